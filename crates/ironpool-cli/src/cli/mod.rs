//! The CLI's commands. Administrative commands go to a running server's control
//! socket when there is one, and otherwise open the pool themselves (import, run,
//! export) with the very same command code.

pub mod arcstat;
pub mod datasets;
pub mod discovery;
pub mod events;
pub mod format;
pub mod iostat;
pub mod keys;
pub mod replication;
pub mod serve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ironpool::control::client;
use ironpool::control::commands::{execute, Command, Response};
use ironpool::format::label::TopVdevKind;
use ironpool::pool::{LayoutGroup, Pool, PoolError, PoolTunables};
use ironpool::rt::Runtime;
use ironpool::units::parse_size;
use serde_json::Value;

/// Options shared by every command.
pub struct Context {
    pub control: Option<PathBuf>,
    pub json: bool,
}

/// Submission slots of the CLI's and server's io_uring.
pub const RING_ENTRIES: u32 = 1024;

/// Where servers put their control sockets by default.
pub fn default_run_dir() -> PathBuf {
    std::env::var_os("IRONPOOL_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ironpool"))
}

pub fn default_control_path(pool: &str) -> PathBuf {
    default_run_dir().join(format!("{pool}.ctl"))
}

/// The pool cache: which directories hold each pool's devices, so commands work
/// without `-d` after `create`.
fn cache_path() -> PathBuf {
    std::env::var_os("IRONPOOL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/ironpool/pools.json"))
}

pub(crate) fn read_cache() -> BTreeMap<String, Vec<PathBuf>> {
    std::fs::read(cache_path())
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// `directory` as an absolute path, so a remembered directory means the same
/// from wherever a later command runs: canonical when it exists, else joined
/// to the working directory.
fn absolute(directory: &Path) -> PathBuf {
    std::fs::canonicalize(directory)
        .or_else(|_| std::path::absolute(directory))
        .unwrap_or_else(|_| directory.to_path_buf())
}

/// Records where a pool's devices are (best effort: the cache is a convenience),
/// as absolute paths.
pub fn remember(pool: &str, directories: &[PathBuf]) {
    let mut absolute_directories: Vec<PathBuf> = directories
        .iter()
        .map(|directory| absolute(directory))
        .collect();
    absolute_directories.dedup();
    let mut cache = read_cache();
    cache.insert(pool.to_string(), absolute_directories);
    write_cache(&cache);
}

/// Forgets where a pool's devices are (export, or an import under a new
/// name): best effort, like `remember`.
pub fn forget(pool: &str) {
    let mut cache = read_cache();
    if cache.remove(pool).is_none() {
        return;
    }
    write_cache(&cache);
}

fn write_cache(cache: &BTreeMap<String, Vec<PathBuf>>) {
    let path = cache_path();
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    if let Ok(bytes) = serde_json::to_vec_pretty(cache) {
        let temporary = path.with_extension("tmp");
        if std::fs::write(&temporary, bytes).is_ok() {
            let _ = std::fs::rename(&temporary, &path);
        }
    }
}

/// The directories to search for a pool's devices: `-d`, else the cache.
pub fn search_dirs(pool: &str, dirs: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    if !dirs.is_empty() {
        return Ok(dirs.to_vec());
    }
    match read_cache().remove(pool) {
        Some(dirs) if !dirs.is_empty() => Ok(dirs),
        _ => Err(format!(
            "where are the devices of pool '{pool}'? pass -d DIR (no entry in {})",
            cache_path().display()
        )),
    }
}

/// Runs a command against pool `pool`: through the control socket if a server
/// runs, else by opening the pool here.
pub fn admin(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    command: Command,
) -> Result<Value, String> {
    let explicit = context.control.clone();
    let control = explicit
        .clone()
        .unwrap_or_else(|| default_control_path(pool));
    if explicit.is_some() || control.exists() {
        if let Some(answer) = server_answer(client::call(&control, &command), explicit.is_some()) {
            return answer;
        }
    }
    let dirs = search_dirs(pool, dirs)?;
    with_pool(pool, &dirs, move |pool| async move {
        execute(&pool, command, None).await
    })
}

/// What a call to a server means for the CLI: `None` when no server was
/// reached at the default socket (a stale file: the CLI opens the pool itself),
/// else the answer. A server that was reached and then failed or died is an
/// error, never a reason to run the command again here: it may have run.
pub fn server_answer(
    call: Result<Response, client::CallError>,
    explicit: bool,
) -> Option<Result<Value, String>> {
    match call {
        Ok(response) if response.ok => Some(Ok(response.result.unwrap_or(Value::Null))),
        Ok(response) => Some(Err(response
            .error
            .unwrap_or_else(|| "the server reported an error".into()))),
        Err(client::CallError::NotReached(text)) if explicit => {
            Some(Err(format!("cannot reach the server: {text}")))
        }
        Err(client::CallError::NotReached(_)) => None,
        Err(error @ client::CallError::Lost(_)) => Some(Err(error.to_string())),
    }
}

/// Imports `pool`, runs `work`, exports it again.
pub fn with_pool<F, Fut>(pool_name: &str, dirs: &[PathBuf], work: F) -> Result<Value, String>
where
    F: FnOnce(Rc<Pool>) -> Fut,
    Fut: std::future::Future<Output = Result<Value, PoolError>>,
{
    let runtime = Runtime::new_uring(RING_ENTRIES)
        .map_err(|error| format!("cannot set up io_uring: {error}"))?;
    runtime.block_on(async {
        let pool = Pool::import(pool_name, dirs, PoolTunables::default())
            .await
            .map_err(|error| explain_import(pool_name, error))?;
        let result = work(pool.clone()).await;
        let exported = pool.export().await;
        let value = result.map_err(|error| error.to_string())?;
        exported.map_err(|error| error.to_string())?;
        Ok(value)
    })
}

fn explain_import(pool: &str, error: PoolError) -> String {
    let text = error.to_string();
    if text.contains("in use by another process") {
        format!("{text}\npool '{pool}' is probably served by a running `ironpool serve`; pass --control PATH to reach it")
    } else {
        text
    }
}

/// Splits `DEV... [mirror|raidz|raidz1|raidz2|raidz3 DEV...]... [log [mirror]
/// DEV...] [spare DEV...]` into top-level vdevs: devices outside a group are
/// single-disk vdevs; a keyword starts a group that takes the devices up to
/// the next keyword; what follows `log` is a log device (a disk or a
/// mirror), what follows `spare` hot spares (one device each), up to the
/// other section's keyword.
pub fn parse_layout(words: &[String]) -> Result<Vec<LayoutGroup>, String> {
    let mut groups: Vec<LayoutGroup> = Vec::new();
    let mut in_group = false;
    let mut log = false;
    let mut spares = false;
    let (mut seen_log, mut seen_spare) = (false, false);
    for word in words {
        if word == "log" || word == "spare" {
            let seen = if word == "log" {
                &mut seen_log
            } else {
                &mut seen_spare
            };
            if *seen {
                return Err(format!("'{word}' is given twice"));
            }
            *seen = true;
            log = word == "log";
            spares = word == "spare";
            in_group = false;
            continue;
        }
        if spares {
            if group_keyword(word).is_some() {
                return Err(format!("'{word}' after 'spare': a spare is one device"));
            }
            groups.push(LayoutGroup {
                kind: TopVdevKind::Disk,
                paths: vec![PathBuf::from(word)],
                log: false,
                spare: true,
            });
            continue;
        }
        match group_keyword(word) {
            Some(Ok(kind)) if log && kind.is_raidz() => {
                return Err("a log device is a disk or a mirror, not RAID-Z".into())
            }
            Some(Ok(kind)) => {
                groups.push(LayoutGroup {
                    kind,
                    paths: Vec::new(),
                    log,
                    spare: false,
                });
                in_group = true;
            }
            Some(Err(message)) => return Err(message),
            None if in_group => groups
                .last_mut()
                .expect("a group was started")
                .paths
                .push(PathBuf::from(word)),
            None => groups.push(LayoutGroup {
                kind: TopVdevKind::Disk,
                paths: vec![PathBuf::from(word)],
                log,
                spare: false,
            }),
        }
    }
    for group in &groups {
        let range = group.kind.children_range();
        if !range.contains(&group.paths.len()) {
            let name = group.kind.vdev_name(0);
            let name = name.trim_end_matches("-0");
            let joiner = if range.end() - range.start() == 1 {
                "or"
            } else {
                "to"
            };
            return Err(format!(
                "a {name} takes {} {joiner} {} devices, got {}",
                range.start(),
                range.end(),
                group.paths.len()
            ));
        }
    }
    if seen_log && !groups.iter().any(|group| group.log) {
        return Err("'log' is not followed by a device".into());
    }
    if seen_spare && !groups.iter().any(|group| group.spare) {
        return Err("'spare' is not followed by a device".into());
    }
    if groups.is_empty() {
        return Err("no devices given".into());
    }
    Ok(groups)
}

/// The vdev kind a layout keyword names; None for a device.
fn group_keyword(word: &str) -> Option<Result<TopVdevKind, String>> {
    match word {
        "mirror" => Some(Ok(TopVdevKind::Mirror)),
        "raidz" | "raidz1" => Some(Ok(TopVdevKind::Raidz1)),
        "raidz2" => Some(Ok(TopVdevKind::Raidz2)),
        "raidz3" => Some(Ok(TopVdevKind::Raidz3)),
        keyword if keyword.starts_with("raidz") => Some(Err(format!(
            "'{keyword}': RAID-Z has 1 to 3 parity columns (raidz1, raidz2, raidz3)"
        ))),
        "draid" | "cache" | "special" | "dedup" => Some(Err(format!(
            "'{word}' vdevs are not supported: use mirror, raidz1-3, log, spare or plain devices"
        ))),
        _ => None,
    }
}

pub fn create(
    context: &Context,
    pool: &str,
    words: &[String],
    force: bool,
    size: Option<&str>,
) -> Result<(), String> {
    let layout = parse_layout(words)?;
    if layout.iter().all(|group| group.log || group.spare) {
        return Err("no devices given (other than log devices and spares)".into());
    }
    let size_bytes = size.map(parse_size).transpose()?;
    // Absolute before anything is created (the files may not exist yet).
    let mut dirs: Vec<PathBuf> = layout
        .iter()
        .flat_map(|group| group.paths.iter())
        .map(|device| {
            absolute(
                device
                    .parent()
                    .filter(|parent| !parent.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
            )
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    let runtime = Runtime::new_uring(RING_ENTRIES)
        .map_err(|error| format!("cannot set up io_uring: {error}"))?;
    let status = runtime.block_on(async {
        let pool = Pool::create(pool, layout, force, size_bytes, PoolTunables::default())
            .await
            .map_err(|error| error.to_string())?;
        let status = execute(&pool, Command::Status, None)
            .await
            .map_err(|error| error.to_string())?;
        pool.export().await.map_err(|error| error.to_string())?;
        Ok::<Value, String>(status)
    })?;
    remember(pool, &dirs);
    if context.json {
        println!("{status}");
    } else {
        println!(
            "created pool '{pool}': {} usable",
            format::bytes(status["size_bytes"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

fn split_volume_name(name: &str) -> Result<(&str, &str), String> {
    name.split_once('/')
        .ok_or_else(|| format!("'{name}': volumes are named POOL/NAME"))
}

pub fn volume_create(
    context: &Context,
    name: &str,
    size: &str,
    sparse: bool,
    parents: bool,
    options: &[String],
    dirs: &[PathBuf],
) -> Result<(), String> {
    let (pool, _) = split_volume_name(name)?;
    let size_bytes = parse_size(size)?;
    let properties = assignments(options)?;
    let key = keys::create_key(name, &properties)?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::VolumeCreate {
            name: name.to_string(),
            size_bytes,
            properties,
            sparse,
            parents,
            key: key.map(|key| key.to_string()),
        },
    )?;
    if context.json {
        println!("{result}");
    } else {
        println!(
            "created volume '{}' ({}, volblocksize {})",
            name,
            format::bytes(size_bytes),
            format::bytes(result["block_bytes"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

pub fn fs_create(
    context: &Context,
    name: &str,
    parents: bool,
    options: &[String],
    dirs: &[PathBuf],
) -> Result<(), String> {
    let (pool, _) = name
        .split_once('/')
        .ok_or_else(|| format!("'{name}': filesystems are named POOL/NAME"))?;
    let properties = assignments(options)?;
    let key = keys::create_key(name, &properties)?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::FsCreate {
            name: name.to_string(),
            properties,
            parents,
            key: key.map(|key| key.to_string()),
        },
    )?;
    if context.json {
        println!("{result}");
    } else {
        println!(
            "created filesystem '{name}' (recordsize {})",
            format::bytes(result["recordsize"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

/// `-o key=value` options as properties.
pub fn assignments(options: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut properties = BTreeMap::new();
    for option in options {
        let (key, value) = option
            .split_once('=')
            .ok_or_else(|| format!("'-o {option}': use -o key=value"))?;
        properties.insert(key.to_string(), value.to_string());
    }
    Ok(properties)
}

pub fn fs_list(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(context, pool, dirs, Command::FsList)?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    println!(
        "{:<30} {:>10} {:>10}  {:<30} TRANSPORT",
        "NAME", "RECORDSIZE", "OBJECTS", "MOUNTPOINT"
    );
    for fs in result["filesystems"].as_array().into_iter().flatten() {
        let transport = fs["front_end"]["transport"].as_str().unwrap_or_default();
        println!(
            "{:<30} {:>10} {:>10}  {:<30} {}",
            fs["name"].as_str().unwrap_or_default(),
            format::bytes(fs["recordsize"].as_u64().unwrap_or(0)),
            fs["objects"].as_u64().unwrap_or(0),
            fs["mountpoint"].as_str().unwrap_or("none"),
            if fs["mounted"].is_null() {
                "-"
            } else {
                transport
            },
        );
    }
    Ok(())
}

pub fn fs_destroy(
    context: &Context,
    name: &str,
    recursive: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let (pool, _) = name
        .split_once('/')
        .ok_or_else(|| format!("'{name}': filesystems are named POOL/NAME"))?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::FsDestroy {
            name: name.to_string(),
            recursive,
        },
    )?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    for destroyed in result["datasets"].as_array().into_iter().flatten() {
        println!("destroyed '{}'", destroyed.as_str().unwrap_or("?"));
    }
    Ok(())
}

pub fn volume_list(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(context, pool, dirs, Command::VolumeList)?;
    if context.json {
        println!("{result}");
        return Ok(());
    }
    println!(
        "{:<32} {:>10} {:>10} {:>12}",
        "NAME", "VOLSIZE", "USED", "VOLBLOCKSIZE"
    );
    for volume in result["volumes"].as_array().cloned().unwrap_or_default() {
        println!(
            "{:<32} {:>10} {:>10} {:>12}",
            volume["name"].as_str().unwrap_or("?"),
            format::bytes(volume["size_bytes"].as_u64().unwrap_or(0)),
            format::bytes(volume["used_bytes"].as_u64().unwrap_or(0)),
            format::bytes(volume["block_bytes"].as_u64().unwrap_or(0)),
        );
    }
    Ok(())
}

pub fn volume_destroy(
    context: &Context,
    name: &str,
    dirs: &[PathBuf],
    recursive: bool,
) -> Result<(), String> {
    let (pool, _) = split_volume_name(name)?;
    let result = admin(
        context,
        pool,
        dirs,
        Command::VolumeDestroy {
            name: name.to_string(),
            recursive,
        },
    )?;
    if context.json {
        println!("{result}");
    } else if let Some(datasets) = result["datasets"].as_array() {
        for destroyed in datasets {
            println!("destroyed '{}'", destroyed.as_str().unwrap_or("?"));
        }
    } else {
        println!(
            "destroyed {} '{name}'",
            result["type"].as_str().unwrap_or("volume")
        );
    }
    Ok(())
}

pub fn status(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(context, pool, dirs, Command::Status)?;
    if context.json {
        println!("{result}");
    } else {
        print!("{}", format::status(&result));
    }
    Ok(())
}

pub fn list(
    context: &Context,
    pool: Option<&str>,
    verbose: bool,
    dirs: &[PathBuf],
) -> Result<(), String> {
    let names: Vec<String> = match pool {
        Some(pool) => vec![pool.to_string()],
        None => read_cache().keys().cloned().collect(),
    };
    let mut pools = Vec::new();
    let mut errors = Vec::new();
    for name in names {
        match admin(context, &name, dirs, Command::List { verbose }) {
            Ok(result) => pools.extend(result["pools"].as_array().cloned().unwrap_or_default()),
            Err(error) => errors.push(format!("{name}: {error}")),
        }
    }
    if context.json {
        println!(
            "{}",
            serde_json::json!({ "pools": pools, "errors": errors })
        );
    } else {
        println!(
            "{:<20} {:>10} {:>10} {:>10} {:>8}  HEALTH",
            "NAME", "SIZE", "ALLOC", "FREE", "CAP"
        );
        for entry in &pools {
            let size = entry["size_bytes"].as_u64().unwrap_or(0);
            let allocated = entry["allocated_bytes"].as_u64().unwrap_or(0);
            let capacity = if size == 0 {
                0.0
            } else {
                allocated as f64 * 100.0 / size as f64
            };
            println!(
                "{:<20} {:>10} {:>10} {:>10} {:>7.0}%  {}",
                entry["name"].as_str().unwrap_or("?"),
                format::bytes(size),
                format::bytes(allocated),
                format::bytes(entry["free_bytes"].as_u64().unwrap_or(0)),
                capacity,
                entry["health"].as_str().unwrap_or("?")
            );
            if !verbose {
                continue;
            }
            // As `zpool list -v`: a row per vdev, FRAG in the CAP column.
            for vdev in entry["vdevs"].as_array().into_iter().flatten() {
                let size = vdev["size_bytes"].as_u64().unwrap_or(0);
                let allocated = vdev["allocated_bytes"].as_u64().unwrap_or(0);
                let name = match vdev["log"].as_bool() {
                    Some(true) => format!("  {} (log)", vdev["name"].as_str().unwrap_or("?")),
                    _ => format!("  {}", vdev["name"].as_str().unwrap_or("?")),
                };
                println!(
                    "{:<20} {:>10} {:>10} {:>10} {:>8}  {}",
                    name,
                    format::bytes(size),
                    format::bytes(allocated),
                    format::bytes(size.saturating_sub(allocated)),
                    vdev["fragmentation_percent"]
                        .as_u64()
                        .map(|percent| format!("{percent}% frag"))
                        .unwrap_or_else(|| "-".into()),
                    vdev["state"].as_str().unwrap_or("?")
                );
            }
        }
        for error in &errors {
            eprintln!("ironpool: {error}");
        }
    }
    if pools.is_empty() && !errors.is_empty() {
        return Err("no pool could be listed".into());
    }
    Ok(())
}

pub fn scrub(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    wait: bool,
    stop: bool,
) -> Result<(), String> {
    if stop {
        let result = admin(context, pool, dirs, Command::ScrubStop)?;
        if context.json {
            println!("{result}");
        } else {
            println!("scrub of '{pool}' stopping");
        }
        return Ok(());
    }
    let served = context.control.is_some() || default_control_path(pool).exists();
    if !served {
        // No server: scrub in this process, which must wait for the end.
        let dirs = search_dirs(pool, dirs)?;
        let result = with_pool(pool, &dirs, |pool| async move {
            // The import may have resumed an interrupted scrub: finish that one.
            if pool.scrub_status().state != "scanning" {
                execute(&pool, Command::ScrubStart, None).await?;
            }
            pool.scrub_wait().await;
            Ok(serde_json::to_value(pool.scrub_status()).unwrap_or(Value::Null))
        })?;
        return print_scrub(context, pool, &result);
    }
    admin(context, pool, dirs, Command::ScrubStart)?;
    if !wait {
        if !context.json {
            println!("scrub of '{pool}' started");
        }
        return Ok(());
    }
    let result = follow(
        context,
        pool,
        dirs,
        (Command::ScrubStatus, "scanning"),
        std::time::Duration::from_millis(500),
        |result| {
            format!(
                "scrub of '{pool}': {:.1}% ({} of {})",
                result["progress_percent"].as_f64().unwrap_or(0.0),
                format::bytes(result["examined_bytes"].as_u64().unwrap_or(0)),
                format::bytes(result["total_bytes"].as_u64().unwrap_or(0))
            )
        },
    )?;
    print_scrub(context, pool, &result)
}

/// Polls a running server's `status` command every `interval` while its
/// answer's state is `running`, showing `progress` of each answer on
/// stderr (not with --json); returns the first answer past it.
fn follow(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    (status, running): (Command, &str),
    interval: std::time::Duration,
    progress: impl Fn(&Value) -> String,
) -> Result<Value, String> {
    loop {
        std::thread::sleep(interval);
        let result = admin(context, pool, dirs, status.clone())?;
        if result["state"] != running {
            return Ok(result);
        }
        if !context.json {
            eprintln!("{}", progress(&result));
        }
    }
}

/// `trim [-w] [-s] POOL`: discards all free space, through the server when
/// one runs (with `-w`, following it to the end); otherwise on the pool
/// opened here, which waits for the end before it is exported.
pub fn trim(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    wait: bool,
    stop: bool,
) -> Result<(), String> {
    let print = |result: &Value| {
        if context.json {
            println!("{result}");
        } else {
            println!("{pool}: {}", format::trim_line(result));
        }
    };
    if stop {
        let result = admin(context, pool, dirs, Command::TrimStop)?;
        print(&result);
        return Ok(());
    }
    let served = context.control.is_some() || default_control_path(pool).exists();
    if !served {
        let dirs = search_dirs(pool, dirs)?;
        let result = with_pool(pool, &dirs, |pool| async move {
            execute(&pool, Command::TrimStart, None).await?;
            pool.trim_wait().await;
            Ok(serde_json::to_value(pool.trim_status()).unwrap_or(Value::Null))
        })?;
        print(&result);
        return Ok(());
    }
    admin(context, pool, dirs, Command::TrimStart)?;
    if !wait {
        if !context.json {
            println!("trim of '{pool}' started");
        }
        return Ok(());
    }
    let result = follow(
        context,
        pool,
        dirs,
        (Command::TrimStatus, "trimming"),
        std::time::Duration::from_millis(250),
        |result| {
            format!(
                "trim of '{pool}': {:.1}% ({} discarded)",
                result["progress_percent"].as_f64().unwrap_or(0.0),
                format::bytes(result["trimmed_bytes"].as_u64().unwrap_or(0))
            )
        },
    )?;
    print(&result);
    Ok(())
}

fn print_scrub(context: &Context, pool: &str, result: &Value) -> Result<(), String> {
    if context.json {
        println!("{result}");
    } else {
        println!("scrub of '{pool}': {}", format::scrub_line(result));
    }
    if result["errors"].as_u64().unwrap_or(0) > 0 {
        return Err(format!(
            "scrub found {} unrecoverable errors",
            result["errors"]
        ));
    }
    Ok(())
}

/// `offline`, `online` and `replace`: through the server when one runs (with
/// `wait`, following the resilver until it ends); otherwise on the pool
/// opened here, which then resilvers before it is exported.
pub fn device_command(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    command: Command,
    wait: bool,
) -> Result<(), String> {
    device_command_status(context, pool, dirs, command, wait).map(|_| ())
}

/// [`device_command`], returning the status it printed.
fn device_command_status(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    command: Command,
    wait: bool,
) -> Result<Value, String> {
    let served = context.control.is_some() || default_control_path(pool).exists();
    let result = if served {
        let result = admin(context, pool, dirs, command)?;
        if wait {
            wait_for_resilver(context, pool, dirs)?
        } else {
            result
        }
    } else {
        let dirs = search_dirs(pool, dirs)?;
        with_pool(pool, &dirs, move |pool| async move {
            execute(&pool, command, None).await?;
            pool.resilver_wait().await;
            // The process ends after: a removal it started runs to its end.
            pool.removal_wait().await;
            execute(&pool, Command::Status, None).await
        })?
    };
    if context.json {
        println!("{result}");
    } else {
        print!("{}", format::status(&result));
    }
    let errors = result["resilver"]["errors"].as_u64().unwrap_or(0);
    if errors > 0 {
        return Err(format!("the resilver met {errors} errors"));
    }
    Ok(result)
}

/// `replace`: NEW made absolute, and created when asked
/// ([`new_device_path`]).
#[allow(clippy::too_many_arguments)]
pub fn replace(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    old: &str,
    new: &str,
    force: bool,
    wait: bool,
    size: Option<&str>,
) -> Result<(), String> {
    let new = new_device_path(new, size)?;
    let command = Command::Replace {
        old: old.to_string(),
        new,
        force,
    };
    device_command(context, pool, dirs, command, wait)
}

/// The absolute path of a device `replace` or `attach` puts in (a server
/// resolves paths from its own directory), created sparse at `size` when
/// asked and missing.
fn new_device_path(new: &str, size: Option<&str>) -> Result<String, String> {
    let path = Path::new(new);
    if let Some(size) = size {
        if !path.exists() {
            ironpool::pool::create_sparse_file(path, parse_size(size)?)
                .map_err(|error| error.to_string())?;
        }
    }
    let canonical = std::fs::canonicalize(path).map_err(|error| format!("{new}: {error}"))?;
    Ok(canonical.display().to_string())
}

/// `attach POOL EXISTING NEW`: NEW made absolute, and created when asked
/// ([`new_device_path`]); `wait` follows the resilver.
#[allow(clippy::too_many_arguments)]
pub fn attach(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    existing: &str,
    new: &str,
    force: bool,
    wait: bool,
    size: Option<&str>,
) -> Result<(), String> {
    let new = new_device_path(new, size)?;
    let command = Command::Attach {
        existing: existing.to_string(),
        new,
        force,
    };
    device_command(context, pool, dirs, command, wait)
}

/// `detach POOL DEV`.
pub fn detach(context: &Context, pool: &str, dirs: &[PathBuf], device: &str) -> Result<(), String> {
    let command = Command::Detach {
        device: device.to_string(),
    };
    device_command(context, pool, dirs, command, false)
}

/// `split POOL NEWPOOL [DEV...]`: the original pool's status, then what
/// the new pool is made of and how to import it.
pub fn split(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    new_pool: &str,
    devices: &[String],
) -> Result<(), String> {
    let command = Command::Split {
        new_pool: new_pool.to_string(),
        devices: devices.to_vec(),
    };
    let served = context.control.is_some() || default_control_path(pool).exists();
    let result = if served {
        admin(context, pool, dirs, command)?
    } else {
        let dirs = search_dirs(pool, dirs)?;
        with_pool(pool, &dirs, move |pool| async move {
            execute(&pool, command, None).await
        })?
    };
    if context.json {
        println!("{result}");
        return Ok(());
    }
    print!("{}", format::status(&result));
    let split = &result["split"];
    let devices: Vec<&str> = split["devices"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!(
        "split off: pool '{}' (guid {:#x}, txg {}) of {}; exported: `ironpool import {}` to use it",
        split["pool"].as_str().unwrap_or(new_pool),
        split["guid"].as_u64().unwrap_or(0),
        split["txg"].as_u64().unwrap_or(0),
        devices.join(", "),
        split["pool"].as_str().unwrap_or(new_pool),
    );
    Ok(())
}

/// `add`: data vdevs or log devices. Paths are made absolute and created
/// at `size` when asked and missing, as in `create`.
pub fn add(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    words: &[String],
    force: bool,
    size: Option<&str>,
) -> Result<(), String> {
    let mut groups = parse_layout(words)?;
    for group in &mut groups {
        for path in &mut group.paths {
            if let Some(size) = size {
                if !path.exists() {
                    // As at create: data devices sparse, log devices written
                    // out (their writes are the latency of every FLUSH).
                    let made = if group.log {
                        ironpool::pool::create_written_file(path, parse_size(size)?)
                    } else {
                        ironpool::pool::create_sparse_file(path, parse_size(size)?)
                    };
                    made.map_err(|error| error.to_string())?;
                }
            }
            *path = std::fs::canonicalize(&*path)
                .map_err(|error| format!("{}: {error}", path.display()))?;
        }
    }
    let command = Command::Add {
        vdevs: groups,
        force,
    };
    device_command(context, pool, dirs, command, false)
}

/// Polls a served pool until its resilver ends; returns the final status.
/// `remove [-w|-s] POOL [DEV]`: a device command; with `-w`, polls a
/// served pool's status until the removal of a data vdev ends. Fails when
/// the removal it waited for stopped before its end (the reason is in
/// `status`).
pub fn remove(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    device: Option<String>,
    wait: bool,
    stop: bool,
) -> Result<(), String> {
    let served = context.control.is_some() || default_control_path(pool).exists();
    let command = Command::Remove {
        device: device.unwrap_or_default(),
        stop,
    };
    if !(served && wait) {
        let status = device_command_status(context, pool, dirs, command, false)?;
        if stop || served {
            return Ok(());
        }
        // Not served: the command waited for the removal.
        return removal_outcome(&status);
    }
    admin(context, pool, dirs, command)?;
    let status = loop {
        let status = admin(context, pool, dirs, Command::Status)?;
        if status["removal"]["state"] != "removing" {
            break status;
        }
        if !context.json {
            eprintln!(
                "{pool}: removing {}: {} of {} moved",
                status["removal"]["vdev"].as_str().unwrap_or("?"),
                format::bytes(status["removal"]["moved_bytes"].as_u64().unwrap_or(0)),
                format::bytes(status["removal"]["to_move_bytes"].as_u64().unwrap_or(0))
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    if context.json {
        println!("{status}");
    } else {
        print!("{}", format::status(&status));
    }
    removal_outcome(&status)
}

/// An error when the last removal stopped before its end.
fn removal_outcome(status: &Value) -> Result<(), String> {
    if status["removal"]["state"] == "stopped" {
        return Err(format!(
            "the removal of {} stopped: {}",
            status["removal"]["vdev"].as_str().unwrap_or("?"),
            status["removal"]["error"].as_str().unwrap_or("?")
        ));
    }
    Ok(())
}

fn wait_for_resilver(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<Value, String> {
    loop {
        let status = admin(context, pool, dirs, Command::Status)?;
        if status["resilver"]["state"] != "resilvering" {
            return Ok(status);
        }
        if !context.json {
            eprintln!("{pool}: {}", format::resilver_line(&status["resilver"]));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

pub fn check(context: &Context, pool: &str, dirs: &[PathBuf]) -> Result<(), String> {
    let result = admin(context, pool, dirs, Command::Check)?;
    let problems = result["problems"].as_array().cloned().unwrap_or_default();
    if context.json {
        println!("{result}");
    } else {
        println!(
            "checked {} objects, {} block copies, {} referenced, {} allocated",
            result["objects"],
            result["block_copies"],
            format::bytes(result["referenced_bytes"].as_u64().unwrap_or(0)),
            format::bytes(result["allocated_bytes"].as_u64().unwrap_or(0))
        );
        for problem in &problems {
            println!("  problem: {}", problem.as_str().unwrap_or("?"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{} problems found", problems.len()))
    }
}

pub fn tune(
    context: &Context,
    pool: &str,
    dirs: &[PathBuf],
    name: Option<String>,
    value: Option<String>,
) -> Result<(), String> {
    let command = match (name, value) {
        (Some(name), Some(value)) => Command::SetTunable { name, value },
        (None, None) => Command::GetTunables,
        _ => return Err("give both NAME and VALUE to set a tunable".into()),
    };
    let result = admin(context, pool, dirs, command)?;
    if context.json {
        println!("{result}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    }
    Ok(())
}

/// `ironpool sync POOL|POOL/NAME...`: each pool, filesystem or volume
/// named, in order; returns once each is durable.
pub fn sync(context: &Context, dirs: &[PathBuf], names: &[String]) -> Result<(), String> {
    for name in names {
        let (pool, dataset) = match name.split_once('/') {
            Some((pool, _)) => (pool, Some(name.clone())),
            None => (name.as_str(), None),
        };
        let result = admin(context, pool, dirs, Command::Sync { name: dataset })?;
        if context.json {
            println!("{result}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn layouts_mix_disks_mirrors_and_raidz_groups() {
        let layout = parse_layout(&words("a mirror b c raidz2 d e f g raidz h i")).unwrap();
        let kinds: Vec<(TopVdevKind, usize)> = layout
            .iter()
            .map(|group| (group.kind, group.paths.len()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (TopVdevKind::Disk, 1),
                (TopVdevKind::Mirror, 2),
                (TopVdevKind::Raidz2, 4),
                (TopVdevKind::Raidz1, 2)
            ]
        );
        assert_eq!(
            parse_layout(&words("raidz3 a b c d")).unwrap()[0].kind,
            TopVdevKind::Raidz3
        );
        assert!(parse_layout(&words("raidz3 a b c"))
            .unwrap_err()
            .contains("4 to 255"));
        assert!(parse_layout(&words("raidz1 a"))
            .unwrap_err()
            .contains("2 to 255"));
        assert!(parse_layout(&words("mirror a b c d"))
            .unwrap_err()
            .contains("2 or 3"));
        assert!(parse_layout(&words("raidz0 a b")).is_err());
        assert!(parse_layout(&words("raidz2")).is_err());
        assert!(parse_layout(&[]).is_err());
    }

    #[test]
    fn log_devices_follow_the_log_keyword() {
        let layout = parse_layout(&words("mirror a b log c mirror d e")).unwrap();
        let shape: Vec<(TopVdevKind, usize, bool)> = layout
            .iter()
            .map(|group| (group.kind, group.paths.len(), group.log))
            .collect();
        assert_eq!(
            shape,
            vec![
                (TopVdevKind::Mirror, 2, false),
                (TopVdevKind::Disk, 1, true),
                (TopVdevKind::Mirror, 2, true)
            ]
        );
        assert!(parse_layout(&words("a log raidz b c"))
            .unwrap_err()
            .contains("not RAID-Z"));
        assert!(parse_layout(&words("a log")).unwrap_err().contains("log"));
        assert!(parse_layout(&words("log a")).unwrap()[0].log);
        assert!(parse_layout(&words("a log b log c"))
            .unwrap_err()
            .contains("twice"));
    }
}
