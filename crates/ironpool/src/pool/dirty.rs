//! The pool's dirty data: one budget for what volumes' held blocks and
//! filesystems' written-behind blocks take of memory
//! (`dirty_data_max_bytes`, the throttle that makes writers wait) and of
//! free space (promised to held blocks, claimed by writes going through),
//! the write-out parameters both use, and the pressure figures: how much
//! dirty data and metadata wait, which the leaf queues scale their async
//! writes by, and the space the next commit may need for metadata, which
//! data allocations leave free.
//!
//! The txg engine (a commit empties the open txg), volumes and filesystems
//! all report here, and this room imports none of them. Before, the
//! budget lived in `volume/writeback.rs` (filesystems imported volumes for
//! it) and the pressure figures in `txg.rs` (every room the txg build walks
//! imported the txg engine back): two import circles among `pool/`'s rooms
//! that issue 69 asks to remove.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use crate::pool::{Pool, PoolError};
use crate::rt::sync::Notify;

/// Dirty data a pool holds in memory before writers wait (the default of the
/// `dirty_data_max_bytes` tunable): 128 MiB is about half
/// a second of what these machines' disks write, so a flush takes at most that
/// long, and a small share of any server's memory (OpenZFS allows 10% of RAM,
/// up to 4 GiB).
pub const DIRTY_DATA_MAX_BYTES: u64 = 128 << 20;
/// A volume (or a filesystem, its written-behind blocks) starts writing out
/// once it holds this much, in batches of this size: 4 MiB gives each child of a 6-wide RAID-Z2 a 1 MiB run (the queue's
/// aggregation limit) and a mirror 4 MiB of contiguous blocks.
pub const WRITEBACK_BATCH_BYTES: u64 = 4 << 20;
/// Batches of one volume or filesystem being written at once: enough to keep every device
/// busy while the next batch is gathered, few enough that the queue sees long
/// runs rather than many short ones.
pub const WRITEBACK_BATCHES_IN_FLIGHT: usize = 4;
/// Writes of at least this many bytes are written through, not held: a 512 KiB
/// request is already a run long enough for the devices (128 KiB per child of
/// a 6-wide RAID-Z2), and holding it costs more than it gains: 1 MiB
/// sequential writes at QD16 on raidz2 of 6 ran at 0.6-0.7x when held
/// (740-760 against 1080-1230 MiB/s, alternating runs), the engine's core
/// being the limit.
pub const WRITE_THROUGH_MIN_BYTES: u64 = 512 << 10;
/// Longest a dirty block waits before it is written, however little is dirty:
/// bounds what an idle client leaves in memory (OpenZFS's txg timeout is 5 s).
pub const WRITEBACK_DELAY: Duration = Duration::from_millis(100);
/// Blocks are held only while the pool keeps this share (1/16) of its size free
/// beyond them, the metadata reserve and the slop (what data allocations may
/// not take): free space that close to full is fragmented, and a held block
/// must still find room when written out. Past it writes go through and meet
/// the space limit themselves.
const WRITEBACK_SPACE_MARGIN_DIVISOR: u64 = 16;
/// Writers held back by the limit are let in again once 1/8 of it is free: in
/// batches, rather than one wake-up of every waiter per block written out.
const ADMIT_HYSTERESIS_DIVISOR: u64 = 8;

/// What the pool's pressure figures remember between updates.
#[derive(Default)]
pub struct Pressure {
    /// Data bytes linked in the open txg: their frees wait for commits, so a
    /// commit must come before they eat the free space.
    data_bytes_open: Cell<u64>,
    /// The dirty percentage last given to the leaf queues.
    dirty_percent: Cell<u32>,
}

impl Pressure {
    /// Data bytes linked in the open txg.
    pub fn data_bytes_open(&self) -> u64 {
        self.data_bytes_open.get()
    }

    /// Counts `bytes` of data linked in the open txg; the open txg's total.
    pub fn add_data_bytes(&self, bytes: u64) -> u64 {
        let total = self.data_bytes_open.get() + bytes;
        self.data_bytes_open.set(total);
        total
    }

    /// The open txg was closed: its data is the commit's now.
    pub fn txg_closed(&self) {
        self.data_bytes_open.set(0);
    }
}

/// Tells the leaf queues how much dirty data waits, as the largest of: data
/// linked in the open txg against the point that starts a commit, dirty
/// metadata against its sync point, and volume data held by write-back
/// against its limit. Async writes (commits, write-back) get more slots as
/// it rises, as OpenZFS scales them with its dirty data.
pub fn update_dirty_percent(pool: &Pool) {
    let pressure = &pool.pressure;
    let data_percent = pressure.data_bytes_open() * 100 / data_sync_bytes(pool).max(1);
    let (metadata_percent, held_percent) = {
        let tunables = pool.tunables.borrow();
        let held = match tunables.dirty_data_max_bytes {
            0 => 0,
            limit => pool.dirty_data_bytes() * 100 / limit,
        };
        (
            pool.dirty_metadata_bytes() * 100 / tunables.dirty_sync_bytes.max(1),
            held,
        )
    };
    let percent = data_percent
        .max(metadata_percent)
        .max(held_percent)
        .min(1000) as u32;
    if percent != pressure.dirty_percent.replace(percent) {
        for top in pool.store.vdevs().iter() {
            for leaf in &top.children {
                leaf.queue.set_dirty_percent(percent);
            }
        }
    }
}

/// Data written in one txg before a commit starts: an eighth of the free space
/// (between 16 MiB and 1 GiB). Copy-on-write needs free space for every overwrite
/// and frees only come back two txgs later, so a full-ish pool commits more often.
pub fn data_sync_bytes(pool: &Pool) -> u64 {
    let free = pool.store.allocator.borrow().free_bytes();
    (free / 8).clamp(16 << 20, 1 << 30)
}

/// Space the next commit may need for metadata: every dirty node rewritten with
/// its copies (twice over, for blocks freed in this txg that are not reusable
/// yet), plus room for space map growth. Data allocations leave this free.
pub fn update_metadata_reserve(pool: &Pool) {
    let dirty = pool.dirty_metadata_bytes();
    let metaslabs: u64 = pool
        .store
        .allocator
        .borrow()
        .vdevs
        .iter()
        .map(|vdev| vdev.metaslabs.len() as u64)
        .sum();
    let reserve = 4 * crate::object::sync::METADATA_COPIES as u64 * dirty + metaslabs * (64 << 10);
    // (Counted at two copies even where level-1 blocks get one: a reserve errs high.)
    pool.store.allocator.borrow_mut().metadata_reserve_bytes = reserve;
}

/// The pool's side: the dirty bytes of all volumes against the limit.
#[derive(Default)]
pub struct PoolWriteback {
    dirty_bytes: Cell<u64>,
    reserved_bytes: Cell<u64>,
    /// Space claimed by writes going through now ([`SpaceClaim`]), until
    /// their blocks are allocated and the write returns.
    claimed_bytes: Cell<u64>,
    /// Bytes of writes admitted and not yet returned (they may become dirty).
    admitted_bytes: Cell<u64>,
    /// Writers waiting for dirty data to drop below the limit.
    waiting: Cell<u32>,
    /// Times a writer waited for room, since import (the throttle at work).
    waits: Cell<u64>,
    /// Volumes whose last write-back failed: their dirty blocks may not drain,
    /// so writers do not wait for room and write through instead.
    failing_volumes: Cell<u32>,
    space: Notify,
}

/// Space a write going through (not held) claimed before it allocates
/// ([`Pool::claim_space`]): counted out of what other writes may take, and
/// out of what blocks may be held against, until dropped when the write
/// returns. Without it, writes in flight at once each saw the same free
/// space, and one could take the space promised to a held block, whose
/// write-out then failed: an acknowledged write lost to a full pool.
pub(crate) struct SpaceClaim<'a> {
    state: &'a PoolWriteback,
    bytes: u64,
}

impl Drop for SpaceClaim<'_> {
    fn drop(&mut self) {
        let claimed = &self.state.claimed_bytes;
        claimed.set(claimed.get() - self.bytes);
    }
}

/// A write admitted by `admit_dirty`: its bytes count against the limit until
/// it returns (by then what it held is counted as dirty).
pub(crate) struct Admission<'a> {
    state: &'a PoolWriteback,
    bytes: u64,
    limit: u64,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.state
            .admitted_bytes
            .set(self.state.admitted_bytes.get() - self.bytes);
        // A write that held nothing (written through) frees room too.
        self.state.wake_writers(self.limit);
    }
}

impl PoolWriteback {
    /// A volume's write-back started failing (`failing`) or recovered: while
    /// any fails, dirty data may not drain, so writers go through instead of
    /// waiting for room (those waiting now are let go).
    pub(crate) fn note_failing(&self, failing: bool) {
        let count = &self.failing_volumes;
        if failing {
            count.set(count.get() + 1);
            self.space.notify_all();
        } else {
            debug_assert!(count.get() > 0, "a volume recovered that was not failing");
            count.set(count.get() - 1);
        }
    }

    /// Wakes the writers waiting for room once a good part of the limit is
    /// free, not at every block: each wake-up of all of them costs a turn each.
    fn wake_writers(&self, limit: u64) {
        if self.waiting.get() > 0
            && self.dirty_bytes.get() + self.admitted_bytes.get() + limit / ADMIT_HYSTERESIS_DIVISOR
                <= limit
        {
            self.space.notify_all();
        }
    }
}

impl Pool {
    /// Memory held by the dirty blocks of all volumes: their bytes and the
    /// parity computed ahead for them (what `dirty_data_max_bytes` bounds).
    pub fn dirty_data_bytes(&self) -> u64 {
        self.writeback.dirty_bytes.get()
    }

    /// Writers waiting for room under `dirty_data_max_bytes` now, and the
    /// times one waited since import: how often write-back held clients back.
    pub fn writeback_waits(&self) -> (u32, u64) {
        (self.writeback.waiting.get(), self.writeback.waits.get())
    }

    /// Admits a write that may hold `bytes` (see `hold_bytes`): waits until dirty data plus
    /// the writes admitted before it leave room for it under
    /// `dirty_data_max_bytes` (alone, any size is let in, so one large request
    /// is never refused). Called before a write takes its block locks. None
    /// when the write must go through instead: write-back is off, a
    /// write-back is failing (dirty data may not drain), or the pool cannot
    /// commit or is being exported (`ensure_writable`).
    pub(crate) async fn admit_dirty(self: &Rc<Self>, bytes: u64) -> Option<Admission<'_>> {
        let state = &self.writeback;
        loop {
            let limit = self.tunables.borrow().dirty_data_max_bytes;
            if limit == 0 || state.failing_volumes.get() > 0 || self.txg.ensure_writable().is_err()
            {
                return None;
            }
            let used = state.dirty_bytes.get() + state.admitted_bytes.get();
            if used == 0 || used + bytes <= limit {
                state.admitted_bytes.set(state.admitted_bytes.get() + bytes);
                return Some(Admission {
                    state,
                    bytes,
                    limit,
                });
            }
            state.waiting.set(state.waiting.get() + 1);
            state.waits.set(state.waits.get() + 1);
            self.nudge_write_outs();
            state.space.notified().await;
            state.waiting.set(state.waiting.get() - 1);
        }
    }

    /// Whether writers wait for dirty data to drop below the limit: what
    /// is held should be written out now, not when its batch fills.
    pub(crate) fn writers_held_back(&self) -> bool {
        self.writeback.waiting.get() > 0
    }

    /// Space a held block of `bytes` may take once written: its allocated
    /// size uncompressed, on the widest-parity vdev.
    pub(crate) fn held_space_bytes(&self, bytes: u64) -> u64 {
        self.store
            .vdevs()
            .iter()
            .map(|top| top.allocated_size(bytes))
            .max()
            .unwrap_or(bytes)
    }

    /// Space promised to the blocks held now, for when they are written out,
    /// and claimed by writes going through now ([`SpaceClaim`]).
    pub(crate) fn promised_bytes(&self) -> u64 {
        self.writeback.reserved_bytes.get() + self.writeback.claimed_bytes.get()
    }

    /// Claims the space a write of `bytes` going through may take, all or
    /// nothing, before it allocates: never the space held blocks were
    /// promised or other writes in flight claimed. ENOSPC when it is not
    /// there; see [`Pool::claim_space`] for the claim that waits for frees.
    pub(crate) fn try_claim_space(&self, bytes: u64) -> Result<SpaceClaim<'_>, PoolError> {
        let needed = self.held_space_bytes(bytes);
        if needed > self.data_available_bytes() {
            return Err(PoolError::NoSpace);
        }
        let claimed = &self.writeback.claimed_bytes;
        claimed.set(claimed.get() + needed);
        Ok(SpaceClaim {
            state: &self.writeback,
            bytes: needed,
        })
    }

    /// [`Pool::try_claim_space`], which, when the space is missing but may
    /// come back (frees on their way, space other writes hold), waits for
    /// it ([`Pool::wait_for_freed_space`]) and tries again, as
    /// [`Pool::retry_while_space_returns`] bounds. The caller must hold no
    /// lock a commit takes.
    pub(crate) async fn claim_space(
        self: &Rc<Self>,
        bytes: u64,
    ) -> Result<SpaceClaim<'_>, PoolError> {
        self.retry_while_space_returns(
            bytes,
            |error| matches!(error, PoolError::NoSpace),
            || std::future::ready(self.try_claim_space(bytes)),
        )
        .await
    }

    /// Whether the pool has room to hold `reserved` more bytes of space (in
    /// place of `replaced`, held for the same block before) beside what is
    /// held or claimed already, the margin and what data may not take (the
    /// metadata reserve and the slop: without the slop, a pool whose margin
    /// was under it held blocks that then found no room).
    pub(crate) fn has_room_to_hold(&self, reserved: u64, replaced: u64) -> bool {
        let allocator = self.store.allocator.borrow();
        let needed = self.promised_bytes() - replaced
            + reserved
            + allocator.size_bytes() / WRITEBACK_SPACE_MARGIN_DIVISOR;
        allocator.data_available_bytes() >= needed
    }

    /// Counts a held block's (memory, space) `new` in place of `old`, what
    /// the block held before (zeros for a new one): a volume's dirty block
    /// or a filesystem's written-behind version (`pool::filesystem::behind`)
    /// against the same limits.
    pub(crate) fn replace_held(&self, old: (u64, u64), new: (u64, u64)) {
        let state = &self.writeback;
        state
            .dirty_bytes
            .set(state.dirty_bytes.get() - old.0 + new.0);
        state
            .reserved_bytes
            .set(state.reserved_bytes.get() - old.1 + new.1);
        update_dirty_percent(self);
    }

    /// Gives back what a held block counted ([`Pool::replace_held`]).
    pub(crate) fn release_dirty(&self, bytes: u64, reserved: u64) {
        let state = &self.writeback;
        state.dirty_bytes.set(state.dirty_bytes.get() - bytes);
        state
            .reserved_bytes
            .set(state.reserved_bytes.get() - reserved);
        update_dirty_percent(self);
        state.wake_writers(self.tunables.borrow().dirty_data_max_bytes);
    }
}
