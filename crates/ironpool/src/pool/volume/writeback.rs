//! Write-back of volume data: a client's write is acknowledged once its blocks
//! are in memory, and the blocks are written out later in batches.
//!
//! Why: a block written the moment it arrives can only share a device write
//! with the blocks queued beside it, which a client's queue depth bounds (at
//! QD64 a RAID-Z child sees 50-100 KiB writes). Written in batches of a few
//! MiB, consecutive allocations give every child one long contiguous run
//! where the free space has one, and the queue merges it into writes up to its
//! aggregation limit. OpenZFS does the same with its dirty data, written at
//! the txg sync.
//!
//! What it guarantees:
//! - A write that returns is readable at once: reads look at the dirty blocks
//!   first (the client's own buffer, no copy).
//! - FLUSH writes out and links every block dirtied before it, then commits;
//!   an error writing any of them fails the flush. FUA writes and every
//!   write under `sync=always` are held and committed as a FLUSH is when
//!   their copy goes into the log (`logbias=latency`, blocks and the write of
//!   at most 32 KiB), else written through; requests of
//!   `WRITE_THROUGH_MIN_BYTES` or more are written through (never held in
//!   memory).
//! - Snapshots, rollback, destroy, receive, block status and every commit
//!   (administrative changes, `sync`, export) write dirty blocks out first, so
//!   they see every acknowledged write.
//! - Memory is bounded: the pool's `dirty_data_max_bytes` tunable (default
//!   `DIRTY_DATA_MAX_BYTES`; 0 turns write-back off) bounds the held blocks
//!   with the RAID-Z parity computed for them; writers wait above it.
//!   A block is held only while the pool has room for it (with its parity,
//!   uncompressed, and 1/16 of the pool to spare): short of space, or after a
//!   write-back failed, writes go through at once, so a full pool or a
//!   failing device is reported to the write that meets it.
//! - Nothing held is lost except by a crash before the flush, which the block
//!   device contract allows (a crash loses unflushed writes on any disk).
//!
//! A block being written out holds its per-block lock, so a client write to it
//! waits for that one block; blocks are linked in the order they were written.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::block::StorePrep;
use crate::format::bp::Compression;
use crate::format::checksum::{Checksum, ChecksumAlgo};
use crate::pool::dirty::{WRITEBACK_BATCHES_IN_FLIGHT, WRITEBACK_BATCH_BYTES, WRITEBACK_DELAY};
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::BufSlice;
use crate::rt::sync::Notify;
use crate::rt::{self, Instant};

/// Wait before writing out again after a write-back failed (a device away, the
/// pool suspended): the blocks stay dirty and readable meanwhile.
pub const WRITEBACK_RETRY_DELAY: Duration = Duration::from_secs(1);

/// What is computed from a block when it is held: the bytes are then in the
/// CPU cache (just received), written out later they are not (measured:
/// hashing at write-out took twice the time per byte, and parity generation
/// spent most of its time waiting on loads).
#[derive(Clone, Default)]
pub(crate) struct Prepared {
    /// Its checksum, when it is stored uncompressed (a compressed block's
    /// checksum covers its compressed bytes, known only at write-out).
    pub checksum: Option<(ChecksumAlgo, Checksum)>,
    /// The store's own preparation, under the same condition (it covers the
    /// bytes stored).
    pub store: StorePrep,
}

impl Prepared {
    /// Memory it holds beyond the block itself.
    fn bytes(&self) -> u64 {
        self.store.bytes()
    }
}

/// A block acknowledged to the client and not yet in the volume's tree.
struct DirtyBlock {
    data: BufSlice,
    prepared: Prepared,
    seq: u64,
    since: Instant,
    /// Space counted against the pool while the block is held (its allocated
    /// size uncompressed, on the widest-parity vdev).
    reserved_bytes: u64,
    /// These bytes are copied into the intent log (a FLUSH took them).
    logged: bool,
    /// Intent log commits holding copies of this block (of these bytes or
    /// earlier ones): each is told when the block is linked, so its log
    /// blocks are freed once that link is durable.
    log_commits: Vec<u64>,
}

/// What the intent log needs of a dirty block when it leaves for the tree.
pub(crate) struct Forgotten {
    /// Its bytes were copied into the log (the link needs no record).
    pub logged: bool,
    /// Intent log commits holding copies of it.
    pub log_commits: Vec<u64>,
}

/// The dirty blocks of one volume.
#[derive(Default)]
pub struct DirtyBlocks {
    blocks: rustc_hash::FxHashMap<u64, DirtyBlock>,
    /// Order of first dirtying (sequence number to block id): oldest first. A
    /// block written again keeps its number until it is linked.
    order: BTreeMap<u64, u64>,
    next_seq: u64,
    bytes: u64,
    /// Of `bytes`, those of blocks not copied into the intent log: what a
    /// FLUSH would copy (kept here, not summed over the blocks, because it
    /// is asked at every durable write and the logged blocks a txg has not
    /// yet written out may number tens of thousands).
    unlogged_bytes: u64,
    /// Of `bytes`, those in batches being written now.
    in_flight_bytes: u64,
    phase: WritebackPhase,
    batches_in_flight: usize,
    /// Blocks dirtied up to this sequence number are written out now (a drain).
    drain_target: u64,
    /// Write-backs that failed (cumulative), and the last reason.
    failures: u64,
    last_error: Option<String>,
}

/// Where a volume's write-back task is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum WritebackPhase {
    /// No task: nothing is dirty (the next dirty block starts one).
    #[default]
    Idle,
    /// The task writes dirty blocks out.
    Running,
    /// The task runs and its last batch failed: new writes go through until
    /// a batch succeeds.
    Failing,
}

impl DirtyBlock {
    /// Memory it holds: its bytes and what was computed from them.
    fn memory_bytes(&self) -> u64 {
        self.data.len() as u64 + self.prepared.bytes()
    }
}

impl DirtyBlocks {
    /// Takes block `blkid`'s entry out, with its place in the order and its
    /// bytes (the pool's counts are the caller's).
    fn remove(&mut self, blkid: u64) -> Option<DirtyBlock> {
        let old = self.blocks.remove(&blkid)?;
        self.order.remove(&old.seq);
        self.bytes -= old.data.len() as u64;
        if !old.logged {
            self.unlogged_bytes -= old.data.len() as u64;
        }
        Some(old)
    }
}

/// Per-volume events: blocks written out or a write-back failed (drains wait on
/// it), a batch finished (the write-back task waits for a free slot), and
/// requests to write out now (the write-back task waits on it).
#[derive(Default)]
pub struct VolumeWriteback {
    pub(crate) dirty: RefCell<DirtyBlocks>,
    changed: Notify,
    batch_done: Notify,
    kick: Notify,
}

impl VolumeWriteback {
    /// A writer waits for dirty data to drop ([`Pool::nudge_write_outs`]):
    /// the held blocks go out now rather than when a batch fills.
    pub(in crate::pool) fn nudge(&self) {
        self.kick.notify_all();
    }

    /// The space the dirty blocks will take once linked (what they
    /// reserved): part of what the volume uses, for its quota.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.dirty
            .borrow()
            .blocks
            .values()
            .map(|block| block.reserved_bytes)
            .sum()
    }

    /// The blocks held dirty whose bytes are not in the intent log yet, in
    /// block order: what a FLUSH copies into the log.
    pub(crate) fn unlogged(&self) -> Vec<(u64, BufSlice)> {
        let dirty = self.dirty.borrow();
        let mut blocks: Vec<(u64, BufSlice)> = dirty
            .blocks
            .iter()
            .filter(|(_, block)| !block.logged)
            .map(|(blkid, block)| (*blkid, block.data.clone()))
            .collect();
        blocks.sort_unstable_by_key(|(blkid, _)| *blkid);
        blocks
    }

    /// Bytes of the blocks `unlogged` would return.
    pub(crate) fn unlogged_bytes(&self) -> u64 {
        self.dirty.borrow().unlogged_bytes
    }

    /// Notes that log commit `commit` holds a copy of block `blkid` as
    /// `data`; false (nothing noted) if the block no longer holds those bytes.
    pub(crate) fn mark_logged(&self, blkid: u64, data: &BufSlice, commit: u64) -> bool {
        let mut dirty = self.dirty.borrow_mut();
        let Some(block) = dirty.blocks.get_mut(&blkid) else {
            return false;
        };
        if !block.data.same_bytes_as(data) {
            return false;
        }
        let newly = !block.logged;
        block.logged = true;
        block.log_commits.push(commit);
        let bytes = block.data.len() as u64;
        if newly {
            dirty.unlogged_bytes -= bytes;
        }
        true
    }

    /// Forgets that `blkid`'s bytes are in the log (the commit that copied
    /// them failed): the next FLUSH copies them again.
    pub(crate) fn unmark_logged(&self, blkid: u64, commit: u64) {
        let mut dirty = self.dirty.borrow_mut();
        if let Some(block) = dirty.blocks.get_mut(&blkid) {
            if block.log_commits.last() == Some(&commit) {
                block.log_commits.pop();
                let was_logged = std::mem::replace(&mut block.logged, false);
                let bytes = block.data.len() as u64;
                if was_logged {
                    dirty.unlogged_bytes += bytes;
                }
            }
        }
    }

    /// The dirty copy of block `blkid`, if it has one.
    pub fn lookup(&self, blkid: u64) -> Option<BufSlice> {
        self.dirty
            .borrow()
            .blocks
            .get(&blkid)
            .map(|block| block.data.clone())
    }

    /// Bytes held dirty.
    pub fn bytes(&self) -> u64 {
        self.dirty.borrow().bytes
    }

    /// Whether any block is dirty.
    pub fn is_empty(&self) -> bool {
        self.dirty.borrow().blocks.is_empty()
    }
}

impl Pool {
    /// Memory `blocks` blocks of `volume` hold when held dirty: whole blocks
    /// (a partial write holds its merged block) and the parity computed for
    /// them; what a write is admitted for.
    pub(crate) fn hold_bytes(&self, volume: &Volume, blocks: u64) -> u64 {
        let parity = if volume.settings().compression.algo == Compression::Off {
            self.store.prepared_bytes(volume.block_bytes)
        } else {
            0
        };
        blocks * (volume.block_bytes + parity)
    }

    /// Lets every failed write-back try again now (`ironpool clear`), rather
    /// than after `WRITEBACK_RETRY_DELAY`.
    pub(crate) fn retry_writeback(&self) {
        for volume in self.all_volumes() {
            volume.writeback.kick.notify_all();
        }
    }

    /// Marks `volume`'s write-back as failing or not (counted for the pool).
    fn set_failing(&self, volume: &Volume, failing: bool) {
        let was = {
            let mut dirty = volume.writeback.dirty.borrow_mut();
            let was = dirty.phase == WritebackPhase::Failing;
            // A batch fails while its task runs: the task outlives its batches.
            debug_assert!(dirty.phase != WritebackPhase::Idle || !failing);
            if dirty.phase != WritebackPhase::Idle {
                dirty.phase = if failing {
                    WritebackPhase::Failing
                } else {
                    WritebackPhase::Running
                };
            }
            was
        };
        if was != failing {
            self.writeback.note_failing(failing);
        }
    }

    /// Holds `data` as block `blkid` of `volume` for an admitted write (the
    /// caller holds the block's lock). False when it must be written through
    /// instead: the volume's last write-back failed, or the pool may not have
    /// room for it.
    pub(crate) fn hold_dirty(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        data: BufSlice,
    ) -> bool {
        if volume.writeback.dirty.borrow().phase == WritebackPhase::Failing {
            return false;
        }
        let reserved = self.held_space_bytes(data.len() as u64);
        let previous_reserve = volume
            .writeback
            .dirty
            .borrow()
            .blocks
            .get(&blkid)
            .map_or(0, |block| block.reserved_bytes);
        if !self.has_room_to_hold(reserved, previous_reserve) {
            return false;
        }
        let length = data.len() as u64;
        let settings = volume.settings();
        // Stored as received, the checksum and parity of these bytes are
        // the block's: not when compressed or sealed.
        let prepared =
            if settings.compression.algo == Compression::Off && volume.key_guid().is_none() {
                Prepared {
                    checksum: Some((settings.checksum, settings.checksum.compute(&data))),
                    store: self.store.prepare(&data),
                }
            } else {
                Prepared::default()
            };
        let memory = length + prepared.bytes();
        let mut dirty = volume.writeback.dirty.borrow_mut();
        // A block written again keeps its place in the order and its age: it
        // still holds (merged into the new copy) the write that first dirtied
        // it, which a drain begun since must link, and which must not wait
        // longer than `WRITEBACK_DELAY` because the block keeps changing.
        // Copies of its earlier bytes in the intent log wait for it too.
        let (old_memory, old_reserved, seq, since, log_commits) = match dirty.remove(blkid) {
            Some(old) => {
                volume.count(|stats| stats.absorbed_writes += 1);
                let memory = old.memory_bytes();
                (
                    memory,
                    old.reserved_bytes,
                    old.seq,
                    old.since,
                    old.log_commits,
                )
            }
            None => {
                dirty.next_seq += 1;
                (0, 0, dirty.next_seq, rt::now(), Vec::new())
            }
        };
        dirty.blocks.insert(
            blkid,
            DirtyBlock {
                data,
                prepared,
                seq,
                since,
                reserved_bytes: reserved,
                logged: false,
                log_commits,
            },
        );
        dirty.order.insert(seq, blkid);
        dirty.bytes += length;
        dirty.unlogged_bytes += length;
        let urgent = dirty.bytes.saturating_sub(dirty.in_flight_bytes) >= WRITEBACK_BATCH_BYTES;
        drop(dirty);
        self.replace_held((old_memory, old_reserved), (memory, reserved));
        if !self.start_writeback(volume) && urgent {
            volume.writeback.kick.notify_all();
        }
        true
    }

    /// Starts `volume`'s write-back task unless it is running; true if started.
    fn start_writeback(self: &Rc<Self>, volume: &Rc<Volume>) -> bool {
        {
            let mut dirty = volume.writeback.dirty.borrow_mut();
            if dirty.phase != WritebackPhase::Idle {
                return false;
            }
            dirty.phase = WritebackPhase::Running;
        }
        let pool = self.clone();
        let task_volume = volume.clone();
        rt::spawn(async move { writeback_task(pool, task_volume).await });
        true
    }

    /// Forgets the dirty copy of `blkid` once the tree holds what the caller
    /// wrote (called right after linking, with the block's lock held, so reads
    /// go from the dirty copy to the tree with nothing in between).
    pub(crate) fn forget_dirty(&self, volume: &Volume, blkid: u64) -> Option<Forgotten> {
        let removed = volume.writeback.dirty.borrow_mut().remove(blkid);
        let old = removed?;
        self.release_dirty(old.memory_bytes(), old.reserved_bytes);
        volume.writeback.changed.notify_all();
        Some(Forgotten {
            logged: old.logged,
            log_commits: old.log_commits,
        })
    }

    /// Writes out and links every block of `volume` dirtied so far (blocks
    /// dirtied meanwhile may wait); fails if a write-back fails meanwhile.
    pub async fn drain_volume(self: &Rc<Self>, volume: &Rc<Volume>) -> Result<(), PoolError> {
        let (target, failures) = {
            let dirty = volume.writeback.dirty.borrow();
            (dirty.next_seq, dirty.failures)
        };
        loop {
            {
                let mut dirty = volume.writeback.dirty.borrow_mut();
                match dirty.order.first_key_value() {
                    None => return Ok(()),
                    Some((&oldest, _)) if oldest > target => return Ok(()),
                    Some(_) => {}
                }
                if dirty.failures > failures {
                    let reason = dirty.last_error.clone().unwrap_or_default();
                    return Err(PoolError::Io(format!(
                        "{}: writing out acknowledged data failed: {reason}",
                        volume.name()
                    )));
                }
                dirty.drain_target = dirty.drain_target.max(target);
            }
            self.start_writeback(volume);
            volume.writeback.kick.notify_all();
            volume.writeback.changed.notified().await;
        }
    }

    /// Drains every volume, and waits for the writes every filesystem
    /// answered before now to be linked (FLUSH of the pool, snapshots,
    /// export).
    pub async fn drain_all(self: &Rc<Self>) -> Result<(), PoolError> {
        let volumes = self.all_volumes();
        let drains = volumes.iter().map(|volume| self.drain_volume(volume));
        for result in futures_util::future::join_all(drains).await {
            result?;
        }
        for (_, fs) in self.all_filesystems() {
            fs.settle_writes(None).await;
        }
        Ok(())
    }

    /// Every open volume that can take writes, hidden ones included.
    fn all_volumes(&self) -> Vec<Rc<Volume>> {
        self.datasets.volumes.all()
    }
}

/// Writes out a volume's dirty blocks, oldest first, a batch at a time; ends
/// when none is left (the next dirty block starts it again).
async fn writeback_task(pool: Rc<Pool>, volume: Rc<Volume>) {
    let state = &volume.writeback;
    let batch_blocks = (WRITEBACK_BATCH_BYTES / volume.block_bytes).max(1) as usize;
    loop {
        // Read under one borrow, awaited on only once it is dropped.
        let head = {
            let dirty = state.dirty.borrow();
            match dirty
                .order
                .first_key_value()
                .map(|(&seq, &blkid)| (seq, blkid))
            {
                Some((oldest_seq, oldest_blkid)) => {
                    let since = dirty
                        .blocks
                        .get(&oldest_blkid)
                        .map(|block| block.since)
                        .unwrap_or(Instant(0));
                    let urgent = dirty.bytes.saturating_sub(dirty.in_flight_bytes)
                        >= WRITEBACK_BATCH_BYTES
                        || dirty.drain_target >= oldest_seq
                        || pool.writers_held_back()
                        || pool.txg.ensure_writable().is_err();
                    let failing = dirty.phase == WritebackPhase::Failing;
                    Some((since, urgent, dirty.batches_in_flight, failing))
                }
                None if dirty.batches_in_flight == 0 => {
                    drop(dirty);
                    // Nothing is left that could fail again.
                    pool.set_failing(&volume, false);
                    state.dirty.borrow_mut().phase = WritebackPhase::Idle;
                    return;
                }
                None => None,
            }
        };
        let Some((oldest_since, urgent, in_flight, failing)) = head else {
            state.changed.notified().await;
            continue;
        };
        if failing && in_flight == 0 {
            rt::timeout(WRITEBACK_RETRY_DELAY, state.kick.notified()).await;
            pool.set_failing(&volume, false);
        }
        let age = rt::now().duration_since(oldest_since);
        if !urgent && age < WRITEBACK_DELAY {
            rt::timeout(WRITEBACK_DELAY - age, state.kick.notified()).await;
            continue;
        }
        if in_flight >= WRITEBACK_BATCHES_IN_FLIGHT {
            state.batch_done.notified().await;
            continue;
        }
        let batch = pick_batch(&volume, batch_blocks);
        if batch.is_empty() {
            // Everything dirty is locked: being written out, or by a client
            // write about to replace it. Either releases its lock soon.
            volume.wait_unlocked().await;
            continue;
        }
        {
            let mut dirty = state.dirty.borrow_mut();
            dirty.batches_in_flight += 1;
            dirty.in_flight_bytes += batch
                .iter()
                .map(|(_, data, _)| data.len() as u64)
                .sum::<u64>();
        }
        let batch_pool = pool.clone();
        let batch_volume = volume.clone();
        rt::spawn(async move { write_batch(batch_pool, batch_volume, batch).await });
    }
}

/// Takes up to `limit` of the oldest dirty blocks not locked, locks them, and
/// returns them in block order (so a sequential writer's blocks are laid out
/// in order).
fn pick_batch(volume: &Volume, limit: usize) -> Vec<(u64, BufSlice, Prepared)> {
    let dirty = volume.writeback.dirty.borrow();
    let mut batch = Vec::with_capacity(limit.min(dirty.blocks.len()));
    for (_, &blkid) in dirty.order.iter() {
        if batch.len() >= limit {
            break;
        }
        if volume.try_lock_block(blkid) {
            let block = &dirty.blocks[&blkid];
            batch.push((blkid, block.data.clone(), block.prepared.clone()));
        }
    }
    batch.sort_unstable_by_key(|(blkid, _, _)| *blkid);
    batch
}

/// Writes and links one batch; the blocks' locks were taken by `pick_batch`.
async fn write_batch(pool: Rc<Pool>, volume: Rc<Volume>, batch: Vec<(u64, BufSlice, Prepared)>) {
    let locks: Vec<_> = batch
        .iter()
        .map(|(blkid, _, _)| volume.held_lock(*blkid))
        .collect();
    let bytes: u64 = batch.iter().map(|(_, data, _)| data.len() as u64).sum();
    let results = pool
        .store_blocks(&volume, batch, IoClass::AsyncWrite, true)
        .await;
    volume.writeback.dirty.borrow_mut().in_flight_bytes -= bytes;
    drop(locks);
    let written = results.iter().filter(|result| result.is_ok()).count() as u64;
    let error = results.into_iter().filter_map(Result::err).next_back();
    volume.count(|stats| stats.writeback_blocks += written);
    let state = &volume.writeback;
    {
        let mut dirty = state.dirty.borrow_mut();
        dirty.batches_in_flight -= 1;
        if let Some(failure) = error {
            dirty.failures += 1;
            dirty.last_error = Some(failure.to_string());
            drop(dirty);
            pool.set_failing(&volume, true);
            volume.count(|stats| stats.writeback_errors += 1);
        }
    }
    state.changed.notify_all();
    state.batch_done.notify_all();
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dev::sim::SimDevice;
    use crate::format::label::TopVdevKind;
    use crate::pool::test_pool::{sim_pool, unhurried};
    use crate::rt::buf::AlignedBuf;
    use crate::rt::Runtime;

    const BLOCK: u64 = 16384;

    fn filled(byte: u8) -> BufSlice {
        let mut buffer = AlignedBuf::zeroed(BLOCK as usize);
        buffer.fill(byte);
        BufSlice::whole(buffer.into_shared())
    }

    /// A block dirtied before a drain began and written again while the drain
    /// waits (its lock held by a client write, so the batches pass it by) is
    /// still one the drain must link: it holds a write acknowledged before the
    /// drain. A drain that let the rewrite count as "dirtied after" returned
    /// with it unlinked, and a snapshot or FLUSH then missed an acknowledged
    /// write.
    #[test]
    fn a_block_rewritten_during_a_drain_is_still_drained() {
        Runtime::new_sim(11).block_on(async {
            let disk = SimDevice::new("d0", 128 << 20, 11);
            let pool = sim_pool(&[disk], TopVdevKind::Disk, unhurried()).await;
            pool.create_volume("tank/vol", 32 << 20, BLOCK as u32, BTreeMap::new())
                .await
                .unwrap();
            let volume = pool.volume("tank/vol").unwrap();
            pool.write(&volume, 0, filled(1), false).await.unwrap();
            pool.write(&volume, BLOCK, filled(2), false).await.unwrap();
            // A client write holds block 0's lock across the drain's start.
            assert!(volume.try_lock_block(0));
            let lock = volume.held_lock(0);
            let drain = {
                let (pool, volume) = (pool.clone(), volume.clone());
                rt::spawn(async move { pool.drain_volume(&volume).await })
            };
            // Until block 1's batch is on its way.
            while volume.writeback.dirty.borrow().in_flight_bytes == 0 {
                rt::yield_now().await;
            }
            // Block 1 is being written out; block 0 is rewritten meanwhile,
            // and its writer still holds the lock when block 1 is linked.
            assert!(pool.hold_dirty(&volume, 0, filled(3)));
            while volume.writeback.dirty.borrow().in_flight_bytes != 0 {
                rt::sleep(Duration::from_micros(10)).await;
            }
            rt::sleep(Duration::from_micros(10)).await;
            drop(lock);
            drain.await.unwrap();
            assert!(
                volume.writeback.lookup(0).is_none(),
                "the drain returned with block 0 (dirtied before it) unlinked"
            );
        });
    }
}
