//! Writing an object's dirty nodes at txg sync (copy-on-write, bottom-up).
//!
//! This runs synchronously inside the txg sync's "build" step: nothing else runs
//! while the tree is being rewritten, so the image written for the txg is exactly
//! the tree at one instant. The node buffers collected here are written afterwards.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{account, NodeBody, Object, ObjectError, ObjectSet};
use crate::alloc::NoSpace;
use crate::block::BlockError;
use crate::format::bp::{Compression, BLOCK_POINTER_BYTES, DVA_COUNT};
use crate::format::checksum::ChecksumAlgo;
use crate::format::dnode::DNODE_FLAG_AUTHENTICATED;
use crate::format::{BlockPointer, Dva};
use crate::rt::buf::AlignedBuf;

/// Copies of metadata blocks (indirect blocks of any object, and the data blocks
/// of metadata objects): losing one sector must not lose a tree.
pub const METADATA_COPIES: usize = 2;

/// How many copies a metadata block gets. Level-1 indirect blocks of volumes
/// get one copy when every top-level vdev is itself redundant (a mirror keeps two
/// already): they are most of the metadata a random-write load rewrites each
/// txg, and their loss costs what losing a data block costs. Everything else
/// (higher levels, the dnode table, space maps, the directory) keeps two.
pub fn metadata_copies(
    object_type: crate::format::ObjectType,
    level: u8,
    redundant_vdevs: bool,
) -> usize {
    if redundant_vdevs && level == 1 && object_type.is_user_data() {
        1
    } else {
        METADATA_COPIES
    }
}

/// What one txg sync collects: the blocks to write, keyed by location so a block
/// rewritten in a later pass of the same sync replaces its earlier image.
pub struct SyncContext {
    pub txg: u64,
    pub writes: BTreeMap<(u32, u64), (Dva, Rc<AlignedBuf>)>,
}

impl SyncContext {
    pub fn new(txg: u64) -> SyncContext {
        SyncContext {
            txg,
            writes: BTreeMap::new(),
        }
    }

    fn queue(&mut self, pointer: &BlockPointer, buffer: Rc<AlignedBuf>) {
        for dva in pointer.copies() {
            self.writes
                .insert((dva.vdev, dva.offset), (*dva, buffer.clone()));
        }
    }

    /// Bytes to write.
    pub fn bytes(&self) -> u64 {
        self.writes.values().map(|(dva, _)| dva.asize as u64).sum()
    }
}

impl ObjectSet {
    /// Writes every dirty node of `object` to new locations (or in place when the
    /// node was already written by this same txg) and updates the dnode's root.
    pub fn sync_object(
        &self,
        object: &Object,
        context: &mut SyncContext,
    ) -> Result<(), ObjectError> {
        let keys: Vec<(u8, u64)> = std::mem::take(&mut *object.dirty_nodes.borrow_mut())
            .into_iter()
            .collect();
        // Every object of an authenticated filesystem is authenticated,
        // however its dnode was made (created, received, replaced).
        if self.nested && !object.dnode().is_authenticated() && self.is_authenticated() {
            object.dnode.borrow_mut().flags |= DNODE_FLAG_AUTHENTICATED;
        }
        let dnode = object.dnode();
        // Keys sort by level: children are written, and their digests known,
        // before their parents.
        debug_assert!(keys.windows(2).all(|pair| pair[0].0 <= pair[1].0));
        for (level, blkid) in keys {
            let node = object
                .nodes
                .borrow()
                .get(&(level, blkid))
                .cloned()
                .expect("a dirty node is cached");
            let (buffer, fill, hole) = encode_node(&node.body.borrow(), level);
            let old = self.pointer_in_parent(object, level, blkid)?;
            let new = if hole {
                BlockPointer::hole(level, dnode.object_type, context.txg)
            } else {
                let (buffer, crypt) = match level {
                    0 => self.seal_node(object, buffer)?,
                    _ => (buffer, None),
                };
                let digest = match (dnode.is_authenticated(), &crypt) {
                    (true, None) => Some(node_digest(object, &node.body.borrow(), level).map_err(
                        |error| ObjectError::Corrupt {
                            object: object.id,
                            error,
                        },
                    )?),
                    _ => None,
                };
                let physical = buffer.len() as u32;
                let in_place = !old.is_hole()
                    && old.written_txg() == context.txg
                    && old.physical_size == physical;
                let copies =
                    metadata_copies(dnode.object_type, level, self.store.all_vdevs_redundant());
                let dvas = if in_place {
                    old.dvas
                } else {
                    self.allocate_metadata(physical as u64, copies)?
                };
                let pointer = BlockPointer {
                    dvas,
                    birth_txg: context.txg,
                    physical_birth: 0,
                    logical_size: physical,
                    physical_size: physical,
                    level,
                    object_type: dnode.object_type,
                    // A sealed block's MAC, or a digest, takes the second
                    // half of an XXH3 checksum's place.
                    checksum_algo: if crypt.is_some() || digest.is_some() {
                        ChecksumAlgo::Xxh3
                    } else {
                        dnode.checksum_algo
                    },
                    compression: Compression::Off,
                    fill,
                    checksum: if crypt.is_some() || digest.is_some() {
                        ChecksumAlgo::Xxh3.compute(&buffer)
                    } else {
                        dnode.checksum_algo.compute(&buffer)
                    },
                    crypt,
                    digest,
                };
                context.queue(&pointer, Rc::new(buffer));
                pointer
            };
            let in_place = !new.is_hole() && new.dvas == old.dvas;
            if !in_place {
                self.kill(object, &old);
                if !new.is_hole() {
                    self.store.commit(&new);
                }
            }
            self.set_pointer_in_parent(object, level, blkid, new)?;
            if !in_place {
                // Only indirect pointers here: level-0 accounting of metadata data
                // blocks is counted as used bytes too.
                account(object, &old, &new);
            }
            node.synced_txg.set(context.txg);
        }
        Ok(())
    }

    /// A data node's bytes as stored: sealed under the set's key when the
    /// object is of a sealed type (see [`super::sealed_type`]), with what
    /// its pointer records of the sealing; else as they are.
    fn seal_node(
        &self,
        object: &Object,
        buffer: AlignedBuf,
    ) -> Result<(AlignedBuf, Option<crate::format::bp::BlockCrypt>), ObjectError> {
        if !super::sealed_type(object.object_type()) {
            return Ok((buffer, None));
        }
        let Some(key) = self.loaded_key(object.id)? else {
            return Ok((buffer, None));
        };
        let physical = buffer.len() as u32;
        let aad = crate::crypto::block_aad(
            object.object_type(),
            0,
            Compression::Off,
            physical,
            physical,
        );
        let mut sealed = AlignedBuf::zeroed(buffer.len());
        let crypt =
            key.seal_into(&aad, &buffer, &mut sealed)
                .map_err(|error| ObjectError::Sealing {
                    object: object.id,
                    error,
                })?;
        Ok((sealed, Some(crypt)))
    }

    fn allocate_metadata(
        &self,
        physical_bytes: u64,
        copies: usize,
    ) -> Result<[Dva; DVA_COUNT], ObjectError> {
        self.store
            .allocate(physical_bytes, true, copies)
            .map_err(|NoSpace| ObjectError::Block(BlockError::NoSpace))
    }

    fn pointer_in_parent(
        &self,
        object: &Object,
        level: u8,
        blkid: u64,
    ) -> Result<BlockPointer, ObjectError> {
        let levels = object.levels();
        if level == levels - 1 {
            return Ok(object.dnode().root);
        }
        let parent = self.node_cached(object, level + 1, blkid >> object.pointer_shift())?;
        let body = parent.body.borrow();
        match &*body {
            NodeBody::Indirect(pointers) => Ok(pointers[object.index_in_parent(blkid)]),
            NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
        }
    }

    fn set_pointer_in_parent(
        &self,
        object: &Object,
        level: u8,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<(), ObjectError> {
        let levels = object.levels();
        if level == levels - 1 {
            object.dnode.borrow_mut().root = pointer;
            return Ok(());
        }
        let parent = self.node_cached(object, level + 1, blkid >> object.pointer_shift())?;
        let mut body = parent.body.borrow_mut();
        match &mut *body {
            NodeBody::Indirect(pointers) => pointers[object.index_in_parent(blkid)] = pointer,
            NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
        }
        Ok(())
    }
}

/// The portable digest of a node an authenticated object writes unsealed
/// (`format::portable`): an indirect block's over its children, a data
/// block's over its bytes (a dnode table's over its dnodes).
pub(super) fn node_digest(
    object: &Object,
    body: &NodeBody,
    level: u8,
) -> Result<crate::format::portable::Digest, crate::format::FormatError> {
    match body {
        NodeBody::Indirect(pointers) => crate::format::portable::node_digest(level, pointers),
        NodeBody::Data(bytes) => {
            crate::format::portable::data_block_digest(object.object_type(), bytes)
        }
    }
}

/// Serialises a node. Returns the buffer, the fill count and whether the node
/// is written at all: an indirect node of holes only, or a data block of a
/// metadata object that is all zeros (a dnode table block whose objects were
/// all freed, a dead list emptied), becomes a hole and gives its space back,
/// as OpenZFS writes a block of zeros as a hole. A hole reads as zeros, so
/// every reader sees the same bytes.
fn encode_node(body: &NodeBody, level: u8) -> (AlignedBuf, u64, bool) {
    match body {
        NodeBody::Indirect(pointers) => {
            let mut buffer = AlignedBuf::zeroed(pointers.len() * BLOCK_POINTER_BYTES);
            let mut fill = 0u64;
            let mut all_holes = true;
            for (index, pointer) in pointers.iter().enumerate() {
                debug_assert!(pointer.is_hole() || pointer.level + 1 == level);
                pointer.encode(
                    &mut buffer[index * BLOCK_POINTER_BYTES..(index + 1) * BLOCK_POINTER_BYTES],
                );
                if !pointer.is_hole() {
                    all_holes = false;
                    fill += pointer.fill;
                }
            }
            (buffer, fill, all_holes)
        }
        NodeBody::Data(bytes) => {
            let zeros = bytes.iter().all(|byte| *byte == 0);
            (AlignedBuf::copy_from(bytes), 1, zeros)
        }
    }
}
