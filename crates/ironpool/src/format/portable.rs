//! Portable digests: what an encrypted dataset's MAC covers (docs/FORMAT.md,
//! "Object-set MAC").
//!
//! A dataset's MAC (keyed, `crypto::DatasetKey::objset_mac`) is taken over the digest of
//! its root dnode; that digest covers the dnode's root pointer's digest, which
//! covers the block it points to, and so on down to the sealed data blocks,
//! whose own MACs cover their bytes. A writer of the devices who lacks the key
//! can then change nothing the tree says (a length, a type, which block is at
//! which offset, an object's dnode put back from an older txg) without the
//! MAC failing. (The MAC is not bound to the dataset or the txg: the root
//! dnode itself, put back whole from an older txg or swapped with another
//! dataset's under the same key, still verifies; docs/FORMAT.md.)
//!
//! The digests leave out where things are and how the tree is shaped: DVAs,
//! births, fill, space figures, checksum and compression settings, and the
//! number of levels. Device removal moves blocks, a raw receive rebuilds the
//! tree on another pool, space is counted per pool; the digests of two copies
//! of the same content are equal. A node whose only child is its first digests
//! as that child, so a tree that grew a level over the same blocks digests as
//! before. Each node's digest names its level, so blocks cannot move between
//! offsets by a change of shape.
//!
//! They are BLAKE3 of a tag and the fields, truncated to [`DIGEST_BYTES`]
//! (128 bits, as OpenZFS's indirect-block MACs), unkeyed: the txg build
//! computes them for every metadata block it writes, a read checks them, and
//! neither needs the key. Only the MAC at the root needs it.

use super::bp::{BlockCrypt, BlockPointer, DIGEST_BYTES};
use super::dnode::{Dnode, ObjectType, DNODE_BYTES, DNODE_FLAG_READ_ONLY};
use super::{invalid, FormatError};

/// A portable digest.
pub type Digest = [u8; DIGEST_BYTES];

/// The digest of a hole (and of a free dnode slot): zeros, so that a node's
/// digest over children that are holes is the same wherever they are.
pub const HOLE: Digest = [0; DIGEST_BYTES];

/// Bytes of a filesystem's header (the bonus of its table's dnode,
/// `format::znode::FsHeader`) that the digest covers: version, root
/// directory, next object number, unlinked set. Bytes 32 to 64 (the count of
/// objects and the space sums) are per pool and left out; bytes 64 to 72,
/// the flags, are covered too ([`HEADER_FLAGS`]).
const HEADER_COVERED: std::ops::Range<usize> = 0..32;
/// The header's flags (see [`HEADER_COVERED`]).
const HEADER_FLAGS: std::ops::Range<usize> = 64..72;

fn finish(hasher: &blake3::Hasher) -> Digest {
    let mut digest = [0u8; DIGEST_BYTES];
    digest.copy_from_slice(&hasher.finalize().as_bytes()[..DIGEST_BYTES]);
    digest
}

fn unauthenticated(pointer: &BlockPointer) -> FormatError {
    invalid(
        "authenticated tree",
        format!(
            "a level {} {:?} block that is neither sealed nor digested",
            pointer.level, pointer.object_type
        ),
    )
}

/// Feeds the portable fields of a sealed block (its sealing and what says
/// how to read it).
fn feed_sealed(hasher: &mut blake3::Hasher, pointer: &BlockPointer, crypt: &BlockCrypt) {
    hasher.update(&[
        pointer.object_type.code(),
        pointer.level,
        pointer.compression.code(),
    ]);
    hasher.update(&pointer.logical_size.to_le_bytes());
    hasher.update(&pointer.physical_size.to_le_bytes());
    hasher.update(&crypt.to_bytes());
}

/// The digest a pointer stands for on its own (a dnode's root, a node that
/// collapses to its first child): zeros for a hole, the stored digest of a
/// metadata block, a hash of a sealed block's portable fields. A pointer
/// with neither sealing nor digest (written by no authenticated tree) is
/// refused.
pub fn pointer_digest(pointer: &BlockPointer) -> Result<Digest, FormatError> {
    if pointer.is_hole() {
        return Ok(HOLE);
    }
    if let Some(digest) = pointer.digest {
        return Ok(digest);
    }
    let Some(crypt) = &pointer.crypt else {
        return Err(unauthenticated(pointer));
    };
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ironpool leaf 1\0");
    feed_sealed(&mut hasher, pointer, crypt);
    Ok(finish(&hasher))
}

/// The digest of an indirect block of `level` (1 or more) holding
/// `children`: its first child's when every other is a hole (the same
/// content one level lower), else one hash over each child in order: a
/// tag byte (0 hole, 1 sealed, 2 digest) and a sealed child's portable
/// fields, or a metadata child's digest. Sealed children are fed whole
/// rather than hashed one by one: one hash of 13 KiB (52 bytes a child)
/// per 32 KiB block of 256 pointers, which the txg build pays for each
/// indirect block it writes.
pub fn node_digest(level: u8, children: &[BlockPointer]) -> Result<Digest, FormatError> {
    if let Some((first, rest)) = children.split_first() {
        if rest.iter().all(BlockPointer::is_hole) {
            return pointer_digest(first);
        }
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ironpool node 1\0");
    hasher.update(&[level]);
    hasher.update(&(children.len() as u32).to_le_bytes());
    for child in children {
        if child.is_hole() {
            hasher.update(&[0]);
        } else if let Some(digest) = &child.digest {
            hasher.update(&[2]);
            hasher.update(digest);
        } else if let Some(crypt) = &child.crypt {
            hasher.update(&[1]);
            feed_sealed(&mut hasher, child, crypt);
        } else {
            return Err(unauthenticated(child));
        }
    }
    Ok(finish(&hasher))
}

/// The digest of a dnode: what its object is (type, block sizes, flags
/// other than read-only, which a snapshot's copy sets, length, bonus; of a
/// filesystem's table, the header's covered bytes instead of the length and
/// bonus) and its tree's content (its root pointer's digest). Not its
/// levels, space figures, txgs or MAC.
pub fn dnode_digest(dnode: &Dnode) -> Result<Digest, FormatError> {
    if dnode.is_free() {
        return Ok(HOLE);
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ironpool dnode 1");
    hasher.update(&[
        dnode.object_type.code(),
        dnode.data_block_shift,
        dnode.indirect_block_shift,
        dnode.flags & !DNODE_FLAG_READ_ONLY,
    ]);
    match dnode.object_type {
        // A table's length follows the highest object it ever held, which
        // a receiver need not have had; its content is its tree's.
        ObjectType::FsObjects => {
            hasher.update(&dnode.bonus.0[HEADER_COVERED]);
            hasher.update(&dnode.bonus.0[HEADER_FLAGS]);
        }
        _ => {
            hasher.update(&dnode.length_bytes.to_le_bytes());
            hasher.update(&dnode.bonus.0);
        }
    }
    hasher.update(&pointer_digest(&dnode.root)?);
    Ok(finish(&hasher))
}

/// The digest of a block of a filesystem's dnode table: each slot's dnode
/// digest in order (zeros for a free slot).
pub fn dnode_block_digest(bytes: &[u8]) -> Result<Digest, FormatError> {
    if !bytes.len().is_multiple_of(DNODE_BYTES) {
        return Err(invalid(
            "dnode table block",
            format!("{} bytes", bytes.len()),
        ));
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ironpool dnodes1");
    hasher.update(&((bytes.len() / DNODE_BYTES) as u32).to_le_bytes());
    for slot in bytes.chunks_exact(DNODE_BYTES) {
        hasher.update(&dnode_digest(&Dnode::decode(slot)?)?);
    }
    Ok(finish(&hasher))
}

/// The digest of any other level-0 block a txg build writes unsealed in an
/// authenticated tree: its bytes.
pub fn bytes_digest(bytes: &[u8]) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ironpool bytes 1");
    hasher.update(bytes);
    finish(&hasher)
}

/// The digest of a level-0 block of an object of `object_type` that the txg
/// build writes in the clear (a metadata object's block).
pub fn data_block_digest(object_type: ObjectType, bytes: &[u8]) -> Result<Digest, FormatError> {
    match object_type {
        ObjectType::FsObjects => dnode_block_digest(bytes),
        _ => Ok(bytes_digest(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bp::{Compression, Dva};
    use crate::format::checksum::ChecksumAlgo;

    fn sealed(seed: u8, level: u8) -> BlockPointer {
        BlockPointer {
            dvas: [
                Dva {
                    vdev: 0,
                    asize: 4096,
                    offset: 4096 * seed as u64,
                },
                Dva::default(),
                Dva::default(),
            ],
            birth_txg: 10 + seed as u64,
            logical_size: 4096,
            physical_size: 4096,
            level,
            object_type: ObjectType::FsFile,
            checksum_algo: ChecksumAlgo::Xxh3,
            compression: Compression::Off,
            fill: 1,
            crypt: Some(BlockCrypt {
                salt: 7,
                iv: [seed; 12],
                mac: [seed; 16],
            }),
            ..BlockPointer::default()
        }
    }

    fn indirect(level: u8, children: &[BlockPointer]) -> BlockPointer {
        let mut pointer = sealed(0, level);
        pointer.crypt = None;
        pointer.digest = Some(node_digest(level, children).unwrap());
        pointer
    }

    fn holes(count: usize) -> Vec<BlockPointer> {
        vec![BlockPointer::hole(0, ObjectType::FsFile, 0); count]
    }

    /// Where a block is and when it was written do not count; its sealing
    /// and sizes do.
    #[test]
    fn a_leaf_digests_its_sealing_not_its_place() {
        let block = sealed(3, 0);
        let mut moved = block;
        moved.dvas[0].offset += 1 << 20;
        moved.birth_txg += 5;
        moved.fill = 9;
        assert_eq!(
            pointer_digest(&block).unwrap(),
            pointer_digest(&moved).unwrap()
        );
        let mut other = block;
        other.crypt.as_mut().unwrap().mac[0] ^= 1;
        assert_ne!(
            pointer_digest(&block).unwrap(),
            pointer_digest(&other).unwrap()
        );
        let mut resized = block;
        resized.logical_size = 8192;
        assert_ne!(
            pointer_digest(&block).unwrap(),
            pointer_digest(&resized).unwrap()
        );
        let mut plain = block;
        plain.crypt = None;
        assert!(
            pointer_digest(&plain).is_err(),
            "an unsealed leaf has no digest"
        );
        assert_eq!(
            pointer_digest(&BlockPointer::hole(0, ObjectType::FsFile, 4)).unwrap(),
            HOLE
        );
    }

    /// A tree that grew levels over the same blocks digests as before; the
    /// same blocks at other offsets do not.
    #[test]
    fn levels_do_not_count_offsets_do() {
        let (a, b) = (sealed(1, 0), sealed(2, 0));
        // One level: blocks 0 and 1.
        let mut low = holes(128);
        low[0] = a;
        low[1] = b;
        let low_digest = node_digest(1, &low).unwrap();
        // The same under a second level, as its first child.
        let mut high = holes(128);
        high[0] = indirect(1, &low);
        assert_eq!(node_digest(2, &high).unwrap(), low_digest);
        // A lone block digests as itself however tall its tree.
        let mut lone = holes(128);
        lone[0] = a;
        assert_eq!(node_digest(1, &lone).unwrap(), pointer_digest(&a).unwrap());
        // Block b at offset 128 (under the second child of a level 2) is not
        // b at offset 1, though each level-1 node holds one block first.
        let mut first = holes(128);
        first[0] = a;
        let mut second = holes(128);
        second[0] = b;
        let mut spread = holes(128);
        spread[0] = indirect(1, &first);
        spread[1] = indirect(1, &second);
        assert_ne!(node_digest(2, &spread).unwrap(), low_digest);
        // Swapped blocks differ.
        low.swap(0, 1);
        assert_ne!(node_digest(1, &low).unwrap(), low_digest);
    }

    fn file_dnode(root: BlockPointer) -> Dnode {
        Dnode {
            object_type: ObjectType::FsFile,
            levels: 1,
            data_block_shift: 12,
            indirect_block_shift: 14,
            length_bytes: 4096,
            root,
            ..Dnode::default()
        }
    }

    /// A dnode's digest covers what its object is, not its space, txgs or
    /// the read-only flag of a snapshot's copy.
    #[test]
    fn a_dnode_digests_its_object_not_its_accounting() {
        let dnode = file_dnode(sealed(1, 0));
        let digest = dnode_digest(&dnode).unwrap();
        let mut counted = dnode;
        counted.used_bytes = 1 << 30;
        counted.creation_txg = 99;
        counted.levels = 2;
        counted.flags |= DNODE_FLAG_READ_ONLY;
        assert_eq!(dnode_digest(&counted).unwrap(), digest);
        let mut longer = dnode;
        longer.length_bytes += 1;
        assert_ne!(dnode_digest(&longer).unwrap(), digest);
        let mut other = dnode;
        other.root = sealed(2, 0);
        assert_ne!(dnode_digest(&other).unwrap(), digest);
        let mut attrs = dnode;
        attrs.bonus.0[100] ^= 1;
        assert_ne!(dnode_digest(&attrs).unwrap(), digest);
        // A table block: slots in order, free ones as holes.
        let mut block = vec![0u8; 4 * DNODE_BYTES];
        dnode.encode(&mut block[DNODE_BYTES..2 * DNODE_BYTES]);
        let before = dnode_block_digest(&block).unwrap();
        block.copy_within(DNODE_BYTES..2 * DNODE_BYTES, 2 * DNODE_BYTES);
        block[DNODE_BYTES..2 * DNODE_BYTES].fill(0);
        assert_ne!(dnode_block_digest(&block).unwrap(), before, "a moved dnode");
    }
}
