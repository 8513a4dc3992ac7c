//! Volumes: block devices made of a copy-on-write tree of `volblocksize` blocks.
//!
//! The I/O path is asynchronous and copies nothing:
//! - a write of whole blocks is held as dirty blocks that point into the buffer
//!   the request arrived in, and acknowledged; the write-back
//!   (`crate::pool::volume::writeback`) later allocates new space for a batch of them, writes
//!   them there, links the new pointers into the tree and frees the old blocks.
//!   FUA writes and `sync=always` write through: allocated, written and linked
//!   before the reply, then committed;
//! - a write of part of a block reads the old block (from memory when it is
//!   dirty), merges, and stores it the same way (read-modify-write, counted);
//! - a read returns a dirty block's bytes, or looks up the pointer and reads the
//!   block, verified, from a device; never-written blocks are holes and read as
//!   zeros without I/O;
//! - blocks of zeros (written, zeroed or trimmed) become holes, at once.
//!
//! Reads and BLOCK_STATUS are in `read.rs`, the write-back in
//! `writeback.rs`, read-ahead in `prefetch.rs`.
//!
//! Writes to the same block are serialised by a per-block lock so that partial
//! writes to different parts of one block both land; writes to different blocks
//! run concurrently, and all of them reach the device queue at once.

pub mod prefetch;
mod read;
pub mod writeback;

pub use read::ReadPiece;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::Serialize;

use crate::format::bp::Compression;
use crate::format::{BlockPointer, ObjectType};
use crate::object::{block_pieces, Object};
use crate::pool::data::{is_zero, BLOCKS_IN_FLIGHT_PER_REQUEST};
use crate::pool::dataset::directory::VolumeRecord;
use crate::pool::dataset::intent_log::COPY_BLOCK_BYTES_MAX;
use crate::pool::dataset::props::{LogBias, SyncMode, VolumeSettings};
use crate::pool::Owner;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Notify;

/// What a volume write holds from its admission until its blocks are
/// linked or held ([`Pool::admit_volume_write`]): its place in the
/// dataset's quota and its claim on the pool's free space.
#[must_use]
struct VolumeWriteAdmission<'a> {
    _admitted: crate::pool::dataset::quota::Admitted<'a>,
    _space: crate::pool::dirty::SpaceClaim<'a>,
}

/// Largest volblocksize: 128 KiB (as OpenZFS's default maximum for zvols).
pub const VOLUME_BLOCK_BYTES_MAX: u32 = 128 * 1024;
/// Default volblocksize: 16 KiB, OpenZFS's zvol default.
pub const VOLUME_BLOCK_BYTES_DEFAULT: u32 = 16 * 1024;
/// Largest volume: 2^56 bytes, the reach of space map offsets.
pub const VOLUME_SIZE_MAX_BYTES: u64 = 1 << 56;
/// The `refreservation` that makes a volume of `size_bytes` in blocks of
/// `block_bytes` thick (a volume's default, and `refreservation=auto`):
/// its data, plus every indirect block that points at it, each kept in
/// [`crate::object::sync::METADATA_COPIES`] copies and counted
/// uncompressed, as OpenZFS's `zvol_volsize_to_reservation` counts them
/// (an upper bound: the volume can always be written in full).
pub fn thick_reservation(size_bytes: u64, block_bytes: u32) -> u64 {
    let pointers_per_indirect =
        (1u64 << crate::pool::INDIRECT_BLOCK_SHIFT) / crate::format::bp::BLOCK_POINTER_BYTES as u64;
    let mut blocks = size_bytes.div_ceil(u64::from(block_bytes.max(1)));
    let mut indirect = 0u64;
    while blocks > 1 {
        blocks = blocks.div_ceil(pointers_per_indirect);
        indirect += blocks;
    }
    let copies = crate::object::sync::METADATA_COPIES as u64;
    size_bytes.saturating_add(
        indirect
            .saturating_mul(copies)
            .saturating_mul(1 << crate::pool::INDIRECT_BLOCK_SHIFT),
    )
}

/// Offsets and lengths of volume I/O must be multiples of this (the NBD minimum
/// block size advertised to clients; a 512-byte sector, like any disk).
pub const IO_ALIGNMENT_BYTES: u64 = 512;
/// Writers a volume admits at once before an operation that needs it alone
/// (rollback, receive) can take it: far above any client's queue depth.
const VOLUME_WRITERS_MAX: u64 = 1 << 20;
/// Most extents one block-status answer reports (the rest is asked again).
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 65536;

/// What the volume's I/O did (cumulative since import).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct VolumeStats {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Reads that bypassed the read cache (`direct=always`), and writes
    /// (all of them: dirty blocks are the clients' own buffers, and writes
    /// never enter the read cache).
    pub direct_read_ops: u64,
    pub direct_write_ops: u64,
    /// Partial-block writes that had to read the old block first.
    pub rmw_write_ops: u64,
    /// Blocks read from the read cache, and read from the devices (a read
    /// that waited for the same block's read in flight counts as a miss).
    pub cache_hit_blocks: u64,
    pub cache_miss_blocks: u64,
    /// Reads of never-written blocks (answered with zeros, no device I/O).
    pub hole_read_ops: u64,
    /// Blocks of zeros stored as holes.
    pub zero_blocks: u64,
    pub trim_ops: u64,
    pub zero_ops: u64,
    pub flush_ops: u64,
    /// Blocks read from memory: written, acknowledged, not yet written out.
    pub dirty_read_blocks: u64,
    /// Dirty blocks overwritten before they were written out (device writes
    /// saved).
    pub absorbed_writes: u64,
    /// Dirty blocks written out and linked by the write-back.
    pub writeback_blocks: u64,
    /// Write-back batches that failed (their blocks stay dirty; the next flush
    /// reports it).
    pub writeback_errors: u64,
    /// Bytes held dirty now.
    pub dirty_bytes: u64,
    /// Blocks stored compressed.
    pub compressed_blocks: u64,
    /// Blocks compression was tried on but did not save enough (stored as is).
    pub incompressible_blocks: u64,
}

/// A volume.
pub struct Volume {
    /// `POOL/NAME`; `rename` changes it.
    name_cell: RefCell<String>,
    pub object: Rc<Object>,
    pub size_bytes: Cell<u64>,
    pub block_bytes: u64,
    pub read_only: Cell<bool>,
    /// Compression, checksum and sync of new writes (from its properties).
    settings: Cell<VolumeSettings>,
    destroying: Cell<bool>,
    locked: RefCell<rustc_hash::FxHashSet<u64>>,
    unlocked: Notify,
    stats: Cell<VolumeStats>,
    /// Writes hold one unit; rollback and receive take them all.
    writers: Rc<crate::rt::sync::Semaphore>,
    /// Blocks acknowledged and not yet written out.
    pub(crate) writeback: crate::pool::volume::writeback::VolumeWriteback,
    /// What a FLUSH writes instead of a txg.
    pub(crate) log: crate::pool::dataset::intent_log::IntentLog,
    /// Its sequential readers, for prefetch.
    pub(crate) streams: prefetch::Streams,
    /// Its space figures for its quota and reservation (`dataset::quota`).
    pub(crate) usage: crate::pool::dataset::quota::UsageEstimate,
    /// The key guid of its encryption root, when it is encrypted: its data
    /// blocks are sealed under that key (`dataset::keys`).
    key_guid: Option<u64>,
}

/// A new directory record.
pub fn record(
    object: u64,
    size_bytes: u64,
    block_bytes: u32,
    created_txg: u64,
    properties: BTreeMap<String, String>,
) -> VolumeRecord {
    VolumeRecord {
        object,
        size_bytes,
        block_bytes,
        created_txg,
        properties,
        received: BTreeMap::new(),
        guid: crate::format::new_guid(),
        lineage: Default::default(),
        receive: None,
        intent_log: None,
        crypt: None,
    }
}

impl Volume {
    /// A volume over `object`, following `settings` (see [`Pool::volume_settings`]).
    pub fn new(
        name: String,
        object: Rc<Object>,
        record: &VolumeRecord,
        settings: VolumeSettings,
    ) -> Rc<Volume> {
        Rc::new(Volume {
            name_cell: RefCell::new(name),
            object,
            size_bytes: Cell::new(record.size_bytes),
            block_bytes: record.block_bytes as u64,
            read_only: Cell::new(settings.read_only),
            settings: Cell::new(settings),
            destroying: Cell::new(false),
            locked: RefCell::default(),
            unlocked: Notify::new(),
            stats: Cell::new(VolumeStats::default()),
            writers: crate::rt::sync::Semaphore::new(VOLUME_WRITERS_MAX),
            writeback: Default::default(),
            log: Default::default(),
            streams: Default::default(),
            usage: Default::default(),
            key_guid: record.crypt.as_ref().map(|crypt| crypt.key_guid),
        })
    }

    /// The key guid of its encryption root, when it is encrypted.
    pub fn key_guid(&self) -> Option<u64> {
        self.key_guid
    }

    /// `POOL/NAME` (a snapshot's: `POOL/NAME@SNAP`): what NBD clients
    /// ask for and messages name.
    pub fn name(&self) -> String {
        self.name_cell.borrow().clone()
    }

    /// Gives the volume its name after a `rename`.
    pub(in crate::pool) fn set_name(&self, name: String) {
        *self.name_cell.borrow_mut() = name;
    }

    /// The settings new writes follow.
    pub fn settings(&self) -> VolumeSettings {
        self.settings.get()
    }

    /// Follows changed properties from the next request on.
    pub fn apply_settings(&self, settings: VolumeSettings) {
        self.settings.set(settings);
        self.read_only.set(settings.read_only);
    }

    /// Whether a write must be durable before it is acknowledged: the client's
    /// FUA, overridden by the `sync` property.
    fn durable(&self, fua: bool) -> bool {
        match self.settings.get().sync {
            SyncMode::Standard => fua,
            SyncMode::Always => true,
            SyncMode::Disabled => false,
        }
    }

    /// The name within the pool.
    pub fn short_name(&self) -> String {
        let name = self.name_cell.borrow();
        name.split_once('/')
            .map(|(_, short)| short.to_string())
            .unwrap_or_else(|| name.clone())
    }

    pub fn stats(&self) -> VolumeStats {
        VolumeStats {
            dirty_bytes: self.writeback.bytes(),
            ..self.stats.get()
        }
    }

    /// The counters of the volume's intent log.
    pub fn log_stats(&self) -> crate::pool::dataset::intent_log::LogStats {
        self.log.stats()
    }

    pub(crate) fn count(&self, update: impl FnOnce(&mut VolumeStats)) {
        let mut stats = self.stats.get();
        update(&mut stats);
        self.stats.set(stats);
    }

    /// How the volume's data blocks are stored now (its properties).
    pub(crate) fn block_format(&self) -> crate::pool::data::BlockFormat {
        let settings = self.settings();
        crate::pool::data::BlockFormat {
            // An encrypted block's MAC takes the second half of the
            // checksum's place: XXH3-128 fills only the first.
            checksum: match self.key_guid {
                Some(_) => crate::format::ChecksumAlgo::Xxh3,
                None => settings.checksum,
            },
            compression: settings.compression,
            object_type: ObjectType::VolumeData,
            key: self.key_guid,
        }
    }

    /// Block `data` (a whole block) for the write pipeline, with the work
    /// `prepared` from it when it was received.
    pub(crate) fn new_block(
        &self,
        data: BufSlice,
        prepared: crate::pool::volume::writeback::Prepared,
    ) -> crate::pool::data::NewBlock {
        debug_assert_eq!(
            data.len() as u64,
            self.block_bytes,
            "a volume block is whole"
        );
        crate::pool::data::NewBlock {
            checksum: prepared.checksum,
            prep: prepared.store,
            ..crate::pool::data::NewBlock::whole(data)
        }
    }

    /// Counts a stored block as compressed or not, when the volume compresses.
    pub(crate) fn count_stored(&self, pointer: &BlockPointer) {
        if self.settings().compression.algo == Compression::Off {
            return;
        }
        if pointer.compression == Compression::Off {
            self.count(|stats| stats.incompressible_blocks += 1);
        } else {
            self.count(|stats| stats.compressed_blocks += 1);
        }
    }

    /// Waits until no write is in progress and keeps writes out while held
    /// (dirty blocks may remain: see [`Pool::exclusive`]).
    async fn exclusive_writers(&self) -> crate::rt::sync::Permit {
        self.writers.acquire(VOLUME_WRITERS_MAX).await
    }

    /// Takes a writer's permit, then checks the volume still exists: a write
    /// that waited behind a destroy's exclusive permit must not go on into the
    /// freed tree (it held blocks of a forgotten object, and the next txg build
    /// freed space twice and stopped the server).
    async fn writer(&self) -> Result<crate::rt::sync::Permit, PoolError> {
        let permit = self.writers.acquire(1).await;
        if self.destroying.get() {
            return Err(PoolError::NoSuchVolume(self.name()));
        }
        Ok(permit)
    }

    pub(crate) fn begin_destroy(&self) {
        self.destroying.set(true);
    }

    /// True once the volume (or the snapshot this view shows) is being
    /// destroyed: its exports end their connections.
    pub fn is_destroyed(&self) -> bool {
        self.destroying.get()
    }

    fn check(&self, offset: u64, length: u64) -> Result<(), PoolError> {
        if self.destroying.get() {
            return Err(PoolError::NoSuchVolume(self.name()));
        }
        let size = self.size_bytes.get();
        if offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(PoolError::OutOfRange {
                offset,
                length,
                size,
            });
        }
        if !offset.is_multiple_of(IO_ALIGNMENT_BYTES) || !length.is_multiple_of(IO_ALIGNMENT_BYTES)
        {
            return Err(PoolError::Misaligned {
                offset,
                length,
                alignment: IO_ALIGNMENT_BYTES,
            });
        }
        Ok(())
    }

    fn check_writable(&self, offset: u64, length: u64) -> Result<(), PoolError> {
        self.check(offset, length)?;
        if self.read_only.get() {
            return Err(PoolError::ReadOnly(self.name()));
        }
        Ok(())
    }

    /// Takes the per-block write locks of blocks `first..=last`, in ascending order
    /// (so two requests never wait on each other in a cycle).
    async fn lock(&self, first: u64, last: u64) -> BlockLocks<'_> {
        for blkid in first..=last {
            loop {
                let free = !self.locked.borrow().contains(&blkid);
                if free {
                    self.locked.borrow_mut().insert(blkid);
                    break;
                }
                self.unlocked.notified().await;
            }
        }
        BlockLocks {
            volume: self,
            first,
            last,
        }
    }

    /// Takes block `blkid`'s lock if it is free (the write-back never waits
    /// for a lock, so it never holds one while waiting for another).
    pub(crate) fn try_lock_block(&self, blkid: u64) -> bool {
        self.locked.borrow_mut().insert(blkid)
    }

    /// The guard of a lock taken by `try_lock_block`.
    pub(crate) fn held_lock(&self, blkid: u64) -> impl Drop + '_ {
        BlockLocks {
            volume: self,
            first: blkid,
            last: blkid,
        }
    }

    /// Completes when some block lock is released.
    pub(crate) async fn wait_unlocked(&self) {
        self.unlocked.notified().await
    }
}

struct BlockLocks<'a> {
    volume: &'a Volume,
    first: u64,
    last: u64,
}

impl Drop for BlockLocks<'_> {
    fn drop(&mut self) {
        let mut locked = self.volume.locked.borrow_mut();
        for blkid in self.first..=self.last {
            locked.remove(&blkid);
        }
        drop(locked);
        self.volume.unlocked.notify_all();
    }
}

/// What a write puts into one block.
enum BlockContent {
    /// The whole block.
    Full(BufSlice),
    /// The whole block, stored as data even if it is all zeros (WRITE_ZEROES with
    /// NO_HOLE: the client wants the space allocated).
    FullAllocated(BufSlice),
    /// Part of the block at `within`.
    Partial { within: usize, data: BufSlice },
    /// Zeros over the whole block.
    Zero,
    /// Zeros over part of the block.
    PartialZero { within: usize, length: usize },
}

impl Pool {
    /// Lets a write of blocks `first..=last` of `volume` in, once the
    /// write throttle does: all or nothing, and never into the space held
    /// writes will take. It claims the whole blocks it touches (a part of
    /// one is written as a new whole block), the volume's quota and the
    /// other datasets' reservations first. The caller takes no lock before
    /// (the claim may wait for commits) and keeps what this returns until
    /// its blocks are linked or held.
    async fn admit_volume_write<'a>(
        self: &'a Rc<Self>,
        volume: &'a Rc<Volume>,
        first: u64,
        last: u64,
    ) -> Result<VolumeWriteAdmission<'a>, PoolError> {
        debug_assert!(first <= last, "a write touches a block");
        self.txg.throttle(self).await;
        let blocks = last - first + 1;
        let admitted = self
            .admit_volume_blocks(volume, blocks, volume.block_bytes)
            .await?;
        let space = self.claim_space(blocks * volume.block_bytes).await?;
        Ok(VolumeWriteAdmission {
            _admitted: admitted,
            _space: space,
        })
    }

    /// Writes `data` at `offset` of `volume`; with `fua`, returns once it is durable.
    pub async fn write(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        data: BufSlice,
        fua: bool,
    ) -> Result<(), PoolError> {
        let length = data.len() as u64;
        volume.check_writable(offset, length)?;
        self.txg.ensure_writable()?;
        if length == 0 {
            return Ok(());
        }
        volume.log.note_write_arrived();
        let durable = volume.durable(fua);
        let block = volume.block_bytes;
        let first = offset / block;
        let last = (offset + length - 1) / block;
        let _admitted = self.admit_volume_write(volume, first, last).await?;
        // A small durable write (small blocks, `logbias=latency`) is held and
        // its commit copies it into the log, as OpenZFS copies small sync
        // writes into its log records: one durable log write, where writing
        // it through first costs a device write and then the commit.
        // Never an encrypted volume's: the log's records are not sealed.
        let copied = durable
            && volume.key_guid().is_none()
            && volume.settings().log_bias == LogBias::Latency
            && block <= COPY_BLOCK_BYTES_MAX
            && length <= COPY_BLOCK_BYTES_MAX;
        let admission =
            if durable && !copied || length >= crate::pool::dirty::WRITE_THROUGH_MIN_BYTES {
                None
            } else {
                self.admit_dirty(self.hold_bytes(volume, last - first + 1))
                    .await
            };
        let hold = admission.is_some();
        let writer = volume.writer().await?;
        let locks = volume.lock(first, last).await;
        let mut contents = Vec::with_capacity((last - first + 1) as usize);
        for (blkid, within, chunk, position) in block_pieces(offset, offset + length, block) {
            let start = (position - offset) as usize;
            let slice = data.slice(start..start + chunk);
            let content = if chunk as u64 == block {
                BlockContent::Full(slice)
            } else {
                BlockContent::Partial {
                    within,
                    data: slice,
                }
            };
            contents.push((blkid, content));
        }
        self.apply_contents(volume, contents, hold).await?;
        volume.count(|stats| {
            stats.write_ops += 1;
            stats.direct_write_ops += 1;
            stats.write_bytes += length;
        });
        if durable {
            if hold {
                // As a FLUSH does: the commit may write held blocks out,
                // which takes their locks, so this write's are let go first.
                drop(locks);
                drop(writer);
            }
            self.log_commit(volume, hold).await?;
        }
        Ok(())
    }

    /// Stores block `raw.block` of `volume`, an encrypted volume, as the
    /// pool that sent it stored it (a raw receive): its bytes stay sealed,
    /// its pointer takes the fields that open it, and no key is needed.
    /// Written through and linked, as a large write is.
    pub(crate) async fn write_stored_block(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        raw: &crate::format::stream::RawBlock,
        data: &[u8],
    ) -> Result<(), PoolError> {
        let block = volume.block_bytes;
        // The receive's checks (a raw stream creates an encrypted volume,
        // or applies to one of its key; its blocks are the volume's size)
        // make this hold; a stream that slipped past them is refused.
        if volume.key_guid().is_none() || raw.logical as u64 != block {
            return Err(PoolError::InvalidArgument(format!(
                "{}: a raw block goes into an encrypted volume of its block size",
                volume.name()
            )));
        }
        volume.check_writable(raw.block * block, block)?;
        self.txg.ensure_writable()?;
        let _admitted = self
            .admit_volume_write(volume, raw.block, raw.block)
            .await?;
        let _writer = volume.writer().await?;
        let _lock = volume.lock(raw.block, raw.block).await;
        let formed = crate::pool::data::Formed::stored_as_sent(
            self,
            volume.block_format().object_type,
            raw.logical,
            raw.compression,
            raw.crypt,
            data,
        );
        let pointer = crate::pool::data::write_formed(self, vec![Ok(formed)], IoClass::AsyncWrite)
            .await
            .pop()
            .expect("a result for the one block")?;
        volume.count_stored(&pointer);
        volume.count(|stats| {
            stats.write_ops += 1;
            stats.write_bytes += block;
        });
        self.link_block(volume, raw.block, pointer, false).await
    }

    /// Makes `offset..offset+length` read as zeros; whole blocks become holes
    /// (TRIM and WRITE_ZEROES both end here: a trimmed range reads as zeros).
    pub async fn zero(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        length: u64,
        fua: bool,
        trim: bool,
    ) -> Result<(), PoolError> {
        if !self
            .fill_zeros(volume, offset, length, || BlockContent::Zero)
            .await?
        {
            return Ok(());
        }
        volume.count(|stats| {
            if trim {
                stats.trim_ops += 1
            } else {
                stats.zero_ops += 1
            }
        });
        self.commit_if_durable(volume, fua).await
    }

    /// Writes zeros as allocated data blocks (NBD WRITE_ZEROES with NO_HOLE).
    pub async fn write_allocated_zeroes(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), PoolError> {
        let zeros = BufSlice::whole(AlignedBuf::zeroed(volume.block_bytes as usize).into_shared());
        let filled = self
            .fill_zeros(volume, offset, length, || {
                BlockContent::FullAllocated(zeros.clone())
            })
            .await?;
        if !filled {
            return Ok(());
        }
        volume.count(|stats| stats.zero_ops += 1);
        self.commit_if_durable(volume, fua).await
    }

    /// Zeroes `offset..offset+length`: whole blocks become `whole()`, parts of
    /// blocks are zeroed in place. Large ranges go a slice of blocks at a time
    /// so locks and memory stay bounded. False when the range is empty (nothing
    /// done, nothing to count or commit).
    async fn fill_zeros(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        length: u64,
        whole: impl Fn() -> BlockContent,
    ) -> Result<bool, PoolError> {
        volume.check_writable(offset, length)?;
        self.txg.ensure_writable()?;
        if length == 0 {
            return Ok(false);
        }
        self.txg.throttle(self).await;
        let _writer = volume.writer().await?;
        let block = volume.block_bytes;
        let end = offset + length;
        let whole_allocates = matches!(whole(), BlockContent::FullAllocated(_));
        let mut position = offset;
        while position < end {
            let slice_end =
                end.min((position / block + BLOCKS_IN_FLIGHT_PER_REQUEST as u64) * block);
            // Zeros written as data (WRITE_ZEROES with NO_HOLE) claim their
            // space before the slice's locks, as a write does. Holes take
            // none: a TRIM on a full pool must go on (parts of blocks zeroed
            // in place, two at most per request, are left unclaimed for it).
            let _space = if whole_allocates {
                let admitted = self
                    .admit_volume_blocks(volume, (slice_end - position).div_ceil(block), block)
                    .await?;
                Some((admitted, self.claim_space(slice_end - position).await?))
            } else {
                None
            };
            let _locks = volume.lock(position / block, (slice_end - 1) / block).await;
            let contents = block_pieces(position, slice_end, block)
                .map(|(blkid, within, chunk, _)| {
                    let content = if chunk as u64 == block {
                        whole()
                    } else {
                        BlockContent::PartialZero {
                            within,
                            length: chunk,
                        }
                    };
                    (blkid, content)
                })
                .collect();
            self.apply_contents(volume, contents, false).await?;
            position = slice_end;
            // A slice of holes links without waiting on a device: a TRIM
            // of a whole disk (mkfs, blkdiscard) would hold the engine's
            // loop from every other client until it ended (a GiB of 16 KiB
            // blocks, 60-90 ms) without this turn between slices.
            if position < end {
                crate::rt::yield_now().await;
            }
        }
        Ok(true)
    }

    /// Commits what was linked when the write must be durable on return (FUA,
    /// or the volume's `sync=always`).
    async fn commit_if_durable(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        fua: bool,
    ) -> Result<(), PoolError> {
        if volume.durable(fua) {
            self.log_commit(volume, false).await?;
        }
        Ok(())
    }

    /// Puts each block's content in place; with `hold`, blocks of data may be
    /// held dirty (write-back), else everything is written through.
    async fn apply_contents(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        contents: Vec<(u64, BlockContent)>,
        hold: bool,
    ) -> Result<(), PoolError> {
        let mut contents = contents.into_iter();
        loop {
            let batch: Vec<(u64, BlockContent)> = contents
                .by_ref()
                .take(BLOCKS_IN_FLIGHT_PER_REQUEST)
                .collect();
            if batch.is_empty() {
                return Ok(());
            }
            if batch.len() == 1 {
                let (blkid, content) = batch.into_iter().next().expect("one block");
                self.write_block(volume, blkid, content, hold).await?;
                continue;
            }
            // Written through, whole blocks of data go to the devices as one
            // run; the rest (partial blocks, zeros) one by one.
            let mut run = Vec::new();
            let mut single = Vec::new();
            for (blkid, content) in batch {
                match content {
                    BlockContent::Full(data) if !hold && !is_zero(&data) => {
                        run.push((blkid, data, Default::default()))
                    }
                    BlockContent::FullAllocated(data) if !hold => {
                        run.push((blkid, data, Default::default()))
                    }
                    content => single.push((blkid, content)),
                }
            }
            let singles = futures_util::future::join_all(
                single
                    .into_iter()
                    .map(|(blkid, content)| self.write_block(volume, blkid, content, hold)),
            );
            let (run_results, single_results) = futures_util::future::join(
                self.store_blocks(volume, run, IoClass::SyncWrite, false),
                singles,
            )
            .await;
            for result in run_results.into_iter().chain(single_results) {
                result?;
            }
        }
    }

    /// Puts `content` into block `blkid` (the caller holds its lock): held
    /// dirty when `hold` allows and the pool takes it, else written through.
    async fn write_block(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        content: BlockContent,
        hold: bool,
    ) -> Result<(), PoolError> {
        let block = volume.block_bytes as usize;
        let data: Option<BufSlice> = match content {
            BlockContent::Full(slice) => (!is_zero(&slice)).then_some(slice),
            BlockContent::FullAllocated(slice) => Some(slice),
            BlockContent::Zero => None,
            BlockContent::Partial { within, data } => {
                let mut merged = self
                    .read_block(volume, blkid, false)
                    .await?
                    .map(mutable_copy)
                    .unwrap_or_else(|| AlignedBuf::zeroed(block));
                merged[within..within + data.len()].copy_from_slice(&data);
                volume.count(|stats| stats.rmw_write_ops += 1);
                (!is_zero(&merged)).then(|| BufSlice::whole(merged.into_shared()))
            }
            BlockContent::PartialZero { within, length } => {
                match self.read_block(volume, blkid, false).await? {
                    None => None,
                    Some(old) => {
                        let mut merged = mutable_copy(old);
                        merged[within..within + length].fill(0);
                        (!is_zero(&merged)).then(|| BufSlice::whole(merged.into_shared()))
                    }
                }
            }
        };
        if let Some(data) = &data {
            if hold && self.hold_dirty(volume, blkid, data.clone()) {
                return Ok(());
            }
        }
        self.store_block(volume, blkid, data, Default::default(), IoClass::SyncWrite)
            .await
    }

    /// Writes `data` (None: zeros, a hole) as block `blkid` and links it, in
    /// I/O class `class`; its dirty copy, if any, is dropped as it is linked.
    /// `prepared` is what was computed from `data` earlier (its checksum and
    /// the store's preparation), used when the block is stored uncompressed (the checksum only
    /// with that algorithm). The caller holds the block's lock.
    pub(crate) async fn store_block(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        data: Option<BufSlice>,
        prepared: crate::pool::volume::writeback::Prepared,
        class: IoClass,
    ) -> Result<(), PoolError> {
        let pointer = match data {
            None => {
                volume.count(|stats| stats.zero_blocks += 1);
                BlockPointer::hole(0, ObjectType::VolumeData, 0)
            }
            Some(data) => {
                let block = volume.new_block(data, prepared);
                let pointer =
                    crate::pool::data::write_block(self, volume.block_format(), block, class)
                        .await?;
                volume.count_stored(&pointer);
                pointer
            }
        };
        self.link_block(volume, blkid, pointer, false).await
    }

    /// Writes and links several blocks (the caller holds their locks), each
    /// as `store_block` would, but together, through the one write pipeline
    /// of data blocks ([`crate::pool::data::write_blocks`]: compressed
    /// concurrently, allocated in order, written as one run), then linked
    /// concurrently (a link may wait for a tree node to be read). Returns
    /// each block's result, in order. `writes_out`: the blocks are the
    /// write-back's dirty copies (see [`Pool::link_block`]).
    pub(crate) async fn store_blocks(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blocks: Vec<(u64, BufSlice, crate::pool::volume::writeback::Prepared)>,
        class: IoClass,
        writes_out: bool,
    ) -> Vec<Result<(), PoolError>> {
        let (blkids, new): (Vec<u64>, Vec<_>) = blocks
            .into_iter()
            .map(|(blkid, data, prepared)| (blkid, volume.new_block(data, prepared)))
            .unzip();
        let written =
            crate::pool::data::write_blocks(self, volume.block_format(), new, class).await;
        let links = blkids
            .into_iter()
            .zip(written)
            .map(|(blkid, written)| async move {
                let pointer = written?;
                volume.count_stored(&pointer);
                self.link_block(volume, blkid, pointer, writes_out).await
            });
        futures_util::future::join_all(links.collect::<Vec<_>>()).await
    }

    /// Links a written block (or a hole) into the volume's tree, in the txg
    /// open at that moment: loads the path, changes the tree, logs the
    /// allocation and frees the block it replaces, all in one step. Drops the
    /// block's dirty copy. On failure the new block's space is released. The
    /// caller holds the block's lock.
    ///
    /// `writes_out`: `pointer` holds the bytes of the block's dirty copy (the
    /// write-back writing it out). If a log commit copied those bytes, the
    /// link needs no record of its own. Any other link (new bytes written
    /// through over a held block, replay) is a newer change than a copy in
    /// the log, and is noted for the next commit like any link (found by
    /// ironpool-sim seed 5, mirror3: a FUA write too large to copy, written
    /// through over a block whose earlier bytes a commit had copied, was
    /// answered without a record, and a crash brought the copy back).
    pub(crate) async fn link_block(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        mut pointer: BlockPointer,
        writes_out: bool,
    ) -> Result<(), PoolError> {
        crate::pool::data::prepare_link(self, &self.objects, &volume.object, blkid, &pointer)
            .await?;
        if pointer.is_hole()
            && self
                .objects
                .block_pointer_cached(&volume.object, blkid)?
                .is_hole()
        {
            // Zeros over a hole: nothing changes in the tree. If the held
            // bytes this replaces were copied into the intent log, the next
            // commit records the hole after them.
            if let Some(forgotten) = self.forget_dirty(volume, blkid) {
                let txg = self.txg.open();
                volume.log.resolve_copies(&forgotten.log_commits, txg);
                volume.log.note_superseded(volume.object.id, blkid, txg);
                if !forgotten.log_commits.is_empty() {
                    volume.log.note_linked(volume.object.id, blkid, txg);
                }
            }
            return Ok(());
        }
        pointer.birth_txg = self.txg.open();
        crate::pool::data::link(
            self,
            &self.objects,
            &volume.object,
            &volume.object,
            blkid,
            pointer,
        )?;
        // Bytes the intent log holds a copy of need no record of their link;
        // the log's copies are freed once this link is durable.
        let forgotten = self.forget_dirty(volume, blkid);
        let logged = writes_out && forgotten.as_ref().is_some_and(|forgotten| forgotten.logged);
        if let Some(forgotten) = forgotten {
            volume
                .log
                .resolve_copies(&forgotten.log_commits, pointer.birth_txg);
        }
        if !logged {
            volume
                .log
                .note_superseded(volume.object.id, blkid, pointer.birth_txg);
            volume
                .log
                .note_linked(volume.object.id, blkid, pointer.birth_txg);
        }
        Ok(())
    }

    /// [`Pool::admit_to_dataset`] of `blocks` blocks of `block_bytes` to
    /// `volume`, waiting for space on its way back when the room the other
    /// datasets' reservations leave is short, as the pool claim after it
    /// waits ([`Pool::retry_while_space_returns`]). Without the wait, a
    /// pool whose free space was in frees still waiting for their txgs
    /// (844 MB of them on a 3 GiB pool, measured, with two thick volumes
    /// overwritten at once at 1 MiB QD16) refused overwrites with ENOSPC
    /// although the pool was a third free. The wait counts the others'
    /// reservations in the room it needs, so a write that even every free
    /// on its way would not let past them is refused at once, as before.
    /// The caller holds no lock a commit takes (a writer permit at most).
    async fn admit_volume_blocks<'a>(
        self: &Rc<Self>,
        volume: &'a Volume,
        blocks: u64,
        block_bytes: u64,
    ) -> Result<crate::pool::dataset::quota::Admitted<'a>, PoolError> {
        let needed = self
            .held_space_bytes(block_bytes)
            .saturating_mul(blocks)
            .saturating_add(self.reserved_elsewhere(Owner::Volume(volume)));
        self.retry_while_space_returns(
            needed,
            |error| matches!(error, PoolError::NoSpace),
            || self.admit_to_dataset(Owner::Volume(volume), blocks, block_bytes),
        )
        .await
    }

    /// Allocates a data block. When the pool is full but frees are waiting for
    /// their txgs, commits (up to the defer depth) so they become usable, and
    /// waits for the discards of free space in flight (autotrim holds what a
    /// commit released until its discard ends), rather than failing a write
    /// that will fit a moment later.
    pub(crate) async fn allocate_data(
        self: &Rc<Self>,
        bytes: u64,
    ) -> Result<[crate::format::Dva; crate::format::bp::DVA_COUNT], PoolError> {
        let mut commits = 0;
        crate::pool::dirty::update_metadata_reserve(self);
        loop {
            match self.store.allocate(bytes, false, 1) {
                Ok(dvas) => return Ok(dvas),
                Err(_) => {
                    let (waiting, trimming) = {
                        let allocator = self.store.allocator.borrow();
                        (allocator.deferred_bytes(), allocator.trimming_bytes())
                    };
                    if trimming > 0 {
                        // Discards end in device time; each gives its space back.
                        self.trim_ended().await;
                        continue;
                    }
                    if waiting < bytes || commits > crate::alloc::DEFER_TXGS {
                        return Err(PoolError::NoSpace);
                    }
                    commits += 1;
                    self.txg.wait_durable(self, self.txg.open()).await?;
                }
            }
        }
    }

    /// Counts a client flush on the volume's statistics.
    pub fn count_flush(&self, volume: &Volume) {
        volume.count(|stats| stats.flush_ops += 1);
    }

    /// A client's flush of `volume`: everything acknowledged becomes durable
    /// (at once with `sync=disabled`, which leaves that to the write-back and
    /// the next commit).
    pub async fn flush_volume(self: &Rc<Self>, volume: &Rc<Volume>) -> Result<(), PoolError> {
        self.count_flush(volume);
        volume.log.note_flush_arrived(0);
        if volume.settings().sync == SyncMode::Disabled {
            return Ok(());
        }
        self.log_commit(volume, true).await
    }

    /// Waits until no write to `volume` is in progress, writes out its dirty
    /// blocks, and keeps writes out while the permit is held: for operations
    /// that change or read the volume's whole tree (rollback, receive, destroy).
    pub async fn exclusive(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
    ) -> Result<crate::rt::sync::Permit, PoolError> {
        let permit = volume.exclusive_writers().await;
        self.drain_volume(volume).await?;
        Ok(permit)
    }
}

/// A block's bytes to change: the buffer itself when nothing else holds it (a
/// block just read), else a copy (a dirty block, which readers may hold).
fn mutable_copy(data: BufSlice) -> AlignedBuf {
    let (buffer, range) = data.into_owned();
    if range == (0..buffer.len()) {
        buffer
    } else {
        AlignedBuf::copy_from(&buffer[range])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thick_volume_reserves_its_data_and_indirect_blocks() {
        // 1 GiB of 16K blocks: 65536 pointers in 256 indirect blocks of
        // 32K, under one more; each in two copies.
        assert_eq!(
            thick_reservation(1 << 30, 16 << 10),
            (1 << 30) + 257 * 2 * (32 << 10)
        );
        // One block needs no indirect block.
        assert_eq!(thick_reservation(16 << 10, 16 << 10), 16 << 10);
        assert!(thick_reservation(VOLUME_SIZE_MAX_BYTES, 4096) > VOLUME_SIZE_MAX_BYTES);
    }
}
