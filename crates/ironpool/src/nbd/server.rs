//! The NBD front end: sockets, handshakes, parsing and replies, on the engine's
//! thread and io_uring loop (the default: no cross-thread wakeup per request),
//! or on a thread and loop of its own (`serve --nbd-thread`).
//!
//! Each connection has one task that reads: the handshake, then request after
//! request. Requests go to the engine's thread ([`super::engine`]) through a
//! channel, many in flight at once; replies come back as they complete (out of
//! order) and the connection's sender task batches them into one sendmsg.
//! Nothing blocks: socket reads and writes are io_uring operations.
//!
//! Bounds: requests in flight per connection, payload bytes in flight per server,
//! connections per server, option sizes, and the time a handshake may take.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use super::engine::{EngineRequest, ExportInfo, FromEngine, OwnedPiece, SharedStats, ToEngine};
use super::proto::*;
use crate::pool::volume::IO_ALIGNMENT_BYTES;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::channel::{channel, Receiver as ChannelReceiver, Sender};
use crate::rt::sync::{Notify, Permit, Semaphore};
use crate::rt::uring::{self, send_all, SendPiece};
use crate::rt::{self};

/// Requests one connection may have in flight (a client's queue depth; the Linux
/// nbd driver uses 128 per connection, fio/qemu up to 64-256).
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION: u64 = 256;
/// Payload bytes (write data received, read data to send) in flight across the
/// server: bounds memory under any number of clients.
pub const PAYLOAD_BYTES_IN_FLIGHT_MAX: u64 = 256 * 1024 * 1024;
/// Payload bytes one connection may hold (a fair share of
/// `PAYLOAD_BYTES_IN_FLIGHT_MAX`): a client that pipelines large reads and
/// never reads the replies holds at most this much, and every other client
/// keeps the rest. Two of the largest requests (`PAYLOAD_BYTES_MAX`), and
/// 1 MiB sequential I/O at queue depth 64, fit.
pub const PAYLOAD_BYTES_IN_FLIGHT_PER_CONNECTION: u64 = 64 * 1024 * 1024;
// The read cache keeps one connection's payload and the read-ahead in flight
// free below a memory limit (see `cache::memory`).
const _: () = assert!(
    PAYLOAD_BYTES_IN_FLIGHT_PER_CONNECTION
        + crate::pool::volume::prefetch::PREFETCH_IN_FLIGHT_BYTES_MAX
        <= crate::cache::memory::HEADROOM_RESERVE_BYTES
);
/// Longest a connection's replies may wait on a socket that accepts no bytes,
/// by default (`serve --nbd-reply-timeout`): a client that stops reading its
/// replies holds its share of the payload budget until then, and is
/// disconnected after (so a few such clients cannot hold the whole budget for
/// good). Generous: a live client reads within ms.
pub const REPLY_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// A stalled client is dropped between the reply timeout and this fraction
/// of it more (at most [`STALL_SLACK_MAX`] more): the timer is re-armed once
/// per that slack, not once per reply.
const STALL_SLACK_DIVISOR: u32 = 4;
/// See [`STALL_SLACK_DIVISOR`]: a second past 60 s is as good as 60 s.
const STALL_SLACK_MAX: Duration = Duration::from_secs(1);
/// Connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Time a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Receive buffer per connection once it serves an export: holds many request
/// headers (and small payloads) per recv.
const RECEIVE_BUFFER_BYTES: usize = 1024 * 1024;
/// Receive buffer during the handshake (grown for a larger option, up to
/// `OPTION_BYTES_MAX`): idle connections that never finish a handshake cost
/// this, not `RECEIVE_BUFFER_BYTES` (1000 of them held 1.2 GB).
const HANDSHAKE_BUFFER_BYTES: usize = 4096;
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
            let address = if address.contains(':') {
                address.to_string()
            } else {
                format!("127.0.0.1:{address}")
            };
            return Ok(Listen::Tcp(address));
        }
        Err(format!("'{text}': use unix:PATH or tcp:HOST:PORT"))
    }
}

/// Server-wide counters (a snapshot of [`SharedStats`]).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ServerStats {
    pub connections_accepted: u64,
    pub connections_open: u64,
    pub connections_refused: u64,
    pub requests: u64,
    pub request_errors: u64,
    pub protocol_errors: u64,
    /// Requests read and not yet answered, over all connections.
    pub requests_in_flight: u64,
    /// WRITE payloads received from the socket straight into a buffer of
    /// their own (one copy, the kernel's), and those copied out of a
    /// receive buffer (a second copy): see `Receiver`.
    pub payloads_apart: u64,
    pub payloads_copied: u64,
}

/// A bound listening socket, ready to hand to the front end's thread.
pub struct BoundListener {
    fd: OwnedFd,
    path: Option<PathBuf>,
    _lock: Option<OwnedFd>,
}

impl BoundListener {
    /// The listening socket, for an accept loop on this thread.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Binds `listen` (replacing a dead server's unix socket, refusing a live one's).
    pub fn bind(listen: &Listen) -> std::io::Result<BoundListener> {
        match listen {
            Listen::Unix(path) => {
                let (listener, lock) = bind_unix_exclusive(path)?;
                Ok(BoundListener {
                    fd: listener.into(),
                    path: Some(path.clone()),
                    _lock: Some(lock),
                })
            }
            Listen::Tcp(address) => {
                let listener = std::net::TcpListener::bind(address).map_err(|error| {
                    std::io::Error::new(error.kind(), format!("{address}: {error}"))
                })?;
                Ok(BoundListener {
                    fd: listener.into(),
                    path: None,
                    _lock: None,
                })
            }
        }
    }
}

/// The front end of one pool's NBD server (lives on the front end's thread).
pub struct NbdServer {
    /// Taken at the end of shutdown: the engine's inbox closes, which ends it
    /// (whether the front end runs on its own thread or on the engine's).
    engine: RefCell<Option<Sender<ToEngine>>>,
    payload_budget: Rc<Semaphore>,
    shutting_down: Cell<bool>,
    listeners: RefCell<Vec<BoundListener>>,
    connections: RefCell<HashMap<u64, Weak<Connection>>>,
    next_connection: Cell<u64>,
    drained: Notify,
    stats: Arc<SharedStats>,
    /// See `REPLY_STALL_TIMEOUT`.
    reply_stall_timeout: Duration,
}

impl NbdServer {
    /// A front end sending to `engine`; a connection whose replies wait
    /// `reply_stall_timeout` on a socket that takes no bytes is closed.
    pub fn new(
        engine: Sender<ToEngine>,
        stats: Arc<SharedStats>,
        reply_stall_timeout: Duration,
    ) -> Rc<NbdServer> {
        Rc::new(NbdServer {
            engine: RefCell::new(Some(engine)),
            payload_budget: Semaphore::new(PAYLOAD_BYTES_IN_FLIGHT_MAX),
            shutting_down: Cell::new(false),
            listeners: RefCell::new(Vec::new()),
            connections: RefCell::new(HashMap::new()),
            next_connection: Cell::new(1),
            drained: Notify::new(),
            stats,
            reply_stall_timeout,
        })
    }

    /// Starts accepting on a bound listener.
    pub fn serve_listener(self: &Rc<Self>, listener: BoundListener) {
        let raw = listener.fd.as_raw_fd();
        self.listeners.borrow_mut().push(listener);
        let server = self.clone();
        rt::spawn(async move { server.accept_loop(raw).await });
    }

    /// Delivers the engine's replies to their connections until the engine is gone.
    pub async fn deliver_replies(self: Rc<Self>, mut inbox: ChannelReceiver<FromEngine>) {
        loop {
            let batch = inbox.recv_batch().await;
            if batch.is_empty() {
                return;
            }
            for reply in batch {
                let connection = self
                    .connections
                    .borrow()
                    .get(&reply.connection)
                    .and_then(Weak::upgrade);
                if let Some(connection) = connection {
                    if !reply.pieces.is_empty() {
                        connection.deliver(reply.token, reply.pieces);
                    }
                    if reply.end {
                        connection.stop_reading();
                    }
                }
            }
        }
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
                    self.connections
                        .borrow_mut()
                        .retain(|_, weak| weak.strong_count() > 0);
                    if self.connections.borrow().len() >= CONNECTIONS_MAX {
                        self.stats.add(&self.stats.connections_refused, 1);
                        continue; // dropping the socket closes it
                    }
                    set_nodelay(&socket);
                    self.stats.add(&self.stats.connections_accepted, 1);
                    self.stats.add(&self.stats.connections_open, 1);
                    let id = self.next_connection.get();
                    self.next_connection.set(id + 1);
                    let connection = Rc::new(Connection::new(id, socket, self.clone()));
                    self.connections
                        .borrow_mut()
                        .insert(id, Rc::downgrade(&connection));
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
        for listener in self.listeners.borrow_mut().drain(..) {
            // SAFETY: shutting down a listening socket we own makes pending
            // accepts fail, which ends the accept loops.
            unsafe { libc::shutdown(listener.fd.as_raw_fd(), libc::SHUT_RDWR) };
            if let Some(path) = &listener.path {
                let _ = std::fs::remove_file(path);
            }
        }
        let connections: Vec<Rc<Connection>> = self
            .connections
            .borrow()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for connection in &connections {
            connection.stop_reading();
        }
        drop(connections);
        let drained = async {
            loop {
                self.connections
                    .borrow_mut()
                    .retain(|_, weak| weak.strong_count() > 0);
                if self.connections.borrow().is_empty() {
                    return;
                }
                self.drained.notified().await;
            }
        };
        if rt::timeout(SHUTDOWN_DRAIN_TIMEOUT, drained).await.is_none() {
            eprintln!(
                "ironpool: some NBD connections did not finish within {SHUTDOWN_DRAIN_TIMEOUT:?}"
            );
        }
        self.engine.borrow_mut().take();
    }

    /// Sends to the engine; an error once the engine or the front end is shutting down.
    fn to_engine(&self, message: ToEngine) -> Result<(), ()> {
        match &*self.engine.borrow() {
            Some(engine) => engine.send(message).map_err(|_| ()),
            None => Err(()),
        }
    }

    /// Asks the engine something and waits for the answer.
    async fn ask<T>(&self, make: impl FnOnce(Sender<T>) -> ToEngine) -> Option<T> {
        let (reply, mut answer) = channel();
        if self.to_engine(make(reply)).is_err() {
            return None;
        }
        answer.recv_batch().await.into_iter().next()
    }

    async fn lookup(&self, name: &str) -> Option<ExportInfo> {
        let name = name.to_string();
        self.ask(|reply| ToEngine::Lookup { name, reply })
            .await
            .flatten()
    }
}

/// Binds a unix socket that only one server may own: an exclusive lock on
/// `PATH.lock` decides. A socket file left by a server that died is replaced; a
/// live server's is refused. (Connecting to test liveness is not enough: a
/// killed server's listening socket can linger, accepting, while the kernel
/// tears its io_uring down.)
pub fn bind_unix_exclusive(
    path: &std::path::Path,
) -> std::io::Result<(std::os::unix::net::UnixListener, OwnedFd)> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    let lock: OwnedFd = lock_file.into();
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{}: another server is listening there", path.display()),
        ));
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|error| {
        std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
    })?;
    Ok((listener, lock))
}

fn set_nodelay(socket: &OwnedFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a valid int; it fails harmlessly on unix sockets.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const libc::c_int as *const libc::c_void,
            4,
        );
    }
}

/// What a connection negotiated.
#[derive(Default)]
struct Negotiated {
    structured: bool,
    no_zeroes: bool,
    /// Canonical export name of the last SET_META_CONTEXT, if base:allocation
    /// was selected.
    meta_allocation_export: Option<String>,
}

/// A reply waiting to be sent, with the permits it holds until then.
struct Outgoing {
    pieces: Vec<SendPiece>,
    _permits: RequestPermits,
}

/// What a request holds while the engine runs it and until its reply is sent.
struct RequestPermits {
    /// Its place among the connection's requests in flight.
    _slot: Permit,
    /// A READ's reply bytes (held until sent), a WRITE's payload (released
    /// once the engine has taken it): from the connection's share, then the
    /// server's budget.
    payload: Option<(Permit, Permit)>,
    /// True for a WRITE: its payload permits end when the engine replies.
    write: bool,
    /// Counts the request in the server's requests in flight until dropped.
    _in_flight: InFlightRequest,
}

/// One request between its header and its reply: counted in
/// [`SharedStats::requests_in_flight`] while it lives.
struct InFlightRequest(Arc<SharedStats>);

impl InFlightRequest {
    fn new(stats: &Arc<SharedStats>) -> InFlightRequest {
        stats.add(&stats.requests_in_flight, 1);
        InFlightRequest(stats.clone())
    }
}

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        self.0
            .requests_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

struct Connection {
    id: u64,
    fd: OwnedFd,
    server: Rc<NbdServer>,
    outbox: RefCell<VecDeque<Outgoing>>,
    outbox_ready: Notify,
    /// The reader is done (EOF, DISC, error or shutdown).
    reading_done: Cell<bool>,
    /// The socket failed for sending.
    broken: Cell<bool>,
    in_flight: Rc<Semaphore>,
    /// This connection's share of the payload budget.
    payload_share: Rc<Semaphore>,
    /// Permits of requests at the engine, by token.
    pending: RefCell<HashMap<u64, RequestPermits>>,
    next_token: Cell<u64>,
}

/// The read side of a connection: a buffer over the socket.
///
/// A run of WRITEs of one size (what a client writing blocks sends) is
/// received with each payload in an aligned buffer of its own, kept as
/// the blocks' bytes: one `recvmsg` lays the stream out as a request
/// header in `buffer`, a payload buffer, the next header, ... as if the
/// payloads were in `buffer` between the headers
/// ([`Receiver::receive_apart`]). So a payload is copied once, by the
/// kernel from the socket into its buffer; received into `buffer` with its
/// neighbours, it is copied again (`read_payload`). Measured on 16K random
/// writes at QD64 (`perf record`, same run): the engine's user-space
/// copies fell from 25% of its samples to 13%, the kernel's receive copy
/// rose from 6% to 16%, and IOPS stayed within the run's noise. Writing
/// 16 KiB into memory not in the cache costs what it costs wherever it
/// is done; what goes is reading it back out of the receive buffer.
struct Receiver {
    fd: RawFd,
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    /// Payloads received apart, in stream order: each stands for
    /// `buffer[at..at + len]`, which holds nothing.
    apart: VecDeque<Apart>,
    /// The payload size of the WRITEs of the current run, and how many in
    /// a row came ([`Receiver::note_request`]).
    run: (usize, u32),
    /// Payload buffers of the run's size laid out and not used, for the
    /// next receive (at most [`APART_PER_RECEIVE_MAX`]).
    spare: Vec<AlignedBuf>,
    /// Payloads the next receive lays out: twice what the last one got,
    /// so a client that sends a few at a time costs few buffers.
    laid_out: usize,
}

/// A WRITE's payload received apart from the stream's buffer.
struct Apart {
    /// Where its bytes would lie in the buffer.
    at: usize,
    payload: AlignedBuf,
    /// Its bytes received so far (the rest follows on the socket).
    received: usize,
}

/// WRITEs of one size in a row before their payloads are received apart:
/// enough that a mix of commands (reads among writes) rarely gets a
/// header where a payload buffer was laid out (that costs a copy back).
const APART_RUN_MIN: u32 = 8;
/// Largest payload received apart: a volume's largest block (128 KiB), so
/// a run of larger writes (already received mostly straight into place)
/// lays out nothing.
const APART_PAYLOAD_BYTES_MAX: usize = 128 << 10;
/// Payload bytes laid out by one receive: a bound on what a connection
/// holds beyond its receive buffer, a quarter of it.
const APART_BYTES_PER_RECEIVE: usize = RECEIVE_BUFFER_BYTES / 4;
/// Payloads laid out by one receive, at most (16K writes: 16 per receive).
const APART_PER_RECEIVE_MAX: usize = 32;

impl Receiver {
    fn new(fd: RawFd) -> Receiver {
        Receiver {
            fd,
            buffer: vec![0u8; HANDSHAKE_BUFFER_BYTES],
            start: 0,
            end: 0,
            apart: VecDeque::new(),
            run: (0, 0),
            spare: Vec::new(),
            laid_out: 2,
        }
    }

    /// Makes at least `count` bytes available in `buffer[start..end]`.
    async fn fill(&mut self, count: usize) -> std::io::Result<()> {
        assert!(count <= RECEIVE_BUFFER_BYTES);
        if count > self.buffer.len() {
            self.grow(count);
        }
        while self.end - self.start < count {
            // Every payload received apart was taken before the next
            // header is read past it: the request loop reads a WRITE's
            // payload right after its header.
            assert!(
                self.apart.is_empty(),
                "a payload received apart was skipped"
            );
            if self.start == self.end && self.run.1 >= APART_RUN_MIN {
                self.receive_apart().await?;
                continue;
            }
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

    /// Notes a request's header: a WRITE of the run's size lengthens the
    /// run; any other request ends it.
    fn note_request(&mut self, request: &Request) {
        let length = request.length as usize;
        self.run = if request.command == CMD_WRITE
            && length > 0
            && length <= APART_PAYLOAD_BYTES_MAX
            && length.is_multiple_of(IO_ALIGNMENT_BYTES as usize)
        {
            match self.run {
                (size, count) if size == length => (size, count.saturating_add(1)),
                _ => (length, 1),
            }
        } else {
            (0, 0)
        };
    }

    /// Receives with the next WRITEs' payloads laid out apart (the buffer
    /// is empty): header `i` at `buffer[i * step..][..28]`, its payload in
    /// a buffer of its own standing for the rest of the step, then the
    /// rest of `buffer`. Each header that is a WRITE of the run's size keeps
    /// its payload apart; from the first that is not, the bytes received
    /// into payload buffers are copied to where they stand in `buffer`, so
    /// the stream from there reads as a plain receive would have left it.
    async fn receive_apart(&mut self) -> std::io::Result<()> {
        let size = self.run.0;
        let step = REQUEST_HEADER_BYTES + size;
        let count = (APART_BYTES_PER_RECEIVE / size)
            .clamp(1, APART_PER_RECEIVE_MAX)
            .min(self.laid_out);
        self.grow(RECEIVE_BUFFER_BYTES);
        assert!(count * step < self.buffer.len());
        let mut heads: Vec<std::ops::Range<usize>> = (0..count)
            .map(|index| index * step..index * step + REQUEST_HEADER_BYTES)
            .collect();
        heads.push(count * step..self.buffer.len());
        self.spare.retain(|spare| spare.len() == size);
        let payloads = (0..count)
            .map(|_| {
                self.spare
                    .pop()
                    .unwrap_or_else(|| AlignedBuf::for_overwrite(size))
            })
            .collect();
        let buffer = std::mem::take(&mut self.buffer);
        let (result, buffer, payloads) =
            uring::recv_scattered(self.fd, buffer, &heads, payloads).await;
        self.buffer = buffer;
        let received = match result? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            received => received,
        };
        (self.start, self.end) = (0, received);
        self.laid_out = (received.div_ceil(step) * 2).clamp(2, APART_PER_RECEIVE_MAX);
        let mut linear = false;
        for (index, payload) in payloads.into_iter().enumerate() {
            let head = index * step;
            let at = head + REQUEST_HEADER_BYTES;
            if received <= at {
                self.spare.push(payload);
                continue;
            }
            let got = (received - at).min(size);
            if !linear {
                let header: &[u8; REQUEST_HEADER_BYTES] =
                    self.buffer[head..at].try_into().expect("a header's bytes");
                linear = !matches!(parse_request(header), Ok(request)
                    if request.command == CMD_WRITE && request.length as usize == size);
            }
            if linear {
                self.buffer[at..at + got].copy_from_slice(&payload[..got]);
                self.spare.push(payload);
            } else {
                self.apart.push_back(Apart {
                    at,
                    payload,
                    received: got,
                });
            }
        }
        Ok(())
    }

    /// Enlarges the buffer to hold at least `bytes` (at most `RECEIVE_BUFFER_BYTES`).
    fn grow(&mut self, bytes: usize) {
        let target = bytes
            .next_power_of_two()
            .clamp(HANDSHAKE_BUFFER_BYTES, RECEIVE_BUFFER_BYTES);
        if target > self.buffer.len() {
            self.buffer.resize(target, 0);
        }
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
    async fn read_payload(
        &mut self,
        length: usize,
        stats: &SharedStats,
    ) -> std::io::Result<AlignedBuf> {
        if self
            .apart
            .front()
            .is_some_and(|apart| apart.at == self.start)
        {
            stats.add(&stats.payloads_apart, 1);
            let Apart {
                mut payload,
                mut received,
                ..
            } = self.apart.pop_front().expect("the front");
            assert_eq!(payload.len(), length, "laid out for a WRITE of this size");
            while received < length {
                let (result, buffer) =
                    uring::recv_aligned(self.fd, payload, received, length).await;
                payload = buffer;
                match result? {
                    0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    more => received += more,
                }
            }
            self.start += length;
            self.end = self.end.max(self.start);
            return Ok(payload);
        }
        let mut payload = AlignedBuf::for_overwrite(length);
        let buffered = (self.end - self.start).min(length);
        let counter = match buffered {
            0 => &stats.payloads_apart,
            _ => &stats.payloads_copied,
        };
        stats.add(counter, 1);
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

/// The handshake ended: with an export to serve, or not.
enum HandshakeEnd {
    Serve(ExportInfo),
    Close,
}

impl Connection {
    fn new(id: u64, fd: OwnedFd, server: Rc<NbdServer>) -> Connection {
        Connection {
            id,
            fd,
            server,
            outbox: RefCell::new(VecDeque::new()),
            outbox_ready: Notify::new(),
            reading_done: Cell::new(false),
            broken: Cell::new(false),
            in_flight: Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION),
            payload_share: Semaphore::new(PAYLOAD_BYTES_IN_FLIGHT_PER_CONNECTION),
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
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
        let mut receiver = Receiver::new(self.raw());
        let mut negotiated = Negotiated::default();
        let handshake = rt::timeout(
            HANDSHAKE_TIMEOUT,
            self.handshake(&mut receiver, &mut negotiated),
        )
        .await;
        let export = match handshake {
            Some(Ok(HandshakeEnd::Serve(export))) => export,
            Some(Ok(HandshakeEnd::Close)) => return self.closed(false),
            Some(Err(_)) | None => {
                self.server.stats.add(&self.server.stats.protocol_errors, 1);
                return self.closed(false);
            }
        };
        receiver.grow(RECEIVE_BUFFER_BYTES);
        let sender = {
            let connection = self.clone();
            rt::spawn(async move { connection.send_loop().await })
        };
        if let Err(error) = self.transmission(&mut receiver, &export, &negotiated).await {
            if error.kind() != std::io::ErrorKind::UnexpectedEof {
                self.server.stats.add(&self.server.stats.protocol_errors, 1);
            }
        }
        // Let requests in flight finish and their replies go out, then close.
        let _all = self
            .in_flight
            .acquire(REQUESTS_IN_FLIGHT_PER_CONNECTION)
            .await;
        self.reading_done.set(true);
        self.outbox_ready.notify_all();
        sender.await;
        self.closed(true);
    }

    fn closed(&self, opened: bool) {
        if opened {
            let _ = self.server.to_engine(ToEngine::Close {
                connection: self.id,
            });
        }
        self.server
            .stats
            .connections_open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.server.drained.notify_all();
    }

    async fn handshake(
        &self,
        receiver: &mut Receiver,
        negotiated: &mut Negotiated,
    ) -> std::io::Result<HandshakeEnd> {
        let fd = self.raw();
        send_all(fd, greeting()).await?;
        let flags: [u8; 4] = receiver.read_array().await?;
        negotiated.no_zeroes = parse_client_flags(&flags).map_err(protocol_to_io)?;
        loop {
            let header_bytes: [u8; OPTION_HEADER_BYTES] = receiver.read_array().await?;
            let header = parse_option_header(&header_bytes).map_err(protocol_to_io)?;
            if header.length > OPTION_BYTES_MAX {
                send_all(
                    fd,
                    option_reply(header.option, REP_ERR_TOO_BIG, b"option data too large"),
                )
                .await?;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "oversized option",
                ));
            }
            let data = receiver.read_vec(header.length as usize).await?;
            if self.server.shutting_down.get() && header.option != OPT_ABORT {
                if header.option == OPT_EXPORT_NAME {
                    return Ok(HandshakeEnd::Close);
                }
                send_all(
                    fd,
                    option_reply(header.option, REP_ERR_SHUTDOWN, b"server shutting down"),
                )
                .await?;
                continue;
            }
            match header.option {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).to_string();
                    // No error reply exists for EXPORT_NAME: an unknown name closes.
                    let Some(export) = self.open(&name).await else {
                        return Ok(HandshakeEnd::Close);
                    };
                    let flags = export.transmission_flags(false);
                    send_all(
                        fd,
                        export_name_reply(export.size_bytes, flags, negotiated.no_zeroes),
                    )
                    .await?;
                    return Ok(HandshakeEnd::Serve(export));
                }
                OPT_ABORT => {
                    let _ = send_all(fd, option_reply(OPT_ABORT, REP_ACK, &[])).await;
                    return Ok(HandshakeEnd::Close);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        send_all(
                            fd,
                            option_reply(OPT_LIST, REP_ERR_INVALID, b"LIST takes no data"),
                        )
                        .await?;
                        continue;
                    }
                    let exports = self
                        .server
                        .ask(|reply| ToEngine::List { reply })
                        .await
                        .unwrap_or_default();
                    let mut replies = Vec::new();
                    for export in exports {
                        let mut entry = (export.name.len() as u32).to_be_bytes().to_vec();
                        entry.extend_from_slice(export.name.as_bytes());
                        replies.extend(option_reply(OPT_LIST, REP_SERVER, &entry));
                    }
                    replies.extend(option_reply(OPT_LIST, REP_ACK, &[]));
                    send_all(fd, replies).await?;
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        send_all(
                            fd,
                            option_reply(
                                header.option,
                                REP_ERR_INVALID,
                                b"STRUCTURED_REPLY takes no data",
                            ),
                        )
                        .await?;
                        continue;
                    }
                    negotiated.structured = true;
                    send_all(fd, option_reply(header.option, REP_ACK, &[])).await?;
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    let reply = self.meta_context(header.option, &data, negotiated).await;
                    send_all(fd, reply).await?;
                }
                OPT_INFO | OPT_GO => {
                    let request = match parse_info_request(&data) {
                        Ok(request) => request,
                        Err(reason) => {
                            send_all(
                                fd,
                                option_reply(header.option, REP_ERR_INVALID, reason.as_bytes()),
                            )
                            .await?;
                            continue;
                        }
                    };
                    let export = if header.option == OPT_GO {
                        self.open(&request.name).await
                    } else {
                        self.server.lookup(&request.name).await
                    };
                    let Some(export) = export else {
                        let message = format!("no export named '{}'", request.name);
                        send_all(
                            fd,
                            option_reply(header.option, REP_ERR_UNKNOWN, message.as_bytes()),
                        )
                        .await?;
                        continue;
                    };
                    let flags = export.transmission_flags(negotiated.structured);
                    let mut replies = option_reply(
                        header.option,
                        REP_INFO,
                        &info_export(export.size_bytes, flags),
                    );
                    if request.requests.contains(&INFO_NAME) {
                        let mut payload = INFO_NAME.to_be_bytes().to_vec();
                        payload.extend_from_slice(export.name.as_bytes());
                        replies.extend(option_reply(header.option, REP_INFO, &payload));
                    }
                    if request.requests.contains(&INFO_DESCRIPTION) {
                        let mut payload = INFO_DESCRIPTION.to_be_bytes().to_vec();
                        payload.extend_from_slice(
                            format!("ironpool volume {}", export.name).as_bytes(),
                        );
                        replies.extend(option_reply(header.option, REP_INFO, &payload));
                    }
                    let preferred = export
                        .block_bytes
                        .clamp(IO_ALIGNMENT_BYTES, PAYLOAD_BYTES_MAX as u64)
                        as u32;
                    replies.extend(option_reply(
                        header.option,
                        REP_INFO,
                        &info_block_size(IO_ALIGNMENT_BYTES as u32, preferred, PAYLOAD_BYTES_MAX),
                    ));
                    replies.extend(option_reply(header.option, REP_ACK, &[]));
                    send_all(fd, replies).await?;
                    if header.option == OPT_GO {
                        return Ok(HandshakeEnd::Serve(export));
                    }
                }
                OPT_STARTTLS => {
                    send_all(
                        fd,
                        option_reply(
                            header.option,
                            REP_ERR_POLICY,
                            b"TLS is not offered; use a unix socket or loopback",
                        ),
                    )
                    .await?;
                }
                other => {
                    let message = format!("option {other} is not supported");
                    send_all(fd, option_reply(other, REP_ERR_UNSUP, message.as_bytes())).await?;
                }
            }
        }
    }

    /// Tells the engine this connection serves `name`.
    async fn open(&self, name: &str) -> Option<ExportInfo> {
        let connection = self.id;
        let name = name.to_string();
        self.server
            .ask(|reply| ToEngine::Open {
                connection,
                name,
                reply,
            })
            .await
            .flatten()
    }

    /// Answers LIST_META_CONTEXT / SET_META_CONTEXT.
    async fn meta_context(&self, option: u32, data: &[u8], negotiated: &mut Negotiated) -> Vec<u8> {
        if option == OPT_SET_META_CONTEXT {
            // SET replaces the selection even when it fails.
            negotiated.meta_allocation_export = None;
        }
        if !negotiated.structured {
            return option_reply(
                option,
                REP_ERR_INVALID,
                b"negotiate structured replies first",
            );
        }
        let request = match parse_meta_context_request(data) {
            Ok(request) => request,
            Err(reason) => return option_reply(option, REP_ERR_INVALID, reason.as_bytes()),
        };
        let Some(export) = self.server.lookup(&request.export).await else {
            return option_reply(option, REP_ERR_UNKNOWN, b"no such export");
        };
        let selected = if option == OPT_LIST_META_CONTEXT && request.queries.is_empty() {
            true
        } else {
            request.queries.iter().any(|query| {
                matches_base_allocation(query)
                    && (option == OPT_LIST_META_CONTEXT || query != "base:")
            })
        };
        let mut replies = Vec::new();
        if selected {
            let id = if option == OPT_SET_META_CONTEXT {
                CONTEXT_BASE_ALLOCATION_ID
            } else {
                0
            };
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend_from_slice(CONTEXT_BASE_ALLOCATION.as_bytes());
            replies.extend(option_reply(option, REP_META_CONTEXT, &payload));
        }
        if option == OPT_SET_META_CONTEXT && selected {
            negotiated.meta_allocation_export = Some(export.name);
        }
        replies.extend(option_reply(option, REP_ACK, &[]));
        replies
    }

    async fn transmission(
        self: &Rc<Self>,
        receiver: &mut Receiver,
        export: &ExportInfo,
        negotiated: &Negotiated,
    ) -> std::io::Result<()> {
        let block_status = negotiated.structured
            && negotiated.meta_allocation_export.as_deref() == Some(export.name.as_str());
        loop {
            let permit = self.in_flight.acquire(1).await;
            let header: [u8; REQUEST_HEADER_BYTES] = receiver.read_array().await?;
            let request = match parse_request(&header) {
                Ok(request) => request,
                // The stream is out of step: nothing more can be trusted.
                Err(error) => return Err(protocol_to_io(error)),
            };
            self.server.stats.add(&self.server.stats.requests, 1);
            receiver.note_request(&request);
            if request.command == CMD_DISC {
                return Ok(());
            }
            let write = request.command == CMD_WRITE;
            let mut permits = RequestPermits {
                _slot: permit,
                payload: None,
                write,
                _in_flight: InFlightRequest::new(&self.server.stats),
            };
            let payload = if write && request.length > 0 {
                if request.length > PAYLOAD_BYTES_MAX {
                    // The payload cannot be skipped safely at this size: disconnect.
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "write payload above the maximum",
                    ));
                }
                permits.payload = Some(self.payload_permits(request.length).await);
                Some(
                    receiver
                        .read_payload(request.length as usize, &self.server.stats)
                        .await?,
                )
            } else {
                if request.command == CMD_READ
                    && request.length > 0
                    && request.length <= PAYLOAD_BYTES_MAX
                {
                    permits.payload = Some(self.payload_permits(request.length).await);
                }
                None
            };
            let token = self.next_token.get();
            self.next_token.set(token + 1);
            self.pending.borrow_mut().insert(token, permits);
            let message = EngineRequest {
                connection: self.id,
                token,
                request,
                payload,
                structured: negotiated.structured,
                block_status,
            };
            if self
                .server
                .to_engine(ToEngine::Request(Box::new(message)))
                .is_err()
            {
                self.pending.borrow_mut().remove(&token);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the engine is gone",
                ));
            }
        }
    }

    /// Payload permits for `length` bytes: the connection's own share first
    /// (a connection waits on itself without holding any of the server's
    /// budget), then the server's.
    async fn payload_permits(&self, length: u32) -> (Permit, Permit) {
        let share = self.payload_share.acquire(length as u64).await;
        let budget = self.server.payload_budget.acquire(length as u64).await;
        (share, budget)
    }

    /// A reply from the engine: queue it for sending with the request's permits
    /// (a WRITE's payload permits end here: the engine has taken the payload).
    fn deliver(&self, token: u64, pieces: Vec<OwnedPiece>) {
        let Some(mut permits) = self.pending.borrow_mut().remove(&token) else {
            return;
        };
        if permits.write {
            permits.payload = None;
        }
        if self.broken.get() {
            return; // the client is gone; dropping releases the permits
        }
        let mut pieces_sent = Vec::with_capacity(pieces.len());
        for piece in pieces {
            pieces_sent.push(match piece {
                OwnedPiece::Bytes(bytes) => SendPiece::Bytes(bytes),
                OwnedPiece::Buffer(buffer, range) => {
                    SendPiece::Slice(BufSlice::new(buffer.into_shared(), range))
                }
                OwnedPiece::Zeros(length) => SendPiece::Zeros(length),
                OwnedPiece::Lent(lent) => match lent.take() {
                    Some(slice) => SendPiece::Slice(slice),
                    None => {
                        // Lent on another thread: the engine lends only to
                        // a front end on its own, so this is a bug. The
                        // reply cannot be sent whole: the client is cut off
                        // rather than sent other bytes.
                        debug_assert!(false, "a READ's bytes lent across threads");
                        self.broken.set(true);
                        self.outbox.borrow_mut().clear();
                        self.stop_reading();
                        return;
                    }
                },
            });
        }
        let pieces = pieces_sent;
        self.outbox.borrow_mut().push_back(Outgoing {
            pieces,
            _permits: permits,
        });
        self.outbox_ready.notify_all();
    }

    async fn send_loop(self: Rc<Self>) {
        // One stall timer for many sends: re-armed at most once per slack,
        // not per reply.
        let mut stall_timer = rt::Timer::new();
        let stall_slack =
            (self.server.reply_stall_timeout / STALL_SLACK_DIVISOR).min(STALL_SLACK_MAX);
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
                // A client that reads none of its replies for the server's
                // reply stall timeout (up to a quarter more) is dropped,
                // which releases what its replies hold.
                let Some((result, returned)) = stall_timer
                    .timeout_within(
                        self.server.reply_stall_timeout,
                        stall_slack,
                        uring::send_pieces(self.raw(), pieces, sent),
                    )
                    .await
                else {
                    self.broken.set(true);
                    self.outbox.borrow_mut().clear();
                    // Both ways: the abandoned send fails at once and the reader ends.
                    // SAFETY: shutting down our own socket.
                    unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
                    break;
                };
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
}

fn protocol_to_io(error: ProtocolError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string())
}
