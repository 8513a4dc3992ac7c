//! The FUSE front end: a filesystem served to the kernel from the engine's
//! own io_uring loop. No libfuse: `/dev/fuse` is read and written with ring
//! operations, and each request runs as a task on the engine thread, so
//! many requests of one mount are in flight at once (up to [`SERVED_MAX`]).
//!
//! At INIT the server asks for `FUSE_ASYNC_DIO` and a `max_background` of
//! [`MAX_BACKGROUND`] (without them the kernel sends a direct-I/O file's
//! requests one at a time) and 1 MiB writes; files opened with `O_DIRECT`
//! get `FOPEN_DIRECT_IO` and `FOPEN_PARALLEL_DIRECT_WRITES`. It also asks
//! for `FUSE_HANDLE_KILLPRIV_V2`: the server drops set-user-id, set-group-id
//! and `security.capability` on write, truncate and chown
//! (`Filesystem::drop_privileges`), so the kernel no longer asks for
//! `security.capability` before every buffered write (a round trip each).
//!
//! When the kernel offers FUSE over io_uring (`enable_uring`), INIT asks
//! for it and the mount registers slots on the engine's ring once INIT is
//! answered ([`uring`]); requests then come as ring completions, and only
//! INIT, FORGET and INTERRUPT still come through `/dev/fuse`. `fs list`
//! reports the transport and the most requests served at once.
//!
//! Reads and writes of different blocks of a file run concurrently in the
//! filesystem layer; `fsync` commits the intent log (or a txg), unless
//! every answer given before it rests on durable changes: direct writes
//! whose client calls `fsync` every few writes are made durable before
//! they are answered ([`Filesystem::request_began`], [`Filesystem::fsync`]).
//!
//! `.zfs/snapshot/NAME` in the root shows snapshot NAME read-only
//! ([`snapdir`], which also says how node ids tell a snapshot's objects
//! from the head's).

mod peers;
pub mod proto;
mod snapdir;
mod uring;

pub use uring::SLOTS_MAX;

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::format::znode::{
    Timestamp, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, ZNODE_APPEND, ZNODE_IMMUTABLE, ZNODE_NODUMP,
    ZNODE_PROJINHERIT,
};
use crate::pool::dataset::props::SyncMode;
use crate::pool::filesystem::{
    check_open, Attr, DataChange, Filesystem, FsError, NewObject, RequestKind, SessionId, SetAttr,
};
use crate::pool::Pool;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Semaphore;
use crate::rt::uring::WriteBytes;
use crate::rt::{self, uring as rt_uring};

/// Largest write the kernel sends (and read it asks for): 1 MiB.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Pages of the largest request (1 MiB of 4 KiB pages).
const MAX_PAGES: u16 = 256;
/// Bytes of one request buffer: the largest write and its headers.
const REQUEST_BUFFER_BYTES: usize = MAX_WRITE_BYTES as usize + 4096;
/// Where in its buffer a request from `/dev/fuse` is read: a WRITE's
/// payload follows its two headers and so lands on a 4 KiB boundary, from
/// where the whole blocks of a write going through (O_DIRECT, not held)
/// are written to the devices with no copy ([`Filesystem::write_lent`]).
/// The kernel needs room for the
/// largest write and those headers after it.
const REQUEST_READ_AT: usize = 4096 - proto::IN_HEADER_BYTES - proto::WRITE_IN_BYTES;
const _: () = assert!(
    REQUEST_BUFFER_BYTES - REQUEST_READ_AT
        >= MAX_WRITE_BYTES as usize + proto::IN_HEADER_BYTES + proto::WRITE_IN_BYTES
);
/// Where a WRITE's payload begins in a request buffer, after its headers
/// read at [`REQUEST_READ_AT`]: a 4 KiB boundary.
const PAYLOAD_AT: usize = REQUEST_READ_AT + proto::WRITE_HEADERS_BYTES;
const _: () = assert!(PAYLOAD_AT == 4096);
/// Largest WRITE payload read into a buffer of its own, when the last
/// WRITE was that size: 128 KiB, the default record, so the common
/// writes (a record or a few pages) are kept as the blocks' bytes with no
/// copy, while a buffer read for a write that does not come (a request of
/// another kind or size) is at most this, used for the next one.
const PAYLOAD_APART_BYTES_MAX: usize = 128 << 10;
/// Payloads read apart are whole pages: a block's bytes from one start on
/// a page, as a device opened with O_DIRECT needs.
const PAYLOAD_APART_UNIT: usize = 4096;
/// WRITEs of one size in a row before the next is expected to be one too:
/// a client that alternates sizes (8K pages and 16K log records) would
/// otherwise have most payloads read into a buffer of the wrong size and
/// copied back.
const PAYLOAD_APART_RUN_MIN: u32 = 2;
/// Requests of one mount served at once over `/dev/fuse`. Each holds a
/// request buffer, so this bounds a mount's memory (64 MiB) and its queue
/// depth at the server; the kernel queues the rest.
pub const SERVED_MAX: usize = 64;
/// Reads of `/dev/fuse` posted at once while requests come in bursts (an
/// application's queue depth: several come while one is served). The
/// kernel wakes every posted read for each request it queues, and each
/// woken read that finds nothing costs a failed read and a new poll, in
/// the loop that is about to answer: so while requests come one at a time
/// (a `stat`, `create` or `unlink` after another) one read is posted, and
/// the others only after a request arrives while another is being served
/// ([`Session::note_arrival`]). Measured on a mirror of two files (fio
/// 16K random writes at QD64 on a file; creates of 40,000 files): always
/// 1 gave 44k IOPS and 11.3k creates/s, always 4 gave 52k and 9.4k (a
/// request waited 37 us for its answer instead of 26), this 48-56k and
/// 11.0-11.2k.
pub const READS_POSTED: usize = 4;
/// Requests in a row that arrive with none other being served before the
/// reads past the first are no longer posted: a burst has ended.
const CALM_REQUESTS: u32 = 64;
/// Background (asynchronous) requests the kernel keeps outstanding, direct
/// I/O included: at least the queue depth an application uses (fio's 64).
pub const MAX_BACKGROUND: u16 = 256;
/// How long the kernel may cache names, absent names and attributes: a
/// day, as virtiofsd's `cache=always`. Every change to a mounted
/// filesystem goes through the kernel, which drops what it cached of the
/// names and inodes a request changes (a write, a rename, an unlink, a
/// setxattr); this server is the only writer, so nothing it cached goes
/// stale behind its back. Cached attributes are what make `stat` cost no
/// round trip, and a cached name what makes `unlink` one request.
const ATTR_VALID_SECONDS: u64 = 24 * 60 * 60;
/// How long a server that stops waits for files still open on a
/// filesystem it unmounted before it aborts the connection.
pub const UNMOUNT_PATIENCE: Duration = Duration::from_secs(5);
/// How long a mount of a filesystem rolled back or destroyed waits for
/// the kernel to end its session (at once when no file is open in it)
/// before it aborts it: the files still open only get `ESTALE`.
pub const RETIRED_PATIENCE: Duration = Duration::from_secs(1);
/// Largest directory listing reply (the kernel asks for a page at a time).
const READDIR_BYTES_MAX: usize = 64 * 1024;

/// One mounted filesystem.
pub struct Mount {
    /// The kernel's number for the session (its device minor), under
    /// `/sys/fs/fuse/connections`; None if it could not be found.
    connection: Option<u32>,
    /// The mount flags it has ([`mount_flags`] when mounted or last
    /// changed).
    flags: Cell<libc::c_ulong>,
    mountpoint: PathBuf,
    /// Unmounted from its path already ([`Mount::detach`]).
    detached: Cell<bool>,
    session: Rc<Session>,
    readers: Vec<rt::JoinHandle<()>>,
}

struct Session {
    pool: Rc<Pool>,
    fs: Rc<Filesystem>,
    /// This session's holds on the filesystem's objects (another mount of
    /// it may be alive beside this one).
    id: SessionId,
    /// `/dev/fuse` for this session (`fd` is its number), closed when the
    /// last holder of the session lets go (the mount once stopped, a task
    /// telling it of another mount's changes), so no write reaches a
    /// reused number.
    _device: OwnedFd,
    fd: RawFd,
    /// Whether INIT asks for FUSE over io_uring (the kernel offers it), or
    /// why not.
    uring_offered: Result<(), String>,
    /// Set by the INIT reply that asked for it: register the ring's slots
    /// once that reply is written.
    start_uring: Cell<bool>,
    uring: RefCell<Option<Rc<uring::UringTransport>>>,
    /// Request buffers not in use (at most [`SERVED_MAX`] are ever made).
    buffers: RefCell<Vec<AlignedBuf>>,
    /// The payload size of the last WRITEs read, when it may be read apart
    /// (a whole number of pages, at most [`PAYLOAD_APART_BYTES_MAX`]), and
    /// how many of that size came in a row: from [`PAYLOAD_APART_RUN_MIN`]
    /// on, the next read puts that many bytes after a WRITE's headers into
    /// a buffer of their own. Size 0: read whole.
    write_run: Cell<(usize, u32)>,
    /// Requests being served: one unit each, [`SERVED_MAX`] in all.
    serving: Rc<Semaphore>,
    /// Requests being handled now (read, not yet answered).
    handling: Cell<usize>,
    /// Requests in a row that arrived while none other was handled; under
    /// [`CALM_REQUESTS`], requests come in bursts and every reader posts.
    calm: Cell<u32>,
    /// Wakes the readers past the first when a burst starts, or the
    /// session ends.
    burst: crate::rt::sync::Notify,
    /// A reader saw the session end: the others stop too.
    ended: Cell<bool>,
    /// The snapshots `.zfs/snapshot` gave node-id slots to.
    snapshot_slots: RefCell<snapdir::Slots>,
    /// At INIT: whether POSIX ACLs were asked for (`acltype=posix` then),
    /// and whether the kernel checks them (None: no INIT yet). The session
    /// keeps them; a change of `acltype` takes a new mount.
    posix_acl: Cell<Option<(bool, bool)>>,
    /// Whether INIT asks for the kernel's writeback cache
    /// (`writebackcache=on` at the mount's start; a change takes a new
    /// mount, as `acltype`'s does).
    writeback_cache: bool,
}

/// The flags a mount of `fs` has: no set-user-id programs, no device
/// files; relatime, or no access times with `atime=off` (so the kernel
/// does not ask for them after each read either; a remount keeps the
/// old access-time flag unless given one, so one is always given); and
/// read-only with `readonly=on`. `mount` then shows what the filesystem
/// does.
fn mount_flags(fs: &Filesystem) -> libc::c_ulong {
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    flags |= if fs.access_times() {
        libc::MS_RELATIME
    } else {
        libc::MS_NOATIME
    };
    if fs.settings().read_only {
        flags |= libc::MS_RDONLY;
    }
    flags
}

/// The most of the kernel's dirty pages one mount with the writeback
/// cache may hold once the kernel's own dirty limits are reached (its
/// `max_bytes`): a share, as a local filesystem's, not all of them.
const KERNEL_DIRTY_BYTES_MAX: u64 = 1 << 30;

/// Lets the kernel hold this mount's dirty pages as it holds a local
/// filesystem's (`writebackcache=on`): FUSE confines each mount to a
/// strict 1% share of the dirty limit, against servers that cannot keep
/// up or cannot be trusted, and then sends every few pages as they are
/// written, so a program's small writes wait on the server after all
/// (buffered 4K random writes measured 31k IOPS so, 335k without). This
/// server is root's own; the kernel's global limits still bound it
/// (`vm.dirty_ratio`), and [`KERNEL_DIRTY_BYTES_MAX`] its share of them.
/// A kernel without the knobs (before 6.2) keeps its default.
fn loosen_dirty_limit(connection: u32) {
    let bdi = PathBuf::from(format!("/sys/class/bdi/0:{connection}"));
    let knobs = [
        ("max_bytes", KERNEL_DIRTY_BYTES_MAX.to_string()),
        ("strict_limit", "0".to_string()),
    ];
    for (knob, value) in knobs {
        if let Err(error) = std::fs::write(bdi.join(knob), &value) {
            eprintln!(
                "ironpool: cannot set {}/{knob} to {value}: {error}; the kernel's default applies",
                bdi.display()
            );
        }
    }
}

/// The FUSE connection number of the mount at `mountpoint`: the minor
/// of its device number, from `/proc/self/mountinfo` (a `stat` would wait
/// for the server, which is not serving yet when this is asked).
fn connection_of(mountpoint: &Path) -> Option<u32> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = mountpoint.to_str()?;
    // The last mount at the path is the one just made.
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let fstype = fields.iter().skip_while(|field| **field != "-").nth(1)?;
        if fields.get(4) != Some(&wanted) || *fstype != "fuse.ironpool" {
            return None;
        }
        fields.get(2)?.split_once(':')?.1.parse().ok()
    })
}

/// Where the kernel's FUSE control filesystem is (`fusectl`).
const FUSE_CONNECTIONS: &std::ffi::CStr = c"/sys/fs/fuse/connections";

/// Aborts FUSE connection `connection` (its requests fail, the session
/// ends), through the control filesystem, mounted here if it is not.
fn abort_connection(connection: u32) -> io::Result<()> {
    let connections = Path::new(FUSE_CONNECTIONS.to_str().expect("an ASCII path"));
    let abort = connections.join(connection.to_string()).join("abort");
    if !abort.exists() {
        // SAFETY: constant NUL-terminated strings.
        let done = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                FUSE_CONNECTIONS.as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    std::fs::write(abort, b"1")
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

/// Detaches whatever is mounted at `path` if it is a FUSE mount whose
/// server is gone (`ENOTCONN`, or `ECONNABORTED` once the kernel aborted
/// the connection): left by a server that was killed. Asked with
/// `statfs`, which the kernel always sends to the server: a `stat` of the
/// mount's root is answered from the kernel's cache while the root's
/// attributes are still valid (for a day), dead server or not, and a new
/// mount would then be stacked on the dead one.
fn clear_dead_mount(path: &Path) -> io::Result<()> {
    let name = c_path(path)?;
    // SAFETY: a NUL-terminated path, and a zeroed statfs for the kernel to
    // fill; both outlive the call.
    let answered = unsafe {
        let mut stats: libc::statfs = std::mem::zeroed();
        libc::statfs(name.as_ptr(), &mut stats) == 0
    };
    let error = io::Error::last_os_error();
    if !answered
        && matches!(
            error.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        )
    {
        return detach_path(path);
    }
    Ok(())
}

/// Clears a dead mount at `path`, makes the directory, opens `/dev/fuse`
/// and mounts it there with `flags`: the path's part of a mount, run on a
/// thread apart (see [`Mount::start`]). Returns the device, which serves
/// the mount.
fn mount_device(path: &Path, source: &CString, flags: libc::c_ulong) -> io::Result<OwnedFd> {
    clear_dead_mount(path)?;
    std::fs::create_dir_all(path)?;
    // Non-blocking, so a read with no request queued makes the ring
    // wait for one (poll) instead of blocking one of its threads.
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/dev/fuse".as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned here.
    let device = unsafe { OwnedFd::from_raw_fd(fd) };
    let fstype = c"fuse.ironpool";
    let options = CString::new(format!(
        "fd={fd},rootmode={:o},user_id=0,group_id=0,default_permissions,allow_other,max_read={MAX_WRITE_BYTES}",
        S_IFDIR
    ))
    .expect("no NUL in options");
    let target = c_path(path)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let mounted = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            options.as_ptr() as *const libc::c_void,
        )
    };
    if mounted != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(device)
}

/// Detaches the mount at `path` lazily (open files keep it alive).
fn detach_path(path: &Path) -> io::Result<()> {
    let target = c_path(path)?;
    // SAFETY: a NUL-terminated path; umount2 reads it only.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Changes the flags of the mount at `path` (a remount of it alone).
fn remount(path: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let target = c_path(path)?;
    // SAFETY: a NUL-terminated path; the other pointers may be null
    // for a remount.
    let done = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Mount {
    /// Mounts `fs` at `mountpoint` (created if missing) and starts serving
    /// it on the current runtime.
    ///
    /// The path's system calls run on a thread apart: the mountpoint of a
    /// nested filesystem lies inside its parent's mount, which this engine
    /// serves, so looking the path up asks the engine itself.
    pub async fn start(pool: Rc<Pool>, fs: Rc<Filesystem>, mountpoint: &Path) -> io::Result<Mount> {
        let source = CString::new(format!("ironpool:{}", fs.name())).expect("no NUL in names");
        let flags = mount_flags(&fs);
        let path = mountpoint.to_path_buf();
        let device = rt::offload::run_apart(move || mount_device(&path, &source, flags)).await?;
        let uring_offered = uring::kernel_offers();
        fs.note_front_end(|stats| {
            *stats = Default::default();
            stats.transport = match &uring_offered {
                Ok(()) => "/dev/fuse (until INIT sets up io_uring)".into(),
                Err(why) => format!("/dev/fuse ({why})"),
            };
        });
        let writeback_cache = fs.writeback_cache();
        let session = Rc::new(Session {
            pool,
            id: fs.begin_session(),
            fs,
            fd: device.as_raw_fd(),
            _device: device,
            uring_offered,
            start_uring: Cell::new(false),
            uring: RefCell::new(None),
            buffers: RefCell::default(),
            write_run: Cell::new((0, 0)),
            serving: Semaphore::new(SERVED_MAX as u64),
            handling: Cell::new(0),
            calm: Cell::new(CALM_REQUESTS),
            burst: crate::rt::sync::Notify::new(),
            ended: Cell::new(false),
            snapshot_slots: RefCell::default(),
            posix_acl: Cell::new(None),
            writeback_cache,
        });
        // With the kernel's writeback cache, a snapshot or a stop has the
        // kernel send what it holds first.
        if session.writeback_cache {
            session.fs.add_kernel_cache(session.id, mountpoint);
        }
        peers::register(&session);
        let readers = (0..READS_POSTED)
            .map(|index| rt::spawn(reader(session.clone(), index)))
            .collect();
        let connection = connection_of(mountpoint);
        if let (true, Some(connection)) = (writeback_cache, connection) {
            loosen_dirty_limit(connection);
        }
        Ok(Mount {
            connection,
            flags: Cell::new(mount_flags(&session.fs)),
            mountpoint: mountpoint.to_path_buf(),
            detached: Cell::new(false),
            session,
            readers,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Changes the mount's flags when the filesystem's properties changed
    /// them (`atime`, `readonly`): a remount of this mount only, as
    /// `mount -o remount,bind` does. The kernel refuses to make a mount
    /// read-only while a file on it is open for writing (EBUSY); the
    /// server refuses the writes either way.
    pub async fn follow_properties(&self) -> io::Result<()> {
        let wanted = mount_flags(&self.session.fs);
        if wanted == self.flags.get() {
            return Ok(());
        }
        let path = self.mountpoint.clone();
        rt::offload::run_apart(move || remount(&path, wanted)).await?;
        self.flags.set(wanted);
        Ok(())
    }

    /// Whether this mount serves `fs` (not an older filesystem of its name)
    /// as its properties say: with POSIX ACLs checked by the kernel or not
    /// (fixed at INIT, so a change of `acltype` takes a new mount).
    pub fn serves(&self, fs: &Rc<Filesystem>) -> bool {
        // Compared with what was asked, not granted: a kernel without
        // POSIX ACLs would otherwise be remounted over and over.
        let acls_as_set = self
            .session
            .posix_acl
            .get()
            .is_none_or(|(asked, _)| asked == fs.posix_acls());
        Rc::ptr_eq(&self.session.fs, fs)
            && acls_as_set
            && self.session.writeback_cache == fs.writeback_cache()
    }

    /// Whether the filesystem it serves was rolled back or destroyed: its
    /// open files only get `ESTALE` from now on.
    pub fn serves_retired(&self) -> bool {
        self.session.fs.is_retired()
    }

    /// Takes the mount off its path (lazily: open files keep it alive), at
    /// once and only once. A replacement may be mounted on the same path
    /// right after: the unmount must not reach that one.
    pub async fn detach(&self) {
        if self.detached.replace(true) {
            return;
        }
        // The writes the kernel caches reach the filesystem before the
        // mount leaves its path (a session ended or aborted later would
        // drop them); a retired filesystem has nowhere to put them.
        let fs = &self.session.fs;
        if !fs.is_retired() {
            fs.flush_kernel_caches().await;
        }
        fs.remove_kernel_cache(self.session.id);
        let path = self.mountpoint.clone();
        // An error means it is gone already: a parent's lazy unmount
        // takes the mounts inside it along.
        let _ = rt::offload::run_apart(move || detach_path(&path)).await;
    }

    /// Unmounts (lazily: open files keep working until closed, then the
    /// kernel lets go) and waits for the readers, which end when the kernel
    /// ends the session. With `patience`, a session that files still open
    /// (or a process's working directory) keep alive longer than that is
    /// aborted: a server that stops does not wait on its users forever,
    /// and they get `ENOTCONN` from then on.
    pub async fn stop(self, patience: Option<Duration>) {
        self.detach().await;
        let readers = futures_util::future::join_all(self.readers);
        let mut readers = std::pin::pin!(readers);
        if let Some(patience) = patience {
            if rt::timeout(patience, readers.as_mut()).await.is_none() {
                let name = &self.session.fs.name();
                match self.connection.map(abort_connection) {
                    Some(Ok(())) => eprintln!(
                        "ironpool: {name}: files still open after {} s: connection aborted",
                        patience.as_secs()
                    ),
                    Some(Err(error)) => eprintln!(
                        "ironpool: {name}: files still open; cannot abort the connection: {error}"
                    ),
                    None => {
                        eprintln!("ironpool: {name}: files still open; waiting for them to close")
                    }
                }
            }
        }
        readers.await;
        // Requests still being served finish before the session is let go.
        let _all = self.session.serving.acquire(SERVED_MAX as u64).await;
        self.session.buffers.borrow_mut().clear();
        let transport = self.session.uring.borrow_mut().take();
        if let Some(transport) = transport {
            transport.stop().await;
        }
        // The kernel holds nothing of this session any more.
        peers::unregister(&self.session);
        let fs = &self.session.fs;
        if let Err(error) = fs.session_ended(&self.session.pool, self.session.id).await {
            eprintln!("ironpool: {}: freeing removed objects: {error}", fs.name());
        }
        fs.note_front_end(|stats| *stats = Default::default());
        // The device closes with the session (this is its last holder
        // unless a notification task still has it, for a moment).
        drop(self.session);
    }
}

impl Session {
    /// A request was read: under way with others (a burst: every reader
    /// posts from now on), or alone (one more in a row of those).
    fn note_arrival(&self) {
        if self.handling.get() > 0 {
            if self.calm.replace(0) >= CALM_REQUESTS {
                self.burst.notify_all();
            }
        } else {
            self.calm.set(self.calm.get().saturating_add(1));
        }
        self.handling.set(self.handling.get() + 1);
    }

    /// Whether reader `index` posts a read now: the first always, the
    /// others during a burst.
    fn posts(&self, index: usize) -> bool {
        index == 0 || self.calm.get() < CALM_REQUESTS
    }
}

/// Reads requests from `/dev/fuse` and serves each as a task of its own,
/// until the session ends; [`READS_POSTED`] of these run per mount, all
/// but the first only during bursts ([`Session::posts`]).
/// Requests run concurrently, up to [`SERVED_MAX`] at once (each holds a
/// request buffer); past that, the readers wait for one to finish.
async fn reader(session: Rc<Session>, index: usize) {
    loop {
        while !session.ended.get() && !session.posts(index) {
            session.burst.notified().await;
        }
        if session.ended.get() {
            break;
        }
        let permit = session.serving.acquire(1).await;
        let mut buffer = session
            .buffers
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed(REQUEST_BUFFER_BYTES));
        // Non-blocking: with no request queued the ring polls for one.
        let expected = match session.write_run.get() {
            (size, count) if count >= PAYLOAD_APART_RUN_MIN => size,
            _ => 0,
        };
        let (result, payload) = match expected {
            0 => {
                let (result, read) =
                    rt_uring::read_stream_into(session.fd, buffer, REQUEST_READ_AT).await;
                buffer = read;
                (result, None)
            }
            expected => {
                let (result, read, payload) = rt_uring::read_stream_split(
                    session.fd,
                    buffer,
                    REQUEST_READ_AT,
                    PAYLOAD_AT,
                    AlignedBuf::for_overwrite(expected),
                )
                .await;
                buffer = read;
                (result, Some(payload))
            }
        };
        match result {
            Ok(length) => {
                session.note_arrival();
                let headers = length.min(proto::WRITE_HEADERS_BYTES);
                let head = &buffer[REQUEST_READ_AT..REQUEST_READ_AT + headers];
                let write_size = proto::write_payload_size(head);
                let is_write = head.len() >= proto::IN_HEADER_BYTES
                    && u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) == proto::WRITE;
                let payload = match payload {
                    Some(payload) if write_size == Some(payload.len()) => {
                        session
                            .fs
                            .note_front_end(|stats| stats.write_payloads_apart += 1);
                        Some(payload)
                    }
                    Some(payload) => {
                        // Not the write expected: its bytes as a plain
                        // read leaves them.
                        let spilled = (length - headers).min(payload.len());
                        buffer[PAYLOAD_AT..PAYLOAD_AT + spilled]
                            .copy_from_slice(&payload[..spilled]);
                        None
                    }
                    None => None,
                };
                if is_write {
                    let size = write_size
                        .filter(|size| *size <= PAYLOAD_APART_BYTES_MAX)
                        .filter(|size| size.is_multiple_of(PAYLOAD_APART_UNIT))
                        .unwrap_or(0);
                    session.write_run.set(match session.write_run.get() {
                        (last, count) if last == size => (size, count.saturating_add(1)),
                        _ => (size, 1),
                    });
                }
                let session = session.clone();
                let (request, payload) = match payload {
                    Some(payload) => (
                        BufSlice::new(buffer.into_shared(), REQUEST_READ_AT..PAYLOAD_AT),
                        Some(BufSlice::whole(payload.into_shared())),
                    ),
                    None => (
                        BufSlice::new(
                            buffer.into_shared(),
                            REQUEST_READ_AT..REQUEST_READ_AT + length,
                        ),
                        None,
                    ),
                };
                rt::spawn(async move {
                    serve_request(&session, &request, payload.as_ref()).await;
                    // Nothing keeps a request's bytes past its answer.
                    if let Some(buffer) = request.try_into_buffer() {
                        session.buffers.borrow_mut().push(buffer);
                    }
                    drop(permit);
                });
                continue;
            }
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)
                ) => {}
            // The filesystem was unmounted.
            Err(error) if error.raw_os_error() == Some(libc::ENODEV) => break,
            Err(error) => {
                eprintln!(
                    "ironpool: {}: reading /dev/fuse: {error}",
                    session.fs.name()
                );
                break;
            }
        }
        session.buffers.borrow_mut().push(buffer);
    }
    // The readers waiting for a burst end with this one.
    session.ended.set(true);
    session.burst.notify_all();
}

/// Serves one request read from `/dev/fuse` and writes its reply;
/// `payload`: a WRITE's payload, read apart from its headers (`request`).
async fn serve_request(session: &Rc<Session>, request: &BufSlice, payload: Option<&BufSlice>) {
    let lent = match payload {
        Some(payload) => Lent::Kept(payload),
        None => Lent::Request(request),
    };
    let (opcode, reply) = handle(session, request, lent).await;
    session.handling.set(session.handling.get() - 1);
    if let Some(reply) = reply {
        // The header, the body, and a READ's data as the pieces of the
        // blocks read, in one write with no copy.
        let handed = proto::entry_node(opcode, &reply);
        let mut pieces = vec![WriteBytes::Owned(reply.header.to_vec())];
        if !reply.body.is_empty() {
            pieces.push(WriteBytes::Owned(reply.body));
        }
        pieces.extend(reply.data.into_iter().map(WriteBytes::Shared));
        // ENOENT: the request was interrupted and is gone, and with it the
        // reference an entry reply would have handed the kernel.
        match rt_uring::writev_bytes(session.fd, pieces).await {
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {
                if let Some(node) = handed {
                    forget(session, node, 1).await;
                }
            }
            Err(error) => eprintln!("ironpool: {}: fuse reply: {error}", session.fs.name()),
            Ok(_) => {}
        }
    }
    if session.start_uring.take() {
        start_uring(session);
    }
}

/// The kernel let go of `count` references to node `node`: a node of the
/// mounted filesystem (not of a snapshot, which frees nothing) may be
/// freed if that was the last hold on an object with no names.
async fn forget(session: &Session, node: u64, count: u64) {
    let (slot, ino) = snapdir::split(node);
    if slot != 0 {
        return;
    }
    if let Err(error) = session
        .fs
        .forgotten(&session.pool, session.id, ino, count)
        .await
    {
        eprintln!(
            "ironpool: {}: freeing removed object {ino}: {error}",
            session.fs.name()
        );
    }
}

/// Tells the kernel the attributes of node `nodeid` changed without a
/// request that returns them (a write that dropped set-user-id). Its
/// cached ones would otherwise hold for [`ATTR_VALID_SECONDS`].
async fn notify_inval_attributes(session: &Session, nodeid: u64) {
    let bytes = proto::notify_inval_attributes(nodeid);
    let bytes = BufSlice::whole(AlignedBuf::copy_from(&bytes).into_shared());
    // ENOENT: the kernel no longer knows the node.
    if let Err(error) = rt_uring::writev_at(session.fd, vec![bytes], u64::MAX).await {
        if error.raw_os_error() != Some(libc::ENOENT) {
            eprintln!(
                "ironpool: {}: fuse notification: {error}",
                session.fs.name()
            );
        }
    }
}

fn to_fuse(attr: &Attr) -> proto::Attr {
    let time = |time: Timestamp| (time.seconds, time.nanos);
    let znode = &attr.znode;
    proto::Attr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        atime: time(znode.atime),
        mtime: time(znode.mtime),
        ctime: time(znode.ctime),
        btime: time(znode.birth),
        mode: znode.mode,
        nlink: znode.nlink.min(u32::MAX as u64) as u32,
        uid: znode.uid,
        gid: znode.gid,
        rdev: znode.rdev as u32,
        blksize: attr.block_bytes,
    }
}

/// The entry of `attr`, an object of the filesystem in node-id slot `slot`,
/// valid in the kernel's cache for `valid_seconds`.
fn entry(slot: u64, attr: &Attr, valid_seconds: u64) -> Vec<u8> {
    proto::entry_out(
        &to_fuse(&in_slot(slot, attr)),
        attr.znode.generation,
        valid_seconds,
    )
}

/// How long `session`'s kernel may cache names, absent names and
/// attributes: [`ATTR_VALID_SECONDS`] while it is the filesystem's only
/// mount session, nothing while another is alive beside it (a change
/// through either could race the other's caching of what it changed; the
/// notifications of `peers` cover what was cached before).
fn valid_seconds(session: &Session) -> u64 {
    if peers::alone(session) {
        ATTR_VALID_SECONDS
    } else {
        0
    }
}

/// `attr` with its node id for slot `slot` ([`snapdir`]).
fn in_slot(slot: u64, attr: &Attr) -> Attr {
    Attr {
        ino: snapdir::node_id(slot, attr.ino),
        ..*attr
    }
}

/// The reply to STATFS: the pool's space, the mounted filesystem's objects.
/// Free and available are both the space data may still take, so `df`
/// reads zero when writes get ENOSPC, not the slop kept for metadata.
fn statfs(session: &Session) -> Result<Vec<u8>, FsError> {
    let stats = session.fs.stats(&session.pool);
    let block = 4096u64;
    let available = stats.available_bytes / block;
    Ok(proto::statfs_out(
        stats.total_bytes / block,
        available,
        stats.objects + available,
        available,
        block as u32,
    ))
}

/// Registers the io_uring transport's slots (after the INIT reply that
/// asked for it); on failure the kernel goes on with `/dev/fuse`.
fn start_uring(session: &Rc<Session>) {
    match uring::UringTransport::start(session) {
        Ok(transport) => {
            let name = transport.description();
            eprintln!("ironpool: {}: serving over {name}", session.fs.name());
            session.fs.note_front_end(|stats| stats.transport = name);
            *session.uring.borrow_mut() = Some(transport);
        }
        Err(error) => {
            eprintln!(
                "ironpool: {}: FUSE over io_uring not set up ({error}); using /dev/fuse",
                session.fs.name()
            );
            session.fs.note_front_end(|stats| {
                stats.transport = format!("/dev/fuse (io_uring not set up: {error})")
            });
        }
    }
}

/// The buffer a request's bytes lie in, as a WRITE may use it.
#[derive(Clone, Copy)]
enum Lent<'a> {
    /// None: the bytes were copied out of the transport's buffers.
    None,
    /// The request buffer the whole request was read into: a WRITE's
    /// whole blocks are written from it while the request is served, but
    /// not kept after (the buffer returns for the next read).
    Request(&'a BufSlice),
    /// A WRITE's payload, read apart from its headers into a buffer of its
    /// own: its blocks may also be held as they are.
    Kept(&'a BufSlice),
}

impl<'a> Lent<'a> {
    /// The buffer to write whole blocks from.
    fn buffer(self) -> Option<&'a BufSlice> {
        match self {
            Lent::None => None,
            Lent::Request(buffer) | Lent::Kept(buffer) => Some(buffer),
        }
    }

    /// The buffer whose slices may be kept past the answer.
    fn kept(self) -> Option<&'a BufSlice> {
        match self {
            Lent::Kept(buffer) => Some(buffer),
            _ => None,
        }
    }
}

/// Serves one request, counting it in the filesystem's front-end figures;
/// returns its opcode (0: malformed) and the reply (None: the kernel
/// expects none). `lent`: the buffer the request's bytes lie in; with
/// [`Lent::Kept`], `bytes` are a WRITE's headers alone and its payload is
/// that buffer.
async fn handle(session: &Session, bytes: &[u8], lent: Lent<'_>) -> (u32, Option<proto::Reply>) {
    let arrived = rt::now();
    session.fs.note_front_end(|stats| {
        stats.in_flight += 1;
        stats.in_flight_max = stats.in_flight_max.max(stats.in_flight);
    });
    let apart = lent.kept().map_or(0, |payload| payload.len());
    let (opcode, reply) = match proto::header_apart(bytes, apart) {
        Ok(header) => (
            header.opcode,
            handle_counted(session, &header, bytes, lent).await,
        ),
        Err(proto::Malformed(why)) => {
            eprintln!(
                "ironpool: {}: malformed fuse request: {why}",
                session.fs.name()
            );
            (0, None)
        }
    };
    let micros = rt::now().duration_since(arrived).as_micros() as u64;
    session.fs.note_front_end(|stats| {
        stats.in_flight = stats.in_flight.saturating_sub(1);
        stats.requests += 1;
        let op = stats.ops.entry(proto::opcode_name(opcode)).or_default();
        op.count += 1;
        op.service_us += micros;
    });
    (opcode, reply)
}

async fn handle_counted(
    session: &Session,
    header: &proto::InHeader,
    bytes: &[u8],
    lent: Lent<'_>,
) -> Option<proto::Reply> {
    let parsed = match lent.kept() {
        Some(payload) => proto::write_apart(header, bytes, payload),
        None => proto::request(header, bytes),
    };
    let request = match parsed {
        Ok(request) => request,
        Err(proto::Malformed(why)) if proto::no_reply(header.opcode) => {
            eprintln!(
                "ironpool: {}: malformed fuse request {}: {why}",
                session.fs.name(),
                header.opcode
            );
            return None;
        }
        Err(_) => return Some(proto::Reply::new(header.unique, -libc::EINVAL, Vec::new())),
    };
    if let proto::Request::Forget(nodes) = &request {
        for &(node, count) in nodes {
            forget(session, node, count).await;
        }
        return None;
    }
    if proto::no_reply(header.opcode) {
        return None;
    }
    let result = serve(session, header, request, lent).await;
    Some(match result {
        Ok(Answer::Bytes(body)) => proto::Reply::new(header.unique, 0, body),
        Ok(Answer::Data(data)) => proto::Reply::data(header.unique, data),
        Err(error) => proto::Reply::new(header.unique, -error.errno(), Vec::new()),
    })
}

/// What a request is answered with: bytes, or a READ's data as the pieces
/// of the blocks it read.
enum Answer {
    Bytes(Vec<u8>),
    Data(Vec<BufSlice>),
}

async fn serve(
    session: &Session,
    header: &proto::InHeader,
    request: proto::Request<'_>,
    lent: Lent<'_>,
) -> Result<Answer, FsError> {
    use proto::Request;
    let (fs, node, slot) = match snapdir::route(session, header.nodeid).await? {
        snapdir::Route::Control(node) => {
            return snapdir::serve(session, header, node, request)
                .await
                .map(Answer::Bytes)
        }
        snapdir::Route::Fs { fs, ino, slot } => (fs, ino, slot),
    };
    let fs = &fs;
    let pool = &session.pool;
    // What must be durable when answered: a write under `O_SYNC` or
    // `O_DSYNC` (`sync=disabled` aside), and under `sync=always` every
    // change. FSYNC itself is answered below.
    let sync = fs.settings().sync;
    let durable = match &request {
        Request::Write { flags, .. } => {
            sync == SyncMode::Always
                || (sync == SyncMode::Standard && flags & libc::O_DSYNC as u32 != 0)
        }
        Request::Setattr(_)
        | Request::Symlink { .. }
        | Request::Mknod { .. }
        | Request::Mkdir { .. }
        | Request::Unlink { .. }
        | Request::Rmdir { .. }
        | Request::Rename { .. }
        | Request::Link { .. }
        | Request::Create { .. }
        | Request::Tmpfile { .. }
        | Request::Setxattr { .. }
        | Request::Removexattr { .. }
        | Request::Ioctl { .. }
        | Request::Fallocate { .. } => sync == SyncMode::Always,
        _ => false,
    };
    // A direct write whose client calls `fsync` after every write: that
    // commit starts as this one is answered (a held write is copied into it).
    let ahead = !durable
        && matches!(&request, Request::Write { flags, .. } if !fs.may_write_behind(*flags));
    // A direct write among others whose client calls `fsync` every few
    // writes is made durable before it is answered, so that the `fsync`,
    // which keeps the file's other writes out while it is in the server,
    // finds nothing to commit (`DURABLE_WRITES_FSYNC_GAP_MAX`). Every
    // answer is counted for that `fsync`.
    let kind = if ahead {
        RequestKind::DirectWrite
    } else if matches!(
        &request,
        Request::Fsync { .. }
            | Request::Fsyncdir
            | Request::Read { .. }
            | Request::Lookup { .. }
            | Request::Getattr { .. }
            | Request::Statx { .. }
            | Request::Readlink
            | Request::Statfs
            | Request::Access { .. }
            | Request::Getxattr { .. }
            | Request::Listxattr { .. }
    ) {
        RequestKind::NoChange
    } else {
        RequestKind::Changes
    };
    let answering = fs.request_began(pool, kind);
    let durable = durable || answering.durable_first();
    let ahead = ahead && !answering.durable_first();
    // Another mount of this filesystem alive beside this one: what the
    // request changes is told to its kernel.
    let peers = if slot == 0 {
        peers::of(session)
    } else {
        Vec::new()
    };
    let stale = if peers.is_empty() {
        Vec::new()
    } else {
        peers::stale_after(fs, node, &request).await
    };
    let held = matches!(&request, Request::Write { data, .. } if answering.holds(data.len()));
    let answer = serve_fs(session, header, request, lent, fs, (node, slot), held).await;
    if !stale.is_empty() {
        peers::tell(peers, stale);
    }
    let answer = match answer {
        Ok(answer) if durable => match pool.fs_log_commit(fs).await {
            Ok(()) => {
                fs.count_flush();
                Ok(answer)
            }
            Err(error) => Err(FsError::from(error)),
        },
        answer => answer,
    };
    // Counted after the request's changes were noted, before its answer
    // leaves: a commit that begins after this covers them.
    answering.answered(answer.is_ok());
    let answer = answer?;
    if ahead && fs.fsync_expected() {
        let (pool, fs) = (pool.clone(), fs.clone());
        // Started in this turn, its log write is submitted with the answer.
        // Deferring it until the answer had been submitted (a timer of no
        // time) measured 8% fewer fsyncs per second at QD1 (median 3,502
        // against 3,779 over 7 alternating rounds): the log write then
        // starts a whole turn later.
        rt::spawn(async move { pool.fs_log_ahead(&fs).await });
    }
    Ok(answer)
}

/// [`serve`] for a request to a filesystem's node `node` (of the head, or
/// of the snapshot in `slot`); `held`: the request is a direct write to
/// be held ([`Answering::holds`](crate::pool::filesystem::Answering::holds)).
async fn serve_fs(
    session: &Session,
    header: &proto::InHeader,
    request: proto::Request<'_>,
    lent: Lent<'_>,
    fs: &Rc<Filesystem>,
    (node, slot): (u64, u64),
    held: bool,
) -> Result<Answer, FsError> {
    use proto::Request;
    let pool = &session.pool;
    let owned = |mode: u32| NewObject::owned(mode, header.uid, header.gid);
    // On a mount with POSIX ACLs the kernel leaves the umask to the server.
    let umask_of = |umask: u32| {
        let granted = session.posix_acl.get().is_some_and(|(_, granted)| granted);
        granted.then_some(umask)
    };
    // Every entry reply hands the kernel a reference to its node, counted
    // as the reply is made, with no await since the object was found or
    // made (so nothing frees it between). Should the request fail after
    // (a `sync=always` commit), the count stays: the object, if removed,
    // is then freed at the session's end rather than at FORGET.
    let entry = |attr: &Attr| {
        if slot == 0 {
            fs.remembered(session.id, attr.ino);
        }
        entry(slot, attr, valid_seconds(session))
    };
    // `.zfs` in the root is the control directory: no file takes its name.
    let reserved = |parent: u64, name: &[u8]| {
        if slot == 0 && parent == fs.root() && name == snapdir::CONTROL_NAME {
            Err(FsError::Exists)
        } else {
            Ok(())
        }
    };
    // A link or a rename stays within one filesystem (the head, or one
    // snapshot, which refuses it anyway).
    let same_slot = |other: u64| -> Result<u64, FsError> {
        let (other_slot, ino) = snapdir::split(other);
        if other_slot == slot {
            Ok(ino)
        } else {
            Err(FsError::CrossDevice)
        }
    };
    let bytes = match request {
        Request::Init {
            major,
            minor,
            flags,
            ..
        } => init(session, major, minor, flags),
        Request::Release => {
            fs.release(pool, session.id, node).await?;
            Ok(Vec::new())
        }
        // A write's error is its own reply, so a close has nothing to
        // report: ENOSYS tells the kernel never to send FLUSH again, which
        // saves a round trip on every close (a quarter of a file create).
        Request::Flush => Err(FsError::NotSupported),
        Request::Destroy | Request::Releasedir | Request::Access { .. } => Ok(Vec::new()),
        Request::Forget(_) | Request::Interrupt => Ok(Vec::new()),
        // An absent name is answered with node 0 and a timeout, which the
        // kernel caches as a negative entry (an error it would ask again).
        Request::Lookup { name } if reserved(node, name).is_err() => {
            snapdir::control_entry(session, snapdir::ZFS_DIR).await
        }
        Request::Lookup { name } => match fs.lookup(node, name).await {
            Ok(attr) => Ok(entry(&attr)),
            Err(FsError::NotFound) => Ok(proto::negative_entry_out(valid_seconds(session))),
            Err(error) => Err(error),
        },
        Request::Getattr => Ok(proto::attr_out(
            &to_fuse(&in_slot(slot, &fs.getattr(node).await?)),
            valid_seconds(session),
        )),
        Request::Statx => Ok(proto::statx_out(
            &to_fuse(&in_slot(slot, &fs.getattr(node).await?)),
            valid_seconds(session),
        )),
        Request::Setattr(change) => {
            let now = Timestamp::from_ns(rt::file_clock_ns());
            let time = |(seconds, nanos): (u64, u32), now_bit: u32, set_bit: u32| {
                if change.valid & now_bit != 0 {
                    Some(now)
                } else if change.valid & set_bit != 0 {
                    Some(Timestamp {
                        seconds: seconds as i64,
                        nanos,
                    })
                } else {
                    None
                }
            };
            // A truncate or chown drops capabilities, and set-user-id and
            // set-group-id when the kernel says so (`HANDLE_KILLPRIV_V2`).
            let owner_or_size =
                change.valid & (proto::FATTR_SIZE | proto::FATTR_UID | proto::FATTR_GID) != 0;
            if owner_or_size {
                fs.drop_privileges(pool, node, false, DataChange::Attributes)
                    .await?;
            }
            // With the writeback cache the kernel keeps a regular file's
            // mtime and ctime, and hands both over after it wrote the
            // file's pages (and on close): its bookkeeping, not a
            // caller's `utimensat`, which sets the atime too.
            let kernel_times =
                change.valid & SETATTR_CHANGES == proto::FATTR_MTIME | proto::FATTR_CTIME;
            let set = SetAttr {
                mode: (change.valid & proto::FATTR_MODE != 0).then_some(change.mode),
                uid: (change.valid & proto::FATTR_UID != 0).then_some(change.uid),
                gid: (change.valid & proto::FATTR_GID != 0).then_some(change.gid),
                size: (change.valid & proto::FATTR_SIZE != 0).then_some(change.size),
                atime: time(change.atime, proto::FATTR_ATIME_NOW, proto::FATTR_ATIME),
                mtime: time(change.mtime, proto::FATTR_MTIME_NOW, proto::FATTR_MTIME),
                ctime: time(change.ctime, 0, proto::FATTR_CTIME),
                explicit_times: !kernel_times
                    && [
                        (proto::FATTR_ATIME, proto::FATTR_ATIME_NOW),
                        (proto::FATTR_MTIME, proto::FATTR_MTIME_NOW),
                    ]
                    .iter()
                    .any(|(set, now)| change.valid & set != 0 && change.valid & now == 0),
                allocating: false,
                drop_setid: owner_or_size && change.valid & proto::FATTR_KILL_SUIDGID != 0,
            };
            let attr = fs.setattr(pool, node, set).await?;
            Ok(proto::attr_out(
                &to_fuse(&in_slot(slot, &attr)),
                valid_seconds(session),
            ))
        }
        Request::Readlink => fs.readlink(node).await,
        Request::Symlink { name, target } => {
            reserved(node, name)?;
            let new = NewObject {
                target: Some(target),
                ..owned(S_IFLNK | 0o777)
            };
            Ok(entry(&fs.create(pool, node, name, &new).await?))
        }
        Request::Mknod {
            name,
            mode,
            rdev,
            umask,
        } => {
            reserved(node, name)?;
            let new = NewObject {
                rdev: u64::from(rdev),
                umask: umask_of(umask),
                ..owned(mode)
            };
            Ok(entry(&fs.create(pool, node, name, &new).await?))
        }
        Request::Mkdir { name, mode, umask } => {
            reserved(node, name)?;
            let new = NewObject {
                umask: umask_of(umask),
                ..owned(S_IFDIR | (mode & 0o7777))
            };
            Ok(entry(&fs.create(pool, node, name, &new).await?))
        }
        Request::Unlink { name } => fs
            .remove(pool, node, name, false)
            .await
            .map(|()| Vec::new()),
        Request::Rmdir { name } => fs.remove(pool, node, name, true).await.map(|()| Vec::new()),
        Request::Rename {
            new_dir,
            name,
            new_name,
            flags,
        } => {
            let new_dir = same_slot(new_dir)?;
            reserved(new_dir, new_name)?;
            fs.rename(pool, node, name, new_dir, new_name, flags)
                .await
                .map(|()| Vec::new())
        }
        Request::Link { old_node, name } => {
            let old_node = same_slot(old_node)?;
            reserved(node, name)?;
            Ok(entry(&fs.link(pool, old_node, node, name).await?))
        }
        Request::Open { flags } => {
            let attr = fs.getattr(node).await?;
            if attr.znode.is_dir() {
                return Err(FsError::IsDir);
            }
            check_open(&attr.znode, flags)?;
            fs.opened(session.id, node);
            Ok(proto::open_out(0, open_flags(session, flags)))
        }
        Request::Opendir => Ok(proto::open_out(0, 0)),
        Request::Create {
            name,
            flags,
            mode,
            umask,
        } => {
            reserved(node, name)?;
            let mode = if mode & S_IFMT == 0 {
                mode | S_IFREG
            } else {
                mode
            };
            let new = NewObject {
                umask: umask_of(umask),
                ..owned(mode)
            };
            let attr = fs.create(pool, node, name, &new).await?;
            fs.opened(session.id, attr.ino);
            let mut body = entry(&attr);
            body.extend_from_slice(&proto::open_out(0, open_flags(session, flags)));
            Ok(body)
        }
        Request::Tmpfile { flags, mode, umask } => {
            let new = NewObject {
                umask: umask_of(umask),
                ..owned(S_IFREG | (mode & 0o7777))
            };
            let attr = fs.create_tmpfile(pool, node, &new).await?;
            fs.opened(session.id, attr.ino);
            let mut body = entry(&attr);
            body.extend_from_slice(&proto::open_out(0, open_flags(session, flags)));
            Ok(body)
        }
        // The pieces of the blocks read, for the transport to write as
        // they are.
        Request::Read {
            offset,
            size,
            flags,
            ..
        } => {
            let size = size.min(MAX_WRITE_BYTES) as usize;
            let direct = flags & libc::O_DIRECT as u32 != 0;
            return fs
                .read_pieces(pool, node, offset, size, direct)
                .await
                .map(Answer::Data);
        }
        Request::Write {
            offset,
            data,
            write_flags,
            flags,
            ..
        } => {
            let kill_setid = write_flags & proto::WRITE_KILL_SUIDGID != 0;
            let data_change = DataChange::Write { offset };
            if fs
                .drop_privileges(pool, node, kill_setid, data_change)
                .await?
            {
                notify_inval_attributes(session, header.nodeid).await;
            }
            let buffered = fs.may_write_behind(flags);
            let written = if buffered || held {
                let direct = !buffered;
                fs.write_behind_lent(pool, (node, offset), data, lent.kept(), direct)
                    .await?
            } else {
                fs.write_lent(pool, node, offset, data, lent.buffer())
                    .await?
            };
            if fs.is_direct(flags) {
                fs.count_direct_write();
            }
            Ok(proto::write_out(written as u32))
        }
        Request::Statfs => statfs(session),
        // `fsync` and `fdatasync` of a file or a directory: through the
        // intent log when it carries every change since the last durable
        // txg, else a txg (`sync=disabled`: nothing, as OpenZFS).
        Request::Fsync { .. } | Request::Fsyncdir => {
            fs.fsync(pool, node).await?;
            Ok(Vec::new())
        }
        Request::Fallocate {
            offset,
            length,
            mode,
        } => {
            if fs
                .drop_privileges(pool, node, false, DataChange::Allocate { mode })
                .await?
            {
                notify_inval_attributes(session, header.nodeid).await;
            }
            fs.fallocate(pool, node, offset, length, mode).await?;
            Ok(Vec::new())
        }
        Request::CopyFileRange {
            offset_in,
            node_out,
            offset_out,
            length,
            flags,
        } => {
            if flags != 0 {
                return Err(FsError::Invalid(format!(
                    "copy_file_range flags {flags:#x}"
                )));
            }
            // The destination is a file of the head: a snapshot's are
            // read-only. The source may be a snapshot's (its bytes are
            // copied: a snapshot is another tree).
            let (head, target) = match snapdir::route(session, node_out).await? {
                snapdir::Route::Fs { fs, ino, slot: 0 } => (fs, ino),
                _ => return Err(FsError::ReadOnly),
            };
            if head
                .drop_privileges(
                    pool,
                    target,
                    false,
                    DataChange::Write { offset: offset_out },
                )
                .await?
            {
                notify_inval_attributes(session, node_out).await;
            }
            let copied = head
                .copy_range(pool, fs, node, offset_in, target, offset_out, length)
                .await?;
            // `sync=always` of the head written to (the source may be a
            // snapshot's file, whose settings are not the head's).
            if head.settings().sync == SyncMode::Always {
                pool.fs_log_commit(&head).await?;
                head.count_flush();
            }
            Ok(proto::write_out(copied as u32))
        }
        Request::Lseek { offset, whence } => {
            let data = match whence as i32 {
                libc::SEEK_DATA => true,
                libc::SEEK_HOLE => false,
                _ => return Err(FsError::Invalid(format!("lseek whence {whence}"))),
            };
            match fs.seek(node, offset, data).await? {
                Some(found) => Ok(proto::lseek_out(found)),
                None => Err(FsError::NoData),
            }
        }
        Request::Readdir {
            offset,
            size,
            plus: false,
        } => {
            let limit = (size as usize).min(READDIR_BYTES_MAX);
            let mut out = Vec::with_capacity(limit);
            // Each entry takes at least 32 bytes: ask for no more than fit.
            let entries = fs.readdir(node, offset, limit / 32 + 1).await?;
            for (next, entry) in entries {
                let ino = snapdir::node_id(slot, entry.object);
                if !proto::push_dirent(&mut out, limit, ino, next, entry.kind, &entry.name) {
                    break;
                }
            }
            Ok(out)
        }
        // Each entry with its attributes: the kernel takes a reference to
        // every node given (not `.` and `..`, which get none), counted as
        // an entry reply's is, once the entry is known to fit.
        Request::Readdir {
            offset,
            size,
            plus: true,
        } => {
            let limit = (size as usize).min(READDIR_BYTES_MAX);
            let mut out = Vec::with_capacity(limit);
            let entries = fs
                .readdir(node, offset, limit / proto::direntplus_bytes(1) + 1)
                .await?;
            for (next, dirent) in entries {
                if out.len() + proto::direntplus_bytes(dirent.name.len()) > limit {
                    break;
                }
                let dots = dirent.name == b"." || dirent.name == b"..";
                // The name looked up again, as a LOOKUP would: the node
                // it names now (the listing's object may have gone, its
                // number taken by another file, since).
                let attributes = if dots {
                    None
                } else {
                    match fs.lookup(node, &dirent.name).await {
                        Ok(attr) => Some(attr),
                        // Removed since it was listed: a plain entry.
                        Err(FsError::NotFound | FsError::Stale) => None,
                        // What fits so far is answered (its nodes are
                        // counted); the error comes again next time.
                        Err(_) if !out.is_empty() => break,
                        Err(error) => return Err(error),
                    }
                };
                let ino = match &attributes {
                    Some(attr) => snapdir::node_id(slot, attr.ino),
                    None => snapdir::node_id(slot, dirent.object),
                };
                let reply = match &attributes {
                    Some(attr) => entry(attr),
                    None => proto::negative_entry_out(0),
                };
                let pushed = proto::push_direntplus(
                    &mut out,
                    limit,
                    &reply,
                    ino,
                    next,
                    dirent.kind,
                    &dirent.name,
                );
                assert!(pushed, "a direntplus measured to fit");
            }
            Ok(out)
        }
        Request::Setxattr { name, value, flags } => fs
            .setxattr(pool, node, name, value, flags)
            .await
            .map(|()| Vec::new()),
        Request::Getxattr { name, size } => sized(fs.getxattr(node, name).await?, size),
        Request::Listxattr { size } => {
            let mut names = Vec::new();
            for name in fs.listxattr(node).await? {
                names.extend_from_slice(&name);
                names.push(0);
            }
            sized(names, size)
        }
        Request::Removexattr { name } => {
            fs.removexattr(pool, node, name).await.map(|()| Vec::new())
        }
        Request::Ioctl {
            flags,
            cmd,
            out_size,
            data,
        } => file_attr_ioctl(fs, pool, node, flags, cmd, out_size, data).await,
        Request::Unsupported(_) => Err(FsError::NotSupported),
    };
    bytes.map(Answer::Bytes)
}

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`.
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize, pad.
const FSXATTR_BYTES: usize = 28;

/// The file flags kept, as `FS_IOC_GETFLAGS` (`FS_*_FL`) and
/// `FS_IOC_FSGETXATTR` (`FS_XFLAG_*`) name them, beside the znode's.
const FILE_FLAGS: [(u32, u32, u32); 4] = [
    (ZNODE_IMMUTABLE, 0x0000_0010, 0x0000_0008),
    (ZNODE_APPEND, 0x0000_0020, 0x0000_0010),
    (ZNODE_NODUMP, 0x0000_0040, 0x0000_0080),
    (ZNODE_PROJINHERIT, 0x2000_0000, 0x0000_0200),
];

/// `flags` of one naming (`pick` 1: `FS_*_FL`, 2: `FS_XFLAG_*`) as the
/// znode's; None when one is not kept.
fn znode_flags(flags: u32, pick: fn(&(u32, u32, u32)) -> u32) -> Option<u32> {
    let known = FILE_FLAGS.iter().fold(0, |all, entry| all | pick(entry));
    if flags & !known != 0 {
        return None;
    }
    Some(
        FILE_FLAGS
            .iter()
            .filter(|entry| flags & pick(entry) != 0)
            .fold(0, |all, entry| all | entry.0),
    )
}

/// The znode's `flags` in one naming.
fn linux_flags(flags: u32, pick: fn(&(u32, u32, u32)) -> u32) -> u32 {
    FILE_FLAGS
        .iter()
        .filter(|entry| flags & entry.0 != 0)
        .fold(0, |all, entry| all | pick(entry))
}

/// The file-attribute ioctls (`chattr`, `lsattr`, `chattr -p`): the flags
/// and project id a file keeps ([`crate::pool::filesystem`]'s `attrs`).
/// Any other ioctl is `ENOTTY`, as on a filesystem without it.
async fn file_attr_ioctl(
    fs: &Rc<Filesystem>,
    pool: &Rc<crate::pool::Pool>,
    node: u64,
    flags: u32,
    cmd: u32,
    out_size: u32,
    data: &[u8],
) -> Result<Vec<u8>, FsError> {
    let word = |at: usize| -> Result<u32, FsError> {
        data.get(at..at + 4)
            .map(|bytes| u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
            .ok_or_else(|| {
                FsError::Invalid(format!("ioctl {cmd:#x}: {} bytes of argument", data.len()))
            })
    };
    let unsupported = |flags: u32| {
        FsError::Unsupported(format!(
            "file flags {flags:#x}: kept are immutable, append-only, no-dump and project-inherit"
        ))
    };
    let by_name = |entry: &(u32, u32, u32)| entry.1;
    let by_xflag = |entry: &(u32, u32, u32)| entry.2;
    if flags & proto::IOCTL_UNRESTRICTED != 0 {
        return Err(FsError::NotTty);
    }
    let out = match cmd {
        FS_IOC_GETFLAGS => {
            let (flags, _) = fs.file_flags(node).await?;
            linux_flags(flags, by_name).to_le_bytes().to_vec()
        }
        FS_IOC_SETFLAGS => {
            let asked = word(0)?;
            let flags = znode_flags(asked, by_name).ok_or_else(|| unsupported(asked))?;
            fs.set_file_flags(pool, node, flags, None).await?;
            Vec::new()
        }
        FS_IOC_FSGETXATTR => {
            let (flags, project) = fs.file_flags(node).await?;
            let mut out = vec![0u8; FSXATTR_BYTES];
            out[0..4].copy_from_slice(&linux_flags(flags, by_xflag).to_le_bytes());
            out[12..16].copy_from_slice(&project.to_le_bytes());
            out
        }
        FS_IOC_FSSETXATTR => {
            let asked = word(0)?;
            let project = word(12)?;
            let flags = znode_flags(asked, by_xflag).ok_or_else(|| unsupported(asked))?;
            fs.set_file_flags(pool, node, flags, Some(project)).await?;
            Vec::new()
        }
        _ => return Err(FsError::NotTty),
    };
    Ok(proto::ioctl_out(&out[..out.len().min(out_size as usize)]))
}

/// The SETATTR bits that change something (the others name a file
/// handle or a lock owner, or say how).
const SETATTR_CHANGES: u32 = proto::FATTR_MODE
    | proto::FATTR_UID
    | proto::FATTR_GID
    | proto::FATTR_SIZE
    | proto::FATTR_ATIME
    | proto::FATTR_MTIME
    | proto::FATTR_ATIME_NOW
    | proto::FATTR_MTIME_NOW
    | proto::FATTR_CTIME;

/// The reply to INIT: what the server asks of the kernel.
fn init(session: &Session, major: u32, minor: u32, flags: u32) -> Result<Vec<u8>, FsError> {
    if major != proto::KERNEL_VERSION {
        return Err(FsError::Invalid(format!("FUSE major version {major}")));
    }
    let wanted = proto::ASYNC_READ
        | proto::BIG_WRITES
        | proto::ASYNC_DIO
        | proto::PARALLEL_DIROPS
        | proto::DO_READDIRPLUS
        | proto::READDIRPLUS_AUTO
        | proto::MAX_PAGES
        | proto::HANDLE_KILLPRIV_V2;
    // `writebackcache=on`: the kernel's page cache holds buffered writes
    // and sends them in pages later. It then keeps a regular file's mtime
    // and ctime itself (stamped with its coarse clock, as the server's
    // are) and hands them over in a SETATTR with `FATTR_CTIME`.
    let wanted = if session.writeback_cache {
        wanted | proto::WRITEBACK_CACHE
    } else {
        wanted
    };
    // `acltype=posix`: the kernel checks ACLs and leaves the umask to us.
    let asked = session.fs.posix_acls();
    let wanted = if asked {
        wanted | proto::POSIX_ACL | proto::DONT_MASK
    } else {
        wanted
    };
    let granted = flags & wanted & proto::POSIX_ACL != 0;
    if asked && !granted {
        eprintln!(
            "ironpool: {}: the kernel does not offer POSIX ACLs: acltype=posix is not in force on this mount",
            session.fs.name()
        );
    }
    session.posix_acl.set(Some((asked, granted)));
    // FUSE over io_uring: asked for in flags2, behind INIT_EXT,
    // when the kernel offers it (it sets INIT_EXT itself then).
    let uring = session.uring_offered.is_ok() && flags & proto::INIT_EXT != 0;
    session.start_uring.set(uring);
    let (ext, flags2) = if uring {
        (proto::INIT_EXT, proto::OVER_IO_URING_FLAGS2)
    } else {
        (0, 0)
    };
    Ok(proto::init_out(
        minor.min(proto::KERNEL_MINOR_VERSION),
        (flags & wanted) | ext,
        flags2,
        MAX_BACKGROUND,
        MAX_WRITE_BYTES,
        MAX_PAGES,
    ))
}

/// The reply to a GETXATTR or LISTXATTR whose caller has `size` bytes for
/// `bytes`: their length when it asked with 0, `ERANGE` when they do not fit.
fn sized(bytes: Vec<u8>, size: u32) -> Result<Vec<u8>, FsError> {
    if size == 0 {
        Ok(proto::getxattr_out(bytes.len() as u32))
    } else if bytes.len() > size as usize {
        Err(FsError::Range)
    } else {
        Ok(bytes)
    }
}

/// The FUSE open flags for a file opened with `flags`: `O_DIRECT` opens
/// bypass the kernel's page cache and may write in parallel. Not with the
/// writeback cache: there the kernel may hold a file's newer bytes (and
/// size) in its cache, and only its own `O_DIRECT` path sends those pages
/// before a direct read or write of their range (`FOPEN_DIRECT_IO` waits
/// only for pages already on their way), so a direct read would miss
/// them.
fn open_flags(session: &Session, flags: u32) -> u32 {
    if flags & libc::O_DIRECT as u32 != 0 && !session.writeback_cache {
        proto::FOPEN_DIRECT_IO | proto::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        0
    }
}
