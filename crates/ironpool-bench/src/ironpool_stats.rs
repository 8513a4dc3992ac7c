//! The JSON the `ironpool` CLI prints for `iostat --json` and `list --json`,
//! and the per-test deltas the report shows.
//!
//! Counters are cumulative since import, so a test's figures are the
//! difference of two snapshots taken just before and just after it.

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::results::{DeviceSummary, VolumeDelta};

/// `ironpool iostat --json`: one document of cumulative counters.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct IostatSnapshot {
    /// Pool name.
    #[serde(default)]
    pub pool: String,
    /// Monotonic time of the snapshot.
    #[serde(default)]
    pub timestamp_ns: u64,
    /// Leaf devices.
    #[serde(default)]
    pub devices: Vec<DeviceCounters>,
    /// Volumes.
    #[serde(default)]
    pub volumes: Vec<VolumeCounters>,
    /// Filesystems: their file I/O, with a volume's counter names.
    #[serde(default)]
    pub filesystems: Vec<VolumeCounters>,
}

/// Cumulative counters of one leaf device.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct DeviceCounters {
    /// Path of the device or file.
    #[serde(default)]
    pub path: String,
    /// The top-level vdev it belongs to, e.g. `mirror-0`.
    #[serde(default)]
    pub top_vdev: String,
    /// Device reads after aggregation.
    #[serde(default)]
    pub read_ops: u64,
    /// Device writes after aggregation.
    #[serde(default)]
    pub write_ops: u64,
    #[serde(default)]
    pub read_bytes: u64,
    #[serde(default)]
    pub write_bytes: u64,
    /// Reads before aggregation.
    #[serde(default)]
    pub read_requests: u64,
    /// Writes before aggregation.
    #[serde(default)]
    pub write_requests: u64,
    /// Time integral of the number of active device I/Os.
    #[serde(default)]
    pub active_time_weighted_ns: u64,
    #[serde(default)]
    pub busy_ns: u64,
    #[serde(default)]
    pub read_errors: u64,
    #[serde(default)]
    pub write_errors: u64,
    #[serde(default)]
    pub checksum_errors: u64,
    /// Cache flushes sent to the device.
    #[serde(default)]
    pub flush_ops: u64,
    /// Writes sent durable (FUA, or O_DSYNC on a file).
    #[serde(default)]
    pub durable_write_ops: u64,
    /// Flushes the device's queue did not send: nothing was written since
    /// the last.
    #[serde(default)]
    pub flushes_skipped: u64,
}

/// Cumulative counters of one volume.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct VolumeCounters {
    /// `pool/volume`.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub read_ops: u64,
    #[serde(default)]
    pub write_ops: u64,
    #[serde(default)]
    pub read_bytes: u64,
    #[serde(default)]
    pub write_bytes: u64,
    #[serde(default)]
    pub direct_read_ops: u64,
    #[serde(default)]
    pub direct_write_ops: u64,
    #[serde(default)]
    pub rmw_write_ops: u64,
    #[serde(default)]
    pub hole_read_ops: u64,
    /// Client FLUSHes.
    #[serde(default)]
    pub flush_ops: u64,
    /// The volume's intent log (absent from servers before it existed).
    #[serde(default)]
    pub intent_log: LogCounters,
}

/// Cumulative counters of one volume's intent log.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[allow(missing_docs)]
pub struct LogCounters {
    /// Log commits that wrote blocks (each one durable write per log device).
    #[serde(default)]
    pub commits: u64,
    /// Commits that found their writes logged by the one before.
    #[serde(default)]
    pub shared_commits: u64,
    /// Commits that went through a txg instead.
    #[serde(default)]
    pub txg_fallbacks: u64,
    #[serde(default)]
    pub bytes_written: u64,
}

/// `ironpool list --json`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PoolList {
    /// Imported pools.
    #[serde(default)]
    pub pools: Vec<PoolSpace>,
}

/// One pool of `ironpool list --json`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PoolSpace {
    /// Pool name.
    pub name: String,
    /// Usable capacity.
    pub size_bytes: u64,
    /// Allocated.
    #[serde(default)]
    pub allocated_bytes: u64,
    /// Free.
    #[serde(default)]
    pub free_bytes: u64,
    /// ONLINE, DEGRADED, …
    #[serde(default)]
    pub health: String,
}

impl PoolSpace {
    /// Allocated space as a percentage of capacity.
    pub fn fill_percent(&self) -> f64 {
        if self.size_bytes == 0 {
            return 0.0;
        }
        100.0 * self.allocated_bytes as f64 / self.size_bytes as f64
    }
}

/// Parses `ironpool iostat --json`.
pub fn parse_iostat(text: &str) -> Result<IostatSnapshot> {
    serde_json::from_str(text.trim())
        .context("`ironpool iostat --json` printed something that is not its JSON document")
}

/// Parses `ironpool list --json` and picks `pool`.
pub fn parse_list(text: &str, pool: &str) -> Result<PoolSpace> {
    let list: PoolList = serde_json::from_str(text.trim())
        .context("`ironpool list --json` printed something that is not its JSON document")?;
    list.pools
        .into_iter()
        .find(|p| p.name == pool)
        .with_context(|| format!("`ironpool list --json` does not list pool {pool:?}"))
}

/// Device-side figures between two snapshots; `client_write_bytes` is what
/// fio wrote, for the write amplification.
pub fn device_delta(
    before: &IostatSnapshot,
    after: &IostatSnapshot,
    client_write_bytes: u64,
) -> DeviceSummary {
    let mut sum = DeviceCounters::default();
    let mut queue_depths = Vec::new();
    let elapsed_ns = after.timestamp_ns.saturating_sub(before.timestamp_ns);
    for device in &after.devices {
        let zero = DeviceCounters::default();
        let old = before
            .devices
            .iter()
            .find(|d| d.path == device.path)
            .unwrap_or(&zero);
        sum.read_ops += device.read_ops.saturating_sub(old.read_ops);
        sum.write_ops += device.write_ops.saturating_sub(old.write_ops);
        sum.read_bytes += device.read_bytes.saturating_sub(old.read_bytes);
        sum.write_bytes += device.write_bytes.saturating_sub(old.write_bytes);
        sum.write_requests += device.write_requests.saturating_sub(old.write_requests);
        sum.read_requests += device.read_requests.saturating_sub(old.read_requests);
        sum.read_errors += device.read_errors.saturating_sub(old.read_errors);
        sum.write_errors += device.write_errors.saturating_sub(old.write_errors);
        sum.checksum_errors += device.checksum_errors.saturating_sub(old.checksum_errors);
        sum.flush_ops += device.flush_ops.saturating_sub(old.flush_ops);
        sum.durable_write_ops += device
            .durable_write_ops
            .saturating_sub(old.durable_write_ops);
        sum.flushes_skipped += device.flushes_skipped.saturating_sub(old.flushes_skipped);
        if elapsed_ns > 0 {
            let weighted = device
                .active_time_weighted_ns
                .saturating_sub(old.active_time_weighted_ns);
            queue_depths.push(weighted as f64 / elapsed_ns as f64);
        }
    }
    let per = |total: u64, count: u64| {
        if count == 0 {
            0.0
        } else {
            total as f64 / count as f64
        }
    };
    DeviceSummary {
        write_ops: sum.write_ops,
        write_bytes: sum.write_bytes,
        read_ops: sum.read_ops,
        read_bytes: sum.read_bytes,
        average_write_size_bytes: per(sum.write_bytes, sum.write_ops),
        average_read_size_bytes: per(sum.read_bytes, sum.read_ops),
        write_aggregation: per(sum.write_requests, sum.write_ops),
        read_aggregation: per(sum.read_requests, sum.read_ops),
        average_queue_depth: if queue_depths.is_empty() {
            0.0
        } else {
            queue_depths.iter().sum::<f64>() / queue_depths.len() as f64
        },
        write_amplification: per(sum.write_bytes, client_write_bytes),
        errors: sum.read_errors + sum.write_errors + sum.checksum_errors,
        syncs: sum.flush_ops + sum.durable_write_ops,
        syncs_skipped: sum.flushes_skipped,
    }
}

/// Volume counters between two snapshots, for `volume` (`pool/vol`).
pub fn volume_delta(
    before: &IostatSnapshot,
    after: &IostatSnapshot,
    volume: &str,
) -> Option<VolumeDelta> {
    let find = |snapshot: &'_ IostatSnapshot| {
        snapshot
            .volumes
            .iter()
            .chain(&snapshot.filesystems)
            .find(|v| v.name == volume)
            .cloned()
    };
    let new = find(after)?;
    let old = find(before).unwrap_or_default();
    Some(VolumeDelta {
        read_ops: new.read_ops.saturating_sub(old.read_ops),
        write_ops: new.write_ops.saturating_sub(old.write_ops),
        direct_read_ops: new.direct_read_ops.saturating_sub(old.direct_read_ops),
        direct_write_ops: new.direct_write_ops.saturating_sub(old.direct_write_ops),
        rmw_write_ops: new.rmw_write_ops.saturating_sub(old.rmw_write_ops),
        hole_read_ops: new.hole_read_ops.saturating_sub(old.hole_read_ops),
        flush_ops: new.flush_ops.saturating_sub(old.flush_ops),
        log_commits: new
            .intent_log
            .commits
            .saturating_sub(old.intent_log.commits),
        log_shared_commits: new
            .intent_log
            .shared_commits
            .saturating_sub(old.intent_log.shared_commits),
        log_txg_fallbacks: new
            .intent_log
            .txg_fallbacks
            .saturating_sub(old.intent_log.txg_fallbacks),
        log_bytes: new
            .intent_log
            .bytes_written
            .saturating_sub(old.intent_log.bytes_written),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"{"pool":"bench","timestamp_ns":1000000000,
      "devices":[{"path":"/o/d0.img","top_vdev":"mirror-0","read_ops":0,"write_ops":10,"read_bytes":0,
        "write_bytes":1048576,"read_requests":0,"write_requests":10,"active_time_weighted_ns":0,"busy_ns":0,
        "queued_total":0,"active_total":0,"read_errors":0,"write_errors":0,"checksum_errors":0},
        {"path":"/o/d1.img","top_vdev":"mirror-0","write_ops":10,"write_bytes":1048576,"write_requests":10}],
      "volumes":[{"name":"bench/vol","read_ops":5,"write_ops":7,"direct_write_ops":7}]}"#;
    const AFTER: &str = r#"{"pool":"bench","timestamp_ns":3000000000,
      "devices":[{"path":"/o/d0.img","top_vdev":"mirror-0","write_ops":110,"write_bytes":53477376,
        "write_requests":3210,"active_time_weighted_ns":8000000000,"checksum_errors":1,
        "flush_ops":4,"flushes_skipped":3},
        {"path":"/o/d1.img","top_vdev":"mirror-0","write_ops":110,"write_bytes":53477376,"write_requests":3210,
        "active_time_weighted_ns":4000000000,"flush_ops":7}],
      "volumes":[{"name":"bench/vol","read_ops":5,"write_ops":3207,"direct_write_ops":3207,"hole_read_ops":2}]}"#;

    #[test]
    fn computes_device_and_volume_deltas() {
        let before = parse_iostat(BEFORE).unwrap();
        let after = parse_iostat(AFTER).unwrap();
        // fio wrote 3200 x 16 KiB = 50 MiB; each device took 50 MiB in 100 writes.
        let device = device_delta(&before, &after, 3200 * 16384);
        assert_eq!(device.write_ops, 200);
        assert_eq!(device.average_write_size_bytes, 524_288.0);
        assert_eq!(device.write_aggregation, 32.0);
        assert_eq!(device.average_queue_depth, 3.0);
        assert_eq!(device.write_amplification, 2.0);
        assert_eq!(device.errors, 1);
        assert_eq!((device.syncs, device.syncs_skipped), (11, 3));
        let volume = volume_delta(&before, &after, "bench/vol").unwrap();
        assert_eq!(volume.write_ops, 3200);
        assert_eq!(volume.direct_write_ops, 3200);
        assert_eq!(volume.hole_read_ops, 2);
        assert!(volume_delta(&before, &after, "bench/other").is_none());
    }

    #[test]
    fn reads_pool_list() {
        let text = r#"{"pools":[{"name":"bench","size_bytes":2000,"allocated_bytes":1700,"free_bytes":300,"health":"ONLINE"}]}"#;
        let pool = parse_list(text, "bench").unwrap();
        assert_eq!(pool.fill_percent(), 85.0);
        assert!(parse_list(text, "other").is_err());
    }
}
