//! report.md, rendered from results alone: the cross-target summary, the
//! findings, the charts, a table per target and suite, and how to
//! reproduce the run.

use crate::analysis;
use crate::charts;
use crate::fio_json::DirectionSummary;
use crate::results::{Finding, Outcome, Results, Severity, TargetResult, TestResult};
use crate::suites::Suite;
use crate::units::{
    bytes_human, count_human, duration_human, latency_human, rate_human, ratio_human, size_short,
    utc_human,
};

/// Appends one formatted line to a String.
macro_rules! emit {
    ($out:expr) => { $out.push('\n') };
    ($out:expr, $($arg:tt)*) => {{ $out.push_str(&format!($($arg)*)); $out.push('\n'); }};
}

/// The whole report.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    header(&mut out, results);
    summary(&mut out, results);
    findings(&mut out, results);
    chart_links(&mut out, results);
    emit!(out, "## Targets");
    emit!(out);
    for target in &results.targets {
        target_section(&mut out, results, target);
    }
    method(&mut out, results);
    out
}

fn header(out: &mut String, results: &Results) {
    let machine = &results.machine;
    let suites: Vec<&str> = results.settings.suites.iter().map(|s| s.name()).collect();
    emit!(out, "# ironpool bench report");
    emit!(out);
    emit!(
        out,
        "Measured {} over {} on {}, Linux {}, {} ({} CPUs), {} memory; {}.",
        utc_human(results.started_unix_seconds),
        duration_human(
            results
                .finished_unix_seconds
                .saturating_sub(results.started_unix_seconds) as f64
        ),
        if machine.os.is_empty() {
            "an unknown OS"
        } else {
            &machine.os
        },
        machine.kernel,
        machine.cpu_model,
        machine.cpu_count,
        bytes_human(machine.memory_bytes as f64),
        machine.fio_version
    );
    emit!(
        out,
        "Suites: {}. Each test runs {} s{} on a {} working set, fio with direct=1 and latency percentiles; \
         every target is written in full before any test reads it.",
        suites.join(", "),
        results.settings.runtime_seconds,
        if results.settings.ramp_seconds > 0 { format!(" after a {} s ramp", results.settings.ramp_seconds) } else { String::new() },
        bytes_human(results.settings.size_bytes as f64)
    );
    emit!(out, "Figures vary from run to run (5-15% on a VM): compare targets within one report, as ratios.");
    emit!(out);
    if results.interrupted {
        emit!(
            out,
            "> **Interrupted**: this report covers only the tests that finished."
        );
        emit!(out);
    }
}

/// Unique (suite, label) rows in first-seen order across targets.
fn rows(results: &Results) -> Vec<(Suite, String)> {
    let mut rows: Vec<(Suite, String)> = Vec::new();
    for test in results.targets.iter().flat_map(|t| t.tests.iter()) {
        let row = (test.suite, test.label());
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    rows
}

fn find<'a>(target: &'a TargetResult, suite: Suite, label: &str) -> Option<&'a TestResult> {
    target
        .tests
        .iter()
        .find(|t| t.suite == suite && t.label() == label)
}

/// `15.3k IOPS`, `3.50 GiB/s` or (system calls) `52.1k/s`, by workload.
fn headline(test: &TestResult) -> String {
    if test.workload.ops == Some(crate::suites::OpsTest::Idle) {
        let cores = test.server.map_or(0.0, |s| s.cores_used);
        return format!("{cores:.3} cores");
    }
    if let Some(rate) = test.ops_per_second {
        return format!("{}/s", count_human(rate));
    }
    if test.workload.pattern.is_sequential() {
        rate_human(test.total_bandwidth())
    } else {
        format!("{} IOPS", count_human(test.total_iops()))
    }
}

fn outcome_word(test: &TestResult) -> Option<&'static str> {
    match test.outcome {
        Outcome::Ok => None,
        Outcome::Failed { .. } => Some("failed"),
        Outcome::Skipped { .. } => Some("skipped"),
    }
}

fn summary(out: &mut String, results: &Results) {
    emit!(out, "## Summary");
    emit!(out);
    let baseline = results.baseline().map(|b| b.label.clone());
    match &baseline {
        Some(label) => {
            let mut limits: Vec<&String> = results
                .targets
                .iter()
                .filter_map(|t| t.limit.as_ref())
                .collect();
            limits.dedup();
            let also = match limits.as_slice() {
                [] => String::new(),
                [limit] => format!(
                    "; a mirror's to `{limit}` (two raw files written at once: its physical limit)"
                ),
                _ => "; a mirror's to its limit (see its table)".to_string(),
            };
            emit!(out, "Random tests in IOPS, sequential tests in bandwidth; in parentheses the ratio to `{label}`{also}.")
        }
        None => emit!(
            out,
            "Random tests in IOPS, sequential tests in bandwidth (no raw baseline in this run)."
        ),
    }
    if let Some(ext4) = results.targets.iter().find(|t| t.kind == "ext4") {
        emit!(
            out,
            "Tests of system calls (`files-*`, `names-*`) in operations per second; they and the \
             buffered writes are held to `{}`, a kernel filesystem on the same disk.",
            ext4.label
        );
    }
    let cached = results
        .targets
        .iter()
        .flat_map(|t| &t.tests)
        .any(|t| t.workload.cached);
    if let Some(memory) = results
        .targets
        .iter()
        .find(|t| t.kind == "nbdkit-memory")
        .filter(|_| cached)
    {
        emit!(
            out,
            "Reads from a cache (`-cached`) are held to `{}`: the same transport with its data \
             in RAM.",
            memory.label
        );
    }
    // Tests held to another test of their own target, each pair once.
    let mut own: Vec<String> = Vec::new();
    for test in results.targets.iter().flat_map(|t| &t.tests) {
        if let Some(reference) = test.workload.own_limit() {
            let pair = format!("`{}` to `{}`", test.name, reference.name());
            if !own.contains(&pair) {
                own.push(pair);
            }
        }
    }
    if !own.is_empty() {
        emit!(
            out,
            "These are held to another test of the same target, not to another target: {}.",
            own.join(", ")
        );
    }
    emit!(out);
    let labels: Vec<String> = results
        .targets
        .iter()
        .map(|t| format!("`{}`", t.label))
        .collect();
    emit!(out, "| suite | test | {} |", labels.join(" | "));
    emit!(out, "|---|---|{}", "---|".repeat(labels.len()));
    for (suite, label) in rows(results) {
        let cells: Vec<String> = results
            .targets
            .iter()
            .map(|target| match find(target, suite, &label) {
                None => "—".to_string(),
                Some(test) => match outcome_word(test) {
                    Some(word) => word.to_string(),
                    None => {
                        let ratio = results
                            .limit_for(target, test)
                            .filter(|b| b.headline() > 0.0)
                            .map(|b| format!(" ({})", ratio_human(test.headline() / b.headline())))
                            .unwrap_or_default();
                        format!("{}{ratio}", headline(test))
                    }
                },
            })
            .collect();
        emit!(
            out,
            "| {} | {} | {} |",
            suite.name(),
            label,
            cells.join(" | ")
        );
    }
    emit!(out);
}

fn findings(out: &mut String, results: &Results) {
    emit!(out, "## Findings");
    emit!(out);
    let computed = analysis::findings(results);
    for target in &results.targets {
        let mine: Vec<&Finding> = target
            .pitfalls
            .iter()
            .chain(
                computed
                    .iter()
                    .filter(|f| f.target.as_deref() == Some(target.label.as_str())),
            )
            .collect();
        if mine.is_empty() {
            continue;
        }
        emit!(out, "### `{}`", target.label);
        emit!(out);
        for finding in mine
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .chain(mine.iter().filter(|f| f.severity == Severity::Info))
        {
            let mark = if finding.severity == Severity::Warning {
                "**warning** "
            } else {
                ""
            };
            emit!(out, "- {mark}{} [{}]", finding.message, finding.check);
        }
        emit!(out);
    }
}

fn chart_links(out: &mut String, results: &Results) {
    let charts = charts::plan(results);
    if charts.is_empty() {
        return;
    }
    emit!(out, "## Charts");
    emit!(out);
    for chart in charts {
        emit!(out, "![{}]({})", chart.title, chart.file_name);
        emit!(out);
    }
}

fn target_section(out: &mut String, results: &Results, target: &TargetResult) {
    emit!(
        out,
        "### `{}`{}",
        target.label,
        if target.baseline { " (baseline)" } else { "" }
    );
    emit!(out);
    if !target.description.is_empty() {
        emit!(out, "{}.", target.description);
        emit!(out);
    }
    let mut facts = vec![format!(
        "working set {}",
        bytes_human(target.size_bytes as f64)
    )];
    if let Some(record) = target.record_size_bytes {
        facts.push(format!("record size {}", size_short(record)));
    }
    if let Some(fs) = &target.filesystem {
        facts.push(format!("filesystem {fs}"));
    }
    for prefill in &target.prefills {
        facts.push(format!(
            "prefill ({}) {} at {}",
            prefill.purpose,
            bytes_human(prefill.bytes as f64),
            rate_human(prefill.bandwidth_bytes_per_second)
        ));
    }
    emit!(out, "{}.", capitalise(&facts.join(", ")));
    emit!(out);
    if let Some(error) = &target.error {
        emit!(out, "**Error:** {error}");
        emit!(out);
    }
    for note in &target.notes {
        emit!(out, "- Note: {note}");
    }
    if !target.notes.is_empty() {
        emit!(out);
    }
    let mut suites: Vec<Suite> = target.tests.iter().map(|t| t.suite).collect();
    suites.dedup();
    for suite in suites {
        let tests: Vec<&TestResult> = target.tests.iter().filter(|t| t.suite == suite).collect();
        emit!(out, "#### {}", suite.name());
        emit!(out);
        suite_table(out, results, target, &tests);
    }
    commands(out, target);
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Which optional columns a table needs.
struct Columns {
    flush: bool,
    server: bool,
    /// Server CPU per operation (results older than the figure lack it).
    cpu_per_op: bool,
    device: bool,
    /// Device syncs per client flush and log bytes per client byte: the
    /// cost of durability, for targets that count their flushes.
    durability: bool,
}

/// Device syncs per client flush, log bytes per client byte and device
/// write bandwidth of one test (`scripts/bench-durable.sh`'s figures).
fn durability_cells(test: &TestResult) -> String {
    let (Some(device), Some(volume)) = (test.device, test.volume) else {
        return " — | — | — |".to_string();
    };
    let client_bytes = test.write.map_or(0, |w| w.io_bytes);
    let per_flush = if volume.flush_ops > 0 {
        let skipped = if device.syncs_skipped > 0 {
            format!(", {} skipped", device.syncs_skipped)
        } else {
            String::new()
        };
        format!(
            "{:.2}{skipped}",
            device.syncs as f64 / volume.flush_ops as f64
        )
    } else {
        "—".to_string()
    };
    let per_byte = if client_bytes > 0 {
        format!("{:.2}", volume.log_bytes as f64 / client_bytes as f64)
    } else {
        "—".to_string()
    };
    let seconds = test.wall_seconds.max(f64::MIN_POSITIVE);
    format!(
        " {per_flush} | {per_byte} | {:.0} |",
        device.write_bytes as f64 / seconds / 1e6
    )
}

fn suite_table(out: &mut String, results: &Results, target: &TargetResult, tests: &[&TestResult]) {
    let columns = Columns {
        flush: tests.iter().any(|t| t.sync.is_some()),
        server: tests.iter().any(|t| t.server.is_some()),
        cpu_per_op: tests
            .iter()
            .any(|t| t.server.is_some_and(|s| s.cpu_us_per_op > 0.0)),
        device: tests.iter().any(|t| t.device.is_some()),
        durability: tests
            .iter()
            .any(|t| t.device.is_some() && t.volume.is_some_and(|v| v.flush_ops > 0)),
    };
    let versus = match &target.limit {
        Some(limit) => format!("vs {limit}"),
        None => "vs raw".to_string(),
    };
    let mut head =
        format!("| test | IOPS | bandwidth | avg lat | p50 | p95 | p99 | total I/O | {versus} |");
    if columns.flush {
        head.push_str(" flush p99 |");
    }
    if columns.server {
        head.push_str(" server CPU s | server cores | IOPS/core |");
    }
    if columns.cpu_per_op {
        head.push_str(" server CPU/op | 1-core ceiling |");
    }
    if columns.device {
        head.push_str(" dev I/O size | dev aggregation | dev QD | dev write amp |");
    }
    if columns.durability {
        head.push_str(" dev syncs/flush | log B/client B | dev write MB/s |");
    }
    emit!(out, "{head}");
    emit!(
        out,
        "|---{}",
        "|---".repeat(head.matches('|').count() - 2) + "|"
    );
    let mut problems = Vec::new();
    for test in tests {
        match &test.outcome {
            Outcome::Ok => {}
            Outcome::Failed { error } => problems.push(format!("{} failed: {error}", test.label())),
            Outcome::Skipped { reason } => {
                problems.push(format!("{} skipped: {reason}", test.label()))
            }
        }
        let directions: Vec<(&str, bool, DirectionSummary, Option<DirectionSummary>)> = {
            let base = results.limit_for(target, test);
            let mut list = Vec::new();
            let both = test.read.is_some() && test.write.is_some();
            if let Some(read) = test.read {
                list.push((
                    if both { " (read)" } else { "" },
                    true,
                    read,
                    base.and_then(|b| b.read),
                ));
            }
            if let Some(write) = test.write {
                list.push((
                    if both { " (write)" } else { "" },
                    false,
                    write,
                    base.and_then(|b| b.write),
                ));
            }
            list
        };
        if let (Some(rate), None) = (test.ops_per_second, outcome_word(test)) {
            // A test of system calls: operations per second, the mean time
            // of one, and the ratio to its limit.
            let ratio = results
                .limit_for(target, test)
                .and_then(|b| b.ops_per_second)
                .filter(|b| *b > 0.0)
                .map(|b| ratio_human(rate / b))
                .unwrap_or_else(|| "—".to_string());
            let mean = if rate > 0.0 {
                latency_human(1e9 / rate)
            } else {
                "—".to_string()
            };
            let prefix = format!(
                "| {} | {}/s | — | {mean} | — | — | — | — | {ratio} |",
                test.label(),
                count_human(rate)
            );
            emit!(out, "{}", prefix + &row_tail(&columns, test, false));
            continue;
        }
        if directions.is_empty() {
            let word = outcome_word(test).unwrap_or("no I/O");
            if word == "no I/O" && test.server.is_some() {
                // The server's figures of a test with no I/O (`idle`).
                let prefix = format!("| {} | {word} | — | — | — | — | — | — | — |", test.label());
                emit!(out, "{}", prefix + &row_tail(&columns, test, true));
                continue;
            }
            let blanks = head.matches('|').count() - 3;
            emit!(
                out,
                "| {} | {word} |{}",
                test.label(),
                " — |".repeat(blanks)
            );
            continue;
        }
        for (suffix, is_read, figures, base) in directions {
            let ratio = base
                .map(|b| {
                    if test.workload.pattern.is_sequential() {
                        (
                            figures.bandwidth_bytes_per_second,
                            b.bandwidth_bytes_per_second,
                        )
                    } else {
                        (figures.iops, b.iops)
                    }
                })
                .filter(|(_, b)| *b > 0.0)
                .map(|(value, b)| ratio_human(value / b))
                .unwrap_or_else(|| "—".to_string());
            let latency = figures.latency;
            let mut row = format!(
                "| {}{suffix} | {} | {} | {} | {} | {} | {} | {} | {ratio} |",
                test.label(),
                count_human(figures.iops),
                rate_human(figures.bandwidth_bytes_per_second),
                latency_human(latency.mean_ns),
                latency_human(latency.p50_ns as f64),
                latency_human(latency.p95_ns as f64),
                latency_human(latency.p99_ns as f64),
                bytes_human(figures.io_bytes as f64)
            );
            row.push_str(&row_tail(&columns, test, is_read));
            emit!(out, "{row}");
        }
    }
    emit!(out);
    for problem in problems {
        emit!(out, "- {problem}");
    }
    if tests.iter().any(|t| !t.is_ok()) {
        emit!(out);
    }
}

/// The cells after the ratio: flush, server, CPU per operation, device and
/// durability columns, as far as the table has them.
fn row_tail(columns: &Columns, test: &TestResult, is_read: bool) -> String {
    let mut row = String::new();
    if columns.flush {
        let flush = test
            .sync
            .map(|s| latency_human(s.p99_ns as f64))
            .unwrap_or_else(|| "—".to_string());
        row.push_str(&format!(" {flush} |"));
    }
    if columns.server {
        match test.server {
            Some(s) => row.push_str(&format!(
                " {:.2} | {:.2} | {} |",
                s.cpu_seconds,
                s.cores_used,
                count_human(s.iops_per_core)
            )),
            None => row.push_str(" — | — | — |"),
        }
    }
    if columns.cpu_per_op {
        match test.server.filter(|s| s.cpu_us_per_op > 0.0) {
            Some(s) => row.push_str(&format!(
                " {} | {} IOPS |",
                latency_human(s.cpu_us_per_op * 1e3),
                count_human(1e6 / s.cpu_us_per_op)
            )),
            None => row.push_str(" — | — |"),
        }
    }
    if columns.device {
        match test.device {
            Some(d) => {
                // The device side of this row's direction.
                let (size, aggregation) = if is_read {
                    (d.average_read_size_bytes, d.read_aggregation)
                } else {
                    (d.average_write_size_bytes, d.write_aggregation)
                };
                // Device bytes written per byte the client wrote (copies,
                // parity, padding, metadata): only for a row that wrote.
                let amplification = if is_read || d.write_amplification <= 0.0 {
                    "—".to_string()
                } else {
                    format!("{:.2}x", d.write_amplification)
                };
                row.push_str(&format!(
                    " {} | {:.1}x | {:.1} | {amplification} |",
                    bytes_human(size),
                    aggregation,
                    d.average_queue_depth
                ))
            }
            None => row.push_str(" — | — | — | — |"),
        }
    }
    if columns.durability {
        row.push_str(&durability_cells(test));
    }
    row
}

fn commands(out: &mut String, target: &TargetResult) {
    let mut lines: Vec<String> = target
        .setup_commands
        .iter()
        .map(|c| shell_words(c))
        .collect();
    lines.extend(target.prefills.iter().map(|p| shell_words(&p.command)));
    lines.extend(
        target
            .tests
            .iter()
            .filter(|t| !t.command.is_empty())
            .map(|t| shell_words(&t.command)),
    );
    if lines.is_empty() {
        return;
    }
    emit!(
        out,
        "<details><summary>Commands run for <code>{}</code></summary>",
        target.label
    );
    emit!(out);
    emit!(out, "```");
    for line in lines {
        emit!(out, "{line}");
    }
    emit!(out, "```");
    emit!(out);
    emit!(out, "</details>");
    emit!(out);
}

/// A command line a shell reproduces: words with shell syntax are quoted.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|word| {
            // A lone `|` joins two commands of one line (the send suite's
            // `send | receive`).
            let plain = word == "|"
                || (!word.is_empty()
                    && word
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_=./:,+%@".contains(c)));
            if plain {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn method(out: &mut String, results: &Results) {
    let machine = &results.machine;
    let settings = &results.settings;
    emit!(out, "## Machine and method");
    emit!(out);
    emit!(
        out,
        "- Kernel: Linux {}; OS: {}",
        machine.kernel,
        machine.os
    );
    emit!(
        out,
        "- CPU: {} ({} CPUs); memory {}; page size {}",
        machine.cpu_model,
        machine.cpu_count,
        bytes_human(machine.memory_bytes as f64),
        size_short(machine.page_size_bytes)
    );
    emit!(out, "- fio: {}", machine.fio_version);
    if let Some(version) = &machine.nbdkit_version {
        emit!(out, "- nbdkit: {version}");
    }
    if let Some(version) = &machine.ironpool_version {
        emit!(out, "- ironpool: {version}");
    }
    emit!(
        out,
        "- ironpool-bench {}; results.json holds every figure and exact command",
        results.tool_version
    );
    emit!(out);
    let mut argv: Vec<String> = vec!["ironpool".into(), "bench".into()];
    for suite in &settings.suites {
        argv.extend(["--suite".into(), suite.name().into()]);
    }
    for spec in &settings.target_specs {
        argv.extend([
            "--target".into(),
            spec.split('#').next().unwrap_or(spec).to_string(),
        ]);
    }
    if !settings.target_specs.iter().any(|s| s.starts_with("raw")) {
        argv.push("--no-raw".into());
    }
    argv.extend(["--runtime".into(), settings.runtime_seconds.to_string()]);
    if settings.ramp_seconds > 0 {
        argv.extend(["--ramp".into(), settings.ramp_seconds.to_string()]);
    }
    argv.extend(["--size".into(), size_short(settings.size_bytes)]);
    let list = |values: &[u32]| {
        values
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if settings.suites.contains(&Suite::QdScaling) {
        argv.extend([
            "--qd".into(),
            list(&settings.depths),
            "--jobs".into(),
            list(&settings.jobs),
        ]);
    }
    if settings.suites.contains(&Suite::Fill) {
        argv.extend(["--fill-levels".into(), list(&settings.fill_levels_percent)]);
    }
    emit!(out, "Reproduce with:");
    emit!(out);
    emit!(out, "```");
    emit!(out, "{}", shell_words(&argv));
    emit!(out, "```");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_shell_words() {
        let argv = vec![
            "fio".to_string(),
            "--uri=nbd+unix:///?socket=/o/nbd.sock".to_string(),
            "a b".to_string(),
        ];
        assert_eq!(
            shell_words(&argv),
            "fio '--uri=nbd+unix:///?socket=/o/nbd.sock' 'a b'"
        );
    }
}
