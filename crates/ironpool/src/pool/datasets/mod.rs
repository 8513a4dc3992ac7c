//! The datasets of a pool, together: the ones open, and what acts on
//! several at once or on a whole one from above its data path.
//!
//! - [`intent_log`]: committing and replaying the logs of volumes and
//!   filesystems (their state and records are
//!   [`crate::pool::dataset::intent_log`]'s).
//! - [`keys`]: loading, unloading and changing keys.
//! - [`props`]: setting and reading properties.
//! - [`quota`]: quotas and reservations over the dataset tree.
//! - [`snapshot`]: snapshots, clones, rollback and promote.
//! - [`receive`]: a stream made a dataset again.
//! - [`rename`]: datasets renamed.

pub mod intent_log;
pub mod keys;
pub mod props;
pub mod quota;
pub mod receive;
pub mod rename;
pub mod snapshot;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::pool::dataset::{dead_space, directory, keys as key_records};
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::rt::sync::{Notify, Semaphore};

/// The datasets room's state, which the pool holds: the directory naming
/// every dataset, the datasets open, the snapshots waiting for the next
/// commit or held by sends, and the lock and notices of administrative
/// changes. Each part is its own small owner (a [`directory::DirectoryCell`]
/// marks its changes for the txg build, an [`OpenMap`] never lends its map
/// across an await). The pool's other rooms reach the directory, the open
/// heads and snapshot filesystems, the lock and the notices; the snapshot
/// bookkeeping (requests, holds, opened snapshot volumes, referenced
/// figures) is private to this room.
pub struct Datasets {
    /// The dataset directory and whether it changed since the last build.
    pub(in crate::pool) directory: directory::DirectoryCell,
    /// Open volumes by short name (hidden ones of receives included).
    pub(in crate::pool) volumes: OpenMap<Volume>,
    /// Open filesystems by short name (all of the directory's).
    pub(in crate::pool) filesystems: OpenMap<Filesystem>,
    /// Read-only volumes opened for snapshots (exports, reads), by full name.
    snapshot_volumes: OpenMap<Volume>,
    /// Read-only filesystems opened for snapshots (`.zfs/snapshot`), by
    /// full name.
    pub(in crate::pool) snapshot_filesystems: OpenMap<Filesystem>,
    /// What each filesystem snapshot refers to (bytes allocated, logical,
    /// physical), by its table's object, once walked.
    snapshot_referenced: RefCell<rustc_hash::FxHashMap<u64, (u64, u64, u64)>>,
    /// The space on each dead list by birth txg, once summed.
    pub(in crate::pool) dead_space: dead_space::DeadSpaceCache,
    /// Snapshots to take at the next commit.
    pending_snapshots: RefCell<Vec<snapshot::SnapshotRequest>>,
    /// Snapshots being sent (by full name, with the number of sends): they
    /// cannot be destroyed meanwhile.
    pub(in crate::pool) snapshot_holds: RefCell<BTreeMap<String, usize>>,
    /// Serialises administrative changes to datasets (snapshot, destroy,
    /// clone, rollback, promote, receive).
    pub(in crate::pool) admin_lock: Rc<Semaphore>,
    /// Notified when a volume or a snapshot is destroyed: NBD ends the
    /// connections that served it.
    pub(in crate::pool) exports_gone: Notify,
    /// Notified when a filesystem is created or destroyed.
    pub(in crate::pool) filesystems_changed: Notify,
    /// The keys of encrypted volumes loaded now.
    pub(in crate::pool) keys: key_records::LoadedKeys,
}

impl Datasets {
    /// `dirty`: the directory is new and must be written by the first
    /// commit (an imported one is on disk already).
    pub(in crate::pool) fn new(directory: directory::Directory, dirty: bool) -> Datasets {
        Datasets {
            directory: directory::DirectoryCell::new(directory, dirty),
            volumes: OpenMap::default(),
            filesystems: OpenMap::default(),
            snapshot_volumes: OpenMap::default(),
            snapshot_filesystems: OpenMap::default(),
            snapshot_referenced: RefCell::default(),
            dead_space: dead_space::DeadSpaceCache::default(),
            pending_snapshots: RefCell::default(),
            snapshot_holds: RefCell::default(),
            admin_lock: Semaphore::new(1),
            exports_gone: Notify::new(),
            filesystems_changed: Notify::new(),
            keys: key_records::LoadedKeys::default(),
        }
    }

    /// Asks for snapshot `name` of dataset `short` (with `guid`, its
    /// identity across pools) at the next txg build.
    pub(in crate::pool) fn request_snapshot(&self, short: &str, name: &str, guid: u64) {
        self.pending_snapshots
            .borrow_mut()
            .push(snapshot::SnapshotRequest {
                volume: short.to_string(),
                name: name.to_string(),
                guid,
            });
    }
}

/// The open datasets of one kind (volumes, filesystems, or the snapshots of
/// either opened for reading), by name. Every method borrows the map only
/// for its own length and hands back shared handles, so no caller can hold
/// the map across an await (a borrow held there would panic when another
/// task opens or closes a dataset meanwhile). Listings are in name order.
impl Datasets {
    /// A snapshot of `old` or below it that a send or a diff holds
    /// (`Pool::hold_snapshot`), by full name.
    pub(in crate::pool) fn held_snapshot_within(&self, pool: &str, old: &str) -> Option<String> {
        self.snapshot_holds
            .borrow()
            .keys()
            .find(|full| snapshot_within(pool, full, old))
            .cloned()
    }

    /// After snapshots `names` (full names) were renamed: their open views
    /// go (one in use stays with its user); a lookup of the new name opens
    /// it afresh.
    pub(in crate::pool) fn forget_snapshots(&self, names: &[String]) {
        self.snapshot_volumes
            .retain(|full| !names.iter().any(|name| name == full));
        self.snapshot_filesystems
            .retain(|full| !names.iter().any(|name| name == full));
    }

    /// After `old` and what is below it were renamed to `new`: the open
    /// snapshot views of them go (they carry the old names; one in use
    /// stays with its user), and snapshots asked for follow the new names.
    pub(in crate::pool) fn forget_renamed(&self, pool: &str, old: &str, new: &str) {
        self.snapshot_volumes
            .retain(|full| !snapshot_within(pool, full, old));
        self.snapshot_filesystems
            .retain(|full| !snapshot_within(pool, full, old));
        for request in self.pending_snapshots.borrow_mut().iter_mut() {
            if directory::is_within(&request.volume, old) {
                request.volume = format!("{new}{}", &request.volume[old.len()..]);
            }
        }
    }
}

/// Whether snapshot `full` (`POOL/A/B@SNAP`) is of a dataset at or below
/// `short` in pool `pool`.
fn snapshot_within(pool: &str, full: &str, short: &str) -> bool {
    let dataset = full.split('@').next().unwrap_or_default();
    dataset
        .strip_prefix(pool)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|name| directory::is_within(name, short))
}

pub struct OpenMap<T> {
    map: RefCell<BTreeMap<String, Rc<T>>>,
    /// Datasets let go (evicted by [`OpenMap::insert_bounded`], removed,
    /// renamed away) while a task still held them (a send, a diff, a
    /// scrub's walk of a snapshot, a request under `.zfs/snapshot`), by
    /// the name they had: what must reach every dataset in memory finds
    /// them here (`unload-key` sealing their attributes,
    /// [`OpenMap::all_held`]; a destroy or promote retiring them,
    /// [`OpenMap::let_go_named`]). Those no task holds any more are pruned
    /// at each let-go, so it never holds more than tasks do.
    let_go: RefCell<Vec<(String, std::rc::Weak<T>)>>,
}

impl<T> Default for OpenMap<T> {
    fn default() -> OpenMap<T> {
        OpenMap {
            map: RefCell::new(BTreeMap::new()),
            let_go: RefCell::new(Vec::new()),
        }
    }
}

impl<T> OpenMap<T> {
    /// The dataset open as `name`.
    pub fn get(&self, name: &str) -> Option<Rc<T>> {
        self.map.borrow().get(name).cloned()
    }

    /// Whether `name` is open.
    pub fn contains(&self, name: &str) -> bool {
        self.map.borrow().contains_key(name)
    }

    /// Notes `dataset` open as `name` (replacing what was open there).
    pub fn insert(&self, name: String, dataset: Rc<T>) {
        self.map.borrow_mut().insert(name, dataset);
    }

    /// `dataset` open as `name` unless another task opened one there
    /// first, which is kept and returned instead; past `max` open, the first
    /// by name is let go (for caches of snapshots: a task still using it
    /// keeps its handle).
    pub fn insert_bounded(&self, name: String, dataset: Rc<T>, max: usize) -> Rc<T> {
        let mut map = self.map.borrow_mut();
        if let Some(open) = map.get(&name) {
            return open.clone();
        }
        if map.len() >= max {
            if let Some(first) = map.keys().next().cloned() {
                let evicted = map.remove(&first).expect("the first name is open");
                self.note_let_go(first, &evicted);
            }
        }
        map.insert(name, dataset.clone());
        dataset
    }

    /// Remembers `dataset`, let go as `name`, if a task still holds it
    /// (besides the caller's handle).
    fn note_let_go(&self, name: String, dataset: &Rc<T>) {
        let mut let_go = self.let_go.borrow_mut();
        let_go.retain(|(_, held)| held.strong_count() > 0);
        if Rc::strong_count(dataset) > 1 {
            let_go.push((name, Rc::downgrade(dataset)));
        }
    }

    /// Notes `name` closed, returning what was open.
    pub fn remove(&self, name: &str) -> Option<Rc<T>> {
        let removed = self.map.borrow_mut().remove(name)?;
        self.note_let_go(name.to_string(), &removed);
        Some(removed)
    }

    /// Keeps only the datasets whose names pass `keep`.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<String> = self
            .map
            .borrow()
            .keys()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
    }

    /// Closes every one, returning them by name.
    pub fn take(&self) -> BTreeMap<String, Rc<T>> {
        let taken = std::mem::take(&mut *self.map.borrow_mut());
        for (name, dataset) in &taken {
            self.note_let_go(name.clone(), dataset);
        }
        taken
    }

    /// Every open dataset.
    pub fn all(&self) -> Vec<Rc<T>> {
        self.map.borrow().values().cloned().collect()
    }

    /// Every open dataset, and every one let go that a task still holds.
    pub fn all_held(&self) -> Vec<Rc<T>> {
        let mut held = self.all();
        held.extend(
            self.let_go
                .borrow()
                .iter()
                .filter_map(|(_, weak)| weak.upgrade()),
        );
        held
    }

    /// The datasets let go as `name` (see [`OpenMap::all_held`]) that a
    /// task still holds; every one when `name` is None.
    pub fn let_go_named(&self, name: Option<&str>) -> Vec<Rc<T>> {
        self.let_go
            .borrow()
            .iter()
            .filter(|(held_as, _)| name.is_none_or(|name| name == held_as))
            .filter_map(|(_, weak)| weak.upgrade())
            .collect()
    }

    /// Every open dataset with its name.
    /// The datasets named `short` or below it (`short/...`).
    pub fn within(&self, short: &str) -> Vec<Rc<T>> {
        self.map
            .borrow()
            .iter()
            .filter(|(name, _)| directory::is_within(name, short))
            .map(|(_, dataset)| dataset.clone())
            .collect()
    }

    pub fn named(&self) -> Vec<(String, Rc<T>)> {
        self.map
            .borrow()
            .iter()
            .map(|(name, dataset)| (name.clone(), dataset.clone()))
            .collect()
    }

    /// Whether `test` holds for any open dataset (without a listing).
    pub fn any(&self, mut test: impl FnMut(&T) -> bool) -> bool {
        self.map.borrow().values().any(|dataset| test(dataset))
    }

    /// Whether `test` holds for every open dataset (without a listing).
    pub fn every(&self, mut test: impl FnMut(&T) -> bool) -> bool {
        self.map.borrow().values().all(|dataset| test(dataset))
    }

    /// The sum of `figure` over the open datasets (without a listing: the
    /// write throttle asks on every write).
    pub fn sum(&self, mut figure: impl FnMut(&T) -> u64) -> u64 {
        self.map
            .borrow()
            .values()
            .map(|dataset| figure(dataset))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a map lets go while a task holds it stays reachable by
    /// `all_held` and by its name, however it was let go, and is
    /// forgotten once nothing holds it.
    #[test]
    fn datasets_let_go_while_held_stay_reachable() {
        let map: OpenMap<u32> = OpenMap::default();
        let held_evicted = map.insert_bounded("a".into(), Rc::new(1), 2);
        let held_removed = map.insert_bounded("b".into(), Rc::new(2), 2);
        // "a" is evicted; "b" and "c" stay open.
        map.insert_bounded("c".into(), Rc::new(3), 2);
        assert!(map.get("a").is_none());
        assert!(map.remove("b").is_some());
        map.insert("d".into(), Rc::new(4));
        map.retain(|name| name != "d");
        let mut all: Vec<u32> = map.all_held().iter().map(|value| **value).collect();
        all.sort();
        // "d" was let go by retain with nothing holding it: gone.
        assert_eq!(all, vec![1, 2, 3]);
        assert_eq!(
            map.let_go_named(Some("b"))
                .iter()
                .map(|value| **value)
                .collect::<Vec<_>>(),
            vec![2]
        );
        let taken = map.take();
        assert_eq!(taken.len(), 1);
        drop(taken);
        // "c" was taken and dropped: nothing holds it.
        drop((held_evicted, held_removed));
        // Pruned at the next let-go.
        map.insert("e".into(), Rc::new(5));
        map.remove("e");
        assert!(map.all_held().is_empty());
        assert!(map.let_go.borrow().is_empty());
    }
}
