//! Trim: telling the devices which space holds nothing (discard), so a
//! sparse device file gives the space back to its filesystem, and an SSD or
//! a thin volume to its own pool.
//!
//! Two ways, as in OpenZFS:
//! - **autotrim** (pool property, default off): when a commit makes frees
//!   allocatable again (past the defer window, so no uberblock a rewind could
//!   reach refers to them), the extents of at least
//!   [`TRIM_EXTENT_BYTES_MIN`](crate::alloc::TRIM_EXTENT_BYTES_MIN) are held
//!   out of allocation, discarded in the background in the queue's trim
//!   class, and then become allocatable.
//! - **`ironpool trim POOL`**: every free extent of that size, metaslab by
//!   metaslab, with progress and an ETA; `-s` stops it.
//!
//! A range is never allocatable while its discard is in flight, so no block
//! can be written where a discard may land after it. A discard the device
//! loses in a crash leaves free space as it was; one it keeps zeroes only
//! free space. A device that cannot discard is reported once and skipped.

use std::rc::Rc;

use serde::Serialize;

use crate::alloc::TrimExtent;
use crate::events::{EventClass, NewEvent};
use crate::pool::scan::scrub::unix_seconds;
use crate::pool::scan::{eta_seconds, progress_percent};
use crate::pool::{Pool, PoolError};
use crate::rt::{self, Instant, JoinHandle};

/// Discards in flight per pool: each holds its range out of allocation, and
/// the trim class already lets only a few per device reach it.
const TRIMS_IN_FLIGHT: usize = 16;

/// Where a trim of all free space is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum TrimPhase {
    #[default]
    Idle,
    Running,
    /// `trim -s`, or the pool is being exported.
    Stopping,
}

/// Autotrim's queue and a trim of all free space.
#[derive(Default)]
pub struct TrimState {
    autotrim_task: Option<JoinHandle<()>>,
    /// Export: autotrim stops taking extents.
    shut: bool,
    /// Since import: extents autotrim discarded, and the device bytes.
    autotrim_extents: u64,
    autotrim_bytes: u64,
    phase: TrimPhase,
    started_unix_seconds: u64,
    finished_unix_seconds: u64,
    started: Option<Instant>,
    /// Free bytes when the trim of all free space began, and those of the
    /// metaslabs it has been through.
    total_bytes: u64,
    examined_bytes: u64,
    /// Device bytes it discarded.
    trimmed_bytes: u64,
    /// It went through every metaslab.
    completed: bool,
    task: Option<JoinHandle<()>>,
}

/// What `status` shows about trims.
#[derive(Clone, Debug, Serialize)]
pub struct TrimStatus {
    /// The pool's autotrim property.
    pub autotrim: bool,
    /// Of the last `ironpool trim`: "trimming", "finished", "stopped" or "none".
    pub state: &'static str,
    pub started_unix_seconds: u64,
    pub finished_unix_seconds: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub progress_percent: f64,
    /// Estimated seconds to the end (none before any progress).
    pub eta_seconds: Option<u64>,
    pub trimmed_bytes: u64,
    /// Since import.
    pub autotrim_extents: u64,
    pub autotrim_trimmed_bytes: u64,
    /// Autotrim has freed space still to discard.
    pub autotrim_pending: bool,
    /// Autotrim's discards are running.
    pub autotrim_running: bool,
    /// Devices that said they cannot discard.
    pub unsupported_devices: Vec<String>,
}

impl Pool {
    /// The pool's `autotrim` property: off unless set on. Off by default,
    /// as in OpenZFS: measured with perf-table.sh on a mirror of two files,
    /// the discards cost random 16K overwrites 20% (write-back on) to 40%
    /// (write-back off) of their IOPS, against the raw file in the same run.
    pub fn autotrim(&self) -> bool {
        self.datasets
            .directory
            .read()
            .properties
            .get("autotrim")
            .is_some_and(|value| value == "on")
    }

    /// After a commit: discards in the background what it made allocatable
    /// (noted by the allocator), unless autotrim is off or runs already.
    pub(in crate::pool) fn start_autotrim(self: &Rc<Self>) {
        if !self.autotrim() {
            self.store.allocator.borrow_mut().clear_pending_trims();
            return;
        }
        let mut state = self.scans.trim.borrow_mut();
        if state.shut
            || state.autotrim_task.is_some()
            || !self.store.allocator.borrow().has_pending_trims()
        {
            return;
        }
        let pool = self.clone();
        state.autotrim_task = Some(rt::spawn(async move { pool.autotrim_run().await }));
    }

    async fn autotrim_run(self: Rc<Self>) {
        loop {
            let batch = if self.scans.trim.borrow().shut || !self.autotrim() {
                Vec::new()
            } else {
                self.store
                    .allocator
                    .borrow_mut()
                    .take_pending_trims(TRIMS_IN_FLIGHT)
            };
            if batch.is_empty() {
                // Done, or no room to hold anything out now (a pool nearly
                // full): the notes stay for the next commit to try.
                self.scans.trim.borrow_mut().autotrim_task = None;
                return;
            }
            let count = batch.len() as u64;
            let bytes = self.trim_extents(batch).await;
            let mut state = self.scans.trim.borrow_mut();
            state.autotrim_extents += count;
            state.autotrim_bytes += bytes;
        }
    }

    /// Discards `extents` (held out of allocation) and makes each
    /// allocatable once its discard ended. Returns the device bytes
    /// discarded.
    async fn trim_extents(self: &Rc<Self>, extents: Vec<TrimExtent>) -> u64 {
        let discards = extents.iter().map(|extent| async move {
            let top = &self.store.vdevs()[extent.vdev as usize];
            let bytes = top.trim(extent.start, extent.end - extent.start).await;
            self.store.allocator.borrow_mut().trim_done(*extent);
            self.scans.trims_ended.notify_all();
            bytes
        });
        futures_util::future::join_all(discards)
            .await
            .into_iter()
            .sum()
    }

    /// Completes once a discard of free space ends after the call (its
    /// space allocatable again).
    pub(in crate::pool) fn trim_ended(&self) -> crate::rt::sync::Notified<'_> {
        self.scans.trims_ended.notified()
    }

    /// Commits until what was freed before now is allocatable again, so
    /// that a trim of all free space covers it (`ironpool trim` right after
    /// a destroy: its frees wait out the defer window first, and a trim
    /// begun at once left the device files as full as before). At most
    /// [`DEFER_TXGS`](crate::alloc::DEFER_TXGS) + 1 commits: each frees a
    /// little of its own metadata, so waiting for none deferred would not
    /// end.
    pub async fn settle_frees(self: &Rc<Self>) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        for _ in 0..=crate::alloc::DEFER_TXGS {
            if self.store.allocator.borrow().deferred_bytes() == 0 {
                break;
            }
            self.commit().await?;
        }
        Ok(())
    }

    /// Starts a trim of all free space in the background (`ironpool trim`;
    /// [`Pool::settle_frees`] first, to include what was just freed).
    pub fn trim_start(self: &Rc<Self>) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let mut state = self.scans.trim.borrow_mut();
        if state.phase != TrimPhase::Idle {
            return Err(PoolError::InvalidArgument(
                "a trim is already running".into(),
            ));
        }
        let (_, free) = self.space();
        state.phase = TrimPhase::Running;
        state.started_unix_seconds = unix_seconds();
        state.finished_unix_seconds = 0;
        state.started = Some(rt::now());
        state.total_bytes = free;
        state.examined_bytes = 0;
        state.trimmed_bytes = 0;
        state.completed = false;
        self.events.post(
            EventClass::TrimStart,
            NewEvent::detail(format!("{free} free bytes to discard")),
        );
        let pool = self.clone();
        state.task = Some(rt::spawn(async move { pool.trim_run().await }));
        Ok(())
    }

    async fn trim_run(self: Rc<Self>) {
        let counts = self.store.allocator.borrow().metaslab_counts();
        'walk: for (vdev, count) in counts.iter().enumerate() {
            for metaslab in 0..*count {
                let (pieces, free) = self
                    .store
                    .allocator
                    .borrow()
                    .free_extents_for_trim(vdev as u32, metaslab);
                let mut trimmed = 0;
                let mut pieces = pieces.into_iter().peekable();
                while pieces.peek().is_some() {
                    if self.scans.trim.borrow().phase != TrimPhase::Running {
                        break 'walk;
                    }
                    // A batch held out of allocation at a time, within the
                    // allocator's budget; a piece allocated meanwhile is
                    // skipped (it holds data now).
                    let mut batch = Vec::new();
                    while batch.len() < TRIMS_IN_FLIGHT {
                        let Some(piece) = pieces.peek().copied() else {
                            break;
                        };
                        let mut allocator = self.store.allocator.borrow_mut();
                        if allocator.hold_for_trim(piece) {
                            batch.push(piece);
                        } else if allocator.is_free(piece) && !batch.is_empty() {
                            // Still free, but no budget left: discard the
                            // batch first, then try it again.
                            break;
                        }
                        drop(allocator);
                        pieces.next();
                    }
                    trimmed += self.trim_extents(batch).await;
                }
                let mut state = self.scans.trim.borrow_mut();
                state.examined_bytes += free;
                state.trimmed_bytes += trimmed;
            }
        }
        let mut state = self.scans.trim.borrow_mut();
        state.completed = state.phase == TrimPhase::Running;
        state.phase = TrimPhase::Idle;
        state.finished_unix_seconds = unix_seconds();
        self.events.post(
            EventClass::TrimFinish,
            NewEvent::detail(format!(
                "{}: {} of {} free bytes examined, {} discarded",
                if state.completed {
                    "completed"
                } else {
                    "stopped"
                },
                state.examined_bytes,
                state.total_bytes,
                state.trimmed_bytes
            )),
        );
    }

    /// Asks a running trim of all free space to stop (`trim -s`).
    pub fn trim_cancel(&self) {
        let mut state = self.scans.trim.borrow_mut();
        if state.phase == TrimPhase::Running {
            state.phase = TrimPhase::Stopping;
        }
    }

    /// Waits for the running trim of all free space (if any) to end.
    pub async fn trim_wait(&self) {
        let task = self.scans.trim.borrow_mut().task.take();
        super::wait_task(task).await;
    }

    /// Stops every trim and waits for them (pool export).
    pub(in crate::pool) async fn trim_stop(&self) {
        self.trim_cancel();
        self.trim_wait().await;
        let task = {
            let mut state = self.scans.trim.borrow_mut();
            state.shut = true;
            state.autotrim_task.take()
        };
        super::wait_task(task).await;
    }

    /// Trims, for `status`.
    pub fn trim_status(&self) -> TrimStatus {
        let state = self.scans.trim.borrow();
        let running = state.phase != TrimPhase::Idle;
        let eta_seconds = eta_seconds(
            state.started.filter(|_| running),
            state.examined_bytes,
            state.total_bytes,
        );
        let unsupported_devices = self
            .store
            .vdevs()
            .iter()
            .flat_map(|top| top.children.iter())
            .filter(|leaf| !leaf.trim_supported())
            .map(|leaf| leaf.path.borrow().clone())
            .collect();
        TrimStatus {
            autotrim: self.autotrim(),
            state: if running {
                "trimming"
            } else if state.started_unix_seconds == 0 {
                "none"
            } else if state.completed {
                "finished"
            } else {
                "stopped"
            },
            started_unix_seconds: state.started_unix_seconds,
            finished_unix_seconds: state.finished_unix_seconds,
            examined_bytes: state.examined_bytes,
            total_bytes: state.total_bytes,
            progress_percent: progress_percent(state.examined_bytes, state.total_bytes, running),
            eta_seconds,
            trimmed_bytes: state.trimmed_bytes,
            autotrim_extents: state.autotrim_extents,
            autotrim_trimmed_bytes: state.autotrim_bytes,
            autotrim_pending: self.store.allocator.borrow().has_pending_trims(),
            autotrim_running: state.autotrim_task.is_some(),
            unsupported_devices,
        }
    }
}
