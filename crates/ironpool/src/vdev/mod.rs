//! Virtual devices: leaves (one device each, with its I/O queue) and top-level
//! vdevs (a single disk, or a mirror of 2-3 leaves; RAID-Z plugs in here).
//!
//! A top-level vdev places a block's copy at an offset of its data area and knows
//! how to read it back verified: a mirror tries its children until one returns
//! bytes that match the block's checksum, and reports which children were bad so
//! the caller can rewrite them (self-heal).

pub mod queue;
pub mod raidz;
pub mod stats;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::dev::{Device, DeviceError};
use crate::format::label::TopVdevKind;
use crate::format::DATA_START_BYTES;
use crate::rt::buf::{AlignedBuf, BufSlice};
use queue::{IoClass, IoFlags, QueueTunables, VdevQueue};

/// The health of a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LeafState {
    Online,
    /// Not found at import, or vanished.
    Missing,
    /// Taken out by the operator.
    Offline,
}

/// One device in the pool.
pub struct LeafVdev {
    pub guid: u64,
    pub path: RefCell<String>,
    pub queue: Rc<VdevQueue>,
    state: Cell<LeafState>,
}

impl LeafVdev {
    pub fn new(guid: u64, path: String, device: Option<Rc<dyn Device>>, tunables: QueueTunables) -> Rc<LeafVdev> {
        let state = if device.is_some() { LeafState::Online } else { LeafState::Missing };
        Rc::new(LeafVdev { guid, path: RefCell::new(path), queue: VdevQueue::new(device, tunables), state: Cell::new(state) })
    }

    pub fn state(&self) -> LeafState {
        self.state.get()
    }

    pub fn is_online(&self) -> bool {
        self.state.get() == LeafState::Online
    }

    pub fn device(&self) -> Option<Rc<dyn Device>> {
        self.queue.device()
    }

    /// Releases the device (pool export): its descriptor closes and its lock drops
    /// once in-flight I/O is done with it.
    pub fn close(&self) {
        self.queue.set_device(None);
        self.state.set(LeafState::Missing);
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
}

/// Result of a verified read: the good bytes and the children that returned bad
/// bytes or errors (to be repaired by the caller).
pub struct VerifiedRead {
    pub data: AlignedBuf,
    pub bad_children: Vec<usize>,
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
}

impl TopVdev {
    pub fn sector_bytes(&self) -> u64 {
        1 << self.ashift
    }

    /// Rounds a physical size up to this vdev's allocation unit.
    pub fn allocated_size(&self, physical_bytes: u64) -> u64 {
        physical_bytes.div_ceil(self.sector_bytes()) * self.sector_bytes()
    }

    /// True when every child is online.
    pub fn is_healthy(&self) -> bool {
        self.children.iter().all(|child| child.is_online())
    }

    /// True when some copy can still be read and written.
    pub fn is_available(&self) -> bool {
        self.children.iter().any(|child| child.is_online())
    }

    /// Writes `data` at data-area offset `offset` on every online child.
    /// Succeeds when at least one child took it (a mirror keeps working degraded);
    /// the failures are counted on the children.
    pub async fn write(&self, class: IoClass, offset: u64, data: BufSlice, flags: IoFlags) -> Result<(), VdevError> {
        debug_assert_eq!(data.len() as u64 % self.sector_bytes(), 0);
        let absolute = DATA_START_BYTES + offset;
        let online: Vec<&Rc<LeafVdev>> = self.children.iter().filter(|child| child.is_online()).collect();
        // Two- and one-sided writes are the common cases: join them without
        // join_all's heap-allocated bookkeeping.
        let results: Vec<Result<(), DeviceError>> = match online.as_slice() {
            [only] => vec![only.queue.write(class, absolute, data, flags).await],
            [first, second] => {
                let (a, b) = futures_util::future::join(first.queue.write(class, absolute, data.clone(), flags), second.queue.write(class, absolute, data, flags)).await;
                vec![a, b]
            }
            _ => futures_util::future::join_all(online.iter().map(|child| child.queue.write(class, absolute, data.clone(), flags))).await,
        };
        if results.iter().any(|result| result.is_ok()) {
            return Ok(());
        }
        Err(VdevError::AllFailed(describe_errors(results.into_iter().filter_map(Result::err))))
    }

    /// Rewrites one child's copy (self-heal, scrub repair).
    pub async fn repair(&self, child: usize, offset: u64, data: BufSlice, class: IoClass) -> Result<(), DeviceError> {
        let leaf = &self.children[child];
        let result = leaf.queue.write(class, DATA_START_BYTES + offset, data.clone(), IoFlags { repair: true, ..IoFlags::default() }).await;
        if result.is_ok() {
            leaf.queue.count(|stats| stats.repaired_bytes += data.len() as u64);
        }
        result
    }

    /// Reads `length` bytes at `offset`, trying children (least busy first) until
    /// `verify` accepts the bytes. Children that failed are reported for repair.
    pub async fn read_verified(&self, class: IoClass, offset: u64, length: u64, verify: &dyn Fn(&[u8]) -> bool) -> Result<VerifiedRead, VdevError> {
        let order = self.read_order();
        let mut bad_children = Vec::new();
        let mut errors = Vec::new();
        for child in order {
            let leaf = &self.children[child];
            match leaf.queue.read(class, DATA_START_BYTES + offset, length, IoFlags::default()).await {
                Ok(data) if verify(&data) => return Ok(VerifiedRead { data, bad_children }),
                Ok(_) => {
                    leaf.queue.count(|stats| stats.checksum_errors += 1);
                    bad_children.push(child);
                    errors.push(format!("{}: checksum mismatch", leaf.path.borrow()));
                }
                Err(error) => {
                    bad_children.push(child);
                    errors.push(format!("{}: {error}", leaf.path.borrow()));
                }
            }
        }
        Err(VdevError::AllFailed(if errors.is_empty() { "no device available".to_string() } else { errors.join("; ") }))
    }

    /// Reads every child's copy (scrub): returns a verified copy if any, and the
    /// children whose copy is bad.
    pub async fn read_every_copy(&self, offset: u64, length: u64, verify: &dyn Fn(&[u8]) -> bool) -> (Option<AlignedBuf>, Vec<usize>) {
        let reads = self
            .children
            .iter()
            .map(|leaf| leaf.queue.read(IoClass::Scrub, DATA_START_BYTES + offset, length, IoFlags { scrub: true, ..IoFlags::default() }));
        let results = futures_util::future::join_all(reads).await;
        let mut good = None;
        let mut bad = Vec::new();
        for (child, result) in results.into_iter().enumerate() {
            if !self.children[child].is_online() {
                continue;
            }
            match result {
                Ok(data) if verify(&data) => {
                    if good.is_none() {
                        good = Some(data);
                    }
                }
                Ok(_) => {
                    self.children[child].queue.count(|stats| stats.checksum_errors += 1);
                    bad.push(child);
                }
                Err(_) => bad.push(child),
            }
        }
        (good, bad)
    }

    /// Flushes every online child. Succeeds when at least one did.
    pub async fn flush(&self) -> Result<(), VdevError> {
        let flushes = self.children.iter().filter(|child| child.is_online()).map(|child| child.queue.flush());
        let results = futures_util::future::join_all(flushes).await;
        if results.iter().any(|result| result.is_ok()) {
            return Ok(());
        }
        Err(VdevError::AllFailed(describe_errors(results.into_iter().filter_map(Result::err))))
    }

    /// Children to try, least busy first; ties broken at random so both sides of
    /// a mirror share the reads.
    fn read_order(&self) -> Vec<usize> {
        let mut order: Vec<(u64, u64, usize)> = self
            .children
            .iter()
            .enumerate()
            .filter(|(_, child)| child.is_online())
            .map(|(index, child)| (child.load(), crate::rt::random_u64(), index))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, _, index)| index).collect()
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
