//! Target `indirect_mapping`: `format::remap::decode_entries` on a removed
//! vdev's mapping object, then the mapping an import builds from it
//! (`block::remap::Remaps::load`).
//!
//! Input: the object's bytes. A length that is not a whole number of entries
//! must be refused; the whole entries before the tail are decoded as well.
//! Entries that decode must re-encode to the same bytes; loading them may
//! refuse an entry (one that overlaps another, or maps to its own vdev) but
//! must never panic, and a mapping that loads finds every entry's block
//! where the entry says, and nothing on the removed vdev that no entry names.

use ironpool::block::remap::Remaps;
use ironpool::format::bp::Dva;
use ironpool::format::remap::{decode_entries, encode_entries, MAPPING_ENTRY_BYTES};

/// The removed vdev the entries are loaded for.
const VDEV: u32 = 1;

pub fn check(data: &[u8]) {
    let whole_bytes = data.len() - data.len() % MAPPING_ENTRY_BYTES;
    if whole_bytes != data.len() {
        assert!(
            decode_entries(data).is_err(),
            "{} bytes accepted as whole entries",
            data.len()
        );
    }
    let Ok(entries) = decode_entries(&data[..whole_bytes]) else {
        return;
    };
    assert_eq!(
        encode_entries(&entries),
        &data[..whole_bytes],
        "mapping entries do not round trip"
    );
    let mut remaps = Remaps::default();
    if remaps.load(VDEV, &entries).is_err() {
        return;
    }
    assert_eq!(remaps.len(VDEV), entries.len());
    for entry in &entries {
        let source = Dva {
            vdev: VDEV,
            asize: entry.source_asize,
            offset: entry.source_offset,
        };
        assert_eq!(remaps.locate(&source), Some(entry.target), "{entry:?}");
        // A copy of another size at the same place was never moved.
        let other = Dva {
            asize: entry.source_asize.wrapping_add(1).max(1),
            ..source
        };
        if other.asize != source.asize {
            assert_eq!(remaps.locate(&other), None, "{entry:?}");
        }
    }
}
