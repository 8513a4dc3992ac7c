//! The part of fio's `--output-format=json` we read (fio 3.x), and the
//! summaries the report uses.
//!
//! Every field defaults when absent, so older and newer fio versions parse;
//! what we cannot do without (a `jobs` array) is an error. fio's nbd engine
//! prints `fio: connected to NBD server` (once per job) and fio prints error
//! lines such as `fio: pid=…, err=22/…` on stdout before the JSON document:
//! [`parse`] keeps those lines as [`FioOutput::preamble`] for error messages.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// A whole fio JSON report.
#[derive(Debug, Clone, Deserialize)]
pub struct FioReport {
    /// e.g. `fio-3.33`.
    #[serde(rename = "fio version", default)]
    pub fio_version: String,
    /// One entry per job, or a single one with `--group_reporting`.
    pub jobs: Vec<FioJobReport>,
    /// Block devices the run touched, as the kernel saw them.
    #[serde(default)]
    pub disk_util: Vec<FioDiskUtil>,
}

impl FioReport {
    /// The job with the fewest I/Os per second (reads plus writes): the one
    /// job of a `--group_reporting` run, or the slower file of a pair, which
    /// a mirror's write waits for.
    pub fn slowest_job(&self) -> Option<&FioJobReport> {
        let iops = |job: &FioJobReport| {
            job.read.summary().map_or(0.0, |r| r.iops) + job.write.summary().map_or(0.0, |w| w.iops)
        };
        self.jobs.iter().min_by(|a, b| iops(a).total_cmp(&iops(b)))
    }
}

/// One job's (or one reporting group's) figures.
#[derive(Debug, Clone, Deserialize)]
pub struct FioJobReport {
    /// The `--name` of the job.
    #[serde(default)]
    pub jobname: String,
    /// errno of the first error that stopped the job; 0 when it ran through.
    #[serde(default)]
    pub error: i64,
    /// Read direction.
    #[serde(default)]
    pub read: FioDirection,
    /// Write direction.
    #[serde(default)]
    pub write: FioDirection,
    /// fsync/fdatasync/flush operations issued with `--fsync`/`--fdatasync`.
    #[serde(default)]
    pub sync: FioSync,
    /// User CPU of the fio process, percent of one core.
    #[serde(default)]
    pub usr_cpu: f64,
    /// System CPU of the fio process, percent of one core.
    #[serde(default)]
    pub sys_cpu: f64,
    /// Milliseconds the job ran (excluding ramp time).
    #[serde(default)]
    pub job_runtime: u64,
}

/// Figures for one direction (read or write) of a job.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioDirection {
    /// Bytes transferred.
    #[serde(default)]
    pub io_bytes: u64,
    /// Bandwidth in bytes per second.
    #[serde(default)]
    pub bw_bytes: f64,
    /// Operations per second.
    #[serde(default)]
    pub iops: f64,
    /// Milliseconds of this direction's run.
    #[serde(default)]
    pub runtime: u64,
    /// Operations completed.
    #[serde(default)]
    pub total_ios: u64,
    /// Completion latency: from submission to completion.
    #[serde(default)]
    pub clat_ns: FioLatency,
    /// Total latency: submission latency plus completion latency.
    #[serde(default)]
    pub lat_ns: FioLatency,
}

/// The `sync` section: flush operations and their latency.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioSync {
    /// Flushes fio counted (psync's fdatasync is only in `lat_ns.N`).
    #[serde(default)]
    pub total_ios: u64,
    /// Flush latency.
    #[serde(default)]
    pub lat_ns: FioLatency,
}

/// A latency distribution in nanoseconds.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioLatency {
    /// Smallest sample.
    #[serde(default)]
    pub min: u64,
    /// Largest sample.
    #[serde(default)]
    pub max: u64,
    /// Mean of the samples.
    #[serde(default)]
    pub mean: f64,
    /// Number of samples.
    #[serde(rename = "N", default)]
    pub samples: u64,
    /// Percentiles keyed `"99.000000"`; present when fio computed them.
    #[serde(default)]
    pub percentile: BTreeMap<String, u64>,
}

/// One `disk_util` entry: the kernel's view of a block device during the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FioDiskUtil {
    /// Device name, e.g. `vda`.
    #[serde(default)]
    pub name: String,
    /// Reads the device completed.
    #[serde(default)]
    pub read_ios: u64,
    /// Writes the device completed.
    #[serde(default)]
    pub write_ios: u64,
    /// Percent of the run the device was busy.
    #[serde(default)]
    pub util: f64,
}

/// A parsed fio run: the report and whatever fio printed before it.
#[derive(Debug, Clone)]
pub struct FioOutput {
    /// Lines before the JSON document (`fio: connected to NBD server`,
    /// error lines), trimmed.
    pub preamble: Vec<String>,
    /// The JSON report.
    pub report: FioReport,
}

/// Parses fio's stdout: skips everything before the first line that starts
/// with `{`, then reads one JSON document.
pub fn parse(stdout: &str) -> Result<FioOutput> {
    let start = json_start(stdout).with_context(|| {
        format!(
            "fio printed no JSON report; its output began: {:?}",
            stdout.chars().take(300).collect::<String>()
        )
    })?;
    let (before, json) = stdout.split_at(start);
    let report: FioReport = serde_json::from_str(json)
        .context("fio's JSON report does not parse (is this fio 3.x with --output-format=json?)")?;
    if report.jobs.is_empty() {
        bail!("fio's JSON report has no jobs");
    }
    let preamble = before
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect();
    Ok(FioOutput { preamble, report })
}

/// Byte offset of the first `{` that begins a line: a `{` inside a stray
/// message line must not be taken for the document.
fn json_start(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('{') {
            return Some(offset + (line.len() - line.trim_start().len()));
        }
        offset += line.len();
    }
    None
}

/// The latency figures the report shows, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    /// Smallest sample.
    #[serde(default)]
    pub min_ns: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 95th percentile.
    pub p95_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    #[serde(default)]
    pub p99_9_ns: u64,
    /// Largest sample.
    pub max_ns: u64,
    /// Samples behind the figures.
    pub samples: u64,
}

/// One direction's figures as results.json keeps them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct DirectionSummary {
    /// Operations per second.
    pub iops: f64,
    /// Bytes per second.
    pub bandwidth_bytes_per_second: f64,
    /// Bytes transferred.
    pub io_bytes: u64,
    /// Operations completed.
    pub ops: u64,
    /// Total latency (submission + completion) when fio measured it,
    /// otherwise completion latency.
    pub latency: LatencySummary,
}

impl FioLatency {
    /// The percentile closest to `wanted` (e.g. 99.0), if fio computed any.
    pub fn percentile_ns(&self, wanted: f64) -> Option<u64> {
        self.percentile
            .iter()
            .filter_map(|(key, value)| key.parse::<f64>().ok().map(|p| (p, *value)))
            .min_by(|a, b| (a.0 - wanted).abs().total_cmp(&(b.0 - wanted).abs()))
            .filter(|(p, _)| (p - wanted).abs() < 0.01)
            .map(|(_, value)| value)
    }

    /// The report's summary of this distribution.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            min_ns: self.min,
            mean_ns: self.mean,
            p50_ns: self.percentile_ns(50.0).unwrap_or(0),
            p95_ns: self.percentile_ns(95.0).unwrap_or(0),
            p99_ns: self.percentile_ns(99.0).unwrap_or(0),
            p99_9_ns: self.percentile_ns(99.9).unwrap_or(0),
            max_ns: self.max,
            samples: self.samples,
        }
    }
}

impl FioDirection {
    /// The summary of this direction, or `None` when it did no I/O.
    pub fn summary(&self) -> Option<DirectionSummary> {
        if self.total_ios == 0 {
            return None;
        }
        // With --lat_percentiles=1 the total latency carries percentiles;
        // without it only the completion latency does.
        let latency = if self.lat_ns.percentile.is_empty() && !self.clat_ns.percentile.is_empty() {
            &self.clat_ns
        } else {
            &self.lat_ns
        };
        Some(DirectionSummary {
            iops: self.iops,
            bandwidth_bytes_per_second: self.bw_bytes,
            io_bytes: self.io_bytes,
            ops: self.total_ios,
            latency: latency.summary(),
        })
    }
}

impl FioSync {
    /// Flush latency, or `None` when the job issued no flushes.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.lat_ns.samples == 0 && self.total_ios == 0 {
            return None;
        }
        Some(self.lat_ns.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_json_after_stray_lines() {
        let text = "fio: connected to NBD server\nfio: {odd}\n{\"jobs\":[{}]}\n";
        let output = parse(text).unwrap();
        assert_eq!(
            output.preamble,
            vec!["fio: connected to NBD server", "fio: {odd}"]
        );
        assert_eq!(output.report.jobs.len(), 1);
    }

    #[test]
    fn rejects_output_without_json() {
        let error = parse("fio: failed to open\n").unwrap_err();
        assert!(format!("{error:#}").contains("no JSON report"));
    }

    #[test]
    fn picks_nearest_percentile() {
        let mut latency = FioLatency::default();
        latency.percentile.insert("99.000000".into(), 120);
        latency.percentile.insert("99.500000".into(), 150);
        assert_eq!(latency.percentile_ns(99.0), Some(120));
        assert_eq!(latency.percentile_ns(50.0), None);
    }
}
