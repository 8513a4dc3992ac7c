//! Per-leaf I/O statistics: what `ironpool iostat` shows.
//!
//! Counters are cumulative since import; readers take differences between samples.
//! "Device" figures count I/Os as issued to the device (after aggregation),
//! "request" figures count the individual I/Os before aggregation.

use serde::Serialize;

use super::{IoClass, CLASS_COUNT};

/// Buckets of a power-of-two histogram: bucket i counts values in [2^i, 2^(i+1)).
pub const HISTOGRAM_BUCKETS: usize = 40;

/// A log2 histogram (latency in ns, or sizes in bytes).
#[derive(Clone, Debug, Serialize)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    /// Every value recorded, summed (saturating): with the count, the exact
    /// mean, which the buckets give only within a factor of two.
    pub sum: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: vec![0; HISTOGRAM_BUCKETS],
            sum: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        self.sum = self.sum.saturating_add(value);
        let bucket = (63 - value.max(1).leading_zeros()) as usize;
        self.buckets[bucket.min(HISTOGRAM_BUCKETS - 1)] += 1;
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// An upper bound of the `fraction` quantile (the top of the bucket it falls in).
    pub fn quantile_upper_bound(&self, fraction: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let target = ((total as f64) * fraction).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= target {
                return 1u64 << (bucket + 1).min(63);
            }
        }
        u64::MAX
    }
}

/// Figures for one priority class on one leaf.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassStats {
    pub queued: u64,
    pub active: u64,
    pub completed_requests: u64,
    pub completed_bytes: u64,
    /// Time from enqueue to completion, ns.
    pub total_latency_ns: Histogram,
    /// Time from issue to completion (device latency), ns.
    pub device_latency_ns: Histogram,
    /// Time waiting in the queue, ns.
    pub queue_latency_ns: Histogram,
}

/// Everything counted for one leaf device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeafStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Cache flushes sent to the device.
    pub flush_ops: u64,
    /// Writes durable on completion (FUA: a log commit's blocks), which
    /// need no flush; counted in `write_ops` too.
    pub durable_write_ops: u64,
    /// Flushes asked for that the device did not need: no write had
    /// completed on it since the last flush was sent (a commit that wrote
    /// to other devices only).
    pub flushes_skipped: u64,
    /// Discards issued, and the bytes they covered.
    pub trim_ops: u64,
    pub trim_bytes: u64,
    /// Discards that failed (counted apart: they never fault the leaf).
    pub trim_errors: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    /// Optional I/Os dropped because nothing needed them.
    pub optional_dropped: u64,
    /// Integral over time of the number of active device I/Os (ns x I/Os).
    pub active_time_weighted_ns: u64,
    /// Time with at least one device I/O active, ns.
    pub busy_ns: u64,
    /// Integral over time of the number of individual requests inside active
    /// device I/Os (an aggregate of eight writes counts eight): the queue depth
    /// that reaches the device, whatever the aggregation.
    pub active_requests_time_weighted_ns: u64,
    /// Individual requests inside active device I/Os now.
    pub active_requests: u64,
    pub queued_total: u64,
    pub active_total: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// Failed I/Os since the last one that succeeded: a leaf is faulted when
    /// this reaches `LEAF_FAULT_CONSECUTIVE_ERRORS`.
    pub consecutive_errors: u64,
    /// Writes refused because the filesystem holding the device is full
    /// (counted apart: they never fault the leaf).
    pub no_space_errors: u64,
    /// True from a write refused for lack of host space until `ironpool
    /// clear`: `status` names the device and the cause.
    pub host_full: bool,
    /// Bytes rewritten to repair bad copies (self-heal and scrub).
    pub repaired_bytes: u64,
    pub classes: Vec<ClassStats>,
    /// Sizes of individual requests, bytes.
    pub read_request_sizes: Histogram,
    pub write_request_sizes: Histogram,
    /// Sizes of device I/Os (aggregated), bytes.
    pub read_device_sizes: Histogram,
    pub write_device_sizes: Histogram,
    #[serde(skip)]
    pub(crate) last_change_ns: u64,
}

impl LeafStats {
    pub fn new() -> LeafStats {
        LeafStats {
            classes: (0..CLASS_COUNT).map(|_| ClassStats::default()).collect(),
            ..LeafStats::default()
        }
    }

    pub fn class(&mut self, class: IoClass) -> &mut ClassStats {
        &mut self.classes[class as usize]
    }

    /// Accounts the time since the last change at the current active count;
    /// call before every change of `active_total`.
    pub(crate) fn advance_clock(&mut self, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.last_change_ns);
        self.active_time_weighted_ns += elapsed * self.active_total;
        self.active_requests_time_weighted_ns += elapsed * self.active_requests;
        if self.active_total > 0 {
            self.busy_ns += elapsed;
        }
        self.last_change_ns = now_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let mut histogram = Histogram::default();
        for value in [0, 1, 2, 3, 4, 1000, 1024] {
            histogram.record(value);
        }
        assert_eq!(histogram.buckets[0], 2); // 0 and 1
        assert_eq!(histogram.buckets[1], 2); // 2, 3
        assert_eq!(histogram.buckets[2], 1); // 4
        assert_eq!(histogram.buckets[9], 1); // 1000
        assert_eq!(histogram.buckets[10], 1); // 1024
        assert_eq!(histogram.count(), 7);
        assert_eq!(histogram.quantile_upper_bound(0.5), 4);
    }

    #[test]
    fn active_time_integrates() {
        let mut stats = LeafStats::new();
        stats.advance_clock(100);
        stats.active_total = 2;
        stats.advance_clock(1100);
        stats.active_total = 0;
        stats.advance_clock(2100);
        assert_eq!(stats.active_time_weighted_ns, 2000);
        assert_eq!(stats.busy_ns, 1000);
    }
}
