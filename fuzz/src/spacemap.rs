//! Target `spacemap`: `format::spacemap::decode_records` on a space map's or
//! space log's bytes.
//!
//! Input: the object's bytes. A length that is not a whole number of records
//! must be refused; the whole records before the tail are decoded as well, so
//! that such inputs still reach the record checks.

use ironpool::format::spacemap::{decode_records, encode_records, Record, RECORD_BYTES};

pub fn check(data: &[u8]) {
    let whole_bytes = data.len() - data.len() % RECORD_BYTES;
    if whole_bytes != data.len() {
        assert!(decode_records(data).is_err(), "{} bytes accepted as whole records", data.len());
    }
    if let Ok(records) = decode_records(&data[..whole_bytes]) {
        check_decoded(&records, whole_bytes);
    }
}

/// Decoded records re-encode to as many bytes and decode to the same records.
fn check_decoded(records: &[Record], length_bytes: usize) {
    for record in records {
        if let Record::Allocate { offset, length } | Record::Free { offset, length } = *record {
            assert!(length > 0 && offset.checked_add(length).is_some(), "decoded range {offset}+{length}");
        }
    }
    let bytes = encode_records(records);
    assert_eq!(bytes.len(), length_bytes);
    let again = decode_records(&bytes).unwrap_or_else(|error| panic!("re-encoded space map does not decode: {error}"));
    assert_eq!(again, records, "space map records do not round trip");
}
