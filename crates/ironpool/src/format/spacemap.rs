//! Space map records: 16-byte records of allocations and frees. They make up
//! two kinds of objects:
//! - a metaslab's **space map**: a checkpoint of the metaslab as of a txg (its
//!   allocated ranges, then its still-deferred frees with their txgs);
//! - the pool's **space log**: every txg's allocations and frees for all
//!   metaslabs, appended at each commit (so a commit writes one log tail, not a
//!   block per metaslab touched). Metaslabs are checkpointed a few per txg, and
//!   log objects older than every metaslab's checkpoint are freed.
//!
//! Record layout (16 bytes, little-endian):
//!
//! | word | bits | field |
//! |---|---|---|
//! | 0 | 63..56 | kind: 1 allocate, 2 free, 3 txg marker, 4 vdev marker |
//! | 0 | 55..0 | offset in bytes from the data area start (allocate, free) |
//! | 1 | 63..0 | length in bytes (allocate, free), the txg (txg marker), or the top-level vdev id (vdev marker) |
//!
//! A txg marker precedes the records of that txg, so import can tell which frees
//! are recent enough to still be deferred; in the log a vdev marker says which
//! top-level vdev the following offsets belong to.

use super::{get_u64, invalid, put_u64, FormatError};

pub const RECORD_BYTES: usize = 16;
const OFFSET_MASK: u64 = (1 << 56) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Allocate { offset: u64, length: u64 },
    Free { offset: u64, length: u64 },
    Txg(u64),
    Vdev(u32),
}

impl Record {
    pub fn encode(&self, out: &mut [u8]) {
        let (kind, first, second) = match *self {
            Record::Allocate { offset, length } => (1u64, offset, length),
            Record::Free { offset, length } => (2, offset, length),
            Record::Txg(txg) => (3, 0, txg),
            Record::Vdev(vdev) => (4, 0, vdev as u64),
        };
        assert!(
            first <= OFFSET_MASK,
            "space map offset {first} does not fit in 56 bits"
        );
        put_u64(out, 0, (kind << 56) | first);
        put_u64(out, 8, second);
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, FormatError> {
        let word = get_u64(bytes, 0);
        let second = get_u64(bytes, 8);
        let offset = word & OFFSET_MASK;
        let record = match word >> 56 {
            1 => Record::Allocate {
                offset,
                length: second,
            },
            2 => Record::Free {
                offset,
                length: second,
            },
            3 => Record::Txg(second),
            4 => match u32::try_from(second) {
                Ok(vdev) => Record::Vdev(vdev),
                Err(_) => return Err(invalid("space map record", format!("vdev {second}"))),
            },
            kind => return Err(invalid("space map record", format!("kind {kind}"))),
        };
        if let Record::Allocate { length, .. } | Record::Free { length, .. } = record {
            if length == 0 || offset.checked_add(length).is_none() {
                return Err(invalid(
                    "space map record",
                    format!("range {offset}+{length}"),
                ));
            }
        }
        Ok(record)
    }
}

/// Encodes records into a byte vector.
pub fn encode_records(records: &[Record]) -> Vec<u8> {
    let mut out = vec![0u8; records.len() * RECORD_BYTES];
    for (index, record) in records.iter().enumerate() {
        record.encode(&mut out[index * RECORD_BYTES..(index + 1) * RECORD_BYTES]);
    }
    out
}

/// Decodes a whole space map's bytes.
pub fn decode_records(bytes: &[u8]) -> Result<Vec<Record>, FormatError> {
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        return Err(invalid(
            "space map",
            format!("{} bytes is not a whole number of records", bytes.len()),
        ));
    }
    bytes
        .chunks_exact(RECORD_BYTES)
        .map(Record::decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let records = vec![
            Record::Txg(5),
            Record::Allocate {
                offset: 4096,
                length: 1 << 20,
            },
            Record::Free {
                offset: OFFSET_MASK - 512,
                length: 512,
            },
            Record::Vdev(3),
        ];
        assert_eq!(decode_records(&encode_records(&records)).unwrap(), records);
        assert!(decode_records(&[0u8; 16]).is_err());
        assert!(decode_records(&[0u8; 15]).is_err());
        let mut zero_length = encode_records(&[Record::Free {
            offset: 0,
            length: 1,
        }]);
        zero_length[8] = 0;
        assert!(decode_records(&zero_length).is_err());
    }
}
