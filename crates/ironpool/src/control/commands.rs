//! Administrative commands, as JSON in and JSON out.
//!
//! The same code answers the control socket of a running server and the CLI when
//! it opens a pool itself, so both paths behave identically.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::nbd::server::ServerStats;
use crate::pool::dataset::send::SendRequest;
use crate::pool::datasets::receive::ReceiveOptions;
use crate::pool::volume::VOLUME_BLOCK_BYTES_DEFAULT;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::units::parse_size;

/// A command sent to a pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    Status,
    /// The pool's space and health; with `verbose` (`list -v`), each
    /// vdev's too (a walk of its free extents for fragmentation, so not by
    /// default: scripts and the bench poll `list`).
    List {
        #[serde(default)]
        verbose: bool,
    },
    Iostat,
    /// The read cache's counters (`ironpool arcstat`).
    Arcstat,
    VolumeCreate {
        name: String,
        size_bytes: u64,
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// No `refreservation` (`volume create -s`): the volume takes space
        /// as it is written, and a full pool can refuse its writes. Without
        /// it a volume is thick, as in OpenZFS (`refreservation=auto`).
        #[serde(default)]
        sparse: bool,
        /// Create the missing parents as filesystems first (`-p`).
        #[serde(default)]
        parents: bool,
        /// The user's key of an encrypted volume (`-o encryption=on`), in
        /// hexadecimal, when the caller read it (`keylocation=prompt`);
        /// never written to the pool's history.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    VolumeList,
    /// Loads the key of an encrypted volume (`load-key`), from `key` (the
    /// user's key in hexadecimal, as read by the caller) or its
    /// `keylocation`; with `all`, every key whose `keylocation` is a file.
    LoadKey {
        #[serde(default)]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default)]
        all: bool,
    },
    /// Unloads the key of an encrypted volume (`unload-key`).
    UnloadKey {
        name: String,
    },
    /// Wraps an encrypted volume's master key under a new user's key
    /// (`change-key`), optionally in another format or location.
    ChangeKey {
        name: String,
        #[serde(default)]
        properties: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// Creates a filesystem (`ironpool fs create [-p] POOL/A/B -o ...`).
    FsCreate {
        name: String,
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Create the missing parents as filesystems first (`-p`).
        #[serde(default)]
        parents: bool,
        /// An encrypted filesystem's user key, in hexadecimal, when it was
        /// read at a prompt (`keylocation=prompt`); never in the history.
        #[serde(default)]
        key: Option<String>,
    },
    FsList,
    /// Destroys a filesystem; `recursive`: its snapshots and every
    /// dataset below it too.
    FsDestroy {
        name: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Mounts a filesystem the server serves (`ironpool mount POOL/NAME`),
    /// after an `unmount`.
    FsMount {
        name: String,
    },
    /// Unmounts a filesystem until `mount` or the next `serve`.
    FsUnmount {
        name: String,
    },
    /// Destroys a volume or a filesystem; `recursive`: its snapshots and
    /// every dataset below it too.
    VolumeDestroy {
        name: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Takes snapshots "POOL/VOL@NAME" atomically (one txg); `recursive` with a
    /// name "POOL@NAME" snapshots every volume.
    Snapshot {
        names: Vec<String>,
        #[serde(default)]
        recursive: bool,
    },
    /// Lists snapshots (of one volume, or all).
    SnapshotList {
        #[serde(default)]
        volume: Option<String>,
    },
    SnapshotDestroy {
        name: String,
    },
    /// Places user hold `tag` on snapshots (`ironpool hold TAG SNAP...`);
    /// `recursive` with POOL@NAME or POOL/DS@NAME: that snapshot of every
    /// dataset under the name that has it.
    Hold {
        tag: String,
        snapshots: Vec<String>,
        #[serde(default)]
        recursive: bool,
    },
    /// Takes user hold `tag` off snapshots (`ironpool release`).
    Release {
        tag: String,
        snapshots: Vec<String>,
        #[serde(default)]
        recursive: bool,
    },
    /// Lists the user holds of snapshots (`ironpool holds`).
    Holds {
        snapshots: Vec<String>,
        #[serde(default)]
        recursive: bool,
    },
    /// Makes bookmark `bookmark` (POOL/DS#NAME or #NAME) of `source`, a
    /// snapshot or a bookmark (`ironpool bookmark`).
    Bookmark {
        source: String,
        bookmark: String,
    },
    /// Lists bookmarks (of one dataset, or all).
    BookmarkList {
        #[serde(default)]
        dataset: Option<String>,
    },
    BookmarkDestroy {
        name: String,
    },
    /// The space each user (or, with `group`, each group; with `project`,
    /// each project) owning objects of filesystem `name` uses, and their
    /// quotas (`ironpool userspace`, `groupspace`, `projectspace`).
    IdSpace {
        name: String,
        #[serde(default)]
        group: bool,
        #[serde(default)]
        project: bool,
    },
    /// What changed in a filesystem from snapshot `from` to a later one
    /// or the filesystem itself (`ironpool diff`).
    Diff {
        from: String,
        to: String,
    },
    Clone {
        origin: String,
        name: String,
        /// Properties of the clone (`clone -o key=value`).
        #[serde(default)]
        properties: BTreeMap<String, String>,
    },
    Promote {
        name: String,
    },
    /// Renames a dataset and everything below it (`ironpool rename`);
    /// `parents`: create the new name's missing parents first. Of a
    /// snapshot (`from` has `@`): renames it, and with `recursive` the
    /// snapshot of that name of every dataset below.
    Rename {
        from: String,
        to: String,
        #[serde(default)]
        parents: bool,
        #[serde(default)]
        recursive: bool,
    },
    Rollback {
        name: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Writes a snapshot's send stream (full, incremental `from`, or resumed
    /// from `token`) to the descriptor passed with the request.
    Send {
        #[serde(default)]
        snapshot: Option<String>,
        #[serde(default)]
        from: Option<String>,
        #[serde(default)]
        token: Option<String>,
        /// `-w`: an encrypted dataset's blocks as stored (a raw stream).
        #[serde(default)]
        raw: bool,
    },
    /// Applies a send stream read from the descriptor passed with the request.
    Receive {
        target: String,
        #[serde(default)]
        force: bool,
        #[serde(default)]
        save_partial: bool,
        /// Properties to set on the received dataset (`-o`).
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Properties received with the stream (a `send -R` package's):
        /// they replace the dataset's received properties. None: a lone
        /// stream, which leaves them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        received: Option<BTreeMap<String, String>>,
    },
    /// Discards an interrupted receive.
    ReceiveAbort {
        target: String,
    },
    /// Properties of the pool ("POOL"), a volume or a snapshot; all, or those named.
    GetProperties {
        name: String,
        #[serde(default)]
        properties: Vec<String>,
    },
    /// Sets properties (all or none).
    SetProperties {
        name: String,
        properties: BTreeMap<String, String>,
    },
    /// Removes a local setting so that the pool's (or the default) applies.
    InheritProperty {
        name: String,
        property: String,
    },
    ScrubStart,
    ScrubStop,
    ScrubStatus,
    /// Discards all free space in the background (`ironpool trim`).
    TrimStart,
    TrimStop,
    TrimStatus,
    /// Stops serving and exports the pool (`ironpool export` of a served
    /// pool): the server finishes requests in flight, commits, marks the
    /// pool exported and exits, as on SIGTERM.
    Export,
    /// Adds top-level vdevs (data vdevs, or log devices), by absolute path.
    Add {
        vdevs: Vec<crate::pool::LayoutGroup>,
        #[serde(default)]
        force: bool,
    },
    /// Removes a log device (named by a device path, file name or guid, or
    /// its vdev's name) after moving the intent logs off it.
    Remove {
        device: String,
        /// Stop the removal of a data vdev in progress instead (`-s`;
        /// `device` is then unused).
        #[serde(default)]
        stop: bool,
    },
    /// Takes a device out of service.
    Offline {
        device: String,
    },
    /// Puts a device back in service (it resilvers what it missed).
    Online {
        device: String,
    },
    /// Puts the device at path `new` in the place of device `old` and
    /// resilvers it.
    Replace {
        old: String,
        new: String,
        #[serde(default)]
        force: bool,
    },
    /// Attaches device `new` beside `existing`: a disk becomes a mirror, a
    /// mirror one side wider (`ironpool attach`).
    Attach {
        existing: String,
        new: String,
        #[serde(default)]
        force: bool,
    },
    /// Detaches a side of a mirror (`ironpool detach`).
    Detach {
        device: String,
    },
    /// Splits one side of every mirror off into a new, exported pool
    /// (`ironpool split`); `devices` names the sides to take, at most one
    /// per mirror (the last side of a mirror not named).
    Split {
        new_pool: String,
        #[serde(default)]
        devices: Vec<String>,
    },
    ResilverStatus,
    /// Clears device error streaks and faults, and retries failed writes now.
    Clear,
    Check,
    /// Makes every change answered so far durable (`ironpool sync`, as
    /// `zpool sync`): of the whole pool through a txg, or with `name`, of
    /// one filesystem (through its intent log, as an `fsync` of all of it)
    /// or one volume (as a client's FLUSH).
    Sync {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    GetTunables,
    SetTunable {
        name: String,
        value: String,
    },
    /// The events numbered after `after` (`ironpool events`); with
    /// `wait_ms`, waits up to that long for one when there is none yet (a
    /// follower's long poll, bounded by [`EVENTS_WAIT_MS_MAX`]).
    Events {
        #[serde(default)]
        after: u64,
        #[serde(default)]
        wait_ms: u64,
    },
    /// The commands that changed the pool (`ironpool history`).
    History,
}

/// Longest an `events` request waits for a new event: a follower asks
/// again after it, so a server that stopped is noticed within this time.
pub const EVENTS_WAIT_MS_MAX: u64 = 10_000;

/// Events one answer carries at most (a follower asks again for the rest;
/// an answer stays well under the control socket's size limits).
pub const EVENTS_PER_ANSWER_MAX: usize = 256;

impl Command {
    /// The command as `ironpool history` shows it (the CLI's words, without
    /// the program name), for commands that change the pool; None for those
    /// that only look (status, lists, statistics, send) or change only this
    /// process (tunables).
    pub fn history_line(&self, pool: &str) -> Option<String> {
        let mut words: Vec<String> = Vec::new();
        let mut push = |word: &str| words.push(quote(word));
        match self {
            Command::VolumeCreate {
                name,
                size_bytes,
                properties,
                sparse,
                parents,
                key: _,
            } => {
                push("volume");
                push("create");
                if *sparse {
                    push("-s");
                }
                if *parents {
                    push("-p");
                }
                push(name);
                push(&size_bytes.to_string());
                for (key, value) in properties {
                    push("-o");
                    push(&format!("{key}={value}"));
                }
            }
            Command::ChangeKey {
                name,
                properties,
                key: _,
            } => {
                push("change-key");
                for (key, value) in properties {
                    push("-o");
                    push(&format!("{key}={value}"));
                }
                push(name);
            }
            Command::FsCreate {
                name,
                properties,
                parents,
                key: _,
            } => {
                push("fs");
                push("create");
                if *parents {
                    push("-p");
                }
                push(name);
                for (key, value) in properties {
                    push("-o");
                    push(&format!("{key}={value}"));
                }
            }
            Command::FsDestroy { name, recursive } => {
                push("fs");
                push("destroy");
                if *recursive {
                    push("-r");
                }
                push(name);
            }
            Command::VolumeDestroy { name, recursive } => {
                push("destroy");
                if *recursive {
                    push("-r");
                }
                push(name);
            }
            Command::Snapshot { names, recursive } => {
                push("snapshot");
                if *recursive {
                    push("-r");
                }
                for name in names {
                    push(name);
                }
            }
            Command::SnapshotDestroy { name } | Command::BookmarkDestroy { name } => {
                push("destroy");
                push(name);
            }
            Command::Hold {
                tag,
                snapshots,
                recursive,
            }
            | Command::Release {
                tag,
                snapshots,
                recursive,
            } => {
                push(if matches!(self, Command::Hold { .. }) {
                    "hold"
                } else {
                    "release"
                });
                if *recursive {
                    push("-r");
                }
                push(tag);
                for snapshot in snapshots {
                    push(snapshot);
                }
            }
            Command::Bookmark { source, bookmark } => {
                push("bookmark");
                push(source);
                push(bookmark);
            }
            Command::Clone {
                origin,
                name,
                properties,
            } => {
                push("clone");
                push(origin);
                push(name);
                for (key, value) in properties {
                    push("-o");
                    push(&format!("{key}={value}"));
                }
            }
            Command::Promote { name } => {
                push("promote");
                push(name);
            }
            Command::Rename {
                from,
                to,
                parents,
                recursive,
            } => {
                push("rename");
                if *parents {
                    push("-p");
                }
                if *recursive {
                    push("-r");
                }
                push(from);
                push(to);
            }
            Command::Rollback { name, recursive } => {
                push("rollback");
                if *recursive {
                    push("-r");
                }
                push(name);
            }
            Command::Receive {
                target,
                force,
                save_partial,
                properties,
                ..
            } => {
                push("receive");
                if *force {
                    push("-F");
                }
                if *save_partial {
                    push("-s");
                }
                for (key, value) in properties {
                    push("-o");
                    push(&format!("{key}={value}"));
                }
                push(target);
            }
            Command::ReceiveAbort { target } => {
                push("receive");
                push("-A");
                push(target);
            }
            Command::SetProperties { name, properties } => {
                push("set");
                for (key, value) in properties {
                    push(&format!("{key}={value}"));
                }
                push(name);
            }
            Command::InheritProperty { name, property } => {
                push("inherit");
                push(property);
                push(name);
            }
            Command::ScrubStart => {
                push("scrub");
                push(pool);
            }
            Command::ScrubStop => {
                push("scrub");
                push("-s");
                push(pool);
            }
            Command::TrimStart => {
                push("trim");
                push(pool);
            }
            Command::TrimStop => {
                push("trim");
                push("-s");
                push(pool);
            }
            Command::Export => {
                push("export");
                push(pool);
            }
            Command::Offline { device } => {
                push("offline");
                push(pool);
                push(device);
            }
            Command::Online { device } => {
                push("online");
                push(pool);
                push(device);
            }
            Command::Replace { old, new, force } => {
                push("replace");
                if *force {
                    push("-f");
                }
                push(pool);
                push(old);
                push(new);
            }
            Command::Clear => {
                push("clear");
                push(pool);
            }
            Command::Attach {
                existing,
                new,
                force,
            } => {
                push("attach");
                if *force {
                    push("-f");
                }
                push(pool);
                push(existing);
                push(new);
            }
            Command::Detach { device } => {
                push("detach");
                push(pool);
                push(device);
            }
            Command::Split { new_pool, devices } => {
                push("split");
                push(pool);
                push(new_pool);
                for device in devices {
                    push(device);
                }
            }
            Command::Add { vdevs, force } => {
                push("add");
                if *force {
                    push("-f");
                }
                push(pool);
                let (mut logs_named, mut spares_named) = (false, false);
                for group in vdevs {
                    if group.log && !logs_named {
                        push("log");
                        logs_named = true;
                    }
                    if group.spare && !spares_named {
                        push("spare");
                        spares_named = true;
                    }
                    if group.kind != crate::format::label::TopVdevKind::Disk {
                        let name = group.kind.vdev_name(0);
                        push(name.trim_end_matches("-0"));
                    }
                    for path in &group.paths {
                        push(&path.display().to_string());
                    }
                }
            }
            Command::Remove { device, stop } => {
                push("remove");
                if *stop {
                    push("-s");
                    push(pool);
                } else {
                    push(pool);
                    push(device);
                }
            }
            Command::Status
            | Command::List { .. }
            | Command::Iostat
            | Command::Arcstat
            | Command::VolumeList
            | Command::FsList
            | Command::FsMount { .. }
            | Command::FsUnmount { .. }
            | Command::SnapshotList { .. }
            | Command::Holds { .. }
            | Command::BookmarkList { .. }
            | Command::Diff { .. }
            | Command::IdSpace { .. }
            | Command::Send { .. }
            | Command::GetProperties { .. }
            | Command::ScrubStatus
            | Command::TrimStatus
            | Command::ResilverStatus
            | Command::Check
            | Command::Sync { .. }
            | Command::LoadKey { .. }
            | Command::UnloadKey { .. }
            | Command::GetTunables
            | Command::SetTunable { .. }
            | Command::Events { .. }
            | Command::History => return None,
        }
        Some(words.join(" "))
    }
}

/// The user's key sent in hexadecimal, as bytes that are zeroed when
/// dropped.
fn key_material(key: Option<String>) -> Result<Option<zeroize::Zeroizing<Vec<u8>>>, PoolError> {
    let Some(key) = key.map(zeroize::Zeroizing::new) else {
        return Ok(None);
    };
    crate::pool::dataset::keys::unhex(&key)
        .map(|bytes| Some(zeroize::Zeroizing::new(bytes)))
        .ok_or_else(|| PoolError::InvalidArgument("the key sent is not hexadecimal".into()))
}

/// A word of a command line as a shell would need it: plain when it has
/// nothing a shell treats specially, else in single quotes.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|character| character.is_ascii_alphanumeric() || "-_./:@=%+,".contains(character));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The control protocol's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn from_result(result: Result<Value, PoolError>) -> Response {
        match result {
            Ok(value) => Response {
                ok: true,
                result: Some(value),
                error: None,
            },
            Err(error) => Response {
                ok: false,
                result: None,
                error: Some(error.to_string()),
            },
        }
    }
}

/// Runs a stream command (send, receive) on `pool` with `stream` as its input or
/// output; other commands run as [`execute`] does.
pub async fn execute_stream(
    pool: &Rc<Pool>,
    command: Command,
    stream: std::os::fd::RawFd,
) -> Result<Value, PoolError> {
    let history = command.history_line(pool.name());
    let result = run_stream(pool, command, stream).await;
    record_history(pool, history, &result).await;
    result
}

/// A command that succeeded and changed the pool goes into its history
/// (and is on disk before the command answers).
async fn record_history(pool: &Rc<Pool>, line: Option<String>, result: &Result<Value, PoolError>) {
    if let (Some(line), Ok(_)) = (line, result) {
        pool.commit_history(line).await;
    }
}

async fn run_stream(
    pool: &Rc<Pool>,
    command: Command,
    stream: std::os::fd::RawFd,
) -> Result<Value, PoolError> {
    let stream = &crate::pool::dataset::stream_io::FdStream(stream);
    match command {
        Command::Send {
            snapshot,
            from,
            token,
            raw,
        } => {
            let request = match token {
                Some(token) => {
                    let token = crate::pool::dataset::send::ResumeToken::decode(&token)?;
                    let from = token.from.clone();
                    let request = SendRequest {
                        snapshot: token.snapshot.clone(),
                        from,
                        resume_block: Some(token.next_block),
                        resume_object: (token.next_object != 0).then_some(token.next_object),
                        raw: token.raw,
                    };
                    check_token_guids(pool, &token)?;
                    request
                }
                None => SendRequest {
                    snapshot: snapshot.ok_or_else(|| {
                        PoolError::InvalidArgument("name the snapshot to send".into())
                    })?,
                    from,
                    resume_block: None,
                    resume_object: None,
                    raw,
                },
            };
            let summary = pool.send(request, stream).await?;
            Ok(serde_json::to_value(summary).unwrap_or(Value::Null))
        }
        Command::Receive {
            target,
            force,
            save_partial,
            properties,
            received,
        } => {
            let summary = pool
                .receive(
                    ReceiveOptions {
                        target,
                        force,
                        save_partial,
                        properties,
                        received,
                    },
                    stream,
                )
                .await?;
            Ok(serde_json::to_value(summary).unwrap_or(Value::Null))
        }
        other => execute(pool, other, None).await,
    }
}

/// A resume token names snapshots: they must still be the same ones (guids).
fn check_token_guids(
    pool: &Pool,
    token: &crate::pool::dataset::send::ResumeToken,
) -> Result<(), PoolError> {
    let guid_of = |name: &str| -> Option<u64> {
        let (volume, snapshot) = crate::pool::dataset::split_snapshot_name(pool.name(), name)?;
        pool.directory()
            .lineage(volume)?
            .snapshot(snapshot)
            .map(|existing| existing.guid)
    };
    if guid_of(&token.snapshot) != Some(token.to_guid) {
        return Err(PoolError::InvalidArgument(format!(
            "the token's snapshot {} is gone or was replaced",
            token.snapshot
        )));
    }
    if let Some(from) = &token.from {
        if guid_of(from) != Some(token.from_guid) {
            return Err(PoolError::InvalidArgument(format!(
                "the token's source snapshot {from} is gone or was replaced"
            )));
        }
    }
    Ok(())
}

/// Runs `command` on `pool`; one that changed the pool is recorded in its
/// history.
pub async fn execute(
    pool: &Rc<Pool>,
    command: Command,
    server: Option<ServerStats>,
) -> Result<Value, PoolError> {
    let history = command.history_line(pool.name());
    let result = run(pool, command, server).await;
    record_history(pool, history, &result).await;
    result
}

async fn run(
    pool: &Rc<Pool>,
    command: Command,
    server: Option<ServerStats>,
) -> Result<Value, PoolError> {
    match command {
        Command::Status => Ok(status(pool)),
        Command::List { verbose } => Ok(json!({ "pools": [list_entry(pool, verbose)] })),
        Command::Iostat => Ok(iostat(pool, server)),
        Command::Arcstat => Ok(arcstat(pool)),
        Command::VolumeCreate {
            name,
            size_bytes,
            mut properties,
            sparse,
            parents,
            key,
        } => {
            let encryption =
                crate::pool::dataset::keys::CreateKey::take(&mut properties, key_material(key)?)?;
            if parents {
                create_parents(pool, &name).await?;
            }
            let block_bytes = match properties.remove("volblocksize") {
                Some(text) => parse_size(&text).map_err(PoolError::InvalidArgument)? as u32,
                None => VOLUME_BLOCK_BYTES_DEFAULT,
            };
            if !sparse && !properties.contains_key("refreservation") {
                properties.insert("refreservation".into(), "auto".into());
            }
            let volume = pool
                .create_volume_with(&name, size_bytes, block_bytes, properties, encryption)
                .await?;
            Ok(
                json!({ "name": volume.name(), "size_bytes": volume.size_bytes.get(), "block_bytes": volume.block_bytes }),
            )
        }
        Command::FsCreate {
            name,
            properties,
            parents,
            key,
        } => {
            if parents {
                create_parents(pool, &name).await?;
            }
            let fs = pool
                .create_filesystem_keyed(&name, properties, key_material(key)?)
                .await?;
            Ok(json!({ "name": fs.name(), "recordsize": fs.record_bytes() }))
        }
        Command::FsDestroy { name, recursive } => {
            let destroyed = destroy_filesystem_tree(pool, &name, recursive).await?;
            Ok(
                json!({ "name": name, "destroyed": name, "type": "filesystem", "datasets": destroyed }),
            )
        }
        Command::FsList => {
            let mut filesystems = Vec::new();
            for (short, fs) in pool.filesystems() {
                let Some(record) = pool.filesystem_record(&short) else {
                    continue;
                };
                let origin = pool.origin_name(&record.lineage);
                let snapshots = record.lineage.snapshots.len();
                let properties = record.properties;
                let stats = fs.stats(pool);
                let mut entry = json!({
                    "name": fs.name(),
                    "type": "filesystem",
                    "origin": origin,
                    "snapshots": snapshots,
                    "mountpoint": pool.filesystem_mountpoint(&short),
                    "mounted": pool.mounted_at(&short),
                    "recordsize": fs.record_bytes(),
                    "objects": stats.objects,
                    // Objects in memory now (bounded by the
                    // fs_objects_loaded_max tunable after each txg).
                    "loaded_objects": fs.objects.loaded_objects(),
                    "properties": properties,
                    "front_end": fs.front_end(),
                });
                let space = pool.volume_space(&short).await?;
                if let (Value::Object(map), Ok(Value::Object(figures))) =
                    (&mut entry, serde_json::to_value(space))
                {
                    map.extend(figures);
                }
                entry["available_bytes"] = json!(pool.available_bytes(&short).await?);
                filesystems.push(entry);
            }
            Ok(json!({ "filesystems": filesystems }))
        }
        Command::FsMount { name } => {
            let at = pool.set_mounted(&name, true).await?;
            Ok(json!({ "name": name, "mounted": at }))
        }
        Command::FsUnmount { name } => {
            pool.set_mounted(&name, false).await?;
            Ok(json!({ "name": name, "mounted": null }))
        }
        Command::VolumeList => {
            let mut volumes = volume_list(pool);
            for entry in volumes.iter_mut() {
                let name = entry["name"].as_str().unwrap_or_default().to_string();
                let space = pool.volume_space(&name).await?;
                if let (Value::Object(map), Ok(Value::Object(figures))) =
                    (&mut *entry, serde_json::to_value(space))
                {
                    map.extend(figures);
                }
                entry["available_bytes"] = json!(pool.available_bytes(&name).await?);
            }
            Ok(json!({ "volumes": volumes }))
        }
        Command::Snapshot { names, recursive } => {
            let targets = snapshot_targets(pool, names, recursive)?;
            if targets.is_empty() {
                return Err(PoolError::InvalidArgument(
                    "no volume or filesystem to snapshot".into(),
                ));
            }
            pool.snapshot(&targets).await?;
            Ok(json!({ "snapshots": targets }))
        }
        Command::SnapshotList { volume } => {
            let volumes: Vec<String> = match volume {
                Some(volume) => vec![volume],
                None => dataset_names(pool),
            };
            let mut snapshots = Vec::new();
            for volume in volumes {
                snapshots.extend(pool.snapshots(&volume).await?);
            }
            Ok(json!({ "snapshots": snapshots }))
        }
        Command::SnapshotDestroy { name } => {
            pool.destroy_snapshot(&name).await?;
            Ok(json!({ "destroyed": name }))
        }
        Command::Hold {
            tag,
            snapshots,
            recursive,
        } => {
            let targets = existing_snapshots(pool, snapshots, recursive)?;
            pool.hold(&tag, &targets).await?;
            Ok(json!({ "held": targets, "tag": tag }))
        }
        Command::Release {
            tag,
            snapshots,
            recursive,
        } => {
            let targets = existing_snapshots(pool, snapshots, recursive)?;
            pool.release(&tag, &targets).await?;
            Ok(json!({ "released": targets, "tag": tag }))
        }
        Command::Holds {
            snapshots,
            recursive,
        } => {
            let targets = existing_snapshots(pool, snapshots, recursive)?;
            Ok(json!({ "holds": pool.holds(&targets)? }))
        }
        Command::Bookmark { source, bookmark } => {
            let made = pool.bookmark(&source, &bookmark).await?;
            Ok(json!({ "bookmark": made, "source": source }))
        }
        Command::BookmarkList { dataset } => {
            Ok(json!({ "bookmarks": pool.bookmarks(dataset.as_deref())? }))
        }
        Command::IdSpace {
            name,
            group,
            project,
        } => {
            use crate::pool::filesystem::id_space::IdKind;
            let kind = match (group, project) {
                (_, true) => IdKind::Project,
                (true, false) => IdKind::Group,
                (false, false) => IdKind::User,
            };
            Ok(json!({ "name": name, "ids": pool.id_space(&name, &[kind]).await? }))
        }
        Command::Diff { from, to } => {
            let report = pool.diff(&from, &to).await?;
            Ok(serde_json::to_value(report).unwrap_or(Value::Null))
        }
        Command::BookmarkDestroy { name } => {
            pool.destroy_bookmark(&name).await?;
            Ok(json!({ "destroyed": name, "type": "bookmark" }))
        }
        Command::Clone {
            origin,
            name,
            properties,
        } => {
            let of_filesystem = crate::pool::dataset::split_snapshot_name(pool.name(), &origin)
                .is_some_and(|(dataset, _)| pool.filesystem(dataset).is_ok());
            let made = if of_filesystem {
                pool.clone_filesystem(&origin, &name, properties)
                    .await?
                    .name()
                    .clone()
            } else {
                let made = pool.clone_snapshot(&origin, &name).await?.name();
                if !properties.is_empty() {
                    pool.set_properties(&made, &properties).await?;
                }
                made
            };
            Ok(json!({ "name": made, "origin": origin }))
        }
        Command::Promote { name } => {
            pool.promote(&name).await?;
            Ok(json!({ "promoted": name }))
        }
        Command::Rename {
            from,
            to,
            parents,
            recursive,
        } => {
            let renamed = if from.contains('@') {
                pool.rename_snapshot(&from, &to, recursive).await?
            } else if recursive {
                return Err(PoolError::InvalidArgument(
                    "rename -r renames snapshots (POOL/DS@OLD NEW); a dataset's rename always moves everything below it".into(),
                ));
            } else {
                if parents {
                    create_parents(pool, &to).await?;
                }
                pool.rename_dataset(&from, &to).await?
            };
            let renamed: Vec<Value> = renamed
                .into_iter()
                .map(|(old, new)| json!({ "from": old, "to": new }))
                .collect();
            Ok(json!({ "renamed": renamed }))
        }
        Command::Rollback { name, recursive } => {
            pool.rollback(&name, recursive).await?;
            Ok(json!({ "rolled_back_to": name }))
        }
        // `destroy POOL/NAME` names a volume or a filesystem.
        Command::VolumeDestroy { name, recursive }
            if !name.contains('@') && pool.filesystem(&name).is_ok() =>
        {
            let destroyed = destroy_filesystem_tree(pool, &name, recursive).await?;
            Ok(json!({ "destroyed": name, "type": "filesystem", "datasets": destroyed }))
        }
        Command::VolumeDestroy { name, recursive } => {
            pool.destroy_volume(&name, recursive).await?;
            Ok(json!({ "destroyed": name, "type": "volume" }))
        }
        Command::Send { .. } | Command::Receive { .. } => Err(PoolError::InvalidArgument(
            "send and receive stream through a descriptor: use the ironpool command".into(),
        )),
        Command::ReceiveAbort { target } => {
            pool.receive_abort(&target).await?;
            Ok(json!({ "aborted": target }))
        }
        Command::GetProperties { name, properties } => {
            if properties
                .iter()
                .any(|property| property == "receive_resume_token")
            {
                let token = pool
                    .receive_resume_token(&name)
                    .unwrap_or_else(|| "-".into());
                return Ok(
                    json!({ "properties": [{ "name": name, "property": "receive_resume_token", "value": token, "source": "-" }] }),
                );
            }
            let rows = pool.get_properties(&name, &properties).await?;
            Ok(json!({ "properties": rows }))
        }
        Command::SetProperties { name, properties } => {
            pool.set_properties(&name, &properties).await?;
            Ok(json!({ "set": properties, "name": name }))
        }
        Command::InheritProperty { name, property } => {
            pool.inherit_property(&name, &property).await?;
            Ok(json!({ "inherited": property, "name": name }))
        }
        Command::ScrubStart => {
            pool.scrub_start()?;
            Ok(serde_json::to_value(pool.scrub_status()).unwrap_or(Value::Null))
        }
        Command::ScrubStop => {
            pool.scrub_cancel();
            Ok(serde_json::to_value(pool.scrub_status()).unwrap_or(Value::Null))
        }
        Command::ScrubStatus => {
            Ok(serde_json::to_value(pool.scrub_status()).unwrap_or(Value::Null))
        }
        Command::TrimStart => {
            pool.settle_frees().await?;
            pool.trim_start()?;
            Ok(serde_json::to_value(pool.trim_status()).unwrap_or(Value::Null))
        }
        Command::TrimStop => {
            pool.trim_cancel();
            Ok(serde_json::to_value(pool.trim_status()).unwrap_or(Value::Null))
        }
        Command::TrimStatus => Ok(serde_json::to_value(pool.trim_status()).unwrap_or(Value::Null)),
        Command::Events { after, wait_ms } => {
            if wait_ms > 0 {
                let wait = std::time::Duration::from_millis(wait_ms.min(EVENTS_WAIT_MS_MAX));
                crate::rt::timeout(wait, pool.events().wait_after(after)).await;
            }
            let batch = pool.events().since(after, EVENTS_PER_ANSWER_MAX);
            Ok(serde_json::to_value(batch).unwrap_or(Value::Null))
        }
        Command::History => Ok(json!({ "pool": pool.name(), "history": pool.history() })),
        Command::Export => {
            pool.request_export();
            Ok(json!({ "exporting": pool.name() }))
        }
        Command::Clear => {
            let cleared = pool.clear().await?;
            let mut answer = status(pool);
            answer["cleared_devices"] = json!(cleared);
            Ok(answer)
        }
        Command::Offline { device } => {
            pool.offline_device(&device).await?;
            Ok(status(pool))
        }
        Command::Online { device } => {
            pool.online_device(&device, None).await?;
            Ok(status(pool))
        }
        Command::Add { vdevs, force } => {
            let mut layout = Vec::new();
            let mut spares = Vec::new();
            for group in vdevs {
                let mut devices = Vec::new();
                for path in &group.paths {
                    devices.push(open_new_device(&path.display().to_string())?);
                }
                if group.spare {
                    spares.extend(devices);
                    continue;
                }
                layout.push(crate::pool::NewTopVdev {
                    kind: group.kind,
                    devices,
                    log: group.log,
                });
            }
            if !layout.is_empty() {
                pool.add_vdevs(layout, force).await?;
            }
            if !spares.is_empty() {
                pool.add_spares(spares, force).await?;
            }
            Ok(status(pool))
        }
        Command::Remove { device, stop } => {
            if stop {
                pool.removal_stop().await?;
            } else if pool.is_available_spare(&device) {
                pool.remove_spare(&device).await?;
            } else {
                pool.remove_vdev(&device).await?;
            }
            Ok(status(pool))
        }
        Command::Replace { old, new, force } => {
            let new = open_new_device(&new)?;
            pool.replace_device(&old, new, force).await?;
            Ok(status(pool))
        }
        Command::Attach {
            existing,
            new,
            force,
        } => {
            let new = open_new_device(&new)?;
            pool.attach_device(&existing, new, force).await?;
            Ok(status(pool))
        }
        Command::Detach { device } => {
            pool.detach_device(&device).await?;
            Ok(status(pool))
        }
        Command::Split { new_pool, devices } => {
            let outcome = pool.split(&new_pool, &devices).await?;
            let mut answer = status(pool);
            answer["split"] = serde_json::to_value(outcome).unwrap_or(Value::Null);
            Ok(answer)
        }
        Command::ResilverStatus => {
            Ok(serde_json::to_value(pool.resilver_status()).unwrap_or(Value::Null))
        }
        Command::Check => {
            let report = pool.check_space().await?;
            Ok(serde_json::to_value(report).unwrap_or(Value::Null))
        }
        Command::Sync { name: None } => {
            for (_, fs) in pool.filesystems() {
                fs.flush_kernel_caches().await;
            }
            pool.commit().await?;
            Ok(json!({ "durable_txg": pool.txg().durable() }))
        }
        Command::Sync { name: Some(name) } => {
            use crate::pool::dataset::props::SyncMode;
            if let Ok(fs) = pool.filesystem(&name) {
                // What the kernel caches (`writebackcache=on`) first.
                fs.flush_kernel_caches().await;
                // Both first link the buffered writes answered before; then
                // the log (or a txg) carries every change, as `fsync`.
                if fs.settings().sync == SyncMode::Disabled {
                    pool.commit().await?;
                } else {
                    pool.fs_log_commit(&fs).await?;
                }
            } else {
                let volume = pool.volume(&name)?;
                if volume.settings().sync == SyncMode::Disabled {
                    // Its FLUSH promises nothing: an administrator's sync does.
                    pool.drain_volume(&volume).await?;
                    pool.commit_linked().await?;
                } else {
                    pool.flush_volume(&volume).await?;
                }
            }
            Ok(json!({ "synced": name, "durable_txg": pool.txg().durable() }))
        }
        Command::LoadKey { name, key, all } => {
            if all {
                let results = pool.load_keys_from_files().await;
                let loaded: Vec<&String> = results
                    .iter()
                    .filter(|(_, result)| result.is_ok())
                    .map(|(name, _)| name)
                    .collect();
                let failed: Vec<Value> = results
                    .iter()
                    .filter_map(|(name, result)| {
                        let error = result.as_ref().err()?;
                        Some(json!({ "name": name, "error": error.to_string() }))
                    })
                    .collect();
                return Ok(json!({ "loaded": loaded, "failed": failed }));
            }
            let name = name.ok_or_else(|| {
                PoolError::InvalidArgument("load-key takes a volume, or -a".into())
            })?;
            pool.load_key(&name, key_material(key)?).await?;
            Ok(json!({ "loaded": [name], "failed": [] }))
        }
        Command::UnloadKey { name } => {
            pool.unload_key(&name).await?;
            Ok(json!({ "unloaded": name }))
        }
        Command::ChangeKey {
            name,
            mut properties,
            key,
        } => {
            use crate::crypto::KeyFormat;
            let format = match properties.remove("keyformat") {
                Some(value) => Some(
                    KeyFormat::parse(&value)
                        .map_err(|error| PoolError::InvalidArgument(error.to_string()))?,
                ),
                None => None,
            };
            let keylocation = properties.remove("keylocation");
            let iterations = match properties.remove("pbkdf2iters") {
                Some(value) => Some(value.parse::<u32>().map_err(|_| {
                    PoolError::InvalidArgument(format!("pbkdf2iters={value}: not a number"))
                })?),
                None => None,
            };
            if let Some(other) = properties.keys().next() {
                return Err(PoolError::InvalidArgument(format!(
                    "change-key takes keyformat, keylocation and pbkdf2iters, not {other}"
                )));
            }
            pool.change_key(&name, format, keylocation, iterations, key_material(key)?)
                .await?;
            Ok(json!({ "changed": name }))
        }
        Command::GetTunables => Ok(tunables(pool)),
        Command::SetTunable { name, value } => {
            pool.set_tunable(&name, &value)?;
            Ok(tunables(pool))
        }
    }
}

/// Opens the device a replacement names (a file is used as it is: create it
/// at the size wanted first).
fn open_new_device(path: &str) -> Result<crate::pool::NewDevice, PoolError> {
    let canonical = std::fs::canonicalize(path)
        .map_err(|error| PoolError::Device(format!("{path}: {error}")))?;
    let device = crate::dev::file::FileDevice::open(&canonical)?;
    Ok(crate::pool::NewDevice {
        path: canonical.display().to_string(),
        device: Rc::new(device),
    })
}

fn list_entry(pool: &Pool, verbose: bool) -> Value {
    let (size, free) = pool.space();
    let mut entry = json!({
        "name": pool.name(),
        "guid": format!("{:#x}", pool.guid()),
        "size_bytes": size,
        "allocated_bytes": size - free,
        "free_bytes": free,
        "health": pool.health(),
        "volumes": pool.visible_volumes().len(),
    });
    if verbose {
        let vdevs: Vec<Value> = pool
            .store()
            .vdevs()
            .iter()
            // Removed vdevs hold nothing (`status` names them).
            .filter(|top| top.kind != crate::format::label::TopVdevKind::Indirect)
            .map(|top| {
                let (allocated, fragmentation) = vdev_space(pool, top);
                json!({
                    "name": top.kind.vdev_name(top.id),
                    "log": top.log,
                    "state": top.health(),
                    "size_bytes": top.asize_bytes,
                    "allocated_bytes": allocated,
                    "fragmentation_percent": fragmentation,
                })
            })
            .collect();
        entry["vdevs"] = Value::Array(vdevs);
    }
    entry
}

/// A top-level vdev's allocated bytes and fragmentation percent (None
/// when nothing is free).
fn vdev_space(pool: &Pool, top: &crate::vdev::TopVdev) -> (u64, Option<u64>) {
    let allocator = pool.store().allocator.borrow();
    allocator
        .vdevs
        .get(top.id as usize)
        .map(|space| {
            (
                space.size_bytes() - space.free_bytes(),
                space.fragmentation_percent(),
            )
        })
        .unwrap_or((0, None))
}

/// Destroys filesystem `name`; with `recursive`, its snapshots and the
/// datasets below it first, children before parents. Returns the names
/// destroyed, in order. Without `recursive` a filesystem with children is
/// refused (`Pool::destroy_filesystem`).
async fn destroy_filesystem_tree(
    pool: &Rc<Pool>,
    name: &str,
    recursive: bool,
) -> Result<Vec<String>, PoolError> {
    let mut destroyed = Vec::new();
    if recursive {
        let short = pool.filesystem(name)?.short_name().to_string();
        for child in pool.descendants(&short).into_iter().rev() {
            let child = format!("{}/{child}", pool.name());
            if pool.filesystem(&child).is_ok() {
                pool.destroy_filesystem(&child, true).await?;
            } else {
                pool.destroy_volume(&child, true).await?;
            }
            destroyed.push(child);
        }
    }
    pool.destroy_filesystem(name, recursive).await?;
    destroyed.push(name.to_string());
    Ok(destroyed)
}

/// Creates the missing parents of dataset `name` as filesystems with
/// default properties, outermost first (`create -p`).
async fn create_parents(pool: &Rc<Pool>, name: &str) -> Result<(), PoolError> {
    for parent in pool.missing_parents(name) {
        pool.create_filesystem(&parent, BTreeMap::new()).await?;
    }
    Ok(())
}

/// The snapshots `names` stand for: each name itself; with `recursive`,
/// POOL@NAME or POOL/DS@NAME stands for snapshot NAME of every dataset
/// named so or under it (the pool: all of them).
fn snapshot_targets(
    pool: &Pool,
    names: Vec<String>,
    recursive: bool,
) -> Result<Vec<String>, PoolError> {
    let mut targets = Vec::new();
    for name in names {
        if !recursive {
            targets.push(name);
            continue;
        }
        let (prefix, snapshot) = name.split_once('@').ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{name}': use POOL@NAME or POOL/DATASET@NAME"))
        })?;
        targets.extend(
            dataset_names(pool)
                .into_iter()
                .filter(|dataset| {
                    dataset == prefix
                        || dataset.starts_with(&format!("{prefix}/"))
                        || prefix == pool.name()
                })
                .map(|dataset| format!("{dataset}@{snapshot}")),
        );
    }
    Ok(targets)
}

/// [`snapshot_targets`] for commands on existing snapshots (holds): with
/// `recursive`, the datasets that have no snapshot of the name are left
/// out, as `zfs hold -r` does; none at all is an error.
fn existing_snapshots(
    pool: &Pool,
    names: Vec<String>,
    recursive: bool,
) -> Result<Vec<String>, PoolError> {
    if !recursive {
        return Ok(names);
    }
    let asked = names.join(", ");
    let targets: Vec<String> = snapshot_targets(pool, names, true)?
        .into_iter()
        .filter(|name| {
            crate::pool::dataset::split_snapshot_name(pool.name(), name).is_some_and(
                |(dataset, snapshot)| {
                    pool.directory()
                        .lineage(dataset)
                        .is_some_and(|lineage| lineage.snapshot(snapshot).is_some())
                },
            )
        })
        .collect();
    if targets.is_empty() {
        return Err(PoolError::NoSuchSnapshot(asked));
    }
    Ok(targets)
}

/// The full names of every volume users see and every filesystem: what a
/// snapshot can be taken of.
fn dataset_names(pool: &Pool) -> Vec<String> {
    pool.visible_volumes()
        .iter()
        .map(|volume| volume.name())
        .chain(pool.filesystems().into_iter().map(|(_, fs)| fs.name()))
        .collect()
}

fn volume_list(pool: &Pool) -> Vec<Value> {
    let directory = pool.directory();
    pool.open_volumes()
        .iter()
        .filter(|(short, _)| !crate::pool::is_hidden_dataset(short))
        .map(|(short, volume)| {
            let dnode = volume.object.dnode();
            let record = directory.volumes.get(short);
            let properties = record
                .map(|record| record.properties.clone())
                .unwrap_or_default();
            let origin = record.and_then(|record| pool.origin_name(&record.lineage));
            let snapshots = record
                .map(|record| record.lineage.snapshots.len())
                .unwrap_or(0);
            json!({
                "origin": origin,
                "snapshots": snapshots,
                "name": volume.name(),
                "size_bytes": volume.size_bytes.get(),
                "block_bytes": volume.block_bytes,
                "used_bytes": dnode.used_bytes,
                "logical_bytes": dnode.logical_bytes,
                "checksum": dnode.checksum_algo.name(),
                "read_only": volume.read_only.get(),
                "properties": properties,
            })
        })
        .collect()
}

fn status(pool: &Pool) -> Value {
    let (size, free) = pool.space();
    let mut vdevs = Vec::new();
    for top in pool.store().vdevs().iter() {
        let mut children = Vec::new();
        let (mut read_errors, mut write_errors, mut checksum_errors) = (0, 0, 0);
        for leaf in &top.children {
            let stats = leaf.queue.stats();
            read_errors += stats.read_errors;
            write_errors += stats.write_errors;
            checksum_errors += stats.checksum_errors;
            let direct = leaf.device().map(|device| device.info().direct);
            let dtl = leaf.dtl.borrow();
            children.push(json!({
                "path": leaf.path.borrow().clone(),
                "guid": format!("{:#x}", leaf.guid()),
                "state": leaf.state(),
                "missed_txgs": dtl.to_config(),
                "needs_resilver": !dtl.is_empty(),
                "read_errors": stats.read_errors,
                "write_errors": stats.write_errors,
                "checksum_errors": stats.checksum_errors,
                "repaired_bytes": stats.repaired_bytes,
                "no_space_errors": stats.no_space_errors,
                "host_full": stats.host_full,
                "direct_io": direct,
                "trim_supported": leaf.trim_supported(),
            }));
        }
        let (allocated, fragmentation) = vdev_space(pool, top);
        vdevs.push(json!({
            "name": top.kind.vdev_name(top.id),
            "kind": top.kind,
            "log": top.log,
            "parity": top.kind.parity(),
            "state": top.health(),
            "ashift": top.ashift,
            // A removed vdev has no space left.
            "size_bytes": if top.kind == crate::format::label::TopVdevKind::Indirect {
                0
            } else {
                top.asize_bytes
            },
            "allocated_bytes": allocated,
            "fragmentation_percent": fragmentation,
            "read_errors": read_errors,
            "write_errors": write_errors,
            "checksum_errors": checksum_errors,
            "children": children,
        }));
    }
    let (cloned_blocks, clone_saved) = pool.clone_figures();
    json!({
        "pool": pool.name(),
        "guid": format!("{:#x}", pool.guid()),
        "health": pool.health(),
        "size_bytes": size,
        "allocated_bytes": size - free,
        "free_bytes": free,
        "cloned_blocks": cloned_blocks,
        "clone_saved_bytes": clone_saved,
        "open_txg": pool.txg().open(),
        "durable_txg": pool.txg().durable(),
        "imported_txg": pool.imported_txg(),
        "suspended": pool.txg().suspended(),
        "host_full_devices": pool.host_full_devices(),
        "vdevs": vdevs,
        "spares": pool.spares_status(),
        "scrub": pool.scrub_status(),
        "resilver": pool.resilver_status(),
        "removal": pool.removal_status(),
        "trim": pool.trim_status(),
        "unrecoverable_reads": pool.store().stats().unrecoverable_reads,
        "healed_reads": pool.store().stats().healed_reads,
        "notes": pool.notes(),
        "volumes": volume_list(pool),
        "filesystems": pool
            .filesystems()
            .iter()
            .map(|(short, fs)| {
                json!({
                    "name": fs.name(),
                    "mounted": pool.mounted_at(short),
                    "front_end": fs.front_end(),
                })
            })
            .collect::<Vec<Value>>(),
    })
}

fn iostat(pool: &Pool, server: Option<ServerStats>) -> Value {
    let mut devices = Vec::new();
    for top in pool.store().vdevs().iter() {
        let top_name = top.kind.vdev_name(top.id);
        for leaf in &top.children {
            let stats = leaf.queue.stats();
            let mut value = serde_json::to_value(&stats).unwrap_or(Value::Null);
            if let Value::Object(map) = &mut value {
                map.insert("path".into(), json!(leaf.path.borrow().clone()));
                map.insert("top_vdev".into(), json!(top_name));
                map.insert("log".into(), json!(top.log));
                let classes: serde_json::Map<String, Value> = IoClass::ALL
                    .iter()
                    .map(|class| {
                        (
                            class.name().to_string(),
                            serde_json::to_value(&stats.classes[*class as usize])
                                .unwrap_or(Value::Null),
                        )
                    })
                    .collect();
                map.insert("classes".into(), Value::Object(classes));
            }
            devices.push(value);
        }
    }
    let volumes: Vec<Value> = pool
        .open_volumes()
        .iter()
        .map(|(_, volume)| {
            let mut value = serde_json::to_value(volume.stats()).unwrap_or(Value::Null);
            if let Value::Object(map) = &mut value {
                map.insert("name".into(), json!(volume.name()));
                map.insert("intent_log".into(), json!(volume.log_stats()));
            }
            value
        })
        .collect();
    let filesystems: Vec<Value> = pool
        .filesystems()
        .iter()
        .map(|(short, fs)| {
            let mut value = serde_json::to_value(fs.io_stats()).unwrap_or(Value::Null);
            if let Value::Object(map) = &mut value {
                map.insert("name".into(), json!(fs.name()));
                map.insert("mounted".into(), json!(pool.mounted_at(short)));
                map.insert("front_end".into(), json!(fs.front_end()));
                map.insert("intent_log".into(), json!(fs.log_stats()));
            }
            value
        })
        .collect();
    json!({
        "pool": pool.name(),
        "timestamp_ns": crate::rt::now().0,
        "devices": devices,
        "volumes": volumes,
        "filesystems": filesystems,
        "txg": pool.txg().stats(),
        "blocks": pool.store().stats(),
        "server": server,
        "cached_metadata_bytes": pool.objects().cached_bytes(),
        "cache": arcstat(pool),
    })
}

/// The read cache: sizes, hits and misses, the policy's lists, prefetch.
fn arcstat(pool: &Pool) -> Value {
    let (prefetched_blocks, prefetch_throttled) = pool.prefetch_counters();
    json!({
        "pool": pool.name(),
        "timestamp_ns": crate::rt::now().0,
        "cache": pool.store().cache.stats(),
        "prefetch": {
            "issued_blocks": prefetched_blocks,
            "throttled": prefetch_throttled,
        },
    })
}

fn tunables(pool: &Pool) -> Value {
    let tunables = pool.tunables();
    json!({
        "txg_timeout_ms": tunables.txg_timeout.as_millis() as u64,
        "dirty_sync_bytes": tunables.dirty_sync_bytes,
        "dirty_max_bytes": tunables.dirty_max_bytes,
        "dirty_data_max_bytes": tunables.dirty_data_max_bytes,
        "cache_budget_bytes": tunables.cache_budget_bytes,
        "arc_max_bytes": tunables.arc_max_bytes,
        "scrub_rate_bytes": tunables.scrub_rate_bytes,
        "fs_objects_loaded_max": tunables.fs_objects_loaded_max,
        "dead_spill_pointers": tunables.dead_spill_pointers,
        "log_group_wait_percent": tunables.log_group_wait_percent,
        "log_commits_in_flight": tunables.log_commits_in_flight,
        "fs_durable_writes_fsync_gap": tunables.fs_durable_writes_fsync_gap,
        "queue": tunables.queue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_as_json() {
        let command = Command::VolumeCreate {
            name: "tank/v".into(),
            size_bytes: 1 << 30,
            properties: BTreeMap::new(),
            sparse: true,
            parents: false,
            key: None,
        };
        let text = serde_json::to_string(&command).unwrap();
        assert!(text.contains("\"command\":\"volume_create\""));
        let back: Command = serde_json::from_str(&text).unwrap();
        assert!(
            matches!(back, Command::VolumeCreate { size_bytes, sparse: true, .. } if size_bytes == 1 << 30)
        );
        // A client that predates `-s` asks for a thick volume.
        let old = r#"{"command":"volume_create","name":"tank/v","size_bytes":4096}"#;
        assert!(matches!(
            serde_json::from_str::<Command>(old).unwrap(),
            Command::VolumeCreate { sparse: false, .. }
        ));
        assert!(serde_json::from_str::<Command>("{\"command\":\"rm -rf\"}").is_err());
    }
}
