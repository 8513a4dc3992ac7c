//! Disks and mirrors: every child holds the whole block at the same offset.

use std::rc::Rc;

use super::run::{Piece, Plan, Survives};
use super::{LeafVdev, TopVdev, VdevError, VerifiedRead};
use crate::dev::DeviceError;
use crate::format::DATA_START_BYTES;
use crate::queue::{IoClass, IoFlags};
use crate::rt::buf::{AlignedBuf, BufSlice};

/// Queued reads by which a mirror side continuing a sequential run may be
/// busier than another side before a read goes elsewhere. Why: sides taking
/// turns block by block each read every other block, and each queue's
/// aggregation then fills the gaps between them: a 1 GiB send of 16K
/// blocks read 1 GiB from each side of a two-way mirror, twice the stream
/// in all. Kept on one side
/// for up to 64 reads (1 MiB of 16K blocks, the aggregation limit), a run
/// is read once, and both sides still share a long stream and random reads
/// (which continue no run) go to the least busy. OpenZFS's mirror does the
/// same with a seek penalty on reads that do not follow a child's last one.
pub const MIRROR_SEEK_PENALTY: u64 = 64;

/// Writing a block puts it whole on every online child; a mirror keeps
/// working degraded as long as one side takes it, the others are missed.
pub(super) fn plan_write(top: &TopVdev, offset: u64, data: &BufSlice) -> Plan {
    let absolute = DATA_START_BYTES + offset;
    let mut pieces = Vec::with_capacity(top.children.len());
    let mut missed = Vec::new();
    for (child, leaf) in top.children.iter().enumerate() {
        if leaf.is_online() {
            pieces.push(Piece {
                child,
                offset: absolute,
                data: data.clone(),
                optional: false,
                counts: true,
            });
        } else {
            missed.push(child);
        }
    }
    Plan::new(pieces, missed, Survives::AnySide)
}

/// Rewrites the whole block on each of `children` (fails for those away).
pub(super) async fn repair(
    top: &TopVdev,
    children: &[usize],
    offset: u64,
    data: BufSlice,
    class: IoClass,
) -> Result<(), DeviceError> {
    let mut outcome = Ok(());
    for &index in children {
        let leaf = &top.children[index];
        if !leaf.is_online() {
            outcome = Err(DeviceError::Missing);
            continue;
        }
        let result = leaf
            .queue
            .write(
                class,
                DATA_START_BYTES + offset,
                data.clone(),
                IoFlags {
                    repair: true,
                    ..IoFlags::default()
                },
            )
            .await;
        match result {
            Ok(()) => leaf
                .queue
                .count(|stats| stats.repaired_bytes += data.len() as u64),
            Err(error) => outcome = Err(error),
        }
    }
    outcome
}

/// Tries the children that hold the block (least busy first) until `verify`
/// accepts the bytes. Children that failed are reported for repair. Children
/// that missed the block's txg are tried last, as a last resort (the checksum
/// says whether they happen to hold it); their failures are expected and left
/// to the resilver.
pub(super) async fn read_verified(
    top: &TopVdev,
    class: IoClass,
    offset: u64,
    length: u64,
    birth_txg: u64,
    verify: &dyn Fn(&[u8]) -> bool,
) -> Result<VerifiedRead, VdevError> {
    let mut bad_children = Vec::new();
    let mut errors = Vec::new();
    for child in read_order(top, birth_txg, offset) {
        let leaf = &top.children[child];
        let stale = !leaf.is_readable_for(birth_txg);
        let generation = leaf.generation();
        leaf.read_end.set(offset + length);
        let result = leaf
            .queue
            .read(class, DATA_START_BYTES + offset, length, IoFlags::default())
            .await;
        // A read queued before the device was replaced may have gone to the
        // new one, which does not hold the block yet: a stale copy, not a bad
        // one (the resilver writes it), and no fault of the new device.
        let stale = stale || leaf.generation() != generation;
        match result {
            Ok(data) if verify(&data) => return Ok(VerifiedRead { data, bad_children }),
            Ok(_) if stale => {
                errors.push(format!("{}: missed this block's txg", leaf.path.borrow()))
            }
            Ok(_) => {
                leaf.queue.checksum_error(
                    DATA_START_BYTES + offset,
                    length,
                    "mirror copy does not match its checksum",
                );
                bad_children.push(child);
                errors.push(format!("{}: checksum mismatch", leaf.path.borrow()));
            }
            Err(error) => {
                if !stale {
                    bad_children.push(child);
                }
                errors.push(format!("{}: {error}", leaf.path.borrow()));
            }
        }
    }
    Err(VdevError::AllFailed(if errors.is_empty() {
        "no device holds this block".to_string()
    } else {
        errors.join("; ")
    }))
}

/// Reads every child's copy: returns a verified copy if any, and the children
/// whose copy is bad or stale (missed while away). When no child that holds
/// the block has a good copy, the stale ones are read as a last resort, as
/// `read_verified` does: "missed" is what the pool could prove, not that the
/// copy is gone (after a crash in a commit, every child whose label missed the
/// last txg is marked, though its data was flushed before any uberblock was
/// written), and a copy that verifies is the block.
pub(super) async fn scrub_read(
    top: &TopVdev,
    offset: u64,
    length: u64,
    birth_txg: u64,
    verify: &dyn Fn(&[u8]) -> bool,
) -> (Option<AlignedBuf>, Vec<usize>) {
    let (readable, stale): (Vec<usize>, Vec<usize>) = (0..top.children.len())
        .filter(|index| top.children[*index].is_online())
        .partition(|index| top.children[*index].is_readable_for(birth_txg));
    let read_all = |children: &[usize]| {
        futures_util::future::join_all(children.iter().map(|index| {
            top.children[*index].queue.read(
                IoClass::Scrub,
                DATA_START_BYTES + offset,
                length,
                IoFlags {
                    scrub: true,
                    ..IoFlags::default()
                },
            )
        }))
    };
    let results = read_all(&readable).await;
    let mut good = None;
    // Online children that missed the block's txg hold a stale copy: they are
    // rewritten whatever a last-resort read of them finds.
    let mut bad = stale.clone();
    for (child, result) in readable.into_iter().zip(results) {
        match result {
            Ok(data) if verify(&data) => {
                if good.is_none() {
                    good = Some(data);
                }
            }
            Ok(_) => {
                top.children[child].queue.checksum_error(
                    DATA_START_BYTES + offset,
                    length,
                    "mirror copy does not match its checksum (scrub)",
                );
                bad.push(child);
            }
            Err(_) => bad.push(child),
        }
    }
    if good.is_none() && !stale.is_empty() {
        good = read_all(&stale)
            .await
            .into_iter()
            .flatten()
            .find(|data| verify(data));
    }
    (good, bad)
}

/// Children to try: online ones, those that hold the block first, then least
/// busy first, a side whose last read ended at `offset` counted
/// [`MIRROR_SEEK_PENALTY`] less busy; ties broken at random so both sides of
/// a mirror share the reads.
fn read_order(top: &TopVdev, birth_txg: u64, offset: u64) -> Vec<usize> {
    let mut order: Vec<(bool, u64, u64, usize)> = top
        .children
        .iter()
        .enumerate()
        .filter(|(_, child)| child.is_online())
        .map(|(index, child): (usize, &Rc<LeafVdev>)| {
            (
                !child.is_readable_for(birth_txg),
                child.load()
                    + if child.read_end.get() == offset {
                        0
                    } else {
                        MIRROR_SEEK_PENALTY
                    },
                crate::rt::random_u64(),
                index,
            )
        })
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, _, _, index)| index).collect()
}
