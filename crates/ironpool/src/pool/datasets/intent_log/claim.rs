//! An encrypted filesystem's intent log after a crash, while its key is
//! not loaded: claimed at import (its blocks and the blocks its records
//! link committed in the space maps, as OpenZFS's `zil_claim` allocates
//! them in the first txg), replayed when the key is loaded, and freed whole
//! by a destroy. So nothing of it is applied without the key
//! (docs/ARCHITECTURE.md, "Encrypted filesystems: replay with the key").

use std::rc::Rc;

use super::replay::{self, commit_start, Apply, ChainRead};
use crate::format::intent_log::{LogPointer, LogRecord};
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
        let pointers = read.pointers();
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
                chain: pointers,
                blocks: linked.into_iter().map(|(_, pointer)| pointer).collect(),
                partial: false,
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

/// What [`read_claimed`] read of a claimed chain.
struct ClaimedRead {
    read: ChainRead,
    /// Every block and record claimed was read: what the records decide
    /// is what the claim decided (the same records, the same rules), so
    /// the blocks they link are the claimed ones.
    whole: bool,
}

/// Reads the chain an earlier import claimed at `head`: its blocks up to
/// the claim's last, its records up to the claim's count (fewer, whole
/// commits, noted, when a block is unreadable since).
async fn read_claimed(
    pool: &Pool,
    name: &str,
    head: &LogHead,
    notes: &mut Vec<String>,
) -> ClaimedRead {
    let claim = head.claimed.expect("a claimed head");
    let chain = replay::read_chain(pool, head, Some(claim.seq)).await;
    let whole = chain.records.len() as u64 >= claim.records
        && chain.blocks.len() as u64 == claim.seq - head.seq + 1;
    let mut records = chain.records;
    if !whole {
        notes.push(format!(
            "{name}: intent log: {} of its claimed records unreadable{}",
            claim.records.saturating_sub(records.len() as u64),
            chain
                .damage
                .map(|damage| format!(" ({damage})"))
                .unwrap_or_default()
        ));
        // Whole commits only.
        records.truncate(chain.complete);
    }
    records.truncate(claim.records as usize);
    ClaimedRead {
        read: ChainRead::new(records, chain.blocks),
        whole,
    }
}

/// At import: the space of a chain an earlier import claimed (`head`), so
/// that a destroy frees it, a scrub reads it and the space check counts it.
///
/// Read whole, the records decide the claimed blocks again. Read in part
/// (a block unreadable since), they cannot: a record past the damage may
/// have decided another block than one read, so none of the blocks the
/// records link is taken as claimed (the replay links none of them, and a
/// destroy frees only the chain's blocks read). Their space stays
/// allocated, as the space check then says: nothing is freed or linked
/// that the claim may not hold.
pub(super) async fn keep_claim(
    pool: &Pool,
    fs: &Filesystem,
    head: &LogHead,
    notes: &mut Vec<String>,
) {
    let claim = head.claimed.expect("a claimed head");
    let ClaimedRead { read, whole } = read_claimed(pool, &fs.name(), head, notes).await;
    let blocks = match whole {
        true => linked_blocks(&read.records, claim.txg, head)
            .into_iter()
            .map(|(_, pointer)| pointer)
            .collect(),
        false => {
            notes.push(format!(
                "{}: intent log: the claimed chain reads in part: the blocks its records link stay allocated, and are not replayed",
                fs.name()
            ));
            Vec::new()
        }
    };
    let space = ClaimedSpace {
        chain: read.pointers(),
        blocks,
        partial: !whole,
    };
    fs.log.set_claimed(space);
}

/// Opens the sealed records of `records` (filesystem `name`'s, read from
/// its claimed chain) with its `key`. The first that does not open (altered,
/// or damaged past its checksum) ends the replay before its commit, as a
/// damaged block ends a chain.
fn open_sealed(
    key: &crate::crypto::DatasetKey,
    name: &str,
    records: &mut Vec<(u64, LogRecord)>,
    notes: &mut Vec<String>,
) {
    for index in 0..records.len() {
        let LogRecord::Sealed {
            object,
            txg,
            sealed,
        } = &records[index].1
        else {
            continue;
        };
        match crate::crypto::open_record(key, *object, *txg, sealed) {
            Ok(record) => records[index].1 = record,
            Err(error) => {
                let cut = commit_start(records, index);
                notes.push(format!(
                    "{name}: intent log: record {index} does not open ({error}); {} records from its commit on not replayed",
                    records.len() - cut
                ));
                records.truncate(cut);
                return;
            }
        }
    }
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
        let ClaimedRead { mut read, whole } = read_claimed(self, &name, &head, &mut notes).await;
        // The blocks the claim holds: decided again from the whole chain
        // (as the claim decided them), else those the import kept.
        let (claimed_blocks, chain): (Vec<BlockPointer>, Vec<LogPointer>) = match whole {
            true => (
                linked_blocks(&read.records, claim.txg, &head)
                    .into_iter()
                    .map(|(_, pointer)| pointer)
                    .collect(),
                read.pointers(),
            ),
            false => (space.blocks.clone(), space.chain.clone()),
        };
        let held: rustc_hash::FxHashSet<Dva> = claimed_blocks
            .iter()
            .map(|pointer| pointer.dvas[0])
            .collect();
        match fs.data_key() {
            Ok(Some(key)) => open_sealed(&key, &name, &mut read.records, &mut notes),
            // Not encrypted (a claim is made only of an encrypted one's).
            Ok(None) => {}
            Err(_) => return false,
        }
        // Only a block the claim holds is linked: records cut short (a
        // sealed one that does not open, a chain block unreadable) may
        // leave an older pointer deciding, whose space the claim never
        // took. Its commit would then apply without that block: the replay
        // ends before it instead, and decides again.
        let decided = loop {
            let decided = replay::decide_fs(&read.records, claim.txg, &head);
            let first_unclaimed = decided
                .blocks
                .values()
                .flatten()
                .filter_map(|(index, record)| match record {
                    LogRecord::Block { pointer, .. } if !held.contains(&pointer.dvas[0]) => {
                        Some(*index)
                    }
                    _ => None,
                })
                .min();
            let Some(index) = first_unclaimed else {
                break decided;
            };
            let cut = commit_start(&read.records, index);
            notes.push(format!(
                "{name}: intent log: record {index} names a block never claimed; {} records from its commit on not replayed",
                read.records.len() - cut
            ));
            read.records.truncate(cut);
        };
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
            for block in claimed_blocks
                .iter()
                .filter(|block| !given.contains(&block.dvas[0]))
            {
                self.store.free(block);
            }
            self.store
                .free_dvas(chain.iter().map(|pointer| &pointer.dva));
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
            // Read in part, its blocks may be on any vdev.
            if space.partial || space.dvas().any(|dva| dva.vdev == vdev) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{seal_record, DatasetKey, MasterKey, Suite};

    /// A sealed record that does not open (altered) ends the replay before
    /// its commit: the commit applies whole or not at all, and nothing
    /// after it applies; the note says how many records were dropped.
    #[test]
    fn a_sealed_record_that_does_not_open_ends_the_replay_before_its_commit() {
        let key = DatasetKey::new(MasterKey::generate(Suite::Aes256Gcm).unwrap());
        let entry = |txg, name: &[u8]| LogRecord::Entry {
            dir: 2,
            txg,
            name: name.to_vec(),
            target: None,
        };
        let mut records = vec![
            (1, seal_record(&key, &entry(10, b"a")).unwrap()),
            (2, LogRecord::Freed { object: 9, txg: 11 }),
            (2, seal_record(&key, &entry(11, b"b")).unwrap()),
            (3, seal_record(&key, &entry(12, b"c")).unwrap()),
        ];
        let LogRecord::Sealed { sealed, .. } = &mut records[2].1 else {
            panic!("not sealed");
        };
        sealed[0] ^= 1;
        let mut notes = Vec::new();
        open_sealed(&key, "tank/fs", &mut records, &mut notes);
        assert_eq!(records, vec![(1, entry(10, b"a"))]);
        assert!(
            notes.len() == 1 && notes[0].contains("3 records from its commit on"),
            "{notes:?}"
        );
    }
}
