//! Targets: parsing specs, setting targets up (files, servers, pools),
//! observing them around each test, filling them, and tearing them down.

pub mod ext4;
pub mod files;
pub mod ironpool;
pub mod nbd;
pub mod process;
pub mod spec;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use self::files::MountEntry;
use self::ironpool::IronpoolPool;
use self::process::ServerProcess;
pub use self::spec::{IronpoolSpec, Layout, SpecError, TargetSpec};
use crate::pitfalls;
use crate::results::Finding;
use crate::units::bytes_human;

/// Name of the file a `dir:` target gets.
pub const DIR_TARGET_FILE: &str = "ironpool-bench.dat";

/// How fio reaches a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A file or block device, through io_uring with direct=1.
    File(PathBuf),
    /// An NBD export, through fio's nbd engine.
    Nbd(String),
    /// Two files written at once, one fio job each (io_uring, direct=1):
    /// the most a mirror of two files on the same disk can do.
    FilePair(PathBuf, PathBuf),
}

/// What a target set-up is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The ordinary suites: a working set of `--size`.
    Main,
    /// The fill suite: ironpool gets a fresh pool with a small working set,
    /// so that the lowest fill level is reachable.
    Fill,
}

/// What setting a target up needs.
#[derive(Debug, Clone)]
pub struct SetupContext<'a> {
    /// Where created files, sockets and logs go.
    pub out_dir: &'a Path,
    /// Working-set size.
    pub size_bytes: u64,
    /// Allow writing over data we did not create.
    pub overwrite: bool,
    /// nbdkit executable.
    pub nbdkit: &'a Path,
    /// nbdinfo executable.
    pub nbdinfo: &'a Path,
    /// ironpool executable.
    pub ironpool: &'a Path,
    /// Treat `file:` and `dir:` targets as living on this ZFS pool (tests).
    pub assume_zfs_pool: Option<&'a str>,
    /// Ordinary or fill suite.
    pub purpose: Purpose,
    /// Write ironpool's disk images out with zeros before `create`
    /// (`--write-out`), as a real device's blocks all exist.
    pub write_out_disks: bool,
}

/// How the fill suite raises a target's fill level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FillMethod {
    /// Filler volumes in the ironpool pool.
    Pool,
    /// Filler files in this directory.
    Filesystem(PathBuf),
    /// Not possible; the reason for people.
    Unsupported(String),
}

/// A target that is set up and ready for fio.
#[derive(Debug)]
pub struct Instance {
    /// The spec as text.
    pub label: String,
    /// raw, file, dir, ext4, nbd, nbdkit, ironpool.
    pub kind: &'static str,
    /// How fio reaches it.
    pub access: Access,
    /// Working-set size.
    pub size_bytes: u64,
    /// Record size, when known.
    pub record_size_bytes: Option<u64>,
    /// The filesystem under a file-backed target.
    pub filesystem: Option<MountEntry>,
    /// A sentence for people.
    pub description: String,
    /// Commands run to set it up.
    pub setup_commands: Vec<Vec<String>>,
    /// The server we started, if any.
    pub server: Option<ServerProcess>,
    /// The ironpool pool, for ironpool targets.
    pub pool: Option<IronpoolPool>,
    /// The ZFS pool under a file-backed target.
    pub zfs_pool: Option<String>,
    /// For NBD targets: the server-specific note on caching.
    pub nbd_cache_note: Option<String>,
    /// For NBD targets: whether the server advertises multi-conn.
    pub nbd_multi_conn: Option<bool>,
    /// How the fill suite fills it.
    pub fill: FillMethod,
    /// Pitfalls found while setting up.
    pub setup_findings: Vec<Finding>,
    /// Files we created and remove at teardown.
    owned_files: Vec<PathBuf>,
    /// A loop device we attached and mounted, undone at teardown (before
    /// its image is removed).
    loop_mount: Option<ext4::LoopMount>,
    /// Filler files and volumes made so far.
    filler_count: u32,
    /// The stall suite's probe dataset, once made.
    pub stall_probe: Option<Access>,
    /// The grow suite added a vdev to the pool (once per set-up).
    pub grown: bool,
}

impl Instance {
    fn new(label: String, kind: &'static str, access: Access, size_bytes: u64) -> Instance {
        Instance {
            label,
            kind,
            access,
            size_bytes,
            record_size_bytes: None,
            filesystem: None,
            description: String::new(),
            setup_commands: Vec::new(),
            server: None,
            pool: None,
            zfs_pool: None,
            nbd_cache_note: None,
            nbd_multi_conn: None,
            fill: FillMethod::Unsupported("not a pool or filesystem".to_string()),
            setup_findings: Vec::new(),
            owned_files: Vec::new(),
            loop_mount: None,
            filler_count: 0,
            stall_probe: None,
            grown: false,
        }
    }

    /// The fill level of the pool or filesystem under the target, percent;
    /// `None` for block devices and NBD exports of unknown servers.
    pub fn fill_percent(&self) -> Result<Option<f64>> {
        if let Some(pool) = &self.pool {
            return Ok(Some(pool.settled_space()?.fill_percent()));
        }
        match &self.access {
            Access::File(path) if !files::is_block_device(path) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                Ok(Some(files::fs_space(dir)?.used_percent()))
            }
            _ => Ok(None),
        }
    }

    /// What `fill_percent` measures, for messages: pool or filesystem.
    pub fn fill_subject(&self) -> &'static str {
        if self.pool.is_some() {
            "pool"
        } else {
            "filesystem"
        }
    }

    /// Bytes to write to raise the fill level to `percent`; 0 if already there.
    pub fn fill_shortfall_bytes(&self, percent: u32) -> Result<u64> {
        let (used, capacity) = match (&self.fill, &self.pool) {
            (FillMethod::Pool, Some(pool)) => {
                let space = pool.settled_space()?;
                (space.allocated_bytes, space.size_bytes)
            }
            (FillMethod::Filesystem(dir), _) => {
                let space = files::fs_space(dir)?;
                (space.used_bytes, space.capacity_bytes())
            }
            _ => bail!("{} cannot be filled", self.label),
        };
        let wanted = (capacity as u128 * u128::from(percent) / 100) as u64;
        Ok(wanted.saturating_sub(used))
    }

    /// Makes an empty filler of `size_bytes` for the fill suite and returns
    /// how fio reaches it; the runner writes it with real data.
    pub fn new_filler(&mut self, size_bytes: u64) -> Result<(String, Access)> {
        self.filler_count += 1;
        let name = format!("fill{}", self.filler_count);
        match &self.fill {
            FillMethod::Pool => {
                let pool = self
                    .pool
                    .as_ref()
                    .context("ironpool target without a pool")?;
                let (access, command) = pool.create_filler(&name, size_bytes)?;
                self.setup_commands.push(command);
                Ok((name, access))
            }
            FillMethod::Filesystem(dir) => {
                let path = dir.join(format!("ironpool-bench-{name}.dat"));
                files::create_sparse(&path, size_bytes)?;
                self.owned_files.push(path.clone());
                Ok((name, Access::File(path)))
            }
            FillMethod::Unsupported(reason) => bail!("{} cannot be filled: {reason}", self.label),
        }
    }

    /// Refreshes the record size of a file-backed target from st_blksize
    /// (ZFS reports the recordsize once a file spans several records).
    pub fn refresh_record_size(&mut self) -> Result<()> {
        if let (Access::File(path), None) = (&self.access, &self.pool) {
            self.record_size_bytes = Some(files::preferred_block_size(path)?);
        }
        Ok(())
    }

    /// Whether the target makes every write durable by a property rather
    /// than by O_DSYNC: an ironpool volume over NBD, whose client (fio's
    /// nbd engine) sends no FUA, gets `sync=always` for those tests.
    pub fn dsync_by_property(&self) -> bool {
        self.pool.is_some() && matches!(self.access, Access::Nbd(_))
    }

    /// Sets the benchmarked dataset's `sync` property (see
    /// [`Instance::dsync_by_property`]).
    pub fn set_sync(&mut self, value: &str) -> Result<()> {
        self.set_property("sync", value)
    }

    /// Sets a property of the benchmarked dataset of an ironpool target;
    /// the command joins the set-up commands.
    pub fn set_property(&mut self, key: &str, value: &str) -> Result<()> {
        let pool = self.pool.as_ref().context("not an ironpool target")?;
        let command = pool.set_property(key, value)?;
        self.setup_commands.push(command);
        Ok(())
    }

    /// Empties an ironpool target's read cache (`ironpool tune POOL
    /// arc_drop 1`); nothing on other targets. The command joins the
    /// set-up commands the first time.
    pub fn drop_cache(&mut self) -> Result<()> {
        let Some(pool) = self.pool.as_ref() else {
            return Ok(());
        };
        let command = pool.drop_cache()?;
        if !self.setup_commands.contains(&command) {
            self.setup_commands.push(command);
        }
        Ok(())
    }

    /// The directory the working set's file lies in, on an ironpool
    /// filesystem target (its mountpoint): where its snapshots appear,
    /// under `.zfs/snapshot`.
    fn ironpool_mountpoint(&self) -> std::result::Result<&Path, String> {
        match (&self.access, self.kind) {
            (Access::File(path), "ironpool-fs") => path
                .parent()
                .ok_or_else(|| format!("{} has no directory", path.display())),
            _ => Err(format!(
                "a snapshot's test needs an ironpool-fs target, not {}",
                self.kind
            )),
        }
    }

    /// Takes snapshot `name` of the benchmarked filesystem (an
    /// `ironpool-fs` target); the command joins the set-up commands.
    /// Err(reason) when the target has no snapshots.
    pub fn take_snapshot(&mut self, name: &str) -> std::result::Result<Result<()>, String> {
        self.ironpool_mountpoint()?;
        let pool = self.pool.as_ref().ok_or("not an ironpool target")?;
        Ok(pool.snapshot(name).map(|command| {
            self.setup_commands.push(command);
        }))
    }

    /// Where snapshot `name` shows `relative` (a path in the filesystem),
    /// on an `ironpool-fs` target.
    pub fn in_snapshot(&self, name: &str, relative: &Path) -> std::result::Result<PathBuf, String> {
        Ok(self
            .ironpool_mountpoint()?
            .join(".zfs/snapshot")
            .join(name)
            .join(relative))
    }

    /// The directory of the working set's file, for tests of system calls.
    pub fn file_dir(&self) -> Option<&Path> {
        match &self.access {
            Access::File(path) => path.parent(),
            _ => None,
        }
    }

    /// Whether snapshot `name` of the benchmarked filesystem exists (its
    /// directory under `.zfs/snapshot` does).
    pub fn has_snapshot(&self, name: &str) -> bool {
        self.in_snapshot(name, Path::new(""))
            .is_ok_and(|path| path.is_dir())
    }

    /// Server CPU seconds so far, for targets with a server we started.
    pub fn server_cpu_seconds(&self) -> Result<Option<f64>> {
        self.server
            .as_ref()
            .map(ServerProcess::cpu_seconds)
            .transpose()
    }

    /// Stops servers and removes what we created, unless `keep`.
    pub fn teardown(mut self, keep: bool) -> Result<()> {
        let mut errors = Vec::new();
        if let Some(mut server) = self.server.take() {
            if let Err(error) = server.stop(process::SERVER_STOP_TIMEOUT) {
                errors.push(format!("{error:#}"));
            }
        }
        if let Some(mount) = self.loop_mount.take() {
            if let Err(error) = mount.undo() {
                errors.push(format!("{error:#}"));
            }
        }
        if !keep {
            let mut owned = std::mem::take(&mut self.owned_files);
            if let Some(pool) = &self.pool {
                owned.extend(pool.disk_paths().iter().cloned());
            }
            for path in owned {
                if let Err(error) = files::remove_if_present(&path) {
                    errors.push(format!("{error:#}"));
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("tearing down {}: {}", self.label, errors.join("; "))
        }
    }
}

/// Sets a target up: creates files, starts servers, creates pools.
pub fn setup(
    spec: &TargetSpec,
    label: &str,
    slug: &str,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    match spec {
        TargetSpec::Raw(path) => setup_raw(path.as_deref(), label, context),
        TargetSpec::RawPair => setup_raw_pair(label, context),
        TargetSpec::File(path) => {
            let owned = !path.exists();
            setup_file(path, owned, label, "file", context)
        }
        TargetSpec::Dir(dir) => {
            if !dir.is_dir() {
                bail!("dir target {}: not a directory", dir.display());
            }
            setup_file(&dir.join(DIR_TARGET_FILE), true, label, "dir", context)
        }
        TargetSpec::Ext4 => ext4::setup(label, slug, context),
        TargetSpec::Nbd(uri) => nbd::setup_uri(uri, label, context),
        TargetSpec::Nbdkit(path) => nbd::setup_nbdkit(path.as_deref(), label, slug, context),
        TargetSpec::NbdkitMemory => nbd::setup_nbdkit_memory(label, slug, context),
        TargetSpec::Ironpool(pool) => ironpool::setup(pool, label, slug, context),
    }
}

/// Refuses to write over data we did not create, unless `--overwrite`.
pub fn check_overwrite(what: &str, context: &SetupContext<'_>) -> Result<()> {
    if !context.overwrite {
        bail!("{what} holds data this tool did not create and the benchmark writes over all of it; pass --overwrite to allow that");
    }
    Ok(())
}

fn setup_raw(path: Option<&Path>, label: &str, context: &SetupContext<'_>) -> Result<Instance> {
    let Some(path) = path else {
        let path = context.out_dir.join("raw.img");
        return setup_file(&path, true, label, "raw", context);
    };
    if !files::is_block_device(path) {
        let owned = !path.exists();
        return setup_file(path, owned, label, "raw", context);
    }
    check_overwrite(&format!("block device {}", path.display()), context)?;
    let device_bytes = files::device_size(path)?;
    let size_bytes = context.size_bytes.min(device_bytes);
    let mut instance = Instance::new(
        label.to_string(),
        "raw",
        Access::File(path.to_path_buf()),
        size_bytes,
    );
    instance.description = format!(
        "block device {} ({}), first {} used; io_uring, direct=1",
        path.display(),
        bytes_human(device_bytes as f64),
        bytes_human(size_bytes as f64)
    );
    instance.fill = FillMethod::Unsupported("a block device has no fill level".to_string());
    Ok(instance)
}

/// The filesystem a target file lives on, for its description:
/// `ext4 (/dev/vda)`.
fn describe_mount(mount: Option<&MountEntry>) -> String {
    mount
        .map(|m| format!("{} ({})", m.fs_type, m.source))
        .unwrap_or_else(|| "an unknown filesystem".to_string())
}

/// Two raw files in the output directory, written at once: a mirror's limit.
fn setup_raw_pair(label: &str, context: &SetupContext<'_>) -> Result<Instance> {
    let paths = ["raw-pair-a.img", "raw-pair-b.img"].map(|name| context.out_dir.join(name));
    for path in &paths {
        files::create_sparse(path, context.size_bytes)?;
    }
    let [first, second] = paths;
    let mut instance = Instance::new(
        label.to_string(),
        "raw-pair",
        Access::FilePair(first.clone(), second.clone()),
        context.size_bytes,
    );
    instance.owned_files = vec![first.clone(), second.clone()];
    let mount = files::mount_of(&first)?;
    let fs = describe_mount(mount.as_ref());
    instance.filesystem = mount;
    instance.record_size_bytes = Some(files::preferred_block_size(&first)?);
    instance.fill = FillMethod::Unsupported("the raw pair is not filled".to_string());
    instance.description = format!(
        "raw files {} and {} on {fs}, the same job on both at once (the slower one counts, \
         as a mirror's write waits for both copies); io_uring, direct=1",
        first.display(),
        second.display()
    );
    Ok(instance)
}

/// A file on a filesystem: raw files, `file:` and `dir:` targets.
fn setup_file(
    path: &Path,
    owned: bool,
    label: &str,
    kind: &'static str,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    if !owned {
        check_overwrite(&format!("file {}", path.display()), context)?;
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    files::create_sparse(path, context.size_bytes)?;
    let mut instance = Instance::new(
        label.to_string(),
        kind,
        Access::File(path.to_path_buf()),
        context.size_bytes,
    );
    if owned {
        instance.owned_files.push(path.to_path_buf());
    }
    let mount = files::mount_of(path)?;
    let fs = describe_mount(mount.as_ref());
    let assumed = context
        .assume_zfs_pool
        .filter(|_| kind != "raw")
        .map(str::to_string);
    instance.zfs_pool = assumed.or_else(|| mount.as_ref().and_then(MountEntry::zfs_pool));
    if let Some(mount) = &mount {
        let direct_io = files::loop_direct_io(&mount.source);
        instance
            .setup_findings
            .extend(pitfalls::loop_device_buffered(
                label,
                &mount.source,
                direct_io,
            ));
    }
    instance.filesystem = mount;
    instance.record_size_bytes = Some(files::preferred_block_size(path)?);
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    instance.fill = if kind == "raw" {
        FillMethod::Unsupported("the raw baseline is not filled".to_string())
    } else {
        FillMethod::Filesystem(dir)
    };
    instance.description = format!(
        "{} {} on {fs}; io_uring, direct=1",
        if kind == "raw" { "raw file" } else { "file" },
        path.display()
    );
    Ok(instance)
}
