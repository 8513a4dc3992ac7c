//! fio tests with something done beside them: snapshots taken while the
//! writes run (the datasets suite), a dataset's `compression` set for them,
//! the pool grown before them (the grow suite), the server and pool sampled
//! through them (the soak suite).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{Runner, StallAction};
use crate::results::{Finding, Outcome, Sample, Severity, TargetResult, TestResult};
use crate::suites::{self, Compression, TestSpec};
use crate::target::Instance;
use crate::units::{bytes_human, MIB};

/// Prefix of the snapshots a `snapshots` test takes (`bench-load-1`, ...).
const LOAD_SNAPSHOT_PREFIX: &str = "bench-load-";
/// How often a sampling or snapshotting thread looks at its stop flag: a
/// test's end is noticed within this.
const STOP_POLL: Duration = Duration::from_millis(50);
/// A soak's samples are at least this far apart: `/proc` and `ironpool
/// list` cost little, but a sample per tick of a long run says nothing
/// more.
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Sleeps `duration`, or less if `stop` is set first; whether it was.
fn sleep_unless(stop: &AtomicBool, duration: Duration) -> bool {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(STOP_POLL.min(end.saturating_duration_since(Instant::now())));
    }
    stop.load(Ordering::Relaxed)
}

/// The median of `values` (sorted in place); 0 when empty.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

impl Runner<'_> {
    /// Runs a `snapshots` test: fio's writes, and on a thread an `ironpool
    /// snapshot` of the dataset every [`suites::SNAPSHOT_EVERY_SECONDS`]
    /// until they end; the snapshots are destroyed after. Skipped on
    /// targets without snapshots.
    pub(super) fn run_with_snapshots(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        // A copy of the pool's handle: the thread and the cleanup use it
        // while the test borrows the instance.
        let Some(pool) = instance.pool.clone() else {
            let reason = format!("{} targets take no snapshots", instance.kind);
            return self.not_run(test, Outcome::Skipped { reason });
        };
        let dataset = pool.dataset().to_string();
        let (snapshot_argv, env) = pool.command("snapshot", &[]);
        let stop = Arc::new(AtomicBool::new(false));
        let snapshotting = {
            let stop = Arc::clone(&stop);
            let dataset = dataset.clone();
            std::thread::spawn(move || -> (Vec<String>, Vec<f64>, Option<String>) {
                let every = Duration::from_secs(suites::SNAPSHOT_EVERY_SECONDS);
                let (mut names, mut seconds) = (Vec::new(), Vec::new());
                while !sleep_unless(&stop, every) {
                    let name = format!("{LOAD_SNAPSHOT_PREFIX}{}", names.len() + 1);
                    let mut argv = snapshot_argv.clone();
                    argv.push(format!("{dataset}@{name}"));
                    let start = Instant::now();
                    let taken = StallAction::Command(argv, env.clone()).run();
                    if let Err(error) = taken {
                        return (names, seconds, Some(format!("{error:#}")));
                    }
                    seconds.push(start.elapsed().as_secs_f64());
                    names.push(name);
                }
                (names, seconds, None)
            })
        };
        let access = instance.access.clone();
        let mut result = self.run_fio_test(instance, &access, test, false, slug, target);
        stop.store(true, Ordering::Relaxed);
        let (names, mut seconds, error) = snapshotting
            .join()
            .unwrap_or_else(|_| (Vec::new(), Vec::new(), Some("the thread panicked".into())));
        for name in &names {
            let (argv, env) = pool.command("destroy", &[format!("{dataset}@{name}")]);
            if let Err(error) = StallAction::Command(argv, env).run() {
                result.outcome = Outcome::Failed {
                    error: format!("destroying the load's snapshot {name}: {error:#}"),
                };
            }
        }
        if let Some(error) = error {
            result.outcome = Outcome::Failed {
                error: format!("taking a snapshot during the writes: {error}"),
            };
        } else if names.is_empty() && result.is_ok() {
            result.outcome = Outcome::Failed {
                error: format!(
                    "the writes ended before the first snapshot ({} s in): a longer --runtime",
                    suites::SNAPSHOT_EVERY_SECONDS
                ),
            };
        } else if result.is_ok() {
            let longest = seconds.iter().copied().fold(0.0, f64::max);
            target.notes.push(format!(
                "{}: {} taken during the writes, one every {} s; `ironpool snapshot` \
                 took {:.1} ms at the median, {:.1} ms at most",
                test.name(),
                match names.len() {
                    1 => "1 snapshot".to_string(),
                    count => format!("{count} snapshots"),
                },
                suites::SNAPSHOT_EVERY_SECONDS,
                median(&mut seconds) * 1e3,
                longest * 1e3
            ));
        }
        result
    }

    /// Runs a test with `compression` set on an ironpool dataset for it
    /// (put back after), and notes the dataset's `compressratio` after an
    /// `lz4` test; other targets run the writes as they are.
    pub(super) fn run_with_compression(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        compression: Compression,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        let access = instance.access.clone();
        let Some(pool) = instance.pool.clone() else {
            return self.run_fio_test(instance, &access, test, false, slug, target);
        };
        let previous = match pool.property("compression") {
            Ok(previous) => previous,
            Err(error) => return self.not_run(test, super::failed(&error)),
        };
        let mut result = self.with_property(
            instance,
            test,
            ("compression", compression.value(), &previous),
            |runner, instance| runner.run_fio_test(instance, &access, test, false, slug, target),
        );
        if compression == Compression::Lz4 && result.is_ok() {
            match pool.property("compressratio") {
                Ok(ratio) => target.notes.push(format!(
                    "{}: the dataset's compressratio after it: {ratio} (of everything it holds, \
                     the uncompressed prefill too); `dev write amp` is this test's own",
                    test.name()
                )),
                Err(error) => result.outcome = super::failed(&error),
            }
        }
        result
    }

    /// Runs a `grown` test: before the first, an ironpool pool gets a vdev
    /// like its first (`ironpool add`), with its fill and every vdev's
    /// allocation noted before the add and after the test; other targets
    /// run the writes again (the disk's drift since the test before).
    pub(super) fn run_grown(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        if instance.pool.is_some() && !instance.grown {
            if let Err(error) = self.grow(instance, target) {
                return self.not_run(test, super::failed(&error));
            }
        }
        let access = instance.access.clone();
        let mut result = self.run_fio_test(instance, &access, test, false, slug, target);
        if let Some(pool) = instance.pool.as_ref().filter(|_| result.is_ok()) {
            let after = pool
                .sync()
                .and_then(|sync| Ok((sync, pool.vdev_allocation()?)));
            match after {
                Ok((sync, allocation)) => {
                    target.setup_commands.push(sync);
                    target.notes.push(format!(
                        "{}: allocated after its {} s of writes: {allocation}",
                        test.name(),
                        self.plan.runtime_seconds
                    ));
                }
                Err(error) => result.outcome = super::failed(&error),
            }
        }
        let before = suites::Workload {
            grown: false,
            ..test.workload
        };
        let before = target
            .tests
            .iter()
            .find(|t| t.is_ok() && t.workload == before);
        if let Some(before) = before.filter(|b| result.is_ok() && b.total_iops() > 0.0) {
            target.notes.push(format!(
                "{}: {:.2}x the same writes before{}",
                test.name(),
                result.total_iops() / before.total_iops(),
                if instance.pool.is_some() {
                    " the add"
                } else {
                    " (no pool to grow: the disk's drift)"
                }
            ));
        }
        result
    }

    /// Adds a vdev like the first to the target's pool once it is
    /// committed, and notes how full it was and where its data lay.
    fn grow(&mut self, instance: &mut Instance, target: &mut TargetResult) -> Result<()> {
        let fill = instance
            .fill_percent()?
            .context("the pool has no fill level")?;
        let pool = instance.pool.as_mut().context("not an ironpool target")?;
        target.setup_commands.push(pool.sync()?);
        let allocation = pool.vdev_allocation()?;
        target.setup_commands.push(pool.add_vdev()?);
        instance.grown = true;
        target.notes.push(format!(
            "grow: the pool was {fill:.0}% full before the add; allocated: {allocation}"
        ));
        if fill < suites::GROW_FULL_PERCENT {
            target.pitfalls.push(Finding::new(
                Severity::Info,
                "grow-fill",
                &target.label,
                None,
                format!(
                    "the pool was only {fill:.0}% full when it grew: its first vdev still had \
                     room, so the test does not ask whether writes collapse onto the new one \
                     (a --size near {:.0}% of the pool does)",
                    suites::GROW_FULL_PERCENT + 20.0
                ),
            ));
        }
        Ok(())
    }

    /// Runs a soak (`verify`): fio, and on a thread a sample of the server's
    /// memory and CPU and the pool's free space [`suites::SOAK_SAMPLES`]
    /// times over the runtime; their summary is noted, and memory still
    /// growing over the second half is a warning.
    pub(super) fn run_soak(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        let interval = Duration::from_secs_f64(
            (self.plan.runtime_seconds + self.plan.ramp_seconds) as f64
                / suites::SOAK_SAMPLES as f64,
        )
        .max(MIN_SAMPLE_INTERVAL);
        let pid = instance.server.as_ref().map(|s| s.pid());
        let pool = instance.pool.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let sampling = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let start = Instant::now();
                let ticks_per_second = crate::target::process::clock_ticks_per_second();
                let mut last = pid.and_then(cpu_ticks).map(|t| (t, Instant::now()));
                let mut samples = Vec::new();
                while !sleep_unless(&stop, interval) {
                    let now = Instant::now();
                    let ticks = pid.and_then(cpu_ticks);
                    let server_cpu_percent = match (ticks, last) {
                        (Some(ticks), Some((before, then))) => Some(
                            (ticks.saturating_sub(before)) as f64 / ticks_per_second * 100.0
                                / now.duration_since(then).as_secs_f64(),
                        ),
                        _ => None,
                    };
                    last = ticks.map(|t| (t, now));
                    samples.push(Sample {
                        seconds: start.elapsed().as_secs_f64(),
                        server_rss_bytes: pid.and_then(rss_bytes),
                        server_cpu_percent,
                        pool_free_bytes: pool
                            .as_ref()
                            .and_then(|p| p.space().ok())
                            .map(|s| s.free_bytes),
                    });
                }
                samples
            })
        };
        let access = instance.access.clone();
        let mut result = self.run_fio_test(instance, &access, test, false, slug, target);
        stop.store(true, Ordering::Relaxed);
        result.samples = sampling.join().unwrap_or_default();
        if result.is_ok() {
            if let Some(note) = soak_note(&test.name(), &result.samples, interval) {
                target.notes.push(note);
            }
            if let Some(finding) = rss_growth(&target.label, &test.name(), &result.samples) {
                target.pitfalls.push(finding);
            }
        }
        result
    }
}

/// A process's user plus system CPU ticks, from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::target::process::cpu_ticks_from_stat(&text).ok()
}

/// A process's resident memory, from `/proc/PID/status`.
fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `randrw70-...: server RSS 180 / 210 / 214 MiB (min / median / max), +2
/// MiB over the second half; server CPU 96% / 101% of a core (median / max);
/// pool free 3.1 GiB -> 3.0 GiB; 20 samples every 3 s`.
fn soak_note(name: &str, samples: &[Sample], interval: Duration) -> Option<String> {
    let mut parts = Vec::new();
    let mut rss: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.server_rss_bytes)
        .map(|b| b as f64)
        .collect();
    if let (Some(&first), Some(&last)) = (rss.get(rss.len() / 2), rss.last()) {
        let max = rss.iter().copied().fold(0.0, f64::max);
        let min = rss.iter().copied().fold(f64::MAX, f64::min);
        let growth = last - first;
        parts.push(format!(
            "server RSS {} / {} / {} (min / median / max), {}{} over the second half",
            bytes_human(min),
            bytes_human(median(&mut rss)),
            bytes_human(max),
            if growth < 0.0 { "-" } else { "+" },
            bytes_human(growth.abs())
        ));
    }
    let mut cpu: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.server_cpu_percent)
        .collect();
    if !cpu.is_empty() {
        let max = cpu.iter().copied().fold(0.0, f64::max);
        parts.push(format!(
            "server CPU {:.0}% / {:.0}% of a core (median / max)",
            median(&mut cpu),
            max
        ));
    }
    let free: Vec<u64> = samples.iter().filter_map(|s| s.pool_free_bytes).collect();
    if let (Some(first), Some(last)) = (free.first(), free.last()) {
        parts.push(format!(
            "pool free {} -> {}",
            bytes_human(*first as f64),
            bytes_human(*last as f64)
        ));
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!(
        "{name}: {}; {} samples every {:.0} s (results.json)",
        parts.join("; "),
        samples.len(),
        interval.as_secs_f64()
    ))
}

/// A warning when the server's memory grew by more than
/// [`suites::SOAK_RSS_GROWTH_WARN_PERCENT`] (and a MiB) from the middle of a
/// soak to its end: a server whose caches are bounded levels off.
fn rss_growth(label: &str, name: &str, samples: &[Sample]) -> Option<Finding> {
    let rss: Vec<u64> = samples.iter().filter_map(|s| s.server_rss_bytes).collect();
    let (&middle, &last) = (rss.get(rss.len() / 2)?, rss.last()?);
    let growth = last.saturating_sub(middle);
    if middle == 0
        || growth < MIB
        || (growth as f64) < suites::SOAK_RSS_GROWTH_WARN_PERCENT / 100.0 * middle as f64
    {
        return None;
    }
    Some(Finding::new(
        Severity::Warning,
        "memory-growth",
        label,
        Some(name),
        format!(
            "the server's memory grew from {} to {} (+{:.0}%) over the soak's second half: \
             something it holds is not bounded, or the run was too short for its caches to fill",
            bytes_human(middle as f64),
            bytes_human(last as f64),
            growth as f64 / middle as f64 * 100.0
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seconds: f64, rss_mib: u64) -> Sample {
        Sample {
            seconds,
            server_rss_bytes: Some(rss_mib * MIB),
            server_cpu_percent: Some(90.0),
            pool_free_bytes: Some(1024 * MIB),
        }
    }

    #[test]
    fn warns_of_memory_that_keeps_growing() {
        let level: Vec<Sample> = (0..10).map(|i| sample(i as f64, 200 + i % 2)).collect();
        assert!(rss_growth("t", "soak", &level).is_none());
        let growing: Vec<Sample> = (0..10).map(|i| sample(i as f64, 200 + 10 * i)).collect();
        let finding = rss_growth("t", "soak", &growing).expect("a warning");
        assert!(finding.message.contains("250 MiB"), "{}", finding.message);
        assert!(rss_growth("t", "soak", &[]).is_none());
    }

    #[test]
    fn sums_a_soak_up() {
        let samples: Vec<Sample> = (1..=4).map(|i| sample(i as f64, 100 * i)).collect();
        let note = soak_note("soak", &samples, Duration::from_secs(1)).unwrap();
        assert!(
            note.contains("server RSS 100 MiB / 300 MiB / 400 MiB"),
            "{note}"
        );
        assert!(note.contains("+100 MiB over the second half"), "{note}");
        assert!(note.contains("90% / 90%"), "{note}");
        assert!(note.contains("4 samples every 1 s"), "{note}");
        assert!(soak_note("soak", &[], Duration::from_secs(1)).is_none());
    }
}
