//! The NBD server, on the same io_uring loop as the engine.
//!
//! Each connection has one task that reads: the handshake, then request after
//! request. Every request becomes its own task, so many run at once and their
//! replies go out as they complete (out of order), through the connection's
//! sender task, which batches replies into one sendmsg. Nothing blocks: socket
//! reads and writes are io_uring operations like device I/O.
//!
//! Bounds: requests in flight per connection, payload bytes in flight per server,
//! connections per server, option sizes, and the time a handshake may take.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use super::proto::*;
use crate::pool::volume::{ReadPiece, Volume, IO_ALIGNMENT_BYTES};
use crate::pool::{Pool, PoolError};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::{Notify, Permit, Semaphore};
use crate::rt::uring::{self, SendPiece};
use crate::rt::{self};

/// Requests one connection may have in flight (a client's queue depth; the Linux
/// nbd driver uses 128 per connection, fio/qemu up to 64-256).
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION: u64 = 256;
/// Payload bytes (write data received, read data to send) in flight across the
/// server: bounds memory under any number of clients.
pub const PAYLOAD_BYTES_IN_FLIGHT_MAX: u64 = 256 * 1024 * 1024;
/// Connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Time a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Receive buffer per connection: holds many request headers (and small payloads)
/// per recv.
const RECEIVE_BUFFER_BYTES: usize = 1024 * 1024;
/// Most pieces gathered into one sendmsg.
const SEND_BATCH_PIECES: usize = 512;
/// Longest a shutdown waits for connections to drain.
const SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

impl Listen {
    /// Parses `unix:PATH` or `tcp:HOST:PORT` (`tcp:PORT` means 127.0.0.1).
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        if let Some(address) = text.strip_prefix("tcp:") {
            let address = if address.contains(':') { address.to_string() } else { format!("127.0.0.1:{address}") };
            return Ok(Listen::Tcp(address));
        }
        Err(format!("'{text}': use unix:PATH or tcp:HOST:PORT"))
    }
}

/// Server-wide counters.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ServerStats {
    pub connections_accepted: u64,
    pub connections_open: u64,
    pub connections_refused: u64,
    pub requests: u64,
    pub request_errors: u64,
    pub protocol_errors: u64,
}

/// The NBD server of one pool.
pub struct NbdServer {
    pool: Rc<Pool>,
    payload_budget: Rc<Semaphore>,
    shutting_down: Cell<bool>,
    listeners: RefCell<Vec<(OwnedFd, Option<PathBuf>)>>,
    /// Locks on the unix socket paths, held for the server's life.
    locks: RefCell<Vec<OwnedFd>>,
    connections: RefCell<Vec<std::rc::Weak<Connection>>>,
    drained: Notify,
    stats: Cell<ServerStats>,
}

impl NbdServer {
    pub fn new(pool: Rc<Pool>) -> Rc<NbdServer> {
        Rc::new(NbdServer {
            pool,
            payload_budget: Semaphore::new(PAYLOAD_BYTES_IN_FLIGHT_MAX),
            shutting_down: Cell::new(false),
            listeners: RefCell::new(Vec::new()),
            locks: RefCell::new(Vec::new()),
            connections: RefCell::new(Vec::new()),
            drained: Notify::new(),
            stats: Cell::new(ServerStats::default()),
        })
    }

    pub fn stats(&self) -> ServerStats {
        self.stats.get()
    }

    fn count(&self, update: impl FnOnce(&mut ServerStats)) {
        let mut stats = self.stats.get();
        update(&mut stats);
        self.stats.set(stats);
    }

    /// Binds `listen` and starts accepting connections.
    pub fn listen(self: &Rc<Self>, listen: &Listen) -> std::io::Result<()> {
        let (fd, path): (OwnedFd, Option<PathBuf>) = match listen {
            Listen::Unix(path) => {
                let (listener, lock) = bind_unix_exclusive(path)?;
                self.locks.borrow_mut().push(lock);
                (listener.into(), Some(path.clone()))
            }
            Listen::Tcp(address) => {
                let listener =
                    std::net::TcpListener::bind(address).map_err(|error| std::io::Error::new(error.kind(), format!("{address}: {error}")))?;
                (listener.into(), None)
            }
        };
        let raw = fd.as_raw_fd();
        self.listeners.borrow_mut().push((fd, path));
        let server = self.clone();
        rt::spawn(async move { server.accept_loop(raw).await });
        Ok(())
    }

    async fn accept_loop(self: Rc<Self>, listener: RawFd) {
        loop {
            if self.shutting_down.get() {
                return;
            }
            match uring::accept(listener).await {
                Ok(socket) => {
                    if self.shutting_down.get() {
                        return;
                    }
                    self.connections.borrow_mut().retain(|weak| weak.strong_count() > 0);
                    if self.connections.borrow().len() >= CONNECTIONS_MAX {
                        self.count(|stats| stats.connections_refused += 1);
                        continue; // dropping the socket closes it
                    }
                    set_nodelay(&socket);
                    self.count(|stats| {
                        stats.connections_accepted += 1;
                        stats.connections_open += 1;
                    });
                    let connection = Rc::new(Connection::new(socket, self.clone()));
                    self.connections.borrow_mut().push(Rc::downgrade(&connection));
                    rt::spawn(async move { connection.run().await });
                }
                Err(error) => {
                    if self.shutting_down.get() {
                        return;
                    }
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("ironpool: accept failed: {error}");
                    rt::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Stops accepting, lets every connection finish its requests, then returns.
    pub async fn shutdown(&self) {
        self.shutting_down.set(true);
        for (fd, path) in self.listeners.borrow_mut().drain(..) {
            // SAFETY: shutting down a listening socket we own makes pending
            // accepts fail, which ends the accept loops.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
            if let Some(path) = path {
                let _ = std::fs::remove_file(path);
            }
        }
        let connections: Vec<Rc<Connection>> = self.connections.borrow().iter().filter_map(|weak| weak.upgrade()).collect();
        for connection in &connections {
            connection.stop_reading();
        }
        drop(connections);
        let drained = async {
            loop {
                self.connections.borrow_mut().retain(|weak| weak.strong_count() > 0);
                if self.connections.borrow().is_empty() {
                    return;
                }
                self.drained.notified().await;
            }
        };
        if rt::timeout(SHUTDOWN_DRAIN_TIMEOUT, drained).await.is_none() {
            eprintln!("ironpool: some NBD connections did not finish within {SHUTDOWN_DRAIN_TIMEOUT:?}");
        }
    }

    /// The volume an export name refers to: "POOL/NAME", "NAME", or "" when the
    /// pool has exactly one volume.
    fn export(&self, name: &str) -> Option<Rc<Volume>> {
        if name.is_empty() {
            let volumes = self.pool.volumes.borrow();
            if volumes.len() == 1 {
                return volumes.values().next().cloned();
            }
            return None;
        }
        self.pool.volume(name).ok()
    }

    fn export_names(&self) -> Vec<String> {
        self.pool.volumes.borrow().values().map(|volume| volume.name.clone()).collect()
    }
}

/// Binds a unix socket that only one server may own: an exclusive lock on
/// `PATH.lock` decides. A socket file left by a server that died is replaced; a
/// live server's is refused. (Connecting to test liveness is not enough: a
/// killed server's listening socket can linger, accepting, while the kernel
/// tears its io_uring down.)
pub fn bind_unix_exclusive(path: &std::path::Path) -> std::io::Result<(std::os::unix::net::UnixListener, OwnedFd)> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    let lock: OwnedFd = lock_file.into();
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("{}: another server is listening there", path.display())));
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|error| std::io::Error::new(error.kind(), format!("{}: {error}", path.display())))?;
    Ok((listener, lock))
}

fn set_nodelay(socket: &OwnedFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a valid int; it fails harmlessly on unix sockets.
    unsafe {
        libc::setsockopt(socket.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, &one as *const libc::c_int as *const libc::c_void, 4);
    }
}

/// What a connection negotiated.
#[derive(Default)]
struct Negotiated {
    structured: bool,
    no_zeroes: bool,
    /// Export named in the last SET_META_CONTEXT and whether base:allocation was
    /// selected.
    meta_export: Option<String>,
    meta_allocation: bool,
}

/// A reply waiting to be sent, with the permit it holds until then.
struct Outgoing {
    pieces: Vec<SendPiece>,
    _permits: Vec<Permit>,
}

struct Connection {
    fd: OwnedFd,
    server: Rc<NbdServer>,
    outbox: RefCell<VecDeque<Outgoing>>,
    outbox_ready: Notify,
    /// The reader is done (EOF, DISC, error or shutdown).
    reading_done: Cell<bool>,
    /// The socket failed for sending.
    broken: Cell<bool>,
    in_flight: Rc<Semaphore>,
}

/// The read side of a connection: a buffer over the socket.
struct Receiver {
    fd: RawFd,
    buffer: Vec<u8>,
    start: usize,
    end: usize,
}

impl Receiver {
    /// Makes at least `count` bytes available in `buffer[start..end]`.
    async fn fill(&mut self, count: usize) -> std::io::Result<()> {
        assert!(count <= RECEIVE_BUFFER_BYTES);
        while self.end - self.start < count {
            if self.start > 0 && self.start + count > self.buffer.len() {
                self.buffer.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let buffer = std::mem::take(&mut self.buffer);
            let (result, buffer) = uring::recv_into(self.fd, buffer, self.end).await;
            self.buffer = buffer;
            match result? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                received => self.end += received,
            }
        }
        Ok(())
    }

    async fn read_array<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        self.fill(N).await?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buffer[self.start..self.start + N]);
        self.start += N;
        Ok(out)
    }

    /// Reads `length` bytes of option data (bounded by OPTION_BYTES_MAX).
    async fn read_vec(&mut self, length: usize) -> std::io::Result<Vec<u8>> {
        self.fill(length).await?;
        let out = self.buffer[self.start..self.start + length].to_vec();
        self.start += length;
        Ok(out)
    }

    /// Reads a write payload into an aligned buffer: what is buffered is copied,
    /// the rest is received straight into place.
    async fn read_payload(&mut self, length: usize) -> std::io::Result<AlignedBuf> {
        let mut payload = AlignedBuf::for_overwrite(length);
        let buffered = (self.end - self.start).min(length);
        payload[..buffered].copy_from_slice(&self.buffer[self.start..self.start + buffered]);
        self.start += buffered;
        let mut done = buffered;
        while done < length {
            let (result, buffer) = uring::recv_aligned(self.fd, payload, done, length).await;
            payload = buffer;
            match result? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                received => done += received,
            }
        }
        Ok(payload)
    }
}

async fn send_all(fd: RawFd, bytes: Vec<u8>) -> std::io::Result<()> {
    let total = bytes.len();
    let mut pieces = vec![SendPiece::Bytes(bytes)];
    let mut sent = 0;
    while sent < total {
        let (result, returned) = uring::send_pieces(fd, pieces, sent).await;
        pieces = returned;
        match result? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            count => sent += count,
        }
    }
    Ok(())
}

/// The handshake ended: with an export to serve, or not.
enum HandshakeEnd {
    Serve(Rc<Volume>),
    Close,
}

impl Connection {
    fn new(fd: OwnedFd, server: Rc<NbdServer>) -> Connection {
        Connection {
            fd,
            server,
            outbox: RefCell::new(VecDeque::new()),
            outbox_ready: Notify::new(),
            reading_done: Cell::new(false),
            broken: Cell::new(false),
            in_flight: Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION),
        }
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes the reader see end-of-file (server shutdown); requests in flight finish.
    fn stop_reading(&self) {
        // SAFETY: shutting down the read side of our own socket.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RD) };
    }

    async fn run(self: Rc<Self>) {
        let mut receiver = Receiver { fd: self.raw(), buffer: vec![0u8; RECEIVE_BUFFER_BYTES], start: 0, end: 0 };
        let mut negotiated = Negotiated::default();
        let handshake = rt::timeout(HANDSHAKE_TIMEOUT, self.handshake(&mut receiver, &mut negotiated)).await;
        let volume = match handshake {
            Some(Ok(HandshakeEnd::Serve(volume))) => volume,
            Some(Ok(HandshakeEnd::Close)) => return self.closed(),
            Some(Err(_)) | None => {
                self.server.count(|stats| stats.protocol_errors += 1);
                return self.closed();
            }
        };
        let sender = {
            let connection = self.clone();
            rt::spawn(async move { connection.send_loop().await })
        };
        let negotiated = Rc::new(negotiated);
        if let Err(error) = self.transmission(&mut receiver, &volume, &negotiated).await {
            if error.kind() != std::io::ErrorKind::UnexpectedEof {
                self.server.count(|stats| stats.protocol_errors += 1);
            }
        }
        // Let requests in flight finish and their replies go out, then close.
        let _all = self.in_flight.acquire(REQUESTS_IN_FLIGHT_PER_CONNECTION).await;
        self.reading_done.set(true);
        self.outbox_ready.notify_all();
        sender.await;
        self.closed();
    }

    fn closed(&self) {
        self.server.count(|stats| stats.connections_open = stats.connections_open.saturating_sub(1));
        self.server.drained.notify_all();
    }

    async fn handshake(&self, receiver: &mut Receiver, negotiated: &mut Negotiated) -> std::io::Result<HandshakeEnd> {
        let fd = self.raw();
        send_all(fd, greeting()).await?;
        let flags: [u8; 4] = receiver.read_array().await?;
        negotiated.no_zeroes = parse_client_flags(&flags).map_err(protocol_to_io)?;
        loop {
            let header_bytes: [u8; OPTION_HEADER_BYTES] = receiver.read_array().await?;
            let header = parse_option_header(&header_bytes).map_err(protocol_to_io)?;
            if header.length > OPTION_BYTES_MAX {
                send_all(fd, option_reply(header.option, REP_ERR_TOO_BIG, b"option data too large")).await?;
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "oversized option"));
            }
            let data = receiver.read_vec(header.length as usize).await?;
            if self.server.shutting_down.get() && header.option != OPT_ABORT {
                if header.option == OPT_EXPORT_NAME {
                    return Ok(HandshakeEnd::Close);
                }
                send_all(fd, option_reply(header.option, REP_ERR_SHUTDOWN, b"server shutting down")).await?;
                continue;
            }
            match header.option {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).to_string();
                    // No error reply exists for EXPORT_NAME: an unknown name closes.
                    let Some(volume) = self.server.export(&name) else { return Ok(HandshakeEnd::Close) };
                    let flags = transmission_flags(&volume, false);
                    send_all(fd, export_name_reply(volume.size_bytes.get(), flags, negotiated.no_zeroes)).await?;
                    return Ok(HandshakeEnd::Serve(volume));
                }
                OPT_ABORT => {
                    let _ = send_all(fd, option_reply(OPT_ABORT, REP_ACK, &[])).await;
                    return Ok(HandshakeEnd::Close);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        send_all(fd, option_reply(OPT_LIST, REP_ERR_INVALID, b"LIST takes no data")).await?;
                        continue;
                    }
                    let mut replies = Vec::new();
                    for name in self.server.export_names() {
                        let mut entry = (name.len() as u32).to_be_bytes().to_vec();
                        entry.extend_from_slice(name.as_bytes());
                        replies.extend(option_reply(OPT_LIST, REP_SERVER, &entry));
                    }
                    replies.extend(option_reply(OPT_LIST, REP_ACK, &[]));
                    send_all(fd, replies).await?;
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        send_all(fd, option_reply(header.option, REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data")).await?;
                        continue;
                    }
                    negotiated.structured = true;
                    send_all(fd, option_reply(header.option, REP_ACK, &[])).await?;
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    let reply = self.meta_context(header.option, &data, negotiated);
                    send_all(fd, reply).await?;
                }
                OPT_INFO | OPT_GO => {
                    let request = match parse_info_request(&data) {
                        Ok(request) => request,
                        Err(reason) => {
                            send_all(fd, option_reply(header.option, REP_ERR_INVALID, reason.as_bytes())).await?;
                            continue;
                        }
                    };
                    let Some(volume) = self.server.export(&request.name) else {
                        let message = format!("no export named '{}'", request.name);
                        send_all(fd, option_reply(header.option, REP_ERR_UNKNOWN, message.as_bytes())).await?;
                        continue;
                    };
                    let flags = transmission_flags(&volume, negotiated.structured);
                    let mut replies = option_reply(header.option, REP_INFO, &info_export(volume.size_bytes.get(), flags));
                    if request.requests.contains(&INFO_NAME) {
                        let mut payload = INFO_NAME.to_be_bytes().to_vec();
                        payload.extend_from_slice(volume.name.as_bytes());
                        replies.extend(option_reply(header.option, REP_INFO, &payload));
                    }
                    if request.requests.contains(&INFO_DESCRIPTION) {
                        let mut payload = INFO_DESCRIPTION.to_be_bytes().to_vec();
                        payload.extend_from_slice(format!("ironpool volume {}", volume.name).as_bytes());
                        replies.extend(option_reply(header.option, REP_INFO, &payload));
                    }
                    let preferred = volume.block_bytes.clamp(IO_ALIGNMENT_BYTES, PAYLOAD_BYTES_MAX as u64) as u32;
                    replies.extend(option_reply(header.option, REP_INFO, &info_block_size(IO_ALIGNMENT_BYTES as u32, preferred, PAYLOAD_BYTES_MAX)));
                    replies.extend(option_reply(header.option, REP_ACK, &[]));
                    send_all(fd, replies).await?;
                    if header.option == OPT_GO {
                        return Ok(HandshakeEnd::Serve(volume));
                    }
                }
                OPT_STARTTLS => {
                    send_all(fd, option_reply(header.option, REP_ERR_POLICY, b"TLS is not offered; use a unix socket or loopback")).await?;
                }
                other => {
                    let message = format!("option {other} is not supported");
                    send_all(fd, option_reply(other, REP_ERR_UNSUP, message.as_bytes())).await?;
                }
            }
        }
    }

    /// Answers LIST_META_CONTEXT / SET_META_CONTEXT.
    fn meta_context(&self, option: u32, data: &[u8], negotiated: &mut Negotiated) -> Vec<u8> {
        if option == OPT_SET_META_CONTEXT {
            // SET replaces the selection even when it fails.
            negotiated.meta_export = None;
            negotiated.meta_allocation = false;
        }
        if !negotiated.structured {
            return option_reply(option, REP_ERR_INVALID, b"negotiate structured replies first");
        }
        let request = match parse_meta_context_request(data) {
            Ok(request) => request,
            Err(reason) => return option_reply(option, REP_ERR_INVALID, reason.as_bytes()),
        };
        if self.server.export(&request.export).is_none() {
            return option_reply(option, REP_ERR_UNKNOWN, b"no such export");
        }
        let selected = if option == OPT_LIST_META_CONTEXT && request.queries.is_empty() {
            true
        } else {
            request.queries.iter().any(|query| matches_base_allocation(query) && (option == OPT_LIST_META_CONTEXT || query != "base:"))
        };
        let mut replies = Vec::new();
        if selected {
            let id = if option == OPT_SET_META_CONTEXT { CONTEXT_BASE_ALLOCATION_ID } else { 0 };
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend_from_slice(CONTEXT_BASE_ALLOCATION.as_bytes());
            replies.extend(option_reply(option, REP_META_CONTEXT, &payload));
        }
        if option == OPT_SET_META_CONTEXT {
            negotiated.meta_export = Some(request.export);
            negotiated.meta_allocation = selected;
        }
        replies.extend(option_reply(option, REP_ACK, &[]));
        replies
    }

    async fn transmission(self: &Rc<Self>, receiver: &mut Receiver, volume: &Rc<Volume>, negotiated: &Rc<Negotiated>) -> std::io::Result<()> {
        loop {
            let permit = self.in_flight.acquire(1).await;
            let header: [u8; REQUEST_HEADER_BYTES] = receiver.read_array().await?;
            let request = match parse_request(&header) {
                Ok(request) => request,
                // The stream is out of step: nothing more can be trusted.
                Err(error) => return Err(protocol_to_io(error)),
            };
            self.server.count(|stats| stats.requests += 1);
            if request.command == CMD_DISC {
                return Ok(());
            }
            let mut permits = vec![permit];
            let payload = if request.command == CMD_WRITE && request.length > 0 {
                if request.length > PAYLOAD_BYTES_MAX {
                    // The payload cannot be skipped safely at this size: disconnect.
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "write payload above the maximum"));
                }
                permits.push(self.server.payload_budget.acquire(request.length as u64).await);
                Some(receiver.read_payload(request.length as usize).await?)
            } else {
                if request.command == CMD_READ && request.length > 0 && request.length <= PAYLOAD_BYTES_MAX {
                    permits.push(self.server.payload_budget.acquire(request.length as u64).await);
                }
                None
            };
            let connection = self.clone();
            let volume = volume.clone();
            let negotiated = negotiated.clone();
            rt::spawn(async move {
                let pieces = connection.execute(&volume, &negotiated, request, payload).await;
                connection.queue(Outgoing { pieces, _permits: permits });
            });
        }
    }

    fn queue(&self, outgoing: Outgoing) {
        if self.broken.get() {
            return; // the client is gone; dropping releases the permits
        }
        self.outbox.borrow_mut().push_back(outgoing);
        self.outbox_ready.notify_all();
    }

    async fn send_loop(self: Rc<Self>) {
        loop {
            let batch: Vec<Outgoing> = {
                let mut outbox = self.outbox.borrow_mut();
                let mut batch = Vec::new();
                let mut pieces = 0;
                while let Some(next) = outbox.front() {
                    if !batch.is_empty() && pieces + next.pieces.len() > SEND_BATCH_PIECES {
                        break;
                    }
                    pieces += next.pieces.len();
                    batch.push(outbox.pop_front().expect("front exists"));
                }
                batch
            };
            if batch.is_empty() {
                if self.reading_done.get() {
                    return;
                }
                self.outbox_ready.notified().await;
                continue;
            }
            let mut pieces = Vec::new();
            let mut permits = Vec::new();
            for outgoing in batch {
                pieces.extend(outgoing.pieces);
                permits.push(outgoing._permits);
            }
            let total: usize = pieces.iter().map(SendPiece::len).sum();
            let mut sent = 0;
            while sent < total {
                let (result, returned) = uring::send_pieces(self.raw(), pieces, sent).await;
                pieces = returned;
                match result {
                    Ok(0) | Err(_) => {
                        self.broken.set(true);
                        self.outbox.borrow_mut().clear();
                        // Make the reader stop too.
                        self.stop_reading();
                        break;
                    }
                    Ok(count) => sent += count,
                }
            }
            drop(permits);
            if self.broken.get() && self.reading_done.get() {
                return;
            }
        }
    }

    /// Runs one request and builds its reply.
    async fn execute(&self, volume: &Rc<Volume>, negotiated: &Negotiated, request: Request, payload: Option<AlignedBuf>) -> Vec<SendPiece> {
        let pool = &self.server.pool;
        let structured = negotiated.structured;
        let fail = |error: u32, message: &str| {
            self.server.count(|stats| stats.request_errors += 1);
            error_reply(request.cookie, structured, error, message)
        };
        if request.flags & !allowed_flags(request.command, structured) != 0 {
            return fail(EINVAL, "flag not valid for this command");
        }
        let fua = request.flags & CMD_FLAG_FUA != 0;
        let size = volume.size_bytes.get();
        let length = request.length as u64;
        let in_range = request.offset.checked_add(length).is_some_and(|end| end <= size);
        let aligned = request.offset % IO_ALIGNMENT_BYTES == 0 && length % IO_ALIGNMENT_BYTES == 0;
        let is_write = matches!(request.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        match request.command {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE | CMD_BLOCK_STATUS => {
                if is_write && volume.read_only.get() {
                    return fail(EPERM, "the export is read-only");
                }
                if !in_range {
                    let error = if matches!(request.command, CMD_WRITE | CMD_WRITE_ZEROES) { ENOSPC } else { EINVAL };
                    return fail(error, "request beyond the end of the export");
                }
                if !aligned {
                    return fail(EINVAL, "offset and length must be multiples of 512");
                }
                if request.command == CMD_READ && request.length > PAYLOAD_BYTES_MAX {
                    return fail(EOVERFLOW, "read larger than the maximum payload");
                }
            }
            CMD_FLUSH => {
                if request.offset != 0 || request.length != 0 {
                    return fail(EINVAL, "flush takes no range");
                }
            }
            _ => return fail(EINVAL, "unknown command"),
        }
        let result: Result<Vec<SendPiece>, PoolError> = match request.command {
            CMD_READ => match pool.read(volume, request.offset, length).await {
                Ok(pieces) => Ok(read_reply(request.cookie, request.offset, pieces, structured, request.flags & CMD_FLAG_DF != 0)),
                Err(error) => Err(error),
            },
            CMD_WRITE => {
                let data = payload.map(|buffer| BufSlice::whole(buffer.into_shared()));
                match data {
                    Some(data) => pool.write(volume, request.offset, data, fua).await.map(|()| vec![SendPiece::Bytes(simple_reply(request.cookie, 0))]),
                    None => Ok(vec![SendPiece::Bytes(simple_reply(request.cookie, 0))]),
                }
            }
            CMD_FLUSH => {
                pool.count_flush(volume);
                pool.flush().await.map(|()| vec![SendPiece::Bytes(simple_reply(request.cookie, 0))])
            }
            CMD_TRIM => pool.zero(volume, request.offset, length, fua, true).await.map(|()| vec![SendPiece::Bytes(simple_reply(request.cookie, 0))]),
            CMD_WRITE_ZEROES => {
                let allocate = request.flags & CMD_FLAG_NO_HOLE != 0;
                let result = if allocate {
                    pool.write_allocated_zeroes(volume, request.offset, length, fua).await
                } else {
                    pool.zero(volume, request.offset, length, fua, false).await
                };
                result.map(|()| vec![SendPiece::Bytes(simple_reply(request.cookie, 0))])
            }
            // No cache to warm: every read goes to the devices. Advertised so
            // clients that send it anyway get a clean success.
            CMD_CACHE => Ok(vec![SendPiece::Bytes(simple_reply(request.cookie, 0))]),
            CMD_BLOCK_STATUS => {
                let allowed = structured && negotiated.meta_allocation && negotiated.meta_export.as_deref().is_some_and(|name| self.server.export(name).is_some_and(|selected| Rc::ptr_eq(&selected, volume)));
                if !allowed {
                    return fail(EINVAL, "block status needs structured replies and the base:allocation context");
                }
                if length == 0 {
                    return fail(EINVAL, "block status of zero length");
                }
                pool.block_status(volume, request.offset, length).await.map(|runs| vec![SendPiece::Bytes(block_status_reply(request.cookie, &runs, length, request.flags & CMD_FLAG_REQ_ONE != 0))])
            }
            _ => unreachable!("commands were filtered above"),
        };
        match result {
            Ok(pieces) => pieces,
            Err(error) => fail(errno_of(&error), &error.to_string()),
        }
    }
}

fn protocol_to_io(error: ProtocolError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string())
}

/// Transmission flags of an export.
fn transmission_flags(volume: &Volume, structured: bool) -> u16 {
    let mut flags = TRANSMIT_HAS_FLAGS
        | TRANSMIT_SEND_FLUSH
        | TRANSMIT_SEND_FUA
        | TRANSMIT_SEND_TRIM
        | TRANSMIT_SEND_WRITE_ZEROES
        | TRANSMIT_SEND_CACHE
        // One engine behind every connection: a flush on any connection covers
        // writes acknowledged on all of them.
        | TRANSMIT_CAN_MULTI_CONN;
    if structured {
        flags |= TRANSMIT_SEND_DF;
    }
    if volume.read_only.get() {
        flags |= TRANSMIT_READ_ONLY;
    }
    flags
}

/// The NBD error for an engine error.
fn errno_of(error: &PoolError) -> u32 {
    match error {
        PoolError::NoSpace => ENOSPC,
        PoolError::ReadOnly(_) => EPERM,
        PoolError::OutOfRange { .. } | PoolError::Misaligned { .. } | PoolError::InvalidArgument(_) => EINVAL,
        PoolError::Closing => ESHUTDOWN,
        PoolError::NoSuchVolume(_) => ESHUTDOWN,
        _ => EIO,
    }
}

/// An error reply: a structured ERROR chunk (with the message) once structured
/// replies are negotiated, a simple reply otherwise.
fn error_reply(cookie: u64, structured: bool, error: u32, message: &str) -> Vec<SendPiece> {
    if structured {
        vec![SendPiece::Bytes(structured_error(cookie, error, message))]
    } else {
        vec![SendPiece::Bytes(simple_reply(cookie, error))]
    }
}

/// Builds a READ reply: structured (data and hole chunks, or one chunk with DF),
/// or simple (header then the bytes, holes sent as zeros).
fn read_reply(cookie: u64, offset: u64, pieces: Vec<ReadPiece>, structured: bool, dont_fragment: bool) -> Vec<SendPiece> {
    let total: usize = pieces.iter().map(ReadPiece::len).sum();
    if !structured {
        let mut out = Vec::with_capacity(pieces.len() + 1);
        out.push(SendPiece::Bytes(simple_reply(cookie, 0)));
        out.extend(pieces.into_iter().map(to_send_piece));
        return out;
    }
    if dont_fragment || total == 0 {
        let mut out = Vec::with_capacity(pieces.len() + 1);
        let header = structured_chunk(cookie, REPLY_FLAG_DONE, if total == 0 { REPLY_TYPE_NONE } else { REPLY_TYPE_OFFSET_DATA }, if total == 0 { 0 } else { 8 + total as u32 }, &if total == 0 { Vec::new() } else { offset.to_be_bytes().to_vec() });
        out.push(SendPiece::Bytes(header));
        out.extend(pieces.into_iter().map(to_send_piece));
        return out;
    }
    // Group consecutive data pieces into one chunk; holes become hole chunks.
    let mut groups: Vec<(bool, u64, Vec<ReadPiece>)> = Vec::new();
    let mut position = offset;
    for piece in pieces {
        let is_data = matches!(piece, ReadPiece::Data(_));
        let length = piece.len() as u64;
        match groups.last_mut() {
            Some((last_is_data, _, members)) if *last_is_data == is_data => members.push(piece),
            _ => groups.push((is_data, position, vec![piece])),
        }
        position += length;
    }
    let count = groups.len();
    let mut out = Vec::new();
    for (index, (is_data, start, members)) in groups.into_iter().enumerate() {
        let flags = if index + 1 == count { REPLY_FLAG_DONE } else { 0 };
        let length: usize = members.iter().map(ReadPiece::len).sum();
        if is_data {
            out.push(SendPiece::Bytes(structured_chunk(cookie, flags, REPLY_TYPE_OFFSET_DATA, 8 + length as u32, &start.to_be_bytes())));
            out.extend(members.into_iter().map(to_send_piece));
        } else {
            let mut payload = start.to_be_bytes().to_vec();
            payload.extend_from_slice(&(length as u32).to_be_bytes());
            out.push(SendPiece::Bytes(structured_chunk(cookie, flags, REPLY_TYPE_OFFSET_HOLE, 12, &payload)));
        }
    }
    out
}

fn to_send_piece(piece: ReadPiece) -> SendPiece {
    match piece {
        ReadPiece::Data(slice) => SendPiece::Slice(slice),
        ReadPiece::Zeros(length) => SendPiece::Zeros(length),
    }
}

/// Builds a BLOCK_STATUS reply for `base:allocation` from runs of (bytes, allocated).
fn block_status_reply(cookie: u64, runs: &[(u64, bool)], requested: u64, one: bool) -> Vec<u8> {
    let mut extents: Vec<(u32, u32)> = Vec::new();
    for &(bytes, allocated) in runs {
        let flags = if allocated { 0 } else { STATE_HOLE | STATE_ZERO };
        let mut left = bytes;
        while left > 0 {
            let piece = left.min(EXTENT_BYTES_MAX);
            extents.push((piece as u32, flags));
            left -= piece;
        }
    }
    if one {
        extents.truncate(1);
        if let Some(first) = extents.first_mut() {
            first.0 = (first.0 as u64).min(requested) as u32;
        }
    }
    block_status_chunk(cookie, &extents)
}
