//! Helpers shared by the tests that run fio for real.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::Parser;
use ironpool_bench::results::{Outcome, Results};
use ironpool_bench::{charts, fio_json, BenchArgs, REPORT_FILE, RESULTS_FILE};

/// Real runs share 2 cores: one at a time.
pub static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// Parses `ironpool bench` arguments.
pub fn bench_args(args: &[&str]) -> BenchArgs {
    Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("bad test arguments: {e}"))
        .bench
}

/// Runs `ironpool bench` with `args` (whose `--out` is `out`); on failure
/// panics with what a reader needs first, since a CI log keeps only part of
/// the output: each failed target's and test's error, then the last lines
/// of every server log under `out`.
pub fn run_bench(args: BenchArgs, ironpool: &Path, out: &Path) {
    let Err(error) = ironpool_bench::run(args, ironpool) else {
        return;
    };
    let mut why = format!("ironpool bench failed: {error:#}\n");
    if let Ok(results) = Results::load(&out.join(RESULTS_FILE)) {
        for target in &results.targets {
            if let Some(error) = &target.error {
                why.push_str(&format!("target {}: {error}\n", target.label));
            }
            for test in &target.tests {
                if let Outcome::Failed { .. } = test.outcome {
                    why.push_str(&format!(
                        "test {} {}: {:?}\n",
                        target.label,
                        test.label(),
                        test.outcome
                    ));
                }
            }
        }
    }
    let mut logs = Vec::new();
    collect_named(out, "serve.log", &mut logs);
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(SERVER_LOG_TAIL_LINES)..];
        why.push_str(&format!(
            "{} (last lines):\n{}\n",
            log.display(),
            tail.join("\n")
        ));
    }
    panic!("{why}");
}

/// Lines of each server log a failed run prints: enough for the error that
/// stopped it and what came just before.
const SERVER_LOG_TAIL_LINES: usize = 30;

/// Every file named `name` under `dir`, at any depth.
fn collect_named(dir: &Path, name: &str, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_named(&path, name, found);
        } else if path.file_name().is_some_and(|n| n == name) {
            found.push(path);
        }
    }
}

/// A fresh scratch directory under Cargo's per-target tmp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Fails loudly when a tool the real runs need is missing.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: apt-get install {package} (see bench/README.md)"
    );
}

/// Checks that report.md, results.json, the fio outputs and the charts of a
/// run in `out` exist and agree with each other; returns the results.
pub fn check_outputs(out: &Path) -> Results {
    let results = Results::load(&out.join(RESULTS_FILE)).expect("results.json loads");
    let report = std::fs::read_to_string(out.join(REPORT_FILE)).expect("report.md exists");
    assert!(report.starts_with("# ironpool bench report"));
    assert!(!results.machine.fio_version.is_empty() && !results.machine.kernel.is_empty());

    for target in &results.targets {
        assert!(
            report.contains(&format!("### `{}`", target.label)),
            "report lacks {}",
            target.label
        );
        assert!(
            target.error.is_none(),
            "{}: {:?}",
            target.label,
            target.error
        );
        assert!(
            !target.prefills.is_empty(),
            "{} was not prefilled",
            target.label
        );
        for test in &target.tests {
            let row = format!("| {} | {} |", test.suite.name(), test.label());
            assert!(report.contains(&row), "summary lacks {row}");
            if let Outcome::Failed { error } = &test.outcome {
                panic!("{} {} failed: {error}", target.label, test.label());
            }
            if !test.is_ok() {
                continue;
            }
            if test.workload.ops == Some(ironpool_bench::suites::OpsTest::Idle) {
                // Nothing done: the server's CPU is the figure.
                assert!(test.server.is_some(), "idle without server figures");
                assert!(
                    test.read.is_none() && test.write.is_none() && test.ops_per_second.is_none()
                );
                continue;
            }
            if let Some(ops) = test.workload.ops.filter(|ops| ops.of_send()) {
                // A stream (or the copy that is its limit): no fio, one
                // operation that read the stream's bytes.
                let read = test
                    .read
                    .unwrap_or_else(|| panic!("{}: no figures", test.label()));
                assert!(
                    read.io_bytes > 0 && read.ops == 1 && read.bandwidth_bytes_per_second > 0.0,
                    "{}: {ops:?} moved nothing: {read:?}",
                    test.label()
                );
                assert!(test.fio_output.is_none() && test.ops_per_second.is_none());
                continue;
            }
            if let Some(ops) = test.workload.ops.filter(|ops| !ops.of_stall()) {
                // A test of system calls: no fio, a rate and its count.
                assert!(
                    test.ops_per_second.is_some_and(|r| r > 0.0) && test.operations() > 0,
                    "{}: {:?} did nothing",
                    test.label(),
                    ops
                );
                assert!(test.fio_output.is_none() && test.read.is_none() && test.write.is_none());
                continue;
            }
            assert!(
                test.command.first().is_some_and(|c| c.ends_with("fio")),
                "{:?}",
                test.command
            );
            // The figures in results.json are those of fio's own output: its
            // one job, or the slower of a pair's two.
            let fio_path = out.join(test.fio_output.as_ref().expect("fio output recorded"));
            let output = fio_json::parse(&std::fs::read_to_string(&fio_path).unwrap()).unwrap();
            let job = output.report.slowest_job().expect("a job");
            assert_eq!(
                test.read,
                job.read.summary(),
                "{}: read figures",
                test.label()
            );
            assert_eq!(
                test.write,
                job.write.summary(),
                "{}: write figures",
                test.label()
            );
            assert!(test.total_iops() > 0.0, "{} did no I/O", test.label());
            if test.workload.pattern.reads() {
                assert!(
                    test.read.is_some_and(|r| r.latency.p99_ns > 0),
                    "{}: no read p99",
                    test.label()
                );
            }
        }
    }

    let planned = charts::plan(&results);
    assert!(!planned.is_empty(), "no charts planned");
    for chart in &planned {
        assert!(
            report.contains(&format!("]({})", chart.file_name)),
            "report does not link {}",
            chart.file_name
        );
        let file = std::fs::File::open(out.join(&chart.file_name))
            .unwrap_or_else(|e| panic!("{}: {e}", chart.file_name));
        let decoder = png::Decoder::new(std::io::BufReader::new(file));
        let reader = decoder.read_info().expect("a valid PNG");
        let info = reader.info();
        assert!(
            info.width >= 400 && info.height >= 300,
            "{} is {}x{}",
            chart.file_name,
            info.width,
            info.height
        );
    }

    // The report is a function of results.json alone.
    let again = out.join("rerendered");
    std::fs::create_dir_all(&again).unwrap();
    ironpool_bench::write_outputs(&results, &again, false).unwrap();
    assert_eq!(
        std::fs::read_to_string(again.join(REPORT_FILE)).unwrap(),
        report
    );
    results
}
