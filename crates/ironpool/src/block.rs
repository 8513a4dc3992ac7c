//! The block pipeline: one block's journey to and from the devices.
//!
//! Reading a block tries its copies (DVAs) in turn; each top-level vdev tries its
//! children (mirror sides) until the bytes match the block pointer's checksum. A
//! copy that was bad — unreadable or wrong — is rewritten from the good one
//! (self-heal) and counted on its device. Only when no copy verifies does the read
//! fail, and then it fails loudly: wrong data is never returned.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::alloc::{Allocator, BlockClass, NoSpace};
use crate::format::bp::DVA_COUNT;
use crate::format::{BlockPointer, Dva};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Notify;
use crate::vdev::queue::{IoClass, IoFlags};
use crate::vdev::TopVdev;

/// Why a block could not be read or written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BlockError {
    #[error("no valid copy of the block at {location}: {detail}")]
    Unreadable { location: String, detail: String },
    #[error("could not write the block at {location}: {detail}")]
    WriteFailed { location: String, detail: String },
    #[error("the pool is out of space")]
    NoSpace,
}

impl From<NoSpace> for BlockError {
    fn from(_: NoSpace) -> BlockError {
        BlockError::NoSpace
    }
}

/// Counters of the pipeline (pool-wide).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct BlockStats {
    /// Blocks read whose first copy tried was bad but another was good.
    pub healed_reads: u64,
    /// Repair writes issued.
    pub repair_writes: u64,
    /// Blocks for which no copy verified.
    pub unrecoverable_reads: u64,
}

/// Devices, allocator, and the rules for reading and writing blocks.
pub struct BlockStore {
    pub vdevs: Vec<Rc<TopVdev>>,
    pub allocator: RefCell<Allocator>,
    repairs_in_flight: Cell<u32>,
    repairs_done: Notify,
    stats: Cell<BlockStats>,
    /// The open txg, to stamp reads with (see `ReadGuard`).
    open_txg: Cell<u64>,
    /// Reads in flight by the open txg in which they started.
    reads_by_txg: RefCell<std::collections::BTreeMap<u64, u32>>,
    reads_done: Notify,
}

/// Held for the duration of a block read. A block looked up during open txg X can
/// be freed no earlier than X and reused no earlier than after txg X + 2 commits;
/// the commit waits for reads that started in X to finish before releasing X's
/// frees, so a read never sees space that was handed to another block.
pub struct ReadGuard {
    store: Rc<BlockStore>,
    txg: u64,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        let mut reads = self.store.reads_by_txg.borrow_mut();
        if let Some(count) = reads.get_mut(&self.txg) {
            *count -= 1;
            if *count == 0 {
                reads.remove(&self.txg);
                drop(reads);
                self.store.reads_done.notify_all();
            }
        }
    }
}

fn location(dva: &Dva) -> String {
    format!("vdev {} offset {:#x}", dva.vdev, dva.offset)
}

impl BlockStore {
    pub fn new(vdevs: Vec<Rc<TopVdev>>, allocator: Allocator) -> Rc<BlockStore> {
        Rc::new(BlockStore {
            vdevs,
            allocator: RefCell::new(allocator),
            repairs_in_flight: Cell::new(0),
            repairs_done: Notify::new(),
            stats: Cell::new(BlockStats::default()),
            open_txg: Cell::new(1),
            reads_by_txg: RefCell::new(Default::default()),
            reads_done: Notify::new(),
        })
    }

    pub fn set_open_txg(&self, txg: u64) {
        self.open_txg.set(txg);
    }

    /// Marks a read (or a walk that will read what it looked up) as in flight.
    pub fn read_guard(self: &Rc<Self>) -> ReadGuard {
        let txg = self.open_txg.get();
        *self.reads_by_txg.borrow_mut().entry(txg).or_insert(0) += 1;
        ReadGuard { store: self.clone(), txg }
    }

    /// Waits until no read that started in txg `txg` or earlier is in flight.
    pub async fn reads_quiesced(&self, txg: u64) {
        loop {
            let busy = self.reads_by_txg.borrow().range(..=txg).next().is_some();
            if !busy {
                return;
            }
            self.reads_done.notified().await;
        }
    }

    pub fn stats(&self) -> BlockStats {
        self.stats.get()
    }

    fn count(&self, update: impl FnOnce(&mut BlockStats)) {
        let mut stats = self.stats.get();
        update(&mut stats);
        self.stats.set(stats);
    }

    /// True when every top-level vdev keeps more than one copy of what it stores.
    pub fn all_vdevs_redundant(&self) -> bool {
        self.vdevs.iter().all(|top| top.children.len() > 1)
    }

    /// Allocates space for a block of `physical_bytes` with `copies` copies.
    pub fn allocate(&self, physical_bytes: u64, metadata: bool, copies: usize) -> Result<[Dva; DVA_COUNT], NoSpace> {
        let mut allocator = self.allocator.borrow_mut();
        let mut dvas = [Dva::default(); DVA_COUNT];
        for copy in 0..copies.clamp(1, DVA_COUNT) {
            let class = if metadata { BlockClass::Metadata(copy) } else { BlockClass::Data };
            let avoid = if copy > 0 { Some(dvas[0]) } else { None };
            match allocator.allocate(physical_bytes, class, avoid) {
                Ok(dva) => dvas[copy] = dva,
                Err(NoSpace) if copy > 0 => break, // fewer copies beats failing the txg
                Err(NoSpace) => return Err(NoSpace),
            }
        }
        Ok(dvas)
    }

    /// Returns never-committed allocations.
    pub fn release(&self, dvas: &[Dva]) {
        let mut allocator = self.allocator.borrow_mut();
        for dva in dvas.iter().filter(|dva| !dva.is_empty()) {
            allocator.release(*dva);
        }
    }

    /// Records a block's space as used from the open txg on.
    pub fn commit(&self, bp: &BlockPointer) {
        let mut allocator = self.allocator.borrow_mut();
        for dva in bp.copies() {
            allocator.commit(*dva);
        }
    }

    /// Records a block's space as freed in the open txg.
    pub fn free(&self, bp: &BlockPointer) {
        let mut allocator = self.allocator.borrow_mut();
        for dva in bp.copies() {
            allocator.free(*dva);
        }
    }

    /// Writes `data` to every copy in `dvas`. Succeeds when every copy reached at
    /// least one device.
    pub async fn write(&self, dvas: &[Dva], data: BufSlice, class: IoClass) -> Result<(), BlockError> {
        if dvas.len() > 1 && dvas[1].is_empty() || dvas.len() == 1 {
            // One copy (data blocks): no join machinery on the hot path.
            let dva = dvas[0];
            return self.vdevs[dva.vdev as usize]
                .write(class, dva.offset, data, IoFlags::default())
                .await
                .map_err(|error| BlockError::WriteFailed { location: location(&dva), detail: error.to_string() });
        }
        let writes = dvas.iter().filter(|dva| !dva.is_empty()).map(|dva| {
            let top = self.vdevs[dva.vdev as usize].clone();
            let data = data.clone();
            let offset = dva.offset;
            async move { top.write(class, offset, data, IoFlags::default()).await }
        });
        let results = futures_util::future::join_all(writes).await;
        for (result, dva) in results.into_iter().zip(dvas.iter()) {
            if let Err(error) = result {
                return Err(BlockError::WriteFailed { location: location(dva), detail: error.to_string() });
            }
        }
        Ok(())
    }

    /// Reads and verifies a block, repairing bad copies in the background.
    pub async fn read(self: &Rc<Self>, bp: &BlockPointer, class: IoClass) -> Result<AlignedBuf, BlockError> {
        assert!(!bp.is_hole(), "read of a hole");
        let _guard = self.read_guard();
        let physical = bp.physical_size as usize;
        let verify = |data: &[u8]| bp.checksum_algo.verify(&data[..physical], &bp.checksum);
        let mut bad_copies: Vec<Dva> = Vec::new();
        let mut details = Vec::new();
        for dva in bp.copies() {
            let Some(top) = self.vdevs.get(dva.vdev as usize) else {
                details.push(format!("copy on missing vdev {}", dva.vdev));
                continue;
            };
            let length = top.allocated_size(physical as u64);
            match top.read_verified(class, dva.offset, length, &verify).await {
                Ok(read) => {
                    let data = read.data.into_shared();
                    if !read.bad_children.is_empty() || !bad_copies.is_empty() {
                        self.count(|stats| stats.healed_reads += 1);
                    }
                    for child in read.bad_children {
                        self.spawn_repair(top.clone(), Some(child), dva.offset, BufSlice::whole(data.clone()));
                    }
                    for bad in &bad_copies {
                        let bad_top = self.vdevs[bad.vdev as usize].clone();
                        self.spawn_repair(bad_top, None, bad.offset, BufSlice::whole(data.clone()));
                    }
                    let mut data = Rc::try_unwrap(data).unwrap_or_else(|shared| AlignedBuf::copy_from(&shared));
                    // The physical bytes: the logical block, or its compressed form.
                    data.truncate(physical);
                    return Ok(data);
                }
                Err(error) => {
                    bad_copies.push(*dva);
                    details.push(error.to_string());
                }
            }
        }
        self.count(|stats| stats.unrecoverable_reads += 1);
        let first = bp.dvas[0];
        Err(BlockError::Unreadable { location: location(&first), detail: details.join("; ") })
    }

    /// Reads every copy on every device (scrub); rewrites the bad ones from a good
    /// one. Returns (bad copies found, repaired); an error when none verifies.
    pub async fn scrub(self: &Rc<Self>, bp: &BlockPointer) -> Result<(u64, u64), BlockError> {
        let physical = bp.physical_size as usize;
        let verify = |data: &[u8]| bp.checksum_algo.verify(&data[..physical], &bp.checksum);
        let mut good: Option<Rc<AlignedBuf>> = None;
        let mut bad: Vec<(Rc<TopVdev>, Option<usize>, u64)> = Vec::new();
        for dva in bp.copies() {
            let Some(top) = self.vdevs.get(dva.vdev as usize) else { continue };
            let length = top.allocated_size(physical as u64);
            let (copy, bad_children) = top.read_every_copy(dva.offset, length, &verify).await;
            match copy {
                Some(data) => {
                    if good.is_none() {
                        good = Some(data.into_shared());
                    }
                    bad.extend(bad_children.into_iter().map(|child| (top.clone(), Some(child), dva.offset)));
                }
                None => bad.push((top.clone(), None, dva.offset)),
            }
        }
        let Some(good) = good else {
            self.count(|stats| stats.unrecoverable_reads += 1);
            return Err(BlockError::Unreadable { location: location(&bp.dvas[0]), detail: "no copy verifies".into() });
        };
        let found = bad.len() as u64;
        let mut repaired = 0;
        for (top, child, offset) in bad {
            if self.repair(top, child, offset, BufSlice::whole(good.clone()), IoClass::Scrub).await {
                repaired += 1;
            }
        }
        Ok((found, repaired))
    }

    fn spawn_repair(self: &Rc<Self>, top: Rc<TopVdev>, child: Option<usize>, offset: u64, data: BufSlice) {
        let store = self.clone();
        // Count it now, before the task runs, so no deferred free is released
        // while the repair is queued.
        store.repairs_in_flight.set(store.repairs_in_flight.get() + 1);
        crate::rt::spawn(async move {
            store.repair_counted(top, child, offset, data, IoClass::AsyncWrite).await;
        });
    }

    /// Rewrites a bad copy: one child of a top-level vdev, or (child None) all of
    /// them. While any repair is in flight, deferred frees are not released, so the
    /// space being repaired cannot be handed to another block meanwhile.
    async fn repair(&self, top: Rc<TopVdev>, child: Option<usize>, offset: u64, data: BufSlice, class: IoClass) -> bool {
        self.repairs_in_flight.set(self.repairs_in_flight.get() + 1);
        self.repair_counted(top, child, offset, data, class).await
    }

    async fn repair_counted(&self, top: Rc<TopVdev>, child: Option<usize>, offset: u64, data: BufSlice, class: IoClass) -> bool {
        self.count(|stats| stats.repair_writes += 1);
        let children: Vec<usize> = match child {
            Some(child) => vec![child],
            None => (0..top.children.len()).filter(|index| top.children[*index].is_online()).collect(),
        };
        let mut all_ok = true;
        for index in children {
            if top.repair(index, offset, data.clone(), class).await.is_err() {
                all_ok = false;
            }
        }
        self.repairs_in_flight.set(self.repairs_in_flight.get() - 1);
        if self.repairs_in_flight.get() == 0 {
            self.repairs_done.notify_all();
        }
        all_ok
    }

    /// Waits until no repair write is in flight.
    pub async fn repairs_quiesced(&self) {
        while self.repairs_in_flight.get() > 0 {
            self.repairs_done.notified().await;
        }
    }

    /// Flushes every device of every top-level vdev.
    pub async fn flush_all(&self) -> Result<(), BlockError> {
        let flushes = self.vdevs.iter().map(|top| top.flush());
        for (result, top) in futures_util::future::join_all(flushes).await.into_iter().zip(self.vdevs.iter()) {
            if let Err(error) = result {
                return Err(BlockError::WriteFailed { location: format!("vdev {}", top.id), detail: format!("flush: {error}") });
            }
        }
        Ok(())
    }
}
