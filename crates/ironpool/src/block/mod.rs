//! The block pipeline: one block's journey to and from the devices.
//!
//! Reading a block tries its copies (DVAs) in turn; each top-level vdev tries its
//! children (mirror sides) until the bytes match the block pointer's checksum. A
//! copy that was bad — unreadable or wrong — is rewritten from the good one
//! (self-heal) and counted on its device. Only when no copy verifies does the read
//! fail, and then it fails loudly: wrong data is never returned.
//!
//! A write that some child missed (away, or its part failed) still succeeds
//! while the vdev's redundancy covers it; the child's dirty time log gets the
//! block's birth txg once the block is linked ([`BlockStore::commit`]), so a
//! resilver knows what to rewrite there.

pub mod clones;
pub mod compress;
pub mod remap;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::alloc::{Allocator, BlockClass, NoSpace, VdevSpace};
use crate::cache::{BlockCache, CacheUse, Cached};
use crate::events::{EventClass, EventLog, NewEvent, RateLimit};
use crate::format::bp::DVA_COUNT;
use crate::format::label::TopVdevKind;
use crate::format::{BlockPointer, Dva};
use crate::queue::{IoClass, IoFlags};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Notify;
use crate::vdev::raidz::{PrecomputedParity, RaidzGeometry};
use crate::vdev::run::RunBlock;
use crate::vdev::{TopVdev, VdevError, WriteOutcome};

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

/// The blocks of a `write_run` going to one top-level vdev: their indexes in
/// the run and the blocks.
type VdevRun = (Vec<usize>, Vec<RunBlock>);

/// What a resilver of one block wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Children written (one block rewritten on two devices counts two).
    pub copies: u64,
    /// Bytes written to them: the whole block on a mirror side, the child's
    /// column on RAID-Z.
    pub bytes: u64,
}

/// Work done for a block ahead of its write, so the write costs less where it
/// must be fast (today the RAID-Z parity of its bytes; see
/// [`BlockStore::prepare`]). Opaque above this layer: write-back holds it with
/// the block and hands it back to [`BlockStore::write_run`], and never needs to
/// know which vdev kind it was for.
#[derive(Clone, Default)]
pub struct StorePrep(Option<Rc<PrecomputedParity>>);

impl StorePrep {
    /// Memory it holds beyond the block itself.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |parity| parity.bytes())
    }

    /// Itself if the block is stored as the bytes it was prepared from, else
    /// nothing (a compressed block's stored bytes differ).
    pub fn if_stored_as_prepared(self, as_prepared: bool) -> StorePrep {
        if as_prepared {
            self
        } else {
            StorePrep::default()
        }
    }
}

/// Devices, allocator, and the rules for reading and writing blocks.
pub struct BlockStore {
    /// The top-level vdevs by id; replaced whole when one is added (see
    /// [`BlockStore::add_vdev`]), so a caller's snapshot stays valid.
    vdevs: RefCell<Rc<[Rc<TopVdev>]>>,
    pub allocator: RefCell<Allocator>,
    repairs_in_flight: Cell<u32>,
    repairs_done: Notify,
    stats: Cell<BlockStats>,
    /// The open txg, to stamp reads with (see `ReadGuard`).
    open_txg: Cell<u64>,
    /// Reads in flight by the open txg in which they started.
    reads_by_txg: RefCell<std::collections::BTreeMap<u64, u32>>,
    reads_done: Notify,
    /// Written blocks that some children missed, not linked yet: (vdev,
    /// offset) -> children. The birth txg is only known at link time; linking
    /// (`commit`) moves the entry into the children's dirty time logs, and
    /// `release` drops it. Bounded by the writes in flight on a degraded vdev.
    unlinked_misses: RefCell<rustc_hash::FxHashMap<(u32, u64), Vec<usize>>>,
    /// Where blocks no copy of which could be read are reported (set by the
    /// pool once it is open), with a rate limit: a client retrying a lost
    /// block must not fill the ring.
    events: RefCell<Option<Rc<EventLog>>>,
    data_error_rate: RateLimit,
    /// Verified blocks kept in memory (the ARC): see [`crate::cache`].
    pub cache: BlockCache,
    /// Extra references of cloned blocks: [`BlockStore::free`] of one takes
    /// a reference away instead of its space.
    pub clones: RefCell<clones::CloneTable>,
    /// Where the blocks of removed vdevs are now, and the mapping of the
    /// one being removed (see [`remap`]).
    pub remaps: RefCell<remap::Remaps>,
    /// Opens of small sealed blocks read in one round, gathered into one
    /// handoff to a worker (see [`crate::crypto::gather`]).
    pub opens: crate::crypto::gather::OpenGather,
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

/// A block's bytes as `top` stores them: `physical` bytes then zeros, to whole
/// sectors of `top` (copies on vdevs of different sector sizes differ only in
/// padding). Zero padding also keeps RAID-Z parity what a fresh write gives.
fn fit(top: &TopVdev, data: &Rc<AlignedBuf>, physical: usize) -> BufSlice {
    let length = top.io_bytes(physical as u64) as usize;
    if data.len() >= length && data[physical..length].iter().all(|byte| *byte == 0) {
        return BufSlice::new(data.clone(), 0..length);
    }
    let mut copy = AlignedBuf::zeroed(length);
    copy[..physical].copy_from_slice(&data[..physical]);
    BufSlice::whole(copy.into_shared())
}

impl BlockStore {
    /// A store over `vdevs` whose read cache holds up to `cache_bytes`.
    pub fn new(vdevs: Vec<Rc<TopVdev>>, allocator: Allocator, cache_bytes: u64) -> Rc<BlockStore> {
        Rc::new(BlockStore {
            vdevs: RefCell::new(vdevs.into()),
            allocator: RefCell::new(allocator),
            repairs_in_flight: Cell::new(0),
            repairs_done: Notify::new(),
            stats: Cell::new(BlockStats::default()),
            open_txg: Cell::new(1),
            reads_by_txg: RefCell::new(Default::default()),
            reads_done: Notify::new(),
            unlinked_misses: RefCell::new(Default::default()),
            events: RefCell::new(None),
            data_error_rate: RateLimit::default(),
            cache: BlockCache::new(cache_bytes),
            clones: RefCell::new(clones::CloneTable::default()),
            remaps: RefCell::new(remap::Remaps::default()),
            opens: Default::default(),
        })
    }

    /// Where lost blocks are reported (see the field).
    pub fn set_events(&self, events: Rc<EventLog>) {
        *self.events.borrow_mut() = Some(events);
    }

    /// Reports a block no copy of which could be read or rebuilt.
    fn post_data_error(&self, bp: &BlockPointer, detail: String) {
        let events = self.events.borrow();
        let Some(events) = events.as_ref() else {
            return;
        };
        if !self.data_error_rate.allow(crate::rt::now().0) {
            events.note_suppressed(1);
            return;
        }
        events.post(
            EventClass::DataError,
            NewEvent {
                device: None,
                offset: Some(bp.dvas[0].offset),
                length: Some(bp.physical_size as u64),
                vdev: Some(bp.dvas[0].vdev),
                detail: format!("block born in txg {}: {detail}", bp.birth_txg),
            },
        );
    }

    pub fn set_open_txg(&self, txg: u64) {
        self.open_txg.set(txg);
    }

    /// Marks a read (or a walk that will read what it looked up) as in flight.
    pub fn read_guard(self: &Rc<Self>) -> ReadGuard {
        let txg = self.open_txg.get();
        *self.reads_by_txg.borrow_mut().entry(txg).or_insert(0) += 1;
        ReadGuard {
            store: self.clone(),
            txg,
        }
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

    /// The top-level vdevs by id, as they are now.
    pub fn vdevs(&self) -> Rc<[Rc<TopVdev>]> {
        self.vdevs.borrow().clone()
    }

    /// Top-level vdev `id`, if the pool has one.
    pub fn vdev(&self, id: u32) -> Option<Rc<TopVdev>> {
        self.vdevs.borrow().get(id as usize).cloned()
    }

    /// Where copy `dva` is read from, and its vdev: in place, or where a
    /// removal moved it (see [`remap`]). An error names what is missing.
    pub fn locate(&self, dva: &Dva) -> Result<(Dva, Rc<TopVdev>), String> {
        let at = self.remaps.borrow().locate(dva).ok_or_else(|| {
            format!(
                "copy at {} on removed vdev {} was not moved",
                location(dva),
                dva.vdev
            )
        })?;
        match self.vdev(at.vdev) {
            Some(top) => Ok((at, top)),
            None => Err(format!("copy on missing vdev {}", at.vdev)),
        }
    }

    /// Adds a top-level vdev (its id is the next one) with its space.
    /// Puts `top` in the place of the vdev of its id (`attach`, `detach`):
    /// I/O issued before goes on with the vdev it was issued to.
    pub fn replace_vdev(&self, top: Rc<TopVdev>) {
        let mut vdevs = self.vdevs.borrow().to_vec();
        let slot = &mut vdevs[top.id as usize];
        assert_eq!(slot.guid, top.guid, "the same vdev, reshaped");
        *slot = top;
        *self.vdevs.borrow_mut() = vdevs.into();
    }

    pub fn add_vdev(&self, top: Rc<TopVdev>, space: VdevSpace) {
        let mut vdevs = self.vdevs.borrow().to_vec();
        assert_eq!(top.id as usize, vdevs.len(), "vdev ids are dense");
        vdevs.push(top);
        *self.vdevs.borrow_mut() = vdevs.into();
        self.allocator.borrow_mut().add_vdev(space);
    }

    /// Removes the last top-level vdev, a log device nothing refers to any
    /// more (see `Pool::remove_log_vdev`), with its space.
    pub fn remove_last_vdev(&self) -> Option<Rc<TopVdev>> {
        let mut vdevs = self.vdevs.borrow().to_vec();
        let last = vdevs.pop()?;
        *self.vdevs.borrow_mut() = vdevs.into();
        let mut allocator = self.allocator.borrow_mut();
        allocator.vdevs.pop();
        allocator.recount();
        Some(last)
    }

    /// True when every top-level vdev keeps more than one copy of what it stores.
    /// (Log devices hold no pool data and are not asked.)
    pub fn all_vdevs_redundant(&self) -> bool {
        self.vdevs()
            .iter()
            .filter(|top| !top.log && top.kind != TopVdevKind::Indirect)
            .all(|top| top.children.len() > 1)
    }

    /// Allocates space for a block of `physical_bytes` with `copies` copies.
    pub fn allocate(
        &self,
        physical_bytes: u64,
        metadata: bool,
        copies: usize,
    ) -> Result<[Dva; DVA_COUNT], NoSpace> {
        let mut allocator = self.allocator.borrow_mut();
        let mut dvas = [Dva::default(); DVA_COUNT];
        for copy in 0..copies.clamp(1, DVA_COUNT) {
            let class = if metadata {
                BlockClass::Metadata(copy)
            } else {
                BlockClass::Data
            };
            let avoid = if copy > 0 { Some(dvas[0]) } else { None };
            match allocator.allocate(physical_bytes, class, avoid) {
                Ok(dva) => dvas[copy] = dva,
                Err(NoSpace) if copy > 0 => break, // fewer copies beats failing the txg
                Err(NoSpace) => return Err(NoSpace),
            }
        }
        Ok(dvas)
    }

    /// Allocates an intent-log block of `physical_bytes`: on a log device
    /// that can take writes, else in the main devices' metadata space.
    pub fn allocate_log(&self, physical_bytes: u64) -> Result<Dva, NoSpace> {
        let vdevs = self.vdevs();
        self.allocator
            .borrow_mut()
            .allocate_log(physical_bytes, |id| {
                vdevs
                    .get(id as usize)
                    .is_some_and(|top| top.log && top.is_available() && !top.removing.get())
            })
    }

    /// True when some log device can take log blocks.
    pub fn has_usable_log_device(&self) -> bool {
        self.vdevs()
            .iter()
            .any(|top| top.log && top.is_available() && !top.removing.get())
    }

    /// Returns never-committed allocations.
    pub fn release(&self, dvas: &[Dva]) {
        let mut allocator = self.allocator.borrow_mut();
        let mut misses = self.unlinked_misses.borrow_mut();
        for dva in dvas.iter().filter(|dva| !dva.is_empty()) {
            allocator.release(*dva);
            misses.remove(&(dva.vdev, dva.offset));
        }
    }

    /// Records space taken by [`BlockStore::claim`] as used from the open
    /// txg on, for space that must stay allocated across txgs and imports
    /// though no tree points at it yet: an encrypted filesystem's intent
    /// log, claimed at import and replayed when its key is loaded.
    pub fn commit_claimed(&self, dvas: &[Dva]) {
        let mut allocator = self.allocator.borrow_mut();
        for dva in dvas.iter().filter(|dva| !dva.is_empty()) {
            allocator.commit(*dva);
        }
    }

    /// Records a block's space as used from the open txg on, and the block's
    /// birth txg in the log of every child that missed its write.
    pub fn commit(&self, bp: &BlockPointer) {
        let mut allocator = self.allocator.borrow_mut();
        for dva in bp.copies() {
            allocator.commit(*dva);
        }
        drop(allocator);
        let mut misses = self.unlinked_misses.borrow_mut();
        if misses.is_empty() {
            return;
        }
        for dva in bp.copies() {
            if let Some(children) = misses.remove(&(dva.vdev, dva.offset)) {
                self.note_missed(dva.vdev, &children, bp.birth_txg);
            }
        }
    }

    /// Adds `txg` to the dirty time log of `children` of vdev `vdev`.
    fn note_missed(&self, vdev: u32, children: &[usize], txg: u64) {
        let Some(top) = self.vdev(vdev) else {
            return;
        };
        for &child in children {
            if let Some(leaf) = top.children.get(child) {
                leaf.dtl.borrow_mut().add(txg);
            }
        }
    }

    /// Records a block's space as freed in the open txg, and drops its
    /// cached copy (the space may hold another block later). A cloned block
    /// with other references loses one reference instead.
    pub fn free(&self, bp: &BlockPointer) {
        if self.clones.borrow_mut().drop_reference(&bp.dvas[0]) {
            return;
        }
        self.cache.forget(bp);
        self.free_dvas(bp.copies());
    }

    /// Records the space of `dvas` as freed in the open txg: space whose
    /// allocation was committed, not a block of the tree (an intent log's
    /// blocks and the blocks its records name, claimed at import: see
    /// [`BlockStore::commit_claimed`]).
    pub fn free_dvas<'a>(&self, dvas: impl IntoIterator<Item = &'a Dva>) {
        let remaps = self.remaps.borrow();
        let mut allocator = self.allocator.borrow_mut();
        for dva in dvas.into_iter().filter(|dva| !dva.is_empty()) {
            if !remaps.is_empty() && remaps.is_mapped(dva.vdev) {
                // A copy a removal moved: the moved copy goes too. A removed
                // vdev has no space of its own to give back.
                if let Some(target) = remaps.target(dva) {
                    allocator.free(target);
                }
                if remaps.is_indirect(dva.vdev) {
                    continue;
                }
            }
            allocator.free(*dva);
        }
    }

    /// Writes `data` (whole sectors) to every copy in `dvas`, a block to be
    /// linked later. Succeeds when every copy is intact (within its vdev's
    /// redundancy); children that missed it are remembered until the link.
    pub async fn write(
        &self,
        dvas: &[Dva],
        data: BufSlice,
        class: IoClass,
    ) -> Result<(), BlockError> {
        self.write_with(dvas, data, class, IoFlags::default()).await
    }

    /// `write`, durable when it returns (FUA on every device written): an
    /// intent-log block, which a commit then need not flush.
    pub async fn write_durable(
        &self,
        dvas: &[Dva],
        data: BufSlice,
        class: IoClass,
    ) -> Result<(), BlockError> {
        let flags = IoFlags {
            durable: true,
            ..IoFlags::default()
        };
        self.write_with(dvas, data, class, flags).await
    }

    async fn write_with(
        &self,
        dvas: &[Dva],
        data: BufSlice,
        class: IoClass,
        flags: IoFlags,
    ) -> Result<(), BlockError> {
        if dvas.len() > 1 && dvas[1].is_empty() || dvas.len() == 1 {
            // One copy (data blocks): no join machinery on the hot path.
            let dva = dvas[0];
            let outcome = self.vdevs()[dva.vdev as usize]
                .write(class, dva.offset, data, flags)
                .await;
            return self.settle_write(&dva, outcome);
        }
        let writes = dvas.iter().filter(|dva| !dva.is_empty()).map(|dva| {
            let top = self.vdevs()[dva.vdev as usize].clone();
            let data = data.clone();
            let offset = dva.offset;
            async move { top.write(class, offset, data, flags).await }
        });
        let results = futures_util::future::join_all(writes).await;
        for (result, dva) in results.into_iter().zip(dvas.iter()) {
            self.settle_write(dva, result)?;
        }
        Ok(())
    }

    /// Writes blocks of one copy each (write-back's batches), as `write`
    /// writes each, but per top-level vdev in one go: pieces that follow each
    /// other on a child become one queue request (see `TopVdev::write_run`).
    /// Each block may bring work done ahead for it (see
    /// [`BlockStore::prepare`]). Returns each block's result, in order.
    pub async fn write_run(
        &self,
        blocks: Vec<(Dva, BufSlice, StorePrep)>,
        class: IoClass,
    ) -> Vec<Result<(), BlockError>> {
        let mut results: Vec<Result<(), BlockError>> = blocks.iter().map(|_| Ok(())).collect();
        let mut by_vdev: Vec<VdevRun> = self
            .vdevs()
            .iter()
            .map(|_| (Vec::new(), Vec::new()))
            .collect();
        for (index, (dva, data, parity)) in blocks.iter().enumerate() {
            match by_vdev.get_mut(dva.vdev as usize) {
                Some((indexes, run)) => {
                    indexes.push(index);
                    run.push(RunBlock {
                        offset: dva.offset,
                        data: data.clone(),
                        parity: parity.0.clone(),
                    });
                }
                None => {
                    results[index] = Err(BlockError::WriteFailed {
                        location: location(dva),
                        detail: "no such vdev".into(),
                    })
                }
            }
        }
        let writes = by_vdev
            .into_iter()
            .enumerate()
            .filter(|(_, (indexes, _))| !indexes.is_empty())
            .map(|(vdev, (indexes, run))| {
                let top = self.vdevs()[vdev].clone();
                async move {
                    (
                        indexes,
                        top.write_run(class, &run, IoFlags::default()).await,
                    )
                }
            });
        for (indexes, outcomes) in futures_util::future::join_all(writes).await {
            for (index, outcome) in indexes.into_iter().zip(outcomes) {
                results[index] = self.settle_write(&blocks[index].0, outcome);
            }
        }
        results
    }

    /// Prepares `data`, to be stored later as it is, for the store: today
    /// its RAID-Z parity (see [`PrecomputedParity`]) when the pool's data can
    /// only go to RAID-Z groups of one geometry; nothing otherwise (a mirror or
    /// a second geometry could take the block, and the work would be lost).
    pub fn prepare(&self, data: &[u8]) -> StorePrep {
        StorePrep(
            self.parity_ahead_geometry()
                .and_then(|geometry| PrecomputedParity::compute(&geometry, data))
                .map(Rc::new),
        )
    }

    /// Bytes `prepare` holds for a block of `data_bytes` (0 when it
    /// prepares nothing): write-back admits a write for its blocks with them.
    pub fn prepared_bytes(&self, data_bytes: u64) -> u64 {
        self.parity_ahead_geometry().map_or(0, |geometry| {
            PrecomputedParity::bytes_for(&geometry, data_bytes)
        })
    }

    /// The geometry of every top-level vdev that takes data (log devices do
    /// not), when all are RAID-Z of one.
    fn parity_ahead_geometry(&self) -> Option<RaidzGeometry> {
        let vdevs = self.vdevs();
        let mut data_vdevs = vdevs
            .iter()
            .filter(|top| !top.log && top.kind != TopVdevKind::Indirect);
        let first = *data_vdevs.next()?.raidz_geometry()?;
        data_vdevs
            .all(|top| top.raidz_geometry() == Some(&first))
            .then_some(first)
    }

    /// A copy's write as the caller sees it: children that missed it are
    /// remembered until the link, a failed copy is an error naming it.
    fn settle_write(
        &self,
        dva: &Dva,
        outcome: Result<WriteOutcome, VdevError>,
    ) -> Result<(), BlockError> {
        let outcome = outcome.map_err(|error| BlockError::WriteFailed {
            location: location(dva),
            detail: error.to_string(),
        })?;
        if !outcome.missed_children.is_empty() {
            self.unlinked_misses
                .borrow_mut()
                .insert((dva.vdev, dva.offset), outcome.missed_children);
        }
        Ok(())
    }

    /// Writes one copy of a block already linked in txg `txg` (a txg's
    /// metadata): children that miss it get `txg` in their log at once.
    pub async fn write_linked(
        &self,
        dva: Dva,
        data: BufSlice,
        class: IoClass,
        txg: u64,
    ) -> Result<(), BlockError> {
        let top = self.vdev(dva.vdev).ok_or_else(|| BlockError::WriteFailed {
            location: location(&dva),
            detail: "no such vdev".into(),
        })?;
        let outcome = top
            .write(class, dva.offset, data, IoFlags::default())
            .await
            .map_err(|error| BlockError::WriteFailed {
                location: location(&dva),
                detail: error.to_string(),
            })?;
        self.note_missed(dva.vdev, &outcome.missed_children, txg);
        Ok(())
    }

    /// A block's physical bytes (its logical bytes, or their compressed
    /// form) from the read cache when `usage` lets it and the block is
    /// there; else read and verified (self-healing bad copies), and kept
    /// when `usage` says so. A read that finds the same block being read for
    /// the cache waits for that read rather than issue its own.
    /// An encrypted block may come back opened (see [`Cached`]); a block
    /// that is not comes back as stored.
    pub async fn read_cached(
        self: &Rc<Self>,
        bp: &BlockPointer,
        class: IoClass,
        usage: CacheUse,
    ) -> Result<Cached, BlockError> {
        assert!(!bp.is_hole(), "read of a hole");
        let physical = bp.physical_size as usize;
        let mut waited = false;
        loop {
            if let Some((data, opened)) = self.cache.lookup(bp, usage) {
                return Ok(Cached {
                    data,
                    hit: true,
                    opened,
                });
            }
            // Wait for a read of the block in flight once; if it left
            // nothing (it failed, or its block was freed), read.
            let in_flight = self.cache.join_or_begin_read(bp, usage);
            if let Some(in_flight) = in_flight.as_ref().filter(|_| !waited) {
                waited = true;
                in_flight.notified().await;
                continue;
            }
            let _guard = self.read_guard();
            let read = self.read_physical(bp, class).await;
            let data = read.map(|(data, _)| BufSlice::new(data, 0..physical));
            // None: this read is the one registered in flight (if kept).
            if in_flight.is_none() {
                self.cache.end_read(bp, usage, data.as_ref().ok());
            }
            return data.map(|data| Cached {
                data,
                hit: false,
                opened: false,
            });
        }
    }

    /// Reads the first copy that verifies (whole sectors of the vdev it came
    /// from, and that vdev), rewriting bad children and bad copies in the
    /// background.
    async fn read_physical(
        self: &Rc<Self>,
        bp: &BlockPointer,
        class: IoClass,
    ) -> Result<(Rc<AlignedBuf>, u32), BlockError> {
        let physical = bp.physical_size as usize;
        let verify = |data: &[u8]| bp.checksum_algo.verify(&data[..physical], &bp.checksum);
        let mut bad_copies: Vec<Dva> = Vec::new();
        let mut details = Vec::new();
        for dva in bp.copies() {
            let (dva, top) = match self.locate(dva) {
                Ok(found) => found,
                Err(detail) => {
                    details.push(detail);
                    continue;
                }
            };
            let dva = &dva;
            let length = top.io_bytes(physical as u64);
            match top
                .read_verified(class, dva.offset, length, bp.written_txg(), &verify)
                .await
            {
                Ok(read) => {
                    let data = read.data.into_shared();
                    if !read.bad_children.is_empty() || !bad_copies.is_empty() {
                        self.count(|stats| stats.healed_reads += 1);
                    }
                    if !read.bad_children.is_empty() {
                        self.spawn_repair(
                            top.clone(),
                            Some(read.bad_children),
                            dva.offset,
                            BufSlice::whole(data.clone()),
                        );
                    }
                    for bad in &bad_copies {
                        let bad_top = self.vdevs()[bad.vdev as usize].clone();
                        let fitted = fit(&bad_top, &data, physical);
                        self.spawn_repair(bad_top, None, bad.offset, fitted);
                    }
                    return Ok((data, dva.vdev));
                }
                Err(error) => {
                    bad_copies.push(*dva);
                    details.push(error.to_string());
                }
            }
        }
        self.count(|stats| stats.unrecoverable_reads += 1);
        self.post_data_error(bp, details.join("; "));
        let first = bp.dvas[0];
        Err(BlockError::Unreadable {
            location: location(&first),
            detail: details.join("; "),
        })
    }

    /// Reads every copy on every device (scrub); rewrites the bad ones from a good
    /// one. Returns (bad copies found, repaired), counting each bad child as a
    /// copy; an error when none verifies.
    pub async fn scrub(self: &Rc<Self>, bp: &BlockPointer) -> Result<(u64, u64), BlockError> {
        let physical = bp.physical_size as usize;
        let verify = |data: &[u8]| bp.checksum_algo.verify(&data[..physical], &bp.checksum);
        let mut good: Option<Rc<AlignedBuf>> = None;
        // (vdev, its bad children or None for the whole copy, offset)
        let mut bad: Vec<(Rc<TopVdev>, Option<Vec<usize>>, u64)> = Vec::new();
        for dva in bp.copies() {
            let Ok((dva, top)) = self.locate(dva) else {
                continue;
            };
            let length = top.io_bytes(physical as u64);
            let (copy, bad_children) = top
                .scrub_read(dva.offset, length, bp.written_txg(), &verify)
                .await;
            match copy {
                Some(data) => {
                    if good.is_none() {
                        good = Some(data.into_shared());
                    }
                    if !bad_children.is_empty() {
                        bad.push((top.clone(), Some(bad_children), dva.offset));
                    }
                }
                None => bad.push((top.clone(), None, dva.offset)),
            }
        }
        let Some(good) = good else {
            self.count(|stats| stats.unrecoverable_reads += 1);
            self.post_data_error(bp, "no copy verifies (scrub)".into());
            return Err(BlockError::Unreadable {
                location: location(&bp.dvas[0]),
                detail: "no copy verifies".into(),
            });
        };
        let mut found = 0;
        let mut repaired = 0;
        for (top, children, offset) in bad {
            let count = children
                .as_ref()
                .map_or(1, |children| children.len() as u64);
            found += count;
            if self
                .repair(
                    top.clone(),
                    children,
                    offset,
                    fit(&top, &good, physical),
                    IoClass::Scrub,
                )
                .await
            {
                repaired += count;
            }
        }
        Ok((found, repaired))
    }

    /// Rewrites the copies of `bp` on the children that `targets` names for
    /// each vdev (children that missed the block's txg), from a copy that
    /// verifies. Returns what it wrote. The caller holds a
    /// read guard over the walk that found `bp`.
    pub async fn resilver(
        self: &Rc<Self>,
        bp: &BlockPointer,
        targets: &dyn Fn(u32) -> Vec<usize>,
    ) -> Result<Rewritten, BlockError> {
        let wanted: Vec<(Dva, Vec<usize>)> = bp
            .copies()
            .filter_map(|dva| self.locate(dva).ok())
            .map(|(dva, _)| (dva, targets(dva.vdev)))
            .filter(|(_, children)| !children.is_empty())
            .collect();
        if wanted.is_empty() {
            return Ok(Rewritten::default());
        }
        let (data, _) = self.read_physical(bp, IoClass::Rebuild).await?;
        let mut rewritten = Rewritten::default();
        for (dva, children) in wanted {
            let top = self.vdevs()[dva.vdev as usize].clone();
            let fitted = fit(&top, &data, bp.physical_size as usize);
            let bytes = top.children_share_bytes(&children, dva.offset, fitted.len() as u64);
            let count = children.len() as u64;
            if !self
                .repair(top, Some(children), dva.offset, fitted, IoClass::Rebuild)
                .await
            {
                return Err(BlockError::WriteFailed {
                    location: location(&dva),
                    detail: "resilver write failed".into(),
                });
            }
            rewritten.copies += count;
            rewritten.bytes += bytes;
        }
        Ok(rewritten)
    }

    /// [`BlockStore::resilver`] for a block that checksums itself (an
    /// intent log's, `length` bytes at `dva`, `verify` telling a good copy):
    /// read from a good copy, written to the children `targets` names.
    pub async fn resilver_self_checked(
        self: &Rc<Self>,
        dva: Dva,
        length: u64,
        verify: &dyn Fn(&[u8]) -> bool,
        targets: &dyn Fn(u32) -> Vec<usize>,
    ) -> Result<Rewritten, BlockError> {
        let Ok((located, top)) = self.locate(&dva) else {
            return Ok(Rewritten::default());
        };
        let children = targets(located.vdev);
        if children.is_empty() {
            return Ok(Rewritten::default());
        }
        let data = Rc::new(self.read_self_checked(dva, length, verify).await?);
        let fitted = fit(&top, &data, length as usize);
        let bytes = top.children_share_bytes(&children, located.offset, fitted.len() as u64);
        let count = children.len() as u64;
        if !self
            .repair(
                top,
                Some(children),
                located.offset,
                fitted,
                IoClass::Rebuild,
            )
            .await
        {
            return Err(BlockError::WriteFailed {
                location: location(&located),
                detail: "resilver write failed".into(),
            });
        }
        Ok(Rewritten {
            copies: count,
            bytes,
        })
    }

    /// Copies copy `index` of `bp` into new space on another vdev (device
    /// removal): the block is read and verified from any copy (bad ones
    /// repaired, as by any read), then written to space allocated away
    /// from its other copies, and every child of that vdev must take it
    /// (a copy some device missed would need a resilver the mapping cannot
    /// tell it about). Returns the new place, allocated but not committed:
    /// the caller records it (`Allocator::commit`) or gives it back
    /// ([`BlockStore::release`]).
    pub async fn move_copy(
        self: &Rc<Self>,
        bp: &BlockPointer,
        index: usize,
    ) -> Result<Dva, BlockError> {
        let (data, _) = self.read_physical(bp, IoClass::Rebuild).await?;
        let source = bp.dvas[index];
        let class = if bp.level > 0 || bp.object_type.is_metadata() {
            BlockClass::Metadata(index.min(1))
        } else {
            BlockClass::Data
        };
        let avoid = bp
            .copies()
            .enumerate()
            .find(|(other, dva)| *other != index && dva.vdev != source.vdev)
            .map(|(_, dva)| *dva);
        let target = self
            .allocator
            .borrow_mut()
            .allocate(bp.physical_size as u64, class, avoid)?;
        assert_ne!(target.vdev, source.vdev, "a copy moves off its vdev");
        let failed = |detail: String| BlockError::WriteFailed {
            location: location(&target),
            detail,
        };
        let Some(top) = self.vdev(target.vdev) else {
            self.release(&[target]);
            return Err(failed("no such vdev".into()));
        };
        let fitted = fit(&top, &data, bp.physical_size as usize);
        match top
            .write(IoClass::Rebuild, target.offset, fitted, IoFlags::default())
            .await
        {
            Ok(outcome) if outcome.missed_children.is_empty() => Ok(target),
            Ok(outcome) => {
                self.release(&[target]);
                Err(failed(format!(
                    "children {:?} of vdev {} missed the copy",
                    outcome.missed_children, target.vdev
                )))
            }
            Err(error) => {
                self.release(&[target]);
                Err(failed(error.to_string()))
            }
        }
    }

    fn spawn_repair(
        self: &Rc<Self>,
        top: Rc<TopVdev>,
        children: Option<Vec<usize>>,
        offset: u64,
        data: BufSlice,
    ) {
        let store = self.clone();
        // Count it now, before the task runs, so no deferred free is released
        // while the repair is queued.
        store
            .repairs_in_flight
            .set(store.repairs_in_flight.get() + 1);
        crate::rt::spawn(async move {
            store
                .repair_counted(top, children, offset, data, IoClass::AsyncWrite)
                .await;
        });
    }

    /// Rewrites a bad copy: some children of a top-level vdev, or (None) all of
    /// them. While any repair is in flight, deferred frees are not released, so the
    /// space being repaired cannot be handed to another block meanwhile.
    async fn repair(
        &self,
        top: Rc<TopVdev>,
        children: Option<Vec<usize>>,
        offset: u64,
        data: BufSlice,
        class: IoClass,
    ) -> bool {
        self.repairs_in_flight.set(self.repairs_in_flight.get() + 1);
        self.repair_counted(top, children, offset, data, class)
            .await
    }

    async fn repair_counted(
        &self,
        top: Rc<TopVdev>,
        children: Option<Vec<usize>>,
        offset: u64,
        data: BufSlice,
        class: IoClass,
    ) -> bool {
        self.count(|stats| stats.repair_writes += 1);
        let children: Vec<usize> = children.unwrap_or_else(|| {
            (0..top.children.len())
                .filter(|index| top.children[*index].is_online())
                .collect()
        });
        let all_ok = top.repair(&children, offset, data, class).await.is_ok();
        self.repairs_in_flight.set(self.repairs_in_flight.get() - 1);
        if self.repairs_in_flight.get() == 0 {
            self.repairs_done.notify_all();
        }
        all_ok
    }

    /// Reads the `length` bytes (whole sectors) at `dva` as the devices hold
    /// them, unverified: a self-checksummed block (an intent log block) whose
    /// caller checks it. Nothing is counted or repaired: the block at the end
    /// of a log chain is expected to be garbage.
    pub async fn read_unverified(
        self: &Rc<Self>,
        dva: Dva,
        length: u64,
    ) -> Result<AlignedBuf, BlockError> {
        self.read_self_checked(dva, length, &|_| true).await
    }

    /// Reads the `length` bytes at `dva` until `verify` accepts them, as
    /// `read` does for a block with a pointer (other sides, reconstruction),
    /// for a self-checksummed block. Bad children are counted, not repaired
    /// (the block is short-lived; replay frees it).
    pub async fn read_self_checked(
        self: &Rc<Self>,
        dva: Dva,
        length: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<AlignedBuf, BlockError> {
        let _guard = self.read_guard();
        let (dva, top) = self.locate(&dva).map_err(|detail| BlockError::Unreadable {
            location: location(&dva),
            detail,
        })?;
        let length = top.io_bytes(length);
        match top
            .read_verified(IoClass::SyncRead, dva.offset, length, u64::MAX, verify)
            .await
        {
            Ok(read) => Ok(read.data),
            Err(error) => Err(BlockError::Unreadable {
                location: location(&dva),
                detail: error.to_string(),
            }),
        }
    }

    /// As [`BlockStore::read_self_checked`]; with `quiet`, a read that finds
    /// no good copy leaves the devices' error counts as they were: the
    /// block was most likely never written (the end of a log chain), and
    /// its garbage is no device's fault. Used at import, before anything
    /// else reads.
    pub async fn read_self_checked_quietly(
        self: &Rc<Self>,
        dva: Dva,
        length: u64,
        verify: &dyn Fn(&[u8]) -> bool,
        quiet: bool,
    ) -> Result<AlignedBuf, BlockError> {
        let before: Vec<u64> = self
            .vdevs()
            .get(dva.vdev as usize)
            .map(|top| {
                top.children
                    .iter()
                    .map(|leaf| leaf.queue.stats().checksum_errors)
                    .collect()
            })
            .unwrap_or_default();
        let result = self.read_self_checked(dva, length, verify).await;
        if result.is_err() && quiet {
            if let Some(top) = self.vdev(dva.vdev) {
                for (leaf, errors) in top.children.iter().zip(before) {
                    leaf.queue.count(|stats| stats.checksum_errors = errors);
                }
            }
        }
        result
    }

    /// Takes `dva` out of the free space if all of it is free (an intent log
    /// replay claiming a block written after the last durable txg), as
    /// `allocate` would: linking it commits it, `release` gives it back.
    pub fn claim(&self, dva: Dva) -> bool {
        self.allocator.borrow_mut().claim(dva)
    }

    /// Waits until no repair write is in flight.
    pub async fn repairs_quiesced(&self) {
        while self.repairs_in_flight.get() > 0 {
            self.repairs_done.notified().await;
        }
    }

    /// Flushes every device of every top-level vdev, for a txg: a log
    /// device that fails to flush does not fail it (a txg keeps nothing on
    /// log devices; the failure is counted on the device, and log commits
    /// move to the main devices once it is faulted).
    pub async fn flush_all(&self) -> Result<(), BlockError> {
        let vdevs = self.vdevs();
        self.flush_vdevs(vdevs.iter().collect(), |top| !top.log)
            .await
    }

    /// Flushes the top-level vdevs an intent-log commit needs durable (those
    /// holding its log blocks and the blocks its records point to); a
    /// failure of any fails the commit. Others are not asked: a faulted log
    /// device the commit did not write to (the log fell back to the main
    /// devices) no longer fails every commit.
    pub async fn flush_for_log(&self, needed: &[u32]) -> Result<(), BlockError> {
        let vdevs = self.vdevs();
        let chosen = vdevs
            .iter()
            .filter(|top| needed.contains(&top.id))
            .collect();
        self.flush_vdevs(chosen, |_| true).await
    }

    /// Flushes `vdevs` at once; the first failure of one that `must_flush`
    /// is the error.
    async fn flush_vdevs(
        &self,
        vdevs: Vec<&Rc<TopVdev>>,
        must_flush: impl Fn(&TopVdev) -> bool,
    ) -> Result<(), BlockError> {
        let flushes = vdevs.iter().map(|top| top.flush());
        for (result, top) in futures_util::future::join_all(flushes)
            .await
            .into_iter()
            .zip(vdevs.iter())
        {
            if let Err(error) = result {
                if must_flush(top) {
                    return Err(BlockError::WriteFailed {
                        location: format!("vdev {}", top.id),
                        detail: format!("flush: {error}"),
                    });
                }
            }
        }
        Ok(())
    }
}
