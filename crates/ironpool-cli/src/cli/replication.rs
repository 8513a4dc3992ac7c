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
    raw: bool,
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
                    raw: false,
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
                    raw,
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
    if stdin_is_package() {
        if save_partial {
            return Err(
                "a replication package (send -R) cannot be resumed: receive it without -s".into(),
            );
        }
        return receive_replication(context, target, force, properties, dirs);
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
            received: None,
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

/// Which snapshots of each dataset an incremental package sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Between {
    /// `-i @FROM`: one stream, FROM to the snapshot sent.
    Last,
    /// `-I @FROM`: every snapshot after FROM up to the snapshot sent.
    All,
}

/// The subtree at `top` (`POOL/A`), parents first, that `send -R` sends:
/// each dataset with its kind and its snapshots up to and including
/// `snapshot`, oldest first. A dataset without that snapshot is left out
/// with those below it (they could not be received without it), said on
/// stderr, as `zfs send -R` skips them. With `from` (an incremental
/// package), a dataset that has snapshot `from` starts from it (the
/// snapshots after it, per `between`); one made since is sent whole (the
/// snapshot sent only, with `Between::Last`).
fn replication_subtree(
    context: &Context,
    pool: &str,
    top: &str,
    snapshot: &str,
    from: Option<(&str, Between)>,
    dirs: &[PathBuf],
) -> Result<(Vec<ironpool::format::package::PackageDataset>, Vec<String>), String> {
    let datasets = subtree_datasets(context, pool, top, dirs)?;
    if datasets.is_empty() {
        return Err(format!("no dataset '{top}'"));
    }
    let mut snapshots = snapshots_by_dataset(context, pool, dirs)?;
    let below_top = |name: &str| {
        name.strip_prefix(top)
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string()
    };
    let mut chosen = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut unsent = Vec::new();
    for (name, kind) in datasets {
        if skipped.iter().any(|gone| {
            name.strip_prefix(gone.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        }) {
            unsent.push(below_top(&name));
            continue;
        }
        let mut own = snapshots.remove(&name).unwrap_or_default();
        let existing: Vec<String> = own.iter().map(|(_, snap)| snap.clone()).collect();
        let Some(position) = own.iter().position(|(_, snap)| snap == snapshot) else {
            eprintln!(
                "ironpool: {name} has no snapshot @{snapshot}: not sent, nor what is below it"
            );
            unsent.push(below_top(&name));
            skipped.push(name);
            continue;
        };
        own.truncate(position + 1);
        let mut base = None;
        if let Some((from, between)) = from {
            match own.iter().position(|(_, snap)| snap == from) {
                Some(start) if start == position => {
                    return Err(format!(
                        "{name}@{from} is the snapshot sent: nothing to send from it"
                    ));
                }
                Some(start) => {
                    own.drain(..=start);
                    base = Some(from.to_string());
                }
                None => {}
            }
            if between == Between::Last {
                own.drain(..own.len() - 1);
            }
            if name == top && base.is_none() {
                return Err(format!(
                    "{top} has no snapshot @{from} before @{snapshot}: send it whole (without -i)"
                ));
            }
        }
        let result = super::admin(
            context,
            pool,
            dirs,
            Command::GetProperties {
                name: name.clone(),
                properties: Vec::new(),
            },
        )?;
        // Its own settings; the stream carries the size and block size.
        let properties = result["properties"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["source"] == "local" || row["source"] == "received")
            .filter_map(|row| Some((row["property"].as_str()?, row["value"].as_str()?)))
            .filter(|(property, _)| !matches!(*property, "volsize" | "volblocksize"))
            .map(|(property, value)| (property.to_string(), value.to_string()))
            .collect();
        chosen.push(ironpool::format::package::PackageDataset {
            name: below_top(&name),
            kind,
            properties,
            snapshots: own.into_iter().map(|(_, snap)| snap).collect(),
            from: base,
            existing: Some(existing),
        });
    }
    if chosen.is_empty() {
        return Err(format!("{top} has no snapshot @{snapshot}"));
    }
    Ok((chosen, unsent))
}

/// The datasets at and below `top` (`POOL/A`), with their kinds
/// (`filesystem`, `volume`), sorted by name (a parent before its children).
fn subtree_datasets(
    context: &Context,
    pool: &str,
    top: &str,
    dirs: &[PathBuf],
) -> Result<Vec<(String, String)>, String> {
    let within = |name: &str| {
        name == top
            || name
                .strip_prefix(top)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let mut datasets: Vec<(String, String)> = Vec::new();
    for (command, list, kind) in [
        (Command::FsList, "filesystems", "filesystem"),
        (Command::VolumeList, "volumes", "volume"),
    ] {
        let listed = super::admin(context, pool, dirs, command)?;
        for row in listed[list].as_array().into_iter().flatten() {
            if let Some(name) = row["name"].as_str().filter(|name| within(name)) {
                datasets.push((name.to_string(), kind.into()));
            }
        }
    }
    datasets.sort();
    Ok(datasets)
}

/// Every snapshot of the pool, by dataset: (txg, name), oldest first.
fn snapshots_by_dataset(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
) -> Result<BTreeMap<String, Vec<(u64, String)>>, String> {
    let listed = super::admin(context, pool, dirs, Command::SnapshotList { volume: None })?;
    let mut snapshots: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for row in listed["snapshots"].as_array().into_iter().flatten() {
        let (Some(full), Some(txg)) = (row["name"].as_str(), row["txg"].as_u64()) else {
            continue;
        };
        if let Some((dataset, name)) = full.split_once('@') {
            snapshots
                .entry(dataset.to_string())
                .or_default()
                .push((txg, name.to_string()));
        }
    }
    for own in snapshots.values_mut() {
        own.sort();
    }
    Ok(snapshots)
}

/// `send -R POOL/A@SNAP`: a replication package (see
/// `ironpool::format::package`) of `POOL/A` and every dataset below it
/// with their properties and snapshots up to `@SNAP`: each dataset's
/// first snapshot as a full stream, each later one incremental from the
/// one before. With `from` (`-i @FROM`, `-I @FROM`): an incremental
/// package, for a receiver that has FROM of the subtree.
pub fn send_replication(
    context: &Context,
    snapshot: &str,
    from: Option<(&str, Between)>,
    raw: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    use ironpool::format::package::{
        write_header, Manifest, MANIFEST_VERSION, MANIFEST_VERSION_INCREMENTAL,
    };
    use std::io::Write;
    const STDOUT: RawFd = 1;
    if is_terminal(STDOUT) {
        return Err("refusing to write a binary stream to a terminal: redirect it to a file or pipe it into `ironpool receive`".into());
    }
    let (top, name) = snapshot
        .split_once('@')
        .ok_or_else(|| format!("'{snapshot}': send -R takes POOL/DATASET@SNAP"))?;
    if !top.contains('/') {
        return Err(format!(
            "'{snapshot}': send -R takes POOL/DATASET@SNAP (a dataset and what is below it)"
        ));
    }
    let pool = pool_of(top);
    // `-i @FROM`, or `-i POOL/A@FROM` of the top dataset itself.
    let from = match from {
        Some((base, between)) => {
            let (dataset, base_name) = base.split_once('@').ok_or_else(|| {
                format!("'{base}': send -R -i takes the base as @SNAP (of every dataset sent)")
            })?;
            if !dataset.is_empty() && dataset != top {
                return Err(format!(
                    "'{base}': the base of send -R is a snapshot of {top} (and of those below it): give @{base_name}"
                ));
            }
            Some((base_name, between))
        }
        None => None,
    };
    let (datasets, unsent) = replication_subtree(context, pool, top, name, from, dirs)?;
    let manifest = Manifest {
        version: if from.is_some() {
            MANIFEST_VERSION_INCREMENTAL
        } else {
            MANIFEST_VERSION
        },
        snapshot: name.to_string(),
        from: from.map(|(base, _)| base.to_string()),
        datasets,
        unsent: Some(unsent),
    };
    let mut stdout = std::io::stdout().lock();
    write_header(&mut stdout, &manifest)
        .and_then(|()| stdout.flush())
        .map_err(|error| format!("writing the stream: {error}"))?;
    drop(stdout);
    for dataset in &manifest.datasets {
        let full = match dataset.name.as_str() {
            "" => top.to_string(),
            below => format!("{top}/{below}"),
        };
        for (index, snap) in dataset.snapshots.iter().enumerate() {
            let from = match index {
                0 => dataset.from.as_ref().map(|base| format!("@{base}")),
                _ => Some(format!("@{}", dataset.snapshots[index - 1])),
            };
            let command = Command::Send {
                snapshot: Some(format!("{full}@{snap}")),
                from: from.clone(),
                token: None,
                raw,
            };
            let result = admin_stream(context, pool, dirs, command, STDOUT)?;
            if context.json {
                eprintln!("{result}");
            } else {
                eprintln!(
                    "sent {full}@{snap}{}: {} bytes",
                    from.map(|from| format!(" (from {from})"))
                        .unwrap_or_default(),
                    result["stream_bytes"]
                );
            }
        }
    }
    Ok(())
}

/// The first 8 bytes of stdin without consuming them, when stdin allows
/// it: a file is read at its offset, a pipe through `tee(2)` (which copies
/// what waits in it into a second pipe). Anything else: None.
fn peek_stdin() -> Option<[u8; 8]> {
    use std::os::fd::AsRawFd;
    // SAFETY: a stat is plain data, valid zeroed.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of stdin into `stat`, which outlives the call.
    if unsafe { libc::fstat(0, &mut stat) } != 0 {
        return None;
    }
    let mut bytes = [0u8; 8];
    match stat.st_mode & libc::S_IFMT {
        libc::S_IFREG => {
            // SAFETY: asks stdin's offset; moves nothing.
            let offset = unsafe { libc::lseek(0, 0, libc::SEEK_CUR) };
            // SAFETY: reads at most 8 bytes into `bytes`, 8 bytes long.
            let read = unsafe { libc::pread(0, bytes.as_mut_ptr().cast(), 8, offset) };
            (read == 8).then_some(bytes)
        }
        libc::S_IFIFO => {
            let (reader, writer) = pipe().ok()?;
            // Waits until the writer has put something in (or closed).
            for _ in 0..PEEK_ATTEMPTS {
                // SAFETY: tee between two pipes; `bytes` is 8 bytes long.
                let copied = unsafe { libc::tee(0, writer.as_raw_fd(), 8, 0) };
                if copied <= 0 {
                    return None;
                }
                // SAFETY: reads at most 8 bytes into `bytes`, 8 bytes long.
                let read = unsafe { libc::read(reader.as_raw_fd(), bytes.as_mut_ptr().cast(), 8) };
                if read == 8 {
                    return Some(bytes);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            None
        }
        _ => None,
    }
}

/// A pipe, (read end, write end), closed on exec.
fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut ends = [0; 2];
    // SAFETY: pipe2 fills `ends`, two ints.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) })
}

/// Times `peek_stdin` looks again at a pipe holding fewer than 8 bytes
/// (10 ms apart): a sender writes a stream's first bytes in one go.
const PEEK_ATTEMPTS: usize = 500;

/// Whether stdin holds a replication package (`send -R`).
pub fn stdin_is_package() -> bool {
    peek_stdin() == Some(ironpool::format::package::PACKAGE_MAGIC)
}

/// `receive POOL/TARGET` of a replication package: every dataset of it
/// created (or updated, with `-F`) below `target` in turn, parents
/// first, each stream handed to the server through a pipe of its own. An
/// incremental package's datasets that start from its base update the
/// copies received before (which must have the base; `-F` rolls them
/// back to it first); those made since are created.
/// `properties` (`-o`) are set on the top one, whose children inherit
/// them.
pub fn receive_replication(
    context: &Context,
    target: &str,
    force: bool,
    properties: BTreeMap<String, String>,
    dirs: &[PathBuf],
) -> Result<(), String> {
    use ironpool::format::package::{copy_one_stream, read_manifest, PACKAGE_MAGIC};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    // A server that refuses a stream closes its end: the copy then gets
    // EPIPE (and stops) instead of the process dying of SIGPIPE.
    // SAFETY: changing a signal's disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let pool = pool_of(target).to_string();
    let mut input = std::io::BufReader::with_capacity(1 << 20, std::io::stdin());
    let mut magic = [0u8; 8];
    input
        .read_exact(&mut magic)
        .map_err(|error| format!("reading the stream: {error}"))?;
    if magic != PACKAGE_MAGIC {
        return Err("not a replication package".into());
    }
    let manifest = read_manifest(&mut input).map_err(|error| error.to_string())?;
    let mut received = Vec::new();
    for dataset in &manifest.datasets {
        let name = match dataset.name.as_str() {
            "" => target.to_string(),
            below => format!("{target}/{below}"),
        };
        for (index, snapshot) in dataset.snapshots.iter().enumerate() {
            let (reader, writer) = pipe().map_err(|error| format!("pipe: {error}"))?;
            let mut source = std::mem::replace(
                &mut input,
                std::io::BufReader::with_capacity(0, std::io::stdin()),
            );
            let copier = std::thread::spawn(move || {
                let mut sink = std::fs::File::from(writer);
                let copied = copy_one_stream(&mut source, &mut sink);
                (source, copied)
            });
            // The package's properties are received (they apply where the
            // copy sets none); `-o` sets the top one's locally.
            let wanted = if index == 0 && dataset.name.is_empty() {
                properties.clone()
            } else {
                BTreeMap::new()
            };
            let answer = admin_stream(
                context,
                &pool,
                dirs,
                Command::Receive {
                    target: name.clone(),
                    force: force && index == 0,
                    save_partial: false,
                    properties: wanted,
                    received: (index == 0).then(|| dataset.properties.clone()),
                },
                reader.as_raw_fd(),
            );
            drop(reader);
            let (source, copied) = copier
                .join()
                .map_err(|_| "the stream copy panicked".to_string())?;
            input = source;
            let result = answer?;
            copied.map_err(|error| format!("{name}@{snapshot}: {error}"))?;
            if !context.json {
                println!(
                    "received {}: {} blocks written, {} freed",
                    result["snapshot"].as_str().unwrap_or("?"),
                    result["written_blocks"],
                    result["freed_blocks"]
                );
            }
            received.push(result);
        }
    }
    // Nothing may follow the last stream.
    let mut rest = [0u8; 1];
    if input.read(&mut rest).map_err(|error| error.to_string())? != 0 {
        return Err("bytes follow the package's last stream: the package is damaged".into());
    }
    // Only once every stream is in: a damaged package destroys nothing.
    let destroyed = if force {
        destroy_gone_on_sender(context, &pool, target, &manifest, dirs)?
    } else {
        Vec::new()
    };
    if context.json {
        println!(
            "{}",
            serde_json::json!({ "received": received, "destroyed": destroyed })
        );
    } else {
        for name in &destroyed {
            println!("destroyed {name} (gone on the sender)");
        }
    }
    Ok(())
}

/// `receive -F` of a package, once its streams are in: destroys the
/// snapshots of each received dataset that its sender no longer has, and
/// the datasets below `target` the sender no longer has (with what is
/// below them), as `zfs receive -F` of a replication stream does, so the
/// copy mirrors the sender. A package that does not say what its sender
/// has (an older build's) destroys nothing. Returns the names destroyed.
fn destroy_gone_on_sender(
    context: &Context,
    pool: &str,
    target: &str,
    manifest: &ironpool::format::package::Manifest,
    dirs: &[PathBuf],
) -> Result<Vec<String>, String> {
    let Some(unsent) = &manifest.unsent else {
        return Ok(Vec::new());
    };
    let full_name = |below: &str| match below {
        "" => target.to_string(),
        below => format!("{target}/{below}"),
    };
    let mut destroyed = Vec::new();
    let mut snapshots = snapshots_by_dataset(context, pool, dirs)?;
    for dataset in &manifest.datasets {
        let Some(existing) = &dataset.existing else {
            continue;
        };
        let name = full_name(&dataset.name);
        for (_, snapshot) in snapshots.remove(&name).unwrap_or_default() {
            if existing.contains(&snapshot) {
                continue;
            }
            let gone = format!("{name}@{snapshot}");
            super::admin(
                context,
                pool,
                dirs,
                Command::SnapshotDestroy { name: gone.clone() },
            )
            .map_err(|error| format!("destroying {gone} (gone on the sender): {error}"))?;
            destroyed.push(gone);
        }
    }
    let known: Vec<String> = manifest
        .datasets
        .iter()
        .map(|dataset| full_name(&dataset.name))
        .chain(unsent.iter().map(|below| full_name(below)))
        .collect();
    let mut gone: Vec<String> = Vec::new();
    for (name, _) in subtree_datasets(context, pool, target, dirs)? {
        let below_gone = gone.iter().any(|parent| {
            name.strip_prefix(parent.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        });
        if known.contains(&name) || below_gone {
            continue;
        }
        super::admin(
            context,
            pool,
            dirs,
            Command::VolumeDestroy {
                name: name.clone(),
                recursive: true,
            },
        )
        .map_err(|error| format!("destroying {name} (gone on the sender): {error}"))?;
        gone.push(name);
    }
    destroyed.extend(gone);
    Ok(destroyed)
}
