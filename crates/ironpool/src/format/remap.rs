//! The indirect mapping of a removed top-level vdev (device removal,
//! format 4): where each block that was on it lives now.
//!
//! A removal copies every block on the vdev to the other vdevs, one block
//! at a time, and writes down where each went. Block pointers are never
//! rewritten (a snapshot's tree is immutable, and its checksums cover the
//! pointers below): a read of a copy on the removed vdev looks its place
//! up here. One entry per block copy, so a block is always read from one
//! place, whole (OpenZFS maps ranges and may split a block; mapping blocks
//! keeps every read, scrub and resilver of a moved block the same as of
//! any other).
//!
//! The mapping is one pool-level object (type 13), named by the
//! directory's removal record while the removal runs and by its
//! `indirect` list once it is done: 32-byte entries appended at each
//! commit, in the txg that also records the new copies' space as
//! allocated, so the two always agree on disk. It is never rewritten.
//!
//! Entry layout (32 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | offset of the copy on the removed vdev (its data area) |
//! | 8 | 4 | its allocated size there |
//! | 12 | 4 | the top-level vdev it was copied to |
//! | 16 | 8 | the offset of the new copy there |
//! | 24 | 4 | the new copy's allocated size |
//! | 28 | 4 | reserved, zero |

use super::bp::Dva;
use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError};

/// Bytes of one entry.
pub const MAPPING_ENTRY_BYTES: usize = 32;

/// One block copy that moved off a removed vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingEntry {
    /// Where it was on the removed vdev.
    pub source_offset: u64,
    pub source_asize: u32,
    /// Where it is now.
    pub target: Dva,
}

impl MappingEntry {
    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), MAPPING_ENTRY_BYTES);
        put_u64(out, 0, self.source_offset);
        put_u32(out, 8, self.source_asize);
        put_u32(out, 12, self.target.vdev);
        put_u64(out, 16, self.target.offset);
        put_u32(out, 24, self.target.asize);
        put_u32(out, 28, 0);
    }

    pub fn decode(bytes: &[u8]) -> Result<MappingEntry, FormatError> {
        if bytes.len() != MAPPING_ENTRY_BYTES {
            return Err(invalid(
                "mapping entry",
                format!("{} bytes, expected {MAPPING_ENTRY_BYTES}", bytes.len()),
            ));
        }
        let entry = MappingEntry {
            source_offset: get_u64(bytes, 0),
            source_asize: get_u32(bytes, 8),
            target: Dva {
                vdev: get_u32(bytes, 12),
                offset: get_u64(bytes, 16),
                asize: get_u32(bytes, 24),
            },
        };
        let ends = entry
            .source_offset
            .checked_add(u64::from(entry.source_asize))
            .is_some()
            && entry
                .target
                .offset
                .checked_add(u64::from(entry.target.asize))
                .is_some();
        if entry.source_asize == 0 || entry.target.asize == 0 || !ends || get_u32(bytes, 28) != 0 {
            return Err(invalid("mapping entry", format!("{entry:?}")));
        }
        Ok(entry)
    }
}

/// Encodes `entries` one after another.
pub fn encode_entries(entries: &[MappingEntry]) -> Vec<u8> {
    let mut bytes = vec![0u8; entries.len() * MAPPING_ENTRY_BYTES];
    for (entry, out) in entries
        .iter()
        .zip(bytes.chunks_exact_mut(MAPPING_ENTRY_BYTES))
    {
        entry.encode(out);
    }
    bytes
}

/// Decodes a mapping object's bytes: whole entries only.
pub fn decode_entries(bytes: &[u8]) -> Result<Vec<MappingEntry>, FormatError> {
    if !bytes.len().is_multiple_of(MAPPING_ENTRY_BYTES) {
        return Err(invalid(
            "indirect mapping",
            format!("{} bytes, not whole entries", bytes.len()),
        ));
    }
    bytes
        .chunks_exact(MAPPING_ENTRY_BYTES)
        .map(MappingEntry::decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let entries = vec![
            MappingEntry {
                source_offset: 0x1000,
                source_asize: 16384,
                target: Dva {
                    vdev: 2,
                    asize: 16384,
                    offset: 0x40_0000,
                },
            },
            MappingEntry {
                source_offset: u64::MAX - 8192,
                source_asize: 4096,
                target: Dva {
                    vdev: 0,
                    asize: 8192,
                    offset: 0,
                },
            },
        ];
        let bytes = encode_entries(&entries);
        assert_eq!(decode_entries(&bytes).unwrap(), entries);
        assert!(decode_entries(&bytes[..40]).is_err());
        let mut zero_size = bytes.clone();
        zero_size[8..12].fill(0);
        assert!(decode_entries(&zero_size).is_err());
        let mut reserved = bytes.clone();
        reserved[28] = 1;
        assert!(decode_entries(&reserved).is_err());
        let mut overflow = bytes;
        overflow[0..8].fill(0xff);
        assert!(decode_entries(&overflow).is_err());
    }
}
