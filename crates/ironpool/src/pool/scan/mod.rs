//! Walking every block tree of the pool: the part scrub and resilver share.
//!
//! Every object (from the dnode table, so snapshots that nobody opened are
//! walked too) is walked top-down, a node at a time: the pointers in one node
//! are handed to the scan together (the scan bounds how many it has in flight)
//! while a read guard keeps their space from being reused meanwhile. A
//! resilver walks only subtrees that can hold blocks born in the txgs it
//! repairs: copy-on-write rewrites a pointer whenever anything beneath it
//! changes, so a pointer born before the oldest such txg has nothing newer
//! beneath it.
//!
//! Blocks shared by snapshots are visited once, by birth txg (as OpenZFS
//! scans): a volume's oldest snapshot is walked whole, each later snapshot
//! and the volume itself only beneath pointers born after the snapshot before
//! it, and a clone only beneath pointers born after its origin snapshot.
//! Anything older in their trees is in that earlier snapshot's tree (a block
//! is born into one tree and only leaves trees after), and is visited there.
//! See [`Pool::scan_floor_txg`]. A snapshot destroyed while a walk runs may
//! leave the blocks it shared with the next one unvisited by that walk (they
//! are the next scrub's).
//!
//! The walk of a volume or snapshot destroyed under it stops at once: its
//! blocks are freed, and the space of those freed before the walk's read
//! guard may already hold other blocks, which the walk would report as bad
//! and "repair" with the old contents. Such a walk visited less than the
//! devices' logs need: it does not catch a resilver's devices up.

pub mod check;
pub mod resilver;
pub mod scrub;
pub mod trim;

use std::rc::Rc;

use crate::format::dnode::DNODE_BYTES;
use crate::format::{BlockPointer, Dnode};
use crate::object::{NodeBody, Object, ObjectSet};
use crate::pool::filesystem::OBJECTS_PER_TURN;
use crate::pool::scan::resilver::ResilverTargets;
use crate::pool::{Pool, PoolError};
use crate::rt::JoinHandle;

/// The background scans' state: the scrub, the resilver and trimming. Its
/// fields are private to this room (`scan/`): the pool holds it, and every
/// other room reaches a scan through the methods on [`Pool`] that scrub.rs,
/// resilver.rs and trim.rs define.
#[derive(Default)]
pub struct Scans {
    scrub: std::cell::RefCell<scrub::ScrubState>,
    resilver: std::cell::RefCell<resilver::ResilverState>,
    /// Autotrim's queue and `ironpool trim` (see [`trim`]).
    trim: std::cell::RefCell<trim::TrimState>,
    /// Discards of free space ended, giving it back to allocation: a write
    /// that found the pool full waits for it.
    trims_ended: crate::rt::sync::Notify,
}

/// Most error descriptions a scan keeps for `status`: enough to find the
/// damaged objects, bounded so a dying device cannot grow memory without end.
const ERROR_DETAILS_MAX: usize = 32;

/// Keeps `detail` among a scan's error descriptions while there is room.
pub(in crate::pool) fn keep_error_detail(details: &mut Vec<String>, detail: String) {
    if details.len() < ERROR_DETAILS_MAX {
        details.push(detail);
    }
}

/// A scan's progress for `status`: bytes examined against the bytes it set
/// out to examine. A scan of nothing is 0% while it runs and 100% after.
pub(in crate::pool) fn progress_percent(examined: u64, total: u64, running: bool) -> f64 {
    match (total, running) {
        (0, true) => 0.0,
        (0, false) => 100.0,
        _ => (examined as f64 * 100.0 / total as f64).min(100.0),
    }
}

/// Seconds a running scan started at `started` still needs at the rate so
/// far (none before any progress, or when it is not running).
pub(in crate::pool) fn eta_seconds(
    started: Option<crate::rt::Instant>,
    examined: u64,
    total: u64,
) -> Option<u64> {
    let started = started.filter(|_| examined > 0)?;
    let elapsed = crate::rt::now().duration_since(started).as_secs_f64();
    let remaining = total.saturating_sub(examined) as f64;
    Some((elapsed * remaining / examined as f64).ceil() as u64)
}

/// Waits for a scan's task (taken out of its state first, so no borrow is
/// held across the wait).
pub(in crate::pool) async fn wait_task(task: Option<JoinHandle<()>>) {
    if let Some(task) = task {
        task.await;
    }
}

/// How a walk of every object ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum WalkEnd {
    /// Every object was walked (errors, if any, went to the scan's count).
    Finished,
    /// The scan was asked to stop: the objects from the one it was in on
    /// were not (all) walked.
    Stopped,
}

/// What a walk does with the pointers it finds.
pub(in crate::pool) enum Scan {
    /// Verify every copy of every block, repair bad ones.
    Scrub,
    /// Rewrite blocks born in the txgs some devices missed, onto them.
    Resilver(Rc<ResilverTargets>),
    /// Move the copies on the vdev being removed (see `pool::removal`).
    Remove,
}

impl Scan {
    /// Blocks born before this txg are skipped with everything beneath them.
    fn min_birth_txg(&self) -> u64 {
        match self {
            Scan::Scrub | Scan::Remove => 0,
            Scan::Resilver(targets) => targets.min_birth_txg(),
        }
    }

    fn cancelled(&self, pool: &Pool) -> bool {
        match self {
            Scan::Scrub => pool.scans.scrub.borrow().stopping(),
            Scan::Resilver(_) => pool.scans.resilver.borrow().cancelled(),
            Scan::Remove => pool.removal_halting(),
        }
    }

    /// Counts an error and keeps its description.
    fn error(&self, pool: &Pool, detail: String) {
        match self {
            Scan::Scrub => pool.scrub_error(detail),
            Scan::Resilver(_) => pool.resilver_error(detail),
            Scan::Remove => pool.removal_error(detail),
        }
    }

    /// Every object below `next_object` is walked.
    fn walked_below(&self, pool: &Pool, next_object: u64) {
        if let Scan::Scrub = self {
            pool.scrub_bookmark(next_object);
        }
    }

    /// The walk stopped at an object destroyed under it (see the module).
    fn vanished(&self, pool: &Pool) {
        match self {
            Scan::Scrub => pool.scans.scrub.borrow_mut().walk_incomplete = true,
            Scan::Resilver(_) => pool.resilver_walk_incomplete(),
            // What it missed is still in use on the vdev: the next walk.
            Scan::Remove => {}
        }
    }

    async fn process(&self, pool: &Rc<Pool>, object: &Rc<Object>, pointers: &[BlockPointer]) {
        match self {
            Scan::Scrub => pool.scrub_pointers(object, pointers).await,
            Scan::Resilver(targets) => pool.resilver_pointers(targets, pointers).await,
            Scan::Remove => pool.removal_copy(pointers).await,
        }
    }

    /// Progress for subtrees skipped whole: an estimate of the bytes beneath.
    fn skipped(&self, pool: &Pool, dnode: &Dnode, pointers: &[BlockPointer]) {
        if let Scan::Resilver(_) = self {
            let beneath = |pointer: &BlockPointer| {
                if pointer.level == 0 {
                    0
                } else {
                    pointer.fill.saturating_mul(dnode.data_block_bytes())
                }
            };
            let bytes: u64 = pointers
                .iter()
                .map(|pointer| pointer.allocated_bytes() + beneath(pointer))
                .sum();
            pool.scans.resilver.borrow_mut().examined_bytes += bytes;
        }
    }
}

/// Blocks of a claimed intent log handed to a scan at once (as a tree's
/// node hands its pointers): bounds the reads one batch puts in flight.
const SCAN_CLAIMED_BATCH: usize = 128;

impl Pool {
    /// Walks every object numbered `first_object` or more for `scan`, in
    /// object order, each below its floor ([`Pool::scan_floor_txg`]). Errors
    /// (also failing to list the objects) go to the scan's count; an object
    /// cut short by a stop is not counted as walked.
    pub(in crate::pool) async fn walk_objects(
        self: &Rc<Self>,
        scan: &Scan,
        first_object: u64,
    ) -> WalkEnd {
        let objects = match self.all_objects().await {
            Ok(objects) => objects,
            Err(error) => {
                scan.error(self, format!("listing objects: {error}"));
                return WalkEnd::Finished;
            }
        };
        for object in objects
            .into_iter()
            .filter(|object| object.id >= first_object)
        {
            if scan.cancelled(self) {
                return WalkEnd::Stopped;
            }
            if let Err(error) = self
                .scan_object(&self.objects, &object, scan, self.scan_floor_txg(object.id))
                .await
            {
                scan.error(self, format!("object {}: {error}", object.id));
            }
            match self.filesystem_of_table(&object).await {
                Ok(Some(fs)) => {
                    let floor = self.scan_floor_txg(object.id);
                    if let Err(error) = self.scan_filesystem(&fs, scan, floor).await {
                        scan.error(self, format!("{}: {error}", fs.name()));
                    }
                }
                Ok(None) => {}
                Err(error) => scan.error(self, format!("object {}: {error}", object.id)),
            }
            if scan.cancelled(self) {
                return WalkEnd::Stopped;
            }
            scan.walked_below(self, object.id + 1);
        }
        WalkEnd::Finished
    }

    /// Every object of the pool: the dnode table, then every allocated dnode.
    pub(in crate::pool) async fn all_objects(&self) -> Result<Vec<Rc<Object>>, PoolError> {
        let table = self.objects.dnode_table();
        let count = table.length_bytes() / DNODE_BYTES as u64;
        let mut objects = vec![table.clone()];
        for id in 1..count {
            if id.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            if let Some(object) = self.objects.get(id) {
                objects.push(object);
                continue;
            }
            let bytes = self
                .objects
                .read_bytes(&table, id * DNODE_BYTES as u64, DNODE_BYTES)
                .await?;
            let dnode = Dnode::decode(&bytes)
                .map_err(|error| PoolError::Corrupt(format!("dnode {id}: {error}")))?;
            if dnode.is_free() {
                continue;
            }
            match self.objects.open(id).await {
                Ok(object) => objects.push(object),
                // Freed between the read and the open: nothing to scan.
                Err(crate::object::ObjectError::NoSuchObject(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(objects)
    }

    /// The txg at or before which the blocks of object `object_id` are
    /// visited through another object (0: none, walk it whole): for a volume
    /// or snapshot, the txg of the snapshot before it, or of its origin for a
    /// clone's first. Read from the directory as it is when the object's walk
    /// begins.
    pub(in crate::pool) fn scan_floor_txg(&self, object_id: u64) -> u64 {
        let directory = self.datasets.directory.read();
        let origin_txg = |record: &crate::pool::dataset::directory::Lineage| -> u64 {
            let Some(origin) = &record.origin else {
                return 0;
            };
            directory
                .snapshot(origin)
                .map_or(0, |snapshot| snapshot.txg)
        };
        let heads = directory
            .volumes
            .values()
            .map(|record| (record.object, &record.lineage))
            .chain(
                directory
                    .filesystems
                    .values()
                    .map(|record| (record.object, &record.lineage)),
            );
        for (head, record) in heads {
            if head == object_id {
                return record
                    .snapshots
                    .last()
                    .map_or_else(|| origin_txg(record), |snapshot| snapshot.txg);
            }
            if let Some(index) = record
                .snapshots
                .iter()
                .position(|snapshot| snapshot.object == object_id)
            {
                return if index == 0 {
                    origin_txg(record)
                } else {
                    record.snapshots[index - 1].txg
                };
            }
        }
        0
    }

    /// The filesystem whose dnode table is `object`, if it is one: a head,
    /// or a snapshot's (opened read-only).
    async fn filesystem_of_table(
        self: &Rc<Self>,
        object: &Rc<Object>,
    ) -> Result<Option<Rc<crate::pool::filesystem::Filesystem>>, PoolError> {
        if object.object_type() != crate::format::ObjectType::FsObjects {
            return Ok(None);
        }
        let head = self
            .datasets
            .filesystems
            .all()
            .into_iter()
            .find(|fs| Rc::ptr_eq(&fs.table, object));
        if head.is_some() {
            return Ok(head);
        }
        let snapshot =
            self.datasets
                .directory
                .read()
                .filesystems
                .iter()
                .find_map(|(short, record)| {
                    record
                        .lineage
                        .snapshots
                        .iter()
                        .find(|snapshot| snapshot.object == object.id)
                        .map(|snapshot| format!("{}/{short}@{}", self.name, snapshot.name))
                });
        match snapshot {
            Some(name) => Ok(Some(self.snapshot_filesystem(&name).await?)),
            None => Ok(None),
        }
    }

    /// Walks every object of a filesystem (its table was walked as a pool
    /// object), below pointers born after `floor_txg` (older ones belong
    /// to an earlier snapshot, walked through it). A file removed
    /// meanwhile is skipped: its blocks are free.
    async fn scan_filesystem(
        self: &Rc<Self>,
        fs: &crate::pool::filesystem::Filesystem,
        scan: &Scan,
        floor_txg: u64,
    ) -> Result<(), PoolError> {
        let count = fs.table.length_bytes() / DNODE_BYTES as u64;
        for id in 1..count {
            if scan.cancelled(self) {
                return Ok(());
            }
            // A filesystem of small files is mostly objects whose blocks
            // are in memory or few: without a turn now and then, their
            // walk held every client of the pool (0.2 s for 100k files).
            if id.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            let object = match fs.objects.open(id).await {
                Ok(object) => object,
                Err(crate::object::ObjectError::NoSuchObject(_)) => continue,
                Err(error) => return Err(error.into()),
            };
            self.scan_object(&fs.objects, &object, scan, floor_txg)
                .await?;
        }
        self.scan_claimed_log(fs, scan).await;
        Ok(())
    }

    /// A scrub or resilver of filesystem `fs` reads what its intent log,
    /// claimed at import, holds until its key's load replays it: the blocks
    /// its records link (verified and repaired as a tree's are) and the
    /// chain's own blocks (each checksums itself: a scrub counts a bad
    /// copy, a resilver rewrites it on the children it rebuilds). A
    /// removal never meets one: it is refused while a claimed chain holds
    /// space on its vdev.
    async fn scan_claimed_log(
        self: &Rc<Self>,
        fs: &crate::pool::filesystem::Filesystem,
        scan: &Scan,
    ) {
        let Some(space) = fs.log.claimed() else {
            return;
        };
        if matches!(scan, Scan::Remove) {
            return;
        }
        // A replay at `load-key` or a destroy may free the claim meanwhile:
        // each batch checks it is still held and keeps its space from
        // reuse while it reads (and a resilver writes), as a tree's walk
        // does with `still_open`.
        for blocks in space.blocks.chunks(SCAN_CLAIMED_BATCH) {
            if !fs.log.is_claimed() {
                return;
            }
            let _guard = self.store.read_guard();
            scan.process(self, &fs.table, blocks).await;
        }
        let verify = |bytes: &[u8]| crate::format::intent_log::verifies_itself(bytes);
        for pointer in &space.chain {
            if !fs.log.is_claimed() {
                return;
            }
            let _guard = self.store.read_guard();
            let bytes = u64::from(pointer.bytes);
            let result = match scan {
                Scan::Resilver(targets) => self
                    .store
                    .resilver_self_checked(pointer.dva, bytes, &verify, &|vdev| {
                        let top = self.store.vdevs()[vdev as usize].clone();
                        targets
                            .children_of(vdev)
                            .into_iter()
                            .filter(|child| top.children[*child].is_online())
                            .collect()
                    })
                    .await
                    .map(|rewritten| {
                        let mut state = self.scans.resilver.borrow_mut();
                        state.rewritten_blocks += rewritten.copies;
                        state.rewritten_bytes += rewritten.bytes;
                    }),
                _ => self
                    .store
                    .read_self_checked(pointer.dva, bytes, &verify)
                    .await
                    .map(|_| ()),
            };
            if let Err(error) = result {
                scan.error(
                    self,
                    format!("{}: claimed intent log block: {error}", fs.name()),
                );
            }
        }
    }

    /// True while `object` is the open object of its id in `objects`:
    /// destroying a volume or a snapshot forgets its object in the step that
    /// frees its blocks (a read guard taken before then keeps their space).
    fn still_open(objects: &ObjectSet, object: &Rc<Object>) -> bool {
        objects
            .get(object.id)
            .is_some_and(|open| Rc::ptr_eq(&open, object))
    }

    /// Walks one object's tree for `scan`, node by node from the top, below
    /// pointers born after `floor_txg` only (see [`Pool::scan_floor_txg`]).
    pub(in crate::pool) async fn scan_object(
        self: &Rc<Self>,
        objects: &Rc<ObjectSet>,
        object: &Rc<Object>,
        scan: &Scan,
        floor_txg: u64,
    ) -> Result<(), PoolError> {
        let dnode = object.dnode();
        let min_birth = scan.min_birth_txg();
        let root = dnode.root;
        // Older blocks were visited through the object holding them earlier.
        if root.is_hole() || root.birth_txg <= floor_txg {
            return Ok(());
        }
        if root.birth_txg < min_birth {
            scan.skipped(self, &dnode, &[root]);
            return Ok(());
        }
        {
            let _guard = self.store.read_guard();
            if !Self::still_open(objects, object) {
                if Rc::ptr_eq(objects, &self.objects) {
                    scan.vanished(self);
                }
                return Ok(());
            }
            scan.process(self, object, &[root]).await;
        }
        let shift = dnode.pointers_per_indirect_shift();
        let mut frontier: Vec<u64> = vec![0];
        for level in (1..dnode.levels).rev() {
            let mut next = Vec::new();
            for blkid in frontier {
                if scan.cancelled(self) {
                    return Ok(());
                }
                let guard = self.store.read_guard();
                if !Self::still_open(objects, object) {
                    if Rc::ptr_eq(objects, &self.objects) {
                        scan.vanished(self);
                    }
                    return Ok(());
                }
                let node = objects.node(object, level, blkid).await?;
                let children: Vec<(u64, BlockPointer)> = match &*node.body.borrow() {
                    NodeBody::Indirect(pointers) => pointers
                        .iter()
                        .enumerate()
                        .filter(|(_, pointer)| !pointer.is_hole() && pointer.birth_txg > floor_txg)
                        .map(|(index, pointer)| ((blkid << shift) + index as u64, *pointer))
                        .collect(),
                    NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
                };
                drop(node);
                let (wanted, skipped): (Vec<_>, Vec<_>) = children
                    .into_iter()
                    .partition(|(_, pointer)| pointer.birth_txg >= min_birth);
                scan.skipped(
                    self,
                    &dnode,
                    &skipped
                        .iter()
                        .map(|(_, pointer)| *pointer)
                        .collect::<Vec<_>>(),
                );
                let pointers: Vec<BlockPointer> =
                    wanted.iter().map(|(_, pointer)| *pointer).collect();
                scan.process(self, object, &pointers).await;
                drop(guard);
                if level > 1 {
                    next.extend(wanted.iter().map(|(child, _)| *child));
                }
            }
            frontier = next;
        }
        Ok(())
    }
}
