//! The write pipeline of data blocks, one for every object of every dataset:
//! a volume's blocks, a file's, a symbolic link's and an extended
//! attribute's go through the same steps, so a rule about how a block is
//! stored (its checksum, its compression, where it goes, how neighbours
//! become one device request) is written once.
//!
//! The steps, for a batch of blocks that belong together (one request's, or
//! one write-out's):
//! 1. compress each block, concurrently (the work runs on worker threads);
//! 2. checksum each and allocate its space, in block order with nothing in
//!    between, so consecutive blocks get consecutive space where the free
//!    space has it;
//! 3. write them as one run ([`crate::block::BlockStore::write_run`]): the
//!    pieces that follow each other on a device become one queue request.
//!
//! A written block is linked into its object's tree by [`link`] (after
//! [`prepare_link`] loaded its path), and a linked block read back by
//! [`read_linked`], for any object alike; the caller keeps what only it
//! knows: the object's locks, the dirty copies it holds, and what the intent
//! log needs. A block whose write failed has its space let go here; a
//! caller that cannot link a written block lets go of it itself
//! ([`release_unlinked`]).

use std::rc::Rc;

use crate::block::compress::CompressionSetting;
use crate::block::{BlockError, StorePrep};
use crate::cache::CacheUse;
use crate::crypto::{block_aad, CRYPT_OFFLOAD_MIN_BYTES};
use crate::format::bp::Compression;
use crate::format::checksum::{Checksum, ChecksumAlgo};
use crate::format::{BlockPointer, ObjectType};
use crate::object::{Object, ObjectSet};
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};

/// Blocks of one request processed at once: bounds the tasks and memory a single
/// large request (up to 32 MiB) holds, while keeping many I/Os in flight. A
/// filesystem's reads and writes (up to 1 MiB) use it too.
pub(crate) const BLOCKS_IN_FLIGHT_PER_REQUEST: usize = 64;

/// Reads of a block that failed on every copy, tried again when its
/// pointer changed meanwhile: the block was rewritten and its old space
/// freed and reused while the read was in flight, which is a race, not a
/// damaged block. A few are plenty: each retry follows a new write.
const READ_RETRIES: usize = 3;

/// True when every byte is zero (fast on random data: stops at the first non-zero).
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    let (head, words, tail) = unsafe {
        // SAFETY: u128 has no invalid bit patterns; align_to only reinterprets
        // the aligned middle of the slice.
        bytes.align_to::<u128>()
    };
    head.iter().all(|byte| *byte == 0)
        && words.iter().all(|word| *word == 0)
        && tail.iter().all(|byte| *byte == 0)
}

/// How the blocks of one batch are stored: what their pointers say.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct BlockFormat {
    pub checksum: ChecksumAlgo,
    pub compression: CompressionSetting,
    pub object_type: ObjectType,
    /// The key guid blocks are sealed under (an encrypted dataset's), after
    /// compression and before the checksum, which covers the ciphertext so
    /// that scrub and resilver need no key.
    pub key: Option<u64>,
}

/// Seals `physical` bytes of `payload` (a block as it is to be stored,
/// padded to the sector) into a new buffer, out of place: the shared
/// payload may be a write-back's held copy, which stays plaintext. The pad
/// stays zeros.
fn seal_block(
    key: &crate::crypto::DatasetKey,
    payload: &BufSlice,
    physical: usize,
    aad: &[u8],
) -> Result<(BufSlice, crate::format::bp::BlockCrypt), PoolError> {
    let mut sealed = AlignedBuf::for_overwrite(payload.len());
    sealed[physical..].fill(0);
    let crypt = key
        .seal_into(aad, &payload[..physical], &mut sealed[..physical])
        .map_err(|error| PoolError::Io(format!("sealing a block: {error}")))?;
    Ok((BufSlice::whole(sealed.into_shared()), crypt))
}

/// A block of a batch as sealed: its stored bytes, what its pointer
/// records of the sealing, and, when sealed on a worker, the checksum of
/// the stored bytes computed there too.
type SealedBlock = (BufSlice, crate::format::bp::BlockCrypt, Option<Checksum>);

/// Seals the blocks of a batch (`compressed`: each one's bytes as to be
/// stored, the size they hold, their compression; `blocks`: their logical
/// sizes) under `key`, with the associated data of `object_type`'s blocks.
/// The IVs are handed out here, in block order, on the engine thread; a
/// batch of [`CRYPT_OFFLOAD_MIN_BYTES`] and more is then sealed (and its
/// XXH3 checksums computed) on a worker in one handoff.
async fn seal_batch(
    key: &crate::crypto::DatasetKey,
    object_type: ObjectType,
    blocks: &[NewBlock],
    compressed: &[(BufSlice, usize, Compression)],
) -> Vec<Result<SealedBlock, PoolError>> {
    let aads: Vec<[u8; 27]> = blocks
        .iter()
        .zip(compressed)
        .map(|(block, (_, physical, compression))| {
            block_aad(
                object_type,
                0,
                *compression,
                block.logical as u32,
                *physical as u32,
            )
        })
        .collect();
    let total: usize = compressed.iter().map(|(_, physical, _)| *physical).sum();
    if total < CRYPT_OFFLOAD_MIN_BYTES {
        return compressed
            .iter()
            .zip(&aads)
            .map(|((payload, physical, _), aad)| {
                seal_block(key, payload, *physical, aad)
                    .map(|(sealed, crypt)| (sealed, crypt, None))
            })
            .collect();
    }
    let jobs: Vec<_> = compressed
        .iter()
        .zip(aads)
        .map(|((payload, _, _), aad)| {
            key.sealing_key().map(|(salt, block_key, iv)| {
                (
                    salt,
                    block_key,
                    iv,
                    aad,
                    AlignedBuf::for_overwrite(payload.len()),
                )
            })
        })
        .collect();
    let ranges: Vec<&[u8]> = compressed
        .iter()
        .map(|(payload, physical, _)| &payload[..*physical])
        .collect();
    // SAFETY: `compressed` holds every range and outlives the awaited
    // future, which is not leaked (dropping it waits for the work).
    let sealed = unsafe {
        crate::rt::offload::run_borrowing_many(&ranges, move |ranges| {
            jobs.into_iter()
                .zip(ranges)
                .map(|(job, range)| {
                    let (salt, block_key, iv, aad, mut out) = job?;
                    // Inside the job that received the range (the unsafe
                    // block above covers it).
                    let plaintext = range.bytes();
                    let physical = plaintext.len();
                    out[physical..].fill(0);
                    let crypt = crate::crypto::seal_into_with(
                        &block_key,
                        salt,
                        iv,
                        &aad,
                        plaintext,
                        &mut out[..physical],
                    )?;
                    let checksum = ChecksumAlgo::Xxh3.compute(&out[..physical]);
                    Ok((out, crypt, checksum))
                })
                .collect::<Vec<Result<_, crate::crypto::CryptoError>>>()
        })
    }
    .await;
    sealed
        .into_iter()
        .map(|result| {
            result
                .map(|(out, crypt, checksum)| {
                    (BufSlice::whole(out.into_shared()), crypt, Some(checksum))
                })
                .map_err(|error| PoolError::Io(format!("sealing a block: {error}")))
        })
        .collect()
}

/// The logical bytes of a block `read` (verified by its checksum): opened
/// with `key` when the pointer says it is encrypted and the cache did not
/// hold it opened (its MAC checked; the cache then holds the plaintext,
/// see [`crate::cache::BlockCache::open_entry`]), then decompressed.
/// `name` and `blkid` name it in errors.
pub(crate) async fn logical_bytes(
    store: &crate::block::BlockStore,
    pointer: &BlockPointer,
    read: crate::cache::Cached,
    key: Option<&crate::crypto::DatasetKey>,
    name: &dyn std::fmt::Display,
    blkid: u64,
) -> Result<BufSlice, PoolError> {
    let physical = match &pointer.crypt {
        None => read.data,
        Some(_) if read.opened => read.data,
        Some(crypt) => {
            let Some(key) = key else {
                return Err(PoolError::KeyUnavailable(format!(
                    "{name} block {blkid} is encrypted"
                )));
            };
            let physical = read.data;
            let size = pointer.physical_size as usize;
            // As large a buffer as the one read: the cache's entry is
            // charged that, and keeps its charge when it takes this one.
            let mut opened = AlignedBuf::for_overwrite(physical.buffer_len().max(size).max(1));
            let aad = block_aad(
                pointer.object_type,
                pointer.level,
                pointer.compression,
                pointer.logical_size,
                pointer.physical_size,
            );
            // Opened from the bytes read into a buffer of its own: the read
            // cache may share the ciphertext, and a copy first cost as much
            // as the opening (8% of the server's samples each, 1 MiB reads).
            // With the other opens of this round (`crypto::gather`): on a
            // worker when they add up to CRYPT_OFFLOAD_MIN_BYTES, as one
            // large block does alone.
            let corrupt = |error| PoolError::Corrupt(format!("{name} block {blkid}: {error}"));
            let block_key = key.opening_key(crypt.salt).map_err(corrupt)?;
            // An unload of the key while this open waits drops the opened
            // blocks; this one must not come back after it.
            let epoch = store.cache.opened_epoch();
            let (back, result) = store
                .opens
                .open(block_key, *crypt, aad, physical.slice(0..size), opened)
                .await;
            opened = back;
            result.map_err(corrupt)?;
            opened[size..].fill(0);
            let opened = BufSlice::whole(opened.into_shared()).slice(0..size);
            store.cache.open_entry(pointer, &opened, epoch);
            opened
        }
    };
    if pointer.compression == Compression::Off {
        return Ok(physical);
    }
    let data = crate::block::compress::decompress_offloaded(
        pointer.compression,
        &physical,
        pointer.logical_size as usize,
    )
    .await
    .map_err(|error| PoolError::Corrupt(format!("{name} block {blkid}: {error}")))?;
    Ok(BufSlice::whole(data.into_shared()))
}

/// One block to store.
pub(crate) struct NewBlock {
    /// The buffer the devices write when the block is stored uncompressed:
    /// its logical bytes, then zeros to a whole number of sectors.
    pub payload: BufSlice,
    /// The block's logical size, at most `payload.len()`.
    pub logical: usize,
    /// Its checksum and the store's work, computed when the bytes were
    /// received (they apply only if the block is stored uncompressed).
    pub checksum: Option<(ChecksumAlgo, Checksum)>,
    pub prep: StorePrep,
}

impl NewBlock {
    /// A block of `bytes`, copied once into a buffer the devices can write
    /// (zeros after them to the pool's sector).
    pub fn copied(pool: &Pool, bytes: &[u8]) -> NewBlock {
        let sector = sector_bytes(pool);
        let mut padded = AlignedBuf::for_overwrite(bytes.len().next_multiple_of(sector));
        padded[..bytes.len()].copy_from_slice(bytes);
        padded[bytes.len()..].fill(0);
        NewBlock {
            payload: BufSlice::whole(padded.into_shared()),
            logical: bytes.len(),
            checksum: None,
            prep: StorePrep::default(),
        }
    }

    /// A block of `bytes`: their own buffer when it is whole sectors that
    /// start at a sector boundary in memory (what a device opened with
    /// O_DIRECT can write), else a copy padded to the sector.
    pub fn of(pool: &Pool, bytes: BufSlice) -> NewBlock {
        let sector = sector_bytes(pool);
        if bytes.len().is_multiple_of(sector) && (bytes.as_ptr() as usize).is_multiple_of(sector) {
            NewBlock::whole(bytes)
        } else {
            NewBlock::copied(pool, &bytes)
        }
    }

    /// A block whose buffer is already whole sectors of its bytes (a
    /// volume's blocks are).
    pub fn whole(payload: BufSlice) -> NewBlock {
        NewBlock {
            logical: payload.len(),
            payload,
            checksum: None,
            prep: StorePrep::default(),
        }
    }
}

/// The largest sector of the pool's devices: what a stored block is padded to.
pub(crate) fn sector_bytes(pool: &Pool) -> usize {
    pool.store
        .vdevs()
        .iter()
        .map(|top| top.sector_bytes())
        .max()
        .unwrap_or(4096) as usize
}

/// Stores `blocks` (compressed, checksummed, allocated in order, written as
/// one run) and returns each one's pointer, in order, or its error. A block
/// that failed holds no space.
pub(crate) async fn write_blocks(
    pool: &Rc<Pool>,
    format: BlockFormat,
    blocks: Vec<NewBlock>,
    class: IoClass,
) -> Vec<Result<BlockPointer, PoolError>> {
    let sector = sector_bytes(pool);
    let key = match format.key.map(|guid| pool.data_key(guid)).transpose() {
        Ok(key) => key,
        Err(error) => {
            return blocks
                .iter()
                .map(|_| Err(PoolError::KeyUnavailable(error.to_string())))
                .collect()
        }
    };
    let compressed = futures_util::future::join_all(
        blocks
            .iter()
            .map(|block| compress(format.compression, block, sector)),
    )
    .await;
    let mut sealed = match &key {
        None => Vec::new(),
        Some(key) => seal_batch(key, format.object_type, &blocks, &compressed).await,
    }
    .into_iter();
    let mut formed = Vec::with_capacity(blocks.len());
    for (block, (payload, physical, compression)) in blocks.into_iter().zip(compressed) {
        debug_assert!(physical <= payload.len() && block.logical <= block.payload.len());
        let (payload, crypt, sealed_checksum) = match sealed.next() {
            None => (payload, None, None),
            Some(Ok((sealed, crypt, checksum))) => (sealed, Some(crypt), checksum),
            Some(Err(error)) => {
                formed.push(Err(error));
                continue;
            }
        };
        // What was computed from the bytes as received (their checksum, a
        // RAID-Z parity) holds only if they are stored as they are.
        let as_received = compression == Compression::Off && crypt.is_none();
        let checksum = match block.checksum {
            // Computed with the sealing, of the stored bytes.
            _ if sealed_checksum.is_some() && format.checksum == ChecksumAlgo::Xxh3 => {
                sealed_checksum.expect("matched")
            }
            Some((algo, checksum)) if algo == format.checksum && as_received => {
                debug_assert!(
                    checksum == algo.compute(&payload[..physical]),
                    "a checksum computed as the bytes arrived covers the bytes stored"
                );
                checksum
            }
            _ => format.checksum.compute(&payload[..physical]),
        };
        assert!(
            crypt.is_none() || format.checksum == ChecksumAlgo::Xxh3,
            "an encrypted block's MAC shares the place of an XXH3 checksum"
        );
        formed.push(Ok(Formed {
            pointer: BlockPointer {
                logical_size: block.logical as u32,
                physical_size: physical as u32,
                level: 0,
                object_type: format.object_type,
                checksum_algo: format.checksum,
                compression,
                fill: 1,
                checksum,
                crypt,
                ..BlockPointer::default()
            },
            payload,
            prep: block.prep.if_stored_as_prepared(as_received),
        }));
    }
    write_formed(pool, formed, class).await
}

/// A data block as it is to be stored (compressed, sealed, checksummed):
/// its pointer, with no place yet, and the bytes the devices write.
pub(crate) struct Formed {
    pub pointer: BlockPointer,
    /// The stored bytes, padded with zeros to whole sectors.
    pub payload: BufSlice,
    pub prep: StorePrep,
}

impl Formed {
    /// A block received as it was stored by another pool (a raw send):
    /// its `physical` bytes, compressed by `compression` from `logical`
    /// bytes and sealed (`crypt`), kept as they are. Its checksum is
    /// computed here over what is stored, as for any block; its MAC came
    /// with it, so the dataset's key opens it.
    pub fn stored_as_sent(
        pool: &Pool,
        object_type: ObjectType,
        logical: u32,
        compression: Compression,
        crypt: crate::format::bp::BlockCrypt,
        physical: &[u8],
    ) -> Formed {
        assert!(
            !physical.is_empty() && physical.len() <= logical as usize,
            "a stored block is no larger than its logical bytes"
        );
        let block = NewBlock::copied(pool, physical);
        Formed {
            pointer: BlockPointer {
                logical_size: logical,
                physical_size: physical.len() as u32,
                level: 0,
                object_type,
                checksum_algo: ChecksumAlgo::Xxh3,
                compression,
                fill: 1,
                checksum: ChecksumAlgo::Xxh3.compute(physical),
                crypt: Some(crypt),
                ..BlockPointer::default()
            },
            payload: block.payload,
            prep: StorePrep::default(),
        }
    }
}

/// Allocates and writes `formed`, a metadata object's level-0 block (a
/// directory's leaf a raw stream brought sealed), with `copies` copies, as
/// the txg build writes metadata (fewer when another does not fit, as
/// there); returns its pointer, with its place, to be linked. It comes
/// from a client, as data does, so it must fit in data's room: the slop
/// and the metadata reserve (which the caller brings up to date first)
/// stay for the txg build, which fails the pool if it finds no room. On
/// failure it holds no space.
pub(crate) async fn write_formed_metadata(
    pool: &Rc<Pool>,
    formed: Formed,
    copies: usize,
    class: IoClass,
) -> Result<BlockPointer, PoolError> {
    let Formed {
        mut pointer,
        payload,
        ..
    } = formed;
    debug_assert!(pointer.is_hole() && pointer.physical_size as usize <= payload.len());
    let bytes = payload.len() as u64;
    if pool.store.allocator.borrow().data_available_bytes() < bytes * copies as u64 {
        return Err(PoolError::NoSpace);
    }
    pointer.dvas = pool
        .store
        .allocate(bytes, true, copies)
        .map_err(|_| PoolError::NoSpace)?;
    assert!(
        (1..=copies).contains(&pointer.copies().count()),
        "a metadata block gets at most the copies asked for, and one"
    );
    if let Err(error) = pool.store.write(&pointer.dvas, payload, class).await {
        pool.store.release(&pointer.dvas);
        return Err(error.into());
    }
    Ok(pointer)
}

/// Allocates and writes `formed` blocks (an error stands in for a block
/// that could not be formed) in order, as one run, and returns each one's
/// pointer, with its place, or its error. A block that failed holds no space.
pub(crate) async fn write_formed(
    pool: &Rc<Pool>,
    formed: Vec<Result<Formed, PoolError>>,
    class: IoClass,
) -> Vec<Result<BlockPointer, PoolError>> {
    let mut allocated = Vec::with_capacity(formed.len());
    for block in formed {
        let Formed {
            mut pointer,
            payload,
            prep,
        } = match block {
            Ok(block) => block,
            Err(error) => {
                allocated.push(Err(error));
                continue;
            }
        };
        debug_assert!(pointer.is_hole() && pointer.physical_size as usize <= payload.len());
        let dvas = pool.allocate_data(payload.len() as u64).await;
        allocated.push(dvas.map(|dvas| {
            pointer.dvas = dvas;
            (pointer, payload, prep)
        }));
    }
    // Data has one copy: the run writes `dvas[0]` of each.
    assert!(
        allocated
            .iter()
            .flatten()
            .all(|(pointer, _, _)| pointer.copies().count() == 1),
        "data blocks have one copy"
    );
    if let [Ok((pointer, payload, prep))] = allocated.as_slice() {
        if prep.bytes() == 0 {
            // One block with no work prepared (a file's direct write, most
            // often): the store's single write, without the run's grouping.
            let written = pool
                .store
                .write(&pointer.dvas, payload.clone(), class)
                .await;
            return vec![match written {
                Ok(()) => Ok(*pointer),
                Err(error) => {
                    pool.store.release(&pointer.dvas);
                    Err(error.into())
                }
            }];
        }
    }
    let run: Vec<_> = allocated
        .iter()
        .flatten()
        .map(|(pointer, payload, prep)| (pointer.dvas[0], payload.clone(), prep.clone()))
        .collect();
    let mut writes = pool.store.write_run(run, class).await.into_iter();
    let results: Vec<_> = allocated
        .into_iter()
        .map(|block| {
            let (pointer, _, _) = block?;
            match writes.next().expect("a result per block written") {
                Ok(()) => Ok(pointer),
                Err(error) => {
                    pool.store.release(&pointer.dvas);
                    Err(error.into())
                }
            }
        })
        .collect();
    debug_assert!(writes.next().is_none(), "no result without its block");
    results
}

/// Batches of gathered blocks ([`write_blocks_gathered`]) in flight at
/// once. A write that finds fewer goes out at once, alone (a QD1 writer
/// never waits for another); one that finds this many waits for the next
/// batch, which takes every block that waited meanwhile and writes them as
/// one run. So a deep queue of concurrent writes reaches the devices as
/// fewer, larger writes, while each still waits for its own blocks to be
/// on the devices.
///
/// 32, not fewer: a batch is one run only where the free space is one
/// piece. On a pool that random overwrites have aged, the free space is
/// holes of a block or two, a batch becomes many device writes (40-48 KiB
/// each, measured), and it ends only when its slowest piece does; four
/// batches then held fio's 16K `O_DIRECT` random writes at QD64 on a file
/// to 31-34k IOPS with the machine a core idle, where 32 gave 39-41k (the
/// volume beside it: 39-45k). On a fresh pool the two were alike in IOPS
/// (42-45k against 41-46k); four saved 1-2 us of CPU per write there.
pub(crate) const GATHER_BATCHES_IN_FLIGHT: usize = 32;

/// Writes of this many bytes and more go out at once, outside the count of
/// batches: such a write is a run of its own (a 1 MiB write is 64 blocks of
/// 16K), gathering adds nothing to it, and the count would hold a
/// sequential writer's queue depth to [`GATHER_BATCHES_IN_FLIGHT`] (fio's
/// 1 MiB writes at QD16 on a file lost 11% in one run).
const GATHER_ALONE_BYTES: usize = 256 * 1024;

/// Blocks in one gathered batch, at most: the run's size (1 MiB of 16K
/// blocks, the device queue's aggregation limit) and what a batch holds.
const GATHER_BLOCKS_MAX: usize = BLOCKS_IN_FLIGHT_PER_REQUEST;

/// One write's blocks waiting for a gathered batch.
struct Gathered {
    format: BlockFormat,
    class: IoClass,
    blocks: Vec<NewBlock>,
    reply: crate::rt::sync::OneshotSender<Vec<Result<BlockPointer, PoolError>>>,
}

/// The state of [`write_blocks_gathered`]: batches in flight and the
/// writes waiting for the next one.
/// The writes waiting are bounded by their callers: a mount serves at most
/// `fuse::SERVED_MAX` requests at once, and write-behind's write-outs hold
/// dirty data under `dirty_data_max_bytes`.
#[derive(Default)]
pub(crate) struct Gather {
    in_flight: std::cell::Cell<usize>,
    waiting: std::cell::RefCell<std::collections::VecDeque<Gathered>>,
    /// Batches of waiting writes started, and the writes they held.
    batches: std::cell::Cell<u64>,
    gathered_writes: std::cell::Cell<u64>,
}

/// [`write_blocks`] for writes that come concurrently (a filesystem's
/// direct and synchronous writes, its write-behind's write-outs): at most
/// [`GATHER_BATCHES_IN_FLIGHT`] batches go to the devices at once, and the
/// writes that come meanwhile are stored together, as one run, in the next
/// batch (see the constant). A large write goes out at once
/// ([`GATHER_ALONE_BYTES`]). Returns this write's results, as
/// `write_blocks` does.
pub(crate) async fn write_blocks_gathered(
    pool: &Rc<Pool>,
    format: BlockFormat,
    blocks: Vec<NewBlock>,
    class: IoClass,
) -> Vec<Result<BlockPointer, PoolError>> {
    let gather = &pool.gather;
    let bytes: usize = blocks.iter().map(|block| block.logical).sum();
    if bytes >= GATHER_ALONE_BYTES {
        return write_blocks(pool, format, blocks, class).await;
    }
    if gather.in_flight.get() < GATHER_BATCHES_IN_FLIGHT && gather.waiting.borrow().is_empty() {
        gather.in_flight.set(gather.in_flight.get() + 1);
        debug_assert!(gather.in_flight.get() <= GATHER_BATCHES_IN_FLIGHT);
        // Ended by the guard even if this future is dropped part way: a
        // batch counted and never ended would hold every later write.
        let _ends = BatchEnds(pool);
        return write_blocks(pool, format, blocks, class).await;
    }
    let count = blocks.len();
    let (reply, results) = crate::rt::sync::oneshot();
    gather.waiting.borrow_mut().push_back(Gathered {
        format,
        class,
        blocks,
        reply,
    });
    match results.await {
        Some(results) => results,
        // The batch was dropped with the pool (export, a crash in the
        // simulator) before it ended.
        None => (0..count)
            .map(|_| {
                Err(PoolError::Io(
                    "the pool closed before the write ended".into(),
                ))
            })
            .collect(),
    }
}

/// Ends a batch of one write when dropped (see [`batch_ended`]).
struct BatchEnds<'a>(&'a Rc<Pool>);

impl Drop for BatchEnds<'_> {
    fn drop(&mut self) {
        batch_ended(self.0);
    }
}

/// A gathered batch ended: the next one starts with the writes that waited,
/// in their order, as many as fit one run of one format and class.
fn batch_ended(pool: &Rc<Pool>) {
    let gather = &pool.gather;
    let batch: Vec<Gathered> = {
        let mut waiting = gather.waiting.borrow_mut();
        let mut batch = Vec::new();
        let mut blocks = 0;
        while let Some(next) = waiting.front() {
            let fits = batch.first().is_none_or(|first: &Gathered| {
                first.format == next.format && first.class == next.class
            }) && (batch.is_empty() || blocks + next.blocks.len() <= GATHER_BLOCKS_MAX);
            if !fits {
                break;
            }
            blocks += next.blocks.len();
            batch.push(waiting.pop_front().expect("the front is there"));
        }
        batch
    };
    if batch.is_empty() {
        gather.in_flight.set(gather.in_flight.get() - 1);
        return;
    }
    assert!(
        gather.in_flight.get() >= 1,
        "a batch ended that was not counted"
    );
    gather.batches.set(gather.batches.get() + 1);
    gather
        .gathered_writes
        .set(gather.gathered_writes.get() + batch.len() as u64);
    let pool = pool.clone();
    crate::rt::spawn(async move {
        let (format, class) = (batch[0].format, batch[0].class);
        let mut counts = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut blocks = Vec::new();
        for write in batch {
            counts.push(write.blocks.len());
            replies.push(write.reply);
            blocks.extend(write.blocks);
        }
        let mut results = write_blocks(&pool, format, blocks, class).await.into_iter();
        for (reply, count) in replies.into_iter().zip(counts) {
            reply.send(results.by_ref().take(count).collect());
        }
        debug_assert!(results.next().is_none(), "a result per block");
        batch_ended(&pool);
    });
}

/// Stores one block, as [`write_blocks`] does.
pub(crate) async fn write_block(
    pool: &Rc<Pool>,
    format: BlockFormat,
    block: NewBlock,
    class: IoClass,
) -> Result<BlockPointer, PoolError> {
    write_blocks(pool, format, vec![block], class)
        .await
        .pop()
        .expect("a result for the one block")
}

/// Blocks up to this size are compressed with lz4 on the engine thread
/// rather than a worker: lz4 runs at several GB/s (about 1 us for 16 KiB of
/// random data here), and the handoff to a worker and back cost the server
/// about 9 us of CPU per 16 KiB write (`ironpool bench --suite datasets`:
/// 9.5 us per write with compression off, 18.8 us with lz4 offloaded).
/// Larger blocks and zstd, which take tens of microseconds and more, still
/// go to the workers so the engine's I/O never waits on them.
const INLINE_LZ4_MAX_BYTES: usize = 32 * 1024;

/// The bytes `block` is stored as: compressed when the setting asks and the
/// block gets smaller, else its own payload. Returns them, the size the
/// checksum covers, and the compression used.
async fn compress(
    setting: CompressionSetting,
    block: &NewBlock,
    sector: usize,
) -> (BufSlice, usize, Compression) {
    if setting.algo == Compression::Off {
        return (block.payload.clone(), block.logical, Compression::Off);
    }
    let data = block.payload.slice(0..block.logical);
    // lz4 of a small block takes about a microsecond (16 KiB, random data,
    // on this project's machines): less than handing it to a worker and
    // waking up for its answer.
    let inline = setting.algo == Compression::Lz4 && block.logical <= INLINE_LZ4_MAX_BYTES;
    let compressed = if inline {
        crate::block::compress::compress(setting, &data, sector)
    } else {
        crate::block::compress::compress_offloaded(setting, &data, sector).await
    };
    match compressed {
        Some((compressed, exact)) => (
            BufSlice::whole(compressed.into_shared()),
            exact,
            setting.algo,
        ),
        None => (block.payload.clone(), block.logical, Compression::Off),
    }
}

/// Lets go of the space of `pointer`, a block written and never linked (a
/// hole has none).
pub(crate) fn release_unlinked(pool: &Pool, pointer: &BlockPointer) {
    if !pointer.is_hole() {
        pool.store.release(&pointer.dvas);
    }
}

/// Loads what linking block `blkid` of `object` needs (the tree nodes on
/// its path, the tree grown to reach it); on failure lets go of
/// `pointer`'s block (written, never linked), so no space leaks.
pub(crate) async fn prepare_link(
    pool: &Pool,
    objects: &ObjectSet,
    object: &Object,
    blkid: u64,
    pointer: &BlockPointer,
) -> Result<(), PoolError> {
    if let Err(error) = objects.prepare_link(object, blkid).await {
        release_unlinked(pool, pointer);
        return Err(error.into());
    }
    Ok(())
}

/// Links `pointer` (a block written by [`write_blocks`], or a hole) as
/// level-0 block `blkid` of `object` in the open txg, with no await, once
/// [`prepare_link`] loaded the path: the tree changes, the block's
/// allocation is committed and counted toward the txg, and the block it
/// replaces is killed (freed, or kept on the dead list of the dataset
/// `dead_owner` when a snapshot holds it). Returns the replaced pointer.
/// On failure the new block's space is let go.
///
/// A written block's birth must be the open txg: a txg writes only the
/// blocks it built, and copy-on-write never links one block twice.
pub(crate) fn link(
    pool: &Rc<Pool>,
    objects: &ObjectSet,
    object: &Object,
    dead_owner: &Object,
    blkid: u64,
    pointer: BlockPointer,
) -> Result<BlockPointer, PoolError> {
    link_space(
        pool,
        objects,
        object,
        dead_owner,
        blkid,
        pointer,
        Space::New,
    )
}

/// Whose the space of a block being linked is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Space {
    /// Allocated for it and not committed: the link commits it, and a
    /// failure lets it go.
    New,
    /// Committed already, by an import's claim of an encrypted
    /// filesystem's intent log (replayed at its key's load): the link
    /// takes it as it is, and a failure frees it.
    Claimed,
}

/// [`link`], for a block whose space is `space`'s.
pub(crate) fn link_space(
    pool: &Rc<Pool>,
    objects: &ObjectSet,
    object: &Object,
    dead_owner: &Object,
    blkid: u64,
    pointer: BlockPointer,
    space: Space,
) -> Result<BlockPointer, PoolError> {
    let txg = pool.txg.open();
    assert!(
        pointer.is_hole() || (pointer.birth_txg == txg && pointer.level == 0),
        "object {} block {blkid}: linking {pointer:?} in txg {txg}",
        object.id
    );
    let old = match objects.set_block_pointer_cached(object, blkid, pointer) {
        Ok(old) => old,
        Err(error) => {
            match space {
                Space::New => release_unlinked(pool, &pointer),
                Space::Claimed => pool.store.free(&pointer),
            }
            return Err(error.into());
        }
    };
    // Copy-on-write: the block replaced was born in this txg or before,
    // and a block is written once, never linked over itself.
    assert!(
        pointer.is_hole()
            || old.is_hole()
            || (old.birth_txg <= txg && old.dvas[0] != pointer.dvas[0]),
        "object {} block {blkid}: linking {pointer:?} over {old:?}",
        object.id
    );
    if !pointer.is_hole() && space == Space::New {
        pool.store.commit(&pointer);
        pool.txg.add_data(pool, pointer.allocated_bytes());
    }
    objects.kill(object, &old);
    pool.spill_dead(dead_owner);
    Ok(old)
}

/// Links `source`, a data block another tree links (block cloning), as
/// level-0 block `blkid` of `object` in the open txg, with no await, once
/// [`prepare_link`] loaded the path: the block gets one more reference in
/// the block reference table, its pointer is born in the open txg (so
/// snapshots, dead lists and incremental sends see a new link) and keeps
/// the txg its bytes were written in, and the block it replaces is killed.
/// False, with nothing changed, when the table is full: the caller copies
/// the bytes instead.
pub(crate) fn link_clone(
    pool: &Rc<Pool>,
    objects: &ObjectSet,
    object: &Object,
    dead_owner: &Object,
    blkid: u64,
    source: BlockPointer,
) -> Result<bool, PoolError> {
    let txg = pool.txg.open();
    assert!(
        !source.is_hole() && source.level == 0 && source.birth_txg <= txg,
        "object {} block {blkid}: cloning {source:?} in txg {txg}",
        object.id
    );
    if !pool.store.clones.borrow_mut().add_reference(&source) {
        return Ok(false);
    }
    let written = source.written_txg();
    let mut clone = source;
    clone.birth_txg = txg;
    clone.physical_birth = if written == txg { 0 } else { written };
    let old = match objects.set_block_pointer_cached(object, blkid, clone) {
        Ok(old) => old,
        Err(error) => {
            pool.store
                .clones
                .borrow_mut()
                .drop_reference(&source.dvas[0]);
            return Err(error.into());
        }
    };
    // (Killing the old block after the reference was added: cloning a
    // block over a link of itself leaves it with the count it had.)
    objects.kill(object, &old);
    pool.spill_dead(dead_owner);
    Ok(true)
}

/// What [`read_linked`] found for a block.
pub(crate) enum Linked {
    /// A hole: the block reads as zeros.
    Hole,
    /// The caller's own dirty copy, found when the tree was looked at.
    Held(BufSlice),
    /// The block's bytes as linked (decompressed); `hit`: served from the
    /// read cache.
    Read { data: BufSlice, hit: bool },
}

/// Reads level-0 block `blkid` of `object` as its tree links it, for any
/// object of any dataset: its pointer, the block through the read cache
/// (verified, healed from another copy), decompressed. `held` is asked
/// after each look at the tree for a dirty copy the caller keeps, which is
/// newer than the tree (a write acknowledged while the pointer was being
/// looked up). A read that finds no valid copy is tried again if the
/// pointer changed meanwhile (the old block was rewritten, freed and its
/// space reused: see [`READ_RETRIES`]). `key` opens an encrypted
/// dataset's blocks. `name` names the object in errors.
pub(crate) async fn read_linked(
    objects: &ObjectSet,
    object: &Object,
    blkid: u64,
    usage: CacheUse,
    held: impl Fn() -> Option<BufSlice>,
    key: Option<&crate::crypto::DatasetKey>,
    name: &dyn std::fmt::Display,
) -> Result<Linked, PoolError> {
    let mut attempt = 0;
    loop {
        let pointer = objects.block_pointer(object, blkid).await?;
        if let Some(data) = held() {
            return Ok(Linked::Held(data));
        }
        if pointer.is_hole() {
            return Ok(Linked::Hole);
        }
        match objects
            .store
            .read_cached(&pointer, IoClass::SyncRead, usage)
            .await
        {
            Ok(read) => {
                let hit = read.hit;
                let data = logical_bytes(&objects.store, &pointer, read, key, name, blkid).await?;
                return Ok(Linked::Read { data, hit });
            }
            Err(BlockError::Unreadable { location, detail }) => {
                let now = objects.block_pointer(object, blkid).await?;
                attempt += 1;
                if now == pointer || attempt > READ_RETRIES {
                    return Err(PoolError::Io(format!(
                        "{name} block {blkid}: no valid copy at {location}: {detail}"
                    )));
                }
            }
            Err(other) => return Err(other.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::sim::SimDevice;
    use crate::format::label::TopVdevKind;
    use crate::pool::test_pool::{sim_pool, unhurried};
    use crate::rt::Runtime;

    /// Writes that come while [`GATHER_BATCHES_IN_FLIGHT`] batches are on
    /// the devices wait, and go out together in the next batch; each still
    /// gets its own block back, stored with its own bytes, and no more
    /// batches than that are ever in flight.
    #[test]
    fn concurrent_writes_are_gathered_and_each_gets_its_own_block() {
        Runtime::new_sim(71).block_on(async {
            let disks: Vec<_> = (0..2)
                .map(|index| SimDevice::new(&format!("d{index}"), 128 << 20, 71 + index))
                .collect();
            let pool = sim_pool(&disks, TopVdevKind::Mirror, unhurried()).await;
            let format = BlockFormat {
                checksum: ChecksumAlgo::default(),
                compression: CompressionSetting::OFF,
                object_type: ObjectType::FsFile,
                key: None,
            };
            // Three times the batches allowed: two thirds of them wait.
            const WRITES: usize = 3 * GATHER_BATCHES_IN_FLIGHT;
            let most_in_flight = Rc::new(std::cell::Cell::new(0));
            let writes: Vec<_> = (0..WRITES)
                .map(|index| {
                    let (pool, most) = (pool.clone(), most_in_flight.clone());
                    crate::rt::spawn(async move {
                        let bytes = vec![index as u8 + 1; 16384];
                        let block = NewBlock::copied(&pool, &bytes);
                        let written =
                            write_blocks_gathered(&pool, format, vec![block], IoClass::AsyncWrite);
                        most.set(most.get().max(pool.gather.in_flight.get()));
                        let mut results = written.await;
                        most.set(most.get().max(pool.gather.in_flight.get()));
                        assert_eq!(results.len(), 1);
                        (bytes, results.pop().unwrap().unwrap())
                    })
                })
                .collect();
            let mut pointers = Vec::new();
            for write in writes {
                let (bytes, pointer) = write.await;
                let stored = pool
                    .store
                    .read_cached(&pointer, IoClass::SyncRead, CacheUse::data(false, false))
                    .await
                    .unwrap()
                    .data;
                assert_eq!(
                    &stored[..],
                    &bytes[..],
                    "each write reads back its own bytes"
                );
                pointers.push(pointer);
            }
            let gather = &pool.gather;
            assert!(most_in_flight.get() <= GATHER_BATCHES_IN_FLIGHT);
            assert_eq!(gather.in_flight.get(), 0, "every batch ended");
            assert!(gather.waiting.borrow().is_empty());
            assert!(
                gather.batches.get() >= 1 && gather.gathered_writes.get() > gather.batches.get(),
                "{} writes in {} batches: the waiting writes went out together",
                gather.gathered_writes.get(),
                gather.batches.get()
            );
            let mut dvas: Vec<_> = pointers.iter().map(|pointer| pointer.dvas[0]).collect();
            dvas.sort_by_key(|dva| (dva.vdev, dva.offset));
            dvas.dedup();
            assert_eq!(dvas.len(), WRITES, "no two writes share space");
            for pointer in &pointers {
                release_unlinked(&pool, pointer);
            }

            // A write dropped while its batch is in flight still ends it:
            // a batch counted for ever would hold every later write.
            let block = NewBlock::copied(&pool, &[9u8; 16384]);
            let mut dropped = Box::pin(write_blocks_gathered(
                &pool,
                format,
                vec![block],
                IoClass::AsyncWrite,
            ));
            std::future::poll_fn(|context| {
                let _ = std::future::Future::poll(dropped.as_mut(), context);
                std::task::Poll::Ready(())
            })
            .await;
            assert_eq!(gather.in_flight.get(), 1, "the write's batch is in flight");
            drop(dropped);
            assert_eq!(gather.in_flight.get(), 0, "the dropped write's batch ended");
        });
    }
}
