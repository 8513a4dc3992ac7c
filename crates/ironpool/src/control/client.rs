//! The CLI side of the control socket (plain blocking I/O: the CLI is a short-lived
//! process outside the engine's loop).
//!
//! A call fails in one of two ways, and the CLI must tell them apart: when no
//! server answered at all ([`CallError::NotReached`]) the CLI may open the pool
//! itself; once a server accepted the command ([`CallError::Lost`]) the command
//! may have run, in part or whole, so running it again against the pool would
//! repeat it (a second stream appended to a partial one, a destroy reported as
//! "no volume" after it committed). Then the only honest answer is the error.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::commands::{Command, Response};

/// How long the CLI waits for a server's answer (a check or destroy of a large
/// volume can take a while).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Why a call to a server failed.
#[derive(Debug)]
pub enum CallError {
    /// Nothing listens on the socket (no file, or a stale one left by a dead
    /// server): the command was never delivered.
    NotReached(String),
    /// A server accepted the connection and then failed or went away before
    /// answering: the command may have run in part or whole.
    Lost(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotReached(text) => write!(formatter, "no server reached: {text}"),
            CallError::Lost(text) => write!(formatter, "{text}"),
        }
    }
}

/// True when a server holds the socket's lock (`PATH.lock`, taken for as long
/// as a server lives; see `bind_unix_exclusive`). A killed server's socket can
/// linger and accept for a moment while the kernel tears it down, so a
/// connection alone does not prove a live server.
fn server_holds_lock(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let Ok(file) = std::fs::File::open(&lock_path) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; a shared lock taken here is
    // released when `file` closes at the end of this function.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

/// Connects to the server on `path`; a refused or missing socket, or one no
/// live server holds, is `NotReached`.
fn connect(path: &Path) -> Result<UnixStream, CallError> {
    if !server_holds_lock(path) {
        return Err(CallError::NotReached(format!(
            "{}: no server holds this socket",
            path.display()
        )));
    }
    UnixStream::connect(path)
        .map_err(|error| CallError::NotReached(format!("{}: {error}", path.display())))
}

/// Reads the server's one-line answer; anything short of a full answer is `Lost`.
fn read_answer(path: &Path, socket: UnixStream) -> Result<Response, CallError> {
    let lost = |what: String| {
        CallError::Lost(format!("the server on {} {what}; the command may have run in part or whole: check before retrying", path.display()))
    };
    let mut line = String::new();
    BufReader::new(socket)
        .read_line(&mut line)
        .map_err(|error| lost(format!("failed before answering ({error})")))?;
    if !line.ends_with('\n') {
        return Err(lost(
            "closed the connection without an answer (did it stop or crash?)".into(),
        ));
    }
    serde_json::from_str(&line)
        .map_err(|error| CallError::Lost(format!("bad answer from {}: {error}", path.display())))
}

/// Sends `command` to the server listening on `path`.
pub fn call(path: &Path, command: &Command) -> Result<Response, CallError> {
    let mut stream = connect(path)?;
    let lost = |error: std::io::Error| CallError::Lost(format!("{}: {error}", path.display()));
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(lost)?;
    let mut request =
        serde_json::to_vec(command).map_err(|error| CallError::NotReached(error.to_string()))?;
    request.push(b'\n');
    stream.write_all(&request).map_err(lost)?;
    read_answer(path, stream)
}

/// Sends a stream command (send, receive) to the server on `path`, passing it
/// `stream` (the CLI's stdout or stdin) so that the server reads or writes the
/// stream directly; waits for the answer however long the stream takes.
pub fn call_with_stream(
    path: &Path,
    command: &Command,
    stream: std::os::fd::RawFd,
) -> Result<Response, CallError> {
    use std::os::fd::AsRawFd;
    let socket = connect(path)?;
    let mut request =
        serde_json::to_vec(command).map_err(|error| CallError::NotReached(error.to_string()))?;
    request.push(b'\n');
    send_with_fd(socket.as_raw_fd(), &request, stream)
        .map_err(|error| CallError::Lost(format!("{}: {error}", path.display())))?;
    read_answer(path, socket)
}

/// Writes `bytes` to a unix socket with `fd` attached (SCM_RIGHTS) to the first
/// part of them.
fn send_with_fd(
    socket: std::os::fd::RawFd,
    bytes: &[u8],
    fd: std::os::fd::RawFd,
) -> std::io::Result<()> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<std::os::fd::RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iovec = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid; its pointers are set to live locals.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iovec;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    header.msg_controllen = space as _;
    // SAFETY: the control buffer holds one message of CMSG_SPACE(int) bytes.
    unsafe {
        let message = libc::CMSG_FIRSTHDR(&header);
        (*message).cmsg_level = libc::SOL_SOCKET;
        (*message).cmsg_type = libc::SCM_RIGHTS;
        (*message).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<std::os::fd::RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(message) as *mut std::os::fd::RawFd, fd);
    }
    // SAFETY: header points to live buffers for the duration of the call.
    let sent = unsafe { libc::sendmsg(socket, &header, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let sent = sent as usize;
    if sent < bytes.len() {
        // The descriptor went with the first part; the rest is plain bytes.
        use std::io::Write;
        // SAFETY: borrowing the caller's socket descriptor without taking it.
        let mut stream = std::mem::ManuallyDrop::new(unsafe {
            <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(socket)
        });
        stream.write_all(&bytes[sent..])?;
    }
    Ok(())
}
