//! Target `uberblock`: `format::uberblock::Uberblock::decode` on one ring slot.
//!
//! Input: the slot (decode reads the first 1024 bytes). When the only fault is
//! the checksum, it is recomputed and the slot decoded again, so mutations
//! reach the field checks and the embedded dnode.

use ironpool::format::checksum::embedded;
use ironpool::format::uberblock::{Uberblock, UBERBLOCK_BYTES};
use ironpool::format::FormatError;

/// Where the slot's checksum sits (the last 16 bytes).
const CHECKSUM_OFFSET: usize = UBERBLOCK_BYTES - 16;

pub fn check(data: &[u8]) {
    match Uberblock::decode(data) {
        Ok(uberblock) => check_decoded(&uberblock),
        Err(FormatError::ChecksumMismatch(_)) => match Uberblock::decode(&seal(data)) {
            Ok(uberblock) => check_decoded(&uberblock),
            Err(FormatError::ChecksumMismatch(_)) => panic!("uberblock checksum still wrong after sealing: layout drifted"),
            Err(_) => {}
        },
        Err(_) => {}
    }
}

/// The first slot of `data` with its checksum recomputed (`data` holds at least
/// a slot: decode checks the length before the checksum).
pub fn seal(data: &[u8]) -> [u8; UBERBLOCK_BYTES] {
    let mut slot = [0u8; UBERBLOCK_BYTES];
    slot.copy_from_slice(&data[..UBERBLOCK_BYTES]);
    let checksum = embedded(&slot[..CHECKSUM_OFFSET]);
    slot[CHECKSUM_OFFSET..].copy_from_slice(&checksum);
    slot
}

fn check_decoded(uberblock: &Uberblock) {
    assert!(uberblock.txg != 0 && !uberblock.dnode_table.is_free());
    crate::dnode::check_decoded(&uberblock.dnode_table);
    let again = Uberblock::decode(&uberblock.encode()).unwrap_or_else(|error| panic!("re-encoded uberblock does not decode: {error}: {uberblock:?}"));
    assert_eq!(again, *uberblock, "uberblock does not round trip");
}
