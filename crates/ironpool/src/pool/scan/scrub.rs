//! Scrub: read every copy of every live block, verify it against its checksum
//! (and RAID-Z parity against the data), and rewrite the bad copies from a
//! good one.
//!
//! The walk ([`crate::pool::scan`]) goes object by object in object number order,
//! top-down through each tree, a node at a time: the pointers in one node are
//! scrubbed together (a bounded number in flight). A block shared by snapshots
//! is read once. Progress is bytes examined against the bytes allocated when
//! the scrub started.
//!
//! A running scrub is recorded in the directory ([`ScrubProgress`]) from its
//! start, with the first object not yet scrubbed (its bookmark) updated as it
//! goes: a scrub cut short by a crash or an export resumes at the next import
//! from that object. Stopping it (`scrub -s`) or its end clears the record.

use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;

use crate::events::{EventClass, NewEvent};
use crate::format::BlockPointer;
use crate::object::Object;
use crate::pool::dataset::directory::{ScrubProgress, ScrubRecord};
use crate::pool::scan::{keep_error_detail, progress_percent, wait_task, Scan, WalkEnd};
use crate::pool::{Pool, PoolError};
use crate::rt::{self, Instant, JoinHandle};

/// Blocks scrubbed concurrently: enough to keep devices busy, few enough that
/// interactive I/O (which has priority in the queues anyway) is not crowded out.
const SCRUB_BLOCKS_IN_FLIGHT: usize = 32;

/// Where a scrub task is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScrubPhase {
    /// No task runs.
    #[default]
    Idle,
    /// A task walks the pool.
    Running,
    /// The operator asked it to stop (`scrub -s`): it ends recorded as not
    /// completed and is not resumed.
    Cancelling,
    /// The pool is being exported: it stops and stays recorded in the
    /// directory, to resume at the next import.
    Pausing,
}

/// A running or finished scrub.
#[derive(Default)]
pub struct ScrubState {
    phase: ScrubPhase,
    /// It resumed a scrub an earlier import of the pool had not finished.
    resumed: bool,
    /// The bookmark and figures so far: what the directory keeps of it while
    /// it runs, so a scrub cut short resumes from them.
    progress: ScrubProgress,
    /// When this process started (or resumed) it: the rate limit's clock.
    started: Option<Instant>,
    /// Bytes examined when this process started (or resumed) it.
    examined_at_start: u64,
    /// What the unrecoverable errors were (bounded list).
    error_details: Vec<String>,
    /// The walk stopped at an object destroyed under it: it does not catch
    /// up the devices' logs (see `scan`).
    pub(super) walk_incomplete: bool,
    /// Cloned blocks (block cloning) scrubbed so far: a block linked by
    /// several files is read once. At most the block reference table's
    /// entries (`CLONED_BLOCKS_MAX`).
    cloned_done: rustc_hash::FxHashSet<(u32, u64)>,
    task: Option<JoinHandle<()>>,
}

impl ScrubState {
    /// A scrub task is running (perhaps stopping).
    pub fn running(&self) -> bool {
        self.phase != ScrubPhase::Idle
    }

    /// The walk must end at the next node.
    pub fn stopping(&self) -> bool {
        matches!(self.phase, ScrubPhase::Cancelling | ScrubPhase::Pausing)
    }
}

/// What `status` shows about scrubs.
#[derive(Clone, Debug, Serialize)]
pub struct ScrubStatus {
    /// "scanning", "finished" or "none".
    pub state: &'static str,
    /// The running scrub resumed one that an earlier import of the pool did
    /// not finish (a crash, or an export while it ran).
    pub resumed: bool,
    pub started_unix_seconds: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub progress_percent: f64,
    pub bad_copies: u64,
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
    pub error_details: Vec<String>,
    /// The last scrub that ended (completed or stopped).
    pub last: Option<ScrubRecord>,
}

/// Seconds since the Unix epoch, by the runtime's clock.
pub(in crate::pool) fn unix_seconds() -> u64 {
    crate::rt::wall_clock_ns() / 1_000_000_000
}

impl Pool {
    /// Starts a scrub in the background.
    pub fn scrub_start(self: &Rc<Self>) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        if self.scans.scrub.borrow().running() {
            return Err(PoolError::InvalidArgument(
                "a scrub is already running".into(),
            ));
        }
        let (size, free) = self.space();
        let progress = ScrubProgress {
            started_unix_seconds: unix_seconds(),
            total_bytes: size - free,
            ..ScrubProgress::default()
        };
        self.scrub_launch(progress, false);
        Ok(())
    }

    /// At import: resumes the scrub the directory says was running, from its
    /// bookmark. True when one was resumed.
    pub(in crate::pool) fn scrub_resume(self: &Rc<Self>) -> bool {
        let Some(progress) = self.datasets.directory.read().scrub_in_progress.clone() else {
            return false;
        };
        if self.txg.ensure_writable().is_err() || self.scans.scrub.borrow().running() {
            return false;
        }
        self.scrub_launch(progress, true);
        true
    }

    /// Records the scrub in the directory and starts its task.
    fn scrub_launch(self: &Rc<Self>, progress: ScrubProgress, resumed: bool) {
        let mut scrub = self.scans.scrub.borrow_mut();
        *scrub = ScrubState {
            phase: ScrubPhase::Running,
            resumed,
            started: Some(rt::now()),
            examined_at_start: progress.examined_bytes,
            progress: progress.clone(),
            ..ScrubState::default()
        };
        self.events.post(
            EventClass::ScrubStart,
            NewEvent::detail(if resumed {
                format!(
                    "resumed at object {}, {} of {} bytes examined",
                    progress.next_object, progress.examined_bytes, progress.total_bytes
                )
            } else {
                format!("{} bytes to examine", progress.total_bytes)
            }),
        );
        self.datasets.directory.edit().scrub_in_progress = Some(progress);
        let pool = self.clone();
        scrub.task = Some(rt::spawn(async move { pool.scrub_run(resumed).await }));
    }

    /// Asks a running scrub to stop (`scrub -s`): it ends, recorded as not
    /// completed, and is not resumed.
    pub fn scrub_cancel(&self) {
        let mut scrub = self.scans.scrub.borrow_mut();
        if scrub.phase == ScrubPhase::Running {
            scrub.phase = ScrubPhase::Cancelling;
        }
    }

    /// Stops a running scrub for an export and waits for it: it stays
    /// recorded in the directory (with its bookmark) and the next import
    /// resumes it.
    pub async fn scrub_pause(&self) {
        {
            let mut scrub = self.scans.scrub.borrow_mut();
            if scrub.running() {
                scrub.phase = ScrubPhase::Pausing;
            }
        }
        self.scrub_wait().await;
    }

    /// Waits for the running scrub (if any) to end.
    pub async fn scrub_wait(&self) {
        let task = self.scans.scrub.borrow_mut().task.take();
        wait_task(task).await;
    }

    /// The running or last scrub, for `status`.
    pub fn scrub_status(&self) -> ScrubStatus {
        let scrub = self.scans.scrub.borrow();
        let progress = progress_percent(
            scrub.progress.examined_bytes,
            scrub.progress.total_bytes,
            scrub.running(),
        );
        ScrubStatus {
            state: if scrub.running() {
                "scanning"
            } else if scrub.progress.started_unix_seconds > 0 {
                "finished"
            } else {
                "none"
            },
            resumed: scrub.resumed,
            started_unix_seconds: scrub.progress.started_unix_seconds,
            examined_bytes: scrub.progress.examined_bytes,
            total_bytes: scrub.progress.total_bytes,
            progress_percent: progress,
            bad_copies: scrub.progress.bad_copies,
            repaired_copies: scrub.progress.repaired_copies,
            repaired_bytes: scrub.progress.repaired_bytes,
            errors: scrub.progress.errors,
            error_details: scrub.error_details.clone(),
            last: self.datasets.directory.read().last_scrub.clone(),
        }
    }

    async fn scrub_run(self: Rc<Self>, resumed: bool) {
        // The directory's record of the scrub is on disk before the walk, so
        // a crash from here on resumes it.
        if let Err(error) = self.txg.wait_durable(&self, self.txg.open()).await {
            self.scrub_error(format!("recording the scrub: {error}"));
        }
        // A scrub rewrites the children that missed a block's txg too (it is a
        // resilver of every block it reads): when it completes clean, the txgs
        // those children missed at its start are caught up, as a resilver
        // pass would have left them. The blocks of those txgs must be on disk
        // before the walk, or it would skip them as too new. Not for a resumed
        // scrub: the part walked before the interruption was walked for the
        // devices' logs as they were then.
        let mut caught_up = if resumed {
            None
        } else {
            self.resilver_targets()
        };
        if let Some(targets) = &caught_up {
            if self
                .txg
                .wait_durable(&self, targets.max_txg())
                .await
                .is_err()
            {
                caught_up = None;
            }
        }
        let first = self.scans.scrub.borrow().progress.next_object;
        let walked = self.walk_objects(&Scan::Scrub, first).await;
        let (record, shut) = {
            let scrub = self.scans.scrub.borrow();
            let record = ScrubRecord {
                started_unix_seconds: scrub.progress.started_unix_seconds,
                finished_unix_seconds: unix_seconds(),
                examined_bytes: scrub.progress.examined_bytes,
                repaired_bytes: scrub.progress.repaired_bytes,
                errors: scrub.progress.errors,
                completed: walked == WalkEnd::Finished && scrub.phase == ScrubPhase::Running,
            };
            (record, scrub.phase == ScrubPhase::Pausing)
        };
        if shut {
            // Export: the directory keeps the scrub as of its last bookmark
            // (the object cut short is walked again, and counted again, from
            // its start), to resume at the next import.
            self.scans.scrub.borrow_mut().phase = ScrubPhase::Idle;
            return;
        }
        self.events.post(
            EventClass::ScrubFinish,
            NewEvent::detail(format!(
                "{}: {} bytes examined, {} repaired, {} errors",
                if record.completed {
                    "completed"
                } else {
                    "stopped"
                },
                record.examined_bytes,
                record.repaired_bytes,
                record.errors
            )),
        );
        let clean = record.completed && record.errors == 0 && {
            let scrub = self.scans.scrub.borrow();
            scrub.progress.repaired_copies == scrub.progress.bad_copies
        };
        {
            let mut directory = self.datasets.directory.edit();
            directory.last_scrub = Some(record);
            directory.scrub_in_progress = None;
        }
        let caught_up = caught_up.filter(|_| !self.scans.scrub.borrow().walk_incomplete);
        if let (true, Some(targets)) = (clean, caught_up) {
            self.drop_resilvered_ranges(&targets);
            if let Err(error) = self.commit().await {
                self.scrub_error(format!("committing the devices' caught-up state: {error}"));
            }
        } else if let Err(error) = self.txg.wait_durable(&self, self.txg.open()).await {
            self.scrub_error(format!("recording the end of the scrub: {error}"));
        }
        // Shown as ended once the end is on disk: a crash after this does not
        // resume it.
        self.scans.scrub.borrow_mut().phase = ScrubPhase::Idle;
    }

    /// Records that every object below `next_object` is scrubbed: the
    /// directory carries it from the next commit.
    pub(super) fn scrub_bookmark(&self, next_object: u64) {
        let progress = {
            let mut scrub = self.scans.scrub.borrow_mut();
            scrub.progress.next_object = next_object;
            scrub.progress.clone()
        };
        self.datasets.directory.edit().scrub_in_progress = Some(progress);
    }

    /// Waits as long as needed to keep the scrub at the `scrub_rate_bytes`
    /// tunable (bytes examined per second; 0: no limit).
    async fn scrub_throttle(&self) {
        let rate = self.tunables.borrow().scrub_rate_bytes;
        if rate == 0 {
            return;
        }
        let (started, examined) = {
            let scrub = self.scans.scrub.borrow();
            (
                scrub.started,
                scrub
                    .progress
                    .examined_bytes
                    .saturating_sub(scrub.examined_at_start),
            )
        };
        let Some(started) = started else { return };
        let due = Duration::from_secs_f64(examined as f64 / rate as f64);
        let elapsed = rt::now().duration_since(started);
        if due > elapsed {
            rt::sleep(due - elapsed).await;
        }
    }

    pub(super) fn scrub_error(&self, detail: String) {
        let mut scrub = self.scans.scrub.borrow_mut();
        scrub.progress.errors += 1;
        keep_error_detail(&mut scrub.error_details, detail);
    }

    /// Scrubs the pointers of one node (a bounded number at a time).
    pub(in crate::pool) async fn scrub_pointers(
        self: &Rc<Self>,
        object: &Rc<Object>,
        pointers: &[BlockPointer],
    ) {
        // Blocks of a txg still being written may not be on every device yet:
        // they are the next scrub's.
        let durable = self.txg.durable();
        let pointers: Vec<BlockPointer> = {
            let clones = self.store.clones.borrow();
            let mut scrub = self.scans.scrub.borrow_mut();
            pointers
                .iter()
                .filter(|pointer| pointer.birth_txg <= durable)
                // A cloned block once, whichever link comes first.
                .filter(|pointer| clones.first_sighting(&mut scrub.cloned_done, pointer))
                .copied()
                .collect()
        };
        for batch in pointers.chunks(SCRUB_BLOCKS_IN_FLIGHT) {
            self.scrub_throttle().await;
            let results = futures_util::future::join_all(
                batch.iter().map(|pointer| self.store.scrub(pointer)),
            )
            .await;
            let mut scrub = self.scans.scrub.borrow_mut();
            for (pointer, result) in batch.iter().zip(results) {
                scrub.progress.examined_bytes += pointer.allocated_bytes();
                match result {
                    Ok((bad, repaired)) => {
                        if bad > 0 {
                            let detail = format!(
                                "object {} level {} birth {} at {:?}: {bad} bad copies, {repaired} repaired",
                                object.id, pointer.level, pointer.birth_txg, pointer.dvas[0]
                            );
                            keep_error_detail(&mut scrub.error_details, detail);
                        }
                        scrub.progress.bad_copies += bad;
                        scrub.progress.repaired_copies += repaired;
                        scrub.progress.repaired_bytes += repaired * pointer.physical_size as u64;
                    }
                    Err(error) => {
                        scrub.progress.errors += 1;
                        let detail = format!(
                            "object {} level {} birth {}: {error}",
                            object.id, pointer.level, pointer.birth_txg
                        );
                        keep_error_detail(&mut scrub.error_details, detail);
                    }
                }
            }
        }
    }
}
