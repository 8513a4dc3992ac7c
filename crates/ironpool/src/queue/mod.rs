//! The per-leaf I/O queue: every device read and write goes through here.
//!
//! Modelled on OpenZFS's vdev_queue, rebuilt for NVMe:
//! - Priority classes, each with a minimum and maximum number of active I/Os, and
//!   a per-device total. The class issued next is, first, any class below its
//!   minimum (round robin), then the highest-priority class below its maximum.
//!   Defaults let a client's queue depth reach the device (OpenZFS caps every
//!   class at 10, which is why its queue depth never grows on NVMe).
//! - Background classes (scrub, trim, rebuild, initializing) are held to their
//!   minimum while interactive I/O is queued or active.
//! - I/Os are also kept in one offset-sorted set per direction, shared by all
//!   classes, so neighbours of different classes aggregate into one vectored
//!   device I/O (no copy: the aggregate is a readv/writev over the children's own
//!   buffers). Reads may bridge small gaps; writes must be contiguous. I/Os whose
//!   repair or scrub semantics differ never merge.
//! - Optional I/Os (RAID-Z pad sectors) join an aggregate past the size limit,
//!   never start or end one, and are dropped when nothing needs them.
//! - Dispatch is deferred to the end of the loop's round (like a block-layer
//!   plug), so all I/Os queued in one round are seen together and can
//!   aggregate, and the device I/Os it starts are submitted in the same turn.

pub mod stats;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, VecDeque};
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::dev::{Device, DeviceError};
use crate::events::{EventClass, EventLog, NewEvent, RateLimit};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::{oneshot, OneshotSender};
use crate::rt::uring::IOVEC_COUNT_MAX;
use crate::rt::{self};
use stats::LeafStats;

/// Priority classes, highest priority first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoClass {
    /// Reads a client is waiting for.
    SyncRead,
    /// Writes a client is waiting for (direct data writes).
    SyncWrite,
    /// Reads nobody waits on (prefetch).
    AsyncRead,
    /// Transaction-group writes (metadata, labels, uberblocks).
    AsyncWrite,
    /// Scrub reads and the repairs they cause.
    Scrub,
    /// Discards.
    Trim,
    /// Resilver / rebuild.
    Rebuild,
    /// Initializing new devices.
    Initializing,
}

pub const CLASS_COUNT: usize = 8;

impl IoClass {
    pub const ALL: [IoClass; CLASS_COUNT] = [
        IoClass::SyncRead,
        IoClass::SyncWrite,
        IoClass::AsyncRead,
        IoClass::AsyncWrite,
        IoClass::Scrub,
        IoClass::Trim,
        IoClass::Rebuild,
        IoClass::Initializing,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync_read",
            IoClass::SyncWrite => "sync_write",
            IoClass::AsyncRead => "async_read",
            IoClass::AsyncWrite => "async_write",
            IoClass::Scrub => "scrub",
            IoClass::Trim => "trim",
            IoClass::Rebuild => "rebuild",
            IoClass::Initializing => "initializing",
        }
    }

    /// Background work yields to interactive I/O.
    pub fn is_background(self) -> bool {
        matches!(
            self,
            IoClass::Scrub | IoClass::Trim | IoClass::Rebuild | IoClass::Initializing
        )
    }
}

/// Minimum and maximum active I/Os of one class on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassLimits {
    pub min_active: u32,
    pub max_active: u32,
}

/// The queue's tunables. Defaults are for NVMe-class devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueTunables {
    /// Per class, in `IoClass::ALL` order.
    pub class_limits: [ClassLimits; CLASS_COUNT],
    /// Active I/Os per device, all classes together. NVMe devices take 1024+
    /// commands per queue; 256 keeps a client's QD64 x 4 jobs fully in flight while
    /// bounding the memory pinned by in-flight I/O.
    pub max_active_total: u32,
    /// Largest aggregated I/O. 1 MiB: past it this machine's virtual disk gains no
    /// bandwidth, and it bounds the latency one I/O can add to others.
    pub aggregation_limit_bytes: u32,
    /// Largest hole a read aggregate may bridge (the bytes are read and discarded).
    pub read_gap_limit_bytes: u32,
    /// Largest span of an aggregate including optional I/Os, which do not count
    /// against `aggregation_limit_bytes` (OpenZFS: 16 MiB).
    pub optional_span_limit_bytes: u32,
    /// Priority classes on (the default). Off: one FIFO in arrival order, only
    /// the per-device total applies — the baseline the classes are measured against.
    #[serde(default = "default_true")]
    pub classes: bool,
    /// Async (txg) writes get `min_active` slots below this much dirty data (as a
    /// percentage of the point that starts a commit) and `max_active` above
    /// `async_write_dirty_high_percent`, linearly in between (OpenZFS: 30/60).
    #[serde(default = "default_dirty_low")]
    pub async_write_dirty_low_percent: u32,
    #[serde(default = "default_dirty_high")]
    pub async_write_dirty_high_percent: u32,
    /// Most client writes active while client reads are queued or active: reads
    /// wait inside the device behind every write already there, so a deep write
    /// load is held to this many (larger, aggregated) writes while reads run.
    #[serde(default = "default_writes_under_reads")]
    pub sync_write_max_active_under_reads: u32,
}

fn default_writes_under_reads() -> u32 {
    8
}

fn default_true() -> bool {
    true
}
fn default_dirty_low() -> u32 {
    30
}
fn default_dirty_high() -> u32 {
    60
}

impl Default for QueueTunables {
    fn default() -> QueueTunables {
        let limits = |min_active, max_active| ClassLimits {
            min_active,
            max_active,
        };
        QueueTunables {
            class_limits: [
                limits(32, 256), // sync read
                limits(32, 256), // sync write
                limits(4, 64),   // async read
                limits(4, 32),   // async write: txg commits yield to clients' writes
                limits(2, 16),   // scrub
                limits(1, 8),    // trim
                limits(2, 16),   // rebuild
                limits(1, 4),    // initializing
            ],
            max_active_total: 256,
            aggregation_limit_bytes: 1024 * 1024,
            read_gap_limit_bytes: 32 * 1024,
            optional_span_limit_bytes: 16 * 1024 * 1024,
            classes: true,
            async_write_dirty_low_percent: 30,
            async_write_dirty_high_percent: 60,
            sync_write_max_active_under_reads: 8,
        }
    }
}

/// How an I/O may combine with others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoFlags {
    /// A pad write that exists only to fill a gap between two real writes.
    pub optional: bool,
    /// A repair write (self-heal, scrub repair, resilver).
    pub repair: bool,
    /// A scrub read (reads one specific copy).
    pub scrub: bool,
    /// A write durable when it completes (FUA, `RWF_DSYNC`): it needs no
    /// flush after it, so it does not count toward the next one. Only
    /// aggregated with other durable writes (a FUA aggregate would make a
    /// batch of ordinary writes pay for it).
    pub durable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Read = 0,
    Write = 1,
    /// A discard: never aggregated, never counted against the device's health.
    Trim = 2,
}

enum Payload {
    Read(AlignedBuf),
    Write(BufSlice),
    /// One request made of several consecutive buffers (a run of blocks'
    /// columns on this child, see `TopVdev::write_run`): written with one
    /// iovec each, never copied.
    Writev(Vec<BufSlice>),
    /// A discard of the request's range: no bytes.
    Trim,
}

enum Completion {
    Read(Result<AlignedBuf, DeviceError>),
    Write(Result<(), DeviceError>),
}

struct Pending {
    class: IoClass,
    direction: Direction,
    offset: u64,
    length: u64,
    flags: IoFlags,
    payload: Payload,
    reply: OneshotSender<Completion>,
    enqueued_ns: u64,
}

impl Pending {
    fn end(&self) -> u64 {
        self.offset + self.length
    }

    /// Buffers this request adds to a vectored device I/O.
    fn iovecs(&self) -> usize {
        match &self.payload {
            Payload::Writev(slices) => slices.len(),
            Payload::Read(_) | Payload::Write(_) => 1,
            Payload::Trim => 0,
        }
    }
}

struct State {
    next_id: u64,
    pending: rustc_hash::FxHashMap<u64, Pending>,
    fifo: [VecDeque<u64>; CLASS_COUNT],
    queued: [u32; CLASS_COUNT],
    by_offset: [BTreeSet<(u64, u64)>; 3],
    active: [u32; CLASS_COUNT],
    active_total: u32,
    round_robin_next: usize,
}

/// The queue of one leaf device.
pub struct VdevQueue {
    device: RefCell<Option<Rc<dyn Device>>>,
    state: RefCell<State>,
    tunables: RefCell<QueueTunables>,
    stats: RefCell<LeafStats>,
    dispatch_scheduled: Cell<bool>,
    /// How full the open txg is (percent of the point that starts a commit),
    /// set by the pool: scales the async write class.
    dirty_percent: Cell<u32>,
    /// The pool's event ring, once the pool wires it (failed I/Os and
    /// checksum mismatches are posted there, naming this device).
    events: RefCell<Option<Rc<EventLog>>>,
    /// Keeps a failing device from flooding the ring.
    event_rate: RateLimit,
    /// Writes completed on the device (successful or not), and how many of
    /// them the last successful flush covered (those completed before it
    /// was sent): when the two are equal the device's cache holds nothing
    /// of ours, and a flush is skipped.
    writes_completed: Cell<u64>,
    flushed_through: Cell<u64>,
}

/// An aggregate ready to issue: children in offset order.
struct Aggregate {
    class: IoClass,
    direction: Direction,
    offset: u64,
    children: Vec<Pending>,
}

impl VdevQueue {
    pub fn new(device: Option<Rc<dyn Device>>, tunables: QueueTunables) -> Rc<VdevQueue> {
        Rc::new(VdevQueue {
            device: RefCell::new(device),
            state: RefCell::new(State {
                next_id: 0,
                pending: Default::default(),
                fifo: Default::default(),
                queued: [0; CLASS_COUNT],
                by_offset: [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()],
                active: [0; CLASS_COUNT],
                active_total: 0,
                round_robin_next: 0,
            }),
            tunables: RefCell::new(tunables),
            stats: RefCell::new(LeafStats::new()),
            dispatch_scheduled: Cell::new(false),
            dirty_percent: Cell::new(0),
            events: RefCell::new(None),
            event_rate: RateLimit::default(),
            writes_completed: Cell::new(0),
            flushed_through: Cell::new(0),
        })
    }

    /// Where this leaf's failed I/Os and checksum mismatches are posted.
    pub fn set_events(&self, events: Rc<EventLog>) {
        *self.events.borrow_mut() = Some(events);
    }

    /// Posts an event about this device and the byte range `offset` +
    /// `length` (absolute on the device), within the device's rate limit.
    pub fn post_event(&self, class: EventClass, offset: u64, length: u64, detail: String) {
        let events = self.events.borrow();
        let Some(events) = events.as_ref() else {
            return;
        };
        if !self.event_rate.allow(rt::now().0) {
            events.note_suppressed(1);
            return;
        }
        let device = self.device().map_or_else(
            || "(no device)".to_string(),
            |device| device.info().path.clone(),
        );
        events.post(
            class,
            NewEvent {
                device: Some(device),
                offset: Some(offset),
                length: Some(length),
                vdev: None,
                detail,
            },
        );
    }

    /// Counts and posts bytes read from `offset` + `length` (absolute) that
    /// did not match their checksum.
    pub fn checksum_error(&self, offset: u64, length: u64, detail: &str) {
        self.count(|stats| stats.checksum_errors += 1);
        self.post_event(
            EventClass::ChecksumError,
            offset,
            length,
            detail.to_string(),
        );
    }

    pub fn device(&self) -> Option<Rc<dyn Device>> {
        self.device.borrow().clone()
    }

    pub fn set_device(&self, device: Option<Rc<dyn Device>>) {
        *self.device.borrow_mut() = device;
        // Whatever a new device holds, its first flush is sent.
        self.writes_completed.set(self.writes_completed.get() + 1);
    }

    pub fn set_tunables(&self, tunables: QueueTunables) {
        *self.tunables.borrow_mut() = tunables;
    }

    pub fn tunables(&self) -> QueueTunables {
        self.tunables.borrow().clone()
    }

    /// A snapshot of the statistics, with the time integrals brought up to now.
    pub fn stats(&self) -> LeafStats {
        let mut stats = self.stats.borrow_mut();
        stats.advance_clock(rt::now().0);
        let state = self.state.borrow();
        for class in IoClass::ALL {
            stats.class(class).queued = state.queued[class as usize] as u64;
            stats.class(class).active = state.active[class as usize] as u64;
        }
        stats.queued_total = state.queued.iter().map(|count| *count as u64).sum();
        stats.clone()
    }

    /// Tells the queue how full the open txg is (scales async writes).
    pub fn set_dirty_percent(&self, percent: u32) {
        self.dirty_percent.set(percent);
    }

    /// I/Os queued or active now (cheap: used on every mirror read).
    pub fn load(&self) -> u64 {
        let state = self.state.borrow();
        state.queued.iter().map(|count| *count as u64).sum::<u64>() + state.active_total as u64
    }

    /// Failed I/Os since the last success (cheap: checked on every routing
    /// decision).
    pub fn consecutive_errors(&self) -> u64 {
        self.stats.borrow().consecutive_errors
    }

    /// Forgets the failures that faulted the leaf (the operator put it back).
    pub fn reset_consecutive_errors(&self) {
        self.stats.borrow_mut().consecutive_errors = 0;
    }

    /// Forgets that a write was refused for lack of host space (`ironpool
    /// clear`: the operator says space is back; a new refusal sets it again).
    pub fn clear_host_full(&self) {
        self.stats.borrow_mut().host_full = false;
    }

    /// Starts the statistics over (a new device took the leaf's place). The
    /// clock integrals keep their reference time.
    pub fn reset_stats(&self) {
        let mut stats = self.stats.borrow_mut();
        let last_change_ns = stats.last_change_ns;
        let (active_total, active_requests) = (stats.active_total, stats.active_requests);
        *stats = LeafStats::new();
        stats.last_change_ns = last_change_ns;
        stats.active_total = active_total;
        stats.active_requests = active_requests;
    }

    /// Updates error and repair counters kept with the I/O statistics.
    pub fn count(&self, update: impl FnOnce(&mut LeafStats)) {
        update(&mut self.stats.borrow_mut());
    }

    /// Reads `length` bytes at absolute device offset `offset`.
    pub async fn read(
        self: &Rc<Self>,
        class: IoClass,
        offset: u64,
        length: u64,
        flags: IoFlags,
    ) -> Result<AlignedBuf, DeviceError> {
        let buffer = AlignedBuf::for_overwrite(length as usize);
        match self
            .enqueue(
                class,
                Direction::Read,
                offset,
                length,
                flags,
                Payload::Read(buffer),
            )
            .await
        {
            Completion::Read(result) => result,
            Completion::Write(_) => unreachable!("a read completed as a write"),
        }
    }

    /// Writes `data` at absolute device offset `offset`.
    pub async fn write(
        self: &Rc<Self>,
        class: IoClass,
        offset: u64,
        data: BufSlice,
        flags: IoFlags,
    ) -> Result<(), DeviceError> {
        let length = data.len() as u64;
        match self
            .enqueue(
                class,
                Direction::Write,
                offset,
                length,
                flags,
                Payload::Write(data),
            )
            .await
        {
            Completion::Write(result) => result,
            Completion::Read(_) => unreachable!("a write completed as a read"),
        }
    }

    /// Writes `slices`, one after another, at absolute device offset `offset`:
    /// one request (completed, aggregated and failed as a whole), at most
    /// `IOVEC_COUNT_MAX / 2` slices so that it always fits an aggregate.
    pub async fn writev(
        self: &Rc<Self>,
        class: IoClass,
        offset: u64,
        slices: Vec<BufSlice>,
        flags: IoFlags,
    ) -> Result<(), DeviceError> {
        assert!(
            !slices.is_empty() && slices.len() <= IOVEC_COUNT_MAX / 2,
            "a vectored write of {} slices",
            slices.len()
        );
        let length = slices.iter().map(|slice| slice.len() as u64).sum();
        match self
            .enqueue(
                class,
                Direction::Write,
                offset,
                length,
                flags,
                Payload::Writev(slices),
            )
            .await
        {
            Completion::Write(result) => result,
            Completion::Read(_) => unreachable!("a write completed as a read"),
        }
    }

    /// Discards `length` bytes at absolute device offset `offset`, in the
    /// trim class. Fails with [`DeviceError::Unsupported`] when the device
    /// has no discard; a failed discard never counts against the device's
    /// health (the space is free either way).
    pub async fn trim(self: &Rc<Self>, offset: u64, length: u64) -> Result<(), DeviceError> {
        match self
            .enqueue(
                IoClass::Trim,
                Direction::Trim,
                offset,
                length,
                IoFlags::default(),
                Payload::Trim,
            )
            .await
        {
            Completion::Write(result) => result,
            Completion::Read(_) => unreachable!("a trim completed as a read"),
        }
    }

    /// Flushes the device's write cache (not queued: a flush covers writes that
    /// completed before it, and callers only flush after their writes complete).
    ///
    /// Sent only when a write completed since the last flush was sent: a
    /// flush covers the writes completed before it, so one that finds
    /// none has nothing to make durable (a log commit or txg that wrote to
    /// other devices of the pool costs this one no cache flush).
    pub async fn flush(self: &Rc<Self>) -> Result<(), DeviceError> {
        let Some(device) = self.device() else {
            return Err(DeviceError::Missing);
        };
        let covers = self.writes_completed.get();
        if covers == self.flushed_through.get() {
            self.stats.borrow_mut().flushes_skipped += 1;
            return Ok(());
        }
        let result = device.flush().await;
        self.stats.borrow_mut().flush_ops += 1;
        if result.is_ok() && covers > self.flushed_through.get() {
            self.flushed_through.set(covers);
        }
        result
    }

    async fn enqueue(
        self: &Rc<Self>,
        class: IoClass,
        direction: Direction,
        offset: u64,
        length: u64,
        flags: IoFlags,
        payload: Payload,
    ) -> Completion {
        if self.device.borrow().is_none() {
            return match direction {
                Direction::Read => Completion::Read(Err(DeviceError::Missing)),
                Direction::Write | Direction::Trim => Completion::Write(Err(DeviceError::Missing)),
            };
        }
        let (reply, receiver) = oneshot();
        {
            let mut state = self.state.borrow_mut();
            let id = state.next_id;
            state.next_id += 1;
            state.pending.insert(
                id,
                Pending {
                    class,
                    direction,
                    offset,
                    length,
                    flags,
                    payload,
                    reply,
                    enqueued_ns: rt::now().0,
                },
            );
            state.fifo[class as usize].push_back(id);
            state.queued[class as usize] += 1;
            state.by_offset[direction as usize].insert((offset, id));
        }
        {
            let mut stats = self.stats.borrow_mut();
            match direction {
                Direction::Read => {
                    stats.read_requests += 1;
                    stats.read_request_sizes.record(length);
                }
                Direction::Write => {
                    stats.write_requests += 1;
                    stats.write_request_sizes.record(length);
                }
                Direction::Trim => {}
            }
        }
        self.kick();
        match receiver.await {
            Some(completion) => completion,
            // The queue was torn down (pool export or crash) with the I/O queued.
            None => match direction {
                Direction::Read => Completion::Read(Err(DeviceError::Missing)),
                Direction::Write | Direction::Trim => Completion::Write(Err(DeviceError::Missing)),
            },
        }
    }

    /// Schedules a dispatch for the end of this round of the loop: after every
    /// task of the round has queued its I/Os (so that neighbours aggregate),
    /// before the loop's turn submits (so that they reach the devices now).
    fn kick(self: &Rc<Self>) {
        if self.dispatch_scheduled.replace(true) {
            return;
        }
        let queue = self.clone();
        rt::spawn_at_round_end(async move {
            queue.dispatch_scheduled.set(false);
            queue.dispatch();
        });
    }

    /// Issues I/Os while the limits allow.
    fn dispatch(self: &Rc<Self>) {
        loop {
            let aggregate = {
                let mut state = self.state.borrow_mut();
                let tunables = self.tunables.borrow();
                if state.active_total >= tunables.max_active_total {
                    return;
                }
                let Some(class) = choose_class(&state, &tunables, self.dirty_percent.get()) else {
                    return;
                };
                let Some(head) = pop_head(&mut state, class) else {
                    continue;
                };
                build_aggregate(&mut state, &tunables, class, head)
            };
            match aggregate {
                Some(aggregate) => self.issue(aggregate),
                // A lone optional I/O was dropped; keep dispatching.
                None => self.stats.borrow_mut().optional_dropped += 1,
            }
        }
    }

    fn issue(self: &Rc<Self>, aggregate: Aggregate) {
        let now = rt::now().0;
        {
            let mut state = self.state.borrow_mut();
            state.active[aggregate.class as usize] += 1;
            state.active_total += 1;
            let mut stats = self.stats.borrow_mut();
            stats.advance_clock(now);
            stats.active_total = state.active_total as u64;
            stats.active_requests += aggregate.children.len() as u64;
            for child in &aggregate.children {
                stats
                    .class(child.class)
                    .queue_latency_ns
                    .record(now.saturating_sub(child.enqueued_ns));
            }
        }
        let queue = self.clone();
        // Polled in this round too: its first poll hands the I/O to the device.
        rt::spawn_at_round_end(async move {
            let class = aggregate.class;
            let requests = aggregate.children.len() as u64;
            queue.execute(aggregate, now).await;
            let mut state = queue.state.borrow_mut();
            state.active[class as usize] -= 1;
            state.active_total -= 1;
            let mut stats = queue.stats.borrow_mut();
            stats.advance_clock(rt::now().0);
            stats.active_total = state.active_total as u64;
            stats.active_requests -= requests;
            drop(stats);
            drop(state);
            queue.kick();
        });
    }

    async fn execute(self: &Rc<Self>, aggregate: Aggregate, issued_ns: u64) {
        let Some(device) = self.device() else {
            for child in aggregate.children {
                complete(child, Err(DeviceError::Missing), self, issued_ns);
            }
            return;
        };
        let total: u64 = aggregate
            .children
            .last()
            .map(|last| last.end() - aggregate.offset)
            .unwrap_or(0);
        {
            let mut stats = self.stats.borrow_mut();
            match aggregate.direction {
                Direction::Read => {
                    stats.read_ops += 1;
                    stats.read_bytes += total;
                    stats.read_device_sizes.record(total);
                }
                Direction::Write => {
                    stats.write_ops += 1;
                    stats.write_bytes += total;
                    stats.write_device_sizes.record(total);
                }
                Direction::Trim => {
                    stats.trim_ops += 1;
                    stats.trim_bytes += total;
                }
            }
        }
        let child_count = aggregate.children.len();
        let (result, mut children) = run_device_io(
            &*device,
            aggregate.direction,
            aggregate.offset,
            aggregate.children,
        )
        .await;
        if result.is_err() && child_count > 1 {
            // Find out which children really fail: retry each on its own, so one
            // bad sector does not fail its neighbours.
            for child in children {
                let offset = child.offset;
                let (result, mut alone) =
                    run_device_io(&*device, child_direction(&child), offset, vec![child]).await;
                let child = alone.pop().expect("one child back");
                complete(child, result, self, issued_ns);
            }
            return;
        }
        for child in children.drain(..) {
            complete(child, result.clone(), self, issued_ns);
        }
    }
}

fn child_direction(child: &Pending) -> Direction {
    child.direction
}

/// Performs one device I/O for children (contiguous or with read gaps) and hands
/// the children back with their payloads.
async fn run_device_io(
    device: &dyn Device,
    direction: Direction,
    offset: u64,
    mut children: Vec<Pending>,
) -> (Result<(), DeviceError>, Vec<Pending>) {
    match direction {
        Direction::Trim => {
            let length = children.iter().map(|child| child.length).sum();
            let result = device.trim(offset, length).await;
            (result, children)
        }
        Direction::Write => {
            // Aggregates hold durable writes only or none (see `compatible`).
            let durable = children.iter().any(|child| child.flags.durable);
            let mut slices: Vec<BufSlice> =
                Vec::with_capacity(children.iter().map(Pending::iovecs).sum());
            for child in &children {
                match &child.payload {
                    Payload::Write(slice) => slices.push(slice.clone()),
                    Payload::Writev(run) => slices.extend(run.iter().cloned()),
                    Payload::Read(_) | Payload::Trim => {
                        unreachable!("a read or trim in a write aggregate")
                    }
                }
            }
            let result = device.write(offset, slices, durable).await;
            (result, children)
        }
        Direction::Read => {
            // Buffers in order: each child's own, with scratch buffers for gaps.
            let mut buffers = Vec::with_capacity(children.len() * 2);
            let mut is_gap = Vec::with_capacity(children.len() * 2);
            let mut position = offset;
            for child in children.iter_mut() {
                if child.offset > position {
                    buffers.push(AlignedBuf::for_overwrite(
                        (child.offset - position) as usize,
                    ));
                    is_gap.push(true);
                }
                let buffer = match std::mem::replace(
                    &mut child.payload,
                    Payload::Read(AlignedBuf::zeroed(0)),
                ) {
                    Payload::Read(buffer) => buffer,
                    Payload::Write(_) | Payload::Writev(_) | Payload::Trim => {
                        unreachable!("a write or trim in a read aggregate")
                    }
                };
                buffers.push(buffer);
                is_gap.push(false);
                position = child.end();
            }
            let (result, buffers) = device.read(offset, buffers).await;
            let mut own = buffers
                .into_iter()
                .zip(is_gap)
                .filter(|(_, gap)| !gap)
                .map(|(buffer, _)| buffer);
            for child in children.iter_mut() {
                child.payload = Payload::Read(own.next().expect("a buffer per child"));
            }
            (result, children)
        }
    }
}

fn complete(child: Pending, result: Result<(), DeviceError>, queue: &VdevQueue, issued_ns: u64) {
    let now = rt::now().0;
    let mut event = None;
    {
        let mut stats = queue.stats.borrow_mut();
        match &result {
            // A full host filesystem is not the device failing: reads still
            // work, and writes do again once space is freed.
            // A discard that failed leaves free space as it was: the device
            // serves reads and writes as before.
            Err(DeviceError::Unsupported { .. }) => {}
            Err(_) if child.direction == Direction::Trim => stats.trim_errors += 1,
            Err(error) if error.is_no_space() => {
                stats.no_space_errors += 1;
                if !stats.host_full {
                    // Once per episode, naming the device and the cause.
                    eprintln!("ironpool: {error}");
                    event = Some((EventClass::DeviceFull, error.to_string()));
                }
                stats.host_full = true;
            }
            Err(error) => {
                let what = match child.direction {
                    Direction::Read => {
                        stats.read_errors += 1;
                        "read"
                    }
                    Direction::Write | Direction::Trim => {
                        stats.write_errors += 1;
                        "write"
                    }
                };
                stats.consecutive_errors += 1;
                event = Some((EventClass::IoError, format!("{what} failed: {error}")));
            }
            // host_full stays set until `ironpool clear`: writes over space the
            // host filesystem had already given the file succeed while it is
            // full, so a success says nothing about the next write.
            Ok(()) if child.direction == Direction::Trim => {}
            Ok(()) => stats.consecutive_errors = 0,
        }
        let class_stats = stats.class(child.class);
        class_stats.completed_requests += 1;
        class_stats.completed_bytes += child.length;
        class_stats
            .total_latency_ns
            .record(now.saturating_sub(child.enqueued_ns));
        class_stats
            .device_latency_ns
            .record(now.saturating_sub(issued_ns));
    }
    if child.direction == Direction::Write {
        if child.flags.durable {
            queue.stats.borrow_mut().durable_write_ops += 1;
        } else {
            // A flush from now on has this write to make durable.
            queue.writes_completed.set(queue.writes_completed.get() + 1);
        }
    }
    if let Some((class, detail)) = event {
        queue.post_event(class, child.offset, child.length, detail);
    }
    let completion = match child.payload {
        Payload::Read(buffer) => Completion::Read(result.map(|()| buffer)),
        Payload::Write(_) | Payload::Writev(_) | Payload::Trim => Completion::Write(result),
    };
    child.reply.send(completion);
}

/// Which class to issue from next, or None if nothing may be issued.
fn choose_class(state: &State, tunables: &QueueTunables, dirty_percent: u32) -> Option<IoClass> {
    if !tunables.classes {
        return oldest_class(state);
    }
    let interactive_busy = IoClass::ALL
        .iter()
        .filter(|class| !class.is_background())
        .any(|class| state.queued[*class as usize] > 0 || state.active[*class as usize] > 0);
    let reading = state.queued[IoClass::SyncRead as usize] > 0
        || state.active[IoClass::SyncRead as usize] > 0;
    let max_for = |class: IoClass| {
        let limits = tunables.class_limits[class as usize];
        if class.is_background() && interactive_busy {
            limits.min_active.min(limits.max_active)
        } else if class == IoClass::SyncWrite && reading {
            limits
                .max_active
                .min(tunables.sync_write_max_active_under_reads.max(1))
        } else if class == IoClass::AsyncWrite {
            async_write_max(limits, dirty_percent, tunables)
        } else {
            limits.max_active
        }
    };
    // Pass 1: round robin, the first class below its minimum.
    for step in 0..CLASS_COUNT {
        let class = IoClass::ALL[(state.round_robin_next + step) % CLASS_COUNT];
        let limits = tunables.class_limits[class as usize];
        if state.queued[class as usize] > 0
            && state.active[class as usize] < limits.min_active.min(max_for(class))
        {
            return Some(class);
        }
    }
    // Pass 2: priority order, the first class below its maximum.
    IoClass::ALL.into_iter().find(|class| {
        state.queued[*class as usize] > 0 && state.active[*class as usize] < max_for(*class)
    })
}

/// Async write slots by dirty data: `min_active` up to the low mark, `max_active`
/// from the high mark, linear in between.
fn async_write_max(limits: ClassLimits, dirty_percent: u32, tunables: &QueueTunables) -> u32 {
    let (low, high) = (
        tunables.async_write_dirty_low_percent,
        tunables
            .async_write_dirty_high_percent
            .max(tunables.async_write_dirty_low_percent + 1),
    );
    if dirty_percent <= low {
        return limits.min_active;
    }
    if dirty_percent >= high {
        return limits.max_active;
    }
    let span = (limits.max_active - limits.min_active.min(limits.max_active)) as u64;
    limits.min_active + (span * (dirty_percent - low) as u64 / (high - low) as u64) as u32
}

/// With classes off: the class whose oldest queued I/O arrived first.
fn oldest_class(state: &State) -> Option<IoClass> {
    IoClass::ALL
        .into_iter()
        .filter(|class| state.queued[*class as usize] > 0)
        .filter_map(|class| {
            state.fifo[class as usize]
                .iter()
                .find(|id| state.pending.contains_key(id))
                .map(|id| (*id, class))
        })
        .min()
        .map(|(_, class)| class)
}

/// Takes the oldest queued I/O of `class` (skipping ids already aggregated).
fn pop_head(state: &mut State, class: IoClass) -> Option<u64> {
    state.round_robin_next = (class as usize + 1) % CLASS_COUNT;
    while let Some(id) = state.fifo[class as usize].pop_front() {
        if state.pending.contains_key(&id) {
            return Some(id);
        }
    }
    // The count said there was one; the FIFO disagrees: repair the count.
    state.queued[class as usize] = 0;
    None
}

fn compatible(a: &Pending, b: &Pending) -> bool {
    a.direction == b.direction
        && a.direction != Direction::Trim
        && a.flags.repair == b.flags.repair
        && a.flags.scrub == b.flags.scrub
        && a.flags.durable == b.flags.durable
}

/// Grows an aggregate around `head` and removes its members from the queue.
/// Returns None when `head` was a lone optional I/O (completed without I/O).
fn build_aggregate(
    state: &mut State,
    tunables: &QueueTunables,
    class: IoClass,
    head_id: u64,
) -> Option<Aggregate> {
    let head = &state.pending[&head_id];
    let direction = head.direction;
    let gap_limit = if direction == Direction::Read {
        tunables.read_gap_limit_bytes as u64
    } else {
        0
    };
    let limit = tunables.aggregation_limit_bytes as u64;
    let optional_limit = tunables.optional_span_limit_bytes as u64;
    let tree = &state.by_offset[direction as usize];
    let (mut first_offset, mut last_end) = (head.offset, head.end());
    // Bytes counted against the limit: everything but optional I/Os (pads ride
    // along for free; only the total span is capped).
    let mut required = if head.flags.optional { 0 } else { head.length };
    let mut members: VecDeque<u64> = VecDeque::from([head_id]);
    // Buffers of the device I/O: each member's, plus one per read gap.
    let mut buffers = head.iovecs();
    // Walk backwards.
    for &(_, id) in tree.range(..(head.offset, head_id)).rev() {
        let candidate = &state.pending[&id];
        let gap = first_offset.saturating_sub(candidate.end());
        let added = gap
            + if candidate.flags.optional {
                0
            } else {
                candidate.length
            };
        let span = last_end - candidate.offset;
        if candidate.end() > first_offset
            || gap > gap_limit
            || !compatible(candidate, head)
            || required + added > limit
            || span > optional_limit
        {
            break;
        }
        let more = candidate.iovecs() + usize::from(gap > 0);
        if buffers + more > IOVEC_COUNT_MAX {
            break;
        }
        buffers += more;
        required += added;
        first_offset = candidate.offset;
        members.push_front(id);
    }
    // Walk forwards.
    for &(_, id) in tree.range((head.offset, head_id + 1)..) {
        let candidate = &state.pending[&id];
        let gap = candidate.offset.saturating_sub(last_end);
        let added = gap
            + if candidate.flags.optional {
                0
            } else {
                candidate.length
            };
        let span = candidate.end().saturating_sub(first_offset);
        if candidate.offset < last_end
            || gap > gap_limit
            || !compatible(candidate, head)
            || required + added > limit
            || span > optional_limit
        {
            break;
        }
        let more = candidate.iovecs() + usize::from(gap > 0);
        if buffers + more > IOVEC_COUNT_MAX {
            break;
        }
        buffers += more;
        required += added;
        last_end = candidate.end();
        members.push_back(id);
    }
    // Optional I/Os never begin or end an aggregate.
    while members.len() > 1
        && state.pending[members.front().expect("non-empty")]
            .flags
            .optional
    {
        members.pop_front();
    }
    while members.len() > 1
        && state.pending[members.back().expect("non-empty")]
            .flags
            .optional
    {
        members.pop_back();
    }
    // An optional head trimmed off an end stays queued, as its other trimmed
    // neighbours do: back at the front of its FIFO (which it was popped from),
    // or it would sit in the queue with nothing left to dispatch it, and its
    // writer would wait forever. Each such turn issues the required I/Os it
    // was trimmed from, so dispatch still progresses.
    if !members.contains(&head_id) {
        state.fifo[class as usize].push_front(head_id);
    }
    let mut children = Vec::with_capacity(members.len());
    for id in members {
        let pending = state.pending.remove(&id).expect("member is pending");
        state.by_offset[direction as usize].remove(&(pending.offset, id));
        state.queued[pending.class as usize] -= 1;
        children.push(pending);
    }
    if children.len() == 1 && children[0].flags.optional {
        let child = children.pop().expect("one child");
        let completion = match child.payload {
            Payload::Read(buffer) => Completion::Read(Ok(buffer)),
            Payload::Write(_) | Payload::Writev(_) | Payload::Trim => Completion::Write(Ok(())),
        };
        child.reply.send(completion);
        return None;
    }
    let offset = children[0].offset;
    Some(Aggregate {
        class,
        direction,
        offset,
        children,
    })
}

#[cfg(test)]
mod tests;
