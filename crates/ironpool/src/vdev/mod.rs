//! Virtual devices: leaves (one device each, with its I/O queue) and top-level
//! vdevs (a single disk, a mirror of 2-3 leaves, or a RAID-Z group).
//!
//! A top-level vdev places a block at an offset of its data area and knows how
//! to read it back verified: a mirror tries its children until one returns bytes
//! that match the block's checksum; a RAID-Z group reads the data columns and,
//! when they do not verify, reconstructs from parity ([`raidz::io`]). Both
//! report which children were bad so the caller can rewrite them (self-heal).
//!
//! Every child can be away (missing, offline by the operator, or faulted after
//! failing I/O after I/O): writes skip it and report it as missed, so the caller
//! can record the birth txg in its dirty time log ([`dtl`]); reads do not trust
//! it for blocks born in txgs it missed. A group keeps serving as long as no
//! more children are away than its redundancy allows.

pub mod dtl;
mod mirror;
pub mod raidz;
pub mod run;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::dev::{Device, DeviceError};
use crate::format::label::TopVdevKind;
use crate::format::DATA_START_BYTES;
use crate::queue::{IoClass, IoFlags, QueueTunables, VdevQueue};
use crate::rt::buf::{AlignedBuf, BufSlice};
use dtl::Dtl;
use raidz::RaidzGeometry;

/// I/O errors in a row (no success between them) after which a leaf is taken
/// out of service (FAULTED). One bad sector fails one I/O and a retry of the
/// neighbours succeeds; a device that has gone away fails every I/O. 16 lets a
/// burst of bad sectors pass while a dead device is given up on within a
/// moment, before every read pays for trying it.
pub const LEAF_FAULT_CONSECUTIVE_ERRORS: u64 = 16;

/// The health of a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LeafState {
    Online,
    /// Not found at import, or vanished.
    Missing,
    /// Taken out by the operator.
    Offline,
    /// Failed `LEAF_FAULT_CONSECUTIVE_ERRORS` I/Os in a row: no longer used
    /// until `ironpool online` or `replace`.
    Faulted,
}

impl LeafState {
    /// The state as `status` shows it.
    pub fn name(self) -> &'static str {
        match self {
            LeafState::Online => "ONLINE",
            LeafState::Missing => "MISSING",
            LeafState::Offline => "OFFLINE",
            LeafState::Faulted => "FAULTED",
        }
    }
}

/// One device in the pool.
pub struct LeafVdev {
    /// Changes only when the device is replaced.
    guid: Cell<u64>,
    pub path: RefCell<String>,
    pub queue: Rc<VdevQueue>,
    state: Cell<LeafState>,
    /// Bumped whenever the device behind this leaf changes (back online,
    /// replaced): a write issued before the change may not have reached the
    /// device now in place, so it counts as missed.
    generation: Cell<u64>,
    /// The txgs this leaf missed writes in.
    pub dtl: RefCell<Dtl>,
    /// The device answered a discard with "not supported": it is reported
    /// once and not asked again until it is replaced or brought back.
    trim_unsupported: Cell<bool>,
    /// The state last reported as an event (None until the first report,
    /// which only sets it: the import's notes say how the pool came up).
    reported_state: Cell<Option<LeafState>>,
    /// Where the last read a mirror sent to this leaf ended: a read that
    /// starts there continues a sequential run on this side (see
    /// `mirror::read_order`).
    read_end: Cell<u64>,
}

impl LeafVdev {
    pub fn new(
        guid: u64,
        path: String,
        device: Option<Rc<dyn Device>>,
        tunables: QueueTunables,
    ) -> Rc<LeafVdev> {
        let state = if device.is_some() {
            LeafState::Online
        } else {
            LeafState::Missing
        };
        Rc::new(LeafVdev {
            guid: Cell::new(guid),
            path: RefCell::new(path),
            queue: VdevQueue::new(device, tunables),
            state: Cell::new(state),
            generation: Cell::new(0),
            dtl: RefCell::new(Dtl::default()),
            trim_unsupported: Cell::new(false),
            reported_state: Cell::new(None),
            read_end: Cell::new(u64::MAX),
        })
    }

    /// The state before and now, when it changed since the last call (the
    /// first call only records it).
    pub fn take_state_change(&self) -> Option<(LeafState, LeafState)> {
        let now = self.state();
        match self.reported_state.replace(Some(now)) {
            Some(before) if before != now => Some((before, now)),
            _ => None,
        }
    }

    /// The leaf's identity in the pool config.
    pub fn guid(&self) -> u64 {
        self.guid.get()
    }

    /// The state, with a leaf that keeps failing shown as faulted.
    pub fn state(&self) -> LeafState {
        match self.state.get() {
            LeafState::Online
                if self.queue.consecutive_errors() >= LEAF_FAULT_CONSECUTIVE_ERRORS =>
            {
                LeafState::Faulted
            }
            state => state,
        }
    }

    /// True when I/O should go to this leaf.
    pub fn is_online(&self) -> bool {
        self.state() == LeafState::Online
    }

    /// True when this leaf's copy of a block born in `birth_txg` can be read:
    /// it is online and did not miss that txg.
    pub fn is_readable_for(&self, birth_txg: u64) -> bool {
        self.is_online() && !self.dtl.borrow().contains(birth_txg)
    }

    pub fn device(&self) -> Option<Rc<dyn Device>> {
        self.queue.device()
    }

    /// False once the device said it cannot discard (see the field).
    pub fn trim_supported(&self) -> bool {
        !self.trim_unsupported.get()
    }

    /// Discards `length` bytes at `offset` of the leaf's data area, unless
    /// the leaf is out of service or its device cannot: true when done.
    async fn trim(&self, offset: u64, length: u64) -> bool {
        if !self.is_online() || self.trim_unsupported.get() || length == 0 {
            return false;
        }
        match self.queue.trim(DATA_START_BYTES + offset, length).await {
            Ok(()) => true,
            Err(DeviceError::Unsupported { path }) => {
                if !self.trim_unsupported.replace(true) {
                    eprintln!(
                        "ironpool: {path} does not support discard (TRIM): its free space is not trimmed"
                    );
                }
                false
            }
            Err(_) => false,
        }
    }

    /// See the field: compared before and after a write.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Releases the device (pool export): its descriptor closes and its lock drops
    /// once in-flight I/O is done with it.
    pub fn close(&self) {
        self.queue.set_device(None);
        self.state.set(LeafState::Missing);
    }

    /// The operator takes the leaf out (it keeps its device open).
    pub fn set_offline(&self) {
        self.state.set(LeafState::Offline);
    }

    /// Puts the leaf back in service, with `device` when it had none (a device
    /// that returned). Error counters that faulted it start over.
    pub fn bring_online(&self, device: Option<Rc<dyn Device>>) {
        if let Some(device) = device {
            self.queue.set_device(Some(device));
        }
        self.queue.reset_consecutive_errors();
        self.trim_unsupported.set(false);
        self.generation.set(self.generation.get() + 1);
        self.state.set(if self.queue.device().is_some() {
            LeafState::Online
        } else {
            LeafState::Missing
        });
    }

    /// Puts a new device in this leaf's place: new identity, fresh statistics,
    /// and a log saying it missed everything up to `open_txg`.
    pub fn replace_device(&self, guid: u64, path: String, device: Rc<dyn Device>, open_txg: u64) {
        self.queue.set_device(Some(device));
        self.queue.reset_stats();
        self.trim_unsupported.set(false);
        self.guid.set(guid);
        *self.path.borrow_mut() = path;
        self.dtl.borrow_mut().reset_to_everything_before(open_txg);
        self.generation.set(self.generation.get() + 1);
        self.state.set(LeafState::Online);
    }

    /// Number of I/Os queued or active: used to pick the least busy mirror side.
    fn load(&self) -> u64 {
        self.queue.load()
    }
}

/// Why a top-level vdev could not complete an I/O.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VdevError {
    #[error("every copy failed: {0}")]
    AllFailed(String),
    #[error("more columns lost than parity can rebuild: {0}")]
    TooManyFailures(String),
    #[error("no layout for this block: {0}")]
    Layout(#[from] raidz::GeometryError),
}

/// Result of a verified read: the good bytes and the children that returned bad
/// bytes or errors (to be repaired by the caller).
pub struct VerifiedRead {
    pub data: AlignedBuf,
    pub bad_children: Vec<usize>,
}

/// What a successful write did not reach: children that were away or whose
/// part failed. The block is intact (the vdev's redundancy covers them), but
/// these children miss it until a resilver.
#[derive(Debug, Default)]
pub struct WriteOutcome {
    pub missed_children: Vec<usize>,
}

/// The health of a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum VdevHealth {
    Online,
    /// Serving, with less redundancy than it should have (a child away, or a
    /// child that missed writes and is not resilvered yet).
    Degraded,
    /// More children away than the redundancy covers.
    Unavail,
}

/// A top-level vdev.
pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub kind: TopVdevKind,
    pub ashift: u8,
    pub asize_bytes: u64,
    pub metaslab_shift: u8,
    pub children: Vec<Rc<LeafVdev>>,
    /// A log device: it holds intent-log blocks only (see
    /// `pool::dataset::intent_log`).
    pub log: bool,
    /// A log device being removed: no new log block goes to it.
    pub removing: Cell<bool>,
    /// The group's layout, for RAID-Z.
    raidz: Option<RaidzGeometry>,
}

impl TopVdev {
    /// A top-level vdev; fails when a RAID-Z group's shape has no layout.
    pub fn new(
        id: u32,
        guid: u64,
        kind: TopVdevKind,
        ashift: u8,
        asize_bytes: u64,
        metaslab_shift: u8,
        children: Vec<Rc<LeafVdev>>,
    ) -> Result<TopVdev, raidz::GeometryError> {
        let raidz = if kind.is_raidz() {
            Some(RaidzGeometry::new(
                children.len() as u32,
                kind.parity(),
                ashift,
            )?)
        } else {
            None
        };
        Ok(TopVdev {
            id,
            guid,
            kind,
            ashift,
            asize_bytes,
            metaslab_shift,
            children,
            log: false,
            removing: Cell::new(false),
            raidz,
        })
    }

    /// The same vdev (id, guid, size) as `kind` with `children`: a disk
    /// made a mirror by `attach`, a mirror that lost a side to `detach`.
    /// Disks and mirrors only: a RAID-Z group's layout depends on its width.
    pub fn reshaped(&self, kind: TopVdevKind, children: Vec<Rc<LeafVdev>>) -> TopVdev {
        assert!(
            !kind.is_raidz() && self.raidz.is_none(),
            "only disks and mirrors are reshaped"
        );
        TopVdev {
            id: self.id,
            guid: self.guid,
            kind,
            ashift: self.ashift,
            asize_bytes: self.asize_bytes,
            metaslab_shift: self.metaslab_shift,
            children,
            log: self.log,
            removing: Cell::new(self.removing.get()),
            raidz: None,
        }
    }

    /// This vdev as a log device (see [`TopVdev::log`]).
    pub fn into_log(mut self) -> TopVdev {
        self.log = true;
        self
    }

    pub fn sector_bytes(&self) -> u64 {
        1 << self.ashift
    }

    /// The RAID-Z layout, for RAID-Z groups.
    pub fn raidz_geometry(&self) -> Option<&RaidzGeometry> {
        self.raidz.as_ref()
    }

    /// Bytes moved for a block of `physical_bytes`: its size in whole sectors
    /// (what `write` takes and `read_verified` returns).
    pub fn io_bytes(&self, physical_bytes: u64) -> u64 {
        physical_bytes.div_ceil(self.sector_bytes()) * self.sector_bytes()
    }

    /// Space a block of `physical_bytes` takes: whole sectors on a disk or
    /// mirror; data, parity and pad sectors on RAID-Z.
    pub fn allocated_size(&self, physical_bytes: u64) -> u64 {
        match &self.raidz {
            Some(geometry) => geometry.asize(physical_bytes),
            None => self.io_bytes(physical_bytes),
        }
    }

    /// Children that may be lost with every block still readable.
    pub fn redundancy(&self) -> usize {
        self.kind.redundancy(self.children.len())
    }

    /// Children not in service now.
    pub fn children_away(&self) -> usize {
        self.children
            .iter()
            .filter(|child| !child.is_online())
            .count()
    }

    /// True when every block can still be read and written.
    pub fn is_available(&self) -> bool {
        self.children_away() <= self.redundancy()
    }

    /// ONLINE, DEGRADED (serving with less redundancy, including children still
    /// to be resilvered) or UNAVAIL.
    pub fn health(&self) -> VdevHealth {
        if !self.is_available() {
            VdevHealth::Unavail
        } else if self
            .children
            .iter()
            .any(|child| !child.is_online() || !child.dtl.borrow().is_empty())
        {
            VdevHealth::Degraded
        } else {
            VdevHealth::Online
        }
    }

    /// Writes a block of `data` (whole sectors) at data-area offset `offset`:
    /// the same bytes on every child of a mirror, columns and parity on RAID-Z.
    /// Succeeds while the children that missed it are within the redundancy;
    /// reports them.
    pub async fn write(
        &self,
        class: IoClass,
        offset: u64,
        data: BufSlice,
        flags: IoFlags,
    ) -> Result<WriteOutcome, VdevError> {
        run::write_one(self, class, offset, &data, flags).await
    }

    /// Writes several blocks as `write` writes each, with the pieces that
    /// follow each other on a child merged into one request (see [`run`]).
    /// Returns each block's outcome, in order.
    pub async fn write_run(
        &self,
        class: IoClass,
        blocks: &[run::RunBlock],
        flags: IoFlags,
    ) -> Vec<Result<WriteOutcome, VdevError>> {
        run::write_run(self, class, blocks, flags).await
    }

    /// What writing a block puts on each child (`ahead`: its RAID-Z parity,
    /// when computed earlier).
    fn plan_write(
        &self,
        offset: u64,
        data: &BufSlice,
        ahead: Option<&raidz::PrecomputedParity>,
    ) -> Result<run::Plan, VdevError> {
        debug_assert_eq!(data.len() as u64 % self.sector_bytes(), 0);
        match &self.raidz {
            Some(geometry) => raidz::io::plan_write(self, geometry, offset, data, ahead),
            None => Ok(mirror::plan_write(self, offset, data)),
        }
    }

    /// Bytes of a block of `length` bytes (whole sectors) at `offset` that
    /// `children` hold: all of it on each mirror side, their columns on RAID-Z.
    pub fn children_share_bytes(&self, children: &[usize], offset: u64, length: u64) -> u64 {
        match &self.raidz {
            Some(geometry) => match geometry.map(offset, length) {
                Ok(map) => map
                    .columns
                    .iter()
                    .filter(|column| children.contains(&(column.child as usize)))
                    .map(|column| column.size_bytes)
                    .sum(),
                Err(_) => 0,
            },
            None => length * children.len() as u64,
        }
    }

    /// Rewrites the given children's part of a block (self-heal, scrub repair,
    /// resilver) from the block's good `data`: the whole block on a mirror, the
    /// child's column (data, or parity recomputed) on RAID-Z. Fails when any of
    /// them failed.
    pub async fn repair(
        &self,
        children: &[usize],
        offset: u64,
        data: BufSlice,
        class: IoClass,
    ) -> Result<(), DeviceError> {
        match &self.raidz {
            Some(geometry) => {
                raidz::io::repair(self, geometry, children, offset, data, class).await
            }
            None => mirror::repair(self, children, offset, data, class).await,
        }
    }

    /// Reads the block of `length` bytes (whole sectors) at `offset`, born in
    /// `birth_txg`, until `verify` accepts it: mirror sides in turn, or RAID-Z
    /// data columns and, if needed, reconstruction. Children that returned bad
    /// bytes or errors are reported for repair.
    pub async fn read_verified(
        &self,
        class: IoClass,
        offset: u64,
        length: u64,
        birth_txg: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<VerifiedRead, VdevError> {
        match &self.raidz {
            Some(geometry) => {
                raidz::io::read_verified(self, geometry, class, offset, length, birth_txg, verify)
                    .await
            }
            None => mirror::read_verified(self, class, offset, length, birth_txg, verify).await,
        }
    }

    /// Reads everything stored for a block (scrub): every mirror side, or every
    /// RAID-Z column including parity. Returns the verified block if any, and
    /// the children whose part is bad (wrong, unreadable, parity that does not
    /// match, or missed while the child was away).
    pub async fn scrub_read(
        &self,
        offset: u64,
        length: u64,
        birth_txg: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> (Option<AlignedBuf>, Vec<usize>) {
        match &self.raidz {
            Some(geometry) => {
                raidz::io::scrub_read(self, geometry, offset, length, birth_txg, verify).await
            }
            None => mirror::scrub_read(self, offset, length, birth_txg, verify).await,
        }
    }

    /// Discards the vdev range `[offset, offset + length)` (free space) on
    /// every child in service that can: the same range on each side of a
    /// mirror, each child's own sectors of it on RAID-Z. Returns the bytes
    /// the children discarded; a child that failed or cannot is left as it
    /// is (the space is free either way).
    pub async fn trim(&self, offset: u64, length: u64) -> u64 {
        let pieces: Vec<(usize, u64, u64)> = match &self.raidz {
            Some(geometry) => geometry
                .child_ranges(offset, length)
                .into_iter()
                .map(|(child, child_offset, child_length)| {
                    (child as usize, child_offset, child_length)
                })
                .collect(),
            None => (0..self.children.len())
                .map(|child| (child, offset, length))
                .collect(),
        };
        let trims = pieces
            .iter()
            .map(|(child, child_offset, child_length)| async move {
                if self.children[*child]
                    .trim(*child_offset, *child_length)
                    .await
                {
                    *child_length
                } else {
                    0
                }
            });
        futures_util::future::join_all(trims)
            .await
            .into_iter()
            .sum()
    }

    /// Flushes every online child. Succeeds while the children that failed (or
    /// are away) are within the redundancy.
    pub async fn flush(&self) -> Result<(), VdevError> {
        if self.kind == TopVdevKind::Indirect {
            // A removed vdev has no devices, and nothing is written to it.
            return Ok(());
        }
        let flushes = self
            .children
            .iter()
            .filter(|child| child.is_online())
            .map(|child| child.queue.flush());
        let results = futures_util::future::join_all(flushes).await;
        let flushed = results.iter().filter(|result| result.is_ok()).count();
        if flushed > 0 && self.children.len() - flushed <= self.redundancy() {
            return Ok(());
        }
        Err(VdevError::AllFailed(describe_errors(
            results.into_iter().filter_map(Result::err),
        )))
    }
}

/// Notes the children whose generation moved while a write was in flight: the
/// write went to a device that is no longer the one in place.
fn note_replaced_during_write(top: &TopVdev, generations: &[u64], missed: &mut Vec<usize>) {
    for (index, child) in top.children.iter().enumerate() {
        if child.generation() != generations[index] && !missed.contains(&index) {
            missed.push(index);
        }
    }
}

fn describe_errors(errors: impl Iterator<Item = DeviceError>) -> String {
    let text: Vec<String> = errors.map(|error| error.to_string()).collect();
    if text.is_empty() {
        "no device available".to_string()
    } else {
        text.join("; ")
    }
}
