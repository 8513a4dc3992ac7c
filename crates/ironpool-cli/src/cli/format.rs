//! Human-readable output in the spirit of `zpool status` / `zpool list`.

use serde_json::Value;

/// 1536 -> "1.5K", binary units like zpool.
pub fn bytes(value: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut scaled = value as f64;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value}B")
    } else if scaled >= 100.0 {
        format!("{scaled:.0}{}", UNITS[unit])
    } else {
        format!("{scaled:.1}{}", UNITS[unit])
    }
}

/// A count with a K/M suffix, for operations.
pub fn count(value: f64) -> String {
    if value >= 10_000_000.0 {
        format!("{:.0}M", value / 1e6)
    } else if value >= 10_000.0 {
        format!("{:.0}K", value / 1e3)
    } else if value >= 100.0 || value == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

/// "1 pass", "2 passes": `count` with the word that fits it.
pub fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// Seconds since the Unix epoch as a UTC date and time,
/// "2026-11-23 14:05:09 UTC".
pub fn utc(unix_seconds: u64) -> String {
    const SECONDS_PER_DAY: u64 = 86_400;
    let (days, seconds) = (
        unix_seconds / SECONDS_PER_DAY,
        unix_seconds % SECONDS_PER_DAY,
    );
    let (year, month, day) = ironpool_bench::units::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// Nanoseconds since the Unix epoch as a UTC date and time to the
/// millisecond, "2026-11-23 14:05:09.123".
pub fn utc_millis(unix_ns: u64) -> String {
    let text = utc(unix_ns / 1_000_000_000);
    let millis = unix_ns / 1_000_000 % 1000;
    format!("{}.{millis:03}", text.trim_end_matches(" UTC"))
}

/// One line about the scrub.
pub fn scrub_line(scrub: &Value) -> String {
    match scrub["state"].as_str().unwrap_or("none") {
        "scanning" => format!(
            "scrub in progress since {}{}: {:.1}% done, {} of {} examined, {} repaired, {}",
            utc(number(&scrub["started_unix_seconds"])),
            if scrub["resumed"] == true {
                " (resumed after an interruption)"
            } else {
                ""
            },
            scrub["progress_percent"].as_f64().unwrap_or(0.0),
            bytes(number(&scrub["examined_bytes"])),
            bytes(number(&scrub["total_bytes"])),
            plural(number(&scrub["repaired_copies"]), "copy", "copies"),
            plural(number(&scrub["errors"]), "error", "errors")
        ),
        "finished" => format!(
            "scrub repaired {} ({}) with {}, {} examined{}",
            bytes(number(&scrub["repaired_bytes"])),
            plural(number(&scrub["bad_copies"]), "bad copy", "bad copies"),
            plural(number(&scrub["errors"]), "error", "errors"),
            bytes(number(&scrub["examined_bytes"])),
            match scrub["last"]["finished_unix_seconds"].as_u64() {
                Some(finished) => format!(
                    ", {} at {}",
                    if scrub["last"]["completed"] == true {
                        "completed"
                    } else {
                        "stopped"
                    },
                    utc(finished)
                ),
                None => String::new(),
            }
        ),
        _ => match scrub["last"].as_object() {
            Some(last) => format!(
                "last scrub repaired {} with {} ({}), finished at {}",
                bytes(
                    last.get("repaired_bytes")
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                ),
                plural(
                    last.get("errors").and_then(Value::as_u64).unwrap_or(0),
                    "error",
                    "errors"
                ),
                if last
                    .get("completed")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                {
                    "completed"
                } else {
                    "stopped"
                },
                utc(last
                    .get("finished_unix_seconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(0))
            ),
            None => "none requested".to_string(),
        },
    }
}

/// One line about trims: autotrim and the last `ironpool trim`.
pub fn trim_line(trim: &Value) -> String {
    let autotrim = if trim["autotrim"] == false {
        "autotrim off".to_string()
    } else {
        format!(
            "autotrim on ({} discarded since import)",
            bytes(number(&trim["autotrim_trimmed_bytes"]))
        )
    };
    let last = match trim["state"].as_str().unwrap_or("none") {
        "trimming" => format!(
            "; trim in progress since {}: {:.1}% done, {} discarded{}",
            utc(number(&trim["started_unix_seconds"])),
            trim["progress_percent"].as_f64().unwrap_or(0.0),
            bytes(number(&trim["trimmed_bytes"])),
            match trim["eta_seconds"].as_u64() {
                Some(seconds) => format!(", {seconds} s to go"),
                None => String::new(),
            }
        ),
        "finished" => format!(
            "; trim discarded {} at {}",
            bytes(number(&trim["trimmed_bytes"])),
            utc(number(&trim["finished_unix_seconds"]))
        ),
        "stopped" => format!(
            "; trim stopped at {} after {} discarded",
            utc(number(&trim["finished_unix_seconds"])),
            bytes(number(&trim["trimmed_bytes"]))
        ),
        _ => String::new(),
    };
    autotrim + &last
}

/// One line about the resilver.
pub fn resilver_line(resilver: &Value) -> String {
    let devices: Vec<&str> = resilver["devices"]
        .as_array()
        .map(|devices| devices.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let of_devices = if devices.is_empty() {
        String::new()
    } else {
        format!(" of {}", devices.join(", "))
    };
    let on_devices = if devices.is_empty() {
        String::new()
    } else {
        format!(" on {}", devices.join(", "))
    };
    match resilver["state"].as_str().unwrap_or("none") {
        "resilvering" => format!(
            "resilver{of_devices} in progress: {:.1}% done, {} of {} examined, {} rewritten, {}",
            resilver["progress_percent"].as_f64().unwrap_or(0.0),
            bytes(number(&resilver["examined_bytes"])),
            bytes(number(&resilver["total_bytes"])),
            bytes(number(&resilver["rewritten_bytes"])),
            match resilver["eta_seconds"].as_u64() {
                Some(seconds) => format!("about {}m{:02}s to go", seconds / 60, seconds % 60),
                None => "no estimate yet".to_string(),
            }
        ),
        "finished" => format!(
            "resilvered {} ({}){on_devices} in {} with {}, {} examined, finished at {}",
            bytes(number(&resilver["rewritten_bytes"])),
            plural(
                number(&resilver["rewritten_blocks"]),
                "block copy",
                "block copies"
            ),
            plural(number(&resilver["passes"]), "pass", "passes"),
            plural(number(&resilver["errors"]), "error", "errors"),
            bytes(number(&resilver["examined_bytes"])),
            utc(number(&resilver["finished_unix_seconds"]))
        ),
        _ => "none".to_string(),
    }
}

/// The line about device removal `status` shows, if there is anything to
/// say: a removal running or stopped, or the vdevs removed.
pub fn removal_line(removal: &Value) -> Option<String> {
    let vdev = removal["vdev"].as_str().unwrap_or("?");
    match removal["state"].as_str().unwrap_or("none") {
        "removing" => Some(format!(
            "removing {vdev}: {} of {} moved ({:.1}%), walk {}",
            bytes(number(&removal["moved_bytes"])),
            bytes(number(&removal["to_move_bytes"])),
            removal["progress_percent"].as_f64().unwrap_or(0.0),
            number(&removal["pass"])
        )),
        "stopped" => Some(format!(
            "the removal of {vdev} stopped: {}",
            removal["error"].as_str().unwrap_or("?")
        )),
        _ => {
            let removed = removal["removed"].as_array().cloned().unwrap_or_default();
            if removed.is_empty() {
                return None;
            }
            let each: Vec<String> = removed
                .iter()
                .map(|vdev| {
                    format!(
                        "{} ({} in {} moved, finished at {})",
                        vdev["vdev"].as_str().unwrap_or("?"),
                        bytes(number(&vdev["moved_bytes"])),
                        plural(number(&vdev["moved_blocks"]), "block", "blocks"),
                        utc(number(&vdev["finished_unix_seconds"]))
                    )
                })
                .collect();
            Some(format!(
                "removed {}; their mappings hold {} in memory",
                each.join(", "),
                plural(number(&removal["mapped_blocks"]), "block", "blocks")
            ))
        }
    }
}

/// The one scan `status` shows: a running resilver, else a running scrub,
/// else whichever of the two ended last.
pub fn scan_line(status: &Value) -> String {
    let scrub = &status["scrub"];
    let resilver = &status["resilver"];
    let resilver_state = resilver["state"].as_str().unwrap_or("none");
    if resilver_state == "resilvering" {
        return resilver_line(resilver);
    }
    if resilver_state == "none" || scrub["state"] == "scanning" {
        return scrub_line(scrub);
    }
    // Both ended: the later one. A scrub that ended has its record in `last`.
    let scrub_finished = scrub["last"]["finished_unix_seconds"].as_u64().unwrap_or(0);
    if scrub_finished > number(&resilver["finished_unix_seconds"]) {
        scrub_line(scrub)
    } else {
        resilver_line(resilver)
    }
}

/// The `status` report.
pub fn status(status: &Value) -> String {
    let mut out = String::new();
    out += &format!("  pool: {}\n", status["pool"].as_str().unwrap_or("?"));
    out += &format!(" state: {}\n", status["health"].as_str().unwrap_or("?"));
    for device in status["host_full_devices"].as_array().into_iter().flatten() {
        out += &format!(
            "status: the filesystem holding {} is full: writes fail with ENOSPC; free space there, then run `ironpool clear {}`\n",
            device.as_str().unwrap_or("?"),
            status["pool"].as_str().unwrap_or("POOL")
        );
    }
    if let Some(reason) = status["suspended"].as_str() {
        out += &format!("status: suspended: {reason}\n");
    }
    for note in status["notes"].as_array().cloned().unwrap_or_default() {
        out += &format!("  note: {}\n", note.as_str().unwrap_or(""));
    }
    out += &format!("  scan: {}\n", scan_line(status));
    out += &format!("  trim: {}\n", trim_line(&status["trim"]));
    if let Some(line) = removal_line(&status["removal"]) {
        out += &format!("remove: {line}\n");
    }
    for device in status["trim"]["unsupported_devices"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out += &format!(
            "  note: {} does not support discard (TRIM): its free space is not trimmed\n",
            device.as_str().unwrap_or("?")
        );
    }
    out += &format!(
        " space: {} used of {} ({} free), txg {} durable\n",
        bytes(number(&status["allocated_bytes"])),
        bytes(number(&status["size_bytes"])),
        bytes(number(&status["free_bytes"])),
        number(&status["durable_txg"])
    );
    out += "config:\n\n";
    out += &format!(
        "\t{:<44} {:<9} {:>5} {:>5} {:>5}\n",
        "NAME", "STATE", "READ", "WRITE", "CKSUM"
    );
    let vdevs = status["vdevs"].as_array().cloned().unwrap_or_default();
    let pool_errors = |field: &str| vdevs.iter().map(|vdev| number(&vdev[field])).sum::<u64>();
    out += &format!(
        "\t{:<44} {:<9} {:>5} {:>5} {:>5}\n",
        status["pool"].as_str().unwrap_or("?"),
        status["health"].as_str().unwrap_or("?"),
        pool_errors("read_errors"),
        pool_errors("write_errors"),
        pool_errors("checksum_errors")
    );
    let spares = status["spares"].as_array().cloned().unwrap_or_default();
    // Data vdevs, then log devices under a `logs` heading, then spares (as
    // `zpool status`).
    // Removed vdevs have no devices: the `remove` line names them.
    let (logs, data): (Vec<&Value>, Vec<&Value>) = vdevs
        .iter()
        .filter(|vdev| vdev["kind"] != "indirect")
        .partition(|vdev| vdev["log"] == true);
    let data_count = data.len();
    for (index, vdev) in data.into_iter().chain(logs.iter().copied()).enumerate() {
        if vdev["log"] == true && index == data_count {
            out += "\tlogs\n";
        }
        let children = vdev["children"].as_array().cloned().unwrap_or_default();
        let mut indent = "  ";
        if vdev["kind"] != "disk" {
            out += &format!(
                "\t  {:<42} {:<9} {:>5} {:>5} {:>5}\n",
                vdev["name"].as_str().unwrap_or("?"),
                vdev["state"].as_str().unwrap_or("?"),
                number(&vdev["read_errors"]),
                number(&vdev["write_errors"]),
                number(&vdev["checksum_errors"])
            );
            indent = "    ";
        }
        for child in children {
            let width = 44 - indent.len();
            let resilvering = status["resilver"]["devices"]
                .as_array()
                .is_some_and(|devices| devices.contains(&child["path"]))
                && status["resilver"]["state"] == "resilvering";
            let mut note = if resilvering {
                "  (resilvering)"
            } else if child["needs_resilver"] == true {
                "  (missed writes: to resilver)"
            } else {
                ""
            }
            .to_string();
            let spare = spares.iter().find(|spare| spare["guid"] == child["guid"]);
            if let Some(replacing) = spare.and_then(|spare| spare["replacing"].as_str()) {
                note += &format!("  (spare in place of {replacing})");
            }
            out += &format!(
                "\t{indent}{:<width$} {:<9} {:>5} {:>5} {:>5}{note}\n",
                child["path"].as_str().unwrap_or("?"),
                child["state"].as_str().unwrap_or("?"),
                number(&child["read_errors"]),
                number(&child["write_errors"]),
                number(&child["checksum_errors"])
            );
        }
    }
    if !spares.is_empty() {
        out += "\tspares\n";
    }
    for spare in &spares {
        let state = match spare["state"].as_str() {
            Some("available") => "AVAIL",
            Some("in use") => "INUSE",
            _ => "MISSING",
        };
        let note = spare["replacing"]
            .as_str()
            .map(|old| format!("  (in place of {old})"))
            .unwrap_or_default();
        out += &format!(
            "\t  {:<42} {state:<9}{note}\n",
            spare["path"].as_str().unwrap_or("?")
        );
    }
    // Space per vdev, as `zpool list -v` gives it.
    out += &format!(
        "\n\t{:<20} {:>9} {:>9} {:>9} {:>5}\n",
        "VDEV", "SIZE", "ALLOC", "FREE", "FRAG"
    );
    for vdev in vdevs.iter().filter(|vdev| vdev["kind"] != "indirect") {
        let (size, allocated) = (
            number(&vdev["size_bytes"]),
            number(&vdev["allocated_bytes"]),
        );
        out += &format!(
            "\t{:<20} {:>9} {:>9} {:>9} {:>5}\n",
            vdev["name"].as_str().unwrap_or("?"),
            bytes(size),
            bytes(allocated),
            bytes(size.saturating_sub(allocated)),
            vdev["fragmentation_percent"]
                .as_u64()
                .map(|percent| format!("{percent}%"))
                .unwrap_or_else(|| "-".into())
        );
    }
    let unrecoverable = number(&status["unrecoverable_reads"]) + number(&status["scrub"]["errors"]);
    out += "\n";
    if unrecoverable == 0 {
        out += "errors: No known data errors\n";
    } else {
        out += &format!("errors: {unrecoverable} blocks could not be read from any copy\n");
        for detail in status["scrub"]["error_details"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            out += &format!("        {}\n", detail.as_str().unwrap_or(""));
        }
    }
    let volumes = status["volumes"].as_array().cloned().unwrap_or_default();
    if !volumes.is_empty() {
        out += "volumes:\n";
        for volume in volumes {
            out += &format!(
                "\t{:<40} {:>10} volsize, {:>10} used, volblocksize {}\n",
                volume["name"].as_str().unwrap_or("?"),
                bytes(number(&volume["size_bytes"])),
                bytes(number(&volume["used_bytes"])),
                bytes(number(&volume["block_bytes"]))
            );
        }
    }
    let filesystems = status["filesystems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !filesystems.is_empty() {
        out += "filesystems:\n";
        for fs in filesystems {
            let name = fs["name"].as_str().unwrap_or("?");
            let front_end = &fs["front_end"];
            match fs["mounted"].as_str() {
                Some(path) => {
                    out += &format!(
                        "\t{name:<40} mounted at {path} over {}, {} requests, at most {} at once\n",
                        front_end["transport"].as_str().unwrap_or("?"),
                        number(&front_end["requests"]),
                        number(&front_end["in_flight_max"])
                    )
                }
                None => out += &format!("\t{name:<40} not mounted\n"),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bytes() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(2 << 30), "2.0G");
        assert_eq!(bytes(200 << 20), "200M");
    }

    #[test]
    fn formats_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_458_137), "2026-11-23 18:22:17 UTC");
        assert_eq!(utc(4_107_542_399), "2100-02-28 23:59:59 UTC");
        assert_eq!(utc(4_107_542_400), "2100-03-01 00:00:00 UTC");
    }

    #[test]
    fn plurals() {
        assert_eq!(plural(1, "pass", "passes"), "1 pass");
        assert_eq!(plural(0, "pass", "passes"), "0 passes");
        assert_eq!(plural(2, "error", "errors"), "2 errors");
    }

    #[test]
    fn one_scan_line() {
        let status = serde_json::json!({
            "pool": "tank",
            "scrub": { "state": "none", "last": { "finished_unix_seconds": 100, "completed": true, "errors": 0, "repaired_bytes": 0 } },
            "resilver": { "state": "finished", "devices": ["/d/new.img"], "passes": 1, "errors": 0, "rewritten_bytes": 4096,
                          "rewritten_blocks": 1, "examined_bytes": 8192, "finished_unix_seconds": 200 },
        });
        let text = super::status(&status);
        assert_eq!(text.matches("scan:").count(), 1, "{text}");
        assert!(
            text.contains("resilvered 4.0K (1 block copy) on /d/new.img in 1 pass with 0 errors"),
            "{text}"
        );
        assert!(!text.contains("unix time"), "{text}");
        let running =
            serde_json::json!({ "state": "resilvering", "devices": [], "progress_percent": 0.0 });
        assert!(
            resilver_line(&running).starts_with("resilver in progress"),
            "{}",
            resilver_line(&running)
        );
    }
}
