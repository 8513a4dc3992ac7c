//! Building fio command lines and running fio: one process per test, its
//! JSON written to a file (kept for people) and parsed from there.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::fio_json::{self, FioOutput};
use crate::interrupt;
use crate::progress::Progress;
use crate::suites::{
    Durability, Engine, Workload, COMPRESSIBLE_CHUNK_BYTES, COMPRESSIBLE_PERCENT, LOAD_BLOCK_BYTES,
    LOAD_IODEPTH,
};
use crate::target::process::wait_with_deadline;
use crate::target::Access;
use crate::units::{size_short, MIB};

/// Prefill block size: large sequential writes fill fastest.
const PREFILL_BLOCK_SIZE_BYTES: u64 = MIB;
/// Prefill queue depth: enough to keep a device busy.
const PREFILL_IODEPTH: u32 = 16;
/// Time fio may take beyond runtime + ramp before it is stopped: job start,
/// file layout and the final report.
const FIO_MARGIN: Duration = Duration::from_secs(60);
/// Slowest prefill we wait for (bytes per second), to bound its wait.
const PREFILL_MIN_BANDWIDTH_BYTES_PER_SECOND: u64 = 5 * MIB;
/// How long fio gets to exit after SIGINT/SIGTERM before SIGKILL.
const FIO_STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the wait loop updates the progress display.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// fio settings common to every test.
#[derive(Debug, Clone)]
pub struct FioSettings {
    /// The fio executable.
    pub exe: PathBuf,
    /// Measured seconds per test.
    pub runtime_seconds: u64,
    /// Unmeasured warm-up seconds per test.
    pub ramp_seconds: u64,
}

/// The fio options that address a target (for a pair of files, the engine
/// only: [`pair_jobs`] names the files); an error with a reason when fio
/// cannot run this workload there.
fn access_args(
    access: &Access,
    durability: Durability,
    engine: Engine,
    buffered: bool,
) -> std::result::Result<Vec<String>, String> {
    let file_engine = |filename: Option<&Path>| {
        let engine = if durability == Durability::PsyncFdatasync {
            Engine::Psync
        } else {
            engine
        };
        let direct = if buffered { "--direct=0" } else { "--direct=1" };
        let mut args = vec![
            format!("--ioengine={}", engine.fio_name()),
            direct.to_string(),
        ];
        args.extend(filename.map(|path| format!("--filename={}", path.display())));
        args
    };
    match access {
        Access::File(path) => Ok(file_engine(Some(path))),
        Access::FilePair(..) => Ok(file_engine(None)),
        Access::Nbd(_) if buffered => {
            Err("a volume over NBD has no page cache in front of it (fio's nbd engine)".to_string())
        }
        Access::Nbd(_) if engine != Engine::IoUring => Err(format!(
            "fio's nbd engine stands for the file engines on a volume: {} is a file engine",
            engine.fio_name()
        )),
        Access::Nbd(uri) => match durability {
            Durability::Dsync => Err("fio's nbd engine cannot send FUA writes".to_string()),
            Durability::PsyncFdatasync => Err(
                "fio's nbd engine rejects fdatasync (EINVAL); the -fsync tests flush with NBD_CMD_FLUSH".to_string(),
            ),
            // direct=1 is ignored by the nbd engine; passing it keeps the
            // command lines comparable and the request explicit.
            _ => Ok(vec!["--ioengine=nbd".to_string(), format!("--uri={uri}"), "--direct=1".to_string()]),
        },
    }
}

/// For a pair of files, one job per file named `NAME-a` and `NAME-b`. They
/// come last on the command line: every option before the first `--name`
/// is global, so both jobs run the same workload at once.
fn pair_jobs(access: &Access, name: &str) -> Vec<String> {
    match access {
        Access::FilePair(first, second) => vec![
            format!("--name={name}-a"),
            format!("--filename={}", first.display()),
            format!("--name={name}-b"),
            format!("--filename={}", second.display()),
        ],
        _ => Vec::new(),
    }
}

/// The job's name first for one target; nothing yet for a pair (its jobs
/// come last, see [`pair_jobs`]).
fn leading_name(access: &Access, name: &str) -> Vec<String> {
    match access {
        Access::FilePair(..) => Vec::new(),
        _ => vec![format!("--name={name}")],
    }
}

/// The fio command of a test, or why it cannot run on this target.
/// `durable_by_target`: the target itself makes every write durable (an
/// ironpool volume with `sync=always`), so a `-dsync` test writes plainly.
pub fn test_command(
    settings: &FioSettings,
    access: &Access,
    workload: &Workload,
    size_bytes: u64,
    durable_by_target: bool,
) -> std::result::Result<Vec<String>, String> {
    let name = workload.name();
    // A stall probe is fio's random reads, named for its action.
    if let Some(ops) = workload.ops.filter(|ops| !ops.of_stall()) {
        return Err(format!("{} is not a fio test", ops.name()));
    }
    let durability = match workload.durability {
        Durability::Dsync if durable_by_target => Durability::None,
        durability => durability,
    };
    let mut argv = vec![settings.exe.display().to_string()];
    argv.extend(leading_name(access, &name));
    argv.extend(access_args(
        access,
        durability,
        workload.engine,
        workload.buffered,
    )?);
    let synchronous = durability == Durability::PsyncFdatasync || workload.engine == Engine::Psync;
    let iodepth = if synchronous { 1 } else { workload.iodepth };
    let size_bytes = workload
        .region_bytes
        .map_or(size_bytes, |region| region.min(size_bytes));
    // Verifying jobs each write a region of their own: two jobs writing one
    // block would each find the other's crc.
    let (size_bytes, offset_increment) = if workload.verify && workload.numjobs > 1 {
        let share = size_bytes / u64::from(workload.numjobs);
        let share = share - share % workload.block_size_bytes.max(1);
        if share == 0 {
            return Err(format!(
                "a working set of {} has no {} block for each of {} verifying jobs",
                size_short(size_bytes),
                size_short(workload.block_size_bytes),
                workload.numjobs
            ));
        }
        (share, Some(share))
    } else {
        (size_bytes, None)
    };
    argv.extend([
        format!("--rw={}", workload.pattern.fio_rw()),
        format!(
            "--bs={}",
            size_short(workload.block_size_bytes).to_lowercase()
        ),
        format!("--iodepth={iodepth}"),
        format!("--numjobs={}", workload.numjobs),
        format!("--size={}", size_short(size_bytes)),
    ]);
    // A read from a cold cache is one pass over the working set: a second
    // would read what the first left in the cache.
    if !workload.cold {
        argv.extend([
            format!("--runtime={}", settings.runtime_seconds),
            "--time_based".to_string(),
        ]);
    }
    if settings.ramp_seconds > 0 && !workload.cold {
        argv.push(format!("--ramp_time={}", settings.ramp_seconds));
    }
    if let Some(mix) = workload.read_mix_percent {
        argv.push(format!("--rwmixread={mix}"));
    }
    if let Some(increment) = offset_increment {
        argv.push(format!("--offset_increment={}", size_short(increment)));
    }
    if workload.verify {
        argv.extend([
            "--verify=crc32c".to_string(),
            "--verify_fatal=1".to_string(),
        ]);
    }
    if workload.compressible {
        argv.extend([
            "--refill_buffers".to_string(),
            format!("--buffer_compress_percentage={COMPRESSIBLE_PERCENT}"),
            format!("--buffer_compress_chunk={COMPRESSIBLE_CHUNK_BYTES}"),
        ]);
    } else if workload.compression.is_some() {
        // Random data, new for every write: nothing for lz4 to find.
        argv.push("--refill_buffers".to_string());
    }
    match durability {
        Durability::None => {}
        Durability::Fsync => argv.push("--fsync=1".to_string()),
        Durability::FsyncEvery(writes) => argv.push(format!("--fsync={writes}")),
        Durability::Dsync => argv.push("--sync=dsync".to_string()),
        Durability::PsyncFdatasync => argv.push("--fdatasync=1".to_string()),
    }
    if workload.buffered {
        // The page cache's writes reach the target at the end: the figure
        // counts them.
        argv.push("--end_fsync=1".to_string());
    }
    // A pair reports each job: the slower file is what a mirror waits for;
    // a test under load reports its own job apart from the load's.
    if !matches!(access, Access::FilePair(..)) && !workload.under_load {
        argv.push("--group_reporting".to_string());
    }
    argv.extend([
        "--lat_percentiles=1".to_string(),
        "--output-format=json".to_string(),
    ]);
    argv.extend(pair_jobs(access, &name));
    if workload.under_load {
        if matches!(access, Access::FilePair(..)) {
            return Err("a load beside the test needs one target, not a pair".to_string());
        }
        // A job of its own: options after its --name are its alone.
        argv.push(format!("--name={LOAD_JOB_NAME}"));
        argv.extend(access_args(
            access,
            Durability::None,
            Engine::IoUring,
            false,
        )?);
        argv.extend([
            "--rw=randwrite".to_string(),
            format!("--bs={}", size_short(LOAD_BLOCK_BYTES).to_lowercase()),
            format!("--iodepth={LOAD_IODEPTH}"),
            format!("--size={}", size_short(size_bytes)),
            format!("--runtime={}", settings.runtime_seconds),
            "--time_based".to_string(),
        ]);
    }
    Ok(argv)
}

/// The job name of an `under_load` test's background load.
pub const LOAD_JOB_NAME: &str = "load";

/// The fio command that writes a whole target (or filler) once with real
/// data, sequentially, so that no read hits never-written space.
pub fn prefill_command(settings: &FioSettings, access: &Access, size_bytes: u64) -> Vec<String> {
    whole_pass(settings, access, size_bytes, "prefill", false)
}

/// Reads of the random pass that warms a volume's cache: 4 KiB, every
/// block of any block size touched.
pub const WARM_VOLUME_BLOCK_BYTES: u64 = 4096;

/// The fio command that rewrites one record in `every` of a target (of
/// `record_bytes` each), once, in order: a dataset's change between two
/// snapshots for an incremental stream.
pub fn change_command(
    settings: &FioSettings,
    access: &Access,
    size_bytes: u64,
    record_bytes: u64,
    every: u64,
) -> Vec<String> {
    let mut argv = vec![settings.exe.display().to_string()];
    argv.extend(leading_name(access, "change"));
    argv.extend(access_args(access, Durability::None, Engine::IoUring, false).unwrap_or_default());
    argv.extend([
        format!(
            "--rw=write:{}",
            record_bytes.saturating_mul(every.saturating_sub(1))
        ),
        format!("--bs={record_bytes}"),
        format!("--size={}", size_short(size_bytes)),
        "--iodepth=16".to_string(),
        "--end_fsync=1".to_string(),
        "--output-format=json".to_string(),
    ]);
    argv.extend(pair_jobs(access, "change"));
    argv
}

/// The fio command that reads a whole target once through its cache before
/// a `cached` test: buffered from a file (the page cache passes each miss
/// to the filesystem, whose own cache keeps it), from a volume over NBD in
/// one random pass of [`WARM_VOLUME_BLOCK_BYTES`] reads (fio's random map
/// reads each block once; a volume caches what it serves at random).
pub fn warm_command(settings: &FioSettings, access: &Access, size_bytes: u64) -> Vec<String> {
    whole_pass(settings, access, size_bytes, "warm", true)
}

/// One sequential pass over a whole target in large requests: `prefill`
/// writes it (with an fsync at the end), `warm` reads it, buffered where
/// the target has a page cache.
fn whole_pass(
    settings: &FioSettings,
    access: &Access,
    size_bytes: u64,
    name: &str,
    read: bool,
) -> Vec<String> {
    let mut argv = vec![settings.exe.display().to_string()];
    argv.extend(leading_name(access, name));
    let buffered = read && !matches!(access, Access::Nbd(_));
    // Durability::None with the default engine always has access options.
    argv.extend(
        access_args(access, Durability::None, Engine::IoUring, buffered).unwrap_or_default(),
    );
    // A volume keeps in its cache what clients read at random, not a
    // sequential stream of large reads (scan resistance, as OpenZFS's ARC
    // and prefetch): it is warmed by one random pass over every block.
    let (rw, block_bytes) = match (read, access) {
        (true, Access::Nbd(_)) => ("randread", WARM_VOLUME_BLOCK_BYTES),
        (true, _) => ("read", PREFILL_BLOCK_SIZE_BYTES),
        (false, _) => ("write", PREFILL_BLOCK_SIZE_BYTES),
    };
    argv.extend([
        format!("--rw={rw}"),
        format!("--bs={}", size_short(block_bytes).to_lowercase()),
        format!("--iodepth={PREFILL_IODEPTH}"),
        "--numjobs=1".to_string(),
        format!("--size={}", size_short(size_bytes)),
    ]);
    if !read {
        argv.push("--end_fsync=1".to_string());
    }
    argv.push("--output-format=json".to_string());
    argv.extend(pair_jobs(access, name));
    argv
}

/// How long a test may run before it is stopped.
pub fn test_timeout(settings: &FioSettings) -> Duration {
    Duration::from_secs(settings.runtime_seconds + settings.ramp_seconds) + FIO_MARGIN
}

/// How long a prefill of `size_bytes` may run before it is stopped.
pub fn prefill_timeout(size_bytes: u64) -> Duration {
    Duration::from_secs(size_bytes / PREFILL_MIN_BANDWIDTH_BYTES_PER_SECOND) + FIO_MARGIN
}

/// A finished fio process.
#[derive(Debug)]
pub struct FioRun {
    /// The parsed report, or why there is none.
    pub output: std::result::Result<FioOutput, String>,
    /// fio's exit status.
    pub status: ExitStatus,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// fio's stderr.
    pub stderr: String,
    /// True when the run was interrupted or timed out.
    pub stopped: bool,
}

impl FioRun {
    /// The report if fio ran through, else an error for people built from
    /// fio's own messages.
    pub fn report(&self) -> std::result::Result<&FioOutput, String> {
        let output = self.output.as_ref().map_err(|e| self.explain(e))?;
        let job_error = output.report.jobs.iter().map(|j| j.error).find(|&e| e != 0);
        if self.stopped {
            return Err(self.explain("stopped before the end (interrupted or past its time limit)"));
        }
        if let Some(errno) = job_error {
            return Err(self.explain(&format!("a job failed with errno {errno}")));
        }
        if !self.status.success() {
            return Err(self.explain(&format!("fio exited with {}", self.status)));
        }
        Ok(output)
    }

    fn explain(&self, what: &str) -> String {
        let mut messages: Vec<String> = self
            .output
            .as_ref()
            .map(|o| o.preamble.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|line| !line.contains("connected to NBD server"))
            .collect();
        messages.extend(
            self.stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
        if messages.is_empty() {
            what.to_string()
        } else {
            format!("{what}: {}", messages.join(" | "))
        }
    }
}

/// Runs fio with `argv`, writing stdout to `output_path` and stderr beside
/// it, updating `progress` while it runs and stopping it after `timeout`
/// or on Ctrl-C.
pub fn run(
    argv: &[String],
    output_path: &Path,
    timeout: Duration,
    progress: &mut Progress,
) -> Result<FioRun> {
    let (program, args) = argv.split_first().context("empty fio command")?;
    let stderr_path = output_path.with_extension("stderr");
    let stdout =
        File::create(output_path).with_context(|| format!("creating {}", output_path.display()))?;
    let stderr = File::create(&stderr_path)
        .with_context(|| format!("creating {}", stderr_path.display()))?;
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| {
            format!("starting fio ({program}); is fio installed? (apt-get install fio)")
        })?;
    let deadline = started + timeout;
    let mut stopped = false;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for fio")? {
            break status;
        }
        let past_deadline = Instant::now() >= deadline;
        if past_deadline || interrupt::requested() {
            stopped = true;
            // fio prints its report on SIGINT; SIGTERM past the deadline.
            let signal = if past_deadline {
                libc::SIGTERM
            } else {
                libc::SIGINT
            };
            let pid = libc::pid_t::try_from(child.id()).context("fio PID out of range")?;
            // SAFETY: plain syscall on our own unreaped child.
            unsafe { libc::kill(pid, signal) };
            match wait_with_deadline(&mut child, FIO_STOP_TIMEOUT)? {
                Some(status) => break status,
                None => {
                    child.kill().context("killing fio")?;
                    break child.wait().context("reaping fio")?;
                }
            }
        }
        progress.tick();
        std::thread::sleep(POLL_INTERVAL);
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(output_path)
        .with_context(|| format!("reading {}", output_path.display()))?;
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    if stderr.trim().is_empty() {
        let _ = std::fs::remove_file(&stderr_path);
    }
    let output = fio_json::parse(&text).map_err(|e| format!("{e:#}"));
    Ok(FioRun {
        output,
        status,
        wall_seconds,
        stderr,
        stopped,
    })
}

/// `fio --version`.
pub fn version(exe: &Path) -> Result<String> {
    let argv = vec![exe.display().to_string(), "--version".to_string()];
    let text = crate::target::process::run_command(&argv, Duration::from_secs(30))
        .context("running `fio --version`: is fio installed? (apt-get install fio)")?;
    Ok(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suites::Pattern;
    use crate::units::{GIB, KIB};

    fn settings() -> FioSettings {
        FioSettings {
            exe: "fio".into(),
            runtime_seconds: 10,
            ramp_seconds: 0,
        }
    }

    #[test]
    fn builds_the_benchmarks_md_template() {
        let workload = Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1);
        let argv = test_command(
            &settings(),
            &Access::File("/p/raw.img".into()),
            &workload,
            2 * GIB,
            false,
        )
        .unwrap();
        assert_eq!(
            argv.join(" "),
            "fio --name=randwrite-16k-qd64-1j --ioengine=io_uring --direct=1 --filename=/p/raw.img \
             --rw=randwrite --bs=16k --iodepth=64 --numjobs=1 --size=2G --runtime=10 --time_based \
             --group_reporting --lat_percentiles=1 --output-format=json"
        );
    }

    #[test]
    fn runs_a_pair_of_files_as_two_jobs_of_one_workload() {
        let mut workload = Workload::new(Pattern::RandWrite, 16 * KIB, 64, 1);
        workload.durability = Durability::FsyncEvery(32);
        let pair = Access::FilePair("/p/a.img".into(), "/p/b.img".into());
        let argv = test_command(&settings(), &pair, &workload, GIB, false).unwrap();
        assert_eq!(
            argv.join(" "),
            "fio --ioengine=io_uring --direct=1 --rw=randwrite --bs=16k --iodepth=64 --numjobs=1 \
             --size=1G --runtime=10 --time_based --fsync=32 --lat_percentiles=1 --output-format=json \
             --name=randwrite-16k-qd64-1j-fsync32-a --filename=/p/a.img \
             --name=randwrite-16k-qd64-1j-fsync32-b --filename=/p/b.img"
        );
        let prefill = prefill_command(&settings(), &pair, GIB).join(" ");
        assert!(prefill.starts_with("fio --ioengine=io_uring --direct=1 --rw=write"));
        assert!(prefill.ends_with(
            "--name=prefill-a --filename=/p/a.img --name=prefill-b --filename=/p/b.img"
        ));
    }

    #[test]
    fn builds_the_fs_suite_engines_and_buffered_writes() {
        use crate::suites::Engine;
        let file = Access::File("/m/f".into());
        let mut workload = Workload::new(Pattern::RandWrite, 4 * KIB, 64, 1);
        workload.buffered = true;
        let argv = test_command(&settings(), &file, &workload, GIB, false).unwrap();
        assert!(
            argv.contains(&"--direct=0".to_string()) && argv.contains(&"--end_fsync=1".to_string())
        );
        workload.engine = Engine::Psync;
        let argv = test_command(&settings(), &file, &workload, GIB, false).unwrap();
        assert!(
            argv.contains(&"--ioengine=psync".to_string())
                && argv.contains(&"--iodepth=1".to_string())
        );
        // A volume over NBD has neither a page cache nor file engines.
        let nbd = Access::Nbd("nbd+unix:///?socket=/s".into());
        assert!(test_command(&settings(), &nbd, &workload, GIB, false).is_err());
        workload.buffered = false;
        assert!(test_command(&settings(), &nbd, &workload, GIB, false).is_err());
        workload.engine = Engine::Libaio;
        let argv = test_command(&settings(), &file, &workload, GIB, false).unwrap();
        assert!(
            argv.contains(&"--ioengine=libaio".to_string())
                && argv.contains(&"--direct=1".to_string())
        );
        let ops = Workload::ops(crate::suites::OpsTest::FilesCreate);
        assert!(test_command(&settings(), &file, &ops, GIB, false).is_err());
        let warm = warm_command(&settings(), &file, GIB).join(" ");
        assert!(
            warm.contains("--direct=0") && warm.contains("--rw=read"),
            "{warm}"
        );
        let warm = warm_command(&settings(), &nbd, GIB).join(" ");
        assert!(warm.contains("--ioengine=nbd"), "{warm}");
    }

    #[test]
    fn nbd_cannot_do_fua_or_fdatasync() {
        let nbd = Access::Nbd("nbd+unix:///?socket=/s".into());
        let mut workload = Workload::new(Pattern::RandWrite, 16 * KIB, 1, 1);
        workload.durability = Durability::Dsync;
        assert!(test_command(&settings(), &nbd, &workload, GIB, false).is_err());
        // A volume with sync=always makes every write durable: fio writes plainly.
        let by_volume = test_command(&settings(), &nbd, &workload, GIB, true).unwrap();
        assert!(by_volume.contains(&"--name=randwrite-16k-qd1-1j-dsync".to_string()));
        assert!(!by_volume.iter().any(|a| a.starts_with("--sync")));
        workload.durability = Durability::Fsync;
        let argv = test_command(&settings(), &nbd, &workload, GIB, false).unwrap();
        assert!(
            argv.contains(&"--ioengine=nbd".to_string()) && argv.contains(&"--fsync=1".to_string())
        );
        workload.durability = Durability::PsyncFdatasync;
        let file = test_command(
            &settings(),
            &Access::File("/f".into()),
            &workload,
            GIB,
            false,
        )
        .unwrap();
        assert!(
            file.contains(&"--ioengine=psync".to_string())
                && file.contains(&"--fdatasync=1".to_string())
        );
    }
}
