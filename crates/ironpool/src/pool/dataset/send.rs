//! `send`: a snapshot as a stream ([`crate::format::stream`]), full or
//! incremental from an earlier snapshot, written to a pipe, a file or a socket.
//!
//! An incremental stream carries only the blocks born after the earlier
//! snapshot, found through the birth txgs of the block pointers without reading
//! unchanged subtrees, and the ranges that became holes since. Blocks are read
//! many at a time (the device queue sees depth, not one read after another) and
//! written out in order. The snapshot is held while it is sent, so it cannot be
//! destroyed under the stream.

use std::collections::VecDeque;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::format::stream::{
    self, RecordKind, StreamBegin, StreamEnd, STREAM_VERSION, WRITE_DATA_BYTES_MAX,
};
use crate::object::BlockChange;
use crate::pool::dataset::split_snapshot_name;
use crate::pool::dataset::stream_io::StreamSink;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::executor::JoinHandle;

/// Block reads a send keeps in flight: enough depth for the devices (and their
/// queue's aggregation of neighbours), bounded memory (64 × 128 KiB at most).
pub const SEND_READS_IN_FLIGHT: usize = 64;
/// Changes found per walk of the tree (the walk resumes where it stopped).
pub(in crate::pool) const CHANGES_PER_WALK: usize = 4096;

/// Where an interrupted receive stopped: what `send -t` needs to continue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeToken {
    /// "POOL/VOL@SNAP" as the sender named it.
    pub snapshot: String,
    pub to_guid: u64,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub from_guid: u64,
    /// The first block not yet received (of a filesystem: of object
    /// `next_object`).
    pub next_block: u64,
    /// A filesystem's receive: the first object not yet wholly received
    /// (0 for a volume's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_object: u64,
    /// The stream was raw (`send -w`): its rest must be too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw: bool,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Version tag of the token's text form.
const TOKEN_PREFIX: &str = "1-";
/// Longest token accepted (a token is a few hundred characters).
const TOKEN_CHARS_MAX: usize = 16 * 1024;

impl ResumeToken {
    /// The text form: a version, then the JSON document in hex (safe to paste in
    /// a shell, and into `ironpool send -t`).
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("token serialises");
        let mut text = String::from(TOKEN_PREFIX);
        for byte in json {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }

    pub fn decode(text: &str) -> Result<ResumeToken, PoolError> {
        let invalid = || {
            PoolError::InvalidArgument("not a valid resume token (copy it whole from the receive error or `ironpool get receive_resume_token`)".into())
        };
        let hex = text.trim().strip_prefix(TOKEN_PREFIX).ok_or_else(invalid)?;
        if hex.len() % 2 != 0 || hex.len() > TOKEN_CHARS_MAX {
            return Err(invalid());
        }
        let bytes: Result<Vec<u8>, _> = (0..hex.len())
            .step_by(2)
            .map(|index| u8::from_str_radix(&hex[index..index + 2], 16))
            .collect();
        serde_json::from_slice(&bytes.map_err(|_| invalid())?).map_err(|_| invalid())
    }
}

/// What a send did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SendSummary {
    pub snapshot: String,
    pub from: Option<String>,
    pub records: u64,
    pub written_blocks: u64,
    pub freed_blocks: u64,
    pub stream_bytes: u64,
}

/// What to send.
#[derive(Clone, Debug)]
pub struct SendRequest {
    /// "POOL/VOL@SNAP".
    pub snapshot: String,
    /// "@EARLIER", "VOL@EARLIER" or "POOL/VOL@EARLIER": an earlier snapshot of
    /// the same volume, or the origin of a clone.
    pub from: Option<String>,
    /// Continue an interrupted stream from this block.
    pub resume_block: Option<u64>,
    /// A filesystem's: continue from this object (and `resume_block` of it).
    pub resume_object: Option<u64>,
    /// `send -w`: an encrypted dataset's blocks as stored, sealed (a raw
    /// stream). Other datasets are sent as they would be without it.
    pub raw: bool,
}

/// A raw stream's key (BEGIN's `raw`) for a send of a dataset whose
/// encryption record is `crypt`: with `send -w` of an encrypted dataset,
/// the master key as wrapped, so that neither side needs the key; else
/// none (the stream is not raw).
pub(in crate::pool) fn raw_key(
    crypt: &Option<crate::pool::dataset::directory::CryptRecord>,
    request: &SendRequest,
) -> Option<stream::RawKey> {
    match (crypt, request.raw) {
        (Some(crypt), true) => Some(stream::RawKey {
            key_guid: crypt.key_guid,
            wrapped_key: crypt.wrapped_key.clone(),
        }),
        _ => None,
    }
}

/// A block as the stream carries it: its logical bytes, or (raw) as stored.
pub(in crate::pool) enum Sent {
    Logical(BufSlice),
    Raw(stream::RawBlock, BufSlice),
}

/// One entry of the in-order pipeline between reads and the output.
enum Pending {
    Read {
        blkid: u64,
        read: JoinHandle<Result<Sent, PoolError>>,
    },
    Holes {
        first: u64,
        count: u64,
    },
}

/// Builds records from blocks in order and writes them out.
pub(in crate::pool) struct StreamOut<'a> {
    out: &'a dyn StreamSink,
    block_bytes: u64,
    previous: [u8; 16],
    pub(in crate::pool) end: StreamEnd,
    pub(in crate::pool) bytes: u64,
    incremental: bool,
    /// Data blocks waiting to become a WRITE record: first block and the blocks.
    run: Option<(u64, Vec<BufSlice>)>,
    /// Holes waiting to become a FREE record.
    holes: Option<(u64, u64)>,
}

impl<'a> StreamOut<'a> {
    /// Output to `out`; `block_bytes` for a volume's WRITE runs (0 for a
    /// filesystem's stream).
    pub(in crate::pool) fn new(
        out: &'a dyn StreamSink,
        block_bytes: u64,
        incremental: bool,
    ) -> StreamOut<'a> {
        StreamOut {
            out,
            block_bytes,
            previous: [0; 16],
            end: StreamEnd::default(),
            bytes: 0,
            incremental,
            run: None,
            holes: None,
        }
    }

    /// Writes one record: `head` then `data` as its payload.
    pub(in crate::pool) async fn record(
        &mut self,
        kind: RecordKind,
        head: &[u8],
        data: Vec<BufSlice>,
    ) -> Result<(), PoolError> {
        let (header, checksum) = {
            let mut parts: Vec<&[u8]> = vec![head];
            parts.extend(data.iter().map(|slice| &slice[..]));
            stream::encode_header(kind, &parts, &self.previous)
        };
        let mut front = AlignedBuf::for_overwrite(header.len() + head.len());
        front[..header.len()].copy_from_slice(&header);
        front[header.len()..].copy_from_slice(head);
        let length = front.len() as u64 + data.iter().map(|slice| slice.len() as u64).sum::<u64>();
        let mut slices = vec![BufSlice::whole(front.into_shared())];
        slices.extend(data);
        self.out
            .write_all(slices)
            .await
            .map_err(|error| PoolError::Io(format!("writing the stream: {error}")))?;
        self.previous = checksum;
        self.end.records += 1;
        self.bytes += length;
        Ok(())
    }

    async fn flush_run(&mut self) -> Result<(), PoolError> {
        if let Some((first, blocks)) = self.run.take() {
            let count = blocks.len() as u32;
            self.record(
                RecordKind::Write,
                &stream::write_header(first, count),
                blocks,
            )
            .await?;
            self.end.written_blocks += count as u64;
        }
        Ok(())
    }

    async fn flush_holes(&mut self) -> Result<(), PoolError> {
        if let Some((first, count)) = self.holes.take() {
            self.record(
                RecordKind::Free,
                &stream::free_payload(first, count),
                Vec::new(),
            )
            .await?;
            self.end.freed_blocks += count;
        }
        Ok(())
    }

    async fn block(&mut self, blkid: u64, data: BufSlice) -> Result<(), PoolError> {
        self.flush_holes().await?;
        let blocks_max = (WRITE_DATA_BYTES_MAX / self.block_bytes) as usize;
        let continues = matches!(&self.run, Some((first, blocks)) if first + blocks.len() as u64 == blkid && blocks.len() < blocks_max);
        if !continues {
            self.flush_run().await?;
            self.run = Some((blkid, Vec::new()));
        }
        self.run.as_mut().expect("a run").1.push(data);
        Ok(())
    }

    /// One block as stored (a raw stream's): a record of its own.
    async fn raw_block(&mut self, raw: stream::RawBlock, data: BufSlice) -> Result<(), PoolError> {
        self.flush_holes().await?;
        self.flush_run().await?;
        self.record(
            RecordKind::WriteRaw,
            &stream::write_raw_header(&raw),
            vec![data],
        )
        .await?;
        self.end.written_blocks += 1;
        Ok(())
    }

    async fn free(&mut self, first: u64, count: u64) -> Result<(), PoolError> {
        // A full stream starts from nothing: holes need no record.
        if !self.incremental {
            return Ok(());
        }
        self.flush_run().await?;
        match &mut self.holes {
            Some((start, length)) if *start + *length == first => *length += count,
            _ => {
                self.flush_holes().await?;
                self.holes = Some((first, count));
            }
        }
        Ok(())
    }
}

impl Pool {
    /// Resolves "@SNAP", "VOL@SNAP" or "POOL/VOL@SNAP" against `volume`.
    pub(in crate::pool) fn resolve_from(
        &self,
        volume: &str,
        from: &str,
    ) -> Result<(String, String), PoolError> {
        let (from_volume, from_snapshot) = match from.strip_prefix('@') {
            Some(snapshot) => (volume.to_string(), snapshot.to_string()),
            None => {
                let (from_volume, from_snapshot) = split_snapshot_name(&self.name, from)
                    .ok_or_else(|| {
                        PoolError::InvalidArgument(format!("'{from}' is not a snapshot name"))
                    })?;
                (from_volume.to_string(), from_snapshot.to_string())
            }
        };
        Ok((from_volume, from_snapshot))
    }

    /// The earlier snapshot an incremental send of `to` (snapshot of
    /// `dataset`, `to_name` in full) starts from: its txg, full name and
    /// guid; (0, None, 0) for a full send. It must be a snapshot of the
    /// same dataset, or its origin, and older than `to`.
    pub(in crate::pool) fn send_source(
        &self,
        dataset: &str,
        lineage: &crate::pool::dataset::directory::Lineage,
        to: &crate::pool::dataset::directory::SnapshotRecord,
        to_name: &str,
        from: &Option<String>,
    ) -> Result<(u64, Option<String>, u64), PoolError> {
        let Some(from) = from else {
            return Ok((0, None, 0));
        };
        if from.contains('#') {
            return self.send_source_bookmark(dataset, lineage, to, to_name, from);
        }
        let (from_dataset, from_snapshot) = self.resolve_from(dataset, from)?;
        let is_origin = lineage.origin.as_ref().is_some_and(|origin| {
            origin.volume == from_dataset && origin.snapshot == from_snapshot
        });
        if from_dataset != dataset && !is_origin {
            return Err(PoolError::InvalidArgument(format!(
                "{from} is neither a snapshot of {}/{dataset} nor its origin",
                self.name
            )));
        }
        let from_record = self
            .datasets
            .directory
            .read()
            .lineage(&from_dataset)
            .and_then(|owner| owner.snapshot(&from_snapshot).cloned())
            .ok_or_else(|| {
                PoolError::NoSuchSnapshot(format!("{}/{from_dataset}@{from_snapshot}", self.name))
            })?;
        if from_record.txg >= to.txg {
            return Err(PoolError::InvalidArgument(format!(
                "{from} is not earlier than {to_name}"
            )));
        }
        Ok((
            from_record.txg,
            Some(format!("{}/{from_dataset}@{from_snapshot}", self.name)),
            from_record.guid,
        ))
    }

    /// [`Pool::send_source`] from bookmark `from` (#NAME, or
    /// POOL/DATASET#NAME) of `dataset`: the txg and guid of the snapshot it
    /// was made of, which may be gone.
    fn send_source_bookmark(
        &self,
        dataset: &str,
        lineage: &crate::pool::dataset::directory::Lineage,
        to: &crate::pool::dataset::directory::SnapshotRecord,
        to_name: &str,
        from: &str,
    ) -> Result<(u64, Option<String>, u64), PoolError> {
        let (owner, name) =
            crate::pool::dataset::split_bookmark_name(&self.name, from, Some(dataset)).ok_or_else(
                || PoolError::InvalidArgument(format!("'{from}' is not a bookmark name")),
            )?;
        if owner != dataset {
            return Err(PoolError::InvalidArgument(format!(
                "{from} is not a bookmark of {}/{dataset}",
                self.name
            )));
        }
        let bookmark = lineage
            .bookmark(name)
            .ok_or_else(|| PoolError::NoSuchSnapshot(format!("{}/{dataset}#{name}", self.name)))?;
        if bookmark.txg >= to.txg {
            return Err(PoolError::InvalidArgument(format!(
                "{from} is not earlier than {to_name}"
            )));
        }
        Ok((
            bookmark.txg,
            Some(format!("{}/{dataset}#{name}", self.name)),
            bookmark.guid,
        ))
    }

    /// Writes `request`'s stream to `out`.
    pub async fn send(
        self: &Rc<Self>,
        request: SendRequest,
        out: &dyn StreamSink,
    ) -> Result<SendSummary, PoolError> {
        let (volume, snapshot) =
            split_snapshot_name(&self.name, &request.snapshot).ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "'{}': send takes POOL/VOL@SNAP",
                    request.snapshot
                ))
            })?;
        if self.filesystem(volume).is_ok() {
            let (volume, snapshot) = (volume.to_string(), snapshot.to_string());
            return self.send_filesystem(&volume, &snapshot, request, out).await;
        }
        let record = self.volume_record(volume)?;
        let to = record
            .lineage
            .snapshot(snapshot)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchVolume(request.snapshot.clone()))?;
        let to_name = format!("{}/{volume}@{snapshot}", self.name);
        let (since_txg, from_name, from_guid) =
            self.send_source(volume, &record.lineage, &to, &to_name, &request.from)?;
        let _hold = self.hold_snapshot(&to_name);
        let _from_hold = from_name.as_ref().map(|name| self.hold_snapshot(name));
        let view = self.snapshot_volume(&to_name).await?;
        let size_bytes = view.size_bytes.get();
        let block_bytes = view.block_bytes;
        let blocks = size_bytes / block_bytes;
        let raw = raw_key(&record.crypt, &request);
        let begin = StreamBegin {
            version: if raw.is_some() {
                stream::STREAM_VERSION_RAW
            } else {
                STREAM_VERSION
            },
            snapshot: to_name.clone(),
            to_guid: to.guid,
            from: from_name.clone(),
            from_guid,
            size_bytes,
            block_bytes: block_bytes as u32,
            resume_block: request.resume_block,
            properties: record.own_properties(),
            filesystem: None,
            resume_object: None,
            raw: raw.clone(),
        };
        let mut output = StreamOut::new(out, block_bytes, from_name.is_some());
        let json = serde_json::to_vec(&begin).expect("BEGIN serialises");
        output.record(RecordKind::Begin, &json, Vec::new()).await?;
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let start = request.resume_block.unwrap_or(0);
        // The stream's reads run ahead of it (SEND_READS_IN_FLIGHT): its
        // prefetch. A block already cached is sent from the cache; what is
        // read is not kept: a send is one pass over the whole snapshot,
        // and keeping it would cost a new buffer per block while the cache
        // grows (1 GiB sent at 294-584 MiB/s against 911-1,067 without,
        // in one run) and push out what readers use once it is full.
        let usage = view.settings().data_cache_use();
        let usage = crate::cache::CacheUse::data(usage.lookup, false);
        // An encrypted volume is sent as plaintext unless raw: its key
        // must be loaded then.
        let key = match raw {
            Some(_) => None,
            None => view
                .key_guid()
                .map(|guid| self.data_key(guid))
                .transpose()
                .map_err(|_| {
                    PoolError::KeyUnavailable(format!(
                        "{} is encrypted: load its key to send it, or send it raw (send -w)",
                        request.snapshot
                    ))
                })?,
        };
        let raw = raw.is_some();
        let mut walk = self.objects.walk_changed_blocks(
            &view.object,
            since_txg,
            start,
            CHANGES_PER_WALK,
            true,
        );
        while let Some(changes) = walk.next_batch().await? {
            for change in changes {
                match change {
                    BlockChange::Data { blkid, pointer } if blkid < blocks => {
                        let pool = self.clone();
                        let key = key.clone();
                        pending.push_back(Pending::Read {
                            blkid,
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
                    BlockChange::Holes { first, count } if first < blocks => {
                        pending.push_back(Pending::Holes {
                            first,
                            count: count.min(blocks - first),
                        })
                    }
                    _ => {}
                }
                let reads = pending
                    .iter()
                    .filter(|entry| matches!(entry, Pending::Read { .. }))
                    .count();
                if reads >= SEND_READS_IN_FLIGHT {
                    drain_front(&mut pending, &mut output, reads / 2).await?;
                }
            }
        }
        drain_front(&mut pending, &mut output, usize::MAX).await?;
        output.flush_run().await?;
        output.flush_holes().await?;
        let end = output.end;
        output
            .record(RecordKind::End, &stream::end_payload(&end), Vec::new())
            .await?;
        Ok(SendSummary {
            snapshot: to_name,
            from: from_name,
            records: output.end.records,
            written_blocks: end.written_blocks,
            freed_blocks: end.freed_blocks,
            stream_bytes: output.bytes,
        })
    }

    /// Reads a block (through the cache as `usage` says) and returns its
    /// logical bytes (opened with `key` if encrypted, decompressed).
    pub(crate) async fn read_logical(
        self: &Rc<Self>,
        pointer: &crate::format::BlockPointer,
        blkid: u64,
        usage: crate::cache::CacheUse,
        key: Option<&crate::crypto::DatasetKey>,
    ) -> Result<BufSlice, PoolError> {
        let read = self
            .store
            .read_cached(pointer, IoClass::AsyncRead, usage)
            .await?;
        crate::pool::data::logical_bytes(
            &self.store,
            pointer,
            read,
            key,
            &"the snapshot sent",
            blkid,
        )
        .await
    }

    /// Reads an encrypted block as stored (verified by its checksum, healed
    /// from another copy, never opened) for a raw stream. The read cache
    /// is passed by: it may hold the block opened.
    pub(in crate::pool) async fn read_stored(
        self: &Rc<Self>,
        pointer: &crate::format::BlockPointer,
        blkid: u64,
    ) -> Result<Sent, PoolError> {
        let Some(crypt) = pointer.crypt else {
            return Err(PoolError::Corrupt(format!(
                "block {blkid} of an encrypted dataset is not sealed"
            )));
        };
        let read = self
            .store
            .read_cached(
                pointer,
                IoClass::AsyncRead,
                crate::cache::CacheUse::data(false, false),
            )
            .await?;
        debug_assert!(!read.opened, "a read that passed the cache is as stored");
        let raw = stream::RawBlock {
            block: blkid,
            logical: pointer.logical_size,
            physical: pointer.physical_size,
            compression: pointer.compression,
            crypt,
        };
        let size = pointer.physical_size as usize;
        Ok(Sent::Raw(raw, read.data.slice(0..size)))
    }

    /// Keeps snapshot `full_name` from being destroyed while the guard lives.
    pub(crate) fn hold_snapshot(self: &Rc<Self>, full_name: &str) -> SnapshotHold {
        *self
            .datasets
            .snapshot_holds
            .borrow_mut()
            .entry(full_name.to_string())
            .or_insert(0) += 1;
        SnapshotHold {
            pool: self.clone(),
            name: full_name.to_string(),
        }
    }

    /// Refuses to destroy a snapshot that is being sent.
    pub(crate) fn check_not_held(&self, full_name: &str) -> Result<(), PoolError> {
        if self
            .datasets
            .snapshot_holds
            .borrow()
            .get(full_name)
            .is_some_and(|count| *count > 0)
        {
            return Err(PoolError::InvalidArgument(format!(
                "{full_name} is being sent; try again when the send ends"
            )));
        }
        let tags = self.user_holds(full_name);
        if !tags.is_empty() {
            return Err(PoolError::InvalidArgument(format!(
                "{full_name} is held (tags: {}); release the holds first (`ironpool release TAG {full_name}`)",
                tags.join(", ")
            )));
        }
        Ok(())
    }
}

/// A hold on a snapshot (see [`Pool::hold_snapshot`]).
pub struct SnapshotHold {
    pool: Rc<Pool>,
    name: String,
}

impl Drop for SnapshotHold {
    fn drop(&mut self) {
        let mut holds = self.pool.datasets.snapshot_holds.borrow_mut();
        if let Some(count) = holds.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                holds.remove(&self.name);
            }
        }
    }
}

/// Hands the first `reads` reads (and the holes between) to the output, in order.
async fn drain_front(
    pending: &mut VecDeque<Pending>,
    output: &mut StreamOut<'_>,
    reads: usize,
) -> Result<(), PoolError> {
    let mut drained = 0;
    while let Some(entry) = pending.pop_front() {
        match entry {
            Pending::Read { blkid, read } => {
                match read.await? {
                    Sent::Logical(data) => output.block(blkid, data).await?,
                    Sent::Raw(raw, data) => output.raw_block(raw, data).await?,
                }
                drained += 1;
                if drained >= reads {
                    break;
                }
            }
            Pending::Holes { first, count } => output.free(first, count).await?,
        }
    }
    Ok(())
}
