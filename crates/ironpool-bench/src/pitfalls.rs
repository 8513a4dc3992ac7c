//! The classic benchmarking traps, each checked from observations and
//! reported as a [`Finding`] (BSDCan 2025 Direct I/O talk, the published ZFS
//! reports):
//!
//! - a target smaller than one record,
//! - a block size not aligned to the record size or the page size,
//! - direct I/O requested but not engaged,
//! - reads of never-written space,
//! - a pool or filesystem more than 80% full,
//! - device errors during a run.
//!
//! Every function here is pure: the runner gathers the observations (kstat
//! files, `ironpool iostat`, SEEK_HOLE scans, statvfs) and tests feed crafted
//! ones.

use crate::results::{Finding, Severity, VolumeDelta};
use crate::units::{bytes_human, size_short};
use crate::zfs_kstat::ZfsDirectDelta;

/// Above this fill level a copy-on-write pool (and most filesystems) has to
/// hunt for free space and slows down: the ZFS guidance is to stay below 80%.
pub const FILL_WARNING_PERCENT: f64 = 80.0;

/// Direct I/O counts as engaged when at least this fraction of fio's
/// operations bypassed the cache; the slack allows for operations counted
/// during fio's start and ramp.
pub const DIRECT_ENGAGED_MIN_FRACTION: f64 = 0.9;

/// Check names, as they appear in results.json.
pub mod check {
    /// Target smaller than one record.
    pub const SMALLER_THAN_RECORD: &str = "smaller-than-record";
    /// Block size not aligned to the record or page size.
    pub const ALIGNMENT: &str = "alignment";
    /// Direct I/O requested but not engaged.
    pub const DIRECT_IO: &str = "direct-io";
    /// Reads of never-written space.
    pub const NEVER_WRITTEN: &str = "never-written";
    /// Pool or filesystem fill level.
    pub const FILL_LEVEL: &str = "fill-level";
    /// Device errors.
    pub const DEVICE_ERRORS: &str = "device-errors";
    /// A debug build of the server under test.
    pub const DEBUG_BUILD: &str = "debug-build";
    /// How FLUSHes were made durable (intent log commits, group commit).
    pub const INTENT_LOG: &str = "intent-log";
    /// A test of the cache whose reads did not come from where it says.
    pub const CACHE_READS: &str = "cache-reads";
}

/// The share of a cached test's bytes the devices may read before the
/// figure stops being one of the cache (a miss now and then, metadata).
pub const CACHED_DEVICE_READ_MAX_FRACTION: f64 = 0.1;
/// The share of a `primarycache=none` test's bytes the devices must read
/// at least (they read whole blocks, so usually more than fio asked).
pub const NOCACHE_DEVICE_READ_MIN_FRACTION: f64 = 0.5;

/// A test that reads from the cache (`cached`) whose bytes came from the
/// devices, or one with the cache off (`nocache`) whose bytes did not: the
/// figure is not what its name says (a working set larger than the
/// cache; a cache the property did not turn off).
pub fn cache_reads(
    target: &str,
    test: &str,
    cached: bool,
    fio_read_bytes: u64,
    device_read_bytes: u64,
) -> Option<Finding> {
    if fio_read_bytes == 0 {
        return None;
    }
    let share = device_read_bytes as f64 / fio_read_bytes as f64;
    let message = if cached && share > CACHED_DEVICE_READ_MAX_FRACTION {
        format!(
            "reads meant to come from the cache came from the devices: they read {:.0}% of the bytes fio read (the working set is larger than the cache?)",
            100.0 * share
        )
    } else if !cached && share < NOCACHE_DEVICE_READ_MIN_FRACTION {
        format!(
            "reads meant to go to the devices came from a cache: the devices read {:.0}% of the bytes fio read",
            100.0 * share
        )
    } else {
        return None;
    };
    Some(Finding::new(
        Severity::Warning,
        check::CACHE_READS,
        target,
        Some(test),
        message,
    ))
}

/// How an ironpool volume made the test's FLUSHes durable: client FLUSHes per
/// log commit (above 1: concurrent FLUSHes shared a log write and its device
/// flush), those that needed a txg, and log bytes per byte fio wrote.
pub fn intent_log_ironpool(
    target: &str,
    test: &str,
    volume: &VolumeDelta,
    fio_write_bytes: u64,
) -> Option<Finding> {
    if volume.flush_ops == 0 {
        return None;
    }
    let per_commit = if volume.log_commits > 0 {
        format!(
            "{:.2} FLUSHes per log commit",
            volume.flush_ops as f64 / volume.log_commits as f64
        )
    } else {
        "no log commit".to_string()
    };
    let per_byte = if fio_write_bytes > 0 {
        format!(
            "{:.3} log bytes per byte written",
            volume.log_bytes as f64 / fio_write_bytes as f64
        )
    } else {
        "nothing written".to_string()
    };
    Some(Finding::new(
        Severity::Info,
        check::INTENT_LOG,
        target,
        Some(test),
        format!(
            "{} FLUSHes: {} log commits ({per_commit}), {} shared a commit, {} through a txg; {per_byte}",
            volume.flush_ops, volume.log_commits, volume.log_shared_commits, volume.log_txg_fallbacks
        ),
    ))
}

/// The target holds less than one record: every I/O touches the same record.
pub fn smaller_than_record(
    target: &str,
    size_bytes: u64,
    record_size_bytes: Option<u64>,
) -> Option<Finding> {
    let record = record_size_bytes?;
    (size_bytes < record).then(|| {
        Finding::new(
            Severity::Warning,
            check::SMALLER_THAN_RECORD,
            target,
            None,
            format!(
                "the target is {} but its record size is {}: every I/O lands in one record, \
                 so the figures measure a cache, not the storage",
                bytes_human(size_bytes as f64),
                bytes_human(record as f64)
            ),
        )
    })
}

/// Block sizes that are not a multiple of the page size, or that do not fill
/// whole records. `tests` pairs a test name with its block size.
pub fn alignment(
    target: &str,
    tests: &[(String, u64)],
    record_size_bytes: Option<u64>,
    page_size_bytes: u64,
) -> Vec<Finding> {
    let mut block_sizes: Vec<u64> = tests.iter().map(|(_, bs)| *bs).collect();
    block_sizes.sort_unstable();
    block_sizes.dedup();
    let mut findings = Vec::new();
    for block_size in block_sizes {
        let names: Vec<&str> = tests
            .iter()
            .filter(|(_, bs)| *bs == block_size)
            .map(|(n, _)| n.as_str())
            .collect();
        let listed = list_tests(&names);
        let bs = size_short(block_size);
        if page_size_bytes > 0 && block_size % page_size_bytes != 0 {
            findings.push(Finding::new(
                Severity::Warning,
                check::ALIGNMENT,
                target,
                None,
                format!(
                    "block size {bs} is not a multiple of the {} page: direct I/O needs page-aligned \
                     sizes and either fails or falls back to buffered I/O ({listed})",
                    size_short(page_size_bytes)
                ),
            ));
        }
        let Some(record) = record_size_bytes else {
            continue;
        };
        let message = if block_size < record && record % block_size == 0 {
            format!(
                "{bs} I/O on a {} record size: each write is a read-modify-write of a whole record \
                 and each read moves {}x the data it returns ({listed})",
                size_short(record),
                record / block_size
            )
        } else if block_size % record != 0 {
            format!(
                "block size {bs} is not a multiple of the {} record size: I/Os straddle records \
                 and partial records need read-modify-write ({listed})",
                size_short(record)
            )
        } else {
            continue;
        };
        findings.push(Finding::new(
            Severity::Warning,
            check::ALIGNMENT,
            target,
            None,
            message,
        ));
    }
    findings
}

/// Compares ironpool's direct-path counters with fio's operation counts.
pub fn direct_ironpool(
    target: &str,
    test: &str,
    fio_read_ops: u64,
    fio_write_ops: u64,
    volume: &VolumeDelta,
) -> Option<Finding> {
    let mut parts = Vec::new();
    for (what, fio_ops, direct_ops) in [
        ("reads", fio_read_ops, volume.direct_read_ops),
        ("writes", fio_write_ops, volume.direct_write_ops),
    ] {
        if fio_ops > 0 && (direct_ops as f64) < DIRECT_ENGAGED_MIN_FRACTION * fio_ops as f64 {
            parts.push(format!(
                "{} of {} {what} ({:.0}%) bypassed the cache",
                direct_ops,
                fio_ops,
                100.0 * direct_ops as f64 / fio_ops as f64
            ));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let rmw = if volume.rmw_write_ops > 0 {
        format!(
            "; {} writes needed a read-modify-write",
            volume.rmw_write_ops
        )
    } else {
        String::new()
    };
    Some(Finding::new(
        Severity::Warning,
        check::DIRECT_IO,
        target,
        Some(test),
        format!(
            "direct I/O requested but not engaged: {}{rmw}",
            parts.join(", ")
        ),
    ))
}

/// Compares the ZFS pool's Direct I/O counters with fio's operation counts;
/// `delta` is `None` when the kstat has no Direct I/O counters.
pub fn direct_zfs(
    target: &str,
    test: &str,
    pool: &str,
    fio_read_ops: u64,
    fio_write_ops: u64,
    delta: Option<ZfsDirectDelta>,
) -> Option<Finding> {
    let Some(delta) = delta else {
        return Some(Finding::new(
            Severity::Warning,
            check::DIRECT_IO,
            target,
            Some(test),
            format!(
                "ZFS pool {pool} has no Direct I/O counters (OpenZFS before 2.3 accepts O_DIRECT and \
                 ignores it): the figures include the ARC"
            ),
        ));
    };
    let volume = VolumeDelta {
        direct_read_ops: delta.direct_reads,
        direct_write_ops: delta.direct_writes,
        ..VolumeDelta::default()
    };
    let mut finding = direct_ironpool(target, test, fio_read_ops, fio_write_ops, &volume)?;
    finding.message = format!(
        "{} (ZFS pool {pool}: I/O not aligned to the recordsize, or direct=disabled, goes through the ARC)",
        finding.message
    );
    Some(finding)
}

/// fio's nbd engine ignores `direct=1`: whether the server caches is the
/// server's business, and nothing on the client can check it.
pub fn direct_over_nbd(target: &str, server_note: Option<&str>) -> Finding {
    let note = server_note.map(|n| format!("; {n}")).unwrap_or_default();
    Finding::new(
        Severity::Info,
        check::DIRECT_IO,
        target,
        None,
        format!("fio's nbd engine ignores direct=1: the client cannot check that I/O bypasses caches{note}"),
    )
}

/// A filesystem on a loop device whose backing file is read and written
/// through the page cache (`dio` 0): direct I/O to the filesystem stops at
/// the loop device and lands in the cache of the backing file.
pub fn loop_device_buffered(
    target: &str,
    device: &str,
    direct_io: Option<bool>,
) -> Option<Finding> {
    (direct_io == Some(false)).then(|| {
        Finding::new(
            Severity::Warning,
            check::DIRECT_IO,
            target,
            None,
            format!(
                "the filesystem sits on loop device {device} without direct I/O: O_DIRECT stops at the loop \
                 device and the data goes through the page cache of its backing file (losetup --direct-io=on)"
            ),
        )
    })
}

/// ironpool served reads of blocks that were never written.
pub fn never_written_ironpool(
    target: &str,
    test: &str,
    hole_read_ops: u64,
    fio_read_ops: u64,
) -> Option<Finding> {
    (hole_read_ops > 0).then(|| {
        Finding::new(
            Severity::Warning,
            check::NEVER_WRITTEN,
            target,
            Some(test),
            format!(
                "{hole_read_ops} of {fio_read_ops} reads hit never-written blocks: they return zeros \
                 without touching the devices, so read figures are too good"
            ),
        )
    })
}

/// A file-backed target still has holes or unwritten extents after the
/// prefill (found with SEEK_HOLE).
pub fn never_written_file(target: &str, hole_bytes: u64, size_bytes: u64) -> Option<Finding> {
    (hole_bytes > 0).then(|| {
        Finding::new(
            Severity::Warning,
            check::NEVER_WRITTEN,
            target,
            None,
            format!(
                "{} of {} is still a hole or unwritten extent after the prefill: reads there return \
                 zeros without touching the disk",
                bytes_human(hole_bytes as f64),
                bytes_human(size_bytes as f64)
            ),
        )
    })
}

/// The prefill wrote less than the whole target, so some reads hit space
/// that was never written.
pub fn never_written_prefill(
    target: &str,
    prefilled_bytes: u64,
    size_bytes: u64,
) -> Option<Finding> {
    (prefilled_bytes < size_bytes).then(|| {
        Finding::new(
            Severity::Warning,
            check::NEVER_WRITTEN,
            target,
            None,
            format!(
                "the prefill wrote {} of {}: reads of the rest hit never-written space",
                bytes_human(prefilled_bytes as f64),
                bytes_human(size_bytes as f64)
            ),
        )
    })
}

/// The pool or filesystem is fuller than [`FILL_WARNING_PERCENT`];
/// `intended` when the fill suite put it there on purpose.
pub fn fill_level(
    target: &str,
    test: Option<&str>,
    used_percent: f64,
    what: &str,
    intended: bool,
) -> Option<Finding> {
    if used_percent <= FILL_WARNING_PERCENT {
        return None;
    }
    let why = if intended {
        "as the fill suite intends: compare with the lower levels"
    } else {
        "copy-on-write pools and most filesystems slow down as free space runs out, so these \
         figures are not those of an emptier pool"
    };
    Some(Finding::new(
        if intended {
            Severity::Info
        } else {
            Severity::Warning
        },
        check::FILL_LEVEL,
        target,
        test,
        format!("the {what} is {used_percent:.0}% full (over {FILL_WARNING_PERCENT:.0}%): {why}"),
    ))
}

/// The server under test is a Cargo debug build (its path runs through
/// `target/debug`): unoptimised code understates the engine.
pub fn debug_build(target: &str, exe: &std::path::Path) -> Option<Finding> {
    let components: Vec<&std::ffi::OsStr> = exe.iter().collect();
    let debug = components
        .windows(2)
        .any(|pair| pair[0] == "target" && pair[1] == "debug");
    debug.then(|| {
        Finding::new(
            Severity::Warning,
            check::DEBUG_BUILD,
            target,
            None,
            format!(
                "{} is a debug build: its figures understate a release build (cargo build --release)",
                exe.display()
            ),
        )
    })
}

/// Devices reported read, write or checksum errors during a test.
pub fn device_errors(target: &str, test: &str, errors: u64) -> Option<Finding> {
    (errors > 0).then(|| {
        Finding::new(
            Severity::Warning,
            check::DEVICE_ERRORS,
            target,
            Some(test),
            format!("the devices reported {errors} read, write or checksum errors during the test"),
        )
    })
}

/// Merges per-test findings of the same check on the same target into one
/// (the first, plus the names of the other tests), so a pitfall that hits
/// every test reads as one finding. Order is kept.
pub fn collapse(findings: Vec<Finding>) -> Vec<Finding> {
    let mut merged: Vec<(Finding, Vec<String>)> = Vec::new();
    for finding in findings {
        let same = merged.iter_mut().find(|(kept, _)| {
            kept.test.is_some()
                && finding.test.is_some()
                && kept.check == finding.check
                && kept.target == finding.target
        });
        match (same, finding.test.clone()) {
            (Some((_, others)), Some(test)) => others.push(test),
            _ => merged.push((finding, Vec::new())),
        }
    }
    merged
        .into_iter()
        .map(|(mut finding, others)| {
            if !others.is_empty() {
                let names: Vec<&str> = others.iter().map(String::as_str).collect();
                let test = finding.test.clone().unwrap_or_default();
                finding.message = format!(
                    "{test}: {}; the same in {}",
                    finding.message,
                    list_tests(&names)
                );
            }
            finding
        })
        .collect()
}

/// `tests: a, b, c` or `tests: a, b and 3 more`.
fn list_tests(names: &[&str]) -> String {
    const SHOWN_MAX: usize = 3;
    let shown = names
        .iter()
        .take(SHOWN_MAX)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    let more = names.len().saturating_sub(SHOWN_MAX);
    let label = if names.len() == 1 { "test" } else { "tests" };
    if more > 0 {
        format!("{label}: {shown} and {more} more")
    } else {
        format!("{label}: {shown}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_log_finding_gives_flushes_per_commit_and_log_bytes_per_byte() {
        let volume = VolumeDelta {
            flush_ops: 300,
            log_commits: 100,
            log_shared_commits: 200,
            log_bytes: 4096 * 100,
            ..VolumeDelta::default()
        };
        let finding =
            intent_log_ironpool("ironpool", "t", &volume, 16384 * 300).expect("a finding");
        assert!(
            finding.message.contains("3.00 FLUSHes per log commit"),
            "{}",
            finding.message
        );
        assert!(
            finding.message.contains("0.083 log bytes per byte written"),
            "{}",
            finding.message
        );
        let no_flushes = VolumeDelta::default();
        assert!(intent_log_ironpool("ironpool", "t", &no_flushes, 1).is_none());
    }
}
