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
//! Linking the written blocks into their object's tree stays with the
//! caller, which knows the object's locks and what the intent log needs.
//! A block whose write failed has its space let go here; a caller that
//! cannot link a written block lets go of it itself.

use std::rc::Rc;

use crate::block::compress::CompressionSetting;
use crate::block::StorePrep;
use crate::format::bp::Compression;
use crate::format::checksum::{Checksum, ChecksumAlgo};
use crate::format::{BlockPointer, ObjectType};
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};

/// Blocks of one request processed at once: bounds the tasks and memory a single
/// large request (up to 32 MiB) holds, while keeping many I/Os in flight. A
/// filesystem's reads and writes (up to 1 MiB) use it too.
pub(crate) const BLOCKS_IN_FLIGHT_PER_REQUEST: usize = 64;

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
#[derive(Clone, Copy)]
pub(crate) struct BlockFormat {
    pub checksum: ChecksumAlgo,
    pub compression: CompressionSetting,
    pub object_type: ObjectType,
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

    /// A block of `bytes`: their own buffer when it is whole sectors, else
    /// a copy padded to the sector.
    pub fn of(pool: &Pool, bytes: BufSlice) -> NewBlock {
        if bytes.len().is_multiple_of(sector_bytes(pool)) {
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
    let compressed = futures_util::future::join_all(
        blocks
            .iter()
            .map(|block| compress(format.compression, block, sector)),
    )
    .await;
    let mut allocated = Vec::with_capacity(blocks.len());
    for (block, (payload, physical, compression)) in blocks.into_iter().zip(compressed) {
        debug_assert!(physical <= payload.len() && block.logical <= block.payload.len());
        let checksum = match block.checksum {
            Some((algo, checksum))
                if algo == format.checksum && compression == Compression::Off =>
            {
                checksum
            }
            _ => format.checksum.compute(&payload[..physical]),
        };
        let dvas = pool.allocate_data(payload.len() as u64).await;
        let prep = block
            .prep
            .if_stored_as_prepared(compression == Compression::Off);
        allocated.push(dvas.map(|dvas| {
            let pointer = BlockPointer {
                dvas,
                birth_txg: 0,
                logical_size: block.logical as u32,
                physical_size: physical as u32,
                level: 0,
                object_type: format.object_type,
                checksum_algo: format.checksum,
                compression,
                fill: 1,
                checksum,
            };
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
    match crate::block::compress::compress_offloaded(setting, &data, sector).await {
        Some((compressed, exact)) => (
            BufSlice::whole(compressed.into_shared()),
            exact,
            setting.algo,
        ),
        None => (block.payload.clone(), block.logical, Compression::Off),
    }
}
