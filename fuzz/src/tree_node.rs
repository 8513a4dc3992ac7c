//! Target `tree_node`: an indirect block of an object's block-pointer tree,
//! decoded as `object` decodes one it loads (`ObjectSet::load` in
//! `crates/ironpool/src/object/mod.rs`): the block must be the dnode's indirect
//! block size, and is a sequence of 128-byte pointers, each decoded with
//! `BlockPointer::decode`, each non-hole one one level below the node.
//!
//! Input: byte 0 picks the node's level (1 to `LEVEL_MAX`), the rest is the
//! start of a 4 KiB indirect block (the smallest size); the block is zero
//! filled past the input (zeros are holes), and cut at 4 KiB.
//!
//! The decoding loop is mirrored here because the object layer does it inside
//! an async load with its cache; if it ever moves to a pure function, call
//! that instead.

use ironpool::format::bp::{BlockPointer, BLOCK_POINTER_BYTES, LEVEL_MAX};
use ironpool::format::dnode::INDIRECT_BLOCK_SHIFT_MIN;

/// Size of the indirect blocks fuzzed: the smallest, so each input is cheap.
const INDIRECT_BLOCK_BYTES: usize = 1 << INDIRECT_BLOCK_SHIFT_MIN;

pub fn check(data: &[u8]) {
    let Some((&level_selector, body)) = data.split_first() else { return };
    let level = 1 + level_selector % LEVEL_MAX;
    let mut block = vec![0u8; INDIRECT_BLOCK_BYTES];
    let copied_bytes = body.len().min(INDIRECT_BLOCK_BYTES);
    block[..copied_bytes].copy_from_slice(&body[..copied_bytes]);
    let Ok(pointers) = decode_indirect_node(&block, level, INDIRECT_BLOCK_BYTES as u64) else { return };
    assert_eq!(pointers.len(), INDIRECT_BLOCK_BYTES / BLOCK_POINTER_BYTES);
    let mut again = vec![0u8; INDIRECT_BLOCK_BYTES];
    for (pointer, chunk) in pointers.iter().zip(again.chunks_exact_mut(BLOCK_POINTER_BYTES)) {
        assert!(pointer.is_hole() || pointer.level + 1 == level);
        crate::block_pointer::check_decoded(pointer);
        pointer.encode(chunk);
    }
    let decoded_again = decode_indirect_node(&again, level, INDIRECT_BLOCK_BYTES as u64)
        .unwrap_or_else(|reason| panic!("re-encoded level {level} node does not decode: {reason}"));
    assert_eq!(decoded_again, pointers, "tree node does not round trip");
}

/// The pointers of an indirect block at `level` (> 0), or why it is corrupt.
pub fn decode_indirect_node(data: &[u8], level: u8, indirect_block_bytes: u64) -> Result<Vec<BlockPointer>, String> {
    assert!(level > 0, "level 0 blocks hold data, not pointers");
    if data.len() as u64 != indirect_block_bytes {
        return Err(format!("indirect block of {} bytes", data.len()));
    }
    let mut pointers = Vec::with_capacity(data.len() / BLOCK_POINTER_BYTES);
    for chunk in data.chunks_exact(BLOCK_POINTER_BYTES) {
        let child = BlockPointer::decode(chunk).map_err(|error| error.to_string())?;
        if !child.is_hole() && child.level + 1 != level {
            return Err(format!("level {} pointer inside a level {level} block", child.level));
        }
        pointers.push(child);
    }
    Ok(pointers)
}
