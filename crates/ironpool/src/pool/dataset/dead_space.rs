//! The space a dead list holds, summed by birth txg, so that `list` and
//! `get` answer without reading every pointer of every list each time.
//!
//! A snapshot's `used` is the space on the next dead list born after the
//! snapshot before it; a dataset's `usedbysnapshots` is the space on all
//! its lists born after its origin. Both are sums over a range of birth
//! txgs, so a list's summary is its space by birth txg ([`DeadSpace`]).
//!
//! Dead lists only grow (a txg build appends what the head let go; a
//! snapshot's destroy appends what the next list keeps to the snapshot's
//! own) or are dropped whole. A summary is cached with the length it
//! covers and extended by the tail on the next query. A summary is read a
//! slice at a time with a turn of the engine's loop between, so a large
//! list does not hold the pool's clients (a 3 GiB overwrite's 196k
//! pointers held them 30-130 ms when `list` read them in one go).
//!
//! A list dropped while a query reads it (a destroy, a rollback) restarts
//! the query: every drop moves the pool's dead-list epoch on, and a query
//! that sees it move starts again, the last time under the admin lock.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::format::bp::BLOCK_POINTER_BYTES;
use crate::format::BlockPointer;
use crate::pool::{Pool, PoolError};

/// Distinct birth txgs a cached summary may hold: 4096 take about 200 KiB.
/// A list born of more txgs than that (a long-lived dataset's) is summed
/// again, a slice at a time, at each query.
pub const DEAD_SPACE_BIRTHS_MAX: usize = 4096;

/// Dead lists whose summaries stay cached: with [`DEAD_SPACE_BIRTHS_MAX`],
/// at most 50 MiB, and typically a few KiB each (a list is born of the
/// txgs between two snapshots).
pub const DEAD_SPACE_LISTS_MAX: usize = 256;

/// Attempts at a space query that concurrent drops of dead lists restart,
/// before one more under the admin lock (which every drop of a dataset's
/// list holds).
const SPACE_QUERY_ATTEMPTS: usize = 3;

/// The space of one birth txg's blocks on a dead list.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct BirthSpace {
    /// Bytes allocated (all levels).
    allocated: u64,
    /// Logical bytes of data blocks (level 0).
    logical: u64,
}

/// The space of a set of block pointers by birth txg.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub(crate) struct DeadSpace {
    by_birth: BTreeMap<u64, BirthSpace>,
}

impl DeadSpace {
    /// Counts one more pointer.
    pub(crate) fn add(&mut self, pointer: &BlockPointer) {
        let space = self.by_birth.entry(pointer.birth_txg).or_default();
        space.allocated += pointer.allocated_bytes();
        if pointer.level == 0 {
            space.logical += pointer.logical_size as u64;
        }
    }

    /// Counts every pointer of another summary.
    pub(crate) fn merge(&mut self, other: &DeadSpace) {
        for (birth, theirs) in &other.by_birth {
            let space = self.by_birth.entry(*birth).or_default();
            space.allocated += theirs.allocated;
            space.logical += theirs.logical;
        }
    }

    /// Bytes allocated by all the blocks.
    pub(crate) fn allocated(&self) -> u64 {
        self.by_birth.values().map(|space| space.allocated).sum()
    }

    /// Bytes allocated by the blocks born after `txg`.
    pub(crate) fn allocated_after(&self, txg: u64) -> u64 {
        self.after(txg).map(|space| space.allocated).sum()
    }

    /// Logical bytes of the data blocks born after `txg`.
    pub(crate) fn logical_after(&self, txg: u64) -> u64 {
        self.after(txg).map(|space| space.logical).sum()
    }

    fn after(&self, txg: u64) -> impl Iterator<Item = &BirthSpace> {
        self.by_birth
            .range(txg.saturating_add(1)..)
            .map(|(_, space)| space)
    }
}

/// A cached summary: of the list created in `creation_txg` (an object id
/// freed and reused is another list), covering its first `bytes`.
struct CachedSummary {
    creation_txg: u64,
    bytes: u64,
    space: DeadSpace,
}

/// The pool's cache of dead-list summaries and the epoch of list drops.
#[derive(Default)]
pub(in crate::pool) struct DeadSpaceCache {
    summaries: RefCell<FxHashMap<u64, CachedSummary>>,
    epoch: Cell<u64>,
}

impl DeadSpaceCache {
    /// The epoch a query starts in.
    pub(in crate::pool) fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Dead list `object_id` is dropped or rewritten: its summary goes, and
    /// queries reading meanwhile start again.
    pub(in crate::pool) fn forget(&self, object_id: u64) {
        self.summaries.borrow_mut().remove(&object_id);
        self.epoch.set(self.epoch.get() + 1);
    }
}

impl Pool {
    /// Runs `query` (of `dataset`'s space) until no dead list is dropped
    /// while it reads: [`SPACE_QUERY_ATTEMPTS`] times in the epoch it
    /// starts in, then once under the admin lock (with no epoch).
    pub(in crate::pool) async fn restarting_space_query<T, Query, Answer>(
        &self,
        dataset: &str,
        query: Query,
    ) -> Result<T, PoolError>
    where
        Query: Fn(Option<u64>) -> Answer,
        Answer: std::future::Future<Output = Result<Option<T>, PoolError>>,
    {
        for _ in 0..SPACE_QUERY_ATTEMPTS {
            if let Some(answer) = query(Some(self.datasets.dead_space.epoch())).await? {
                return Ok(answer);
            }
        }
        let _admin = self.datasets.admin_lock.acquire(1).await;
        query(None).await?.ok_or_else(|| {
            PoolError::Corrupt(format!("{dataset}: a dead list went under the admin lock"))
        })
    }

    /// The space on dead list `object_id` (0: none), from its cached summary
    /// and the pointers appended since, read a slice at a time. None when a
    /// list was dropped since the query began in `epoch` (it starts again);
    /// no epoch: the caller holds the admin lock, and no list is dropped.
    pub(in crate::pool) async fn dead_list_space(
        &self,
        object_id: u64,
        epoch: Option<u64>,
    ) -> Result<Option<DeadSpace>, PoolError> {
        let cache = &self.datasets.dead_space;
        let moved = || epoch.is_some_and(|epoch| epoch != cache.epoch());
        if moved() {
            return Ok(None);
        }
        if object_id == 0 {
            return Ok(Some(DeadSpace::default()));
        }
        let dnode = self.dead_list_object(object_id)?.dnode();
        let pointer = BLOCK_POINTER_BYTES as u64;
        let end = dnode.length_bytes / pointer * pointer;
        let (mut offset, mut space) = match cache.summaries.borrow_mut().remove(&object_id) {
            Some(cached) if cached.creation_txg == dnode.creation_txg && cached.bytes <= end => {
                (cached.bytes, cached.space)
            }
            _ => (0, DeadSpace::default()),
        };
        while offset < end {
            // The read may wait for the devices, and the list be dropped
            // meanwhile: then what it read (or its error) means nothing.
            let slice = self.dead_list_slice(object_id, offset).await;
            if moved() {
                return Ok(None);
            }
            let Some(slice) = slice? else {
                break;
            };
            offset += slice.len() as u64 * pointer;
            for pointer in &slice {
                space.add(pointer);
            }
            crate::rt::yield_now().await;
            if moved() {
                return Ok(None);
            }
        }
        if space.by_birth.len() <= DEAD_SPACE_BIRTHS_MAX {
            let mut summaries = cache.summaries.borrow_mut();
            if summaries.len() >= DEAD_SPACE_LISTS_MAX {
                if let Some(evicted) = summaries.keys().next().copied() {
                    summaries.remove(&evicted);
                }
            }
            summaries.insert(
                object_id,
                CachedSummary {
                    creation_txg: dnode.creation_txg,
                    bytes: offset,
                    space: space.clone(),
                },
            );
        }
        Ok(Some(space))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectType;

    /// A pointer born in `birth_txg` at `level`, allocating `allocated`
    /// bytes (one copy) for twice that many logical ones.
    fn pointer(birth_txg: u64, level: u8, allocated: u32) -> BlockPointer {
        let mut pointer = BlockPointer::hole(level, ObjectType::VolumeData, birth_txg);
        pointer.dvas[0].asize = allocated;
        pointer.physical_size = allocated;
        pointer.logical_size = allocated * 2;
        pointer
    }

    #[test]
    fn sums_after_a_txg_count_only_the_blocks_born_later() {
        let mut space = DeadSpace::default();
        space.add(&pointer(5, 0, 4096));
        space.add(&pointer(7, 0, 8192));
        space.add(&pointer(7, 1, 512));
        let mut other = DeadSpace::default();
        other.add(&pointer(9, 0, 4096));
        other.add(&pointer(5, 0, 4096));
        space.merge(&other);
        let allocated: Vec<u64> = [0, 4, 5, 6, 7, 8, 9]
            .into_iter()
            .map(|txg| space.allocated_after(txg))
            .collect();
        assert_eq!(
            allocated,
            [20992, 20992, 12800, 12800, 4096, 4096, 0],
            "allocated after each txg"
        );
        // The logical figure counts data blocks (level 0) only.
        assert_eq!(space.logical_after(6), 2 * (8192 + 4096));
        assert_eq!(space.logical_after(0), 2 * (4096 + 8192 + 4096 + 4096));
    }
}
