//! The intent log: what makes a FLUSH (a FUA write, every write under
//! `sync=always`) cost one log write and one device flush instead of a
//! transaction group.
//!
//! Each dataset has a chain of self-checksummed log blocks (see
//! `format::intent_log`), its head kept in the dataset's directory record.
//! Every block change linked into a dataset's tree (a block written in place,
//! a hole) is noted with the txg it was linked in. A log commit writes a
//! record for each block changed since the last durable txg and not yet
//! logged: its block pointer (the data is already in place), or that it is a
//! hole. The records go into the pre-allocated next block of the chain (more
//! blocks chained behind it when they do not fit), every device is flushed,
//! and the FLUSH is answered. Commits of one dataset are serialised: FLUSHes
//! that arrive while one is in flight share the next (group commit).
//!
//! When txg T is built, every log block whose records are all of txgs up to T
//! is obsolete once T is durable: the head moves past them in T's directory
//! and they are freed in T (so the head that is durable never points at
//! freed space). Replay at import (before any allocation) walks the chain
//! from the durable head, stops at the first block that does not verify,
//! claims the space of every record's block whose txg never became durable
//! and links it; records of durable txgs are skipped (what is on disk is as
//! new or newer). The chain is then freed and a new one started.
//!
//! As in OpenZFS, without a separate log device the chain lives in the main
//! devices (metadata space, one copy: the vdev's redundancy protects it).
//!
//! Log blocks are allocated in memory only, never recorded in the space
//! maps: after a crash their space is free, and a chain cut anywhere (a torn
//! block with written ones behind it) leaks nothing. A block the durable
//! head may still reach is not reused before that head is replaced for good:
//! its space returns to the allocator once the txg that stopped naming it is
//! past the defer depth, as a freed block's would.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use crate::format::intent_log::{
    self as format, LogBlockHeader, LogPointer, LogRecord, LOG_BLOCK_BYTES_MAX, LOG_BLOCK_BYTES_MIN,
};
use crate::format::{BlockPointer, Dva, ObjectType};
use crate::pool::dataset::directory::LogHead;
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Semaphore;

/// Log blocks replay reads per dataset at most (8 GiB of the largest): a
/// chain longer than this is damaged (blocks are freed at every txg, and a
/// txg holds far less), and replay must end.
pub const REPLAY_BLOCKS_MAX: u64 = 1 << 16;
/// Log blocks one commit writes at most (each up to 128 KiB: 8 MiB of
/// records, about 50,000 blocks changed); changes beyond wait for the next
/// commit, and a commit that has more falls back to a txg.
pub const COMMIT_BLOCKS_MAX: usize = 64;

/// Counters of a dataset's intent log (`iostat --json`, per volume).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogStats {
    /// Log commits that wrote blocks (each one device flush).
    pub commits: u64,
    /// Commits that found everything already logged (a FLUSH that shared the
    /// previous one's write).
    pub shared_commits: u64,
    /// Commits that went through a txg instead (no durable chain head yet, a
    /// failed log write, no space).
    pub txg_fallbacks: u64,
    pub blocks_written: u64,
    pub bytes_written: u64,
    pub records_written: u64,
    /// Microseconds the last commit took (write and flush).
    pub last_commit_us: u64,
}

/// A dataset's intent log in memory.
pub struct IntentLog {
    state: RefCell<LogState>,
    /// One commit at a time: a FLUSH arriving meanwhile waits and shares the
    /// next commit with every other one that arrived.
    commit_lock: Rc<Semaphore>,
}

impl Default for IntentLog {
    fn default() -> IntentLog {
        IntentLog {
            state: RefCell::new(LogState::default()),
            commit_lock: Semaphore::new(1),
        }
    }
}

#[derive(Default)]
struct LogState {
    chain_guid: u64,
    /// The next block to write (allocated, named by the durable head or by
    /// the last block written) and its sequence number.
    next: Option<(u64, LogPointer)>,
    /// The txg whose commit makes the head of this chain durable: the log
    /// is usable once it is.
    head_txg: u64,
    /// Blocks written and not yet freed, oldest first: sequence, where, and
    /// the newest txg among their records.
    written: VecDeque<(u64, LogPointer, u64)>,
    /// Blocks linked since the last durable txg and not yet logged, with the
    /// txg they were linked in (non-decreasing: txgs only move forward).
    unlogged: Vec<(u64, u64)>,
    /// Size of the next block to allocate: what the last commit needed.
    next_bytes: u32,
    stats: LogStats,
}

impl IntentLog {
    /// The log's counters.
    pub fn stats(&self) -> LogStats {
        self.state.borrow().stats
    }

    /// Notes that block `blkid` was linked in txg `txg`.
    pub(crate) fn note_linked(&self, blkid: u64, txg: u64) {
        self.state.borrow_mut().unlogged.push((blkid, txg));
    }

    /// Drops what txg `durable` made durable.
    fn forget_durable(&self, durable: u64) {
        let mut state = self.state.borrow_mut();
        let keep_from = state.unlogged.partition_point(|(_, txg)| *txg <= durable);
        state.unlogged.drain(..keep_from);
    }
}

fn block_size_for(bytes: usize) -> u32 {
    bytes
        .next_multiple_of(LOG_BLOCK_BYTES_MIN)
        .clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX) as u32
}

impl Pool {
    /// Allocates a log block of `bytes` and records it as used from the open
    /// txg on (so a durable head or block pointing at it points at space the
    /// durable space maps hold, or that replay claims).
    fn allocate_log_block(&self, bytes: u32) -> Result<LogPointer, PoolError> {
        let dvas = self
            .store
            .allocate(bytes as u64, true, 1)
            .map_err(|_| PoolError::NoSpace)?;
        Ok(LogPointer {
            dva: dvas[0],
            bytes,
        })
    }

    /// Returns log blocks' space once txg `txg` (which stopped naming them)
    /// is past the defer depth.
    fn release_log_blocks_after(&self, txg: u64, blocks: impl IntoIterator<Item = LogPointer>) {
        let mut releases = self.log_releases.0.borrow_mut();
        releases.extend(blocks.into_iter().map(|pointer| (txg, pointer)));
    }

    /// Starts a new chain for `volume`: its head block is allocated and named
    /// in the directory, usable once the open txg is durable.
    fn start_log_chain(&self, volume: &Volume) -> Result<(), PoolError> {
        let head = self.allocate_log_block(LOG_BLOCK_BYTES_MIN as u32)?;
        let guid = crate::format::new_guid();
        {
            let mut state = volume.log.state.borrow_mut();
            debug_assert!(state.written.is_empty(), "a chain restarts only when empty");
            state.chain_guid = guid;
            state.next = Some((1, head));
            state.head_txg = self.txg.open();
            state.next_bytes = LOG_BLOCK_BYTES_MIN as u32;
        }
        if let Some(record) = self
            .directory
            .borrow_mut()
            .volumes
            .get_mut(volume.short_name())
        {
            record.intent_log = Some(LogHead::at(guid, 1, head));
        }
        self.directory_dirty.set(true);
        Ok(())
    }

    /// Makes every change linked into `volume`'s tree so far durable: through
    /// its intent log when it has a durable chain, else through a txg.
    /// (A FLUSH drains the volume's held blocks first; a FUA write linked its
    /// own blocks before calling this.)
    pub(crate) async fn log_commit(self: &Rc<Self>, volume: &Rc<Volume>) -> Result<(), PoolError> {
        let _commit = volume.log.commit_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let usable = {
            let state = volume.log.state.borrow();
            state.next.is_some() && state.head_txg <= self.txg.durable()
        };
        if !usable {
            if volume.log.state.borrow().next.is_none() {
                // Allocation may fail on a full pool: the txg still commits.
                let _ = self.start_log_chain(volume);
            }
            volume.log.state.borrow_mut().stats.txg_fallbacks += 1;
            return self.commit_linked().await;
        }
        let started = crate::rt::now();
        let durable = self.txg.durable();
        volume.log.forget_durable(durable);
        let unlogged = std::mem::take(&mut volume.log.state.borrow_mut().unlogged);
        // The newest change of each block only, in the order they were linked.
        let mut seen = rustc_hash::FxHashSet::default();
        let mut blocks: Vec<(u64, u64)> = unlogged
            .iter()
            .rev()
            .filter(|(blkid, txg)| *txg > durable && seen.insert(*blkid))
            .copied()
            .collect();
        blocks.reverse();
        let mut records = Vec::with_capacity(blocks.len());
        for (blkid, linked_txg) in blocks {
            let pointer = match self.objects.block_pointer(&volume.object, blkid).await {
                Ok(pointer) => pointer,
                Err(error) => {
                    self.requeue_unlogged(volume, &unlogged);
                    return Err(error.into());
                }
            };
            // A hole keeps no birth in the tree: the link's txg stands for it.
            let txg = if pointer.is_hole() {
                linked_txg
            } else {
                pointer.birth_txg
            };
            if txg <= self.txg.durable() {
                continue; // durable already (or relinked since, and that is)
            }
            records.push(if pointer.is_hole() {
                LogRecord::Hole {
                    object: volume.object.id,
                    blkid,
                    txg,
                }
            } else {
                LogRecord::Block {
                    object: volume.object.id,
                    blkid,
                    pointer,
                }
            });
        }
        if records.is_empty() {
            // Everything was logged by a commit that finished before this one
            // started (it held the lock), or is durable.
            volume.log.state.borrow_mut().stats.shared_commits += 1;
            return Ok(());
        }
        match self.write_log_blocks(volume, &records).await {
            Ok(()) => {
                let elapsed = crate::rt::now().duration_since(started);
                volume.log.state.borrow_mut().stats.last_commit_us = elapsed.as_micros() as u64;
                Ok(())
            }
            Err(error) => {
                // The chain may now have a gap: a txg makes everything durable
                // instead, and a new chain starts with it.
                eprintln!(
                    "ironpool: {}: intent log write failed ({error}); committing a txg instead",
                    volume.name
                );
                self.requeue_unlogged(volume, &unlogged);
                self.abandon_log_chain(volume);
                let _ = self.start_log_chain(volume);
                volume.log.state.borrow_mut().stats.txg_fallbacks += 1;
                self.commit_linked().await
            }
        }
    }

    /// Puts changes taken for a commit that did not happen back in front.
    fn requeue_unlogged(&self, volume: &Volume, taken: &[(u64, u64)]) {
        let mut state = volume.log.state.borrow_mut();
        let newer = std::mem::take(&mut state.unlogged);
        state.unlogged = taken.iter().copied().chain(newer).collect();
    }

    /// Writes `records` into the next blocks of `volume`'s chain and flushes
    /// every device; on success the blocks join the chain.
    async fn write_log_blocks(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        records: &[LogRecord],
    ) -> Result<(), PoolError> {
        let (guid, first) = {
            let state = volume.log.state.borrow();
            (
                state.chain_guid,
                state.next.expect("a usable chain has a next block"),
            )
        };
        // Cut the records into blocks: the pre-allocated next one first, then
        // blocks allocated to fit the rest; the last names a new next block.
        let mut blocks: Vec<(u64, LogPointer, &[LogRecord])> = Vec::new();
        let mut current = first;
        let mut start = 0;
        let mut allocated = Vec::new();
        while start < records.len() {
            let capacity = current.1.bytes as usize;
            let mut end = start;
            let mut used = format::LOG_HEADER_BYTES;
            while end < records.len() && used + records[end].encoded_bytes() <= capacity {
                used += records[end].encoded_bytes();
                end += 1;
            }
            // A record larger than this block leaves it empty: the record goes
            // into the next one, sized for it.
            blocks.push((current.0, current.1, &records[start..end]));
            start = end;
            if blocks.len() > COMMIT_BLOCKS_MAX {
                self.release_log_blocks(&allocated);
                return Err(PoolError::InvalidArgument(format!(
                    "{} log records need more than {COMMIT_BLOCKS_MAX} log blocks",
                    records.len()
                )));
            }
            let rest = format::block_bytes_for(&records[start..]);
            let bytes = if start < records.len() {
                block_size_for(rest)
            } else {
                let last_used = format::block_bytes_for(records);
                block_size_for(last_used.min(LOG_BLOCK_BYTES_MAX))
            };
            match self.allocate_log_block(bytes) {
                Ok(pointer) => {
                    allocated.push(pointer);
                    current = (current.0 + 1, pointer);
                }
                Err(error) => {
                    self.release_log_blocks(&allocated);
                    return Err(error);
                }
            }
        }
        let new_next = current;
        let writes = blocks
            .iter()
            .enumerate()
            .map(|(index, (seq, pointer, records))| {
                let next = blocks
                    .get(index + 1)
                    .map(|(seq, pointer, _)| (*seq, *pointer))
                    .unwrap_or(new_next);
                let mut buffer = AlignedBuf::zeroed(pointer.bytes as usize);
                format::encode_block(
                    &LogBlockHeader {
                        chain_guid: guid,
                        seq: *seq,
                        next: next.1,
                    },
                    records,
                    &mut buffer,
                );
                let dva = pointer.dva;
                let store = self.store.clone();
                async move {
                    store
                        .write(
                            &[dva],
                            BufSlice::whole(buffer.into_shared()),
                            IoClass::SyncWrite,
                        )
                        .await
                }
            });
        for result in futures_util::future::join_all(writes).await {
            if let Err(error) = result {
                self.release_log_blocks(&allocated);
                return Err(error.into());
            }
        }
        if let Err(error) = self.store.flush_all().await {
            self.release_log_blocks(&allocated);
            return Err(error.into());
        }
        let max_txg = records
            .iter()
            .map(|record| match record {
                LogRecord::Block { pointer, .. } => pointer.birth_txg,
                LogRecord::Hole { txg, .. } => *txg,
                LogRecord::Copy { .. } => u64::MAX,
            })
            .max()
            .unwrap_or(0);
        let mut state = volume.log.state.borrow_mut();
        for (seq, pointer, block_records) in &blocks {
            state.written.push_back((*seq, *pointer, max_txg));
            state.stats.blocks_written += 1;
            state.stats.bytes_written += pointer.bytes as u64;
            state.stats.records_written += block_records.len() as u64;
        }
        state.stats.commits += 1;
        state.next = Some(new_next);
        state.next_bytes = new_next.1.bytes;
        Ok(())
    }

    /// Returns log blocks allocated for a commit that failed: nothing durable
    /// names them (a block that names one was never acknowledged).
    fn release_log_blocks(&self, blocks: &[LogPointer]) {
        let dvas: Vec<Dva> = blocks.iter().map(|pointer| pointer.dva).collect();
        self.store.release(&dvas);
    }

    /// Waits for `volume`'s log commit in flight, then frees its chain; the
    /// returned permit keeps new commits out (the volume is being destroyed).
    pub(crate) async fn discard_log(&self, volume: &Volume) -> crate::rt::sync::Permit {
        let permit = volume.log.commit_lock.acquire(1).await;
        self.abandon_log_chain(volume);
        permit
    }

    /// Frees `volume`'s whole chain (written blocks and the next one) and
    /// forgets it: the volume is destroyed, or its chain is broken. The
    /// directory's head is cleared in the open txg.
    pub(crate) fn abandon_log_chain(&self, volume: &Volume) {
        let txg = self.txg.open();
        let mut state = volume.log.state.borrow_mut();
        let written: Vec<LogPointer> = state
            .written
            .drain(..)
            .map(|(_, pointer, _)| pointer)
            .collect();
        let next = state.next.take().map(|(_, pointer)| pointer);
        drop(state);
        self.release_log_blocks_after(txg, written.into_iter().chain(next));
        if let Some(record) = self
            .directory
            .borrow_mut()
            .volumes
            .get_mut(volume.short_name())
        {
            record.intent_log = None;
        }
        self.directory_dirty.set(true);
    }
}

/// Txg `txg` is being built: every log block whose records are all of txgs
/// up to `txg` is freed in it, and each chain's head moves past them in its
/// directory. Returns whether the directory changed.
pub(crate) fn build_step(pool: &Pool, txg: u64) -> bool {
    let mut changed = false;
    for volume in pool.volumes.borrow().values() {
        let mut state = volume.log.state.borrow_mut();
        let mut obsolete = Vec::new();
        while state
            .written
            .front()
            .is_some_and(|(_, _, max_txg)| *max_txg <= txg)
        {
            let (_, pointer, _) = state.written.pop_front().expect("a front block");
            obsolete.push(pointer);
        }
        if obsolete.is_empty() {
            continue;
        }
        pool.release_log_blocks_after(txg, obsolete);
        let head = match (state.written.front(), state.next) {
            (Some((seq, pointer, _)), _) => Some((*seq, *pointer)),
            (None, Some(next)) => Some(next),
            (None, None) => None,
        };
        let guid = state.chain_guid;
        drop(state);
        if let Some(record) = pool
            .directory
            .borrow_mut()
            .volumes
            .get_mut(volume.short_name())
        {
            record.intent_log = head.map(|(seq, pointer)| LogHead::at(guid, seq, pointer));
            changed = true;
        }
    }
    if changed {
        pool.directory_dirty.set(true);
    }
    changed
}

/// Txg `txg` is durable: changes linked up to it need no log record, and
/// log blocks the txgs past the defer depth stopped naming are free again.
pub(crate) fn txg_durable(pool: &Pool, txg: u64) {
    for volume in pool.volumes.borrow().values() {
        volume.log.forget_durable(txg);
    }
    let mut releases = pool.log_releases.0.borrow_mut();
    let due: Vec<Dva> = releases
        .iter()
        .filter(|(named_until, _)| named_until + crate::alloc::DEFER_TXGS <= txg)
        .map(|(_, pointer)| pointer.dva)
        .collect();
    if due.is_empty() {
        return;
    }
    releases.retain(|(named_until, _)| named_until + crate::alloc::DEFER_TXGS > txg);
    drop(releases);
    pool.store.release(&due);
}

/// Log blocks waiting to return to the allocator (see [`txg_durable`]).
#[derive(Default)]
pub(crate) struct LogReleases(RefCell<Vec<(u64, LogPointer)>>);

/// What replay found in one chain.
struct Chain {
    records: Vec<LogRecord>,
    /// Why the walk ended, when it was not at a block never written.
    damage: Option<String>,
}

/// Reads `volume`'s chain from `head` until a block does not verify.
async fn read_chain(pool: &Pool, head: LogHead) -> Chain {
    let mut chain = Chain {
        records: Vec::new(),
        damage: None,
    };
    let mut pointer = head.pointer();
    for seq in head.seq..head.seq.saturating_add(REPLAY_BLOCKS_MAX) {
        if pointer.bytes as usize > LOG_BLOCK_BYTES_MAX || pointer.bytes == 0 {
            chain.damage = Some(format!("log block {seq} has an invalid size"));
            break;
        }
        let first = pool
            .store
            .read_unverified(pointer.dva, pointer.bytes as u64)
            .await;
        let decoded = match &first {
            Ok(bytes) => {
                format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
            }
            Err(error) => Err(crate::format::FormatError::Invalid {
                what: "intent log block",
                reason: error.to_string(),
            }),
        };
        let decoded = match decoded {
            Ok(decoded) => Ok(decoded),
            Err(error) => {
                // A block of this chain that does not verify: another side
                // or parity may hold it intact.
                let ours = first
                    .as_ref()
                    .is_ok_and(|bytes| format::names_block(bytes, head.chain_guid, seq));
                if ours {
                    let verify = |bytes: &[u8]| {
                        format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
                            .is_ok()
                    };
                    match pool
                        .store
                        .read_self_checked(pointer.dva, pointer.bytes as u64, &verify)
                        .await
                    {
                        Ok(bytes) => format::decode_block(
                            &bytes[..pointer.bytes as usize],
                            head.chain_guid,
                            seq,
                        ),
                        Err(_) => {
                            chain.damage = Some(format!(
                                "log block {seq} is torn or damaged ({error}); replay ended there"
                            ));
                            Err(error)
                        }
                    }
                } else {
                    Err(error)
                }
            }
        };
        let Ok((header, records)) = decoded else {
            break;
        };
        chain.records.extend(records);
        pointer = header.next;
    }
    chain
}

/// Replays every volume's intent log into its tree (at import, before any
/// allocation: the records' blocks are claimed first) and starts new chains.
/// Returns notes for `status`.
pub(crate) async fn replay(pool: &Rc<Pool>) -> Replayed {
    let durable = pool.txg.durable();
    let mut notes = Vec::new();
    let heads: Vec<(String, LogHead)> = pool
        .directory
        .borrow()
        .volumes
        .iter()
        .filter_map(|(name, record)| record.intent_log.map(|head| (name.clone(), head)))
        .collect();
    let mut replays = Vec::new();
    let mut changes = 0;
    for (name, head) in heads {
        let Some(volume) = pool.volumes.borrow().get(&name).cloned() else {
            continue;
        };
        let chain = read_chain(pool, head).await;
        if let Some(damage) = &chain.damage {
            notes.push(format!("{}: intent log: {damage}", volume.name));
        }
        // A commit is answered only after a device flush that covers its
        // blocks' data: a record whose data does not verify belongs to a
        // commit that never finished (its log block landed, its data did
        // not), and no later commit was started. Replay ends there.
        let mut records = chain.records;
        if let Some(unwritten) = first_unwritten(pool, &records, durable).await {
            notes.push(format!(
                "{}: intent log: the last commit did not finish ({} of its records not replayed)",
                volume.name,
                records.len() - unwritten
            ));
            records.truncate(unwritten);
        }
        // The newest record of each block decides; a record of a durable txg
        // means the tree already holds that change or a newer one.
        let mut last: std::collections::BTreeMap<u64, Option<LogRecord>> = Default::default();
        for record in records {
            let (object, blkid) = record.target();
            if object != volume.object.id
                || blkid.saturating_mul(volume.block_bytes) >= volume.size_bytes.get()
            {
                continue;
            }
            let keep = match &record {
                LogRecord::Block { pointer, .. } => pointer.birth_txg <= durable,
                LogRecord::Hole { txg, .. } => *txg <= durable,
                LogRecord::Copy { .. } => false,
            };
            last.insert(blkid, (!keep).then_some(record));
        }
        // Claim every block to link before anything allocates.
        let mut apply = Vec::new();
        let mut refused = 0u64;
        for (blkid, record) in last {
            match record {
                Some(LogRecord::Block { pointer, .. }) => {
                    let mut claimed = Vec::new();
                    for dva in pointer.copies() {
                        if !pool.store.claim(*dva) {
                            break;
                        }
                        claimed.push(*dva);
                    }
                    if claimed.len() == pointer.copies().count() {
                        apply.push((blkid, Some(pointer)));
                    } else {
                        // Give back what was taken: the allocator's own view.
                        pool.store.release(&claimed);
                        refused += 1;
                    }
                }
                Some(LogRecord::Hole { .. }) => apply.push((blkid, None)),
                Some(LogRecord::Copy { .. }) | None => {}
            }
        }
        if refused > 0 {
            notes.push(format!(
                "{}: intent log: {refused} records point at space in use; not replayed",
                volume.name
            ));
        }
        replays.push((volume, apply));
    }
    for (volume, apply) in replays {
        let count = apply.len();
        let mut failed = Vec::new();
        for (blkid, pointer) in apply {
            let pointer =
                pointer.unwrap_or_else(|| BlockPointer::hole(0, ObjectType::VolumeData, 0));
            // A failed link releases the block it was given.
            if let Err(error) = pool.link_block(&volume, blkid, pointer).await {
                failed.push(format!("block {blkid}: {error}"));
            }
        }
        changes += count - failed.len();
        if count > failed.len() {
            notes.push(format!(
                "{}: intent log: replayed {} block changes",
                volume.name,
                count - failed.len()
            ));
        }
        if !failed.is_empty() {
            notes.push(format!(
                "{}: intent log: {} records could not be replayed: {}",
                volume.name,
                failed.len(),
                failed.join("; ")
            ));
        }
        if let Some(record) = pool
            .directory
            .borrow_mut()
            .volumes
            .get_mut(volume.short_name())
        {
            record.intent_log = None;
        }
        pool.directory_dirty.set(true);
    }
    Replayed { notes, changes }
}

/// Records read at once while checking that the blocks of a chain's records
/// hold their data (a bound on replay's reads in flight).
const REPLAY_READS_IN_FLIGHT: usize = 64;

/// The index of the first record of a txg after `durable` whose block does
/// not hold the data its pointer names, if any. Every side and column is
/// read and the bad ones are rewritten (as a scrub does): a block whose
/// write a crash cut short may verify through parity or one mirror side
/// while the rest is stale, and the pool adopts it.
async fn first_unwritten(pool: &Rc<Pool>, records: &[LogRecord], durable: u64) -> Option<usize> {
    let to_check: Vec<(usize, BlockPointer)> = records
        .iter()
        .enumerate()
        .filter_map(|(index, record)| match record {
            LogRecord::Block { pointer, .. } if pointer.birth_txg > durable => {
                Some((index, *pointer))
            }
            _ => None,
        })
        .collect();
    for batch in to_check.chunks(REPLAY_READS_IN_FLIGHT) {
        let reads = batch.iter().map(|(index, pointer)| async move {
            (*index, pool.store.scrub(pointer).await.is_ok())
        });
        let results = futures_util::future::join_all(reads).await;
        if let Some((index, _)) = results.into_iter().find(|(_, ok)| !ok) {
            return Some(index);
        }
    }
    None
}

/// What [`replay`] did.
pub(crate) struct Replayed {
    /// For `status`: what was replayed, and what ended a chain early.
    pub notes: Vec<String>,
    /// Block changes linked.
    pub changes: usize,
}
