//! The read cache (ironpool's ARC): verified blocks kept in memory by address,
//! so a block read again costs no device I/O and no checksum.
//!
//! - **Keyed by where the block is**: its first copy's (vdev, offset). A
//!   cached entry also keeps the birth txg, size and checksum of the block
//!   pointer it was read through, and a lookup serves it only to a pointer
//!   that matches all of them. Copy-on-write never rewrites a live block in
//!   place, so a matching entry is that block's bytes, whoever asks: a
//!   volume, its snapshots and clones, a send, after a rollback or a
//!   receive. Freeing a block drops its entry ([`BlockCache::forget`]), so
//!   space reused by a new block never meets an old entry.
//! - **Kept as stored**: a compressed block is cached compressed (more fits;
//!   the saving is reported), verified once on its way in, served without
//!   verifying again. An encrypted block is cached as read, then, once a
//!   demand read opened it, as its plaintext ([`BlockCache::open_entry`]),
//!   as OpenZFS's ARC holds decrypted data: a hit then costs no
//!   decryption. Unloading a key empties the cache.
//! - **Bounded in bytes** by [`BlockCache::target_bytes`]: the tunable
//!   `arc_max_bytes` (default [`default_max_bytes`]), lowered while the
//!   server's memory limit is near (see [`memory`]). An entry is charged the
//!   whole buffer it holds, never less.
//! - **Replaced adaptively** ([`arc::AdaptiveCache`]): recency against
//!   frequency, scan-resistant.
//! - **Reads in flight are shared**: a read that finds another read of the
//!   same block under way (a prefetch, or a neighbour's 4K read of the same
//!   16K block) waits for it instead of reading the block again.
//!
//! What is cached is the caller's choice per read ([`CacheUse`]): metadata
//! always, a dataset's data by its `primarycache` and `direct` properties.

pub mod arc;
pub mod memory;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde::Serialize;

use crate::format::{BlockPointer, Checksum, Dva};
use crate::rt::buf::BufSlice;
use crate::rt::sync::Notify;
use arc::{AdaptiveCache, Evicted, ListSizes, PolicyCounters};

/// Default share of RAM the cache may take: one eighth. A user-space server
/// shares the machine with its clients (and, here, with the page cache of
/// the files it serves); OpenZFS takes up to half, but owns the kernel.
pub const ARC_RAM_SHARE_DIVISOR: u64 = 8;
/// Smallest cache: room for the metadata of a busy pool and some data; the
/// memory watcher never shrinks below it.
pub const ARC_MIN_BYTES: u64 = 64 << 20;
/// Largest default (a tunable may set more): 16 GiB keeps the cache's own
/// bookkeeping (entries and ghosts) well under a percent of RAM.
pub const ARC_DEFAULT_CEILING_BYTES: u64 = 16 << 30;

/// The default `arc_max_bytes`: [`ARC_RAM_SHARE_DIVISOR`] of RAM within
/// [`ARC_MIN_BYTES`] and [`ARC_DEFAULT_CEILING_BYTES`], and at most a half
/// of the server's cgroup memory limit.
pub fn default_max_bytes() -> u64 {
    let share = memory::ram_bytes().map_or(ARC_MIN_BYTES * 4, |ram| ram / ARC_RAM_SHARE_DIVISOR);
    let share = match memory::cgroup_limit() {
        Some(limit) => share.min(limit.max_bytes / 2),
        None => share,
    };
    share.clamp(ARC_MIN_BYTES, ARC_DEFAULT_CEILING_BYTES)
}

/// Where a block's cached copy is looked for: its first copy's address.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct BlockKey {
    vdev: u32,
    offset: u64,
}

impl BlockKey {
    fn of(dva: &Dva) -> BlockKey {
        BlockKey {
            vdev: dva.vdev,
            offset: dva.offset,
        }
    }
}

/// A cached block: its stored bytes and the pointer facts that say whose.
#[derive(Clone)]
struct CachedBlock {
    data: BufSlice,
    birth_txg: u64,
    physical: u32,
    logical: u32,
    checksum: Checksum,
    metadata: bool,
    /// The bytes are an encrypted block's plaintext (opened), not as stored.
    opened: bool,
}

/// A block's bytes from the cache or the devices, with how they were found.
#[derive(Clone)]
pub struct Cached {
    /// Its physical bytes: as stored, or opened (`opened`).
    pub data: BufSlice,
    /// Served by the cache.
    pub hit: bool,
    /// An encrypted block already opened (its MAC checked): `data` is its
    /// plaintext, compressed if the block is.
    pub opened: bool,
}

impl CachedBlock {
    fn matches(&self, bp: &BlockPointer) -> bool {
        self.birth_txg == bp.written_txg()
            && self.physical == bp.physical_size
            && self.checksum == bp.checksum
    }

    /// Memory a compressed block saves by being cached compressed.
    fn saved(&self) -> u64 {
        (self.logical as u64).saturating_sub(self.physical as u64)
    }
}

/// What a block is to the cache (counted apart in `arcstat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Data,
    Metadata,
}

/// How one read uses the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheUse {
    pub kind: BlockKind,
    /// Serve it from the cache if it is there (false: `direct=always`).
    pub lookup: bool,
    /// Keep what was read (false: `primarycache` excludes it, or direct).
    pub keep: bool,
    /// A read ahead of the reader, not one it asked for.
    pub prefetch: bool,
    /// A demand read that reaches the end of the block: a sequential reader
    /// is done with it (see [`BlockCache::lookup`]'s drop-behind).
    pub finishes_block: bool,
}

impl CacheUse {
    /// A pool metadata block: always cached.
    pub const METADATA: CacheUse = CacheUse {
        kind: BlockKind::Metadata,
        lookup: true,
        keep: true,
        prefetch: false,
        finishes_block: false,
    };
    /// Nothing to do with the cache: scrub and resilver verify the devices.
    pub const BYPASS: CacheUse = CacheUse {
        kind: BlockKind::Data,
        lookup: false,
        keep: false,
        prefetch: false,
        finishes_block: false,
    };

    /// A dataset's data block read on demand.
    pub fn data(lookup: bool, keep: bool) -> CacheUse {
        CacheUse {
            kind: BlockKind::Data,
            lookup,
            keep,
            prefetch: false,
            finishes_block: false,
        }
    }

    /// The same read, reaching the end of its block (or not).
    pub fn finishing(self, finishes_block: bool) -> CacheUse {
        CacheUse {
            finishes_block,
            ..self
        }
    }

    /// The same read issued ahead of the reader.
    pub fn prefetch(self) -> CacheUse {
        CacheUse {
            prefetch: true,
            ..self
        }
    }
}

/// Hits and misses of one kind of read.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct HitsMisses {
    pub hits: u64,
    pub misses: u64,
}

/// Counters beyond the policy's.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    demand_data: HitsMisses,
    demand_metadata: HitsMisses,
    prefetch_data: HitsMisses,
    prefetch_metadata: HitsMisses,
    /// Reads that did not look (direct I/O) or kept nothing (primarycache).
    bypassed: u64,
    /// Reads that waited for the same block's read in flight.
    shared_reads: u64,
    /// Blocks read ahead, used by their sequential reader and dropped.
    dropped_behind: u64,
    inserts: u64,
    /// Entries dropped because their block was freed.
    freed: u64,
    /// Entries found not to match their pointer (a block at the same place
    /// from another life), dropped.
    stale: u64,
    /// Bytes the cached compressed blocks would take decompressed, less
    /// what they take.
    compressed_saved_bytes: u64,
    data_bytes: u64,
    metadata_bytes: u64,
}

/// What `arcstat` shows: size, target, hits and misses, lists, evictions.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CacheStats {
    pub size_bytes: u64,
    pub data_bytes: u64,
    pub metadata_bytes: u64,
    pub entries: u64,
    /// What the cache may hold now (`min(max, memory limit)`).
    pub target_bytes: u64,
    /// The tunable `arc_max_bytes`.
    pub max_bytes: u64,
    /// The bound the memory watcher set (`u64::MAX` when memory is ample).
    pub memory_limit_bytes: u64,
    /// The policy's adaptive target for the recency list (ARC's `p`).
    pub mru_target_bytes: u64,
    pub lists: ListSizes,
    pub demand_data: HitsMisses,
    pub demand_metadata: HitsMisses,
    pub prefetch_data: HitsMisses,
    pub prefetch_metadata: HitsMisses,
    pub bypassed: u64,
    pub shared_reads: u64,
    pub dropped_behind: u64,
    pub inserts: u64,
    pub freed: u64,
    pub stale: u64,
    pub policy: PolicyCounters,
    pub compressed_saved_bytes: u64,
}

/// The pool's read cache.
pub struct BlockCache {
    policy: RefCell<AdaptiveCache<BlockKey, CachedBlock>>,
    counters: Cell<Counters>,
    max_bytes: Cell<u64>,
    memory_limit_bytes: Cell<u64>,
    /// Blocks being read to be cached, with what wakes those waiting.
    in_flight: RefCell<rustc_hash::FxHashMap<BlockKey, Rc<Notify>>>,
    /// How many times [`BlockCache::drop_opened`] ran. An opening that
    /// began before an unload of its key and ended after it must not put
    /// its plaintext back: it hands [`BlockCache::open_entry`] the epoch it
    /// began in, and a later one refuses it.
    opened_epoch: Cell<u64>,
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> BlockCache {
        BlockCache {
            policy: RefCell::new(AdaptiveCache::new(max_bytes)),
            counters: Cell::new(Counters::default()),
            max_bytes: Cell::new(max_bytes),
            memory_limit_bytes: Cell::new(u64::MAX),
            in_flight: RefCell::new(Default::default()),
            opened_epoch: Cell::new(0),
        }
    }

    fn count(&self, update: impl FnOnce(&mut Counters)) {
        let mut counters = self.counters.get();
        update(&mut counters);
        self.counters.set(counters);
    }

    /// What the cache may hold now.
    pub fn target_bytes(&self) -> u64 {
        self.max_bytes.get().min(self.memory_limit_bytes.get())
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> u64 {
        self.policy.borrow().bytes()
    }

    /// Sets `arc_max_bytes` (0 turns the cache off) and evicts down to it.
    pub fn set_max_bytes(&self, bytes: u64) {
        self.max_bytes.set(bytes);
        self.retarget();
    }

    /// Bounds the cache below its maximum while memory is short (the
    /// memory watcher); `u64::MAX` lifts the bound.
    pub fn set_memory_limit(&self, bytes: u64) {
        self.memory_limit_bytes.set(bytes);
        self.retarget();
    }

    pub fn memory_limit_bytes(&self) -> u64 {
        self.memory_limit_bytes.get()
    }

    fn retarget(&self) {
        let target = self.target_bytes();
        let evicted = self.policy.borrow_mut().set_target(target);
        self.note_evicted(evicted);
    }

    fn note_evicted(&self, evicted: Vec<Evicted<CachedBlock>>) {
        for entry in evicted {
            self.released(&entry.value);
        }
    }

    /// Takes an entry that left the cache out of the byte counts.
    fn released(&self, entry: &CachedBlock) {
        let bytes = entry.data.buffer_len() as u64;
        self.count(|counters| {
            counters.compressed_saved_bytes = counters
                .compressed_saved_bytes
                .saturating_sub(entry.saved());
            let kind = if entry.metadata {
                &mut counters.metadata_bytes
            } else {
                &mut counters.data_bytes
            };
            *kind = kind.saturating_sub(bytes);
        });
    }

    /// The cached bytes of `bp` (its physical bytes, and whether they are
    /// opened), counting a hit or a miss; `None` on a miss or when `usage`
    /// does not look.
    pub fn lookup(&self, bp: &BlockPointer, usage: CacheUse) -> Option<(BufSlice, bool)> {
        if !usage.lookup {
            self.count(|counters| counters.bypassed += 1);
            return None;
        }
        let key = BlockKey::of(&bp.dvas[0]);
        let mut policy = self.policy.borrow_mut();
        // One probe of the map: the rest works on the entry's place.
        let slot = policy.find(&key);
        let entry = slot.and_then(|slot| {
            let entry = policy.value_at(slot)?;
            Some((slot, entry.matches(bp), policy.prefetched_at(slot)))
        });
        let found = match entry {
            Some((slot, false, _)) => {
                let stale = policy.remove_at(slot);
                drop(policy);
                if let Some(entry) = stale {
                    self.released(&entry);
                }
                self.count(|counters| counters.stale += 1);
                None
            }
            // A prefetch that finds the block has nothing to do, and must
            // not count as an access.
            Some((slot, true, _)) if usage.prefetch => policy
                .value_at(slot)
                .map(|entry| (entry.data.clone(), entry.opened)),
            // Drop-behind: a block read ahead for a sequential reader is
            // its reader's alone. Reads inside it leave it as it is; the one
            // that finishes it takes it out of the cache, so its buffer
            // goes back to be read into again. Keeping sequential data
            // would make the cache grow by fresh memory the kernel must
            // zero first (1M sequential reads at QD1 ran at 608-800 MiB/s
            // while the cache grew, 1,200-1,300 once buffers recycled), and
            // evict data read at random once full; read again, it is read
            // ahead again.
            Some((slot, true, true)) => {
                if usage.finishes_block {
                    let entry = policy.remove_at(slot);
                    drop(policy);
                    entry.map(|entry| {
                        self.released(&entry);
                        self.count(|counters| counters.dropped_behind += 1);
                        (entry.data, entry.opened)
                    })
                } else {
                    policy
                        .value_at(slot)
                        .map(|entry| (entry.data.clone(), entry.opened))
                }
            }
            Some((slot, true, false)) => policy
                .get_at(slot, crate::rt::now().0)
                .map(|entry| (entry.data, entry.opened)),
            None => None,
        };
        let hit = found.is_some();
        self.count(|counters| {
            let slot = match (usage.prefetch, usage.kind) {
                (false, BlockKind::Data) => &mut counters.demand_data,
                (false, BlockKind::Metadata) => &mut counters.demand_metadata,
                (true, BlockKind::Data) => &mut counters.prefetch_data,
                (true, BlockKind::Metadata) => &mut counters.prefetch_metadata,
            };
            if hit {
                slot.hits += 1;
            } else {
                slot.misses += 1;
            }
        });
        found
    }

    /// If a read of `bp`'s block to be cached is in flight, what signals its
    /// end (wait, then look again); else `None`, and when `usage` keeps the
    /// block, this read is registered as the one in flight until
    /// [`BlockCache::end_read`].
    pub fn join_or_begin_read(&self, bp: &BlockPointer, usage: CacheUse) -> Option<Rc<Notify>> {
        if !usage.lookup && !usage.keep {
            return None;
        }
        let key = BlockKey::of(&bp.dvas[0]);
        let mut in_flight = self.in_flight.borrow_mut();
        if let Some(notify) = in_flight.get(&key) {
            let notify = notify.clone();
            drop(in_flight);
            self.count(|counters| counters.shared_reads += 1);
            return Some(notify);
        }
        if usage.keep {
            in_flight.insert(key, Rc::new(Notify::new()));
        }
        None
    }

    /// Ends a read registered by [`BlockCache::join_or_begin_read`], caching
    /// its bytes if it succeeded, and wakes those waiting for it.
    pub fn end_read(&self, bp: &BlockPointer, usage: CacheUse, data: Option<&BufSlice>) {
        if !usage.keep {
            return;
        }
        let key = BlockKey::of(&bp.dvas[0]);
        if let Some(data) = data {
            self.insert(bp, data.clone(), usage);
        }
        if let Some(notify) = self.in_flight.borrow_mut().remove(&key) {
            notify.notify_all();
        }
    }

    /// Caches `data`, the verified physical bytes of `bp`.
    fn insert(&self, bp: &BlockPointer, data: BufSlice, usage: CacheUse) {
        if self.target_bytes() == 0 {
            return;
        }
        let entry = CachedBlock {
            birth_txg: bp.written_txg(),
            physical: bp.physical_size,
            logical: bp.logical_size,
            checksum: bp.checksum,
            metadata: usage.kind == BlockKind::Metadata,
            opened: false,
            data,
        };
        let saved = entry.saved();
        // Charged the whole buffer: a slice of a larger buffer holds all of it.
        let bytes = entry.data.buffer_len() as u64;
        let key = BlockKey::of(&bp.dvas[0]);
        let mut policy = self.policy.borrow_mut();
        // A live entry (a read raced another) is replaced; a ghost stays,
        // to be hit.
        let replaced = match policy.peek(&key) {
            Some(_) => policy.remove(&key),
            None => None,
        };
        let evicted = policy.insert(key, entry, bytes, crate::rt::now().0, usage.prefetch);
        drop(policy);
        if let Some(old) = replaced {
            self.released(&old);
        }
        self.count(|counters| {
            counters.inserts += 1;
            counters.compressed_saved_bytes += saved;
            match usage.kind {
                BlockKind::Data => counters.data_bytes += bytes,
                BlockKind::Metadata => counters.metadata_bytes += bytes,
            }
        });
        self.note_evicted(evicted);
    }

    /// The epoch an opening begins in, for [`BlockCache::open_entry`].
    pub fn opened_epoch(&self) -> u64 {
        self.opened_epoch.get()
    }

    /// Holds `plaintext` for `bp`'s encrypted block in place of its stored
    /// bytes, when they are cached (and still `bp`'s), `plaintext`'s
    /// buffer is as large (the entry stays charged what it was), and no key
    /// was unloaded since the opening began (`epoch`, from
    /// [`BlockCache::opened_epoch`]): the unload dropped every opened
    /// block, and none may come back after it.
    pub fn open_entry(&self, bp: &BlockPointer, plaintext: &BufSlice, epoch: u64) {
        debug_assert!(bp.crypt.is_some(), "only an encrypted block is opened");
        if epoch != self.opened_epoch.get() {
            return;
        }
        let key = BlockKey::of(&bp.dvas[0]);
        let mut policy = self.policy.borrow_mut();
        if let Some(entry) = policy.peek_mut(&key) {
            if entry.matches(bp)
                && !entry.opened
                && entry.data.buffer_len() == plaintext.buffer_len()
                && entry.data.len() == plaintext.len()
            {
                entry.data = plaintext.clone();
                entry.opened = true;
            }
        }
    }

    /// Drops the entry of a block being freed (its space may be reused).
    pub fn forget(&self, bp: &BlockPointer) {
        let key = BlockKey::of(&bp.dvas[0]);
        let removed = self.policy.borrow_mut().remove(&key);
        if let Some(entry) = removed {
            self.released(&entry);
            self.count(|counters| counters.freed += 1);
        }
    }

    /// Drops every entry (`ironpool tune POOL arc_drop=1`, and tests that
    /// need the next read to go to the devices).
    /// Drops every block held opened (an encrypted block's plaintext): when
    /// a key is unloaded, none of its blocks may stay readable from memory.
    /// (Which key opened an entry is not kept, so every key's go; blocks
    /// as stored, and every plain block, stay.)
    pub fn drop_opened(&self) {
        self.opened_epoch.set(self.opened_epoch.get() + 1);
        let mut policy = self.policy.borrow_mut();
        let opened = policy.keys_where(|entry| entry.opened);
        let removed: Vec<CachedBlock> =
            opened.iter().filter_map(|key| policy.remove(key)).collect();
        drop(policy);
        for entry in &removed {
            self.released(entry);
        }
    }

    /// How many cached blocks are held opened (plaintext).
    pub fn opened_entries(&self) -> usize {
        self.policy.borrow().keys_where(|entry| entry.opened).len()
    }

    pub fn clear(&self) {
        *self.policy.borrow_mut() = AdaptiveCache::new(self.target_bytes());
        self.count(|counters| {
            counters.compressed_saved_bytes = 0;
            counters.data_bytes = 0;
            counters.metadata_bytes = 0;
        });
    }

    /// Sizes, hits and misses, the policy's lists and counters.
    pub fn stats(&self) -> CacheStats {
        let policy = self.policy.borrow();
        let counters = self.counters.get();
        CacheStats {
            size_bytes: policy.bytes(),
            data_bytes: counters.data_bytes,
            metadata_bytes: counters.metadata_bytes,
            entries: policy.len(),
            target_bytes: self.target_bytes(),
            max_bytes: self.max_bytes.get(),
            memory_limit_bytes: self.memory_limit_bytes.get(),
            mru_target_bytes: policy.mru_target_bytes(),
            lists: policy.list_sizes(),
            demand_data: counters.demand_data,
            demand_metadata: counters.demand_metadata,
            prefetch_data: counters.prefetch_data,
            prefetch_metadata: counters.prefetch_metadata,
            bypassed: counters.bypassed,
            shared_reads: counters.shared_reads,
            dropped_behind: counters.dropped_behind,
            inserts: counters.inserts,
            freed: counters.freed,
            stale: counters.stale,
            policy: policy.counters(),
            compressed_saved_bytes: counters.compressed_saved_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bp::BlockCrypt;
    use crate::format::{Dva, ObjectType};
    use crate::rt::buf::AlignedBuf;

    fn sealed_pointer() -> BlockPointer {
        let mut pointer = BlockPointer::hole(0, ObjectType::VolumeData, 7);
        pointer.dvas[0] = Dva {
            vdev: 0,
            asize: 4096,
            offset: 1 << 20,
        };
        pointer.logical_size = 4096;
        pointer.physical_size = 4096;
        pointer.crypt = Some(BlockCrypt {
            salt: 1,
            iv: [2; 12],
            mac: [3; 16],
        });
        pointer
    }

    fn bytes(fill: u8) -> BufSlice {
        let mut buffer = AlignedBuf::zeroed(4096);
        buffer.fill(fill);
        BufSlice::whole(buffer.into_shared())
    }

    /// An opening that began before an unload dropped the opened blocks
    /// does not put its plaintext back after it; one begun after does.
    #[test]
    fn an_opening_across_an_unload_is_not_cached() {
        crate::rt::Runtime::new_sim(1).block_on(async {
            let cache = BlockCache::new(1 << 20);
            let pointer = sealed_pointer();
            let usage = CacheUse::data(true, true);
            assert!(cache.join_or_begin_read(&pointer, usage).is_none());
            cache.end_read(&pointer, usage, Some(&bytes(0xc1)));
            let begun = cache.opened_epoch();
            cache.drop_opened();
            cache.open_entry(&pointer, &bytes(0x0a), begun);
            assert_eq!(cache.opened_entries(), 0, "plaintext back after the unload");
            let (data, opened) = cache.lookup(&pointer, usage).expect("still cached, sealed");
            assert!(!opened);
            assert_eq!(data[0], 0xc1);
            cache.open_entry(&pointer, &bytes(0x0a), cache.opened_epoch());
            assert_eq!(cache.opened_entries(), 1);
        });
    }
}
