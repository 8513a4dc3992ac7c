//! What is read from a target just before and just after each test — the
//! server's CPU time, ironpool's device and volume counters, ZFS Direct I/O
//! counters — and the figures and pitfalls computed from the two.

use std::path::Path;
use std::time::Instant;

use crate::ironpool_stats::{device_delta, volume_delta, IostatSnapshot};
use crate::pitfalls;
use crate::results::{Finding, ServerUsage, TestResult};
use crate::target::Instance;
use crate::zfs_kstat::{self, KstatSnapshot};

/// One side (before or after) of a test.
#[derive(Debug, Default)]
pub struct Snapshot {
    taken: Option<Instant>,
    server_cpu_seconds: Option<f64>,
    iostat: Option<IostatSnapshot>,
    kstat: Option<KstatSnapshot>,
    kstat_missing: bool,
}

/// Reads what the target offers. Failures become `notes` rather than
/// failing the test: the fio figures stand without them.
pub fn snapshot(instance: &Instance, kstat_dir: &Path, notes: &mut Vec<String>) -> Snapshot {
    let mut snapshot = Snapshot {
        taken: Some(Instant::now()),
        ..Snapshot::default()
    };
    match instance.server_cpu_seconds() {
        Ok(cpu) => snapshot.server_cpu_seconds = cpu,
        Err(error) => note(notes, format!("server CPU time unavailable: {error:#}")),
    }
    if let Some(pool) = &instance.pool {
        match pool.iostat() {
            Ok(iostat) => snapshot.iostat = Some(iostat),
            Err(error) => note(notes, format!("`ironpool iostat` failed: {error:#}")),
        }
    }
    if let Some(zfs_pool) = &instance.zfs_pool {
        match zfs_kstat::read(&zfs_kstat::iostats_path(kstat_dir, zfs_pool)) {
            Ok(Some(kstat)) => snapshot.kstat = Some(kstat),
            Ok(None) => snapshot.kstat_missing = true,
            Err(error) => note(notes, format!("ZFS kstat unreadable: {error:#}")),
        }
    }
    snapshot
}

/// Adds a note once.
fn note(notes: &mut Vec<String>, text: String) {
    if !notes.contains(&text) {
        notes.push(text);
    }
}

/// Fills `result` with the server, device and volume figures between two
/// snapshots and returns the pitfalls they show.
pub fn compare(
    instance: &Instance,
    before: &Snapshot,
    after: &Snapshot,
    result: &mut TestResult,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let label = instance.label.as_str();
    let test = result.label();
    let fio_reads = result.read.map_or(0, |r| r.ops);
    let fio_writes = result.write.map_or(0, |w| w.ops);
    let fio_write_bytes = result.write.map_or(0, |w| w.io_bytes);

    if let (Some(cpu_before), Some(cpu_after), Some(t0), Some(t1)) = (
        before.server_cpu_seconds,
        after.server_cpu_seconds,
        before.taken,
        after.taken,
    ) {
        let cpu_seconds = (cpu_after - cpu_before).max(0.0);
        let wall = t1.duration_since(t0).as_secs_f64();
        let cores_used = if wall > 0.0 { cpu_seconds / wall } else { 0.0 };
        // Under a background load the server's CPU served the load too:
        // no figure per operation of the test's own job.
        let own = !result.workload.under_load;
        let iops_per_core = if cores_used > 0.0 && own {
            result.total_iops() / cores_used
        } else {
            0.0
        };
        let ops = if own { result.operations() } else { 0 };
        let cpu_us_per_op = if ops > 0 {
            cpu_seconds * 1e6 / ops as f64
        } else {
            0.0
        };
        result.server = Some(ServerUsage {
            cpu_seconds,
            cores_used,
            iops_per_core,
            cpu_us_per_op,
        });
    }

    if let (Some(pool), Some(old), Some(new)) = (&instance.pool, &before.iostat, &after.iostat) {
        let device = device_delta(old, new, fio_write_bytes);
        findings.extend(pitfalls::device_errors(label, &test, device.errors));
        result.device = Some(device);
        if let Some(volume) = volume_delta(old, new, &pool.volume_name()) {
            // Reads that took at least their bytes from the devices did not
            // come from the cache, counted as direct or not (the fill suite's
            // volume caches no data: primarycache=metadata).
            let fio_read_bytes = result.read.map_or(0, |r| r.io_bytes);
            let reads_from_devices = fio_read_bytes > 0 && device.read_bytes >= fio_read_bytes;
            let checked_reads = if reads_from_devices { 0 } else { fio_reads };
            // Buffered writes go through the page cache by design, and the
            // cached tests read what the cache holds.
            // A cold read fills the cache it reads through.
            if !result.workload.buffered && !result.workload.cached && !result.workload.cold {
                findings.extend(pitfalls::direct_ironpool(
                    label,
                    &test,
                    checked_reads,
                    fio_writes,
                    &volume,
                ));
            }
            if result.workload.cached || result.workload.nocache {
                findings.extend(pitfalls::cache_reads(
                    label,
                    &test,
                    result.workload.cached,
                    fio_read_bytes,
                    device.read_bytes,
                ));
            }
            findings.extend(pitfalls::never_written_ironpool(
                label,
                &test,
                volume.hole_read_ops,
                fio_reads,
            ));
            findings.extend(pitfalls::intent_log_ironpool(
                label,
                &test,
                &volume,
                fio_write_bytes,
            ));
            result.volume = Some(volume);
        }
    }

    if let Some(zfs_pool) = &instance.zfs_pool {
        let delta = match (&before.kstat, &after.kstat) {
            (Some(old), Some(new)) => zfs_kstat::direct_delta(old, new),
            _ => None,
        };
        let observed = before.kstat.is_some() && after.kstat.is_some();
        if observed || before.kstat_missing || after.kstat_missing {
            findings.extend(pitfalls::direct_zfs(
                label, &test, zfs_pool, fio_reads, fio_writes, delta,
            ));
        }
    }
    findings
}
