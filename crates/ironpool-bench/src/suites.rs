//! The suites of BENCHMARKS.md ("The suites") as lists of fio workloads.
//!
//! A suite is data: a list of [`TestSpec`]s. How a test reaches a target
//! (ioengine, file or URI) is the fio runner's business.

use serde::{Deserialize, Serialize};

use crate::units::{size_short, KIB, MIB};

/// Queue depths of the qd-scaling suite: the OpenZFS async complaint is that
/// IOPS stay flat from QD1 to QD64.
pub const QD_SCALING_DEPTHS: [u32; 4] = [1, 4, 16, 64];
/// Job counts of the qd-scaling suite: one submitter, and four (more
/// submitters than this machine's 2 cores, to show contention).
pub const QD_SCALING_JOBS: [u32; 2] = [1, 4];
/// Writes per flush of the durable suite's batched row: a database's group
/// commit keeps many writes in flight per flush, and 32 at QD64 is the row
/// the issues and `scripts/bench-durable.sh` have quoted since issue 17.
pub const DURABLE_WRITES_PER_FLUSH: u32 = 32;
/// Queue depth of the durable suite's deep rows: the seeds' QD64.
pub const DURABLE_DEEP_IODEPTH: u32 = 64;
/// Fill levels of the fill suite, percent of the pool or filesystem.
pub const FILL_LEVELS_PERCENT: [u32; 4] = [10, 50, 80, 90];

/// A named suite.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Suite {
    /// 16K random writes and 4K random reads at QD 1..64, 1 and 4 jobs.
    QdScaling,
    /// The five-test pool report.
    PoolReport,
    /// Random writes with a flush or FUA after each write.
    Durable,
    /// The pool report repeated at rising fill levels.
    Fill,
}

impl Suite {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Suite::QdScaling => "qd-scaling",
            Suite::PoolReport => "pool-report",
            Suite::Durable => "durable",
            Suite::Fill => "fill",
        }
    }
}

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Sequential reads.
    SeqRead,
    /// Sequential writes.
    SeqWrite,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mixed reads and writes.
    RandRw,
}

impl Pattern {
    /// fio's `--rw` value.
    pub fn fio_rw(self) -> &'static str {
        match self {
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::RandRw => "randrw",
        }
    }

    /// Whether the workload reads anything (and so needs a prefilled target).
    pub fn reads(self) -> bool {
        matches!(self, Pattern::SeqRead | Pattern::RandRead | Pattern::RandRw)
    }

    /// Whether the workload writes anything.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Pattern::SeqWrite | Pattern::RandWrite | Pattern::RandRw
        )
    }

    /// Sequential workloads are judged by bandwidth, random ones by IOPS.
    pub fn is_sequential(self) -> bool {
        matches!(self, Pattern::SeqRead | Pattern::SeqWrite)
    }
}

/// How a write is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// No flushes: the device's write cache may hold the data.
    #[default]
    None,
    /// A flush after each write (`--fsync=1`; NBD_CMD_FLUSH over NBD).
    Fsync,
    /// A flush after every N writes (`--fsync=N`): a database's group
    /// commit, many writes in flight per flush.
    FsyncEvery(u32),
    /// Every write durable when it completes: files opened O_DSYNC
    /// (`--sync=dsync`, FUA writes on a block device); an ironpool volume
    /// with `sync=always` (fio's nbd engine sends no FUA).
    Dsync,
    /// The classic durable baseline: `psync` with `--fdatasync=1`.
    PsyncFdatasync,
}

impl Durability {
    /// The suffix of test names.
    fn suffix(self) -> String {
        match self {
            Durability::None => String::new(),
            Durability::Fsync => "-fsync".to_string(),
            Durability::FsyncEvery(writes) => format!("-fsync{writes}"),
            Durability::Dsync => "-dsync".to_string(),
            Durability::PsyncFdatasync => "-psync-fdatasync".to_string(),
        }
    }
}

/// One fio workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Access pattern.
    pub pattern: Pattern,
    /// Block size of each I/O.
    pub block_size_bytes: u64,
    /// Outstanding I/Os per job.
    pub iodepth: u32,
    /// Parallel jobs (fio processes; NBD connections over NBD).
    pub numjobs: u32,
    /// Percent of reads in a mixed workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_mix_percent: Option<u32>,
    /// Flush or FUA behaviour.
    #[serde(default)]
    pub durability: Durability,
}

impl Workload {
    /// A workload with no flushes.
    pub fn new(pattern: Pattern, block_size_bytes: u64, iodepth: u32, numjobs: u32) -> Self {
        Workload {
            pattern,
            block_size_bytes,
            iodepth,
            numjobs,
            read_mix_percent: None,
            durability: Durability::None,
        }
    }

    /// The test name: `randwrite-16k-qd64-4j`, `randrw70-256k-qd16-4j`,
    /// `randwrite-16k-qd1-1j-fsync`.
    pub fn name(&self) -> String {
        let mix = self
            .read_mix_percent
            .map(|p| p.to_string())
            .unwrap_or_default();
        format!(
            "{}{}-{}-qd{}-{}j{}",
            self.pattern.fio_rw(),
            mix,
            size_short(self.block_size_bytes).to_lowercase(),
            self.iodepth,
            self.numjobs,
            self.durability.suffix()
        )
    }
}

/// One test of a suite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestSpec {
    /// The suite it belongs to.
    pub suite: Suite,
    /// The workload.
    pub workload: Workload,
    /// For the fill suite: the pool or filesystem fill level to reach first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_percent: Option<u32>,
}

impl TestSpec {
    /// The workload's name (unique within a suite and fill level).
    pub fn name(&self) -> String {
        self.workload.name()
    }
}

/// What to run, after defaults and `--quick`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteOptions {
    /// Queue depths of qd-scaling.
    pub depths: Vec<u32>,
    /// Job counts of qd-scaling.
    pub jobs: Vec<u32>,
    /// Fill levels of the fill suite.
    pub fill_levels_percent: Vec<u32>,
}

/// The tests of one suite, in run order. The fill suite repeats the pool
/// report at each level; targets that cannot be filled run the pool report
/// once with no level (see the runner).
pub fn tests_of(suite: Suite, options: &SuiteOptions) -> Vec<TestSpec> {
    let plain = |workload| TestSpec {
        suite,
        workload,
        fill_percent: None,
    };
    match suite {
        Suite::QdScaling => {
            let mut tests = Vec::new();
            for (pattern, block_size_bytes) in
                [(Pattern::RandWrite, 16 * KIB), (Pattern::RandRead, 4 * KIB)]
            {
                for &numjobs in &options.jobs {
                    for &iodepth in &options.depths {
                        tests.push(plain(Workload::new(
                            pattern,
                            block_size_bytes,
                            iodepth,
                            numjobs,
                        )));
                    }
                }
            }
            tests
        }
        Suite::PoolReport => pool_report_workloads().into_iter().map(plain).collect(),
        Suite::Durable => durable_workloads().into_iter().map(plain).collect(),
        Suite::Fill => options
            .fill_levels_percent
            .iter()
            .flat_map(|&level| {
                pool_report_workloads()
                    .into_iter()
                    .map(move |workload| TestSpec {
                        suite,
                        workload,
                        fill_percent: Some(level),
                    })
            })
            .collect(),
    }
}

/// The five tests of the pool report (BENCHMARKS.md suite 2).
pub fn pool_report_workloads() -> Vec<Workload> {
    let mut mixed = Workload::new(Pattern::RandRw, 256 * KIB, 16, 4);
    mixed.read_mix_percent = Some(70);
    vec![
        Workload::new(Pattern::SeqWrite, MIB, 1, 1),
        Workload::new(Pattern::SeqRead, MIB, 1, 1),
        Workload::new(Pattern::RandRead, 4 * KIB, 32, 4),
        Workload::new(Pattern::RandWrite, 4 * KIB, 32, 4),
        mixed,
    ]
}

/// The durable-write tests (BENCHMARKS.md suite 3, the table of
/// `scripts/bench-durable.sh`): 16K random writes with a flush after each
/// write at QD1 (the latency of one durable write), a flush after every 32
/// at QD64 (does the target batch flushes?), every write durable at QD64
/// (O_DSYNC, or `sync=always` on a volume), the same writes with no flush
/// (what durability costs), and the raw psync + fdatasync baseline.
pub fn durable_workloads() -> Vec<Workload> {
    let with = |iodepth, durability| Workload {
        durability,
        ..Workload::new(Pattern::RandWrite, 16 * KIB, iodepth, 1)
    };
    vec![
        with(1, Durability::Fsync),
        with(
            DURABLE_DEEP_IODEPTH,
            Durability::FsyncEvery(DURABLE_WRITES_PER_FLUSH),
        ),
        with(DURABLE_DEEP_IODEPTH, Durability::Dsync),
        with(DURABLE_DEEP_IODEPTH, Durability::None),
        with(1, Durability::PsyncFdatasync),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> SuiteOptions {
        SuiteOptions {
            depths: QD_SCALING_DEPTHS.to_vec(),
            jobs: QD_SCALING_JOBS.to_vec(),
            fill_levels_percent: FILL_LEVELS_PERCENT.to_vec(),
        }
    }

    #[test]
    fn names_tests() {
        let names: Vec<String> = tests_of(Suite::PoolReport, &options())
            .iter()
            .map(TestSpec::name)
            .collect();
        assert_eq!(
            names,
            [
                "write-1m-qd1-1j",
                "read-1m-qd1-1j",
                "randread-4k-qd32-4j",
                "randwrite-4k-qd32-4j",
                "randrw70-256k-qd16-4j"
            ]
        );
        let durable: Vec<String> = tests_of(Suite::Durable, &options())
            .iter()
            .map(TestSpec::name)
            .collect();
        assert_eq!(
            durable,
            [
                "randwrite-16k-qd1-1j-fsync",
                "randwrite-16k-qd64-1j-fsync32",
                "randwrite-16k-qd64-1j-dsync",
                "randwrite-16k-qd64-1j",
                "randwrite-16k-qd1-1j-psync-fdatasync"
            ]
        );
    }

    #[test]
    fn sizes_suites() {
        assert_eq!(tests_of(Suite::QdScaling, &options()).len(), 16);
        assert_eq!(tests_of(Suite::Fill, &options()).len(), 20);
    }
}
