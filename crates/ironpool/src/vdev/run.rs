//! Writing blocks through a top-level vdev, one or many at a time.
//!
//! Each block is first planned: the pieces its vdev kind puts on each child
//! (the whole block on every mirror side; data and parity columns and pads on
//! RAID-Z). Pieces of different blocks that follow each other on a child are
//! then handed to that child's queue as one request of several buffers.
//!
//! Why: write-back writes a few hundred blocks allocated one after another.
//! On a RAID-Z group of 6 a 16 KiB block is 6 column writes; queued one by
//! one, a 4 MiB batch was 1,536 queue entries (each with its reply channel,
//! index updates and wake-ups) that the queue then aggregated back into a
//! handful of device writes. Merged here, the same batch is a handful of
//! requests, and the per-column queue work is gone.
//!
//! A request fails as a whole: every block with a piece in it misses that
//! child. Whether a block survives that is the vdev kind's rule, as for a
//! single write: a mirror needs one side written, RAID-Z at most `parity`
//! columns lost. Pads are never read, so losing one costs nothing.

use std::rc::Rc;

use crate::dev::DeviceError;
use crate::rt::buf::BufSlice;
use crate::rt::uring::IOVEC_COUNT_MAX;

use super::raidz::PrecomputedParity;
use super::{describe_errors, note_replaced_during_write, TopVdev, VdevError, WriteOutcome};
use crate::queue::{IoClass, IoFlags};

/// Largest request built from a run on one child: the queue's default
/// aggregation limit, so merging here never makes a device I/O the queue
/// would not have made, and one request never holds up others for long.
pub const RUN_REQUEST_BYTES_MAX: u64 = 1 << 20;

/// Most buffers in one merged request: half of what a vectored device I/O
/// takes, so a request always fits an aggregate with room for neighbours.
pub const RUN_REQUEST_SLICES_MAX: usize = IOVEC_COUNT_MAX / 2;

/// One child's part of a block.
pub(super) struct Piece {
    pub child: usize,
    /// Absolute device offset.
    pub offset: u64,
    pub data: BufSlice,
    /// A pad the queue may drop when it fills no gap (OpenZFS 8005).
    pub optional: bool,
    /// Holds part of the block (false for pads): losing it means the child
    /// missed the block.
    pub counts: bool,
}

/// How many lost children a block survives.
#[derive(Clone, Copy)]
pub(super) enum Survives {
    /// Every side holds the whole block: one written side is enough.
    AnySide,
    /// RAID-Z: up to this many columns lost (of `columns`).
    Parity { parity: usize, columns: usize },
}

/// A block's pieces and the children that miss it already (away); then, as
/// its pieces complete, what they did.
pub(super) struct Plan {
    pub pieces: Vec<Piece>,
    pub missed: Vec<usize>,
    pub survives: Survives,
    /// Pieces holding part of the block that were written.
    pub written: usize,
    /// Why the others failed.
    pub errors: Vec<DeviceError>,
}

impl Plan {
    pub fn new(pieces: Vec<Piece>, missed: Vec<usize>, survives: Survives) -> Plan {
        Plan {
            pieces,
            missed,
            survives,
            written: 0,
            errors: Vec::new(),
        }
    }

    /// Notes how a piece holding part of the block on `child` went.
    fn record(&mut self, child: usize, result: &Result<(), DeviceError>) {
        match result {
            Ok(()) => self.written += 1,
            Err(error) => {
                if !self.missed.contains(&child) {
                    self.missed.push(child);
                }
                self.errors.push(error.clone());
            }
        }
    }

    /// The block's outcome by its vdev kind's rule.
    fn judge(
        mut self,
        top: &TopVdev,
        generations: &[u64],
        offset: u64,
    ) -> Result<WriteOutcome, VdevError> {
        let lost = self.missed.len();
        note_replaced_during_write(top, generations, &mut self.missed);
        match self.survives {
            Survives::AnySide if self.written == 0 => Err(VdevError::AllFailed(describe_errors(
                self.errors.into_iter(),
            ))),
            Survives::Parity { parity, columns } if lost > parity => {
                Err(VdevError::TooManyFailures(format!(
                    "{lost} of {columns} columns not written at offset {offset:#x}: {}",
                    describe_errors(self.errors.into_iter())
                )))
            }
            _ => Ok(WriteOutcome {
                missed_children: self.missed,
            }),
        }
    }
}

/// One request to one child's queue: consecutive pieces of one or more blocks.
struct Request {
    child: usize,
    offset: u64,
    bytes: u64,
    slices: Vec<BufSlice>,
    optional: bool,
    /// Blocks with a counted piece in this request.
    blocks: Vec<usize>,
}

impl Request {
    fn new(piece: &Piece) -> Request {
        Request {
            child: piece.child,
            offset: piece.offset,
            bytes: 0,
            slices: Vec::new(),
            optional: piece.optional,
            blocks: Vec::new(),
        }
    }

    fn takes(&self, piece: &Piece) -> bool {
        !self.optional
            && !piece.optional
            && self.offset + self.bytes == piece.offset
            && self.bytes + piece.data.len() as u64 <= RUN_REQUEST_BYTES_MAX
            && self.slices.len() < RUN_REQUEST_SLICES_MAX
    }

    fn add(&mut self, piece: Piece, block: usize) {
        if piece.counts && self.blocks.last() != Some(&block) {
            self.blocks.push(block);
        }
        self.bytes += piece.data.len() as u64;
        self.slices.push(piece.data);
    }
}

/// One block of a run.
pub struct RunBlock {
    /// Where it goes in the top-level vdev's data area.
    pub offset: u64,
    /// Its bytes, whole sectors.
    pub data: BufSlice,
    /// Its RAID-Z parity when computed ahead (write-back computes it while the
    /// bytes are in the CPU cache); else computed here.
    pub parity: Option<Rc<PrecomputedParity>>,
}

/// Writes `blocks` and returns each block's outcome in the same order.
pub(super) async fn write_run(
    top: &TopVdev,
    class: IoClass,
    blocks: &[RunBlock],
    flags: IoFlags,
) -> Vec<Result<WriteOutcome, VdevError>> {
    let generations: Vec<u64> = top
        .children
        .iter()
        .map(|child| child.generation())
        .collect();
    let mut plans: Vec<Result<Plan, VdevError>> = blocks
        .iter()
        .map(|block| top.plan_write(block.offset, &block.data, block.parity.as_deref()))
        .collect();
    // In offset order, so that each child's pieces come in offset order.
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&index| blocks[index].offset);
    let mut open: Vec<Option<Request>> = top.children.iter().map(|_| None).collect();
    let mut requests: Vec<Request> = Vec::new();
    for index in order {
        let Ok(plan) = &mut plans[index] else {
            continue;
        };
        for piece in std::mem::take(&mut plan.pieces) {
            let slot = &mut open[piece.child];
            if !slot.as_ref().is_some_and(|request| request.takes(&piece)) {
                requests.extend(slot.replace(Request::new(&piece)));
            }
            slot.as_mut()
                .expect("a request was just opened")
                .add(piece, index);
        }
    }
    requests.extend(open.into_iter().flatten());

    let mut writes = Vec::with_capacity(requests.len());
    let mut owners = Vec::with_capacity(requests.len());
    for request in requests {
        let queue = top.children[request.child].queue.clone();
        let request_flags = IoFlags {
            optional: request.optional,
            ..flags
        };
        let (offset, mut slices) = (request.offset, request.slices);
        owners.push((request.child, request.blocks));
        writes.push(async move {
            if slices.len() == 1 {
                queue
                    .write(
                        class,
                        offset,
                        slices.pop().expect("one slice"),
                        request_flags,
                    )
                    .await
            } else {
                queue.writev(class, offset, slices, request_flags).await
            }
        });
    }
    let results = futures_util::future::join_all(writes).await;

    for ((child, owned), result) in owners.into_iter().zip(results) {
        for block in owned {
            if let Ok(plan) = &mut plans[block] {
                plan.record(child, &result);
            }
        }
    }
    plans
        .into_iter()
        .zip(blocks)
        .map(|(plan, block)| plan?.judge(top, &generations, block.offset))
        .collect()
}

/// Writes one block: its pieces straight to the queues, none to merge. (A
/// client's written-through write and every metadata block come this way;
/// through the run's bookkeeping, 1 MiB sequential writes took about a fifth
/// more engine CPU per byte.)
pub(super) async fn write_one(
    top: &TopVdev,
    class: IoClass,
    offset: u64,
    data: &BufSlice,
    flags: IoFlags,
) -> Result<WriteOutcome, VdevError> {
    let generations: Vec<u64> = top
        .children
        .iter()
        .map(|child| child.generation())
        .collect();
    let mut plan = top.plan_write(offset, data, None)?;
    let pieces = std::mem::take(&mut plan.pieces);
    let owners: Vec<(usize, bool)> = pieces
        .iter()
        .map(|piece| (piece.child, piece.counts))
        .collect();
    let writes = pieces.into_iter().map(|piece| {
        let queue = top.children[piece.child].queue.clone();
        async move {
            queue
                .write(
                    class,
                    piece.offset,
                    piece.data,
                    IoFlags {
                        optional: piece.optional,
                        ..flags
                    },
                )
                .await
        }
    });
    let results = futures_util::future::join_all(writes).await;
    // A pad that failed costs nothing: it is never read.
    for ((child, counts), result) in owners.into_iter().zip(results) {
        if counts {
            plan.record(child, &result);
        }
    }
    plan.judge(top, &generations, offset)
}
