//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, enabled by
//! root with `/sys/module/fuse/parameters/enable_uring`): the kernel hands
//! requests to buffers the server registered and takes replies from them,
//! one `IORING_OP_URING_CMD` per request and reply, with no `/dev/fuse`
//! read or write and no io_uring worker thread in between.
//!
//! The commands go on the engine's own ring (its SQEs are 128 bytes for
//! them): the kernel copies a request into a slot's buffers in the engine
//! thread and completes the slot's command, which wakes the slot's task;
//! the request runs there, like a request read from `/dev/fuse`, and its
//! reply goes back with `COMMIT_AND_FETCH`, submitted with the loop's other
//! work, which also arms the slot for the next request.
//!
//! The kernel keeps one queue per possible CPU and uses the ring only once
//! every queue has a slot; a request goes to the queue of the CPU the
//! application ran on. Each slot is a 288-byte header (the request's
//! `fuse_in_header`, the operation's own header, and the slot's
//! `commit_id` and payload length) and a payload buffer for the rest. A
//! request is laid out again as `/dev/fuse` would have given it (in front
//! of the payload, without copying it), so both transports share one
//! decoder and one dispatcher. INIT, FORGET and INTERRUPT still come
//! through `/dev/fuse`, whose readers stay.
//!
//! A kernel or setting without it refuses the first registration and the
//! kernel goes on with `/dev/fuse` alone; the filesystem's front-end figures
//! (`fs list`, `status`) say which is used.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

use io_uring::{opcode, squeue, types};

use super::proto::{self, IN_HEADER_BYTES, OUT_HEADER_BYTES};
use super::{handle, Session, REQUEST_BUFFER_BYTES};
use crate::rt::buf::AlignedBuf;
use crate::rt::uring::Op;
use crate::rt::{self};

/// `FUSE_IO_URING_CMD_REGISTER`: gives the kernel a slot.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: a reply, and the slot back.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: the request's header (and the reply's),
/// the operation's header, then `fuse_uring_ent_in_out`.
const SLOT_HEADER_BYTES: usize = 288;
const OP_HEADER_AT: usize = 128;
const OP_HEADER_BYTES_MAX: usize = 128;
const COMMIT_ID_AT: usize = 264;
const PAYLOAD_BYTES_AT: usize = 272;
/// Room in front of a slot's payload for the request's headers, so that the
/// request lies in one piece as `/dev/fuse` gives it.
const FRONT_BYTES: usize = 256;
/// The payload buffer: the kernel wants at least `max_write` and
/// `max_pages` pages (1 MiB here); a reply's body goes there too.
const PAYLOAD_BYTES: usize = REQUEST_BUFFER_BYTES;
/// Slots of one mount over all its queues. Each holds a 1 MiB buffer, so
/// this bounds a mount's memory (128 MiB) and the requests it serves at
/// once; a queue gets its share (64 each with two CPUs: the depth of fio's
/// QD64 from one CPU), and at least one.
pub const SLOTS_MAX: usize = 128;
/// More possible CPUs than this and the mount keeps to `/dev/fuse` (one
/// slot a queue would pass [`SLOTS_MAX`] many times over).
const QUEUES_MAX: usize = 1024;
/// How long a stopping mount waits for the kernel to hand its slots back
/// (it does at once when the session ends); past it, a slot's memory stays
/// with its command until the ring is closed.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Where `enable_uring` lives (Y: the kernel offers FUSE over io_uring).
const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring now (checked at mount: the
/// kernel decides at INIT).
pub fn kernel_offers() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_PARAMETER) {
        Ok(text) if text.trim() == "Y" => Ok(()),
        Ok(_) => Err(format!("{ENABLE_PARAMETER} is N")),
        Err(_) => Err("this kernel has no FUSE over io_uring".into()),
    }
}

/// The number of possible CPUs (the kernel's queue count), from
/// `/sys/devices/system/cpu/possible` ("0-7", "0,2-3").
fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut highest = None;
    for range in text.trim().split(',') {
        let last = range.rsplit('-').next().unwrap_or(range);
        let last: usize = last
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, text.clone()))?;
        highest = highest.max(Some(last));
    }
    highest
        .map(|cpu| cpu + 1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, text))
}

/// One registered slot: its queue, its header and payload buffers, and the
/// two iovecs that name them to the kernel. The buffers are heap memory
/// that never moves; the kernel writes them only while the slot is armed
/// (its command in flight), and the server only while it is not.
struct Slot {
    qid: u16,
    header: RefCell<Box<[u8; SLOT_HEADER_BYTES]>>,
    buffer: RefCell<AlignedBuf>,
    iovecs: Box<[libc::iovec; 2]>,
}

impl Slot {
    fn new(qid: u16) -> Slot {
        let mut header = Box::new([0u8; SLOT_HEADER_BYTES]);
        let mut buffer = AlignedBuf::zeroed(FRONT_BYTES + PAYLOAD_BYTES);
        let iovecs = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: SLOT_HEADER_BYTES,
            },
            libc::iovec {
                // SAFETY: FRONT_BYTES is within the buffer.
                iov_base: unsafe { buffer.as_mut_ptr().add(FRONT_BYTES) }.cast(),
                iov_len: PAYLOAD_BYTES,
            },
        ]);
        Slot {
            qid,
            header: RefCell::new(header),
            buffer: RefCell::new(buffer),
            iovecs,
        }
    }

    /// The 80 command bytes: `fuse_uring_cmd_req` (flags, commit_id, qid).
    fn command(&self, commit_id: u64) -> [u8; 80] {
        let mut bytes = [0u8; 80];
        bytes[8..16].copy_from_slice(&commit_id.to_le_bytes());
        bytes[16..18].copy_from_slice(&self.qid.to_le_bytes());
        bytes
    }
}

/// A mount's io_uring transport: its slots, and a task per slot.
pub(super) struct UringTransport {
    fd: RawFd,
    slots: Vec<Slot>,
    queues: usize,
    /// The kernel refused a slot (said once).
    refused: Cell<bool>,
    tasks: RefCell<Vec<rt::JoinHandle<()>>>,
}

impl UringTransport {
    /// Registers slots for every queue of the mount (after the INIT reply:
    /// the kernel refuses them before) and serves what they bring.
    pub(super) fn start(session: &Rc<Session>) -> io::Result<Rc<UringTransport>> {
        let queues = possible_cpus()?;
        if queues > QUEUES_MAX {
            return Err(io::Error::other(format!(
                "{queues} possible CPUs (at most {QUEUES_MAX})"
            )));
        }
        let per_queue = (SLOTS_MAX / queues).max(1);
        let count = queues * per_queue;
        let transport = Rc::new(UringTransport {
            fd: session.fd,
            slots: (0..count)
                .map(|index| Slot::new((index / per_queue) as u16))
                .collect(),
            queues,
            refused: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
        });
        let tasks = (0..count)
            .map(|index| rt::spawn(run_slot(session.clone(), transport.clone(), index)))
            .collect();
        *transport.tasks.borrow_mut() = tasks;
        Ok(transport)
    }

    /// What the transport is, for the front-end figures.
    pub(super) fn description(&self) -> String {
        format!(
            "io_uring ({} queues x {} slots)",
            self.queues,
            self.slots.len() / self.queues
        )
    }

    /// The REGISTER command of slot `index`.
    fn register(&self, index: usize) -> squeue::Entry128 {
        let slot = &self.slots[index];
        let mut entry = opcode::UringCmd80::new(types::Fd(self.fd), CMD_REGISTER)
            .addr(Some(slot.iovecs.as_ptr() as u64))
            .cmd(slot.command(0))
            .build();
        // The builder has no length: the SQE's `len` (byte 24 of the raw
        // entry, which the 128-byte entry starts with) is the iovec count.
        // SAFETY: `Entry128` is `repr(C)` and starts with the 64-byte SQE.
        unsafe {
            (&mut entry as *mut squeue::Entry128)
                .cast::<u8>()
                .add(24)
                .cast::<u32>()
                .write_unaligned(2)
        };
        entry
    }

    /// Waits (a bounded time) for the slots' tasks, which end when the
    /// kernel, the session over (the `/dev/fuse` readers are done), hands
    /// the slots back.
    pub(super) async fn stop(&self) {
        let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
        let all = futures_util::future::join_all(tasks);
        if rt::timeout(STOP_WAIT, all).await.is_none() {
            eprintln!("ironpool: FUSE ring slots not handed back after {STOP_WAIT:?}");
        }
    }
}

/// One slot's life: registered, then each completion brings a request,
/// served here, whose reply's commit fetches the next; it ends when the
/// kernel ends it (the session is over) or refuses it.
async fn run_slot(session: Rc<Session>, transport: Rc<UringTransport>, index: usize) {
    let mut entry = transport.register(index);
    loop {
        // SAFETY: the entry points at the slot's iovecs and buffers, heap
        // memory of the transport, which the op holds until completion.
        let (result, _) = unsafe { Op::submit128(entry, transport.clone()) }.await;
        entry = match -result {
            0 => serve(&session, &transport, index).await,
            // The session ended (unmount) or the thread is going.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => return,
            // Registered before the kernel took the INIT reply: again.
            libc::EAGAIN | libc::EINTR => {
                rt::sleep(Duration::from_millis(10)).await;
                transport.register(index)
            }
            // Refused: the kernel goes on with /dev/fuse.
            errno => {
                let error = io::Error::from_raw_os_error(errno);
                if !transport.refused.replace(true) {
                    eprintln!(
                        "ironpool: {}: FUSE over io_uring refused ({error}); using /dev/fuse",
                        session.fs.name()
                    );
                    session.fs.note_front_end(|stats| {
                        stats.transport = format!("/dev/fuse (io_uring refused: {error})")
                    });
                }
                return;
            }
        };
    }
}

/// Serves the request slot `index` holds; returns the command that
/// commits the reply and arms the slot for the next request.
async fn serve(session: &Session, transport: &UringTransport, index: usize) -> squeue::Entry128 {
    let slot = &transport.slots[index];
    // The buffer is taken out of its cell while the request is served (its
    // heap memory, which the kernel knows, does not move) and put back.
    let mut buffer = std::mem::replace(&mut *slot.buffer.borrow_mut(), AlignedBuf::zeroed(0));
    let (commit_id, unique, reply) = {
        let header: [u8; SLOT_HEADER_BYTES] = **slot.header.borrow();
        let field = |at: usize, bytes: usize| {
            let mut value = [0u8; 8];
            value[..bytes].copy_from_slice(&header[at..at + bytes]);
            u64::from_le_bytes(value)
        };
        let length = field(0, 4) as usize;
        let unique = field(8, 8);
        let commit_id = field(COMMIT_ID_AT, 8);
        let payload = field(PAYLOAD_BYTES_AT, 4) as usize;
        // What is neither the in-header nor the payload is the operation's
        // header (the kernel does not say its size).
        let op_bytes = length
            .checked_sub(IN_HEADER_BYTES + payload)
            .filter(|bytes| *bytes <= OP_HEADER_BYTES_MAX && payload <= PAYLOAD_BYTES);
        let reply = match op_bytes {
            Some(op_bytes) => {
                let start = FRONT_BYTES - IN_HEADER_BYTES - op_bytes;
                buffer[start..start + IN_HEADER_BYTES].copy_from_slice(&header[..IN_HEADER_BYTES]);
                buffer[start + IN_HEADER_BYTES..FRONT_BYTES]
                    .copy_from_slice(&header[OP_HEADER_AT..OP_HEADER_AT + op_bytes]);
                let request = &buffer[start..FRONT_BYTES + payload];
                handle(session, request, super::Lent::None).await.1
            }
            None => {
                eprintln!(
                    "ironpool: {}: malformed FUSE request on the ring: length {length}, payload {payload}",
                    session.fs.name()
                );
                None
            }
        };
        (commit_id, unique, reply)
    };
    // Every request on the ring is committed, one without a reply too (as
    // an empty success), or its slot would be lost.
    let reply = reply
        .filter(|reply| reply.body_len() <= PAYLOAD_BYTES)
        .unwrap_or_else(|| {
            proto::Reply::new(unique, if unique == 0 { 0 } else { -libc::EIO }, Vec::new())
        });
    {
        let mut header = slot.header.borrow_mut();
        header[..OUT_HEADER_BYTES].copy_from_slice(&reply.header);
        header[PAYLOAD_BYTES_AT..PAYLOAD_BYTES_AT + 4]
            .copy_from_slice(&(reply.body_len() as u32).to_le_bytes());
        // The body, then a READ's data, each copied once into the slot.
        let mut at = FRONT_BYTES;
        for piece in std::iter::once(&reply.body[..]).chain(reply.data.iter().map(|p| &p[..])) {
            buffer[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
    }
    *slot.buffer.borrow_mut() = buffer;
    opcode::UringCmd80::new(types::Fd(transport.fd), CMD_COMMIT_AND_FETCH)
        .cmd(slot.command(commit_id))
        .build()
}
