//! `ironpool bench`: the storage benchmark report.
//!
//! Runs fio suites (BENCHMARKS.md, "The suites") against ironpool volumes it
//! creates, any NBD export, files and directories on any filesystem, raw
//! files and block devices, and nbdkit as the transport baseline; always
//! beside a raw-file baseline. It prefills before reading, records server
//! CPU and ironpool's device-side counters, checks the classic pitfalls, and
//! writes `report.md`, `results.json` and PNG charts.
//!
//! The main binary embeds it as a subcommand:
//! ```text
//! Command::Bench(args) => ironpool_bench::run(args, &std::env::current_exe()?)
//! ```
//!
//! Layers, top down: [`run`] → `runner` (targets × suites) → `fio_runner`,
//! `target`, `observe` → `fio_json`, `ironpool_stats`, `zfs_kstat`; and from
//! a [`results::Results`] alone: `analysis`, `report`, `charts`.

pub mod analysis;
pub mod args;
pub mod charts;
pub mod fio_json;
pub mod fio_runner;
pub mod interrupt;
pub mod ironpool_stats;
pub mod machine;
pub mod observe;
pub mod ops;
pub mod pitfalls;
pub mod progress;
pub mod report;
pub mod results;
pub mod runner;
pub mod suites;
pub mod target;
pub mod units;
pub mod zfs_kstat;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub use args::BenchArgs;
use results::{Outcome, Results};

/// Name of the report in the output directory.
pub const REPORT_FILE: &str = "report.md";
/// Name of the results in the output directory.
pub const RESULTS_FILE: &str = "results.json";

/// Runs `ironpool bench`. `ironpool_exe` is the ironpool binary that ironpool
/// targets drive (the caller's own executable), unless `--ironpool-bin` or
/// IRONPOOL_BIN says otherwise.
pub fn run(args: BenchArgs, ironpool_exe: &Path) -> Result<()> {
    if let Some(results_path) = &args.from_results {
        let results = Results::load(results_path)?;
        let dir = results_path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let written = write_outputs(&results, dir, false)?;
        eprintln!(
            "ironpool-bench: re-rendered {} files in {}",
            written.len(),
            dir.display()
        );
        return Ok(());
    }
    let plan = args.plan()?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating output directory {}", args.out.display()))?;
    let out_dir = args
        .out
        .canonicalize()
        .with_context(|| format!("resolving {}", args.out.display()))?;
    let ironpool_exe = args
        .ironpool_bin
        .clone()
        .unwrap_or_else(|| ironpool_exe.to_path_buf());
    let mut results = runner::execute(&plan, &args, &out_dir, &ironpool_exe)?;
    results.findings = analysis::findings(&results);
    write_outputs(&results, &out_dir, true)?;
    eprintln!(
        "ironpool-bench: report in {}",
        out_dir.join(REPORT_FILE).display()
    );
    if results.interrupted {
        bail!(
            "interrupted: the report in {} is partial",
            out_dir.display()
        );
    }
    let failed_targets = results.targets.iter().filter(|t| t.error.is_some()).count();
    let failed_tests = results
        .targets
        .iter()
        .flat_map(|t| t.tests.iter())
        .filter(|t| matches!(t.outcome, Outcome::Failed { .. }))
        .count();
    if failed_targets + failed_tests > 0 {
        bail!(
            "{failed_targets} target(s) and {failed_tests} test(s) failed; see {}",
            out_dir.join(REPORT_FILE).display()
        );
    }
    Ok(())
}

/// Writes report.md and the charts (and results.json when `with_results`)
/// into `dir`; returns the files written.
pub fn write_outputs(results: &Results, dir: &Path, with_results: bool) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if with_results {
        let path = dir.join(RESULTS_FILE);
        results.save(&path)?;
        written.push(path);
    }
    let report_path = dir.join(REPORT_FILE);
    std::fs::write(&report_path, report::render(results))
        .with_context(|| format!("writing {}", report_path.display()))?;
    written.push(report_path);
    written.extend(charts::render_all(results, dir)?);
    Ok(written)
}
