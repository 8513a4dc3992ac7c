//! Send and receive of filesystems: a snapshot's objects as a stream
//! ([`crate::format::stream`]), full or incremental, and their application
//! on the receiving side.
//!
//! The sender walks the snapshot's dnode table: a full stream visits every
//! table block, an incremental one only the blocks born after the earlier
//! snapshot (a dnode that changed rewrote its block), so the cost follows
//! the change. Each object found there goes out as an OBJECT record (its
//! type, block size, length and attributes) followed by its blocks born
//! after the earlier snapshot (OBJECT_WRITE) and the ranges that may have
//! become holes since (OBJECT_FREE); a slot that is free, or a file removed
//! while open (no names: the receiver would only free it), goes out as
//! FREEOBJECTS. Object numbers are the same on both sides: they are never
//! reused, so a number names one object for the filesystem's whole life.
//!
//! The receiver applies the records to the hidden filesystem of the receive
//! (`pool::datasets::receive`): objects are created, updated or freed by
//! number, file blocks are written as new blocks (compressed and
//! checksummed as the receiving filesystem says), directory leaves as
//! metadata. A changed block size (a one-block file that grew) replaces the
//! object's blocks: the sender carries all of them in that case, since the
//! block was rewritten at its new size.
//!
//! A raw stream (`send -w`) of an encrypted filesystem carries each block
//! as stored, sealed (OBJECT_WRITE_RAW, one per block): neither side needs
//! the key. The receiver stores and links those blocks as they came, files'
//! as data and directories' leaves as metadata, and opens nothing.

use std::collections::VecDeque;
use std::rc::Rc;

use crate::format::dnode::{Bonus, BONUS_BYTES, DNODE_BYTES};
use crate::format::sealed_bonus::{is_sealed, SealedBonus};
use crate::format::stream::{
    self, FsStreamInfo, RecordKind, StreamBegin, StreamObject, STREAM_VERSION, WRITE_DATA_BYTES_MAX,
};
use crate::format::znode::{FsHeader, Znode};
use crate::format::ObjectType;
use crate::object::{new_dnode, BlockChange, Object, ObjectError};
use crate::pool::dataset::send::{
    raw_key, SendRequest, SendSummary, Sent, StreamOut, CHANGES_PER_WALK, SEND_READS_IN_FLIGHT,
};
use crate::pool::dataset::stream_io::Failure;
use crate::pool::dataset::stream_io::StreamSink;
use crate::pool::filesystem::{Filesystem, FsError, TABLE_BLOCK_SHIFT};
use crate::pool::{Pool, PoolError, INDIRECT_BLOCK_SHIFT};
use crate::queue::IoClass;
use crate::rt::buf::BufSlice;
use crate::rt::executor::JoinHandle;

/// A filesystem's error in a receive is this pool's, never the stream's.
impl From<crate::pool::filesystem::FsError> for Failure {
    fn from(error: crate::pool::filesystem::FsError) -> Failure {
        Failure::Pool(PoolError::Io(error.to_string()))
    }
}

/// Dnodes in one block of a filesystem's dnode table.
const DNODES_PER_TABLE_BLOCK: u64 = (1 << TABLE_BLOCK_SHIFT) / DNODE_BYTES as u64;
/// Records a send holds before writing them out: OBJECT records of objects
/// without changed blocks (empty files, attribute changes) start no read,
/// so the bound on reads in flight does not bound them (each holds a
/// 304-byte bonus: 4096 of them are about 1.5 MiB).
const SEND_ENTRIES_PENDING_MAX: usize = 4096;

/// One entry of the in-order pipeline between the walk and the output.
enum Entry {
    Object(StreamObject),
    FreeObjects {
        first: u64,
        count: u64,
    },
    Free {
        object: u64,
        first: u64,
        count: u64,
    },
    Read {
        object: u64,
        blkid: u64,
        block_bytes: u64,
        /// The block's logical bytes, or (a raw stream's) as stored.
        read: JoinHandle<Result<Sent, PoolError>>,
    },
}

/// The records of a filesystem's stream, in order, with block reads
/// running ahead of the output.
struct FsStreamOut<'a> {
    output: StreamOut<'a>,
    pending: VecDeque<Entry>,
    reads: usize,
    incremental: bool,
    /// A raw stream (BEGIN's `raw`): blocks are read and sent as stored.
    raw: bool,
    /// Free object slots waiting to become one FREEOBJECTS record.
    free_objects: Option<(u64, u64)>,
    /// Blocks waiting to become one OBJECT_WRITE: object, first block, data.
    run: Option<(u64, u64, Vec<BufSlice>)>,
}

impl FsStreamOut<'_> {
    fn push(&mut self, entry: Entry) {
        if let Some((first, count)) = self.free_objects.take() {
            self.pending.push_back(Entry::FreeObjects { first, count });
        }
        if matches!(entry, Entry::Read { .. }) {
            self.reads += 1;
        }
        self.pending.push_back(entry);
    }

    /// Writes out the front of the queue once it holds enough reads in
    /// flight or enough records (see [`SEND_ENTRIES_PENDING_MAX`]).
    async fn bound(&mut self) -> Result<(), PoolError> {
        if self.reads >= SEND_READS_IN_FLIGHT || self.pending.len() >= SEND_ENTRIES_PENDING_MAX {
            self.drain((self.reads / 2).max(1)).await?;
        }
        Ok(())
    }

    /// Object `id` does not exist in the snapshot (incremental streams
    /// say so; a full one starts from nothing).
    fn free_object(&mut self, id: u64, count: u64) {
        if !self.incremental || count == 0 {
            return;
        }
        match &mut self.free_objects {
            Some((first, length)) if *first + *length == id => *length += count,
            _ => {
                if let Some((first, count)) = self.free_objects.take() {
                    self.pending.push_back(Entry::FreeObjects { first, count });
                }
                self.free_objects = Some((id, count));
            }
        }
    }

    async fn flush_run(&mut self) -> Result<(), PoolError> {
        if let Some((object, first, blocks)) = self.run.take() {
            let count = blocks.len() as u32;
            self.output
                .record(
                    RecordKind::ObjectWrite,
                    &stream::object_write_header(object, first, count),
                    blocks,
                )
                .await?;
            self.output.end.written_blocks += count as u64;
        }
        Ok(())
    }

    /// Writes out entries from the front until `reads` reads are done
    /// (all of them with `usize::MAX`).
    async fn drain(&mut self, reads: usize) -> Result<(), PoolError> {
        if reads == usize::MAX {
            if let Some((first, count)) = self.free_objects.take() {
                self.pending.push_back(Entry::FreeObjects { first, count });
            }
        }
        let mut drained = 0;
        while let Some(entry) = self.pending.pop_front() {
            match entry {
                Entry::Read {
                    object,
                    blkid,
                    block_bytes,
                    read,
                } => {
                    self.reads -= 1;
                    let data = match read.await? {
                        Sent::Logical(data) => data,
                        Sent::Raw(raw, data) => {
                            if raw.logical as u64 != block_bytes {
                                return Err(PoolError::Corrupt(format!(
                                    "object {object} block {blkid}: a block of {} bytes where its blocks have {block_bytes}",
                                    raw.logical
                                )));
                            }
                            self.flush_run().await?;
                            self.output
                                .record(
                                    RecordKind::ObjectWriteRaw,
                                    &stream::object_write_raw_header(object, &raw),
                                    vec![data],
                                )
                                .await?;
                            self.output.end.written_blocks += 1;
                            drained += 1;
                            if drained >= reads {
                                break;
                            }
                            continue;
                        }
                    };
                    if data.len() as u64 != block_bytes {
                        return Err(PoolError::Corrupt(format!(
                            "object {object} block {blkid}: {} bytes where its blocks have {block_bytes}",
                            data.len()
                        )));
                    }
                    let blocks_max = (WRITE_DATA_BYTES_MAX / block_bytes) as usize;
                    let continues = matches!(&self.run, Some((run_object, first, blocks))
                        if *run_object == object
                            && first + blocks.len() as u64 == blkid
                            && blocks.len() < blocks_max);
                    if !continues {
                        self.flush_run().await?;
                        self.run = Some((object, blkid, Vec::new()));
                    }
                    self.run.as_mut().expect("a run").2.push(data);
                    drained += 1;
                    if drained >= reads {
                        break;
                    }
                }
                Entry::Object(object) => {
                    self.flush_run().await?;
                    self.output
                        .record(
                            RecordKind::Object,
                            &stream::object_payload(&object),
                            Vec::new(),
                        )
                        .await?;
                }
                Entry::FreeObjects { first, count } => {
                    self.flush_run().await?;
                    self.output
                        .record(
                            RecordKind::FreeObjects,
                            &stream::free_payload(first, count),
                            Vec::new(),
                        )
                        .await?;
                }
                Entry::Free {
                    object,
                    first,
                    count,
                } => {
                    self.flush_run().await?;
                    self.output
                        .record(
                            RecordKind::ObjectFree,
                            &stream::object_free_payload(object, first, count),
                            Vec::new(),
                        )
                        .await?;
                    self.output.end.freed_blocks += count;
                }
            }
        }
        if reads == usize::MAX {
            self.flush_run().await?;
        }
        Ok(())
    }
}

/// Whether `object` is a file or directory removed while in use (no names
/// left) or the extended attributes of one: the receiver must not get it.
async fn unlinked(fs: &Filesystem, object: &Object) -> Result<bool, PoolError> {
    let corrupt = |id: u64, error: crate::format::FormatError| {
        PoolError::Corrupt(format!("{} object {id}: {error}", fs.name()))
    };
    let dnode = object.dnode();
    let (no_names, owner) = names_and_owner(&dnode).map_err(|error| corrupt(object.id, error))?;
    match dnode.object_type {
        ObjectType::FsFile | ObjectType::FsDirectory => Ok(no_names),
        ObjectType::FsXattr => {
            let owner = match fs.objects.open(owner).await {
                Ok(owner) => owner,
                Err(ObjectError::NoSuchObject(_)) => return Ok(true),
                Err(error) => return Err(error.into()),
            };
            let owner_dnode = owner.dnode();
            let (owner_gone, _) =
                names_and_owner(&owner_dnode).map_err(|error| corrupt(owner.id, error))?;
            Ok(matches!(
                owner_dnode.object_type,
                ObjectType::FsFile | ObjectType::FsDirectory
            ) && owner_gone)
        }
        _ => Ok(false),
    }
}

/// Whether an object has no names left, and the object it belongs to (an
/// extended attribute object's owner; a file's parent): from its
/// attributes, or, sealed (a raw send without the key), from their part in
/// the clear.
fn names_and_owner(
    dnode: &crate::format::Dnode,
) -> Result<(bool, u64), crate::format::FormatError> {
    if let Some(sealed) = SealedBonus::decode(&dnode.bonus)? {
        return Ok((sealed.no_names, sealed.owner));
    }
    let znode = Znode::decode(&dnode.bonus)?;
    Ok((znode.nlink == 0, znode.parent))
}

impl Pool {
    /// Writes the stream of filesystem snapshot `request.snapshot` to `out`
    /// (see the module documentation).
    pub(in crate::pool) async fn send_filesystem(
        self: &Rc<Self>,
        short: &str,
        snapshot: &str,
        request: SendRequest,
        out: &dyn StreamSink,
    ) -> Result<SendSummary, PoolError> {
        let record = self
            .filesystem_record(short)
            .ok_or_else(|| PoolError::NoSuchSnapshot(request.snapshot.clone()))?;
        let to = record
            .lineage
            .snapshot(snapshot)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchSnapshot(request.snapshot.clone()))?;
        let to_name = format!("{}/{short}@{snapshot}", self.name);
        if request.resume_block.is_some() && request.resume_object.is_none() {
            return Err(PoolError::InvalidArgument(format!(
                "the resume token is a volume's, but {to_name} is a filesystem's snapshot"
            )));
        }
        let (since_txg, from_name, from_guid) =
            self.send_source(short, &record.lineage, &to, &to_name, &request.from)?;
        let _hold = self.hold_snapshot(&to_name);
        let _from_hold = from_name.as_ref().map(|name| self.hold_snapshot(name));
        let fs = self.snapshot_filesystem(&to_name).await?;
        // A raw stream: the blocks as stored (files' and directories'),
        // the attributes as the dnodes hold them, and the master key as
        // wrapped, so that neither side needs the key. Else an encrypted
        // filesystem is sent as plaintext: its key opens its blocks.
        let raw = raw_key(&record.crypt, &request);
        if raw.is_none() {
            fs.data_key().map_err(|_| {
                PoolError::KeyUnavailable(format!(
                    "{to_name} is encrypted: load its key to send it, or send it raw (send -w)"
                ))
            })?;
        }
        let header = fs.header.get();
        let begin = StreamBegin {
            version: if raw.is_some() {
                stream::STREAM_VERSION_RAW_SEALED_ATTRIBUTES
            } else {
                STREAM_VERSION
            },
            snapshot: to_name.clone(),
            to_guid: to.guid,
            from: from_name.clone(),
            from_guid,
            size_bytes: 0,
            block_bytes: fs.record_bytes(),
            resume_block: request.resume_block,
            properties: record.own_properties(),
            filesystem: Some(FsStreamInfo {
                root: header.root,
                next_object: header.next_object,
            }),
            raw,
            resume_object: request.resume_object,
        };
        let mut output = FsStreamOut {
            output: StreamOut::new(out, 0, from_name.is_some()),
            pending: VecDeque::new(),
            reads: 0,
            incremental: from_name.is_some(),
            raw: begin.raw.is_some(),
            free_objects: None,
            run: None,
        };
        let json = serde_json::to_vec(&begin).expect("BEGIN serialises");
        output
            .output
            .record(RecordKind::Begin, &json, Vec::new())
            .await?;
        let first_object = request.resume_object.unwrap_or(1).max(1);
        let end_object = header.next_object;
        // The table's holes carry no txg: report them all (conservative).
        let mut walk = self.objects.walk_changed_blocks(
            &fs.table,
            since_txg,
            first_object / DNODES_PER_TABLE_BLOCK,
            CHANGES_PER_WALK,
            false,
        );
        while let Some(changes) = walk.next_batch().await? {
            for change in changes {
                let (first, count) = match change {
                    BlockChange::Data { blkid, .. } => (blkid, 1),
                    BlockChange::Holes { first, count } => (first, count),
                };
                let ids_start = first
                    .saturating_mul(DNODES_PER_TABLE_BLOCK)
                    .max(first_object);
                let ids_end = first
                    .saturating_add(count)
                    .saturating_mul(DNODES_PER_TABLE_BLOCK)
                    .min(end_object);
                if ids_start >= ids_end {
                    continue;
                }
                match change {
                    BlockChange::Holes { .. } => {
                        output.free_object(ids_start, ids_end - ids_start);
                    }
                    BlockChange::Data { .. } => {
                        for id in ids_start..ids_end {
                            self.send_object(&fs, id, since_txg, &request, &mut output)
                                .await?;
                        }
                    }
                }
            }
        }
        output.drain(usize::MAX).await?;
        let end = output.output.end;
        output
            .output
            .record(RecordKind::End, &stream::end_payload(&end), Vec::new())
            .await?;
        Ok(SendSummary {
            snapshot: to_name,
            from: from_name,
            records: output.output.end.records,
            written_blocks: end.written_blocks,
            freed_blocks: end.freed_blocks,
            stream_bytes: output.output.bytes,
        })
    }

    /// Puts object `id` of snapshot `fs` in the stream: its OBJECT record,
    /// the reads of its changed blocks and its new holes; or, when it does
    /// not exist (or has no names), a free slot.
    async fn send_object(
        self: &Rc<Self>,
        fs: &Rc<Filesystem>,
        id: u64,
        since_txg: u64,
        request: &SendRequest,
        output: &mut FsStreamOut<'_>,
    ) -> Result<(), PoolError> {
        let object = match fs.objects.open(id).await {
            Ok(object) => object,
            Err(ObjectError::NoSuchObject(_)) => {
                output.free_object(id, 1);
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        };
        let dnode = object.dnode();
        if !matches!(
            dnode.object_type,
            ObjectType::FsFile | ObjectType::FsDirectory | ObjectType::FsXattr
        ) {
            return Err(PoolError::Corrupt(format!(
                "{} object {id}: type {:?} in a filesystem",
                fs.name(),
                dnode.object_type
            )));
        }
        if unlinked(fs, &object).await? {
            output.free_object(id, 1);
            return Ok(());
        }
        output.push(Entry::Object(StreamObject {
            object: id,
            object_type: dnode.object_type,
            block_shift: dnode.data_block_shift,
            length: dnode.length_bytes,
            // A raw stream's attributes sealed, as the table stores them.
            bonus: if output.raw {
                fs.objects.stored_bonus(id, &dnode)?.0.to_vec()
            } else {
                dnode.bonus.0.to_vec()
            },
        }));
        output.bound().await?;
        // An object made since the earlier snapshot is new to the receiver:
        // its holes need no records.
        let new = dnode.creation_txg > since_txg;
        let block_bytes = dnode.data_block_bytes();
        let usage = crate::cache::CacheUse::data(fs.settings().data_cache_use().lookup, false);
        // A raw stream's blocks are read as stored: no key.
        let raw = output.raw;
        let key = if raw { None } else { fs.data_key()? };
        let start = match request.resume_object {
            Some(first) if first == id => request.resume_block.unwrap_or(0),
            _ => 0,
        };
        let mut walk =
            fs.objects
                .walk_changed_blocks(&object, since_txg, start, CHANGES_PER_WALK, false);
        while let Some(changes) = walk.next_batch().await? {
            for change in changes {
                match change {
                    BlockChange::Data { blkid, pointer } => {
                        let pool = self.clone();
                        let key = key.clone();
                        output.push(Entry::Read {
                            object: id,
                            blkid,
                            block_bytes,
                            read: crate::rt::spawn(async move {
                                if raw {
                                    return pool.read_stored(&pointer, blkid).await;
                                }
                                pool.read_logical(&pointer, blkid, usage, key.as_deref())
                                    .await
                                    .map(Sent::Logical)
                            }),
                        });
                    }
                    BlockChange::Holes { first, count } => {
                        if output.incremental && !new {
                            output.push(Entry::Free {
                                object: id,
                                first,
                                count,
                            });
                        }
                    }
                }
                output.bound().await?;
            }
        }
        Ok(())
    }
}

impl Filesystem {
    /// The receive of a full stream starts from an empty filesystem: a
    /// header and no objects (the stream brings the root).
    pub(in crate::pool) fn receive_header(info: &FsStreamInfo) -> FsHeader {
        FsHeader {
            root: info.root,
            next_object: info.root + 1,
            unlinked_object: 0,
            objects: 0,
            space: Some(Default::default()),
            sealed_bonuses: false,
        }
    }

    /// Applies an OBJECT record: creates object `record.object`, or updates
    /// the one there (cut to the new length; replaced, blocks and all, when
    /// its type or block size changed). Returns it for the records that
    /// follow. A `raw` stream's file is cut by whole blocks: its last block,
    /// if cut, changed and comes in the stream, and is not opened here.
    pub(in crate::pool) async fn receive_object(
        &self,
        pool: &Rc<Pool>,
        info: &FsStreamInfo,
        record: &StreamObject,
        raw: bool,
    ) -> Result<Rc<Object>, Failure> {
        let id = record.object;
        if id >= info.next_object {
            return Err(Failure::Stream(format!(
                "object {id} is past the stream's next object {}",
                info.next_object
            )));
        }
        let mut bonus = Bonus::default();
        bonus.0.copy_from_slice(&record.bonus[..BONUS_BYTES]);
        let is_dir = record.object_type == ObjectType::FsDirectory;
        let bonus = if is_sealed(&bonus) {
            // A raw stream's attributes, sealed by the sender: opened now
            // when the key is loaded (their MAC checked), else kept so.
            if !raw || !self.objects.has_key() {
                return Err(Failure::Stream(format!(
                    "object {id}: sealed attributes in a stream that is not raw"
                )));
            }
            self.objects
                .accepted_bonus(id, record.object_type, bonus)
                .map_err(|error| Failure::Stream(format!("object {id}: {error}")))?
        } else if raw && self.objects.seals_every_bonus() {
            return Err(Failure::Stream(format!(
                "object {id}: attributes in the clear in a raw stream (of an older build) into {}, which seals them",
                self.name()
            )));
        } else {
            bonus
        };
        if !is_sealed(&bonus) {
            let znode = Znode::decode(&bonus)
                .map_err(|error| Failure::Stream(format!("object {id}: {error}")))?;
            if is_dir != znode.is_dir() {
                return Err(Failure::Stream(format!(
                    "object {id}: its type and its attributes disagree"
                )));
            }
        }
        if id == info.root && !is_dir {
            return Err(Failure::Stream(format!(
                "object {id}: the root is not a directory"
            )));
        }
        // Freeing and replacing collect pointers across awaits: no txg build
        // may sync the object meanwhile.
        let _hold = pool.txg.hold_builds();
        let object = match self.objects.open(id).await {
            Ok(object) => object,
            Err(ObjectError::NoSuchObject(_)) => {
                let mut dnode = new_dnode(
                    record.object_type,
                    record.block_shift,
                    INDIRECT_BLOCK_SHIFT,
                    record.length,
                    pool.txg.open(),
                );
                dnode.checksum_algo = self.settings.get().checksum;
                dnode.bonus = bonus;
                let object = self.objects.create(id, dnode);
                let mut header = self.header.get();
                header.objects += 1;
                header.next_object = header.next_object.max(id + 1);
                self.set_header(header);
                return Ok(object);
            }
            Err(error) => return Err(error.into()),
        };
        let dnode = object.dnode();
        if dnode.object_type != record.object_type || dnode.data_block_shift != record.block_shift {
            let mut pointers = Vec::new();
            self.objects
                .visit_pointers(&object, &mut |_, _, pointer| pointers.push(*pointer))
                .await?;
            for pointer in &pointers {
                self.objects.kill(&object, pointer);
            }
            let mut fresh = new_dnode(
                record.object_type,
                record.block_shift,
                INDIRECT_BLOCK_SHIFT,
                record.length,
                pool.txg.open(),
            );
            fresh.checksum_algo = dnode.checksum_algo;
            fresh.bonus = bonus;
            self.objects.reset_tree(&object, fresh);
            return Ok(object);
        }
        if record.length < dnode.length_bytes {
            if is_dir {
                self.objects.truncate(&object, record.length).await?;
            } else if raw {
                let block = dnode.data_block_bytes();
                self.punch_range(
                    pool,
                    &object,
                    record.length.div_ceil(block),
                    dnode.length_bytes.div_ceil(block),
                )
                .await?;
            } else {
                self.truncate(pool, &object, record.length).await?;
            }
        }
        {
            let mut dnode = object.dnode.borrow_mut();
            dnode.length_bytes = record.length;
            dnode.bonus = bonus;
        }
        object.dirty.set(true);
        Ok(object)
    }

    /// Applies a FREEOBJECTS record: the objects of the range that exist
    /// here are freed (with their extended attributes).
    pub(in crate::pool) async fn receive_free_objects(
        &self,
        pool: &Rc<Pool>,
        first: u64,
        count: u64,
    ) -> Result<(), Failure> {
        let end = first
            .saturating_add(count)
            .min(self.header.get().next_object);
        let _hold = pool.txg.hold_builds();
        for id in first..end {
            match self.objects.open(id).await {
                Ok(object) => self.free_object(pool, &object).await?,
                Err(ObjectError::NoSuchObject(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Applies an OBJECT_FREE record: blocks `first..first+count` of
    /// `object` become holes.
    pub(in crate::pool) async fn receive_free_blocks(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        count: u64,
    ) -> Result<(), Failure> {
        let end = first
            .saturating_add(count)
            .min(object.dnode().capacity_blocks());
        // A stream's free record may span a whole file.
        self.punch_range(pool, object, first, end).await?;
        Ok(())
    }

    /// Applies an OBJECT_WRITE record's blocks (`data`, `count` blocks from
    /// `first`) to `object`: file and attribute blocks as new data blocks,
    /// directory leaves as metadata.
    pub(in crate::pool) async fn receive_blocks(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        data: &[u8],
    ) -> Result<(), Failure> {
        let dnode = object.dnode();
        let block_bytes = dnode.data_block_bytes() as usize;
        let blocks: Vec<(u64, &[u8])> = data
            .chunks(block_bytes)
            .enumerate()
            .map(|(index, bytes)| (first + index as u64, bytes))
            .collect();
        if dnode.object_type != ObjectType::FsDirectory {
            return Ok(self
                .store_blocks(
                    pool,
                    object,
                    &blocks,
                    dnode.object_type,
                    None,
                    IoClass::AsyncWrite,
                )
                .await?);
        }
        for (blkid, bytes) in blocks {
            self.objects
                .write_bytes(object, blkid * block_bytes as u64, bytes)
                .await?;
        }
        Ok(())
    }

    /// Applies an OBJECT_WRITE_RAW record: `data`, block `raw.block` of
    /// `object` as the sender stored it (sealed, maybe compressed), is
    /// stored as it came, with its salt, IV and MAC and a checksum over it,
    /// and linked there: a file's block as a data block, a directory's leaf
    /// with the copies the txg build gives metadata (its cached copy, if
    /// any, dropped). Nothing is opened: the sender's user key opens it
    /// once loaded (the receive gave this filesystem the sender's key, or
    /// checked that it has it).
    pub(in crate::pool) async fn receive_stored_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        raw: &stream::RawBlock,
        data: &[u8],
    ) -> Result<(), Failure> {
        let object_type = object.object_type();
        if self.key_guid().is_none() {
            return Err(Failure::Stream(format!(
                "{}: a block as stored (a raw stream's) goes into an encrypted filesystem only",
                self.name()
            )));
        }
        if raw.logical as u64 != object.data_block_bytes() {
            return Err(Failure::Stream(format!(
                "object {}: a block of {} bytes where its blocks have {}",
                object.id,
                raw.logical,
                object.data_block_bytes()
            )));
        }
        let formed = crate::pool::data::Formed::stored_as_sent(
            pool,
            object_type,
            raw.logical,
            raw.compression,
            raw.crypt,
            data,
        );
        if object_type != ObjectType::FsDirectory {
            let pointer =
                crate::pool::data::write_formed(pool, vec![Ok(formed)], IoClass::AsyncWrite)
                    .await
                    .pop()
                    .expect("a result for the one block")?;
            self.link_block(pool, object, raw.block, pointer).await?;
            return Ok(());
        }
        // A leaf is sealed as the txg build seals it: whole, uncompressed.
        if raw.compression != crate::format::bp::Compression::Off {
            return Err(Failure::Stream(format!(
                "object {}: a directory leaf stored compressed",
                object.id
            )));
        }
        let copies =
            crate::object::sync::metadata_copies(object_type, 0, pool.store.all_vdevs_redundant());
        crate::pool::dirty::update_metadata_reserve(pool);
        let pointer =
            crate::pool::data::write_formed_metadata(pool, formed, copies, IoClass::AsyncWrite)
                .await?;
        crate::pool::data::prepare_link(pool, &self.objects, object, raw.block, &pointer).await?;
        // No await from here to the link. (Not `link_cached`: a directory's
        // leaves are never a file's logged blocks.)
        self.objects.forget_data_node(object, raw.block);
        let mut pointer = pointer;
        pointer.birth_txg = pool.txg.open();
        crate::pool::data::link(pool, &self.objects, object, &self.table, raw.block, pointer)?;
        Ok(())
    }

    /// After the END record: the header takes the stream's root and next
    /// object number; a full stream must have brought the root directory
    /// (read when the filesystem's key is loaded, or it is not encrypted;
    /// else, a raw stream's, its object is checked).
    pub(in crate::pool) async fn receive_end(&self, info: &FsStreamInfo) -> Result<(), Failure> {
        let no_root = || {
            Failure::Stream(format!(
                "the stream has no root directory (object {})",
                info.root
            ))
        };
        if self.data_key().is_ok() {
            match self.load_dir(info.root).await {
                Ok(_) => {}
                Err(FsError::NotFound | FsError::NotDir) => return Err(no_root()),
                Err(error) => return Err(error.into()),
            }
        } else {
            match self.objects.open(info.root).await {
                Ok(root) if root.object_type() == ObjectType::FsDirectory => {}
                Ok(_) | Err(ObjectError::NoSuchObject(_)) => return Err(no_root()),
                Err(error) => return Err(error.into()),
            }
        }
        let mut header = self.header.get();
        header.root = info.root;
        header.next_object = header.next_object.max(info.next_object);
        self.set_header(header);
        Ok(())
    }
}
