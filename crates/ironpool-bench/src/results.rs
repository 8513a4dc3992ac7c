//! results.json: every figure of a run, the machine, the versions and the
//! exact commands. The report and the charts are rendered from this alone,
//! so a recorded results.json reproduces them (`--from-results`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::fio_json::{DirectionSummary, FioDiskUtil, LatencySummary};
use crate::suites::{Suite, Workload};

/// Version of the results.json layout; bumped on incompatible changes.
pub const RESULTS_SCHEMA_VERSION: u32 = 1;

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    /// [`RESULTS_SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// Version of ironpool-bench that ran.
    pub tool_version: String,
    /// Unix seconds at the start.
    pub started_unix_seconds: u64,
    /// Unix seconds at the end.
    pub finished_unix_seconds: u64,
    /// True when the run was interrupted and the results are partial.
    #[serde(default)]
    pub interrupted: bool,
    /// The machine and tool versions.
    pub machine: Machine,
    /// What was asked for.
    pub settings: Settings,
    /// One entry per target, in run order; the raw baseline first.
    pub targets: Vec<TargetResult>,
    /// Findings computed from the figures (see `analysis`); pitfalls found
    /// while running are kept per target.
    #[serde(default)]
    pub findings: Vec<Finding>,
}

/// The machine the figures belong to.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// PRETTY_NAME of /etc/os-release.
    #[serde(default)]
    pub os: String,
    /// The first `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// CPUs this process may use.
    pub cpu_count: u32,
    /// MemTotal.
    pub memory_bytes: u64,
    /// The page size: direct I/O needs buffers and offsets aligned to it.
    pub page_size_bytes: u64,
    /// `fio --version`.
    pub fio_version: String,
    /// `nbdkit --version`, when an nbdkit target ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbdkit_version: Option<String>,
    /// `ironpool --version`, when an ironpool target ran and it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ironpool_version: Option<String>,
}

/// The run's settings after defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// Suites in run order.
    pub suites: Vec<Suite>,
    /// The target specs as given (plus the raw baseline).
    pub target_specs: Vec<String>,
    /// Measured seconds per test.
    pub runtime_seconds: u64,
    /// Warm-up seconds per test, not measured.
    pub ramp_seconds: u64,
    /// Working-set size of every target.
    pub size_bytes: u64,
    /// Queue depths of qd-scaling.
    pub depths: Vec<u32>,
    /// Job counts of qd-scaling.
    pub jobs: Vec<u32>,
    /// Fill levels of the fill suite.
    pub fill_levels_percent: Vec<u32>,
    /// Files of the fs suite's metadata phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
}

/// One target's setup and tests.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TargetResult {
    /// The target spec, e.g. `ironpool:mirror:2x2G`; the report's label.
    pub label: String,
    /// raw, file, dir, nbd, nbdkit, ironpool.
    pub kind: String,
    /// True for the raw baseline the ratios divide by.
    #[serde(default)]
    pub baseline: bool,
    /// The target whose figures are this one's physical limit, when not the
    /// raw baseline: a mirror of two files is held to two raw files written
    /// at once (`raw-pair`), every byte written twice on the one disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// A sentence for people: what this target is.
    pub description: String,
    /// Working-set size.
    pub size_bytes: u64,
    /// The filesystem type under a file-backed target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<String>,
    /// Record size (volblocksize, ZFS recordsize, st_blksize or the NBD
    /// preferred block size), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_size_bytes: Option<u64>,
    /// Commands run to set the target up (pool create, server start, …).
    #[serde(default)]
    pub setup_commands: Vec<Vec<String>>,
    /// Why the target could not be set up or was abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Sequential writes that filled the target (and fill-suite fillers).
    #[serde(default)]
    pub prefills: Vec<PrefillResult>,
    /// The tests, in run order.
    #[serde(default)]
    pub tests: Vec<TestResult>,
    /// Remarks for people (skipped suites and why).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Pitfalls found while running.
    #[serde(default)]
    pub pitfalls: Vec<Finding>,
}

impl TargetResult {
    /// This target's passed test of `test`'s workload: of the same suite
    /// first, then of any suite.
    pub fn same_workload(&self, test: &TestResult) -> Option<&TestResult> {
        let ok = |t: &&TestResult| t.is_ok() && t.workload == test.workload;
        self.tests
            .iter()
            .filter(ok)
            .find(|t| t.suite == test.suite)
            .or_else(|| self.tests.iter().find(ok))
    }
}

/// A sequential write that filled a target or a filler.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PrefillResult {
    /// What was filled: `target` or a filler's name.
    pub purpose: String,
    /// Bytes written.
    pub bytes: u64,
    /// Bytes per second.
    pub bandwidth_bytes_per_second: f64,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// The exact fio command.
    pub command: Vec<String>,
}

/// How a test ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Outcome {
    /// fio ran through.
    Ok,
    /// fio failed; the figures may be missing.
    Failed {
        /// fio's error, for people.
        error: String,
    },
    /// Not run on this target.
    Skipped {
        /// Why, for people.
        reason: String,
    },
}

/// One test on one target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TestResult {
    /// The suite.
    pub suite: Suite,
    /// The workload's name, e.g. `randwrite-16k-qd64-4j`.
    pub name: String,
    /// The workload.
    pub workload: Workload,
    /// The fill level the fill suite aimed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_target_percent: Option<u32>,
    /// The fill level measured just before the test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_measured_percent: Option<f64>,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The exact fio command.
    #[serde(default)]
    pub command: Vec<String>,
    /// fio's raw output, relative to the output directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fio_output: Option<String>,
    /// Read figures, when the test read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<DirectionSummary>,
    /// Write figures, when the test wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<DirectionSummary>,
    /// Flush latency, when the test flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<LatencySummary>,
    /// Wall-clock seconds of the fio process.
    #[serde(default)]
    pub wall_seconds: f64,
    /// fio's own CPU, percent of one core (user + system).
    #[serde(default)]
    pub client_cpu_percent: f64,
    /// The server's CPU, for targets served by a process we started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerUsage>,
    /// Device-side figures from `ironpool iostat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceSummary>,
    /// Volume-side counters from `ironpool iostat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeDelta>,
    /// The kernel's view of the block devices (fio's disk_util).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk_util: Vec<FioDiskUtil>,
    /// For a test of system calls (`ops`): operations per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_second: Option<f64>,
    /// For a soak (`verify`): the server and pool sampled through the
    /// test, in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<Sample>,
}

/// One sample of a soak: what the server held and used, and the pool's
/// free space, at a moment of the test.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Seconds since the test started.
    pub seconds: f64,
    /// The server's resident memory (`VmRSS`); none without a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_rss_bytes: Option<u64>,
    /// The server's CPU since the sample before, percent of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_percent: Option<f64>,
    /// The pool's free space (ironpool targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_free_bytes: Option<u64>,
}

/// The server's CPU use during one test.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerUsage {
    /// utime + stime consumed during the test.
    pub cpu_seconds: f64,
    /// cpu_seconds over the test's wall-clock time.
    pub cores_used: f64,
    /// The test's IOPS over cores_used: the efficiency figure.
    pub iops_per_core: f64,
    /// Server CPU microseconds per operation (cpu_seconds over fio's I/Os):
    /// 1 / this is the most one core of the server can serve.
    #[serde(default)]
    pub cpu_us_per_op: f64,
}

/// Device-side figures of an ironpool target over one test.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceSummary {
    /// Device writes after aggregation.
    pub write_ops: u64,
    /// Bytes written to devices.
    pub write_bytes: u64,
    /// Device reads after aggregation.
    pub read_ops: u64,
    /// Bytes read from devices.
    pub read_bytes: u64,
    /// write_bytes / write_ops.
    pub average_write_size_bytes: f64,
    /// read_bytes / read_ops.
    pub average_read_size_bytes: f64,
    /// Writes before aggregation per write after: how much merging happened.
    pub write_aggregation: f64,
    /// Reads before aggregation per read after.
    #[serde(default)]
    pub read_aggregation: f64,
    /// Mean over devices of the average number of I/Os in flight.
    pub average_queue_depth: f64,
    /// Bytes written to devices per byte fio wrote (mirror: 2, plus metadata).
    pub write_amplification: f64,
    /// Read, write and checksum errors the devices reported.
    pub errors: u64,
    /// Device cache flushes plus durable (FUA) writes, all devices: what
    /// making data durable cost (a mirror's log block is two).
    #[serde(default)]
    pub syncs: u64,
    /// Cache flushes the devices' queues did not send, all devices: a
    /// flush that found nothing written since the one before (what
    /// `scripts/compare-flush.sh` printed beside the flushes sent).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub syncs_skipped: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Volume counters of an ironpool target over one test.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct VolumeDelta {
    /// Reads the volume served.
    pub read_ops: u64,
    /// Writes the volume served.
    pub write_ops: u64,
    /// Reads served without a cache copy.
    pub direct_read_ops: u64,
    /// Writes served without a cache copy.
    pub direct_write_ops: u64,
    /// Partial-block writes that needed a read-modify-write.
    pub rmw_write_ops: u64,
    /// Reads of never-written blocks.
    pub hole_read_ops: u64,
    /// Client FLUSHes.
    #[serde(default)]
    pub flush_ops: u64,
    /// Intent log commits that wrote blocks (each one durable write per log device).
    #[serde(default)]
    pub log_commits: u64,
    /// FLUSHes whose writes the commit before had logged (group commit).
    #[serde(default)]
    pub log_shared_commits: u64,
    /// FLUSHes made durable by a txg instead of the log.
    #[serde(default)]
    pub log_txg_fallbacks: u64,
    /// Bytes of log blocks written.
    #[serde(default)]
    pub log_bytes: u64,
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// A figure worth knowing.
    Info,
    /// A figure that is probably wrong, or a target that misbehaves.
    Warning,
}

/// A plain-language statement computed from the data.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// A stable identifier of the check, e.g. `qd-scaling`, `direct-io`.
    pub check: String,
    /// The target it is about, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The test it is about, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// The sentence.
    pub message: String,
}

impl Finding {
    /// A finding about a target (and maybe one test).
    pub fn new(
        severity: Severity,
        check: &str,
        target: &str,
        test: Option<&str>,
        message: String,
    ) -> Self {
        Finding {
            severity,
            check: check.to_string(),
            target: Some(target.to_string()),
            test: test.map(str::to_string),
            message,
        }
    }
}

impl TestResult {
    /// A result with no figures yet.
    pub fn pending(suite: Suite, workload: Workload, fill_target_percent: Option<u32>) -> Self {
        TestResult {
            suite,
            name: workload.name(),
            workload,
            fill_target_percent,
            fill_measured_percent: None,
            outcome: Outcome::Ok,
            command: Vec::new(),
            fio_output: None,
            read: None,
            write: None,
            sync: None,
            wall_seconds: 0.0,
            client_cpu_percent: 0.0,
            server: None,
            device: None,
            volume: None,
            disk_util: Vec::new(),
            ops_per_second: None,
            samples: Vec::new(),
        }
    }

    /// True when fio ran through.
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// Read plus write operations per second (for a test of system
    /// calls, its operations per second).
    pub fn total_iops(&self) -> f64 {
        if let Some(rate) = self.ops_per_second {
            return rate;
        }
        self.read.map_or(0.0, |r| r.iops) + self.write.map_or(0.0, |w| w.iops)
    }

    /// Operations done: fio's reads and writes, or a test of system calls'
    /// operations.
    pub fn operations(&self) -> u64 {
        if let Some(rate) = self.ops_per_second {
            return (rate * self.wall_seconds).round() as u64;
        }
        self.read.map_or(0, |r| r.ops) + self.write.map_or(0, |w| w.ops)
    }

    /// Read plus write bytes per second.
    pub fn total_bandwidth(&self) -> f64 {
        self.read.map_or(0.0, |r| r.bandwidth_bytes_per_second)
            + self.write.map_or(0.0, |w| w.bandwidth_bytes_per_second)
    }

    /// Read plus write bytes.
    pub fn total_io_bytes(&self) -> u64 {
        self.read.map_or(0, |r| r.io_bytes) + self.write.map_or(0, |w| w.io_bytes)
    }

    /// The figure a test is judged by: bandwidth for sequential workloads,
    /// IOPS for random ones.
    pub fn headline(&self) -> f64 {
        if self.workload.pattern.is_sequential() {
            self.total_bandwidth()
        } else {
            self.total_iops()
        }
    }

    /// The p99 latency of the direction that dominates the test (writes for
    /// writes, reads for reads and mixes).
    pub fn p99_ns(&self) -> Option<u64> {
        self.read.or(self.write).map(|d| d.latency.p99_ns)
    }

    /// A label that tells fill levels apart: `fill-50/randwrite-4k-qd32-4j`.
    pub fn label(&self) -> String {
        match self.fill_target_percent {
            Some(level) => format!("fill-{level}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

impl Results {
    /// The raw baseline, when one ran.
    pub fn baseline(&self) -> Option<&TargetResult> {
        self.targets.iter().find(|t| t.baseline)
    }

    /// The result a target's test is held to: the same workload on its
    /// limit target (`raw-pair` for a mirror) when that ran it, else on the
    /// raw baseline ([`Results::baseline_for`]); for what a filesystem
    /// answers on its own, on the `ext4` target.
    pub fn limit_for(&self, target: &TargetResult, test: &TestResult) -> Option<&TestResult> {
        self.limit_with_target(target, test).map(|(_, test)| test)
    }

    /// [`Results::limit_for`] with the target it comes from, to name it.
    pub fn limit_with_target(
        &self,
        target: &TargetResult,
        test: &TestResult,
    ) -> Option<(&TargetResult, &TestResult)> {
        if target.baseline {
            return None;
        }
        fn same<'a>(
            limit: &'a TargetResult,
            test: &TestResult,
        ) -> Option<(&'a TargetResult, &'a TestResult)> {
            Some((limit, limit.same_workload(test)?))
        }
        let same = |limit| same(limit, test);
        // Some tests are held to another test of the same target (see
        // `Workload::own_limit`): a snapshot's reads to the head's, and so on.
        if let Some(head) = test.workload.own_limit() {
            let own = self.targets.iter().find(|t| t.label == target.label)?;
            return own
                .tests
                .iter()
                .find(|t| t.is_ok() && t.workload == head)
                .map(|head| (own, head));
        }
        // What a filesystem answers on its own (system calls, the page
        // cache) is held to another filesystem on the same disk.
        if test.workload.is_filesystem_test() {
            return self
                .targets
                .iter()
                .find(|t| t.kind == "ext4" && t.label != target.label)
                .and_then(same);
        }
        // Reads from a cache are held to nbdkit's memory plugin when the
        // run has it: the same transport with its data in RAM.
        if test.workload.cached {
            if let Some(memory) = self
                .targets
                .iter()
                .find(|t| t.kind == "nbdkit-memory" && t.label != target.label)
                .and_then(same)
            {
                return Some(memory);
            }
        }
        target
            .limit
            .as_ref()
            .and_then(|label| self.targets.iter().find(|t| &t.label == label))
            .and_then(same)
            .or_else(|| self.baseline().and_then(same))
    }

    /// The baseline's result for the same workload: the same suite first,
    /// then any suite (the fill suite compares with the raw pool report).
    pub fn baseline_for(&self, test: &TestResult) -> Option<&TestResult> {
        self.baseline()?.same_workload(test)
    }

    /// Reads a results.json.
    pub fn load(path: &Path) -> Result<Results> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("{} is not an ironpool-bench results.json", path.display()))?;
        if results.schema_version != RESULTS_SCHEMA_VERSION {
            bail!(
                "{} has schema version {}, this ironpool-bench reads version {}",
                path.display(),
                results.schema_version,
                RESULTS_SCHEMA_VERSION
            );
        }
        Ok(results)
    }

    /// Writes results.json (pretty-printed, for diffs).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("serialising results")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    /// Figures read back from results.json are the ones written, to the
    /// last bit: a re-rendered report prints what the first one printed.
    #[test]
    fn floats_survive_a_round_trip() {
        let mut value = 0.1f64;
        for step in 0..10_000 {
            value = value * 1.000_123_456_7 + f64::from(step) / 3.0;
            let text = serde_json::to_string(&value).unwrap();
            let back: f64 = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_bits(), value.to_bits(), "{text}");
        }
        let per_op: f64 = 3.0e-2 * 1e6 / 299.0;
        let text = serde_json::to_string(&per_op).unwrap();
        let back: f64 = serde_json::from_str(&text).unwrap();
        assert_eq!(back.to_bits(), per_op.to_bits());
    }
}
