//! `ironpool serve`: import a pool, serve its volumes over NBD and the control
//! socket, and shut down cleanly on SIGINT or SIGTERM (finish requests in flight,
//! commit, mark the pool exported).
//!
//! One thread owns the pool (the engine: devices, trees, txgs, the control
//! socket) and, by default, runs the NBD front end on the same loop (sockets,
//! parsing, replies): two threads cost a wake-up each way per request.
//! `--nbd-thread` gives the front end a thread of its own, exchanging requests
//! and replies with the engine through channels.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use ironpool::control::metrics::MetricsServer;
use ironpool::control::server::ControlServer;
use ironpool::fuse::{Mount, RETIRED_PATIENCE, UNMOUNT_PATIENCE};
use ironpool::nbd::engine::{self, SharedStats};
use ironpool::nbd::server::{BoundListener, Listen, NbdServer};
use ironpool::pool::{Pool, PoolTunables};
use ironpool::rt::channel::channel;
use ironpool::rt::{self, uring, Runtime};

use super::{default_control_path, default_run_dir, remember, search_dirs, Context, RING_ENTRIES};

/// Blocks the termination signals for this thread (and the front end's thread,
/// which inherits the mask) and returns a signalfd that reports them, so the loop
/// reads them like any other event.
fn termination_signals() -> Result<OwnedFd, String> {
    // SAFETY: plain libc calls on a local sigset; the fd returned is owned below.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("cannot block signals".into());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(format!("signalfd: {}", std::io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Turns transparent huge pages off for this process (`serve
/// --no-huge-pages`), before the engine allocates its working memory.
///
/// The allocator (mimalloc) asks for huge pages on its arenas, so where the
/// system allows them every first touch of a fresh 2 MiB of heap is a fault
/// that zeroes all 2 MiB while the loop waits, whatever the allocation's
/// size; and the engine's one loop serves every client. While a 3 GiB file
/// of 16K records under a snapshot was freed, with a QD1 reader on another
/// filesystem: 36-41 polls of the loop over 2 ms with huge pages, 4-5
/// without; the reader's answers over 2 ms 47-57 against 12-17; the
/// server's memory 590 MB against 240-280 MB (and 295 against 237 a second
/// after the removal in another pair). Random 16K writes at QD64 over NBD
/// measured about 5% slower without (16 alternating pairs), which is why
/// the system's setting stays the default.
fn no_transparent_huge_pages() -> Result<(), String> {
    // SAFETY: sets a process attribute; no memory is touched.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "--no-huge-pages: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// How `serve` runs its front ends: NBD, and the metrics endpoint.
pub struct NbdOptions {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (none: the default socket).
    pub listen: Vec<String>,
    /// On a thread of its own rather than the engine's.
    pub thread: bool,
    /// A connection whose replies wait this long on a socket that takes no
    /// bytes is closed (`nbd::server::REPLY_STALL_TIMEOUT` by default).
    pub reply_timeout: std::time::Duration,
    /// Where to serve Prometheus metrics (`tcp:HOST:PORT` or `unix:PATH`).
    pub metrics: Option<String>,
    /// Import although a log device is missing after a crash (`-m`; see
    /// `PoolTunables::discard_missing_log`).
    pub missing_log: bool,
    /// Turn transparent huge pages off for the server
    /// ([`no_transparent_huge_pages`]).
    pub no_huge_pages: bool,
    /// Load the key of every encrypted volume whose `keylocation` is a
    /// file before serving (an unattended start).
    pub load_keys: bool,
}

pub fn serve(
    context: &Context,
    pool_name: &str,
    dirs: &[PathBuf],
    nbd: &NbdOptions,
    pidfile: Option<&Path>,
    tunables: &[String],
) -> Result<(), String> {
    let dirs = search_dirs(pool_name, dirs)?;
    let mut settings = Vec::new();
    for setting in tunables {
        let (name, value) = setting
            .split_once('=')
            .ok_or_else(|| format!("'-o {setting}': use -o NAME=VALUE"))?;
        settings.push((name.to_string(), value.to_string()));
    }
    let mut listens = Vec::new();
    for spec in &nbd.listen {
        listens.push(Listen::parse(spec)?);
    }
    let metrics_listen = match &nbd.metrics {
        Some(spec) => Some(Listen::parse(spec).map_err(|error| format!("--metrics: {error}"))?),
        None => None,
    };
    if listens.is_empty() {
        listens.push(Listen::Unix(
            default_run_dir().join(format!("{pool_name}.sock")),
        ));
    }
    for listen in &listens {
        if let Listen::Unix(path) = listen {
            if let Some(parent) = path
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
            {
                std::fs::create_dir_all(parent)
                    .map_err(|error| format!("{}: {error}", parent.display()))?;
            }
        }
    }
    let control_path = context
        .control
        .clone()
        .unwrap_or_else(|| default_control_path(pool_name));
    let signals = termination_signals()?;
    if nbd.no_huge_pages {
        no_transparent_huge_pages()?;
    }
    let runtime = Runtime::new_uring(RING_ENTRIES * 4)
        .map_err(|error| format!("cannot set up io_uring: {error}"))?;
    runtime.block_on(async {
        let tunables = PoolTunables {
            discard_missing_log: nbd.missing_log,
            ..PoolTunables::default()
        };
        let pool = Pool::import(pool_name, &dirs, tunables)
            .await
            .map_err(|error| super::explain_import(pool_name, error))?;
        remember(pool_name, &dirs);
        // The labels say the pool is in use from now on, not only from its
        // first change: `import` elsewhere then needs -f.
        if let Err(error) = pool.commit().await {
            eprintln!("ironpool: {pool_name}: marking the pool in use failed: {error}");
        }
        for (name, value) in &settings {
            if let Err(error) = pool.set_tunable(name, value) {
                let _ = pool.export().await;
                return Err(format!("-o {name}={value}: {error}"));
            }
        }
        if nbd.load_keys {
            // A key that does not load leaves its volume unserved, not the
            // pool: the others are served, and `load-key` can follow.
            for (name, result) in pool.load_keys_from_files().await {
                if let Err(error) = result {
                    eprintln!("ironpool: {name}: key not loaded: {error}");
                }
            }
        }
        let mut bound = Vec::new();
        let mut failure = None;
        for listen in &listens {
            match BoundListener::bind(listen) {
                Ok(listener) => bound.push(listener),
                Err(error) => {
                    failure = Some(format!("cannot listen: {error}"));
                    break;
                }
            }
        }
        let stats = Arc::new(SharedStats::default());
        let control = match &failure {
            None => match ControlServer::start(&control_path, pool.clone(), Some(stats.clone())) {
                Ok(control) => Some(control),
                Err(error) => {
                    failure = Some(format!("control socket: {error}"));
                    None
                }
            },
            Some(_) => None,
        };
        let metrics = match (&failure, &metrics_listen) {
            (None, Some(listen)) => {
                match MetricsServer::start(listen, pool.clone(), Some(stats.clone())) {
                    Ok(metrics) => Some(metrics),
                    Err(error) => {
                        failure = Some(format!("--metrics: cannot listen: {error}"));
                        None
                    }
                }
            }
            _ => None,
        };
        let mut front_end = None;
        if failure.is_none() {
            let (to_engine, engine_inbox) = channel();
            let (to_front_end, replies) = channel();
            let (stop, mut stopped) = channel::<()>();
            let front_stats = stats.clone();
            let reply_timeout = nbd.reply_timeout;
            let run_front_end = move || async move {
                let server = NbdServer::new(to_engine, front_stats, reply_timeout);
                for listener in bound {
                    server.serve_listener(listener);
                }
                rt::spawn(server.clone().deliver_replies(replies));
                let _ = stopped.recv_batch().await;
                server.shutdown().await;
            };
            let thread = if !nbd.thread {
                FrontEnd::Task(rt::spawn(run_front_end()))
            } else {
                FrontEnd::Thread(
                    std::thread::Builder::new()
                        .name("ironpool-nbd".into())
                        .spawn(move || -> Result<(), String> {
                            let runtime = Runtime::new_uring(RING_ENTRIES * 4)
                                .map_err(|error| format!("cannot set up io_uring: {error}"))?;
                            runtime.block_on(run_front_end());
                            Ok(())
                        })
                        .map_err(|error| format!("cannot start the NBD thread: {error}"))?,
                )
            };
            let engine = rt::spawn(engine::serve(
                pool.clone(),
                engine_inbox,
                to_front_end,
                stats.clone(),
                !nbd.thread,
            ));
            front_end = Some((thread, stop, engine));
        }
        if failure.is_none() {
            // What the import found is said before the pidfile says the
            // server is up: whoever waits for the pidfile and then reads
            // the log (a test after a kill -9, an operator's script) finds
            // it there.
            for note in &pool.notes() {
                eprintln!("ironpool: {pool_name}: {note}");
            }
            if let Some(pidfile) = pidfile {
                if let Err(error) = std::fs::write(pidfile, format!("{}\n", std::process::id())) {
                    failure = Some(format!("{}: {error}", pidfile.display()));
                }
            }
        }
        if failure.is_none() {
            let exports: Vec<String> = pool
                .visible_volumes()
                .iter()
                .filter(|volume| pool.volume_key_available(volume))
                .map(|volume| volume.name())
                .collect();
            let serving = format!(
                "serving pool '{pool_name}' (txg {}) exports [{}] on {} (control {}{})",
                pool.txg().durable(),
                exports.join(", "),
                listens.iter().map(describe).collect::<Vec<_>>().join(", "),
                control_path.display(),
                metrics_listen
                    .as_ref()
                    .map(|listen| format!(", metrics {}", describe(listen)))
                    .unwrap_or_default()
            );
            eprintln!("ironpool: {serving}");
            // The pool is imported and every listener accepts connections
            // (the kernel queues them until the front end takes them).
            notify_service_manager(&format!("READY=1\nSTATUS={serving}"));
            // Filesystems are mounted now and whenever one is created or
            // destroyed while the server runs.
            let mounts: Rc<RefCell<BTreeMap<String, Mount>>> = Rc::default();
            // Each wait for a change starts before the reconcile it
            // follows: a change while that reconcile awaits a mount(2) is
            // seen by the next one, not lost.
            let mut changed = Box::pin(pool.filesystems_changed());
            reconcile_mounts(&pool, &mounts).await;
            // The watcher finishes a reconcile under way before it stops:
            // cut off between a mount(2) and its record, a mount would be
            // left with no server.
            let stopping = rt::sync::Notify::new();
            // Made before either runs: a stop asked at once is not missed.
            let stopped = stopping.notified();
            let watcher = async {
                let mut stopped = std::pin::pin!(stopped);
                loop {
                    if let futures_util::future::Either::Right(_) =
                        futures_util::future::select(changed.as_mut(), stopped.as_mut()).await
                    {
                        break;
                    }
                    changed = Box::pin(pool.filesystems_changed());
                    reconcile_mounts(&pool, &mounts).await;
                }
            };
            let asked = pool.export_requested();
            let stop = async {
                futures_util::future::select(
                    std::pin::pin!(wait_for_signal(&signals)),
                    std::pin::pin!(asked),
                )
                .await;
                stopping.notify_all();
            };
            futures_util::future::join(stop, watcher).await;
            // Filesystems first, all at once (each may wait out its
            // patience for open files): their requests finish, then the
            // kernel lets go.
            let mounted = std::mem::take(&mut *mounts.borrow_mut());
            let stops = mounted.into_iter().map(|(name, mount)| {
                pool.note_mount(&name, None);
                let path = mount.mountpoint().display().to_string();
                let pool_name = &pool_name;
                async move {
                    mount.stop(Some(UNMOUNT_PATIENCE)).await;
                    eprintln!("ironpool: unmounted {pool_name}/{name} from {path}");
                }
            });
            futures_util::future::join_all(stops).await;
            notify_service_manager("STOPPING=1\nSTATUS=finishing requests and exporting");
            eprintln!("ironpool: shutting down: finishing requests in flight");
        }
        if let Some((thread, stop, engine)) = front_end {
            // The front end drains its connections, then drops its end of the
            // request channel, which ends the engine side.
            let _ = stop.send(());
            engine.await;
            match thread {
                FrontEnd::Thread(thread) => {
                    if let Ok(Err(error)) = thread.join() {
                        failure.get_or_insert(error);
                    }
                }
                FrontEnd::Task(task) => task.await,
            }
        }
        if let Some(control) = &control {
            control.stop();
        }
        if let Some(metrics) = &metrics {
            metrics.stop();
        }
        let exported = pool.export().await;
        if let Some(pidfile) = pidfile {
            let _ = std::fs::remove_file(pidfile);
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        exported.map_err(|error| format!("export failed: {error}"))?;
        eprintln!("ironpool: pool '{pool_name}' exported");
        Ok(())
    })
}

/// Mounts the pool's filesystems that are not mounted (at their
/// mountpoints), moves those whose mountpoint changed, remounts those
/// whose `atime` or `readonly` changed, and unmounts those destroyed,
/// unmounted by `ironpool unmount` or set to `mountpoint=none`.
/// A filesystem that cannot be mounted (no `/dev/fuse`, not root) is
/// reported; volumes are served regardless.
async fn reconcile_mounts(pool: &Rc<Pool>, mounts: &Rc<RefCell<BTreeMap<String, Mount>>>) {
    let mut wanted = BTreeMap::new();
    for (short, fs) in pool.filesystems() {
        if let Some(path) = pool.filesystem_mountpoint(&short) {
            if pool.mount_wanted(&short) {
                wanted.insert(short, (fs, path));
            }
        }
    }
    let stale: Vec<String> = mounts
        .borrow()
        .iter()
        .filter(|(name, mount)| match wanted.get(*name) {
            Some((fs, path)) => !mount.serves(fs) || mount.mountpoint() != Path::new(path),
            None => true,
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in stale {
        let mount = mounts.borrow_mut().remove(&name);
        if let Some(mount) = mount {
            let path = mount.mountpoint().display().to_string();
            // Detached now, before a replacement (a rolled-back filesystem)
            // is mounted on the same path; the session ends when its last
            // open file closes, which need not hold up the other mounts.
            // Files open in a filesystem rolled back or destroyed get only
            // ESTALE: their session is aborted after a second.
            mount.detach().await;
            // Noted once off its path: `unmount` answers when it is.
            pool.note_mount(&name, None);
            let patience = mount.serves_retired().then_some(RETIRED_PATIENCE);
            let pool_name = pool.name().to_string();
            rt::spawn(async move {
                mount.stop(patience).await;
                eprintln!("ironpool: unmounted {pool_name}/{name} from {path}");
            });
        }
    }
    // Parents before children: a name sorts after its parent's, and a
    // child's mountpoint is made inside its parent's mount.
    for (short, (fs, path)) in wanted {
        // Out of the map while the remount runs (the map is not borrowed
        // across it); reconciles run one at a time.
        let existing = mounts.borrow_mut().remove(&short);
        if let Some(mount) = existing {
            if let Err(error) = mount.follow_properties().await {
                eprintln!(
                    "ironpool: cannot change the mount flags of {} at {path}: {error}",
                    fs.name()
                );
            }
            mounts.borrow_mut().insert(short, mount);
            continue;
        }
        match Mount::start(pool.clone(), fs.clone(), Path::new(&path)).await {
            Ok(mount) => {
                eprintln!("ironpool: mounted {} at {path}", fs.name());
                mounts.borrow_mut().insert(short.clone(), mount);
                pool.note_mount(&short, Some(path));
            }
            Err(error) => eprintln!("ironpool: cannot mount {} at {path}: {error}", fs.name()),
        }
    }
}

/// Where the NBD front end runs.
enum FrontEnd {
    Thread(std::thread::JoinHandle<Result<(), String>>),
    Task(rt::JoinHandle<()>),
}

/// Tells a service manager (systemd's `Type=notify`) how the server is, by
/// the `sd_notify` protocol: one datagram to the unix socket named in
/// `NOTIFY_SOCKET` (a path, or an abstract name written with a leading
/// `@`). Without that variable it does nothing; a failure is reported and
/// not fatal (the manager then times the start out itself).
fn notify_service_manager(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    let address = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&target),
    };
    let sent = address.and_then(|address| {
        let socket = UnixDatagram::unbound()?;
        let message = format!("{state}\nMAINPID={}", std::process::id());
        socket.send_to_addr(message.as_bytes(), &address)
    });
    if let Err(error) = sent {
        eprintln!("ironpool: cannot notify the service manager at {target}: {error}");
    }
}

fn describe(listen: &Listen) -> String {
    match listen {
        Listen::Unix(path) => format!("unix:{}", path.display()),
        Listen::Tcp(address) => format!("tcp:{address}"),
    }
}

async fn wait_for_signal(signals: &OwnedFd) {
    loop {
        // One signalfd_siginfo is 128 bytes.
        let (result, _) = uring::read_bytes(signals.as_raw_fd(), vec![0u8; 128]).await;
        match result {
            Ok(_) => return,
            Err(error) if error.raw_os_error() == Some(libc::EINTR) => continue,
            Err(error) => {
                eprintln!("ironpool: reading signals failed ({error}); shutting down");
                return;
            }
        }
    }
}
