//! The control socket of a running server: one JSON request per connection, one
//! JSON response back. Commands run on the engine's loop like any other task.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use super::commands::{execute, execute_stream, Command, Response};
use crate::nbd::engine::SharedStats;
use crate::pool::Pool;
use crate::rt::uring;
use crate::rt::{self};

/// Largest request accepted (commands are small JSON documents).
pub const CONTROL_REQUEST_BYTES_MAX: usize = 1024 * 1024;
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A listening control socket.
pub struct ControlServer {
    fd: OwnedFd,
    path: PathBuf,
    _lock: OwnedFd,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket) and serves commands for `pool`.
    pub fn start(
        path: &Path,
        pool: Rc<Pool>,
        nbd: Option<std::sync::Arc<SharedStats>>,
    ) -> std::io::Result<Rc<ControlServer>> {
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)?;
            }
        }
        let (listener, lock) = crate::nbd::server::bind_unix_exclusive(path)?;
        let server = Rc::new(ControlServer {
            fd: listener.into(),
            path: path.to_path_buf(),
            _lock: lock,
        });
        let raw = server.fd.as_raw_fd();
        rt::spawn(async move {
            while let Ok(socket) = uring::accept(raw).await {
                let pool = pool.clone();
                let nbd = nbd.clone();
                rt::spawn(async move { serve_one(socket, pool, nbd).await });
            }
        });
        Ok(server)
    }

    /// Stops accepting and removes the socket file.
    pub fn stop(&self) {
        // SAFETY: shutting down our own listening socket ends the accept loop.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads one request line, and the descriptor passed with it if any (send and
/// receive pass the CLI's stdout or stdin).
async fn read_request(fd: RawFd) -> Result<(Vec<u8>, Option<OwnedFd>), String> {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut length = 0;
    let mut passed: Option<OwnedFd> = None;
    loop {
        if let Some(end) = buffer[..length].iter().position(|byte| *byte == b'\n') {
            buffer.truncate(end);
            return Ok((buffer, passed));
        }
        if length == buffer.len() {
            if buffer.len() >= CONTROL_REQUEST_BYTES_MAX {
                return Err("request too large".into());
            }
            buffer.resize(buffer.len() * 2, 0);
        }
        let (result, returned, descriptor) = uring::recv_into_with_fd(fd, buffer, length).await;
        buffer = returned;
        if passed.is_none() {
            passed = descriptor;
        }
        match result {
            Ok(0) => {
                buffer.truncate(length);
                return Ok((buffer, passed));
            }
            Ok(count) => length += count,
            Err(error) => return Err(error.to_string()),
        }
    }
}

async fn serve_one(socket: OwnedFd, pool: Rc<Pool>, nbd: Option<std::sync::Arc<SharedStats>>) {
    let fd = socket.as_raw_fd();
    let response = match rt::timeout(REQUEST_TIMEOUT, read_request(fd)).await {
        None => Response {
            ok: false,
            result: None,
            error: Some("timed out waiting for the request".into()),
        },
        Some(Err(error)) => Response {
            ok: false,
            result: None,
            error: Some(error),
        },
        Some(Ok((bytes, passed))) => match serde_json::from_slice::<Command>(&bytes) {
            Ok(command @ (Command::Send { .. } | Command::Receive { .. })) => match passed {
                Some(stream) => {
                    Response::from_result(execute_stream(&pool, command, stream.as_raw_fd()).await)
                }
                None => Response {
                    ok: false,
                    result: None,
                    error: Some(
                        "send and receive need the stream's descriptor passed with the request"
                            .into(),
                    ),
                },
            },
            Ok(command) => Response::from_result(
                execute(&pool, command, nbd.map(|stats| stats.snapshot())).await,
            ),
            Err(error) => Response {
                ok: false,
                result: None,
                error: Some(format!("bad request: {error}")),
            },
        },
    };
    let mut bytes = serde_json::to_vec(&response).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    bytes.push(b'\n');
    // A client gone before its answer has nothing left to be told.
    let _ = uring::send_all(fd, bytes).await;
}
