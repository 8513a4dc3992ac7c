//! Target `block_pointer`: `format::bp::BlockPointer::decode`.
//!
//! Input: one 128-byte pointer; a longer input is cut to 128 bytes, so the
//! fuzzer's length changes do not all end in the length check.

use ironpool::format::bp::{BlockPointer, BLOCK_POINTER_BYTES};

pub fn check(data: &[u8]) {
    let window = &data[..data.len().min(BLOCK_POINTER_BYTES)];
    if let Ok(pointer) = BlockPointer::decode(window) {
        check_decoded(&pointer);
    }
}

/// The accessors the engine uses are total on a decoded pointer, and it round
/// trips.
pub fn check_decoded(pointer: &BlockPointer) {
    if !pointer.is_hole() {
        pointer.validate().unwrap_or_else(|error| panic!("decoded pointer fails validate: {error}: {pointer:?}"));
    }
    for dva in pointer.copies() {
        assert!(dva.end() >= dva.offset);
    }
    let _ = pointer.allocated_bytes();
    let mut bytes = [0u8; BLOCK_POINTER_BYTES];
    pointer.encode(&mut bytes);
    let again = BlockPointer::decode(&bytes).unwrap_or_else(|error| panic!("re-encoded pointer does not decode: {error}: {pointer:?}"));
    assert_eq!(again, *pointer, "block pointer does not round trip");
}
