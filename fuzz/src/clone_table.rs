//! Target `clone_table`: `format::clones::decode_records` on a block
//! reference table object's bytes, then the counts an import builds from
//! them (`block::clones::CloneTable::apply`).
//!
//! Input: the object's bytes. A length that is not a whole number of records
//! must be refused; the whole records before the tail are decoded as well.
//! Records that decode must re-encode to the same bytes, and applying them
//! may refuse a record (a count below zero, a size that changes) but must
//! never panic; what it keeps rewrites to records that apply again to the
//! same counts.

use ironpool::block::clones::CloneTable;
use ironpool::format::clones::{decode_records, encode_records, CLONE_RECORD_BYTES};

pub fn check(data: &[u8]) {
    let whole_bytes = data.len() - data.len() % CLONE_RECORD_BYTES;
    if whole_bytes != data.len() {
        assert!(
            decode_records(data).is_err(),
            "{} bytes accepted as whole records",
            data.len()
        );
    }
    let Ok(records) = decode_records(&data[..whole_bytes]) else {
        return;
    };
    assert_eq!(
        encode_records(&records),
        &data[..whole_bytes],
        "clone records do not round trip"
    );
    let mut table = CloneTable::default();
    for record in &records {
        if table.apply(record).is_err() {
            return;
        }
    }
    let kept = table.records();
    let mut again = CloneTable::default();
    for record in &kept {
        again
            .apply(record)
            .unwrap_or_else(|error| panic!("a kept count does not apply again: {error}"));
    }
    assert_eq!(
        again.records(),
        kept,
        "the counts do not rebuild from their records"
    );
}
