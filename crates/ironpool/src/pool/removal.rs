//! Removal of a data vdev (`ironpool remove POOL VDEV`), as OpenZFS's
//! device removal: every block on the vdev is copied to the other vdevs,
//! and a mapping (`format::remap`) says where each went, so block
//! pointers, which snapshots make immutable, never change. The vdev stays
//! in the config as an `indirect` vdev with no devices and no space; its
//! id is kept because pointers name vdevs by id.
//!
//! The steps:
//! 1. `remove` checks the pool can take it (another data vdev, every
//!    other vdev healthy, room for what the vdev holds), marks the vdev
//!    removing (nothing new is allocated there, its space leaves the
//!    pool's) and records the removal in the directory, in a txg it waits
//!    for. A crash from here on resumes the removal at import.
//! 2. A task walks every block tree, as a scrub does, and moves each copy
//!    on the vdev: read and verified from any copy, written to new space
//!    on another vdev, then recorded at once, in the open txg, both as the
//!    new copy's space and as a mapping entry (appended by the txg's build,
//!    [`build_step`]), so the two agree on disk at every txg. Reads still
//!    go to the vdev itself; a free of a moved copy frees the new copy too
//!    ([`crate::block::BlockStore::free`]), and a copy freed while it was
//!    being moved is given back rather than recorded.
//! 3. After each walk the vdev's space in use is compared with what the
//!    mapping covers. Blocks linked after the walk passed their place (a
//!    write allocated before the removal began, a file cloned) are left
//!    over; another walk takes them, up to [`REMOVAL_PASSES_MAX`]. Space in
//!    use that no walk finds stops the removal with an error: the vdev is
//!    then kept, never dropped with a block on it.
//! 4. Once everything is covered and on disk, the vdev becomes indirect in
//!    one txg: the config (with the devices' guids gone, so import picks
//!    this config only with an uberblock of the same txg), the directory
//!    (the mapping moves to the `indirect` list) and the space (its space
//!    maps are freed). Then its devices' labels are cleared.
//!
//! `remove -s` stops a removal: every moved copy is freed and the vdev is
//! in use again. A failure (a block no copy of which reads, a device of
//! another vdev missing a copy, no space) stops it the same way, with the
//! reason in `status`. Export pauses it; import resumes it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde::Serialize;

use crate::events::{EventClass, NewEvent};
use crate::format::label::TopVdevKind;
use crate::format::remap::{decode_entries, encode_entries, MAPPING_ENTRY_BYTES};
use crate::format::{BlockPointer, ObjectType};
use crate::object::{Object, ObjectError};
use crate::pool::dataset::directory::RemovalRecord;
use crate::pool::scan::{Scan, WalkEnd};
use crate::pool::{Pool, PoolError};
use crate::rt::{self, JoinHandle};
use crate::vdev::TopVdev;

/// Walks of every tree a removal makes before it gives up on space in use
/// that no walk found: one finds everything that was linked when it
/// began; a second takes blocks linked behind the first (writes allocated
/// before the removal, clones); more find nothing new unless something
/// keeps linking old blocks, which is no longer the removal's to chase.
pub const REMOVAL_PASSES_MAX: u32 = 4;

/// Block copies a removal moves at once: each is a read and a write of one
/// block, and a pool of 16 KiB blocks moves as fast as a sequential copy of
/// the same bytes with 64 (measured: 16 in flight moved at 0.4-0.6x of
/// `dd`'s rate, 64 at 0.96-0.99x). Clients keep their share of the
/// devices: the moves are the scheduler's rebuild class.
pub const REMOVAL_COPIES_IN_FLIGHT: usize = 64;

/// Bytes of blocks a removal moves at once, whatever their count: the
/// buffers they take (OpenZFS's `zfs_remove_max_copy_bytes` is 64 MiB).
pub const REMOVAL_BYTES_IN_FLIGHT: u64 = 32 << 20;

/// Free space a removal leaves on the other vdevs beyond what it moves, as
/// a share of that (1/16): the pool must still be writable afterwards.
const REMOVAL_HEADROOM_SHIFT: u32 = 4;

/// The removal's state: at most one runs at a time.
#[derive(Default)]
pub(crate) struct Removal {
    state: RefCell<RemovalState>,
    task: RefCell<Option<JoinHandle<()>>>,
    /// The mapping object of the removal in progress, held so that the
    /// txg build appends to it without I/O.
    mapping: RefCell<Option<Rc<Object>>>,
    /// Entries in the mapping object.
    entries_on_disk: Cell<u64>,
}

#[derive(Default)]
struct RemovalState {
    /// The vdev being removed.
    vdev: Option<u32>,
    /// What stops the task: `Stop` (the operator's `remove -s`, or a
    /// failure) cancels the removal; `Pause` (export) leaves it to resume.
    halt: Option<Halt>,
    running: bool,
    pass: u32,
    started_unix_seconds: u64,
    /// Space in use on the vdev when the removal (or its resumption)
    /// started: what it has to move.
    to_move_bytes: u64,
    moved_blocks: u64,
    moved_bytes: u64,
    /// Why the last removal stopped before its end, if it did.
    error: Option<String>,
    /// The vdev the last stopped removal was for.
    stopped_vdev: Option<u32>,
}

impl RemovalState {
    /// The removal in progress ended: stopped before its end (its vdev,
    /// and why) or done (None), which `status` shows until the next one.
    fn end(&mut self, stopped: Option<(u32, String)>) {
        self.vdev = None;
        self.stopped_vdev = stopped.as_ref().map(|(vdev, _)| *vdev);
        self.error = stopped.map(|(_, reason)| reason);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Halt {
    Stop,
    Pause,
}

/// What `status` shows of removals.
#[derive(Clone, Debug, Serialize)]
pub struct RemovalStatus {
    /// `removing`, `stopped` (by the operator or a failure: `error` says
    /// which) or `none`.
    pub state: &'static str,
    /// The vdev being removed (or the one whose removal stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vdev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix_seconds: Option<u64>,
    pub pass: u32,
    pub to_move_bytes: u64,
    pub moved_blocks: u64,
    pub moved_bytes: u64,
    pub progress_percent: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Vdevs removed, with what moved off each; the blocks their mappings
    /// keep in memory.
    pub removed: Vec<RemovedVdev>,
    pub mapped_blocks: u64,
}

/// A removed vdev, for `status`.
#[derive(Clone, Debug, Serialize)]
pub struct RemovedVdev {
    pub vdev: String,
    pub moved_blocks: u64,
    pub moved_bytes: u64,
    pub started_unix_seconds: u64,
    pub finished_unix_seconds: u64,
}

impl Pool {
    /// `ironpool remove POOL DEV`: DEV names a vdev (`mirror-1`) or one of
    /// its devices. A log vdev is removed at once
    /// ([`Pool::remove_log_vdev`]); a data vdev's removal starts
    /// ([`Pool::remove_data_vdev`]).
    pub async fn remove_vdev(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        let by_name = self
            .store
            .vdevs()
            .iter()
            .find(|top| top.kind.vdev_name(top.id) == name)
            .cloned();
        let top = match by_name {
            Some(top) => top,
            None => self.find_leaf(name)?.0,
        };
        if top.log {
            self.remove_log_vdev(name).await
        } else {
            self.remove_data_vdev(top).await
        }
    }

    /// Starts removing data vdev `top` (`ironpool remove POOL VDEV`; the
    /// caller resolved the name): refused, with nothing changed, unless
    /// another data vdev can take its blocks, every vdev is healthy and
    /// the others have room. Returns once the removal is recorded on disk
    /// and its task runs; [`Pool::removal_wait`] waits for its end.
    pub async fn remove_data_vdev(self: &Rc<Self>, top: Rc<TopVdev>) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let name = top.kind.vdev_name(top.id);
        let refuse = |reason: String| Err(PoolError::InvalidArgument(reason));
        let running = self.removal.state.borrow().vdev;
        if let Some(vdev) = running.and_then(|vdev| self.store.vdev(vdev)) {
            return refuse(format!(
                "{} is being removed: wait for it (remove -w) or stop it (remove -s)",
                vdev.kind.vdev_name(vdev.id)
            ));
        }
        assert!(!top.log, "log devices are removed by remove_log_vdev");
        match top.kind {
            TopVdevKind::Indirect => return refuse(format!("{name} is already removed")),
            kind if kind.is_raidz() => {
                return refuse(format!(
                    "{name} is RAID-Z: only disks and mirrors can be removed (as in OpenZFS)"
                ))
            }
            _ => {}
        }
        let vdevs = self.store.vdevs();
        let others: Vec<&Rc<TopVdev>> = vdevs
            .iter()
            .filter(|other| other.id != top.id && !other.log && other.kind != TopVdevKind::Indirect)
            .collect();
        if others.is_empty() {
            return refuse(format!(
                "{name} is the pool's only data vdev: its blocks have nowhere to go"
            ));
        }
        for vdev in vdevs
            .iter()
            .filter(|vdev| vdev.kind != TopVdevKind::Indirect)
        {
            let behind = vdev
                .children
                .iter()
                .find(|leaf| !leaf.is_online() || !leaf.dtl.borrow().is_empty());
            if let Some(leaf) = behind.filter(|_| !vdev.log) {
                return refuse(format!(
                    "{} of {} is {} or has txgs to resilver: bring the pool to health first",
                    leaf.path.borrow(),
                    vdev.kind.vdev_name(vdev.id),
                    leaf.state().name()
                ));
            }
        }
        if self.resilver_status().state == "resilvering" {
            return refuse("a resilver is running: wait for it first".into());
        }
        self.check_no_claim_on(top.id)?;
        if self.config.borrow().spares.iter().any(|spare| {
            spare
                .replacing
                .as_ref()
                .is_some_and(|_| top.children.iter().any(|leaf| leaf.guid() == spare.guid))
        }) {
            return refuse(format!(
                "a spare stands in {name}: detach or replace the device it replaced first"
            ));
        }
        // The space the vdev holds must fit on the others with room left.
        let needed = {
            let mut allocator = self.store.allocator.borrow_mut();
            let held = allocator.vdevs[top.id as usize].live_ranges().total_bytes();
            allocator.set_removing(top.id, true);
            let room = allocator.data_available_bytes();
            let needed = held + (held >> REMOVAL_HEADROOM_SHIFT);
            if room < needed {
                allocator.set_removing(top.id, false);
                return refuse(format!(
                    "{name} holds {held} bytes; the other vdevs have room for {room} (at least {needed} needed)"
                ));
            }
            held
        };
        self.store.remaps.borrow_mut().set_removing(Some(top.id));
        self.datasets.directory.edit().removing = Some(RemovalRecord {
            vdev: top.id,
            mapping: 0,
            started_unix_seconds: crate::pool::scan::scrub::unix_seconds(),
            finished_unix_seconds: 0,
            moved_blocks: 0,
            moved_bytes: 0,
        });
        {
            let mut state = self.removal.state.borrow_mut();
            *state = RemovalState {
                vdev: Some(top.id),
                started_unix_seconds: crate::pool::scan::scrub::unix_seconds(),
                to_move_bytes: needed,
                ..RemovalState::default()
            };
        }
        for leaf in &top.children {
            self.events.post(
                EventClass::DeviceState,
                NewEvent::device(
                    leaf.path.borrow().clone(),
                    format!("{name} is being removed: its blocks move to the other vdevs"),
                ),
            );
        }
        if let Err(error) = self.commit().await {
            // Not on disk: forget it (nothing was moved yet).
            self.store.remaps.borrow_mut().drop_vdev(top.id);
            self.store
                .allocator
                .borrow_mut()
                .set_removing(top.id, false);
            self.datasets.directory.edit().removing = None;
            self.removal.state.borrow_mut().vdev = None;
            return Err(error);
        }
        self.removal_spawn();
        Ok(())
    }

    /// Stops the removal in progress (`remove -s`) and waits for it: the
    /// copies it moved are freed and the vdev is in use again.
    pub async fn removal_stop(self: &Rc<Self>) -> Result<(), PoolError> {
        if self.removal.state.borrow().vdev.is_none() {
            return Err(PoolError::InvalidArgument(
                "no vdev is being removed".into(),
            ));
        }
        self.removal.state.borrow_mut().halt = Some(Halt::Stop);
        self.removal_wait().await;
        // A removal resumed but not running (its task could not start).
        if self.removal.state.borrow().vdev.is_some() {
            self.removal_cancel("stopped by the operator").await?;
        }
        Ok(())
    }

    /// Waits for the removal in progress (if any) to end: done, stopped or
    /// failed (see [`Pool::removal_status`]).
    pub async fn removal_wait(&self) {
        let task = self.removal.task.borrow_mut().take();
        crate::pool::scan::wait_task(task).await;
    }

    /// Pauses the removal for export: what it moved stays on disk and the
    /// next import resumes it.
    pub(in crate::pool) async fn removal_pause(&self) {
        {
            let mut state = self.removal.state.borrow_mut();
            if state.running {
                state.halt = Some(Halt::Pause);
            }
        }
        self.removal_wait().await;
    }

    /// True while the walk of the removal should stop.
    pub(in crate::pool) fn removal_halting(&self) -> bool {
        self.removal.state.borrow().halt.is_some()
    }

    /// A walk of the removal met an error it cannot go past (a block it
    /// could not move): the removal stops with it.
    pub(in crate::pool) fn removal_error(&self, detail: String) {
        let mut state = self.removal.state.borrow_mut();
        if state.error.is_none() {
            state.error = Some(detail);
        }
        state.halt = Some(Halt::Stop);
    }

    pub fn removal_status(&self) -> RemovalStatus {
        let state = self.removal.state.borrow();
        let directory = self.datasets.directory.read();
        let removed = directory
            .indirect
            .iter()
            .map(|record| RemovedVdev {
                vdev: TopVdevKind::Indirect.vdev_name(record.vdev),
                moved_blocks: record.moved_blocks,
                moved_bytes: record.moved_bytes,
                started_unix_seconds: record.started_unix_seconds,
                finished_unix_seconds: record.finished_unix_seconds,
            })
            .collect();
        let remaps = self.store.remaps.borrow();
        let mapped_blocks = directory
            .indirect
            .iter()
            .map(|record| remaps.len(record.vdev) as u64)
            .sum();
        let name = |vdev: u32| {
            self.store
                .vdev(vdev)
                .map(|top| top.kind.vdev_name(vdev))
                .unwrap_or_else(|| vdev.to_string())
        };
        let (state_name, vdev) = match (state.vdev, state.stopped_vdev) {
            (Some(vdev), _) => ("removing", Some(name(vdev))),
            (None, Some(vdev)) => ("stopped", Some(name(vdev))),
            (None, None) => ("none", None),
        };
        RemovalStatus {
            state: state_name,
            vdev,
            started_unix_seconds: (state.vdev.is_some() || state.stopped_vdev.is_some())
                .then_some(state.started_unix_seconds),
            pass: state.pass,
            to_move_bytes: state.to_move_bytes,
            moved_blocks: state.moved_blocks,
            moved_bytes: state.moved_bytes,
            progress_percent: crate::pool::scan::progress_percent(
                state.moved_bytes,
                state.to_move_bytes,
                state.vdev.is_some(),
            ),
            error: state.error.clone(),
            removed,
            mapped_blocks,
        }
    }

    /// At import: reads the mappings of removed vdevs and of the removal in
    /// progress. A mapping that cannot be read fails the import: without
    /// it the blocks of a removed vdev cannot be found.
    pub(in crate::pool) async fn load_removals(&self) -> Result<(), PoolError> {
        let (removing, indirect) = {
            let directory = self.datasets.directory.read();
            (directory.removing.clone(), directory.indirect.clone())
        };
        let vdevs = self.store.vdevs();
        for record in &indirect {
            if vdevs.get(record.vdev as usize).map(|top| top.kind) != Some(TopVdevKind::Indirect) {
                return Err(PoolError::Corrupt(format!(
                    "the directory names vdev {} as removed; the config does not",
                    record.vdev
                )));
            }
            let (_, entries) = self.read_mapping(record).await?;
            self.store
                .remaps
                .borrow_mut()
                .load(record.vdev, &entries)
                .map_err(PoolError::Corrupt)?;
        }
        if let Some(kind) = vdevs
            .iter()
            .find(|top| {
                top.kind == TopVdevKind::Indirect
                    && !indirect.iter().any(|record| record.vdev == top.id)
            })
            .map(|top| top.id)
        {
            return Err(PoolError::Corrupt(format!(
                "vdev {kind} is removed but the directory has no mapping for it"
            )));
        }
        let Some(record) = removing else {
            return Ok(());
        };
        let usable = vdevs
            .get(record.vdev as usize)
            .is_some_and(|top| !top.log && top.kind != TopVdevKind::Indirect);
        if !usable {
            return Err(PoolError::Corrupt(format!(
                "the directory names vdev {} as being removed; the config has no such data vdev",
                record.vdev
            )));
        }
        let (object, entries) = self.read_mapping(&record).await?;
        {
            let mut remaps = self.store.remaps.borrow_mut();
            remaps.set_removing(Some(record.vdev));
            remaps
                .load(record.vdev, &entries)
                .map_err(PoolError::Corrupt)?;
        }
        self.store
            .allocator
            .borrow_mut()
            .set_removing(record.vdev, true);
        self.removal.entries_on_disk.set(entries.len() as u64);
        *self.removal.mapping.borrow_mut() = object;
        let moved_bytes = entries
            .iter()
            .map(|entry| u64::from(entry.source_asize))
            .sum::<u64>();
        let held = self.store.allocator.borrow().vdevs[record.vdev as usize]
            .live_ranges()
            .total_bytes();
        *self.removal.state.borrow_mut() = RemovalState {
            vdev: Some(record.vdev),
            started_unix_seconds: record.started_unix_seconds,
            to_move_bytes: held,
            moved_blocks: entries.len() as u64,
            moved_bytes: moved_bytes.min(held),
            ..RemovalState::default()
        };
        Ok(())
    }

    /// Reads the mapping object of `record` (none yet: no entries).
    async fn read_mapping(
        &self,
        record: &RemovalRecord,
    ) -> Result<(Option<Rc<Object>>, Vec<crate::format::remap::MappingEntry>), PoolError> {
        if record.mapping == 0 {
            return Ok((None, Vec::new()));
        }
        let object = self.objects.open(record.mapping).await?;
        let length = object.length_bytes();
        let bound = (crate::block::remap::MAPPED_BLOCKS_MAX * MAPPING_ENTRY_BYTES) as u64;
        if object.object_type() != ObjectType::IndirectMapping || length > bound {
            return Err(PoolError::Corrupt(format!(
                "mapping of vdev {}: object {} is not one ({length} bytes)",
                record.vdev, record.mapping
            )));
        }
        let bytes = self.objects.read_bytes(&object, 0, length as usize).await?;
        let entries = decode_entries(&bytes).map_err(|error| {
            PoolError::Corrupt(format!("mapping of vdev {}: {error}", record.vdev))
        })?;
        Ok((Some(object), entries))
    }

    /// Starts the removal the directory records, after import, unless it
    /// runs already or a claimed intent log holds space on its vdev (an
    /// encrypted filesystem's, which no walk moves until its key's load
    /// replays it: that load resumes the removal).
    pub(in crate::pool) fn removal_resume(self: &Rc<Self>) {
        let (vdev, running) = {
            let state = self.removal.state.borrow();
            (state.vdev, state.running)
        };
        let Some(vdev) = vdev else {
            return;
        };
        if running || self.txg.ensure_writable().is_err() {
            return;
        }
        if let Err(error) = self.check_no_claim_on(vdev) {
            self.import_notes
                .borrow_mut()
                .push(format!("the removal of vdev {vdev} waits: {error}"));
            return;
        }
        self.removal_spawn();
    }

    fn removal_spawn(self: &Rc<Self>) {
        self.removal.state.borrow_mut().running = true;
        let pool = self.clone();
        *self.removal.task.borrow_mut() = Some(rt::spawn(async move { pool.removal_run().await }));
    }

    /// The removal's task: walks until everything on the vdev moved, then
    /// drops the vdev; stops (and cancels) on a failure or `remove -s`.
    async fn removal_run(self: Rc<Self>) {
        let mut outcome = self.removal_passes().await;
        // Blocks linked on the vdev between the last walk and the drop
        // (seen by `removal_finish`) get one more round of walks.
        for _ in 0..2 {
            if !matches!(outcome, Ok(true)) || self.removal_halting() {
                break;
            }
            match self.removal_finish().await {
                Ok(true) => {
                    self.removal.state.borrow_mut().running = false;
                    return;
                }
                Ok(false) => outcome = self.removal_passes().await,
                Err(error) => outcome = Err(error),
            }
        }
        let halt = self.removal.state.borrow().halt;
        let result = match (outcome, halt) {
            (_, Some(Halt::Pause)) => Ok(()),
            (Ok(_), Some(Halt::Stop)) => {
                let reason = self
                    .removal
                    .state
                    .borrow()
                    .error
                    .clone()
                    .unwrap_or_else(|| "stopped by the operator".into());
                self.removal_cancel(&reason).await
            }
            (Ok(_), None) => {
                let left = self.removal_left_bytes();
                let reason = format!(
                    "{left} bytes in use on the vdev belong to no block a walk of every tree found, after {REMOVAL_PASSES_MAX} walks (run `check`)"
                );
                self.removal_cancel(&reason).await
            }
            (Err(error), _) => self.removal_cancel(&error.to_string()).await,
        };
        if let Err(error) = result {
            // The pool could not commit: the removal stays recorded and
            // resumes at the next import.
            self.removal_error(format!("{error}"));
            eprintln!("ironpool: {}: removal: {error}", self.name);
        }
        self.removal.state.borrow_mut().running = false;
    }

    /// Walks every tree until the mapping covers everything on the vdev
    /// (true), or the walks are exhausted or halted (false).
    async fn removal_passes(self: &Rc<Self>) -> Result<bool, PoolError> {
        let vdev = self.removal_vdev();
        for pass in 1..=REMOVAL_PASSES_MAX {
            self.removal.state.borrow_mut().pass = pass;
            // Intent logs end their chains on the vdev (new log blocks go
            // elsewhere), and what was allocated before the removal began
            // is linked by the commits.
            if self.log_chains_use(vdev) {
                for (_, volume) in self.open_volumes() {
                    self.move_log_off(&volume).await?;
                }
                for (_, fs) in self.all_filesystems() {
                    self.move_fs_log_off(&fs).await?;
                }
            }
            self.commit().await?;
            if self.walk_objects(&Scan::Remove, 0).await == WalkEnd::Stopped
                || self.removal_halting()
            {
                return Ok(false);
            }
            // The entries are on disk, and log blocks released, by the
            // time the frees of the commits are past their defer depth.
            for _ in 0..=crate::alloc::DEFER_TXGS {
                self.commit().await?;
            }
            if self.removal_halting() {
                return Ok(false);
            }
            if self.removal_left_bytes() == 0 && !self.log_chains_use(vdev) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn removal_vdev(&self) -> u32 {
        self.removal
            .state
            .borrow()
            .vdev
            .expect("a removal task runs for a vdev")
    }

    /// Bytes on the vdev in use, or handed out and not settled, that the
    /// mapping does not cover.
    fn removal_left_bytes(&self) -> u64 {
        let vdev = self.removal_vdev();
        let allocator = self.store.allocator.borrow();
        let space = &allocator.vdevs[vdev as usize];
        let mut live = space.live_ranges();
        let remaps = self.store.remaps.borrow();
        for (offset, asize, _) in remaps.entries(vdev) {
            live.remove_overlapping(offset, offset + u64::from(asize));
        }
        live.total_bytes() + space.unsettled_bytes()
    }

    /// Moves the copies on the vdev being removed of `pointers` (a walk's
    /// batch, under its read guard), at most [`REMOVAL_COPIES_IN_FLIGHT`] and
    /// [`REMOVAL_BYTES_IN_FLIGHT`] at a time.
    pub(in crate::pool) async fn removal_copy(self: &Rc<Self>, pointers: &[BlockPointer]) {
        let vdev = self.removal_vdev();
        let mut jobs: Vec<(BlockPointer, usize)> = Vec::new();
        {
            let remaps = self.store.remaps.borrow();
            for pointer in pointers {
                for (index, dva) in pointer.copies().enumerate() {
                    let queued = jobs.iter().any(|(other, at)| other.dvas[*at] == *dva);
                    if dva.vdev == vdev && remaps.target(dva).is_none() && !queued {
                        jobs.push((*pointer, index));
                    }
                }
            }
        }
        let mut batches: Vec<&[(BlockPointer, usize)]> = Vec::new();
        let (mut first, mut bytes) = (0, 0u64);
        for (index, (pointer, _)) in jobs.iter().enumerate() {
            let size = u64::from(pointer.physical_size);
            if index > first
                && (index - first == REMOVAL_COPIES_IN_FLIGHT
                    || bytes + size > REMOVAL_BYTES_IN_FLIGHT)
            {
                batches.push(&jobs[first..index]);
                (first, bytes) = (index, 0);
            }
            bytes += size;
        }
        if first < jobs.len() {
            batches.push(&jobs[first..]);
        }
        for batch in batches {
            if self.removal_halting() {
                return;
            }
            let moves = batch
                .iter()
                .map(|(pointer, index)| self.store.move_copy(pointer, *index));
            let results = futures_util::future::join_all(moves).await;
            for ((pointer, index), result) in batch.iter().zip(results) {
                let source = pointer.dvas[*index];
                let target = match result {
                    Ok(target) => target,
                    Err(error) => {
                        self.removal_error(format!(
                            "moving the block at vdev {} offset {:#x} (born in txg {}): {error}",
                            source.vdev, source.offset, pointer.birth_txg
                        ));
                        continue;
                    }
                };
                // Synchronously from here: a free of the block lands either
                // before this (the copy is given back) or after (the entry
                // is there and the free frees the copy too).
                let live = self.store.allocator.borrow().vdevs[vdev as usize]
                    .is_live(source.offset, u64::from(source.asize));
                let known = self.store.remaps.borrow().target(&source).is_some();
                if !live || known {
                    self.store.release(&[target]);
                    continue;
                }
                let inserted = self.store.remaps.borrow_mut().insert(source, target);
                if let Err(error) = inserted {
                    self.store.release(&[target]);
                    self.removal_error(error);
                    continue;
                }
                self.store.allocator.borrow_mut().commit(target);
                let mut state = self.removal.state.borrow_mut();
                state.moved_blocks += 1;
                state.moved_bytes += u64::from(source.asize);
            }
        }
    }

    /// Gives up the removal in progress: every moved copy whose block is
    /// still in use is freed (the others were freed with their block), the
    /// mapping is dropped and the vdev takes blocks again; `reason` goes to
    /// `status` and the events.
    async fn removal_cancel(self: &Rc<Self>, reason: &str) -> Result<(), PoolError> {
        let vdev = self.removal_vdev();
        {
            let remaps = self.store.remaps.borrow();
            let mut allocator = self.store.allocator.borrow_mut();
            let moved: Vec<_> = remaps.entries(vdev).collect();
            for (offset, asize, target) in moved {
                if allocator.vdevs[vdev as usize].is_live(offset, u64::from(asize)) {
                    allocator.free(target);
                }
            }
            allocator.set_removing(vdev, false);
        }
        self.store.remaps.borrow_mut().drop_vdev(vdev);
        if let Some(object) = self.removal.mapping.borrow_mut().take() {
            self.objects.truncate_cached(&object, 0)?;
            self.objects.free_object_cached(&object)?;
        }
        self.removal.entries_on_disk.set(0);
        self.datasets.directory.edit().removing = None;
        {
            let mut state = self.removal.state.borrow_mut();
            state.end(Some((vdev, reason.to_string())));
            state.halt = None;
        }
        if let Some(top) = self.store.vdev(vdev) {
            for leaf in &top.children {
                self.events.post(
                    EventClass::DeviceState,
                    NewEvent::device(
                        leaf.path.borrow().clone(),
                        format!(
                            "the removal of {} stopped: {reason}",
                            top.kind.vdev_name(vdev)
                        ),
                    ),
                );
            }
        }
        self.commit().await
    }

    /// Everything on the vdev moved and is on disk: the vdev becomes
    /// indirect in one txg (config, directory, space), then its devices'
    /// labels are cleared. False, with nothing changed, when something
    /// landed on the vdev since the last walk.
    async fn removal_finish(self: &Rc<Self>) -> Result<bool, PoolError> {
        let vdev = self.removal_vdev();
        let top = self.store.vdev(vdev).expect("the vdev being removed");
        // Open what is freed below, before the change (no await after it).
        let (maps, array) = {
            let allocator = self.store.allocator.borrow();
            let space = &allocator.vdevs[vdev as usize];
            let maps: Vec<u64> = space
                .metaslabs
                .iter()
                .map(|metaslab| metaslab.space_map_object)
                .filter(|&id| id != 0)
                .collect();
            (maps, space.array_object)
        };
        let mut objects = Vec::new();
        for id in maps.iter().copied().chain((array != 0).then_some(array)) {
            objects.push(self.objects.open(id).await?);
        }
        // A resilver walking toward the vdev's devices ends first: its
        // targets would name children the vdev no longer has.
        self.resilver_wait().await;
        if self.removal_left_bytes() != 0 || self.log_chains_use(vdev) {
            return Ok(false);
        }
        assert!(
            self.store.remaps.borrow_mut().take_pending().is_empty(),
            "every entry is on disk"
        );
        // From here on, synchronously: the vdev becomes indirect.
        let switch_txg = self.txg.open();
        self.drop_log_releases_on(vdev);
        // A spare standing in a device of the vdev is available again.
        let spares: Vec<u64> = top
            .children
            .iter()
            .filter(|leaf| self.spare_left_tree(leaf.guid(), leaf.device()))
            .map(|leaf| leaf.guid())
            .collect();
        let indirect = TopVdev::new(
            vdev,
            top.guid,
            TopVdevKind::Indirect,
            top.ashift,
            top.asize_bytes,
            top.metaslab_shift,
            Vec::new(),
        )
        .expect("an indirect vdev has no layout");
        self.store.replace_vdev(Rc::new(indirect));
        self.store.remaps.borrow_mut().finish_removing();
        self.store.allocator.borrow_mut().drop_space(vdev);
        for object in &objects {
            self.objects.truncate_cached(object, 0)?;
            self.objects.free_object_cached(object)?;
        }
        {
            let mut config = self.config.borrow_mut();
            let slot = &mut config.vdevs[vdev as usize];
            slot.kind = TopVdevKind::Indirect;
            slot.children.clear();
        }
        self.config_dirty.set(true);
        // What moved over the whole removal (the task's counts start again
        // when an import resumes it): the mapping's.
        let (moved_blocks, moved_bytes) = {
            let mut directory = self.datasets.directory.edit();
            let mut record = directory
                .removing
                .take()
                .expect("the removal is in the directory");
            record.finished_unix_seconds = crate::pool::scan::scrub::unix_seconds();
            record.moved_blocks = self.store.remaps.borrow().len(vdev) as u64;
            record.moved_bytes = self
                .store
                .remaps
                .borrow()
                .entries(vdev)
                .map(|(_, asize, _)| u64::from(asize))
                .sum();
            let moved = (record.moved_blocks, record.moved_bytes);
            directory.indirect.push(record);
            directory.metaslab_arrays[vdev as usize] = 0;
            moved
        };
        *self.removal.mapping.borrow_mut() = None;
        self.removal.entries_on_disk.set(0);
        self.removal.state.borrow_mut().end(None);
        let name = top.kind.vdev_name(vdev);
        for leaf in &top.children {
            self.events.post(
                EventClass::DeviceState,
                NewEvent::device(
                    leaf.path.borrow().clone(),
                    format!(
                        "removed with {name}: {moved_blocks} blocks ({moved_bytes} bytes) moved"
                    ),
                ),
            );
        }
        if let Err(error) = self.commit().await {
            // The change is made in memory; the suspended pool writes it
            // when it retries the txg. Until then the devices keep their
            // labels (an import before that resumes the removal).
            eprintln!("ironpool: {}: removal of {name}: {error}", self.name);
            return Ok(true);
        }
        // Reads and repairs that went to the devices before the change end
        // before the devices close.
        self.store.reads_quiesced(switch_txg).await;
        self.store.repairs_quiesced().await;
        for leaf in top
            .children
            .iter()
            .filter(|leaf| !spares.contains(&leaf.guid()))
        {
            crate::pool::labels::clear_leaf_labels(&self.name, leaf, "removed").await;
            leaf.close();
        }
        Ok(true)
    }
}

/// A txg's build step: appends the mapping entries of the removal in
/// progress made since the last build (creating the object with the first).
/// True when it changed anything.
pub(in crate::pool) fn build_step(pool: &Pool, txg: u64) -> Result<bool, ObjectError> {
    let pending = pool.store.remaps.borrow_mut().take_pending();
    if pending.is_empty() {
        return Ok(false);
    }
    let held = pool.removal.mapping.borrow().clone();
    let object = match held {
        Some(object) => object,
        None => {
            let (id, object) = pool.create_metadata_object(ObjectType::IndirectMapping, txg);
            pool.datasets
                .directory
                .edit()
                .removing
                .as_mut()
                .expect("entries are made by a removal in the directory")
                .mapping = id;
            pool.removal.entries_on_disk.set(0);
            *pool.removal.mapping.borrow_mut() = Some(object.clone());
            object
        }
    };
    let offset = pool.removal.entries_on_disk.get() * MAPPING_ENTRY_BYTES as u64;
    pool.objects
        .write_bytes_cached(&object, offset, &encode_entries(&pending))?;
    pool.removal
        .entries_on_disk
        .set(pool.removal.entries_on_disk.get() + pending.len() as u64);
    Ok(true)
}
