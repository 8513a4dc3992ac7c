//! A file's data: reads, writes (through the one write pipeline of data
//! blocks, `pool::data`), a file's one block growing, links of written
//! blocks and truncation.

use std::rc::Rc;

use super::behind::HeldBlock;
use super::id_space::IdAdmitted;
use super::{
    behind, block_pieces, block_shift_for, concat, now, object_state, write_end, Filesystem,
    FsError, FREE_BLOCKS_PER_TURN, RELATIME_SECONDS,
};
use crate::cache::CacheUse;
use crate::format::znode::Znode;
use crate::format::{BlockPointer, Dnode, ObjectType};
use crate::object::Object;
use crate::pool::data::{is_zero, release_unlinked, Linked, BLOCKS_IN_FLIGHT_PER_REQUEST};
use crate::pool::dataset::props::{DirectMode, LogBias};
use crate::pool::dataset::quota::Admitted;
use crate::pool::Owner;
use crate::pool::Pool;
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};

/// Zeros `fallocate` writes per turn when it punches or zeroes a range: a
/// FUSE write's largest size, so a punch of any length holds at most this
/// much memory and the files' other requests interleave with it.
const FALLOCATE_ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Records `lseek` looks at between turns of the engine's loop: about a
/// millisecond of cached tree walks, so other requests wait no longer.
const SEEK_RECORDS_PER_TURN: u64 = 1024;

impl Filesystem {
    /// Reads up to `length` bytes at `offset` of file `ino` (fewer at its
    /// end). A `direct` read (`O_DIRECT`, unless the filesystem's `direct`
    /// property is `disabled`) keeps nothing in the read cache and takes a
    /// block from it only when it is there, as OpenZFS 2.3's direct reads
    /// copy out cached blocks: data another reader brought in costs no
    /// device read. With `direct=always` every read goes to the devices and
    /// keeps nothing. The cache stays coherent: it is keyed by block
    /// pointer, and a block rewritten is a new block.
    pub async fn read(
        &self,
        pool: &Pool,
        ino: u64,
        offset: u64,
        length: usize,
        direct: bool,
    ) -> Result<Vec<u8>, FsError> {
        let pieces = self.read_pieces(pool, ino, offset, length, direct).await?;
        Ok(concat(&pieces))
    }

    /// [`Filesystem::read`] as the pieces of the blocks it read, in order
    /// (holes as zeroed buffers), not copied into one: FUSE writes them to
    /// the kernel as they are. The blocks are shared and never changed in
    /// place (a write makes new ones), so the pieces hold what was read.
    pub async fn read_pieces(
        &self,
        pool: &Pool,
        ino: u64,
        offset: u64,
        length: usize,
        direct: bool,
    ) -> Result<Vec<BufSlice>, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        let size = object.length_bytes();
        if length == 0 || offset >= size {
            return Ok(Vec::new());
        }
        let _blocks = loop {
            let block = object.data_block_bytes();
            let last = (offset + length as u64 - 1).min(size - 1) / block;
            let guard = self.files.blocks(ino, offset / block..=last).await;
            // The file's block grew while this waited: lock anew.
            if object.data_block_bytes() == block {
                break guard;
            }
        };
        let settings = self.settings.get();
        let (usage, direct) = match settings.direct {
            DirectMode::Always => (CacheUse::data(false, false), true),
            DirectMode::Standard if direct => (CacheUse::data(true, false), true),
            _ => (settings.data_cache_use(), false),
        };
        let data = self
            .read_locked_pieces(&object, offset, length, usage)
            .await?;
        self.touch_atime(pool, &object);
        self.count(|stats| {
            stats.read_ops += 1;
            stats.read_bytes += data.iter().map(|piece| piece.len() as u64).sum::<u64>();
            stats.direct_read_ops += u64::from(direct);
        });
        Ok(data)
    }

    /// `fallocate(2)` in the modes OpenZFS offers: `PUNCH_HOLE` (with
    /// `KEEP_SIZE`, as Linux requires) and `ZERO_RANGE` write zeros over
    /// the range, so whole records become holes and give their space back
    /// (partial ones keep zeros), through the same write path as any write
    /// (durable at the next `fsync`, in snapshots as written); `ZERO_RANGE`
    /// without `KEEP_SIZE` may grow the file. Mode 0 and `KEEP_SIZE` alone
    /// reserve nothing (copy-on-write cannot promise where a later write
    /// goes, as OpenZFS says): they check that the pool has `length` bytes
    /// free for data (else ENOSPC) and mode 0 grows the file to the end of
    /// the range. Other modes get EOPNOTSUPP.
    pub async fn fallocate(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> Result<(), FsError> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE as u32 != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE as u32 != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE as u32 != 0;
        let known = (libc::FALLOC_FL_KEEP_SIZE
            | libc::FALLOC_FL_PUNCH_HOLE
            | libc::FALLOC_FL_ZERO_RANGE) as u32;
        if mode & !known != 0 || (punch && zero) {
            return Err(FsError::Unsupported(format!("fallocate mode {mode:#x}")));
        }
        if punch && !keep_size {
            return Err(FsError::Invalid("a punched hole keeps the size".into()));
        }
        if length == 0 {
            return Err(FsError::Invalid("fallocate of 0 bytes".into()));
        }
        let end = write_end(offset, length.min(usize::MAX as u64) as usize)?;
        let (object, znode) = {
            let _shared = self.lock.acquire(1).await;
            self.load(ino).await?
        };
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        let size = object.length_bytes();
        if punch || zero {
            // Writes held in memory are linked first: the holes skipped
            // below are the tree's, and a held block over one would
            // otherwise survive the punch (and be linked after it).
            self.behind.settle(Some(ino)).await;
            // Past the end there is nothing to zero: the file grows (with
            // holes) below, unless the size is kept.
            let zero_end = end.min(size);
            let zeros = vec![0u8; FALLOCATE_ZERO_CHUNK_BYTES];
            let mut position = offset;
            while position < zero_end {
                let block = object.data_block_bytes();
                if position.is_multiple_of(block) {
                    // Holes already: skipped whole, so the work follows
                    // the data in the range, not its length.
                    let holes = {
                        let _shared = self.lock.acquire(1).await;
                        self.objects.hole_span(&object, position / block).await?
                    };
                    if holes > 0 {
                        position = zero_end.min(
                            (position / block)
                                .saturating_add(holes)
                                .saturating_mul(block),
                        );
                        continue;
                    }
                }
                // From inside a record, to its end first: the turns after
                // start on record boundaries, where holes can be skipped.
                let limit = if position.is_multiple_of(block) {
                    FALLOCATE_ZERO_CHUNK_BYTES as u64
                } else {
                    block - position % block
                };
                let chunk = (zero_end - position).min(limit) as usize;
                self.write_once(pool, ino, position, &zeros[..chunk], None, true)
                    .await?;
                position += chunk as u64;
            }
        } else if pool.data_available_bytes() < length {
            return Err(FsError::NoSpace);
        }
        if !keep_size && end > size {
            let grow = super::SetAttr {
                size: Some(end),
                allocating: true,
                ..super::SetAttr::default()
            };
            self.setattr(pool, ino, grow).await?;
        }
        Ok(())
    }

    /// `lseek(SEEK_DATA)` (`data`) or `lseek(SEEK_HOLE)`: the first offset
    /// at or after `offset` in data, or in a hole. Exact to the record, as
    /// OpenZFS: a record with a write not yet linked is data, a record
    /// written as zeros is a hole (none is stored), and the end of the file
    /// is a hole. None (ENXIO) at or past the end, or for data when none
    /// follows. Records are looked at one by one where data is dense (the
    /// tree's nodes cached as a read would), holes skipped whole.
    pub async fn seek(&self, ino: u64, offset: u64, data: bool) -> Result<Option<u64>, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        let size = object.length_bytes();
        if offset >= size {
            return Ok(None);
        }
        let block = object.data_block_bytes();
        let last = (size - 1) / block;
        // Writes answered and not yet in the tree: data where the tree
        // has holes.
        let held = self.behind.held_blocks(object.id);
        let mut blkid = offset / block;
        let mut looked = 0u64;
        while blkid <= last {
            // Dense data is looked at a record at a time: turn the engine's
            // loop now and then, so a seek through a large file does not
            // hold up every other request.
            looked += 1;
            if looked.is_multiple_of(SEEK_RECORDS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            let next_held = held[held.partition_point(|&held| held < blkid)..]
                .first()
                .copied();
            let holes = if next_held == Some(blkid) {
                0
            } else {
                let span = self.objects.hole_span(&object, blkid).await?;
                // A hole up to the next held block at most.
                next_held.map_or(span, |next| span.min(next - blkid))
            };
            if data == (holes == 0) {
                return Ok(Some(offset.max(blkid * block)));
            }
            blkid = blkid.saturating_add(holes.max(1));
        }
        Ok((!data).then_some(size))
    }

    /// A read of `object` updates its access time when `atime=on`, by
    /// relatime's rule (Linux's default): only when the access time is not
    /// after the last change or modification, or is a day old, so that a
    /// file read over and over costs one attribute write a day, not one per
    /// read. A read-only filesystem or pool keeps its times.
    fn touch_atime(&self, pool: &Pool, object: &Object) {
        if !self.atime.get() || self.check_writable(pool).is_err() {
            return;
        }
        // Decoded and saved with no await between: a write's or another
        // read's change to the attributes meanwhile is kept.
        let Ok(mut znode) = Znode::decode(&object.dnode().bonus) else {
            return;
        };
        let time = now();
        if znode.atime > znode.mtime
            && znode.atime > znode.ctime
            && time.seconds.saturating_sub(znode.atime.seconds) < RELATIME_SECONDS
        {
            return;
        }
        znode.atime = time;
        Self::save(object, &znode);
    }

    pub(super) async fn read_locked(
        &self,
        object: &Rc<Object>,
        offset: u64,
        length: usize,
        usage: CacheUse,
    ) -> Result<Vec<u8>, FsError> {
        let pieces = self
            .read_locked_pieces(object, offset, length, usage)
            .await?;
        Ok(concat(&pieces))
    }

    /// [`Filesystem::read_locked`] as the pieces of the blocks read.
    async fn read_locked_pieces(
        &self,
        object: &Rc<Object>,
        offset: u64,
        length: usize,
        usage: CacheUse,
    ) -> Result<Vec<BufSlice>, FsError> {
        let size = object.length_bytes();
        if offset >= size {
            return Ok(Vec::new());
        }
        let end = (offset + length as u64).min(size);
        let block = object.data_block_bytes();
        // The request's blocks are read many at once (as its writes are
        // written: see `write_locked`), then copied out in order.
        let blkids: Vec<u64> = (offset / block..=(end - 1) / block).collect();
        let mut reads = Vec::with_capacity(blkids.len());
        for batch in blkids.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            reads.extend(
                futures_util::future::join_all(
                    batch
                        .iter()
                        .map(|blkid| self.read_block(object, *blkid, usage)),
                )
                .await,
            );
        }
        let mut out = Vec::with_capacity(reads.len());
        let mut position = offset;
        for read in reads {
            let within = (position % block) as usize;
            let chunk = ((block - within as u64).min(end - position)) as usize;
            match read? {
                Some(data) => out.push(data.slice(within..within + chunk)),
                None => {
                    self.count(|stats| stats.hole_read_ops += 1);
                    out.push(BufSlice::whole(AlignedBuf::zeroed(chunk).into_shared()));
                }
            }
            position += chunk as u64;
        }
        Ok(out)
    }

    /// One whole data block (None: a hole).
    async fn read_block(
        &self,
        object: &Object,
        blkid: u64,
        usage: CacheUse,
    ) -> Result<Option<BufSlice>, FsError> {
        // A buffered write's newest version, not yet linked: whole, or
        // the parts written over the block in the tree.
        match self.behind.lookup(object.id, blkid) {
            Some(HeldBlock {
                bytes, parts: None, ..
            }) => Ok(Some(bytes)),
            Some(HeldBlock {
                bytes,
                parts: Some(parts),
                ..
            }) => {
                let old = self.read_linked_block(object, blkid, usage).await?;
                Ok(Some(behind::merged(old.as_deref(), &bytes, &parts)))
            }
            None => self.read_linked_block(object, blkid, usage).await,
        }
    }

    /// One whole data block as the tree has it (None: a hole).
    pub(super) async fn read_linked_block(
        &self,
        object: &Object,
        blkid: u64,
        usage: CacheUse,
    ) -> Result<Option<BufSlice>, FsError> {
        let name = format_args!("{} object {}", self.name(), object.id);
        let key = self.data_key()?;
        let read = crate::pool::data::read_linked(
            &self.objects,
            object,
            blkid,
            usage,
            || None,
            key.as_deref(),
            &name,
        )
        .await?;
        Ok(match read {
            Linked::Hole => None,
            Linked::Held(data) | Linked::Read { data, .. } => Some(data),
        })
    }

    /// Writes `data` at `offset` of file `ino`; returns the bytes written.
    /// A write that finds no room while space is being freed (a large file
    /// was just removed) waits for the frees to come back and tries again,
    /// as OpenZFS's writers wait for the syncing txg, rather than failing
    /// with ENOSPC for the few txgs the frees take.
    pub async fn write(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        self.write_lent(pool, ino, offset, data, None).await
    }

    /// [`Filesystem::write`] of bytes that lie in `lent`, an aligned buffer
    /// the front end read them into (a FUSE WRITE's payload lands on a
    /// 4 KiB boundary): the whole blocks of the write are written from it
    /// without a copy. The buffer is held only until the write returns.
    pub async fn write_lent(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
    ) -> Result<usize, FsError> {
        pool.retry_while_space_returns(
            data.len() as u64,
            |error: &FsError| error.errno() == libc::ENOSPC,
            || self.write_once(pool, ino, offset, data, lent, false),
        )
        .await
    }

    /// [`Filesystem::write`] without the wait for freed space. `zeros`:
    /// `data` is all zeros (`fallocate`), so the records it covers whole
    /// become holes and need no space: only the partial ones at its ends
    /// are claimed, and a punch on a full pool gives space back.
    async fn write_once(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
        zeros: bool,
    ) -> Result<usize, FsError> {
        self.log.note_write_arrived();
        let (_shared, object) = self.begin_write(pool, ino).await?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = write_end(offset, data.len())?;
        // All or nothing, and never into the space held writes will take:
        // the whole records it touches (a part of one is written as a new
        // whole record). `Filesystem::write` waits for frees and retries,
        // as a commit must not wait for this write's locks.
        let block = object.data_block_bytes();
        let records = (end - 1) / block - offset / block + 1;
        let claim = if zeros {
            let partial =
                u64::from(!offset.is_multiple_of(block)) + u64::from(!end.is_multiple_of(block));
            partial.min(records) * block
        } else {
            (records * block).max(data.len() as u64)
        };
        // Its quotas and the others' reservations: the blocks it stores
        // (fallocate's zeros: only the partial records at its ends).
        let shape = match zeros {
            true => (claim / block, block),
            false => self.written_shape(&object.dnode(), offset, end),
        };
        let _admitted = self.admit_write(pool, &object, shape).await?;
        let _space = pool.try_claim_space(claim)?;
        let (_file, blocks) = loop {
            let dnode = object.dnode();
            let block = dnode.data_block_bytes();
            if self.grows(&dnode, end) {
                break (self.files.whole(ino).await, None);
            }
            let blocks = offset / block..=(end - 1) / block;
            let guard = self.files.blocks(ino, blocks.clone()).await;
            let now = object.dnode();
            if now.data_block_bytes() == block && !self.grows(&now, end) {
                break (guard, Some(blocks));
            }
        };
        // Versions written behind before this are linked first.
        self.behind.settle_blocks(ino, blocks).await;
        self.write_locked(pool, &object, offset, data, lent).await?;
        self.behind.wrote_through();
        self.count(|stats| {
            stats.write_ops += 1;
            stats.write_bytes += data.len() as u64;
            stats.through_write_ops += 1;
        });
        self.stamp_write(pool, &object)?;
        Ok(data.len())
    }

    /// What every write does first: waits under the dirty metadata limit
    /// (for a commit past it, before taking any lock a commit could need),
    /// takes the filesystem's lock shared and loads file `ino`.
    pub(super) async fn begin_write(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
    ) -> Result<(crate::rt::sync::Permit, Rc<Object>), FsError> {
        pool.txg.throttle(pool).await;
        let shared = self.lock.acquire(1).await;
        self.check_writable(pool)?;
        let (object, znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::IsDir);
        }
        Ok((shared, object))
    }

    async fn write_locked(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        offset: u64,
        data: &[u8],
        lent: Option<&BufSlice>,
    ) -> Result<(), FsError> {
        let end = write_end(offset, data.len())?;
        self.grow_block(pool, object, end).await?;
        let block = object.data_block_bytes();
        // A whole block is the request's own bytes, not a copy of them:
        // written from the buffer `lent` when they lie in it, else copied
        // once, into the buffer the devices write.
        let mut blocks: Vec<(u64, std::borrow::Cow<'_, [u8]>)> = Vec::new();
        for (blkid, within, source) in block_pieces(offset, data, block) {
            let chunk = source.len();
            if chunk as u64 == block {
                blocks.push((blkid, std::borrow::Cow::Borrowed(source)));
                continue;
            }
            self.count(|stats| stats.rmw_write_ops += 1);
            let mut old = match self
                .read_block(object, blkid, self.settings.get().data_cache_use())
                .await?
            {
                Some(old) => old.to_vec(),
                None => vec![0u8; block as usize],
            };
            old.resize(block as usize, 0);
            old[within..within + chunk].copy_from_slice(source);
            blocks.push((blkid, std::borrow::Cow::Owned(old)));
        }
        let slices: Vec<(u64, &[u8])> = blocks
            .iter()
            .map(|(blkid, bytes)| (*blkid, bytes.as_ref()))
            .collect();
        // A client waits for it: not the class of write-back, whose slots
        // follow the dirty data (four per device while little is dirty).
        self.store_blocks(
            pool,
            object,
            &slices,
            ObjectType::FsFile,
            lent,
            IoClass::SyncWrite,
        )
        .await?;
        let mut dnode = object.dnode.borrow_mut();
        if end > dnode.length_bytes {
            dnode.length_bytes = end;
        }
        drop(dnode);
        object.dirty.set(true);
        Ok(())
    }

    /// Writes `blocks` (block number, whole block's bytes) of `object`, of
    /// `object_type`, to new space through the write pipeline of data
    /// blocks, up to [`BLOCKS_IN_FLIGHT_PER_REQUEST`] as one run (one
    /// request of 1 MiB is 8 blocks of 128 KiB: neighbours on a device
    /// become one queue request), then links them in order. Blocks of zeros
    /// are holes. A block whose bytes lie in `lent` (an aligned buffer the
    /// front end read them into) is written from it, others are copied.
    /// A failure lets go of the blocks written and not linked. `class`:
    /// [`IoClass::SyncWrite`] where a client waits for the write (a direct
    /// or synchronous one, or one written through), as for a volume's writes
    /// through; [`IoClass::AsyncWrite`] for a `receive`'s blocks, as for a
    /// volume's.
    pub(super) async fn store_blocks(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blocks: &[(u64, &[u8])],
        object_type: ObjectType,
        lent: Option<&BufSlice>,
        class: IoClass,
    ) -> Result<(), FsError> {
        let mut pointers = Vec::with_capacity(blocks.len());
        let mut failure = None;
        for batch in blocks.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            let zero: Vec<bool> = batch.iter().map(|(_, bytes)| is_zero(bytes)).collect();
            let new = batch
                .iter()
                .zip(&zero)
                .filter(|(_, zero)| !**zero)
                .map(
                    |((_, bytes), _)| match lent.and_then(|lent| lent.slice_holding(bytes)) {
                        Some(bytes) => crate::pool::data::NewBlock::of(pool, bytes),
                        None => crate::pool::data::NewBlock::copied(pool, bytes),
                    },
                )
                .collect();
            let format = self.block_format(object_type);
            let mut written = crate::pool::data::write_blocks_gathered(pool, format, new, class)
                .await
                .into_iter();
            for zero in zero {
                let result = if zero {
                    Ok(BlockPointer::hole(0, object_type, 0))
                } else {
                    written.next().expect("a result per block written")
                };
                match result {
                    Ok(pointer) => pointers.push(pointer),
                    Err(error) => {
                        failure.get_or_insert(FsError::from(error));
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(error) = failure {
            for pointer in &pointers {
                release_unlinked(pool, pointer);
            }
            return Err(error);
        }
        // A file's small blocks are kept for the next fsync to copy into the
        // log (logbias=latency), as OpenZFS copies small synchronous writes.
        let copy =
            object_type == ObjectType::FsFile && self.settings.get().log_bias == LogBias::Latency;
        let mut pointers = pointers.into_iter();
        for (blkid, bytes) in blocks {
            let pointer = pointers.next().expect("a pointer per block");
            let linked = match self.link_block(pool, object, *blkid, pointer).await {
                Ok(linked) => linked,
                Err(error) => {
                    // (link_block let go of its own block.)
                    for pointer in pointers {
                        release_unlinked(pool, &pointer);
                    }
                    return Err(error);
                }
            };
            self.log
                .note_written(object.id, *blkid, &linked, copy.then_some(*bytes));
        }
        Ok(())
    }

    /// The blocks a write of `offset..end` will store, and their size, for
    /// its admission by quotas: the records it touches, or, for a file of
    /// one block that grows, its block at the new size (one block up to
    /// the record size; past it, every record up to `end`).
    pub(super) fn written_shape(&self, dnode: &Dnode, offset: u64, end: u64) -> (u64, u64) {
        if self.grows(dnode, end) {
            let record = 1u64 << self.record_shift.get();
            if end <= record {
                return (1, 1u64 << super::block_shift_for(end));
            }
            return ((end - 1) / record + 1, record);
        }
        let block = dnode.data_block_bytes();
        ((end - 1) / block - offset / block + 1, block)
    }

    /// Admits a write of `shape` (blocks, and their size) to file `object`:
    /// its filesystem's quotas and the other datasets' reservations, then
    /// its owner's and group's quotas. The caller holds the lock shared and
    /// keeps the guards until the blocks are linked or held.
    pub(super) async fn admit_write<'a>(
        &'a self,
        pool: &Rc<Pool>,
        object: &Object,
        (blocks, size): (u64, u64),
    ) -> Result<(Admitted<'a>, IdAdmitted<'a>), FsError> {
        let admitted = pool
            .admit_to_dataset(Owner::Filesystem(self), blocks, size)
            .await?;
        let owners = self.admit_to_owners(object, admitted.bytes()).await?;
        Ok((admitted, owners))
    }

    /// Whether a write ending at `end` makes the file's one block larger.
    pub(super) fn grows(&self, dnode: &Dnode, end: u64) -> bool {
        dnode.levels == 1
            && dnode.data_block_shift < self.record_shift.get()
            && end > dnode.data_block_bytes()
    }

    /// A file of one block whose data will end at `end` past that block
    /// gets a larger block (up to the record size): its block is rewritten
    /// at the new size, and the tree switched to it in one step.
    async fn grow_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        end: u64,
    ) -> Result<(), FsError> {
        let dnode = object.dnode();
        if dnode.levels != 1
            || dnode.data_block_shift >= self.record_shift.get()
            || end <= dnode.data_block_bytes()
        {
            return Ok(());
        }
        let shift = block_shift_for(end).min(self.record_shift.get());
        let old = self
            .read_block(object, 0, self.settings.get().data_cache_use())
            .await?;
        let pointer = match old {
            Some(old) => {
                let mut bytes = old.to_vec();
                bytes.resize(1 << shift, 0);
                self.write_block(pool, &bytes, ObjectType::FsFile).await?
            }
            None => BlockPointer::hole(0, ObjectType::FsFile, 0),
        };
        // No await from here: the old block is let go and the new one linked
        // in the same txg.
        let current = object.dnode();
        if current.levels != 1 || current.data_block_shift != dnode.data_block_shift {
            self.objects.store.release(&pointer.dvas);
            return Err(FsError::Corrupt("file changed while its block grew".into()));
        }
        self.replace_only_block(pool, object, shift, current.length_bytes, pointer)?;
        // The log records the new block size in the file's state, and the
        // new block (a hole too: an older record may name the old one).
        let txg = pool.txg.open();
        self.log.note_reshaped();
        if pointer.is_hole() {
            self.log.note_linked(object.id, 0, txg);
        }
        self.note_state(object, txg);
        Ok(())
    }

    /// Notes `object`'s state, as a change of txg `txg` left it, for the
    /// log (one whose attributes do not decode goes through a txg).
    pub(super) fn note_state(&self, object: &Object, txg: u64) {
        match object_state(object) {
            Some(state) => self.log.note_object(object.id, txg, Some(state)),
            None => self.log.note_unloggable(txg),
        }
    }

    /// Makes `pointer` (a written block of `1 << shift` bytes, or a hole)
    /// the one block of `object`, a one-block object, whose length becomes
    /// `length`: the old block is let go and the tree switched in one step,
    /// with no await, so one txg holds the old block or the new one.
    pub(super) fn replace_only_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        shift: u8,
        length: u64,
        pointer: BlockPointer,
    ) -> Result<(), FsError> {
        let mut fresh = object.dnode();
        self.objects.kill(object, &fresh.root);
        fresh.data_block_shift = shift;
        fresh.root = BlockPointer::hole(0, fresh.object_type, 0);
        fresh.length_bytes = length;
        fresh.used_bytes = 0;
        fresh.logical_bytes = 0;
        fresh.physical_bytes = 0;
        self.objects.reset_tree(object, fresh);
        if !pointer.is_hole() {
            self.link_cached(pool, object, 0, pointer)?;
        }
        Ok(())
    }

    /// How the filesystem's blocks of `object_type` are stored now.
    pub(super) fn block_format(&self, object_type: ObjectType) -> crate::pool::data::BlockFormat {
        let settings = self.settings.get();
        crate::pool::data::BlockFormat {
            // An encrypted block's MAC takes the second half of the
            // checksum's place: XXH3-128 fills only the first.
            checksum: match self.key_guid() {
                Some(_) => crate::format::ChecksumAlgo::Xxh3,
                None => settings.checksum,
            },
            compression: settings.compression,
            object_type,
            key: self.key_guid(),
        }
    }

    /// Writes one block's bytes of an object of `object_type` to new space
    /// through the write pipeline of data blocks; a block of zeros is a
    /// hole and writes nothing.
    pub(super) async fn write_block(
        &self,
        pool: &Rc<Pool>,
        bytes: &[u8],
        object_type: ObjectType,
    ) -> Result<BlockPointer, FsError> {
        if is_zero(bytes) {
            return Ok(BlockPointer::hole(0, object_type, 0));
        }
        let block = crate::pool::data::NewBlock::copied(pool, bytes);
        let format = self.block_format(object_type);
        Ok(crate::pool::data::write_block(pool, format, block, IoClass::SyncWrite).await?)
    }

    /// Links a written block (or a hole) as block `blkid` of `object`;
    /// returns it as linked (born in the open txg).
    pub(super) async fn link_block(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<BlockPointer, FsError> {
        crate::pool::data::prepare_link(pool, &self.objects, object, blkid, &pointer).await?;
        self.link_cached(pool, object, blkid, pointer)
    }

    /// [`Filesystem::link_block`] for a block an import claimed (its
    /// space committed: see [`crate::pool::data::Space::Claimed`]), born
    /// again in the open txg and keeping the txg its bytes were written in
    /// as its physical birth, as a clone does. A failure frees it.
    pub(super) async fn link_claimed(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        mut pointer: BlockPointer,
    ) -> Result<BlockPointer, FsError> {
        assert!(!pointer.is_hole(), "a claimed block is written");
        // A hole to prepare with: a failure to load the path must free the
        // claimed block, not let go of an allocation.
        let hole = BlockPointer::hole(0, ObjectType::FsFile, 0);
        if let Err(error) =
            crate::pool::data::prepare_link(pool, &self.objects, object, blkid, &hole).await
        {
            pool.store.free(&pointer);
            return Err(error.into());
        }
        let txg = pool.txg.open();
        let written = pointer.written_txg();
        pointer.birth_txg = txg;
        // The txg its bytes were written in, for a resilver's question of
        // which devices missed them; none when that is this txg's number
        // (a block of the txg open at the crash, replayed before a second
        // commit: the import's claim committed only the first).
        pointer.physical_birth = if written < txg { written } else { 0 };
        crate::pool::data::link_space(
            pool,
            &self.objects,
            object,
            &self.table,
            blkid,
            pointer,
            crate::pool::data::Space::Claimed,
        )?;
        self.log.note_linked(object.id, blkid, txg);
        self.log.note_superseded(object.id, blkid, txg);
        Ok(pointer)
    }

    /// [`Filesystem::link_block`] for a written block of `size` bytes,
    /// unless the file's block size is no longer `size` when the link can
    /// be made (its one block grew in memory meanwhile, see `behind.rs`):
    /// then the block is let go and None returned. No await from the check
    /// to the link. Not noted for the log: the caller, a held version's
    /// write-out, notes it.
    pub(super) async fn link_block_of_size(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: BlockPointer,
        size: u64,
    ) -> Result<Option<BlockPointer>, FsError> {
        crate::pool::data::prepare_link(pool, &self.objects, object, blkid, &pointer).await?;
        if object.data_block_bytes() != size {
            release_unlinked(pool, &pointer);
            return Ok(None);
        }
        self.link_cached_noting(pool, object, blkid, pointer, false)
            .map(Some)
    }

    /// Links `pointer` as block `blkid` of `object` in the open txg (the
    /// caller read the tree's path to it), noted for the log.
    pub(super) fn link_cached(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<BlockPointer, FsError> {
        self.link_cached_noting(pool, object, blkid, pointer, true)
    }

    /// [`Filesystem::link_cached`]; `note`: noted for the log (a held
    /// version's link is noted by its write-out, which knows whether a
    /// commit copied it).
    fn link_cached_noting(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        blkid: u64,
        mut pointer: BlockPointer,
        note: bool,
    ) -> Result<BlockPointer, FsError> {
        // A file's blocks are all of its block size: a block of another
        // size would be read back short or long after a txg wrote it.
        debug_assert!(
            pointer.is_hole()
                || pointer.object_type != ObjectType::FsFile
                || u64::from(pointer.logical_size) == object.data_block_bytes(),
            "{} object {}: a block of {} bytes linked where blocks are {}",
            self.name(),
            object.id,
            pointer.logical_size,
            object.data_block_bytes()
        );
        let txg = pool.txg.open();
        if !pointer.is_hole() {
            pointer.birth_txg = txg;
        }
        crate::pool::data::link(pool, &self.objects, object, &self.table, blkid, pointer)?;
        // An xattr object's block is logged as its owner's whole list.
        if note && object.object_type() != ObjectType::FsXattr {
            self.log.note_linked(object.id, blkid, txg);
            // Newer than any copy of the block's held bytes in the log (a
            // write through waits for them to be linked first).
            self.log.note_superseded(object.id, blkid, txg);
        }
        Ok(pointer)
    }

    /// Frees the blocks of file `ino` past `size` before a truncate to it
    /// takes the filesystem's lock exclusively, as OpenZFS frees a range
    /// before it sets the size: a slice ([`Filesystem::punch_slice`]) at a
    /// time, each under the lock shared, the file's whole-file lock and
    /// builds held off, all let go between slices. So the filesystem's
    /// other files are served while a large file is cut (a 3 GiB file of
    /// 16K records held them 175 ms), and the truncate's own step finds
    /// holes, passed whole, and frees only what was written meanwhile. A
    /// range of one slice or less is left to that step. A crash part way
    /// leaves the file its old size with holes where blocks were freed:
    /// the truncate had not returned.
    pub(super) async fn free_ahead_of_truncate(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        size: u64,
    ) -> Result<(), FsError> {
        // Blocks from `first` to this are holes already.
        let mut next = 0;
        loop {
            pool.txg.throttle(pool).await;
            let shared = self.lock.acquire(1).await;
            if self.is_retired() || self.check_writable(pool).is_err() {
                return Ok(());
            }
            let (object, znode) = match self.load(ino).await {
                Ok(loaded) => loaded,
                Err(FsError::NotFound) => return Ok(()),
                Err(error) => return Err(error),
            };
            if !znode.is_regular() {
                // The truncate's own step says why it cannot be cut.
                return Ok(());
            }
            let file = self.files.whole(ino).await;
            let hold = pool.txg.hold_builds();
            let dnode = object.dnode();
            let block = dnode.data_block_bytes();
            let first = size.div_ceil(block);
            let end = dnode.length_bytes.div_ceil(block);
            if next == 0 && end.saturating_sub(first) <= FREE_BLOCKS_PER_TURN {
                return Ok(());
            }
            next = next.max(first);
            if next >= end {
                return Ok(());
            }
            next = self.punch_slice(pool, &object, next, end).await?;
            drop((hold, file, shared));
            pool.spill_dead(&self.table);
            crate::rt::yield_now().await;
        }
    }

    /// Cuts or extends `object` to `size` bytes. Blocks past the end become
    /// holes; the kept part of the last block past the end is zeroed, so an
    /// extension reads zeros.
    pub(super) async fn truncate(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        size: u64,
    ) -> Result<(), FsError> {
        let old_size = object.length_bytes();
        if size < old_size {
            let block = object.data_block_bytes();
            let within = size % block;
            if within != 0 {
                let blkid = size / block;
                if let Some(old) = self
                    .read_block(object, blkid, self.settings.get().data_cache_use())
                    .await?
                {
                    let mut bytes = old.to_vec();
                    bytes[within as usize..].fill(0);
                    let pointer = self.write_block(pool, &bytes, ObjectType::FsFile).await?;
                    self.link_block(pool, object, blkid, pointer).await?;
                }
            }
            self.punch_range(pool, object, size.div_ceil(block), old_size.div_ceil(block))
                .await?;
        }
        object.dnode.borrow_mut().length_bytes = size;
        object.dirty.set(true);
        Ok(())
    }
}
