//! Runs a plan: for each target in turn, set it up, prefill it, run the
//! suites' tests with observations around each, tear it down. One target
//! runs at a time, so no two servers compete for the 2 cores.
//!
//! The fill suite gets its own set-up of each target (a fresh pool with the
//! working set `--size` asks, its data not cached so that reads go to the
//! devices) and raises the fill level with fillers between levels; each
//! test is charted at the level measured (after a commit) just before it. Targets that cannot be filled skip it, except the raw
//! baseline, which runs the pool report once so the fill levels have
//! something to be compared with.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::args::{BenchArgs, Plan};
use crate::fio_runner::{self, FioSettings};
use crate::machine;
use crate::observe;
use crate::pitfalls;
use crate::progress::Progress;
use crate::results::{
    Finding, Outcome, PrefillResult, Results, Settings, TargetResult, TestResult,
    RESULTS_SCHEMA_VERSION,
};
use crate::suites::{self, Durability, Suite, TestSpec};
use crate::target::{self, Access, FillMethod, Instance, Purpose, SetupContext, TargetSpec};
use crate::units::{bytes_human, count_human, latency_human, rate_human};
use crate::{interrupt, target::files};

mod beside;

/// The send suite's copy needs the working set's size and this fraction
/// of it again (1/8: the copy's metadata and the slack allocation leaves)
/// free in the pool before it starts.
const SEND_COPY_MARGIN_DIVISOR: u64 = 8;
/// How far (percentage points) a fill level measured may be from the one
/// asked before the report says so: fillers are whole MiB and metadata
/// grows with them, so a level lands near, not on, the one asked.
const FILL_LEVEL_TOLERANCE_PERCENT: f64 = 3.0;
/// Planned prefill speed for the ETA only.
const PLANNED_PREFILL_BYTES_PER_SECOND: f64 = 200.0 * 1024.0 * 1024.0;
/// Planned seconds per test beyond runtime and ramp (fio start, report).
const PLANNED_TEST_OVERHEAD_SECONDS: f64 = 1.0;

/// Run-wide state.
struct Runner<'a> {
    plan: &'a Plan,
    args: &'a BenchArgs,
    out_dir: PathBuf,
    fio: FioSettings,
    ironpool_exe: PathBuf,
    progress: Progress,
    page_size_bytes: u64,
    interrupted: bool,
    /// Output directory names of the targets so far, kept unique.
    used_slugs: Vec<String>,
}

/// Runs the plan and returns the results (partial when interrupted).
pub fn execute(
    plan: &Plan,
    args: &BenchArgs,
    out_dir: &Path,
    ironpool_exe: &Path,
) -> Result<Results> {
    let fio_version = fio_runner::version(&args.fio)?;
    let mut machine = machine::describe(fio_version);
    let started = unix_now();
    let (steps, planned_seconds) = planned_work(plan);
    let mut runner = Runner {
        plan,
        args,
        out_dir: out_dir.to_path_buf(),
        fio: FioSettings {
            exe: args.fio.clone(),
            runtime_seconds: plan.runtime_seconds,
            ramp_seconds: plan.ramp_seconds,
        },
        ironpool_exe: ironpool_exe.to_path_buf(),
        progress: Progress::new(steps, planned_seconds),
        page_size_bytes: machine.page_size_bytes,
        interrupted: false,
        used_slugs: Vec::new(),
    };
    runner.progress.log(&format!(
        "{} targets, {} steps planned, about {} (results in {})",
        plan.targets.len(),
        steps,
        crate::units::duration_human(planned_seconds),
        out_dir.display()
    ));
    let _sigint = interrupt::install().context("installing the Ctrl-C handler")?;
    let mut targets = Vec::new();
    for (label, spec) in &plan.targets {
        runner.interrupted |= interrupt::requested();
        if runner.interrupted {
            break;
        }
        targets.push(runner.run_target(label, spec));
    }
    runner.progress.finish();
    if plan
        .targets
        .iter()
        .any(|(_, s)| matches!(s, TargetSpec::Nbdkit(_) | TargetSpec::NbdkitMemory))
    {
        let argv = vec![args.nbdkit.display().to_string(), "--version".to_string()];
        machine.nbdkit_version =
            target::process::run_command(&argv, std::time::Duration::from_secs(30))
                .ok()
                .map(|s| s.trim().to_string());
    }
    if plan
        .targets
        .iter()
        .any(|(_, s)| matches!(s, TargetSpec::Ironpool(_)))
    {
        machine.ironpool_version = target::ironpool::version(ironpool_exe);
    }
    Ok(Results {
        schema_version: RESULTS_SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        started_unix_seconds: started,
        finished_unix_seconds: unix_now(),
        interrupted: runner.interrupted,
        machine,
        settings: Settings {
            suites: plan.suites.clone(),
            target_specs: plan.targets.iter().map(|(l, _)| l.clone()).collect(),
            runtime_seconds: plan.runtime_seconds,
            ramp_seconds: plan.ramp_seconds,
            size_bytes: plan.size_bytes,
            depths: plan.suite_options.depths.clone(),
            jobs: plan.suite_options.jobs.clone(),
            fill_levels_percent: plan.suite_options.fill_levels_percent.clone(),
            files: plan
                .suites
                .iter()
                .any(|s| matches!(s, Suite::Fs | Suite::Snapshot | Suite::Send))
                .then_some(plan.files),
        },
        targets,
        findings: Vec::new(),
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Steps and planned seconds of the whole plan, for the progress display.
fn planned_work(plan: &Plan) -> (usize, f64) {
    let per_test =
        (plan.runtime_seconds + plan.ramp_seconds) as f64 + PLANNED_TEST_OVERHEAD_SECONDS;
    let per_prefill =
        plan.size_bytes as f64 / PLANNED_PREFILL_BYTES_PER_SECOND + PLANNED_TEST_OVERHEAD_SECONDS;
    let mut steps = 0;
    let mut seconds = 0.0;
    for (_, spec) in &plan.targets {
        for (_, tests) in test_groups(plan, spec, matches!(spec, TargetSpec::Raw(_))) {
            steps += tests.len() + 1;
            seconds += tests.len() as f64 * per_test + per_prefill;
        }
    }
    (steps, seconds)
}

/// The label of the target that is `spec`'s physical limit when it is not
/// the raw baseline: the raw pair for an ironpool mirror (both copies of
/// every write land on the one disk), if the plan has one.
fn limit_of(plan: &Plan, spec: &TargetSpec) -> Option<String> {
    let mirror =
        matches!(spec, TargetSpec::Ironpool(pool) if pool.layout == target::Layout::Mirror);
    if !mirror {
        return None;
    }
    plan.targets
        .iter()
        .find(|(_, s)| *s == TargetSpec::RawPair)
        .map(|(label, _)| label.clone())
}

/// The tests of a target, grouped by set-up: the ordinary suites, then the
/// fill suite. Targets that cannot be filled get no fill tests, except the
/// raw baseline, which runs the pool report once (unless that suite already
/// ran) so that fill levels can be compared with it.
fn test_groups(plan: &Plan, spec: &TargetSpec, baseline: bool) -> Vec<(Purpose, Vec<TestSpec>)> {
    let mut groups = Vec::new();
    let main: Vec<TestSpec> = plan
        .suites
        .iter()
        .filter(|s| **s != Suite::Fill)
        .flat_map(|&s| suites::tests_of(s, &plan.suite_options))
        .collect();
    if !main.is_empty() {
        groups.push((Purpose::Main, main));
    }
    if plan.suites.contains(&Suite::Fill) {
        let fillable = matches!(
            spec,
            TargetSpec::Ironpool(_) | TargetSpec::File(_) | TargetSpec::Dir(_) | TargetSpec::Ext4
        );
        if fillable {
            groups.push((
                Purpose::Fill,
                suites::tests_of(Suite::Fill, &plan.suite_options),
            ));
        } else if baseline && !plan.suites.contains(&Suite::PoolReport) {
            let tests = suites::pool_report_workloads()
                .into_iter()
                .map(|workload| TestSpec {
                    suite: Suite::Fill,
                    workload,
                    fill_percent: None,
                })
                .collect();
            groups.push((Purpose::Main, tests));
        }
    }
    groups
}

impl Runner<'_> {
    /// Planned seconds of one test, for the progress display.
    fn planned_test_seconds(&self) -> f64 {
        (self.plan.runtime_seconds + self.plan.ramp_seconds) as f64 + PLANNED_TEST_OVERHEAD_SECONDS
    }

    /// Planned seconds of one set-up and prefill, for the progress display.
    fn planned_prefill_seconds(&self) -> f64 {
        self.plan.size_bytes as f64 / PLANNED_PREFILL_BYTES_PER_SECOND
            + PLANNED_TEST_OVERHEAD_SECONDS
    }

    fn run_target(&mut self, label: &str, spec: &TargetSpec) -> TargetResult {
        let baseline = matches!(spec, TargetSpec::Raw(_));
        let mut result = TargetResult {
            label: label.to_string(),
            kind: spec.kind().to_string(),
            baseline,
            limit: limit_of(self.plan, spec),
            size_bytes: self.plan.size_bytes,
            ..TargetResult::default()
        };
        let groups = test_groups(self.plan, spec, baseline);
        if self.plan.suites.contains(&Suite::Fill)
            && !groups.iter().any(|(p, _)| *p == Purpose::Fill)
            && !baseline
        {
            result.notes.push(format!(
                "fill suite skipped: {} targets have no fill level the tool can raise",
                spec.kind()
            ));
        }
        let mut slug = spec.slug();
        if label.contains('#') {
            slug = format!("{slug}-{}", label.rsplit('#').next().unwrap_or_default());
        }
        // Slugs are cut to a length: two long specs (`bin=` paths) may meet.
        let base = slug.clone();
        let mut copy = 1;
        while self.used_slugs.contains(&slug) {
            copy += 1;
            slug = format!("{base}-{copy}");
        }
        self.used_slugs.push(slug.clone());
        let mut static_checks_done = false;
        let mut remaining: Vec<(Purpose, Vec<TestSpec>)> = groups;
        remaining.reverse();
        while let Some((purpose, tests)) = remaining.pop() {
            self.interrupted |= interrupt::requested();
            if self.interrupted {
                break;
            }
            let outcome = self.run_group(
                label,
                spec,
                &slug,
                purpose,
                &tests,
                &mut result,
                &mut static_checks_done,
            );
            if let Err(error) = outcome {
                let message = format!("{error:#}");
                self.progress.log(&format!("{label}: {message}"));
                result.error.get_or_insert(message);
                for (_, tests) in &remaining {
                    self.progress.skip(self.planned_prefill_seconds());
                    for _ in tests {
                        self.progress.skip(self.planned_test_seconds());
                    }
                }
                break;
            }
        }
        result.pitfalls = pitfalls::collapse(std::mem::take(&mut result.pitfalls));
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn run_group(
        &mut self,
        label: &str,
        spec: &TargetSpec,
        slug: &str,
        purpose: Purpose,
        tests: &[TestSpec],
        result: &mut TargetResult,
        static_checks_done: &mut bool,
    ) -> Result<()> {
        let context = SetupContext {
            out_dir: &self.out_dir,
            size_bytes: self.plan.size_bytes,
            overwrite: self.args.overwrite,
            nbdkit: &self.args.nbdkit,
            nbdinfo: &self.args.nbdinfo,
            ironpool: &self.ironpool_exe,
            assume_zfs_pool: self.args.assume_zfs_pool.as_deref(),
            purpose,
            write_out_disks: self.args.write_out,
        };
        let planned = self.planned_prefill_seconds();
        self.progress
            .begin(&format!("{label}: setting up and prefilling"), planned);
        let mut instance = match target::setup(spec, label, slug, &context) {
            Ok(instance) => instance,
            Err(error) => {
                self.progress.end("set-up failed");
                for _ in tests {
                    self.progress.skip(self.planned_test_seconds());
                }
                return Err(error.context(format!("setting up {label}")));
            }
        };
        let setup_findings = std::mem::take(&mut instance.setup_findings);
        for finding in setup_findings {
            if !result.pitfalls.contains(&finding) {
                result.pitfalls.push(finding);
            }
        }
        if result.description.is_empty() {
            result.description = instance.description.clone();
            result.filesystem = instance.filesystem.as_ref().map(|m| m.fs_type.clone());
            result.size_bytes = instance.size_bytes;
        } else if purpose == Purpose::Fill {
            result.notes.push(format!(
                "fill suite on a fresh set-up: {}",
                instance.description
            ));
        }
        result.setup_commands.append(&mut instance.setup_commands);
        let prefill_name = if purpose == Purpose::Fill {
            "fill-target"
        } else {
            "target"
        };
        let outcome = self.run_prepared(
            &mut instance,
            slug,
            prefill_name,
            tests,
            result,
            static_checks_done,
        );
        result.setup_commands.append(&mut instance.setup_commands);
        let teardown = instance.teardown(self.args.keep);
        outcome.and(teardown)
    }

    fn run_prepared(
        &mut self,
        instance: &mut Instance,
        slug: &str,
        prefill_name: &str,
        tests: &[TestSpec],
        result: &mut TargetResult,
        static_checks_done: &mut bool,
    ) -> Result<()> {
        let size = instance.size_bytes;
        let access = instance.access.clone();
        let prefill = self.prefill(&access, size, prefill_name, slug);
        let prefill = match prefill {
            Ok(prefill) => prefill,
            Err(error) => {
                self.progress.end("prefill failed");
                for _ in tests {
                    self.progress.skip(self.planned_test_seconds());
                }
                return Err(error);
            }
        };
        self.progress.end(&format!(
            "prefilled {} at {}",
            bytes_human(prefill.bytes as f64),
            rate_human(prefill.bandwidth_bytes_per_second)
        ));
        result.pitfalls.extend(pitfalls::never_written_prefill(
            &instance.label,
            prefill.bytes,
            size,
        ));
        result.prefills.push(prefill);
        if let Access::File(path) = &access {
            if !files::is_block_device(path) {
                result.pitfalls.extend(pitfalls::never_written_file(
                    &instance.label,
                    files::hole_bytes(path, size)?,
                    size,
                ));
            }
        }
        instance.refresh_record_size()?;
        if result.record_size_bytes.is_none() {
            result.record_size_bytes = instance.record_size_bytes;
        }
        if !*static_checks_done {
            *static_checks_done = true;
            self.static_checks(instance, result);
        }
        let label = instance.label.clone();
        if let Some(fill) = instance.fill_percent()? {
            if tests.iter().all(|t| t.fill_percent.is_none()) {
                let subject = instance.fill_subject();
                result
                    .pitfalls
                    .extend(pitfalls::fill_level(&label, None, fill, subject, false));
            }
        }
        let mut current_level = None;
        for (index, test) in tests.iter().enumerate() {
            if self.interrupted || interrupt::requested() {
                self.interrupted = true;
                for _ in &tests[index..] {
                    self.progress.skip(self.planned_test_seconds());
                }
                break;
            }
            let mut fill_measured = None;
            if let Some(level) = test.fill_percent {
                if current_level != Some(level) {
                    current_level = Some(level);
                    if let Err(error) = self.raise_fill(instance, level, slug, result) {
                        let pool = instance.pool.as_ref().and_then(|pool| {
                            Some((pool.space().ok()?, pool.vdev_allocation().ok()?))
                        });
                        let state = match pool {
                            Some((space, allocation)) => {
                                let free = space.free_bytes as f64 / space.size_bytes.max(1) as f64;
                                let why = if format!("{error:#}").contains("No space left")
                                    && free > 0.1
                                {
                                    " (the pool refused a block with that much free: ironpool has no \
                                     gang blocks, so a block needs a free extent of its own size, and \
                                     overwrites leave the free space in smaller pieces)"
                                } else {
                                    ""
                                };
                                format!(
                                    "; the pool then: {} free of {}, {allocation}{why}",
                                    bytes_human(space.free_bytes as f64),
                                    bytes_human(space.size_bytes as f64)
                                )
                            }
                            None => String::new(),
                        };
                        result
                            .notes
                            .push(format!("fill suite stopped at {level}%: {error:#}{state}"));
                        for _ in &tests[index..] {
                            self.progress.skip(self.planned_test_seconds());
                        }
                        break;
                    }
                    let measured = instance.fill_percent()?;
                    if let Some(measured) = measured {
                        if (measured - f64::from(level)).abs() > FILL_LEVEL_TOLERANCE_PERCENT {
                            result.notes.push(format!(
                                "fill level {level}%: measured {measured:.0}% (the working set \
                                 alone fills more than the level, or the fillers overshot): its \
                                 tests are charted where measured"
                            ));
                        }
                        let subject = instance.fill_subject();
                        let test_label = format!("fill-{level}");
                        result.pitfalls.extend(pitfalls::fill_level(
                            &label,
                            Some(&test_label),
                            measured,
                            subject,
                            true,
                        ));
                    }
                }
                fill_measured = instance.fill_percent()?;
            }
            let mut test_result = self.run_test(instance, test, slug, result);
            test_result.fill_measured_percent = fill_measured;
            result.tests.push(test_result);
        }
        Ok(())
    }

    /// Pitfalls known before any test: size against record, block sizes
    /// against record and page, NBD caveats. Covers every planned test.
    fn static_checks(&mut self, instance: &Instance, result: &mut TargetResult) {
        let label = instance.label.as_str();
        result.pitfalls.extend(pitfalls::smaller_than_record(
            label,
            instance.size_bytes,
            instance.record_size_bytes,
        ));
        if instance.pool.is_some() {
            result
                .pitfalls
                .extend(pitfalls::debug_build(label, &self.ironpool_exe));
        }
        let planned: Vec<TestSpec> = self
            .plan
            .suites
            .iter()
            .flat_map(|&s| suites::tests_of(s, &self.plan.suite_options))
            .collect();
        let mut named: Vec<(String, u64)> = Vec::new();
        // Tests of system calls have no block size.
        for test in planned.iter().filter(|t| t.workload.ops.is_none()) {
            let entry = (test.name(), test.workload.block_size_bytes);
            if !named.contains(&entry) {
                named.push(entry);
            }
        }
        result.pitfalls.extend(pitfalls::alignment(
            label,
            &named,
            instance.record_size_bytes,
            self.page_size_bytes,
        ));
        if matches!(instance.access, Access::Nbd(_)) && instance.pool.is_none() {
            result.pitfalls.push(pitfalls::direct_over_nbd(
                label,
                instance.nbd_cache_note.as_deref(),
            ));
        }
        let max_jobs = planned
            .iter()
            .map(|t| t.workload.numjobs)
            .max()
            .unwrap_or(1);
        if instance.nbd_multi_conn == Some(false) && max_jobs > 1 {
            result.pitfalls.push(Finding::new(
                crate::results::Severity::Warning,
                "multi-conn",
                label,
                None,
                format!(
                    "the NBD server does not advertise multi-conn: with up to {max_jobs} jobs fio opens as many \
                     connections, and a flush on one need not cover writes made on another"
                ),
            ));
        }
    }

    /// Writes a target or filler once, sequentially, with real data.
    fn prefill(
        &mut self,
        access: &Access,
        size_bytes: u64,
        purpose: &str,
        slug: &str,
    ) -> Result<PrefillResult> {
        let argv = fio_runner::prefill_command(&self.fio, access, size_bytes);
        let output = self.output_path(slug, &format!("prefill-{purpose}"))?;
        let run = fio_runner::run(
            &argv,
            &output,
            fio_runner::prefill_timeout(size_bytes),
            &mut self.progress,
        )?;
        if run.stopped && interrupt::requested() {
            self.interrupted = true;
        }
        let report = run
            .report()
            .map_err(|e| anyhow::anyhow!("prefill ({}) failed: {e}", argv.join(" ")))?;
        // One job, or one per file of a pair: what all of them wrote.
        let writes: Vec<_> = report
            .report
            .jobs
            .iter()
            .filter_map(|j| j.write.summary())
            .collect();
        Ok(PrefillResult {
            purpose: purpose.to_string(),
            bytes: writes.iter().map(|w| w.io_bytes).sum(),
            bandwidth_bytes_per_second: writes.iter().map(|w| w.bandwidth_bytes_per_second).sum(),
            wall_seconds: run.wall_seconds,
            command: argv,
        })
    }

    /// Reads the working set once through the target's cache before a
    /// `cached` test (see [`fio_runner::warm_command`]); the command joins
    /// the target's set-up commands.
    fn warm(
        &mut self,
        instance: &Instance,
        slug: &str,
        test_file: &str,
        target: &mut TargetResult,
    ) -> Result<()> {
        let access = instance.access.clone();
        self.warm_access(&access, instance.size_bytes, slug, test_file, target)
    }

    /// Writes fillers until the pool or filesystem reaches `level` percent.
    fn raise_fill(
        &mut self,
        instance: &mut Instance,
        level: u32,
        slug: &str,
        result: &mut TargetResult,
    ) -> Result<()> {
        let shortfall = instance.fill_shortfall_bytes(level)?;
        if shortfall == 0 {
            return Ok(());
        }
        if let FillMethod::Filesystem(_) = instance.fill {
            let written: u64 = result
                .prefills
                .iter()
                .filter(|p| p.purpose.starts_with("fill"))
                .map(|p| p.bytes)
                .sum();
            if written + shortfall > self.plan.fill_max_bytes {
                anyhow::bail!(
                    "reaching it means writing {} more, over --fill-max {}: use a small dedicated filesystem",
                    bytes_human(shortfall as f64),
                    bytes_human(self.plan.fill_max_bytes as f64)
                );
            }
        }
        let (name, access) = instance.new_filler(shortfall)?;
        let planned = shortfall as f64 / PLANNED_PREFILL_BYTES_PER_SECOND;
        self.progress.add_step(planned);
        self.progress.begin(
            &format!(
                "{}: filling to {level}% ({})",
                instance.label,
                bytes_human(shortfall as f64)
            ),
            planned,
        );
        let prefill = self.prefill(&access, shortfall, &name, slug);
        self.progress.end("done");
        result.prefills.push(prefill?);
        Ok(())
    }

    fn output_path(&self, slug: &str, name: &str) -> Result<PathBuf> {
        let dir = self.out_dir.join("fio").join(slug);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir.join(format!("{name}.json")))
    }

    /// Runs one test. A test whose every write must be durable runs on an
    /// ironpool volume with `sync=always` set for its duration (fio's nbd
    /// engine sends no FUA), as plain writes from fio's side.
    fn run_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        if let Some(ops) = test.workload.ops {
            if ops.of_snapshot() {
                return self.run_snapshot_ops_test(instance, test, ops, target);
            }
            if ops.of_send() {
                return self.run_send_test(instance, test, ops, slug, target);
            }
            if ops.of_small_files() {
                return self.run_small_files_test(instance, test, ops, target);
            }
            if ops == suites::OpsTest::Idle {
                return self.run_idle_test(instance, test, target);
            }
            if ops.of_stall() {
                return self.run_stall_test(instance, test, ops, slug, target);
            }
            return self.run_ops_test(instance, test, ops, target);
        }
        if test.workload.snapshots {
            return self.run_with_snapshots(instance, test, slug, target);
        }
        if let Some(compression) = test.workload.compression {
            return self.run_with_compression(instance, test, compression, slug, target);
        }
        if test.workload.grown {
            return self.run_grown(instance, test, slug, target);
        }
        if test.workload.verify {
            return self.run_soak(instance, test, slug, target);
        }
        if test.workload.snapshot {
            return self.run_snapshot_read(instance, test, slug, target);
        }
        if test.workload.cold || test.workload.nocache {
            if test.workload.nocache && instance.kind == "nbdkit-memory" {
                return self.not_run(
                    test,
                    Outcome::Skipped {
                        reason: "nbdkit-memory's data is in RAM: it has no cache to turn off"
                            .to_string(),
                    },
                );
            }
            // An ironpool target's cache is emptied (a file read with
            // O_DIRECT has no cache in the way).
            if let Err(error) = instance.drop_cache() {
                return self.not_run(test, failed(&error));
            }
        }
        if test.workload.nocache && instance.pool.is_some() {
            return self.with_property(
                instance,
                test,
                ("primarycache", "none", "all"),
                |runner, instance| {
                    let access = instance.access.clone();
                    runner.run_fio_test(instance, &access, test, false, slug, target)
                },
            );
        }
        let by_property =
            test.workload.durability == Durability::Dsync && instance.dsync_by_property();
        let access = instance.access.clone();
        if !by_property {
            return self.run_fio_test(instance, &access, test, false, slug, target);
        }
        let note = "every write durable on the volume: sync=always for the -dsync tests \
                    (fio's nbd engine sends no FUA), fio writing without flushes";
        if !target.notes.iter().any(|n| n == note) {
            target.notes.push(note.to_string());
        }
        if let Err(error) = instance.set_sync("always") {
            return self.not_run(test, failed(&error));
        }
        let mut result = self.run_fio_test(instance, &access, test, true, slug, target);
        if let Err(error) = instance.set_sync("standard") {
            result.outcome = failed(&error);
        }
        result
    }

    /// A test that does not run (skipped, or failed before it could
    /// start): its planned time leaves the progress display, and its
    /// result says why.
    fn not_run(&mut self, test: &TestSpec, outcome: Outcome) -> TestResult {
        self.progress.skip(self.planned_test_seconds());
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        result.outcome = outcome;
        result
    }

    /// Runs `run` (test `test`) with property `key=value` set on an
    /// ironpool target's dataset, and `key=restore` after (both commands
    /// join the set-up commands); a failure to set either fails the test.
    fn with_property(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        (key, value, restore): (&str, &str, &str),
        run: impl FnOnce(&mut Self, &mut Instance) -> TestResult,
    ) -> TestResult {
        if let Err(error) = instance.set_property(key, value) {
            return self.not_run(test, failed(&error));
        }
        let mut result = run(self, instance);
        if let Err(error) = instance.set_property(key, restore) {
            result.outcome = failed(&error);
        }
        result
    }

    /// Runs a test of the snapshot suite that reads the working set's file
    /// through snapshot [`suites::SNAPSHOT_READ_NAME`] of the target's
    /// filesystem, taken before the first such test (skipped on targets
    /// with no snapshots).
    fn run_snapshot_read(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        let name = suites::SNAPSHOT_READ_NAME;
        let taken = if instance.has_snapshot(name) {
            Ok(Ok(()))
        } else {
            instance.take_snapshot(name)
        };
        let file = match &instance.access {
            Access::File(path) => path.file_name().map(PathBuf::from),
            _ => None,
        };
        let path = match (taken, file) {
            (Err(reason), _) => Err(Outcome::Skipped { reason }),
            (Ok(Err(error)), _) => Err(failed(&error)),
            (Ok(Ok(())), None) => Err(Outcome::Skipped {
                reason: "the working set is not a file".to_string(),
            }),
            (Ok(Ok(())), Some(file)) => instance
                .in_snapshot(name, &file)
                .map_err(|reason| Outcome::Skipped { reason }),
        };
        match path {
            Ok(path) => self.run_fio_test(instance, &Access::File(path), test, false, slug, target),
            Err(outcome) => self.not_run(test, outcome),
        }
    }

    /// Runs fio for a test on `access` (the target's, or another way to
    /// its working set) and observes the target around it;
    /// `durable_by_target` as in [`fio_runner::test_command`].
    fn run_fio_test(
        &mut self,
        instance: &Instance,
        access: &Access,
        test: &TestSpec,
        durable_by_target: bool,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let planned = self.planned_test_seconds();
        // A stall probe reads its own small dataset, not the working set.
        let size_bytes = if test.workload.ops.is_some_and(suites::OpsTest::of_stall) {
            suites::STALL_PROBE_BYTES
        } else {
            instance.size_bytes
        };
        let argv = match fio_runner::test_command(
            &self.fio,
            access,
            &test.workload,
            size_bytes,
            durable_by_target,
        ) {
            Ok(argv) => argv,
            Err(reason) => return self.not_run(test, Outcome::Skipped { reason }),
        };
        result.command = argv.clone();
        let file_name = format!("{}-{}", test.suite.name(), result.label().replace('/', "-"));
        if test.workload.cached {
            if let Err(error) = self.warm(instance, slug, &file_name, target) {
                self.progress.skip(planned);
                result.outcome = failed(&error);
                return result;
            }
        }
        self.progress.begin(
            &format!(
                "{} {} {}",
                instance.label,
                test.suite.name(),
                result.label()
            ),
            planned,
        );
        let before = observe::snapshot(instance, &self.args.zfs_kstat_dir, &mut target.notes);
        let run = self.output_path(slug, &file_name).and_then(|output| {
            fio_runner::run(
                &argv,
                &output,
                fio_runner::test_timeout(&self.fio),
                &mut self.progress,
            )
        });
        let after = observe::snapshot(instance, &self.args.zfs_kstat_dir, &mut target.notes);
        let run = match run {
            Ok(run) => run,
            Err(error) => {
                result.outcome = failed(&error);
                self.progress.end("failed to run fio");
                return result;
            }
        };
        if run.stopped && interrupt::requested() {
            self.interrupted = true;
        }
        result.fio_output = Some(format!("fio/{slug}/{file_name}.json"));
        result.wall_seconds = run.wall_seconds;
        match run.report() {
            Ok(output) => {
                // Under load, the test's own job, not the load's.
                let job = if test.workload.under_load {
                    output
                        .report
                        .jobs
                        .iter()
                        .find(|job| job.jobname != fio_runner::LOAD_JOB_NAME)
                } else {
                    output.report.slowest_job()
                };
                if let Some(job) = job {
                    result.read = job.read.summary();
                    result.write = job.write.summary();
                    result.sync = job.sync.summary();
                    result.client_cpu_percent = job.usr_cpu + job.sys_cpu;
                }
                result.disk_util = output.report.disk_util.clone();
            }
            Err(_) if self.interrupted => {
                result.outcome = Outcome::Skipped {
                    reason: "interrupted (Ctrl-C)".to_string(),
                };
            }
            Err(error) => result.outcome = Outcome::Failed { error },
        }
        if result.is_ok() {
            target
                .pitfalls
                .extend(observe::compare(instance, &before, &after, &mut result));
            self.progress.end(&summary_line(&result));
        } else {
            let word = if self.interrupted {
                "interrupted"
            } else {
                "failed"
            };
            self.progress.end(word);
        }
        result
    }
}

impl Runner<'_> {
    /// Runs a test of system calls (see [`crate::ops`]) in the directory of
    /// the target's file, and observes the target around it as a fio test.
    fn run_ops_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        ops: suites::OpsTest,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let planned = self.planned_test_seconds();
        let dir = match (&instance.access, instance.kind) {
            (Access::File(_), "raw") => {
                Err("the raw file is a file, not a filesystem: ext4 is the limit of these tests")
            }
            (Access::File(path), _) if !files::is_block_device(path) => {
                Ok(path.parent().unwrap_or(Path::new(".")).to_path_buf())
            }
            _ => Err("a test of system calls needs a directory of a filesystem"),
        };
        let dir = match dir {
            Ok(dir) => dir,
            Err(reason) => {
                return self.not_run(
                    test,
                    Outcome::Skipped {
                        reason: reason.to_string(),
                    },
                )
            }
        };
        let files = self.plan.files;
        result.command = vec![
            "ironpool".to_string(),
            "bench".to_string(),
            format!("(ops {})", ops.name()),
            dir.display().to_string(),
            if ops.counted() {
                format!("{files} files")
            } else {
                format!("{} s", self.plan.runtime_seconds)
            },
        ];
        let runtime = std::time::Duration::from_secs(self.plan.runtime_seconds);
        self.observed(
            instance,
            (test, ops.name(), planned),
            &mut result,
            target,
            |runner, _, _| {
                let progress = &mut runner.progress;
                crate::ops::run(ops, &dir, files, runtime, &mut || progress.tick())
            },
            |result, run| {
                result.wall_seconds = run.seconds;
                result.ops_per_second = Some(run.rate());
                format!(
                    "{} operations, {}/s",
                    run.operations,
                    count_human(run.rate())
                )
            },
        );
        result
    }
}

impl Runner<'_> {
    /// Runs `snapshot-take` or `snapshot-list` (see [`suites::OpsTest`]) on
    /// an `ironpool-fs` target, observed as a test of system calls.
    fn run_snapshot_ops_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        ops: suites::OpsTest,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let planned = self.planned_test_seconds();
        let name = suites::SNAPSHOT_FILES_NAME;
        let root = match instance.file_dir() {
            Some(root) if instance.kind == "ironpool-fs" => root.to_path_buf(),
            _ => {
                return self.not_run(
                    test,
                    Outcome::Skipped {
                        reason: format!(
                            "a snapshot's test needs an ironpool-fs target, not {}",
                            instance.kind
                        ),
                    },
                )
            }
        };
        let files = self.plan.files;
        let listed = crate::ops::snapshot_files_dir(Path::new(""));
        result.command = vec![
            "ironpool".to_string(),
            "bench".to_string(),
            format!("(ops {})", ops.name()),
            match ops {
                suites::OpsTest::SnapshotList => instance
                    .in_snapshot(name, &listed)
                    .map(|path| path.display().to_string())
                    .unwrap_or_default(),
                _ => root.display().to_string(),
            },
            format!("{files} files"),
        ];
        self.observed(
            instance,
            (test, ops.name(), planned),
            &mut result,
            target,
            |runner, instance, _| {
                let progress = &mut runner.progress;
                match ops {
                    suites::OpsTest::SnapshotTake => {
                        let mut take = || match instance.take_snapshot(name) {
                            Ok(taken) => taken,
                            Err(reason) => Err(anyhow::anyhow!(reason)),
                        };
                        crate::ops::snapshot_take(&root, files, &mut || progress.tick(), &mut take)
                    }
                    _ => instance
                        .in_snapshot(name, &listed)
                        .map_err(|reason| anyhow::anyhow!(reason))
                        .and_then(|dir| {
                            if !dir.is_dir() {
                                anyhow::bail!(
                                    "{} is missing: snapshot-list lists what snapshot-take left",
                                    dir.display()
                                );
                            }
                            crate::ops::snapshot_list(&dir, &mut || progress.tick())
                        }),
                }
            },
            |result, run| {
                result.wall_seconds = run.seconds;
                result.ops_per_second = Some(run.rate());
                format!("{} operations in {:.3} s", run.operations, run.seconds)
            },
        );
        result
    }
}

impl Runner<'_> {
    /// Runs `send-receive` or `send-incremental` (see [`suites::OpsTest`]):
    /// on an ironpool target, the streams of its dataset; on a file, the
    /// copy that is their limit. The figures are a read of the stream's
    /// bytes, one operation long.
    fn run_send_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        ops: suites::OpsTest,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let planned = self.planned_test_seconds();
        let file = match &instance.access {
            Access::File(path) if instance.pool.is_none() && !files::is_block_device(path) => {
                Some(path.clone())
            }
            _ => None,
        };
        if instance.pool.is_none() && (file.is_none() || ops != suites::OpsTest::SendReceive) {
            let reason = match ops {
                suites::OpsTest::SendReceive => format!(
                    "a stream needs an ironpool target; a file target's limit is a copy, and {} is no file",
                    instance.kind
                ),
                _ => "an incremental stream needs an ironpool target".to_string(),
            };
            return self.not_run(test, Outcome::Skipped { reason });
        }
        self.observed(
            instance,
            (test, ops.name(), planned),
            &mut result,
            target,
            |runner, instance, target| match file {
                Some(file) => copy_file(&file),
                None => runner.send_streams(instance, ops, slug, target),
            },
            |result, (bytes, seconds, commands)| {
                // One line of the shell: `send ... | receive ...`.
                result.command = commands.join(&"|".to_string());
                result.wall_seconds = seconds;
                let nanoseconds = (seconds * 1e9) as u64;
                result.read = Some(crate::fio_json::DirectionSummary {
                    iops: if seconds > 0.0 { 1.0 / seconds } else { 0.0 },
                    bandwidth_bytes_per_second: if seconds > 0.0 {
                        bytes as f64 / seconds
                    } else {
                        0.0
                    },
                    io_bytes: bytes,
                    ops: 1,
                    latency: crate::fio_json::LatencySummary {
                        min_ns: nanoseconds,
                        mean_ns: nanoseconds as f64,
                        p50_ns: nanoseconds,
                        p95_ns: nanoseconds,
                        p99_ns: nanoseconds,
                        p99_9_ns: nanoseconds,
                        max_ns: nanoseconds,
                        samples: 1,
                    },
                });
                format!(
                    "{} in {seconds:.2} s, {}",
                    bytes_human(bytes as f64),
                    rate_human(result.total_bandwidth())
                )
            },
        );
        result
    }

    /// The streams of the send suite on an ironpool target: `send-receive`
    /// snapshots the dataset and receives it whole into a copy;
    /// `send-incremental` rewrites one record in
    /// [`suites::SEND_CHANGE_EVERY_RECORDS`], snapshots again, receives
    /// the difference onto the copy and destroys the copy. Returns the
    /// stream's bytes, its seconds and the commands.
    fn send_streams(
        &mut self,
        instance: &mut Instance,
        ops: suites::OpsTest,
        slug: &str,
        target: &mut TargetResult,
    ) -> Result<(u64, f64, Vec<Vec<String>>)> {
        let (first, second, copy) = (
            suites::SEND_FIRST_NAME,
            suites::SEND_SECOND_NAME,
            suites::SEND_COPY_NAME,
        );
        let pool = instance.pool.as_ref().context("not an ironpool target")?;
        if ops == suites::OpsTest::SendReceive {
            // The copy takes the working set's space again (and a volume's
            // copy its reservation): refused with the reason, not failed
            // half way with ENOSPC.
            let free = pool.settled_space()?.free_bytes;
            let needed = instance.size_bytes + instance.size_bytes / SEND_COPY_MARGIN_DIVISOR;
            if free < needed {
                anyhow::bail!(
                    "the pool has {} free and its copy of the working set needs about {}: use larger images (e.g. :2x4G) or a smaller --size",
                    bytes_human(free as f64),
                    bytes_human(needed as f64)
                );
            }
            target.setup_commands.push(pool.snapshot(first)?);
            return pool.send_receive(None, first, copy);
        }
        if !target
            .tests
            .iter()
            .any(|t| t.is_ok() && t.workload.ops == Some(suites::OpsTest::SendReceive))
        {
            anyhow::bail!(
                "send-incremental updates the copy send-receive made, which failed or did not run"
            );
        }
        let record = instance
            .record_size_bytes
            .unwrap_or(pool.volblocksize_bytes)
            .max(4096);
        let change = fio_runner::change_command(
            &self.fio,
            &instance.access,
            instance.size_bytes,
            record,
            suites::SEND_CHANGE_EVERY_RECORDS,
        );
        let output = self.output_path(slug, "send-change")?;
        let run = fio_runner::run(
            &change,
            &output,
            fio_runner::prefill_timeout(instance.size_bytes),
            &mut self.progress,
        )?;
        run.report()
            .map_err(|e| anyhow::anyhow!("rewriting 1% of the working set failed: {e}"))?;
        target.setup_commands.push(change);
        target.setup_commands.push(pool.snapshot(second)?);
        let streamed = pool.send_receive(Some(first), second, copy)?;
        target.setup_commands.push(pool.destroy(copy)?);
        // The incremental stream beside the full one, in the notes.
        let full = target
            .tests
            .iter()
            .find(|t| t.workload.ops == Some(suites::OpsTest::SendReceive))
            .and_then(|t| t.read);
        if let Some(full) = full.filter(|f| f.io_bytes > 0 && f.latency.mean_ns > 0.0) {
            target.notes.push(format!(
                "send-incremental after 1% of the records changed: {} of stream ({:.1}% of the full stream's {}), {:.2} s ({:.1}% of the full one's)",
                bytes_human(streamed.0 as f64),
                100.0 * streamed.0 as f64 / full.io_bytes as f64,
                bytes_human(full.io_bytes as f64),
                streamed.1,
                100.0 * streamed.1 * 1e9 / full.latency.mean_ns,
            ));
        }
        Ok(streamed)
    }
}

impl Runner<'_> {
    /// Runs `files-tar` or `send-files` (see [`suites::OpsTest`]) in
    /// files per second: on an ironpool filesystem target the files live
    /// in a filesystem of their own, which `send-files` sends and then
    /// destroys with its copy; on another filesystem `files-tar` copies
    /// them within it (the limit of the first), and `send-files` is
    /// skipped.
    fn run_small_files_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        ops: suites::OpsTest,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let planned = self.planned_test_seconds();
        let root = match (&instance.access, instance.kind) {
            (Access::File(path), kind) if kind != "raw" && !files::is_block_device(path) => {
                path.parent().map(Path::to_path_buf)
            }
            _ => None,
        };
        let ironpool_fs = instance.kind == "ironpool-fs";
        let skip = match (&root, ops) {
            (None, _) => Some(format!(
                "copying files needs a directory of a filesystem, not {}",
                instance.kind
            )),
            (Some(_), suites::OpsTest::SendFiles) if !ironpool_fs => Some(format!(
                "a stream needs an ironpool-fs target, not {}",
                instance.kind
            )),
            _ => None,
        };
        let (Some(root), None) = (root, skip.clone()) else {
            let reason = skip.unwrap_or_default();
            return self.not_run(test, Outcome::Skipped { reason });
        };
        let files = self.plan.files;
        let run = |runner: &mut Self, instance: &mut Instance, target: &mut TargetResult| {
            let progress = &mut runner.progress;
            match ops {
                suites::OpsTest::FilesTar => (|| {
                    let source = match instance.pool.as_ref().filter(|_| ironpool_fs) {
                        Some(pool) => {
                            let (mountpoint, command) = pool.create_filesystem(
                                suites::SEND_FILES_FS_NAME,
                                &[("atime", "off")],
                            )?;
                            target.setup_commands.push(command);
                            mountpoint
                        }
                        None => root.join("ironpool-bench-tar-source"),
                    };
                    crate::ops::make_small_files(&source, files, &mut || progress.tick())?;
                    let copy = root.join("ironpool-bench-tar-copy");
                    let (seconds, argv) = crate::ops::tar_copy(&source, &copy)?;
                    std::fs::remove_dir_all(&copy)
                        .with_context(|| format!("removing {}", copy.display()))?;
                    if !ironpool_fs {
                        std::fs::remove_dir_all(&source)
                            .with_context(|| format!("removing {}", source.display()))?;
                    }
                    Ok::<_, anyhow::Error>((seconds, vec![argv]))
                })(),
                _ => (|| {
                    if !target
                        .tests
                        .iter()
                        .any(|t| t.is_ok() && t.workload.ops == Some(suites::OpsTest::FilesTar))
                    {
                        anyhow::bail!("send-files sends the files files-tar made, which failed or did not run");
                    }
                    let pool = instance.pool.as_ref().context("not an ironpool target")?;
                    let dataset = format!(
                        "{}/{}",
                        crate::target::ironpool::POOL_NAME,
                        suites::SEND_FILES_FS_NAME
                    );
                    target
                        .setup_commands
                        .push(pool.snapshot_of(&dataset, suites::SEND_FIRST_NAME)?);
                    let (bytes, seconds, commands) = pool.send_receive_of(
                        &dataset,
                        true,
                        None,
                        suites::SEND_FIRST_NAME,
                        suites::SEND_FILES_COPY_NAME,
                    )?;
                    target.notes.push(format!(
                        "send-files: a stream of {} for {files} files of {} KiB",
                        bytes_human(bytes as f64),
                        suites::SEND_FILES_BYTES / 1024
                    ));
                    for name in [suites::SEND_FILES_COPY_NAME, suites::SEND_FILES_FS_NAME] {
                        target.setup_commands.push(pool.destroy(name)?);
                    }
                    Ok((seconds, vec![commands.join(&"|".to_string())]))
                })(),
            }
        };
        self.observed(
            instance,
            (test, ops.name(), planned),
            &mut result,
            target,
            run,
            |result, (seconds, commands)| {
                result.command = commands.into_iter().next().unwrap_or_default();
                let run = crate::ops::OpsRun {
                    operations: files,
                    seconds,
                };
                result.wall_seconds = seconds;
                result.ops_per_second = Some(run.rate());
                format!(
                    "{files} files in {seconds:.2} s, {}/s",
                    count_human(run.rate())
                )
            },
        );
        result
    }
}

impl Runner<'_> {
    /// Runs `idle`: nothing for [`suites::IDLE_SECONDS`], observed as any
    /// test, so that the row holds the server's CPU with no client (on a
    /// target with a server of ours).
    fn run_idle_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        target: &mut TargetResult,
    ) -> TestResult {
        let mut result = TestResult::pending(test.suite, test.workload, test.fill_percent);
        let seconds = suites::IDLE_SECONDS;
        if instance.server.is_none() {
            let reason = format!("{} has no server of ours to watch", instance.kind);
            return self.not_run(test, Outcome::Skipped { reason });
        }
        result.command = vec!["sleep".to_string(), seconds.to_string()];
        self.observed(
            instance,
            (test, "idle", seconds as f64),
            &mut result,
            target,
            |runner, _, _| {
                let start = std::time::Instant::now();
                while start.elapsed() < std::time::Duration::from_secs(seconds) {
                    if interrupt::requested() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    runner.progress.tick();
                }
                Ok(start.elapsed().as_secs_f64())
            },
            |result, elapsed| {
                result.wall_seconds = elapsed;
                format!("{elapsed:.1} s with no client")
            },
        );
        // Its figure is the server's CPU, which only the observation gives.
        if result.is_ok() {
            match result.server {
                Some(usage) => self.progress.log(&format!(
                    "{} {} idle: the server used {:.3} cores",
                    instance.label,
                    test.suite.name(),
                    usage.cores_used
                )),
                None => {
                    result.outcome = Outcome::Failed {
                        error: "no server CPU figures".to_string(),
                    };
                }
            }
        }
        result
    }
}

/// An administrative action of the stall suite, ready to run on a thread
/// of its own while the probe runs.
enum StallAction {
    /// stall-none.
    Nothing,
    /// An ironpool command (its stdout discarded: a send's stream).
    Command(Vec<String>, Vec<(String, PathBuf)>),
    /// `rm` of the working set's file.
    Remove(PathBuf),
    /// `rm -rf` of a directory.
    RemoveTree(PathBuf),
    /// `truncate -s 0` of a file.
    Truncate(PathBuf),
}

impl StallAction {
    /// Runs the action; its command line for the report.
    fn run(&self) -> Result<String> {
        match self {
            StallAction::Nothing => Ok(String::new()),
            StallAction::Command(argv, env) => {
                let output = std::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_path())))
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .output()
                    .with_context(|| format!("starting {}", argv.join(" ")))?;
                if !output.status.success() {
                    anyhow::bail!(
                        "{} exited with {}: {}",
                        argv.join(" "),
                        output.status,
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                }
                Ok(crate::report::shell_words(argv))
            }
            StallAction::Remove(path) => {
                std::fs::remove_file(path)
                    .with_context(|| format!("removing {}", path.display()))?;
                Ok(format!("rm {}", path.display()))
            }
            StallAction::Truncate(path) => {
                std::fs::File::options()
                    .write(true)
                    .open(path)
                    .and_then(|file| file.set_len(0))
                    .with_context(|| format!("truncating {}", path.display()))?;
                Ok(format!("truncate -s 0 {}", path.display()))
            }
            StallAction::RemoveTree(path) => {
                std::fs::remove_dir_all(path)
                    .with_context(|| format!("removing {}", path.display()))?;
                Ok(format!("rm -rf {}", path.display()))
            }
        }
    }
}

impl Runner<'_> {
    /// Runs a probe of the stall suite: the probe dataset made once per
    /// target (a volume beside a volume, a file in a filesystem of its own
    /// beside a filesystem), the action prepared (not measured), then fio's
    /// QD1 reads of the probe for the runtime (at least
    /// [`suites::STALL_PROBE_MIN_SECONDS`]) with the action started a
    /// quarter of the way in, on a thread of its own.
    fn run_stall_test(
        &mut self,
        instance: &mut Instance,
        test: &TestSpec,
        ops: suites::OpsTest,
        slug: &str,
        target: &mut TargetResult,
    ) -> TestResult {
        if instance.pool.is_none() {
            let reason = format!(
                "an action on a pool needs an ironpool target, not {}",
                instance.kind
            );
            return self.not_run(test, Outcome::Skipped { reason });
        }
        let filesystem = instance.pool.as_ref().is_some_and(|p| p.is_filesystem());
        let needs_files = match ops {
            suites::OpsTest::StallRemoveTree => Some("rm -rf"),
            suites::OpsTest::StallTruncate => Some("truncate"),
            suites::OpsTest::StallRemove => Some("rm"),
            _ => None,
        };
        if let Some(command) = needs_files.filter(|_| !filesystem) {
            let reason = format!(
                "{command} needs a filesystem: a volume has no files (stall-destroy destroys it)"
            );
            return self.not_run(test, Outcome::Skipped { reason });
        }
        // The action meets its metadata on the devices, as on a pool
        // imported afresh; the probe is read back into the cache so that
        // it measures the engine, not the disk.
        let prepared = self.stall_probe(instance, slug, target).and_then(|probe| {
            let action = self.prepare_stall(instance, ops, slug, target)?;
            instance.drop_cache()?;
            self.warm_access(
                &probe,
                suites::STALL_PROBE_BYTES,
                slug,
                "stall-probe",
                target,
            )?;
            Ok((probe, action))
        });
        let (probe, action) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => return self.not_run(test, failed(&error)),
        };
        let probe_seconds = self
            .plan
            .runtime_seconds
            .max(suites::STALL_PROBE_MIN_SECONDS);
        let delay = std::time::Duration::from_secs_f64(
            probe_seconds as f64 / suites::STALL_ACTION_AT_DIVISOR as f64,
        );
        let acting = std::thread::spawn(move || {
            std::thread::sleep(delay);
            let start = std::time::Instant::now();
            let outcome = action.run();
            (outcome, start.elapsed().as_secs_f64())
        });
        let runtime = self.fio.runtime_seconds;
        self.fio.runtime_seconds = probe_seconds;
        let mut result = self.run_fio_test(instance, &probe, test, false, slug, target);
        self.fio.runtime_seconds = runtime;
        let longest = |test: &TestResult| test.read.map(|r| latency_human(r.latency.max_ns as f64));
        let none = target
            .tests
            .iter()
            .find(|t| t.is_ok() && t.workload.ops == Some(suites::OpsTest::StallNone))
            .and_then(longest)
            .map(|none| format!(" (stall-none: {none})"))
            .unwrap_or_default();
        match acting.join() {
            Ok((Ok(line), seconds)) => {
                let action = if line.is_empty() {
                    "no action".to_string()
                } else {
                    format!("`{line}` took {seconds:.3} s")
                };
                if let Some(longest) = longest(&result) {
                    target.notes.push(format!(
                        "{}: {action}; the probe's longest read took {longest}{none}",
                        test.name()
                    ));
                }
            }
            Ok((Err(error), _)) => {
                result.outcome = Outcome::Failed {
                    error: format!("the action failed: {error:#}"),
                };
            }
            Err(_) => {
                result.outcome = Outcome::Failed {
                    error: "the action's thread panicked".to_string(),
                };
            }
        }
        if let Some(finding) = stall_finding(target, &result) {
            target.pitfalls.push(finding);
        }
        result
    }

    /// The probe's access, made the first time: a 64 MiB volume (or a file
    /// in a filesystem `POOL/probe`) beside the working set, written once.
    fn stall_probe(
        &mut self,
        instance: &mut Instance,
        slug: &str,
        target: &mut TargetResult,
    ) -> Result<Access> {
        if let Some(probe) = &instance.stall_probe {
            return Ok(probe.clone());
        }
        let pool = instance.pool.as_ref().context("not an ironpool target")?;
        let (access, command) = if pool.is_filesystem() {
            let (mountpoint, command) =
                pool.create_filesystem("probe", &[("recordsize", "16K")])?;
            let file = mountpoint.join("probe.dat");
            files::create_sparse(&file, suites::STALL_PROBE_BYTES)?;
            (Access::File(file), command)
        } else {
            pool.create_side_volume("probe", suites::STALL_PROBE_BYTES)?
        };
        target.setup_commands.push(command);
        self.prefill(&access, suites::STALL_PROBE_BYTES, "stall-probe", slug)?;
        instance.stall_probe = Some(access.clone());
        Ok(access)
    }

    /// What an action needs before its probe (a snapshot to send; a
    /// snapshot whose blocks the working set then no longer shares, and a
    /// commit), and the action itself.
    fn prepare_stall(
        &mut self,
        instance: &mut Instance,
        ops: suites::OpsTest,
        slug: &str,
        target: &mut TargetResult,
    ) -> Result<StallAction> {
        let pool = instance.pool.as_ref().context("not an ironpool target")?;
        let dataset = pool.dataset().to_string();
        let command = |subcommand: &str, args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let (argv, env) = pool.command(subcommand, &args);
            StallAction::Command(argv, env)
        };
        Ok(match ops {
            suites::OpsTest::StallList => {
                command("list", &["-t", "all", crate::target::ironpool::POOL_NAME])
            }
            suites::OpsTest::StallScrub => command("scrub", &[crate::target::ironpool::POOL_NAME]),
            suites::OpsTest::StallSend => {
                target.setup_commands.push(pool.snapshot("stall-send")?);
                command("send", &[&format!("{dataset}@stall-send")])
            }
            suites::OpsTest::StallDestroySnapshot => {
                target.setup_commands.push(pool.snapshot("stall-old")?);
                let sync = pool.sync()?;
                // Written again: the snapshot alone holds the old blocks.
                let access = instance.access.clone();
                let size = instance.size_bytes;
                self.prefill(&access, size, "stall-rewrite", slug)?;
                let pool = instance.pool.as_ref().context("not an ironpool target")?;
                target.setup_commands.push(sync);
                target.setup_commands.push(pool.sync()?);
                let (argv, env) = pool.command("destroy", &[format!("{dataset}@stall-old")]);
                StallAction::Command(argv, env)
            }
            suites::OpsTest::StallRollback => {
                target.setup_commands.push(pool.snapshot("stall-rollback")?);
                let access = instance.access.clone();
                let size = instance.size_bytes;
                self.prefill(&access, size, "stall-rewrite-2", slug)?;
                let pool = instance.pool.as_ref().context("not an ironpool target")?;
                target.setup_commands.push(pool.sync()?);
                let (argv, env) = pool.command("rollback", &[format!("{dataset}@stall-rollback")]);
                StallAction::Command(argv, env)
            }
            suites::OpsTest::StallRemoveTree => {
                let dir = match &instance.access {
                    Access::File(path) if pool.is_filesystem() => path
                        .parent()
                        .context("the working set has no directory")?
                        .join("ironpool-bench-stall-tree"),
                    _ => anyhow::bail!("rm -rf needs a filesystem: a volume has no tree of files"),
                };
                let files = self.plan.files;
                let progress = &mut self.progress;
                crate::ops::create_empty_files(&dir, files, &mut || progress.tick())?;
                StallAction::RemoveTree(dir)
            }
            suites::OpsTest::StallTruncate => {
                let path = self.rewrite_working_set(instance, "stall-rewrite-3", slug)?;
                StallAction::Truncate(path)
            }
            suites::OpsTest::StallRemove => {
                let path = self.rewrite_working_set(instance, "stall-rewrite-4", slug)?;
                StallAction::Remove(path)
            }
            suites::OpsTest::StallDestroy => {
                if pool.is_filesystem() {
                    self.rewrite_working_set(instance, "stall-rewrite-5", slug)?;
                }
                let pool = instance.pool.as_ref().context("not an ironpool target")?;
                let (argv, env) = pool.command("destroy", &["-r".to_string(), dataset]);
                StallAction::Command(argv, env)
            }
            _ => StallAction::Nothing,
        })
    }
}

impl Runner<'_> {
    /// The frame of a test that is not fio's: its progress step begun
    /// (`what`: the test, its name in the step, the planned seconds), the
    /// target observed before and after `run`, then, when it succeeded,
    /// `record` fills the result in from what it returned (before the
    /// observations are compared: the server's CPU per operation needs the
    /// operations) and gives the step's closing line; a failure fails the
    /// test.
    fn observed<T>(
        &mut self,
        instance: &mut Instance,
        (test, name, planned): (&TestSpec, &str, f64),
        result: &mut TestResult,
        target: &mut TargetResult,
        run: impl FnOnce(&mut Self, &mut Instance, &mut TargetResult) -> Result<T>,
        record: impl FnOnce(&mut TestResult, T) -> String,
    ) {
        self.progress.begin(
            &format!("{} {} {name}", instance.label, test.suite.name()),
            planned,
        );
        let before = observe::snapshot(instance, &self.args.zfs_kstat_dir, &mut target.notes);
        let run = run(self, instance, target);
        let after = observe::snapshot(instance, &self.args.zfs_kstat_dir, &mut target.notes);
        self.interrupted |= interrupt::requested();
        match run {
            Ok(value) => {
                let line = record(result, value);
                target
                    .pitfalls
                    .extend(observe::compare(instance, &before, &after, result));
                self.progress.end(&line);
            }
            Err(error) => {
                result.outcome = failed(&error);
                self.progress.end("failed");
            }
        }
    }

    /// Writes a filesystem target's working-set file afresh (the blocks a
    /// truncate or `rm` then frees are its own, none shared with a
    /// snapshot) and commits it; returns its path.
    fn rewrite_working_set(
        &mut self,
        instance: &Instance,
        name: &str,
        slug: &str,
    ) -> Result<PathBuf> {
        let path = match &instance.access {
            Access::File(path) => path.clone(),
            _ => anyhow::bail!("the working set is not a file"),
        };
        // Cut to nothing first: a rewrite in place would leave the old
        // blocks to the snapshots that hold them, and the new ones shared
        // with none.
        std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("emptying {}", path.display()))?;
        self.prefill(&instance.access, instance.size_bytes, name, slug)?;
        let pool = instance.pool.as_ref().context("not an ironpool target")?;
        pool.sync()?;
        Ok(path)
    }

    /// Reads `size_bytes` of `access` once through the target's cache (as
    /// [`Runner::warm`] does the working set); the command joins the
    /// target's set-up commands.
    fn warm_access(
        &mut self,
        access: &Access,
        size_bytes: u64,
        slug: &str,
        name: &str,
        target: &mut TargetResult,
    ) -> Result<()> {
        let argv = fio_runner::warm_command(&self.fio, access, size_bytes);
        let output = self.output_path(slug, &format!("warm-{name}"))?;
        let run = fio_runner::run(
            &argv,
            &output,
            fio_runner::prefill_timeout(size_bytes),
            &mut self.progress,
        )?;
        run.report()
            .map_err(|e| anyhow::anyhow!("warming the cache ({name}) failed: {e}"))?;
        if !target.setup_commands.contains(&argv) {
            target.setup_commands.push(argv);
        }
        Ok(())
    }
}

/// A warning when a probe's longest read is [`suites::STALL_WARN_RATIO`]
/// times stall-none's on the same target: the action held the pool's other
/// clients.
fn stall_finding(target: &TargetResult, test: &TestResult) -> Option<Finding> {
    if test.workload.ops == Some(suites::OpsTest::StallNone) || !test.is_ok() {
        return None;
    }
    let none = target
        .tests
        .iter()
        .find(|t| t.is_ok() && t.workload.ops == Some(suites::OpsTest::StallNone))?;
    let longest = test.read?.latency.max_ns;
    let baseline = none.read?.latency.max_ns;
    if baseline == 0 || (longest as f64) < suites::STALL_WARN_RATIO * baseline as f64 {
        return None;
    }
    Some(Finding::new(
        crate::results::Severity::Warning,
        "stall",
        &target.label,
        Some(&test.label()),
        format!(
            "{} held the pool's other clients: the probe's longest read took {} ({:.0}x its longest with no action, {})",
            test.name,
            latency_human(longest as f64),
            longest as f64 / baseline as f64,
            latency_human(baseline as f64)
        ),
    ))
}

/// The send suite's limit on a file target: `dd` copies the working set
/// into a second file beside it (O_DIRECT both ways, 1 MiB, synced at the
/// end), which is then removed: the disk reading and writing the same
/// bytes once, as `send | receive` within one pool must.
fn copy_file(file: &Path) -> Result<(u64, f64, Vec<Vec<String>>)> {
    let copy = file.with_extension("send-copy");
    let argv: Vec<String> = vec![
        "dd".into(),
        format!("if={}", file.display()),
        format!("of={}", copy.display()),
        "bs=1M".into(),
        "iflag=direct".into(),
        "oflag=direct".into(),
        "conv=fsync".into(),
        "status=none".into(),
    ];
    let size = std::fs::metadata(file)
        .with_context(|| format!("reading the size of {}", file.display()))?
        .len();
    let start = std::time::Instant::now();
    // Read and written: twice a prefill's bytes.
    let copied = target::process::run_command(&argv, fio_runner::prefill_timeout(2 * size));
    let seconds = start.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&copy).map(|m| m.len());
    let removed = std::fs::remove_file(&copy);
    copied.with_context(|| format!("copying {}", file.display()))?;
    let bytes = bytes.with_context(|| format!("reading the size of {}", copy.display()))?;
    removed.with_context(|| format!("removing {}", copy.display()))?;
    Ok((bytes, seconds, vec![argv]))
}

/// A test's failure with an error's whole chain of causes.
fn failed(error: &anyhow::Error) -> Outcome {
    Outcome::Failed {
        error: format!("{error:#}"),
    }
}

/// `15.3k IOPS, 239 MiB/s, p99 122 us`.
fn summary_line(result: &TestResult) -> String {
    let p99 = result
        .p99_ns()
        .map(|p| format!(", p99 {}", latency_human(p as f64)))
        .unwrap_or_default();
    format!(
        "{} IOPS, {}{p99}",
        count_human(result.total_iops()),
        rate_human(result.total_bandwidth())
    )
}
