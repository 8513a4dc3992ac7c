//! Properties (`get`, `set`, `inherit`) and replication (`send`, `receive`).

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::path::PathBuf;

use ironpool::control::client;
use ironpool::control::commands::{execute_stream, Command};
use serde_json::Value;

use super::{default_control_path, search_dirs, with_pool, Context};

/// The pool part of "POOL", "POOL/VOL" or "POOL/VOL@SNAP".
fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

/// Like `admin`, for a command that reads or writes `stream`.
fn admin_stream(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    command: Command,
    stream: RawFd,
) -> Result<Value, String> {
    let explicit = context.control.clone();
    let control = explicit
        .clone()
        .unwrap_or_else(|| default_control_path(pool));
    if explicit.is_some() || control.exists() {
        if let Some(answer) = super::server_answer(
            client::call_with_stream(&control, &command, stream),
            explicit.is_some(),
        ) {
            return answer;
        }
    }
    let dirs = search_dirs(pool, dirs)?;
    with_pool(pool, &dirs, move |pool| async move {
        execute_stream(&pool, command, stream).await
    })
}

fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

pub fn send(
    context: &Context,
    snapshot: Option<&str>,
    from: Option<&str>,
    token: Option<&str>,
    dirs: &[PathBuf],
) -> Result<(), String> {
    const STDOUT: RawFd = 1;
    if is_terminal(STDOUT) {
        return Err("refusing to write a binary stream to a terminal: redirect it to a file or pipe it into `ironpool receive`".into());
    }
    let (pool, command) = match (token, snapshot) {
        (Some(token), _) => {
            let decoded = ironpool::pool::dataset::send::ResumeToken::decode(token)
                .map_err(|error| error.to_string())?;
            (
                pool_of(&decoded.snapshot).to_string(),
                Command::Send {
                    snapshot: None,
                    from: None,
                    token: Some(token.to_string()),
                },
            )
        }
        (None, Some(snapshot)) => {
            if !snapshot.contains('@') {
                return Err(format!("'{snapshot}': send takes POOL/DATASET@SNAP"));
            }
            (
                pool_of(snapshot).to_string(),
                Command::Send {
                    snapshot: Some(snapshot.to_string()),
                    from: from.map(String::from),
                    token: None,
                },
            )
        }
        (None, None) => {
            return Err("name a snapshot to send (POOL/DATASET@SNAP), or -t TOKEN to resume".into())
        }
    };
    let result = admin_stream(context, &pool, dirs, command, STDOUT)?;
    // stdout carries the stream: the summary goes to stderr.
    if context.json {
        eprintln!("{result}");
    } else {
        eprintln!(
            "sent {}{}: {} blocks, {} freed, {} records, {} bytes",
            result["snapshot"].as_str().unwrap_or("?"),
            result["from"]
                .as_str()
                .map(|from| format!(" (from {from})"))
                .unwrap_or_default(),
            result["written_blocks"],
            result["freed_blocks"],
            result["records"],
            result["stream_bytes"]
        );
    }
    Ok(())
}

/// `receive`'s switches: -F, -s, -A.
pub struct ReceiveFlags {
    pub force: bool,
    pub save_partial: bool,
    pub abort: bool,
}

pub fn receive(
    context: &Context,
    target: &str,
    flags: ReceiveFlags,
    options: &[String],
    dirs: &[PathBuf],
) -> Result<(), String> {
    let ReceiveFlags {
        force,
        save_partial,
        abort,
    } = flags;
    let properties = super::assignments(options)?;
    const STDIN: RawFd = 0;
    if !target.contains('/') || target.contains('@') {
        return Err(format!(
            "'{target}': receive into POOL/DATASET (the snapshot name comes from the stream)"
        ));
    }
    let pool = pool_of(target);
    if abort {
        let result = super::admin(
            context,
            pool,
            dirs,
            Command::ReceiveAbort {
                target: target.to_string(),
            },
        )?;
        super::datasets::done(
            context,
            result,
            format!("discarded the interrupted receive into '{target}'"),
        );
        return Ok(());
    }
    if is_terminal(STDIN) {
        return Err(
            "the stream is read from stdin: pipe `ironpool send` into it, or redirect a file"
                .into(),
        );
    }
    let result = admin_stream(
        context,
        pool,
        dirs,
        Command::Receive {
            target: target.to_string(),
            force,
            save_partial,
            properties,
        },
        STDIN,
    )?;
    let message = format!(
        "received {}: {} blocks written, {} freed{}",
        result["snapshot"].as_str().unwrap_or("?"),
        result["written_blocks"],
        result["freed_blocks"],
        match (
            result["resumed_from_object"].as_u64(),
            result["resumed_from_block"].as_u64()
        ) {
            (Some(object), block) =>
                format!(" (resumed at object {object} block {})", block.unwrap_or(0)),
            (None, Some(block)) => format!(" (resumed at block {block})"),
            (None, None) => String::new(),
        }
    );
    super::datasets::done(context, result, message);
    Ok(())
}

pub fn get(
    context: &Context,
    properties: &str,
    name: &str,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let wanted: Vec<String> = properties
        .split(',')
        .filter(|property| !property.is_empty())
        .map(String::from)
        .collect();
    let result = super::admin(
        context,
        pool_of(name),
        dirs,
        Command::GetProperties {
            name: name.to_string(),
            properties: wanted,
        },
    )?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    let rows = result["properties"].as_array().cloned().unwrap_or_default();
    let width = rows
        .iter()
        .filter_map(|row| row["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<width$}  {:<20} {:<24} SOURCE",
        "NAME", "PROPERTY", "VALUE"
    );
    for row in rows {
        println!(
            "{:<width$}  {:<20} {:<24} {}",
            row["name"].as_str().unwrap_or("?"),
            row["property"].as_str().unwrap_or("?"),
            row["value"].as_str().unwrap_or("?"),
            row["source"].as_str().unwrap_or("-")
        );
    }
    Ok(())
}

pub fn set(
    context: &Context,
    assignments: &[String],
    name: &str,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let mut properties = BTreeMap::new();
    for assignment in assignments {
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| format!("'{assignment}': use PROPERTY=VALUE"))?;
        properties.insert(key.to_string(), value.to_string());
    }
    let result = super::admin(
        context,
        pool_of(name),
        dirs,
        Command::SetProperties {
            name: name.to_string(),
            properties,
        },
    )?;
    super::datasets::done(
        context,
        result,
        format!("set {} on '{name}'", assignments.join(" ")),
    );
    Ok(())
}

pub fn inherit(
    context: &Context,
    property: &str,
    name: &str,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let result = super::admin(
        context,
        pool_of(name),
        dirs,
        Command::InheritProperty {
            name: name.to_string(),
            property: property.to_string(),
        },
    )?;
    super::datasets::done(
        context,
        result,
        format!("'{name}' inherits {property} again"),
    );
    Ok(())
}
