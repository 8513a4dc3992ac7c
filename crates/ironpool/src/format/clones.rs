//! The block reference table's records (block cloning, format 3): how many
//! more references than one a cloned block has.
//!
//! The table is one pool-level object (type 12, named by the directory's
//! `clone_table`), a log of 24-byte records appended at each commit that
//! changed a count, rewritten whole (one record per cloned block) when it
//! holds more than twice the records it needs. Import adds the deltas up.
//!
//! Record layout (24 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | top-level vdev of the block's first copy |
//! | 4 | 4 | that copy's allocated size (for the space the clones save) |
//! | 8 | 8 | the copy's offset in the vdev's data area |
//! | 16 | 8 | change of the count of extra references (signed) |

use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError};

/// Bytes of one record.
pub const CLONE_RECORD_BYTES: usize = 24;

/// A change of a cloned block's count of references beyond its first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloneRecord {
    pub vdev: u32,
    pub asize: u32,
    pub offset: u64,
    pub delta: i64,
}

impl CloneRecord {
    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), CLONE_RECORD_BYTES);
        put_u32(out, 0, self.vdev);
        put_u32(out, 4, self.asize);
        put_u64(out, 8, self.offset);
        put_u64(out, 16, self.delta as u64);
    }

    pub fn decode(bytes: &[u8]) -> Result<CloneRecord, FormatError> {
        if bytes.len() != CLONE_RECORD_BYTES {
            return Err(invalid(
                "clone record",
                format!("{} bytes, expected {CLONE_RECORD_BYTES}", bytes.len()),
            ));
        }
        let record = CloneRecord {
            vdev: get_u32(bytes, 0),
            asize: get_u32(bytes, 4),
            offset: get_u64(bytes, 8),
            delta: get_u64(bytes, 16) as i64,
        };
        if record.asize == 0 || record.delta == 0 {
            return Err(invalid("clone record", format!("{record:?}")));
        }
        Ok(record)
    }
}

/// Encodes `records` one after another.
pub fn encode_records(records: &[CloneRecord]) -> Vec<u8> {
    let mut bytes = vec![0u8; records.len() * CLONE_RECORD_BYTES];
    for (record, out) in records
        .iter()
        .zip(bytes.chunks_exact_mut(CLONE_RECORD_BYTES))
    {
        record.encode(out);
    }
    bytes
}

/// Decodes a table object's bytes: whole records only.
pub fn decode_records(bytes: &[u8]) -> Result<Vec<CloneRecord>, FormatError> {
    if !bytes.len().is_multiple_of(CLONE_RECORD_BYTES) {
        return Err(invalid(
            "block reference table",
            format!("{} bytes, not whole records", bytes.len()),
        ));
    }
    bytes
        .chunks_exact(CLONE_RECORD_BYTES)
        .map(CloneRecord::decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_empty_ones_are_refused() {
        let records = [
            CloneRecord {
                vdev: 1,
                asize: 16384,
                offset: 1 << 40,
                delta: 3,
            },
            CloneRecord {
                vdev: 0,
                asize: 4096,
                offset: 8192,
                delta: -1,
            },
        ];
        let bytes = encode_records(&records);
        assert_eq!(decode_records(&bytes).unwrap(), records);
        assert!(decode_records(&bytes[..30]).is_err(), "a record cut short");
        assert!(CloneRecord::decode(&[0u8; CLONE_RECORD_BYTES]).is_err());
        assert!(CloneRecord::decode(&bytes[..20]).is_err());
    }
}
