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

/// Sends a stream command (send, receive) to the server on `path`, passing it
/// `stream` (the CLI's stdout or stdin) so that the server reads or writes the
/// stream directly; waits for the answer however long the stream takes.
pub fn call_with_stream(path: &Path, command: &Command, stream: std::os::fd::RawFd) -> Result<Response, String> {
    use std::os::fd::AsRawFd;
    let socket = UnixStream::connect(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut request = serde_json::to_vec(command).map_err(|error| error.to_string())?;
    request.push(b'\n');
    send_with_fd(socket.as_raw_fd(), &request, stream).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut line = String::new();
    BufReader::new(socket).read_line(&mut line).map_err(|error| format!("{}: {error}", path.display()))?;
    if line.is_empty() {
        return Err(format!("{}: the server closed the connection without an answer", path.display()));
    }
    serde_json::from_str(&line).map_err(|error| format!("bad answer from {}: {error}", path.display()))
}

/// Writes `bytes` to a unix socket with `fd` attached (SCM_RIGHTS) to the first
/// part of them.
fn send_with_fd(socket: std::os::fd::RawFd, bytes: &[u8], fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<std::os::fd::RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iovec = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
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
        let mut stream = std::mem::ManuallyDrop::new(unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(socket) });
        stream.write_all(&bytes[sent..])?;
    }
    Ok(())
}
