//! Replay at import: the chains read from their durable heads, the records
//! of txgs that never became durable claimed and applied (volumes' blocks,
//! filesystems' objects, entries, extended attributes, blocks and sizes).

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::format::intent_log::{
    self as format, EntryTarget, LogPointer, LogRecord, ObjectState, LOG_BLOCK_BYTES_MAX,
};
use crate::format::{BlockPointer, ObjectType};
use crate::pool::dataset::directory::{LogHead, ReplayedTimes};
use crate::pool::dataset::intent_log::{EntryKey, FileAttr, REPLAY_BLOCKS_MAX};
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::pool::Owner;
use crate::pool::Pool;
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};

/// What replay found in one chain.
pub(super) struct Chain {
    /// Each record with the commit that wrote it.
    pub(super) records: Vec<(u64, LogRecord)>,
    /// Records up to the end of the last block that ends its commit: the
    /// rest belong to a commit whose last block was not read (torn, or
    /// never written).
    pub(super) complete: usize,
    /// Why the walk ended, when it was not at a block never written.
    pub(super) damage: Option<String>,
    /// The blocks read, each with the count of records up to its end.
    pub(super) blocks: Vec<(LogPointer, usize)>,
}

/// Reads a dataset's chain from `head` until a block does not verify, or
/// up to block `last` (a claim's last block).
pub(super) async fn read_chain(pool: &Pool, head: &LogHead, last: Option<u64>) -> Chain {
    let mut chain = Chain {
        records: Vec::new(),
        complete: 0,
        damage: None,
        blocks: Vec::new(),
    };
    let mut pointer = head.pointer();
    let end = head.seq.saturating_add(REPLAY_BLOCKS_MAX);
    let end = last.map_or(end, |last| end.min(last.saturating_add(1)));
    for seq in head.seq..end {
        if pointer.bytes as usize > LOG_BLOCK_BYTES_MAX || pointer.bytes == 0 {
            chain.damage = Some(format!("log block {seq} has an invalid size"));
            break;
        }
        let first = pool
            .store
            .read_unverified(pointer.dva, pointer.bytes as u64)
            .await;
        let decoded = match &first {
            Ok(bytes) => {
                format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
            }
            Err(error) => Err(crate::format::FormatError::Invalid {
                what: "intent log block",
                reason: error.to_string(),
            }),
        };
        let decoded = match decoded {
            Ok(decoded) => Ok(decoded),
            Err(error) => {
                // The copy read first does not verify: another side or
                // parity may hold the block intact (a damaged side can hide
                // even that the block is this chain's), so every block
                // that fails is read again with reconstruction. Only the
                // block after the last one written fails that too, as
                // expected: what that read counted against the devices is
                // taken back, unless the block named itself as this chain's
                // (then it is a torn or damaged block, and reported).
                let ours = first
                    .as_ref()
                    .is_ok_and(|bytes| format::names_block(bytes, head.chain_guid, seq));
                let verify = |bytes: &[u8]| {
                    format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
                        .is_ok()
                };
                match pool
                    .store
                    .read_self_checked_quietly(pointer.dva, pointer.bytes as u64, &verify, !ours)
                    .await
                {
                    Ok(bytes) => {
                        format::decode_block(&bytes[..pointer.bytes as usize], head.chain_guid, seq)
                    }
                    Err(_) => {
                        if ours {
                            chain.damage = Some(format!(
                                "log block {seq} is torn or damaged ({error}); replay ended there"
                            ));
                        }
                        Err(error)
                    }
                }
            }
        };
        let Ok((header, records)) = decoded else {
            break;
        };
        chain
            .records
            .extend(records.into_iter().map(|record| (header.commit, record)));
        if header.ends_commit {
            chain.complete = chain.records.len();
        }
        chain.blocks.push((pointer, chain.records.len()));
        pointer = header.next;
    }
    chain
}

/// What replay does to one block.
pub(super) enum Apply {
    /// Link a block written in place (its space claimed).
    Link(BlockPointer),
    /// Link a block whose space an import claimed and committed (an
    /// encrypted filesystem's, replayed at its key's load): a failure
    /// frees it rather than letting go of an allocation never committed.
    Claimed(BlockPointer),
    /// Make it a hole.
    Hole,
    /// Write these bytes (a copy from the log).
    Write(Vec<u8>),
}

/// What replay does to a volume, block by block.
type BlockChanges = Vec<(u64, Apply)>;

/// What replay does to a filesystem, in this order: objects' states,
/// directory entries, extended attributes (lists written to new blocks
/// first, then swapped in), blocks by (object, block number), files' sizes
/// and times, objects freed.
pub(super) struct FsChanges {
    objects: Vec<(u64, ObjectState)>,
    entries: Vec<(EntryKey, Option<EntryTarget>)>,
    xattrs: Vec<(u64, XattrsApply)>,
    pub(super) blocks: Vec<((u64, u64), Apply)>,
    attrs: Vec<(u64, FileAttr)>,
    freed: Vec<u64>,
}

/// An object's extended attributes as replay sets them: the list's bytes,
/// then (once written to new space, before the txg of the links) where.
pub(super) enum XattrsApply {
    List(Vec<u8>),
    /// The list's length and block (None: no attributes).
    Written(Option<(u64, BlockPointer)>),
    /// Its block could not be written (counted as failed).
    Failed,
}

/// What a filesystem's records leave an object as.
pub(super) enum ObjectChange {
    State(ObjectState),
    Freed,
}

/// Intent logs read and their blocks claimed, to apply once the pool runs.
pub(crate) struct PreparedReplay {
    notes: Vec<String>,
    volumes: Vec<(Rc<Volume>, BlockChanges)>,
    filesystems: Vec<(Rc<Filesystem>, FsChanges)>,
    /// Encrypted filesystems' chains claimed, their space to commit.
    claims: Vec<super::claim::Claimed>,
}

/// The records of the chain at `head` of dataset `name` that replay may
/// apply: up to the first block that does not verify, and before the first
/// record whose block does not hold its data (notes say why it ended).
async fn read_records(
    pool: &Rc<Pool>,
    name: &str,
    head: LogHead,
    durable: u64,
    whole_commits: bool,
    notes: &mut Vec<String>,
) -> ChainRead {
    let chain = read_chain(pool, &head, None).await;
    if let Some(damage) = &chain.damage {
        notes.push(format!("{name}: intent log: {damage}"));
    }
    let blocks = chain.blocks;
    let mut records = chain.records;
    if whole_commits && chain.complete < records.len() {
        notes.push(format!(
            "{name}: intent log: the last commit did not finish ({} of its records not replayed)",
            records.len() - chain.complete
        ));
        records.truncate(chain.complete);
    }
    // A commit is answered only after a device flush that covers its
    // blocks' data: a record whose data does not verify belongs to a
    // commit that never finished (its log block landed, its data did
    // not), and no later commit was started. Replay ends there (at the
    // start of that commit, with `whole_commits`).
    if let Some(mut unwritten) = first_unwritten(pool, &records, durable).await {
        if whole_commits {
            unwritten = commit_start(&records, unwritten);
        }
        notes.push(format!(
            "{name}: intent log: the last commit did not finish ({} of its records not replayed)",
            records.len() - unwritten
        ));
        records.truncate(unwritten);
    }
    ChainRead::new(records, blocks)
}

/// The index of the first record of the commit of record `index`: a
/// filesystem's commit applies whole or not at all.
pub(super) fn commit_start(records: &[(u64, LogRecord)], mut index: usize) -> usize {
    let commit = records[index].0;
    while index > 0 && records[index - 1].0 == commit {
        index -= 1;
    }
    index
}

/// The records a replay takes from a chain, and the chain's blocks that
/// hold them.
pub(super) struct ChainRead {
    pub(super) records: Vec<(u64, LogRecord)>,
    /// Each block with the count of records up to its end: the last is
    /// the first whose end reaches the last record.
    pub(super) blocks: Vec<(LogPointer, usize)>,
}

impl ChainRead {
    /// `records`, and the blocks of `blocks` that hold them.
    pub(super) fn new(
        records: Vec<(u64, LogRecord)>,
        mut blocks: Vec<(LogPointer, usize)>,
    ) -> Self {
        let needed = blocks
            .iter()
            .position(|(_, end)| *end >= records.len())
            .map_or(blocks.len(), |last| last + 1);
        blocks.truncate(if records.is_empty() { 0 } else { needed });
        ChainRead { records, blocks }
    }

    /// Where the blocks that hold the records are, in chain order.
    pub(super) fn pointers(&self) -> Vec<LogPointer> {
        self.blocks.iter().map(|(pointer, _)| *pointer).collect()
    }
}

/// What replay does for each block's deciding record (None: nothing), the
/// space of every block to link claimed before anything allocates; records
/// whose space is in use are not replayed (a note of dataset `name` says
/// how many).
fn claim_changes<K>(
    pool: &Pool,
    name: &str,
    last: impl IntoIterator<Item = (K, Option<LogRecord>)>,
    notes: &mut Vec<String>,
) -> Vec<(K, Apply)> {
    let mut apply = Vec::new();
    let mut refused = 0u64;
    for (target, record) in last {
        match record {
            Some(LogRecord::Block { pointer, .. }) => {
                if claim_block(pool, &pointer) {
                    apply.push((target, Apply::Link(pointer)));
                } else {
                    refused += 1;
                }
            }
            Some(LogRecord::Hole { .. }) => apply.push((target, Apply::Hole)),
            Some(LogRecord::Copy { data, .. } | LogRecord::Written { data, .. }) => {
                apply.push((target, Apply::Write(data)))
            }
            None
            | Some(
                LogRecord::Attr { .. }
                | LogRecord::Object { .. }
                | LogRecord::Freed { .. }
                | LogRecord::Entry { .. }
                | LogRecord::Xattrs { .. }
                | LogRecord::Sealed { .. },
            ) => {}
        }
    }
    if refused > 0 {
        notes.push(format!(
            "{name}: intent log: {refused} records point at space in use; not replayed"
        ));
    }
    apply
}

/// Claims the space of a block a record names (before anything allocates);
/// false, claiming nothing, when some of it is in use.
fn claim_block(pool: &Pool, pointer: &BlockPointer) -> bool {
    let mut claimed = Vec::new();
    for dva in pointer.copies() {
        if !pool.store.claim(*dva) {
            // Give back what was taken: the allocator's own view.
            pool.store.release(&claimed);
            return false;
        }
        claimed.push(*dva);
    }
    true
}

/// Reads every volume's intent log and claims the blocks its records name
/// (at import, before anything allocates: this is the only time their
/// space can be told from free space). [`apply_replay`] links them.
pub(crate) async fn prepare_replay(pool: &Rc<Pool>) -> PreparedReplay {
    let durable = pool.txg.durable();
    let mut notes = Vec::new();
    let heads = log_heads(&pool.datasets.directory.read().volumes, |record| {
        &record.intent_log
    });
    let mut volumes = Vec::new();
    for (name, head) in heads {
        let Some(volume) = pool.datasets.volumes.get(&name) else {
            continue;
        };
        let cancelled: rustc_hash::FxHashSet<(u64, u64)> = head.cancelled.iter().copied().collect();
        // A volume's blocks are independent: a commit cut short (never
        // answered) may apply in part.
        let records = read_records(pool, &volume.name(), head, durable, false, &mut notes)
            .await
            .records;
        // The last record of each block decides. A pointer or hole of a txg
        // that is durable means the tree holds that change or a newer one
        // (and an older copy before it must not come back). A copy applies
        // unless the head cancels it: a newer change was linked in a txg
        // that is durable (a newer change that is not durable has a record
        // after the copy if a FLUSH covered it, and may be lost if none did).
        let mut last: std::collections::BTreeMap<u64, Option<LogRecord>> = Default::default();
        let mut malformed = 0u64;
        for (commit, record) in records {
            let (object, blkid) = record.target();
            if object != volume.object.id
                || blkid.saturating_mul(volume.block_bytes) >= volume.size_bytes.get()
            {
                malformed += 1;
                continue;
            }
            let keep = match &record {
                LogRecord::Block { pointer, .. } => pointer.birth_txg <= durable,
                LogRecord::Hole { txg, .. } => *txg <= durable,
                LogRecord::Copy { data, .. } => {
                    if data.len() as u64 != volume.block_bytes {
                        malformed += 1;
                        continue;
                    }
                    cancelled.contains(&(commit, blkid))
                }
                LogRecord::Attr { .. }
                | LogRecord::Written { .. }
                | LogRecord::Object { .. }
                | LogRecord::Freed { .. }
                | LogRecord::Entry { .. }
                | LogRecord::Xattrs { .. }
                | LogRecord::Sealed { .. } => {
                    malformed += 1;
                    continue;
                }
            };
            last.insert(blkid, (!keep).then_some(record));
        }
        if malformed > 0 {
            notes.push(format!(
                "{}: intent log: {malformed} records name another object, a block past the end or a wrong size; not replayed",
                volume.name()
            ));
        }
        let apply = claim_changes(pool, &volume.name(), last, &mut notes);
        volumes.push((volume, apply));
    }
    let mut claims = Vec::new();
    let filesystems = prepare_fs_replay(pool, durable, &mut notes, &mut claims).await;
    PreparedReplay {
        notes,
        volumes,
        filesystems,
        claims,
    }
}

/// The datasets of `records` (a directory's volumes or filesystems) that
/// have an intent log, with its head.
fn log_heads<R>(
    records: &std::collections::BTreeMap<String, R>,
    head: impl Fn(&R) -> &Option<LogHead>,
) -> Vec<(String, LogHead)> {
    records
        .iter()
        .filter_map(|(name, record)| head(record).clone().map(|head| (name.clone(), head)))
        .collect()
}

/// [`prepare_replay`] for filesystems: each file's blocks and its size and
/// times, as of the last record of each (records of txgs that are durable
/// apply nothing: the tree holds that change or a newer one). An encrypted
/// filesystem's chain is claimed instead (its key is not loaded at
/// import), or left as a claim made before: its replay waits for the key.
async fn prepare_fs_replay(
    pool: &Rc<Pool>,
    durable: u64,
    notes: &mut Vec<String>,
    claims: &mut Vec<super::claim::Claimed>,
) -> Vec<(Rc<Filesystem>, FsChanges)> {
    let heads = log_heads(&pool.datasets.directory.read().filesystems, |record| {
        &record.intent_log
    });
    let mut filesystems = Vec::new();
    for (short, head) in heads {
        let Some(fs) = pool.datasets.filesystems.get(&short) else {
            continue;
        };
        if head.claimed.is_some() {
            // Claimed by an earlier import: its space is in the space maps.
            notes.push(format!(
                "{}: intent log: claimed, replayed when its key is loaded",
                fs.name()
            ));
            super::claim::keep_claim(pool, &fs, &head, notes).await;
            continue;
        }
        // A commit of a filesystem applies whole or not at all: a write's
        // blocks and the file size it set go together.
        let read = read_records(pool, &fs.name(), head.clone(), durable, true, notes).await;
        // Its key is not loaded (no key is, at import): nothing of it is
        // applied without the key.
        if fs.key_guid().is_some() && fs.data_key().is_err() && !read.records.is_empty() {
            claims.push(super::claim::claim_chain(
                pool, &fs, head, read, durable, notes,
            ));
            continue;
        }
        let decided = decide_fs(&read.records, durable, &head);
        let blocks = decided
            .blocks
            .into_iter()
            .map(|(key, record)| (key, record.map(|(_, record)| record)));
        let blocks = claim_changes(pool, &fs.name(), blocks, notes);
        let changes = fs_changes(
            decided.objects,
            decided.entries,
            decided.xattrs,
            decided.attrs,
            blocks,
        );
        filesystems.push((fs, changes));
    }
    filesystems
}

/// What a filesystem's records decide: the last record of each block,
/// object, entry and list of extended attributes (None: nothing to apply),
/// each block's with its index in the records.
pub(super) struct FsDecided {
    pub(super) blocks: BTreeMap<(u64, u64), Option<(usize, LogRecord)>>,
    pub(super) attrs: BTreeMap<u64, Option<FileAttr>>,
    pub(super) objects: BTreeMap<u64, Option<ObjectChange>>,
    pub(super) entries: BTreeMap<EntryKey, Option<Option<EntryTarget>>>,
    pub(super) xattrs: BTreeMap<u64, Option<Vec<u8>>>,
}

/// Decides what a filesystem's `records` (read from the chain at `head`)
/// apply when txg `durable` is the last the tree holds. The last record of
/// each object, entry and block decides; one of a durable txg applies
/// nothing (the tree holds it or newer). An object's state supersedes the
/// sizes and times of writes logged before it; a free, everything logged
/// of the object before it.
pub(super) fn decide_fs(records: &[(u64, LogRecord)], durable: u64, head: &LogHead) -> FsDecided {
    let cancelled: rustc_hash::FxHashSet<(u64, u64, u64)> =
        head.cancelled_blocks.iter().copied().collect();
    let mut blocks: BTreeMap<(u64, u64), Option<(usize, LogRecord)>> = Default::default();
    let mut attrs: BTreeMap<u64, Option<FileAttr>> = Default::default();
    let mut objects: BTreeMap<u64, Option<ObjectChange>> = Default::default();
    let mut entries: BTreeMap<EntryKey, Option<Option<EntryTarget>>> = Default::default();
    let mut xattrs: BTreeMap<u64, Option<Vec<u8>>> = Default::default();
    for (index, (commit, record)) in records.iter().cloned().enumerate() {
        match record {
            // A held write's bytes, copied before they were written in
            // place: they apply unless the head cancels them (a newer
            // change to the block was linked in a txg that is durable).
            LogRecord::Copy { object, blkid, .. } => {
                let apply = !cancelled.contains(&(commit, object, blkid));
                blocks.insert((object, blkid), apply.then_some((index, record)));
            }
            LogRecord::Block {
                object,
                blkid,
                pointer,
            } => {
                let apply = pointer.birth_txg > durable;
                blocks.insert((object, blkid), apply.then_some((index, record)));
            }
            LogRecord::Hole { object, blkid, txg }
            | LogRecord::Written {
                object, blkid, txg, ..
            } => {
                blocks.insert((object, blkid), (txg > durable).then_some((index, record)));
            }
            LogRecord::Attr {
                object,
                txg,
                length,
                mtime,
                ctime,
                sealed,
            } => {
                let attr = FileAttr {
                    txg,
                    length,
                    mtime,
                    ctime,
                    sealed,
                };
                attrs.insert(object, (txg > durable).then_some(attr));
            }
            LogRecord::Object { object, txg, state } => {
                attrs.remove(&object);
                objects.insert(
                    object,
                    (txg > durable).then_some(ObjectChange::State(state)),
                );
            }
            LogRecord::Freed { object, txg } => {
                attrs.remove(&object);
                xattrs.remove(&object);
                let ours: Vec<(u64, u64)> = blocks
                    .range((object, 0)..=(object, u64::MAX))
                    .map(|(key, _)| *key)
                    .collect();
                for key in ours {
                    blocks.remove(&key);
                }
                objects.insert(object, (txg > durable).then_some(ObjectChange::Freed));
            }
            LogRecord::Entry {
                dir,
                txg,
                name,
                target,
            } => {
                entries.insert((dir, name), (txg > durable).then_some(target));
            }
            LogRecord::Xattrs { object, txg, list } => {
                xattrs.insert(object, (txg > durable).then_some(list));
            }
            // Sealed: opened before a replay decides (with the key, at its
            // load). The claim decides without them: they change no block
            // (a free, which does, stays in the clear).
            LogRecord::Sealed { .. } => {}
        }
    }
    FsDecided {
        blocks,
        attrs,
        objects,
        entries,
        xattrs,
    }
}

/// The changes a filesystem's replay makes, from what its records decided
/// and what it does to each block (`blocks`).
pub(super) fn fs_changes(
    objects: BTreeMap<u64, Option<ObjectChange>>,
    entries: BTreeMap<EntryKey, Option<Option<EntryTarget>>>,
    xattrs: BTreeMap<u64, Option<Vec<u8>>>,
    attrs: BTreeMap<u64, Option<FileAttr>>,
    blocks: Vec<((u64, u64), Apply)>,
) -> FsChanges {
    let mut states = Vec::new();
    let mut freed = Vec::new();
    for (object, change) in objects {
        match change {
            Some(ObjectChange::State(state)) => states.push((object, state)),
            Some(ObjectChange::Freed) => freed.push(object),
            None => {}
        }
    }
    FsChanges {
        objects: states,
        entries: entries
            .into_iter()
            .filter_map(|(key, target)| target.map(|target| (key, target)))
            .collect(),
        xattrs: xattrs
            .into_iter()
            .filter_map(|(object, list)| list.map(|list| (object, XattrsApply::List(list))))
            .collect(),
        blocks,
        attrs: attrs
            .into_iter()
            .filter_map(|(object, attr)| attr.map(|attr| (object, attr)))
            .collect(),
        freed,
    }
}

/// Applies what [`prepare_replay`] found: links the claimed blocks, writes
/// the copies, drops each chain (a new one starts with the volume's first
/// FLUSH). The caller commits before anything is served.
pub(crate) async fn apply_replay(pool: &Rc<Pool>, prepared: PreparedReplay) -> Replayed {
    let PreparedReplay {
        mut notes,
        volumes,
        mut filesystems,
        claims,
    } = prepared;
    let mut changes = super::claim::commit_claims(pool, claims, &mut notes);
    let mut done = vec![(0usize, Vec::new()); volumes.len()];
    // A filesystem's copied writes are written to new blocks first, outside
    // the txg of the links (writing may wait for space), and linked in it.
    let mut fs_done = Vec::with_capacity(filesystems.len());
    for (fs, changes) in filesystems.iter_mut() {
        fs_done.push(write_fs_copies(pool, fs, changes).await);
    }
    // Pointers and holes are skipped by a later replay once their txg is
    // durable: all of them go into one txg (no build meanwhile), so a crash
    // never leaves some applied and the rest skipped. Copies are applied
    // again by a later replay whatever the txgs, so they may span txgs (and
    // may wait for one when the pool is full).
    {
        let _no_builds = pool.txg.hold_builds();
        for ((volume, apply), (count, failed)) in volumes.iter().zip(done.iter_mut()) {
            for (blkid, change) in apply {
                let result = match change {
                    // A failed link releases the block it was given.
                    Apply::Link(pointer) => pool.link_block(volume, *blkid, *pointer, false).await,
                    Apply::Hole => {
                        let hole = BlockPointer::hole(0, ObjectType::VolumeData, 0);
                        pool.link_block(volume, *blkid, hole, false).await
                    }
                    // Volumes are never claimed.
                    Apply::Write(_) | Apply::Claimed(_) => continue,
                };
                *count += 1;
                if let Err(error) = result {
                    failed.push(format!("block {blkid}: {error}"));
                }
            }
        }
        for ((fs, changes), done) in filesystems.iter().zip(fs_done.iter_mut()) {
            apply_fs_changes(pool, fs, changes, done).await;
        }
    }
    for ((volume, apply), (count, failed)) in volumes.iter().zip(done.iter_mut()) {
        for (blkid, change) in apply {
            let Apply::Write(data) = change else {
                continue;
            };
            let data = (!crate::pool::data::is_zero(data)).then(|| {
                let mut buffer = AlignedBuf::zeroed(data.len());
                buffer.copy_from_slice(data);
                BufSlice::whole(buffer.into_shared())
            });
            *count += 1;
            let result = pool
                .store_block(volume, *blkid, data, Default::default(), IoClass::SyncWrite)
                .await;
            if let Err(error) = result {
                failed.push(format!("block {blkid}: {error}"));
            }
        }
    }
    for ((volume, _), (count, failed)) in volumes.iter().zip(done) {
        changes += count - failed.len();
        if count > failed.len() {
            notes.push(format!(
                "{}: intent log: replayed {} block changes",
                volume.name(),
                count - failed.len()
            ));
        }
        if !failed.is_empty() {
            notes.push(format!(
                "{}: intent log: {} records could not be replayed: {}",
                volume.name(),
                failed.len(),
                failed.join("; ")
            ));
        }
        pool.set_log_head(Owner::Volume(volume), None);
    }
    for ((fs, _), done) in filesystems.iter().zip(fs_done) {
        changes += done.applied;
        notes.extend(done.notes(&fs.name()));
        pool.set_log_head(Owner::Filesystem(fs), None);
    }
    Replayed { notes, changes }
}

/// Failures of one filesystem's replay named in its note (the rest are
/// counted): the note goes into `status`, which must stay readable.
const REPLAY_FAILURES_SHOWN: usize = 8;

/// What replay did to one filesystem.
#[derive(Default)]
pub(super) struct FsReplayed {
    pub(super) applied: usize,
    /// Records of files that no longer exist (freed at import: unlinked
    /// while open).
    pub(super) gone: usize,
    pub(super) failed: Vec<String>,
}

/// Links a filesystem's replayed blocks and sets its files' sizes and
/// times (the caller holds txg builds off).
pub(super) async fn apply_fs_changes(
    pool: &Rc<Pool>,
    fs: &Filesystem,
    changes: &FsChanges,
    done: &mut FsReplayed,
) {
    // Numbers the records name are not handed out again, before replay
    // makes xattr objects: one freed by a record applied last must not be
    // a number given to a list swapped in before it.
    let named = changes.objects.iter().map(|(object, _)| *object);
    let targets = changes
        .entries
        .iter()
        .filter_map(|(_, target)| target.map(|target| target.object));
    fs.replay_keep_numbers(named.chain(targets).chain(changes.freed.iter().copied()));
    let mut count = |result, what: String| done.count(result, what);
    for (object, state) in &changes.objects {
        let result = fs.replay_object(pool, *object, state).await;
        count(result, format!("object {object}"));
    }
    for ((dir, name), target) in &changes.entries {
        let result = fs.replay_entry(*dir, name, *target).await;
        count(
            result,
            format!("directory {dir} entry {:?}", String::from_utf8_lossy(name)),
        );
    }
    for (object, apply) in &changes.xattrs {
        let XattrsApply::Written(written) = apply else {
            continue;
        };
        let result = fs.replay_xattrs(pool, *object, *written).await;
        count(result, format!("object {object} extended attributes"));
    }
    for ((object, blkid), change) in &changes.blocks {
        let (pointer, claimed) = match change {
            Apply::Link(pointer) => (*pointer, false),
            Apply::Claimed(pointer) => (*pointer, true),
            Apply::Hole => (BlockPointer::hole(0, ObjectType::FsFile, 0), false),
            Apply::Write(_) => continue,
        };
        // A failed link lets go of the block it was given (frees it, when
        // claimed).
        let result = fs
            .replay_block(pool, *object, *blkid, pointer, claimed)
            .await;
        count(result, format!("file {object} block {blkid}"));
    }
    let mut deferred = Vec::new();
    for (object, attr) in &changes.attrs {
        let result = fs.replay_attr(*object, attr).await;
        if let Ok(Some(attr)) = &result {
            let clear = attr.sealed.is_none();
            let at = |time: crate::format::znode::Timestamp| (time.seconds, time.nanos);
            deferred.push(ReplayedTimes {
                object: *object,
                txg: pool.txg.open(),
                log_txg: attr.txg,
                length: attr.length,
                mtime: clear.then(|| at(attr.mtime)),
                ctime: clear.then(|| at(attr.ctime)),
                sealed: attr
                    .sealed
                    .map(|sealed| crate::pool::dataset::keys::hex(&sealed.body(attr.length)[8..])),
            });
        }
        count(result.map(|_| ()), format!("file {object} size"));
    }
    keep_replayed_times(pool, fs, deferred);
    for object in &changes.freed {
        let result = fs.replay_free(pool, *object).await;
        count(result, format!("object {object} freed"));
    }
}

/// Keeps in filesystem `fs`'s record the times its replay could not set
/// (its attributes or its times sealed, its key not loaded), with those
/// kept by an earlier replay (a later replay's replace them). They go in the replay's
/// txg, with the sizes.
fn keep_replayed_times(pool: &Pool, fs: &Filesystem, times: Vec<ReplayedTimes>) {
    if times.is_empty() {
        return;
    }
    let mut directory = pool.datasets.directory.edit();
    let Some(record) = directory.filesystems.get_mut(fs.short_name().as_str()) else {
        return;
    };
    // A later replay's record of a file is newer than an earlier one's.
    for new in times {
        match record
            .replayed_times
            .iter_mut()
            .find(|kept| kept.object == new.object)
        {
            Some(kept) => *kept = new,
            None => record.replayed_times.push(new),
        }
    }
}

impl FsReplayed {
    /// What `status` says of the replay of filesystem `name`.
    pub(super) fn notes(&self, name: &str) -> Vec<String> {
        let mut notes = Vec::new();
        if self.applied > 0 {
            notes.push(format!(
                "{name}: intent log: replayed {} changes of files",
                self.applied
            ));
        }
        if self.gone > 0 {
            notes.push(format!(
                "{name}: intent log: {} records of files freed since (unlinked while open) not replayed",
                self.gone
            ));
        }
        if !self.failed.is_empty() {
            let shown = self.failed.len().min(REPLAY_FAILURES_SHOWN);
            notes.push(format!(
                "{name}: intent log: {} records could not be replayed: {}{}",
                self.failed.len(),
                self.failed[..shown].join("; "),
                if shown < self.failed.len() {
                    "; ..."
                } else {
                    ""
                }
            ));
        }
        notes
    }

    fn count(&mut self, result: Result<(), crate::pool::filesystem::FsError>, what: String) {
        match result {
            Ok(()) => self.applied += 1,
            Err(crate::pool::filesystem::FsError::NotFound) => self.gone += 1,
            Err(error) => self.failed.push(format!("{what}: {error}")),
        }
    }
}

/// Writes the bytes of a filesystem's copied writes to new blocks, each
/// change becoming a link of its block (linked by [`apply_fs_changes`]);
/// one that cannot be written is counted as failed and dropped.
pub(super) async fn write_fs_copies(
    pool: &Rc<Pool>,
    fs: &Filesystem,
    changes: &mut FsChanges,
) -> FsReplayed {
    let mut done = FsReplayed::default();
    let mut kept = Vec::with_capacity(changes.blocks.len());
    for ((object, blkid), change) in std::mem::take(&mut changes.blocks) {
        let Apply::Write(data) = change else {
            kept.push(((object, blkid), change));
            continue;
        };
        match fs.replay_store(pool, &data).await {
            Ok(pointer) => kept.push(((object, blkid), Apply::Link(pointer))),
            Err(error) => done
                .failed
                .push(format!("file {object} block {blkid}: {error}")),
        }
    }
    changes.blocks = kept;
    for (object, apply) in changes.xattrs.iter_mut() {
        let XattrsApply::List(list) = apply else {
            continue;
        };
        *apply = match fs.write_xattr_block(pool, list).await {
            Ok(pointer) => {
                XattrsApply::Written(pointer.map(|pointer| (list.len() as u64, pointer)))
            }
            Err(error) => {
                done.failed
                    .push(format!("object {object} extended attributes: {error}"));
                XattrsApply::Failed
            }
        };
    }
    done
}

/// Records read at once while checking that the blocks of a chain's records
/// hold their data (a bound on replay's reads in flight).
const REPLAY_READS_IN_FLIGHT: usize = 64;

/// The index of the first record of a txg after `durable` whose block does
/// not hold the data its pointer names, if any. Every side and column is
/// read and the bad ones are rewritten (as a scrub does): a block whose
/// write a crash cut short may verify through parity or one mirror side
/// while the rest is stale, and the pool adopts it.
async fn first_unwritten(
    pool: &Rc<Pool>,
    records: &[(u64, LogRecord)],
    durable: u64,
) -> Option<usize> {
    let to_check: Vec<(usize, BlockPointer)> = records
        .iter()
        .enumerate()
        .filter_map(|(index, (_, record))| match record {
            LogRecord::Block { pointer, .. } if pointer.birth_txg > durable => {
                Some((index, *pointer))
            }
            _ => None,
        })
        .collect();
    for batch in to_check.chunks(REPLAY_READS_IN_FLIGHT) {
        let reads = batch.iter().map(|(index, pointer)| async move {
            (*index, pool.store.scrub(pointer).await.is_ok())
        });
        let results = futures_util::future::join_all(reads).await;
        if let Some((index, _)) = results.into_iter().find(|(_, ok)| !ok) {
            return Some(index);
        }
    }
    None
}

/// What [`replay`] did.
pub(crate) struct Replayed {
    /// For `status`: what was replayed, and what ended a chain early.
    pub notes: Vec<String>,
    /// Block changes linked.
    pub changes: usize,
}
