//! Target `dnode`: `format::dnode::Dnode::decode`.
//!
//! Input: one 512-byte dnode; a longer input is cut to 512 bytes.

use ironpool::format::dnode::{Dnode, DNODE_BYTES};

pub fn check(data: &[u8]) {
    let window = &data[..data.len().min(DNODE_BYTES)];
    if let Ok(dnode) = Dnode::decode(window) {
        check_decoded(&dnode);
    }
}

/// The accessors the object layer uses are total on a decoded dnode in use,
/// its root pointer is sound, and the dnode round trips.
pub fn check_decoded(dnode: &Dnode) {
    if !dnode.is_free() {
        dnode.validate().unwrap_or_else(|error| panic!("decoded dnode fails validate: {error}: {dnode:?}"));
        let _ = dnode.data_block_bytes();
        let _ = dnode.indirect_block_bytes();
        let _ = dnode.pointers_per_indirect_shift();
        assert!(dnode.capacity_blocks() >= 1);
        crate::block_pointer::check_decoded(&dnode.root);
    }
    let mut bytes = [0u8; DNODE_BYTES];
    dnode.encode(&mut bytes);
    let again = Dnode::decode(&bytes).unwrap_or_else(|error| panic!("re-encoded dnode does not decode: {error}: {dnode:?}"));
    assert_eq!(again, *dnode, "dnode does not round trip");
}
