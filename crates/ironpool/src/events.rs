//! The pool's event ring: what happened to the pool and its devices, with
//! times, for `ironpool events` (as OpenZFS's `zpool events`).
//!
//! Every layer that sees something an operator must hear about posts here:
//! the leaf queues post failed I/Os and checksum mismatches (naming the
//! device and the range), the pool posts device state changes, scans
//! starting and ending, and a suspended or resumed pool. The ring lives in
//! memory only, like the kernel's zevent list: what must survive a restart
//! is in `status` (device errors, the last scrub) and in the history.
//!
//! Bounded twice over: the ring keeps the newest [`EVENTS_MAX`] events, and a
//! failing device posts at most [`DEVICE_EVENTS_PER_SECOND`] a second (a dead
//! disk under load fails thousands of I/Os a second; the first ones say all
//! there is to say, and the rest would push every other event out). What a
//! limit drops is counted, never silently lost.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::rt::sync::Notify;

/// Events kept: the newest this many. 1024 is hours of a sick pool at the
/// device rate limit's pace once deduplicated by that limit, and about
/// 300 KiB of memory at most.
pub const EVENTS_MAX: usize = 1024;

/// Device error events (I/O and checksum) one device posts per second at
/// most; the rest are counted as suppressed (OpenZFS rate-limits its
/// checksum and delay events per vdev the same way, at 20 a second).
pub const DEVICE_EVENTS_PER_SECOND: u32 = 20;

/// Text of an event's detail is cut to this many bytes (an error message
/// carries a path and an OS error; nothing longer is useful in a ring).
pub const EVENT_DETAIL_BYTES_MAX: usize = 512;

/// What an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventClass {
    /// A read or write failed on a device.
    IoError,
    /// A device returned bytes whose checksum does not match the block
    /// pointer's (the pool repaired them from another copy when it could).
    ChecksumError,
    /// A block no copy of which could be read or rebuilt: data is lost.
    DataError,
    /// The filesystem holding a device file is full.
    DeviceFull,
    /// A device went online, offline, faulted, missing or was replaced.
    DeviceState,
    ScrubStart,
    ScrubFinish,
    ResilverStart,
    ResilverFinish,
    TrimStart,
    TrimFinish,
    /// Writing a txg failed: the pool stops accepting changes and retries.
    PoolSuspended,
    /// A txg that had failed was written: the pool accepts changes again.
    PoolResumed,
    /// The pool was imported (the first event of every server's ring).
    PoolImport,
    /// The pool was created.
    PoolCreate,
}

impl EventClass {
    /// Every class, in the order the metrics list them.
    pub const ALL: [EventClass; 15] = [
        EventClass::IoError,
        EventClass::ChecksumError,
        EventClass::DataError,
        EventClass::DeviceFull,
        EventClass::DeviceState,
        EventClass::ScrubStart,
        EventClass::ScrubFinish,
        EventClass::ResilverStart,
        EventClass::ResilverFinish,
        EventClass::TrimStart,
        EventClass::TrimFinish,
        EventClass::PoolSuspended,
        EventClass::PoolResumed,
        EventClass::PoolImport,
        EventClass::PoolCreate,
    ];

    /// The name `events` prints and `--json` carries.
    pub fn name(self) -> &'static str {
        match self {
            EventClass::IoError => "io_error",
            EventClass::ChecksumError => "checksum_error",
            EventClass::DataError => "data_error",
            EventClass::DeviceFull => "device_full",
            EventClass::DeviceState => "device_state",
            EventClass::ScrubStart => "scrub_start",
            EventClass::ScrubFinish => "scrub_finish",
            EventClass::ResilverStart => "resilver_start",
            EventClass::ResilverFinish => "resilver_finish",
            EventClass::TrimStart => "trim_start",
            EventClass::TrimFinish => "trim_finish",
            EventClass::PoolSuspended => "pool_suspended",
            EventClass::PoolResumed => "pool_resumed",
            EventClass::PoolImport => "pool_import",
            EventClass::PoolCreate => "pool_create",
        }
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Numbers events from 1 in the order they were posted: a follower asks
    /// for those after the last it saw.
    pub seq: u64,
    /// Wall-clock time it was posted, nanoseconds since the Unix epoch.
    pub time_unix_ns: u64,
    pub class: EventClass,
    /// The device concerned (its path), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The byte range concerned on that device (from its start, labels
    /// included) or, for a data error, the block's address in its vdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// The block's vdev, for events about a block rather than a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdev: Option<u32>,
    /// What happened, in words (an error message, "ONLINE -> FAULTED", a
    /// scan's figures).
    pub detail: String,
}

/// An event being posted: everything but its number and time.
#[derive(Clone, Debug, Default)]
pub struct NewEvent {
    pub device: Option<String>,
    pub offset: Option<u64>,
    pub length: Option<u64>,
    pub vdev: Option<u32>,
    pub detail: String,
}

impl NewEvent {
    /// An event with only words.
    pub fn detail(detail: impl Into<String>) -> NewEvent {
        NewEvent {
            detail: detail.into(),
            ..NewEvent::default()
        }
    }

    /// An event about `device`.
    pub fn device(device: impl Into<String>, detail: impl Into<String>) -> NewEvent {
        NewEvent {
            device: Some(device.into()),
            detail: detail.into(),
            ..NewEvent::default()
        }
    }
}

/// Events after a given number, as [`EventLog::since`] returns them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventBatch {
    pub events: Vec<Event>,
    /// The number to ask for next (the last event's, or the one asked with).
    pub last_seq: u64,
    /// Events posted after the one asked for that the ring no longer holds
    /// (a follower that fell behind by more than [`EVENTS_MAX`]).
    pub missed: u64,
    /// Device error events the rate limit suppressed since the pool was
    /// imported.
    pub suppressed: u64,
}

/// The ring (see the module).
#[derive(Default)]
pub struct EventLog {
    ring: RefCell<VecDeque<Event>>,
    next_seq: Cell<u64>,
    suppressed: Cell<u64>,
    /// Events posted per class (in [`EventClass::ALL`]'s order) since the
    /// pool was opened, dropped from the ring or not: what a metrics alert
    /// counts.
    posted_by_class: RefCell<[u64; EventClass::ALL.len()]>,
    posted: Notify,
}

impl EventLog {
    pub fn new() -> EventLog {
        EventLog {
            next_seq: Cell::new(1),
            ..EventLog::default()
        }
    }

    /// Adds an event, dropping the oldest when the ring is full, and wakes
    /// followers.
    pub fn post(&self, class: EventClass, event: NewEvent) {
        let seq = self.next_seq.get().max(1);
        self.next_seq.set(seq + 1);
        let mut detail = event.detail;
        if detail.len() > EVENT_DETAIL_BYTES_MAX {
            let mut cut = EVENT_DETAIL_BYTES_MAX;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        let mut ring = self.ring.borrow_mut();
        if ring.len() == EVENTS_MAX {
            ring.pop_front();
        }
        ring.push_back(Event {
            seq,
            time_unix_ns: crate::rt::wall_clock_ns(),
            class,
            device: event.device,
            offset: event.offset,
            length: event.length,
            vdev: event.vdev,
            detail,
        });
        drop(ring);
        if let Some(index) = EventClass::ALL.iter().position(|each| *each == class) {
            self.posted_by_class.borrow_mut()[index] += 1;
        }
        self.posted.notify_all();
    }

    /// Events posted per class since the pool was opened.
    pub fn counts(&self) -> Vec<(EventClass, u64)> {
        let counts = self.posted_by_class.borrow();
        EventClass::ALL
            .iter()
            .copied()
            .zip(counts.iter().copied())
            .collect()
    }

    /// Device events a rate limit did not post since the pool was opened.
    pub fn suppressed(&self) -> u64 {
        self.suppressed.get()
    }

    /// Counts a device event a rate limit did not post.
    pub fn note_suppressed(&self, count: u64) {
        self.suppressed.set(self.suppressed.get() + count);
    }

    /// The events numbered after `after`, at most `limit` of them, oldest
    /// first.
    pub fn since(&self, after: u64, limit: usize) -> EventBatch {
        let ring = self.ring.borrow();
        let first_held = ring.front().map_or(self.next_seq.get(), |event| event.seq);
        let missed = first_held.saturating_sub(after + 1);
        let events: Vec<Event> = ring
            .iter()
            .filter(|event| event.seq > after)
            .take(limit)
            .cloned()
            .collect();
        EventBatch {
            // With nothing returned, everything up to the newest was seen or
            // is gone; a number from the future (a server that restarted)
            // comes back as the newest too, so its follower starts over.
            last_seq: events
                .last()
                .map_or(self.next_seq.get().max(1) - 1, |event| event.seq),
            events,
            missed,
            suppressed: self.suppressed.get(),
        }
    }

    /// Waits until an event numbered after `after` exists (returns at once
    /// if one does, or if `after` was never posted: a number from before a
    /// restart).
    pub async fn wait_after(&self, after: u64) {
        loop {
            let notified = self.posted.notified();
            let next = self.next_seq.get().max(1);
            if next != after + 1 {
                return;
            }
            notified.await;
        }
    }
}

/// The per-device rate limit (see [`DEVICE_EVENTS_PER_SECOND`]): one per
/// leaf queue.
#[derive(Default)]
pub struct RateLimit {
    /// The second (of the runtime's clock) the count is for, and the count.
    window: Cell<(u64, u32)>,
}

impl RateLimit {
    /// True when an event may be posted at `now_ns`; counts it.
    pub fn allow(&self, now_ns: u64) -> bool {
        let second = now_ns / 1_000_000_000;
        let (window, count) = self.window.get();
        let count = if window == second { count } else { 0 };
        if count >= DEVICE_EVENTS_PER_SECOND {
            self.window.set((second, count));
            return false;
        }
        self.window.set((second, count + 1));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(log: &EventLog, count: usize) {
        for index in 0..count {
            log.post(
                EventClass::IoError,
                NewEvent::device("d0", format!("error {index}")),
            );
        }
    }

    #[test]
    fn followers_get_what_came_after_their_last_event() {
        let log = EventLog::new();
        post(&log, 3);
        let batch = log.since(0, usize::MAX);
        assert_eq!(batch.events.len(), 3);
        assert_eq!(batch.last_seq, 3);
        assert_eq!(batch.missed, 0);
        let batch = log.since(2, usize::MAX);
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].detail, "error 2");
        let batch = log.since(3, usize::MAX);
        assert!(batch.events.is_empty());
        assert_eq!(batch.last_seq, 3);
    }

    #[test]
    fn the_ring_keeps_the_newest_and_counts_what_a_follower_missed() {
        let log = EventLog::new();
        post(&log, EVENTS_MAX + 10);
        let batch = log.since(0, usize::MAX);
        assert_eq!(batch.events.len(), EVENTS_MAX);
        assert_eq!(batch.events[0].seq, 11);
        // Counted whether or not the ring still holds them.
        let io_errors = log.counts()[0];
        assert_eq!(io_errors, (EventClass::IoError, (EVENTS_MAX + 10) as u64));
        assert_eq!(batch.missed, 10);
        assert_eq!(batch.last_seq, (EVENTS_MAX + 10) as u64);
        let batch = log.since(5, 2);
        assert_eq!(batch.missed, 5);
        assert_eq!(batch.events.len(), 2);
        assert_eq!(batch.last_seq, 12);
    }

    #[test]
    fn long_details_are_cut_on_a_character_boundary() {
        let log = EventLog::new();
        log.post(EventClass::IoError, NewEvent::detail("é".repeat(400)));
        let batch = log.since(0, 1);
        assert!(batch.events[0].detail.len() <= EVENT_DETAIL_BYTES_MAX);
        assert!(batch.events[0].detail.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_device_posts_at_most_its_rate_a_second() {
        let limit = RateLimit::default();
        let allowed = (0..100).filter(|_| limit.allow(5_000_000_000)).count();
        assert_eq!(allowed, DEVICE_EVENTS_PER_SECOND as usize);
        assert!(limit.allow(6_000_000_000));
    }
}
