//! Space allocation: each top-level vdev is cut into metaslabs (regions of
//! 2^metaslab_shift bytes); each metaslab tracks its free space in memory and logs
//! its allocations and frees, txg by txg, to a space map object on disk.
//!
//! The life of a range:
//! 1. `allocate` takes it from the free set (in memory only). If the write fails or
//!    the process dies before the block is linked into a tree, nothing on disk
//!    refers to it and it is free again (`release`, or simply at the next import).
//! 2. `commit` records it as allocated in the open txg (when the block is linked).
//! 3. `free` records it as freed in the open txg (when a tree stops referring to it).
//!    It becomes allocatable again only after the txg two later has committed
//!    (the two defer slots), so that the last two uberblocks' trees stay intact:
//!    import may fall back to the previous uberblock if the newest is damaged.
//!
//! Data and metadata allocate from different cursors so that data blocks written
//! together land contiguously (one large device write after aggregation), and the
//! second copy of metadata lands far from the first.
//!
//! A data run starts in the largest free extent of the metaslabs data may use
//! (each metaslab's free set is indexed by size), and the cursor follows that
//! extent to its end. Random overwrites of small blocks cut free space into
//! holes of every size; taking the largest first leaves the small ones to grow
//! as their neighbours are freed, where filling holes as they come would cut
//! every write-back batch into short pieces. (OpenZFS weighs its metaslabs by
//! their largest free segment for the same reason.)
//!
//! They also keep to different metaslabs. Random overwrites of small data
//! blocks free holes of that size everywhere; if metadata shared those
//! metaslabs, a commit could find no room for a 32 KiB indirect block while
//! hundreds of megabytes are free in 4 KiB holes (and the pool would suspend).
//! A metaslab metadata allocates in is owned by metadata until it is empty
//! again; data keeps out of it and leaves enough empty metaslabs for the
//! metadata reserve, using them only when nothing else fits.

pub mod rangeset;

use crate::format::spacemap::Record;
use crate::format::Dva;
use crate::vdev::raidz::RaidzGeometry;
pub use rangeset::{RangeError, RangeSet};

/// Number of txgs a freed range waits before reuse.
pub const DEFER_TXGS: u64 = 2;

/// Free extents smaller than this are not discarded (OpenZFS's
/// `zfs_trim_extent_bytes_min`): each discard is a device command, and a
/// small one gives back little; its neighbours freed later make it larger.
pub const TRIM_EXTENT_BYTES_MIN: u64 = 32 * 1024;
/// A free extent is discarded in pieces of at most this: bounds how long one
/// discard occupies the device and how much space it holds out of
/// allocation (OpenZFS allows 128 MiB, holding a whole metaslab out while
/// it trims; here only the pieces in flight are held).
pub const TRIM_EXTENT_BYTES_MAX: u64 = 16 << 20;
/// Free space held out of allocation by discards in flight, at most: what
/// a full pool's writers may wait for, and never more than leaves the slop
/// and the metadata reserve free (a txg must always find room for its
/// metadata).
pub const TRIM_HELD_BYTES_MAX: u64 = 64 << 20;

/// Free space held out of allocation while it is discarded: `[start, end)`
/// of top-level vdev `vdev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimExtent {
    pub vdev: u32,
    pub start: u64,
    pub end: u64,
}

/// Share of the pool kept free for metadata: data allocations fail with ENOSPC
/// before the last 1/32 is used (at least `SLOP_BYTES_MIN`), so that a txg can
/// always commit its metadata even when clients fill the pool.
pub const SLOP_SHIFT: u32 = 5;
pub const SLOP_BYTES_MIN: u64 = 16 * 1024 * 1024;

/// One region of a top-level vdev.
#[derive(Debug)]
pub struct Metaslab {
    pub index: u32,
    /// Start offset in the vdev's data area.
    pub start: u64,
    pub size: u64,
    /// Allocatable now (indexed by size: data runs start in the largest extent).
    pub free: RangeSet,
    /// Allocated as far as the on-disk space map says (updated at each sync).
    pub allocated: RangeSet,
    /// Metadata allocated here: data stays out while anything is allocated, so
    /// the holes metadata frees stay for metadata (in memory; set again after
    /// import as metadata allocates).
    metadata_owned: bool,
    /// Linked in the open txg, not yet logged.
    pub pending_allocs: RangeSet,
    /// Freed in the open txg, not yet logged.
    pub pending_frees: RangeSet,
    /// Freed in the syncing txg (logged, waiting to enter a defer slot).
    pub syncing_frees: RangeSet,
    /// Freed in recent txgs, by txg % DEFER_TXGS.
    pub defer: [RangeSet; DEFER_TXGS as usize],
    /// Free (on disk too) but held out of allocation while a discard of it
    /// runs: a block written there meanwhile could be discarded under it.
    pub trimming: RangeSet,
    /// Free space autotrim has yet to discard: a part of `free` (still
    /// allocatable; an allocation takes it out of here too), taken out of
    /// allocation only for the moment its discard runs.
    pub trim_pending: RangeSet,
    /// The space map object holding this metaslab's checkpoint (0: none yet).
    pub space_map_object: u64,
    /// The txg the checkpoint describes: the space log's records of later txgs
    /// apply on top of it.
    pub flushed_txg: u64,
    /// The oldest txg whose changes to this metaslab are only in the space log
    /// (0: none): the log cannot be trimmed past it until the metaslab is
    /// checkpointed again.
    pub unflushed_txg: u64,
}

impl Metaslab {
    /// The states a byte of the metaslab can be in, by name: disjoint, and
    /// between them every byte but those allocated and not yet linked (or
    /// intent-log blocks, never recorded).
    fn states(&self) -> [(&'static str, &RangeSet); 7] {
        [
            ("free", &self.free),
            ("trimming", &self.trimming),
            ("allocated", &self.allocated),
            ("pending_allocs", &self.pending_allocs),
            ("syncing_frees", &self.syncing_frees),
            ("defer0", &self.defer[0]),
            ("defer1", &self.defer[1]),
        ]
    }

    fn new(index: u32, start: u64, size: u64) -> Metaslab {
        let mut free = RangeSet::by_size();
        free.insert(start, start + size);
        Metaslab {
            index,
            start,
            size,
            free,
            metadata_owned: false,
            allocated: RangeSet::new(),
            pending_allocs: RangeSet::new(),
            pending_frees: RangeSet::new(),
            syncing_frees: RangeSet::new(),
            defer: [RangeSet::new(), RangeSet::new()],
            trimming: RangeSet::new(),
            trim_pending: RangeSet::new(),
            space_map_object: 0,
            flushed_txg: 0,
            unflushed_txg: 0,
        }
    }

    /// Nothing allocated, pending or deferred here: the whole metaslab is free.
    fn is_empty(&self) -> bool {
        self.free.total_bytes() == self.size
    }

    pub fn has_pending(&self) -> bool {
        !self.pending_allocs.is_empty() || !self.pending_frees.is_empty()
    }

    /// Replays this metaslab's checkpoint followed by its log records (import).
    /// `last_txg` is the txg being imported: frees of the last `DEFER_TXGS` txgs
    /// stay deferred.
    pub fn replay(&mut self, records: &[Record], last_txg: u64) -> Result<(), RangeError> {
        let mut txg = 0;
        let mut allocated = RangeSet::new();
        let mut recent_frees: Vec<(u64, u64, u64)> = Vec::new();
        for record in records {
            match *record {
                Record::Txg(value) => txg = value,
                Record::Vdev(_) => {}
                Record::Allocate { offset, length } => {
                    self.check_inside(offset, length)?;
                    allocated.try_insert(offset, offset + length)?;
                }
                Record::Free { offset, length } => {
                    self.check_inside(offset, length)?;
                    allocated.try_remove(offset, offset + length)?;
                    if txg + DEFER_TXGS > last_txg {
                        recent_frees.push((txg, offset, offset + length));
                    }
                }
            }
        }
        let mut free = RangeSet::by_size();
        free.insert(self.start, self.start + self.size);
        for (start, end) in allocated.iter() {
            free.try_remove(start, end)?;
        }
        let mut defer = [RangeSet::new(), RangeSet::new()];
        for (txg, start, end) in recent_frees {
            // A range freed, reallocated and freed again within the window is
            // listed twice; it is deferred once (in its latest slot is enough).
            if free.contains(start, end) {
                free.remove(start, end);
                defer[(txg % DEFER_TXGS) as usize].insert(start, end);
            }
        }
        self.free = free;
        self.allocated = allocated;
        self.defer = defer;
        Ok(())
    }

    fn check_inside(&self, offset: u64, length: u64) -> Result<(), RangeError> {
        if offset < self.start || offset + length > self.start + self.size {
            return Err(RangeError {
                start: offset,
                end: offset + length,
                problem: "lies outside its metaslab",
            });
        }
        Ok(())
    }

    /// A checkpoint of this metaslab as of the last committed txg `txg` (taken
    /// before the syncing txg's changes are applied): the allocated ranges —
    /// counting still-deferred frees as allocated — then those frees with their
    /// txgs, so an import that lands within the defer window defers them again.
    pub fn checkpoint_records(&self, txg: u64) -> Vec<Record> {
        let mut held = self.allocated.clone();
        let mut recent: Vec<(u64, &RangeSet)> = Vec::new();
        for back in 0..DEFER_TXGS {
            let Some(freed_txg) = txg.checked_sub(back) else {
                continue;
            };
            let slot = &self.defer[(freed_txg % DEFER_TXGS) as usize];
            if !slot.is_empty() {
                held.insert_all(slot);
                recent.push((freed_txg, slot));
            }
        }
        let mut records = vec![Record::Txg(txg)];
        records.extend(held.iter().map(|(start, end)| Record::Allocate {
            offset: start,
            length: end - start,
        }));
        recent.sort_by_key(|(freed_txg, _)| *freed_txg);
        for (freed_txg, slot) in recent {
            records.push(Record::Txg(freed_txg));
            records.extend(slot.iter().map(|(start, end)| Record::Free {
                offset: start,
                length: end - start,
            }));
        }
        records
    }
}

/// `[start, end)` cut into discards of at most [`TRIM_EXTENT_BYTES_MAX`].
fn trim_pieces(vdev: u32, start: u64, end: u64) -> impl Iterator<Item = TrimExtent> {
    (start..end)
        .step_by(TRIM_EXTENT_BYTES_MAX as usize)
        .map(move |piece| TrimExtent {
            vdev,
            start: piece,
            end: (piece + TRIM_EXTENT_BYTES_MAX).min(end),
        })
}

/// Space of one top-level vdev.
#[derive(Debug)]
pub struct VdevSpace {
    pub vdev: u32,
    pub sector_bytes: u64,
    /// A RAID-Z group's layout: a block takes its data, parity and pad sectors.
    raidz: Option<RaidzGeometry>,
    pub metaslab_shift: u8,
    pub metaslabs: Vec<Metaslab>,
    /// The object listing this vdev's space map objects (0: not created yet).
    pub array_object: u64,
    /// A log device: only intent-log blocks go here (see
    /// [`Allocator::allocate_log`]), and its space is not the pool's.
    pub log: bool,
    /// Being removed (`pool::removal`): nothing new is allocated here and
    /// its space is no longer the pool's, as OpenZFS takes a removing
    /// vdev's space out of the pool at the start.
    pub removing: bool,
    data_cursor: (usize, u64),
    metadata_cursors: [(usize, u64); 2],
}

impl VdevSpace {
    pub fn new(vdev: u32, asize_bytes: u64, metaslab_shift: u8, sector_bytes: u64) -> VdevSpace {
        let size = 1u64 << metaslab_shift;
        let count = (asize_bytes >> metaslab_shift) as u32;
        let mut metaslabs: Vec<Metaslab> = (0..count)
            .map(|index| Metaslab::new(index, index as u64 * size, size))
            .collect();
        let half = count as usize / 2;
        // Metadata starts at its cursors, here and after every import (ownership
        // is not on disk): data keeps out of these once they hold anything.
        for index in [count.saturating_sub(1) as usize, half.saturating_sub(1)] {
            if let Some(metaslab) = metaslabs.get_mut(index) {
                metaslab.metadata_owned = true;
            }
        }
        VdevSpace {
            vdev,
            sector_bytes,
            raidz: None,
            metaslab_shift,
            metaslabs,
            array_object: 0,
            log: false,
            removing: false,
            data_cursor: (0, 0),
            metadata_cursors: [
                (count.saturating_sub(1) as usize, 0),
                (half.saturating_sub(1), 0),
            ],
        }
    }

    /// The space of a log device (see [`VdevSpace::log`]).
    pub fn for_log(mut self) -> VdevSpace {
        self.log = true;
        self
    }

    /// The space of a RAID-Z group: allocations are sized by its geometry.
    pub fn with_raidz(mut self, geometry: RaidzGeometry) -> VdevSpace {
        self.raidz = Some(geometry);
        self
    }

    /// Bytes a block of `physical_bytes` takes on this vdev.
    pub fn asize(&self, physical_bytes: u64) -> u64 {
        match &self.raidz {
            Some(geometry) => geometry.asize(physical_bytes),
            None => physical_bytes.div_ceil(self.sector_bytes) * self.sector_bytes,
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.metaslabs
            .iter()
            .map(|metaslab| metaslab.free.total_bytes())
            .sum()
    }

    pub fn size_bytes(&self) -> u64 {
        self.metaslabs.iter().map(|metaslab| metaslab.size).sum()
    }

    /// True when data and metadata may be placed here: a vdev of the
    /// pool's space (not a log device, not being removed, not removed).
    fn takes_blocks(&self) -> bool {
        !self.log && !self.removing && !self.metaslabs.is_empty()
    }

    /// Space still in use here: allocated on disk or in the open txg, less
    /// what the open txg freed (deferred frees are no longer in use).
    pub fn live_ranges(&self) -> RangeSet {
        let mut live = RangeSet::new();
        for metaslab in &self.metaslabs {
            for (start, end) in metaslab
                .allocated
                .iter()
                .chain(metaslab.pending_allocs.iter())
            {
                live.insert(start, end);
            }
            for (start, end) in metaslab.pending_frees.iter() {
                live.remove(start, end);
            }
        }
        live
    }

    /// Bytes handed out by allocation and not yet recorded as in use or
    /// freed: blocks being written and not linked, and intent-log blocks
    /// (never recorded, see [`Allocator::allocate_log`]).
    pub fn unsettled_bytes(&self) -> u64 {
        self.metaslabs
            .iter()
            .map(|metaslab| {
                let accounted = metaslab
                    .states()
                    .iter()
                    .map(|(_, set)| set.total_bytes())
                    .sum::<u64>();
                metaslab.size.saturating_sub(accounted)
            })
            .sum()
    }

    /// True when all of `[offset, offset + length)` is in use (see
    /// [`VdevSpace::live_ranges`]).
    pub fn is_live(&self, offset: u64, length: u64) -> bool {
        let Some(end) = offset.checked_add(length) else {
            return false;
        };
        let index = (offset >> self.metaslab_shift) as usize;
        let Some(metaslab) = self.metaslabs.get(index) else {
            return false;
        };
        if end > metaslab.start + metaslab.size || metaslab.pending_frees.overlaps(offset, end) {
            return false;
        }
        metaslab.allocated.contains(offset, end) || metaslab.pending_allocs.contains(offset, end)
    }

    /// How broken up the free space is, percent, as OpenZFS's
    /// `fragmentation`: each free extent weighted by its size's share of
    /// [`FRAGMENTATION_BY_SIZE`] (a 16 MiB extent counts 0%, 8 KiB and less
    /// about 100%). None when nothing is free. From each metaslab's free
    /// bytes by length class, kept as its free space changes: 64 sums per
    /// metaslab, not a walk of every free extent.
    pub fn fragmentation_percent(&self) -> Option<u64> {
        let mut weighted = 0u128;
        let mut free = 0u128;
        for metaslab in &self.metaslabs {
            let walked;
            let classes = match metaslab.free.bytes_by_size_class() {
                Some(classes) => classes,
                None => {
                    let mut classes = [0u64; rangeset::SIZE_CLASSES];
                    for (start, end) in metaslab.free.iter() {
                        classes[rangeset::size_class(end - start)] += end - start;
                    }
                    walked = classes;
                    &walked
                }
            };
            for (class, &bytes) in classes.iter().enumerate() {
                let bucket = class.saturating_sub(9).min(FRAGMENTATION_BY_SIZE.len() - 1);
                weighted += u128::from(bytes) * u128::from(FRAGMENTATION_BY_SIZE[bucket]);
                free += u128::from(bytes);
            }
        }
        (free > 0).then(|| (weighted / free) as u64)
    }

    fn metaslab_of(&mut self, offset: u64) -> &mut Metaslab {
        let index = (offset >> self.metaslab_shift) as usize;
        &mut self.metaslabs[index]
    }

    /// Allocates from a cursor and returns the offset with the next cursor.
    /// Data carries on in the free extent the cursor is in; when that is used
    /// up, it starts over in the largest free extent of the metaslabs it may
    /// use. Metadata takes the first fit at or after its cursor in its
    /// metaslab. Either then falls back to first fit in the other metaslabs,
    /// most free space first.
    ///
    /// Metadata and data keep to separate metaslabs. Random overwrites of small
    /// data blocks leave free space in holes of their size; metadata blocks are
    /// larger (32 KiB indirect blocks) and a commit that cannot place them
    /// fails. So metadata takes a metaslab it owns, then an empty one, then any;
    /// data keeps out of metaslabs metadata owns and takes an empty one only while
    /// the free space metadata owns plus the other empty metaslabs still cover
    /// `metadata_reserve` (the next commit's metadata on this vdev), else only
    /// when nothing else fits.
    fn allocate_from(
        &mut self,
        cursor: (usize, u64),
        size: u64,
        avoid: Option<usize>,
        metadata: bool,
        metadata_reserve: u64,
    ) -> Option<(u64, (usize, u64))> {
        let (index, position) = cursor;
        let take = |metaslab: &mut Metaslab, start: u64| {
            // Data in an empty metaslab ends metadata's claim on it; data as a
            // last resort in one metadata still uses leaves the claim.
            metaslab.metadata_owned = metadata || (metaslab.metadata_owned && !metaslab.is_empty());
            metaslab.free.remove(start, start + size);
            metaslab
                .trim_pending
                .remove_overlapping(start, start + size);
            Some((start, (metaslab.index as usize, start + size)))
        };
        // The cursor's metaslab: metadata's own, or for data one holding data.
        let cursor_usable = Some(index) != avoid
            && (metadata
                || (!self.metaslabs[index].metadata_owned && !self.metaslabs[index].is_empty()));
        if cursor_usable {
            let metaslab = &mut self.metaslabs[index];
            if metadata {
                // Metadata: any hole at or after the cursor (when one fits at
                // all: the walk would visit every hole for nothing).
                if metaslab.free.largest_segment() >= size {
                    if let Some(start) = metaslab.free.first_fit(position.max(metaslab.start), size)
                    {
                        return take(metaslab, start);
                    }
                }
            } else {
                // Data: carry on in the extent the cursor is in.
                let at = position.max(metaslab.start);
                if metaslab.free.contains(at, at + size) {
                    return take(metaslab, at);
                }
            }
        }
        // Data may take an empty metaslab while metadata's free space and the
        // other empty metaslabs still cover the reserve (metadata never asks).
        let empty_to_spare = !metadata && {
            let (empty_count, owned_free) =
                self.metaslabs
                    .iter()
                    .fold((0u64, 0u64), |(empty, owned), metaslab| {
                        match (metaslab.is_empty(), metaslab.metadata_owned) {
                            (true, _) => (empty + 1, owned),
                            (false, true) => (empty, owned + metaslab.free.total_bytes()),
                            (false, false) => (empty, owned),
                        }
                    });
            owned_free + empty_count.saturating_sub(1) * (1u64 << self.metaslab_shift)
                >= metadata_reserve
        };
        // Preference rank of a metaslab for this allocation (lower first; None: not now).
        let rank = |metaslab: &Metaslab, last_resort: bool| -> Option<u8> {
            let empty = metaslab.is_empty();
            if metadata {
                return Some(if metaslab.metadata_owned && !empty {
                    0
                } else if empty {
                    1
                } else {
                    2
                });
            }
            match (metaslab.metadata_owned && !empty, empty) {
                (false, false) => Some(0),
                // An empty metaslab to spare ranks with data's.
                (_, true) if empty_to_spare => Some(0),
                _ if last_resort => Some(2),
                _ => None,
            }
        };
        if !metadata {
            // The cursor's extent is used up: the next run starts in the
            // largest free extent of any metaslab data may use now (of
            // equals, one in a metaslab metadata has not claimed, then the
            // lowest-numbered).
            let best = (0..self.metaslabs.len())
                .filter(|&candidate| {
                    Some(candidate) != avoid && rank(&self.metaslabs[candidate], false) == Some(0)
                })
                .filter_map(|candidate| {
                    self.metaslabs[candidate]
                        .free
                        .largest()
                        .map(|(start, end)| (end - start, candidate, start))
                })
                .max_by_key(|&(length, candidate, _)| {
                    (
                        length,
                        !self.metaslabs[candidate].metadata_owned,
                        std::cmp::Reverse(candidate),
                    )
                });
            if let Some((length, candidate, start)) = best {
                if length >= size {
                    return take(&mut self.metaslabs[candidate], start);
                }
            }
        }
        for last_resort in [false, true] {
            let mut candidates: Vec<(u8, usize)> = (0..self.metaslabs.len())
                // (The size index answers whether `size` fits at all, without
                // walking a fragmented metaslab's holes.)
                .filter(|&candidate| {
                    Some(candidate) != avoid
                        && self.metaslabs[candidate].free.largest_segment() >= size
                })
                .filter_map(|candidate| {
                    rank(&self.metaslabs[candidate], last_resort).map(|rank| (rank, candidate))
                })
                .collect();
            candidates.sort_by_key(|&(rank, candidate)| {
                (
                    rank,
                    std::cmp::Reverse(self.metaslabs[candidate].free.total_bytes()),
                    candidate,
                )
            });
            let found = candidates.into_iter().find_map(|(_, candidate)| {
                let start = self.metaslabs[candidate]
                    .free
                    .first_fit(self.metaslabs[candidate].start, size)?;
                Some((candidate, start))
            });
            if let Some((candidate, start)) = found {
                return take(&mut self.metaslabs[candidate], start);
            }
            if metadata {
                break;
            }
        }
        None
    }
}

/// What a block is, for placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockClass {
    Data,
    /// Metadata copy 0 or 1 (ditto copies are placed apart).
    Metadata(usize),
}

/// No space for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of space")]
pub struct NoSpace;

/// Fragmentation percent of a free extent by its size, from 512 bytes
/// (index 0) doubling up to 16 MiB and more (the last): OpenZFS's
/// `zfs_frag_table`, so `fragmentation` reads the same on both.
const FRAGMENTATION_BY_SIZE: [u8; 17] = [
    100, 100, 98, 95, 90, 80, 70, 60, 50, 40, 30, 20, 15, 10, 5, 0, 0,
];

/// Data one top-level vdev takes before the next one's turn, for a vdev as
/// free as the pool (OpenZFS's metaslab aliquot, 1 MiB): long enough that a
/// run of consecutive blocks stays one device write, short enough that the
/// pool's writes stripe over every vdev.
pub const DATA_ALIQUOT_BYTES: u64 = 1 << 20;
/// Bounds of a vdev's share of turns against its free space: a vdev twice
/// as free as the pool takes twice the data per turn (an empty vdev added
/// to a full pool fills first, as OpenZFS's metaslab group bias makes it,
/// without taking every write), within 1/8 and 8 times the aliquot, so
/// every vdev keeps some of the writes and none all of them.
const ALIQUOT_BIAS_MIN: f64 = 0.125;
const ALIQUOT_BIAS_MAX: f64 = 8.0;

/// The pool's allocator: every top-level vdev's space.
#[derive(Debug, Default)]
pub struct Allocator {
    pub vdevs: Vec<VdevSpace>,
    /// The data vdev whose turn it is, the data it took this turn, and how
    /// much it may take ([`Allocator::aliquot_bytes`]).
    rotor: usize,
    rotor_bytes: u64,
    rotor_quota: u64,
    /// Space data allocations must leave for the metadata the open txg will write
    /// at commit (kept up to date by the pool), on top of the slop.
    pub metadata_reserve_bytes: u64,
    /// Running totals (summing ~200 metaslabs per vdev on every allocation would
    /// cost more than the allocation).
    free_total_bytes: u64,
    size_total_bytes: u64,
}

impl Allocator {
    pub fn new(vdevs: Vec<VdevSpace>) -> Allocator {
        let mut allocator = Allocator {
            vdevs,
            rotor: 0,
            rotor_bytes: 0,
            rotor_quota: 0,
            metadata_reserve_bytes: 0,
            free_total_bytes: 0,
            size_total_bytes: 0,
        };
        allocator.recount();
        allocator
    }

    /// Recomputes the running totals from the metaslabs (after import replayed
    /// the space maps into them directly).
    pub fn recount(&mut self) {
        self.free_total_bytes = self.vdevs.iter().map(VdevSpace::free_bytes).sum();
        self.size_total_bytes = self.vdevs.iter().map(VdevSpace::size_bytes).sum();
    }

    /// Adds the space of a new top-level vdev (its id is the next one).
    pub fn add_vdev(&mut self, space: VdevSpace) {
        assert_eq!(space.vdev as usize, self.vdevs.len(), "vdev ids are dense");
        self.vdevs.push(space);
        self.recount();
    }

    /// The pool's size: log devices hold only intent-log blocks, which are
    /// not the pool's space (as in OpenZFS), and a vdev being removed is
    /// no longer the pool's.
    pub fn size_bytes(&self) -> u64 {
        self.size_total_bytes - self.outside_vdevs().map(VdevSpace::size_bytes).sum::<u64>()
    }

    /// Allocatable bytes now (deferred frees not included), log devices not
    /// counted.
    pub fn free_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.free_total_bytes,
            self.vdevs.iter().map(VdevSpace::free_bytes).sum::<u64>()
        );
        self.free_total_bytes - self.outside_vdevs().map(VdevSpace::free_bytes).sum::<u64>()
    }

    /// Vdevs whose space is not the pool's: log devices and a vdev being
    /// removed.
    fn outside_vdevs(&self) -> impl Iterator<Item = &VdevSpace> {
        self.vdevs.iter().filter(|vdev| vdev.log || vdev.removing)
    }

    /// Marks vdev `vdev` as being removed (or no longer): see
    /// [`VdevSpace::removing`].
    pub fn set_removing(&mut self, vdev: u32, removing: bool) {
        let space = &mut self.vdevs[vdev as usize];
        assert!(!space.log, "log devices are removed another way");
        space.removing = removing;
        if self.rotor == vdev as usize {
            self.rotor_quota = 0;
        }
    }

    /// Vdev `vdev` was removed: it has no space from now on (its blocks
    /// are elsewhere, see `pool::removal`).
    pub fn drop_space(&mut self, vdev: u32) {
        let old = &self.vdevs[vdev as usize];
        self.vdevs[vdev as usize] = VdevSpace::new(vdev, 0, old.metaslab_shift, old.sector_bytes);
        if self.rotor == vdev as usize {
            self.rotor_quota = 0;
        }
        self.recount();
    }

    /// Allocates an intent-log block of `physical_bytes` on a log device
    /// `usable` accepts (by vdev id), else, as OpenZFS does without a working
    /// log device, in the pool's metadata space. Log blocks are never
    /// recorded in space maps (see `pool::dataset::intent_log`).
    pub fn allocate_log(
        &mut self,
        physical_bytes: u64,
        usable: impl Fn(u32) -> bool,
    ) -> Result<Dva, NoSpace> {
        for vdev in self.vdevs.iter_mut().filter(|vdev| vdev.log) {
            if !usable(vdev.vdev) {
                continue;
            }
            let size = vdev.asize(physical_bytes);
            let cursor = vdev.metadata_cursors[0];
            if let Some((offset, next_cursor)) = vdev.allocate_from(cursor, size, None, true, 0) {
                vdev.metadata_cursors[0] = next_cursor;
                self.free_total_bytes = self
                    .free_total_bytes
                    .checked_sub(size)
                    .expect("space accounting invariant broken: more allocated than free");
                return Ok(Dva {
                    vdev: vdev.vdev,
                    asize: size as u32,
                    offset,
                });
            }
        }
        self.allocate(physical_bytes, BlockClass::Metadata(0), None)
    }

    /// Free bytes held out of allocation while they are discarded: they
    /// come back as each discard ends.
    pub fn trimming_bytes(&self) -> u64 {
        self.vdevs
            .iter()
            .flat_map(|vdev| vdev.metaslabs.iter())
            .map(|metaslab| metaslab.trimming.total_bytes())
            .sum()
    }

    /// Bytes freed but not yet allocatable (waiting for their txgs to commit).
    pub fn deferred_bytes(&self) -> u64 {
        self.vdevs
            .iter()
            .flat_map(|vdev| vdev.metaslabs.iter())
            .map(|metaslab| {
                metaslab.pending_frees.total_bytes()
                    + metaslab.syncing_frees.total_bytes()
                    + metaslab
                        .defer
                        .iter()
                        .map(RangeSet::total_bytes)
                        .sum::<u64>()
            })
            .sum()
    }

    /// Bytes data may still take: the free space less the slop and the
    /// metadata reserve, which only metadata may use. A data allocation
    /// fails when its block does not fit in this, and it is what a mounted
    /// filesystem reports as available, so that `df` showing room means a
    /// write has room (OpenZFS's `avail` leaves out its slop the same way).
    pub fn data_available_bytes(&self) -> u64 {
        self.free_bytes()
            .saturating_sub(self.slop_bytes() + self.metadata_reserve_bytes)
    }

    /// Bytes held back from data allocations for metadata.
    pub fn slop_bytes(&self) -> u64 {
        (self.size_bytes() >> SLOP_SHIFT)
            .max(SLOP_BYTES_MIN)
            .min(self.size_bytes() / 2)
    }

    /// Allocates space for a block of `physical_bytes` (rounded up to the
    /// vdev's sector, or with parity on RAID-Z).
    /// `avoid_vdev`/`avoid` keep a second copy away from the first.
    pub fn allocate(
        &mut self,
        physical_bytes: u64,
        class: BlockClass,
        avoid: Option<Dva>,
    ) -> Result<Dva, NoSpace> {
        if class == BlockClass::Data {
            let largest = self
                .vdevs
                .iter()
                .filter(|vdev| vdev.takes_blocks())
                .map(|vdev| vdev.asize(physical_bytes) + vdev.sector_bytes)
                .max()
                .unwrap_or(physical_bytes);
            if self.data_available_bytes() < largest {
                return Err(NoSpace);
            }
        }
        let count = self.vdevs.len();
        let normal_count = self
            .vdevs
            .iter()
            .filter(|vdev| vdev.takes_blocks())
            .count()
            .max(1);
        for step in 0..count {
            let vdev_index = (self.rotor + step) % count;
            let vdev = &mut self.vdevs[vdev_index];
            if !vdev.takes_blocks() {
                continue;
            }
            if avoid.is_some_and(|dva| dva.vdev as usize == vdev_index) && normal_count > 1 {
                continue;
            }
            let size = vdev.asize(physical_bytes);
            let avoid_metaslab = avoid
                .filter(|dva| dva.vdev as usize == vdev_index)
                .map(|dva| (dva.offset >> vdev.metaslab_shift) as usize);
            let cursor = match class {
                BlockClass::Data => vdev.data_cursor,
                BlockClass::Metadata(copy) => vdev.metadata_cursors[copy.min(1)],
            };
            let metadata = matches!(class, BlockClass::Metadata(_));
            let metadata_reserve = self.metadata_reserve_bytes / normal_count as u64;
            if let Some((offset, next_cursor)) =
                vdev.allocate_from(cursor, size, avoid_metaslab, metadata, metadata_reserve)
            {
                match class {
                    BlockClass::Data => vdev.data_cursor = next_cursor,
                    BlockClass::Metadata(copy) => vdev.metadata_cursors[copy.min(1)] = next_cursor,
                }
                // The space handed out lies on the vdev, whole sectors.
                assert!(
                    offset.is_multiple_of(vdev.sector_bytes)
                        && size.is_multiple_of(vdev.sector_bytes)
                        && offset + size <= vdev.size_bytes(),
                    "vdev {vdev_index}: allocated {size} bytes at {offset} of {}",
                    vdev.size_bytes()
                );
                self.free_total_bytes = self
                    .free_total_bytes
                    .checked_sub(size)
                    .expect("space accounting invariant broken: more allocated than free");
                if class == BlockClass::Data && normal_count > 1 {
                    self.turn(vdev_index, size);
                }
                return Ok(Dva {
                    vdev: vdev_index as u32,
                    asize: size as u32,
                    offset,
                });
            }
        }
        Err(NoSpace)
    }

    /// Counts `size` bytes of data allocated on `vdev_index` against its
    /// turn, and passes the turn on to the next data vdev once it took its
    /// share: data stripes over the vdevs an aliquot at a time, each
    /// weighted by its free space.
    fn turn(&mut self, vdev_index: usize, size: u64) {
        if vdev_index != self.rotor || self.rotor_quota == 0 {
            // The rotor's vdev was full, or this is the first allocation.
            self.rotor = vdev_index;
            self.rotor_bytes = 0;
            self.rotor_quota = self.aliquot_bytes(vdev_index);
        }
        self.rotor_bytes += size;
        if self.rotor_bytes < self.rotor_quota {
            return;
        }
        let count = self.vdevs.len();
        let next = (1..=count)
            .map(|step| (vdev_index + step) % count)
            .find(|&index| self.vdevs[index].takes_blocks())
            .unwrap_or(vdev_index);
        self.rotor = next;
        self.rotor_bytes = 0;
        self.rotor_quota = self.aliquot_bytes(next);
    }

    /// The data vdev `index` takes per turn: [`DATA_ALIQUOT_BYTES`] times
    /// its free share against the pool's, within the bias bounds.
    pub fn aliquot_bytes(&self, index: usize) -> u64 {
        let vdev = &self.vdevs[index];
        let (free, size) = (vdev.free_bytes(), vdev.size_bytes());
        let (pool_free, pool_size) = (self.free_bytes(), self.size_bytes());
        if size == 0 || pool_free == 0 || pool_size == 0 {
            return DATA_ALIQUOT_BYTES;
        }
        let bias = (free as f64 / size as f64) / (pool_free as f64 / pool_size as f64);
        (DATA_ALIQUOT_BYTES as f64 * bias.clamp(ALIQUOT_BIAS_MIN, ALIQUOT_BIAS_MAX)) as u64
    }

    /// Returns a range that was allocated but never committed (its write failed or
    /// it was superseded before being linked).
    pub fn release(&mut self, dva: Dva) {
        let vdev = &mut self.vdevs[dva.vdev as usize];
        vdev.metaslab_of(dva.offset)
            .free
            .insert(dva.offset, dva.end());
        self.free_total_bytes += dva.asize as u64;
    }

    /// Takes a range that is wholly free, as `allocate` would have (an intent
    /// log replay claiming a block that was written but whose txg never
    /// became durable): `commit` records it once linked, `release` gives it
    /// back. False, with nothing changed, if any of it is not free.
    pub fn claim(&mut self, dva: Dva) -> bool {
        let Some(vdev) = self.vdevs.get_mut(dva.vdev as usize) else {
            return false;
        };
        let in_vdev = dva
            .offset
            .checked_add(dva.asize as u64)
            .is_some_and(|end| end <= vdev.size_bytes());
        if dva.asize == 0 || !in_vdev {
            return false;
        }
        let metaslab = vdev.metaslab_of(dva.offset);
        if dva.end() > metaslab.start + metaslab.size
            || !metaslab.free.contains(dva.offset, dva.end())
        {
            return false;
        }
        metaslab.free.remove(dva.offset, dva.end());
        metaslab
            .trim_pending
            .remove_overlapping(dva.offset, dva.end());
        self.free_total_bytes -= dva.asize as u64;
        true
    }

    /// Records an allocated range as in use from the open txg on.
    pub fn commit(&mut self, dva: Dva) {
        let vdev = &mut self.vdevs[dva.vdev as usize];
        vdev.metaslab_of(dva.offset)
            .pending_allocs
            .insert(dva.offset, dva.end());
    }

    /// Records a committed range as freed in the open txg.
    pub fn free(&mut self, dva: Dva) {
        let vdev = &mut self.vdevs[dva.vdev as usize];
        let metaslab = vdev.metaslab_of(dva.offset);
        if metaslab.pending_allocs.contains(dva.offset, dva.end()) {
            // Committed and freed within the same open txg: it never reached a
            // space map, so it can simply stop being pending — but it may still be
            // read by a reader that looked it up, so it waits like any free.
            metaslab.pending_allocs.remove(dva.offset, dva.end());
            metaslab.syncing_frees.insert(dva.offset, dva.end());
            return;
        }
        metaslab.pending_frees.insert(dva.offset, dva.end());
    }

    /// True when some metaslab has records to log.
    pub fn has_pending(&self) -> bool {
        self.vdevs
            .iter()
            .flat_map(|vdev| vdev.metaslabs.iter())
            .any(Metaslab::has_pending)
    }

    /// Takes the pending records of every metaslab for the syncing txg `txg`:
    /// applies them to the durable view and returns, per (vdev, metaslab), the
    /// records to append to the space log.
    pub fn take_pending(&mut self, txg: u64) -> Vec<(u32, u32, Vec<Record>)> {
        let mut out = Vec::new();
        for vdev in &mut self.vdevs {
            for metaslab in &mut vdev.metaslabs {
                if !metaslab.has_pending() {
                    continue;
                }
                if metaslab.unflushed_txg == 0 {
                    metaslab.unflushed_txg = txg;
                }
                let allocs = std::mem::take(&mut metaslab.pending_allocs);
                let frees = std::mem::take(&mut metaslab.pending_frees);
                let mut records =
                    Vec::with_capacity(allocs.segment_count() + frees.segment_count());
                for (start, end) in allocs.iter() {
                    metaslab.allocated.insert(start, end);
                    records.push(Record::Allocate {
                        offset: start,
                        length: end - start,
                    });
                }
                for (start, end) in frees.iter() {
                    metaslab.allocated.remove(start, end);
                    metaslab.syncing_frees.insert(start, end);
                    records.push(Record::Free {
                        offset: start,
                        length: end - start,
                    });
                }
                out.push((vdev.vdev, metaslab.index, records));
            }
        }
        out
    }

    /// The syncing txg is durable: frees from two txgs ago become allocatable and
    /// this txg's frees take their defer slot. With `trim`, what becomes
    /// allocatable is also noted for autotrim ([`Allocator::take_pending_trims`]):
    /// no uberblock a rewind could reach refers to it any more, exactly as
    /// for reuse.
    pub fn sync_done(&mut self, txg: u64, trim: bool) {
        let slot = (txg % DEFER_TXGS) as usize;
        for vdev in &mut self.vdevs {
            for metaslab in &mut vdev.metaslabs {
                let released = std::mem::take(&mut metaslab.defer[slot]);
                for (start, end) in released.iter() {
                    metaslab.free.insert(start, end);
                    if trim {
                        metaslab.trim_pending.insert(start, end);
                    }
                }
                self.free_total_bytes += released.total_bytes();
                metaslab.defer[slot] = std::mem::take(&mut metaslab.syncing_frees);
            }
        }
    }

    /// Free bytes that may be held out of allocation for discards now (see
    /// [`TRIM_HELD_BYTES_MAX`]).
    fn trim_budget(&self) -> u64 {
        let floor = self.slop_bytes() + self.metadata_reserve_bytes + TRIM_EXTENT_BYTES_MAX;
        self.free_total_bytes
            .saturating_sub(floor)
            .min(TRIM_HELD_BYTES_MAX.saturating_sub(self.trimming_bytes()))
    }

    /// True while autotrim has free space noted to discard.
    pub fn has_pending_trims(&self) -> bool {
        self.vdevs
            .iter()
            .flat_map(|vdev| vdev.metaslabs.iter())
            .any(|metaslab| !metaslab.trim_pending.is_empty())
    }

    /// Forgets what autotrim had noted (it was turned off).
    pub fn clear_pending_trims(&mut self) {
        for metaslab in self
            .vdevs
            .iter_mut()
            .flat_map(|vdev| vdev.metaslabs.iter_mut())
        {
            metaslab.trim_pending.clear();
        }
    }

    /// Holds up to `count` pieces of autotrim's noted free space out of
    /// allocation for their discard, within the budget, and returns them
    /// ([`Allocator::trim_done`] gives each back). Noted extents smaller than
    /// [`TRIM_EXTENT_BYTES_MIN`] are dropped: not worth a command.
    pub fn take_pending_trims(&mut self, count: usize) -> Vec<TrimExtent> {
        let mut budget = self.trim_budget();
        let mut extents = Vec::new();
        for vdev in &mut self.vdevs {
            for metaslab in &mut vdev.metaslabs {
                let noted: Vec<(u64, u64)> = metaslab.trim_pending.iter().collect();
                for (start, end) in noted {
                    if end - start < TRIM_EXTENT_BYTES_MIN {
                        metaslab.trim_pending.remove(start, end);
                        continue;
                    }
                    let piece_end = end.min(start + TRIM_EXTENT_BYTES_MAX);
                    let length = piece_end - start;
                    if extents.len() >= count || length > budget {
                        return extents;
                    }
                    metaslab.trim_pending.remove(start, piece_end);
                    metaslab.free.remove(start, piece_end);
                    metaslab.trimming.insert(start, piece_end);
                    self.free_total_bytes -= length;
                    budget -= length;
                    extents.push(TrimExtent {
                        vdev: vdev.vdev,
                        start,
                        end: piece_end,
                    });
                }
            }
        }
        extents
    }

    /// The free extents of one metaslab worth a discard, in pieces, and the
    /// metaslab's free bytes: what a trim of all free space goes through
    /// (nothing is held; see [`Allocator::hold_for_trim`]).
    pub fn free_extents_for_trim(&self, vdev: u32, metaslab: usize) -> (Vec<TrimExtent>, u64) {
        let Some(metaslab) = self
            .vdevs
            .get(vdev as usize)
            .and_then(|space| space.metaslabs.get(metaslab))
        else {
            return (Vec::new(), 0);
        };
        let extents = metaslab
            .free
            .iter()
            .filter(|(start, end)| end - start >= TRIM_EXTENT_BYTES_MIN)
            .flat_map(|(start, end)| trim_pieces(vdev, start, end))
            .collect();
        (extents, metaslab.free.total_bytes())
    }

    /// True when all of `extent` is free (allocatable) now.
    pub fn is_free(&self, extent: TrimExtent) -> bool {
        self.vdevs.get(extent.vdev as usize).is_some_and(|space| {
            let index = (extent.start >> space.metaslab_shift) as usize;
            space
                .metaslabs
                .get(index)
                .is_some_and(|metaslab| metaslab.free.contains(extent.start, extent.end))
        })
    }

    /// Holds `extent` out of allocation for its discard if it is still all
    /// free and the budget allows; false (nothing changed) otherwise.
    pub fn hold_for_trim(&mut self, extent: TrimExtent) -> bool {
        let length = extent.end - extent.start;
        if length > self.trim_budget() {
            return false;
        }
        let Some(space) = self.vdevs.get_mut(extent.vdev as usize) else {
            return false;
        };
        let index = (extent.start >> space.metaslab_shift) as usize;
        // A vdev removed meanwhile has no space left.
        let Some(metaslab) = space.metaslabs.get_mut(index) else {
            return false;
        };
        if !metaslab.free.contains(extent.start, extent.end) {
            return false;
        }
        metaslab.free.remove(extent.start, extent.end);
        metaslab
            .trim_pending
            .remove_overlapping(extent.start, extent.end);
        metaslab.trimming.insert(extent.start, extent.end);
        self.free_total_bytes -= length;
        true
    }

    /// The discard of `extent` ended (done or not): its space is
    /// allocatable again.
    pub fn trim_done(&mut self, extent: TrimExtent) {
        let vdev = &mut self.vdevs[extent.vdev as usize];
        let index = (extent.start >> vdev.metaslab_shift) as usize;
        // A discard that outlived its vdev's removal: the space went with it.
        let Some(metaslab) = vdev.metaslabs.get_mut(index) else {
            return;
        };
        metaslab.trimming.remove(extent.start, extent.end);
        metaslab.free.insert(extent.start, extent.end);
        self.free_total_bytes += extent.end - extent.start;
    }

    /// Number of metaslabs of each top-level vdev.
    pub fn metaslab_counts(&self) -> Vec<usize> {
        self.vdevs.iter().map(|vdev| vdev.metaslabs.len()).collect()
    }

    /// Checks that every byte of every metaslab is in exactly one state.
    pub fn verify(&self) -> Result<(), String> {
        for vdev in &self.vdevs {
            for metaslab in &vdev.metaslabs {
                let sets = metaslab.states();
                for (index, (name, set)) in sets.iter().enumerate() {
                    for (other_name, other) in sets.iter().skip(index + 1) {
                        for (start, end) in set.iter() {
                            if other.overlaps(start, end) {
                                return Err(format!("vdev {} metaslab {}: {name} and {other_name} overlap at {start}..{end}", vdev.vdev, metaslab.index));
                            }
                        }
                    }
                }
                for (start, end) in metaslab.trim_pending.iter() {
                    if !metaslab.free.contains(start, end) {
                        return Err(format!(
                            "vdev {} metaslab {}: noted for trim {start}..{end} is not free",
                            vdev.vdev, metaslab.index
                        ));
                    }
                }
                for (start, end) in metaslab.pending_frees.iter() {
                    if !metaslab.allocated.contains(start, end) {
                        return Err(format!(
                            "vdev {} metaslab {}: pending free {start}..{end} is not allocated",
                            vdev.vdev, metaslab.index
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocator() -> Allocator {
        Allocator::new(vec![VdevSpace::new(0, 64 << 20, 24, 4096)])
    }

    #[test]
    fn data_allocations_are_contiguous() {
        let mut allocator = allocator();
        let first = allocator.allocate(16384, BlockClass::Data, None).unwrap();
        let second = allocator.allocate(16384, BlockClass::Data, None).unwrap();
        assert_eq!(second.offset, first.end());
        let metadata = allocator
            .allocate(4096, BlockClass::Metadata(0), None)
            .unwrap();
        let ditto = allocator
            .allocate(4096, BlockClass::Metadata(1), Some(metadata))
            .unwrap();
        assert_ne!(
            metadata.offset >> 24,
            ditto.offset >> 24,
            "ditto copies share a metaslab"
        );
        assert_ne!(
            metadata.offset >> 24,
            first.offset >> 24,
            "metadata mixed into the data metaslab"
        );
    }

    #[test]
    fn a_block_fits_where_space_is_contiguous_not_where_most_is_free() {
        let mut allocator = allocator();
        let vdev = &mut allocator.vdevs[0];
        // Metaslab 1 has the most free bytes, all in 4 KiB holes (blocks freed
        // by random overwrites); metaslab 2 has less, in one run.
        for (index, metaslab) in vdev.metaslabs.iter_mut().enumerate() {
            metaslab.free.clear();
            if index == 1 {
                for hole in (metaslab.start..metaslab.start + metaslab.size).step_by(8192) {
                    metaslab.free.insert(hole, hole + 4096);
                }
            }
            if index == 2 {
                metaslab
                    .free
                    .insert(metaslab.start, metaslab.start + (1 << 20));
            }
        }
        allocator.recount();
        let metadata = allocator
            .allocate(32768, BlockClass::Metadata(0), None)
            .expect("a 32 KiB run exists");
        assert_eq!(metadata.offset >> 24, 2);
    }

    #[test]
    fn data_runs_fill_an_extent_then_start_in_the_largest_left() {
        let mut allocator = Allocator::new(vec![VdevSpace::new(0, 512 << 20, 24, 4096)]);
        let vdev = &mut allocator.vdevs[0];
        // Metaslab 1 (the data cursor's) and those after 3 have half their
        // bytes free, in 16 KiB holes left by random overwrites; metaslab 3
        // holds one extent of 512 KiB between data; metaslab 2 one of 256 KiB.
        for (index, metaslab) in vdev.metaslabs.iter_mut().enumerate() {
            metaslab.free.clear();
            match index {
                1 | 4.. => (metaslab.start..metaslab.start + metaslab.size)
                    .step_by(32768)
                    .for_each(|hole| metaslab.free.insert(hole, hole + 16384)),
                2 => metaslab.free.insert(
                    metaslab.start + (4 << 20),
                    metaslab.start + (4 << 20) + (256 << 10),
                ),
                3 => metaslab.free.insert(
                    metaslab.start + (8 << 20),
                    metaslab.start + (8 << 20) + (512 << 10),
                ),
                _ => {}
            }
        }
        vdev.data_cursor = (1, (16 << 20) + 16384); // after a block, not in a hole
        allocator.recount();
        // A run fills the largest extent to its end, block after block, then
        // the next starts in the largest extent left, and so on.
        for (extent_start, blocks) in [
            (3 * (16 << 20) + (8 << 20), 32u64),
            (2 * (16 << 20) + (4 << 20), 16),
        ] {
            for block in 0..blocks {
                let dva = allocator.allocate(16384, BlockClass::Data, None).unwrap();
                assert_eq!(
                    dva.offset,
                    extent_start + block * 16384,
                    "block {block} of the run at {extent_start}"
                );
            }
        }
        // Only 16 KiB holes are left: one of them.
        let next = allocator.allocate(16384, BlockClass::Data, None).unwrap();
        assert!(
            next.offset >> 24 == 1 || next.offset >> 24 >= 4,
            "a hole, at {}",
            next.offset
        );
        assert_eq!(next.offset % 32768, 0, "holes start every 32 KiB");
    }

    #[test]
    fn small_random_overwrites_leave_metadata_contiguous_room() {
        // A 256 MiB vdev: 16 metaslabs of 16 MiB. Fill 69% with 4 KiB data
        // blocks and 32 KiB metadata blocks, then overwrite random data blocks
        // (allocate new, free old, commit) until the data space turned over
        // several times: every metadata block must still find 32 KiB.
        let mut allocator = Allocator::new(vec![VdevSpace::new(0, 256 << 20, 24, 4096)]);
        allocator.metadata_reserve_bytes = 8 << 20;
        let mut data = Vec::new();
        let mut metadata = Vec::new();
        let mut txg = 1;
        let mut seed = 7u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..(176 << 20) / 4096 {
            let dva = allocator.allocate(4096, BlockClass::Data, None).unwrap();
            allocator.commit(dva);
            data.push(dva);
        }
        for round in 0..200 {
            for _ in 0..2048 {
                let slot = (next() % data.len() as u64) as usize;
                let dva = allocator
                    .allocate(4096, BlockClass::Data, None)
                    .expect("data space");
                allocator.commit(dva);
                allocator.free(std::mem::replace(&mut data[slot], dva));
            }
            // The commit rewrites 64 metadata blocks (two copies) and frees the old ones.
            let old: Vec<Dva> = std::mem::take(&mut metadata);
            for _ in 0..64 {
                let first = allocator
                    .allocate(32768, BlockClass::Metadata(0), None)
                    .unwrap_or_else(|_| panic!("no 32 KiB for metadata in round {round}"));
                let second = allocator
                    .allocate(32768, BlockClass::Metadata(1), Some(first))
                    .unwrap_or_else(|_| panic!("no 32 KiB for its copy in round {round}"));
                allocator.commit(first);
                allocator.commit(second);
                metadata.extend([first, second]);
            }
            for dva in old {
                allocator.free(dva);
            }
            allocator.take_pending(txg);
            allocator.sync_done(txg, false);
            txg += 1;
        }
        allocator.verify().unwrap();
    }

    /// Data stripes over the vdevs an aliquot at a time, weighted by free
    /// space: two equal vdevs share writes evenly; a vdev added empty beside
    /// a half-full one takes about twice the other's share (it fills first)
    /// but not all of it.
    #[test]
    fn fragmentation_follows_the_free_extents() {
        let mut space = VdevSpace::new(0, 256 << 20, 24, 4096);
        assert_eq!(
            space.fragmentation_percent(),
            Some(0),
            "all free: whole metaslabs"
        );
        // Every other 8 KiB of the first metaslab taken: 8 KiB holes, about
        // 100% fragmented there, weighed by their bytes against the rest.
        let metaslab = &mut space.metaslabs[0];
        for offset in (0..16u64 << 20).step_by(16 << 10) {
            metaslab.free.remove(offset, offset + (8 << 10));
        }
        let walked = {
            let mut weighted = 0u128;
            let mut free = 0u128;
            for metaslab in &space.metaslabs {
                for (start, end) in metaslab.free.iter() {
                    let class = rangeset::size_class(end - start);
                    let bucket = class.saturating_sub(9).min(FRAGMENTATION_BY_SIZE.len() - 1);
                    weighted += u128::from(end - start) * u128::from(FRAGMENTATION_BY_SIZE[bucket]);
                    free += u128::from(end - start);
                }
            }
            (weighted / free) as u64
        };
        let percent = space.fragmentation_percent().unwrap();
        assert_eq!(percent, walked);
        assert!((1..20).contains(&percent), "{percent}");
        for metaslab in &mut space.metaslabs {
            metaslab.free.clear();
        }
        assert_eq!(space.fragmentation_percent(), None, "nothing free");
    }

    #[test]
    fn data_stripes_by_free_space() {
        let written = |allocator: &mut Allocator, megabytes: u64| {
            let mut per_vdev = [0u64; 2];
            for _ in 0..megabytes * 16 {
                let dva = allocator.allocate(65536, BlockClass::Data, None).unwrap();
                per_vdev[dva.vdev as usize] += 65536;
            }
            per_vdev
        };
        let mut even = Allocator::new(vec![
            VdevSpace::new(0, 512 << 20, 24, 4096),
            VdevSpace::new(1, 512 << 20, 24, 4096),
        ]);
        let [first, second] = written(&mut even, 64);
        assert!(
            first.abs_diff(second) <= 2 * DATA_ALIQUOT_BYTES,
            "{first} {second}"
        );
        // Vdev 0 half full, vdev 1 just added.
        let mut grown = Allocator::new(vec![
            VdevSpace::new(0, 512 << 20, 24, 4096),
            VdevSpace::new(1, 512 << 20, 24, 4096),
        ]);
        for metaslab in grown.vdevs[0].metaslabs.iter_mut().take(16) {
            metaslab.free.clear();
        }
        grown.recount();
        let [old, new] = written(&mut grown, 96);
        let share = new as f64 / (old + new) as f64;
        assert!(
            (0.6..0.8).contains(&share),
            "the new vdev took {share:.2} ({old} {new})"
        );
    }

    #[test]
    fn a_claim_takes_only_wholly_free_space() {
        let mut allocator = allocator();
        let dva = allocator.allocate(16384, BlockClass::Data, None).unwrap();
        allocator.release(dva);
        let free = allocator.free_bytes();
        // Free: claimed, as an allocation would take it; then linked.
        assert!(allocator.claim(dva));
        assert_eq!(allocator.free_bytes(), free - 16384);
        // Taken: a second claim of the same space, or of space overlapping
        // it, changes nothing.
        assert!(!allocator.claim(dva));
        let overlapping = Dva {
            offset: dva.offset + 8192,
            ..dva
        };
        assert!(!allocator.claim(overlapping));
        // Outside the vdev, or on a vdev that does not exist.
        assert!(!allocator.claim(Dva { vdev: 7, ..dva }));
        assert!(!allocator.claim(Dva {
            offset: u64::MAX / 2,
            ..dva
        }));
        assert!(!allocator.claim(Dva {
            offset: u64::MAX - 100,
            ..dva
        }));
        allocator.commit(dva);
        allocator.take_pending(1);
        allocator.sync_done(1, false);
        assert_eq!(allocator.free_bytes(), free - 16384);
        allocator.verify().unwrap();
    }

    #[test]
    fn freed_space_is_noted_for_trim_and_held_only_while_discarded() {
        let mut allocator = allocator();
        // Apart, so their frees do not merge into one extent.
        let big = allocator.allocate(65536, BlockClass::Data, None).unwrap();
        let spacer = allocator.allocate(4096, BlockClass::Data, None).unwrap();
        let small = allocator.allocate(4096, BlockClass::Data, None).unwrap();
        allocator.commit(big);
        allocator.commit(spacer);
        allocator.commit(small);
        allocator.take_pending(1);
        allocator.sync_done(1, true);
        assert!(!allocator.has_pending_trims());
        let free_before = allocator.free_bytes();
        allocator.free(big);
        allocator.free(small);
        allocator.take_pending(2);
        allocator.sync_done(2, true);
        allocator.sync_done(3, true);
        assert!(
            !allocator.has_pending_trims(),
            "noted inside the defer window"
        );
        // Released: both allocatable at once, and noted for autotrim.
        allocator.sync_done(4, true);
        assert!(allocator.has_pending_trims());
        assert_eq!(allocator.free_bytes(), free_before + 65536 + 4096);
        allocator.verify().unwrap();
        // Taken for a discard: only the large one (the small one is not
        // worth a command), held out of allocation until it ends.
        let extents = allocator.take_pending_trims(16);
        assert_eq!(
            extents,
            vec![TrimExtent {
                vdev: 0,
                start: big.offset,
                end: big.end()
            }]
        );
        assert!(!allocator.has_pending_trims());
        assert_eq!(allocator.free_bytes(), free_before + 4096);
        assert_eq!(allocator.trimming_bytes(), 65536);
        allocator.verify().unwrap();
        for _ in 0..64 {
            let dva = allocator.allocate(4096, BlockClass::Data, None).unwrap();
            assert!(
                dva.end() <= big.offset || dva.offset >= big.end(),
                "allocated {dva:?} inside a range being discarded"
            );
        }
        allocator.trim_done(extents[0]);
        assert_eq!(allocator.trimming_bytes(), 0);
        assert_eq!(
            allocator.free_bytes(),
            free_before + 4096 - 64 * 4096 + 65536
        );
        allocator.verify().unwrap();
        // A trim of all free space: each piece is held while discarded.
        let (pieces, free_in_metaslab) = allocator.free_extents_for_trim(0, 0);
        assert!(!pieces.is_empty() && free_in_metaslab > 0);
        assert!(pieces
            .iter()
            .all(|piece| piece.end - piece.start <= TRIM_EXTENT_BYTES_MAX));
        let mut held = Vec::new();
        for piece in pieces {
            if allocator.hold_for_trim(piece) {
                held.push(piece);
            }
        }
        assert!(!held.is_empty());
        assert!(allocator.trimming_bytes() <= TRIM_HELD_BYTES_MAX);
        allocator.verify().unwrap();
        for piece in held {
            assert!(!allocator.hold_for_trim(piece), "held twice");
            allocator.trim_done(piece);
        }
        allocator.verify().unwrap();
    }

    #[test]
    fn an_allocation_takes_its_space_out_of_the_trim_notes() {
        let mut allocator = allocator();
        let dva = allocator.allocate(1 << 20, BlockClass::Data, None).unwrap();
        allocator.commit(dva);
        allocator.take_pending(1);
        allocator.sync_done(1, true);
        allocator.free(dva);
        allocator.take_pending(2);
        for txg in 2..=4 {
            allocator.sync_done(txg, true);
        }
        assert!(allocator.has_pending_trims());
        // Claim part of the noted range (as a replay would): it leaves the notes.
        let claimed = Dva {
            vdev: 0,
            asize: 65536,
            offset: dva.offset + 65536,
        };
        assert!(allocator.claim(claimed));
        allocator.verify().unwrap();
        let extents = allocator.take_pending_trims(64);
        assert!(extents
            .iter()
            .all(|extent| extent.end <= claimed.offset || extent.start >= claimed.end()));
        assert_eq!(
            extents
                .iter()
                .map(|extent| extent.end - extent.start)
                .sum::<u64>(),
            (1 << 20) - 65536
        );
        for extent in extents {
            allocator.trim_done(extent);
        }
        allocator.verify().unwrap();
    }

    #[test]
    fn frees_wait_two_txgs() {
        let mut allocator = allocator();
        let dva = allocator.allocate(16384, BlockClass::Data, None).unwrap();
        allocator.commit(dva);
        let records = allocator.take_pending(1);
        assert_eq!(
            records[0].2,
            vec![Record::Allocate {
                offset: dva.offset,
                length: 16384
            }]
        );
        allocator.sync_done(1, false);
        let free_before = allocator.free_bytes();
        allocator.free(dva);
        allocator.take_pending(2);
        allocator.sync_done(2, false);
        assert_eq!(
            allocator.free_bytes(),
            free_before,
            "freed space reusable after one txg"
        );
        allocator.sync_done(3, false);
        assert_eq!(allocator.free_bytes(), free_before);
        allocator.sync_done(4, false);
        assert_eq!(allocator.free_bytes(), free_before + 16384);
        allocator.verify().unwrap();
    }

    #[test]
    fn replay_rebuilds_state_and_defers_recent_frees() {
        let mut metaslab = Metaslab::new(0, 0, 1 << 24);
        let records = vec![
            Record::Txg(5),
            Record::Allocate {
                offset: 0,
                length: 65536,
            },
            Record::Txg(9),
            Record::Free {
                offset: 0,
                length: 4096,
            },
            Record::Txg(10),
            Record::Free {
                offset: 4096,
                length: 4096,
            },
        ];
        metaslab.replay(&records, 10).unwrap();
        assert_eq!(metaslab.allocated.total_bytes(), 65536 - 8192);
        assert_eq!(metaslab.defer[1].total_bytes(), 4096);
        assert_eq!(metaslab.defer[0].total_bytes(), 4096);
        assert_eq!(metaslab.free.total_bytes(), (1 << 24) - 65536);
        let bad = vec![Record::Free {
            offset: 0,
            length: 4096,
        }];
        assert!(Metaslab::new(0, 0, 1 << 24).replay(&bad, 1).is_err());
        let outside = vec![Record::Allocate {
            offset: 1 << 24,
            length: 4096,
        }];
        assert!(Metaslab::new(0, 0, 1 << 24).replay(&outside, 1).is_err());
    }

    #[test]
    fn a_checkpoint_replays_to_the_same_state() {
        let mut allocator = allocator();
        let mut dvas = Vec::new();
        for _ in 0..100 {
            let dva = allocator.allocate(16384, BlockClass::Data, None).unwrap();
            allocator.commit(dva);
            dvas.push(dva);
        }
        allocator.take_pending(7);
        allocator.sync_done(7, false);
        for dva in dvas.iter().step_by(3) {
            allocator.free(*dva);
        }
        allocator.take_pending(8);
        allocator.sync_done(8, false);
        for dva in dvas
            .iter()
            .skip(1)
            .step_by(5)
            .filter(|dva| (dva.offset / 16384) % 3 != 0)
        {
            allocator.free(*dva);
        }
        allocator.take_pending(9);
        allocator.sync_done(9, false);
        let metaslab = &allocator.vdevs[0].metaslabs[0];
        let checkpoint = metaslab.checkpoint_records(9);
        let mut replayed = Metaslab::new(0, 0, 1 << 24);
        replayed.replay(&checkpoint, 9).unwrap();
        assert_eq!(replayed.allocated, metaslab.allocated);
        assert_eq!(replayed.defer, metaslab.defer);
        assert_eq!(replayed.free, metaslab.free);
        // Imported two txgs later, nothing is deferred any more.
        let mut later = Metaslab::new(0, 0, 1 << 24);
        later.replay(&checkpoint, 11).unwrap();
        assert!(later.defer.iter().all(RangeSet::is_empty));
        assert_eq!(
            later.free.total_bytes(),
            metaslab.free.total_bytes()
                + metaslab
                    .defer
                    .iter()
                    .map(RangeSet::total_bytes)
                    .sum::<u64>()
        );
    }

    #[test]
    fn data_respects_slop_but_metadata_may_use_it() {
        let mut allocator = allocator();
        let mut count = 0;
        while allocator.allocate(1 << 20, BlockClass::Data, None).is_ok() {
            count += 1;
        }
        assert!(count < 64 - 16, "data filled the slop ({count} MiB)");
        assert!(allocator
            .allocate(4096, BlockClass::Metadata(0), None)
            .is_ok());
    }
}
