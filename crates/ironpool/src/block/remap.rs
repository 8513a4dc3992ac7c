//! Where the blocks of removed top-level vdevs are now (device removal):
//! the in-memory form of their indirect mappings (`format::remap`), and of
//! the mapping a removal in progress is building.
//!
//! While a vdev is being removed its blocks are still read where they are,
//! and a free of a block already copied frees the copy too. Once it is
//! removed, every read, scrub and resilver of a copy that was on it goes to
//! the copy the mapping names ([`Remaps::target`]), and a free frees that
//! copy. Entries are never dropped: a block freed after its move leaves an
//! entry nobody asks for, as OpenZFS keeps obsolete mapping entries until
//! it condenses them.

use std::collections::BTreeMap;

use crate::format::bp::Dva;
use crate::format::remap::MappingEntry;

/// Most block copies the mappings of a pool may hold: each costs about 48
/// bytes of memory for as long as the pool is open (96 MiB at the bound),
/// and a removal that would need more is refused as it reaches it. At
/// 128 KiB records this is a 256 GiB vdev; at 16 KiB, 32 GiB.
pub const MAPPED_BLOCKS_MAX: usize = 1 << 21;

/// The mappings of removed vdevs and of the one being removed.
#[derive(Debug, Default)]
pub struct Remaps {
    /// By vdev: source offset -> (source allocated size, where it is now).
    maps: BTreeMap<u32, BTreeMap<u64, (u32, Dva)>>,
    /// The vdev being removed, whose blocks are still read in place.
    removing: Option<u32>,
    /// Entries of the vdev being removed added since the last txg build
    /// took them (see `pool::removal::build_step`).
    pending: Vec<MappingEntry>,
    /// Entries held, over every vdev.
    count: usize,
}

impl Remaps {
    /// True when no vdev was or is being removed: nothing to look up.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// The vdev being removed, if one is.
    pub fn removing(&self) -> Option<u32> {
        self.removing
    }

    /// Starts (`Some`) or ends (`None`) the removal of a vdev: its mapping
    /// starts empty, and one that ends without completing is dropped by
    /// [`Remaps::drop_vdev`].
    pub fn set_removing(&mut self, vdev: Option<u32>) {
        if let Some(vdev) = vdev {
            self.maps.entry(vdev).or_default();
        }
        self.removing = vdev;
    }

    /// True when `vdev` has a mapping (removed, or being removed).
    pub fn is_mapped(&self, vdev: u32) -> bool {
        self.maps.contains_key(&vdev)
    }

    /// True when reads of `vdev` go through its mapping: it was removed.
    pub fn is_indirect(&self, vdev: u32) -> bool {
        self.removing != Some(vdev) && self.maps.contains_key(&vdev)
    }

    /// Where the block copy `dva` was moved to, if it was.
    pub fn target(&self, dva: &Dva) -> Option<Dva> {
        let (asize, target) = self.maps.get(&dva.vdev)?.get(&dva.offset)?;
        (*asize == dva.asize).then_some(*target)
    }

    /// Where a copy is read from: itself, or for a copy on a removed vdev
    /// where it was moved (`None`: it is on a removed vdev and was never
    /// moved, so it cannot be read).
    pub fn locate(&self, dva: &Dva) -> Option<Dva> {
        if self.is_empty() || !self.is_indirect(dva.vdev) {
            return Some(*dva);
        }
        self.target(dva)
    }

    /// Records that the copy at `source` (on the vdev being removed) now
    /// lives at `target`. Refused when the mappings are full or the
    /// source overlaps a copy already moved.
    pub fn insert(&mut self, source: Dva, target: Dva) -> Result<(), String> {
        assert_eq!(
            Some(source.vdev),
            self.removing,
            "only the vdev being removed gains entries"
        );
        assert_ne!(target.vdev, source.vdev, "a copy moves to another vdev");
        let entry = MappingEntry {
            source_offset: source.offset,
            source_asize: source.asize,
            target,
        };
        self.add(source.vdev, entry)?;
        self.pending.push(entry);
        Ok(())
    }

    /// Adds the entries of `vdev`'s mapping as read from disk (at import).
    pub fn load(&mut self, vdev: u32, entries: &[MappingEntry]) -> Result<(), String> {
        self.maps.entry(vdev).or_default();
        for entry in entries {
            if entry.target.vdev == vdev {
                return Err(format!("vdev {vdev}: an entry maps to its own vdev"));
            }
            self.add(vdev, *entry)?;
        }
        Ok(())
    }

    fn add(&mut self, vdev: u32, entry: MappingEntry) -> Result<(), String> {
        if self.count >= MAPPED_BLOCKS_MAX {
            return Err(format!(
                "the pool's mappings hold {MAPPED_BLOCKS_MAX} blocks, the most they may"
            ));
        }
        let map = self.maps.entry(vdev).or_default();
        let start = entry.source_offset;
        let end = start + u64::from(entry.source_asize);
        let before = map
            .range(..=start)
            .next_back()
            .is_some_and(|(offset, (asize, _))| offset + u64::from(*asize) > start);
        let after = map.range(start..end).next().is_some();
        if before || after {
            return Err(format!(
                "vdev {vdev}: the moved copy at {start:#x}..{end:#x} overlaps another"
            ));
        }
        map.insert(start, (entry.source_asize, entry.target));
        self.count += 1;
        Ok(())
    }

    /// The entries added since the last call, for the txg being built.
    pub fn take_pending(&mut self) -> Vec<MappingEntry> {
        std::mem::take(&mut self.pending)
    }

    /// `vdev`'s entries: (source offset, source size, target), in offset
    /// order.
    pub fn entries(&self, vdev: u32) -> impl Iterator<Item = (u64, u32, Dva)> + '_ {
        self.maps
            .get(&vdev)
            .into_iter()
            .flat_map(|map| map.iter())
            .map(|(offset, (asize, target))| (*offset, *asize, *target))
    }

    /// Entries `vdev` holds.
    pub fn len(&self, vdev: u32) -> usize {
        self.maps.get(&vdev).map_or(0, BTreeMap::len)
    }

    /// Forgets `vdev`'s mapping: a removal that stopped before its end
    /// (the vdev keeps its blocks, the copies are freed by the caller).
    pub fn drop_vdev(&mut self, vdev: u32) {
        if let Some(map) = self.maps.remove(&vdev) {
            self.count -= map.len();
        }
        if self.removing == Some(vdev) {
            self.removing = None;
            self.pending.clear();
        }
    }

    /// The removal of the vdev being removed is complete: its reads go
    /// through its mapping from now on.
    pub fn finish_removing(&mut self) {
        assert!(self.pending.is_empty(), "every entry is on disk first");
        self.removing = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dva(vdev: u32, offset: u64, asize: u32) -> Dva {
        Dva {
            vdev,
            asize,
            offset,
        }
    }

    #[test]
    fn moved_copies_are_found_once_the_removal_is_done() {
        let mut remaps = Remaps::default();
        assert!(remaps.is_empty());
        remaps.set_removing(Some(1));
        remaps
            .insert(dva(1, 0x2000, 0x1000), dva(0, 0x9000, 0x1000))
            .unwrap();
        // While it is being removed, reads stay in place.
        assert_eq!(
            remaps.locate(&dva(1, 0x2000, 0x1000)),
            Some(dva(1, 0x2000, 0x1000))
        );
        assert_eq!(remaps.take_pending().len(), 1);
        // Overlaps are refused, whole or in part.
        assert!(remaps
            .insert(dva(1, 0x2800, 0x1000), dva(0, 0xa000, 0x1000))
            .is_err());
        assert!(remaps
            .insert(dva(1, 0x1800, 0x1000), dva(0, 0xa000, 0x1000))
            .is_err());
        remaps.finish_removing();
        assert_eq!(
            remaps.locate(&dva(1, 0x2000, 0x1000)),
            Some(dva(0, 0x9000, 0x1000))
        );
        // A copy on the removed vdev that never moved cannot be read; one
        // on another vdev is where it is.
        assert_eq!(remaps.locate(&dva(1, 0x4000, 0x1000)), None);
        assert_eq!(remaps.locate(&dva(1, 0x2000, 0x800)), None);
        assert_eq!(
            remaps.locate(&dva(0, 0x2000, 0x1000)),
            Some(dva(0, 0x2000, 0x1000))
        );
    }

    #[test]
    fn a_stopped_removal_forgets_its_mapping() {
        let mut remaps = Remaps::default();
        remaps.set_removing(Some(2));
        remaps.insert(dva(2, 0, 0x1000), dva(0, 0, 0x1000)).unwrap();
        remaps.drop_vdev(2);
        assert!(remaps.is_empty());
        assert_eq!(remaps.removing(), None);
        assert!(remaps.take_pending().is_empty());
        assert_eq!(remaps.count, 0);
    }
}
