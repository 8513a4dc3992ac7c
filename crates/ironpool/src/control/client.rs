//! The CLI side of the control socket (plain blocking I/O: the CLI is a short-lived
//! process outside the engine's loop).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::commands::{Command, Response};

/// How long the CLI waits for a server's answer (a check or destroy of a large
/// volume can take a while).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Sends `command` to the server listening on `path`.
pub fn call(path: &Path, command: &Command) -> Result<Response, String> {
    let mut stream = UnixStream::connect(path).map_err(|error| format!("{}: {error}", path.display()))?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(|error| error.to_string())?;
    let mut request = serde_json::to_vec(command).map_err(|error| error.to_string())?;
    request.push(b'\n');
    stream.write_all(&request).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(|error| format!("{}: {error}", path.display()))?;
    serde_json::from_str(&line).map_err(|error| format!("bad answer from {}: {error}", path.display()))
}
