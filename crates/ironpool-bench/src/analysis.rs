//! Plain-language findings computed from the figures of a run: how IOPS
//! scale with queue depth and jobs, ratios to the raw baseline, latency
//! tails, the cost of flushes, the fill-level cliff, device-side
//! aggregation and the server's CPU. Pure: the same results.json always
//! gives the same findings.

use crate::results::{Finding, Outcome, Results, Severity, TargetResult, TestResult};
use crate::suites::{Durability, Engine, Pattern, Suite};
use crate::units::{bytes_human, count_human, latency_human, ratio_human, size_short};

/// Below this QDmax/QD1 IOPS factor, requests are being serialised: a queue
/// 64 deep should give several times the IOPS of one request at a time.
pub const SERIALISED_SCALING_MAX: f64 = 1.3;
/// A p99 latency this many times the median is a long tail.
pub const LATENCY_TAIL_RATIO: f64 = 10.0;
/// Flushes at QD16 should give at least this factor over QD1 when the
/// target batches them (group commit).
pub const GROUP_COMMIT_MIN_GAIN: f64 = 1.5;
/// A fill level that keeps less than this share of the emptiest level's
/// figure is a cliff.
pub const FILL_CLIFF_MAX: f64 = 0.5;
/// A server using this many cores or more is CPU-bound on this 2-core VM
/// (NBD servers here are one thread of work per connection).
pub const CPU_BOUND_CORES: f64 = 0.9;

/// All findings of a run, target by target.
pub fn findings(results: &Results) -> Vec<Finding> {
    let mut all = Vec::new();
    for target in &results.targets {
        all.extend(problems(target));
        all.extend(qd_scaling(results, target));
        all.extend(jobs_scaling(target));
        all.extend(ratios(results, target));
        all.extend(latency_tail(target));
        all.extend(flushes(target));
        all.extend(fill_cliff(target));
        all.extend(device_side(target));
        all.extend(server_cpu(target));
    }
    all
}

fn finding(
    severity: Severity,
    check: &str,
    target: &TargetResult,
    test: Option<&str>,
    message: String,
) -> Finding {
    Finding::new(severity, check, &target.label, test, message)
}

/// `randwrite 16K`, `randrw70 256K`.
fn workload_words(test: &TestResult) -> String {
    let mix = test
        .workload
        .read_mix_percent
        .map(|p| p.to_string())
        .unwrap_or_default();
    format!(
        "{}{mix} {}",
        test.workload.pattern.fio_rw(),
        size_short(test.workload.block_size_bytes)
    )
}

fn jobs_words(numjobs: u32) -> String {
    if numjobs == 1 {
        "1 job".to_string()
    } else {
        format!("{numjobs} jobs")
    }
}

/// The headline figure with its unit.
fn headline_words(test: &TestResult) -> String {
    if let Some(rate) = test.ops_per_second {
        return format!("{}/s", count_human(rate));
    }
    if test.workload.pattern.is_sequential() {
        crate::units::rate_human(test.total_bandwidth())
    } else {
        format!("{} IOPS", count_human(test.total_iops()))
    }
}

/// Set-up errors, failed and skipped tests.
fn problems(target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(error) = &target.error {
        out.push(finding(
            Severity::Warning,
            "target-error",
            target,
            None,
            format!("the target could not be (fully) measured: {error}"),
        ));
    }
    let failed: Vec<&TestResult> = target
        .tests
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Failed { .. }))
        .collect();
    if let Some(first) = failed.first() {
        let Outcome::Failed { error } = &first.outcome else {
            return out;
        };
        out.push(finding(
            Severity::Warning,
            "test-failed",
            target,
            None,
            format!(
                "{} test(s) failed; the first, {}: {error}",
                failed.len(),
                first.label()
            ),
        ));
    }
    let mut reasons: Vec<(&str, Vec<String>)> = Vec::new();
    for test in &target.tests {
        if let Outcome::Skipped { reason } = &test.outcome {
            match reasons.iter_mut().find(|(r, _)| *r == reason.as_str()) {
                Some((_, names)) => names.push(test.label()),
                None => reasons.push((reason.as_str(), vec![test.label()])),
            }
        }
    }
    for (reason, names) in reasons {
        out.push(finding(
            Severity::Info,
            "test-skipped",
            target,
            None,
            format!("skipped {}: {reason}", names.join(", ")),
        ));
    }
    out
}

/// Whether a test belongs to a queue-depth series: every qd-scaling test,
/// and the fs suite's plain direct rows (its 16K writes at QD1 and QD64,
/// through io_uring and through libaio).
fn in_qd_series(test: &TestResult) -> bool {
    let workload = &test.workload;
    test.is_ok()
        && (test.suite == Suite::QdScaling
            || (test.suite == Suite::Fs
                && workload.ops.is_none()
                && !workload.buffered
                && !workload.cached
                && workload.durability == Durability::None))
}

/// The ok tests of `like`'s series (suite, pattern, block size, job count
/// and engine), sorted by queue depth.
fn qd_series<'a>(target: &'a TargetResult, like: &TestResult) -> Vec<&'a TestResult> {
    let mut series: Vec<&TestResult> = target
        .tests
        .iter()
        .filter(|t| {
            in_qd_series(t)
                && t.suite == like.suite
                && t.workload.pattern == like.workload.pattern
                && t.workload.block_size_bytes == like.workload.block_size_bytes
                && t.workload.numjobs == like.workload.numjobs
                && t.workload.engine == like.workload.engine
        })
        .collect();
    series.sort_by_key(|t| t.workload.iodepth);
    series
}

/// One scaling factor per qd-scaling series: IOPS at the deepest queue
/// over IOPS at the shallowest.
fn scaling_factor(series: &[&TestResult]) -> Option<(u32, u32, f64)> {
    let (low, high) = (series.first()?, series.last()?);
    if low.workload.iodepth == high.workload.iodepth || low.total_iops() <= 0.0 {
        return None;
    }
    Some((
        low.workload.iodepth,
        high.workload.iodepth,
        high.total_iops() / low.total_iops(),
    ))
}

fn qd_scaling(results: &Results, target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut seen: Vec<(Suite, Pattern, u64, u32, Engine)> = Vec::new();
    for test in target.tests.iter().filter(|t| in_qd_series(t)) {
        let key = (
            test.suite,
            test.workload.pattern,
            test.workload.block_size_bytes,
            test.workload.numjobs,
            test.workload.engine,
        );
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let series = qd_series(target, test);
        let Some((low, high, factor)) = scaling_factor(&series) else {
            continue;
        };
        let baseline = results
            .baseline()
            .filter(|b| !target.baseline && b.label != target.label)
            .and_then(|b| {
                scaling_factor(&qd_series(b, test))
                    .map(|(_, _, f)| format!(" ({}: {f:.1}x)", b.label))
            })
            .unwrap_or_default();
        let (severity, verdict) = if factor < SERIALISED_SCALING_MAX {
            (Severity::Warning, ": requests are serialised")
        } else {
            (Severity::Info, "")
        };
        out.push(finding(
            severity,
            "qd-scaling",
            target,
            None,
            format!(
                "{}, {}{}: QD{high} gives {factor:.1}x QD{low}{verdict}{baseline}",
                workload_words(test),
                jobs_words(test.workload.numjobs),
                match test.workload.engine {
                    Engine::IoUring => String::new(),
                    engine => format!(", {}", engine.fio_name()),
                }
            ),
        ));
    }
    out
}

/// More jobs at the shallowest queue depth of qd-scaling.
fn jobs_scaling(target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    let qd: Vec<&TestResult> = target
        .tests
        .iter()
        .filter(|t| t.suite == Suite::QdScaling && t.is_ok())
        .collect();
    let Some(depth) = qd.iter().map(|t| t.workload.iodepth).min() else {
        return out;
    };
    let mut done: Vec<(Pattern, u64)> = Vec::new();
    for one in qd.iter().filter(|t| t.workload.iodepth == depth) {
        let key = (one.workload.pattern, one.workload.block_size_bytes);
        let same = |t: &&&TestResult| {
            t.workload.iodepth == depth && (t.workload.pattern, t.workload.block_size_bytes) == key
        };
        let (Some(min), Some(max)) = (
            qd.iter().filter(same).min_by_key(|t| t.workload.numjobs),
            qd.iter().filter(same).max_by_key(|t| t.workload.numjobs),
        ) else {
            continue;
        };
        if done.contains(&key)
            || min.workload.numjobs == max.workload.numjobs
            || min.total_iops() <= 0.0
        {
            continue;
        }
        done.push(key);
        out.push(finding(
            Severity::Info,
            "jobs-scaling",
            target,
            None,
            format!(
                "{} at QD{depth}: {} give {:.1}x {}",
                workload_words(one),
                jobs_words(max.workload.numjobs),
                max.total_iops() / min.total_iops(),
                jobs_words(min.workload.numjobs)
            ),
        ));
    }
    out
}

/// Ratios to the raw baseline (or the target's own limit, the raw pair for a
/// mirror): the qd-scaling 16K random-write points at the shallowest and
/// deepest queue, and the weakest and strongest test.
fn ratios(results: &Results, target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    let Some(baseline) = results.baseline() else {
        return out;
    };
    if target.baseline {
        return out;
    }
    // Each ratio names the target it is to: the limit, the baseline, or
    // ext4 for what a filesystem answers on its own.
    let mut rated: Vec<(&TestResult, &TestResult, f64)> = target
        .tests
        .iter()
        .filter(|t| t.is_ok())
        .filter_map(|t| {
            let (_, base) = results.limit_with_target(target, t)?;
            (base.headline() > 0.0).then(|| (t, base, t.headline() / base.headline()))
        })
        .collect();
    if rated.is_empty() {
        return out;
    }
    let sentence = |test: &TestResult, base: &TestResult, ratio: f64| {
        let limit_label = results
            .limit_with_target(target, test)
            .map_or(baseline.label.as_str(), |(limit, _)| limit.label.as_str());
        format!(
            "{} {} = {} {} ({} vs {})",
            target.label,
            test.label(),
            ratio_human(ratio),
            limit_label,
            headline_words(test),
            headline_words(base)
        )
    };
    let mut named: Vec<String> = Vec::new();
    let headline_points: Vec<&(&TestResult, &TestResult, f64)> = rated
        .iter()
        .filter(|(t, _, _)| {
            t.suite == Suite::QdScaling
                && t.workload.pattern == Pattern::RandWrite
                && t.workload.numjobs == 1
        })
        .collect();
    let low = headline_points
        .iter()
        .min_by_key(|(t, _, _)| t.workload.iodepth);
    let high = headline_points
        .iter()
        .max_by_key(|(t, _, _)| t.workload.iodepth);
    for (test, base, ratio) in low.into_iter().chain(high).copied() {
        if !named.contains(&test.label()) {
            named.push(test.label());
            out.push(finding(
                Severity::Info,
                "ratio-to-raw",
                target,
                Some(&test.label()),
                sentence(test, base, *ratio),
            ));
        }
    }
    rated.sort_by(|a, b| a.2.total_cmp(&b.2));
    let extremes = [
        ("weakest against the baseline", rated.first()),
        ("strongest against the baseline", rated.last()),
    ];
    for (what, entry) in extremes {
        let Some((test, base, ratio)) = entry else {
            continue;
        };
        if !named.contains(&test.label()) {
            named.push(test.label());
            out.push(finding(
                Severity::Info,
                "ratio-to-raw",
                target,
                Some(&test.label()),
                format!("{what}: {}", sentence(test, base, *ratio)),
            ));
        }
    }
    out
}

/// The test with the longest tail, if p99 is far above the median.
fn latency_tail(target: &TargetResult) -> Vec<Finding> {
    let worst = target
        .tests
        .iter()
        .filter(|t| t.is_ok())
        .filter_map(|t| {
            let latency = t.read.or(t.write)?.latency;
            (latency.p50_ns > 0)
                .then(|| (t, latency, latency.p99_ns as f64 / latency.p50_ns as f64))
        })
        .max_by(|a, b| a.2.total_cmp(&b.2));
    let Some((test, latency, ratio)) = worst else {
        return Vec::new();
    };
    if ratio < LATENCY_TAIL_RATIO {
        return Vec::new();
    }
    vec![finding(
        Severity::Info,
        "latency-tail",
        target,
        Some(&test.label()),
        format!(
            "long latency tail in {}: p99 is {ratio:.0}x the median ({} vs {})",
            test.label(),
            latency_human(latency.p99_ns as f64),
            latency_human(latency.p50_ns as f64)
        ),
    )]
}

/// The cost of a flush after each write, and whether flushes are batched.
fn flushes(target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    let find = |durability: Durability, iodepth: u32| {
        target.tests.iter().find(|t| {
            t.is_ok()
                && t.workload.pattern == Pattern::RandWrite
                && t.workload.numjobs == 1
                && t.workload.iodepth == iodepth
                && t.workload.durability == durability
                && t.workload.block_size_bytes == 16 * crate::units::KIB
        })
    };
    let (plain, fsync1) = (find(Durability::None, 1), find(Durability::Fsync, 1));
    // The deepest test that flushes after each write or every few: the
    // durable suite's `--fsync=32` at QD64 (older results: `--fsync=1` at QD16).
    let deep = target
        .tests
        .iter()
        .filter(|t| {
            t.is_ok()
                && t.workload.pattern == Pattern::RandWrite
                && t.workload.numjobs == 1
                && t.workload.iodepth > 1
                && matches!(
                    t.workload.durability,
                    Durability::Fsync | Durability::FsyncEvery(_)
                )
                && t.workload.block_size_bytes == 16 * crate::units::KIB
        })
        .max_by_key(|t| t.workload.iodepth);
    if let (Some(plain), Some(fsync1)) = (plain, fsync1) {
        if plain.total_iops() > 0.0 {
            out.push(finding(
                Severity::Info,
                "flush-cost",
                target,
                Some(&fsync1.label()),
                format!(
                    "a flush after every 16K write leaves {} of the IOPS at QD1: {} vs {} without flushes",
                    ratio_human(fsync1.total_iops() / plain.total_iops()),
                    count_human(fsync1.total_iops()),
                    count_human(plain.total_iops())
                ),
            ));
        }
    }
    if let (Some(fsync1), Some(deep)) = (fsync1, deep) {
        if fsync1.total_iops() > 0.0 {
            let gain = deep.total_iops() / fsync1.total_iops();
            let (every, against) = match deep.workload.durability {
                Durability::FsyncEvery(writes) => (
                    format!("every {writes} writes"),
                    " with a flush after each write",
                ),
                _ => ("each write".to_string(), ""),
            };
            let (severity, verdict) = if gain >= GROUP_COMMIT_MIN_GAIN {
                (Severity::Info, "flushes are batched (group commit)")
            } else {
                (Severity::Warning, "flushes are serialised")
            };
            out.push(finding(
                severity,
                "flush-batching",
                target,
                Some(&deep.label()),
                format!(
                    "with a flush after {every}, QD{} gives {gain:.1}x QD1{against}: {verdict}",
                    deep.workload.iodepth
                ),
            ));
        }
    }
    out
}

/// The fill suite: the test that lost most between the emptiest and the
/// fullest level.
fn fill_cliff(target: &TargetResult) -> Vec<Finding> {
    let fill: Vec<&TestResult> = target
        .tests
        .iter()
        .filter(|t| t.is_ok() && t.fill_target_percent.is_some())
        .collect();
    let (Some(low), Some(high)) = (
        fill.iter().filter_map(|t| t.fill_target_percent).min(),
        fill.iter().filter_map(|t| t.fill_target_percent).max(),
    ) else {
        return Vec::new();
    };
    if low == high {
        return Vec::new();
    }
    let worst = fill
        .iter()
        .filter(|t| t.fill_target_percent == Some(high))
        .filter_map(|full| {
            let empty = fill
                .iter()
                .find(|t| t.fill_target_percent == Some(low) && t.name == full.name)?;
            (empty.headline() > 0.0).then(|| (full, full.headline() / empty.headline()))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let Some((test, ratio)) = worst else {
        return Vec::new();
    };
    let (severity, verdict) = if ratio < FILL_CLIFF_MAX {
        (Severity::Warning, "falls off a cliff as the pool fills")
    } else {
        (Severity::Info, "no cliff")
    };
    vec![finding(
        severity,
        "fill-cliff",
        target,
        Some(&test.label()),
        format!(
            "{} at {high}% full keeps {} of its {low}% figure: {verdict}",
            test.name,
            ratio_human(ratio)
        ),
    )]
}

/// How client writes reach the devices, for the deepest 16K random-write
/// test (or any write test) with device figures.
fn device_side(target: &TargetResult) -> Vec<Finding> {
    let with_device = target
        .tests
        .iter()
        .filter(|t| t.is_ok() && t.write.is_some())
        .filter_map(|t| Some((t, t.device?)));
    let chosen = with_device
        .filter(|(t, d)| t.workload.durability == Durability::None && d.write_ops > 0)
        .max_by_key(|(t, _)| {
            (
                t.workload.pattern == Pattern::RandWrite && t.suite == Suite::QdScaling,
                t.workload.iodepth,
            )
        });
    let Some((test, device)) = chosen else {
        return Vec::new();
    };
    let client = test.workload.block_size_bytes as f64;
    vec![finding(
        Severity::Info,
        "device-aggregation",
        target,
        Some(&test.label()),
        format!(
            "{} writes in {} reach the devices as {} writes on average ({:.1}x the client size, {:.1}x aggregation), \
             average device queue depth {:.1}, {:.2} device bytes written per client byte",
            size_short(test.workload.block_size_bytes),
            test.label(),
            bytes_human(device.average_write_size_bytes),
            device.average_write_size_bytes / client,
            device.write_aggregation,
            device.average_queue_depth,
            device.write_amplification
        ),
    )]
}

/// The busiest server test and the most efficient one.
fn server_cpu(target: &TargetResult) -> Vec<Finding> {
    let mut out = Vec::new();
    let measured: Vec<(&TestResult, _)> = target
        .tests
        .iter()
        .filter(|t| t.is_ok())
        // A test with no I/O (`idle`) has no IOPS per core to speak of.
        .filter(|t| t.operations() > 0)
        .filter_map(|t| Some((t, t.server?)))
        .collect();
    if let Some((test, usage)) = measured
        .iter()
        .max_by(|a, b| a.1.cores_used.total_cmp(&b.1.cores_used))
    {
        if usage.cores_used >= CPU_BOUND_CORES {
            out.push(finding(
                Severity::Info,
                "server-cpu",
                target,
                Some(&test.label()),
                format!(
                    "the server used {:.2} cores in {}: likely CPU-bound there ({} IOPS per core)",
                    usage.cores_used,
                    test.label(),
                    count_human(usage.iops_per_core)
                ),
            ));
        }
    }
    if let Some((test, usage)) = measured
        .iter()
        .max_by(|a, b| a.1.iops_per_core.total_cmp(&b.1.iops_per_core))
    {
        out.push(finding(
            Severity::Info,
            "server-efficiency",
            target,
            Some(&test.label()),
            format!(
                "best efficiency: {} IOPS per server core in {}",
                count_human(usage.iops_per_core),
                test.label()
            ),
        ));
    }
    out
}
