//! Snapshots, clones, rollback and listings of volumes and snapshots.

use std::path::PathBuf;

use ironpool::control::commands::Command;
use serde_json::Value;

use super::format::bytes;
use super::{admin, Context};

/// The pool part of "POOL", "POOL/VOL", "POOL/VOL@SNAP" or "POOL/VOL#MARK".
fn pool_of(name: &str) -> &str {
    name.split(['/', '@', '#']).next().unwrap_or(name)
}

/// The one pool of `names` (commands act on one pool at a time).
fn one_pool<'a>(names: &'a [String], what: &str) -> Result<&'a str, String> {
    let pool = pool_of(names.first().ok_or("name a snapshot")?);
    if names.iter().any(|name| pool_of(name) != pool) {
        return Err(format!("{what} must be in one pool"));
    }
    Ok(pool)
}

pub fn list(
    context: &Context,
    kind: &str,
    verbose: bool,
    recursive: bool,
    target: Option<&str>,
    dirs: &[PathBuf],
) -> Result<(), String> {
    match kind {
        "pool" => super::list(context, target, verbose, dirs),
        "volume" | "filesystem" | "snapshot" | "bookmark" | "all" => {
            let target = target.ok_or("name the pool (or POOL/NAME) to list")?;
            let pool = pool_of(target);
            let mut rows = Vec::new();
            // POOL: every dataset; POOL/NAME: that one, and with -r the
            // ones below it (and their snapshots and bookmarks).
            let within = |name: &str| {
                let dataset = name.split(['@', '#']).next().unwrap_or(name);
                target == pool
                    || dataset == target
                    || (recursive
                        && dataset
                            .strip_prefix(target)
                            .is_some_and(|rest| rest.starts_with('/')))
            };
            let named = |row: &Value| row["name"].as_str().is_some_and(within);
            if kind == "filesystem" || kind == "all" {
                let result = admin(context, pool, dirs, Command::FsList)?;
                rows.extend(
                    result["filesystems"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(named),
                );
            }
            if kind == "volume" || kind == "all" {
                let result = admin(context, pool, dirs, Command::VolumeList)?;
                rows.extend(
                    result["volumes"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(named),
                );
            }
            // With -r the whole pool's are asked for and those below kept.
            let asked = (target != pool && !recursive).then(|| target.to_string());
            if kind == "snapshot" || kind == "all" {
                let volume = asked.clone();
                let result = admin(context, pool, dirs, Command::SnapshotList { volume })?;
                rows.extend(
                    result["snapshots"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(named),
                );
            }
            if kind == "bookmark" || kind == "all" {
                let dataset = asked.clone();
                let result = admin(context, pool, dirs, Command::BookmarkList { dataset })?;
                rows.extend(
                    result["bookmarks"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(named),
                );
            }
            // A tree reads top down: each dataset, its snapshots (oldest
            // first, as `zfs list` shows them) and bookmarks, then what is
            // below it.
            rows.sort_by_cached_key(|row| {
                let name = row["name"].as_str().unwrap_or_default().to_string();
                let (dataset, rank) = match name.find(['@', '#']) {
                    Some(at) if name[at..].starts_with('@') => (&name[..at], 1),
                    Some(at) => (&name[..at], 2),
                    None => (name.as_str(), 0),
                };
                let parts: Vec<String> = dataset.split('/').map(str::to_string).collect();
                (parts, rank, row["txg"].as_u64().unwrap_or(0), name.clone())
            });
            if context.json {
                println!("{}", serde_json::json!({ "datasets": rows }));
                return Ok(());
            }
            println!(
                "{:<40} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}  ORIGIN/MOUNTPOINT",
                "NAME", "USED", "AVAIL", "REFER", "USEDSNAP", "WRITTEN", "RATIO"
            );
            for row in rows {
                let figure = |key: &str| row[key].as_u64().map(bytes).unwrap_or_else(|| "-".into());
                println!(
                    "{:<40} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}  {}",
                    row["name"].as_str().unwrap_or("?"),
                    figure("used_bytes"),
                    figure("available_bytes"),
                    figure("referenced_bytes"),
                    figure("used_by_snapshots_bytes"),
                    figure("written_bytes"),
                    row["compress_ratio"]
                        .as_f64()
                        .map(|ratio| format!("{ratio:.2}x"))
                        .unwrap_or_else(|| "-".into()),
                    row["origin"]
                        .as_str()
                        .or(row["mountpoint"].as_str())
                        .unwrap_or("-")
                );
            }
            Ok(())
        }
        other => Err(format!(
            "-t {other}: use pool, volume, filesystem, snapshot, bookmark or all"
        )),
    }
}

pub fn done(context: &Context, result: Value, message: String) {
    if context.json {
        println!("{result}");
    } else {
        println!("{message}");
    }
}

pub fn snapshot(
    context: &Context,
    names: &[String],
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = one_pool(names, "snapshots taken together")?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::Snapshot {
            names: names.to_vec(),
            recursive,
        },
    )?;
    let taken: Vec<String> = result["snapshots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|name| name.as_str().map(String::from))
        .collect();
    done(context, result, format!("created {}", taken.join(", ")));
    Ok(())
}

pub fn destroy(
    context: &Context,
    name: &str,
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = pool_of(name);
    let (command, what) = if name.contains('#') {
        (
            Command::BookmarkDestroy {
                name: name.to_string(),
            },
            "bookmark",
        )
    } else if name.contains('@') {
        (
            Command::SnapshotDestroy {
                name: name.to_string(),
            },
            "snapshot",
        )
    } else if name.contains('/') {
        (
            Command::VolumeDestroy {
                name: name.to_string(),
                recursive,
            },
            "volume",
        )
    } else {
        return Err(format!(
            "'{name}': destroy takes POOL/VOL, POOL/FS, POOL/VOL@SNAP or POOL/VOL#BOOKMARK"
        ));
    };
    let result = admin(context, pool, dirs, command)?;
    // The server says which kind of dataset POOL/NAME was.
    let what = result["type"].as_str().unwrap_or(what).to_string();
    done(context, result, format!("destroyed {what} '{name}'"));
    Ok(())
}

/// `mount POOL/FS` (`wanted`) or `unmount POOL/FS`.
pub fn mount(context: &Context, name: &str, wanted: bool, dirs: &[PathBuf]) -> Result<(), String> {
    if !name.contains('/') || name.contains('@') {
        return Err(format!("'{name}': filesystems are named POOL/NAME"));
    }
    let pool = pool_of(name);
    let command = if wanted {
        Command::FsMount {
            name: name.to_string(),
        }
    } else {
        Command::FsUnmount {
            name: name.to_string(),
        }
    };
    let result = admin(context, pool, dirs, command)?;
    let message = match result["mounted"].as_str() {
        Some(path) => format!("mounted '{name}' at {path}"),
        None => format!("unmounted '{name}'"),
    };
    done(context, result, message);
    Ok(())
}

pub fn clone(
    context: &Context,
    origin: &str,
    name: &str,
    options: &[String],
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = pool_of(origin);
    if pool_of(name) != pool {
        return Err("a clone lives in its origin's pool".into());
    }
    let properties = super::assignments(options)?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::Clone {
            origin: origin.to_string(),
            name: name.to_string(),
            properties,
        },
    )?;
    done(
        context,
        result,
        format!("created clone '{name}' of '{origin}'"),
    );
    Ok(())
}

pub fn promote(context: &Context, name: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(
        context,
        pool_of(name),
        dirs,
        Command::Promote {
            name: name.to_string(),
        },
    )?;
    done(context, result, format!("promoted '{name}'"));
    Ok(())
}

pub fn rename(
    context: &Context,
    from: &str,
    to: &str,
    parents: bool,
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = pool_of(from);
    // A snapshot's new name may be given alone (`@NEW` or `NEW`).
    let short_snapshot = from.contains('@') && !to.contains('/');
    if !short_snapshot && pool_of(to) != pool {
        return Err(format!(
            "cannot rename {from} to {to}: a dataset stays in its pool (send and receive it to move it to another)"
        ));
    }
    let result = admin(
        context,
        pool,
        dirs,
        Command::Rename {
            from: from.to_string(),
            to: to.to_string(),
            parents,
            recursive,
        },
    )?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    for renamed in result["renamed"].as_array().into_iter().flatten() {
        println!(
            "renamed '{}' to '{}'",
            renamed["from"].as_str().unwrap_or("?"),
            renamed["to"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

pub fn rollback(
    context: &Context,
    name: &str,
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let result = admin(
        context,
        pool_of(name),
        dirs,
        Command::Rollback {
            name: name.to_string(),
            recursive,
        },
    )?;
    done(context, result, format!("rolled back to '{name}'"));
    Ok(())
}

/// `hold TAG SNAP...` (`place`) or `release TAG SNAP...`.
pub fn hold(
    context: &Context,
    tag: &str,
    snapshots: &[String],
    recursive: bool,
    place: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = one_pool(snapshots, "the snapshots")?;
    let (command, key, verb) = if place {
        (
            Command::Hold {
                tag: tag.to_string(),
                snapshots: snapshots.to_vec(),
                recursive,
            },
            "held",
            "placed hold",
        )
    } else {
        (
            Command::Release {
                tag: tag.to_string(),
                snapshots: snapshots.to_vec(),
                recursive,
            },
            "released",
            "released hold",
        )
    };
    let result = admin(context, pool, dirs, command)?;
    let names: Vec<&str> = result[key]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let message = format!("{verb} '{tag}' on {}", names.join(", "));
    done(context, result, message);
    Ok(())
}

/// `holds SNAP...`: NAME, TAG, TIMESTAMP as `zfs holds` prints them.
pub fn holds(
    context: &Context,
    snapshots: &[String],
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let pool = one_pool(snapshots, "the snapshots")?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::Holds {
            snapshots: snapshots.to_vec(),
            recursive,
        },
    )?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    println!("{:<40} {:<24} TIMESTAMP", "NAME", "TAG");
    for hold in result["holds"].as_array().cloned().unwrap_or_default() {
        println!(
            "{:<40} {:<24} {}",
            hold["snapshot"].as_str().unwrap_or("?"),
            hold["tag"].as_str().unwrap_or("?"),
            super::format::utc(hold["created_unix_seconds"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

/// `bookmark SNAP BOOKMARK`.
pub fn bookmark(
    context: &Context,
    source: &str,
    bookmark: &str,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let result = admin(
        context,
        pool_of(source),
        dirs,
        Command::Bookmark {
            source: source.to_string(),
            bookmark: bookmark.to_string(),
        },
    )?;
    let made = result["bookmark"].as_str().unwrap_or(bookmark).to_string();
    done(
        context,
        result,
        format!("created bookmark '{made}' of '{source}'"),
    );
    Ok(())
}

/// `diff [-F] SNAP [SNAP|FS]`: one line per change, tab-separated as
/// `zfs diff` prints them.
pub fn diff(
    context: &Context,
    from: &str,
    to: Option<&str>,
    types: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let to = match to {
        Some(to) => to.to_string(),
        None => from
            .split_once('@')
            .map(|(filesystem, _)| filesystem.to_string())
            .ok_or_else(|| format!("'{from}': diff starts from a snapshot, POOL/FS@SNAP"))?,
    };
    let result = admin(
        context,
        pool_of(from),
        dirs,
        Command::Diff {
            from: from.to_string(),
            to,
        },
    )?;
    if result["truncated"].as_bool() == Some(true) {
        eprintln!(
            "ironpool: more than {} changes: the rest are left out; diff a narrower pair of snapshots",
            ironpool::pool::filesystem::DIFF_ENTRIES_MAX
        );
    }
    if context.json {
        println!("{result}");
        return Ok(());
    }
    for entry in result["entries"].as_array().cloned().unwrap_or_default() {
        let mut line = entry["change"].as_str().unwrap_or("?").to_string();
        line.push('\t');
        if types {
            line.push_str(entry["file_type"].as_str().unwrap_or("?"));
            line.push('\t');
        }
        line.push_str(entry["path"].as_str().unwrap_or("?"));
        if let Some(new_path) = entry["new_path"].as_str() {
            line.push_str(" -> ");
            line.push_str(new_path);
        }
        println!("{line}");
    }
    Ok(())
}

/// `userspace` / `groupspace`: each user's (group's) space in a
/// filesystem and its quota, as `zfs userspace`.
pub fn id_space(
    context: &Context,
    name: &str,
    kind: ironpool::pool::filesystem::id_space::IdKind,
    dirs: &[PathBuf],
) -> Result<(), String> {
    use ironpool::pool::filesystem::id_space::{id_name, IdKind};
    let result = admin(
        context,
        pool_of(name),
        dirs,
        Command::IdSpace {
            name: name.to_string(),
            group: kind == IdKind::Group,
            project: kind == IdKind::Project,
        },
    )?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    println!("{:<12} {:<16} {:>9} {:>9}", "TYPE", "NAME", "USED", "QUOTA");
    for row in result["ids"].as_array().cloned().unwrap_or_default() {
        let id = row["id"].as_u64().unwrap_or(0) as u32;
        let name = id_name(kind, id).unwrap_or_else(|| id.to_string());
        println!(
            "{:<12} {:<16} {:>9} {:>9}",
            match kind {
                IdKind::User => "POSIX User",
                IdKind::Group => "POSIX Group",
                IdKind::Project => "Project",
            },
            name,
            row["used_bytes"]
                .as_u64()
                .map(bytes)
                .unwrap_or_else(|| "-".into()),
            row["quota_bytes"]
                .as_u64()
                .map(bytes)
                .unwrap_or_else(|| "none".into()),
        );
    }
    Ok(())
}
