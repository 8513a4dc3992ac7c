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
//!
//! This file holds the log's state and what writes and changes note for
//! the next commit, and `cadence.rs` how the client flushes and which
//! answers are durable. The commits (a volume's FLUSH, a filesystem's
//! `fsync`), the chain's upkeep and replay at import act on volumes and
//! filesystems, so they are a room above both: `pool::datasets::intent_log`
//! (`commit.rs`, `replay.rs`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use crate::format::intent_log::{EntryTarget, ObjectState};
use crate::format::intent_log::{LogPointer, LogRecord, LOG_BLOCK_BYTES_MAX, LOG_BLOCK_BYTES_MIN};
use crate::format::znode::Timestamp;
use crate::format::{BlockPointer, Dva};
use crate::pool::dataset::directory::LogHead;
use crate::pool::{Owner, Pool};
use crate::rt::buf::AlignedBuf;
use crate::rt::sync::Semaphore;

mod cadence;
mod chain;

use cadence::{Cadence, Vouched};

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
/// `COMMIT_BLOCKS_MAX` blocks hold; sealed, an encrypted filesystem's,
/// 16,384 x 368, under three quarters): past it, an `fsync` commits a
/// txg, which is as fast per change when this many are waiting.
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

/// A filesystem's client whose `fsync`s come at most this many direct
/// writes apart ([`LOG_AHEAD_STREAK`] times in a row), with other direct
/// writes in flight beside it, has each direct write made durable before it
/// is answered ([`IntentLog::writes_durable_first`]). Why: the kernel holds
/// a file's inode lock for the whole `FSYNC` round trip, and no write of
/// that file is sent meanwhile (traced with the `fuse:fuse_request_send`
/// tracepoint, fio 16K QD64 `--fsync=32`: not one WRITE sent while an
/// `FSYNC` was out, `FSYNC`s out 73% of the time, 27 writes in the server
/// on average of 64). Writes hold no lock while the server has them: a
/// commit they wait for together costs what the `fsync`'s would, but the
/// `fsync` then finds its writes durable and is answered at once (same
/// run, alternated: 14.5k and 13.3k IOPS without, 18.2k and 17.2k with;
/// QD1 with an `fsync` per write and QD64 without `fsync` unchanged). 64,
/// a queue's depth: the writes the kernel held back during an `fsync` come
/// in a burst after it, up to 60 between two `fsync`s at QD64 (with 8, the
/// mode held for 185 of 133,000 writes). A client writing more between
/// them keeps one commit per `fsync`, each write answered once in place.
/// The default of the pool's tunable `fs_durable_writes_fsync_gap`.
pub const DURABLE_WRITES_FSYNC_GAP_MAX: u32 = 64;

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
    /// Of `copied_blocks`, a filesystem's held blocks: copied before they
    /// were written in place (as a volume's), not after.
    pub held_copies: u64,
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
    /// Which answers given to a filesystem's client are durable, for
    /// [`IntentLog::answers_durable`].
    vouched: std::cell::Cell<Vouched>,
    /// An encrypted filesystem's log ([`IntentLog::set_encrypted`]):
    /// its records of names and attributes sealed, no copy of bytes.
    encrypted: std::cell::Cell<bool>,
    /// The space of a chain an import claimed (an encrypted filesystem's,
    /// its key not loaded), until its replay or the dataset's destroy.
    claimed: RefCell<Option<ClaimedSpace>>,
}

/// The space an import's claim of a chain holds (committed in the space
/// maps, linked by no tree): its blocks, and the blocks its records link.
/// Kept in memory from the import on, so that a destroy frees it, a scrub
/// reads it and the space check counts it without reading the chain again.
#[derive(Clone, Debug, Default)]
pub struct ClaimedSpace {
    /// The chain's blocks, from the head (where, and the bytes to read).
    pub chain: Vec<LogPointer>,
    /// The blocks its records link, as the records name them.
    pub blocks: Vec<BlockPointer>,
    /// A later import read the chain only in part: the blocks its records
    /// link are not known (not in `blocks`), and may be on any vdev.
    pub partial: bool,
}

impl ClaimedSpace {
    /// Every extent the claim holds.
    pub fn dvas(&self) -> impl Iterator<Item = &crate::format::Dva> {
        self.chain
            .iter()
            .map(|pointer| &pointer.dva)
            .chain(self.blocks.iter().flat_map(|block| block.copies()))
    }
}

impl Default for IntentLog {
    fn default() -> IntentLog {
        IntentLog {
            state: RefCell::new(LogState::default()),
            commit_lock: Semaphore::new(1),
            turns: crate::rt::sync::Notify::new(),
            cadence: Default::default(),
            vouched: Default::default(),
            encrypted: Default::default(),
            claimed: Default::default(),
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
    /// Blocks, by (object, block number), whose bytes commits copied: each
    /// such commit, and the version of the block it copied (a file's held
    /// versions are numbered; a volume's copies are 0), from the moment
    /// the copy is taken. A newer change linked since cancels the copies
    /// it supersedes. Every one is kept, not only the newest: a newer
    /// commit that fails leaves the older copy the block's last record.
    live_copies: rustc_hash::FxHashMap<(u64, u64), Vec<(u64, u64)>>,
    /// Copies cancelled by a change linked in a txg not yet built: (txg,
    /// commit, (object, block number)).
    pending_cancels: Vec<(u64, u64, (u64, u64))>,
    /// Copies cancelled in the head (what the directory holds), while their
    /// log blocks are in the chain: (commit, (object, block number)).
    cancelled: Vec<(u64, (u64, u64))>,
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
        self.live_copies.retain(|_, copies| {
            copies.retain(|(copied_in, _)| !commits.contains(copied_in));
            !copies.is_empty()
        });
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
pub(in crate::pool) struct LogWrite {
    pub(in crate::pool) commit: u64,
    pub(in crate::pool) chain_guid: u64,
    /// Each block: sequence, where, its encoded bytes, and how many records
    /// it holds.
    pub(in crate::pool) blocks: Vec<(u64, LogPointer, AlignedBuf, usize)>,
    /// Top-level vdevs holding blocks its pointer records name: flushed
    /// while the log blocks are written.
    pub(in crate::pool) needed: Vec<u32>,
}

/// Ends a commit in flight: whatever happens to the future writing it
/// (finished, or dropped), its entry leaves the queue, and when it did not
/// succeed its blocks are released and its chain (if still the dataset's)
/// abandoned, so that the commits after it fail rather than wait forever or
/// be answered past a gap.
pub(in crate::pool) struct InFlightEnd<'a> {
    pub(in crate::pool) pool: &'a Pool,
    pub(in crate::pool) owner: Owner<'a>,
    pub(in crate::pool) commit: u64,
    pub(in crate::pool) armed: bool,
}

impl InFlightEnd<'_> {
    pub(in crate::pool) fn end(&mut self, succeeded: bool) {
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
            // A commit succeeds only in its turn, once every commit before it
            // in the chain has ended: its blocks follow theirs.
            assert_eq!(
                index, 0,
                "commit {} succeeded before a commit ahead of it in the chain ended",
                self.commit
            );
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
pub(in crate::pool) type EntryKey = (u64, Vec<u8>);

/// What a filesystem's commit takes from its log state (and gives back if
/// it does not happen).
#[derive(Default)]
pub(in crate::pool) struct FileChanges {
    pub(in crate::pool) attrs: rustc_hash::FxHashMap<u64, FileAttr>,
    pub(in crate::pool) small_writes: rustc_hash::FxHashMap<(u64, u64), WrittenCopy>,
    pub(in crate::pool) objects: rustc_hash::FxHashMap<u64, (u64, Option<ObjectState>)>,
    pub(in crate::pool) entries: rustc_hash::FxHashMap<EntryKey, (u64, Option<EntryTarget>)>,
    pub(in crate::pool) xattrs: rustc_hash::FxHashMap<u64, (u64, Vec<u8>)>,
}

/// A filesystem's written block kept for its next commit (see
/// `LogState::small_writes`).
#[derive(Clone, Debug)]
pub(in crate::pool) struct WrittenCopy {
    pub(in crate::pool) dva: Dva,
    pub(in crate::pool) txg: u64,
    pub(in crate::pool) data: Vec<u8>,
}

/// A file's size and times after a write, as an attribute record carries
/// them, and the txg of the write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileAttr {
    pub txg: u64,
    pub length: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// The times sealed (an encrypted filesystem's record, replayed; then
    /// `mtime` and `ctime` are zero).
    pub sealed: Option<crate::format::intent_log::SealedTimes>,
}

/// Why a volume's log commit runs: a caller asked for it (a FLUSH, a FUA
/// write, a write under `sync=always`), or it was started ahead of a FLUSH
/// the client's pattern says is coming ([`Pool::log_ahead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum Commit {
    Asked,
    Ahead,
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
    pub(in crate::pool) async fn begin_commit(
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
    pub(in crate::pool) fn try_begin_commit(
        &self,
        in_flight_max: u64,
    ) -> Option<(crate::rt::sync::Permit, u64)> {
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
    pub(in crate::pool) async fn wait_ended(&self, last: u64) {
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
    pub(in crate::pool) async fn quiesce(&self) -> crate::rt::sync::Permit {
        let permit = self.commit_lock.acquire(1).await;
        self.wait_in_flight_below(1).await;
        permit
    }

    /// Commit `number` succeeded: it covers every caller that arrived before
    /// it started (with `held`, their held blocks too).
    pub(in crate::pool) fn covered(&self, number: u64, held: bool) {
        let mut state = self.state.borrow_mut();
        // A commit covers callers only up to its own number: one covering
        // a commit not yet begun would answer a FLUSH before its changes
        // were taken.
        assert!(
            number <= state.commits_started,
            "commit {number} covered, only {} begun",
            state.commits_started
        );
        state.covered_linked = state.covered_linked.max(number);
        if held {
            state.covered_held = state.covered_held.max(number);
        }
    }

    /// Counts a commit that wrote blocks, started at `started`.
    pub(in crate::pool) fn note_commit_time(&self, started: crate::rt::Instant) {
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
    pub(in crate::pool) fn requeue_file_changes(&self, taken: FileChanges) {
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

    /// The log's counters.
    pub fn stats(&self) -> LogStats {
        self.state.borrow().stats
    }

    /// Keeps the space of the chain an import claimed.
    pub(crate) fn set_claimed(&self, space: ClaimedSpace) {
        *self.claimed.borrow_mut() = Some(space);
    }

    /// The space of the chain an import claimed, if any.
    pub(crate) fn claimed(&self) -> Option<ClaimedSpace> {
        self.claimed.borrow().clone()
    }

    /// Whether the chain is claimed and waits for its replay.
    pub(crate) fn is_claimed(&self) -> bool {
        self.claimed.borrow().is_some()
    }

    /// Takes the space of the chain an import claimed: it is replayed, or
    /// freed with its dataset.
    pub(crate) fn take_claimed(&self) -> Option<ClaimedSpace> {
        self.claimed.borrow_mut().take()
    }

    /// Makes this the log of an encrypted filesystem: it carries block
    /// pointers, holes, and files' sizes (which the dnode table holds in
    /// the clear too), their times sealed, and objects' states, entries
    /// and lists of extended attributes sealed whole (`LogRecord::Sealed`),
    /// never a copy of bytes (written in place, sealed, and logged as a
    /// pointer). Its replay needs the key: an import claims the chain, and
    /// the key's load replays it.
    pub(crate) fn set_encrypted(&self) {
        self.encrypted.set(true);
    }

    /// Whether this is an encrypted filesystem's log, which seals its
    /// records and never copies bytes ([`IntentLog::set_encrypted`]).
    pub(crate) fn is_encrypted(&self) -> bool {
        self.encrypted.get()
    }

    /// Notes that block `blkid` of `object` was linked in txg `txg`.
    pub(crate) fn note_linked(&self, object: u64, blkid: u64, txg: u64) {
        let mut state = self.state.borrow_mut();
        // Links are noted in the open txg, which only moves forward:
        // `forget_durable` drops the durable ones by a binary search.
        debug_assert!(
            state.unlogged.last().is_none_or(|(_, _, last)| *last <= txg),
            "object {object} block {blkid}: linked in txg {txg} after a link of a later txg was noted"
        );
        state.unlogged.push((object, blkid, txg));
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
        let Some(data) = data.filter(|_| !self.encrypted.get()) else {
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
    pub(in crate::pool) fn forget_durable(&self, durable: u64) {
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

    /// Block `blkid` of `object` got bytes newer than its copy in the log
    /// (if it has one), linked in txg `txg`: once that txg is durable,
    /// replay must not apply the copy (the txg's directory says so).
    pub(crate) fn note_superseded(&self, object: u64, blkid: u64, txg: u64) {
        let mut state = self.state.borrow_mut();
        let key = (object, blkid);
        for (commit, _) in state.live_copies.remove(&key).unwrap_or_default() {
            state.pending_cancels.push((txg, commit, key));
        }
    }

    /// Version `version` of a file's held block `blkid` of `object` was
    /// linked in txg `txg`: a copy of an older version is superseded (as
    /// [`IntentLog::note_superseded`]), a copy of this version or a newer
    /// one stays live (the newer one's bytes are not in the tree yet).
    pub(crate) fn note_version_linked(&self, object: u64, blkid: u64, version: u64, txg: u64) {
        let mut state = self.state.borrow_mut();
        let key = (object, blkid);
        let Some(copies) = state.live_copies.get_mut(&key) else {
            return;
        };
        let mut superseded = Vec::new();
        copies.retain(|&(commit, copied)| {
            let older = copied < version;
            if older {
                superseded.push(commit);
            }
            !older
        });
        if copies.is_empty() {
            state.live_copies.remove(&key);
        }
        for commit in superseded {
            state.pending_cancels.push((txg, commit, key));
        }
    }
}

/// The record of block `blkid` of `object`, linked in `linked_txg` and now
/// `pointer` in the tree, unless its change is durable already (or it was
/// relinked since, and that is).
pub(in crate::pool) fn block_record(
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
pub(in crate::pool) fn record_txg(record: &LogRecord) -> u64 {
    record.txg()
}

pub(in crate::pool) fn block_size_for(bytes: usize) -> u32 {
    bytes
        .next_multiple_of(LOG_BLOCK_BYTES_MIN)
        .clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX) as u32
}

/// [`crate::pool::datasets::intent_log::build_step`] for one dataset's log.
pub(in crate::pool) fn build_step_of(pool: &Pool, owner: Owner, txg: u64) {
    let mut state = owner.log().state.borrow_mut();
    let state = &mut *state;
    // Copies superseded by changes this txg holds are cancelled in it.
    let before = state.cancelled.len();
    let mut later = Vec::new();
    for (linked_txg, commit, key) in state.pending_cancels.drain(..) {
        if linked_txg <= txg {
            state.cancelled.push((commit, key));
        } else {
            later.push((linked_txg, commit, key));
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
    // A volume's copies are all of its one object; a filesystem's name
    // theirs.
    let (cancelled, cancelled_blocks) = match owner {
        Owner::Volume(_) => (
            state
                .cancelled
                .iter()
                .map(|(commit, (_, blkid))| (*commit, *blkid))
                .collect(),
            Vec::new(),
        ),
        Owner::Filesystem(_) => (
            Vec::new(),
            state
                .cancelled
                .iter()
                .map(|(commit, (object, blkid))| (*commit, *object, *blkid))
                .collect(),
        ),
    };
    let head = head.map(|(seq, pointer)| LogHead {
        cancelled,
        cancelled_blocks,
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
pub(crate) struct LogReleases(pub(in crate::pool) RefCell<Vec<(u64, LogPointer)>>);
