//! Filesystems: POSIX files, directories and links in a dataset's own
//! object set.
//!
//! A filesystem is one pool-level object (`FsObjects`) whose tree is the
//! dnode table of the filesystem's own objects, as an OpenZFS objset is: a
//! snapshot of it (later) is one copy of that object's dnode. Its objects
//! are kept by a nested [`ObjectSet`] that shares the pool-level object as
//! its table, so the txg build writes a filesystem's changed dnodes into
//! its table ([`build_step`]) and then syncs the table like any pool object.
//!
//! - Object 1 is the root directory; object numbers are handed out from the
//!   counter in the table's header ([`FsHeader`], in the bonus of the
//!   table's dnode) and are not reused.
//! - A file's attributes are in its dnode's bonus ([`Znode`]); its size is
//!   the dnode's length. A file of one block has a block the size of its
//!   data (rounded up to a power of two) until it reaches the record size,
//!   as in OpenZFS; larger files have record-size blocks.
//! - Directories are hashed leaves (`dir.rs`, `format::fsdir`).
//!
//! Every change to names (create, link, unlink, rename) holds off txg builds
//! while it runs, so a txg holds all of it or none of it: after a crash a
//! rename has happened or not, and a new file is in its directory or does
//! not exist. Data writes do not (a txg may hold part of a write, as on any
//! filesystem after a crash without `fsync`).
//!
//! Changes to names and attributes of one filesystem are serialised by a
//! reader-writer lock (lookups, reads and writes share it); reads and writes
//! lock only the blocks of the file they touch, so many run at once on one
//! file.
//!
//! `fsync` goes through the filesystem's intent log
//! (`pool::dataset::intent_log`): a write notes each block it links and the
//! file's new size and times; a change of names or attributes ([`Change`])
//! notes the state it left each object it saved and each entry it changed,
//! and a change of extended attributes the object's whole new list; a free
//! and a file's one block growing note theirs. A change the log does not
//! carry (past its bounds) is noted with its txg, and an `fsync` until
//! that txg is durable commits a txg instead.

mod behind;
pub mod dir;
mod holds;
mod stream;
pub mod xattr;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::cache::CacheUse;
use crate::format::dnode::DNODE_BYTES;
use crate::format::fsdir::{self, DirEntry};
use crate::format::intent_log::{EntryTarget, ObjectState};
use crate::format::znode::{
    FsHeader, FsSpace, Timestamp, Znode, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_ISGID, S_ISUID,
    S_IXGRP,
};
use crate::format::{BlockPointer, Dnode, ObjectType};
use crate::object::{new_dnode, Object, ObjectError, ObjectSet};
use crate::pool::data::{is_zero, release_unlinked, Linked, BLOCKS_IN_FLIGHT_PER_REQUEST};
use crate::pool::dataset::intent_log::{FileAttr, IntentLog};
use crate::pool::dataset::props::{DirectMode, LogBias, VolumeSettings};
use crate::pool::{Pool, PoolError, INDIRECT_BLOCK_SHIFT};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Notify;
use behind::HeldBlock;
pub use holds::SessionId;
use holds::{Hold, Holds};
use rustc_hash::{FxHashMap, FxHashSet};

/// The root directory's object number.
pub const ROOT_OBJECT: u64 = 1;
/// Record size (`recordsize`): the block size of files larger than one
/// block. 128 KiB by default, as OpenZFS; 4 KiB to 1 MiB.
pub const RECORD_BYTES_DEFAULT: u32 = 128 * 1024;
pub const RECORD_BYTES_MIN: u32 = 4096;
pub const RECORD_BYTES_MAX: u32 = 1 << 20;
/// Smallest file block: one 512-byte sector (a one-block file's block is
/// its size rounded up to a power of two, at least this).
const FILE_BLOCK_SHIFT_MIN: u8 = 9;
/// Largest file: 2^50 bytes (1 PiB); within what block trees address.
pub const FILE_SIZE_MAX_BYTES: u64 = 1 << 50;
/// Objects one filesystem numbers (2^48): FUSE names an inode by 64 bits,
/// and the mount keeps the top 16 for the snapshots it shows (`.zfs`).
/// At a million files a second, nine years of creates.
pub const OBJECTS_MAX: u64 = 1 << 48;
/// Most links to one file (as ext4's 65,000).
pub const LINK_MAX: u64 = 65_000;
/// Longest symbolic link target (Linux's PATH_MAX).
pub const SYMLINK_BYTES_MAX: usize = 4096;
/// Units of a filesystem's lock: a reader takes one, a writer all of them,
/// far above any number of concurrent readers.
const LOCK_UNITS: u64 = 1 << 20;
/// Blocks a truncate (or the free of a removed file) turns into holes
/// between two turns of the engine's loop. Each costs about a microsecond
/// (3 GiB of 16 KiB blocks, 196,608 of them, took 0.22 s in one go, and
/// every client of the pool waited); 1024 keep a turn near a millisecond.
/// A removed file is freed this many blocks at a time with the filesystem's
/// lock let go between, so its other files are served meanwhile.
pub const FREE_BLOCKS_PER_TURN: u64 = 1024;

/// Object numbers a walk of a filesystem's objects ([`Filesystem::next_object`],
/// and the walks of dnodes by a rollback or a check) looks at between two
/// turns of the engine's loop: about a millisecond of
/// opening dnodes (1-1.5 us each when cached).
pub const OBJECTS_PER_TURN: u64 = 1024;

/// Pool space a change that adds a name or an object claims before it runs
/// (create, mkdir, symlink, mknod, link, rename, setxattr): the most
/// metadata it can add, a new directory's leaf, two leaves of a split of
/// the parent's, a dnode table block and two indirect blocks, each with its
/// metadata copies. Claimed as a data write claims its blocks (against what
/// data may take, beyond the slop and the metadata reserve) and let go when
/// the change ends (its dirty metadata is counted in the reserve from then
/// on), so metadata growth meets ENOSPC where data does, and the slop stays
/// for what frees space: a loop of `mkdir` by any user suspended a full
/// pool, whose next txg found no room for the metadata made.
const NAME_CHANGE_CLAIM_BYTES: u64 = crate::object::sync::METADATA_COPIES as u64
    * (3 * fsdir::LEAF_BYTES as u64 + (1 << TABLE_BLOCK_SHIFT) + (2 << INDIRECT_BLOCK_SHIFT));

/// Where a walk of a filesystem's objects is ([`Filesystem::next_object`]):
/// the next object number to look at.
#[derive(Debug)]
pub(in crate::pool) struct ObjectWalk {
    next: u64,
}

impl Default for ObjectWalk {
    /// A walk from the first object (0 is the filesystem's header).
    fn default() -> Self {
        ObjectWalk { next: 1 }
    }
}

/// relatime's day: an access time older than this is updated by a read.
const RELATIME_SECONDS: i64 = 24 * 60 * 60;
/// Block size of a filesystem's dnode table (32 dnodes a block).
const TABLE_BLOCK_SHIFT: u8 = 14;

/// Snapshots of filesystems open at once for `.zfs/snapshot` (each keeps
/// a cache of its nodes): beyond this, one of them is let go.
const SNAPSHOT_FILESYSTEMS_OPEN_MAX: usize = 16;

/// How long `mount` and `unmount` wait for the server to do it (a mount
/// takes milliseconds; an unmount waits for nothing, being lazy).
pub const MOUNT_WAIT_SECONDS: u64 = 10;

/// What the server has mounted, and what an administrator unmounted.
#[derive(Default)]
pub struct MountState {
    /// Mounted filesystems (short names) and where.
    mounted: BTreeMap<String, String>,
    /// Filesystems `ironpool unmount` took down: not mounted again until
    /// `ironpool mount` (or another `serve`).
    held_off: std::collections::BTreeSet<String>,
}

/// `rename` flags (as Linux's `renameat2`).
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// Why a filesystem operation failed; each maps to the errno a POSIX
/// caller expects.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("no space left")]
    NoSpace,
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    TooBig,
    #[error("read-only filesystem")]
    ReadOnly,
    #[error("operation not supported")]
    NotSupported,
    /// A link or a rename between a filesystem and one of its snapshots.
    #[error("cross-device link")]
    CrossDevice,
    #[error("no such extended attribute")]
    NoAttribute,
    /// `xattr=off`, or a POSIX ACL (not supported).
    #[error("operation not supported (xattr=off, or a POSIX ACL)")]
    XattrsOff,
    #[error("result larger than the caller's buffer")]
    Range,
    #[error("damaged filesystem metadata: {0}")]
    Corrupt(String),
    /// The filesystem was rolled back or destroyed (or its snapshot
    /// destroyed) under a file still open or a request in flight.
    #[error("stale file handle: the filesystem was rolled back or destroyed")]
    Stale,
    #[error(transparent)]
    Pool(PoolError),
}

impl FsError {
    /// The errno for a POSIX caller (FUSE answers with its negation).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::NoSpace | FsError::Pool(PoolError::NoSpace) => libc::ENOSPC,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::TooBig => libc::EFBIG,
            FsError::ReadOnly | FsError::Pool(PoolError::ReadOnly(_)) => libc::EROFS,
            FsError::NotSupported => libc::ENOSYS,
            FsError::CrossDevice => libc::EXDEV,
            FsError::NoAttribute => libc::ENODATA,
            FsError::XattrsOff => libc::EOPNOTSUPP,
            FsError::Range => libc::ERANGE,
            FsError::Stale => libc::ESTALE,
            FsError::Corrupt(_) | FsError::Pool(_) => libc::EIO,
        }
    }
}

impl From<PoolError> for FsError {
    fn from(error: PoolError) -> FsError {
        FsError::Pool(error)
    }
}

impl From<ObjectError> for FsError {
    fn from(error: ObjectError) -> FsError {
        FsError::Pool(error.into())
    }
}

/// A filesystem in the pool directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemRecord {
    /// The pool-level object holding its dnode table.
    pub object: u64,
    pub created_txg: u64,
    pub guid: u64,
    /// Properties set on it (`recordsize`, `mountpoint`, the dataset
    /// properties volumes have, `org:key` user properties).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Its snapshots, dead list and origin (a clone's).
    #[serde(flatten)]
    pub lineage: crate::pool::dataset::directory::Lineage,
    /// A receive in progress into this (hidden) filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive: Option<crate::pool::dataset::directory::ReceiveRecord>,
    /// Where the filesystem's intent log starts (`fsync` writes it): absent
    /// until its first `fsync` through the log, and in pools written before
    /// filesystems had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_log: Option<crate::pool::dataset::directory::LogHead>,
}

/// What `stat` reports about an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// Space used, in 512-byte units (`st_blocks`).
    pub blocks: u64,
    /// The object's block size (`st_blksize`).
    pub block_bytes: u32,
    pub znode: Znode,
}

/// Attribute changes (`setattr`); None leaves one as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (the file type cannot change).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    /// Drop set-user-id and set-group-id ([`without_setid`]) from the mode
    /// this change leaves, under the same lock (FUSE's `HANDLE_KILLPRIV_V2`:
    /// a write or truncate by a caller without `CAP_FSETID`, a chown).
    pub drop_setid: bool,
}

/// `mode` without set-user-id, and without set-group-id when the group may
/// execute (without that bit, set-group-id marks mandatory locking and
/// stays), as Linux drops them when a caller without `CAP_FSETID` writes
/// or truncates a file, or anyone changes its owner.
pub fn without_setid(mode: u32) -> u32 {
    let mut mode = mode & !S_ISUID;
    if mode & S_IXGRP != 0 {
        mode &= !S_ISGID;
    }
    mode
}

/// What a new object is (`create`): its type and permissions in `mode`
/// (a regular file when the type bits are 0), owner, device number (device
/// nodes), and a symbolic link's target.
#[derive(Clone, Copy, Debug, Default)]
pub struct NewObject<'a> {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub target: Option<&'a [u8]>,
}

impl NewObject<'_> {
    /// A regular file or directory (per `mode`) owned by `uid`/`gid`.
    pub fn owned(mode: u32, uid: u32, gid: u32) -> NewObject<'static> {
        NewObject {
            mode,
            uid,
            gid,
            rdev: 0,
            target: None,
        }
    }
}

/// What `statfs` reports.
#[derive(Clone, Copy, Debug)]
pub struct FsStats {
    /// Allocated and available bytes together, as OpenZFS reports a
    /// filesystem's size: the space held for metadata is neither.
    pub total_bytes: u64,
    /// Bytes of data that still fit in the pool, counting the space of
    /// removed files on its way back (see `Pool::writable_bytes`).
    pub available_bytes: u64,
    pub objects: u64,
}

/// Locks of data operations on files: a read or write locks the blocks it
/// touches, so that operations on different blocks of one file run at once
/// (a queue depth of 64 on one file reaches the devices); growing a file's
/// first block locks the whole file.
#[derive(Default)]
struct FileLocks {
    files: RefCell<FxHashMap<u64, FileLockState>>,
    released: Notify,
}

#[derive(Default)]
struct FileLockState {
    whole: bool,
    blocks: FxHashSet<u64>,
}

/// What a [`FileLocks`] guard holds: blocks of a file, or all of it.
enum Held {
    Blocks(std::ops::RangeInclusive<u64>),
    Whole,
}

struct FileGuard<'a> {
    locks: &'a FileLocks,
    ino: u64,
    held: Held,
}

impl FileLocks {
    /// Locks blocks `blocks` of file `ino`, waiting for those held.
    async fn blocks(&self, ino: u64, blocks: std::ops::RangeInclusive<u64>) -> FileGuard<'_> {
        loop {
            let released = self.released.notified();
            {
                let mut files = self.files.borrow_mut();
                let state = files.entry(ino).or_default();
                if !state.whole && !blocks.clone().any(|blkid| state.blocks.contains(&blkid)) {
                    state.blocks.extend(blocks.clone());
                    return FileGuard {
                        locks: self,
                        ino,
                        held: Held::Blocks(blocks),
                    };
                }
            }
            released.await;
        }
    }

    /// Locks all of file `ino`, once nothing of it is held.
    async fn whole(&self, ino: u64) -> FileGuard<'_> {
        loop {
            let released = self.released.notified();
            {
                let mut files = self.files.borrow_mut();
                let state = files.entry(ino).or_default();
                if !state.whole && state.blocks.is_empty() {
                    state.whole = true;
                    return FileGuard {
                        locks: self,
                        ino,
                        held: Held::Whole,
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for FileGuard<'_> {
    fn drop(&mut self) {
        let mut files = self.locks.files.borrow_mut();
        if let Some(state) = files.get_mut(&self.ino) {
            match &self.held {
                Held::Whole => state.whole = false,
                Held::Blocks(blocks) => {
                    for blkid in blocks.clone() {
                        state.blocks.remove(&blkid);
                    }
                }
            }
            if !state.whole && state.blocks.is_empty() {
                files.remove(&self.ino);
            }
        }
        drop(files);
        self.locks.released.notify_all();
    }
}

/// What a filesystem's file I/O did since import (`iostat`), with the
/// names and meanings of a volume's counters so tools read both alike.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FsIoStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Direct reads, which keep nothing in the read cache (`O_DIRECT` with
    /// `direct=standard`, taking a block from it when it is there; every
    /// read with `direct=always`), and writes that went to the devices
    /// before they were answered (written blocks never enter the read
    /// cache).
    pub direct_read_ops: u64,
    pub direct_write_ops: u64,
    /// Buffered writes answered once in memory, their blocks written out
    /// after (`behind.rs`), and write-outs of theirs that failed.
    pub behind_write_ops: u64,
    pub behind_failures: u64,
    /// Of `behind_write_ops`, those that grew a file's one block in memory
    /// (a small file written in pieces).
    pub behind_grow_ops: u64,
    /// Write-outs that linked nothing: their file's one block grew in
    /// memory meanwhile, and the newer version carries their bytes.
    pub behind_superseded: u64,
    /// Writes that covered part of a block and read the old block first.
    pub rmw_write_ops: u64,
    /// Blocks read that were holes (answered with zeros, no device I/O).
    pub hole_read_ops: u64,
    /// `fsync`, `fdatasync` and `fsync` of directories.
    pub flush_ops: u64,
}

/// What the front end serving a filesystem (FUSE) reports about itself,
/// for `fs list` and `iostat`: how requests reach it, and how many it
/// serves at once (an application's queue depth should reach it whole).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FrontEndStats {
    /// How requests come (e.g. `io_uring (2 queues x 64 slots)`); empty
    /// when nothing serves the filesystem.
    pub transport: String,
    /// Requests answered since it was mounted.
    pub requests: u64,
    /// Requests being served now, and the most at once since mounted.
    pub in_flight: u64,
    pub in_flight_max: u64,
    /// Requests by kind (the kernel's opcode name) since mounted: how many
    /// an application's calls cost (a create is a LOOKUP, a CREATE and a
    /// GETATTR of its directory, each a round trip), and how long the
    /// server held each kind.
    pub ops: std::collections::BTreeMap<&'static str, OpStats>,
}

/// One kind of FUSE request served by a filesystem's front end.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct OpStats {
    /// Requests of the kind (those the kernel expects no reply to as well).
    pub count: u64,
    /// Microseconds from each request's arrival at the server to its reply,
    /// summed: the server's share of the round trip (with the devices' for
    /// a request that waits on them).
    pub service_us: u64,
}

/// An open filesystem.
pub struct Filesystem {
    /// `POOL/NAME`.
    pub name: String,
    /// The pool-level object holding the dnode table.
    pub table: Rc<Object>,
    /// Its own objects.
    pub objects: Rc<ObjectSet>,
    pub(in crate::pool) header: Cell<FsHeader>,
    settings: Cell<VolumeSettings>,
    /// `xattr=on` (the default): extended attributes are served.
    xattrs: Cell<bool>,
    /// `atime=on` (the default): reads update the access time, with
    /// relatime's rule ([`Filesystem::touch_atime`]).
    atime: Cell<bool>,
    /// The block size of files larger than one block (`recordsize`); a
    /// change applies to files that grow past one block afterwards.
    record_shift: Cell<u8>,
    /// Names and attributes: changes take all of it; reads and data
    /// operations one unit (they lock their files' blocks in `files`).
    lock: Rc<crate::rt::sync::Semaphore>,
    files: FileLocks,
    /// Per mount session: open handles per file (FUSE OPEN/CREATE to
    /// RELEASE), and the kernel's references per node (FUSE's lookup count:
    /// every entry reply gives it one, FORGET takes them back). A file
    /// whose last name goes while it is open lives on, with no links, until
    /// its last handle closes (or, after a crash, until the next import);
    /// an object whose last name goes while a kernel holds its node lives
    /// on until it is forgotten: a process may still `fstat` an `O_PATH`
    /// descriptor of a removed file or `stat` the removed directory it
    /// works in. One entry per node a kernel holds, about 32 bytes each:
    /// the kernel's inode cache bounds it, as it bounds libfuse's node
    /// table.
    holds: Holds,
    /// Objects with no names left that an open handle or the kernel still
    /// holds: freed when the last one lets go ([`Filesystem::free_if_orphan`]),
    /// at the session's end, or at the next import after a crash.
    orphans: RefCell<FxHashSet<u64>>,
    io_stats: Cell<FsIoStats>,
    front_end: RefCell<FrontEndStats>,
    /// Rolled back or destroyed: another `Filesystem` (or none) serves its
    /// name now, and this one answers every request with `ESTALE`.
    retired: Cell<bool>,
    /// A snapshot's (read-only; its `.zfs/snapshot` directory).
    snapshot: bool,
    /// Its intent log: what `fsync` writes (see `pool::dataset::intent_log`).
    pub(in crate::pool) log: IntentLog,
    /// Buffered writes answered and not yet linked (`behind.rs`).
    behind: behind::WrittenBehind,
}

/// The exclusive hold of a filesystem's lock by a change of names or
/// attributes (create, link, remove, rename, setattr, extended attributes,
/// a last hold let go): when it ends it notes, for the intent log, the
/// state of every object it saved (entries, frees and lists of extended
/// attributes are noted as they happen), in the txg open then.
pub(in crate::pool) struct Change<'a> {
    fs: &'a Filesystem,
    pool: &'a Pool,
    /// Objects whose state changed (noted at the end).
    touched: RefCell<Vec<Rc<Object>>>,
    _permit: crate::rt::sync::Permit,
}

impl Change<'_> {
    /// Saves `object`'s attributes, noting it for the log.
    fn save(&self, object: &Rc<Object>, znode: &Znode) {
        Filesystem::save(object, znode);
        self.touch(object);
    }

    /// Notes that `object`'s state changed (other than its attributes).
    fn touch(&self, object: &Rc<Object>) {
        let mut touched = self.touched.borrow_mut();
        if !touched.iter().any(|seen| Rc::ptr_eq(seen, object)) {
            touched.push(object.clone());
        }
    }

    /// Notes that directory `dir`'s entry `name` names `target` now (None:
    /// is gone).
    fn note_entry(&self, dir: &Object, name: &[u8], target: Option<EntryTarget>) {
        self.fs
            .log
            .note_entry(dir.id, name, self.pool.txg.open(), target);
    }

    /// Makes entry `name` of directory `dir` (names hashed with `salt`) name
    /// `target` (object, `DT_*` type), noted for the log: a new entry, or
    /// with `existing` the one there (which keeps its cookie).
    async fn set_entry(
        &self,
        dir: &Object,
        (salt, name): (u64, &[u8]),
        target: (u64, u8),
        existing: bool,
    ) -> Result<(), FsError> {
        let objects = &self.fs.objects;
        let cookie = if existing {
            dir::repoint(objects, dir, salt, name, target).await?
        } else {
            dir::insert(objects, dir, salt, name, target, None).await?
        };
        let (object, kind) = target;
        let entry = EntryTarget {
            object,
            kind,
            cookie,
        };
        self.note_entry(dir, name, Some(entry));
        Ok(())
    }

    /// Removes entry `name` of directory `dir`, noted for the log.
    async fn remove_entry(&self, dir: &Object, salt: u64, name: &[u8]) -> Result<(), FsError> {
        dir::remove(&self.fs.objects, dir, salt, name).await?;
        self.note_entry(dir, name, None);
        Ok(())
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        let txg = self.pool.txg.open();
        for object in self.touched.take() {
            // A freed object's record says so (freed for good).
            if !self.fs.log.freed(object.id) {
                self.fs.note_state(&object, txg);
            }
        }
    }
}

/// An object's state as the intent log records it; None when its bonus
/// holds no attributes (freed, or not a file's).
fn object_state(object: &Object) -> Option<ObjectState> {
    let dnode = object.dnode();
    if dnode.object_type != ObjectType::FsFile && dnode.object_type != ObjectType::FsDirectory {
        return None;
    }
    Some(ObjectState {
        block_shift: dnode.data_block_shift,
        length: dnode.length_bytes,
        znode: Znode::decode(&dnode.bonus).ok()?,
    })
}

/// The block shift of a one-block file of `size` bytes.
fn block_shift_for(size: u64) -> u8 {
    (size.max(1).next_power_of_two().trailing_zeros() as u8).max(FILE_BLOCK_SHIFT_MIN)
}

/// `data` padded with zeros to the block a one-block file of its size has.
fn padded_to_block(data: &[u8]) -> Vec<u8> {
    let mut bytes = data.to_vec();
    bytes.resize(1 << block_shift_for(data.len() as u64), 0);
    bytes
}

/// Where a write of `length` bytes at `offset` ends, if a file may be
/// that large.
fn write_end(offset: u64, length: usize) -> Result<u64, FsError> {
    offset
        .checked_add(length as u64)
        .filter(|end| *end <= FILE_SIZE_MAX_BYTES)
        .ok_or(FsError::TooBig)
}

/// The pieces of a write of `data` at `offset` in blocks of `block`
/// bytes: (block number, offset in the block, the bytes for it).
fn block_pieces(offset: u64, data: &[u8], block: u64) -> impl Iterator<Item = (u64, usize, &[u8])> {
    let end = offset + data.len() as u64;
    let mut position = offset;
    std::iter::from_fn(move || {
        if position >= end {
            return None;
        }
        let within = position % block;
        let chunk = (block - within).min(end - position) as usize;
        let piece = &data[(position - offset) as usize..][..chunk];
        let blkid = position / block;
        position += chunk as u64;
        Some((blkid, within as usize, piece))
    })
}

fn now() -> Timestamp {
    Timestamp::from_ns(crate::rt::wall_clock_ns())
}

/// The record size a filesystem's properties give.
pub fn record_bytes(properties: &BTreeMap<String, String>) -> u32 {
    properties
        .get("recordsize")
        .and_then(|value| value.parse().ok())
        .unwrap_or(RECORD_BYTES_DEFAULT)
}

/// Where filesystem `short` of pool `pool` mounts: its `mountpoint`
/// property, by default `/POOL/NAME` (as OpenZFS); None for `none` and
/// `legacy` (not mounted by the server).
pub fn mountpoint(
    pool: &str,
    short: &str,
    properties: &BTreeMap<String, String>,
) -> Option<String> {
    match properties.get("mountpoint").map(String::as_str) {
        Some("none" | "legacy") => None,
        Some(path) => Some(path.to_string()),
        None => Some(default_mountpoint(pool, short)),
    }
}

/// Where a filesystem mounts without a `mountpoint` property (OpenZFS's
/// rule).
pub fn default_mountpoint(pool: &str, short: &str) -> String {
    format!("/{pool}/{short}")
}

/// A filesystem's own properties (not inherited from the pool).
pub const OWN_PROPERTIES: [&str; 4] = ["recordsize", "mountpoint", "atime", "xattr"];

/// The value of own property `name` of filesystem `short` of pool `pool`
/// when it is not set.
pub fn own_property_default(pool: &str, short: &str, name: &str) -> String {
    match name {
        "recordsize" => RECORD_BYTES_DEFAULT.to_string(),
        "mountpoint" => default_mountpoint(pool, short),
        _ => "on".to_string(),
    }
}

/// Checks a filesystem-only property; returns the value as stored, or None
/// for a property that is not a filesystem's own.
pub fn validate_own_property(name: &str, value: &str) -> Result<Option<String>, PoolError> {
    let invalid = |why: String| Err(PoolError::InvalidArgument(why));
    match name {
        "recordsize" => {
            let bytes = crate::units::parse_size(value).map_err(PoolError::InvalidArgument)?;
            if !bytes.is_power_of_two()
                || bytes < RECORD_BYTES_MIN as u64
                || bytes > RECORD_BYTES_MAX as u64
            {
                return invalid(format!(
                    "recordsize {value}: a power of two from {RECORD_BYTES_MIN} to {RECORD_BYTES_MAX}"
                ));
            }
            Ok(Some(bytes.to_string()))
        }
        "mountpoint" => {
            if value != "none" && value != "legacy" && !value.starts_with('/') {
                return invalid(format!(
                    "mountpoint '{value}': an absolute path, none or legacy"
                ));
            }
            Ok(Some(value.to_string()))
        }
        "atime" | "xattr" => match value {
            "on" | "off" => Ok(Some(value.to_string())),
            _ => invalid(format!("{name} '{value}': use on or off")),
        },
        _ => Ok(None),
    }
}

impl Filesystem {
    /// Opens the filesystem whose table is `table` (its nodes loaded, for
    /// a head: its txg build writes dnodes into them with no I/O).
    fn open(
        pool: &Pool,
        name: String,
        table: Rc<Object>,
        record: &FilesystemRecord,
        settings: VolumeSettings,
        snapshot: bool,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let header = FsHeader::decode(&table.dnode().bonus)
            .map_err(|error| PoolError::Corrupt(format!("filesystem {name}: {error}")))?;
        let objects = ObjectSet::nested(
            pool.store.clone(),
            table.clone(),
            pool.tunables.borrow().cache_budget_bytes,
        );
        objects.set_durable_txg(pool.txg.durable());
        objects.set_loaded_max(pool.tunables.borrow().fs_objects_loaded_max as usize);
        let fs = Rc::new(Filesystem {
            name,
            table,
            objects,
            header: Cell::new(header),
            settings: Cell::new(settings),
            xattrs: Cell::new(true),
            atime: Cell::new(true),
            record_shift: Cell::new(0),
            lock: crate::rt::sync::Semaphore::new(LOCK_UNITS),
            files: FileLocks::default(),
            holds: Holds::default(),
            orphans: RefCell::default(),
            io_stats: Cell::default(),
            front_end: RefCell::default(),
            retired: Cell::new(false),
            snapshot,
            log: IntentLog::default(),
            behind: behind::WrittenBehind::default(),
        });
        fs.apply_properties(settings, &record.properties);
        Ok(fs)
    }

    /// Takes the filesystem out of service: a rollback or a destroy
    /// replaced or removed it. The caller holds it exclusively (no request
    /// is half done); later requests get `ESTALE`.
    pub(in crate::pool) fn retire(&self) {
        self.retired.set(true);
    }

    /// `NAME` of `POOL/NAME`: its key in the directory.
    pub fn short_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or_default()
    }

    /// Takes the filesystem's lock for a change the intent log carries:
    /// the caller saves attributes with [`Change::save`] and notes entries
    /// with [`Change::note_entry`].
    async fn logged_change<'a>(&'a self, pool: &'a Pool) -> Change<'a> {
        Change {
            fs: self,
            pool,
            touched: RefCell::default(),
            _permit: self.lock.acquire(LOCK_UNITS).await,
        }
    }

    /// Whether it was rolled back or destroyed ([`Filesystem::retire`]).
    pub fn is_retired(&self) -> bool {
        self.retired.get()
    }

    /// Whether this is a snapshot's read-only view.
    pub fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    /// Follows the filesystem's properties (at open, and after `set` or
    /// `inherit` changed one): the dataset settings volumes have, and its
    /// own (`recordsize`, `xattr`, `atime`).
    pub(in crate::pool) fn apply_properties(
        &self,
        settings: VolumeSettings,
        properties: &BTreeMap<String, String>,
    ) {
        let mut settings = settings;
        if self.snapshot {
            settings.read_only = true;
        }
        self.settings.set(settings);
        self.record_shift
            .set(record_bytes(properties).trailing_zeros() as u8);
        let on = |name: &str| properties.get(name).map(String::as_str) != Some("off");
        self.xattrs.set(on("xattr"));
        self.atime.set(on("atime") && !self.snapshot);
    }

    /// Holds every operation of the filesystem off (a space check walks
    /// its trees meanwhile).
    pub(in crate::pool) async fn exclusive(&self) -> crate::rt::sync::Permit {
        self.lock.acquire(LOCK_UNITS).await
    }

    pub fn root(&self) -> u64 {
        self.header.get().root
    }

    /// Whether reads update access times (`atime=on`).
    pub fn access_times(&self) -> bool {
        self.atime.get()
    }

    pub fn settings(&self) -> VolumeSettings {
        self.settings.get()
    }

    pub fn record_bytes(&self) -> u32 {
        1 << self.record_shift.get()
    }

    /// Sets the header but its space sums, which stay as the txg builds
    /// and frees left them ([`Filesystem::set_space`]): a caller that read
    /// the header before a wait may not undo a build's sums.
    fn set_header(&self, header: FsHeader) {
        self.write_header(FsHeader {
            space: self.header.get().space,
            ..header
        });
    }

    /// Sets the header's space sums (a txg build, a freed object).
    fn set_space(&self, space: Option<FsSpace>) {
        self.write_header(FsHeader {
            space,
            ..self.header.get()
        });
    }

    fn write_header(&self, header: FsHeader) {
        self.header.set(header);
        self.table.dnode.borrow_mut().bonus = header.encode();
        self.table.dirty.set(true);
    }

    fn check_writable(&self, pool: &Pool) -> Result<(), FsError> {
        if self.retired.get() {
            return Err(FsError::Stale);
        }
        if self.settings.get().read_only {
            return Err(FsError::ReadOnly);
        }
        pool.txg.ensure_writable()?;
        Ok(())
    }

    /// Loads object `ino` and its attributes.
    async fn load(&self, ino: u64) -> Result<(Rc<Object>, Znode), FsError> {
        if self.retired.get() {
            return Err(FsError::Stale);
        }
        if ino == 0 {
            return Err(FsError::NotFound);
        }
        let object = match self.objects.open(ino).await {
            Ok(object) => object,
            Err(ObjectError::NoSuchObject(_)) => return Err(FsError::NotFound),
            Err(error) => return Err(error.into()),
        };
        // The table and the objects holding extended attributes have no
        // name and are never handed out.
        if Rc::ptr_eq(&object, &self.table) || object.dnode().object_type == ObjectType::FsXattr {
            return Err(FsError::NotFound);
        }
        let znode = Znode::decode(&object.dnode().bonus)
            .map_err(|error| FsError::Corrupt(format!("{} object {ino}: {error}", self.name)))?;
        Ok((object, znode))
    }

    async fn load_dir(&self, ino: u64) -> Result<(Rc<Object>, Znode), FsError> {
        let (object, znode) = self.load(ino).await?;
        if !znode.is_dir() {
            return Err(FsError::NotDir);
        }
        Ok((object, znode))
    }

    fn save(object: &Object, znode: &Znode) {
        object.dnode.borrow_mut().bonus = znode.encode();
        object.dirty.set(true);
    }

    fn attr(object: &Object, znode: Znode) -> Attr {
        let dnode = object.dnode();
        Attr {
            ino: object.id,
            // A directory's size is its entries with `.` and `..`, as
            // OpenZFS reports it.
            size: if znode.is_dir() {
                znode.entries + 2
            } else {
                dnode.length_bytes
            },
            blocks: dnode.used_bytes.div_ceil(512),
            block_bytes: dnode.data_block_bytes() as u32,
            znode,
        }
    }

    fn check_name(name: &[u8]) -> Result<(), FsError> {
        if name.len() > fsdir::NAME_BYTES_MAX {
            return Err(FsError::NameTooLong);
        }
        if !fsdir::valid_entry_name(name) {
            return Err(FsError::Invalid(format!(
                "name {:?}",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(())
    }

    /// The attributes of object `ino`.
    pub async fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        Ok(Self::attr(&object, znode))
    }

    /// The object named `name` in directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (dir_object, dir_znode) = self.load_dir(parent).await?;
        if name == b"." {
            return Ok(Self::attr(&dir_object, dir_znode));
        }
        if name == b".." {
            let (object, znode) = self.load(dir_znode.parent).await?;
            return Ok(Self::attr(&object, znode));
        }
        Self::check_name(name)?;
        let entry = dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let (object, znode) = self.load(entry.object).await?;
        Ok(Self::attr(&object, znode))
    }

    /// Creates `name` in `parent`: a file of any type but a directory
    /// (`mode` says which), a directory, or a symbolic link to `target`.
    pub async fn create(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        new: &NewObject<'_>,
    ) -> Result<Attr, FsError> {
        let NewObject {
            mode,
            uid,
            gid,
            rdev,
            target,
        } = *new;
        pool.txg.throttle(pool).await;
        let _room = self.claim_name_room(pool).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        Self::check_name(name)?;
        if self.header.get().next_object >= OBJECTS_MAX {
            return Err(FsError::NoSpace);
        }
        let kind = mode & S_IFMT;
        let mode = if kind == 0 { mode | S_IFREG } else { mode };
        if (mode & S_IFMT == S_IFLNK) != target.is_some() {
            return Err(FsError::Invalid("a symbolic link needs a target".into()));
        }
        if let Some(target) = target {
            if mode & S_IFMT != S_IFLNK || target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
                return Err(FsError::Invalid("symbolic link target".into()));
            }
        }
        // A link's target is written before builds are held off: allocation
        // may wait for a txg when the pool is nearly full.
        let target_block = match target {
            Some(target) => Some(
                self.write_block(pool, &padded_to_block(target), ObjectType::FsFile)
                    .await?,
            ),
            None => None,
        };
        let release = |pointer: &Option<BlockPointer>| {
            if let Some(pointer) = pointer {
                release_unlinked(pool, pointer);
            }
        };
        let _hold = pool.txg.hold_builds();
        let checked = self.check_new_name(parent, name, mode).await;
        let (dir_object, mut dir_znode) = match checked {
            Ok(dir) => dir,
            Err(error) => {
                release(&target_block);
                return Err(error);
            }
        };
        let is_dir = mode & S_IFMT == S_IFDIR;
        // The object counts from here: a failure below frees it again.
        let ino = self.allocate_ino();
        let time = now();
        let znode = Znode {
            mode,
            uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            parent,
            generation: ino,
            atime: time,
            mtime: time,
            ctime: time,
            birth: time,
            rdev,
            entries: 0,
            hash_salt: if is_dir { crate::format::new_guid() } else { 0 },
            xattr_object: 0,
        };
        let object = self.new_object(pool, ino, is_dir, &znode);
        change.touch(&object);
        // Set once the link's target block is handed to the tree (or, on a
        // failed link, released by it).
        let mut target_taken = false;
        let made = async {
            if is_dir {
                dir::init(&self.objects, &object).await?;
            }
            if let (Some(pointer), Some(target)) = (target_block, target) {
                let mut dnode = object.dnode();
                dnode.data_block_shift = block_shift_for(target.len() as u64);
                dnode.length_bytes = target.len() as u64;
                *object.dnode.borrow_mut() = dnode;
                target_taken = true;
                self.link_cached(pool, &object, 0, pointer)?;
            }
            let target = (ino, fsdir::dirent_type(mode));
            change
                .set_entry(&dir_object, (dir_znode.hash_salt, name), target, false)
                .await
        }
        .await;
        if let Err(error) = made {
            if !target_taken {
                release(&target_block);
            }
            // Nothing names the object: it goes, with what it holds.
            self.free_object(pool, &object).await?;
            return Err(error);
        }
        dir_znode.entries += 1;
        if is_dir {
            dir_znode.nlink += 1;
        }
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        let znode = Znode::decode(&object.dnode().bonus).expect("written just now");
        Ok(Self::attr(&object, znode))
    }

    /// Claims room for the metadata a change that adds a name or an object
    /// may add ([`NAME_CHANGE_CLAIM_BYTES`]): ENOSPC when data could not
    /// have it either, after waiting for space being freed. The caller holds
    /// no lock yet (a commit may be waited for).
    async fn claim_name_room<'a>(
        &self,
        pool: &'a Rc<Pool>,
    ) -> Result<crate::pool::volume::writeback::SpaceClaim<'a>, FsError> {
        self.check_writable(pool)?;
        crate::pool::txg::update_metadata_reserve(pool);
        Ok(pool.claim_space(NAME_CHANGE_CLAIM_BYTES).await?)
    }

    /// Checks that `name` can be created in `parent`; returns the directory.
    async fn check_new_name(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
    ) -> Result<(Rc<Object>, Znode), FsError> {
        let (dir_object, dir_znode) = self.load_dir(parent).await?;
        if dir_znode.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .is_some()
        {
            return Err(FsError::Exists);
        }
        if mode & S_IFMT == S_IFDIR && dir_znode.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        Ok((dir_object, dir_znode))
    }

    /// Hands out the next object number and counts the object in the
    /// header (numbers are not reused).
    fn allocate_ino(&self) -> u64 {
        let mut header = self.header.get();
        let ino = header.next_object;
        header.next_object += 1;
        header.objects += 1;
        self.set_header(header);
        ino
    }

    /// A new object numbered `ino` (written at the next txg).
    fn new_object(&self, pool: &Pool, ino: u64, is_dir: bool, znode: &Znode) -> Rc<Object> {
        let (object_type, shift) = if is_dir {
            (ObjectType::FsDirectory, dir::NEW_DIRECTORY_BLOCK_SHIFT)
        } else {
            (ObjectType::FsFile, FILE_BLOCK_SHIFT_MIN)
        };
        let mut dnode = new_dnode(object_type, shift, INDIRECT_BLOCK_SHIFT, 0, pool.txg.open());
        dnode.checksum_algo = self.settings.get().checksum;
        dnode.bonus = znode.encode();
        self.objects.create(ino, dnode)
    }

    /// Adds a link `name` in `parent` to file `ino` (not a directory).
    pub async fn link(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        parent: u64,
        name: &[u8],
    ) -> Result<Attr, FsError> {
        let _room = self.claim_name_room(pool).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        Self::check_name(name)?;
        let _hold = pool.txg.hold_builds();
        let (object, mut znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::NotPermitted("hard links to directories".into()));
        }
        if znode.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if znode.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let (dir_object, mut dir_znode) = self.load_dir(parent).await?;
        if dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .is_some()
        {
            return Err(FsError::Exists);
        }
        let target = (ino, fsdir::dirent_type(znode.mode));
        change
            .set_entry(&dir_object, (dir_znode.hash_salt, name), target, false)
            .await?;
        let time = now();
        znode.nlink += 1;
        znode.ctime = time;
        change.save(&object, &znode);
        dir_znode.entries += 1;
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        Ok(Self::attr(&object, znode))
    }

    /// Removes `name` from `parent`: a non-directory (`unlink`), or an
    /// empty directory (`rmdir`, `want_dir`).
    pub async fn remove(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> Result<(), FsError> {
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        if name == b"." {
            return Err(FsError::Invalid("rmdir of .".into()));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        Self::check_name(name)?;
        let _hold = pool.txg.hold_builds();
        let (dir_object, mut dir_znode) = self.load_dir(parent).await?;
        let entry = dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let (object, znode) = self.load(entry.object).await?;
        match (want_dir, znode.is_dir()) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) if znode.entries > 0 => return Err(FsError::NotEmpty),
            _ => {}
        }
        change
            .remove_entry(&dir_object, dir_znode.hash_salt, name)
            .await?;
        let time = now();
        dir_znode.entries -= 1;
        if znode.is_dir() {
            dir_znode.nlink -= 1;
        }
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        self.drop_link(&change, pool, &object, znode, time).await
    }

    /// One name of `object` is gone: its link count drops, and at zero it
    /// is freed, unless an open handle or the kernel holds it: then it
    /// stays, with no links, until the last one lets go
    /// ([`Filesystem::release`], [`Filesystem::forgotten`]); an import
    /// frees what a crash left so ([`Filesystem::reclaim_unlinked`]).
    async fn drop_link(
        &self,
        change: &Change<'_>,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        mut znode: Znode,
        time: Timestamp,
    ) -> Result<(), FsError> {
        znode.nlink = if znode.is_dir() { 0 } else { znode.nlink - 1 };
        znode.ctime = time;
        if znode.nlink > 0 {
            change.save(object, &znode);
            return Ok(());
        }
        if self.is_held(object.id) {
            change.save(object, &znode);
            self.orphans.borrow_mut().insert(object.id);
            return Ok(());
        }
        self.free_object(pool, object).await
    }

    /// Whether an open handle or a kernel holds object `ino`, in any mount
    /// session.
    fn is_held(&self, ino: u64) -> bool {
        self.holds.is_held(ino)
    }

    /// A mount session begins (a FUSE connection): the holds it takes are
    /// its own, and its end lets go of them alone.
    pub fn begin_session(&self) -> SessionId {
        self.holds.begin()
    }

    /// `session`'s kernel was handed node `ino` once more (an entry reply:
    /// LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK).
    pub fn remembered(&self, session: SessionId, ino: u64) {
        if !self.snapshot {
            self.holds.take(session, Hold::Kernel, ino);
        }
    }

    /// `session`'s kernel let go of `count` of its references to node `ino`
    /// (FORGET, or an entry reply it never took); the last hold of any
    /// session on an object with no names left frees it.
    pub async fn forgotten(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        ino: u64,
        count: u64,
    ) -> Result<(), FsError> {
        self.let_go(pool, session, Hold::Kernel, ino, count).await
    }

    /// `session` lets go of `count` holds of `kind` on `ino`; when they
    /// were its last, the object is freed if it has no names left and no
    /// other hold.
    async fn let_go(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        kind: Hold,
        ino: u64,
        count: u64,
    ) -> Result<(), FsError> {
        if !self.holds.let_go(session, kind, ino, count) {
            return Ok(());
        }
        self.free_if_orphan(pool, ino).await
    }

    /// Mount session `session` ended (unmounted, or the server stops): the
    /// nodes its kernel held and the handles it had open are let go, and
    /// the objects among them with no names left that no other session
    /// holds are freed now rather than at the next import.
    pub async fn session_ended(&self, pool: &Rc<Pool>, session: SessionId) -> Result<(), FsError> {
        self.holds.end(session);
        let mut orphans: Vec<u64> = self.orphans.borrow().iter().copied().collect();
        orphans.sort_unstable();
        for ino in orphans {
            self.free_if_orphan(pool, ino).await?;
        }
        Ok(())
    }

    /// Frees object `ino` if it has no names left and nothing holds it any
    /// more; anything else returns at once, without the lock.
    ///
    /// A file's blocks become holes [`FREE_BLOCKS_PER_TURN`] at a time,
    /// each slice under the lock and with builds held off, and the lock let
    /// go between slices: nothing else can reach the object (no name, no
    /// handle, no node the kernel holds, and the mount offers no handles to
    /// open by), so only the filesystem's other files gain. A crash part
    /// way leaves a file with no links, which the next import frees
    /// ([`Filesystem::reclaim_unlinked`]).
    async fn free_if_orphan(&self, pool: &Rc<Pool>, ino: u64) -> Result<(), FsError> {
        if self.snapshot || !self.orphans.borrow().contains(&ino) {
            return Ok(());
        }
        let mut claimed = false;
        // Blocks below this are holes already.
        let mut next = 0;
        loop {
            let change = self.logged_change(pool).await;
            // Opened or handed to the kernel again while this waited (only
            // before it is claimed: a claimed orphan is this task's alone).
            if !claimed && (self.is_held(ino) || !self.orphans.borrow_mut().remove(&ino)) {
                return Ok(());
            }
            claimed = true;
            if self.is_retired() {
                return Ok(());
            }
            let hold = pool.txg.hold_builds();
            let (object, znode) = match self.load(ino).await {
                Ok(loaded) => loaded,
                Err(FsError::NotFound) => return Ok(()),
                Err(error) => return Err(error),
            };
            if znode.nlink != 0 {
                return Ok(());
            }
            let dnode = object.dnode();
            let end = dnode.length_bytes.div_ceil(dnode.data_block_bytes());
            if znode.is_regular() && next < end {
                next = self.punch_slice(pool, &object, next, end).await?;
                drop(hold);
                drop(change);
                pool.spill_dead(&self.table);
                crate::rt::yield_now().await;
                continue;
            }
            return self.free_object(pool, &object).await;
        }
    }

    /// Turns blocks `first..end` of `object` into holes, a slice at a time
    /// ([`Filesystem::punch_slice`]), turning the engine's loop between
    /// slices: other datasets' requests are served meanwhile (this
    /// filesystem's, when the caller holds its lock, wait for it).
    pub(super) async fn punch_range(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let mut blkid = first;
        while blkid < end {
            blkid = self.punch_slice(pool, object, blkid, end).await?;
            if blkid < end {
                crate::rt::yield_now().await;
            }
        }
        Ok(())
    }

    /// Turns the blocks of `object` from `first` on into holes, up to
    /// [`FREE_BLOCKS_PER_TURN`] of them (holes met on the way cost little:
    /// a hole high in the tree is passed whole). A directory's blocks are
    /// punched as its own code does; a file's, or an extended attribute
    /// object's, get a hole linked. Returns the block after the last one
    /// looked at: `end` once none is left before it.
    async fn punch_slice(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        end: u64,
    ) -> Result<u64, FsError> {
        let mut blkid = first;
        let mut punched = 0;
        let object_type = object.dnode.borrow().object_type;
        while blkid < end && punched < FREE_BLOCKS_PER_TURN {
            let span = self.objects.hole_span(object, blkid).await?;
            if span > 0 {
                blkid = blkid.saturating_add(span);
                continue;
            }
            if object_type == ObjectType::FsDirectory {
                self.objects.punch(object, blkid).await?;
            } else {
                let hole = BlockPointer::hole(0, object_type, 0);
                self.link_block(pool, object, blkid, hole).await?;
            }
            punched += 1;
            blkid += 1;
        }
        Ok(blkid.min(end))
    }

    /// `session` opened a handle to file `ino`.
    pub fn opened(&self, session: SessionId, ino: u64) {
        // A snapshot's files are read-only and freed with it.
        if !self.snapshot {
            self.holds.take(session, Hold::Open, ino);
        }
    }

    /// `session` released a handle to file `ino`; the last hold of any
    /// session on a file with no names left frees it.
    pub async fn release(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        ino: u64,
    ) -> Result<(), FsError> {
        if self.snapshot {
            // Read-only: a snapshot's file with no names is freed with it.
            return Ok(());
        }
        self.let_go(pool, session, Hold::Open, ino, 1).await
    }

    /// The next object in use of a walk of the filesystem's objects (its
    /// dnode table excluded) in object order, one loaded at a time (what
    /// is loaded past `fs_objects_loaded_max` goes as the walk opens more);
    /// None at the end. Turns the engine's loop every
    /// [`OBJECTS_PER_TURN`] object numbers: opening the 100k objects of a
    /// filesystem in one go held every client of the pool for 0.12 s.
    pub(in crate::pool) async fn next_object(
        &self,
        walk: &mut ObjectWalk,
    ) -> Result<Option<Rc<Object>>, ObjectError> {
        loop {
            // Numbers come from the header's counter, read each time: the
            // table grows only when a txg writes new dnodes into it.
            if walk.next >= self.header.get().next_object {
                return Ok(None);
            }
            let ino = walk.next;
            walk.next += 1;
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            match self.objects.open(ino).await {
                Ok(object) => return Ok(Some(object)),
                Err(ObjectError::NoSuchObject(_)) => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Every object of the filesystem in use (its dnode table excluded), in
    /// object order.
    pub(in crate::pool) async fn live_objects(&self) -> Result<Vec<Rc<Object>>, ObjectError> {
        let mut walk = ObjectWalk::default();
        let mut objects = Vec::new();
        while let Some(object) = self.next_object(&mut walk).await? {
            objects.push(object);
        }
        Ok(objects)
    }

    /// Frees the files a crash left unlinked but not yet freed (open when
    /// their last name went). Run at import, before anything is served,
    /// and by a rollback (to a snapshot taken while one was open), which
    /// holds txg builds off meanwhile.
    ///
    /// Dnodes are peeked, not loaded: an import loads only the files it
    /// frees, not every file (which held them all in memory at once, past
    /// the `fs_objects_loaded_max` bound: about 1.4 GB for a million).
    pub(in crate::pool) async fn reclaim_unlinked(&self, pool: &Rc<Pool>) -> Result<u64, FsError> {
        let mut freed = 0;
        for ino in 1..self.header.get().next_object {
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            let Some(dnode) = self.objects.peek_dnode(ino).await? else {
                continue;
            };
            // A directory too: removed while the kernel held it.
            if !matches!(
                dnode.object_type,
                ObjectType::FsFile | ObjectType::FsDirectory
            ) {
                continue;
            }
            match Znode::decode(&dnode.bonus) {
                Ok(znode) if znode.nlink == 0 => {
                    let object = self.objects.open(ino).await?;
                    self.free_object(pool, &object).await?;
                    freed += 1;
                }
                _ => {}
            }
        }
        Ok(freed)
    }

    /// Frees every block of `object` and clears its dnode, and so for the
    /// object holding its extended attributes. The caller holds txg builds
    /// off (a build meanwhile would sync the object's dirty nodes, freeing
    /// their old copies under the pointers collected here).
    async fn free_object(&self, pool: &Rc<Pool>, object: &Rc<Object>) -> Result<(), FsError> {
        let dnode = object.dnode();
        if dnode.object_type != ObjectType::FsXattr {
            if let Ok(znode) = Znode::decode(&dnode.bonus) {
                if znode.xattr_object != 0 {
                    let xattrs = self.load_xattr_object(znode.xattr_object).await?;
                    Box::pin(self.free_object(pool, &xattrs)).await?;
                }
            }
        }
        let mut pointers = Vec::new();
        self.objects
            .visit_pointers(object, &mut |_, _, pointer| pointers.push(*pointer))
            .await?;
        for pointer in &pointers {
            self.objects.kill(object, pointer);
        }
        // Its dnode leaves the table now, with the figures the table held
        // for it (the sums are of the table, not of objects in memory): read
        // and cleared with no wait between, so no txg build comes between.
        let offset = object.id * DNODE_BYTES as u64;
        self.objects
            .prefetch(&self.table, offset, DNODE_BYTES as u64)
            .await?;
        let mut space = self.header.get().space;
        if let Some(space) = space.as_mut() {
            let old = table_dnode_space(&self.objects, &self.table, object.id)?;
            space.replace(old, FsSpace::default());
        }
        self.objects.clear_dnode_cached(object.id)?;
        self.set_space(space);
        self.behind.forget(object.id);
        let mut header = self.header.get();
        header.objects -= 1;
        self.set_header(header);
        self.log.note_reshaped();
        // Freeing a file frees the object holding its extended attributes.
        if dnode.object_type != ObjectType::FsXattr {
            self.log.note_object(object.id, pool.txg.open(), None);
        }
        Ok(())
    }

    /// Renames `parent`/`name` to `new_parent`/`new_name`, atomically; with
    /// `RENAME_NOREPLACE` fails if the target exists; with
    /// `RENAME_EXCHANGE` swaps the two (both must exist).
    pub async fn rename(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        let _room = self.claim_name_room(pool).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(FsError::Invalid(format!("rename flags {flags:#x}")));
        }
        Self::check_name(name)?;
        Self::check_name(new_name)?;
        let _hold = pool.txg.hold_builds();
        let (from_dir, mut from_znode) = self.load_dir(parent).await?;
        let (to_dir, mut to_znode) = if new_parent == parent {
            (from_dir.clone(), from_znode)
        } else {
            self.load_dir(new_parent).await?
        };
        let source = dir::lookup(&self.objects, &from_dir, from_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let target = dir::lookup(&self.objects, &to_dir, to_znode.hash_salt, new_name).await?;
        if parent == new_parent && name == new_name {
            return Ok(());
        }
        let (source_object, mut source_znode) = self.load(source.object).await?;
        // A directory may not move under itself.
        if source_znode.is_dir() && parent != new_parent {
            self.check_not_ancestor(source.object, new_parent).await?;
        }
        let time = now();
        if flags & RENAME_EXCHANGE != 0 {
            let target = target.ok_or(FsError::NotFound)?;
            let (target_object, mut target_znode) = self.load(target.object).await?;
            if target_znode.is_dir() && parent != new_parent {
                self.check_not_ancestor(target.object, parent).await?;
            }
            let (source_target, target_target) =
                ((source.object, source.kind), (target.object, target.kind));
            change
                .set_entry(&from_dir, (from_znode.hash_salt, name), target_target, true)
                .await?;
            change
                .set_entry(&to_dir, (to_znode.hash_salt, new_name), source_target, true)
                .await?;
            if parent != new_parent {
                if source_znode.is_dir() {
                    source_znode.parent = new_parent;
                    from_znode.nlink -= 1;
                    to_znode.nlink += 1;
                }
                if target_znode.is_dir() {
                    target_znode.parent = parent;
                    to_znode.nlink -= 1;
                    from_znode.nlink += 1;
                }
            }
            source_znode.ctime = time;
            target_znode.ctime = time;
            change.save(&source_object, &source_znode);
            change.save(&target_object, &target_znode);
        } else {
            let moving = (source.object, source.kind);
            if let Some(target) = &target {
                if flags & RENAME_NOREPLACE != 0 {
                    return Err(FsError::Exists);
                }
                if target.object == source.object {
                    // Two names of one file: POSIX says do nothing.
                    return Ok(());
                }
                let (target_object, target_znode) = self.load(target.object).await?;
                match (source_znode.is_dir(), target_znode.is_dir()) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if target_znode.entries > 0 => return Err(FsError::NotEmpty),
                    _ => {}
                }
                let salt = to_znode.hash_salt;
                change
                    .set_entry(&to_dir, (salt, new_name), moving, true)
                    .await?;
                if target_znode.is_dir() {
                    to_znode.nlink -= 1;
                }
                to_znode.entries -= 1;
                self.drop_link(&change, pool, &target_object, target_znode, time)
                    .await?;
            } else {
                let salt = to_znode.hash_salt;
                change
                    .set_entry(&to_dir, (salt, new_name), moving, false)
                    .await?;
            }
            change
                .remove_entry(&from_dir, from_znode.hash_salt, name)
                .await?;
            // In one directory the name moved (replacing a target already
            // counted above); between two, an entry moves across.
            if parent != new_parent {
                from_znode.entries -= 1;
                to_znode.entries += 1;
                if source_znode.is_dir() {
                    source_znode.parent = new_parent;
                    from_znode.nlink -= 1;
                    to_znode.nlink += 1;
                }
            }
            source_znode.ctime = time;
            change.save(&source_object, &source_znode);
        }
        from_znode.mtime = time;
        from_znode.ctime = time;
        to_znode.mtime = time;
        to_znode.ctime = time;
        if parent == new_parent {
            // `to_znode` carries every change made to the one directory.
            change.save(&to_dir, &to_znode);
        } else {
            change.save(&from_dir, &from_znode);
            change.save(&to_dir, &to_znode);
        }
        Ok(())
    }

    /// Fails if directory `moving` is `dir` or one of its ancestors.
    async fn check_not_ancestor(&self, moving: u64, dir: u64) -> Result<(), FsError> {
        let mut current = dir;
        let root = self.root();
        // Bounded by the depth of the tree; a loop (damage) is cut off.
        for _ in 0..=self.header.get().next_object {
            if current == moving {
                return Err(FsError::Invalid(
                    "a directory cannot move into itself".into(),
                ));
            }
            if current == root {
                return Ok(());
            }
            current = self.load(current).await?.1.parent;
        }
        Err(FsError::Corrupt(format!(
            "{}: directory parents loop",
            self.name
        )))
    }

    /// Entries of directory `ino` from directory offset `offset` on (0:
    /// from the start, with `.` and `..` at 1 and 2), at most `max`. Each
    /// comes with the offset to continue after it: a positive 63-bit value
    /// (`fsdir::offset_of_cookie`), as `telldir` and `seekdir` need, that
    /// stays valid across changes to the directory.
    pub async fn readdir(
        &self,
        ino: u64,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(u64, DirEntry)>, FsError> {
        let cookie = fsdir::cookie_of_offset(offset);
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load_dir(ino).await?;
        let mut out = Vec::new();
        let dot = |name: &[u8], object: u64| DirEntry {
            cookie: 0,
            object,
            kind: fsdir::DT_DIR,
            name: name.to_vec(),
        };
        if cookie == 0 && out.len() < max {
            out.push((1, dot(b".", ino)));
        }
        if cookie <= 1 && out.len() < max {
            out.push((2, dot(b"..", znode.parent)));
        }
        let from = cookie.max(fsdir::COOKIE_FIRST);
        let room = max - out.len();
        if room > 0 {
            for entry in dir::list(&self.objects, &object, from, room).await? {
                out.push((fsdir::offset_of_cookie(entry.cookie + 1), entry));
            }
        }
        Ok(out)
    }

    /// Changes attributes; a new size truncates or extends (with zeros).
    pub async fn setattr(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        change: SetAttr,
    ) -> Result<Attr, FsError> {
        if let Some(size) = change.size {
            self.free_ahead_of_truncate(pool, ino, size).await?;
        }
        let guard = self.logged_change(pool).await;
        self.check_writable(pool)?;
        let (object, mut znode) = self.load(ino).await?;
        let time = now();
        if let Some(size) = change.size {
            if znode.is_dir() {
                return Err(FsError::IsDir);
            }
            if !znode.is_regular() {
                return Err(FsError::Invalid("size of a special file".into()));
            }
            if size > FILE_SIZE_MAX_BYTES {
                return Err(FsError::TooBig);
            }
            self.truncate(pool, &object, size).await?;
            znode.mtime = time;
        }
        if let Some(mode) = change.mode {
            znode.mode = (znode.mode & S_IFMT) | (mode & 0o7777);
        }
        if let Some(uid) = change.uid {
            znode.uid = uid;
        }
        if let Some(gid) = change.gid {
            znode.gid = gid;
        }
        if change.drop_setid {
            znode.mode = without_setid(znode.mode);
        }
        if let Some(atime) = change.atime {
            znode.atime = atime;
        }
        if let Some(mtime) = change.mtime {
            znode.mtime = mtime;
        }
        znode.ctime = time;
        guard.save(&object, &znode);
        Ok(Self::attr(&object, znode))
    }

    /// The target of symbolic link `ino`.
    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        if !znode.is_symlink() {
            return Err(FsError::Invalid("not a symbolic link".into()));
        }
        let size = object.dnode().length_bytes;
        let usage = self.settings.get().data_cache_use();
        self.read_locked(&object, 0, size as usize, usage).await
    }

    /// Reads up to `length` bytes at `offset` of file `ino` (fewer at its
    /// end). A `direct` read (`O_DIRECT`, unless the filesystem's `direct`
    /// property is `disabled`) keeps nothing in the read cache and takes a
    /// block from it only when it is there, as OpenZFS 2.3's direct reads
    /// copy out cached blocks: data another reader brought in costs no
    /// device read. With `direct=always` every read goes to the devices and
    /// keeps nothing. The cache stays coherent: it is keyed by block
    /// pointer, and a block rewritten is a new block.
    pub async fn read(
        &self,
        pool: &Pool,
        ino: u64,
        offset: u64,
        length: usize,
        direct: bool,
    ) -> Result<Vec<u8>, FsError> {
        let pieces = self.read_pieces(pool, ino, offset, length, direct).await?;
        Ok(concat(&pieces))
    }

    /// [`Filesystem::read`] as the pieces of the blocks it read, in order
    /// (holes as zeroed buffers), not copied into one: FUSE writes them to
    /// the kernel as they are. The blocks are shared and never changed in
    /// place (a write makes new ones), so the pieces hold what was read.
    pub async fn read_pieces(
        &self,
        pool: &Pool,
        ino: u64,
        offset: u64,
        length: usize,
        direct: bool,
    ) -> Result<Vec<BufSlice>, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        let size = object.dnode().length_bytes;
        if length == 0 || offset >= size {
            return Ok(Vec::new());
        }
        let _blocks = loop {
            let block = object.dnode().data_block_bytes();
            let last = (offset + length as u64 - 1).min(size - 1) / block;
            let guard = self.files.blocks(ino, offset / block..=last).await;
            // The file's block grew while this waited: lock anew.
            if object.dnode().data_block_bytes() == block {
                break guard;
            }
        };
        let settings = self.settings.get();
        let (usage, direct) = match settings.direct {
            DirectMode::Always => (CacheUse::data(false, false), true),
            DirectMode::Standard if direct => (CacheUse::data(true, false), true),
            _ => (settings.data_cache_use(), false),
        };
        let data = self
            .read_locked_pieces(&object, offset, length, usage)
            .await?;
        self.touch_atime(pool, &object);
        self.count(|stats| {
            stats.read_ops += 1;
            stats.read_bytes += data.iter().map(|piece| piece.len() as u64).sum::<u64>();
            stats.direct_read_ops += u64::from(direct);
        });
        Ok(data)
    }

    /// A read of `object` updates its access time when `atime=on`, by
    /// relatime's rule (Linux's default): only when the access time is not
    /// after the last change or modification, or is a day old, so that a
    /// file read over and over costs one attribute write a day, not one per
    /// read. A read-only filesystem or pool keeps its times.
    fn touch_atime(&self, pool: &Pool, object: &Object) {
        if !self.atime.get() || self.check_writable(pool).is_err() {
            return;
        }
        // Decoded and saved with no await between: a write's or another
        // read's change to the attributes meanwhile is kept.
        let Ok(mut znode) = Znode::decode(&object.dnode().bonus) else {
            return;
        };
        let time = now();
        if znode.atime > znode.mtime
            && znode.atime > znode.ctime
            && time.seconds.saturating_sub(znode.atime.seconds) < RELATIME_SECONDS
        {
            return;
        }
        znode.atime = time;
        Self::save(object, &znode);
    }

    async fn read_locked(
        &self,
        object: &Rc<Object>,
        offset: u64,
        length: usize,
        usage: CacheUse,
    ) -> Result<Vec<u8>, FsError> {
        let pieces = self
            .read_locked_pieces(object, offset, length, usage)
            .await?;
        Ok(concat(&pieces))
    }

    /// [`Filesystem::read_locked`] as the pieces of the blocks read.
    async fn read_locked_pieces(
        &self,
        object: &Rc<Object>,
        offset: u64,
        length: usize,
        usage: CacheUse,
    ) -> Result<Vec<BufSlice>, FsError> {
        let size = object.dnode().length_bytes;
        if offset >= size {
            return Ok(Vec::new());
        }
        let end = (offset + length as u64).min(size);
        let block = object.dnode().data_block_bytes();
        // The request's blocks are read many at once (as its writes are
        // written: see `write_locked`), then copied out in order.
        let blkids: Vec<u64> = (offset / block..=(end - 1) / block).collect();
        let mut reads = Vec::with_capacity(blkids.len());
        for batch in blkids.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            reads.extend(
                futures_util::future::join_all(
                    batch
                        .iter()
                        .map(|blkid| self.read_block(object, *blkid, usage)),
                )
                .await,
            );
        }
        let mut out = Vec::with_capacity(reads.len());
        let mut position = offset;
        for read in reads {
            let within = (position % block) as usize;
            let chunk = ((block - within as u64).min(end - position)) as usize;
            match read? {
                Some(data) => out.push(data.slice(within..within + chunk)),
                None => {
                    self.count(|stats| stats.hole_read_ops += 1);
                    out.push(BufSlice::whole(AlignedBuf::zeroed(chunk).into_shared()));
                }
            }
            position += chunk as u64;
        }
        Ok(out)
    }

    /// One whole data block (None: a hole).
    async fn read_block(
        &self,
        object: &Object,
        blkid: u64,
        usage: CacheUse,
    ) -> Result<Option<BufSlice>, FsError> {
        // A buffered write's newest version, not yet linked: whole, or
        // the parts written over the block in the tree.
        match self.behind.lookup(object.id, blkid) {
            Some(HeldBlock { bytes, parts: None }) => Ok(Some(bytes)),
            Some(HeldBlock {
                bytes,
                parts: Some(parts),
            }) => {
                let old = self.read_linked_block(object, blkid, usage).await?;
                Ok(Some(behind::merged(old.as_deref(), &bytes, &parts)))
            }
            None => self.read_linked_block(object, blkid, usage).await,
        }
    }

    /// One whole data block as the tree has it (None: a hole).
    async fn read_linked_block(
        &self,
        object: &Object,
        blkid: u64,
        usage: CacheUse,
    ) -> Result<Option<BufSlice>, FsError> {
        let name = format_args!("{} object {}", self.name, object.id);
        let read =
            crate::pool::data::read_linked(&self.objects, object, blkid, usage, || None, &name)
                .await?;
        Ok(match read {
            Linked::Hole => None,
            Linked::Held(data) | Linked::Read { data, .. } => Some(data),
        })
    }

    /// Writes `data` at `offset` of file `ino`; returns the bytes written.
    /// A write that finds no room while space is being freed (a large file
    /// was just removed) waits for the frees to come back and tries again,
    /// as OpenZFS's writers wait for the syncing txg, rather than failing
    /// with ENOSPC for the few txgs the frees take.
    pub async fn write(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        self.write_lent(pool, ino, offset, data, None).await
    }

    /// [`Filesystem::write`] of bytes that lie in `lent`, an aligned buffer
    /// the front end read them into (a FUSE WRITE's payload lands on a
    /// 4 KiB boundary): the whole blocks of the write are written from it
    /// without a copy. The buffer is held only until the write returns.
    pub async fn write_lent(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
    ) -> Result<usize, FsError> {
        match self.write_once(pool, ino, offset, data, lent).await {
            Err(error) if error.errno() == libc::ENOSPC => {
                if pool.wait_for_freed_space(data.len() as u64).await? {
                    self.write_once(pool, ino, offset, data, lent).await
                } else {
                    Err(error)
                }
            }
            result => result,
        }
    }

    /// [`Filesystem::write`] without the wait for freed space.
    async fn write_once(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
    ) -> Result<usize, FsError> {
        self.log.note_write_arrived();
        let (_shared, object) = self.begin_write(pool, ino).await?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = write_end(offset, data.len())?;
        // All or nothing, and never into the space held writes will take:
        // the whole records it touches (a part of one is written as a new
        // whole record). `Filesystem::write` waits for frees and retries,
        // as a commit must not wait for this write's locks.
        let block = object.dnode().data_block_bytes();
        let records = (end - 1) / block - offset / block + 1;
        let _space = pool.try_claim_space((records * block).max(data.len() as u64))?;
        let (_file, blocks) = loop {
            let dnode = object.dnode();
            let block = dnode.data_block_bytes();
            if self.grows(&dnode, end) {
                break (self.files.whole(ino).await, None);
            }
            let blocks = offset / block..=(end - 1) / block;
            let guard = self.files.blocks(ino, blocks.clone()).await;
            let now = object.dnode();
            if now.data_block_bytes() == block && !self.grows(&now, end) {
                break (guard, Some(blocks));
            }
        };
        // Versions written behind before this are linked first.
        self.behind.settle_blocks(ino, blocks).await;
        self.write_locked(pool, &object, offset, data, lent).await?;
        self.behind.wrote_through();
        self.count(|stats| {
            stats.write_ops += 1;
            stats.write_bytes += data.len() as u64;
            stats.direct_write_ops += 1;
        });
        self.stamp_write(pool, &object)?;
        Ok(data.len())
    }

    /// What every write does first: waits under the dirty metadata limit
    /// (for a commit past it, before taking any lock a commit could need),
    /// takes the filesystem's lock shared and loads file `ino`.
    async fn begin_write(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
    ) -> Result<(crate::rt::sync::Permit, Rc<Object>), FsError> {
        pool.txg.throttle(pool).await;
        let shared = self.lock.acquire(1).await;
        self.check_writable(pool)?;
        let (object, znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        Ok((shared, object))
    }

    async fn write_locked(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
    ) -> Result<(), FsError> {
        let end = write_end(offset, data.len())?;
        self.grow_block(pool, object, end).await?;
        let block = object.dnode().data_block_bytes();
        // A whole block is the request's own bytes, not a copy of them:
        // written from the buffer `lent` when they lie in it, else copied
        // once, into the buffer the devices write.
        let mut blocks: Vec<(u64, std::borrow::Cow<'_, [u8]>)> = Vec::new();
        for (blkid, within, source) in block_pieces(offset, data, block) {
            let chunk = source.len();
            if chunk as u64 == block {
                blocks.push((blkid, std::borrow::Cow::Borrowed(source)));
                continue;
            }
            self.count(|stats| stats.rmw_write_ops += 1);
            let mut old = match self
                .read_block(object, blkid, self.settings.get().data_cache_use())
                .await?
            {
                Some(old) => old.to_vec(),
                None => vec![0u8; block as usize],
            };
            old.resize(block as usize, 0);
            old[within..within + chunk].copy_from_slice(source);
            blocks.push((blkid, std::borrow::Cow::Owned(old)));
        }
        let slices: Vec<(u64, &[u8])> = blocks
            .iter()
            .map(|(blkid, bytes)| (*blkid, bytes.as_ref()))
            .collect();
        self.store_blocks(pool, object, &slices, ObjectType::FsFile, lent)
            .await?;
        let mut dnode = object.dnode.borrow_mut();
        if end > dnode.length_bytes {
            dnode.length_bytes = end;
        }
        drop(dnode);
        object.dirty.set(true);
        Ok(())
    }

    /// Writes `blocks` (block number, whole block's bytes) of `object`, of
    /// `object_type`, to new space through the write pipeline of data
    /// blocks, up to [`BLOCKS_IN_FLIGHT_PER_REQUEST`] as one run (one
    /// request of 1 MiB is 8 blocks of 128 KiB: neighbours on a device
    /// become one queue request), then links them in order. Blocks of zeros
    /// are holes. A block whose bytes lie in `lent` (an aligned buffer the
    /// front end read them into) is written from it, others are copied.
    /// A failure lets go of the blocks written and not linked.
    async fn store_blocks(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blocks: &[(u64, &[u8])],
        object_type: ObjectType,
        lent: Option<&BufSlice>,
    ) -> Result<(), FsError> {
        let mut pointers = Vec::with_capacity(blocks.len());
        let mut failure = None;
        for batch in blocks.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            let zero: Vec<bool> = batch.iter().map(|(_, bytes)| is_zero(bytes)).collect();
            let new = batch
                .iter()
                .zip(&zero)
                .filter(|(_, zero)| !**zero)
                .map(
                    |((_, bytes), _)| match lent.and_then(|lent| lent.slice_holding(bytes)) {
                        Some(bytes) => crate::pool::data::NewBlock::of(pool, bytes),
                        None => crate::pool::data::NewBlock::copied(pool, bytes),
                    },
                )
                .collect();
            let format = self.block_format(object_type);
            let mut written =
                crate::pool::data::write_blocks(pool, format, new, IoClass::AsyncWrite)
                    .await
                    .into_iter();
            for zero in zero {
                let result = if zero {
                    Ok(BlockPointer::hole(0, object_type, 0))
                } else {
                    written.next().expect("a result per block written")
                };
                match result {
                    Ok(pointer) => pointers.push(pointer),
                    Err(error) => {
                        failure.get_or_insert(FsError::from(error));
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(error) = failure {
            for pointer in &pointers {
                release_unlinked(pool, pointer);
            }
            return Err(error);
        }
        // A file's small blocks are kept for the next fsync to copy into the
        // log (logbias=latency), as OpenZFS copies small synchronous writes.
        let copy =
            object_type == ObjectType::FsFile && self.settings.get().log_bias == LogBias::Latency;
        let mut pointers = pointers.into_iter();
        for (blkid, bytes) in blocks {
            let pointer = pointers.next().expect("a pointer per block");
            let linked = match self.link_block(pool, object, *blkid, pointer).await {
                Ok(linked) => linked,
                Err(error) => {
                    // (link_block let go of its own block.)
                    for pointer in pointers {
                        release_unlinked(pool, &pointer);
                    }
                    return Err(error);
                }
            };
            self.log
                .note_written(object.id, *blkid, &linked, copy.then_some(*bytes));
        }
        Ok(())
    }

    /// Whether a write ending at `end` makes the file's one block larger.
    fn grows(&self, dnode: &Dnode, end: u64) -> bool {
        dnode.levels == 1
            && dnode.data_block_shift < self.record_shift.get()
            && end > dnode.data_block_bytes()
    }

    /// A file of one block whose data will end at `end` past that block
    /// gets a larger block (up to the record size): its block is rewritten
    /// at the new size, and the tree switched to it in one step.
    async fn grow_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        end: u64,
    ) -> Result<(), FsError> {
        let dnode = object.dnode();
        if dnode.levels != 1
            || dnode.data_block_shift >= self.record_shift.get()
            || end <= dnode.data_block_bytes()
        {
            return Ok(());
        }
        let shift = block_shift_for(end).min(self.record_shift.get());
        let old = self
            .read_block(object, 0, self.settings.get().data_cache_use())
            .await?;
        let pointer = match old {
            Some(old) => {
                let mut bytes = old.to_vec();
                bytes.resize(1 << shift, 0);
                self.write_block(pool, &bytes, ObjectType::FsFile).await?
            }
            None => BlockPointer::hole(0, ObjectType::FsFile, 0),
        };
        // No await from here: the old block is let go and the new one linked
        // in the same txg.
        let current = object.dnode();
        if current.levels != 1 || current.data_block_shift != dnode.data_block_shift {
            self.objects.store.release(&pointer.dvas);
            return Err(FsError::Corrupt("file changed while its block grew".into()));
        }
        self.replace_only_block(pool, object, shift, current.length_bytes, pointer)?;
        // The log records the new block size in the file's state, and the
        // new block (a hole too: an older record may name the old one).
        let txg = pool.txg.open();
        self.log.note_reshaped();
        if pointer.is_hole() {
            self.log.note_linked(object.id, 0, txg);
        }
        self.note_state(object, txg);
        Ok(())
    }

    /// Notes `object`'s state, as a change of txg `txg` left it, for the
    /// log (one whose attributes do not decode goes through a txg).
    fn note_state(&self, object: &Object, txg: u64) {
        match object_state(object) {
            Some(state) => self.log.note_object(object.id, txg, Some(state)),
            None => self.log.note_unloggable(txg),
        }
    }

    /// Makes `pointer` (a written block of `1 << shift` bytes, or a hole)
    /// the one block of `object`, a one-block object, whose length becomes
    /// `length`: the old block is let go and the tree switched in one step,
    /// with no await, so one txg holds the old block or the new one.
    fn replace_only_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        shift: u8,
        length: u64,
        pointer: BlockPointer,
    ) -> Result<(), FsError> {
        let mut fresh = object.dnode();
        self.objects.kill(object, &fresh.root);
        fresh.data_block_shift = shift;
        fresh.root = BlockPointer::hole(0, fresh.object_type, 0);
        fresh.length_bytes = length;
        fresh.used_bytes = 0;
        fresh.logical_bytes = 0;
        fresh.physical_bytes = 0;
        self.objects.reset_tree(object, fresh);
        if !pointer.is_hole() {
            self.link_cached(pool, object, 0, pointer)?;
        }
        Ok(())
    }

    /// How the filesystem's blocks of `object_type` are stored now.
    pub(super) fn block_format(&self, object_type: ObjectType) -> crate::pool::data::BlockFormat {
        let settings = self.settings.get();
        crate::pool::data::BlockFormat {
            checksum: settings.checksum,
            compression: settings.compression,
            object_type,
        }
    }

    /// Writes one block's bytes of an object of `object_type` to new space
    /// through the write pipeline of data blocks; a block of zeros is a
    /// hole and writes nothing.
    async fn write_block(
        &self,
        pool: &Rc<Pool>,
        bytes: &[u8],
        object_type: ObjectType,
    ) -> Result<BlockPointer, FsError> {
        if is_zero(bytes) {
            return Ok(BlockPointer::hole(0, object_type, 0));
        }
        let block = crate::pool::data::NewBlock::copied(pool, bytes);
        let format = self.block_format(object_type);
        Ok(crate::pool::data::write_block(pool, format, block, IoClass::AsyncWrite).await?)
    }

    /// Replay of the intent log: links `pointer` (its space claimed by
    /// replay), or a hole, as block `blkid` of file (or link) `ino`.
    /// Refused, the space let go, when it is neither or its blocks are not
    /// that size (an object record set the block size first).
    pub(in crate::pool) async fn replay_block(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<(), FsError> {
        let release = |error: FsError| {
            release_unlinked(pool, &pointer);
            Err(error)
        };
        let object = match self.load(ino).await {
            // A symbolic link's target is its one block.
            Ok((object, znode)) if znode.is_regular() || znode.is_symlink() => object,
            Ok(_) => return release(FsError::Corrupt("not a file or link".into())),
            Err(error) => return release(error),
        };
        let block = object.dnode().data_block_bytes();
        if (!pointer.is_hole() && u64::from(pointer.logical_size) != block)
            || blkid.saturating_mul(block) >= FILE_SIZE_MAX_BYTES
        {
            return release(FsError::Corrupt(format!(
                "a block of {} bytes at {blkid}, the file's are {block}",
                pointer.logical_size
            )));
        }
        self.link_block(pool, &object, blkid, pointer).await?;
        Ok(())
    }

    /// Replay of the intent log: writes a copied block's bytes to new space
    /// (a hole for zeros), to be linked by [`Filesystem::replay_block`].
    pub(in crate::pool) async fn replay_store(
        &self,
        pool: &Rc<Pool>,
        data: &[u8],
    ) -> Result<BlockPointer, FsError> {
        self.write_block(pool, data, ObjectType::FsFile).await
    }

    /// Replay of the intent log: sets file `ino`'s size and times as a
    /// logged write left them.
    pub(in crate::pool) async fn replay_attr(
        &self,
        ino: u64,
        attr: &FileAttr,
    ) -> Result<(), FsError> {
        let (object, mut znode) = self.load(ino).await?;
        if !znode.is_regular() || attr.length > FILE_SIZE_MAX_BYTES {
            return Err(FsError::Corrupt("not a regular file, or too large".into()));
        }
        object.dnode.borrow_mut().length_bytes = attr.length;
        znode.mtime = attr.mtime;
        znode.ctime = attr.ctime;
        Self::save(&object, &znode);
        Ok(())
    }

    /// Replay of the intent log: makes object `ino` (a file, directory or
    /// link) what a logged change of names or attributes left it: created
    /// if it does not exist (a new directory with no entries: its entries
    /// have records of their own), with its attributes, size and block
    /// size. The object holding its extended attributes stays as it is
    /// (their changes have records of their own).
    pub(in crate::pool) async fn replay_object(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        state: &ObjectState,
    ) -> Result<(), FsError> {
        let is_dir = state.znode.is_dir();
        let shift_max = RECORD_BYTES_MAX.trailing_zeros() as u8;
        if ino == 0
            || ino >= OBJECTS_MAX
            || ino == self.root() && !is_dir
            || !(FILE_BLOCK_SHIFT_MIN..=shift_max).contains(&state.block_shift)
            || state.length > FILE_SIZE_MAX_BYTES
        {
            return Err(FsError::Corrupt("an object state out of range".into()));
        }
        let (object, xattr_object) = match self.objects.open(ino).await {
            Ok(object) => {
                let dnode = object.dnode();
                let kind = if is_dir {
                    ObjectType::FsDirectory
                } else {
                    ObjectType::FsFile
                };
                if dnode.object_type != kind {
                    return Err(FsError::Corrupt(format!(
                        "a {kind:?} state for a {:?} object",
                        dnode.object_type
                    )));
                }
                let xattr_object = Znode::decode(&dnode.bonus).map_or(0, |old| old.xattr_object);
                (object, xattr_object)
            }
            Err(ObjectError::NoSuchObject(_)) => {
                self.keep_number(ino);
                let mut header = self.header.get();
                header.objects += 1;
                self.set_header(header);
                let object = self.new_object(pool, ino, is_dir, &state.znode);
                if is_dir {
                    dir::init(&self.objects, &object).await?;
                } else {
                    object.dnode.borrow_mut().data_block_shift = state.block_shift;
                }
                (object, 0)
            }
            Err(error) => return Err(error.into()),
        };
        if !is_dir {
            let dnode = object.dnode();
            if dnode.data_block_shift != state.block_shift {
                // The file's one block grew: the new block has a record.
                if dnode.levels != 1 || dnode.data_block_shift > state.block_shift {
                    return Err(FsError::Corrupt(format!(
                        "blocks of {} bytes for a file of {}",
                        1u64 << state.block_shift,
                        dnode.data_block_bytes()
                    )));
                }
                let hole = BlockPointer::hole(0, ObjectType::FsFile, 0);
                self.replace_only_block(pool, &object, state.block_shift, state.length, hole)?;
            }
            object.dnode.borrow_mut().length_bytes = state.length;
        }
        let mut znode = state.znode;
        znode.xattr_object = xattr_object;
        Self::save(&object, &znode);
        Ok(())
    }

    /// Replay met these object numbers: the header's counter passes them.
    pub(in crate::pool) fn replay_keep_numbers(&self, numbers: impl Iterator<Item = u64>) {
        for ino in numbers {
            self.keep_number(ino);
        }
    }

    /// Replay met object number `ino`: the header's counter passes it, so it
    /// is not handed out again.
    fn keep_number(&self, ino: u64) {
        let mut header = self.header.get();
        if ino < OBJECTS_MAX && header.next_object <= ino {
            header.next_object = ino + 1;
            self.set_header(header);
        }
    }

    /// Replay of the intent log: makes entry `name` of directory `dir` name
    /// `target` (None: removes it), with the cookie it had.
    pub(in crate::pool) async fn replay_entry(
        &self,
        dir: u64,
        name: &[u8],
        target: Option<EntryTarget>,
    ) -> Result<(), FsError> {
        let (dir_object, dir_znode) = match self.load_dir(dir).await {
            Ok(loaded) => loaded,
            // Removed from a directory freed since.
            Err(FsError::NotFound) if target.is_none() => return Ok(()),
            Err(error) => return Err(error),
        };
        let salt = dir_znode.hash_salt;
        dir::remove(&self.objects, &dir_object, salt, name).await?;
        if let Some(target) = target {
            dir::insert(
                &self.objects,
                &dir_object,
                salt,
                name,
                (target.object, target.kind),
                Some(target.cookie),
            )
            .await?;
        }
        Ok(())
    }

    /// Replay of the intent log: frees object `ino` (if it exists), as its
    /// last name going did. Its number is not handed out again.
    pub(in crate::pool) async fn replay_free(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
    ) -> Result<(), FsError> {
        self.keep_number(ino);
        match self.objects.open(ino).await {
            Ok(object) if ino != self.root() => self.free_object(pool, &object).await,
            Ok(_) => Err(FsError::Corrupt("the root freed".into())),
            Err(ObjectError::NoSuchObject(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Links a written block (or a hole) as block `blkid` of `object`;
    /// returns it as linked (born in the open txg).
    async fn link_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<BlockPointer, FsError> {
        self.prepare_link_or_release(pool, object, blkid, &pointer)
            .await?;
        self.link_cached(pool, object, blkid, pointer)
    }

    /// [`Filesystem::link_block`] for a written block of `size` bytes,
    /// unless the file's block size is no longer `size` when the link can
    /// be made (its one block grew in memory meanwhile, see `behind.rs`):
    /// then the block is let go and None returned. No await from the check
    /// to the link.
    async fn link_block_of_size(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: BlockPointer,
        size: u64,
    ) -> Result<Option<BlockPointer>, FsError> {
        self.prepare_link_or_release(pool, object, blkid, &pointer)
            .await?;
        if object.dnode().data_block_bytes() != size {
            release_unlinked(pool, &pointer);
            return Ok(None);
        }
        self.link_cached(pool, object, blkid, pointer).map(Some)
    }

    /// Loads what linking block `blkid` of `object` needs; on failure lets
    /// go of `pointer`'s block (written, never linked).
    async fn prepare_link_or_release(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: &BlockPointer,
    ) -> Result<(), FsError> {
        crate::pool::data::prepare_link(pool, &self.objects, object, blkid, pointer).await?;
        Ok(())
    }

    fn link_cached(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        mut pointer: BlockPointer,
    ) -> Result<BlockPointer, FsError> {
        // A file's blocks are all of its block size: a block of another
        // size would be read back short or long after a txg wrote it.
        debug_assert!(
            pointer.is_hole()
                || pointer.object_type != ObjectType::FsFile
                || u64::from(pointer.logical_size) == object.dnode().data_block_bytes(),
            "{} object {}: a block of {} bytes linked where blocks are {}",
            self.name,
            object.id,
            pointer.logical_size,
            object.dnode().data_block_bytes()
        );
        let txg = pool.txg.open();
        if !pointer.is_hole() {
            pointer.birth_txg = txg;
        }
        crate::pool::data::link(pool, &self.objects, object, &self.table, blkid, pointer)?;
        // An xattr object's block is logged as its owner's whole list.
        if object.dnode().object_type != ObjectType::FsXattr {
            self.log.note_linked(object.id, blkid, txg);
        }
        Ok(pointer)
    }

    /// Frees the blocks of file `ino` past `size` before a truncate to it
    /// takes the filesystem's lock exclusively, as OpenZFS frees a range
    /// before it sets the size: a slice ([`Filesystem::punch_slice`]) at a
    /// time, each under the lock shared, the file's whole-file lock and
    /// builds held off, all let go between slices. So the filesystem's
    /// other files are served while a large file is cut (a 3 GiB file of
    /// 16K records held them 175 ms), and the truncate's own step finds
    /// holes, passed whole, and frees only what was written meanwhile. A
    /// range of one slice or less is left to that step. A crash part way
    /// leaves the file its old size with holes where blocks were freed:
    /// the truncate had not returned.
    async fn free_ahead_of_truncate(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        size: u64,
    ) -> Result<(), FsError> {
        // Blocks from `first` to this are holes already.
        let mut next = 0;
        loop {
            pool.txg.throttle(pool).await;
            let shared = self.lock.acquire(1).await;
            if self.is_retired() || self.check_writable(pool).is_err() {
                return Ok(());
            }
            let (object, znode) = match self.load(ino).await {
                Ok(loaded) => loaded,
                Err(FsError::NotFound) => return Ok(()),
                Err(error) => return Err(error),
            };
            if !znode.is_regular() {
                // The truncate's own step says why it cannot be cut.
                return Ok(());
            }
            let file = self.files.whole(ino).await;
            let hold = pool.txg.hold_builds();
            let dnode = object.dnode();
            let block = dnode.data_block_bytes();
            let first = size.div_ceil(block);
            let end = dnode.length_bytes.div_ceil(block);
            if next == 0 && end.saturating_sub(first) <= FREE_BLOCKS_PER_TURN {
                return Ok(());
            }
            next = next.max(first);
            if next >= end {
                return Ok(());
            }
            next = self.punch_slice(pool, &object, next, end).await?;
            drop((hold, file, shared));
            pool.spill_dead(&self.table);
            crate::rt::yield_now().await;
        }
    }

    /// Cuts or extends `object` to `size` bytes. Blocks past the end become
    /// holes; the kept part of the last block past the end is zeroed, so an
    /// extension reads zeros.
    async fn truncate(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        size: u64,
    ) -> Result<(), FsError> {
        let old_size = object.dnode().length_bytes;
        if size < old_size {
            let block = object.dnode().data_block_bytes();
            let within = size % block;
            if within != 0 {
                let blkid = size / block;
                if let Some(old) = self
                    .read_block(object, blkid, self.settings.get().data_cache_use())
                    .await?
                {
                    let mut bytes = old.to_vec();
                    bytes[within as usize..].fill(0);
                    let pointer = self.write_block(pool, &bytes, ObjectType::FsFile).await?;
                    self.link_block(pool, object, blkid, pointer).await?;
                }
            }
            self.punch_range(pool, object, size.div_ceil(block), old_size.div_ceil(block))
                .await?;
        }
        object.dnode.borrow_mut().length_bytes = size;
        object.dirty.set(true);
        Ok(())
    }

    /// Holds changes to names and attributes off (as a lookup does).
    pub(in crate::pool) async fn shared(&self) -> crate::rt::sync::Permit {
        self.lock.acquire(1).await
    }

    /// Bytes allocated, logical and physical, of every block of every
    /// object and of the dnode table: what the filesystem refers to, with
    /// the changes no txg has written yet. The caller holds the lock
    /// ([`Filesystem::shared`]), so no object is made or freed meanwhile.
    /// O(objects loaded): the sums of the header (the table as the last
    /// build wrote it), with each changed object's figures in place of the
    /// table's; a header without sums (version 1, a snapshot taken before
    /// them) is walked.
    pub(in crate::pool) async fn referenced_locked(
        &self,
        pool: &Pool,
    ) -> Result<(u64, u64, u64), ObjectError> {
        if self.header.get().space.is_none() {
            return self.referenced_walked().await;
        }
        // No build moves changed objects into the table and the sums while
        // the table's figures are read.
        let _hold = pool.txg.hold_builds();
        let mut space = self.header.get().space.unwrap_or_default();
        let changed: Vec<Rc<Object>> = self
            .objects
            .dirty_objects()
            .into_iter()
            .filter(|object| !Rc::ptr_eq(object, &self.table))
            .collect();
        for object in changed {
            let offset = object.id * DNODE_BYTES as u64;
            self.objects
                .prefetch(&self.table, offset, DNODE_BYTES as u64)
                .await?;
            let old = table_dnode_space(&self.objects, &self.table, object.id)?;
            space.replace(old, dnode_space(&object.dnode()));
        }
        Ok(self.with_table_space(space))
    }

    /// [`Filesystem::referenced_locked`] by a walk of every object (a
    /// filesystem whose header predates the sums, and the check of them).
    pub async fn referenced_walked(&self) -> Result<(u64, u64, u64), ObjectError> {
        let space = self.objects_space_walked().await?;
        Ok(self.with_table_space(space))
    }

    /// The sums of the space of every object (not the table), walked:
    /// dnodes peeked, not loaded, so the walk does not undo the bound on
    /// loaded objects (`fs_objects_loaded_max`).
    async fn objects_space_walked(&self) -> Result<FsSpace, ObjectError> {
        let mut space = FsSpace::default();
        for ino in 1..self.header.get().next_object {
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            if let Some(dnode) = self.objects.peek_dnode(ino).await? {
                space.replace(FsSpace::default(), dnode_space(&dnode));
            }
        }
        Ok(space)
    }

    /// Objects' space `space` with the table's own added: what the
    /// filesystem refers to, allocated, logical and physical.
    fn with_table_space(&self, space: FsSpace) -> (u64, u64, u64) {
        let table = self.table.dnode();
        (
            table.used_bytes.wrapping_add(space.used),
            table.logical_bytes.wrapping_add(space.logical),
            table.physical_bytes.wrapping_add(space.physical),
        )
    }

    /// The counters of the filesystem's intent log (`fsync`).
    pub fn log_stats(&self) -> crate::pool::dataset::intent_log::LogStats {
        self.log.stats()
    }

    /// What its file I/O did since import.
    pub fn io_stats(&self) -> FsIoStats {
        self.io_stats.get()
    }

    fn count(&self, change: impl FnOnce(&mut FsIoStats)) {
        let mut stats = self.io_stats.get();
        change(&mut stats);
        self.io_stats.set(stats);
    }

    /// What its front end last reported.
    pub fn front_end(&self) -> FrontEndStats {
        self.front_end.borrow().clone()
    }

    /// The front end reports a change (its transport, a request).
    pub fn note_front_end(&self, change: impl FnOnce(&mut FrontEndStats)) {
        change(&mut self.front_end.borrow_mut());
    }

    /// Notes an `fsync` (or `fdatasync`) arriving: with the direct writes
    /// [`Filesystem::write`] notes, the cadence that tells
    /// [`Pool::fs_log_ahead`] whether the next `fsync` is expected.
    pub fn note_fsync_arrived(&self) {
        self.log.note_flush_arrived();
    }

    /// Whether this filesystem's client has called `fsync` after every
    /// single direct write lately, and the write just answered is the only
    /// one since its last `fsync`: [`Pool::fs_log_ahead`] would start.
    pub fn fsync_expected(&self) -> bool {
        self.log.flush_expected()
    }

    /// An `fsync` was made durable (counted as a volume's FLUSH is).
    pub fn count_flush(&self) {
        self.count(|stats| stats.flush_ops += 1);
    }

    /// Space and objects for `statfs`.
    pub fn stats(&self, pool: &Pool) -> FsStats {
        let (size_bytes, free_bytes) = pool.space();
        // The size leaves out what metadata may take; what is being freed
        // is available (a write waits for it), so it is no longer used.
        FsStats {
            total_bytes: size_bytes - free_bytes + pool.data_available_bytes(),
            available_bytes: pool.writable_bytes(),
            objects: self.header.get().objects,
        }
    }
}

/// Writes each filesystem's changed dnodes into its table (a step of the
/// txg build, before the pool's own objects are synced: the tables are
/// pool objects). Returns whether anything changed.
pub(in crate::pool) fn build_step(
    pool: &Pool,
    context: &mut crate::object::sync::SyncContext,
) -> Result<bool, ObjectError> {
    let mut changed = false;
    for fs in pool.datasets.filesystems.all() {
        let set = &fs.objects;
        let mut space = fs.header.get().space;
        for object in set.dirty_objects() {
            if Rc::ptr_eq(&object, &fs.table) || !object.dirty.get() {
                continue;
            }
            set.sync_object(&object, context)?;
            object.dirty.set(false);
            let dnode = object.dnode();
            let offset = object.id * DNODE_BYTES as u64;
            if let Some(space) = space.as_mut() {
                // What the table held for it (zeros for a new object).
                let old = table_dnode_space(&fs.objects, &fs.table, object.id)?;
                space.replace(old, dnode_space(&dnode));
            }
            let mut bytes = [0u8; DNODE_BYTES];
            dnode.encode(&mut bytes);
            set.write_bytes_cached(&fs.table, offset, &bytes)?;
            changed = true;
        }
        if space != fs.header.get().space {
            fs.set_space(space);
        }
        set.reset_dirty_bytes();
    }
    Ok(changed)
}

/// The space figures a dnode counts.
pub(in crate::pool) fn dnode_space(dnode: &Dnode) -> FsSpace {
    FsSpace {
        used: dnode.used_bytes,
        logical: dnode.logical_bytes,
        physical: dnode.physical_bytes,
    }
}

/// The space of object `id` as filesystem table `table` holds it now (its
/// block cached: the caller writes it next).
fn table_dnode_space(objects: &ObjectSet, table: &Object, id: u64) -> Result<FsSpace, ObjectError> {
    let bytes = objects.read_bytes_cached(table, id * DNODE_BYTES as u64, DNODE_BYTES)?;
    let dnode =
        Dnode::decode(&bytes).map_err(|error| ObjectError::Corrupt { object: id, error })?;
    Ok(dnode_space(&dnode))
}

impl Pool {
    /// Bytes of metadata nodes dirtied since the last txg build, the pool's
    /// and every filesystem's: what the next commit rewrites, so what the
    /// write throttle, early commits and the metadata reserve count.
    pub fn dirty_metadata_bytes(&self) -> u64 {
        self.objects.dirty_bytes() + self.datasets.filesystems.sum(|fs| fs.objects.dirty_bytes())
    }
}

/// True when no filesystem object has a change a txg build left out.
pub(in crate::pool) fn all_synced(pool: &Pool) -> bool {
    pool.datasets
        .filesystems
        .every(|fs| !fs.objects.any_dirty())
}

/// A txg is durable: nodes it wrote may now be evicted, and objects past
/// the `fs_objects_loaded_max` tunable (read again: `tune` may change it)
/// are let go, of heads and of the snapshots open (their objects in use
/// when they were loaded may go now).
pub(in crate::pool) fn txg_durable(pool: &Pool, txg: u64) {
    let keep = pool.tunables.borrow().fs_objects_loaded_max as usize;
    for fs in pool.datasets.filesystems.all() {
        fs.objects.set_durable_txg(txg);
        fs.objects.set_loaded_max(keep);
        fs.objects.evict_objects(keep);
    }
    for fs in pool.datasets.snapshot_filesystems.all() {
        fs.objects.set_loaded_max(keep);
        fs.objects.evict_objects(keep);
    }
}

impl Pool {
    /// Opens the filesystems of the directory (at import).
    pub(in crate::pool) async fn open_filesystems(&self) -> Result<(), PoolError> {
        let records: Vec<(String, FilesystemRecord)> = self
            .datasets
            .directory
            .read()
            .filesystems
            .iter()
            .map(|(name, record)| (name.clone(), record.clone()))
            .collect();
        for (short, record) in records {
            let table = self.objects.open(record.object).await?;
            let fs = self.open_head_filesystem(&short, table, &record).await?;
            self.datasets.filesystems.insert(short, fs);
        }
        Ok(())
    }

    /// Opens filesystem `short` (a head, writable) over `table`: loads the
    /// whole table (the txg build writes dnodes into it with no I/O) and
    /// its dead lists (metadata, kept cached as a volume's are).
    pub(in crate::pool) async fn open_head_filesystem(
        &self,
        short: &str,
        table: Rc<Object>,
        record: &FilesystemRecord,
    ) -> Result<Rc<Filesystem>, PoolError> {
        if table.dnode().object_type != ObjectType::FsObjects {
            return Err(PoolError::Corrupt(format!(
                "filesystem {short}: object {} is not a filesystem",
                record.object
            )));
        }
        let length = table.dnode().length_bytes;
        self.objects.prefetch(&table, 0, length).await?;
        table.dead_list.set(record.lineage.dead_list);
        for list in std::iter::once(record.lineage.dead_list)
            .chain(
                record
                    .lineage
                    .snapshots
                    .iter()
                    .map(|snapshot| snapshot.dead_list),
            )
            .filter(|list| *list != 0)
        {
            let list_object = self.objects.open(list).await?;
            self.objects.load_dead_list(&list_object).await?;
        }
        let settings = self.volume_settings(&record.properties);
        let fs = Filesystem::open(
            self,
            format!("{}/{short}", self.name),
            table,
            record,
            settings,
            false,
        )?;
        if fs.header.get().space.is_none() {
            // A header from before the sums (version 1): they are taken
            // once, from the table (no object is loaded yet, nothing changed
            // in it), and kept by the txg builds from now on.
            let space = fs.objects_space_walked().await?;
            fs.set_space(Some(space));
        }
        Ok(fs)
    }

    /// Adds filesystem `short` over `table` (a new object of the open txg)
    /// to the directory and opens it.
    pub(in crate::pool) async fn add_filesystem(
        &self,
        short: &str,
        table: Rc<Object>,
        properties: BTreeMap<String, String>,
        lineage: crate::pool::dataset::directory::Lineage,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let record = FilesystemRecord {
            object: table.id,
            created_txg: self.txg.open(),
            guid: crate::format::new_guid(),
            properties,
            lineage,
            receive: None,
            intent_log: None,
        };
        let fs = self.open_head_filesystem(short, table, &record).await?;
        self.datasets
            .directory
            .edit()
            .filesystems
            .insert(short.to_string(), record);
        self.datasets
            .filesystems
            .insert(short.to_string(), fs.clone());
        Ok(fs)
    }

    /// A rollback gave filesystem `short` another tree: `old` serves no
    /// more requests, and a new `Filesystem` over the same table takes its
    /// place (the server mounts it again).
    pub(in crate::pool) async fn reopen_filesystem(
        &self,
        short: &str,
        old: &Filesystem,
    ) -> Result<Rc<Filesystem>, PoolError> {
        old.retire();
        // The old tree's log describes changes to it, not to the one opened
        // in its place (the caller holds the old one exclusively: no commit
        // is writing).
        self.abandon_log_chain(crate::pool::dataset::intent_log::Owner::Filesystem(old));
        let record = self
            .filesystem_record(short)
            .ok_or_else(|| PoolError::Corrupt(format!("filesystem {short} has no record")))?;
        let fs = self
            .open_head_filesystem(short, old.table.clone(), &record)
            .await?;
        self.datasets
            .filesystems
            .insert(short.to_string(), fs.clone());
        Ok(fs)
    }

    /// The read-only filesystem of snapshot `POOL/FS@SNAP` (what
    /// `.zfs/snapshot/SNAP` shows), opened on first use and kept (at most
    /// [`SNAPSHOT_FILESYSTEMS_OPEN_MAX`] at once).
    pub async fn snapshot_filesystem(
        self: &Rc<Self>,
        full_name: &str,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let (short, snapshot) =
            crate::pool::dataset::snapshot::split_snapshot_name(&self.name, full_name)
                .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.to_string()))?;
        let canonical = format!("{}/{short}@{snapshot}", self.name);
        if let Some(fs) = self.datasets.snapshot_filesystems.get(&canonical) {
            return Ok(fs);
        }
        let record = self
            .filesystem_record(short)
            .ok_or_else(|| PoolError::NoSuchSnapshot(canonical.clone()))?;
        let object = record
            .lineage
            .snapshot(snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(canonical.clone()))?
            .object;
        let table = self.objects.open(object).await?;
        let settings = self.volume_settings(&record.properties);
        let fs = Filesystem::open(self, canonical.clone(), table, &record, settings, true)?;
        // Another request may have opened it while this one read: that one
        // is kept. Only a cache: a request still using one let go keeps it.
        Ok(self.datasets.snapshot_filesystems.insert_bounded(
            canonical,
            fs,
            SNAPSHOT_FILESYSTEMS_OPEN_MAX,
        ))
    }

    /// Wakes the server's mount keeper: a filesystem was made, destroyed,
    /// cloned or rolled back.
    pub(in crate::pool) fn notify_filesystems_changed(&self) {
        self.datasets.filesystems_changed.notify_all();
    }

    /// Frees every filesystem's files left unlinked while open by a crash
    /// (at import, before anything is served); notes how many.
    pub(in crate::pool) async fn reclaim_unlinked(self: &Rc<Self>) -> Result<(), PoolError> {
        for (short, fs) in self.filesystems() {
            let freed = fs
                .reclaim_unlinked(self)
                .await
                .map_err(|error| PoolError::Corrupt(format!("filesystem {short}: {error}")))?;
            if freed > 0 {
                self.import_notes.borrow_mut().push(format!(
                    "filesystem {short}: freed {freed} objects removed while in use before the last shutdown"
                ));
            }
        }
        Ok(())
    }

    /// The filesystem named `POOL/NAME` (or `NAME`).
    pub fn filesystem(&self, name: &str) -> Result<Rc<Filesystem>, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name);
        self.datasets
            .filesystems
            .get(short)
            .ok_or_else(|| PoolError::InvalidArgument(format!("no filesystem '{name}'")))
    }

    /// Every filesystem users see, by short name (not the hidden ones of
    /// receives in progress: see [`Pool::all_filesystems`]).
    pub fn filesystems(&self) -> Vec<(String, Rc<Filesystem>)> {
        self.datasets
            .filesystems
            .named()
            .into_iter()
            .filter(|(name, _)| !crate::pool::is_hidden_dataset(name))
            .collect()
    }

    /// Every filesystem, the hidden ones of receives in progress too (they
    /// hold space a check must account for).
    pub fn all_filesystems(&self) -> Vec<(String, Rc<Filesystem>)> {
        self.datasets.filesystems.named()
    }

    /// The directory record of filesystem `short`.
    pub fn filesystem_record(&self, short: &str) -> Option<FilesystemRecord> {
        self.datasets
            .directory
            .read()
            .filesystems
            .get(short)
            .cloned()
    }

    /// Creates a filesystem with an empty root directory.
    pub async fn create_filesystem(
        self: &Rc<Self>,
        name: &str,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let short = self.new_dataset_short_name(name)?;
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.check_name_free(&short)?;
        let mut checked = BTreeMap::new();
        for (key, value) in &properties {
            let value = crate::pool::dataset::props::validate_filesystem(key, value)?;
            checked.insert(key.clone(), value);
        }
        self.txg.ensure_writable()?;
        let settings = self.volume_settings(&checked);
        let open_txg = self.txg.open();
        let id = self.allocate_object_id();
        let mut dnode = new_dnode(
            ObjectType::FsObjects,
            TABLE_BLOCK_SHIFT,
            INDIRECT_BLOCK_SHIFT,
            0,
            open_txg,
        );
        dnode.checksum_algo = settings.checksum;
        dnode.bonus = FsHeader {
            root: ROOT_OBJECT,
            next_object: ROOT_OBJECT + 1,
            unlinked_object: 0,
            objects: 1,
            // An empty table: the sums start at zero, and each txg build
            // adds what it writes into the table.
            space: Some(FsSpace::default()),
        }
        .encode();
        let table = self.objects.create(id, dnode);
        let fs = self
            .add_filesystem(&short, table, checked, Default::default())
            .await?;
        let time = now();
        let root = Znode {
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            parent: ROOT_OBJECT,
            generation: ROOT_OBJECT,
            atime: time,
            mtime: time,
            ctime: time,
            birth: time,
            rdev: 0,
            entries: 0,
            hash_salt: crate::format::new_guid(),
            xattr_object: 0,
        };
        let root_object = fs.new_object(self, ROOT_OBJECT, true, &root);
        dir::init(&fs.objects, &root_object)
            .await
            .map_err(|error| PoolError::Io(error.to_string()))?;
        self.commit().await?;
        self.datasets.filesystems_changed.notify_all();
        Ok(fs)
    }

    /// Creates the hidden filesystem a full stream is received into
    /// (`TARGET%recv`): a dnode table with the stream's header and no
    /// objects yet, with `properties` (checked). The caller holds the
    /// admin lock.
    pub(in crate::pool) async fn create_receive_filesystem(
        &self,
        hidden_short: &str,
        info: &crate::format::stream::FsStreamInfo,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        self.txg.ensure_writable()?;
        let id = self.allocate_object_id();
        let mut dnode = new_dnode(
            ObjectType::FsObjects,
            TABLE_BLOCK_SHIFT,
            INDIRECT_BLOCK_SHIFT,
            0,
            self.txg.open(),
        );
        dnode.checksum_algo = self.volume_settings(&properties).checksum;
        dnode.bonus = Filesystem::receive_header(info).encode();
        let table = self.objects.create(id, dnode);
        self.add_filesystem(hidden_short, table, properties, Default::default())
            .await
    }

    /// Destroys a filesystem and frees its blocks; with `recursive`, its
    /// snapshots too (which it refuses without). A snapshot with clones
    /// keeps it: destroy or promote the clones first.
    pub async fn destroy_filesystem(
        self: &Rc<Self>,
        name: &str,
        recursive: bool,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let fs = self.filesystem(name)?;
        let short = fs.name.rsplit('/').next().unwrap_or_default().to_string();
        let record = self
            .filesystem_record(&short)
            .ok_or_else(|| PoolError::Corrupt(format!("filesystem {short} has no record")))?;
        let snapshots = self.snapshots_to_destroy(name, &short, &record.lineage, recursive)?;
        let _exclusive = fs.lock.acquire(LOCK_UNITS).await;
        let hold = self.txg.hold_builds();
        for snapshot in snapshots.iter().rev() {
            self.destroy_snapshot_locked(snapshot).await?;
        }
        // Blocks born after the origin are its own (all of them when it is
        // not a clone); older ones, and its dead list, are the origin's.
        let origin_txg = fs.table.dnode().origin_txg;
        let pointers = self
            .pointers_born_after(&fs.table, Some(&fs), origin_txg)
            .await?;
        self.free_in_slices(&pointers).await;
        fs.table.dead.borrow_mut().clear();
        self.drop_dead_list(fs.table.dead_list.replace(0))?;
        self.objects.clear_dnode(fs.table.id).await?;
        fs.retire();
        self.abandon_log_chain(crate::pool::dataset::intent_log::Owner::Filesystem(&fs));
        self.datasets.filesystems.remove(&short);
        {
            let mut directory = self.datasets.directory.edit();
            directory.filesystems.remove(&short);
            if let Some(origin) = &record.lineage.origin {
                if let Some(lineage) = directory.lineage_mut(&origin.volume) {
                    for snapshot in lineage.snapshots.iter_mut() {
                        snapshot.clones.retain(|clone| clone != &short);
                    }
                }
            }
        }
        drop(hold);
        let committed = self.commit().await;
        self.datasets.filesystems_changed.notify_all();
        committed
    }

    /// Where filesystem `short` is mounted by this server, if it is.
    pub fn mounted_at(&self, short: &str) -> Option<String> {
        self.mounts.borrow().mounted.get(short).cloned()
    }

    /// Whether filesystem `short` should be mounted: an administrator's
    /// `unmount` holds it off until `mount` (or the next `serve`).
    pub fn mount_wanted(&self, short: &str) -> bool {
        !self.mounts.borrow().held_off.contains(short)
    }

    /// The server mounted filesystem `short` at `path` (None: unmounted it).
    pub fn note_mount(&self, short: &str, path: Option<String>) {
        let mut mounts = self.mounts.borrow_mut();
        match path {
            Some(path) => mounts.mounted.insert(short.to_string(), path),
            None => mounts.mounted.remove(short),
        };
        drop(mounts);
        self.mounts_noted.notify_all();
    }

    /// `ironpool mount` (`wanted`) or `unmount` of filesystem `name`: asks
    /// the server to mount or unmount it and waits until it did, up to
    /// [`MOUNT_WAIT_SECONDS`]. Returns where it is mounted.
    pub async fn set_mounted(&self, name: &str, wanted: bool) -> Result<Option<String>, PoolError> {
        let fs = self.filesystem(name)?;
        let short = fs.name.rsplit('/').next().unwrap_or_default().to_string();
        if wanted {
            let properties = self
                .filesystem_record(&short)
                .map(|record| record.properties)
                .unwrap_or_default();
            if mountpoint(&self.name, &short, &properties).is_none() {
                return Err(PoolError::InvalidArgument(format!(
                    "{name} has mountpoint=none or legacy: set a mountpoint first"
                )));
            }
        }
        {
            let mut mounts = self.mounts.borrow_mut();
            if wanted {
                mounts.held_off.remove(&short);
            } else {
                mounts.held_off.insert(short.clone());
            }
        }
        self.datasets.filesystems_changed.notify_all();
        let deadline =
            crate::rt::now().saturating_add(std::time::Duration::from_secs(MOUNT_WAIT_SECONDS));
        loop {
            let noted = self.mounts_noted.notified();
            let at = self.mounted_at(&short);
            if at.is_some() == wanted {
                return Ok(at);
            }
            if crate::rt::now() >= deadline {
                return Err(PoolError::Io(format!(
                    "{name} is not {} after {MOUNT_WAIT_SECONDS} s (is the pool served by `ironpool serve`? see its log)",
                    if wanted { "mounted" } else { "unmounted" }
                )));
            }
            let _ = crate::rt::timeout(std::time::Duration::from_millis(200), noted).await;
        }
    }

    /// Completes once a filesystem is created or destroyed after the call
    /// (the server mounts and unmounts them).
    pub fn filesystems_changed(&self) -> crate::rt::sync::Notified<'_> {
        self.datasets.filesystems_changed.notified()
    }
}

/// The bytes of `pieces`, in order, in one vector.
fn concat(pieces: &[BufSlice]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(|piece| piece.len()).sum());
    for piece in pieces {
        out.extend_from_slice(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::sim::SimDevice;
    use crate::dev::Device;
    use crate::format::label::TopVdevKind;
    use crate::pool::{NewDevice, NewTopVdev, PoolTunables};
    use crate::rt::Runtime;

    fn named(disks: &[Rc<SimDevice>]) -> Vec<(String, Rc<dyn Device>)> {
        disks
            .iter()
            .enumerate()
            .map(|(index, disk)| (format!("sim:d{index}"), disk.clone() as Rc<dyn Device>))
            .collect()
    }

    async fn mirror_pool(disks: &[Rc<SimDevice>], tunables: PoolTunables) -> Rc<Pool> {
        let layout = vec![NewTopVdev {
            log: false,
            kind: TopVdevKind::Mirror,
            devices: named(disks)
                .into_iter()
                .map(|(path, device)| NewDevice { path, device })
                .collect(),
        }];
        Pool::create_on_devices("tank", layout, false, tunables)
            .await
            .unwrap()
    }

    /// The blocks a truncate freed ahead are passed a run at a time when
    /// its exclusive step walks them again: a run of hole pointers in one
    /// indirect node is one span, up to the node's end or to a block that
    /// holds data. (Passed a block at a time, a 3 GiB file of 16K records
    /// held its filesystem for 30 ms.)
    #[test]
    fn a_run_of_holes_in_an_indirect_node_is_one_span() {
        let disks: Vec<Rc<SimDevice>> = (0..2)
            .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 42 + index))
            .collect();
        Runtime::new_sim(42).block_on(async move {
            let pool = mirror_pool(&disks, PoolTunables::default()).await;
            let properties = BTreeMap::from([("recordsize".to_string(), "4K".to_string())]);
            let fs = pool.create_filesystem("tank/fs", properties).await.unwrap();
            let mode = NewObject::owned(S_IFREG | 0o644, 0, 0);
            let file = fs.create(&pool, fs.root(), b"f", &mode).await.unwrap();
            let (object, _) = fs.load(file.ino).await.unwrap();
            let per_node = 1u64 << object.dnode().pointers_per_indirect_shift();
            let blocks = per_node * 2 + 52;
            fs.write(&pool, file.ino, 0, &vec![5; blocks as usize * 4096])
                .await
                .unwrap();
            pool.commit().await.unwrap();
            let span = |blkid| {
                let (fs, object) = (fs.clone(), object.clone());
                async move { fs.objects.hole_span(&object, blkid).await.unwrap() }
            };
            assert_eq!(span(0).await, 0, "written");

            // Freed in the open txg: the indirect nodes are in memory, full
            // of holes, and still linked above.
            fs.punch_range(&pool, &object, 0, blocks).await.unwrap();
            assert_eq!(span(0).await, per_node, "the first node's run");
            assert_eq!(span(per_node - 10).await, 10, "the rest of the run");
            assert_eq!(span(per_node).await, per_node, "the second node's run");

            // A block written since ends the run before it.
            let written = per_node + 100;
            fs.write(&pool, file.ino, written * 4096, &[6; 4096])
                .await
                .unwrap();
            pool.commit().await.unwrap();
            assert_eq!(span(per_node).await, 100, "up to the written block");
            assert_eq!(span(written).await, 0, "the written block");
            assert_eq!(span(written + 1).await, per_node - 101, "after it");
            assert!(span(0).await >= per_node, "committed holes");
            let read = fs.read(&pool, file.ino, written * 4096, 4096, false);
            assert_eq!(read.await.unwrap(), vec![6; 4096]);
        });
    }

    /// A filesystem whose header predates the space sums (version 1) is
    /// walked once at import, and from then on keeps sums equal to a walk
    /// (which the space check compares), written as a version 2 header.
    #[test]
    fn a_header_without_space_sums_gets_them_at_import() {
        let disks: Vec<Rc<SimDevice>> = (0..2)
            .map(|index| SimDevice::new(&format!("d{index}"), 256 << 20, 40 + index))
            .collect();
        let tunables = || PoolTunables {
            txg_timeout: std::time::Duration::from_secs(60),
            ..PoolTunables::default()
        };
        let walked = Runtime::new_sim(40).block_on({
            let disks = disks.clone();
            async move {
                let pool = mirror_pool(&disks, tunables()).await;
                let fs = pool
                    .create_filesystem("tank/fs", BTreeMap::new())
                    .await
                    .unwrap();
                for index in 0..40u32 {
                    let name = format!("f{index}");
                    let attr = fs
                        .create(
                            &pool,
                            fs.root(),
                            name.as_bytes(),
                            &NewObject::owned(S_IFREG | 0o644, 0, 0),
                        )
                        .await
                        .unwrap();
                    let data = vec![index as u8; 1000 * index as usize + 1];
                    fs.write(&pool, attr.ino, 0, &data).await.unwrap();
                }
                pool.commit().await.unwrap();
                // As a header of an older ironpool left it.
                fs.write_header(FsHeader {
                    space: None,
                    ..fs.header.get()
                });
                pool.commit().await.unwrap();
                assert_eq!(fs.table.dnode().bonus.0[0], 1, "a version 1 header");
                let walked = fs.referenced_walked().await.unwrap();
                assert_eq!(fs.referenced_locked(&pool).await.unwrap(), walked);
                pool.export().await.unwrap();
                walked
            }
        });
        Runtime::new_sim(41).block_on(async move {
            let pool = Pool::import_from_devices("tank", named(&disks), tunables())
                .await
                .unwrap();
            let fs = pool.filesystem("tank/fs").unwrap();
            let space = fs.header.get().space.expect("sums taken at import");
            assert_eq!(
                (
                    fs.table.dnode().used_bytes + space.used,
                    fs.table.dnode().logical_bytes + space.logical,
                    fs.table.dnode().physical_bytes + space.physical
                ),
                walked
            );
            // Kept from now on: a file removed, one grown.
            fs.remove(&pool, fs.root(), b"f3", false).await.unwrap();
            let grown = fs.lookup(fs.root(), b"f7").await.unwrap();
            fs.write(&pool, grown.ino, 0, &vec![9u8; 300_000])
                .await
                .unwrap();
            // Before a txg writes them, the figures count the changes too.
            assert_eq!(
                fs.referenced_locked(&pool).await.unwrap(),
                fs.referenced_walked().await.unwrap()
            );
            assert!(fs.referenced_locked(&pool).await.unwrap().0 > walked.0);
            let report = pool.check_space().await.unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);
            assert_eq!(fs.table.dnode().bonus.0[0], 2, "a version 2 header");
            assert_eq!(
                fs.referenced_locked(&pool).await.unwrap(),
                fs.referenced_walked().await.unwrap()
            );
        });
    }
}
