//! NBD targets: any NBD URI, and nbdkit's file plugin over a unix socket
//! (the transport baseline: the same NBD path as ironpool, with a trivial
//! server behind it).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::process::{command_argv, run_command, ServerProcess};
use super::{check_overwrite, files, Access, FillMethod, Instance, SetupContext};
use crate::units::bytes_human;

/// How long nbdkit may take to listen: it starts in milliseconds.
const NBDKIT_START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long nbdinfo may take to answer a local server.
const NBDINFO_TIMEOUT: Duration = Duration::from_secs(30);

/// sun_path is 108 bytes including the terminating NUL.
pub const UNIX_SOCKET_PATH_MAX_BYTES: usize = 107;

/// What nbdinfo tells about an export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NbdInfo {
    /// Export size.
    pub size_bytes: u64,
    /// Whether several connections see each other's writes after a flush.
    pub multi_conn: Option<bool>,
    /// The server's preferred block size, when it advertises one.
    pub preferred_block_size_bytes: Option<u64>,
}

/// Parses `nbdinfo --json URI` (the first export).
pub fn parse_nbdinfo(text: &str) -> Result<NbdInfo> {
    let json: Value =
        serde_json::from_str(text).context("nbdinfo --json printed something that is not JSON")?;
    let export = json
        .get("exports")
        .and_then(|e| e.get(0))
        .context("nbdinfo --json lists no export")?;
    Ok(NbdInfo {
        size_bytes: export
            .get("export-size")
            .and_then(Value::as_u64)
            .context("nbdinfo --json gives no export-size")?,
        multi_conn: export.get("can_multi_conn").and_then(Value::as_bool),
        preferred_block_size_bytes: export.get("block_size_preferred").and_then(Value::as_u64),
    })
}

/// Asks nbdinfo about an export.
pub fn nbdinfo(nbdinfo: &Path, uri: &str) -> Result<NbdInfo> {
    let argv = vec![
        nbdinfo.display().to_string(),
        "--json".to_string(),
        uri.to_string(),
    ];
    let text = run_command(&argv, NBDINFO_TIMEOUT)
        .context("asking nbdinfo (package libnbd-bin) about the export")?;
    parse_nbdinfo(&text)
}

/// The NBD URI of an export on a unix socket.
pub fn unix_uri(export: &str, socket: &Path) -> String {
    format!(
        "nbd+unix:///{export}?socket={}",
        percent_encode(&socket.display().to_string())
    )
}

/// Percent-encodes what may not appear raw in a URI query value.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Fails clearly when a socket path is too long for sun_path.
pub fn check_socket_path(path: &Path) -> Result<()> {
    let length = path.as_os_str().len();
    if length > UNIX_SOCKET_PATH_MAX_BYTES {
        bail!(
            "socket path {} is {length} bytes, over the {UNIX_SOCKET_PATH_MAX_BYTES}-byte limit of unix sockets: use a shorter --out",
            path.display()
        );
    }
    Ok(())
}

/// `nbd:URI`: an export someone else serves.
pub fn setup_uri(uri: &str, label: &str, context: &SetupContext<'_>) -> Result<Instance> {
    check_overwrite(&format!("NBD export {uri}"), context)?;
    let info = nbdinfo(context.nbdinfo, uri)?;
    let size_bytes = context.size_bytes.min(info.size_bytes);
    let mut instance = Instance::new(
        label.to_string(),
        "nbd",
        Access::Nbd(uri.to_string()),
        size_bytes,
    );
    instance.record_size_bytes = info.preferred_block_size_bytes;
    instance.nbd_multi_conn = info.multi_conn;
    instance.fill =
        FillMethod::Unsupported("the tool cannot see the fill level behind an NBD URI".to_string());
    instance.description = format!(
        "NBD export {uri} ({}), first {} used; fio nbd engine",
        bytes_human(info.size_bytes as f64),
        bytes_human(size_bytes as f64)
    );
    Ok(instance)
}

/// `nbdkit[:PATH]`: starts `nbdkit -f -P PIDFILE --unix SOCK file PATH`.
pub fn setup_nbdkit(
    path: Option<&Path>,
    label: &str,
    slug: &str,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    let dir = context.out_dir.join(slug);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (file, owned): (PathBuf, bool) = match path {
        Some(path) => (path.to_path_buf(), !path.exists()),
        None => (context.out_dir.join("nbdkit.img"), true),
    };
    if !owned {
        check_overwrite(&format!("file {}", file.display()), context)?;
    }
    files::create_sparse(&file, context.size_bytes)?;
    let plugin = [OsStr::new("file"), file.as_os_str()];
    let mut instance = start_nbdkit("nbdkit", &plugin, label, &dir, context)?;
    if owned {
        instance.owned_files.push(file.clone());
    }
    instance.nbd_cache_note =
        Some("nbdkit's file plugin serves through the page cache".to_string());
    instance.fill =
        FillMethod::Unsupported("nbdkit is the transport baseline; it is not filled".to_string());
    let fs = files::mount_of(&file)?
        .map(|m| format!(" on {}", m.fs_type))
        .unwrap_or_default();
    instance.description = format!(
        "nbdkit file plugin serving {}{fs} (page cache) over a unix socket; fio nbd engine",
        file.display()
    );
    Ok(instance)
}

/// Starts `nbdkit -f -P PIDFILE --unix SOCK memory SIZE`: the NBD
/// transport with the working set in the server's RAM, so that reads of it
/// cost the transport and a copy, nothing else: the ceiling of a volume's
/// reads from its cache.
pub fn setup_nbdkit_memory(
    label: &str,
    slug: &str,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    let dir = context.out_dir.join(slug);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let size = context.size_bytes.to_string();
    let plugin = [OsStr::new("memory"), OsStr::new(&size)];
    let mut instance = start_nbdkit("nbdkit-memory", &plugin, label, &dir, context)?;
    instance.nbd_cache_note = Some("nbdkit's memory plugin holds its data in RAM".to_string());
    instance.fill = FillMethod::Unsupported(
        "nbdkit-memory is the cached-read ceiling; it is not filled".to_string(),
    );
    instance.description = format!(
        "nbdkit memory plugin of {} over a unix socket (data in RAM); fio nbd engine",
        bytes_human(context.size_bytes as f64)
    );
    Ok(instance)
}

/// Starts `nbdkit -f -P PIDFILE --unix SOCK PLUGIN...` in target
/// directory `dir` and waits for it: an NBD target of kind `kind`, with
/// the server, its socket and pidfile (removed at teardown), the command,
/// and what `nbdinfo` says of the export (preferred block size,
/// multi-conn). The caller adds what its plugin means.
fn start_nbdkit(
    kind: &'static str,
    plugin: &[&OsStr],
    label: &str,
    dir: &Path,
    context: &SetupContext<'_>,
) -> Result<Instance> {
    let socket = dir.join("nbd.sock");
    let pidfile = dir.join("nbdkit.pid");
    check_socket_path(&socket)?;
    files::remove_if_present(&socket)?;
    files::remove_if_present(&pidfile)?;
    let mut command = Command::new(context.nbdkit);
    command
        .arg("-f")
        .arg("-P")
        .arg(&pidfile)
        .arg("--unix")
        .arg(&socket)
        .args(plugin);
    let argv = command_argv(&command);
    let mut server = ServerProcess::spawn("nbdkit", &mut command, &dir.join("nbdkit.log"))
        .context("starting nbdkit (package nbdkit)")?;
    server.wait_ready(&[&pidfile, &socket], NBDKIT_START_TIMEOUT)?;
    let uri = unix_uri("", &socket);
    let info = nbdinfo(context.nbdinfo, &uri)?;
    let mut instance = Instance::new(
        label.to_string(),
        kind,
        Access::Nbd(uri),
        context.size_bytes,
    );
    instance.owned_files.extend([socket, pidfile]);
    instance.setup_commands.push(argv);
    instance.server = Some(server);
    instance.record_size_bytes = info.preferred_block_size_bytes;
    instance.nbd_multi_conn = info.multi_conn;
    Ok(instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nbdinfo() {
        let text = r#"{"protocol":"newstyle-fixed","exports":[{"export-name":"","can_multi_conn":true,
            "export-size":268435456,"block_size_preferred":4096}]}"#;
        let info = parse_nbdinfo(text).unwrap();
        assert_eq!(info.size_bytes, 268_435_456);
        assert_eq!(info.multi_conn, Some(true));
        assert_eq!(info.preferred_block_size_bytes, Some(4096));
        assert!(parse_nbdinfo(r#"{"exports":[]}"#).is_err());
    }

    #[test]
    fn builds_uris() {
        assert_eq!(
            unix_uri("bench/vol", Path::new("/o/p/nbd.sock")),
            "nbd+unix:///bench/vol?socket=/o/p/nbd.sock"
        );
        assert_eq!(
            unix_uri("", Path::new("/o p/&.sock")),
            "nbd+unix:///?socket=/o%20p/%26.sock"
        );
        assert!(check_socket_path(&PathBuf::from("/".repeat(200))).is_err());
    }
}
