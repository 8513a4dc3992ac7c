//! `ironpool iostat`: per-device operations and bandwidth, the average device I/Os
//! active (aqd) and client requests inside them (areq: the depth that reaches the
//! device whatever the aggregation), and with -q the queued
//! and active I/Os per priority class, -l latencies, -r request sizes — like
//! `zpool iostat` — and each mounted filesystem's FUSE requests by kind. With `--json`, every report is the cumulative counters as one
//! JSON document (consumers take differences).

use std::path::PathBuf;
use std::time::Duration;

use ironpool::control::commands::Command;
use serde_json::Value;

use super::format::{bytes, count};
use super::{admin, Context};

/// Classes shown by -q and -l, with short column names.
const CLASSES: [(&str, &str); 5] = [
    ("sync_read", "syncr"),
    ("sync_write", "syncw"),
    ("async_read", "asyncr"),
    ("async_write", "asyncw"),
    ("scrub", "scrub"),
];

pub struct Options {
    pub queues: bool,
    pub latency: bool,
    pub sizes: bool,
    pub interval: Option<f64>,
    pub count: Option<u64>,
}

/// A JSON number as f64 (0 when absent): the reports take differences.
pub(super) fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

fn delta(now: &Value, before: Option<&Value>, field: &str) -> f64 {
    number(&now[field]) - before.map(|before| number(&before[field])).unwrap_or(0.0)
}

pub fn run(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    options: Options,
) -> Result<(), String> {
    if options.interval.is_none() && !context.json {
        // One report: counters since import (as zpool iostat's first line).
        let now = admin(context, pool, dirs, Command::Iostat)?;
        print_report(&now, None, &options);
        return Ok(());
    }
    let interval = Duration::from_secs_f64(options.interval.unwrap_or(1.0).max(0.01));
    let mut previous: Option<Value> = None;
    let mut reports = 0u64;
    loop {
        let now = admin(context, pool, dirs, Command::Iostat)?;
        if context.json {
            println!("{now}");
        } else {
            print_report(&now, previous.as_ref(), &options);
        }
        reports += 1;
        if options.count.is_some_and(|limit| reports >= limit)
            || (options.interval.is_none() && context.json)
        {
            return Ok(());
        }
        previous = Some(now);
        std::thread::sleep(interval);
    }
}

fn print_report(now: &Value, before: Option<&Value>, options: &Options) {
    let seconds = match before {
        Some(before) => {
            ((number(&now["timestamp_ns"]) - number(&before["timestamp_ns"])) / 1e9).max(1e-9)
        }
        None => (number(&now["timestamp_ns"]) / 1e9).max(1e-9),
    };
    let devices = now["devices"].as_array().cloned().unwrap_or_default();
    let previous: Vec<Value> = before
        .and_then(|before| before["devices"].as_array().cloned())
        .unwrap_or_default();
    let mut header = format!(
        "{:<40} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6}",
        "device", "r/s", "w/s", "rMB/s", "wMB/s", "avg-wsz", "aqd", "areq"
    );
    if options.queues {
        for (_, short) in CLASSES {
            header += &format!(" {:>6}q {:>6}a", short, short);
        }
    }
    if options.latency {
        for (_, short) in CLASSES {
            header += &format!(" {:>8}", format!("{short}_us"));
        }
    }
    println!("{header}");
    for (index, device) in devices.iter().enumerate() {
        let before = previous.get(index);
        let reads = delta(device, before, "read_ops");
        let writes = delta(device, before, "write_ops");
        let write_bytes = delta(device, before, "write_bytes");
        let active_time = delta(device, before, "active_time_weighted_ns");
        let active_requests = delta(device, before, "active_requests_time_weighted_ns");
        let average_write = if writes > 0.0 {
            write_bytes / writes
        } else {
            0.0
        };
        // Log devices are marked: their writes are the intent log's.
        let name = device["path"].as_str().unwrap_or("?");
        let name = if device["log"] == true {
            format!("{} (log)", shorten(name, 34))
        } else {
            shorten(name, 40)
        };
        let mut line = format!(
            "{:<40} {:>7} {:>7} {:>8.1} {:>8.1} {:>8} {:>6.1} {:>6.1}",
            name,
            count(reads / seconds),
            count(writes / seconds),
            delta(device, before, "read_bytes") / seconds / 1e6,
            write_bytes / seconds / 1e6,
            bytes(average_write as u64),
            active_time / (seconds * 1e9),
            active_requests / (seconds * 1e9)
        );
        if options.queues {
            for (class, _) in CLASSES {
                let stats = &device["classes"][class];
                line += &format!(
                    " {:>7} {:>7}",
                    number(&stats["queued"]),
                    number(&stats["active"])
                );
            }
        }
        if options.latency {
            for (class, _) in CLASSES {
                line += &format!(
                    " {:>8}",
                    average_latency_us(&device["classes"][class]["total_latency_ns"])
                );
            }
        }
        println!("{line}");
    }
    print_intent_logs(now, before, seconds, options.latency);
    print_fs_requests(now, before, seconds);
    if options.sizes {
        for device in &devices {
            println!(
                "\n{} request sizes (individual / aggregated device I/Os):",
                device["path"].as_str().unwrap_or("?")
            );
            println!(
                "{:>8} {:>10} {:>10} {:>10} {:>10}",
                "size", "read_ind", "read_agg", "write_ind", "write_agg"
            );
            let columns = [
                "read_request_sizes",
                "read_device_sizes",
                "write_request_sizes",
                "write_device_sizes",
            ];
            for bucket in 9..25usize {
                let values: Vec<u64> = columns
                    .iter()
                    .map(|column| device[*column]["buckets"][bucket].as_u64().unwrap_or(0))
                    .collect();
                if values.iter().all(|value| *value == 0) {
                    continue;
                }
                println!(
                    "{:>8} {:>10} {:>10} {:>10} {:>10}",
                    bytes(1 << bucket),
                    values[0],
                    values[1],
                    values[2],
                    values[3]
                );
            }
        }
    }
    println!();
}

/// Each entry of the report's `key` list (volumes, filesystems) with the
/// entry of the same name in the report before, if any.
fn with_previous(now: &Value, before: Option<&Value>, key: &str) -> Vec<(Value, Option<Value>)> {
    let previous = before
        .and_then(|before| before[key].as_array().cloned())
        .unwrap_or_default();
    let entries = now[key].as_array().cloned().unwrap_or_default();
    entries
        .into_iter()
        .map(|entry| {
            let old = previous
                .iter()
                .find(|old| old["name"] == entry["name"])
                .cloned();
            (entry, old)
        })
        .collect()
}

/// The intent log of every volume whose log did anything in the interval:
/// commits that wrote log blocks, FLUSHes that shared an earlier commit, and
/// those that fell back to a txg, per second; log bytes written; with -l the
/// mean and 99th percentile of a commit's write and device flush.
fn print_intent_logs(now: &Value, before: Option<&Value>, seconds: f64, latency: bool) {
    let mut lines = Vec::new();
    for (volume, old) in with_previous(now, before, "volumes") {
        let name = volume["name"].as_str().unwrap_or("?");
        let log = &volume["intent_log"];
        let old = old.as_ref().map(|old| &old["intent_log"]);
        let commits = delta(log, old, "commits");
        let shared = delta(log, old, "shared_commits");
        let fallbacks = delta(log, old, "txg_fallbacks");
        if commits + shared + fallbacks == 0.0 {
            continue;
        }
        let mut line = format!(
            "{:<24} {:>9} {:>9} {:>9} {:>8.1}",
            shorten(name, 24),
            count(commits / seconds),
            count(shared / seconds),
            count(fallbacks / seconds),
            delta(log, old, "bytes_written") / seconds / 1e6
        );
        if latency {
            let buckets = |value: Option<&Value>| -> Vec<f64> {
                value
                    .and_then(|value| value["commit_latency_us_log2"].as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .map(number)
                    .collect()
            };
            let (new, old_buckets) = (buckets(Some(log)), buckets(old));
            let counts: Vec<f64> = new
                .iter()
                .enumerate()
                .map(|(index, value)| value - old_buckets.get(index).copied().unwrap_or(0.0))
                .collect();
            let timed: f64 = counts.iter().sum();
            let mean = if timed > 0.0 {
                format!("{:.0}", delta(log, old, "commit_time_us") / timed)
            } else {
                "-".to_string()
            };
            line += &format!(" {:>9} {:>9}", mean, log2_percentile_us(&counts, 0.99));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        return;
    }
    let mut header = format!(
        "\n{:<24} {:>9} {:>9} {:>9} {:>8}",
        "intent log", "commit/s", "shared/s", "txg/s", "logMB/s"
    );
    if latency {
        header += &format!(" {:>9} {:>9}", "commit_us", "p99_us");
    }
    println!("{header}");
    for line in lines {
        println!("{line}");
    }
}

/// The FUSE requests of every filesystem that served any in the interval,
/// by kind, busiest first: per second, and the mean microseconds the server
/// held one (a kind the kernel sends synchronously costs the application a
/// round trip besides).
fn print_fs_requests(now: &Value, before: Option<&Value>, seconds: f64) {
    let mut lines = Vec::new();
    for (fs, old) in with_previous(now, before, "filesystems") {
        let name = fs["name"].as_str().unwrap_or("?");
        let old = old.as_ref().map(|old| &old["front_end"]["ops"]);
        let Some(ops) = fs["front_end"]["ops"].as_object() else {
            continue;
        };
        let mut rows: Vec<(String, f64, f64)> = ops
            .iter()
            .map(|(op, stats)| {
                let old = old.map(|old| &old[op]);
                (
                    op.clone(),
                    delta(stats, old, "count"),
                    delta(stats, old, "service_us"),
                )
            })
            .filter(|(_, count, _)| *count > 0.0)
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (index, (op, requests, micros)) in rows.into_iter().enumerate() {
            let shown = if index == 0 {
                shorten(name, 24)
            } else {
                String::new()
            };
            lines.push(format!(
                "{:<24} {:<12} {:>9} {:>9.1}",
                shown,
                op,
                count(requests / seconds),
                micros / requests
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    println!(
        "\n{:<24} {:<12} {:>9} {:>9}",
        "filesystem requests", "kind", "req/s", "serve_us"
    );
    for line in lines {
        println!("{line}");
    }
}

/// The upper bound of the log2 bucket (in microseconds) that holds the
/// `quantile` of the counts, or "-" for none.
fn log2_percentile_us(counts: &[f64], quantile: f64) -> String {
    let total: f64 = counts.iter().sum();
    if total <= 0.0 {
        return "-".to_string();
    }
    let mut seen = 0.0;
    for (index, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= total * quantile {
            return format!("<{}", 1u64 << (index + 1));
        }
    }
    "-".to_string()
}

/// Mean of a log2 latency histogram (bucket midpoints), in microseconds.
fn average_latency_us(histogram: &Value) -> String {
    let buckets = histogram["buckets"].as_array().cloned().unwrap_or_default();
    let mut total = 0.0;
    let mut weighted = 0.0;
    for (index, bucket) in buckets.iter().enumerate() {
        let count = bucket.as_f64().unwrap_or(0.0);
        total += count;
        weighted += count * (1u64 << index) as f64 * 1.5;
    }
    if total == 0.0 {
        "-".to_string()
    } else {
        format!("{:.0}", weighted / total / 1000.0)
    }
}

fn shorten(text: &str, width: usize) -> String {
    if text.len() <= width {
        text.to_string()
    } else {
        format!("...{}", &text[text.len() - (width - 3)..])
    }
}
