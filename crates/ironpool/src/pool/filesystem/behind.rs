//! Writes written behind: a write to a file that is not synchronous (and,
//! if direct, neither long nor from a client that calls `fsync` often:
//! `Answering::holds`) is answered once its blocks are merged in memory, and
//! its blocks go to the devices afterwards, in batches, as a volume's
//! write-back sends them: once a batch's worth is queued (4 MiB, at most 4
//! batches under way), when someone waits for them (an `fsync`, a commit, a
//! change that takes the filesystem's lock whole, a writer over the dirty
//! data limit), or 100 ms after the oldest was queued. A client that waits
//! for its writes often (an `fsync` within every 4 MiB it writes) gets a
//! batch whenever fewer than 4 are under way, so an `fsync` never waits for
//! blocks not yet begun. A file's blocks of one batch go out in block order
//! as runs (neighbours on a device are one request). Measured on a mirror
//! of two files, fio's 16K random writes at QD64 (buffered): a write-out
//! per write cost 33-38 us of server CPU per write (29-30k IOPS), batches
//! 15-19 us (51-67k IOPS, what a volume does beside it).
//!
//! Why: a buffered `write(2)` on FUSE (without the kernel's writeback
//! cache) waits for the server's answer, and a write to part of a record
//! rewrites the whole record: answered only once that record was on the
//! devices, a 4 KiB write of a database page cost a device write of up to
//! 128 KiB in the caller's latency. OpenZFS answers such writes from its
//! dirty data too and writes them at the txg sync.
//!
//! What it guarantees:
//! - A write that returned is read back at once: a read (buffered or
//!   direct) of a block with a version in memory gets those bytes; a
//!   partial write merges into the newest version. A version made of
//!   partial writes alone keeps the parts written, and is merged over the
//!   block in the tree when read or written out: the write itself reads
//!   nothing (a 4 KiB write into a 128 KiB record that is not cached cost
//!   a 128 KiB device read in the caller's latency).
//! - Versions of one block reach the tree in the order they were written:
//!   one write-out of a block at a time, and a version replaced before its
//!   write-out began is never written (two writes to one record cost one
//!   device write when they come faster than the devices).
//! - `fsync` and `fdatasync` (every commit of the intent log, see
//!   `Pool::fs_log_commit`), snapshots, and every pool commit (`sync`,
//!   export) first wait for the writes answered before them to be linked;
//!   a change of names or attributes (truncate, unlink, a last close,
//!   rename, rollback) waits for all of them, as each write-out holds the
//!   filesystem's lock shared until its blocks are linked.
//! - A write-out that fails is reported by the file's next `fsync` (as
//!   Linux reports a writeback error), and the filesystem writes through
//!   until a write succeeds again. Short of space (the margin volumes'
//!   write-back keeps), or above the pool's dirty data limit
//!   (`dirty_data_max_bytes`, shared with volumes), writes wait or go
//!   through, so a full pool is reported to the write that meets it.
//! - A write that grows a file's one block (a small file written in
//!   pieces, as `tar` and `cp` write) is written behind too while that
//!   block has never been linked: the block grows in memory, and a smaller
//!   version still being written out links nothing. Once the block is in
//!   the tree, a write that grows it goes through (letting its bytes go
//!   before the larger block is on the devices would risk them).
//! - Synchronous writes, direct ones that are not held and writes that
//!   cannot be held (above) go through; a write through waits for the
//!   versions in memory of the blocks it touches first.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::{Filesystem, FsError};
use crate::format::bp::Compression;
use crate::format::checksum::{Checksum, ChecksumAlgo};
use crate::format::znode::Znode;
use crate::format::{BlockPointer, ObjectType};
use crate::object::Object;
use crate::pool::data::{is_zero, BLOCKS_IN_FLIGHT_PER_REQUEST};
use crate::pool::dataset::intent_log::{FileAttr, COPY_BLOCK_BYTES_MAX, COPY_BYTES_PER_COMMIT_MAX};
use crate::pool::dataset::props::{DirectMode, LogBias, SyncMode};
use crate::pool::dirty::{WRITEBACK_BATCHES_IN_FLIGHT, WRITEBACK_BATCH_BYTES, WRITEBACK_DELAY};
use crate::pool::Pool;
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::{Notify, Permit};
use crate::rt::{self};

/// Where in memory a block held as a slice of the front end's buffer
/// starts: on a page, so a device opened with O_DIRECT writes it from
/// there (a block that does not is copied, as any other).
const LENT_ALIGN_BYTES: usize = 4096;

/// What a write-out finds of its version.
enum Claim {
    /// A newer version replaced it: nothing to write.
    Replaced,
    /// An earlier version's write-out is in progress.
    Busy,
    /// Its bytes, now this block's one write-out.
    Claimed(HeldBlock),
}

/// Byte ranges of a block, sorted, apart and not touching.
pub(super) type Parts = Vec<std::ops::Range<usize>>;

/// A block's newest version in memory, as reads and write-outs take it.
pub(super) struct HeldBlock {
    /// The block's bytes; with `parts`, only those ranges are written.
    pub bytes: BufSlice,
    /// None: the whole block. Some: the ranges written, to be merged over
    /// the block in the tree.
    pub parts: Option<Parts>,
    /// The checksum of `bytes`, computed as they were held (see
    /// [`Version::checksum`]).
    pub checksum: Option<(ChecksumAlgo, Checksum)>,
}

/// A block's newest version in memory, and the write-outs that still
/// refer to it.
struct Version {
    /// The block as the newest write left it (see `parts`).
    bytes: BufSlice,
    parts: Option<Parts>,
    /// The checksum of a whole block stored as it is (no compression, no
    /// key), computed when it was held: the bytes were just copied in by
    /// the kernel and are in the CPU's cache, where at write-out, a batch
    /// later, they must be read from memory again (XXH3 of 16 KiB held
    /// blocks took 6.0% of the engine's samples there, 1.8% here, 16K
    /// random writes at QD64). The write pipeline uses it when the
    /// settings still agree
    /// (`NewBlock::checksum`).
    checksum: Option<(ChecksumAlgo, Checksum)>,
    /// Its number (from [`WrittenBehind::next`]): a write-out whose number
    /// is no longer the newest was replaced.
    number: u64,
    /// Write-outs of this block not yet ended (replaced ones included).
    tails: u32,
    /// One of them is writing the block now.
    writing: bool,
    /// What the block counts against the pool (memory, space).
    memory: u64,
    reserved: u64,
    /// Intent log commits holding a copy of one of this block's versions,
    /// with the version each copied: each is told once a version at least
    /// as new is linked (its log blocks are freed once that link is
    /// durable). A copy of a version not yet linked is newer than the tree.
    copies: Vec<(u64, u64)>,
    /// The newest version linked into the tree so far.
    linked: Option<u64>,
    /// What a commit of the intent log finds of the newest version.
    pending: Pending,
}

/// What a commit of the intent log finds of a block's newest version
/// (counted in [`WrittenBehind`] so that an `fsync` knows at once whether
/// it may copy what is held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// Copied into a commit, or linked: nothing for a commit to copy.
    Done,
    /// A whole block of a file whose blocks are its records, small enough
    /// to copy: a commit may copy it into the log, as a volume's FLUSH
    /// copies its held blocks.
    Copyable,
    /// Parts of a block, or the one block of a file that may still grow,
    /// or too large: a commit that must make it durable has it written out
    /// and linked first.
    Uncopyable,
}

impl Version {
    /// What a read or a write-out takes of it.
    fn held(&self) -> HeldBlock {
        HeldBlock {
            bytes: self.bytes.clone(),
            parts: self.parts.clone(),
            checksum: self.checksum,
        }
    }
}

/// The written-behind state of one filesystem.
#[derive(Default)]
pub(super) struct WrittenBehind {
    /// Block versions by (object, block).
    blocks: RefCell<FxHashMap<(u64, u64), Version>>,
    /// Write-outs not yet ended, by number, with their object: what a
    /// `fsync` or a commit waits for.
    in_flight: RefCell<BTreeMap<u64, u64>>,
    next: Cell<u64>,
    /// A write-out failed, per object: the error the next `fsync` returns.
    errors: RefCell<FxHashMap<u64, FsError>>,
    /// The last write-out failed: writes go through until one succeeds.
    failing: Cell<bool>,
    /// A write-out ended or a block's write began.
    changed: Notify,
    /// Write-outs answered and not begun: they begin in batches
    /// ([`write_out_task`]).
    queued: RefCell<Vec<Queued>>,
    /// The bytes of the blocks queued.
    queued_bytes: Cell<u64>,
    /// When the oldest write-out queued was queued.
    queued_since: Cell<rt::Instant>,
    /// Batches of queued write-outs under way.
    batches: Cell<usize>,
    /// Someone waits for a queued write-out: begin them all now.
    urgent: Cell<bool>,
    /// Bytes queued since the last wait for write-outs
    /// ([`WrittenBehind::settle`]; None: none yet). Under a batch's worth,
    /// the client waits for its writes often (an `fsync` every few
    /// writes), and a batch begins whenever fewer than the most are under
    /// way, not once it is full: the `fsync` would otherwise wait for
    /// blocks not yet begun.
    queued_since_settle: Cell<Option<u64>>,
    /// The task that begins batches runs (it ends once none is queued).
    task_running: Cell<bool>,
    /// Wakes that task: a write-out was queued, someone waits, or a batch
    /// ended.
    kick: Notify,
    /// Blocks whose newest version a commit may copy
    /// ([`Pending::Copyable`]), in order, and their bytes.
    copyable: RefCell<std::collections::BTreeSet<(u64, u64)>>,
    copyable_bytes: Cell<u64>,
    /// Blocks whose newest version is neither copied nor linked, and may
    /// not be copied ([`Pending::Uncopyable`]).
    uncopyable: Cell<u64>,
}

/// A held block copied into a commit of the intent log: (object, block),
/// the version copied and its bytes.
pub(in crate::pool) type HeldCopy = ((u64, u64), u64, BufSlice);

/// A file and versions (block, number) of its blocks.
type FileVersions = (Rc<Object>, Vec<(u64, u64)>);

/// One write's write-out, queued: the versions (block, number) it wrote of
/// `object`, and the filesystem's lock shared, which keeps changes of names
/// and attributes off until they are linked.
struct Queued {
    object: Rc<Object>,
    numbers: Vec<(u64, u64)>,
    shared: Permit,
}

impl WrittenBehind {
    /// The newest version in memory of block `blkid` of object `ino`.
    pub(super) fn lookup(&self, ino: u64, blkid: u64) -> Option<HeldBlock> {
        self.blocks.borrow().get(&(ino, blkid)).map(Version::held)
    }

    /// The blocks of `ino` with a version in memory, in order: a walk of
    /// every held block (at most the dirty data limit's worth), for
    /// `lseek`, not for a hot path.
    pub(super) fn held_blocks(&self, ino: u64) -> Vec<u64> {
        let mut held: Vec<u64> = self
            .blocks
            .borrow()
            .keys()
            .filter(|(object, _)| *object == ino)
            .map(|(_, blkid)| *blkid)
            .collect();
        held.sort_unstable();
        held
    }

    /// Whether the queued write-outs make a batch: a full one, or any
    /// while the client waits for its writes often (see
    /// `queued_since_settle`).
    fn ready(&self) -> bool {
        self.queued_bytes.get() >= WRITEBACK_BATCH_BYTES
            || self
                .queued_since_settle
                .get()
                .is_some_and(|bytes| bytes < WRITEBACK_BATCH_BYTES)
    }

    /// Wakes the task that begins batches, to look again: a writer waits
    /// for dirty data to drop, so batches need not fill.
    fn nudge(&self) {
        self.kick.notify_all();
    }

    /// Begins every queued write-out now: someone is about to wait for
    /// them (an `fsync`, a commit, a change that takes the filesystem's
    /// lock whole, a write through of the same blocks).
    pub(super) fn hurry(&self) {
        if !self.queued.borrow().is_empty() {
            self.urgent.set(true);
            self.kick.notify_all();
        }
    }

    /// Waits until no block of `ino` in `blocks` (all of them: None) has a
    /// version in memory: for a write through, which then links its own
    /// after them. The caller holds those blocks' locks, so no new version
    /// comes meanwhile.
    pub(super) async fn settle_blocks(
        &self,
        ino: u64,
        blocks: Option<std::ops::RangeInclusive<u64>>,
    ) {
        let mut hurried = false;
        loop {
            let changed = self.changed.notified();
            // A write's own blocks are looked up one by one (direct writes
            // on a hot path); only a whole file needs a scan of them all.
            let pending = {
                let held = self.blocks.borrow();
                match &blocks {
                    Some(range) => range.clone().any(|blkid| held.contains_key(&(ino, blkid))),
                    None => held.keys().any(|(object, _)| *object == ino),
                }
            };
            if !pending {
                return;
            }
            // Once: the versions of these blocks are then all begun (no new
            // one comes, the caller holding their locks); hurrying at every
            // wake-up would send other writes out in small batches.
            if !std::mem::replace(&mut hurried, true) {
                self.hurry();
            }
            changed.await;
        }
    }

    /// Waits until the write-out of every write answered before now (of
    /// `ino` only, with Some) has ended: those writes are then linked, or
    /// failed. Queued write-outs begin at once.
    pub(super) async fn settle(&self, ino: Option<u64>) {
        let target = self.next.get();
        let mut hurried = false;
        loop {
            let changed = self.changed.notified();
            let pending = self
                .in_flight
                .borrow()
                .range(..target)
                .any(|(_, object)| ino.is_none_or(|ino| *object == ino));
            if !pending {
                return;
            }
            // Once: every write-out numbered below `target` is then begun
            // (later ones are not this wait's).
            if !std::mem::replace(&mut hurried, true) {
                self.queued_since_settle.set(Some(0));
                self.hurry();
            }
            changed.await;
        }
    }

    /// A write went through to the devices: writing behind may resume.
    pub(super) fn wrote_through(&self) {
        self.failing.set(false);
    }

    /// Forgets a freed object's failed write-out (no `fsync` can ask).
    pub(super) fn forget(&self, ino: u64) {
        self.errors.borrow_mut().remove(&ino);
    }

    /// Takes the error a failed write-out of `ino` left (reported once).
    pub(super) fn take_error(&self, ino: u64) -> Option<FsError> {
        self.errors.borrow_mut().remove(&ino)
    }

    /// Counts block `key`'s newest version as `pending` (the counts a
    /// commit asks, [`Filesystem::copy_fits`]), in place of what it was.
    fn set_pending(&self, key: (u64, u64), version: &mut Version, pending: Pending) {
        let bytes = version.bytes.len() as u64;
        match version.pending {
            Pending::Done => {}
            Pending::Copyable => {
                let was = self.copyable.borrow_mut().remove(&key);
                debug_assert!(was, "a copyable version is in the set");
                self.copyable_bytes.set(self.copyable_bytes.get() - bytes);
            }
            Pending::Uncopyable => self.uncopyable.set(self.uncopyable.get() - 1),
        }
        match pending {
            Pending::Done => {}
            Pending::Copyable => {
                self.copyable.borrow_mut().insert(key);
                self.copyable_bytes.set(self.copyable_bytes.get() + bytes);
            }
            Pending::Uncopyable => self.uncopyable.set(self.uncopyable.get() + 1),
        }
        version.pending = pending;
    }

    /// Takes, for commit `commit`, every held version a commit may copy
    /// (the caller found they fit), in block order: each is then copied
    /// (not offered again) until it is linked or replaced.
    pub(in crate::pool) fn take_copies(&self, commit: u64) -> Vec<HeldCopy> {
        let keys = std::mem::take(&mut *self.copyable.borrow_mut());
        self.copyable_bytes.set(0);
        let mut blocks = self.blocks.borrow_mut();
        keys.into_iter()
            .map(|key| {
                let version = blocks.get_mut(&key).expect("a copyable version is held");
                assert_eq!(
                    version.pending,
                    Pending::Copyable,
                    "object {} block {}: offered for a copy as it is not",
                    key.0,
                    key.1
                );
                version.pending = Pending::Done;
                version.copies.push((commit, version.number));
                (key, version.number, version.bytes.clone())
            })
            .collect()
    }

    /// Gives back the copies commit `commit` took (it will not be
    /// written): the versions still newest and not linked are offered to
    /// the next commit. Returns the blocks linked meanwhile whose link was
    /// not noted for the log because this commit held their copy: the
    /// caller notes them now.
    pub(in crate::pool) fn give_back_copies(
        &self,
        commit: u64,
        copies: &[HeldCopy],
    ) -> Vec<(u64, u64)> {
        let mut unnoted = Vec::new();
        let mut blocks = self.blocks.borrow_mut();
        for (key, number, _) in copies {
            let Some(version) = blocks.get_mut(key) else {
                // Linked, and its version gone since.
                unnoted.push(*key);
                continue;
            };
            let before = version.copies.len();
            version.copies.retain(|(copied_in, _)| *copied_in != commit);
            if version.copies.len() == before {
                // Its link took this copy as the one that made it durable.
                unnoted.push(*key);
            }
            if version.number == *number
                && version.pending == Pending::Done
                && version.linked != Some(*number)
            {
                self.set_pending(*key, version, Pending::Copyable);
            }
        }
        unnoted
    }

    /// Forgets every copy held versions have in the log (its chain was
    /// abandoned): the versions not yet linked are offered to the next
    /// commit, and their links are noted for the log as any other.
    fn forget_all_copies(&self) {
        let mut blocks = self.blocks.borrow_mut();
        for (key, version) in blocks.iter_mut() {
            if version.copies.is_empty() {
                continue;
            }
            version.copies.clear();
            if version.pending == Pending::Done && version.linked != Some(version.number) {
                self.set_pending(*key, version, Pending::Copyable);
            }
        }
    }

    /// Version `number` of block `key` was linked: returns the commits
    /// holding copies of it or of older versions (whose copies the tree
    /// now holds or supersedes), and whether this version was copied
    /// itself (then its link needs no record of its own).
    fn note_version_linked(&self, key: (u64, u64), number: u64) -> (Vec<u64>, bool) {
        let mut blocks = self.blocks.borrow_mut();
        let Some(version) = blocks.get_mut(&key) else {
            return (Vec::new(), false);
        };
        version.linked = Some(version.linked.map_or(number, |linked| linked.max(number)));
        if version.number == number {
            self.set_pending(key, version, Pending::Done);
        }
        let mut resolved = Vec::new();
        let mut copied = false;
        version.copies.retain(|&(commit, copied_number)| {
            if copied_number > number {
                return true;
            }
            resolved.push(commit);
            copied |= copied_number == number;
            false
        });
        (resolved, copied)
    }

    /// Whether block `key` has a version copied into the log and not yet
    /// linked: that copy is newer than the tree, and a record of the tree's
    /// pointer must not follow it in the chain (replay takes a block's
    /// last record).
    pub(in crate::pool) fn copy_is_newer(&self, key: (u64, u64)) -> bool {
        self.blocks
            .borrow()
            .get(&key)
            .is_some_and(|version| !version.copies.is_empty())
    }
}

impl Filesystem {
    /// Whether I/O by a file opened with `flags` is direct: `O_DIRECT` under
    /// `direct=standard`, or any under `direct=always`.
    pub fn is_direct(&self, flags: u32) -> bool {
        match self.settings.get().direct {
            DirectMode::Always => true,
            DirectMode::Standard => flags & libc::O_DIRECT as u32 != 0,
            DirectMode::Disabled => false,
        }
    }

    /// Whether a write by a file opened with `flags` (`open(2)` flags, as
    /// FUSE gives them with each write) may be written behind: neither
    /// direct (`O_DIRECT` under `direct=standard`, or `direct=always`) nor
    /// synchronous (`O_SYNC`/`O_DSYNC` under `sync=standard`, or
    /// `sync=always`).
    pub fn may_write_behind(&self, flags: u32) -> bool {
        let settings = self.settings.get();
        let direct = self.is_direct(flags);
        let sync = match settings.sync {
            SyncMode::Always => true,
            SyncMode::Standard => flags & libc::O_DSYNC as u32 != 0,
            SyncMode::Disabled => false,
        };
        !direct && !sync && !self.snapshot
    }

    /// Writes `data` at `offset` of file `ino` and answers once its blocks
    /// are merged in memory; a task writes them out and links them (see the
    /// module's guarantees). Goes through ([`Filesystem::write`]) when it
    /// cannot: a growing single block, no room, a failing write-out.
    pub async fn write_behind(
        self: &Rc<Self>,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        self.write_held(pool, ino, offset, data, None, false).await
    }

    /// [`Filesystem::write_behind`] of bytes that lie in `kept`, an aligned
    /// buffer of their own the front end read them into (a FUSE WRITE's
    /// payload read apart from its headers): the whole blocks among them
    /// that start on a page are held as slices of it, not copied.
    /// `direct`: a direct write held ([`super::Answering::holds`]), counted
    /// for its client's `fsync` cadence as a direct write going through is
    /// (a buffered one is not: a buffered writer beside would hide a direct
    /// one's cadence).
    pub async fn write_behind_lent(
        self: &Rc<Self>,
        pool: &Rc<Pool>,
        (ino, offset): (u64, u64),
        data: &[u8],
        kept: Option<&BufSlice>,
        direct: bool,
    ) -> Result<usize, FsError> {
        self.write_held(pool, ino, offset, data, kept, direct).await
    }

    /// [`Filesystem::write_behind_lent`]; `direct`: the write is noted for
    /// the `fsync` cadence once held (a write that goes through instead is
    /// noted there).
    async fn write_held(
        self: &Rc<Self>,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
        kept: Option<&BufSlice>,
        direct: bool,
    ) -> Result<usize, FsError> {
        if self.behind.failing.get() || data.is_empty() {
            return self.write(pool, ino, offset, data).await;
        }
        // Room under the dirty data limit, for as many records as the
        // write may touch, before any lock is taken.
        let record = 1u64 << self.record_shift.get();
        let estimate = (data.len() as u64).div_ceil(record).saturating_add(1) * record;
        let Some(admission) = pool.admit_dirty(estimate).await else {
            return self.write(pool, ino, offset, data).await;
        };
        let (shared, object) = self.begin_write(pool, ino).await?;
        let end = super::write_end(offset, data.len())?;
        let dnode = object.dnode();
        let block = dnode.data_block_bytes();
        // Its quota and the others' reservations first: the whole records
        // it touches, as a write going through claims. (Let go before
        // going through: that write is admitted again.)
        let admitted = match self
            .admit_write(pool, &object, self.written_shape(&dnode, offset, end))
            .await
        {
            Ok(admitted) => admitted,
            // No room beside the others' reservations now: the write goes
            // through, which waits for space on its way back with no lock
            // held (a commit may wait for this write's).
            Err(error) if error.errno() == libc::ENOSPC => {
                drop((shared, admission));
                return self.write(pool, ino, offset, data).await;
            }
            Err(error) => return Err(error),
        };
        if self.grows(&dnode, end) {
            let guard = self.files.whole(ino).await;
            if self.may_grow_behind(pool, &object, end) {
                let number = self.grow_behind(pool, &object, offset, data)?;
                if direct {
                    self.log.note_write_arrived();
                }
                let stamped = self.stamp_write(pool, &object);
                drop((guard, admission));
                self.spawn_write_out(pool, &object, vec![(0, number)], shared);
                return stamped.map(|()| data.len());
            }
            drop((guard, shared, admission, admitted));
            return self.write(pool, ino, offset, data).await;
        }
        let first = offset / block;
        let last = (end - 1) / block;
        let guard = self.files.blocks(ino, first..=last).await;
        let now = object.dnode();
        let reserved = pool.held_space_bytes(block) * (last - first + 1);
        if now.data_block_bytes() != block
            || self.grows(&now, end)
            || !pool.has_room_to_hold(reserved, 0)
        {
            drop((guard, shared, admission, admitted));
            return self.write(pool, ino, offset, data).await;
        }
        let mut numbers = Vec::with_capacity((last - first + 1) as usize);
        // Whole blocks of a file whose one block will not grow may be
        // copied into the log by an `fsync` instead of written out first.
        let copyable = self.may_copy_blocks_of(&now);
        for (blkid, within, source) in super::block_pieces(offset, data, block) {
            let chunk = source.len();
            // Merged into the newest version, or the parts of a new one.
            // A whole block read into a buffer of its own is held as it
            // lies there.
            let lent = (chunk as u64 == block)
                .then(|| kept.and_then(|kept| kept.slice_holding(source)))
                .flatten()
                .filter(|lent| (lent.as_ptr() as usize).is_multiple_of(LENT_ALIGN_BYTES));
            if let Some(lent) = lent {
                let number = self.hold_version(pool, ino, blkid, lent, None, copyable);
                numbers.push((blkid, number));
                continue;
            }
            let (mut bytes, mut parts) = match self.behind.lookup(ino, blkid) {
                _ if chunk as u64 == block => (AlignedBuf::for_overwrite(chunk), None),
                Some(held) => (AlignedBuf::copy_from(&held.bytes), held.parts),
                None => (AlignedBuf::zeroed(block as usize), Some(Parts::new())),
            };
            bytes[within..within + chunk].copy_from_slice(source);
            if let Some(written) = parts.as_mut() {
                add_part(written, within..within + chunk);
            }
            let parts = parts.filter(|parts| parts.len() != 1 || parts[0] != (0..block as usize));
            let bytes = BufSlice::whole(bytes.into_shared());
            let number = self.hold_version(pool, ino, blkid, bytes, parts, copyable);
            numbers.push((blkid, number));
        }
        {
            let mut dnode = object.dnode.borrow_mut();
            if end > dnode.length_bytes {
                dnode.length_bytes = end;
            }
        }
        object.dirty.set(true);
        self.count(|stats| {
            stats.write_ops += 1;
            stats.write_bytes += data.len() as u64;
            stats.behind_write_ops += 1;
        });
        if direct {
            self.log.note_write_arrived();
        }
        let stamped = self.stamp_write(pool, &object);
        drop((guard, admission));
        self.spawn_write_out(pool, &object, numbers, shared);
        stamped.map(|()| data.len())
    }

    /// Queues the write-out of versions `numbers` (block, number) of
    /// `object`. The versions held are written out whatever happens to the
    /// write that made them: each is counted in flight until its write-out
    /// ends. Write-outs begin in batches ([`write_out_task`]), as a
    /// volume's write-back does: a write that returned costs no device
    /// write of its own, and the blocks of many writes go to the devices as
    /// one run where the free space allows.
    fn spawn_write_out(
        self: &Rc<Self>,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        numbers: Vec<(u64, u64)>,
        shared: Permit,
    ) {
        let behind = &self.behind;
        let bytes = numbers.len() as u64 * object.data_block_bytes();
        {
            let mut queued = behind.queued.borrow_mut();
            if queued.is_empty() {
                behind.queued_since.set(rt::now());
            }
            queued.push(Queued {
                object: object.clone(),
                numbers,
                shared,
            });
        }
        behind.queued_bytes.set(behind.queued_bytes.get() + bytes);
        behind.queued_since_settle.set(
            behind
                .queued_since_settle
                .get()
                .map(|since| since.saturating_add(bytes)),
        );
        if matches!(self.batch_due(pool), BatchDue::Now) {
            // Begun here, not by the task: one wake-up less in a write's
            // path to the devices when its client waits for it.
            self.begin_batch(pool);
        } else if !behind.task_running.replace(true) {
            let fs = self.clone();
            let task_pool = pool.clone();
            rt::spawn(async move { write_out_task(fs, task_pool).await });
        }
    }

    /// When the queued write-outs (some are queued) should begin as a
    /// batch: the rules of [`write_out_task`].
    fn batch_due(&self, pool: &Pool) -> BatchDue {
        let behind = &self.behind;
        // Someone waits for them, or for the lock whole (it waits for the
        // queued write-outs), or the pool takes no more writes (an export:
        // a write-out begun later would find the devices closed): no batch
        // fills first.
        let urgent =
            behind.urgent.get() || self.lock.has_waiters() || pool.txg.ensure_writable().is_err();
        // Writers over the dirty data limit: batches need not fill, but
        // stay within their number (as a volume's write-back).
        let ready = behind.ready() || pool.writers_held_back();
        let age = rt::now().duration_since(behind.queued_since.get());
        if urgent
            || (ready && behind.batches.get() < WRITEBACK_BATCHES_IN_FLIGHT)
            || age >= WRITEBACK_DELAY
        {
            BatchDue::Now
        } else if ready {
            BatchDue::WhenOneEnds
        } else {
            BatchDue::After(WRITEBACK_DELAY - age)
        }
    }

    /// Begins one batch: every write-out queued, grouped by file, each
    /// file's blocks in order (a sequential writer's blocks are laid out in
    /// order), the files' write-outs side by side.
    fn begin_batch(self: &Rc<Self>, pool: &Rc<Pool>) {
        let behind = &self.behind;
        let queued = std::mem::take(&mut *behind.queued.borrow_mut());
        behind.queued_bytes.set(0);
        behind.urgent.set(false);
        if queued.is_empty() {
            return;
        }
        behind.batches.set(behind.batches.get() + 1);
        // Each file with its versions (block, number).
        let mut files: Vec<FileVersions> = Vec::new();
        let mut permits = Vec::with_capacity(queued.len());
        for entry in queued {
            match files
                .iter_mut()
                .find(|(object, _)| Rc::ptr_eq(object, &entry.object))
            {
                Some((_, numbers)) => numbers.extend(entry.numbers),
                None => files.push((entry.object, entry.numbers)),
            }
            permits.push(entry.shared);
        }
        for (_, numbers) in files.iter_mut() {
            // Versions of one block keep their order (the stable sort): a
            // write-out of an older one finds itself replaced.
            numbers.sort_by_key(|(blkid, _)| *blkid);
        }
        let fs = self.clone();
        let pool = pool.clone();
        rt::spawn(async move {
            let outs = files.into_iter().map(|(object, numbers)| {
                let (fs, pool) = (fs.clone(), pool.clone());
                async move { fs.write_out(&pool, &object, numbers).await }
            });
            futures_util::future::join_all(outs).await;
            // Linked, or failed: changes of names and attributes may come.
            drop(permits);
            fs.behind.batches.set(fs.behind.batches.get() - 1);
            fs.behind.kick.notify_all();
        });
    }

    /// Whether a write ending at `end` that grows `object`'s one block may
    /// grow it in memory (the caller holds the whole file): the new block
    /// holds the whole write (the write does not cross the record size),
    /// there is room to hold it, and the tree's block is a hole, so that
    /// what the file held is all in memory (the versions written behind
    /// since it was created or emptied) or zeros. A block already linked
    /// goes through instead: its bytes would be let go before the grown
    /// block is on the devices, and a write-out that failed would lose them.
    fn may_grow_behind(&self, pool: &Pool, object: &Object, end: u64) -> bool {
        let dnode = object.dnode();
        let record = 1u64 << self.record_shift.get();
        self.grows(&dnode, end)
            && end <= record
            && dnode.root.is_hole()
            && pool.has_room_to_hold(pool.held_space_bytes(record), 0)
    }

    /// Grows `object`'s one block in memory for a write of `data` at
    /// `offset` (after [`Filesystem::may_grow_behind`], with no await
    /// between): the tree gets the larger block size with a hole, and a
    /// whole version of the new size holds what the file held and the
    /// write, to be written out (its number is returned). A write-out of
    /// a smaller version still in progress finds the block size changed and
    /// links nothing (see `write_and_link`): this version carries its
    /// bytes.
    fn grow_behind(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        offset: u64,
        data: &[u8],
    ) -> Result<u64, FsError> {
        let end = offset + data.len() as u64;
        let dnode = object.dnode();
        let shift = super::block_shift_for(end).min(self.record_shift.get());
        let mut bytes = AlignedBuf::zeroed(1 << shift);
        // The tree's block is a hole: the newest version in memory, or its
        // parts over zeros, is all the file held.
        if let Some(held) = self.behind.lookup(object.id, 0) {
            let old = match held.parts {
                None => held.bytes,
                Some(parts) => merged(None, &held.bytes, &parts),
            };
            let kept = old.len().min(dnode.length_bytes as usize);
            bytes[..kept].copy_from_slice(&old[..kept]);
        }
        bytes[offset as usize..end as usize].copy_from_slice(data);
        let length = dnode.length_bytes.max(end);
        let hole = crate::format::BlockPointer::hole(0, ObjectType::FsFile, 0);
        self.replace_only_block(pool, object, shift, length, hole)?;
        let txg = pool.txg.open();
        self.log.note_reshaped();
        self.log.note_linked(object.id, 0, txg);
        self.note_state(object, txg);
        let number = self.hold_version(
            pool,
            object.id,
            0,
            BufSlice::whole(bytes.into_shared()),
            None,
            false,
        );
        object.dirty.set(true);
        self.count(|stats| {
            stats.write_ops += 1;
            stats.write_bytes += data.len() as u64;
            stats.behind_write_ops += 1;
            stats.behind_grow_ops += 1;
        });
        Ok(number)
    }

    /// Sets a written file's modification and change times, noted for the
    /// log with its size.
    pub(super) fn stamp_write(&self, pool: &Pool, object: &Object) -> Result<(), FsError> {
        // Decoded again: a read's access time set meanwhile is kept.
        let mut znode = Znode::decode(&object.dnode().bonus).map_err(|error| {
            FsError::Corrupt(format!("{} object {}: {error}", self.name(), object.id))
        })?;
        let time = super::now();
        znode.mtime = time;
        znode.ctime = time;
        Self::save(object, &znode);
        self.log.note_attr(
            object.id,
            FileAttr {
                txg: pool.txg.open(),
                length: object.length_bytes(),
                mtime: time,
                ctime: time,
                sealed: None,
            },
        );
        Ok(())
    }

    /// Whether whole blocks held of a file shaped as `dnode` may be copied
    /// into the intent log: its blocks are its records (its one block will
    /// not grow: a copy of a smaller block would not fit the file replay
    /// finds), and small enough to copy.
    fn may_copy_blocks_of(&self, dnode: &crate::format::Dnode) -> bool {
        (dnode.levels > 1 || dnode.data_block_shift >= self.record_shift.get())
            && dnode.data_block_bytes() <= COPY_BLOCK_BYTES_MAX
    }

    /// Makes `bytes` the newest version of block `blkid` of `ino` (the
    /// caller holds the block's lock); returns its number, counted in
    /// flight for a write-out. `copyable`: a whole version may be copied
    /// into the log ([`Filesystem::may_copy_blocks_of`]).
    fn hold_version(
        &self,
        pool: &Pool,
        ino: u64,
        blkid: u64,
        bytes: BufSlice,
        parts: Option<Parts>,
        copyable: bool,
    ) -> u64 {
        let behind = &self.behind;
        let number = behind.next.get();
        behind.next.set(number + 1);
        behind.in_flight.borrow_mut().insert(number, ino);
        // A block held as a slice of a payload buffer read for several
        // (`write_behind_lent`) counts its own bytes: the buffer outlives
        // it only while a sibling block is held, by at most
        // `PAYLOAD_APART_BYTES_MAX` of the FUSE front end.
        let memory = bytes.len() as u64;
        let reserved = pool.held_space_bytes(memory);
        let format = self.block_format(ObjectType::FsFile);
        let as_held =
            parts.is_none() && format.compression.algo == Compression::Off && format.key.is_none();
        let checksum = as_held.then(|| (format.checksum, format.checksum.compute(&bytes)));
        let key = (ino, blkid);
        let mut blocks = behind.blocks.borrow_mut();
        let version = blocks.entry(key).or_insert(Version {
            bytes: bytes.clone(),
            parts: None,
            checksum: None,
            number,
            tails: 0,
            writing: false,
            memory: 0,
            reserved: 0,
            copies: Vec::new(),
            linked: None,
            pending: Pending::Done,
        });
        // Counted off with the bytes it had, on with the new ones.
        behind.set_pending(key, version, Pending::Done);
        let pending = if copyable && parts.is_none() {
            Pending::Copyable
        } else {
            Pending::Uncopyable
        };
        version.bytes = bytes;
        version.parts = parts;
        version.checksum = checksum;
        version.number = number;
        version.tails += 1;
        behind.set_pending(key, version, pending);
        // A version replaced gives its memory back at once; its space is
        // counted once per block.
        pool.replace_held((version.memory, version.reserved), (memory, reserved));
        version.memory = memory;
        version.reserved = reserved;
        number
    }

    /// Writes out and links the versions `numbers` (block, number) of
    /// `object`, each unless replaced meanwhile; `_shared` (the
    /// filesystem's lock, shared) keeps changes of names and attributes off
    /// until they are linked. Up to [`BLOCKS_IN_FLIGHT_PER_REQUEST`] blocks
    /// at a time: those free to write now go out as one run (neighbours on
    /// a device become one request, as a volume's write-back does); a block
    /// whose earlier version is still being written waits for it on its
    /// own, so no write-out holds one block while it waits for another.
    async fn write_out(
        self: Rc<Self>,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        numbers: Vec<(u64, u64)>,
    ) {
        for batch in numbers.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            let mut ready = Vec::with_capacity(batch.len());
            let mut busy = Vec::new();
            for &(blkid, number) in batch {
                match self.claim(object, blkid, number) {
                    Claim::Replaced => {
                        self.end_write_out(pool, object, blkid, number, false, None, false)
                    }
                    Claim::Claimed(held) => ready.push((blkid, number, held)),
                    Claim::Busy => busy.push((blkid, number)),
                }
            }
            let waiting = busy
                .into_iter()
                .map(|(blkid, number)| self.write_out_block(pool, object, blkid, number));
            futures_util::future::join(
                self.write_out_run(pool, object, ready),
                futures_util::future::join_all(waiting),
            )
            .await;
        }
    }

    /// Takes version `number` of block `blkid` for its write-out, unless it
    /// was replaced or an earlier one is being written.
    fn claim(&self, object: &Object, blkid: u64, number: u64) -> Claim {
        let mut blocks = self.behind.blocks.borrow_mut();
        let version = blocks
            .get_mut(&(object.id, blkid))
            .expect("a version per write-out");
        if version.number != number {
            // Replaced: the newer version's write-out carries it.
            return Claim::Replaced;
        }
        if version.writing {
            return Claim::Busy;
        }
        version.writing = true;
        Claim::Claimed(version.held())
    }

    /// One block's write-out, once the one in progress ended: unless a newer
    /// version replaced this one, writes the newest bytes and links them.
    async fn write_out_block(&self, pool: &Rc<Pool>, object: &Rc<Object>, blkid: u64, number: u64) {
        loop {
            let changed = self.behind.changed.notified();
            match self.claim(object, blkid, number) {
                Claim::Replaced => {
                    return self.end_write_out(pool, object, blkid, number, false, None, false)
                }
                Claim::Claimed(held) => {
                    return self
                        .write_out_run(pool, object, vec![(blkid, number, held)])
                        .await
                }
                Claim::Busy => changed.await,
            }
        }
    }

    /// Writes the claimed versions `ready` (block, number, bytes) of
    /// `object` through the write pipeline as one run, links each (noted
    /// for the log), and ends their write-outs.
    ///
    /// A version copied into the log (or newer than one) whose write-out
    /// fails was answered as durable: it is tried again every
    /// `WRITEBACK_RETRY_DELAY` until it is linked or the filesystem is
    /// gone, holding the filesystem's lock shared meanwhile (what OpenZFS's
    /// `failmode=wait` does with a pool that cannot write).
    async fn write_out_run(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        ready: Vec<(u64, u64, HeldBlock)>,
    ) {
        let mut results = self.write_and_link(pool, object, ready).await;
        loop {
            let mut again = Vec::new();
            for (blkid, number, linked) in results {
                match linked {
                    Ok(copied) => {
                        self.end_write_out(pool, object, blkid, number, true, None, copied)
                    }
                    Err(error)
                        if self.behind.copy_is_newer((object.id, blkid)) && !self.is_retired() =>
                    {
                        eprintln!(
                            "ironpool: {}: writing block {blkid} of object {} (in the intent log): {error}; trying again",
                            self.name(),
                            object.id
                        );
                        self.count(|stats| stats.behind_failures += 1);
                        self.behind.failing.set(true);
                        if let Some(version) =
                            self.behind.blocks.borrow_mut().get_mut(&(object.id, blkid))
                        {
                            version.writing = false;
                        }
                        again.push((blkid, number));
                    }
                    Err(error) => {
                        self.end_write_out(pool, object, blkid, number, true, Some(error), false)
                    }
                }
            }
            if again.is_empty() {
                return;
            }
            rt::sleep(crate::pool::volume::writeback::WRITEBACK_RETRY_DELAY).await;
            let mut ready = Vec::with_capacity(again.len());
            for (blkid, number) in again {
                match self.claim(object, blkid, number) {
                    Claim::Claimed(held) => ready.push((blkid, number, held)),
                    // A newer version's write-out carries it.
                    Claim::Replaced | Claim::Busy => {
                        self.end_write_out(pool, object, blkid, number, false, None, false)
                    }
                }
            }
            results = self.write_and_link(pool, object, ready).await;
        }
    }

    /// Writes the claimed versions `ready` (block, number, bytes) of
    /// `object` as one run and links each: per version, whether it was
    /// copied into the log ([`Filesystem::link_written_behind`]), or why
    /// it failed.
    async fn write_and_link(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        ready: Vec<(u64, u64, HeldBlock)>,
    ) -> Vec<(u64, u64, Result<bool, FsError>)> {
        if ready.is_empty() {
            return Vec::new();
        }
        // The whole block each stands for (a version of parts is merged
        // over the block in the tree), unless superseded: a one-block file
        // whose block grew in memory since this version was taken
        // (`grow_behind`), where the newer version carries these bytes.
        let wholes = futures_util::future::join_all(ready.into_iter().map(
            |(blkid, number, held)| async move {
                let size = held.bytes.len() as u64;
                let whole = if object.data_block_bytes() != size {
                    self.count(|stats| stats.behind_superseded += 1);
                    Ok(None)
                } else {
                    self.whole_block(object, blkid, held).await.map(Some)
                };
                (blkid, number, size, whole)
            },
        ))
        .await;
        // Zero blocks become holes: tested once, here.
        let zero: Vec<bool> = wholes
            .iter()
            .map(|(_, _, _, whole)| matches!(whole, Ok(Some((bytes, _))) if is_zero(bytes)))
            .collect();
        let new: Vec<_> = wholes
            .iter()
            .zip(&zero)
            .filter_map(|((_, _, _, whole), zero)| match whole {
                Ok(Some((bytes, checksum))) if !zero => {
                    let mut block = crate::pool::data::NewBlock::of(pool, bytes.clone());
                    block.checksum = *checksum;
                    Some(block)
                }
                _ => None,
            })
            .collect();
        let format = self.block_format(ObjectType::FsFile);
        let mut written =
            crate::pool::data::write_blocks_gathered(pool, format, new, IoClass::AsyncWrite)
                .await
                .into_iter();
        let mut links = Vec::with_capacity(wholes.len());
        for ((blkid, number, size, whole), zero) in wholes.into_iter().zip(zero) {
            // Some(pointer, bytes): a block to link; None: superseded.
            let step = whole.and_then(|whole| {
                whole
                    .map(|(bytes, _)| {
                        let pointer = if zero {
                            BlockPointer::hole(0, ObjectType::FsFile, 0)
                        } else {
                            written.next().expect("a result per block written")?
                        };
                        Ok((pointer, bytes))
                    })
                    .transpose()
            });
            links.push(async move {
                let linked = match step {
                    Ok(Some((pointer, bytes))) => {
                        self.link_written_behind(
                            pool,
                            object,
                            (blkid, number),
                            pointer,
                            size,
                            &bytes,
                        )
                        .await
                    }
                    Ok(None) => Ok(false),
                    Err(error) => Err(error),
                };
                (blkid, number, linked)
            });
        }
        debug_assert!(written.next().is_none(), "every block written is linked");
        futures_util::future::join_all(links).await
    }

    /// Links version `number` of block `blkid` of `object`, written at
    /// `size` from `bytes`, unless the file's block size changed
    /// meanwhile. The commits holding copies of it or of older versions
    /// are told; a version not copied is noted for the next commit.
    /// Returns whether it was copied.
    async fn link_written_behind(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        (blkid, number): (u64, u64),
        pointer: BlockPointer,
        size: u64,
        bytes: &[u8],
    ) -> Result<bool, FsError> {
        let Some(linked) = self
            .link_block_of_size(pool, object, blkid, pointer, size)
            .await?
        else {
            self.count(|stats| stats.behind_superseded += 1);
            return Ok(false);
        };
        // No await since the link: it is of the open txg.
        let txg = pool.txg.open();
        let (resolved, copied) = self.behind.note_version_linked((object.id, blkid), number);
        self.log.resolve_copies(&resolved, txg);
        self.log.note_version_linked(object.id, blkid, number, txg);
        if !copied {
            self.log.note_linked(object.id, blkid, txg);
            let copy = self.settings.get().log_bias == LogBias::Latency;
            self.log
                .note_written(object.id, blkid, &linked, copy.then_some(bytes));
        }
        self.behind.wrote_through();
        Ok(copied)
    }

    /// Ends version `number`'s write-out of block `blkid` (`wrote`: it was
    /// the block's write-out in progress), with its failure if any: the
    /// block's version goes once no write-out refers to it. `copied`: the
    /// version linked was copied into the log, so the answer it gave was
    /// durable already.
    #[allow(clippy::too_many_arguments)]
    fn end_write_out(
        &self,
        pool: &Pool,
        object: &Object,
        blkid: u64,
        number: u64,
        wrote: bool,
        failed: Option<FsError>,
        copied: bool,
    ) {
        let behind = &self.behind;
        {
            let mut blocks = behind.blocks.borrow_mut();
            let version = blocks
                .get_mut(&(object.id, blkid))
                .expect("a version per write-out");
            if wrote {
                debug_assert!(
                    version.writing,
                    "only the write-out in progress ends writing"
                );
                version.writing = false;
            }
            version.tails -= 1;
            if let Some(error) = failed {
                eprintln!(
                    "ironpool: {}: writing block {blkid} of object {}: {error}",
                    self.name(),
                    object.id
                );
                self.count(|stats| stats.behind_failures += 1);
                behind.failing.set(true);
                // Not replaced since: the newest bytes are lost, and the
                // file's next fsync says so.
                if version.number == number {
                    behind.errors.borrow_mut().insert(object.id, error);
                }
            }
            if version.tails == 0 {
                // Every copy of it is told by now: a version copied is
                // linked or tried again, never dropped.
                assert!(
                    version.copies.is_empty() || self.is_retired(),
                    "{} object {} block {blkid}: held bytes copied into the log dropped unlinked",
                    self.name(),
                    object.id
                );
                behind.set_pending((object.id, blkid), version, Pending::Done);
                let (memory, reserved) = (version.memory, version.reserved);
                blocks.remove(&(object.id, blkid));
                pool.release_dirty(memory, reserved);
            }
        }
        behind.in_flight.borrow_mut().remove(&number);
        // Answered before its blocks were linked (and noted): the next
        // `fsync` must commit them (unless its bytes were in the log).
        if !copied {
            self.log.note_answer_unsure();
        }
        behind.changed.notify_all();
    }

    /// The whole block a version being written out stands for: its parts
    /// merged over the block in the tree (read now, while this write-out
    /// is the block's only one).
    async fn whole_block(
        &self,
        object: &Object,
        blkid: u64,
        held: HeldBlock,
    ) -> Result<(BufSlice, Option<(ChecksumAlgo, Checksum)>), FsError> {
        let Some(parts) = held.parts else {
            return Ok((held.bytes, held.checksum));
        };
        self.count(|stats| stats.rmw_write_ops += 1);
        let usage = self.settings.get().data_cache_use();
        let old = self.read_linked_block(object, blkid, usage).await?;
        Ok((merged(old.as_deref(), &held.bytes, &parts), None))
    }

    /// A writer waits for dirty data to drop: queued write-outs begin
    /// without waiting for a batch to fill, within the number of batches
    /// under way.
    pub(in crate::pool) fn nudge_write_outs(&self) {
        self.behind.nudge();
    }

    /// Waits until every write answered before now (of file `ino` only,
    /// with Some) is linked or has failed.
    pub async fn settle_writes(&self, ino: Option<u64>) {
        self.behind.settle(ino).await;
    }

    /// Whether a commit of this filesystem's log may copy held blocks at
    /// all: `logbias=latency`, and a log that carries bytes (an encrypted
    /// filesystem's carries pointers only: a copy would be plaintext).
    pub(in crate::pool) fn copies_held_blocks(&self) -> bool {
        self.settings.get().log_bias == LogBias::Latency
            && !self.log.is_encrypted()
            && !self.snapshot
    }

    /// Whether a commit now would copy every version held that is neither
    /// in the log nor in the tree: all of them whole blocks it may copy,
    /// within [`COPY_BYTES_PER_COMMIT_MAX`] together (as a volume's FLUSH
    /// copies its held blocks). Otherwise an `fsync` has them written out
    /// and linked first.
    pub(in crate::pool) fn copy_fits(&self) -> bool {
        self.copies_held_blocks()
            && self.behind.uncopyable.get() == 0
            && self.behind.copyable_bytes.get() <= COPY_BYTES_PER_COMMIT_MAX
    }

    /// [`WrittenBehind::take_copies`]: the held versions commit `commit`
    /// copies (the caller found they fit, [`Filesystem::copy_fits`]).
    pub(in crate::pool) fn take_held_copies(&self, commit: u64) -> Vec<HeldCopy> {
        self.behind.take_copies(commit)
    }

    /// [`WrittenBehind::give_back_copies`]; the links it finds not noted
    /// are noted for the next commit, in the open txg `txg`.
    pub(in crate::pool) fn give_back_held_copies(
        &self,
        commit: u64,
        copies: &[HeldCopy],
        txg: u64,
    ) {
        let unnoted = self.behind.give_back_copies(commit, copies);
        for (object, blkid) in &unnoted {
            self.log.note_linked(*object, *blkid, txg);
        }
        if !unnoted.is_empty() {
            self.log.note_answer_unsure();
        }
    }

    /// Whether a held version has a copy in the log and is not linked yet.
    pub(in crate::pool) fn held_copies_pending(&self) -> bool {
        self.behind
            .blocks
            .borrow()
            .values()
            .any(|version| !version.copies.is_empty())
    }

    /// The chain of this filesystem's log was abandoned: the held versions
    /// it held copies of are copied again by the next commit (or written
    /// out for a txg), and the next `fsync` commits.
    pub(in crate::pool) fn forget_held_copies(&self) {
        self.behind.forget_all_copies();
        self.log.note_answer_unsure();
    }

    /// [`WrittenBehind::copy_is_newer`] for block `blkid` of `object`.
    pub(in crate::pool) fn held_copy_is_newer(&self, object: u64, blkid: u64) -> bool {
        self.behind.copy_is_newer((object, blkid))
    }

    /// Blocks whose newest version is in memory, not yet linked.
    pub fn held_behind_blocks(&self) -> usize {
        self.behind.blocks.borrow().len()
    }

    /// The space the blocks held in memory will take once linked, per
    /// file (a file per block held): what its owners use, for their quotas.
    pub(super) fn held_behind_by_file(&self) -> Vec<(u64, u64)> {
        self.behind
            .blocks
            .borrow()
            .iter()
            .map(|((ino, _), version)| (*ino, version.reserved))
            .collect()
    }

    /// The space the blocks held in memory will take once linked (what
    /// they reserved): part of what the filesystem uses, for its quota.
    pub fn held_behind_bytes(&self) -> u64 {
        self.behind
            .blocks
            .borrow()
            .values()
            .map(|version| version.reserved)
            .sum()
    }

    /// The error a failed write-out of file `ino` left, if any (once): what
    /// its `fsync` returns.
    pub fn take_write_error(&self, ino: u64) -> Option<FsError> {
        self.behind.take_error(ino)
    }
}

/// Begins the batches of `fs`'s queued write-outs: once a batch's worth
/// ([`WRITEBACK_BATCH_BYTES`]) is queued, at most
/// [`WRITEBACK_BATCHES_IN_FLIGHT`] batches under way; all of them at once
/// when someone waits for them ([`WrittenBehind::hurry`]); and whatever is
/// queued once the oldest waited [`WRITEBACK_DELAY`], so that a write
/// returned reaches the devices soon however little follows it. Ends when
/// nothing is queued (the next write-out queued starts it again).
async fn write_out_task(fs: Rc<Filesystem>, pool: Rc<Pool>) {
    let behind = &fs.behind;
    loop {
        let kicked = behind.kick.notified();
        if behind.queued.borrow().is_empty() {
            behind.task_running.set(false);
            return;
        }
        match fs.batch_due(&pool) {
            BatchDue::Now => fs.begin_batch(&pool),
            // A batch ending kicks.
            BatchDue::WhenOneEnds => kicked.await,
            BatchDue::After(delay) => {
                rt::timeout(delay, kicked).await;
            }
        }
    }
}

/// When queued write-outs begin ([`Filesystem::batch_due`]).
enum BatchDue {
    Now,
    /// Once a batch under way ends (as many as allowed are).
    WhenOneEnds,
    /// After this long, unless kicked first.
    After(std::time::Duration),
}

/// Adds `part` to `parts`, keeping them sorted and merged.
fn add_part(parts: &mut Parts, part: std::ops::Range<usize>) {
    parts.push(part);
    parts.sort_unstable_by_key(|part| part.start);
    let mut merged: Parts = Vec::with_capacity(parts.len());
    for part in parts.drain(..) {
        match merged.last_mut() {
            Some(last) if part.start <= last.end => last.end = last.end.max(part.end),
            _ => merged.push(part),
        }
    }
    *parts = merged;
}

/// `parts` of `bytes` over `old` (None: a hole, zeros), a block of
/// `bytes.len()`.
pub(super) fn merged(old: Option<&[u8]>, bytes: &[u8], parts: &Parts) -> BufSlice {
    let mut out = match old {
        Some(old) if old.len() == bytes.len() => AlignedBuf::copy_from(old),
        // A block of another size is not this file's block any more (its
        // block grows only with nothing written behind): zeros.
        _ => AlignedBuf::zeroed(bytes.len()),
    };
    for part in parts {
        out[part.clone()].copy_from_slice(&bytes[part.clone()]);
    }
    BufSlice::whole(out.into_shared())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_stay_sorted_and_merged() {
        let mut parts = Parts::new();
        add_part(&mut parts, 8..12);
        add_part(&mut parts, 0..4);
        assert_eq!(parts, vec![0..4, 8..12]);
        add_part(&mut parts, 4..8);
        assert_eq!(parts, vec![0..12]);
        add_part(&mut parts, 20..30);
        add_part(&mut parts, 10..22);
        assert_eq!(parts, vec![0..30]);
        let old = [1u8; 32];
        let bytes = [2u8; 32];
        let out = merged(Some(&old), &bytes, &Parts::from([4..8, 16..20]));
        let want: Vec<u8> = (0..32)
            .map(|index| {
                if (4..8).contains(&index) || (16..20).contains(&index) {
                    2
                } else {
                    1
                }
            })
            .collect();
        assert_eq!(&out[..], &want[..]);
        assert_eq!(
            &merged(None, &bytes, &Parts::from([0..2, 3..3]))[..4],
            &[2, 2, 0, 0]
        );
    }
}
