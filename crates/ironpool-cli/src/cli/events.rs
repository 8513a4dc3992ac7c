//! `ironpool events` (what happened to a served pool and its devices) and
//! `ironpool history` (the commands that changed a pool, from the pool
//! itself).

use std::path::PathBuf;

use ironpool::control::client;
use ironpool::control::commands::{Command, EVENTS_PER_ANSWER_MAX, EVENTS_WAIT_MS_MAX};
use serde_json::Value;

use super::{admin, default_control_path, format, server_answer, Context};

/// `events [-f] POOL`: the events the server of `pool` holds; with `follow`,
/// then every new one as it comes, until interrupted or the server stops.
/// The ring lives in the server, so a pool nobody serves has none.
pub fn events(context: &Context, pool: &str, follow: bool) -> Result<(), String> {
    let explicit = context.control.is_some();
    let control = context
        .control
        .clone()
        .unwrap_or_else(|| default_control_path(pool));
    let mut after = 0;
    let mut first = true;
    let mut wait = false;
    let mut reported_missed = 0;
    loop {
        let command = Command::Events {
            after,
            wait_ms: if wait { EVENTS_WAIT_MS_MAX } else { 0 },
        };
        let batch = match server_answer(client::call(&control, &command), explicit) {
            Some(answer) => answer?,
            None if first => {
                return Err(format!(
                    "no server serves pool '{pool}' (control {}): events are kept by the server, from its start",
                    control.display()
                ))
            }
            // The server stopped while we followed it.
            None => return Ok(()),
        };
        let last = batch["last_seq"].as_u64().unwrap_or(after);
        if last < after {
            // A server started since: its numbers begin again.
            reported_missed = 0;
        }
        let missed = batch["missed"].as_u64().unwrap_or(0);
        if missed > reported_missed && !context.json {
            eprintln!(
                "ironpool: {} older events were dropped from the ring",
                missed - reported_missed
            );
        }
        reported_missed = missed;
        let events = batch["events"].as_array().cloned().unwrap_or_default();
        for event in &events {
            if context.json {
                println!("{event}");
            } else {
                println!("{}", event_line(event));
            }
        }
        if first && !context.json {
            let suppressed = batch["suppressed"].as_u64().unwrap_or(0);
            if suppressed > 0 {
                eprintln!(
                    "ironpool: {suppressed} device error events were over the rate limit and not kept"
                );
            }
        }
        first = false;
        after = last;
        // A full answer: ask again at once for the rest.
        let more = events.len() >= EVENTS_PER_ANSWER_MAX;
        if !more && !follow {
            return Ok(());
        }
        wait = !more;
    }
}

/// One event as `events` prints it: time, class, then what it is about
/// (device, vdev, range) before a colon, and what happened.
fn event_line(event: &Value) -> String {
    let nanos = event["time_unix_ns"].as_u64().unwrap_or(0);
    let mut about = Vec::new();
    if let Some(device) = event["device"].as_str() {
        about.push(device.to_string());
    }
    if let Some(vdev) = event["vdev"].as_u64() {
        about.push(format!("vdev {vdev}"));
    }
    if let (Some(offset), Some(length)) = (event["offset"].as_u64(), event["length"].as_u64()) {
        about.push(format!("at {offset:#x}+{length}"));
    }
    let detail = event["detail"].as_str().unwrap_or_default();
    let what = match (about.is_empty(), detail.is_empty()) {
        (true, _) => detail.to_string(),
        (false, true) => about.join(" "),
        (false, false) => format!("{}: {detail}", about.join(" ")),
    };
    format!(
        "{} {:<15} {what}",
        format::utc_millis(nanos),
        event["class"].as_str().unwrap_or("?")
    )
}

/// `history [-l] POOL`: the commands that changed the pool, oldest first;
/// `long` adds the txg each was written in and the host it ran on.
pub fn history(context: &Context, pool: &str, dirs: &[PathBuf], long: bool) -> Result<(), String> {
    let result = admin(context, pool, dirs, Command::History)?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    println!("History for '{pool}':");
    for record in result["history"].as_array().into_iter().flatten() {
        let time = format::utc(record["time_unix_seconds"].as_u64().unwrap_or(0));
        let command = record["command"].as_str().unwrap_or("?");
        if long {
            println!(
                "{time} {command} [txg {} on {}]",
                record["txg"],
                record["host"].as_str().unwrap_or("?")
            );
        } else {
            println!("{time} {command}");
        }
    }
    Ok(())
}
