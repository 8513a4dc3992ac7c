//! The block reference table in memory: for each cloned block, how many
//! more tree references it has than the one its write made (OpenZFS's BRT).
//!
//! Cloning a block (`copy_file_range` on a filesystem) links its pointer a
//! second time and adds one here; [`BlockStore::free`](super::BlockStore::free)
//! of a block with an entry takes one away instead of freeing its space, so
//! the space goes back only with the last reference. The counts change in
//! memory when the trees change (a clone links, a kill frees); a txg build
//! appends the changes to the table's object in the same image as the trees
//! (see `pool::clones`), so after any crash the two agree.

use std::collections::BTreeMap;

use crate::format::clones::CloneRecord;
use crate::format::{BlockPointer, Dva};

/// Cloned blocks the table holds at most (about 64 bytes of memory each
/// with the map's nodes, 24 bytes on disk: 2 Mi entries is about 128 MiB
/// of memory and 48 MiB on disk, and names 256 GiB of 128 KiB records).
/// Past it a clone copies the bytes instead: memory stays bounded however
/// many clones are made.
pub const CLONED_BLOCKS_MAX: usize = 1 << 21;

/// The extra references of cloned blocks, and the changes not yet on disk.
#[derive(Default)]
pub struct CloneTable {
    /// (vdev, offset) of a block's first copy -> (its allocated size,
    /// references beyond the first). Ordered, so a rewrite of the table is
    /// the same bytes on every run (the simulator replays it).
    extra: BTreeMap<(u32, u64), (u32, u64)>,
    /// Changes since the last build took them, in order.
    pending: Vec<CloneRecord>,
    /// The space the extra references save, kept as they change (status
    /// and metrics ask often; the table may hold millions).
    saved: u64,
}

impl CloneTable {
    /// Notes one more reference of `pointer`'s block (a clone links it).
    /// False, with nothing changed, when the table is full.
    pub fn add_reference(&mut self, pointer: &BlockPointer) -> bool {
        let dva = pointer.dvas[0];
        assert!(!dva.is_empty(), "a hole cannot be cloned");
        let key = (dva.vdev, dva.offset);
        if !self.extra.contains_key(&key) && self.extra.len() >= CLONED_BLOCKS_MAX {
            return false;
        }
        let entry = self.extra.entry(key).or_insert((dva.asize, 0));
        assert_eq!(entry.0, dva.asize, "{dva:?} cloned with another size");
        entry.1 += 1;
        self.saved = self.saved.saturating_add(u64::from(dva.asize));
        self.note(dva, 1);
        true
    }

    /// Takes one reference of `dva`'s block away if it has more than one:
    /// true then (its space stays allocated), false when the caller holds
    /// its last reference and must free it.
    pub fn drop_reference(&mut self, dva: &Dva) -> bool {
        let key = (dva.vdev, dva.offset);
        let Some(entry) = self.extra.get_mut(&key) else {
            return false;
        };
        entry.1 -= 1;
        self.saved = self.saved.saturating_sub(u64::from(entry.0));
        if entry.1 == 0 {
            self.extra.remove(&key);
        }
        self.note(*dva, -1);
        true
    }

    fn note(&mut self, dva: Dva, delta: i64) {
        // Two changes of one block in a row make one record.
        if let Some(last) = self.pending.last_mut() {
            if last.vdev == dva.vdev && last.offset == dva.offset {
                last.delta += delta;
                if last.delta == 0 {
                    self.pending.pop();
                }
                return;
            }
        }
        self.pending.push(CloneRecord {
            vdev: dva.vdev,
            asize: dva.asize,
            offset: dva.offset,
            delta,
        });
    }

    /// References of `dva`'s block beyond the first (0: not cloned).
    pub fn extra_references(&self, dva: &Dva) -> u64 {
        self.extra
            .get(&(dva.vdev, dva.offset))
            .map_or(0, |(_, count)| *count)
    }

    /// For a walk that reaches a block once per link (scrub, resilver):
    /// false when `pointer` is a cloned block `seen` already holds, so its
    /// work is done once; `seen` gathers the cloned blocks met (at most the
    /// table's entries). An uncloned block is always new.
    pub fn first_sighting(
        &self,
        seen: &mut rustc_hash::FxHashSet<(u32, u64)>,
        pointer: &BlockPointer,
    ) -> bool {
        let dva = pointer.dvas[0];
        self.extra_references(&dva) == 0 || seen.insert((dva.vdev, dva.offset))
    }

    /// Cloned blocks in the table.
    pub fn len(&self) -> usize {
        self.extra.len()
    }

    pub fn is_empty(&self) -> bool {
        self.extra.is_empty()
    }

    /// Space the clones save: each extra reference's allocated bytes.
    pub fn saved_bytes(&self) -> u64 {
        self.saved
    }

    /// The changes not yet taken by a build (the build appends them).
    pub fn take_pending(&mut self) -> Vec<CloneRecord> {
        std::mem::take(&mut self.pending)
    }

    /// Whether changes wait for a build.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The whole table as records (one per cloned block), for a rewrite.
    pub fn records(&self) -> Vec<CloneRecord> {
        self.extra
            .iter()
            .map(|(&(vdev, offset), &(asize, count))| CloneRecord {
                vdev,
                asize,
                offset,
                delta: count as i64,
            })
            .collect()
    }

    /// Applies a record read back at import. An entry going below zero, a
    /// size that changes, or more entries than the bound mean the table
    /// is damaged.
    pub fn apply(&mut self, record: &CloneRecord) -> Result<(), String> {
        let key = (record.vdev, record.offset);
        let (asize, count) = match self.extra.get(&key) {
            Some(&entry) => entry,
            None if self.extra.len() >= CLONED_BLOCKS_MAX => {
                return Err(format!("more than {CLONED_BLOCKS_MAX} cloned blocks"));
            }
            None => (record.asize, 0),
        };
        let count = i64::try_from(count)
            .ok()
            .and_then(|count| count.checked_add(record.delta))
            .filter(|count| *count >= 0 && asize == record.asize)
            .ok_or_else(|| format!("record {record:?} against count {count}"))?;
        let before = self.extra.get(&key).map_or(0, |(_, count)| *count);
        // (Saturating: a damaged table's counts may be absurd; it is
        // refused as a whole later, or its figure is only shown.)
        let size = u64::from(asize);
        self.saved = self
            .saved
            .saturating_sub(before.saturating_mul(size))
            .saturating_add((count as u64).saturating_mul(size));
        if count == 0 {
            self.extra.remove(&key);
        } else {
            self.extra.insert(key, (asize, count as u64));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectType;

    fn block(offset: u64) -> BlockPointer {
        let mut pointer = BlockPointer::hole(0, ObjectType::FsFile, 5);
        pointer.dvas[0] = Dva {
            vdev: 0,
            asize: 16384,
            offset,
        };
        pointer
    }

    #[test]
    fn the_last_reference_frees_and_the_records_rebuild_the_counts() {
        let mut table = CloneTable::default();
        let (a, b) = (block(0), block(16384));
        assert!(
            !table.drop_reference(&a.dvas[0]),
            "an uncloned block is freed"
        );
        assert!(table.add_reference(&a));
        assert!(table.add_reference(&a));
        assert!(table.add_reference(&b));
        assert_eq!(table.extra_references(&a.dvas[0]), 2);
        assert_eq!(table.saved_bytes(), 3 * 16384);
        let mut pending = table.take_pending();
        assert_eq!(pending.len(), 2, "a's two clones make one record");
        assert!(table.drop_reference(&a.dvas[0]));
        assert!(table.drop_reference(&a.dvas[0]));
        assert!(!table.drop_reference(&a.dvas[0]), "the last reference");
        assert!(table.drop_reference(&b.dvas[0]));
        assert!(table.is_empty());
        pending.extend(table.take_pending());
        let mut rebuilt = CloneTable::default();
        for record in &pending[..2] {
            rebuilt.apply(record).unwrap();
        }
        assert_eq!(rebuilt.records(), {
            let mut again = CloneTable::default();
            again.add_reference(&a);
            again.add_reference(&a);
            again.add_reference(&b);
            again.records()
        });
        for record in &pending[2..] {
            rebuilt.apply(record).unwrap();
        }
        assert!(rebuilt.is_empty());
        let negative = CloneRecord {
            delta: -1,
            ..pending[0]
        };
        assert!(rebuilt.apply(&negative).is_err());
    }
}
