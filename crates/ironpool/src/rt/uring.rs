//! The io_uring driver: the completion-based core under every device and socket.
//!
//! Each operation is an in-flight record (a slot in `slots`) whose index is the SQE's
//! `user_data`. The memory an operation points at (buffers, iovec arrays, a
//! timespec) is owned by its [`Op`] future; if that future is dropped before the
//! kernel completes the operation, the memory moves into the slot and is freed
//! when the completion arrives, never earlier. Submissions are batched: pushing an
//! SQE does not enter the kernel; the loop submits once per turn and reaps every
//! completion, waking the tasks, which then run from the loop.
//!
//! The ring has 128-byte SQEs (`IORING_SETUP_SQE128`): FUSE over io_uring's
//! commands need them, and on this ring the kernel delivers a FUSE request
//! as a completion of the engine's own loop, with no second ring between.
//! Ordinary operations fill the first 64 bytes.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// The engine's ring: 128-byte submission entries (see the module's notes).
type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

use super::buf::{AlignedBuf, BufSlice};
use super::sim::Rng;
use super::{with_current, Driver, Instant};

/// `user_data` of the eventfd read that lets other threads wake the loop.
const EVENTFD_TOKEN: u64 = u64::MAX - 1;
/// `user_data` of a timeout's removal ([`Timeout`]'s drop): its completion
/// says only whether the timer was still armed, which nobody waits for.
const TIMEOUT_REMOVE_TOKEN: u64 = u64::MAX - 2;

/// The longest (microseconds) the loop, with nothing to run and no device
/// I/O in flight, keeps looking for completions before it sleeps in the
/// kernel ([`PollWindow`]): a client that waits for each answer (a FUSE
/// `stat`, `create` or `unlink` after another, an NBD client at queue depth
/// one) then finds the loop awake instead of paying a thread wake-up, which
/// on a virtual machine is an inter-processor interrupt through the host
/// (about 20 us each way on this project's 2-core machine, against 1-2 us
/// for the request's own work). Unset: [`POLL_WINDOW_MAX_US`]; `0` never
/// polls. While device I/O is in flight, and after a busy period that
/// started some, the loop sleeps at once (see [`UringDriver::turn`]).
pub const POLL_ENV: &str = "IRONPOOL_POLL_US";

/// The default ceiling of the poll window: above the round trip of a
/// waiting client on this machine (FUSE: 20-50 us from reply to the next
/// request), so a client one request at a time finds the loop polling, and
/// short enough that an idle loop wastes at most this much per wake-up.
pub const POLL_WINDOW_MAX_US: u64 = 50;

/// The window a poll starts from when idle periods turn short: the loop
/// polls again after a few requests of a waiting client.
const POLL_WINDOW_GROW_START_NS: u64 = 10_000;

/// An idle period this many times the window's ceiling means nobody is
/// waiting on the loop. Not the ceiling itself: an idle period the loop
/// slept through includes its own wake-up (about 20 us here), so a client
/// at a 30 us round trip shows idle periods near 50 us until the loop polls.
const POLL_IDLE_LONG_FACTOR: u64 = 4;

/// How long the loop polls before it sleeps, adapted to the idle periods it
/// sees, as the kernel's `haltpoll` governor adapts a guest's idle polling:
/// a long idle period ([`POLL_IDLE_LONG_FACTOR`] times the ceiling: nobody
/// is waiting on the loop) halves the window, down to none; a shorter one
/// that ended after the window (polling longer would have caught it)
/// doubles it, up to the ceiling. So
/// a client that waits for each answer gets a polling loop, and an idle
/// server polls only briefly after each wake-up, less each time.
#[derive(Debug)]
pub(crate) struct PollWindow {
    ns: Cell<u64>,
    max_ns: u64,
}

impl PollWindow {
    pub(crate) fn new(max_ns: u64) -> PollWindow {
        PollWindow {
            ns: Cell::new(0),
            max_ns,
        }
    }

    /// The window now, in nanoseconds (0: sleep at once).
    pub(crate) fn ns(&self) -> u64 {
        self.ns.get()
    }

    /// Adapts the window to an idle period of `idle_ns` that just ended.
    pub(crate) fn adapt(&self, idle_ns: u64) {
        let window = self.ns.get();
        let next = if idle_ns > self.max_ns.saturating_mul(POLL_IDLE_LONG_FACTOR) {
            let half = window / 2;
            if half < POLL_WINDOW_GROW_START_NS {
                0
            } else {
                half
            }
        } else if idle_ns > window {
            (window * 2).max(POLL_WINDOW_GROW_START_NS).min(self.max_ns)
        } else {
            window
        };
        self.ns.set(next);
    }
}

thread_local! {
    /// Device reads, writes and flushes in flight on this thread's ring.
    static DEVICE_IO: Cell<usize> = const { Cell::new(0) };
    /// Device operations started on this thread's ring, ever.
    static DEVICE_IO_STARTED: Cell<u64> = const { Cell::new(0) };
}

/// Counts a device operation in flight while it lives (see [`POLL_ENV`]).
pub struct DeviceIo(());

impl DeviceIo {
    pub fn start() -> DeviceIo {
        DEVICE_IO.with(|count| count.set(count.get() + 1));
        DEVICE_IO_STARTED.with(|count| count.set(count.get() + 1));
        DeviceIo(())
    }
}

impl Drop for DeviceIo {
    fn drop(&mut self) {
        DEVICE_IO.with(|count| count.set(count.get() - 1));
    }
}

/// Largest iovec count in one vectored operation (the kernel's UIO_MAXIOV).
pub const IOVEC_COUNT_MAX: usize = 1024;

enum Slot {
    Free,
    Waiting(Option<Waker>),
    Done(i32),
    /// The future was dropped; keep its memory until the kernel is done with it.
    Abandoned(#[allow(dead_code)] Box<dyn Any>),
}

pub(crate) struct UringDriver {
    ring: RefCell<Ring>,
    slots: RefCell<Vec<Slot>>,
    free_slots: RefCell<Vec<u32>>,
    in_flight: Cell<usize>,
    started: std::time::Instant,
    rng: RefCell<Rng>,
    eventfd: Arc<OwnedFd>,
    eventfd_buffer: RefCell<Box<[u8; 8]>>,
    poll: PollWindow,
    /// `DEVICE_IO_STARTED` when the loop last went idle: the loop polls
    /// only after busy periods that started no device I/O.
    device_io_seen: Cell<u64>,
}

impl UringDriver {
    pub(crate) fn new(ring_entries: u32) -> io::Result<(UringDriver, Box<dyn Fn() + Send + Sync>)> {
        let ring = build_ring(ring_entries)?;
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        let eventfd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let notify_fd = eventfd.clone();
        let notify: Box<dyn Fn() + Send + Sync> = Box::new(move || {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a valid u64 to an eventfd we keep open.
            // A failure (counter saturated) still leaves the eventfd readable.
            unsafe {
                libc::write(
                    notify_fd.as_raw_fd(),
                    &one as *const u64 as *const libc::c_void,
                    8,
                )
            };
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(1);
        let driver = UringDriver {
            ring: RefCell::new(ring),
            slots: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            started: std::time::Instant::now(),
            rng: RefCell::new(Rng::new(seed)),
            eventfd,
            eventfd_buffer: RefCell::new(Box::new([0; 8])),
            device_io_seen: Cell::new(0),
            poll: PollWindow::new(
                std::env::var(POLL_ENV)
                    .ok()
                    .and_then(|text| text.parse::<u64>().ok())
                    .unwrap_or(POLL_WINDOW_MAX_US)
                    .saturating_mul(1000),
            ),
        };
        driver.arm_eventfd();
        Ok((driver, notify))
    }

    pub(crate) fn now(&self) -> Instant {
        Instant(self.started.elapsed().as_nanos() as u64)
    }

    pub(crate) fn random_u64(&self) -> u64 {
        self.rng.borrow_mut().next_u64()
    }

    /// Operations submitted and not yet completed.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    fn arm_eventfd(&self) {
        let pointer = self.eventfd_buffer.borrow_mut().as_mut_ptr();
        let entry = opcode::Read::new(types::Fd(self.eventfd.as_raw_fd()), pointer, 8)
            .build()
            .user_data(EVENTFD_TOKEN);
        // SAFETY: the buffer is a Box owned by the driver, which outlives the ring's
        // use of it: the driver (and ring) are dropped together, and the kernel
        // cancels the read when the ring closes.
        unsafe { self.push(entry.into()) };
    }

    /// Queues an SQE (an ordinary 64-byte one fills the first half); when the
    /// submission queue is full, hands the queued entries to the kernel first.
    ///
    /// # Safety
    /// Every pointer in `entry` must stay valid until its completion is reaped.
    unsafe fn push(&self, entry: squeue::Entry128) {
        let mut ring = self.ring.borrow_mut();
        loop {
            // SAFETY: forwarded from the caller.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                return;
            }
            match ring.submit() {
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(error)
                    if error.raw_os_error() == Some(libc::EBUSY)
                        || error.raw_os_error() == Some(libc::EAGAIN) =>
                {
                    // The completion queue is backed up: reap to make room.
                    drop(ring);
                    self.reap();
                    ring = self.ring.borrow_mut();
                }
                Err(error) => panic!("io_uring submit failed: {error}"),
            }
        }
    }

    fn allocate_slot(&self) -> u32 {
        if let Some(index) = self.free_slots.borrow_mut().pop() {
            self.slots.borrow_mut()[index as usize] = Slot::Waiting(None);
            return index;
        }
        let mut slots = self.slots.borrow_mut();
        slots.push(Slot::Waiting(None));
        (slots.len() - 1) as u32
    }

    fn release_slot(&self, index: u32) {
        self.slots.borrow_mut()[index as usize] = Slot::Free;
        self.free_slots.borrow_mut().push(index);
        self.in_flight.set(self.in_flight.get() - 1);
    }

    /// Hands the queued entries to the kernel now, without waiting.
    pub(crate) fn submit_queued(&self) {
        let mut ring = self.ring.borrow_mut();
        if ring.submission().is_empty() {
            return;
        }
        let _ = ring.submit();
    }

    /// One loop turn: submit what is queued, wait for a completion when `wait` is
    /// set, then reap every completion that is there.
    pub(crate) fn turn(&self, wait: bool) {
        let idle = wait && DEVICE_IO.with(Cell::get) == 0;
        // Not after device I/O either: a client whose every request waits
        // on the devices gains nothing (the device completion wakes the loop
        // anyway), and on a virtual machine the polling core slows the
        // host's own device work: 4K QD1 reads of the devices took 86 us
        // each polling after none and 101 us polling after them.
        let polling = idle && self.poll.max_ns > 0 && {
            let started = DEVICE_IO_STARTED.with(Cell::get);
            started == self.device_io_seen.replace(started)
        };
        let idle_start = polling.then(std::time::Instant::now);
        let mut found = false;
        if polling && self.poll.ns() > 0 {
            // Nothing but requests from outside can complete: look for the
            // next one for a while before sleeping (see `PollWindow`).
            let start = std::time::Instant::now();
            loop {
                {
                    let mut ring = self.ring.borrow_mut();
                    let _ = ring.submit();
                    if !ring.completion().is_empty() {
                        found = true;
                        break;
                    }
                }
                if start.elapsed().as_nanos() as u64 > self.poll.ns() {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        {
            let ring = self.ring.borrow();
            let result = if wait && !found {
                ring.submit_and_wait(1)
            } else {
                ring.submit()
            };
            match result {
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                    ) => {}
                Err(error) => panic!("io_uring enter failed: {error}"),
            }
        }
        if let Some(start) = idle_start {
            self.poll.adapt(start.elapsed().as_nanos() as u64);
        }
        self.reap();
    }

    fn reap(&self) {
        let mut completed: Vec<(u64, i32)> = Vec::new();
        {
            let mut ring = self.ring.borrow_mut();
            for entry in ring.completion() {
                completed.push((entry.user_data(), entry.result()));
            }
        }
        for (user_data, result) in completed {
            if user_data == EVENTFD_TOKEN {
                self.arm_eventfd();
                continue;
            }
            if user_data == TIMEOUT_REMOVE_TOKEN {
                continue;
            }
            let index = user_data as u32;
            let previous = std::mem::replace(
                &mut self.slots.borrow_mut()[index as usize],
                Slot::Done(result),
            );
            match previous {
                Slot::Waiting(waker) => {
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
                Slot::Abandoned(memory) => {
                    drop(memory);
                    self.release_slot(index);
                }
                Slot::Free | Slot::Done(_) => {
                    panic!("completion for io_uring slot {index} that was not in flight")
                }
            }
        }
    }
}

fn build_ring(ring_entries: u32) -> io::Result<Ring> {
    // The completion queue is four times the submission queue so bursts of
    // completions (an aggregated I/O's many children) never overflow it.
    let completion_entries = ring_entries.saturating_mul(4);
    // IRONPOOL_URING_MODE selects the ring's task-run mode, for measuring:
    // "defer" (default: completions are processed only when the loop asks,
    // in batches), "coop", "plain", "sqpoll".
    let mode = std::env::var("IRONPOOL_URING_MODE").unwrap_or_else(|_| "defer".to_string());
    let mut builder = Ring::builder();
    builder.setup_cqsize(completion_entries);
    match mode.as_str() {
        "coop" => {
            builder
                .setup_single_issuer()
                .setup_coop_taskrun()
                .setup_taskrun_flag();
        }
        "defer" => {
            builder
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag();
        }
        "sqpoll" => {
            // A kernel thread submits (and so does the device and socket work of
            // submission) on another core; it sleeps after 2 ms without work.
            builder.setup_sqpoll(2);
        }
        _ => {}
    }
    match builder.build(ring_entries) {
        Ok(ring) => Ok(ring),
        // An older kernel without these flags: the plain ring is correct, only slower.
        Err(_) => Ring::builder()
            .setup_cqsize(completion_entries)
            .build(ring_entries),
    }
}

fn with_driver<R>(f: impl FnOnce(&UringDriver) -> R) -> R {
    with_current(|inner| match &inner.driver {
        Driver::Uring(driver) => f(driver),
        Driver::Sim(_) => panic!("an io_uring operation was started under the simulated runtime"),
    })
}

/// Operations in flight on this thread's ring.
pub fn in_flight() -> usize {
    with_driver(|driver| driver.in_flight())
}

/// An operation in flight: completes with the kernel's result and gives back the
/// memory it used.
pub(crate) struct Op<T: 'static> {
    slot: u32,
    memory: Option<T>,
}

impl<T: 'static> Op<T> {
    /// Submits `entry`, whose pointers refer to heap memory owned by `memory`.
    ///
    /// # Safety
    /// Every pointer in `entry` must point into heap allocations owned by `memory`
    /// (moving `memory` must not move them), valid for the whole operation.
    pub(crate) unsafe fn submit(entry: squeue::Entry, memory: T) -> Op<T> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::submit128(entry.into(), memory) }
    }

    /// [`Op::submit`] for a 128-byte entry (an `IORING_OP_URING_CMD` with
    /// 80 bytes of command).
    ///
    /// # Safety
    /// As [`Op::submit`].
    pub(crate) unsafe fn submit128(entry: squeue::Entry128, memory: T) -> Op<T> {
        with_driver(|driver| {
            let slot = driver.allocate_slot();
            driver.in_flight.set(driver.in_flight.get() + 1);
            // SAFETY: forwarded from the caller; the memory lives in the Op or,
            // if the Op is dropped early, in the slot until completion.
            unsafe { driver.push(entry.user_data(slot as u64)) };
            Op {
                slot,
                memory: Some(memory),
            }
        })
    }
}

// The kernel points into the heap memory `memory` owns, never into the Op itself,
// so moving an Op is harmless.
impl<T: 'static> Unpin for Op<T> {}

impl<T: 'static> Future for Op<T> {
    type Output = (i32, T);
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<(i32, T)> {
        let slot = self.slot;
        let result = with_driver(|driver| {
            let mut slots = driver.slots.borrow_mut();
            match &mut slots[slot as usize] {
                Slot::Done(result) => Some(*result),
                Slot::Waiting(waker) => {
                    crate::rt::register_waker(waker, context.waker());
                    None
                }
                Slot::Free | Slot::Abandoned(_) => {
                    panic!("polled io_uring slot {slot} in a wrong state")
                }
            }
        });
        match result {
            Some(result) => {
                with_driver(|driver| driver.release_slot(slot));
                let memory = self
                    .memory
                    .take()
                    .expect("an io_uring op polled after completion");
                Poll::Ready((result, memory))
            }
            None => Poll::Pending,
        }
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        let Some(memory) = self.memory.take() else {
            return;
        };
        let slot = self.slot;
        // At process exit the ring is gone too and nothing refers to the
        // memory any more.
        with_live_driver(|driver| {
            let done = matches!(driver.slots.borrow()[slot as usize], Slot::Done(_));
            if done {
                driver.release_slot(slot);
            } else {
                driver.slots.borrow_mut()[slot as usize] = Slot::Abandoned(Box::new(memory));
            }
        });
    }
}

/// [`with_driver`] for a drop: runs `f` with this thread's driver if its
/// runtime still exists, and does nothing if not (at process exit the
/// runtime, and its ring, may be gone before the last operations).
fn with_live_driver(f: impl FnOnce(&UringDriver)) {
    let _ = super::CURRENT.try_with(|current| {
        if let Some(Driver::Uring(driver)) = current.borrow().as_ref().map(|inner| &inner.driver) {
            f(driver);
        }
    });
}

fn to_result(result: i32) -> io::Result<usize> {
    if result < 0 {
        Err(io::Error::from_raw_os_error(-result))
    } else {
        Ok(result as usize)
    }
}

/// Reads into `buffer` at `offset`.
pub async fn read_at(
    fd: RawFd,
    mut buffer: AlignedBuf,
    offset: u64,
) -> (io::Result<usize>, AlignedBuf) {
    let entry = opcode::Read::new(types::Fd(fd), buffer.as_mut_ptr(), buffer.len() as u32)
        .offset(offset)
        .build();
    // SAFETY: the pointer is into buffer's heap allocation, owned by the op.
    let (result, buffer) = unsafe { Op::submit(entry, buffer) }.await;
    (to_result(result), buffer)
}

/// Reads at `offset` into the buffers in order (one device I/O).
pub async fn readv_at(
    fd: RawFd,
    mut buffers: Vec<AlignedBuf>,
    offset: u64,
) -> (io::Result<usize>, Vec<AlignedBuf>) {
    assert!(buffers.len() <= IOVEC_COUNT_MAX);
    let iovecs: Vec<libc::iovec> = buffers
        .iter_mut()
        .map(|buffer| libc::iovec {
            iov_base: buffer.as_mut_ptr() as *mut libc::c_void,
            iov_len: buffer.len(),
        })
        .collect();
    let entry = opcode::Readv::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
        .offset(offset)
        .build();
    // SAFETY: iovecs and the buffers they point to are heap memory owned by the op.
    let (result, (_, buffers)) = unsafe { Op::submit(entry, (iovecs, buffers)) }.await;
    (to_result(result), buffers)
}

/// Writes the slices at `offset`, in order (one device I/O).
pub async fn writev_at(fd: RawFd, slices: Vec<BufSlice>, offset: u64) -> io::Result<usize> {
    writev_at_with(fd, slices, offset, 0).await
}

/// `writev_at` with `pwritev2` flags (`RWF_DSYNC`: durable on completion).
pub async fn writev_at_with(
    fd: RawFd,
    slices: Vec<BufSlice>,
    offset: u64,
    rw_flags: i32,
) -> io::Result<usize> {
    writev_pieces(fd, slices, offset, rw_flags, false).await
}

/// Bytes a write takes over: a vector of the caller's, or a slice of a
/// shared buffer (a block read), neither copied.
pub enum WriteBytes {
    Owned(Vec<u8>),
    Shared(BufSlice),
}

/// Writes `pieces` in order, at the file's position (a `/dev/fuse` reply:
/// its header, its body, a READ's blocks): unlike [`writev_at`], no
/// aligned buffer is needed, so nothing is copied into one. For files that
/// take any address (not `O_DIRECT`).
pub async fn writev_bytes(fd: RawFd, pieces: Vec<WriteBytes>) -> io::Result<usize> {
    writev_pieces(fd, pieces, u64::MAX, 0, false).await
}

/// [`writev_bytes`] issued from one of the kernel's io_uring worker threads
/// (`IOSQE_ASYNC`), never inline in the loop's own `io_uring_enter`: for a
/// write that may block in the kernel on a lock whose holder waits for this
/// loop. A FUSE notification is one: the other mount's kernel takes a
/// directory's lock or a file's pages to apply it, which one of its
/// requests to this server may hold. Written inline, it stopped the loop
/// and with it the reply that lock waited for.
pub async fn writev_bytes_from_worker(fd: RawFd, pieces: Vec<WriteBytes>) -> io::Result<usize> {
    writev_pieces(fd, pieces, u64::MAX, 0, true).await
}

/// Bytes whose memory stays where it is when the value holding them moves
/// (heap memory), so an operation may own the value while the kernel reads
/// the bytes.
trait HeapBytes: 'static {
    fn bytes(&self) -> &[u8];
}

impl HeapBytes for BufSlice {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HeapBytes for WriteBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            WriteBytes::Owned(bytes) => bytes,
            WriteBytes::Shared(slice) => slice,
        }
    }
}

/// One `writev` of `pieces` at `offset` (`u64::MAX`: the file's position),
/// which it owns until the write completes; `from_worker`: issued from an
/// io_uring worker thread (see [`writev_bytes_from_worker`]).
async fn writev_pieces<P: HeapBytes>(
    fd: RawFd,
    pieces: Vec<P>,
    offset: u64,
    rw_flags: i32,
    from_worker: bool,
) -> io::Result<usize> {
    assert!(pieces.len() <= IOVEC_COUNT_MAX);
    let iovecs: Vec<libc::iovec> = pieces
        .iter()
        .map(|piece| libc::iovec {
            iov_base: piece.bytes().as_ptr() as *mut libc::c_void,
            iov_len: piece.bytes().len(),
        })
        .collect();
    let mut entry = opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
        .offset(offset)
        .rw_flags(rw_flags)
        .build();
    if from_worker {
        entry = entry.flags(io_uring::squeue::Flags::ASYNC);
    }
    // SAFETY: the iovec array and the pieces' heap memory (which moving
    // the pieces does not move: `HeapBytes`) are owned by the op until it
    // completes.
    let (result, _) = unsafe { Op::submit(entry, (iovecs, pieces)) }.await;
    to_result(result)
}

/// Flushes the device's (or file's) volatile write cache.
pub async fn fsync(fd: RawFd, data_only: bool) -> io::Result<()> {
    let flags = if data_only {
        types::FsyncFlags::DATASYNC
    } else {
        types::FsyncFlags::empty()
    };
    let entry = opcode::Fsync::new(types::Fd(fd)).flags(flags).build();
    // SAFETY: no memory is referenced.
    let (result, ()) = unsafe { Op::submit(entry, ()) }.await;
    to_result(result).map(|_| ())
}

/// Deallocates `length` bytes of a regular file at `offset`, keeping its size
/// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`): the range reads as zeros and takes
/// no space in the filesystem holding the file.
pub async fn punch_hole(fd: RawFd, offset: u64, length: u64) -> io::Result<()> {
    let entry = opcode::Fallocate::new(types::Fd(fd), length)
        .offset(offset)
        .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
        .build();
    // SAFETY: no memory is referenced.
    let (result, ()) = unsafe { Op::submit(entry, ()) }.await;
    to_result(result).map(|_| ())
}

/// `BLOCK_URING_CMD_DISCARD` from <linux/blkdev.h>: `_IO(0x12, 0)`.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// Discards `length` bytes of a block device at `offset` (the io_uring form
/// of `BLKDISCARD`, Linux 6.12 and later; older kernels answer EINVAL or
/// EOPNOTSUPP). The start goes in the SQE's `addr`, the length in `addr3`
/// (the first 8 bytes of the command area).
pub async fn block_discard(fd: RawFd, offset: u64, length: u64) -> io::Result<()> {
    let mut command = [0u8; 16];
    command[..8].copy_from_slice(&length.to_ne_bytes());
    let entry = opcode::UringCmd16::new(types::Fd(fd), BLOCK_URING_CMD_DISCARD)
        .addr(Some(offset))
        .cmd(command)
        .build();
    // SAFETY: no memory is referenced (the range travels in the SQE).
    let (result, ()) = unsafe { Op::submit(entry, ()) }.await;
    to_result(result).map(|_| ())
}

/// Completes after `duration`.
pub fn timeout(duration: Duration) -> Timeout {
    let timespec = Box::new(
        types::Timespec::new()
            .sec(duration.as_secs())
            .nsec(duration.subsec_nanos()),
    );
    let entry = opcode::Timeout::new(&*timespec as *const types::Timespec).build();
    Timeout {
        // SAFETY: the timespec is boxed and owned by the op.
        op: unsafe { Op::submit(entry, timespec) },
    }
}

/// A kernel timer ([`timeout`]). Dropped before it fires (the other side of
/// a race won), it removes the timer from the kernel: an abandoned timeout
/// would stay armed until it expires, holding a kernel request and a slot.
/// The NBD front end races every reply's send against a 60 s stall timeout:
/// at 200k replies a second that left over a million requests armed
/// (`io_kiocb` in /proc/slabinfo) after 20 s.
pub struct Timeout {
    op: Op<Box<types::Timespec>>,
}

impl Future for Timeout {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        // The result is -ETIME on expiry (or -ECANCELED); either way the
        // time is up.
        Pin::new(&mut self.op).poll(context).map(|_| ())
    }
}

impl Drop for Timeout {
    fn drop(&mut self) {
        if self.op.memory.is_none() {
            return; // Completed and polled: the slot is released.
        }
        let slot = self.op.slot;
        // At process exit the ring may be gone with its timers.
        with_live_driver(|driver| {
            if !matches!(driver.slots.borrow()[slot as usize], Slot::Waiting(_)) {
                return; // Fired already; its completion is reaped.
            }
            let entry = opcode::TimeoutRemove::new(slot as u64)
                .build()
                .user_data(TIMEOUT_REMOVE_TOKEN);
            // SAFETY: the removal refers to no memory. The timer's own
            // completion (-ECANCELED) then frees the slot `Op`'s drop
            // abandons, with the timespec kept until then.
            unsafe { driver.push(entry.into()) };
        });
    }
}

/// Accepts a connection on a listening socket.
pub async fn accept(fd: RawFd) -> io::Result<OwnedFd> {
    let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
        .flags(libc::SOCK_CLOEXEC)
        .build();
    // SAFETY: no memory is referenced (the peer address is not asked for).
    let (result, ()) = unsafe { Op::submit(entry, ()) }.await;
    let raw = to_result(result)?;
    // SAFETY: the kernel returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}

/// Receives up to `buffer.len() - start` bytes into `buffer[start..]`.
pub async fn recv_into(
    fd: RawFd,
    mut buffer: Vec<u8>,
    start: usize,
) -> (io::Result<usize>, Vec<u8>) {
    assert!(start <= buffer.len());
    // SAFETY: start is within the buffer.
    let pointer = unsafe { buffer.as_mut_ptr().add(start) };
    let length = (buffer.len() - start).min(u32::MAX as usize) as u32;
    let entry = opcode::Recv::new(types::Fd(fd), pointer, length).build();
    // SAFETY: the pointer is into the Vec's heap allocation, owned by the op.
    let (result, buffer) = unsafe { Op::submit(entry, buffer) }.await;
    (to_result(result), buffer)
}

/// Receives into `buffer[start..]` like [`recv_into`], also taking a file
/// descriptor passed along (SCM_RIGHTS): the CLI hands its stdin or stdout to
/// the server this way for send and receive.
pub async fn recv_into_with_fd(
    fd: RawFd,
    mut buffer: Vec<u8>,
    start: usize,
) -> (io::Result<usize>, Vec<u8>, Option<OwnedFd>) {
    assert!(start <= buffer.len());
    /// Room for one descriptor's control message (CMSG_SPACE of an int is 24
    /// bytes on 64-bit Linux; 64 leaves margin).
    const CONTROL_BYTES: usize = 64;
    // SAFETY: start is within the buffer.
    let pointer = unsafe { buffer.as_mut_ptr().add(start) };
    let mut iovec = Box::new(libc::iovec {
        iov_base: pointer as *mut libc::c_void,
        iov_len: buffer.len() - start,
    });
    let mut control = Box::new([0u8; CONTROL_BYTES]);
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut header: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
    header.msg_iov = &mut *iovec;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    header.msg_controllen = CONTROL_BYTES as _;
    let entry = opcode::RecvMsg::new(types::Fd(fd), &mut *header)
        .flags(libc::MSG_CMSG_CLOEXEC as u32)
        .build();
    // SAFETY: the header, iovec, control buffer and data buffer are heap memory
    // owned by the op until it completes.
    let (result, (header, _iovec, control, buffer)) =
        unsafe { Op::submit(entry, (header, iovec, control, buffer)) }.await;
    let mut passed = None;
    if result >= 0 {
        let mut view: libc::msghdr = *header;
        view.msg_control = control.as_ptr() as *mut libc::c_void;
        // SAFETY: the kernel filled the control buffer and msg_controllen; the
        // CMSG macros walk only within it.
        unsafe {
            let mut message = libc::CMSG_FIRSTHDR(&view);
            while !message.is_null() {
                if (*message).cmsg_level == libc::SOL_SOCKET
                    && (*message).cmsg_type == libc::SCM_RIGHTS
                {
                    let data = libc::CMSG_DATA(message) as *const RawFd;
                    let count = ((*message).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for index in 0..count {
                        let received = std::ptr::read_unaligned(data.add(index));
                        // Keep the first; close any extra (never leak them).
                        let owned = OwnedFd::from_raw_fd(received);
                        if passed.is_none() {
                            passed = Some(owned);
                        }
                    }
                }
                message = libc::CMSG_NXTHDR(&view, message);
            }
        }
    }
    (to_result(result), buffer, passed)
}

/// Receives into `buffer[start..end]` (an aligned payload buffer).
pub async fn recv_aligned(
    fd: RawFd,
    mut buffer: AlignedBuf,
    start: usize,
    end: usize,
) -> (io::Result<usize>, AlignedBuf) {
    assert!(start <= end && end <= buffer.len());
    // SAFETY: start is within the buffer.
    let pointer = unsafe { buffer.as_mut_ptr().add(start) };
    let entry = opcode::Recv::new(types::Fd(fd), pointer, (end - start) as u32).build();
    // SAFETY: the pointer is into the buffer's heap allocation, owned by the op.
    let (result, buffer) = unsafe { Op::submit(entry, buffer) }.await;
    (to_result(result), buffer)
}

/// Receives into `buffer[heads[0]]`, `payloads[0]`, `buffer[heads[1]]`,
/// `payloads[1]`, ... and last `buffer[heads[payloads.len()]]`, in that
/// order (one `recvmsg`): a server that expects a run of writes of one
/// size gets each payload in an aligned buffer of its own, with no copy.
/// `heads` has one range more than `payloads`, each within `buffer`.
pub async fn recv_scattered(
    fd: RawFd,
    mut buffer: Vec<u8>,
    heads: &[std::ops::Range<usize>],
    mut payloads: Vec<AlignedBuf>,
) -> (io::Result<usize>, Vec<u8>, Vec<AlignedBuf>) {
    assert_eq!(heads.len(), payloads.len() + 1);
    assert!(heads.len() + payloads.len() <= IOVEC_COUNT_MAX);
    assert!(heads
        .iter()
        .all(|head| head.start <= head.end && head.end <= buffer.len()));
    let base = buffer.as_mut_ptr();
    let mut iovecs = Vec::with_capacity(heads.len() + payloads.len());
    for (index, head) in heads.iter().enumerate() {
        iovecs.push(libc::iovec {
            // SAFETY: the range is within `buffer` (asserted above).
            iov_base: unsafe { base.add(head.start) } as *mut libc::c_void,
            iov_len: head.len(),
        });
        if let Some(payload) = payloads.get_mut(index) {
            iovecs.push(libc::iovec {
                iov_base: payload.as_mut_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            });
        }
    }
    let mut iovecs = iovecs.into_boxed_slice();
    // SAFETY: an all-zero msghdr is valid; its iovec pointer is set below.
    let mut header: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
    header.msg_iov = iovecs.as_mut_ptr();
    header.msg_iovlen = iovecs.len() as _;
    let entry = opcode::RecvMsg::new(types::Fd(fd), &mut *header).build();
    // SAFETY: the header, the iovecs and the buffers they point into are
    // heap memory owned by the op until it completes.
    let (result, (_, _, buffer, payloads)) =
        unsafe { Op::submit(entry, (header, iovecs, buffer, payloads)) }.await;
    (to_result(result), buffer, payloads)
}

/// A piece of an outgoing message.
pub enum SendPiece {
    Bytes(Vec<u8>),
    Slice(BufSlice),
    /// `n` zero bytes (a hole in a plain read reply).
    Zeros(usize),
}

impl SendPiece {
    pub fn len(&self) -> usize {
        match self {
            SendPiece::Bytes(bytes) => bytes.len(),
            SendPiece::Slice(slice) => slice.len(),
            SendPiece::Zeros(length) => *length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Zero bytes that `SendPiece::Zeros` points iovecs at.
static ZERO_PAGE: [u8; 65536] = [0; 65536];

/// Sends all of `bytes` on a socket, looping on short sends; a send of zero
/// bytes (the peer is gone) is an error.
pub async fn send_all(fd: RawFd, bytes: Vec<u8>) -> io::Result<()> {
    let total = bytes.len();
    let mut pieces = vec![SendPiece::Bytes(bytes)];
    let mut sent = 0;
    while sent < total {
        let (result, returned) = send_pieces(fd, pieces, sent).await;
        pieces = returned;
        match result? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            count => sent += count,
        }
    }
    Ok(())
}

/// Sends the pieces (from `skip` bytes into them) with one sendmsg; returns bytes sent.
/// Callers loop on short sends.
pub async fn send_pieces(
    fd: RawFd,
    pieces: Vec<SendPiece>,
    skip: usize,
) -> (io::Result<usize>, Vec<SendPiece>) {
    let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(pieces.len().min(IOVEC_COUNT_MAX));
    let mut to_skip = skip;
    'pieces: for piece in &pieces {
        let (base, length): (*const u8, usize) = match piece {
            SendPiece::Bytes(bytes) => (bytes.as_ptr(), bytes.len()),
            SendPiece::Slice(slice) => (slice.as_ptr(), slice.len()),
            SendPiece::Zeros(length) => (ZERO_PAGE.as_ptr(), *length),
        };
        if to_skip >= length {
            to_skip -= length;
            continue;
        }
        let mut offset = to_skip;
        to_skip = 0;
        while offset < length {
            if iovecs.len() == IOVEC_COUNT_MAX {
                break 'pieces;
            }
            let chunk = match piece {
                SendPiece::Zeros(_) => (length - offset).min(ZERO_PAGE.len()),
                _ => length - offset,
            };
            let pointer = match piece {
                SendPiece::Zeros(_) => base,
                // SAFETY: offset < length, within the piece.
                _ => unsafe { base.add(offset) },
            };
            iovecs.push(libc::iovec {
                iov_base: pointer as *mut libc::c_void,
                iov_len: chunk,
            });
            offset += chunk;
        }
    }
    if iovecs.is_empty() {
        return (Ok(0), pieces);
    }
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut header: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
    header.msg_iov = iovecs.as_mut_ptr();
    header.msg_iovlen = iovecs.len() as _;
    let entry = opcode::SendMsg::new(types::Fd(fd), &*header as *const libc::msghdr)
        .flags(libc::MSG_NOSIGNAL as u32)
        .build();
    // SAFETY: the header, the iovec array and every piece they point into are owned
    // by the op (static zeros live forever).
    let (result, (_, _, pieces)) = unsafe { Op::submit(entry, (header, iovecs, pieces)) }.await;
    (to_result(result), pieces)
}

/// Reads from a non-socket descriptor (signalfd, eventfd) into a small buffer.
pub async fn read_bytes(fd: RawFd, mut buffer: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
    let entry = opcode::Read::new(types::Fd(fd), buffer.as_mut_ptr(), buffer.len() as u32)
        .offset(u64::MAX)
        .build();
    // SAFETY: the pointer is into the Vec's heap allocation, owned by the op.
    let (result, buffer) = unsafe { Op::submit(entry, buffer) }.await;
    (to_result(result), buffer)
}

/// Reads from a stream descriptor (a pipe, a file at its current position, a
/// socket, `/dev/fuse`) into `buffer[start..]`. On a non-blocking descriptor
/// that can be polled, the ring tries the read at once and, when nothing is
/// there, waits for the descriptor to be readable and reads then, without
/// blocking this thread or one of its workers.
pub async fn read_stream_into(
    fd: RawFd,
    mut buffer: AlignedBuf,
    start: usize,
) -> (io::Result<usize>, AlignedBuf) {
    assert!(start <= buffer.len());
    // SAFETY: start is within the buffer.
    let pointer = unsafe { buffer.as_mut_ptr().add(start) };
    let entry = opcode::Read::new(types::Fd(fd), pointer, (buffer.len() - start) as u32)
        .offset(u64::MAX)
        .build();
    // SAFETY: the pointer is into buffer's heap allocation, owned by the op.
    let (result, buffer) = unsafe { Op::submit(entry, buffer) }.await;
    (to_result(result), buffer)
}

/// [`read_stream_into`] with `payload` spliced into `buffer` at `split`:
/// one read fills `buffer[start..split]`, then all of `payload`, then
/// `buffer[split + payload.len()..]`. A front end that expects a write
/// whose headers end at `split` gets its payload in a buffer of its own,
/// kept as the block's bytes with no copy; when the message was something
/// else, copying `payload`'s part back into `buffer[split..]` gives the
/// bytes a plain read would have left there.
pub async fn read_stream_split(
    fd: RawFd,
    mut buffer: AlignedBuf,
    start: usize,
    split: usize,
    mut payload: AlignedBuf,
) -> (io::Result<usize>, AlignedBuf, AlignedBuf) {
    assert!(start <= split && split + payload.len() <= buffer.len());
    let base = buffer.as_mut_ptr();
    let tail = split + payload.len();
    // SAFETY: every offset is within `buffer` (asserted above).
    let iovecs: Vec<libc::iovec> = unsafe {
        vec![
            libc::iovec {
                iov_base: base.add(start) as *mut libc::c_void,
                iov_len: split - start,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            },
            libc::iovec {
                iov_base: base.add(tail) as *mut libc::c_void,
                iov_len: buffer.len() - tail,
            },
        ]
    };
    let entry = opcode::Readv::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
        .offset(u64::MAX)
        .build();
    // SAFETY: the iovecs and both buffers they point into are heap memory
    // owned by the op until it completes.
    let (result, (_, buffer, payload)) =
        unsafe { Op::submit(entry, (iovecs, buffer, payload)) }.await;
    (to_result(result), buffer, payload)
}

/// Fills `buffer` from a stream descriptor. Returns the bytes read: fewer than
/// the buffer's length only at the end of the stream.
pub async fn read_stream_exact(
    fd: RawFd,
    mut buffer: AlignedBuf,
) -> (io::Result<usize>, AlignedBuf) {
    let mut filled = 0;
    while filled < buffer.len() {
        let (result, returned) = read_stream_into(fd, buffer, filled).await;
        buffer = returned;
        match result {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return (Err(error), buffer),
        }
    }
    (Ok(filled), buffer)
}

/// Writes all of `slices`, in order, to a stream descriptor (a pipe, a file at
/// its current position, a socket), continuing after short writes.
pub async fn write_stream_all(fd: RawFd, mut slices: Vec<BufSlice>) -> io::Result<()> {
    while !slices.is_empty() {
        let batch: Vec<BufSlice> = slices.iter().take(IOVEC_COUNT_MAX).cloned().collect();
        let written = match writev_at(fd, batch, u64::MAX).await {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the stream accepts no more bytes",
                ))
            }
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => 0,
            Err(error) => return Err(error),
        };
        // Drop what was written; cut the slice written in part.
        let mut remaining = written;
        let mut consumed = 0;
        while consumed < slices.len() && remaining >= slices[consumed].len() {
            remaining -= slices[consumed].len();
            consumed += 1;
        }
        slices.drain(..consumed);
        if remaining > 0 {
            let first = &slices[0];
            slices[0] = first.slice(remaining..first.len());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = POLL_WINDOW_MAX_US * 1000;

    #[test]
    fn a_waiting_client_grows_the_poll_window_to_its_ceiling_and_no_further() {
        let window = PollWindow::new(MAX);
        assert_eq!(window.ns(), 0, "a new loop sleeps at once");
        // A client at a 40 us round trip: slept-through idle periods of 60 us
        // (its round trip and the loop's own wake-up), then caught ones.
        window.adapt(60_000);
        assert_eq!(window.ns(), POLL_WINDOW_GROW_START_NS);
        let mut steps = 1;
        while window.ns() < MAX {
            window.adapt(window.ns() + 1);
            steps += 1;
            assert!(steps < 16, "the window reaches its ceiling in a few steps");
        }
        assert_eq!(window.ns(), MAX);
        window.adapt(MAX * 2);
        assert_eq!(window.ns(), MAX, "never past the ceiling");
        // Periods the poll caught leave the window as it is.
        window.adapt(20_000);
        assert_eq!(window.ns(), MAX);
    }

    #[test]
    fn long_idle_periods_shrink_the_poll_window_to_nothing() {
        let window = PollWindow::new(MAX);
        window.adapt(1);
        while window.ns() < MAX {
            window.adapt(window.ns() + 1);
        }
        let long = MAX * POLL_IDLE_LONG_FACTOR + 1;
        window.adapt(long);
        assert_eq!(window.ns(), MAX / 2);
        for _ in 0..8 {
            window.adapt(long);
        }
        assert_eq!(window.ns(), 0, "an idle server stops polling");
    }

    /// Ops in flight on the ring once the loop has had a few turns to reap
    /// what completed.
    async fn in_flight_after_turns() -> usize {
        for _ in 0..4 {
            crate::rt::sleep(Duration::from_millis(1)).await;
        }
        in_flight()
    }

    #[test]
    fn a_timeout_that_loses_its_race_leaves_no_timer_armed() {
        let runtime = crate::rt::Runtime::new_uring(64).unwrap();
        runtime.block_on(async {
            let before = in_flight_after_turns().await;
            for round in 0..1000 {
                // A reply sent at once, raced against a minute-long stall
                // timeout, as the NBD front end did for every reply.
                let won = crate::rt::timeout(Duration::from_secs(60), async { round }).await;
                assert_eq!(won, Some(round));
            }
            assert_eq!(
                in_flight_after_turns().await,
                before,
                "the 1000 abandoned timeouts were removed from the kernel, not left armed"
            );
            // A timeout that fires still completes.
            let started = std::time::Instant::now();
            crate::rt::sleep(Duration::from_millis(20)).await;
            assert!(started.elapsed() >= Duration::from_millis(20));
        });
    }

    #[test]
    fn a_timer_arms_one_timeout_per_deadline_not_per_wait() {
        let runtime = crate::rt::Runtime::new_uring(64).unwrap();
        runtime.block_on(async {
            let before = in_flight_after_turns().await;
            let mut timer = crate::rt::Timer::new();
            let deadline = crate::rt::now().saturating_add(Duration::from_secs(60));
            for round in 0..1000 {
                assert_eq!(
                    timer.timeout_at(deadline, async { round }).await,
                    Some(round)
                );
                let within = timer
                    .timeout_within(Duration::from_secs(59), Duration::from_secs(2), async {
                        round
                    })
                    .await;
                assert_eq!(within, Some(round));
            }
            assert_eq!(
                in_flight(),
                before + 1,
                "2000 waits on one timer: one timeout armed"
            );
            // Past its deadline, the timer wins.
            let soon = crate::rt::now().saturating_add(Duration::from_millis(10));
            let never = std::future::pending::<()>();
            assert_eq!(timer.timeout_at(soon, never).await, None);
            assert_eq!(in_flight_after_turns().await, before);
        });
    }

    #[test]
    fn a_zero_ceiling_never_polls() {
        let window = PollWindow::new(0);
        for idle in [1, 1_000, 60_000, 1_000_000] {
            window.adapt(idle);
            assert_eq!(window.ns(), 0);
        }
    }
}
