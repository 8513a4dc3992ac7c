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
//! hole. A FLUSH also logs the blocks held in memory by the write-back: by
//! OpenZFS's size rule (`logbias=latency`, blocks of up to 32 KiB) their bytes
//! are copied into the log, so a FLUSH costs one write; otherwise they are
//! written in place first and logged as pointers. The records go into the
//! pre-allocated next block of the chain (more blocks chained behind it when
//! they do not fit), written durable (FUA); the devices holding blocks the
//! pointer records name are flushed, and the FLUSH is answered. Commits of
//! one dataset are serialised: FLUSHes that arrive while one is in flight
//! share the next (group commit).
//!
//! A filesystem's `fsync` ([`Pool::fs_log_commit`]) uses the same chain
//! machinery: its writes are in place before they are answered, so its
//! records are pointers and holes keyed by (file, block), and each written
//! file's size and times. A small block's bytes, kept from its write, go
//! into the log instead of its pointer while the tree still points there
//! (so its devices need no flush for the commit). Changes of names and
//! attributes are logged as the state they left: each object changed (its
//! attributes, size and block size, or that it was freed) and each
//! directory entry changed, and each object's whole list of extended
//! attributes after a change of one, so replay makes them so whatever it
//! finds, in a fixed order (objects, entries, extended attributes, blocks,
//! sizes, frees). Its replay takes whole commits only (a write's blocks
//! and size, a rename's two entries, come back together).
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
//! Log blocks go to a log device (`create POOL ... log [mirror] DEV...`)
//! when one can take writes; as in OpenZFS, without one (none configured, or
//! every one failed) the chain lives in the main devices (metadata space, one
//! copy: the vdev's redundancy protects it). A chain may cross from one to
//! the other: each block names the next by address.
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
use crate::format::intent_log::{EntryTarget, ObjectState};
use crate::format::znode::Timestamp;
use crate::format::{BlockPointer, Dva, ObjectType};
use crate::pool::dataset::directory::LogHead;
use crate::pool::dataset::props::LogBias;
use crate::pool::filesystem::Filesystem;
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
/// records, about 50,000 blocks changed, or the copies below); a commit that
/// needs more falls back to a txg.
pub const COMMIT_BLOCKS_MAX: usize = 64;
/// Blocks a FLUSH copies into the log are at most this large (OpenZFS's
/// `zfs_immediate_write_sz`): a larger block costs less written once in
/// place than twice.
pub const COPY_BLOCK_BYTES_MAX: u64 = 32 * 1024;
/// Bytes of held blocks one commit copies at most. A small commit waits on
/// latency: copying saves the round trip of writing the blocks first. A
/// large one waits on bandwidth: copying writes every byte twice, and each
/// FLUSH brings new blocks to copy, where FLUSHes waiting on blocks written
/// in place pile up and share one commit. Measured with
/// scripts/bench-durable.sh on a mirror of two files (16K random writes),
/// against always writing in place: copying up to 4 MiB made QD1 with a
/// FLUSH per write 14-22% faster and QD64 with a FLUSH every 32 writes 64%
/// slower; this limit (with the blocks over it written out before the
/// commit lock) made them 20% and 5% faster.
pub const COPY_BYTES_PER_COMMIT_MAX: u64 = 64 << 10;

/// The longest wait of a commit for more callers (tunable
/// `log_group_wait_percent`, see `PoolTunables`), whatever the last commit
/// took: one that stalled on a failing device must not make the next wait
/// long.
pub const GROUP_COMMIT_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(2);
/// Callers count as parallel (and commits wait for company) while one of
/// them found the commit lock taken within this many commits (OpenZFS 2.3
/// stops waiting for a single-threaded writer likewise): a lone writer
/// with a FLUSH per write never waits.
pub const GROUP_COMMIT_BURST_COMMITS: u64 = 8;

/// Log commits of one dataset being written at once, at most (the tunable
/// `log_commits_in_flight` goes up to this). Each holds its encoded blocks
/// while they are written: at most `COMMIT_BLOCKS_MAX` of 128 KiB (8 MiB),
/// and a volume's FLUSH commit far less (its copies are bounded by
/// `COPY_BYTES_PER_COMMIT_MAX`). Past a few, commits only queue on the same
/// device syncs, and FLUSHes waiting for a turn share the next commit.
pub const LOG_COMMITS_IN_FLIGHT_MAX: u64 = 8;
/// Log commits of one volume written at once by default: one. On a mirror
/// of two files on one virtual disk (scripts/bench-durable.sh, 16K random
/// writes at QD64, same runs), two in flight made `sync=always` 2-23%
/// faster and `--fsync=32` 24-32% slower: a FLUSH that drained its held
/// blocks starts its own commit beside the one in flight instead of
/// sharing the next, and each adds a flush of the data devices. Where a
/// log device's syncs run in parallel (NVMe), more may pay.
pub const DEFAULT_LOG_COMMITS_IN_FLIGHT: u64 = 1;

/// Objects and directory entries a filesystem keeps for its next commit at
/// most (their records take at most 16,384 x 296 bytes, under half of what
/// `COMMIT_BLOCKS_MAX` blocks hold): past it, an `fsync` commits a txg,
/// which is as fast per change when this many are waiting.
pub const NAMESPACE_CHANGES_MAX: usize = 16_384;

/// The largest list of an object's extended attributes the log carries
/// (encoded, `format::xattr`): a record holds the whole list, so one as
/// large as an xattr block may be (128 KiB) would not fit a log block with
/// its header. Larger lists are rare (a few values near the 64 KiB limit)
/// and go through a txg.
pub const XATTRS_LOGGED_BYTES_MAX: usize = 32 << 10;

/// Lists of extended attributes kept for the next commit, at most (their
/// bytes): past it, changes of extended attributes go through a txg until
/// it is durable, so memory stays bounded between two txgs.
pub const XATTRS_PENDING_BYTES_MAX: u64 = 1 << 20;

/// FLUSHes in a row, each the first request after exactly one WRITE, after
/// which a volume logs each lone WRITE as soon as it is answered (see
/// [`Pool::log_ahead`]): enough that a client flushing after every write
/// is told from one that flushed once after a single write, few enough
/// that the pattern pays from its first second.
pub const LOG_AHEAD_STREAK: u32 = 4;

/// Counters of a dataset's intent log (`iostat --json`, per volume).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogStats {
    /// Log commits that wrote blocks (each one durable write per device
    /// holding its blocks).
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
    /// Blocks whose bytes went into the log: a volume's held blocks (each
    /// written in place later), a filesystem's small writes (already in
    /// place, their devices not flushed for the commit).
    pub copied_blocks: u64,
    /// Microseconds the last commit took (write and flush).
    pub last_commit_us: u64,
    /// Commits that first waited for more callers to share them (group
    /// commit, tunable `log_group_wait_percent`).
    pub group_commit_waits: u64,
    /// Commits started by a WRITE as it was answered, ahead of the FLUSH
    /// (a filesystem's: `fsync`) its client's pattern says comes next
    /// ([`Pool::log_ahead`], [`Pool::fs_log_ahead`]), that wrote log
    /// blocks. Each is also in `commits`, and the FLUSH that finds its
    /// write logged by one counts as shared: `commits` + `shared_commits` +
    /// `txg_fallbacks` is the FLUSHes and durable writes plus
    /// `ahead_commits`.
    pub ahead_commits: u64,
    /// Microseconds all commits that wrote blocks took, summed: with
    /// `commits`, the mean over any interval (`iostat -l`).
    pub commit_time_us: u64,
    /// Those commits by how long they took: bucket i counts commits of
    /// [2^i, 2^(i+1)) microseconds (the last also everything longer).
    pub commit_latency_us_log2: [u64; COMMIT_LATENCY_BUCKETS],
}

/// Buckets of the commit latency histogram: up to 2^23 us (8 s), past any
/// commit that does not time out.
pub const COMMIT_LATENCY_BUCKETS: usize = 24;

/// A dataset's intent log in memory.
pub struct IntentLog {
    state: RefCell<LogState>,
    /// One commit prepared at a time (its records gathered, its blocks
    /// reserved in the chain): a FLUSH arriving meanwhile waits and shares
    /// the next commit with every other one that arrived. A volume's commit
    /// lets it go while its blocks are written, up to the tunable
    /// `log_commits_in_flight` commits at once; a filesystem's keeps it.
    commit_lock: Rc<Semaphore>,
    /// Woken when a commit in flight ends: the next one in chain order may
    /// be answered, and a commit waiting for room in flight may start.
    turns: crate::rt::sync::Notify,
    /// How the dataset's client flushes, for [`Pool::log_ahead`].
    cadence: std::cell::Cell<Cadence>,
}

/// A volume's recent FLUSH pattern: WRITEs since the last FLUSH, and how
/// many FLUSHes in a row came after exactly one.
#[derive(Clone, Copy, Default)]
struct Cadence {
    writes_since_flush: u32,
    streak: u32,
}

impl Default for IntentLog {
    fn default() -> IntentLog {
        IntentLog {
            state: RefCell::new(LogState::default()),
            commit_lock: Semaphore::new(1),
            turns: crate::rt::sync::Notify::new(),
            cadence: Default::default(),
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
    /// the commit they belong to.
    written: VecDeque<(u64, LogPointer, u64)>,
    /// Commits whose blocks are reserved in the chain (after `written`'s,
    /// before `next`) and being written, in chain order. Each is answered
    /// only once those before it are: replay stops at the first block not
    /// written, so a commit is durable only with every one before it.
    in_flight: VecDeque<InFlight>,
    /// Commits in flight that failed, so far: a caller waiting on commits
    /// in flight learns whether they all succeeded.
    failed_commits: u64,
    /// What each commit with blocks in `written` waits for.
    commits: rustc_hash::FxHashMap<u64, CommitWait>,
    /// Blocks whose bytes a commit copied (the newest such commit), from the
    /// moment the copy is taken. A newer change linked since cancels the
    /// copy.
    live_copies: rustc_hash::FxHashMap<u64, u64>,
    /// Copies cancelled by a change linked in a txg not yet built: (txg,
    /// commit, block number).
    pending_cancels: Vec<(u64, u64, u64)>,
    /// Copies cancelled in the head (what the directory holds), while their
    /// log blocks are in the chain.
    cancelled: Vec<(u64, u64)>,
    /// The number of the next commit.
    next_commit: u64,
    /// Commits started (log or txg), counted as each takes the lock: a
    /// caller notes the count when it arrives, and any commit numbered
    /// above it started after its changes were linked or held.
    commits_started: u64,
    /// `commits_started` when a caller last found the commit lock taken:
    /// callers arrive in parallel, and a commit waits for more of them.
    contended_at: Option<u64>,
    /// The newest commit (by `commits_started`) that succeeded, and the
    /// newest that also made every block held at its start durable (a
    /// FLUSH's copying commit; other commits log linked blocks only, their
    /// FLUSH having written its held blocks out before the lock).
    covered_linked: u64,
    covered_held: u64,
    /// Blocks linked since the last durable txg and not yet logged, as
    /// (object, block number, the txg they were linked in); txgs are
    /// non-decreasing (they only move forward).
    unlogged: Vec<(u64, u64, u64)>,
    /// A filesystem's files whose size or times changed by writes since the
    /// last durable txg and not yet logged: their newest values.
    attrs: rustc_hash::FxHashMap<u64, FileAttr>,
    /// A filesystem's small writes since the last durable txg, by (file,
    /// block): where each went, its txg and its bytes, so that a commit can
    /// copy them into the log (and not flush the devices holding them) while
    /// the tree still points at that block. At most
    /// `COPY_BYTES_PER_COMMIT_MAX` bytes.
    small_writes: rustc_hash::FxHashMap<(u64, u64), WrittenCopy>,
    small_write_bytes: u64,
    /// A filesystem's objects changed by a change of names or attributes
    /// (or a file's block growing) since the last durable txg and not yet
    /// logged: their state at the end of the change (None: freed, for
    /// good: numbers are not reused), with its txg.
    objects: rustc_hash::FxHashMap<u64, (u64, Option<ObjectState>)>,
    /// A filesystem's directory entries changed since the last durable txg
    /// and not yet logged, by (directory, name): what each names now (None:
    /// gone), with its txg.
    entries: rustc_hash::FxHashMap<EntryKey, (u64, Option<EntryTarget>)>,
    /// A filesystem's objects whose extended attributes changed since the
    /// last durable txg and not yet logged: the whole list after the
    /// change (encoded; empty: none), with its txg. At most
    /// [`XATTRS_PENDING_BYTES_MAX`] bytes (`xattr_bytes`).
    xattrs: rustc_hash::FxHashMap<u64, (u64, Vec<u8>)>,
    xattr_bytes: u64,
    /// Changes of a file's block size and frees so far: a commit that sees
    /// one happen while it reads block pointers (which may then not fit the
    /// object states it took) goes through a txg.
    reshapes: u64,
    /// The newest txg holding a change of a filesystem the log does not
    /// carry (a list of extended attributes past its bounds; more names and
    /// objects changed than `NAMESPACE_CHANGES_MAX`): a commit goes through
    /// a txg until that one is durable.
    unloggable_since: u64,
    stats: LogStats,
}

impl LogState {
    /// Whether a filesystem's object is noted as freed.
    fn is_freed(&self, object: u64) -> bool {
        matches!(self.objects.get(&object), Some((_, None)))
    }

    /// Forgets commit `commit` and what names its copies (it was never
    /// written: a cancellation of one of its copies, which no record can
    /// match, goes too).
    fn forget_commit(&mut self, commit: u64) {
        let _ = self.forget_commits(&rustc_hash::FxHashSet::from_iter([commit]));
    }

    /// Forgets `commits` and what names their copies, in one pass over the
    /// copies however many commits go: a txg frees every commit it made
    /// durable at once (tens of thousands after a few seconds of a FLUSH per
    /// write), and a pass per commit over tens of thousands of copies held
    /// the loop for up to half a second (fio nbd 16K QD1 `--fsync=1` with a
    /// log device: FLUSH latency max 534 ms, p99.5 3.3 ms). Returns whether
    /// the cancellations the head carries changed.
    #[must_use]
    fn forget_commits(&mut self, commits: &rustc_hash::FxHashSet<u64>) -> bool {
        if commits.is_empty() {
            return false;
        }
        for commit in commits {
            self.commits.remove(commit);
        }
        self.live_copies
            .retain(|_, copied_in| !commits.contains(copied_in));
        self.pending_cancels
            .retain(|(_, copied_in, _)| !commits.contains(copied_in));
        let cancelled = self.cancelled.len();
        self.cancelled
            .retain(|(copied_in, _)| !commits.contains(copied_in));
        self.cancelled.len() != cancelled
    }
}

/// A commit whose blocks are reserved in its chain and being written.
struct InFlight {
    commit: u64,
    /// The chain it was reserved in: if that chain was abandoned meanwhile
    /// (a commit before it failed), the commit failed too.
    chain_guid: u64,
    /// Its blocks in chain order: sequence and where.
    blocks: Vec<(u64, LogPointer)>,
}

/// A commit's log blocks, reserved in the chain by
/// [`Pool::reserve_log_blocks`] and encoded, for [`Pool::write_reserved`].
struct LogWrite {
    commit: u64,
    chain_guid: u64,
    /// Each block: sequence, where, its encoded bytes, and how many records
    /// it holds.
    blocks: Vec<(u64, LogPointer, AlignedBuf, usize)>,
    /// Top-level vdevs holding blocks its pointer records name: flushed
    /// while the log blocks are written.
    needed: Vec<u32>,
}

/// Ends a commit in flight: whatever happens to the future writing it
/// (finished, or dropped), its entry leaves the queue, and when it did not
/// succeed its blocks are released and its chain (if still the dataset's)
/// abandoned, so that the commits after it fail rather than wait forever or
/// be answered past a gap.
struct InFlightEnd<'a> {
    pool: &'a Pool,
    owner: Owner<'a>,
    commit: u64,
    armed: bool,
}

impl InFlightEnd<'_> {
    fn end(&mut self, succeeded: bool) {
        self.armed = false;
        let log = self.owner.log();
        let mut state = log.state.borrow_mut();
        let Some(index) = state
            .in_flight
            .iter()
            .position(|entry| entry.commit == self.commit)
        else {
            return;
        };
        let entry = state.in_flight.remove(index).expect("index found above");
        if succeeded {
            for (seq, pointer) in &entry.blocks {
                state.written.push_back((*seq, *pointer, self.commit));
            }
        } else {
            state.failed_commits += 1;
            // Written or not, its blocks may be named by a durable head (the
            // first, when the chain had no other) or be under I/O still: they
            // go back once the open txg is past the defer depth.
            let current = state.chain_guid == entry.chain_guid;
            drop(state);
            let txg = self.pool.txg.open();
            self.pool
                .release_log_blocks_after(txg, entry.blocks.iter().map(|(_, pointer)| *pointer));
            if current {
                // The chain may now have a gap: the commits behind this one
                // fail too, and a txg makes everything durable instead; a new
                // chain starts with it.
                self.pool.abandon_log_chain(self.owner);
                let _ = self.pool.start_log_chain(self.owner);
            }
        }
        log.turns.notify_all();
    }
}

impl Drop for InFlightEnd<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.end(false);
        }
    }
}

/// A directory entry: the directory's object and the name.
type EntryKey = (u64, Vec<u8>);

/// What a filesystem's commit takes from its log state (and gives back if
/// it does not happen).
#[derive(Default)]
struct FileChanges {
    attrs: rustc_hash::FxHashMap<u64, FileAttr>,
    small_writes: rustc_hash::FxHashMap<(u64, u64), WrittenCopy>,
    objects: rustc_hash::FxHashMap<u64, (u64, Option<ObjectState>)>,
    entries: rustc_hash::FxHashMap<EntryKey, (u64, Option<EntryTarget>)>,
    xattrs: rustc_hash::FxHashMap<u64, (u64, Vec<u8>)>,
}

/// A filesystem's written block kept for its next commit (see
/// `LogState::small_writes`).
#[derive(Clone, Debug)]
struct WrittenCopy {
    dva: Dva,
    txg: u64,
    data: Vec<u8>,
}

/// A file's size and times after a write, as an attribute record carries
/// them, and the txg of the write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileAttr {
    pub txg: u64,
    pub length: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

/// Why a volume's log commit runs: a caller asked for it (a FLUSH, a FUA
/// write, a write under `sync=always`), or it was started ahead of a FLUSH
/// the client's pattern says is coming ([`Pool::log_ahead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    Asked,
    Ahead,
}

/// Whose intent log: a volume's or a filesystem's. The head of each chain is
/// in that dataset's directory record.
#[derive(Clone, Copy)]
pub(crate) enum Owner<'a> {
    Volume(&'a Volume),
    Filesystem(&'a Filesystem),
}

impl<'a> Owner<'a> {
    fn log(self) -> &'a IntentLog {
        match self {
            Owner::Volume(volume) => &volume.log,
            Owner::Filesystem(fs) => &fs.log,
        }
    }
}

/// What a commit's log blocks wait for before they can be freed: the txg
/// that holds all their changes must be durable.
#[derive(Clone, Copy, Debug, Default)]
struct CommitWait {
    /// Blocks copied into the commit and not yet linked into the tree.
    copies_pending: u64,
    /// The newest txg holding one of its changes (linked blocks, holes, and
    /// copied blocks linked since).
    max_txg: u64,
}

impl IntentLog {
    /// Notes that blocks copied into commits `commits` were linked (or
    /// replaced) in txg `txg`.
    pub(crate) fn resolve_copies(&self, commits: &[u64], txg: u64) {
        if commits.is_empty() {
            return;
        }
        let mut state = self.state.borrow_mut();
        for commit in commits {
            if let Some(wait) = state.commits.get_mut(commit) {
                wait.copies_pending = wait.copies_pending.saturating_sub(1);
                wait.max_txg = wait.max_txg.max(txg);
            }
        }
    }

    /// Takes the commit lock for a caller whose changes are linked (and with
    /// `held`, whose blocks are held and will be copied) by now. None when a
    /// commit that started after it arrived has covered them (counted as
    /// shared); else the lock and this commit's number, for
    /// [`IntentLog::covered`] once it succeeds.
    ///
    /// A commit of a dataset whose callers arrive in parallel (one found the
    /// lock taken during the last [`GROUP_COMMIT_BURST_COMMITS`] commits)
    /// first waits `wait_percent` of the last commit's time for more
    /// callers, as OpenZFS's open log block does: each one arriving
    /// meanwhile shares it instead of paying its own device syncs. A lone
    /// caller (QD1 with a FLUSH per write) never waits.
    ///
    /// With the lock, it waits until fewer than `in_flight_max` commits are
    /// being written: callers arriving meanwhile queue behind it and share
    /// the commit it starts, and one ending meanwhile may cover it.
    async fn begin_commit(
        &self,
        held: bool,
        wait_percent: u64,
        in_flight_max: u64,
    ) -> Option<(crate::rt::sync::Permit, u64)> {
        let arrived = self.state.borrow().commits_started;
        let permit = match self.commit_lock.try_acquire(1) {
            Some(permit) => permit,
            None => {
                self.state.borrow_mut().contended_at = Some(arrived);
                self.commit_lock.acquire(1).await
            }
        };
        self.wait_in_flight_below(in_flight_max.max(1)).await;
        let wait = {
            let mut state = self.state.borrow_mut();
            let covered = if held {
                state.covered_held
            } else {
                state.covered_linked
            };
            if covered > arrived {
                state.stats.shared_commits += 1;
                return None;
            }
            let parallel = state.contended_at.is_some_and(|contended| {
                state.commits_started - contended < GROUP_COMMIT_BURST_COMMITS
            });
            let wait_us = (state.stats.last_commit_us * wait_percent / 100)
                .min(GROUP_COMMIT_WAIT_MAX.as_micros() as u64);
            (parallel && wait_us > 0).then(|| std::time::Duration::from_micros(wait_us))
        };
        if let Some(wait) = wait {
            self.state.borrow_mut().stats.group_commit_waits += 1;
            crate::rt::sleep(wait).await;
        }
        // Numbered only now: a caller that arrived while this commit waited
        // is covered by it (nothing else commits while the lock is held).
        let mut state = self.state.borrow_mut();
        state.commits_started += 1;
        Some((permit, state.commits_started))
    }

    /// [`IntentLog::begin_commit`] for a commit nobody waits on
    /// ([`Pool::log_ahead`]): the lock and a number only if the lock is
    /// free and fewer than `in_flight_max` commits are in flight now, else
    /// None, and never a wait for company.
    fn try_begin_commit(&self, in_flight_max: u64) -> Option<(crate::rt::sync::Permit, u64)> {
        let permit = self.commit_lock.try_acquire(1)?;
        let mut state = self.state.borrow_mut();
        if state.in_flight.len() as u64 >= in_flight_max.max(1) {
            return None;
        }
        state.commits_started += 1;
        Some((permit, state.commits_started))
    }

    /// Waits until fewer than `max` commits are in flight.
    async fn wait_in_flight_below(&self, max: u64) {
        loop {
            let turn = self.turns.notified();
            if (self.state.borrow().in_flight.len() as u64) < max {
                return;
            }
            turn.await;
        }
    }

    /// Waits until commit `last` and every commit in flight before it have
    /// ended (they end in chain order, and commits are numbered in it).
    async fn wait_ended(&self, last: u64) {
        loop {
            let turn = self.turns.notified();
            let first = self
                .state
                .borrow()
                .in_flight
                .front()
                .map(|entry| entry.commit);
            if first.is_none_or(|first| first > last) {
                return;
            }
            turn.await;
        }
    }

    /// Takes the commit lock once no commit is in flight: nothing commits
    /// until the permit is dropped.
    async fn quiesce(&self) -> crate::rt::sync::Permit {
        let permit = self.commit_lock.acquire(1).await;
        self.wait_in_flight_below(1).await;
        permit
    }

    /// Commit `number` succeeded: it covers every caller that arrived before
    /// it started (with `held`, their held blocks too).
    fn covered(&self, number: u64, held: bool) {
        let mut state = self.state.borrow_mut();
        state.covered_linked = state.covered_linked.max(number);
        if held {
            state.covered_held = state.covered_held.max(number);
        }
    }

    /// Counts a commit that wrote blocks, started at `started`.
    fn note_commit_time(&self, started: crate::rt::Instant) {
        let micros = crate::rt::now().duration_since(started).as_micros() as u64;
        let bucket = (63 - micros.max(1).leading_zeros()) as usize;
        let mut state = self.state.borrow_mut();
        state.stats.last_commit_us = micros;
        state.stats.commit_time_us += micros;
        state.stats.commit_latency_us_log2[bucket.min(COMMIT_LATENCY_BUCKETS - 1)] += 1;
    }

    /// Puts attribute changes and written copies taken for a commit that
    /// did not happen back, unless newer ones of the same file or block came
    /// meanwhile.
    fn requeue_file_changes(&self, taken: FileChanges) {
        let FileChanges {
            attrs,
            small_writes,
            objects,
            entries,
            xattrs,
        } = taken;
        let mut state = self.state.borrow_mut();
        // A list noted since is newer than the one taken.
        for (object, change) in xattrs {
            if !state.xattrs.contains_key(&object) {
                state.xattr_bytes += change.1.len() as u64;
                state.xattrs.insert(object, change);
            }
        }
        // An object's state noted since supersedes the attributes taken (a
        // write's attributes are newer than its state taken with them).
        for (object, attr) in attrs {
            if !state.objects.contains_key(&object) {
                state.attrs.entry(object).or_insert(attr);
            }
        }
        for (object, change) in objects {
            state.objects.entry(object).or_insert(change);
        }
        for (key, change) in entries {
            state.entries.entry(key).or_insert(change);
        }
        for (target, copy) in small_writes {
            if !state.small_writes.contains_key(&target)
                && state.small_write_bytes + copy.data.len() as u64 <= COPY_BYTES_PER_COMMIT_MAX
            {
                state.small_write_bytes += copy.data.len() as u64;
                state.small_writes.insert(target, copy);
            }
        }
    }

    /// Notes a WRITE arriving, for [`Pool::log_ahead`] and [`Pool::fs_log_ahead`].
    pub(crate) fn note_write_arrived(&self) {
        let mut cadence = self.cadence.get();
        cadence.writes_since_flush = cadence.writes_since_flush.saturating_add(1);
        self.cadence.set(cadence);
    }

    /// Notes a FLUSH arriving, for [`Pool::log_ahead`] and [`Pool::fs_log_ahead`].
    pub(crate) fn note_flush_arrived(&self) {
        let mut cadence = self.cadence.get();
        cadence.streak = match cadence.writes_since_flush {
            1 => cadence.streak.saturating_add(1),
            _ => 0,
        };
        cadence.writes_since_flush = 0;
        self.cadence.set(cadence);
    }

    /// Whether the client flushes after every write, and the write just
    /// answered is the only one since its last FLUSH.
    pub(crate) fn flush_expected(&self) -> bool {
        let cadence = self.cadence.get();
        cadence.streak >= LOG_AHEAD_STREAK && cadence.writes_since_flush == 1
    }

    /// The log's counters.
    pub fn stats(&self) -> LogStats {
        self.state.borrow().stats
    }

    /// Notes that block `blkid` of `object` was linked in txg `txg`.
    pub(crate) fn note_linked(&self, object: u64, blkid: u64, txg: u64) {
        self.state.borrow_mut().unlogged.push((object, blkid, txg));
    }

    /// Notes that block `blkid` of a filesystem's file `object` was linked as
    /// `pointer` holding `data` (None: not to be copied, `logbias=throughput`
    /// or too large): a commit copies the bytes into the log while the tree
    /// still points there, as long as the copies fit their bound.
    pub(crate) fn note_written(
        &self,
        object: u64,
        blkid: u64,
        pointer: &BlockPointer,
        data: Option<&[u8]>,
    ) {
        let mut state = self.state.borrow_mut();
        if let Some(old) = state.small_writes.remove(&(object, blkid)) {
            state.small_write_bytes -= old.data.len() as u64;
        }
        let Some(data) = data else {
            return;
        };
        let bytes = data.len() as u64;
        if pointer.is_hole()
            || bytes > COPY_BLOCK_BYTES_MAX
            || state.small_write_bytes + bytes > COPY_BYTES_PER_COMMIT_MAX
        {
            return;
        }
        state.small_write_bytes += bytes;
        state.small_writes.insert(
            (object, blkid),
            WrittenCopy {
                dva: pointer.dvas[0],
                txg: pointer.birth_txg,
                data: data.to_vec(),
            },
        );
    }

    /// Notes a file's size and times after a write (a filesystem's log).
    pub(crate) fn note_attr(&self, object: u64, attr: FileAttr) {
        self.state.borrow_mut().attrs.insert(object, attr);
    }

    /// Notes a change the log does not carry, made in txg `txg` or before:
    /// commits go through a txg until `txg` is durable.
    pub(crate) fn note_unloggable(&self, txg: u64) {
        let mut state = self.state.borrow_mut();
        state.unloggable_since = state.unloggable_since.max(txg);
    }

    /// Notes a filesystem's object as a change of txg `txg` left it (None:
    /// freed). Its size and times supersede any a write noted before.
    pub(crate) fn note_object(&self, object: u64, txg: u64, state: Option<ObjectState>) {
        let mut log = self.state.borrow_mut();
        // Freed is for good: an object changed in the same change before it
        // was freed is not brought back.
        if log.is_freed(object) {
            return;
        }
        log.attrs.remove(&object);
        if state.is_none() {
            // Its attributes go with it.
            if let Some((_, list)) = log.xattrs.remove(&object) {
                log.xattr_bytes -= list.len() as u64;
            }
        }
        log.objects.insert(object, (txg, state));
        Self::bound_namespace(&mut log, txg);
    }

    /// Whether a filesystem's object was noted as freed (and its txg is not
    /// durable yet).
    pub(crate) fn freed(&self, object: u64) -> bool {
        self.state.borrow().is_freed(object)
    }

    /// Notes that directory `dir`'s entry `name` names `target` (None: is
    /// gone) after a change of txg `txg`.
    pub(crate) fn note_entry(&self, dir: u64, name: &[u8], txg: u64, target: Option<EntryTarget>) {
        let mut log = self.state.borrow_mut();
        log.entries.insert((dir, name.to_vec()), (txg, target));
        Self::bound_namespace(&mut log, txg);
    }

    /// Notes that `object`'s extended attributes are `list` (encoded;
    /// empty: none) after a change of txg `txg`; a list past
    /// [`XATTRS_LOGGED_BYTES_MAX`], or past [`XATTRS_PENDING_BYTES_MAX`] in
    /// all, is not carried: commits go through a txg until `txg` is durable.
    pub(crate) fn note_xattrs(&self, object: u64, txg: u64, list: Vec<u8>) {
        let mut log = self.state.borrow_mut();
        if let Some((_, old)) = log.xattrs.remove(&object) {
            log.xattr_bytes -= old.len() as u64;
        }
        let bytes = list.len() as u64;
        if list.len() > XATTRS_LOGGED_BYTES_MAX
            || log.xattr_bytes + bytes > XATTRS_PENDING_BYTES_MAX
        {
            log.unloggable_since = log.unloggable_since.max(txg);
            return;
        }
        log.xattr_bytes += bytes;
        log.xattrs.insert(object, (txg, list));
    }

    /// Notes a change of a file's block size, or a free.
    pub(crate) fn note_reshaped(&self) {
        self.state.borrow_mut().reshapes += 1;
    }

    /// Past `NAMESPACE_CHANGES_MAX` changes kept, drops them and sends
    /// commits through a txg until `txg` is durable.
    fn bound_namespace(log: &mut LogState, txg: u64) {
        if log.objects.len() + log.entries.len() > NAMESPACE_CHANGES_MAX {
            log.objects.clear();
            log.entries.clear();
            log.unloggable_since = log.unloggable_since.max(txg);
        }
    }

    /// Drops what txg `durable` made durable.
    fn forget_durable(&self, durable: u64) {
        let mut state = self.state.borrow_mut();
        let keep_from = state
            .unlogged
            .partition_point(|(_, _, txg)| *txg <= durable);
        state.unlogged.drain(..keep_from);
        state.attrs.retain(|_, attr| attr.txg > durable);
        state.objects.retain(|_, (txg, _)| *txg > durable);
        state.entries.retain(|_, (txg, _)| *txg > durable);
        state.xattrs.retain(|_, (txg, _)| *txg > durable);
        state.xattr_bytes = state
            .xattrs
            .values()
            .map(|(_, list)| list.len() as u64)
            .sum();
        state.small_writes.retain(|_, copy| copy.txg > durable);
        state.small_write_bytes = state
            .small_writes
            .values()
            .map(|copy| copy.data.len() as u64)
            .sum();
    }

    /// Block `blkid` got bytes newer than its copy in the log (if it has
    /// one), linked in txg `txg`: once that txg is durable, replay must not
    /// apply the copy (the txg's directory says so).
    pub(crate) fn note_superseded(&self, blkid: u64, txg: u64) {
        let mut state = self.state.borrow_mut();
        if let Some(commit) = state.live_copies.remove(&blkid) {
            state.pending_cancels.push((txg, commit, blkid));
        }
    }
}

/// The record of block `blkid` of `object`, linked in `linked_txg` and now
/// `pointer` in the tree, unless its change is durable already (or it was
/// relinked since, and that is).
fn block_record(
    object: u64,
    blkid: u64,
    linked_txg: u64,
    pointer: BlockPointer,
    durable: u64,
) -> Option<LogRecord> {
    // A hole keeps no birth in the tree: the link's txg stands for it.
    if pointer.is_hole() {
        (linked_txg > durable).then_some(LogRecord::Hole {
            object,
            blkid,
            txg: linked_txg,
        })
    } else {
        (pointer.birth_txg > durable).then_some(LogRecord::Block {
            object,
            blkid,
            pointer,
        })
    }
}

/// The txg of a pointer or hole record (others: 0).
fn record_txg(record: &LogRecord) -> u64 {
    match record {
        LogRecord::Block { pointer, .. } => pointer.birth_txg,
        LogRecord::Hole { txg, .. }
        | LogRecord::Attr { txg, .. }
        | LogRecord::Written { txg, .. }
        | LogRecord::Object { txg, .. }
        | LogRecord::Freed { txg, .. }
        | LogRecord::Entry { txg, .. }
        | LogRecord::Xattrs { txg, .. } => *txg,
        LogRecord::Copy { .. } => 0,
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
        let dva = self
            .store
            .allocate_log(bytes as u64)
            .map_err(|_| PoolError::NoSpace)?;
        Ok(LogPointer { dva, bytes })
    }

    /// Returns log blocks' space once txg `txg` (which stopped naming them)
    /// is past the defer depth.
    fn release_log_blocks_after(&self, txg: u64, blocks: impl IntoIterator<Item = LogPointer>) {
        let mut releases = self.log_releases.0.borrow_mut();
        releases.extend(blocks.into_iter().map(|pointer| (txg, pointer)));
    }

    /// Starts a new chain for `owner`: its head block is allocated and named
    /// in the directory, usable once the open txg is durable.
    fn start_log_chain(&self, owner: Owner) -> Result<(), PoolError> {
        let head = self.allocate_log_block(LOG_BLOCK_BYTES_MIN as u32)?;
        let guid = crate::format::new_guid();
        {
            let mut state = owner.log().state.borrow_mut();
            debug_assert!(state.written.is_empty(), "a chain restarts only when empty");
            state.chain_guid = guid;
            state.next = Some((1, head));
            state.head_txg = self.txg.open();
        }
        self.set_log_head(owner, Some(LogHead::at(guid, 1, head)));
        Ok(())
    }

    /// Whether `owner`'s chain can take a commit now: it has one, and the
    /// txg naming its head is durable. A dataset without one starts it here
    /// (usable once the open txg is durable); until then, and on a pool too
    /// full for its head block, commits go through a txg.
    fn chain_usable(&self, owner: Owner) -> bool {
        let (usable, missing) = {
            let state = owner.log().state.borrow();
            (
                state.next.is_some() && state.head_txg <= self.txg.durable(),
                state.next.is_none(),
            )
        };
        if missing {
            let _ = self.start_log_chain(owner);
        }
        usable
    }

    /// Names `head` as where `owner`'s log starts (None: it has none), in
    /// the directory the open or building txg writes.
    fn set_log_head(&self, owner: Owner, head: Option<LogHead>) {
        let mut directory = self.datasets.directory.edit();
        let slot = match owner {
            Owner::Volume(volume) => directory
                .volumes
                .get_mut(volume.short_name())
                .map(|record| &mut record.intent_log),
            Owner::Filesystem(fs) => directory
                .filesystems
                .get_mut(fs.short_name())
                .map(|record| &mut record.intent_log),
        };
        if let Some(slot) = slot {
            *slot = head;
        }
        drop(directory);
    }

    /// Starts the FLUSH that `volume`'s client is about to send, once its
    /// WRITE is answered: when the client has flushed after every single
    /// write lately ([`LOG_AHEAD_STREAK`] times) and this write's blocks
    /// would be copied into the log, the commit copying them starts now.
    /// Its log write then runs while the answer travels to the client and
    /// the FLUSH comes back, and the FLUSH finds its write logged and waits
    /// only for that commit to end. Without it, each write then FLUSH at
    /// QD1 pays the round trip and the durable log write one after the
    /// other. A client whose FLUSH does not come costs one log write of
    /// its held blocks (the streak ends at its next FLUSH), which a txg
    /// frees as it does any log block.
    ///
    /// Nothing is promised by it, so it never waits and never does more
    /// than that one log write: when the commit lock is taken or a commit
    /// is in flight, the chain is not usable or the blocks would not be
    /// copied, it does nothing; it never writes held blocks out or commits
    /// a txg, and when its log write fails, what it took goes back for the
    /// FLUSH, which commits again (through a txg if the chain failed).
    /// It outlives its WRITE's answer; [`Pool::export`] waits for it.
    pub async fn log_ahead(self: &Rc<Self>, volume: &Rc<Volume>) {
        if !volume.log.flush_expected()
            || volume.is_destroyed()
            || volume.settings().sync != crate::pool::dataset::props::SyncMode::Standard
            || volume.writeback.unlogged_bytes() == 0
            || !self.copy_fits(volume)
        {
            return;
        }
        let in_flight_max = self.tunables.borrow().log_commits_in_flight;
        let Some((permit, number)) = volume.log.try_begin_commit(in_flight_max) else {
            return;
        };
        // `commit_locked` checks that the pool takes writes and the chain is
        // usable, as for any commit, and returns at once if not.
        if let Ok(true) = self
            .commit_locked(volume, true, true, permit, Commit::Ahead)
            .await
        {
            volume.log.covered(number, true);
        }
    }

    /// Makes every change linked into `volume`'s tree so far durable, and
    /// with `held` (a FLUSH) every block the write-back holds for it too:
    /// through its intent log when it has a durable chain, else through a
    /// txg. (A FUA write linked its own blocks before calling this.)
    pub(crate) async fn log_commit(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
    ) -> Result<(), PoolError> {
        // Held blocks too many or too large to copy are written out before
        // the commit lock is taken, so that FLUSHes waiting for their blocks
        // wait together and share the commit that follows.
        let mut copy = held && self.copy_fits(volume);
        let (_commit, number) = loop {
            if held && !copy {
                self.drain_volume(volume).await?;
            }
            // Everything this caller needs is linked now, or (when its held
            // blocks are to be copied) held: a commit that starts after this
            // point covers it, whoever asked for it, if it logs what is
            // linked at its start, and for held blocks, if it also took
            // every block held at its start under the lock (a copying commit
            // does; one whose caller wrote its held blocks out before the
            // lock does not).
            let (wait_percent, in_flight_max) = {
                let tunables = self.tunables.borrow();
                (
                    tunables.log_group_wait_percent,
                    tunables.log_commits_in_flight,
                )
            };
            let Some((permit, number)) = volume
                .log
                .begin_commit(copy, wait_percent, in_flight_max)
                .await
            else {
                return Ok(());
            };
            if copy && !self.copy_fits(volume) {
                // More blocks were held while this caller waited for the
                // lock than a commit copies: they are written out after the
                // lock is let go, as above, not under it, where every
                // commit behind this one would wait for those writes too
                // (under `sync=always` at QD64, that wait was half of each
                // commit).
                drop(permit);
                copy = false;
                continue;
            }
            break (permit, number);
        };
        let result = self
            .commit_locked(volume, held, copy, _commit, Commit::Asked)
            .await;
        if result.is_ok() {
            volume.log.covered(number, copy);
        }
        result.map(|_| ())
    }

    /// A commit, under the volume's commit lock (`lock`): through the log
    /// when its chain is usable, else (or when writing the log fails)
    /// through a txg. The lock is let go once the commit's blocks are
    /// reserved in the chain, so the next commit can be prepared and
    /// written while this one's are. Returns whether everything linked
    /// (and with `copy`, held) at its start is durable: always, when it
    /// succeeds, for a commit that was asked for; for one started ahead
    /// ([`Commit::Ahead`]), only when it wrote its blocks (it neither waits
    /// on commits in flight nor falls back to a txg).
    async fn commit_locked(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
        copy: bool,
        lock: crate::rt::sync::Permit,
        kind: Commit,
    ) -> Result<bool, PoolError> {
        self.txg.ensure_writable()?;
        if !self.chain_usable(Owner::Volume(volume)) {
            return self.commit_instead(volume, held, kind).await;
        }
        let started = crate::rt::now();
        let commit = {
            let mut state = volume.log.state.borrow_mut();
            state.next_commit += 1;
            let commit = state.next_commit;
            state.commits.insert(commit, CommitWait::default());
            commit
        };
        // Held blocks first: copied (the caller found they fit, under the
        // lock, with nothing awaited since), or written in place before the
        // lock (then linked, and logged below as pointers).
        let copies = match copy {
            true => self.copy_held_blocks(volume, commit),
            false => Vec::new(),
        };
        let durable = self.txg.durable();
        volume.log.forget_durable(durable);
        let unlogged = std::mem::take(&mut volume.log.state.borrow_mut().unlogged);
        // The newest change of each block only, in the order they were linked.
        let mut seen = rustc_hash::FxHashSet::default();
        let mut blocks: Vec<(u64, u64)> = unlogged
            .iter()
            .rev()
            .filter(|(_, blkid, txg)| *txg > durable && seen.insert(*blkid))
            .map(|(_, blkid, txg)| (*blkid, *txg))
            .collect();
        blocks.reverse();
        let mut records = Vec::with_capacity(blocks.len() + copies.len());
        let mut max_txg = 0;
        for (blkid, linked_txg) in blocks {
            let pointer = match self.objects.block_pointer(&volume.object, blkid).await {
                Ok(pointer) => pointer,
                Err(error) => {
                    self.requeue_unlogged(Owner::Volume(volume), &unlogged);
                    self.forget_commit(volume, commit, &copies);
                    return Err(error.into());
                }
            };
            let object = volume.object.id;
            if let Some(record) =
                block_record(object, blkid, linked_txg, pointer, self.txg.durable())
            {
                max_txg = max_txg.max(record_txg(&record));
                records.push(record);
            }
        }
        // Copies after the pointers: a held block's bytes are newer than
        // whatever its pointer held when they were taken (replay takes the
        // last record of a block).
        let copied = copies.len();
        records.extend(copies.iter().map(|(blkid, data)| LogRecord::Copy {
            object: volume.object.id,
            blkid: *blkid,
            data: data.to_vec(),
        }));
        if records.is_empty() {
            // Everything is durable, or was logged by commits that began
            // before this one: those still in flight must succeed before
            // the caller is answered (found by engine_sim's crash test,
            // seed 16: a FLUSH answered here lost a write whose record was
            // in flight). If one fails, a txg makes everything durable.
            let (last, failures) = {
                let mut state = volume.log.state.borrow_mut();
                state.commits.remove(&commit);
                (
                    state.in_flight.back().map(|entry| entry.commit),
                    state.failed_commits,
                )
            };
            if kind == Commit::Ahead {
                // Nothing of its own to write: the FLUSH will wait.
                return Ok(false);
            }
            if let Some(last) = last {
                drop(lock);
                volume.log.wait_ended(last).await;
                if volume.log.state.borrow().failed_commits != failures {
                    return self.commit_instead(volume, held, kind).await;
                }
            }
            volume.log.state.borrow_mut().stats.shared_commits += 1;
            return Ok(true);
        }
        if let Some(wait) = volume.log.state.borrow_mut().commits.get_mut(&commit) {
            wait.max_txg = wait.max_txg.max(max_txg);
        }
        let written = match self.reserve_log_blocks(Owner::Volume(volume), &records, commit) {
            Ok(write) => {
                drop(lock);
                self.write_reserved(Owner::Volume(volume), write).await
            }
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => {
                volume.log.note_commit_time(started);
                let mut state = volume.log.state.borrow_mut();
                state.stats.copied_blocks += copied as u64;
                if kind == Commit::Ahead {
                    state.stats.ahead_commits += 1;
                }
                Ok(true)
            }
            Err(error) => {
                // A write that failed abandoned the chain (a new one starts):
                // a txg makes everything durable instead. Nothing awaits
                // until what this commit took is given back, so a commit
                // after it that failed with it finds its copies held again.
                self.requeue_unlogged(Owner::Volume(volume), &unlogged);
                self.forget_commit(volume, commit, &copies);
                let instead = match kind {
                    Commit::Ahead => "the next FLUSH commits again",
                    Commit::Asked => "committing a txg instead",
                };
                eprintln!(
                    "ironpool: {}: intent log write failed ({error}); {instead}",
                    volume.name
                );
                self.commit_instead(volume, held, kind).await
            }
        }
    }

    /// What a volume's commit does when its log cannot carry it (no usable
    /// chain, a failed log write, or a failed commit it was waiting on): one
    /// that was asked for makes everything durable through a txg and
    /// returns true; one started ahead ([`Commit::Ahead`]) promised nothing,
    /// so it returns false at once and the FLUSH's own commit does the work.
    async fn commit_instead(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
        kind: Commit,
    ) -> Result<bool, PoolError> {
        match kind {
            Commit::Ahead => Ok(false),
            Commit::Asked => {
                volume.log.state.borrow_mut().stats.txg_fallbacks += 1;
                self.commit_through_txg(volume, held).await.map(|()| true)
            }
        }
    }

    /// [`Pool::log_ahead`] for a filesystem: once a direct WRITE is
    /// answered, when its client has called `fsync` after every single
    /// write lately ([`LOG_AHEAD_STREAK`] times), the commit that `fsync`
    /// will ask for starts now. Its log write then runs while the answer
    /// travels and the FSYNC comes back; the FSYNC's own commit waits for
    /// the commit lock, which this one holds until its log write has ended
    /// (a filesystem writes one commit at a time), and finds nothing left
    /// to log. At QD1 that hides the commit's preparation and part of its
    /// log write behind the round trip.
    ///
    /// Nothing is promised by it, so it never waits for the lock and never
    /// commits a txg: when the lock is taken, the pool closing, or the
    /// changes cannot be logged (no chain yet, a change the log does not
    /// carry, a failed log write), it does nothing, or gives back what it
    /// took, and the FSYNC's commit does the work as it would have. It
    /// outlives its WRITE's answer; [`Pool::export`] waits for it.
    pub async fn fs_log_ahead(self: &Rc<Self>, fs: &Rc<Filesystem>) {
        if !fs.log.flush_expected()
            || fs.is_snapshot()
            || fs.is_retired()
            || fs.settings().sync != crate::pool::dataset::props::SyncMode::Standard
            || self.txg.ensure_writable().is_err()
        {
            return;
        }
        let Some((_commit, number)) = fs.log.try_begin_commit(1) else {
            return;
        };
        if let Ok(true) = self.fs_log_shared(fs).await {
            fs.log.covered(number, false);
            fs.log.state.borrow_mut().stats.ahead_commits += 1;
        }
    }

    /// Makes every change to `fs` so far durable (`fsync`, `fdatasync`, a
    /// write under `O_SYNC`, `O_DSYNC` or `sync=always`): through its intent
    /// log (the records: each changed object's state and entry, each block's
    /// pointer, hole or bytes, each written file's size and times, each
    /// changed list of extended attributes) unless a change it does not
    /// carry is newer than the last durable txg, else through a txg.
    /// Commits of one filesystem are serialised, and `fsync`s that arrive
    /// during one share the next, as a volume's FLUSHes.
    pub async fn fs_log_commit(self: &Rc<Self>, fs: &Rc<Filesystem>) -> Result<(), PoolError> {
        if fs.is_snapshot() {
            // Read-only and durable since it was taken: nothing to log, and
            // no chain to start (its name has no directory record).
            return Ok(());
        }
        // Writes answered before this are linked (and noted) first.
        fs.settle_writes(None).await;
        let wait_percent = self.tunables.borrow().log_group_wait_percent;
        // Its lock is kept while its blocks are written: one in flight.
        let Some((_commit, number)) = fs.log.begin_commit(false, wait_percent, 1).await else {
            return Ok(());
        };
        self.txg.ensure_writable()?;
        if !self.fs_log_shared(fs).await? {
            fs.log.state.borrow_mut().stats.txg_fallbacks += 1;
            self.commit_linked().await?;
        }
        fs.log.covered(number, false);
        Ok(())
    }

    /// [`Pool::fs_log_write`] under the filesystem's lock taken shared, so
    /// that no change of names or attributes runs meanwhile and a rollback,
    /// destroy or receive waits for the log write to end; false, logging
    /// nothing, when the filesystem was retired (destroyed, rolled back or
    /// received over) before the lock was had.
    /// The caller holds the commit lock.
    async fn fs_log_shared(self: &Rc<Self>, fs: &Filesystem) -> Result<bool, PoolError> {
        let _shared = fs.shared().await;
        if fs.is_retired() {
            return Ok(false);
        }
        self.fs_log_write(fs).await
    }

    /// Writes the changes of `fs` not yet logged into its chain. False when
    /// they must go through a txg instead: no usable chain yet, a change the
    /// log does not carry since the last durable txg, a file's block size
    /// changed or a file freed while the pointers were read, or a failed log
    /// write.
    /// The caller holds the commit lock and the filesystem's lock shared.
    async fn fs_log_write(self: &Rc<Self>, fs: &Filesystem) -> Result<bool, PoolError> {
        let owner = Owner::Filesystem(fs);
        let log = &fs.log;
        let unloggable = log.state.borrow().unloggable_since > self.txg.durable();
        if !self.chain_usable(owner) || unloggable {
            return Ok(false);
        }
        let started = crate::rt::now();
        let durable = self.txg.durable();
        log.forget_durable(durable);
        let (unlogged, mut taken, reshapes) = {
            let mut state = log.state.borrow_mut();
            state.small_write_bytes = 0;
            let taken = FileChanges {
                attrs: std::mem::take(&mut state.attrs),
                small_writes: std::mem::take(&mut state.small_writes),
                objects: std::mem::take(&mut state.objects),
                entries: std::mem::take(&mut state.entries),
                xattrs: std::mem::take(&mut state.xattrs),
            };
            state.xattr_bytes = 0;
            (std::mem::take(&mut state.unlogged), taken, state.reshapes)
        };
        let give_back = |unlogged: &[(u64, u64, u64)], taken| {
            self.requeue_unlogged(owner, unlogged);
            log.requeue_file_changes(taken);
        };
        // Objects first, then names (which may name them), then extended
        // attributes, then blocks, then the sizes and times writes set after
        // the objects' states were taken: replay applies them in that order.
        let mut records = Vec::with_capacity(
            unlogged.len() + taken.attrs.len() + taken.objects.len() + taken.entries.len(),
        );
        let mut max_txg = 0;
        let mut objects: Vec<_> = taken.objects.iter().collect();
        objects.sort_unstable_by_key(|(object, _)| **object);
        for (object, (txg, state)) in objects {
            max_txg = max_txg.max(*txg);
            records.push(match state {
                Some(state) => LogRecord::Object {
                    object: *object,
                    txg: *txg,
                    state: *state,
                },
                None => LogRecord::Freed {
                    object: *object,
                    txg: *txg,
                },
            });
        }
        let mut entries: Vec<_> = taken.entries.iter().collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        for ((dir, name), (txg, target)) in entries {
            max_txg = max_txg.max(*txg);
            records.push(LogRecord::Entry {
                dir: *dir,
                txg: *txg,
                name: name.clone(),
                target: *target,
            });
        }
        let mut xattrs: Vec<_> = taken.xattrs.iter().collect();
        xattrs.sort_unstable_by_key(|(object, _)| **object);
        for (object, (txg, list)) in xattrs {
            max_txg = max_txg.max(*txg);
            records.push(LogRecord::Xattrs {
                object: *object,
                txg: *txg,
                list: list.clone(),
            });
        }
        // The newest change of each block only, in the order they were linked.
        let mut seen = rustc_hash::FxHashSet::default();
        let mut blocks: Vec<(u64, u64, u64)> = unlogged
            .iter()
            .rev()
            .filter(|(object, blkid, txg)| *txg > durable && seen.insert((*object, *blkid)))
            .copied()
            .collect();
        blocks.reverse();
        for (object, blkid, linked_txg) in blocks {
            let looked_up = match fs.objects.open(object).await {
                Ok(opened) => fs.objects.block_pointer(&opened, blkid).await,
                Err(error) => Err(error),
            };
            let pointer = match looked_up {
                Ok(pointer) => pointer,
                // Freed since: its freed record says so (this commit's, or
                // the next one's).
                Err(crate::object::ObjectError::NoSuchObject(_)) => continue,
                Err(error) => {
                    give_back(&unlogged, taken);
                    return Err(error.into());
                }
            };
            let Some(mut record) =
                block_record(object, blkid, linked_txg, pointer, self.txg.durable())
            else {
                continue;
            };
            // The tree still points where the kept bytes went: they go into
            // the log, and the devices holding the block need no flush.
            if let Some(copy) = taken.small_writes.get(&(object, blkid)) {
                if copy.dva == pointer.dvas[0] && copy.txg == pointer.birth_txg {
                    record = LogRecord::Written {
                        object,
                        blkid,
                        txg: copy.txg,
                        data: copy.data.clone(),
                    };
                }
            }
            max_txg = max_txg.max(record_txg(&record));
            records.push(record);
        }
        let mut files: Vec<(&u64, &FileAttr)> = taken.attrs.iter().collect();
        files.sort_unstable_by_key(|(object, _)| **object);
        for (object, attr) in files {
            if attr.txg > self.txg.durable() {
                max_txg = max_txg.max(attr.txg);
                records.push(LogRecord::Attr {
                    object: *object,
                    txg: attr.txg,
                    length: attr.length,
                    mtime: attr.mtime,
                    ctime: attr.ctime,
                });
            }
        }
        // A file's block grew, or a file was freed, while the pointers were
        // read: they may not fit the object states taken before, and a
        // change the log does not carry may have come too. No await from
        // this check to the records being fixed.
        let changed = {
            let state = log.state.borrow();
            state.reshapes != reshapes || state.unloggable_since > self.txg.durable()
        };
        if changed {
            give_back(&unlogged, taken);
            return Ok(false);
        }
        if records.is_empty() {
            log.state.borrow_mut().stats.shared_commits += 1;
            return Ok(true);
        }
        let commit = {
            let mut state = log.state.borrow_mut();
            state.next_commit += 1;
            let commit = state.next_commit;
            state.commits.insert(
                commit,
                CommitWait {
                    copies_pending: 0,
                    max_txg,
                },
            );
            commit
        };
        match self.write_log_blocks(owner, &records, commit).await {
            Ok(()) => {
                log.note_commit_time(started);
                let copied = records
                    .iter()
                    .filter(|record| matches!(record, LogRecord::Written { .. }))
                    .count();
                log.state.borrow_mut().stats.copied_blocks += copied as u64;
                Ok(true)
            }
            Err(error) => {
                eprintln!(
                    "ironpool: {}: intent log write failed ({error}); committing a txg instead",
                    fs.name
                );
                give_back(&unlogged, std::mem::take(&mut taken));
                // (A write that failed abandoned the chain, which forgets
                // this commit with the rest.)
                log.state.borrow_mut().forget_commit(commit);
                Ok(false)
            }
        }
    }

    /// What a commit does without a usable log: held blocks written out and
    /// linked (for a FLUSH), then the txg committed.
    async fn commit_through_txg(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
    ) -> Result<(), PoolError> {
        if held {
            self.drain_volume(volume).await?;
        }
        self.commit_linked().await
    }

    /// Takes a copy of every block the write-back holds for `volume` and has
    /// not logged, for commit `commit` (each is marked as logged there). The
    /// caller has checked that they are to be copied ([`Pool::copy_fits`]).
    fn copy_held_blocks(&self, volume: &Rc<Volume>, commit: u64) -> Vec<(u64, BufSlice)> {
        debug_assert!(
            self.copy_fits(volume),
            "held blocks copied past what a commit copies"
        );
        let held = volume.writeback.unlogged();
        let mut copies = Vec::with_capacity(held.len());
        // Nothing awaits from the look-up to the marks: each block's bytes
        // are the ones held now, and a link or a new write after this sees
        // the mark.
        for (blkid, data) in held {
            if volume.writeback.mark_logged(blkid, &data, commit) {
                copies.push((blkid, data));
            }
        }
        let mut state = volume.log.state.borrow_mut();
        for (blkid, _) in &copies {
            state.live_copies.insert(*blkid, commit);
        }
        drop(state);
        if let Some(wait) = volume.log.state.borrow_mut().commits.get_mut(&commit) {
            wait.copies_pending += copies.len() as u64;
        }
        copies
    }

    /// Whether a FLUSH now would copy `volume`'s held blocks into the log
    /// (`logbias=latency`, small blocks, few enough of them).
    fn copy_fits(&self, volume: &Volume) -> bool {
        volume.settings().log_bias == LogBias::Latency
            && volume.block_bytes <= COPY_BLOCK_BYTES_MAX
            && volume.writeback.unlogged_bytes() <= COPY_BYTES_PER_COMMIT_MAX
    }

    /// Undoes the marks of a commit that will not be written: the blocks
    /// still holding the bytes it copied are copied again by the next one.
    fn forget_commit(&self, volume: &Volume, commit: u64, copies: &[(u64, BufSlice)]) {
        for (blkid, _) in copies {
            volume.writeback.unmark_logged(*blkid, commit);
        }
        volume.log.state.borrow_mut().forget_commit(commit);
    }

    /// Puts changes taken for a commit that did not happen back in front
    /// of those noted since, in txg order (commits after it in flight may
    /// have failed and given theirs back first).
    fn requeue_unlogged(&self, owner: Owner, taken: &[(u64, u64, u64)]) {
        let mut state = owner.log().state.borrow_mut();
        let newer = std::mem::take(&mut state.unlogged);
        state.unlogged = taken.iter().copied().chain(newer).collect();
        // Stable: of one txg, the order linked stays.
        state.unlogged.sort_by_key(|(_, _, txg)| *txg);
    }

    /// Writes `records` into the next blocks of `owner`'s chain, with the
    /// devices holding what they name flushed; on success the blocks join
    /// the chain. The caller holds the commit lock throughout.
    async fn write_log_blocks(
        self: &Rc<Self>,
        owner: Owner<'_>,
        records: &[LogRecord],
        commit: u64,
    ) -> Result<(), PoolError> {
        let write = self.reserve_log_blocks(owner, records, commit)?;
        self.write_reserved(owner, write).await
    }

    /// Cuts `records` into blocks of `owner`'s chain (the pre-allocated next
    /// one first, then blocks allocated to fit the rest; the last names a
    /// new next block), encodes them, and takes their place in the chain:
    /// the commit is in flight from here, and the next commit goes after it.
    /// Nothing awaits here. On an error nothing is reserved.
    fn reserve_log_blocks(
        &self,
        owner: Owner<'_>,
        records: &[LogRecord],
        commit: u64,
    ) -> Result<LogWrite, PoolError> {
        let (guid, first) = {
            let state = owner.log().state.borrow();
            // The chain was usable when the commit began, but a commit in
            // flight may have failed since (while this one read block
            // pointers) and a new chain started, whose head is not durable
            // yet: a commit written there would be found by no replay.
            match state.next {
                Some(next) if state.head_txg <= self.txg.durable() => (state.chain_guid, next),
                _ => {
                    return Err(PoolError::Io(
                        "the log chain was restarted by a failed commit".to_string(),
                    ))
                }
            }
        };
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
            // The next block fits the records left, or, for the block after
            // this commit, what this commit needed (clamped to the sizes).
            let bytes = if start < records.len() {
                block_size_for(format::block_bytes_for(&records[start..]))
            } else {
                block_size_for(format::block_bytes_for(records))
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
        let encoded = blocks
            .iter()
            .enumerate()
            .map(|(index, (seq, pointer, block_records))| {
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
                        commit,
                        ends_commit: index + 1 == blocks.len(),
                    },
                    block_records,
                    &mut buffer,
                );
                (*seq, *pointer, buffer, block_records.len())
            })
            .collect::<Vec<_>>();
        // What the commit needs durable besides its log blocks: the blocks
        // its pointer records name (see `write_reserved`).
        let mut needed: Vec<u32> = records
            .iter()
            .flat_map(|record| match record {
                LogRecord::Block { pointer, .. } => pointer
                    .dvas
                    .iter()
                    .filter(|dva| !dva.is_empty())
                    .map(|dva| dva.vdev)
                    .collect::<Vec<u32>>(),
                _ => Vec::new(),
            })
            .collect();
        needed.sort_unstable();
        needed.dedup();
        let mut state = owner.log().state.borrow_mut();
        state.next = Some(new_next);
        state.in_flight.push_back(InFlight {
            commit,
            chain_guid: guid,
            blocks: encoded
                .iter()
                .map(|(seq, pointer, _, _)| (*seq, *pointer))
                .collect(),
        });
        Ok(LogWrite {
            commit,
            chain_guid: guid,
            blocks: encoded,
            needed,
        })
    }

    /// Writes a commit's reserved blocks and flushes the devices it needs,
    /// then waits for the commits before it in the chain: it succeeds only
    /// if they all did (a block that failed cuts the chain there), and they
    /// are answered in order.
    async fn write_reserved(
        self: &Rc<Self>,
        owner: Owner<'_>,
        write: LogWrite,
    ) -> Result<(), PoolError> {
        let mut end = InFlightEnd {
            pool: self,
            owner,
            commit: write.commit,
            armed: true,
        };
        let mut records_written = 0;
        let mut bytes_written = 0;
        let blocks_written = write.blocks.len() as u64;
        let writes = write
            .blocks
            .into_iter()
            .map(|(_, pointer, buffer, records)| {
                records_written += records as u64;
                bytes_written += pointer.bytes as u64;
                let store = self.store.clone();
                async move {
                    store
                        .write_durable(
                            &[pointer.dva],
                            BufSlice::whole(buffer.into_shared()),
                            IoClass::SyncWrite,
                        )
                        .await
                }
            })
            .collect::<Vec<_>>();
        // The log blocks are written durable (FUA: the kernel makes them
        // durable before they complete, and the engine waits once instead of
        // for a write and then a flush). The blocks the pointer records name
        // were written in place and linked before the commit, so a flush
        // sent now covers them. It runs while the log blocks are written:
        // replay verifies every block a pointer record names and stops at
        // the first that does not, so the two need no order. Copies carry
        // their bytes; holes have none. Devices holding none are not
        // flushed (write-back's batches keep the main devices busy, and a
        // commit on a log device need not wait for their caches). Where the
        // log lives beside the data, writing its blocks plainly and flushing
        // once after them (one sync per device, not two) measured slower:
        // the write and the flush in turn wait longer than the FUA write and
        // the flush side by side (mirror of two files, fio nbd 16K QD64:
        // --fsync=32 33.6k -> 29.8k IOPS, sync=always 27.2k -> 20.0k).
        let (written, flushed) = futures_util::future::join(
            futures_util::future::join_all(writes),
            self.store.flush_for_log(&write.needed),
        )
        .await;
        let failed = written
            .into_iter()
            .find_map(Result::err)
            .map(PoolError::from)
            .or(flushed.err().map(PoolError::from));
        // Its turn: every commit before it in the chain has ended (this one
        // is still in flight, so the front is now this one).
        let log = owner.log();
        log.wait_ended(write.commit.saturating_sub(1)).await;
        let failed = failed.or_else(|| {
            (log.state.borrow().chain_guid != write.chain_guid)
                .then(|| PoolError::Io("a log commit before this one failed".to_string()))
        });
        if let Some(error) = failed {
            end.end(false);
            return Err(error);
        }
        end.end(true);
        let mut state = log.state.borrow_mut();
        state.stats.blocks_written += blocks_written;
        state.stats.bytes_written += bytes_written;
        state.stats.records_written += records_written;
        state.stats.commits += 1;
        Ok(())
    }

    /// Returns log blocks allocated for a commit that failed: nothing durable
    /// names them (a block that names one was never acknowledged).
    fn release_log_blocks(&self, blocks: &[LogPointer]) {
        let dvas: Vec<Dva> = blocks.iter().map(|pointer| pointer.dva).collect();
        self.store.release(&dvas);
    }

    /// Moves `volume`'s intent log off a log device being removed (marked
    /// `removing`, so no new block goes there): with its commits held off,
    /// what the chain made durable is made durable by a txg instead (held
    /// blocks written in place), then the chain is dropped and a new one
    /// started on the devices left. Its old blocks are dropped from the
    /// releases of `vdev` by the caller.
    pub(crate) async fn move_log_off(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
    ) -> Result<(), PoolError> {
        let _commit = volume.log.quiesce().await;
        self.drain_volume(volume).await?;
        self.commit_linked().await?;
        self.abandon_log_chain(Owner::Volume(volume));
        // Without space for a head the volume commits through txgs, and a
        // later commit starts the chain.
        let _ = self.start_log_chain(Owner::Volume(volume));
        Ok(())
    }

    /// [`Pool::move_log_off`] for a filesystem's log.
    pub(crate) async fn move_fs_log_off(
        self: &Rc<Self>,
        fs: &Rc<Filesystem>,
    ) -> Result<(), PoolError> {
        let _commit = fs.log.quiesce().await;
        let _shared = fs.shared().await;
        self.commit_linked().await?;
        self.abandon_log_chain(Owner::Filesystem(fs));
        let _ = self.start_log_chain(Owner::Filesystem(fs));
        Ok(())
    }

    /// Forgets the pending releases of log blocks on top-level vdev `vdev`
    /// (a log device leaving the pool: its space goes with it).
    pub(crate) fn drop_log_releases_on(&self, vdev: u32) {
        self.log_releases
            .0
            .borrow_mut()
            .retain(|(_, pointer)| pointer.dva.vdev != vdev);
    }

    /// True when some dataset's chain has a block on top-level vdev `vdev`.
    pub(crate) fn log_chains_use(&self, vdev: u32) -> bool {
        let uses = |log: &IntentLog| {
            let state = log.state.borrow();
            state
                .next
                .is_some_and(|(_, pointer)| pointer.dva.vdev == vdev)
                || state
                    .written
                    .iter()
                    .any(|(_, pointer, _)| pointer.dva.vdev == vdev)
                || state.in_flight.iter().any(|entry| {
                    entry
                        .blocks
                        .iter()
                        .any(|(_, pointer)| pointer.dva.vdev == vdev)
                })
        };
        self.datasets.volumes.any(|volume| uses(&volume.log))
            || self.datasets.filesystems.any(|fs| uses(&fs.log))
    }

    /// Waits for the log commits in flight of every open dataset and keeps
    /// new ones out while the returned permits live (an export, whose final
    /// txg and the closing of the devices must come after the last log
    /// write). A commit may outlive whoever started it: one started ahead of
    /// a FLUSH ([`Pool::log_ahead`]) runs on after its WRITE is answered.
    pub(crate) async fn quiesce_logs(&self) -> Vec<crate::rt::sync::Permit> {
        let mut permits = Vec::new();
        for volume in self.datasets.volumes.all() {
            permits.push(volume.log.quiesce().await);
        }
        for fs in self.datasets.filesystems.all() {
            permits.push(fs.log.quiesce().await);
        }
        permits
    }

    /// Waits for `volume`'s log commits in flight, then frees its chain; the
    /// returned permit keeps new commits out (the volume is being destroyed).
    pub(crate) async fn discard_log(&self, volume: &Volume) -> crate::rt::sync::Permit {
        let permit = volume.log.quiesce().await;
        self.abandon_log_chain(Owner::Volume(volume));
        permit
    }

    /// Frees `owner`'s whole chain (written blocks and the next one) and
    /// forgets it: the dataset is destroyed, rolled back or received over,
    /// or its chain is broken. The directory's head is cleared in the open
    /// txg.
    pub(crate) fn abandon_log_chain(&self, owner: Owner) {
        let txg = self.txg.open();
        let mut state = owner.log().state.borrow_mut();
        let written: Vec<LogPointer> = state
            .written
            .drain(..)
            .map(|(_, pointer, _)| pointer)
            .collect();
        state.commits.clear();
        state.live_copies.clear();
        state.pending_cancels.clear();
        state.cancelled.clear();
        let next = state.next.take().map(|(_, pointer)| pointer);
        drop(state);
        self.release_log_blocks_after(txg, written.into_iter().chain(next));
        self.set_log_head(owner, None);
    }
}

/// Txg `txg` is being built: every log block whose records are all of txgs
/// up to `txg` is freed in it, and each chain's head moves past them in its
/// directory.
pub(crate) fn build_step(pool: &Pool, txg: u64) {
    for volume in pool.datasets.volumes.all() {
        build_step_of(pool, Owner::Volume(&volume), txg);
    }
    for fs in pool.datasets.filesystems.all() {
        build_step_of(pool, Owner::Filesystem(&fs), txg);
    }
}

/// [`build_step`] for one dataset's log.
fn build_step_of(pool: &Pool, owner: Owner, txg: u64) {
    let mut state = owner.log().state.borrow_mut();
    let state = &mut *state;
    // Copies superseded by changes this txg holds are cancelled in it.
    let before = state.cancelled.len();
    let mut later = Vec::new();
    for (linked_txg, commit, blkid) in state.pending_cancels.drain(..) {
        if linked_txg <= txg {
            state.cancelled.push((commit, blkid));
        } else {
            later.push((linked_txg, commit, blkid));
        }
    }
    state.pending_cancels = later;
    let mut obsolete = Vec::new();
    let mut freed = rustc_hash::FxHashSet::default();
    while let Some(&(_, pointer, commit)) = state.written.front() {
        let done = state
            .commits
            .get(&commit)
            .is_none_or(|wait| wait.copies_pending == 0 && wait.max_txg <= txg);
        if !done {
            break;
        }
        state.written.pop_front();
        obsolete.push(pointer);
        if state
            .written
            .front()
            .is_none_or(|(_, _, next)| *next != commit)
        {
            // The commit's last block: what named its copies goes too.
            freed.insert(commit);
        }
    }
    let mut cancels_changed = state.cancelled.len() != before;
    cancels_changed |= state.forget_commits(&freed);
    if obsolete.is_empty() && !cancels_changed {
        return;
    }
    pool.release_log_blocks_after(txg, obsolete);
    // The oldest block kept: written, else the first of a commit in flight
    // (it may be answered once written, and replay must find it), else the
    // next one.
    // (Commits of a chain abandoned meanwhile are ending in failure.)
    let in_flight = state
        .in_flight
        .iter()
        .find(|entry| entry.chain_guid == state.chain_guid)
        .and_then(|entry| entry.blocks.first().copied());
    let head = match (state.written.front(), in_flight, state.next) {
        (Some((seq, pointer, _)), _, _) => Some((*seq, *pointer)),
        (None, Some(first), _) => Some(first),
        (None, None, Some(next)) => Some(next),
        (None, None, None) => None,
    };
    let guid = state.chain_guid;
    let cancelled = state.cancelled.clone();
    let head = head.map(|(seq, pointer)| LogHead {
        cancelled,
        ..LogHead::at(guid, seq, pointer)
    });
    pool.set_log_head(owner, head);
}

/// Txg `txg` is durable: changes linked up to it need no log record, and
/// log blocks the txgs past the defer depth stopped naming are free again.
pub(crate) fn txg_durable(pool: &Pool, txg: u64) {
    for volume in pool.datasets.volumes.all() {
        volume.log.forget_durable(txg);
    }
    for fs in pool.datasets.filesystems.all() {
        fs.log.forget_durable(txg);
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
    /// Each record with the commit that wrote it.
    records: Vec<(u64, LogRecord)>,
    /// Records up to the end of the last block that ends its commit: the
    /// rest belong to a commit whose last block was not read (torn, or
    /// never written).
    complete: usize,
    /// Why the walk ended, when it was not at a block never written.
    damage: Option<String>,
}

/// Reads `volume`'s chain from `head` until a block does not verify.
async fn read_chain(pool: &Pool, head: LogHead) -> Chain {
    let mut chain = Chain {
        records: Vec::new(),
        complete: 0,
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
                // The copy read first does not verify: another side or
                // parity may hold the block intact (a damaged side can hide
                // even that the block is this chain's), so every block
                // that fails is read again with reconstruction. Only the
                // block after the last one written fails that too, as
                // expected: what that read counted against the devices is
                // taken back, unless the block named itself as this chain's
                // (then it is a torn or damaged block, and reported).
                let ours = first
                    .as_ref()
                    .is_ok_and(|bytes| format::names_block(bytes, head.chain_guid, seq));
                let verify = |bytes: &[u8]| {
                    format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
                        .is_ok()
                };
                match pool
                    .store
                    .read_self_checked_quietly(pointer.dva, pointer.bytes as u64, &verify, !ours)
                    .await
                {
                    Ok(bytes) => {
                        format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
                    }
                    Err(_) => {
                        if ours {
                            chain.damage = Some(format!(
                                "log block {seq} is torn or damaged ({error}); replay ended there"
                            ));
                        }
                        Err(error)
                    }
                }
            }
        };
        let Ok((header, records)) = decoded else {
            break;
        };
        chain
            .records
            .extend(records.into_iter().map(|record| (header.commit, record)));
        if header.ends_commit {
            chain.complete = chain.records.len();
        }
        pointer = header.next;
    }
    chain
}

/// What replay does to one block.
enum Apply {
    /// Link a block written in place (its space claimed).
    Link(BlockPointer),
    /// Make it a hole.
    Hole,
    /// Write these bytes (a copy from the log).
    Write(Vec<u8>),
}

/// What replay does to a volume, block by block.
type BlockChanges = Vec<(u64, Apply)>;

/// What replay does to a filesystem, in this order: objects' states,
/// directory entries, extended attributes (lists written to new blocks
/// first, then swapped in), blocks by (object, block number), files' sizes
/// and times, objects freed.
struct FsChanges {
    objects: Vec<(u64, ObjectState)>,
    entries: Vec<(EntryKey, Option<EntryTarget>)>,
    xattrs: Vec<(u64, XattrsApply)>,
    blocks: Vec<((u64, u64), Apply)>,
    attrs: Vec<(u64, FileAttr)>,
    freed: Vec<u64>,
}

/// An object's extended attributes as replay sets them: the list's bytes,
/// then (once written to new space, before the txg of the links) where.
enum XattrsApply {
    List(Vec<u8>),
    /// The list's length and block (None: no attributes).
    Written(Option<(u64, BlockPointer)>),
    /// Its block could not be written (counted as failed).
    Failed,
}

/// What a filesystem's records leave an object as.
enum ObjectChange {
    State(ObjectState),
    Freed,
}

/// Intent logs read and their blocks claimed, to apply once the pool runs.
pub(crate) struct PreparedReplay {
    notes: Vec<String>,
    volumes: Vec<(Rc<Volume>, BlockChanges)>,
    filesystems: Vec<(Rc<Filesystem>, FsChanges)>,
}

/// The records of the chain at `head` of dataset `name` that replay may
/// apply: up to the first block that does not verify, and before the first
/// record whose block does not hold its data (notes say why it ended).
async fn read_records(
    pool: &Rc<Pool>,
    name: &str,
    head: LogHead,
    durable: u64,
    whole_commits: bool,
    notes: &mut Vec<String>,
) -> Vec<(u64, LogRecord)> {
    let chain = read_chain(pool, head).await;
    if let Some(damage) = &chain.damage {
        notes.push(format!("{name}: intent log: {damage}"));
    }
    let mut records = chain.records;
    if whole_commits && chain.complete < records.len() {
        notes.push(format!(
            "{name}: intent log: the last commit did not finish ({} of its records not replayed)",
            records.len() - chain.complete
        ));
        records.truncate(chain.complete);
    }
    // A commit is answered only after a device flush that covers its
    // blocks' data: a record whose data does not verify belongs to a
    // commit that never finished (its log block landed, its data did
    // not), and no later commit was started. Replay ends there (at the
    // start of that commit, with `whole_commits`).
    if let Some(mut unwritten) = first_unwritten(pool, &records, durable).await {
        if whole_commits {
            let commit = records[unwritten].0;
            while unwritten > 0 && records[unwritten - 1].0 == commit {
                unwritten -= 1;
            }
        }
        notes.push(format!(
            "{name}: intent log: the last commit did not finish ({} of its records not replayed)",
            records.len() - unwritten
        ));
        records.truncate(unwritten);
    }
    records
}

/// What replay does for each block's deciding record (None: nothing), the
/// space of every block to link claimed before anything allocates; records
/// whose space is in use are not replayed (a note of dataset `name` says
/// how many).
fn claim_changes<K>(
    pool: &Pool,
    name: &str,
    last: impl IntoIterator<Item = (K, Option<LogRecord>)>,
    notes: &mut Vec<String>,
) -> Vec<(K, Apply)> {
    let mut apply = Vec::new();
    let mut refused = 0u64;
    for (target, record) in last {
        match record {
            Some(LogRecord::Block { pointer, .. }) => {
                if claim_block(pool, &pointer) {
                    apply.push((target, Apply::Link(pointer)));
                } else {
                    refused += 1;
                }
            }
            Some(LogRecord::Hole { .. }) => apply.push((target, Apply::Hole)),
            Some(LogRecord::Copy { data, .. } | LogRecord::Written { data, .. }) => {
                apply.push((target, Apply::Write(data)))
            }
            None
            | Some(
                LogRecord::Attr { .. }
                | LogRecord::Object { .. }
                | LogRecord::Freed { .. }
                | LogRecord::Entry { .. }
                | LogRecord::Xattrs { .. },
            ) => {}
        }
    }
    if refused > 0 {
        notes.push(format!(
            "{name}: intent log: {refused} records point at space in use; not replayed"
        ));
    }
    apply
}

/// Claims the space of a block a record names (before anything allocates);
/// false, claiming nothing, when some of it is in use.
fn claim_block(pool: &Pool, pointer: &BlockPointer) -> bool {
    let mut claimed = Vec::new();
    for dva in pointer.copies() {
        if !pool.store.claim(*dva) {
            // Give back what was taken: the allocator's own view.
            pool.store.release(&claimed);
            return false;
        }
        claimed.push(*dva);
    }
    true
}

/// Reads every volume's intent log and claims the blocks its records name
/// (at import, before anything allocates: this is the only time their
/// space can be told from free space). [`apply_replay`] links them.
pub(crate) async fn prepare_replay(pool: &Rc<Pool>) -> PreparedReplay {
    let durable = pool.txg.durable();
    let mut notes = Vec::new();
    let heads = log_heads(&pool.datasets.directory.read().volumes, |record| {
        &record.intent_log
    });
    let mut volumes = Vec::new();
    for (name, head) in heads {
        let Some(volume) = pool.datasets.volumes.get(&name) else {
            continue;
        };
        let cancelled: rustc_hash::FxHashSet<(u64, u64)> = head.cancelled.iter().copied().collect();
        // A volume's blocks are independent: a commit cut short (never
        // answered) may apply in part.
        let records = read_records(pool, &volume.name, head, durable, false, &mut notes).await;
        // The last record of each block decides. A pointer or hole of a txg
        // that is durable means the tree holds that change or a newer one
        // (and an older copy before it must not come back). A copy applies
        // unless the head cancels it: a newer change was linked in a txg
        // that is durable (a newer change that is not durable has a record
        // after the copy if a FLUSH covered it, and may be lost if none did).
        let mut last: std::collections::BTreeMap<u64, Option<LogRecord>> = Default::default();
        let mut malformed = 0u64;
        for (commit, record) in records {
            let (object, blkid) = record.target();
            if object != volume.object.id
                || blkid.saturating_mul(volume.block_bytes) >= volume.size_bytes.get()
            {
                malformed += 1;
                continue;
            }
            let keep = match &record {
                LogRecord::Block { pointer, .. } => pointer.birth_txg <= durable,
                LogRecord::Hole { txg, .. } => *txg <= durable,
                LogRecord::Copy { data, .. } => {
                    if data.len() as u64 != volume.block_bytes {
                        malformed += 1;
                        continue;
                    }
                    cancelled.contains(&(commit, blkid))
                }
                LogRecord::Attr { .. }
                | LogRecord::Written { .. }
                | LogRecord::Object { .. }
                | LogRecord::Freed { .. }
                | LogRecord::Entry { .. }
                | LogRecord::Xattrs { .. } => {
                    malformed += 1;
                    continue;
                }
            };
            last.insert(blkid, (!keep).then_some(record));
        }
        if malformed > 0 {
            notes.push(format!(
                "{}: intent log: {malformed} records name another object, a block past the end or a wrong size; not replayed",
                volume.name
            ));
        }
        let apply = claim_changes(pool, &volume.name, last, &mut notes);
        volumes.push((volume, apply));
    }
    let filesystems = prepare_fs_replay(pool, durable, &mut notes).await;
    PreparedReplay {
        notes,
        volumes,
        filesystems,
    }
}

/// The datasets of `records` (a directory's volumes or filesystems) that
/// have an intent log, with its head.
fn log_heads<R>(
    records: &std::collections::BTreeMap<String, R>,
    head: impl Fn(&R) -> &Option<LogHead>,
) -> Vec<(String, LogHead)> {
    records
        .iter()
        .filter_map(|(name, record)| head(record).clone().map(|head| (name.clone(), head)))
        .collect()
}

/// [`prepare_replay`] for filesystems: each file's blocks and its size and
/// times, as of the last record of each (records of txgs that are durable
/// apply nothing: the tree holds that change or a newer one).
async fn prepare_fs_replay(
    pool: &Rc<Pool>,
    durable: u64,
    notes: &mut Vec<String>,
) -> Vec<(Rc<Filesystem>, FsChanges)> {
    let heads = log_heads(&pool.datasets.directory.read().filesystems, |record| {
        &record.intent_log
    });
    let mut filesystems = Vec::new();
    for (short, head) in heads {
        let Some(fs) = pool.datasets.filesystems.get(&short) else {
            continue;
        };
        // A commit of a filesystem applies whole or not at all: a write's
        // blocks and the file size it set go together.
        let records = read_records(pool, &fs.name, head, durable, true, notes).await;
        // The last record of each object, entry and block decides; one of a
        // durable txg applies nothing (the tree holds it or newer). An
        // object's state supersedes the sizes and times of writes logged
        // before it; a free, everything logged of the object before it.
        let mut blocks: std::collections::BTreeMap<(u64, u64), Option<LogRecord>> =
            Default::default();
        let mut attrs: std::collections::BTreeMap<u64, Option<FileAttr>> = Default::default();
        let mut objects: std::collections::BTreeMap<u64, Option<ObjectChange>> = Default::default();
        let mut entries: std::collections::BTreeMap<EntryKey, Option<Option<EntryTarget>>> =
            Default::default();
        let mut xattrs: std::collections::BTreeMap<u64, Option<Vec<u8>>> = Default::default();
        let mut malformed = 0u64;
        for (_, record) in records {
            match record {
                LogRecord::Block {
                    object,
                    blkid,
                    pointer,
                } => {
                    let apply = pointer.birth_txg > durable;
                    blocks.insert((object, blkid), apply.then_some(record));
                }
                LogRecord::Hole { object, blkid, txg }
                | LogRecord::Written {
                    object, blkid, txg, ..
                } => {
                    blocks.insert((object, blkid), (txg > durable).then_some(record));
                }
                LogRecord::Attr {
                    object,
                    txg,
                    length,
                    mtime,
                    ctime,
                } => {
                    let attr = FileAttr {
                        txg,
                        length,
                        mtime,
                        ctime,
                    };
                    attrs.insert(object, (txg > durable).then_some(attr));
                }
                LogRecord::Object { object, txg, state } => {
                    attrs.remove(&object);
                    objects.insert(
                        object,
                        (txg > durable).then_some(ObjectChange::State(state)),
                    );
                }
                LogRecord::Freed { object, txg } => {
                    attrs.remove(&object);
                    xattrs.remove(&object);
                    let ours: Vec<(u64, u64)> = blocks
                        .range((object, 0)..=(object, u64::MAX))
                        .map(|(key, _)| *key)
                        .collect();
                    for key in ours {
                        blocks.remove(&key);
                    }
                    objects.insert(object, (txg > durable).then_some(ObjectChange::Freed));
                }
                LogRecord::Entry {
                    dir,
                    txg,
                    name,
                    target,
                } => {
                    entries.insert((dir, name), (txg > durable).then_some(target));
                }
                LogRecord::Xattrs { object, txg, list } => {
                    xattrs.insert(object, (txg > durable).then_some(list));
                }
                LogRecord::Copy { .. } => malformed += 1,
            }
        }
        if malformed > 0 {
            notes.push(format!(
                "{}: intent log: {malformed} records a filesystem does not write; not replayed",
                fs.name
            ));
        }
        let mut states = Vec::new();
        let mut freed = Vec::new();
        for (object, change) in objects {
            match change {
                Some(ObjectChange::State(state)) => states.push((object, state)),
                Some(ObjectChange::Freed) => freed.push(object),
                None => {}
            }
        }
        let changes = FsChanges {
            objects: states,
            entries: entries
                .into_iter()
                .filter_map(|(key, target)| target.map(|target| (key, target)))
                .collect(),
            xattrs: xattrs
                .into_iter()
                .filter_map(|(object, list)| list.map(|list| (object, XattrsApply::List(list))))
                .collect(),
            blocks: claim_changes(pool, &fs.name, blocks, notes),
            attrs: attrs
                .into_iter()
                .filter_map(|(object, attr)| attr.map(|attr| (object, attr)))
                .collect(),
            freed,
        };
        filesystems.push((fs, changes));
    }
    filesystems
}

/// Applies what [`prepare_replay`] found: links the claimed blocks, writes
/// the copies, drops each chain (a new one starts with the volume's first
/// FLUSH). The caller commits before anything is served.
pub(crate) async fn apply_replay(pool: &Rc<Pool>, prepared: PreparedReplay) -> Replayed {
    let PreparedReplay {
        mut notes,
        volumes,
        mut filesystems,
    } = prepared;
    let mut done = vec![(0usize, Vec::new()); volumes.len()];
    // A filesystem's copied writes are written to new blocks first, outside
    // the txg of the links (writing may wait for space), and linked in it.
    let mut fs_done = Vec::with_capacity(filesystems.len());
    for (fs, changes) in filesystems.iter_mut() {
        fs_done.push(write_fs_copies(pool, fs, changes).await);
    }
    // Pointers and holes are skipped by a later replay once their txg is
    // durable: all of them go into one txg (no build meanwhile), so a crash
    // never leaves some applied and the rest skipped. Copies are applied
    // again by a later replay whatever the txgs, so they may span txgs (and
    // may wait for one when the pool is full).
    {
        let _no_builds = pool.txg.hold_builds();
        for ((volume, apply), (count, failed)) in volumes.iter().zip(done.iter_mut()) {
            for (blkid, change) in apply {
                let result = match change {
                    // A failed link releases the block it was given.
                    Apply::Link(pointer) => pool.link_block(volume, *blkid, *pointer, false).await,
                    Apply::Hole => {
                        let hole = BlockPointer::hole(0, ObjectType::VolumeData, 0);
                        pool.link_block(volume, *blkid, hole, false).await
                    }
                    Apply::Write(_) => continue,
                };
                *count += 1;
                if let Err(error) = result {
                    failed.push(format!("block {blkid}: {error}"));
                }
            }
        }
        for ((fs, changes), done) in filesystems.iter().zip(fs_done.iter_mut()) {
            apply_fs_changes(pool, fs, changes, done).await;
        }
    }
    for ((volume, apply), (count, failed)) in volumes.iter().zip(done.iter_mut()) {
        for (blkid, change) in apply {
            let Apply::Write(data) = change else {
                continue;
            };
            let data = (!crate::pool::data::is_zero(data)).then(|| {
                let mut buffer = AlignedBuf::zeroed(data.len());
                buffer.copy_from_slice(data);
                BufSlice::whole(buffer.into_shared())
            });
            *count += 1;
            let result = pool
                .store_block(volume, *blkid, data, Default::default(), IoClass::SyncWrite)
                .await;
            if let Err(error) = result {
                failed.push(format!("block {blkid}: {error}"));
            }
        }
    }
    let mut changes = 0;
    for ((volume, _), (count, failed)) in volumes.iter().zip(done) {
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
        pool.set_log_head(Owner::Volume(volume), None);
    }
    for ((fs, _), done) in filesystems.iter().zip(fs_done) {
        changes += done.applied;
        if done.applied > 0 {
            notes.push(format!(
                "{}: intent log: replayed {} changes of files",
                fs.name, done.applied
            ));
        }
        if done.gone > 0 {
            notes.push(format!(
                "{}: intent log: {} records of files freed since (unlinked while open) not replayed",
                fs.name, done.gone
            ));
        }
        if !done.failed.is_empty() {
            let shown = done.failed.len().min(REPLAY_FAILURES_SHOWN);
            notes.push(format!(
                "{}: intent log: {} records could not be replayed: {}{}",
                fs.name,
                done.failed.len(),
                done.failed[..shown].join("; "),
                if shown < done.failed.len() {
                    "; ..."
                } else {
                    ""
                }
            ));
        }
        pool.set_log_head(Owner::Filesystem(fs), None);
    }
    Replayed { notes, changes }
}

/// Failures of one filesystem's replay named in its note (the rest are
/// counted): the note goes into `status`, which must stay readable.
const REPLAY_FAILURES_SHOWN: usize = 8;

/// What replay did to one filesystem.
#[derive(Default)]
struct FsReplayed {
    applied: usize,
    /// Records of files that no longer exist (freed at import: unlinked
    /// while open).
    gone: usize,
    failed: Vec<String>,
}

/// Links a filesystem's replayed blocks and sets its files' sizes and
/// times (the caller holds txg builds off).
async fn apply_fs_changes(
    pool: &Rc<Pool>,
    fs: &Filesystem,
    changes: &FsChanges,
    done: &mut FsReplayed,
) {
    // Numbers the records name are not handed out again, before replay
    // makes xattr objects: one freed by a record applied last must not be
    // a number given to a list swapped in before it.
    let named = changes.objects.iter().map(|(object, _)| *object);
    let targets = changes
        .entries
        .iter()
        .filter_map(|(_, target)| target.map(|target| target.object));
    fs.replay_keep_numbers(named.chain(targets).chain(changes.freed.iter().copied()));
    let mut count = |result, what: String| done.count(result, what);
    for (object, state) in &changes.objects {
        let result = fs.replay_object(pool, *object, state).await;
        count(result, format!("object {object}"));
    }
    for ((dir, name), target) in &changes.entries {
        let result = fs.replay_entry(*dir, name, *target).await;
        count(
            result,
            format!("directory {dir} entry {:?}", String::from_utf8_lossy(name)),
        );
    }
    for (object, apply) in &changes.xattrs {
        let XattrsApply::Written(written) = apply else {
            continue;
        };
        let result = fs.replay_xattrs(pool, *object, *written).await;
        count(result, format!("object {object} extended attributes"));
    }
    for ((object, blkid), change) in &changes.blocks {
        let pointer = match change {
            Apply::Link(pointer) => *pointer,
            Apply::Hole => BlockPointer::hole(0, ObjectType::FsFile, 0),
            Apply::Write(_) => continue,
        };
        // A failed link releases the block it was given.
        let result = fs.replay_block(pool, *object, *blkid, pointer).await;
        count(result, format!("file {object} block {blkid}"));
    }
    for (object, attr) in &changes.attrs {
        let result = fs.replay_attr(*object, attr).await;
        count(result, format!("file {object} size"));
    }
    for object in &changes.freed {
        let result = fs.replay_free(pool, *object).await;
        count(result, format!("object {object} freed"));
    }
}

impl FsReplayed {
    fn count(&mut self, result: Result<(), crate::pool::filesystem::FsError>, what: String) {
        match result {
            Ok(()) => self.applied += 1,
            Err(crate::pool::filesystem::FsError::NotFound) => self.gone += 1,
            Err(error) => self.failed.push(format!("{what}: {error}")),
        }
    }
}

/// Writes the bytes of a filesystem's copied writes to new blocks, each
/// change becoming a link of its block (linked by [`apply_fs_changes`]);
/// one that cannot be written is counted as failed and dropped.
async fn write_fs_copies(pool: &Rc<Pool>, fs: &Filesystem, changes: &mut FsChanges) -> FsReplayed {
    let mut done = FsReplayed::default();
    let mut kept = Vec::with_capacity(changes.blocks.len());
    for ((object, blkid), change) in std::mem::take(&mut changes.blocks) {
        let Apply::Write(data) = change else {
            kept.push(((object, blkid), change));
            continue;
        };
        match fs.replay_store(pool, &data).await {
            Ok(pointer) => kept.push(((object, blkid), Apply::Link(pointer))),
            Err(error) => done
                .failed
                .push(format!("file {object} block {blkid}: {error}")),
        }
    }
    changes.blocks = kept;
    for (object, apply) in changes.xattrs.iter_mut() {
        let XattrsApply::List(list) = apply else {
            continue;
        };
        *apply = match fs.write_xattr_block(pool, list).await {
            Ok(pointer) => {
                XattrsApply::Written(pointer.map(|pointer| (list.len() as u64, pointer)))
            }
            Err(error) => {
                done.failed
                    .push(format!("object {object} extended attributes: {error}"));
                XattrsApply::Failed
            }
        };
    }
    done
}

/// Records read at once while checking that the blocks of a chain's records
/// hold their data (a bound on replay's reads in flight).
const REPLAY_READS_IN_FLIGHT: usize = 64;

/// The index of the first record of a txg after `durable` whose block does
/// not hold the data its pointer names, if any. Every side and column is
/// read and the bad ones are rewritten (as a scrub does): a block whose
/// write a crash cut short may verify through parity or one mirror side
/// while the rest is stale, and the pool adopts it.
async fn first_unwritten(
    pool: &Rc<Pool>,
    records: &[(u64, LogRecord)],
    durable: u64,
) -> Option<usize> {
    let to_check: Vec<(usize, BlockPointer)> = records
        .iter()
        .enumerate()
        .filter_map(|(index, (_, record))| match record {
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
