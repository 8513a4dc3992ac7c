//! Resilver: rewrite onto devices the blocks born in the txgs they missed.
//!
//! A pass takes a snapshot of the closed ranges in the dirty time logs of the
//! devices in service, waits until the newest of those txgs is durable (so no
//! block born in them can still appear), then walks every tree ([`crate::pool::scan`])
//! skipping subtrees born before the oldest range. Each block born in a range
//! is read from the copies and columns that can be trusted (reconstructed on
//! RAID-Z) and written to the devices that missed it, in the queue's rebuild
//! class. When the pass had no error and its devices stayed in service, their
//! ranges are dropped from the logs (and the config) with a commit. Txgs
//! missed meanwhile (another failure) make another pass.
//!
//! Progress is bytes examined (blocks visited, plus an estimate for skipped
//! subtrees) against the bytes allocated when the pass began; the ETA follows
//! from the rate so far.

use std::rc::Rc;

use serde::Serialize;

use crate::events::{EventClass, NewEvent};
use crate::format::BlockPointer;
use crate::pool::scan::scrub::unix_seconds;
use crate::pool::scan::{
    eta_seconds, keep_error_detail, progress_percent, wait_task, Scan, WalkEnd,
};
use crate::pool::{devices, Pool};
use crate::rt::{self, Instant, JoinHandle};

/// Blocks resilvered concurrently: enough to keep the devices busy (each block
/// is a read of its other columns or copies and one write per target), few
/// enough that client I/O (which the queues favour anyway) is not crowded out.
const RESILVER_BLOCKS_IN_FLIGHT: usize = 32;

/// One device a pass works for.
struct Target {
    vdev: u32,
    child: usize,
    /// The leaf's generation when the pass began: a device that left service
    /// (or was replaced) meanwhile did not get every block.
    generation: u64,
    /// The txgs it missed, as the pass saw them: `[first, last]`.
    ranges: Vec<(u64, u64)>,
}

/// The devices a pass works for and the txgs each missed.
pub struct ResilverTargets {
    targets: Vec<Target>,
}

impl ResilverTargets {
    /// The oldest txg any device missed: older subtrees are skipped.
    pub(in crate::pool) fn min_birth_txg(&self) -> u64 {
        self.targets
            .iter()
            .flat_map(|target| target.ranges.iter().map(|(first, _)| *first))
            .min()
            .unwrap_or(0)
    }

    /// The newest txg any device missed.
    pub(in crate::pool) fn max_txg(&self) -> u64 {
        self.targets
            .iter()
            .flat_map(|target| target.ranges.iter().map(|(_, last)| *last))
            .max()
            .unwrap_or(0)
    }

    /// Every child of `vdev` the resilver rebuilds, whatever the txgs it
    /// missed: for a block whose write txg is not known (a claimed intent
    /// log's own blocks), rewritten where it may be missing.
    pub(in crate::pool) fn children_of(&self, vdev: u32) -> Vec<usize> {
        let mut children: Vec<usize> = self
            .targets
            .iter()
            .filter(|target| target.vdev == vdev)
            .map(|target| target.child)
            .collect();
        children.sort_unstable();
        children.dedup();
        children
    }

    /// Children of vdev `vdev` that need a block born in `birth_txg`.
    fn children_needing(&self, vdev: u32, birth_txg: u64) -> Vec<usize> {
        self.targets
            .iter()
            .filter(|target| {
                target.vdev == vdev
                    && target
                        .ranges
                        .iter()
                        .any(|(first, last)| (*first..=*last).contains(&birth_txg))
            })
            .map(|target| target.child)
            .collect()
    }
}

/// Where the resilver is: one state machine instead of flags that could
/// contradict each other (cancelled but not running, shut yet restarted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ResilverPhase {
    /// No pass runs; one starts when a device has txgs to catch up on.
    #[default]
    Idle,
    /// A task passes over the trees. `again`: devices started missing txgs
    /// while it ran, so it passes once more even after a failed pass.
    Running { again: bool },
    /// Export asked a running resilver to stop: it ends at the next node.
    Stopping,
    /// The pool is being exported: no resilver starts again.
    Shut,
}

/// A running or finished resilver.
#[derive(Default)]
pub struct ResilverState {
    phase: ResilverPhase,
    /// The pass stopped walking an object destroyed under it: it may have
    /// missed blocks, so it does not complete, and another pass runs.
    walk_incomplete: bool,
    pub started_unix_seconds: u64,
    started: Option<Instant>,
    pub finished_unix_seconds: u64,
    /// Paths of the devices being resilvered.
    pub devices: Vec<String>,
    pub passes: u64,
    pub total_bytes: u64,
    pub examined_bytes: u64,
    /// Block copies rewritten on a device (a block rewritten on two devices
    /// counts twice), over every pass of this resilver.
    pub rewritten_blocks: u64,
    /// Bytes written onto the devices (a RAID-Z child's column of a block,
    /// not the whole block), over every pass.
    pub rewritten_bytes: u64,
    /// Blocks that could not be read from anywhere or not written.
    pub errors: u64,
    pub error_details: Vec<String>,
    /// Cloned blocks (block cloning) this pass resilvered: a block linked
    /// by several files is rewritten once. At most the block reference
    /// table's entries (`CLONED_BLOCKS_MAX`); emptied at each pass.
    cloned_done: rustc_hash::FxHashSet<(u32, u64)>,
    task: Option<JoinHandle<()>>,
}

/// What `status` shows about the resilver.
#[derive(Clone, Debug, Serialize)]
pub struct ResilverStatus {
    /// "resilvering", "finished" or "none".
    pub state: &'static str,
    pub devices: Vec<String>,
    pub started_unix_seconds: u64,
    pub finished_unix_seconds: u64,
    pub passes: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub progress_percent: f64,
    pub rewritten_blocks: u64,
    pub rewritten_bytes: u64,
    /// Estimated seconds to the end of this pass (none before any progress).
    pub eta_seconds: Option<u64>,
    pub errors: u64,
    pub error_details: Vec<String>,
}

impl ResilverState {
    /// A resilver task is running (perhaps stopping).
    pub fn running(&self) -> bool {
        matches!(
            self.phase,
            ResilverPhase::Running { .. } | ResilverPhase::Stopping
        )
    }

    /// The running pass must end at the next node.
    pub fn cancelled(&self) -> bool {
        self.phase == ResilverPhase::Stopping
    }

    /// Whether a pass was asked for while one ran, forgetting the request.
    fn take_again(&mut self) -> bool {
        if let ResilverPhase::Running { again: true } = self.phase {
            self.phase = ResilverPhase::Running { again: false };
            return true;
        }
        false
    }
}

impl Pool {
    /// Starts a resilver in the background when some device in service has
    /// txgs to catch up on (or makes a running one pass again).
    pub fn resilver_start(self: &Rc<Self>) {
        let Some(targets) = self.resilver_targets() else {
            return;
        };
        if self.txg.ensure_writable().is_err() {
            return;
        }
        let mut state = self.scans.resilver.borrow_mut();
        match state.phase {
            ResilverPhase::Shut | ResilverPhase::Stopping => return,
            ResilverPhase::Running { .. } => {
                state.phase = ResilverPhase::Running { again: true };
                return;
            }
            ResilverPhase::Idle => {}
        }
        // What the first pass will work on, shown from the start.
        let (size, free) = self.space();
        *state = ResilverState {
            phase: ResilverPhase::Running { again: false },
            started_unix_seconds: unix_seconds(),
            started: Some(rt::now()),
            devices: self.target_paths(&targets),
            total_bytes: size - free,
            ..ResilverState::default()
        };
        self.events.post(
            EventClass::ResilverStart,
            NewEvent::detail(format!("for {}", state.devices.join(", "))),
        );
        let pool = self.clone();
        state.task = Some(rt::spawn(async move { pool.resilver_run().await }));
    }

    /// After a commit: a device that stayed in service but missed writes (a
    /// write to it failed) gets a resilver. Not after a resilver that ended in
    /// errors: a device that keeps failing is left to the operator (`online`,
    /// `replace`), rather than retried at every commit.
    pub(in crate::pool) fn resilver_if_needed(self: &Rc<Self>) {
        let quiet = {
            let state = self.scans.resilver.borrow();
            !state.running() && state.errors == 0
        };
        if quiet {
            self.resilver_start();
        }
    }

    /// Stops a running resilver, waits for it, and starts none after (pool
    /// export). The logs keep what it did not finish; the next import starts
    /// over.
    pub async fn resilver_stop(&self) {
        {
            let mut state = self.scans.resilver.borrow_mut();
            state.phase = match state.phase {
                ResilverPhase::Running { .. } | ResilverPhase::Stopping => ResilverPhase::Stopping,
                ResilverPhase::Idle | ResilverPhase::Shut => ResilverPhase::Shut,
            };
        }
        self.resilver_wait().await;
    }

    /// Waits for the running resilver (if any) to end.
    pub async fn resilver_wait(&self) {
        let task = self.scans.resilver.borrow_mut().task.take();
        wait_task(task).await;
    }

    pub fn resilver_status(&self) -> ResilverStatus {
        let state = self.scans.resilver.borrow();
        let progress = progress_percent(state.examined_bytes, state.total_bytes, state.running());
        let eta_seconds = eta_seconds(
            state.started.filter(|_| state.running()),
            state.examined_bytes,
            state.total_bytes,
        );
        ResilverStatus {
            state: if state.running() {
                "resilvering"
            } else if state.started_unix_seconds > 0 {
                "finished"
            } else {
                "none"
            },
            devices: state.devices.clone(),
            started_unix_seconds: state.started_unix_seconds,
            finished_unix_seconds: state.finished_unix_seconds,
            passes: state.passes,
            examined_bytes: state.examined_bytes,
            total_bytes: state.total_bytes,
            progress_percent: progress,
            rewritten_blocks: state.rewritten_blocks,
            rewritten_bytes: state.rewritten_bytes,
            eta_seconds,
            errors: state.errors,
            error_details: state.error_details.clone(),
        }
    }

    /// The paths of the devices a pass works for.
    fn target_paths(&self, targets: &ResilverTargets) -> Vec<String> {
        targets
            .targets
            .iter()
            .map(|target| {
                self.store.vdevs()[target.vdev as usize].children[target.child]
                    .path
                    .borrow()
                    .clone()
            })
            .collect()
    }

    /// The devices in service with txgs to catch up on, or None.
    pub(in crate::pool) fn resilver_targets(&self) -> Option<ResilverTargets> {
        let mut targets = Vec::new();
        for top in self.store.vdevs().iter() {
            for (child, leaf) in top.children.iter().enumerate() {
                let dtl = leaf.dtl.borrow();
                if !leaf.is_online() || dtl.is_open() || dtl.is_empty() {
                    continue;
                }
                targets.push(Target {
                    vdev: top.id,
                    child,
                    generation: leaf.generation(),
                    ranges: dtl.closed_ranges(),
                });
            }
        }
        (!targets.is_empty()).then_some(ResilverTargets { targets })
    }

    async fn resilver_run(self: Rc<Self>) {
        // Pass until no device in service misses anything; after a failed pass
        // only when asked again (a device came back since).
        while let Some(targets) = self.resilver_targets() {
            if self.scans.resilver.borrow().cancelled() {
                break;
            }
            let completed = self.resilver_pass(targets).await;
            let again = self.scans.resilver.borrow_mut().take_again();
            if !completed && !again {
                break;
            }
        }
        let mut state = self.scans.resilver.borrow_mut();
        state.phase = match state.phase {
            ResilverPhase::Stopping | ResilverPhase::Shut => ResilverPhase::Shut,
            ResilverPhase::Running { .. } | ResilverPhase::Idle => ResilverPhase::Idle,
        };
        state.finished_unix_seconds = unix_seconds();
        self.events.post(
            EventClass::ResilverFinish,
            NewEvent::detail(format!(
                "{} passes, {} bytes rewritten, {} errors{}",
                state.passes,
                state.rewritten_bytes,
                state.errors,
                if state.phase == ResilverPhase::Shut {
                    " (stopped by export)"
                } else {
                    ""
                }
            )),
        );
    }

    /// One pass; true when it completed without errors.
    async fn resilver_pass(self: &Rc<Self>, targets: ResilverTargets) -> bool {
        {
            let (size, free) = self.space();
            let mut state = self.scans.resilver.borrow_mut();
            state.devices = self.target_paths(&targets);
            state.passes += 1;
            state.total_bytes = size - free;
            state.examined_bytes = 0;
            state.started = Some(rt::now());
            state.cloned_done.clear();
        }
        // Every block born in the missed txgs is linked and on disk first.
        if let Err(error) = self.txg.wait_durable(self, targets.max_txg()).await {
            self.resilver_error(format!("waiting for txg {}: {error}", targets.max_txg()));
            return false;
        }
        let errors_before = self.scans.resilver.borrow().errors;
        self.scans.resilver.borrow_mut().walk_incomplete = false;
        let targets = Rc::new(targets);
        let walked = self.walk_objects(&Scan::Resilver(targets.clone()), 0).await;
        let incomplete = {
            let state = self.scans.resilver.borrow();
            state.cancelled() || state.errors > errors_before || state.walk_incomplete
        };
        if walked == WalkEnd::Stopped || incomplete {
            return false;
        }
        self.resilver_finish(&targets).await
    }

    /// Drops the resilvered ranges from the logs of the devices that stayed in
    /// service the whole pass, and commits the config that says so.
    async fn resilver_finish(self: &Rc<Self>, targets: &ResilverTargets) -> bool {
        {
            let mut state = self.scans.resilver.borrow_mut();
            state.examined_bytes = state.total_bytes;
        }
        self.drop_resilvered_ranges(targets);
        match self.commit().await {
            Ok(()) => true,
            Err(error) => {
                self.resilver_error(format!("committing the resilvered state: {error}"));
                false
            }
        }
    }

    /// Drops the ranges a complete pass rebuilt from the logs of the devices
    /// that stayed in service (same generation) the whole pass. The caller
    /// commits.
    pub(in crate::pool) fn drop_resilvered_ranges(self: &Rc<Self>, targets: &ResilverTargets) {
        for target in &targets.targets {
            let leaf = &self.store.vdevs()[target.vdev as usize].children[target.child];
            if leaf.is_online() && leaf.generation() == target.generation {
                leaf.dtl.borrow_mut().remove_ranges(&target.ranges);
            }
        }
        devices::maintain(self, self.txg.open());
    }

    /// The pass stopped at an object destroyed under it: it does not
    /// complete, and another pass walks the pool as it is now.
    pub(super) fn resilver_walk_incomplete(&self) {
        let mut state = self.scans.resilver.borrow_mut();
        state.walk_incomplete = true;
        if let ResilverPhase::Running { .. } = state.phase {
            state.phase = ResilverPhase::Running { again: true };
        }
    }

    pub(super) fn resilver_error(&self, detail: String) {
        let mut state = self.scans.resilver.borrow_mut();
        state.errors += 1;
        keep_error_detail(&mut state.error_details, detail);
    }

    /// Resilvers the pointers of one node (a bounded number at a time).
    pub(in crate::pool) async fn resilver_pointers(
        self: &Rc<Self>,
        targets: &ResilverTargets,
        pointers: &[BlockPointer],
    ) {
        // A cloned block once, whichever link comes first.
        let pointers: Vec<BlockPointer> = {
            let clones = self.store.clones.borrow();
            let mut state = self.scans.resilver.borrow_mut();
            pointers
                .iter()
                .filter(|pointer| clones.first_sighting(&mut state.cloned_done, pointer))
                .copied()
                .collect()
        };
        for batch in pointers.chunks(RESILVER_BLOCKS_IN_FLIGHT) {
            let work = batch.iter().map(|pointer| {
                let needing = |vdev: u32| -> Vec<usize> {
                    let children = targets.children_needing(vdev, pointer.written_txg());
                    children
                        .into_iter()
                        .filter(|child| {
                            self.store.vdevs()[vdev as usize].children[*child].is_online()
                        })
                        .collect()
                };
                async move { self.store.resilver(pointer, &needing).await }
            });
            let results = futures_util::future::join_all(work).await;
            for (pointer, result) in batch.iter().zip(results) {
                let mut state = self.scans.resilver.borrow_mut();
                state.examined_bytes += pointer.allocated_bytes();
                match result {
                    Ok(rewritten) => {
                        state.rewritten_blocks += rewritten.copies;
                        state.rewritten_bytes += rewritten.bytes;
                    }
                    Err(error) => {
                        drop(state);
                        self.resilver_error(format!(
                            "block born in txg {} at {:?}: {error}",
                            pointer.birth_txg, pointer.dvas[0]
                        ));
                    }
                }
            }
        }
    }
}
