//! The model of what every dataset must contain.
//!
//! Content is tracked per volume block (the unit the engine writes
//! copy-on-write, so a block is never half old and half new) as the tag of the
//! write that last covered each 512-byte sector (tag 0: zeros). Every sector a
//! write stores is a pattern derived from (tag, sector number), so a read is
//! decoded back into tags and anything else is garbage.
//!
//! Each block keeps two sets of values:
//! - `current`: what a read may return now (one value, except after a write that
//!   failed part way, which may or may not have landed);
//! - `durable`: what a read may return after a crash now: the values current at
//!   the last acknowledged flush, plus every value written since (an unflushed
//!   write may be kept or lost, block by block).
//!
//! A read narrows `current` to what it saw; an acknowledged flush sets
//! `durable` to `current`; after a crash, what is read must be in `durable`.

use std::collections::BTreeMap;
use std::rc::Rc;

/// Granularity of the model's tags: the engine's I/O alignment.
pub const MODEL_SECTOR_BYTES: u64 = 512;
/// Tag that marks a sector read back as neither zeros nor any write's pattern.
pub const GARBAGE_TAG: u64 = u64::MAX;

/// One block's content: a tag per sector.
pub type Value = Rc<[u64]>;

/// The possible contents of one block.
#[derive(Clone, Debug)]
pub struct BlockModel {
    pub current: Vec<Value>,
    pub durable: Vec<Value>,
}

fn push_unique(values: &mut Vec<Value>, value: &Value) {
    if !values.iter().any(|existing| existing == value) {
        values.push(value.clone());
    }
}

/// One dataset (volume or snapshot).
#[derive(Clone, Debug)]
pub struct DatasetModel {
    pub size_bytes: u64,
    pub block_bytes: u64,
    pub blocks: Vec<BlockModel>,
}

impl DatasetModel {
    pub fn new(size_bytes: u64, block_bytes: u64) -> DatasetModel {
        let sectors = (block_bytes / MODEL_SECTOR_BYTES) as usize;
        let zero: Value = vec![0u64; sectors].into();
        let block = BlockModel {
            current: vec![zero.clone()],
            durable: vec![zero],
        };
        DatasetModel {
            size_bytes,
            block_bytes,
            blocks: vec![block; (size_bytes / block_bytes) as usize],
        }
    }

    /// The values block `blkid` takes when sectors `first..first+count` of it
    /// (block-relative) get `tag`: one per possible current value.
    pub fn merged(&self, blkid: u64, first: usize, count: usize, tag: u64) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        for value in &self.blocks[blkid as usize].current {
            let mut tags = value.to_vec();
            tags[first..first + count].fill(tag);
            push_unique(&mut out, &tags.into());
        }
        out
    }

    /// A write was issued: after a crash any of `values` may be on disk.
    pub fn issued(&mut self, blkid: u64, values: &[Value]) {
        for value in values {
            push_unique(&mut self.blocks[blkid as usize].durable, value);
        }
    }

    /// A write was acknowledged: the block now reads as one of `values`.
    pub fn acknowledged(&mut self, blkid: u64, values: &[Value]) {
        self.blocks[blkid as usize].current = values.to_vec();
    }

    /// A write failed: it may or may not have landed.
    pub fn failed(&mut self, blkid: u64, values: &[Value]) {
        for value in values {
            push_unique(&mut self.blocks[blkid as usize].current, value);
        }
    }

    /// A flush was acknowledged: everything current is durable.
    pub fn flushed(&mut self) {
        for block in &mut self.blocks {
            block.durable = block.current.clone();
        }
    }

    /// A FUA write to block `blkid` was acknowledged: that block is durable
    /// as it is now (FUA promises nothing about other blocks: acknowledged
    /// writes may still be held in memory).
    pub fn flushed_block(&mut self, blkid: u64) {
        let block = &mut self.blocks[blkid as usize];
        block.durable = block.current.clone();
    }

    /// A read of block `blkid` saw `value`: it must be a current value.
    pub fn observe(&mut self, blkid: u64, value: Value) -> Result<(), String> {
        let block = &mut self.blocks[blkid as usize];
        if !block.current.contains(&value) {
            return Err(format!(
                "block {blkid} reads {} but the model allows {}",
                describe(&value),
                describe_all(&block.current)
            ));
        }
        block.current = vec![value];
        Ok(())
    }

    /// The first read after a crash saw `value`: it must be a durable value; it
    /// becomes the only one.
    pub fn observe_after_crash(&mut self, blkid: u64, value: Value) -> Result<(), String> {
        let block = &mut self.blocks[blkid as usize];
        if !block.durable.contains(&value) {
            return Err(format!(
                "after the crash block {blkid} reads {} but only {} may have survived",
                describe(&value),
                describe_all(&block.durable)
            ));
        }
        block.current = vec![value.clone()];
        block.durable = vec![value];
        Ok(())
    }

    /// The dataset as a frozen copy (a snapshot, or a clone's start): committed,
    /// so what is current is durable.
    pub fn frozen(&self) -> DatasetModel {
        let mut copy = self.clone();
        copy.flushed();
        copy
    }
}

/// A short description of a value: runs of equal tags.
pub fn describe(value: &Value) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut index = 0;
    while index < value.len() {
        let tag = value[index];
        let start = index;
        while index < value.len() && value[index] == tag {
            index += 1;
        }
        let name = match tag {
            0 => "zero".to_string(),
            GARBAGE_TAG => "GARBAGE".to_string(),
            tag => format!("w{tag}"),
        };
        runs.push(if index - start == value.len() {
            name
        } else {
            format!("{name}x{}", index - start)
        });
    }
    format!("[{}]", runs.join(" "))
}

fn describe_all(values: &[Value]) -> String {
    values.iter().map(describe).collect::<Vec<_>>().join(" or ")
}

/// The bytes of sector `sector` (volume-relative index) written with `tag`.
pub fn fill_sector(tag: u64, sector: u64, out: &mut [u8]) {
    debug_assert_eq!(out.len() as u64, MODEL_SECTOR_BYTES);
    if tag == 0 {
        out.fill(0);
        return;
    }
    out[..8].copy_from_slice(&tag.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut state =
        tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sector.rotate_left(29) ^ 0x2545_f491_4f6c_dd1d;
    for chunk in out[16..].chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

/// Decodes one sector read back into its tag (`GARBAGE_TAG` when it is neither
/// zeros nor exactly a write's pattern for this sector).
pub fn decode_sector(bytes: &[u8], sector: u64) -> u64 {
    if bytes.iter().all(|byte| *byte == 0) {
        return 0;
    }
    let tag = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if tag == 0 || tag == GARBAGE_TAG {
        return GARBAGE_TAG;
    }
    let mut expected = [0u8; MODEL_SECTOR_BYTES as usize];
    fill_sector(tag, sector, &mut expected);
    if expected[..] == bytes[..] {
        tag
    } else {
        GARBAGE_TAG
    }
}

/// Every dataset, by name ("v0", "v0@s3"), and the name and tag counters.
#[derive(Default)]
pub struct Model {
    pub datasets: BTreeMap<String, DatasetModel>,
    /// Clone -> its origin snapshot ("v0@s3").
    pub origins: BTreeMap<String, String>,
    pub next_tag: u64,
    pub next_name: u64,
}

impl Model {
    pub fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    pub fn name(&mut self, prefix: &str) -> String {
        self.next_name += 1;
        format!("{prefix}{}", self.next_name)
    }

    pub fn volumes(&self) -> Vec<String> {
        self.datasets
            .keys()
            .filter(|name| !name.contains('@'))
            .cloned()
            .collect()
    }

    /// Snapshots of `volume`, oldest first (names are numbered in order).
    pub fn snapshots_of(&self, volume: &str) -> Vec<String> {
        let prefix = format!("{volume}@");
        let mut names: Vec<String> = self
            .datasets
            .keys()
            .filter(|name| name.starts_with(&prefix))
            .cloned()
            .collect();
        names.sort_by_key(|name| name[prefix.len() + 1..].parse::<u64>().unwrap_or(0));
        names
    }

    pub fn has_clones(&self, snapshot: &str) -> bool {
        self.origins.values().any(|origin| origin == snapshot)
    }

    /// Every acknowledged flush covers all datasets.
    pub fn flushed(&mut self) {
        for dataset in self.datasets.values_mut() {
            dataset.flushed();
        }
    }
}
