//! Snapshots, clones, rollback and promote, on the birth txgs of block pointers
//! (as ZFS does it), for volumes and filesystems alike: a dataset's head is
//! one pool-level object (a volume's data tree, a filesystem's dnode table,
//! under which all its objects live), and a snapshot is a copy of its dnode.
//!
//! - A **snapshot** is made inside a txg commit: the volume's tree at that txg,
//!   kept as a read-only copy of its dnode. O(1): no block is copied.
//! - Every block a volume stops using (overwrite, trim) is freed only if it was
//!   born after the latest snapshot; otherwise a snapshot still uses it and it
//!   goes on the volume's **dead list**. Taking a snapshot hands the volume's dead
//!   list to the snapshot, so a snapshot's dead list holds the blocks that died
//!   between the previous snapshot and it.
//! - **Destroying** snapshot S (between P before it and N after it, N possibly the
//!   volume itself) frees the blocks on N's dead list born after P (only S had
//!   them), keeps the rest on N's list, and moves S's list onto N's.
//! - A **clone** is a new volume whose tree starts as a snapshot's; blocks born at
//!   or before the snapshot stay the origin's. **Promote** hands the origin
//!   snapshot (and older ones) to the clone.
//! - **Rollback** frees the volume's blocks born after the snapshot and takes the
//!   snapshot's tree back.

use std::rc::Rc;

use serde::Serialize;

use crate::format::bp::BLOCK_POINTER_BYTES;
use crate::format::dnode::DNODE_FLAG_READ_ONLY;
use crate::format::{BlockPointer, ObjectType};
use crate::object::{Object, ObjectError};
use crate::pool::dataset::dead_space::DeadSpace;
use crate::pool::dataset::directory::{valid_name, Lineage, SnapshotRecord};
use crate::pool::dataset::split_snapshot_name;
use crate::pool::filesystem::{Filesystem, ObjectWalk};
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};

mod bookmarks;
mod clones;
mod holds;

pub use bookmarks::BookmarkInfo;
pub use holds::HoldInfo;

/// Block pointers a destroy or a rollback frees (and, for a snapshot's
/// destroy, reads from a dead list) between two turns of the engine's loop:
/// 512 KiB of list, about half a millisecond of work (decoding and freeing
/// take 0.1-0.2 us a pointer; the 196k of a 3 GiB overwrite, in one go,
/// held every client of the pool for 0.15-0.2 s).
pub const DEAD_LIST_POINTERS_PER_TURN: usize = 4096;

/// Blocks a dataset let go of in the open txg that a snapshot still holds
/// (its pending dead pointers), past which they go onto its dead list at
/// once ([`Pool::spill_dead`]) instead of at the txg build: a slice of list
/// each time, about 2 ms of work. Left to the build, the 196k pointers of a
/// 3 GiB file of 16K records removed after a snapshot took 0.16 s of it in
/// one step of the engine's loop (every client of the pool waited), and a
/// vector of them that size is copied whole each time it doubles.
pub const DEAD_SPILL_POINTERS: usize = DEAD_LIST_POINTERS_PER_TURN;

/// Block pointers collected by a walk, to free later: slices of at most
/// [`DEAD_LIST_POINTERS_PER_TURN`], each allocated once at its full size.
/// One growing vector would copy everything it held at each doubling, in
/// one step of the engine's loop: the 25 MB of a 3 GiB volume's 196k
/// pointers held the pool's clients for 20-25 ms.
#[derive(Default)]
pub(crate) struct PointerSlices {
    slices: Vec<Vec<BlockPointer>>,
}

impl PointerSlices {
    /// Adds one pointer at the end.
    pub(crate) fn push(&mut self, pointer: BlockPointer) {
        match self.slices.last_mut() {
            Some(slice) if slice.len() < DEAD_LIST_POINTERS_PER_TURN => slice.push(pointer),
            _ => {
                let mut slice = Vec::with_capacity(DEAD_LIST_POINTERS_PER_TURN);
                slice.push(pointer);
                self.slices.push(slice);
            }
        }
    }

    /// The slices, in the order pushed.
    pub(crate) fn slices(&self) -> impl Iterator<Item = &[BlockPointer]> {
        self.slices.iter().map(Vec::as_slice)
    }

    /// Every pointer, in the order pushed.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &BlockPointer> {
        self.slices.iter().flatten()
    }
}

/// A snapshot to take at the next commit.
pub struct SnapshotRequest {
    /// The dataset (volume or filesystem), by short name.
    pub volume: String,
    pub name: String,
    pub guid: u64,
}

/// Space figures of a volume (ZFS's names and meanings).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct VolumeSpace {
    /// Space of every block the volume's tree points at.
    pub referenced_bytes: u64,
    /// Space this dataset and its snapshots use that nothing else does,
    /// what its refreservation holds back beyond that, and what the
    /// datasets below it use: `used_by_dataset + used_by_snapshots +
    /// used_by_refreservation + used_by_children`.
    pub used_bytes: u64,
    /// Space of the volume's own blocks (for a clone, those born after its origin).
    pub used_by_dataset_bytes: u64,
    /// Space only snapshots hold: freed if every snapshot were destroyed.
    pub used_by_snapshots_bytes: u64,
    /// What the dataset's `refreservation` sets aside beyond what it
    /// refers to (a thick volume not yet written): counted in `used`, as
    /// OpenZFS counts it, since no other dataset may write there.
    pub used_by_refreservation_bytes: u64,
    /// What the datasets right below it use (their `used`, which counts
    /// theirs in turn): a filesystem's quota and reservation cover it.
    pub used_by_children_bytes: u64,
    /// Space of blocks written since the latest snapshot.
    pub written_bytes: u64,
    /// Logical (uncompressed) bytes of the data counted in `used`.
    pub logical_used_bytes: u64,
    /// Logical bytes of the data the volume refers to.
    pub logical_referenced_bytes: u64,
    /// Logical / physical size of the data the volume refers to.
    pub compress_ratio: f64,
}

/// What `list -t snapshot` shows.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotInfo {
    pub name: String,
    pub txg: u64,
    pub guid: String,
    pub created_unix_seconds: u64,
    /// Space freed by destroying this snapshot alone.
    pub used_bytes: u64,
    pub referenced_bytes: u64,
    pub clones: Vec<String>,
    /// User holds on it (`userrefs`): while any, it cannot be destroyed.
    pub userrefs: u64,
}

fn corrupt(error: ObjectError) -> PoolError {
    PoolError::from(error)
}

impl Pool {
    /// The snapshots, dead list and origin of a dataset (by short name).
    pub(in crate::pool) fn record(&self, dataset: &str) -> Result<Lineage, PoolError> {
        self.datasets
            .directory
            .read()
            .lineage(dataset)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{dataset}", self.name)))
    }

    /// The directory record of volume `short`.
    pub(crate) fn volume_record(
        &self,
        short: &str,
    ) -> Result<crate::pool::dataset::directory::VolumeRecord, PoolError> {
        self.datasets
            .directory
            .read()
            .volumes
            .get(short)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{short}", self.name)))
    }

    /// "POOL/DATASET@SNAP" of a clone's origin, if it is one.
    pub fn origin_name(&self, lineage: &Lineage) -> Option<String> {
        lineage
            .origin
            .as_ref()
            .map(|origin| format!("{}/{}@{}", self.name, origin.volume, origin.snapshot))
    }

    /// The snapshots a destroy of dataset `short` (named `name`) takes
    /// along, by full name, newest last: refused unless `recursive` when
    /// there are any, and while one has clones or is being sent.
    pub(crate) fn snapshots_to_destroy(
        &self,
        name: &str,
        short: &str,
        lineage: &Lineage,
        recursive: bool,
    ) -> Result<Vec<String>, PoolError> {
        let snapshots: Vec<String> = lineage
            .snapshots
            .iter()
            .map(|snapshot| format!("{}/{short}@{}", self.name, snapshot.name))
            .collect();
        if !snapshots.is_empty() && !recursive {
            return Err(PoolError::InvalidArgument(format!(
                "{name} has snapshots ({}); use -r to destroy them too",
                snapshots.join(", ")
            )));
        }
        self.check_no_clones(short, &lineage.snapshots)?;
        for snapshot in &snapshots {
            self.check_not_held(snapshot)?;
        }
        Ok(snapshots)
    }

    /// Refuses to go on while one of `snapshots` (of dataset `short`) has
    /// clones: they depend on its blocks.
    fn check_no_clones(&self, short: &str, snapshots: &[SnapshotRecord]) -> Result<(), PoolError> {
        match snapshots
            .iter()
            .find(|snapshot| !snapshot.clones.is_empty())
        {
            Some(cloned) => Err(PoolError::InvalidArgument(format!(
                "{}/{short}@{} has dependent clones ({}); destroy or promote them first",
                self.name,
                cloned.name,
                cloned.clones.join(", ")
            ))),
            None => Ok(()),
        }
    }

    /// The pool-level object a dataset's snapshots copy: a volume's data
    /// tree, a filesystem's dnode table.
    pub(in crate::pool) fn head_object(&self, dataset: &str) -> Result<Rc<Object>, PoolError> {
        if let Some(volume) = self.datasets.volumes.get(dataset) {
            return Ok(volume.object.clone());
        }
        if let Some(fs) = self.datasets.filesystems.get(dataset) {
            return Ok(fs.table.clone());
        }
        Err(PoolError::NoSuchVolume(format!("{}/{dataset}", self.name)))
    }

    /// Bytes allocated, logical and physical, of everything snapshot
    /// `POOL/FS@SNAP` of a filesystem refers to. A walk of all its objects
    /// the first time; a snapshot never changes, so then remembered (24
    /// bytes a snapshot, until it is destroyed).
    pub(crate) async fn snapshot_referenced(
        self: &Rc<Self>,
        full_name: &str,
    ) -> Result<(u64, u64, u64), PoolError> {
        let fs = self.snapshot_filesystem(full_name).await?;
        if let Some(known) = self.datasets.snapshot_referenced.borrow().get(&fs.table.id) {
            return Ok(*known);
        }
        let _shared = fs.shared().await;
        let figures = fs.referenced_locked(self).await?;
        self.datasets
            .snapshot_referenced
            .borrow_mut()
            .insert(fs.table.id, figures);
        Ok(figures)
    }

    /// Whether dataset `short` is a filesystem.
    fn is_filesystem(&self, short: &str) -> bool {
        self.datasets.filesystems.contains(short)
    }

    /// Takes snapshots of several datasets (volumes, filesystems) atomically
    /// (in one txg).
    pub async fn snapshot(self: &Rc<Self>, names: &[String]) -> Result<(), PoolError> {
        // A filesystem's writes the kernel still caches are in the snapshot.
        for full in names {
            if let Some((dataset, _)) = split_snapshot_name(&self.name, full) {
                if let Ok(fs) = self.filesystem(dataset) {
                    fs.flush_kernel_caches().await;
                }
            }
        }
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let mut requests = Vec::new();
        for full in names {
            let (volume, snapshot) = split_snapshot_name(&self.name, full).ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "'{full}': snapshots are named POOL/VOLUME@NAME"
                ))
            })?;
            if !valid_name(snapshot) {
                return Err(PoolError::InvalidName(snapshot.to_string()));
            }
            let record = self.record(volume)?;
            if let Ok(fs) = self.filesystem(volume) {
                self.check_log_not_claimed(&fs)?;
            }
            if record
                .snapshots
                .iter()
                .any(|existing| existing.name == snapshot)
                || requests.iter().any(|request: &SnapshotRequest| {
                    request.volume == volume && request.name == snapshot
                })
            {
                return Err(PoolError::VolumeExists(format!(
                    "{}/{volume}@{snapshot}",
                    self.name
                )));
            }
            requests.push(SnapshotRequest {
                volume: volume.to_string(),
                name: snapshot.to_string(),
                guid: crate::format::new_guid(),
            });
        }
        // Every write acknowledged before the snapshot is in it, and on disk
        // with it (the commit writes out every volume, as `commit` does).
        self.drain_all().await?;
        self.datasets
            .pending_snapshots
            .borrow_mut()
            .extend(requests);
        let target = self.txg.open();
        self.txg.wait_durable(self, target).await
    }

    /// The snapshots of a dataset (volume or filesystem), oldest first,
    /// with their space.
    ///
    /// Each one's `used` comes from the next dead list's cached summary
    /// ([`super::dead_space`]); a destroy that drops one meanwhile starts
    /// the listing again.
    pub async fn snapshots(self: &Rc<Self>, volume: &str) -> Result<Vec<SnapshotInfo>, PoolError> {
        self.restarting_space_query(volume, |epoch| self.snapshots_in(volume, epoch))
            .await
    }

    /// [`Pool::snapshots`] in `epoch` of the dead-list drops (as
    /// [`Pool::volume_space_in`] is).
    async fn snapshots_in(
        self: &Rc<Self>,
        volume: &str,
        epoch: Option<u64>,
    ) -> Result<Option<Vec<SnapshotInfo>>, PoolError> {
        let short = volume
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(volume);
        let record = self.record(short)?;
        let mut out = Vec::new();
        for (index, snapshot) in record.snapshots.iter().enumerate() {
            let previous_txg = if index == 0 {
                self.origin_txg(&record)
            } else {
                record.snapshots[index - 1].txg
            };
            let next_list = record
                .snapshots
                .get(index + 1)
                .map(|next| next.dead_list)
                .unwrap_or(record.dead_list);
            let used = {
                let _hold = self.txg.hold_builds();
                let unique = if index + 1 == record.snapshots.len() {
                    let head = self.head_object(short)?;
                    self.head_dead_space(&head, &record, epoch).await?
                } else {
                    self.dead_list_space(next_list, epoch).await?
                };
                let Some(unique) = unique else {
                    return Ok(None);
                };
                unique.allocated_after(previous_txg)
            };
            let referenced = if self.is_filesystem(short) {
                let full = format!("{}/{short}@{}", self.name, snapshot.name);
                self.snapshot_referenced(&full).await?.0
            } else {
                self.objects.open(snapshot.object).await?.dnode().used_bytes
            };
            out.push(SnapshotInfo {
                name: format!("{}/{short}@{}", self.name, snapshot.name),
                txg: snapshot.txg,
                guid: format!("{:#x}", snapshot.guid),
                created_unix_seconds: snapshot.created_unix_seconds,
                used_bytes: used,
                referenced_bytes: referenced,
                clones: snapshot
                    .clones
                    .iter()
                    .map(|clone| format!("{}/{clone}", self.name))
                    .collect(),
                userrefs: snapshot.holds.len() as u64,
            });
        }
        Ok(Some(out))
    }

    fn origin_txg(&self, record: &Lineage) -> u64 {
        let Some(origin) = &record.origin else {
            return 0;
        };
        self.datasets
            .directory
            .read()
            .snapshot(origin)
            .map_or(0, |snapshot| snapshot.txg)
    }

    /// The block pointers listed in a dead list object, read in whole (for
    /// a check, which holds them all anyway).
    pub(in crate::pool) async fn dead_list_entries(
        &self,
        object_id: u64,
    ) -> Result<Vec<BlockPointer>, PoolError> {
        if object_id == 0 {
            return Ok(Vec::new());
        }
        let object = self.dead_list_object(object_id)?;
        let length = object.length_bytes() as usize;
        let bytes = self.objects.read_bytes(&object, 0, length).await?;
        decode_dead_list(object_id, &bytes)
    }

    /// Up to [`DEAD_LIST_POINTERS_PER_TURN`] pointers of a dead list object
    /// from byte `offset` on; None past its end (or for no list, 0). Its
    /// blocks are read from the devices if they are not cached (a dead
    /// list's blocks are evicted like a file's, `ObjectSet::load_dead_list`).
    pub(in crate::pool) async fn dead_list_slice(
        &self,
        object_id: u64,
        offset: u64,
    ) -> Result<Option<Vec<BlockPointer>>, PoolError> {
        let Some((object, bytes)) = self.dead_list_slice_span(object_id, offset)? else {
            return Ok(None);
        };
        let bytes = self.objects.read_bytes(&object, offset, bytes).await?;
        decode_dead_list(object_id, &bytes).map(Some)
    }

    /// [`Pool::dead_list_slice`] without I/O, of a list whose blocks the
    /// caller holds (`ObjectSet::hold_blocks`).
    fn dead_list_slice_held(
        &self,
        object_id: u64,
        offset: u64,
    ) -> Result<Option<Vec<BlockPointer>>, PoolError> {
        let Some((object, bytes)) = self.dead_list_slice_span(object_id, offset)? else {
            return Ok(None);
        };
        let bytes = self
            .objects
            .read_bytes_cached(&object, offset, bytes)
            .map_err(corrupt)?;
        decode_dead_list(object_id, &bytes).map(Some)
    }

    /// The list and the bytes of its slice from `offset` (whole pointers,
    /// at most [`DEAD_LIST_POINTERS_PER_TURN`]); None when there are none.
    fn dead_list_slice_span(
        &self,
        object_id: u64,
        offset: u64,
    ) -> Result<Option<(Rc<Object>, usize)>, PoolError> {
        if object_id == 0 {
            return Ok(None);
        }
        let object = self.dead_list_object(object_id)?;
        // Whole pointers only (a torn tail is not a pointer).
        let pointer = BLOCK_POINTER_BYTES as u64;
        let left = object.dnode.borrow().length_bytes.saturating_sub(offset) / pointer;
        let bytes = left.min(DEAD_LIST_POINTERS_PER_TURN as u64) * pointer;
        Ok((bytes != 0).then_some((object, bytes as usize)))
    }

    /// Adds `entries` at the end of a dead list object (created when `object_id`
    /// is 0 and there is anything to add). Returns the list's object id.
    fn append_dead_list(&self, object_id: u64, entries: &[BlockPointer]) -> Result<u64, PoolError> {
        if entries.is_empty() {
            return Ok(object_id);
        }
        let object = match object_id {
            0 => self.create_dead_list(self.txg.open()),
            _ => self.dead_list_object(object_id)?,
        };
        let end = object.dnode.borrow().length_bytes;
        self.objects
            .write_bytes_cached(&object, end, &encode_pointers(entries))
            .map_err(corrupt)?;
        Ok(object.id)
    }

    /// Appends `object`'s pending dead pointers (a volume's, or a
    /// filesystem's table's) to its dead list now, in the open txg, when
    /// there are at least `dead_spill_pointers` of them (the tunable,
    /// [`DEAD_SPILL_POINTERS`] by default) and nothing holds txg builds
    /// off: what the build's step would do with them, spread over the
    /// changes that let them go. Called by the paths that let go of blocks
    /// at a client's rate (a link over an old block, a punch), after the
    /// change and with nothing borrowed.
    ///
    /// A holder of builds (a snapshot's destroy, a rollback, a space
    /// query) counts on pending pointers staying pending meanwhile, as a
    /// build would move them too. The same txg commits the list's new
    /// tail and the changes that let go of the blocks on it. On an error
    /// (the list's tail not in memory) the pointers stay pending, for the
    /// build, which reports it.
    pub(in crate::pool) fn spill_dead(&self, object: &Object) {
        let threshold = self.tunables.borrow().dead_spill_pointers as usize;
        if object.dead.borrow().len() < threshold.max(1) || self.txg.builds_held() {
            return;
        }
        let entries = std::mem::take(&mut *object.dead.borrow_mut());
        if append_dead(self, object, &entries, self.txg.open()).is_err() {
            // The write sets the list's length last: a part written is past
            // its end, and the next append writes over it.
            let mut dead = object.dead.borrow_mut();
            let later = std::mem::replace(&mut *dead, entries);
            dead.extend(later);
        }
    }

    /// A new, empty dead list object, created in `txg`.
    fn create_dead_list(&self, txg: u64) -> Rc<Object> {
        self.create_metadata_object(ObjectType::DeadList, txg).1
    }

    /// Destroys one snapshot.
    pub async fn destroy_snapshot(self: &Rc<Self>, full_name: &str) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        self.destroy_snapshot_locked(full_name).await?;
        self.commit().await
    }

    /// Destroying a snapshot, in the open txg, with the admin lock held:
    /// the blocks born after the previous snapshot that the next one (or
    /// the dataset) no longer uses are freed, and the rest of the next
    /// dead list joins the snapshot's own, which becomes the next one's.
    ///
    /// The next list is read, and its blocks freed, a slice at a time
    /// ([`DEAD_LIST_POINTERS_PER_TURN`]) with a turn of the engine's loop
    /// between, txg builds held off throughout: the change is one txg
    /// (a crash leaves the snapshot whole), and the pool's clients are
    /// served meanwhile (the list of a 3 GiB overwrite, 196k pointers,
    /// held every client for 0.2 s read in one go).
    pub(crate) async fn destroy_snapshot_locked(
        self: &Rc<Self>,
        full_name: &str,
    ) -> Result<(), PoolError> {
        let (volume, snapshot) = split_snapshot_name(&self.name, full_name).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{full_name}' is not a snapshot name"))
        })?;
        let record = self.record(volume)?;
        let index = record
            .snapshots
            .iter()
            .position(|existing| existing.name == snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.to_string()))?;
        let target = &record.snapshots[index];
        self.check_not_held(&format!("{}/{volume}@{snapshot}", self.name))?;
        if !target.clones.is_empty() {
            return Err(PoolError::InvalidArgument(format!(
                "{full_name} has dependent clones ({}); destroy or promote them first",
                target.clones.join(", ")
            )));
        }
        let _hold = self.txg.hold_builds();
        let previous_txg = if index == 0 {
            self.origin_txg(&record)
        } else {
            record.snapshots[index - 1].txg
        };
        let head = self.head_object(volume)?;
        let is_latest = index + 1 == record.snapshots.len();
        let next_list = if is_latest {
            record.dead_list
        } else {
            record.snapshots[index + 1].dead_list
        };
        // The whole next list is read and decodes before anything is
        // freed: an error part way would leave the frees before it in the
        // open txg, for the next build to commit, with the list still
        // naming them. Its blocks are held meanwhile, so the second pass
        // reads them without I/O and cannot fail where the first did not
        // (a dead list's blocks are otherwise evicted: this is the one time
        // a list is in memory whole, until the destroy is done).
        let _held = match next_list {
            0 => Vec::new(),
            list => {
                let object = self.dead_list_object(list)?;
                let length = object.length_bytes();
                self.objects.hold_blocks(&object, 0, length).await?
            }
        };
        let mut offset = 0;
        while let Some(slice) = self.dead_list_slice_held(next_list, offset)? {
            offset += slice.len() as u64 * BLOCK_POINTER_BYTES as u64;
            crate::rt::yield_now().await;
        }
        // The snapshot's own list, with what the next keeps appended, is
        // the next one's.
        let mut new_next = target.dead_list;
        let mut offset = 0;
        while let Some(slice) = self.dead_list_slice_held(next_list, offset)? {
            offset += slice.len() as u64 * BLOCK_POINTER_BYTES as u64;
            let mut kept = Vec::new();
            for pointer in slice {
                if pointer.birth_txg > previous_txg {
                    self.store.free(&pointer);
                } else {
                    kept.push(pointer);
                }
            }
            new_next = self.append_dead_list(new_next, &kept)?;
            crate::rt::yield_now().await;
        }
        if is_latest {
            // Blocks the dataset let go of in the open txg: same rule.
            let pending = std::mem::take(&mut *head.dead.borrow_mut());
            for pointer in pending {
                if pointer.birth_txg > previous_txg {
                    self.store.free(&pointer);
                } else {
                    head.dead.borrow_mut().push(pointer);
                }
            }
        }
        self.drop_dead_list(next_list)?;
        // The snapshot's tree belongs to others now (or was freed above): drop
        // only its dnode.
        self.drop_dnode(target.object)?;
        self.datasets
            .snapshot_referenced
            .borrow_mut()
            .remove(&target.object);
        // The views open of it, and those let go that a task still holds
        // (a scrub's walk, a request under `.zfs/snapshot`): none reads
        // it once its blocks may be freed.
        let full = format!("{}/{volume}@{snapshot}", self.name);
        let volumes = &self.datasets.snapshot_volumes;
        let open_volumes = volumes.remove(&full).into_iter();
        for volume_object in open_volumes.chain(volumes.let_go_named(Some(&full))) {
            volume_object.begin_destroy();
            self.datasets.exports_gone.notify_all();
        }
        let filesystems = &self.datasets.snapshot_filesystems;
        let open_filesystems = filesystems.remove(&full).into_iter();
        for fs in open_filesystems.chain(filesystems.let_go_named(Some(&full))) {
            fs.retire();
        }
        {
            let mut directory = self.datasets.directory.edit();
            let record = directory.lineage_mut(volume).expect("checked above");
            record.snapshots.remove(index);
            if is_latest {
                record.dead_list = new_next;
            } else {
                record.snapshots[index].dead_list = new_next;
            }
        }
        if is_latest {
            head.dead_list.set(new_next);
            head.dnode.borrow_mut().prev_snapshot_txg = previous_txg;
            head.dirty.set(true);
        }
        Ok(())
    }

    /// Frees `pointers`, [`DEAD_LIST_POINTERS_PER_TURN`] at a time with a
    /// turn of the engine's loop between, so that the pool's clients are
    /// served meanwhile. The caller holds txg builds off: the frees are one
    /// txg with the rest of its change.
    pub(crate) async fn free_in_slices(&self, pointers: &PointerSlices) {
        for slice in pointers.slices() {
            for pointer in slice {
                self.store.free(pointer);
            }
            crate::rt::yield_now().await;
        }
    }

    /// Clears a dnode slot and forgets the object, without freeing its blocks.
    pub(crate) fn drop_dnode(&self, object_id: u64) -> Result<(), PoolError> {
        self.objects.clear_dnode_cached(object_id).map_err(corrupt)
    }

    /// Space figures of a volume or a filesystem. A volume's come from its
    /// dnode and a walk of the blocks born after its latest snapshot (or its
    /// origin), pruned by birth. A filesystem's come from its header's sums
    /// and its dead list, with no walk of its objects, unless it is a clone
    /// or its header predates the sums (then the walk covers every object).
    ///
    /// The dead lists are read through their cached summaries
    /// ([`super::dead_space`]); a destroy that drops one meanwhile starts
    /// the figures again.
    pub async fn volume_space(self: &Rc<Self>, volume: &str) -> Result<VolumeSpace, PoolError> {
        let mut space = self
            .restarting_space_query(volume, |epoch| self.volume_space_in(volume, epoch))
            .await?;
        let short = volume
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(volume);
        let children: Vec<String> = self
            .descendants(short)
            .into_iter()
            .filter(|name| {
                crate::pool::dataset::directory::parent_name(name) == Some(short)
                    && !crate::pool::is_hidden_dataset(name)
            })
            .collect();
        for child in children {
            let child_space = Box::pin(self.volume_space(&child)).await?;
            space.used_by_children_bytes = space
                .used_by_children_bytes
                .saturating_add(child_space.used_bytes);
        }
        space.used_bytes = space
            .used_bytes
            .saturating_add(space.used_by_children_bytes);
        Ok(space)
    }

    /// [`Pool::volume_space`] in `epoch` of the dead-list drops (None: under
    /// the admin lock, where no dataset's list is dropped); None when a
    /// drop meanwhile restarts it.
    async fn volume_space_in(
        self: &Rc<Self>,
        volume: &str,
        epoch: Option<u64>,
    ) -> Result<Option<VolumeSpace>, PoolError> {
        let short = volume
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(volume)
            .to_string();
        let record = self.record(&short)?;
        let head = self.head_object(&short)?;
        let fs = self.datasets.filesystems.get(&short);
        let _shared = match &fs {
            Some(fs) => Some(fs.shared().await),
            None => None,
        };
        let dnode = head.dnode();
        // Bytes allocated, logical and physical, of everything it refers to.
        let (referenced, referenced_logical, referenced_physical) = match &fs {
            Some(fs) => fs.referenced_locked(self).await?,
            None => (dnode.used_bytes, dnode.logical_bytes, dnode.physical_bytes),
        };
        let origin_txg = dnode.origin_txg;
        let Some((head_let_go, dead)) = self.all_dead_space(&head, &record, epoch).await? else {
            return Ok(None);
        };
        let fast = match &fs {
            Some(fs) if origin_txg == 0 && fs.header.get().space.is_some() => {
                self.written_by_sums(&short, &record, &head, head_let_go, referenced)
                    .await?
            }
            _ => None,
        };
        let (written, own_allocated, own_logical) = match fast {
            // Not a clone: it owns all it refers to.
            Some(written) => (written, referenced, referenced_logical),
            None => {
                let walked = self.written_walked(&head, fs.as_deref()).await?;
                match origin_txg {
                    0 => (walked.0, referenced, referenced_logical),
                    _ => walked,
                }
            }
        };
        let snapshot_space = dead.allocated_after(origin_txg);
        let snapshot_logical = dead.logical_after(origin_txg);
        let compress_ratio = if referenced_physical == 0 {
            1.0
        } else {
            referenced_logical as f64 / referenced_physical as f64
        };
        let refreservation = {
            let directory = self.datasets.directory.read();
            let properties = match directory.volumes.get(&short) {
                Some(volume) => Some(volume.own_properties()),
                None => directory
                    .filesystems
                    .get(&short)
                    .map(|fs| fs.own_properties()),
            };
            properties.map_or(0, |properties| {
                crate::pool::dataset::props::space_limits(&properties).refreservation
            })
        };
        let by_refreservation = refreservation.saturating_sub(referenced);
        Ok(Some(VolumeSpace {
            referenced_bytes: referenced,
            used_bytes: own_allocated + snapshot_space + by_refreservation,
            used_by_dataset_bytes: own_allocated,
            used_by_snapshots_bytes: snapshot_space,
            used_by_refreservation_bytes: by_refreservation,
            used_by_children_bytes: 0,
            written_bytes: written,
            logical_used_bytes: own_logical + snapshot_logical,
            logical_referenced_bytes: referenced_logical,
            compress_ratio: (compress_ratio * 100.0).round() / 100.0,
        }))
    }

    /// Every block pointer of `head` (a volume or a filesystem's table) born
    /// after `txg`, and with `fs` (its filesystem), of every object of it:
    /// the blocks only the dataset holds since then (a rollback and a
    /// destroy free them, the space figures count them). The walk of each
    /// tree is pruned by birth; a filesystem's loads every object, one at a
    /// time.
    pub(in crate::pool) async fn pointers_born_after(
        &self,
        head: &Object,
        fs: Option<&Filesystem>,
        txg: u64,
    ) -> Result<PointerSlices, PoolError> {
        let mut born_after = PointerSlices::default();
        self.objects
            .visit_pointers_born_after(head, txg, &mut |pointer| born_after.push(*pointer))
            .await?;
        if let Some(fs) = fs {
            let mut walk = ObjectWalk::default();
            while let Some(object) = fs.next_object(&mut walk).await? {
                fs.objects
                    .visit_pointers_born_after(&object, txg, &mut |pointer| {
                        born_after.push(*pointer)
                    })
                    .await?;
            }
        }
        Ok(born_after)
    }

    /// Bytes of `head` (a volume or a filesystem's table, with `fs` its
    /// filesystem) born after its latest snapshot, and, born after its
    /// origin, allocated and logical: a walk of the blocks born after the
    /// origin (or the latest snapshot), pruned by birth; for a filesystem,
    /// of every object too (O(objects)).
    pub(in crate::pool) async fn written_walked(
        &self,
        head: &Object,
        fs: Option<&Filesystem>,
    ) -> Result<(u64, u64, u64), PoolError> {
        let dnode = head.dnode();
        let threshold = if dnode.origin_txg == 0 {
            dnode.prev_snapshot_txg
        } else {
            dnode.origin_txg
        };
        let born_after = self.pointers_born_after(head, fs, threshold).await?;
        if let Some(fs) = fs {
            // The walk loaded every object: those past the bound go again
            // now, not at the next commit (an idle pool makes none).
            fs.objects
                .evict_objects(self.tunables.borrow().fs_objects_loaded_max as usize);
        }
        let written = born_after
            .iter()
            .filter(|pointer| pointer.birth_txg > dnode.prev_snapshot_txg)
            .map(BlockPointer::allocated_bytes)
            .sum();
        let allocated = born_after.iter().map(BlockPointer::allocated_bytes).sum();
        let logical = born_after
            .iter()
            .filter(|pointer| pointer.level == 0)
            .map(|pointer| pointer.logical_size as u64)
            .sum();
        Ok((written, allocated, logical))
    }

    /// What dataset `head` (of `record`) let go since its latest snapshot
    /// that the snapshot still holds: its dead list, in memory and written.
    pub(in crate::pool) async fn head_dead(
        &self,
        head: &Object,
        record: &Lineage,
    ) -> Result<Vec<BlockPointer>, PoolError> {
        let mut dead = head.dead.borrow().clone();
        dead.extend(self.dead_list_entries(record.dead_list).await?);
        Ok(dead)
    }

    /// The space every block a dataset (its `head`, its `record`) and its
    /// snapshots let go of holds, by birth, with what the head alone let
    /// go of (allocated bytes); `epoch` as in [`Pool::dead_list_space`]
    /// (None: a list was dropped meanwhile). Txg builds are held off while
    /// the lists are read: no build moves the head's pending part onto its
    /// list meanwhile.
    pub(in crate::pool) async fn all_dead_space(
        &self,
        head: &Object,
        record: &Lineage,
        epoch: Option<u64>,
    ) -> Result<Option<(u64, DeadSpace)>, PoolError> {
        let _hold = self.txg.hold_builds();
        let Some(mut dead) = self.head_dead_space(head, record, epoch).await? else {
            return Ok(None);
        };
        let head_let_go = dead.allocated();
        for snapshot in &record.snapshots {
            let Some(space) = self.dead_list_space(snapshot.dead_list, epoch).await? else {
                return Ok(None);
            };
            dead.merge(&space);
        }
        Ok(Some((head_let_go, dead)))
    }

    /// The space of [`Pool::head_dead`], from its list's summary
    /// ([`Pool::dead_list_space`], `epoch` as there). The caller holds txg
    /// builds off, which move the pending part onto the list.
    pub(in crate::pool) async fn head_dead_space(
        &self,
        head: &Object,
        record: &Lineage,
        epoch: Option<u64>,
    ) -> Result<Option<DeadSpace>, PoolError> {
        let Some(mut space) = self.dead_list_space(record.dead_list, epoch).await? else {
            return Ok(None);
        };
        for pointer in head.dead.borrow().iter() {
            space.add(pointer);
        }
        Ok(Some(space))
    }

    /// The bytes filesystem `short` (not a clone; `head` its table,
    /// `referenced` its figure) wrote since its latest snapshot, without a
    /// walk: what it refers to, less what the snapshot refers to, plus what
    /// it let go since that the snapshot still holds (its dead list). Each
    /// block it refers to born at or before the snapshot is the snapshot's,
    /// and each of the snapshot's it let go is on that list (`let_go`, the
    /// bytes of [`Pool::head_dead`]). None when the figures do not fit that (the
    /// caller walks).
    pub(in crate::pool) async fn written_by_sums(
        self: &Rc<Self>,
        short: &str,
        record: &Lineage,
        head: &Object,
        let_go: u64,
        referenced: u64,
    ) -> Result<Option<u64>, PoolError> {
        let since = head.dnode().prev_snapshot_txg;
        if since == 0 {
            return Ok(Some(referenced));
        }
        let Some(latest) = record
            .snapshots
            .iter()
            .find(|snapshot| snapshot.txg == since)
        else {
            return Ok(None);
        };
        let (snapshot_referenced, _, _) = self
            .snapshot_referenced(&format!("{}/{short}@{}", self.name, latest.name))
            .await?;
        Ok((referenced + let_go).checked_sub(snapshot_referenced))
    }

    /// A read-only volume for snapshot "POOL/VOL@SNAP" (for reading and export).
    pub async fn snapshot_volume(
        self: &Rc<Self>,
        full_name: &str,
    ) -> Result<Rc<Volume>, PoolError> {
        let (volume, snapshot) = split_snapshot_name(&self.name, full_name)
            .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.to_string()))?;
        let canonical = format!("{}/{volume}@{snapshot}", self.name);
        if let Some(existing) = self.datasets.snapshot_volumes.get(&canonical) {
            return Ok(existing);
        }
        let record = self
            .volume_record(volume)
            .map_err(|_| PoolError::NoSuchSnapshot(canonical.clone()))?;
        let snapshot_record = record
            .lineage
            .snapshot(snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(canonical.clone()))?;
        let object = self.objects.open(snapshot_record.object).await?;
        let mut view = record.clone();
        view.properties.insert("readonly".into(), "on".into());
        // The size the volume had when the snapshot was taken.
        let length = object.length_bytes();
        if length > 0 {
            view.size_bytes = length;
        }
        let opened = Volume::new(
            canonical.clone(),
            object,
            &view,
            self.volume_settings(volume, &view.own_properties()),
        );
        opened.read_only.set(true);
        self.datasets
            .snapshot_volumes
            .insert(canonical, opened.clone());
        Ok(opened)
    }
}

/// The pointers of dead list `object_id` in `bytes`.
fn decode_dead_list(object_id: u64, bytes: &[u8]) -> Result<Vec<BlockPointer>, PoolError> {
    bytes
        .chunks_exact(BLOCK_POINTER_BYTES)
        .map(|chunk| {
            BlockPointer::decode(chunk)
                .map_err(|error| PoolError::Corrupt(format!("dead list {object_id}: {error}")))
        })
        .collect()
}

/// Encodes block pointers back to back.
fn encode_pointers(pointers: &[BlockPointer]) -> Vec<u8> {
    let mut bytes = vec![0u8; pointers.len() * BLOCK_POINTER_BYTES];
    for (index, pointer) in pointers.iter().enumerate() {
        pointer.encode(&mut bytes[index * BLOCK_POINTER_BYTES..(index + 1) * BLOCK_POINTER_BYTES]);
    }
    bytes
}

/// The txg build's step for datasets: appends each volume's dead blocks to its
/// dead list, then takes the requested snapshots. Returns whether anything
/// changed (the build repeats until nothing does).
pub(crate) fn build_step(pool: &Pool, txg: u64) -> Result<bool, ObjectError> {
    let mut changed = false;
    for object in pool.objects.open_objects() {
        if object.dead.borrow().is_empty() {
            continue;
        }
        let entries = std::mem::take(&mut *object.dead.borrow_mut());
        append_dead(pool, &object, &entries, txg)?;
        changed = true;
    }
    let requests = std::mem::take(&mut *pool.datasets.pending_snapshots.borrow_mut());
    for request in requests {
        take_snapshot(pool, &request, txg)?;
        changed = true;
    }
    Ok(changed)
}

fn append_dead(
    pool: &Pool,
    object: &Object,
    entries: &[BlockPointer],
    txg: u64,
) -> Result<(), ObjectError> {
    let list_id = object.dead_list.get();
    let list = if list_id == 0 {
        let list = pool.create_dead_list(txg);
        object.dead_list.set(list.id);
        let mut directory = pool.datasets.directory.edit();
        if let Some(record) = directory
            .volumes
            .values_mut()
            .find(|record| record.object == object.id)
        {
            record.lineage.dead_list = list.id;
        } else if let Some(record) = directory
            .filesystems
            .values_mut()
            .find(|record| record.object == object.id)
        {
            record.lineage.dead_list = list.id;
        }
        drop(directory);
        list
    } else {
        pool.objects
            .get(list_id)
            .ok_or(ObjectError::NoSuchObject(list_id))?
    };
    let end = list.length_bytes();
    pool.objects
        .write_bytes_cached(&list, end, &encode_pointers(entries))
}

fn take_snapshot(pool: &Pool, request: &SnapshotRequest, txg: u64) -> Result<(), ObjectError> {
    let Ok(head) = pool.head_object(&request.volume) else {
        return Ok(());
    };
    let id = pool.allocate_object_id();
    let mut dnode = head.dnode();
    dnode.flags |= DNODE_FLAG_READ_ONLY;
    dnode.creation_txg = txg;
    pool.objects.create(id, dnode);
    let dead_list = head.dead_list.replace(0);
    {
        let mut head_dnode = head.dnode.borrow_mut();
        head_dnode.prev_snapshot_txg = txg;
    }
    head.dirty.set(true);
    let created = crate::rt::wall_clock_ns() / 1_000_000_000;
    let mut directory = pool.datasets.directory.edit();
    if let Some(record) = directory.lineage_mut(&request.volume) {
        record.snapshots.push(SnapshotRecord {
            name: request.name.clone(),
            object: id,
            txg,
            guid: request.guid,
            dead_list,
            created_unix_seconds: created,
            clones: Vec::new(),
            holds: std::collections::BTreeMap::new(),
        });
        record.dead_list = 0;
    }
    drop(directory);
    Ok(())
}
