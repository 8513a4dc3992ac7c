//! ironpool targets: the tool creates disk images, a pool and a volume with
//! the `ironpool` CLI, serves the volume over NBD on a unix socket, and reads
//! device and volume counters with `ironpool iostat --json`.
//!
//! The CLI contract this code relies on (OUT/SLUG is the target's directory):
//! ```text
//! ironpool create --size 2G -f bench [mirror|raidzN] OUT/SLUG/d0.img OUT/SLUG/d1.img [log OUT/SLUG/log.img]
//! ironpool serve -d OUT/SLUG --nbd unix:OUT/SLUG/nbd.sock --control OUT/SLUG/ctl.sock \
//!     --pidfile OUT/SLUG/serve.pid bench
//! ironpool volume create --control OUT/SLUG/ctl.sock bench/vol 1024M [--sparse] -o volblocksize=16K [-o prop=val]
//! ironpool list --json --control OUT/SLUG/ctl.sock
//! ironpool iostat --json --control OUT/SLUG/ctl.sock bench
//! ironpool set --control OUT/SLUG/ctl.sock sync=always bench/vol
//! ```
//! The volume is `nbd+unix:///bench/vol?socket=OUT/SLUG/nbd.sock`; the server
//! stops (exporting the pool) on SIGTERM.
//!
//! An `ironpool-fs` target makes a filesystem instead of the volume, which the
//! server mounts over FUSE, and fio runs on a file of it (io_uring,
//! `direct=1`); that needs root and `/dev/fuse`:
//! ```text
//! ironpool fs create --control OUT/SLUG/ctl.sock bench/fs -o mountpoint=OUT/SLUG/mnt -o recordsize=16K [-o prop=val]
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::nbd::{check_socket_path, unix_uri};
use super::process::{command_argv, run_command, run_command_with_env, ServerProcess};
use super::{files, Access, FillMethod, Instance, IronpoolSpec, Layout, Purpose, SetupContext};
use crate::ironpool_stats::{parse_iostat, parse_list, IostatSnapshot, PoolSpace};
use crate::units::{bytes_human, parse_size, size_short, KIB, MIB};

/// The pool every ironpool target creates (one target runs at a time).
pub const POOL_NAME: &str = "bench";
/// The environment variable of the server's poll window (the engine's
/// `IRONPOOL_POLL_US`), set by a target's `poll_us=N`.
const POLL_ENV: &str = "IRONPOOL_POLL_US";
/// The benchmarked volume.
pub const VOLUME_NAME: &str = "vol";
/// The benchmarked filesystem (`ironpool-fs`) and the file fio uses in it.
pub const FILESYSTEM_NAME: &str = "fs";
const FILESYSTEM_FILE: &str = "bench.dat";
/// volblocksize unless the spec sets one: the 16K of the qd-scaling writes,
/// and OpenZFS's default for volumes.
pub const DEFAULT_VOLBLOCKSIZE_BYTES: u64 = 16 * KIB;
/// The largest working set as a share of usable capacity: a copy-on-write
/// pool needs free space to write into, and over 80% full is a pitfall.
pub const VOLUME_MAX_PERCENT: u64 = 80;
/// What the fill suite's volume or filesystem caches of its data: nothing,
/// so that its reads at every level go to the devices (a working set the
/// read cache held would measure the cache, not the fragmentation the
/// suite is about), unless the target's spec sets `primarycache` itself.
pub const FILL_PRIMARYCACHE: &str = "metadata";
/// Commits in a row that make a pool's freed blocks count as free: a freed
/// block waits two transaction groups before reuse (ironpool's
/// `alloc::DEFER_TXGS`, as OpenZFS defers frees), and each `ironpool sync`
/// commits one, empty or not.
const SETTLE_COMMITS: usize = 3;
/// `ironpool create`, `volume create`, `list` and `iostat` are local and
/// quick; a minute means something is stuck.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Import of a fresh pool and binding two sockets; also the wait for a new
/// filesystem's mount.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Size of the zero buffer that writes disk images out (`--write-out`).
const WRITE_OUT_CHUNK_BYTES: usize = MIB as usize;

/// A running ironpool pool we can query.
#[derive(Debug, Clone)]
pub struct IronpoolPool {
    exe: PathBuf,
    /// The target's directory: also ironpool's run directory and pool cache,
    /// so benchmark pools stay out of /run/ironpool and /var/lib/ironpool.
    dir: PathBuf,
    control: PathBuf,
    nbd_socket: PathBuf,
    disks: Vec<PathBuf>,
    /// `pool/volume` or `pool/filesystem`: the dataset fio drives.
    dataset: String,
    /// Block size of the benchmarked volume (volblocksize) or filesystem
    /// (recordsize).
    pub volblocksize_bytes: u64,
    /// The executable makes volumes sparse on request (`volume create
    /// --sparse`; older builds made every volume sparse and know no flag).
    sparse_flag: bool,
    /// The shape of the pool's first vdev, which [`IronpoolPool::add_vdev`]
    /// repeats: layout, data disks, size of each.
    layout: Layout,
    disk_count: u32,
    disk_size_bytes: u64,
}

impl IronpoolPool {
    /// The command line so far: the executable.
    fn base_argv(&self) -> Vec<String> {
        vec![self.exe.display().to_string()]
    }

    /// Runs an ironpool command with this target's environment.
    fn run(&self, argv: &[String]) -> Result<String> {
        run_isolated(argv, &self.dir)
    }

    /// `ironpool iostat --json`.
    pub fn iostat(&self) -> Result<IostatSnapshot> {
        let mut argv = self.base_argv();
        argv.extend([
            "iostat".into(),
            "--json".into(),
            "--control".into(),
            self.control.display().to_string(),
            POOL_NAME.into(),
        ]);
        parse_iostat(&self.run(&argv)?)
    }

    /// `ironpool list --json`, this pool's entry.
    pub fn space(&self) -> Result<PoolSpace> {
        let mut argv = self.base_argv();
        argv.extend([
            "list".into(),
            "--json".into(),
            "--control".into(),
            self.control.display().to_string(),
            POOL_NAME.into(),
        ]);
        parse_list(&self.run(&argv)?, POOL_NAME)
    }

    /// The pool's space once every change answered so far is committed and
    /// the blocks the last writes replaced are free again
    /// ([`SETTLE_COMMITS`] × `ironpool sync`): what the fill suite
    /// measures. Without it, blocks still held in memory and frees not yet
    /// usable make the level read lower or higher than the live data (a
    /// sequential rewrite of a 192 MiB working set read 49% on a pool at
    /// 40%), and the fillers of the next level miss it.
    pub fn settled_space(&self) -> Result<PoolSpace> {
        let mut argv = self.base_argv();
        argv.extend([
            "sync".into(),
            "--control".into(),
            self.control.display().to_string(),
            POOL_NAME.into(),
        ]);
        for _ in 0..SETTLE_COMMITS {
            self.run(&argv)
                .context("committing the pool before measuring its fill")?;
        }
        self.space()
    }

    /// `ironpool set KEY=VALUE` on the benchmarked dataset; returns the
    /// command.
    pub fn set_property(&self, key: &str, value: &str) -> Result<Vec<String>> {
        let mut argv = self.base_argv();
        argv.extend([
            "set".into(),
            "--control".into(),
            self.control.display().to_string(),
            format!("{key}={value}"),
            self.dataset.clone(),
        ]);
        self.run(&argv)
            .with_context(|| format!("setting {key}={value} on {}", self.dataset))?;
        Ok(argv)
    }

    /// The value of property `key` of the benchmarked dataset (`ironpool
    /// get`).
    pub fn property(&self, key: &str) -> Result<String> {
        let (argv, _) = self.command("get", &["--json".into(), key.into(), self.dataset.clone()]);
        let text = self
            .run(&argv)
            .with_context(|| format!("reading {key} of {}", self.dataset))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("`ironpool get --json` printed no JSON: {text}"))?;
        json["properties"][0]["value"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("`ironpool get --json {key}` has no value: {text}"))
    }

    /// `ironpool add` of a vdev like the pool's first: the same layout
    /// with as many new disk images of the same size (one disk for a
    /// stripe), created by `add --size` in the target's directory and
    /// removed with the others. Returns the command.
    pub fn add_vdev(&mut self) -> Result<Vec<String>> {
        let vdev = self.disks.len();
        let count = if self.layout == Layout::Stripe {
            1
        } else {
            self.disk_count
        };
        let new: Vec<PathBuf> = (0..count)
            .map(|i| self.dir.join(format!("grow{vdev}-{i}.img")))
            .collect();
        let mut args = vec![
            "--size".to_string(),
            size_short(self.disk_size_bytes),
            POOL_NAME.to_string(),
        ];
        args.extend(self.layout.create_word());
        args.extend(new.iter().map(|d| d.display().to_string()));
        let (argv, _) = self.command("add", &args);
        // Whatever `add` created is ours to remove, even if it failed.
        self.disks.extend(new);
        self.run(&argv).context("adding a vdev to the pool")?;
        Ok(argv)
    }

    /// Each data vdev's allocation (`ironpool list -v`):
    /// `mirror-0 1.2 GiB of 2.0 GiB (12% fragmented), mirror-1 180 MiB of
    /// 2.0 GiB (0% fragmented)`.
    pub fn vdev_allocation(&self) -> Result<String> {
        let (argv, _) = self.command("list", &["--json".into(), "-v".into(), POOL_NAME.into()]);
        let text = self.run(&argv).context("listing the pool's vdevs")?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("`ironpool list --json -v` printed no JSON: {text}"))?;
        let vdevs = json["pools"][0]["vdevs"]
            .as_array()
            .with_context(|| format!("`ironpool list --json -v` has no vdevs: {text}"))?;
        Ok(vdevs
            .iter()
            .filter(|v| !v["log"].as_bool().unwrap_or(false))
            .map(|v| {
                let bytes = |key: &str| bytes_human(v[key].as_u64().unwrap_or(0) as f64);
                format!(
                    "{} {} of {} ({}% fragmented)",
                    v["name"].as_str().unwrap_or("?"),
                    bytes("allocated_bytes"),
                    bytes("size_bytes"),
                    v["fragmentation_percent"].as_u64().unwrap_or(0)
                )
            })
            .collect::<Vec<_>>()
            .join(", "))
    }

    /// `ironpool snapshot DATASET@NAME` of the benchmarked dataset; returns
    /// the command.
    pub fn snapshot(&self, name: &str) -> Result<Vec<String>> {
        let dataset = self.dataset.clone();
        self.snapshot_of(&dataset, name)
    }

    /// `ironpool snapshot DATASET@NAME` of `dataset` (`POOL/NAME`).
    pub fn snapshot_of(&self, dataset: &str, name: &str) -> Result<Vec<String>> {
        let mut argv = self.base_argv();
        argv.extend([
            "snapshot".into(),
            "--control".into(),
            self.control.display().to_string(),
            format!("{dataset}@{name}"),
        ]);
        self.run(&argv)
            .with_context(|| format!("taking snapshot {dataset}@{name}"))?;
        Ok(argv)
    }

    /// Creates filesystem `POOL/NAME` with `properties`, mounted at
    /// `TARGET_DIR/NAME`, and waits for its mount; returns the mountpoint
    /// and the command.
    pub fn create_filesystem(
        &self,
        name: &str,
        properties: &[(&str, &str)],
    ) -> Result<(PathBuf, Vec<String>)> {
        let mountpoint = self.dir.join(name);
        let mut argv = self.base_argv();
        argv.extend([
            "fs".into(),
            "create".into(),
            "--control".into(),
            self.control.display().to_string(),
            format!("{POOL_NAME}/{name}"),
            "-o".into(),
            format!("mountpoint={}", mountpoint.display()),
        ]);
        for (key, value) in properties {
            argv.extend(["-o".into(), format!("{key}={value}")]);
        }
        self.run(&argv)
            .with_context(|| format!("creating filesystem {POOL_NAME}/{name}"))?;
        wait_mounted(&mountpoint, &self.dir)?;
        Ok((mountpoint, argv))
    }

    /// `ironpool tune POOL arc_drop 1`: empties the read cache; returns the
    /// command.
    pub fn drop_cache(&self) -> Result<Vec<String>> {
        let mut argv = self.base_argv();
        argv.extend([
            "tune".into(),
            "--control".into(),
            self.control.display().to_string(),
            POOL_NAME.into(),
            "arc_drop".into(),
            "1".into(),
        ]);
        self.run(&argv).context("emptying the read cache")?;
        Ok(argv)
    }

    /// The command line of `ironpool SUBCOMMAND --control SOCKET ARGS...`
    /// for this target, and the environment it runs in ([`isolating_env`]):
    /// for a command run elsewhere (the stall suite runs its actions on a
    /// thread of their own).
    pub fn command(
        &self,
        subcommand: &str,
        args: &[String],
    ) -> (Vec<String>, Vec<(String, PathBuf)>) {
        let mut argv = self.base_argv();
        argv.extend([
            subcommand.to_string(),
            "--control".into(),
            self.control.display().to_string(),
        ]);
        argv.extend(args.iter().cloned());
        let env = isolating_env(&self.dir)
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect();
        (argv, env)
    }

    /// `ironpool sync POOL`: every change so far durable (a commit).
    pub fn sync(&self) -> Result<Vec<String>> {
        let (argv, _) = self.command("sync", &[POOL_NAME.to_string()]);
        self.run(&argv).context("committing the pool")?;
        Ok(argv)
    }

    /// A volume `POOL/NAME` of `size_bytes` beside the benchmarked dataset,
    /// 16K blocks; its NBD access and the command.
    pub fn create_side_volume(&self, name: &str, size_bytes: u64) -> Result<(Access, Vec<String>)> {
        let properties = [("volblocksize".to_string(), "16K".to_string())];
        self.create_volume(name, size_bytes, &properties)
    }

    /// The benchmarked dataset, `POOL/NAME`.
    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// Whether the benchmarked dataset is a filesystem (else a volume).
    pub fn is_filesystem(&self) -> bool {
        self.dataset == format!("{POOL_NAME}/{FILESYSTEM_NAME}")
    }

    /// `ironpool send [-i @FROM] DATASET@SNAPSHOT | ironpool receive
    /// POOL/INTO`: a full stream creates the copy (a filesystem's mounted
    /// under the target's directory), an incremental one updates it
    /// (`-F`). The stream passes through this process, counted on its way
    /// as `pv` would. Returns its bytes, the seconds from the start of
    /// `send` to the end of `receive`, and the two commands.
    pub fn send_receive(
        &self,
        from: Option<&str>,
        snapshot: &str,
        into: &str,
    ) -> Result<(u64, f64, Vec<Vec<String>>)> {
        let dataset = self.dataset.clone();
        self.send_receive_of(&dataset, self.is_filesystem(), from, snapshot, into)
    }

    /// [`IronpoolPool::send_receive`] of `dataset` (`POOL/NAME`), a
    /// filesystem or not.
    pub fn send_receive_of(
        &self,
        dataset: &str,
        filesystem: bool,
        from: Option<&str>,
        snapshot: &str,
        into: &str,
    ) -> Result<(u64, f64, Vec<Vec<String>>)> {
        let control = self.control.display().to_string();
        let mut send = self.base_argv();
        send.extend(["send".into(), "--control".into(), control.clone()]);
        if let Some(from) = from {
            send.extend(["-i".into(), format!("@{from}")]);
        }
        send.push(format!("{dataset}@{snapshot}"));
        let mut receive = self.base_argv();
        receive.extend(["receive".into(), "--control".into(), control]);
        if from.is_some() {
            receive.push("-F".into());
        } else if filesystem {
            receive.extend([
                "-o".into(),
                format!("mountpoint={}", self.dir.join(into).display()),
            ]);
        }
        receive.push(format!("{POOL_NAME}/{into}"));
        let spawn = |argv: &[String], stdin: Stdio, stdout: Stdio| {
            Command::new(&argv[0])
                .args(&argv[1..])
                .envs(isolating_env(&self.dir))
                .stdin(stdin)
                .stdout(stdout)
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", argv.join(" ")))
        };
        let start = Instant::now();
        let mut sender = spawn(&send, Stdio::null(), Stdio::piped())?;
        let mut receiver = match spawn(&receive, Stdio::piped(), Stdio::null()) {
            Ok(receiver) => receiver,
            Err(error) => {
                let _ = sender.kill();
                let _ = sender.wait();
                return Err(error);
            }
        };
        // A receiver that stops early closes the pipe: the copy then fails
        // with EPIPE, reported below with the receiver's own error, rather
        // than killing this process (the ironpool binary, which embeds the
        // tool, lets SIGPIPE end it, as a command in a shell pipeline).
        let _pipe = IgnoreSigpipe::new();
        let copied = match (sender.stdout.take(), receiver.stdin.take()) {
            (Some(mut from), Some(mut to)) => std::io::copy(&mut from, &mut to),
            _ => Err(std::io::Error::other("no pipe to the child")),
        };
        // The receiver sees the end of the stream once its stdin is gone.
        let sent = sender.wait_with_output();
        let received = receiver.wait_with_output();
        let seconds = start.elapsed().as_secs_f64();
        let failed = |argv: &[String], output: std::io::Result<std::process::Output>| match output {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(format!(
                "{} exited with {}: {}",
                argv.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(error) => Some(format!("{}: {error}", argv.join(" "))),
        };
        let problems: Vec<String> = [failed(&send, sent), failed(&receive, received)]
            .into_iter()
            .flatten()
            .collect();
        if !problems.is_empty() {
            bail!("{}", problems.join("; "));
        }
        let bytes = copied.context("passing the stream from send to receive")?;
        Ok((bytes, seconds, vec![send, receive]))
    }

    /// `ironpool destroy -r POOL/NAME`; returns the command.
    pub fn destroy(&self, name: &str) -> Result<Vec<String>> {
        let mut argv = self.base_argv();
        argv.extend([
            "destroy".into(),
            "--control".into(),
            self.control.display().to_string(),
            "-r".into(),
            format!("{POOL_NAME}/{name}"),
        ]);
        self.run(&argv)
            .with_context(|| format!("destroying {POOL_NAME}/{name}"))?;
        Ok(argv)
    }

    /// `pool/volume` (or `pool/filesystem`), the name `iostat` reports.
    pub fn volume_name(&self) -> String {
        self.dataset.clone()
    }

    /// The disk images, removed at teardown.
    pub fn disk_paths(&self) -> &[PathBuf] {
        &self.disks
    }

    /// Creates a volume, sparse: a reservation changes no I/O, and the
    /// fill suite's fillers take the pool's space by writing it, as the
    /// volume does (a thick volume's reservation would count its space
    /// before it is written). Returns its NBD access and the command.
    fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        properties: &[(String, String)],
    ) -> Result<(Access, Vec<String>)> {
        let mut argv = self.base_argv();
        argv.extend([
            "volume".into(),
            "create".into(),
            "--control".into(),
            self.control.display().to_string(),
            format!("{POOL_NAME}/{name}"),
            format!("{}M", size_bytes / MIB),
        ]);
        if self.sparse_flag {
            argv.push("--sparse".into());
        }
        for (key, value) in with_key_file(&self.dir, properties)? {
            argv.extend(["-o".into(), format!("{key}={value}")]);
        }
        self.run(&argv)
            .with_context(|| format!("creating volume {POOL_NAME}/{name}"))?;
        Ok((
            Access::Nbd(unix_uri(&format!("{POOL_NAME}/{name}"), &self.nbd_socket)),
            argv,
        ))
    }

    /// A filler volume for the fill suite, rounded up to whole MiB, with
    /// the working set's block size: the pool fills with blocks like the
    /// ones the tests then allocate (larger ones find no room in the
    /// pieces the tests' overwrites free long before the pool is full:
    /// ironpool has no gang blocks to split them).
    pub fn create_filler(&self, name: &str, size_bytes: u64) -> Result<(Access, Vec<String>)> {
        let rounded = size_bytes.div_ceil(MIB).max(1) * MIB;
        let properties = [(
            "volblocksize".to_string(),
            size_short(self.volblocksize_bytes),
        )];
        self.create_volume(name, rounded, &properties)
    }
}

/// `properties`, and when they ask for an encrypted volume or filesystem
/// (`encryption=on`) without saying where its key is, a key the tool
/// makes: a file in the target's directory `dir`, random, in the
/// `keyformat` asked for (raw by default), named by `keylocation`.
/// The key stays loaded for the server's life, so every suite runs.
fn with_key_file(dir: &Path, properties: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let mut properties = properties.to_vec();
    let value = |name: &str, properties: &[(String, String)]| {
        properties
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let encrypted = value("encryption", &properties).is_some_and(|value| value != "off");
    if !encrypted || value("keylocation", &properties).is_some() {
        return Ok(properties);
    }
    let format = value("keyformat", &properties).unwrap_or_else(|| {
        properties.push(("keyformat".into(), "raw".into()));
        "raw".into()
    });
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut random))
        .context("reading /dev/urandom for a dataset key")?;
    let hex: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
    let material = match format.as_str() {
        "raw" => random.to_vec(),
        "hex" => hex.into_bytes(),
        _ => format!("bench passphrase {hex}\n").into_bytes(),
    };
    let path = dir.join("dataset.key");
    std::fs::write(&path, material).context("writing the dataset key")?;
    properties.push(("keylocation".into(), format!("file://{}", path.display())));
    Ok(properties)
}

/// SIGPIPE ignored while it lives, its former disposition put back after.
struct IgnoreSigpipe(libc::sighandler_t);

impl IgnoreSigpipe {
    fn new() -> IgnoreSigpipe {
        // SAFETY: signal() with a valid signal number and SIG_IGN; the tool
        // runs its commands from one thread.
        IgnoreSigpipe(unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) })
    }
}

impl Drop for IgnoreSigpipe {
    fn drop(&mut self) {
        if self.0 != libc::SIG_ERR {
            // SAFETY: puts back the disposition signal() returned.
            unsafe { libc::signal(libc::SIGPIPE, self.0) };
        }
    }
}

/// Environment of every ironpool command: the target directory as run
/// directory and pool cache (IRONPOOL_RUN_DIR, IRONPOOL_CACHE).
fn isolating_env(dir: &Path) -> [(&'static str, PathBuf); 2] {
    [
        ("IRONPOOL_RUN_DIR", dir.to_path_buf()),
        ("IRONPOOL_CACHE", dir.join("pools.json")),
    ]
}

/// Runs an ironpool command with [`isolating_env`].
fn run_isolated(argv: &[String], dir: &Path) -> Result<String> {
    let env = isolating_env(dir);
    let env: Vec<(&str, &Path)> = env
        .iter()
        .map(|(key, value)| (*key, value.as_path()))
        .collect();
    run_command_with_env(argv, &env, COMMAND_TIMEOUT)
}

/// Creates the pool, starts the server and creates the volume.
pub fn setup(
    spec: &IronpoolSpec,
    label: &str,
    slug: &str,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    let dir = context.out_dir.join(slug);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let control = dir.join("ctl.sock");
    let nbd_socket = dir.join("nbd.sock");
    let pidfile = dir.join("serve.pid");
    check_socket_path(&control)?;
    check_socket_path(&nbd_socket)?;
    for stale in [&control, &nbd_socket, &pidfile] {
        files::remove_if_present(stale)?;
    }
    let mut disks: Vec<PathBuf> = (0..spec.disk_count)
        .map(|i| dir.join(format!("d{i}.img")))
        .collect();
    let log = spec.log.then(|| dir.join("log.img"));
    disks.extend(log.clone());
    for disk in &disks {
        files::create_sparse(disk, spec.disk_size_bytes)?;
        if context.write_out_disks {
            write_out(disk, spec.disk_size_bytes)?;
        }
    }
    let exe = spec
        .bin
        .clone()
        .unwrap_or_else(|| context.ironpool.to_path_buf());
    let mut commands = Vec::new();

    let mut create = vec![
        exe.display().to_string(),
        "create".into(),
        "--size".into(),
        size_short(spec.disk_size_bytes),
        "-f".into(),
        POOL_NAME.into(),
    ];
    create.extend(spec.layout.create_word());
    create.extend(
        disks
            .iter()
            .filter(|d| Some(*d) != log.as_ref())
            .map(|d| d.display().to_string()),
    );
    if let Some(log) = &log {
        create.extend(["log".to_string(), log.display().to_string()]);
    }
    run_isolated(&create, &dir).context("creating the ironpool pool")?;
    commands.push(create);

    let mut serve = Command::new(&exe);
    serve
        .arg("serve")
        .arg("-d")
        .arg(&dir)
        .arg("--nbd")
        .arg(format!("unix:{}", nbd_socket.display()))
        .arg("--control")
        .arg(&control)
        .arg("--pidfile")
        .arg(&pidfile)
        .arg(POOL_NAME)
        .envs(isolating_env(&dir));
    if let Some(us) = spec.poll_us {
        serve.env(POLL_ENV, us.to_string());
    }
    let mut serve_argv = command_argv(&serve);
    if let Some(us) = spec.poll_us {
        serve_argv.insert(0, format!("{POLL_ENV}={us}"));
    }
    commands.push(serve_argv);
    let mut server = ServerProcess::spawn("ironpool serve", &mut serve, &dir.join("serve.log"))?;
    server.wait_ready(&[&pidfile, &control, &nbd_socket], SERVER_START_TIMEOUT)?;
    for (name, value) in &spec.tunables {
        let tune = vec![
            exe.display().to_string(),
            "tune".to_string(),
            "--control".to_string(),
            control.display().to_string(),
            POOL_NAME.to_string(),
            name.clone(),
            value.clone(),
        ];
        run_isolated(&tune, &dir).with_context(|| format!("setting tunable {name}={value}"))?;
        commands.push(tune);
    }

    if spec.filesystem {
        return setup_filesystem(
            spec, label, &dir, server, commands, exe, control, nbd_socket, disks, context,
        );
    }
    let mut properties = spec.properties.clone();
    let volblocksize_bytes = block_size_property(&mut properties, "volblocksize")?;
    let cache = fill_cache_property(&mut properties, context);
    let runtime_files = vec![
        control.clone(),
        nbd_socket.clone(),
        pidfile.clone(),
        dir.join("pools.json"),
    ];
    let sparse_flag = knows_sparse(&exe);
    let pool = IronpoolPool {
        exe,
        dir: dir.clone(),
        control,
        nbd_socket,
        disks,
        dataset: format!("{POOL_NAME}/{VOLUME_NAME}"),
        volblocksize_bytes,
        sparse_flag,
        layout: spec.layout,
        disk_count: spec.disk_count,
        disk_size_bytes: spec.disk_size_bytes,
    };
    let capacity = pool.space()?.size_bytes;
    let size_bytes = working_set_bytes(context, capacity, volblocksize_bytes)?;
    let (access, volume_command) = pool.create_volume(VOLUME_NAME, size_bytes, &properties)?;
    commands.push(volume_command);

    let mut instance = Instance::new(label.to_string(), "ironpool", access, size_bytes);
    instance.setup_commands = commands;
    instance.owned_files = runtime_files;
    instance.server = Some(server);
    instance.record_size_bytes = Some(volblocksize_bytes);
    instance.fill = FillMethod::Pool;
    instance.description = format!(
        "ironpool {} of {} x {} images{} in {} ({} usable), volume {}/{VOLUME_NAME} of {} \
         (volblocksize {}{cache}) over NBD on a unix socket; fio nbd engine",
        spec.layout.name(),
        spec.disk_count,
        bytes_human(spec.disk_size_bytes as f64),
        images_note(spec, context),
        dir.display(),
        bytes_human(capacity as f64),
        POOL_NAME,
        bytes_human(size_bytes as f64),
        size_short(volblocksize_bytes)
    );
    instance.pool = Some(pool);
    Ok(instance)
}

/// The block size property `key` (volblocksize, recordsize) of the
/// dataset's properties, set first to [`DEFAULT_VOLBLOCKSIZE_BYTES`] when
/// the spec does not set it.
fn block_size_property(properties: &mut Vec<(String, String)>, key: &str) -> Result<u64> {
    if !properties.iter().any(|(k, _)| k == key) {
        properties.insert(0, (key.to_string(), size_short(DEFAULT_VOLBLOCKSIZE_BYTES)));
    }
    properties
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| parse_size(v))
        .transpose()
        .with_context(|| format!("{key} property"))
        .map(|bytes| bytes.unwrap_or(DEFAULT_VOLBLOCKSIZE_BYTES))
}

/// The rest of an `ironpool-fs` target's setup, once the server runs:
/// creates the filesystem, waits for its mount and makes fio's file.
#[allow(clippy::too_many_arguments)]
fn setup_filesystem(
    spec: &IronpoolSpec,
    label: &str,
    dir: &Path,
    server: super::process::ServerProcess,
    mut commands: Vec<Vec<String>>,
    exe: PathBuf,
    control: PathBuf,
    nbd_socket: PathBuf,
    disks: Vec<PathBuf>,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    let mut properties = spec.properties.clone();
    if properties
        .iter()
        .any(|(k, _)| k == "volblocksize" || k == "mountpoint")
    {
        bail!(
            "{label}: volblocksize and mountpoint are not for ironpool-fs targets (recordsize is)"
        );
    }
    let record_bytes = block_size_property(&mut properties, "recordsize")?;
    let cache = fill_cache_property(&mut properties, context);
    let mountpoint = dir.join("mnt");
    let dataset = format!("{POOL_NAME}/{FILESYSTEM_NAME}");
    let mut create = vec![
        exe.display().to_string(),
        "fs".into(),
        "create".into(),
        "--control".into(),
        control.display().to_string(),
        dataset.clone(),
        "-o".into(),
        format!("mountpoint={}", mountpoint.display()),
    ];
    for (key, value) in with_key_file(dir, &properties)? {
        create.extend(["-o".into(), format!("{key}={value}")]);
    }
    run_isolated(&create, dir).with_context(|| format!("creating filesystem {dataset}"))?;
    commands.push(create);
    let mount = wait_mounted(&mountpoint, dir)?;
    let sparse_flag = knows_sparse(&exe);
    let pool = IronpoolPool {
        exe,
        dir: dir.to_path_buf(),
        control: control.clone(),
        nbd_socket: nbd_socket.clone(),
        disks,
        dataset: dataset.clone(),
        volblocksize_bytes: record_bytes,
        sparse_flag,
        layout: spec.layout,
        disk_count: spec.disk_count,
        disk_size_bytes: spec.disk_size_bytes,
    };
    let capacity = pool.space()?.size_bytes;
    let size_bytes = working_set_bytes(context, capacity, record_bytes)?;
    let file = mountpoint.join(FILESYSTEM_FILE);
    files::create_sparse(&file, size_bytes)?;
    let mut instance = Instance::new(
        label.to_string(),
        "ironpool-fs",
        Access::File(file.clone()),
        size_bytes,
    );
    instance.setup_commands = commands;
    instance.owned_files = vec![
        control,
        nbd_socket,
        dir.join("serve.pid"),
        dir.join("pools.json"),
    ];
    instance.server = Some(server);
    instance.record_size_bytes = Some(record_bytes);
    instance.fill = FillMethod::Pool;
    instance.filesystem = Some(mount);
    instance.description = format!(
        "ironpool {} of {} x {} images{} in {} ({} usable), file {} of {} on filesystem \
         {dataset} (recordsize {}{cache}) mounted over FUSE; io_uring, direct=1",
        spec.layout.name(),
        spec.disk_count,
        bytes_human(spec.disk_size_bytes as f64),
        images_note(spec, context),
        dir.display(),
        bytes_human(capacity as f64),
        file.display(),
        bytes_human(size_bytes as f64),
        size_short(record_bytes)
    );
    instance.pool = Some(pool);
    Ok(instance)
}

/// Waits (up to [`SERVER_START_TIMEOUT`]) for an ironpool filesystem to
/// be mounted at `mountpoint` by the server of target directory `dir`.
fn wait_mounted(mountpoint: &Path, dir: &Path) -> Result<files::MountEntry> {
    let deadline = std::time::Instant::now() + SERVER_START_TIMEOUT;
    loop {
        // The server makes the directory when it mounts, after `fs create`
        // has returned: until then there is nothing to resolve.
        let entry = match mountpoint.exists() {
            true => files::mount_of(mountpoint)?,
            false => None,
        };
        if let Some(entry) = entry.filter(|entry| {
            entry.fs_type == "fuse.ironpool" && Path::new(&entry.mount_point) == mountpoint
        }) {
            return Ok(entry);
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "no ironpool filesystem was mounted at {} (the server needs root and /dev/fuse; see {})",
                mountpoint.display(),
                dir.join("serve.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the description says of the images beyond their layout: a log
/// device, written out.
fn images_note(spec: &IronpoolSpec, context: &SetupContext<'_>) -> String {
    let mut note = String::new();
    if spec.log {
        note.push_str(" and a log device of the same size");
    }
    if context.write_out_disks {
        note.push_str(", written out with zeros before create");
    }
    note
}

/// Whether `exe volume create` takes `--sparse` (its help says so).
fn knows_sparse(exe: &Path) -> bool {
    let argv = [
        exe.display().to_string(),
        "volume".to_string(),
        "create".to_string(),
        "--help".to_string(),
    ];
    run_command(&argv, COMMAND_TIMEOUT).is_ok_and(|help| help.contains("--sparse"))
}

/// Writes a disk image out with zeros and syncs it: a sparse image makes
/// the host filesystem allocate (and journal) on the first write of every
/// block, which a real device does not (BENCHMARKS.md: 16K O_DIRECT writes
/// fell from 49k to 6k IOPS on sparse files).
pub(super) fn write_out(path: &Path, size_bytes: u64) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {} to write it out", path.display()))?;
    let zeros = vec![0u8; WRITE_OUT_CHUNK_BYTES];
    let mut left = size_bytes;
    while left > 0 {
        let length = left.min(WRITE_OUT_CHUNK_BYTES as u64) as usize;
        file.write_all(&zeros[..length])
            .with_context(|| format!("writing {} out", path.display()))?;
        left -= length as u64;
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// For the fill suite, sets `primarycache` to [`FILL_PRIMARYCACHE`] unless
/// the spec sets it; returns what the target's description says of it.
fn fill_cache_property(
    properties: &mut Vec<(String, String)>,
    context: &SetupContext<'_>,
) -> String {
    if context.purpose != Purpose::Fill {
        return String::new();
    }
    if let Some((_, value)) = properties.iter().find(|(k, _)| k == "primarycache") {
        return format!(", primarycache={value} as the spec sets");
    }
    properties.push(("primarycache".into(), FILL_PRIMARYCACHE.into()));
    format!(", primarycache={FILL_PRIMARYCACHE}: its data reads go to the devices")
}

/// The volume size: `--size` (the fill suite's too: its fillers raise the
/// fill level around it); whole MiB and whole blocks. Refused, with the
/// reason, when the pool cannot hold it with room to write.
fn working_set_bytes(
    context: &SetupContext<'_>,
    capacity_bytes: u64,
    volblocksize_bytes: u64,
) -> Result<u64> {
    let wanted = context.size_bytes;
    let granule = MIB.max(volblocksize_bytes);
    let size = wanted / granule * granule;
    if size == 0 {
        bail!(
            "the pool ({} usable) is too small for a working set",
            bytes_human(capacity_bytes as f64)
        );
    }
    if size > capacity_bytes * VOLUME_MAX_PERCENT / 100 {
        bail!(
            "a {} working set does not fit a pool of {} usable (at most {VOLUME_MAX_PERCENT}%): \
             use a smaller --size or larger disks",
            bytes_human(size as f64),
            bytes_human(capacity_bytes as f64)
        );
    }
    Ok(size)
}

/// `ironpool --version`, if the binary answers it.
pub fn version(exe: &Path) -> Option<String> {
    let argv = vec![exe.display().to_string(), "--version".to_string()];
    run_command(&argv, COMMAND_TIMEOUT)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
