//! The command line of `ironpool bench`, and the settings it resolves to.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::suites::{Suite, SuiteOptions, FILL_LEVELS_PERCENT, QD_SCALING_DEPTHS, QD_SCALING_JOBS};
use crate::target::{Layout, TargetSpec};
use crate::units::{parse_size, GIB, MIB};
use crate::zfs_kstat::DEFAULT_KSTAT_DIR;

/// Seconds each test is measured for, as in BENCHMARKS.md's baselines.
pub const DEFAULT_RUNTIME_SECONDS: u64 = 10;
/// `--quick` seconds per test: enough for a smoke test, not for figures.
pub const QUICK_RUNTIME_SECONDS: u64 = 3;
/// Working set of every target: far larger than any device cache, and half
/// of the default `ironpool:mirror:2x2G` pool, so the pool stays well below
/// the 80% fill pitfall.
pub const DEFAULT_SIZE_BYTES: u64 = GIB;
/// `--quick` working set.
pub const QUICK_SIZE_BYTES: u64 = 256 * MIB;
/// The most the fill suite writes to fill a filesystem: filling a large
/// root filesystem to 90% would take hours and break the machine.
pub const DEFAULT_FILL_MAX: &str = "16G";
/// Files the fs suite's metadata phases create, stat and delete: enough
/// that a phase lasts seconds on ext4 (about 100k creates a second here),
/// few enough to stay far below its inode count.
pub const DEFAULT_FILES: u64 = 20_000;
/// `--quick` files.
pub const QUICK_FILES: u64 = 2_000;
/// Targets when none are given (the raw baseline is added to any list).
pub const DEFAULT_TARGETS: [&str; 2] = ["ironpool:mirror:2x2G", "nbdkit"];
/// The default target of a run of the snapshot suite alone (its reads go
/// through a filesystem's `.zfs/snapshot`).
pub const DEFAULT_FS_TARGETS: [&str; 1] = ["ironpool-fs:mirror:2x2G:recordsize=16K"];
/// The default targets of a run of the cache suite alone: a volume beside
/// nbdkit's memory plugin, the ceiling of its cached reads.
pub const DEFAULT_CACHE_TARGETS: [&str; 2] = ["ironpool:mirror:2x4G", "nbdkit-memory"];
/// The default targets of a run of the poll suite alone: a filesystem and a
/// volume, each with the server's poll window off (`poll_us=0`) and at its
/// default.
pub const DEFAULT_POLL_TARGETS: [&str; 4] = [
    "ironpool-fs:mirror:2x4G:poll_us=0,recordsize=16K",
    "ironpool-fs:mirror:2x4G:recordsize=16K",
    "ironpool:mirror:2x4G:poll_us=0",
    "ironpool:mirror:2x4G",
];
/// The default targets of a run of the scheduler suite alone: a volume as
/// configured, with aggregation off, and with the priority classes off.
pub const DEFAULT_SCHEDULER_TARGETS: [&str; 3] = [
    "ironpool:mirror:2x2G",
    "ironpool:mirror:2x2G:tune.aggregation_limit_bytes=1",
    "ironpool:mirror:2x2G:tune.classes=off",
];
/// The default target of a run of the grow suite alone: a mirror the
/// default 1 GiB working set fills to two thirds before it grows
/// (`bench/grow.sh` filled 70%).
pub const DEFAULT_GROW_TARGETS: [&str; 1] = ["ironpool:mirror:2x1536M"];
/// The default target of a run of the soak suite alone: a volume on a
/// mirror, as `bench/soak.sh` ran it.
pub const DEFAULT_SOAK_TARGETS: [&str; 1] = ["ironpool:mirror:2x4G"];
/// The default targets of a run of the send, datasets or stall suites (with or
/// without the snapshot suite): a volume beside a filesystem.
/// Their images hold the working set twice (the copy `receive` makes).
pub const DEFAULT_SEND_TARGETS: [&str; 2] = [
    "ironpool:mirror:2x4G",
    "ironpool-fs:mirror:2x4G:recordsize=16K",
];

/// `ironpool bench`: run fio suites against storage targets and write a
/// report with charts (report.md, results.json, PNGs) to --out.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Suite to run; repeat for several [default: qd-scaling and pool-report]
    #[arg(long = "suite", value_name = "NAME", value_enum)]
    pub suites: Vec<Suite>,

    /// Target to measure; repeat for several [default: ironpool:mirror:2x2G, nbdkit, and raw;
    /// raw-pair too for the durable and fs suites of a mirror, ext4 for the fs suite of a
    /// filesystem].
    /// raw[:PATH] | raw-pair | file:PATH | dir:PATH | ext4 (a loop device: root) | nbd:URI | nbdkit[:PATH] | nbdkit-memory | ironpool:LAYOUT[+log]:NxSIZE[:prop=val,...] | ironpool-fs:LAYOUT[+log]:NxSIZE[:prop=val,...] (a filesystem over FUSE: root, /dev/fuse); bin=PATH among the props picks the ironpool executable; encryption=on (without keylocation) makes an encrypted volume whose key the tool keeps in the target's directory
    #[arg(long = "target", value_name = "SPEC")]
    pub targets: Vec<String>,

    /// Measured seconds per test [default: 10, or 3 with --quick]
    #[arg(long, value_name = "S")]
    pub runtime: Option<u64>,

    /// Unmeasured warm-up seconds before each test
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub ramp: u64,

    /// Output directory for report.md, results.json, charts and fio outputs
    #[arg(long, value_name = "DIR", default_value = "bench-out")]
    pub out: PathBuf,

    /// Working-set size of every target, e.g. 1G [default: 1G, or 256M with --quick]
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Do not add the raw-file baseline
    #[arg(long)]
    pub no_raw: bool,

    /// Queue depths of qd-scaling, comma-separated [default: 1,4,16,64]
    #[arg(long = "qd", value_name = "LIST", value_delimiter = ',')]
    pub depths: Vec<u32>,

    /// Job counts of qd-scaling, comma-separated [default: 1,4, or 1 with --quick]
    #[arg(long = "jobs", value_name = "LIST", value_delimiter = ',')]
    pub jobs: Vec<u32>,

    /// Fill levels (percent) of the fill suite [default: 10,50,80,90]
    #[arg(long = "fill-levels", value_name = "LIST", value_delimiter = ',')]
    pub fill_levels: Vec<u32>,

    /// Most bytes the fill suite may write to fill a filesystem target
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_FILL_MAX)]
    pub fill_max: String,

    /// Files of the fs suite's metadata phases (create, stat, delete), of the snapshot suite's
    /// snapshot-take and snapshot-list, and of the send suite's small files [default: 20000,
    /// or 2000 with --quick]
    #[arg(long, value_name = "N")]
    pub files: Option<u64>,

    /// A short smoke run: 3 s per test, 256M working set, 1 job in qd-scaling
    #[arg(long)]
    pub quick: bool,

    /// Allow writing over existing files, block devices and NBD exports
    #[arg(long)]
    pub overwrite: bool,

    /// Keep the images and files the run created
    #[arg(long)]
    pub keep: bool,

    /// Write ironpool's disk images out with zeros before creating the pool, as a real
    /// device's blocks all exist (sparse images make the host allocate on first write)
    #[arg(long)]
    pub write_out: bool,

    /// Re-render report.md and charts from this results.json without running fio
    #[arg(long, value_name = "FILE")]
    pub from_results: Option<PathBuf>,

    /// fio executable
    #[arg(long, value_name = "PATH", env = "FIO", default_value = "fio")]
    pub fio: PathBuf,

    /// nbdkit executable
    #[arg(long, value_name = "PATH", env = "NBDKIT", default_value = "nbdkit")]
    pub nbdkit: PathBuf,

    /// nbdinfo executable
    #[arg(long, value_name = "PATH", env = "NBDINFO", default_value = "nbdinfo")]
    pub nbdinfo: PathBuf,

    /// ironpool executable for ironpool targets [default: this program]
    #[arg(long, value_name = "PATH", env = "IRONPOOL_BIN")]
    pub ironpool_bin: Option<PathBuf>,

    /// Directory of OpenZFS kstats (POOL/iostats), for the direct-I/O check
    #[arg(long, value_name = "DIR", default_value = DEFAULT_KSTAT_DIR)]
    pub zfs_kstat_dir: PathBuf,

    /// Treat file: and dir: targets as living on this ZFS pool (tests with a fake kstat)
    #[arg(long, value_name = "POOL", hide = true)]
    pub assume_zfs_pool: Option<String>,
}

/// Everything a run needs, after defaults.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Suites in run order.
    pub suites: Vec<Suite>,
    /// Targets in run order; the raw baseline first. Labels are unique.
    pub targets: Vec<(String, TargetSpec)>,
    /// Measured seconds per test.
    pub runtime_seconds: u64,
    /// Warm-up seconds per test.
    pub ramp_seconds: u64,
    /// Working-set size.
    pub size_bytes: u64,
    /// Fill-suite write limit for filesystems.
    pub fill_max_bytes: u64,
    /// Files of the fs suite's metadata phases.
    pub files: u64,
    /// Depths, jobs and fill levels.
    pub suite_options: SuiteOptions,
}

impl BenchArgs {
    /// Resolves defaults and checks the arguments.
    pub fn plan(&self) -> Result<Plan> {
        let mut suites = if self.suites.is_empty() {
            vec![Suite::QdScaling, Suite::PoolReport]
        } else {
            self.suites.clone()
        };
        suites.sort();
        suites.dedup();
        let size_bytes = match &self.size {
            Some(text) => parse_size(text).context("--size")?,
            None if self.quick => QUICK_SIZE_BYTES,
            None => DEFAULT_SIZE_BYTES,
        };
        if size_bytes < MIB {
            bail!("--size must be at least 1M");
        }
        let runtime_seconds = self.runtime.unwrap_or(if self.quick {
            QUICK_RUNTIME_SECONDS
        } else {
            DEFAULT_RUNTIME_SECONDS
        });
        if self.files == Some(0) {
            bail!("--files must be at least 1");
        }
        if runtime_seconds == 0 {
            bail!("--runtime must be at least 1 second");
        }
        let or_default = |given: &[u32], default: &[u32]| {
            if given.is_empty() {
                default.to_vec()
            } else {
                given.to_vec()
            }
        };
        let quick_jobs: &[u32] = if self.quick { &[1] } else { &QD_SCALING_JOBS };
        let suite_options = SuiteOptions {
            depths: or_default(&self.depths, &QD_SCALING_DEPTHS),
            jobs: or_default(&self.jobs, quick_jobs),
            fill_levels_percent: or_default(&self.fill_levels, &FILL_LEVELS_PERCENT),
        };
        if suite_options
            .depths
            .iter()
            .chain(&suite_options.jobs)
            .any(|&n| n == 0)
        {
            bail!("--qd and --jobs values must be at least 1");
        }
        if suite_options
            .fill_levels_percent
            .iter()
            .any(|&p| p == 0 || p >= 100)
        {
            bail!("--fill-levels must be percentages between 1 and 99");
        }
        Ok(Plan {
            suites,
            targets: self.target_list()?,
            runtime_seconds,
            ramp_seconds: self.ramp,
            size_bytes,
            fill_max_bytes: parse_size(&self.fill_max).context("--fill-max")?,
            files: self.files.unwrap_or(if self.quick {
                QUICK_FILES
            } else {
                DEFAULT_FILES
            }),
            suite_options,
        })
    }

    /// The targets: given or default, raw first unless --no-raw, labels
    /// made unique.
    fn target_list(&self) -> Result<Vec<(String, TargetSpec)>> {
        // Suites only ironpool datasets run default to such targets.
        let only = |allowed: &[Suite]| {
            !self.suites.is_empty() && self.suites.iter().all(|s| allowed.contains(s))
        };
        let defaults: &[&str] = if only(&[Suite::Snapshot]) {
            &DEFAULT_FS_TARGETS
        } else if only(&[Suite::Snapshot, Suite::Send, Suite::Stall, Suite::Datasets]) {
            &DEFAULT_SEND_TARGETS
        } else if only(&[Suite::Cache]) {
            &DEFAULT_CACHE_TARGETS
        } else if only(&[Suite::Poll]) {
            &DEFAULT_POLL_TARGETS
        } else if only(&[Suite::Scheduler]) {
            &DEFAULT_SCHEDULER_TARGETS
        } else if only(&[Suite::Grow]) {
            &DEFAULT_GROW_TARGETS
        } else if only(&[Suite::Soak]) {
            &DEFAULT_SOAK_TARGETS
        } else {
            &DEFAULT_TARGETS
        };
        let texts: Vec<String> = if self.targets.is_empty() {
            defaults.iter().map(|s| s.to_string()).collect()
        } else {
            self.targets.clone()
        };
        let mut specs = Vec::new();
        for text in &texts {
            specs.push(
                text.parse::<TargetSpec>()
                    .with_context(|| format!("--target {text}"))?,
            );
        }
        // The durable, fs and grow suites hold a mirror to two raw files
        // written at once.
        let mirror = specs
            .iter()
            .any(|s| matches!(s, TargetSpec::Ironpool(pool) if pool.layout == Layout::Mirror));
        let pair_suite = [Suite::Durable, Suite::Fs, Suite::Grow]
            .iter()
            .any(|suite| self.suites.contains(suite));
        if mirror && !self.no_raw && pair_suite && !specs.contains(&TargetSpec::RawPair) {
            specs.insert(0, TargetSpec::RawPair);
        }
        // The fs suite holds a filesystem's metadata, names and buffered
        // rows to another filesystem on the same disk: ext4.
        let filesystem = specs
            .iter()
            .any(|s| matches!(s, TargetSpec::Ironpool(pool) if pool.filesystem));
        if filesystem
            && !self.no_raw
            && self.suites.contains(&Suite::Fs)
            && !specs.iter().any(|s| matches!(s, TargetSpec::Ext4))
        {
            specs.insert(0, TargetSpec::Ext4);
        }
        let raw_index = specs.iter().position(|s| matches!(s, TargetSpec::Raw(_)));
        match raw_index {
            Some(index) => {
                let raw = specs.remove(index);
                specs.insert(0, raw);
            }
            None if !self.no_raw => specs.insert(0, TargetSpec::Raw(None)),
            None => {}
        }
        let mut labelled: Vec<(String, TargetSpec)> = Vec::new();
        for spec in specs {
            let base = spec.to_string();
            let mut label = base.clone();
            let mut copy = 1;
            while labelled.iter().any(|(l, _)| *l == label) {
                copy += 1;
                label = format!("{base}#{copy}");
            }
            labelled.push((label, spec));
        }
        Ok(labelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn plan_of(args: &[&str]) -> Plan {
        let cli =
            Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap();
        cli.bench.plan().unwrap()
    }

    #[test]
    fn defaults_to_ironpool_nbdkit_and_raw() {
        let plan = plan_of(&[]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["raw", "ironpool:mirror:2x2G", "nbdkit"]);
        assert_eq!(plan.suites, [Suite::QdScaling, Suite::PoolReport]);
        assert_eq!((plan.runtime_seconds, plan.size_bytes), (10, GIB));
        assert_eq!(plan.suite_options.jobs, [1, 4]);
    }

    #[test]
    fn the_fs_suite_brings_its_limits() {
        let plan = plan_of(&[
            "--target",
            "ironpool-fs:mirror:2x1G",
            "--target",
            "ironpool:mirror:2x1G",
            "--suite",
            "fs",
        ]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "raw",
                "ext4",
                "raw-pair",
                "ironpool-fs:mirror:2x1G",
                "ironpool:mirror:2x1G"
            ]
        );
        assert_eq!(plan.files, DEFAULT_FILES);
        // A volume alone has no filesystem to hold to ext4.
        let plan = plan_of(&[
            "--target",
            "ironpool:stripe:1x1G",
            "--suite",
            "fs",
            "--quick",
        ]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["raw", "ironpool:stripe:1x1G"]);
        assert_eq!(plan.files, QUICK_FILES);
    }

    #[test]
    fn moves_raw_first_and_dedups_labels() {
        let plan = plan_of(&[
            "--target",
            "nbdkit",
            "--target",
            "raw:/tmp/x.img",
            "--target",
            "nbdkit",
            "--quick",
        ]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["raw:/tmp/x.img", "nbdkit", "nbdkit#2"]);
        assert_eq!((plan.runtime_seconds, plan.size_bytes), (3, 256 * MIB));
        let plan = plan_of(&[
            "--target", "nbdkit", "--no-raw", "--qd", "1,8", "--suite", "durable",
        ]);
        assert_eq!(plan.targets.len(), 1);
        assert_eq!(plan.suite_options.depths, [1, 8]);
        assert_eq!(plan.suites, [Suite::Durable]);
        let plan = plan_of(&[
            "--target",
            "ironpool:mirror+log:2x1G",
            "--target",
            "nbdkit",
            "--suite",
            "durable",
        ]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            ["raw", "raw-pair", "ironpool:mirror+log:2x1G", "nbdkit"]
        );
    }

    #[test]
    fn the_snapshot_suite_defaults_to_a_filesystem() {
        let plan = plan_of(&["--suite", "snapshot"]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["raw", "ironpool-fs:mirror:2x2G:recordsize=16K"]);
        // With another suite, the usual targets.
        let plan = plan_of(&["--suite", "snapshot", "--suite", "durable", "--no-raw"]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, DEFAULT_TARGETS);
        let plan = plan_of(&["--suite", "send", "--suite", "snapshot"]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "raw",
                "ironpool:mirror:2x4G",
                "ironpool-fs:mirror:2x4G:recordsize=16K"
            ]
        );
        let plan = plan_of(&["--suite", "cache"]);
        let labels: Vec<&str> = plan.targets.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["raw", "ironpool:mirror:2x4G", "nbdkit-memory"]);
    }

    #[test]
    fn rejects_bad_arguments() {
        let cli = Cli::try_parse_from(["bench", "--target", "tape:1"]).unwrap();
        assert!(cli.bench.plan().is_err());
        let cli = Cli::try_parse_from(["bench", "--fill-levels", "100"]).unwrap();
        assert!(cli.bench.plan().is_err());
    }
}
