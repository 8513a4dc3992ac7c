//! Finding pools and moving them between hosts: `import` (list the pools on
//! the devices in some directories, or import one by name or guid, perhaps
//! under a new name), `export` (stop serving, commit, mark exported, forget
//! here) and `labelclear` (erase a device's labels).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ironpool::control::client;
use ironpool::control::commands::Command;
use ironpool::dev::file::{FileDevice, OpenError};
use ironpool::format::label::PoolState;
use ironpool::pool::labels::{self, FoundPool};
use ironpool::pool::{Pool, PoolTunables};
use ironpool::rt::Runtime;
use serde_json::{json, Value};

use super::{
    default_control_path, forget, read_cache, remember, search_dirs, with_pool, Context,
    RING_ENTRIES,
};

/// Where `import` looks without `-d`: every directory a pool was remembered
/// in, then `/dev`.
fn default_search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = read_cache().into_values().flatten().collect();
    dirs.push(PathBuf::from("/dev"));
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Longest a served pool's export may take (finishing requests, writing out
/// held data, committing) before `export` gives up waiting.
const EXPORT_WAIT: Duration = Duration::from_secs(300);

/// `import` without a pool: the pools found, one line each.
fn list(context: &Context, dirs: &[PathBuf], pools: &[FoundPool]) {
    if context.json {
        println!("{}", json!({ "pools": pools }));
        return;
    }
    if pools.is_empty() {
        let searched: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
        println!("no pools found in {}", searched.join(", "));
        return;
    }
    println!(
        "{:<16} {:<20} {:<12} {:<10} {:<24} {:>7} {:>8}  LAST HOST",
        "NAME", "GUID", "STATE", "DEVICES", "LAYOUT", "TXG", "IMPORT"
    );
    for pool in pools {
        println!(
            "{:<16} {:<20} {:<12} {:<10} {:<24} {:>7} {:>8}  {}",
            pool.name,
            pool.guid,
            if pool.exported_cleanly {
                "exported"
            } else {
                "not exported"
            },
            format!("{}/{}", pool.devices.len(), pool.expected_devices),
            pool.layout.join("+"),
            pool.txg,
            if !pool.importable {
                "no"
            } else if pool.exported_cleanly {
                "yes"
            } else {
                "-f"
            },
            pool.hostname
        );
    }
}

/// The guid `text` names, if it is one (`0x...` or decimal digits).
fn parse_guid(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if text.chars().all(|character| character.is_ascii_digit()) => text.parse().ok(),
        None => None,
    }
}

/// The one pool `wanted` (a name or a guid) names among those found.
fn choose<'a>(
    wanted: &str,
    pools: &'a [FoundPool],
    dirs: &[PathBuf],
) -> Result<&'a FoundPool, String> {
    if let Some(guid) = parse_guid(wanted) {
        let text = format!("{guid:#x}");
        if let Some(pool) = pools.iter().find(|pool| pool.guid == text) {
            return Ok(pool);
        }
    }
    let named: Vec<&FoundPool> = pools.iter().filter(|pool| pool.name == wanted).collect();
    match named.as_slice() {
        [pool] => Ok(pool),
        [] => {
            let searched: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
            let found: Vec<String> = pools
                .iter()
                .map(|pool| format!("'{}' ({})", pool.name, pool.guid))
                .collect();
            Err(format!(
                "no pool '{wanted}' found in {}{}",
                searched.join(", "),
                if found.is_empty() {
                    String::new()
                } else {
                    format!("; found {}", found.join(", "))
                }
            ))
        }
        several => Err(format!(
            "more than one pool named '{wanted}' found (guids {}): import one by its guid, with a new name if the other stays: `ironpool import GUID NEWNAME`",
            several
                .iter()
                .map(|pool| pool.guid.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// True when a server answers on `pool`'s default control socket.
fn served(pool: &str) -> bool {
    client::call(&default_control_path(pool), &Command::Status).is_ok()
}

/// `import [-f] [-d DIR]... [POOL|GUID [NEWNAME]]`.
pub fn import(
    context: &Context,
    dirs: &[PathBuf],
    force: bool,
    missing_log: bool,
    wanted: Option<&str>,
    new_name: Option<&str>,
) -> Result<(), String> {
    let dirs = if dirs.is_empty() {
        default_search_dirs()
    } else {
        dirs.to_vec()
    };
    let runtime = Runtime::new_uring(RING_ENTRIES)
        .map_err(|error| format!("cannot set up io_uring: {error}"))?;
    let pools = runtime.block_on(labels::discover(&dirs));
    let Some(wanted) = wanted else {
        list(context, &dirs, &pools);
        return Ok(());
    };
    let found = choose(wanted, &pools, &dirs)?.clone();
    let name = new_name.unwrap_or(&found.name).to_string();
    if served(&found.name) || served(&name) {
        return Err(format!(
            "pool '{}' is already imported: a running server serves it (control {})",
            found.name,
            default_control_path(&found.name).display()
        ));
    }
    if !found.importable {
        return Err(format!(
            "cannot import pool '{}' ({}): too many devices missing ({} of {} found: {})",
            found.name,
            found.guid,
            found.devices.len(),
            found.expected_devices,
            found.devices.join(", ")
        ));
    }
    if !found.exported_cleanly && !force {
        return Err(format!(
            "pool '{}' ({}) was not exported: it may be in use on host '{}', or its server stopped without exporting it; `ironpool import -f {}` imports it anyway (its intent logs are replayed)",
            found.name, found.guid, found.hostname, found.guid
        ));
    }
    if let Some(new_name) = new_name {
        if let Some(other) = pools
            .iter()
            .find(|pool| pool.name == new_name && pool.guid != found.guid)
        {
            return Err(format!(
                "a pool named '{new_name}' is already there ({}): choose another name",
                other.guid
            ));
        }
    }
    let guid = parse_guid(&found.guid).ok_or("a found pool without a guid")?;
    let device_dirs: Vec<PathBuf> = {
        let mut parents: Vec<PathBuf> = found
            .devices
            .iter()
            .filter_map(|device| Path::new(device).parent().map(Path::to_path_buf))
            .collect();
        parents.sort();
        parents.dedup();
        parents
    };
    let imported: Result<Vec<String>, String> = runtime.block_on(async {
        let tunables = PoolTunables {
            discard_missing_log: missing_log,
            ..PoolTunables::default()
        };
        let pool = Pool::import_guid(guid, &device_dirs, tunables)
            .await
            .map_err(|error| error.to_string())?;
        let notes = pool.notes();
        if let Some(new_name) = new_name {
            if let Err(error) = pool.rename_in_labels(new_name) {
                let _ = pool.export().await;
                return Err(error.to_string());
            }
        }
        // Written by the export's commit.
        pool.log_history(format!(
            "import{}{} {}{}",
            if force { " -f" } else { "" },
            if missing_log { " -m" } else { "" },
            found.guid,
            new_name.map(|name| format!(" {name}")).unwrap_or_default()
        ));
        pool.export().await.map_err(|error| error.to_string())?;
        Ok(notes)
    });
    let notes = imported?;
    // The old name's entry goes if it pointed at this pool's devices (not
    // at another pool's of that name).
    if new_name.is_some()
        && read_cache()
            .get(&found.name)
            .is_some_and(|remembered| remembered.iter().all(|dir| device_dirs.contains(dir)))
    {
        forget(&found.name);
    }
    remember(&name, &device_dirs);
    if context.json {
        println!(
            "{}",
            json!({ "imported": name, "guid": found.guid, "devices": found.devices, "notes": notes })
        );
    } else {
        for note in notes {
            eprintln!("ironpool: {name}: {note}");
        }
        println!(
            "imported pool '{name}' ({}, {} devices){}",
            found.guid,
            found.devices.len(),
            if new_name.is_some() {
                format!(", renamed from '{}'", found.name)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// `export POOL`: a served pool's server stops serving and exports it; an
/// unserved pool is opened, committed and marked exported. Either way this
/// host forgets where its devices are.
pub fn export(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let control = context
        .control
        .clone()
        .unwrap_or_else(|| default_control_path(pool));
    match client::call(&control, &Command::Export) {
        Ok(response) if response.ok => {
            // The server exports and exits: its control socket goes last.
            let deadline = Instant::now() + EXPORT_WAIT;
            while client::call(&control, &Command::Status).is_ok() {
                if Instant::now() > deadline {
                    return Err(format!(
                        "the server of '{pool}' is still exporting after {} s",
                        EXPORT_WAIT.as_secs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(response) => {
            return Err(response
                .error
                .unwrap_or_else(|| "the server refused to export".into()))
        }
        Err(client::CallError::Lost(text)) => return Err(text),
        Err(client::CallError::NotReached(_)) => {
            let dirs = search_dirs(pool, dirs)?;
            with_pool(pool, &dirs, |opened| async move {
                // Written by the export's commit.
                opened.log_history(format!("export {pool}"));
                Ok(Value::Null)
            })?;
        }
    }
    forget(pool);
    if context.json {
        println!("{}", json!({ "exported": pool }));
    } else {
        println!("exported pool '{pool}'");
    }
    Ok(())
}

/// `labelclear [-f] DEV`: erases the labels of a device no server holds.
/// One of a pool not exported cleanly needs `-f` (it may be in use on
/// another host).
pub fn labelclear(context: &Context, device: &Path, force: bool) -> Result<(), String> {
    let opened = FileDevice::open(device).map_err(|error| match error {
        OpenError::InUse { .. } => format!(
            "{}: in use (a running server holds it, or it is mounted): export its pool first",
            device.display()
        ),
        other => other.to_string(),
    })?;
    let runtime = Runtime::new_uring(RING_ENTRIES)
        .map_err(|error| format!("cannot set up io_uring: {error}"))?;
    let owner = runtime.block_on(async {
        let probe = labels::probe_device(&opened, device).await;
        let Some(label) = probe.label else {
            if probe.damaged_labels.is_empty() {
                return Err(format!("{}: no ironpool label: nothing to clear", device.display()));
            }
            return Ok(None);
        };
        if label.config.state == PoolState::Active && !force {
            return Err(format!(
                "{} belongs to pool '{}' ({:#x}), which was not exported: it may be in use on host '{}'; `labelclear -f` erases it anyway",
                device.display(),
                label.config.name,
                label.pool_guid,
                label.config.hostname
            ));
        }
        labels::clear_labels(&opened)
            .await
            .map_err(|error| format!("{}: {error}", device.display()))?;
        Ok(Some((label.config.name, label.pool_guid)))
    })?;
    let described = match &owner {
        Some((name, guid)) => format!(" (it belonged to pool '{name}', {guid:#x})"),
        None => " (only damaged labels were left)".into(),
    };
    if context.json {
        println!(
            "{}",
            json!({ "cleared": device.display().to_string(), "pool": owner.map(|(name, _)| name) })
        );
    } else {
        println!("cleared the labels of {}{described}", device.display());
    }
    Ok(())
}
