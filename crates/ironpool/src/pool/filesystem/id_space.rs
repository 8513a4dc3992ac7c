//! User, group and project quotas of a filesystem (OpenZFS's
//! `userquota@NAME`, `groupquota@NAME`, `projectquota@ID`, `userused@NAME`,
//! `groupused@NAME`, `projectused@ID`, `userspace`, `groupspace`,
//! `projectspace`).
//!
//! A project is a number every object carries (`chattr -p ID`, or taken
//! from a directory with the project-inherit flag, `chattr +P`): a
//! directory tree given one counts against that project's quota whoever
//! owns its files, as on XFS, ext4 and OpenZFS.
//!
//! A quota is a property of the filesystem keyed by the numeric id
//! (`userquota@1000`; a name given is resolved on the server's host when
//! set). What an id uses is the space of every object it owns: all its
//! blocks, as the objects' dnodes count them. The figures are kept as the
//! dataset quotas' are (`dataset::quota`): per id, the space found by the
//! last walk of the filesystem's objects plus the writes admitted since;
//! only when that bound would cross the id's quota is the walk done again
//! (with the blocks held in memory and the writes in flight of its files),
//! so the check is exact at the limit and costs a lookup of the file's
//! owner away from it, and nothing at all on a filesystem without user or
//! group quotas. A walk reads every dnode, so one runs at most every
//! [`ID_WALK_INTERVAL`] per filesystem; between two, a write over the
//! bound is refused (a file removed counts from the next walk).
//!
//! As in OpenZFS, a `chown` is not refused by the new owner's quota; the
//! file's space counts against it from then on.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::{Filesystem, FsError, OBJECTS_PER_TURN};
use crate::format::znode::Znode;
use crate::object::Object;
use crate::pool::{Pool, PoolError};
use crate::rt::sync::Semaphore;

/// The shortest time between two walks of one filesystem's objects for
/// its user and group quotas: a walk reads every dnode (a million files
/// take about a second), and a writer retrying at its quota must not
/// make every retry one.
pub const ID_WALK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub use crate::pool::dataset::props::ids::{
    id_name, id_property, id_quotas, quota_name, resolve_id, validate_id_quota, IdKind, ID_KINDS,
};

/// A filesystem's user, group and project space figures.
pub(crate) struct IdSpace {
    /// The quotas its properties set.
    quotas: RefCell<FxHashMap<(IdKind, u32), u64>>,
    /// Space per id found by the last walk (with what was held and in
    /// flight then), and when it ran.
    walked: RefCell<FxHashMap<(IdKind, u32), u64>>,
    walked_at: Cell<Option<crate::rt::Instant>>,
    /// Bytes admitted per id since the last walk began (and chowned to
    /// it): one entry per owner that wrote since (a walk drops those it
    /// counted down to nothing).
    since: RefCell<FxHashMap<(IdKind, u32), u64>>,
    /// Bytes admitted per id and neither linked nor held yet.
    in_flight: RefCell<FxHashMap<(IdKind, u32), u64>>,
    /// One walk at a time (each starts `since` again).
    walking: Rc<Semaphore>,
}

impl Default for IdSpace {
    fn default() -> IdSpace {
        IdSpace {
            quotas: RefCell::default(),
            walked: RefCell::default(),
            walked_at: Cell::new(None),
            since: RefCell::default(),
            in_flight: RefCell::default(),
            walking: Semaphore::new(1),
        }
    }
}

/// The ids a file's space counts against: its user, its group and its
/// project.
type Owners = [(IdKind, u32); 3];

/// A write admitted by its file's owners' quotas, kept until its blocks
/// are linked or held.
#[must_use]
pub(crate) struct IdAdmitted<'a> {
    space: Option<&'a IdSpace>,
    ids: Owners,
    bytes: u64,
}

impl Drop for IdAdmitted<'_> {
    fn drop(&mut self) {
        if let Some(space) = self.space {
            let mut in_flight = space.in_flight.borrow_mut();
            for id in self.ids {
                if let Some(bytes) = in_flight.get_mut(&id) {
                    *bytes = bytes.saturating_sub(self.bytes);
                }
            }
        }
    }
}

/// One row of `userspace`, `groupspace` or `projectspace`.
#[derive(Clone, Debug, Serialize)]
pub struct IdUsage {
    #[serde(rename = "type")]
    pub kind: IdKind,
    pub id: u32,
    pub used_bytes: u64,
    /// None: no quota.
    pub quota_bytes: Option<u64>,
}

impl IdSpace {
    /// Follows the filesystem's properties.
    /// Follows the filesystem's properties. When the first quota comes
    /// (or the last goes), the figures start again from a walk: nothing
    /// was counted per id while there was none.
    pub(super) fn apply(&self, properties: &BTreeMap<String, String>) {
        let quotas = id_quotas(properties);
        let had_none = self.quotas.borrow().is_empty();
        if had_none != quotas.is_empty() {
            self.walked.borrow_mut().clear();
            self.since.borrow_mut().clear();
            self.walked_at.set(None);
        }
        *self.quotas.borrow_mut() = quotas;
    }

    fn bound(&self, id: (IdKind, u32)) -> u64 {
        let walked = self.walked.borrow().get(&id).copied().unwrap_or(0);
        walked.saturating_add(self.since.borrow().get(&id).copied().unwrap_or(0))
    }

    fn add(map: &RefCell<FxHashMap<(IdKind, u32), u64>>, id: (IdKind, u32), bytes: u64) {
        let mut map = map.borrow_mut();
        let entry = map.entry(id).or_insert(0);
        *entry = entry.saturating_add(bytes);
    }
}

/// The ids whose space a znode's object counts in.
pub(super) fn znode_owners(znode: &Znode) -> Owners {
    [
        (IdKind::User, znode.uid),
        (IdKind::Group, znode.gid),
        (IdKind::Project, znode.project),
    ]
}

/// The owners of a file: its user, group and project.
fn owners(object: &Object) -> Option<Owners> {
    Znode::decode(&object.dnode().bonus)
        .ok()
        .map(|znode| znode_owners(&znode))
}

impl Filesystem {
    /// Admits a write of `bytes` of new space to file `object`: refused
    /// with EDQUOT past its owner's, its group's or its project's quota. The caller holds
    /// the filesystem's lock shared (no object is made or freed during a
    /// walk) and keeps the guard until the blocks are linked or held.
    pub(super) async fn admit_to_owners(
        &self,
        object: &Object,
        bytes: u64,
    ) -> Result<IdAdmitted<'_>, FsError> {
        let space = &self.ids;
        let nothing = IdAdmitted {
            space: None,
            ids: [(IdKind::User, 0), (IdKind::Group, 0), (IdKind::Project, 0)],
            bytes: 0,
        };
        if bytes == 0 || space.quotas.borrow().is_empty() {
            return Ok(nothing);
        }
        let Some(ids) = owners(object) else {
            return Ok(nothing);
        };
        if space.walked_at.get().is_none() {
            // What each id owned before the first write counts too.
            self.walk_ids(Some(None)).await?;
        }
        let over = |id: (IdKind, u32)| {
            let quota = space.quotas.borrow().get(&id).copied();
            quota.filter(|quota| space.bound(id).saturating_add(bytes) > *quota)
        };
        if ids.iter().any(|id| over(*id).is_some()) {
            // The bound counts rewrites whole and removals not at all: the
            // blocks held are written out (an overwrite's old and new
            // versions would both count), and the objects walked again,
            // after waiting for the walk's interval if need be, before
            // the write is refused.
            self.settle_writes(None).await;
            let seen = space.walked_at.get();
            if let Some(at) = seen {
                let waited = crate::rt::now().duration_since(at);
                if waited < ID_WALK_INTERVAL {
                    crate::rt::sleep(ID_WALK_INTERVAL - waited).await;
                }
            }
            self.walk_ids(Some(seen)).await?;
            for id in ids {
                if let Some(quota) = over(id) {
                    return Err(FsError::Pool(PoolError::QuotaExceeded(format!(
                        "{}: a write of {bytes} bytes would pass {}{} of {quota} ({} used)",
                        self.name(),
                        id.0.quota_prefix(),
                        id.1,
                        space.bound(id)
                    ))));
                }
            }
        }
        for id in ids {
            IdSpace::add(&space.since, id, bytes);
            IdSpace::add(&space.in_flight, id, bytes);
        }
        Ok(IdAdmitted {
            space: Some(space),
            ids,
            bytes,
        })
    }

    /// A file of `used` bytes changed owner (`chown`) or project (`chattr
    /// -p`): its space counts against the new ids from now on (not refused
    /// by their quotas, as in OpenZFS).
    pub(super) fn note_owner_change(&self, new: &[(IdKind, u32)], used: u64) {
        if self.ids.quotas.borrow().is_empty() {
            return;
        }
        for id in new {
            IdSpace::add(&self.ids.since, *id, used);
        }
    }

    /// Walks every object for the space each user and group owns, with
    /// the blocks held in memory and the writes in flight. With
    /// `Some(seen)`, not if a walk ended since the caller last looked
    /// (`seen`, when the walk it saw ended): writers waiting at a limit
    /// share one walk. A dnode that cannot be read is left out (and
    /// reported): the others still count. The caller holds the lock
    /// shared.
    async fn walk_ids(&self, seen: Option<Option<crate::rt::Instant>>) -> Result<(), FsError> {
        let space = &self.ids;
        let _one = space.walking.acquire(1).await;
        if seen.is_some_and(|seen| space.walked_at.get() != seen) {
            return Ok(());
        }
        // In flight and held first, then the objects: a block linked in
        // between counts twice (an upper bound), never not at all.
        let mut found: FxHashMap<(IdKind, u32), u64> = space.in_flight.borrow().clone();
        let held: Vec<(u64, u64)> = self.held_behind_by_file();
        for (ino, bytes) in held {
            if let Some(ids) = self.objects.get(ino).as_deref().and_then(owners) {
                for id in ids {
                    *found.entry(id).or_insert(0) += bytes;
                }
            }
        }
        // What was admitted so far leaves `since` only if the walk ends.
        let since_at_start = space.since.borrow().clone();
        let mut unreadable = 0u64;
        for ino in 1..self.header.get().next_object {
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            let dnode = match self.objects.peek_dnode(ino).await {
                Ok(Some(dnode)) => dnode,
                Ok(None) => continue,
                Err(error) => {
                    unreadable += 1;
                    if unreadable == 1 {
                        eprintln!(
                            "ironpool: {}: object {ino} left out of the user and group space: {error}",
                            self.name()
                        );
                    }
                    continue;
                }
            };
            if crate::format::sealed_bonus::is_sealed(&dnode.bonus) {
                // Its owners are sealed: no figure rather than a wrong one.
                return Err(FsError::Pool(PoolError::KeyUnavailable(format!(
                    "{} is encrypted: load its key to count its users' and groups' space",
                    self.name()
                ))));
            }
            let Ok(znode) = Znode::decode(&dnode.bonus) else {
                continue;
            };
            for id in znode_owners(&znode) {
                let entry = found.entry(id).or_insert(0);
                *entry = entry.saturating_add(dnode.used_bytes);
            }
        }
        *space.walked.borrow_mut() = found;
        space.walked_at.set(Some(crate::rt::now()));
        let mut since = space.since.borrow_mut();
        for (id, bytes) in since_at_start {
            if let Some(now) = since.get_mut(&id) {
                *now = now.saturating_sub(bytes);
            }
        }
        since.retain(|_, bytes| *bytes > 0);
        Ok(())
    }

    /// `userspace`, `groupspace` and `projectspace`: the space every id
    /// of `kinds` owning an object uses, and those with a quota, from one
    /// walk. The caller holds the lock shared.
    pub(in crate::pool) async fn id_usage(
        &self,
        kinds: &[IdKind],
    ) -> Result<Vec<IdUsage>, FsError> {
        self.walk_ids(None).await?;
        let walked = self.ids.walked.borrow();
        let quotas = self.ids.quotas.borrow();
        let mut ids: Vec<(IdKind, u32)> = walked
            .keys()
            .chain(quotas.keys())
            .filter(|(kind, _)| kinds.contains(kind))
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids
            .into_iter()
            .map(|id| IdUsage {
                kind: id.0,
                id: id.1,
                used_bytes: walked.get(&id).copied().unwrap_or(0),
                quota_bytes: quotas.get(&id).copied(),
            })
            .collect())
    }
}

impl Pool {
    /// [`Filesystem::id_usage`] of filesystem `name`.
    pub async fn id_space(
        self: &Rc<Self>,
        name: &str,
        kinds: &[IdKind],
    ) -> Result<Vec<IdUsage>, PoolError> {
        let fs = self.filesystem(name)?;
        let _shared = fs.shared().await;
        fs.id_usage(kinds).await.map_err(|error| match error {
            FsError::Pool(error) => error,
            other => PoolError::Io(other.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_properties_name_ids() {
        assert_eq!(
            id_property("userquota@1000"),
            Some((IdKind::User, true, "1000"))
        );
        assert_eq!(
            id_property("groupused@wheel"),
            Some((IdKind::Group, false, "wheel"))
        );
        assert_eq!(id_property("quota"), None);
        assert_eq!(
            validate_id_quota("userquota@root", "10M").unwrap(),
            Some(("userquota@0".to_string(), (10u64 << 20).to_string()))
        );
        assert_eq!(
            validate_id_quota("groupquota@7", "none").unwrap(),
            Some(("groupquota@7".to_string(), "none".to_string()))
        );
        assert!(validate_id_quota("userused@0", "1M").is_err());
        assert_eq!(
            validate_id_quota("projectquota@42", "1G").unwrap(),
            Some(("projectquota@42".to_string(), (1u64 << 30).to_string()))
        );
        assert!(validate_id_quota("projectquota@web", "1G").is_err());
        assert_eq!(
            id_property("projectused@7"),
            Some((IdKind::Project, false, "7"))
        );
        assert!(validate_id_quota("userquota@no-such-user-here", "1M").is_err());
        assert_eq!(validate_id_quota("compression", "lz4").unwrap(), None);
        let properties: BTreeMap<String, String> = [
            ("userquota@5", "100"),
            ("groupquota@6", "none"),
            ("quota", "7"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        let quotas = id_quotas(&properties);
        assert_eq!(quotas.len(), 1);
        assert_eq!(quotas.get(&(IdKind::User, 5)), Some(&100));
    }
}
