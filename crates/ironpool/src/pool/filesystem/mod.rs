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
//! The files of this folder: the filesystem and its objects here; the
//! locks of a file's blocks in `locks.rs`; what it reports (`iostat`,
//! `statfs`) in `stats.rs`; which writes are held or made durable first,
//! and `fsync`, in `sync.rs`; its own properties in `dataset::props::filesystem`; names (lookup, create, link, remove, rename, readdir,
//! setattr) in `names.rs`; the lives of objects (the kernel's holds,
//! removed objects freed at the last one) in `lives.rs`; a file's data
//! (reads, writes, links of written blocks, truncation) in `data.rs`; buffered writes written behind in `behind.rs`; what the
//! intent log's replay applies in `replay.rs`; the pool's side (open at
//! import, create, destroy, snapshot, mounts) in `manage.rs`; extended
//! attributes in `xattr.rs`; send and receive of a filesystem in
//! `stream.rs`; the kernel's holds on removed files in `holds.rs`.
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

mod acl;
mod attrs;
mod behind;
mod clone;
mod data;
mod diff;
pub mod dir;
mod holds;
pub mod id_space;
mod lives;
mod locks;
mod manage;
mod names;
mod replay;
mod stats;
mod stream;
mod sync;
pub mod xattr;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::format::dnode::DNODE_BYTES;
use crate::format::fsdir;
use crate::format::intent_log::{EntryTarget, ObjectState};
use crate::format::znode::{FsHeader, FsSpace, Timestamp, Znode, S_ISGID, S_ISUID, S_IXGRP};
use crate::format::{Dnode, ObjectType};
use crate::object::{Object, ObjectError, ObjectSet};
pub use crate::pool::dataset::directory::FilesystemRecord;
use crate::pool::dataset::intent_log::IntentLog;
pub use crate::pool::dataset::props::filesystem::{
    default_mountpoint, mountpoint, own_property_default, record_bytes, validate_own_property,
    OWN_PROPERTIES, RECORD_BYTES_DEFAULT, RECORD_BYTES_MAX, RECORD_BYTES_MIN,
};
use crate::pool::dataset::props::VolumeSettings;
use crate::pool::{Pool, PoolError, INDIRECT_BLOCK_SHIFT};
use crate::rt::buf::BufSlice;
pub use attrs::{check_open, DataChange};
pub use diff::{DiffEntry, DiffReport, DIFF_ENTRIES_MAX};
use holds::Holds;
pub use holds::SessionId;
use locks::FileLocks;
use rustc_hash::FxHashSet;
pub use stats::{FrontEndStats, FsIoStats, FsStats, OpStats};
pub use sync::{Answering, RequestKind};

/// The root directory's object number.
pub const ROOT_OBJECT: u64 = 1;
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

/// What a change that adds a name or an object counts against the
/// filesystem's quota until its txg is built (`dataset::quota`): the
/// metadata it adds in the usual case, a dnode and a directory entry with
/// their metadata copies, rounded up (1.5 KiB measured per empty file made
/// in a loop). Not [`NAME_CHANGE_CLAIM_BYTES`], the worst case: counted
/// per change for a whole txg, that refused creates in a filesystem half
/// under its quota.
const NAME_CHANGE_QUOTA_BYTES: u64 = 2 << 10;

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
    /// An operation this filesystem does not offer in this form (an
    /// `fallocate` mode), where ENOSYS would make the kernel stop asking.
    #[error("operation not supported: {0}")]
    Unsupported(String),
    /// `SEEK_DATA` at or past the last data, `SEEK_HOLE` past the end.
    #[error("no data or hole at or after the offset")]
    NoData,
    /// An ioctl this filesystem does not answer.
    #[error("inappropriate ioctl for device")]
    NotTty,
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
            FsError::Pool(PoolError::QuotaExceeded(_)) => libc::EDQUOT,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::TooBig => libc::EFBIG,
            FsError::ReadOnly | FsError::Pool(PoolError::ReadOnly(_)) => libc::EROFS,
            FsError::NotSupported => libc::ENOSYS,
            FsError::CrossDevice => libc::EXDEV,
            FsError::NoAttribute => libc::ENODATA,
            FsError::XattrsOff => libc::EOPNOTSUPP,
            FsError::Range => libc::ERANGE,
            FsError::NoData => libc::ENXIO,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            FsError::Stale => libc::ESTALE,
            FsError::NotTty => libc::ENOTTY,
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
    /// The kernel's own ctime of a regular file, which it keeps with the
    /// writeback cache; else the change's time.
    pub ctime: Option<Timestamp>,
    /// Whether a time was given by the caller (`utimensat` with times),
    /// not taken as now: an append-only file refuses only the former.
    pub explicit_times: bool,
    /// The size change is an `fallocate` growing the file, which an
    /// append-only file allows (a truncate it refuses).
    pub allocating: bool,
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
    /// The creator's umask, when the server applies it (a mount with
    /// POSIX ACLs: the kernel leaves it to the filesystem, which applies
    /// the directory's default ACL instead when it has one). None: the
    /// kernel applied it.
    pub umask: Option<u32>,
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
            umask: None,
        }
    }
}

/// An open filesystem.
pub struct Filesystem {
    /// `POOL/NAME`; `rename` changes it.
    name_cell: RefCell<String>,
    /// The pool-level object holding the dnode table.
    pub table: Rc<Object>,
    /// Its own objects.
    pub objects: Rc<ObjectSet>,
    pub(in crate::pool) header: Cell<FsHeader>,
    settings: Cell<VolumeSettings>,
    /// `xattr=on` (the default): extended attributes are served.
    xattrs: Cell<bool>,
    /// `acltype=posix`: POSIX ACLs are kept (as extended attributes the
    /// kernel checks, see `acl`).
    acls: Cell<bool>,
    /// `writebackcache=on`: a mount lets the kernel's page cache hold
    /// buffered writes and send them later, in pages
    /// (`FUSE_WRITEBACK_CACHE`). Off by default: with it, a write past a
    /// quota or into a full pool is refused only when the kernel sends
    /// it, so `write()` succeeds and `fsync` or `close` reports the
    /// error (as on NFS), where OpenZFS refuses the `write()` itself.
    writeback_cache: Cell<bool>,
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
    /// Where the kernel may hold writes to this filesystem in its page
    /// cache, not yet sent (mounts with the kernel's writeback cache): the
    /// mountpoint of each such session. Few: a mount, and for a while the
    /// one it replaced.
    kernel_caches: RefCell<Vec<(SessionId, std::path::PathBuf)>>,
    /// Rolled back or destroyed: another `Filesystem` (or none) serves its
    /// name now, and this one answers every request with `ESTALE`.
    retired: Cell<bool>,
    /// A walk for files left unlinked by a crash met some whose attributes
    /// are sealed and the key not loaded: they are freed when it is
    /// ([`Filesystem::reclaim_unlinked`]).
    pub(in crate::pool) orphans_sealed: Cell<bool>,
    /// A snapshot's (read-only; its `.zfs/snapshot` directory).
    snapshot: bool,
    /// Its intent log: what `fsync` writes (see `pool::dataset::intent_log`).
    pub(in crate::pool) log: IntentLog,
    /// Buffered writes answered and not yet linked (`behind.rs`).
    behind: behind::WrittenBehind,
    /// Its space figures for its quota and reservation (`dataset::quota`).
    pub(crate) usage: crate::pool::dataset::quota::UsageEstimate,
    /// Its users' and groups' space and quotas (`id_space`).
    ids: id_space::IdSpace,
    /// An encrypted filesystem's key (by guid, in the pool's ring of
    /// loaded keys): its files', links' and extended attributes' blocks
    /// are sealed on the data path, its directories' by its object set.
    /// None for one that is not encrypted.
    key: Option<crate::object::SetKey>,
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

/// How long [`Filesystem::flush_kernel_caches`] waits for one mount's
/// kernel to write its cached pages back: a pool whose devices stopped
/// answering must not hold a snapshot command or a stopping server for
/// ever. The kernel writes a mount's dirty pages (at most a fifth of
/// memory by its own limits) well within it at any speed this pool
/// serves.
const KERNEL_FLUSH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// `syncfs(2)` of the filesystem mounted at `path`: the kernel writes its
/// dirty pages there back, and returns when they are written.
fn sync_mounted(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let directory = std::fs::File::open(path)?;
    // SAFETY: a descriptor this function owns, open for the call.
    if unsafe { libc::syncfs(directory.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn now() -> Timestamp {
    Timestamp::from_ns(crate::rt::file_clock_ns())
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
        let key = record.crypt.as_ref().map(|crypt| crate::object::SetKey {
            ring: pool.datasets.keys.ring(),
            guid: crypt.key_guid,
            sealed_bonuses: header.sealed_bonuses,
        });
        let log = IntentLog::default();
        if let Some(key) = &key {
            objects.set_key(key.clone());
            // Names, attributes and bytes would be in the clear in the log.
            log.set_encrypted();
        }
        let fs = Rc::new(Filesystem {
            name_cell: RefCell::new(name),
            table,
            objects,
            header: Cell::new(header),
            settings: Cell::new(settings),
            xattrs: Cell::new(true),
            acls: Cell::new(false),
            writeback_cache: Cell::new(false),
            atime: Cell::new(true),
            record_shift: Cell::new(0),
            lock: crate::rt::sync::Semaphore::new(LOCK_UNITS),
            files: FileLocks::default(),
            holds: Holds::default(),
            orphans: RefCell::default(),
            io_stats: Cell::default(),
            front_end: RefCell::default(),
            kernel_caches: RefCell::default(),
            retired: Cell::new(false),
            orphans_sealed: Cell::new(false),
            snapshot,
            log,
            behind: behind::WrittenBehind::default(),
            usage: Default::default(),
            ids: Default::default(),
            key,
        });
        // What it inherits from the filesystems above it counts as its
        // own where it sets nothing (a snapshot: its dataset's).
        let name = fs.name();
        let dataset = name.split('@').next().unwrap_or_default();
        let short = dataset.split_once('/').map(|(_, short)| short);
        fs.apply_properties(
            settings,
            &pool.effective_properties(short.unwrap_or_default(), &record.own_properties()),
        );
        Ok(fs)
    }

    /// Takes the filesystem out of service: a rollback or a destroy
    /// replaced or removed it. The caller holds it exclusively (no request
    /// is half done); later requests get `ESTALE`.
    pub(in crate::pool) fn retire(&self) {
        self.retired.set(true);
    }

    /// The guid of an encrypted filesystem's key (None: not encrypted).
    pub fn key_guid(&self) -> Option<u64> {
        self.key.as_ref().map(|key| key.guid)
    }

    /// The loaded key that opens this filesystem's blocks: None when it is
    /// not encrypted, an error when its key is not loaded.
    pub(crate) fn data_key(&self) -> Result<Option<Rc<crate::crypto::DatasetKey>>, PoolError> {
        match &self.key {
            None => Ok(None),
            Some(key) => key.ring.get(key.guid).map(Some).ok_or_else(|| {
                PoolError::KeyUnavailable(format!(
                    "{} is encrypted and its key is not loaded",
                    self.name()
                ))
            }),
        }
    }

    /// `POOL/A/B` (a snapshot's: `POOL/A/B@SNAP`): what mounts and
    /// messages name.
    pub fn name(&self) -> String {
        self.name_cell.borrow().clone()
    }

    /// Gives the filesystem its name after a `rename`.
    pub(in crate::pool) fn set_name(&self, name: String) {
        *self.name_cell.borrow_mut() = name;
    }

    /// `A/B` of `POOL/A/B`: its key in the directory.
    pub fn short_name(&self) -> String {
        let name = self.name_cell.borrow();
        name.split_once('/')
            .map(|(_, short)| short.to_string())
            .unwrap_or_else(|| name.clone())
    }

    /// Takes the filesystem's lock for a change the intent log carries:
    /// the caller saves attributes with [`Change::save`] and notes entries
    /// with [`Change::note_entry`].
    async fn logged_change<'a>(&'a self, pool: &'a Pool) -> Change<'a> {
        Change {
            fs: self,
            pool,
            touched: RefCell::default(),
            _permit: self.exclusive().await,
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
        self.ids.apply(properties);
        self.xattrs.set(on("xattr"));
        self.acls
            .set(properties.get("acltype").map(String::as_str) == Some("posix"));
        self.atime.set(on("atime") && !self.snapshot);
        self.writeback_cache.set(
            properties.get("writebackcache").map(String::as_str) == Some("on") && !self.snapshot,
        );
    }

    /// Whether a mount lets the kernel cache buffered writes
    /// (`writebackcache=on`; fixed for a mount at its start).
    pub fn writeback_cache(&self) -> bool {
        self.writeback_cache.get()
    }

    /// Whether POSIX ACLs are kept (`acltype=posix`, with `xattr=on`): a
    /// mount then asks the kernel to check them.
    pub fn posix_acls(&self) -> bool {
        self.acls.get() && self.xattrs.get()
    }

    /// Holds every operation of the filesystem off (a space check walks
    /// its trees meanwhile, a change the log carries, a destroy). The
    /// write-outs queued hold the lock shared: they begin now.
    pub(in crate::pool) async fn exclusive(&self) -> crate::rt::sync::Permit {
        self.behind.hurry();
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
        let object = self.load_object(ino).await?;
        let bonus = object.dnode().bonus;
        if crate::format::sealed_bonus::is_sealed(&bonus) {
            return Err(FsError::Pool(PoolError::KeyUnavailable(format!(
                "{}: object {ino}: its attributes are sealed (its key is not loaded, or they failed their MAC when it was)",
                self.name()
            ))));
        }
        let znode = Znode::decode(&bonus)
            .map_err(|error| FsError::Corrupt(format!("{} object {ino}: {error}", self.name())))?;
        Ok((object, znode))
    }

    /// Object `ino`, a file, directory or link (not the table, nor an
    /// object holding extended attributes), its attributes not read.
    async fn load_object(&self, ino: u64) -> Result<Rc<Object>, FsError> {
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
        if Rc::ptr_eq(&object, &self.table) || object.object_type() == ObjectType::FsXattr {
            return Err(FsError::NotFound);
        }
        Ok(object)
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

    /// Holds changes to names and attributes off (as a lookup does).
    pub(in crate::pool) async fn shared(&self) -> crate::rt::sync::Permit {
        self.lock.acquire(1).await
    }

    /// [`Filesystem::shared`] if it is free now (no exclusive holder or
    /// waiter): for a look at another filesystem from inside one's own
    /// operation, which must not wait for it (a `check` holding it
    /// exclusively may be waiting for ours).
    pub(in crate::pool) fn try_shared(&self) -> Option<crate::rt::sync::Permit> {
        self.lock.try_acquire(1)
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

    /// What the filesystem referred to when the last txg was built (its
    /// header's sums, with the dnode table's own space as it is now), read
    /// without its lock: what a quota check counts for it while another
    /// holds the lock (see `Pool::bound_busy`). None for a header without
    /// sums.
    pub(in crate::pool) fn referenced_at_last_build(&self) -> Option<u64> {
        let space = self.header.get().space?;
        Some(self.with_table_space(space).0)
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

    /// Session `id`, mounted at `mountpoint`, lets the kernel cache
    /// writes (the writeback cache): [`Filesystem::flush_kernel_caches`]
    /// has them sent.
    pub fn add_kernel_cache(&self, id: SessionId, mountpoint: &std::path::Path) {
        let mut caches = self.kernel_caches.borrow_mut();
        caches.retain(|(session, _)| *session != id);
        caches.push((id, mountpoint.to_path_buf()));
    }

    /// Session `id` is off its mountpoint (or ended): nothing reaches its
    /// cache by that path any more.
    pub fn remove_kernel_cache(&self, id: SessionId) {
        self.kernel_caches
            .borrow_mut()
            .retain(|(session, _)| *session != id);
    }

    /// Has every kernel that caches this filesystem's writes send them
    /// (`syncfs` of each mountpoint, on a thread of its own: the writes
    /// it makes the kernel send are served by this thread meanwhile), so
    /// that what follows sees every `write()` that returned before, as on
    /// OpenZFS, where a write is in the pool when it returns. A snapshot,
    /// `ironpool sync` and a stopping mount call it. A mount that cannot
    /// be reached is told on stderr, and skipped.
    pub async fn flush_kernel_caches(&self) {
        let paths: Vec<_> = self
            .kernel_caches
            .borrow()
            .iter()
            .map(|(_, path)| path.clone())
            .collect();
        for path in paths {
            let at = path.clone();
            let synced = crate::rt::offload::run_apart(move || sync_mounted(&at));
            let failed = match crate::rt::timeout(KERNEL_FLUSH_PATIENCE, synced).await {
                Some(Ok(())) => continue,
                Some(Err(error)) => error.to_string(),
                None => format!("not done in {} s", KERNEL_FLUSH_PATIENCE.as_secs()),
            };
            eprintln!(
                "ironpool: {}: cannot flush the kernel's cache at {}: {failed}",
                self.name(),
                path.display()
            );
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
            // An encrypted filesystem's attributes are stored sealed.
            let stored = Dnode {
                bonus: set.stored_bonus(object.id, &dnode)?,
                ..dnode
            };
            let mut bytes = [0u8; DNODE_BYTES];
            stored.encode(&mut bytes);
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
    for fs in pool.datasets.snapshot_filesystems.all_held() {
        fs.objects.set_loaded_max(keep);
        fs.objects.evict_objects(keep);
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
mod mac_tests;
#[cfg(test)]
mod tests;
