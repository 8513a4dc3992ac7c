//! A volume's reads: a READ cut into blocks, each from the write-back's
//! held copy, the read cache or the devices (with the prefetcher told of
//! sequential streams); and BLOCK_STATUS.

use std::rc::Rc;

use super::{Volume, BLOCK_STATUS_EXTENTS_MAX};
use crate::pool::data::{Linked, BLOCKS_IN_FLIGHT_PER_REQUEST};
use crate::pool::{Pool, PoolError};
use crate::rt::buf::BufSlice;

/// A piece of a read's answer.
pub enum ReadPiece {
    Data(BufSlice),
    Zeros(usize),
}

impl ReadPiece {
    pub fn len(&self) -> usize {
        match self {
            ReadPiece::Data(slice) => slice.len(),
            ReadPiece::Zeros(length) => *length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a read's pieces in one buffer, zeros expanded: for callers
    /// that compare or check contents (tests, the simulator's checkers), not
    /// for the serving path, which sends the pieces as they are.
    pub fn concat(pieces: Vec<ReadPiece>) -> Vec<u8> {
        let mut out = Vec::with_capacity(pieces.iter().map(ReadPiece::len).sum());
        for piece in pieces {
            match piece {
                ReadPiece::Data(slice) => out.extend_from_slice(&slice),
                ReadPiece::Zeros(length) => out.resize(out.len() + length, 0),
            }
        }
        out
    }
}

impl Pool {
    /// Reads `length` bytes at `offset` of `volume`.
    pub async fn read(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        length: u64,
    ) -> Result<Vec<ReadPiece>, PoolError> {
        volume.check(offset, length)?;
        let block = volume.block_bytes;
        let mut pieces = Vec::new();
        let mut position = offset;
        let end = offset + length;
        let mut ranges = Vec::new();
        while position < end {
            let blkid = position / block;
            let within = position % block;
            let chunk = (block - within).min(end - position);
            ranges.push((blkid, within as usize, chunk as usize));
            position += chunk;
        }
        let direct = u64::from(!volume.settings().data_cache_use().lookup);
        if let (Some(first), Some(last)) = (ranges.first(), ranges.last()) {
            self.prefetch_after_read(volume, first.0, last.0);
        }
        if let [(blkid, within, chunk)] = ranges[..] {
            pieces.push(self.read_block_range(volume, blkid, within, chunk).await?);
            volume.count(|stats| {
                stats.read_ops += 1;
                stats.direct_read_ops += direct;
                stats.read_bytes += length;
            });
            return Ok(pieces);
        }
        for batch in ranges.chunks(BLOCKS_IN_FLIGHT_PER_REQUEST) {
            let reads = batch
                .iter()
                .map(|&(blkid, within, chunk)| self.read_block_range(volume, blkid, within, chunk));
            for piece in futures_util::future::join_all(reads).await {
                pieces.push(piece?);
            }
        }
        volume.count(|stats| {
            stats.read_ops += 1;
            stats.direct_read_ops += direct;
            stats.read_bytes += length;
        });
        Ok(pieces)
    }

    async fn read_block_range(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        within: usize,
        length: usize,
    ) -> Result<ReadPiece, PoolError> {
        let finishes = within + length == volume.block_bytes as usize;
        match self.read_block(volume, blkid, finishes).await? {
            None => {
                volume.count(|stats| stats.hole_read_ops += 1);
                Ok(ReadPiece::Zeros(length))
            }
            Some(data) => Ok(ReadPiece::Data(data.slice(within..within + length))),
        }
    }

    /// Reads one whole block (None for a hole): its dirty copy if it has one,
    /// else from the devices. Retries when the block changed while it was being
    /// read (its old copy was overwritten and reused).
    /// `finishes`: the read reaches the end of the block (see the cache's
    /// drop-behind).
    pub(super) async fn read_block(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        blkid: u64,
        finishes: bool,
    ) -> Result<Option<BufSlice>, PoolError> {
        let held = || {
            let data = volume.writeback.lookup(blkid)?;
            volume.count(|stats| stats.dirty_read_blocks += 1);
            Some(data)
        };
        if let Some(data) = held() {
            return Ok(Some(data));
        }
        let usage = volume.settings().data_cache_use().finishing(finishes);
        let key = volume
            .key_guid()
            .map(|guid| self.data_key(guid))
            .transpose()?;
        let read = crate::pool::data::read_linked(
            &self.objects,
            &volume.object,
            blkid,
            usage,
            held,
            key.as_deref(),
            &volume.name(),
        )
        .await?;
        Ok(match read {
            Linked::Hole => None,
            Linked::Held(data) => Some(data),
            Linked::Read { data, hit } => {
                volume.count(|stats| match hit {
                    true => stats.cache_hit_blocks += 1,
                    false => stats.cache_miss_blocks += 1,
                });
                Some(data)
            }
        })
    }

    /// Allocation status of `offset..offset+length`: runs of (bytes, allocated),
    /// stopping after `BLOCK_STATUS_EXTENTS_MAX` runs.
    pub async fn block_status(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        offset: u64,
        length: u64,
    ) -> Result<Vec<(u64, bool)>, PoolError> {
        volume.check(offset, length)?;
        // Dirty blocks are not in the tree yet.
        self.drain_volume(volume).await?;
        let block = volume.block_bytes;
        let end = offset + length;
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut position = offset;
        while position < end && runs.len() < BLOCK_STATUS_EXTENTS_MAX {
            let blkid = position / block;
            let holes = self.objects.hole_span(&volume.object, blkid).await?;
            let (blocks, allocated) = if holes > 0 { (holes, false) } else { (1, true) };
            let run_end = end.min((blkid.saturating_add(blocks)).saturating_mul(block));
            let bytes = run_end - position;
            match runs.last_mut() {
                Some((last_bytes, last_allocated)) if *last_allocated == allocated => {
                    *last_bytes += bytes
                }
                _ => runs.push((bytes, allocated)),
            }
            position = run_end;
        }
        Ok(runs)
    }
}
