//! `ironpool arcstat`: the read cache at a glance, like OpenZFS's `arcstat`.
//! One line per interval: reads per second and the share that hit, demand
//! data, demand metadata and prefetch apart; the cache's size and target,
//! its recency (MRU) and frequency (MFU) lists, evictions, and what
//! compression saves. Without an interval, one line of counters since
//! import. With `--json`, each report is the cumulative counters as one JSON
//! document (consumers take differences).

use std::path::PathBuf;
use std::time::Duration;

use ironpool::control::commands::Command;
use serde_json::Value;

use super::format::{bytes, count};
use super::iostat::number;
use super::{admin, Context};

/// `now[path]` less `before[path]` (all of it without `before`).
fn delta(now: &Value, before: Option<&Value>, path: &[&str]) -> f64 {
    let at = |root: &Value| {
        path.iter()
            .fold(root.clone(), |value, key| value[*key].clone())
    };
    number(&at(now)) - before.map(|before| number(&at(before))).unwrap_or(0.0)
}

pub fn run(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    interval: Option<f64>,
    reports: Option<u64>,
) -> Result<(), String> {
    let mut previous: Option<Value> = None;
    let mut done = 0u64;
    loop {
        let now = admin(context, pool, dirs, Command::Arcstat)?;
        if context.json {
            println!("{now}");
        } else {
            print_line(&now, previous.as_ref(), done == 0);
        }
        done += 1;
        let Some(interval) = interval else {
            return Ok(());
        };
        if reports.is_some_and(|limit| done >= limit) {
            return Ok(());
        }
        previous = Some(now);
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.01)));
    }
}

fn print_line(now: &Value, before: Option<&Value>, header: bool) {
    if header {
        println!(
            "{:>10} {:>7} {:>5} {:>7} {:>5} {:>7} {:>5} {:>7} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
            "time", "read/s", "hit%", "dread/s", "dh%", "mread/s", "mh%", "pread/s", "ph%",
            "size", "target", "mru", "mfu", "evict/s", "saved"
        );
    }
    let seconds = match before {
        Some(before) => {
            ((number(&now["timestamp_ns"]) - number(&before["timestamp_ns"])) / 1e9).max(1e-9)
        }
        None => (number(&now["timestamp_ns"]) / 1e9).max(1e-9),
    };
    let kind = |name: &str| {
        let hits = delta(now, before, &["cache", name, "hits"]);
        let misses = delta(now, before, &["cache", name, "misses"]);
        (hits, hits + misses)
    };
    let percent = |(hits, all): (f64, f64)| {
        if all > 0.0 {
            format!("{:.0}", 100.0 * hits / all)
        } else {
            "-".to_string()
        }
    };
    let data = kind("demand_data");
    let metadata = kind("demand_metadata");
    let prefetch = kind("prefetch_data");
    let all = (
        data.0 + metadata.0 + prefetch.0,
        data.1 + metadata.1 + prefetch.1,
    );
    let cache = &now["cache"];
    let size = |value: &Value| bytes(number(value) as u64);
    let time = chrono_like(number(&now["timestamp_ns"]));
    println!(
        "{:>10} {:>7} {:>5} {:>7} {:>5} {:>7} {:>5} {:>7} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        time,
        count(all.1 / seconds),
        percent(all),
        count(data.1 / seconds),
        percent(data),
        count(metadata.1 / seconds),
        percent(metadata),
        count(prefetch.1 / seconds),
        percent(prefetch),
        size(&cache["size_bytes"]),
        size(&cache["target_bytes"]),
        size(&cache["lists"]["mru_bytes"]),
        size(&cache["lists"]["mfu_bytes"]),
        count(delta(now, before, &["cache", "policy", "evictions"]) / seconds),
        size(&cache["compressed_saved_bytes"]),
    );
}

/// Seconds since the server's clock started, as H:MM:SS (the server's
/// monotonic clock: what it says is only comparable line to line).
fn chrono_like(nanos: f64) -> String {
    let seconds = (nanos / 1e9) as u64;
    format!(
        "{}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}
