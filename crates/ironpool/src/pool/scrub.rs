//! Scrub: read every copy of every live block, verify it against its checksum
//! (and RAID-Z parity against the data), and rewrite the bad copies from a
//! good one.
//!
//! The walk ([`super::scan`]) goes object by object, top-down through each
//! tree, a node at a time: the pointers in one node are scrubbed together (a
//! bounded number in flight). A block shared by snapshots is read once.
//! Progress is bytes examined against the bytes
//! allocated when the scrub started.

use std::rc::Rc;

use serde::Serialize;

use super::directory::ScrubRecord;
use super::scan::Scan;
use super::{Pool, PoolError};
use crate::format::BlockPointer;
use crate::object::Object;
use crate::rt::{self, JoinHandle};

/// Blocks scrubbed concurrently: enough to keep devices busy, few enough that
/// interactive I/O (which has priority in the queues anyway) is not crowded out.
const SCRUB_BLOCKS_IN_FLIGHT: usize = 32;

/// A running or finished scrub.
#[derive(Default)]
pub struct ScrubState {
    pub running: bool,
    pub cancel: bool,
    pub started_unix_seconds: u64,
    pub total_bytes: u64,
    pub examined_bytes: u64,
    pub bad_copies: u64,
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    /// Blocks with no good copy left.
    pub errors: u64,
    /// What the unrecoverable errors were (bounded list).
    pub error_details: Vec<String>,
    task: Option<JoinHandle<()>>,
}

/// Most error descriptions kept for `status`.
const ERROR_DETAILS_MAX: usize = 32;

/// What `status` shows about scrubs.
#[derive(Clone, Debug, Serialize)]
pub struct ScrubStatus {
    pub state: &'static str,
    pub started_unix_seconds: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub progress_percent: f64,
    pub bad_copies: u64,
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
    pub error_details: Vec<String>,
    pub last: Option<ScrubRecord>,
}

pub(super) fn unix_seconds() -> u64 {
    crate::rt::wall_clock_ns() / 1_000_000_000
}

impl Pool {
    /// Starts a scrub in the background.
    pub fn scrub_start(self: &Rc<Self>) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let mut scrub = self.scrub.borrow_mut();
        if scrub.running {
            return Err(PoolError::InvalidArgument("a scrub is already running".into()));
        }
        let (size, free) = self.space();
        *scrub = ScrubState { running: true, started_unix_seconds: unix_seconds(), total_bytes: size - free, ..ScrubState::default() };
        let pool = self.clone();
        scrub.task = Some(rt::spawn(async move { pool.scrub_run().await }));
        Ok(())
    }

    /// Asks a running scrub to stop.
    pub fn scrub_cancel(&self) {
        let mut scrub = self.scrub.borrow_mut();
        if scrub.running {
            scrub.cancel = true;
        }
    }

    /// Waits for the running scrub (if any) to end.
    pub async fn scrub_wait(&self) {
        let task = self.scrub.borrow_mut().task.take();
        if let Some(task) = task {
            task.await;
        }
    }

    pub fn scrub_status(&self) -> ScrubStatus {
        let scrub = self.scrub.borrow();
        let progress = if scrub.total_bytes == 0 { if scrub.running { 0.0 } else { 100.0 } } else { (scrub.examined_bytes as f64 * 100.0 / scrub.total_bytes as f64).min(100.0) };
        ScrubStatus {
            state: if scrub.running { "scanning" } else if scrub.started_unix_seconds > 0 { "finished" } else { "none" },
            started_unix_seconds: scrub.started_unix_seconds,
            examined_bytes: scrub.examined_bytes,
            total_bytes: scrub.total_bytes,
            progress_percent: progress,
            bad_copies: scrub.bad_copies,
            repaired_copies: scrub.repaired_copies,
            repaired_bytes: scrub.repaired_bytes,
            errors: scrub.errors,
            error_details: scrub.error_details.clone(),
            last: self.directory.borrow().last_scrub.clone(),
        }
    }

    async fn scrub_run(self: Rc<Self>) {
        let mut completed = true;
        // A scrub rewrites the children that missed a block's txg too (it is a
        // resilver of every block it reads): when it completes clean, the txgs
        // those children missed at its start are caught up, as a resilver
        // pass would have left them. The blocks of those txgs must be on disk
        // before the walk, or it would skip them as too new.
        let mut caught_up = self.resilver_targets();
        if let Some(targets) = &caught_up {
            if self.txg.wait_durable(&self, targets.max_txg()).await.is_err() {
                caught_up = None;
            }
        }
        match self.all_objects().await {
            Ok(objects) => {
                for object in objects {
                    if self.scrub.borrow().cancel {
                        completed = false;
                        break;
                    }
                    let floor = self.scan_floor_txg(object.id);
                    if let Err(error) = self.scan_object(&object, &Scan::Scrub, floor).await {
                        self.scrub_error(format!("object {}: {error}", object.id));
                    }
                }
            }
            Err(error) => self.scrub_error(format!("listing objects: {error}")),
        }
        let record = {
            let mut scrub = self.scrub.borrow_mut();
            scrub.running = false;
            ScrubRecord {
                started_unix_seconds: scrub.started_unix_seconds,
                finished_unix_seconds: unix_seconds(),
                examined_bytes: scrub.examined_bytes,
                repaired_bytes: scrub.repaired_bytes,
                errors: scrub.errors,
                completed: completed && !scrub.cancel,
            }
        };
        let clean = record.completed && record.errors == 0 && {
            let scrub = self.scrub.borrow();
            scrub.repaired_copies == scrub.bad_copies
        };
        self.directory.borrow_mut().last_scrub = Some(record);
        self.directory_dirty.set(true);
        if let (true, Some(targets)) = (clean, caught_up) {
            self.drop_resilvered_ranges(&targets);
            if let Err(error) = self.commit().await {
                self.scrub_error(format!("committing the devices' caught-up state: {error}"));
            }
        }
    }

    fn scrub_error(&self, detail: String) {
        let mut scrub = self.scrub.borrow_mut();
        scrub.errors += 1;
        if scrub.error_details.len() < ERROR_DETAILS_MAX {
            scrub.error_details.push(detail);
        }
    }

    /// Scrubs the pointers of one node (a bounded number at a time).
    pub(super) async fn scrub_pointers(self: &Rc<Self>, object: &Rc<Object>, pointers: &[BlockPointer]) {
        // Blocks of a txg still being written may not be on every device yet:
        // they are the next scrub's.
        let durable = self.txg.durable();
        let pointers: Vec<BlockPointer> = pointers.iter().filter(|pointer| pointer.birth_txg <= durable).copied().collect();
        for batch in pointers.chunks(SCRUB_BLOCKS_IN_FLIGHT) {
            let results = futures_util::future::join_all(batch.iter().map(|pointer| self.store.scrub(pointer))).await;
            let mut scrub = self.scrub.borrow_mut();
            for (pointer, result) in batch.iter().zip(results) {
                scrub.examined_bytes += pointer.allocated_bytes();
                match result {
                    Ok((bad, repaired)) => {
                        if bad > 0 && scrub.error_details.len() < ERROR_DETAILS_MAX {
                            scrub.error_details.push(format!("object {} level {} birth {} at {:?}: {bad} bad copies, {repaired} repaired", object.id, pointer.level, pointer.birth_txg, pointer.dvas[0]));
                        }
                        scrub.bad_copies += bad;
                        scrub.repaired_copies += repaired;
                        scrub.repaired_bytes += repaired * pointer.physical_size as u64;
                    }
                    Err(error) => {
                        scrub.errors += 1;
                        if scrub.error_details.len() < ERROR_DETAILS_MAX {
                            scrub.error_details.push(format!("object {} level {}: {error}", object.id, pointer.level));
                        }
                    }
                }
            }
        }
    }
}
