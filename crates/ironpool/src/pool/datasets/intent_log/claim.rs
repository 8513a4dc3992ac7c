//! An encrypted filesystem's intent log after a crash, while its key is
//! not loaded: claimed at import (its blocks and the blocks its records
//! link committed in the space maps, as OpenZFS's `zil_claim` allocates
//! them in the first txg), replayed when the key is loaded, and freed whole
//! by a destroy. So nothing of it is applied without the key
//! (docs/ARCHITECTURE.md, "Encrypted filesystems: replay with the key").

use std::rc::Rc;

use super::replay::{self, Apply, ChainRead};
use crate::format::intent_log::LogRecord;
use crate::format::{BlockPointer, Dva};
use crate::pool::dataset::directory::{LogClaim, LogHead};
use crate::pool::dataset::intent_log::ClaimedSpace;
use crate::pool::filesystem::Filesystem;
use crate::pool::{Owner, Pool, PoolError};

/// A chain claimed by this import, its space taken from the allocator's
/// free space and committed once the pool runs ([`commit_claims`]).
pub(crate) struct Claimed {
    fs: Rc<Filesystem>,
    head: LogHead,
    space: ClaimedSpace,
}

/// The blocks `read`'s records decide to link when txg `durable` is the
/// last the tree holds (the last record of each block decides), each with
/// the index of its record, in record order.
fn linked_blocks(
    read: &[(u64, LogRecord)],
    durable: u64,
    head: &LogHead,
) -> Vec<(usize, BlockPointer)> {
    let decided = replay::decide_fs(read, durable, head);
    let mut linked: Vec<(usize, BlockPointer)> = decided
        .blocks
        .into_values()
        .flatten()
        .filter_map(|(index, record)| match record {
            LogRecord::Block { pointer, .. } => Some((index, pointer)),
            _ => None,
        })
        .collect();
    linked.sort_by_key(|(index, _)| *index);
    linked
}

/// The index of the first record of the commit of record `index`: a
/// filesystem's commit applies whole or not at all.
fn commit_start(records: &[(u64, LogRecord)], mut index: usize) -> usize {
    let commit = records[index].0;
    while index > 0 && records[index - 1].0 == commit {
        index -= 1;
    }
    index
}

/// Claims the chain of filesystem `fs` at `head` (its key not loaded),
/// from what replay read of it (`read`: whole commits whose blocks hold
/// their data, txg `durable` imported): the space of its blocks and of the
/// blocks its records link is taken before anything allocates. Space found
/// in use (damage: a block a crash left free cannot be) ends the claim
/// before the commit naming it, as a damaged block ends a replay.
pub(super) fn claim_chain(
    pool: &Pool,
    fs: &Rc<Filesystem>,
    head: LogHead,
    read: ChainRead,
    durable: u64,
    notes: &mut Vec<String>,
) -> Claimed {
    let ChainRead {
        mut records,
        blocks: chain,
    } = read;
    loop {
        let read = ChainRead::new(records, chain.clone());
        records = read.records;
        let linked = linked_blocks(&records, durable, &head);
        let mut taken: Vec<Dva> = Vec::new();
        let mut refused = None;
        let mut start = 0;
        for (pointer, end) in &read.blocks {
            if !pool.store.claim(pointer.dva) {
                refused = Some(start);
                break;
            }
            taken.push(pointer.dva);
            start = *end;
        }
        if refused.is_none() {
            'blocks: for (index, pointer) in &linked {
                for dva in pointer.copies() {
                    if !pool.store.claim(*dva) {
                        refused = Some(*index);
                        break 'blocks;
                    }
                    taken.push(*dva);
                }
            }
        }
        let Some(index) = refused else {
            let space = ClaimedSpace {
                chain: read.blocks.iter().map(|(pointer, _)| pointer.dva).collect(),
                blocks: linked.into_iter().map(|(_, pointer)| pointer).collect(),
            };
            let claimed = (!records.is_empty()).then(|| LogClaim {
                txg: durable,
                seq: head.seq + read.blocks.len() as u64 - 1,
                records: records.len() as u64,
            });
            return Claimed {
                fs: fs.clone(),
                head: LogHead { claimed, ..head },
                space,
            };
        };
        pool.store.release(&taken);
        let cut = if index < records.len() {
            commit_start(&records, index)
        } else {
            index
        };
        notes.push(format!(
            "{}: intent log: record {index} names space in use; {} records from its commit on not replayed",
            fs.name(),
            records.len() - cut
        ));
        records.truncate(cut);
    }
}

/// Commits the space of the chains this import claimed (the pool runs
/// now), each filesystem's head naming its claim in the open txg. Returns
/// how many were claimed (the import commits that txg).
pub(super) fn commit_claims(pool: &Pool, claims: Vec<Claimed>, notes: &mut Vec<String>) -> usize {
    let count = claims.len();
    for Claimed { fs, head, space } in claims {
        let dvas: Vec<Dva> = space.dvas().copied().collect();
        pool.store.commit_claimed(&dvas);
        match head.claimed {
            Some(claim) => {
                notes.push(format!(
                    "{}: intent log: claimed {} records, replayed when its key is loaded",
                    fs.name(),
                    claim.records
                ));
                fs.log.set_claimed(space);
                pool.set_log_head(Owner::Filesystem(&fs), Some(head));
            }
            // Nothing left to replay.
            None => pool.set_log_head(Owner::Filesystem(&fs), None),
        }
    }
    count
}

/// Reads the chain an earlier import claimed at `head`: its blocks up to
/// the claim's last, its records up to the claim's count (fewer, noted,
/// when a block was damaged since).
async fn read_claimed(
    pool: &Pool,
    name: &str,
    head: &LogHead,
    notes: &mut Vec<String>,
) -> ChainRead {
    let claim = head.claimed.expect("a claimed head");
    let chain = replay::read_chain(pool, head, Some(claim.seq)).await;
    let mut records = chain.records;
    if (records.len() as u64) < claim.records {
        notes.push(format!(
            "{name}: intent log: {} of its claimed records unreadable{}",
            claim.records - records.len() as u64,
            chain
                .damage
                .map(|damage| format!(" ({damage})"))
                .unwrap_or_default()
        ));
        // Whole commits only.
        records.truncate(chain.complete);
    }
    records.truncate(claim.records as usize);
    ChainRead::new(records, chain.blocks)
}

/// At import: the space of a chain an earlier import claimed (`head`), so
/// that a destroy frees it, a scrub reads it and the space check counts it.
pub(super) async fn keep_claim(
    pool: &Pool,
    fs: &Filesystem,
    head: &LogHead,
    notes: &mut Vec<String>,
) {
    let claim = head.claimed.expect("a claimed head");
    let read = read_claimed(pool, &fs.name(), head, notes).await;
    let space = ClaimedSpace {
        chain: read.blocks.iter().map(|(pointer, _)| pointer.dva).collect(),
        blocks: linked_blocks(&read.records, claim.txg, head)
            .into_iter()
            .map(|(_, pointer)| pointer)
            .collect(),
    };
    fs.log.set_claimed(space);
}

impl Pool {
    /// Refuses what must not happen to filesystem `fs` while its intent
    /// log waits for its key to be replayed: a snapshot would miss what
    /// was acknowledged as durable, a rollback or a receive would change
    /// the tree the records apply to.
    pub(crate) fn check_log_not_claimed(&self, fs: &Filesystem) -> Result<(), PoolError> {
        match fs.log.is_claimed() {
            true => Err(PoolError::KeyUnavailable(format!(
                "{}: its intent log waits for replay: load its key first (ironpool load-key)",
                fs.name()
            ))),
            false => Ok(()),
        }
    }

    /// The key of filesystem `fs` was just loaded: the chain an import
    /// claimed is replayed, in one txg, as an import replays a plain
    /// filesystem's; the claimed blocks no record linked and the chain's
    /// own are freed, and the head goes. The caller holds `fs` whole and
    /// commits. Returns whether anything was replayed (the caller frees
    /// the files it left with no names).
    pub(crate) async fn replay_claimed(self: &Rc<Self>, fs: &Rc<Filesystem>) -> bool {
        let Some(space) = fs.log.claimed() else {
            return false;
        };
        let head = self
            .filesystem_record(&fs.short_name())
            .and_then(|record| record.intent_log)
            .filter(|head| head.claimed.is_some());
        let Some(head) = head else {
            return false;
        };
        let claim = head.claimed.expect("filtered");
        let name = fs.name();
        let mut notes = Vec::new();
        let read = read_claimed(self, &name, &head, &mut notes).await;
        let decided = replay::decide_fs(&read.records, claim.txg, &head);
        let blocks = decided
            .blocks
            .into_iter()
            .filter_map(|(key, record)| {
                let apply = match record?.1 {
                    LogRecord::Block { pointer, .. } => Apply::Claimed(pointer),
                    LogRecord::Hole { .. } => Apply::Hole,
                    LogRecord::Copy { data, .. } | LogRecord::Written { data, .. } => {
                        Apply::Write(data)
                    }
                    _ => return None,
                };
                Some((key, apply))
            })
            .collect();
        let mut changes = replay::fs_changes(
            decided.objects,
            decided.entries,
            decided.xattrs,
            decided.attrs,
            blocks,
        );
        let mut done = replay::write_fs_copies(self, fs, &mut changes).await;
        // Each claimed block given to the replay is linked or freed by it.
        let given: rustc_hash::FxHashSet<Dva> = changes
            .blocks
            .iter()
            .filter_map(|(_, apply)| match apply {
                Apply::Claimed(pointer) => Some(pointer.dvas[0]),
                _ => None,
            })
            .collect();
        {
            let _no_builds = self.txg.hold_builds();
            replay::apply_fs_changes(self, fs, &changes, &mut done).await;
            for block in space
                .blocks
                .iter()
                .filter(|block| !given.contains(&block.dvas[0]))
            {
                self.store.free(block);
            }
            self.store.free_dvas(&space.chain);
            fs.log.take_claimed();
            self.set_log_head(Owner::Filesystem(fs), None);
        }
        notes.extend(done.notes(&name));
        if done.applied == 0 && done.failed.is_empty() {
            notes.push(format!("{name}: intent log: replayed, nothing to apply"));
        }
        for note in &notes {
            eprintln!("ironpool: {note}");
        }
        self.import_notes.borrow_mut().extend(notes);
        true
    }

    /// Refuses the removal of top-level vdev `vdev` while a claimed chain
    /// holds space on it: the removal moves what trees and live chains
    /// hold, and a claimed chain is neither until its replay.
    pub(crate) fn check_no_claim_on(&self, vdev: u32) -> Result<(), PoolError> {
        for (short, space) in self.claimed_spaces() {
            if space.dvas().any(|dva| dva.vdev == vdev) {
                return Err(PoolError::KeyUnavailable(format!(
                    "{}/{short}: its intent log, on this vdev, waits for replay: load its key first (ironpool load-key)",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// The space every claimed chain holds, by filesystem (for the space
    /// check and the scrub).
    pub(crate) fn claimed_spaces(&self) -> Vec<(String, ClaimedSpace)> {
        self.all_filesystems()
            .into_iter()
            .filter_map(|(short, fs)| fs.log.claimed().map(|space| (short, space)))
            .collect()
    }
}
