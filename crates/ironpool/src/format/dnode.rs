//! Dnodes: the descriptor of one object (a volume's data, a space map, the pool
//! directory...). An object is a tree of block pointers; its dnode says how tall
//! the tree is, how big its blocks are, and holds the root pointer.
//!
//! Layout (512 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | object type (0 = free slot) |
//! | 1 | 1 | levels: 1 means the root points at the only data block |
//! | 2 | 1 | data block shift (block = 2^shift bytes) |
//! | 3 | 1 | indirect block shift |
//! | 4 | 1 | checksum algorithm for the object's blocks |
//! | 5 | 1 | compression for the object's data blocks |
//! | 6 | 1 | flags: bit 0 read-only; bit 1 authenticated (version 8: its tree's metadata blocks carry portable digests, `format::portable`) |
//! | 7 | 1 | reserved |
//! | 8 | 8 | length in bytes (a volume's size; a space map's record bytes) |
//! | 16 | 8 | used bytes: space allocated to the object's blocks, all copies |
//! | 24 | 8 | creation txg |
//! | 32 | 8 | logical bytes: sum of the logical sizes of its data blocks |
//! | 40 | 8 | physical bytes: space allocated to its level-0 (data) blocks, all copies |
//! | 48 | 16 | the dataset's MAC (version 8): of an authenticated filesystem's table (flag bit 1), and its snapshots' copies; else zero |
//! | 64 | 128 | root block pointer |
//! | 192 | 8 | volumes: txg of the latest snapshot (blocks born at or before it are also a snapshot's) |
//! | 200 | 8 | volumes (clones): the origin snapshot's txg (blocks born at or before it are the origin's) |
//! | 208 | 304 | bonus: what the object's kind keeps beside its tree (a filesystem object's attributes, `format::znode`; a filesystem's header in its dnode table's dnode); zero for other kinds |

use super::bp::{BlockPointer, BLOCK_POINTER_BYTES, LEVEL_MAX};
use super::checksum::ChecksumAlgo;
use super::{bp::Compression, get_u64, invalid, put_u64, FormatError};

pub const DNODE_BYTES: usize = 512;
/// Where the bonus area starts in a dnode, and its size.
pub const BONUS_OFFSET: usize = 208;
pub const BONUS_BYTES: usize = DNODE_BYTES - BONUS_OFFSET;

/// The bonus area of a dnode: bytes its object's kind interprets (see
/// `format::znode`). A newtype so that `Dnode` stays `Copy + Default`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bonus(pub [u8; BONUS_BYTES]);

impl Default for Bonus {
    fn default() -> Bonus {
        Bonus([0; BONUS_BYTES])
    }
}

impl std::fmt::Debug for Bonus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.iter().all(|byte| *byte == 0) {
            write!(f, "Bonus(zero)")
        } else {
            write!(f, "Bonus({} bytes)", BONUS_BYTES)
        }
    }
}

/// Smallest data block: one 512-byte sector.
pub const DATA_BLOCK_SHIFT_MIN: u8 = 9;
/// Largest data block: 1 MiB (volumes allow up to 128 KiB; metadata uses less).
pub const DATA_BLOCK_SHIFT_MAX: u8 = 20;
/// Indirect blocks from 4 KiB (32 pointers) to 128 KiB (1024 pointers).
pub const INDIRECT_BLOCK_SHIFT_MIN: u8 = 12;
pub const INDIRECT_BLOCK_SHIFT_MAX: u8 = 17;

/// What an object holds (stored in its dnode and in each of its block pointers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum ObjectType {
    #[default]
    None,
    /// The table of all dnodes (object 0; its own dnode is in the uberblock).
    DnodeTable,
    /// The pool directory: volumes, metaslab arrays, pool properties.
    Directory,
    /// A metaslab's space map: a log of allocations and frees.
    SpaceMap,
    /// A top-level vdev's array of space map object numbers.
    MetaslabArray,
    /// A volume's (or snapshot's) data.
    VolumeData,
    /// Block pointers a volume stopped using that a snapshot still uses.
    DeadList,
    /// The pool's command history (`ironpool history`).
    History,
    /// A filesystem's dnode table: the pool-level object whose tree holds the
    /// dnodes of the filesystem's own objects (its object set).
    FsObjects,
    /// A filesystem's file or symbolic link: data blocks, attributes in the bonus.
    FsFile,
    /// A filesystem's directory: hashed leaves of entries (`format::fsdir`).
    FsDirectory,
    /// The extended attributes of one filesystem object (`format::xattr`).
    FsXattr,
    /// The pool's block reference table: the extra references of cloned
    /// blocks (`format::clones`; format 3).
    CloneTable,
    /// Where the blocks of a removed top-level vdev went: its indirect
    /// mapping (`format::remap`; format 4).
    IndirectMapping,
}

impl ObjectType {
    pub fn code(self) -> u8 {
        match self {
            ObjectType::None => 0,
            ObjectType::DnodeTable => 1,
            ObjectType::Directory => 2,
            ObjectType::SpaceMap => 3,
            ObjectType::MetaslabArray => 4,
            ObjectType::VolumeData => 5,
            ObjectType::DeadList => 6,
            ObjectType::History => 7,
            ObjectType::FsObjects => 8,
            ObjectType::FsFile => 9,
            ObjectType::FsDirectory => 10,
            ObjectType::FsXattr => 11,
            ObjectType::CloneTable => 12,
            ObjectType::IndirectMapping => 13,
        }
    }

    pub fn from_code(code: u8) -> Option<ObjectType> {
        match code {
            0 => Some(ObjectType::None),
            1 => Some(ObjectType::DnodeTable),
            2 => Some(ObjectType::Directory),
            3 => Some(ObjectType::SpaceMap),
            4 => Some(ObjectType::MetaslabArray),
            5 => Some(ObjectType::VolumeData),
            6 => Some(ObjectType::DeadList),
            7 => Some(ObjectType::History),
            8 => Some(ObjectType::FsObjects),
            9 => Some(ObjectType::FsFile),
            10 => Some(ObjectType::FsDirectory),
            11 => Some(ObjectType::FsXattr),
            12 => Some(ObjectType::CloneTable),
            13 => Some(ObjectType::IndirectMapping),
            _ => None,
        }
    }

    /// Metadata is stored with two copies (ditto blocks) and cached in memory.
    pub fn is_metadata(self) -> bool {
        !self.is_user_data()
    }

    /// Objects whose level-0 blocks are a user's data (a volume's, a file's,
    /// a file's extended attributes): one copy, written by the data path,
    /// evictable from memory.
    pub fn is_user_data(self) -> bool {
        matches!(
            self,
            ObjectType::VolumeData | ObjectType::FsFile | ObjectType::FsXattr
        )
    }
}

/// Dnode flag: the object may not be modified (snapshots).
pub const DNODE_FLAG_READ_ONLY: u8 = 1;
/// Dnode flag: the object is in an authenticated tree (an encrypted
/// dataset's, made by version 8): every metadata block of its tree carries
/// its portable digest, and a dataset's root object carries the MAC
/// ([`Dnode::mac`]).
pub const DNODE_FLAG_AUTHENTICATED: u8 = 2;
/// Bytes of a dataset's MAC in its root dnode.
pub const DNODE_MAC_BYTES: usize = 16;

/// The in-memory form of a dnode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dnode {
    pub object_type: ObjectType,
    pub levels: u8,
    pub data_block_shift: u8,
    pub indirect_block_shift: u8,
    pub checksum_algo: ChecksumAlgo,
    pub compression: Compression,
    pub flags: u8,
    pub length_bytes: u64,
    pub used_bytes: u64,
    pub creation_txg: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub root: BlockPointer,
    /// The dataset's MAC (`crypto::DatasetKey::objset_mac`) over this
    /// dnode's portable digest: kept in a dataset's root object when it is
    /// authenticated ([`DNODE_FLAG_AUTHENTICATED`]); zero otherwise.
    pub mac: [u8; DNODE_MAC_BYTES],
    pub prev_snapshot_txg: u64,
    pub origin_txg: u64,
    pub bonus: Bonus,
}

impl Dnode {
    /// Whether the object is in an authenticated tree
    /// ([`DNODE_FLAG_AUTHENTICATED`]).
    pub fn is_authenticated(&self) -> bool {
        self.flags & DNODE_FLAG_AUTHENTICATED != 0
    }

    pub fn is_free(&self) -> bool {
        self.object_type == ObjectType::None
    }

    pub fn data_block_bytes(&self) -> u64 {
        1 << self.data_block_shift
    }

    pub fn indirect_block_bytes(&self) -> u64 {
        1 << self.indirect_block_shift
    }

    /// Block pointers per indirect block, as a shift.
    pub fn pointers_per_indirect_shift(&self) -> u8 {
        self.indirect_block_shift - 7 // 128-byte pointers
    }

    /// Number of level-0 blocks the current tree height can address.
    pub fn capacity_blocks(&self) -> u64 {
        let shift = (self.levels as u32 - 1) * self.pointers_per_indirect_shift() as u32;
        if shift >= 64 {
            u64::MAX
        } else {
            1u64 << shift
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), DNODE_BYTES);
        out.fill(0);
        out[0] = self.object_type.code();
        out[1] = self.levels;
        out[2] = self.data_block_shift;
        out[3] = self.indirect_block_shift;
        out[4] = self.checksum_algo.code();
        out[5] = self.compression.code();
        out[6] = self.flags;
        put_u64(out, 8, self.length_bytes);
        put_u64(out, 16, self.used_bytes);
        put_u64(out, 24, self.creation_txg);
        put_u64(out, 32, self.logical_bytes);
        put_u64(out, 40, self.physical_bytes);
        out[48..64].copy_from_slice(&self.mac);
        self.root.encode(&mut out[64..64 + BLOCK_POINTER_BYTES]);
        put_u64(out, 192, self.prev_snapshot_txg);
        put_u64(out, 200, self.origin_txg);
        out[BONUS_OFFSET..].copy_from_slice(&self.bonus.0);
    }

    pub fn decode(bytes: &[u8]) -> Result<Dnode, FormatError> {
        const WHAT: &str = "dnode";
        if bytes.len() != DNODE_BYTES {
            return Err(invalid(WHAT, format!("{} bytes", bytes.len())));
        }
        let object_type = ObjectType::from_code(bytes[0])
            .ok_or_else(|| invalid(WHAT, format!("unknown object type {}", bytes[0])))?;
        if object_type == ObjectType::None {
            return Ok(Dnode::default());
        }
        let dnode = Dnode {
            object_type,
            levels: bytes[1],
            data_block_shift: bytes[2],
            indirect_block_shift: bytes[3],
            checksum_algo: ChecksumAlgo::from_code(bytes[4])
                .ok_or_else(|| invalid(WHAT, format!("unknown checksum {}", bytes[4])))?,
            compression: Compression::from_code(bytes[5])
                .ok_or_else(|| invalid(WHAT, format!("unknown compression {}", bytes[5])))?,
            flags: bytes[6],
            length_bytes: get_u64(bytes, 8),
            used_bytes: get_u64(bytes, 16),
            creation_txg: get_u64(bytes, 24),
            logical_bytes: get_u64(bytes, 32),
            physical_bytes: get_u64(bytes, 40),
            root: BlockPointer::decode(&bytes[64..64 + BLOCK_POINTER_BYTES])?,
            mac: bytes[48..64].try_into().expect("MAC bytes"),
            prev_snapshot_txg: get_u64(bytes, 192),
            origin_txg: get_u64(bytes, 200),
            bonus: Bonus(bytes[BONUS_OFFSET..].try_into().expect("bonus length")),
        };
        dnode.validate()?;
        Ok(dnode)
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "dnode";
        if self.levels == 0 || self.levels > LEVEL_MAX + 1 {
            return Err(invalid(WHAT, format!("{} levels", self.levels)));
        }
        if !(DATA_BLOCK_SHIFT_MIN..=DATA_BLOCK_SHIFT_MAX).contains(&self.data_block_shift) {
            return Err(invalid(
                WHAT,
                format!("data block shift {}", self.data_block_shift),
            ));
        }
        if !(INDIRECT_BLOCK_SHIFT_MIN..=INDIRECT_BLOCK_SHIFT_MAX)
            .contains(&self.indirect_block_shift)
        {
            return Err(invalid(
                WHAT,
                format!("indirect block shift {}", self.indirect_block_shift),
            ));
        }
        if !self.root.is_hole() && self.root.level != self.levels - 1 {
            return Err(invalid(
                WHAT,
                format!(
                    "root at level {} in a {}-level tree",
                    self.root.level, self.levels
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bp::Dva;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let dnode = Dnode {
            object_type: ObjectType::VolumeData,
            levels: 3,
            data_block_shift: 14,
            indirect_block_shift: 15,
            checksum_algo: ChecksumAlgo::Xxh3,
            compression: Compression::Off,
            flags: 0,
            length_bytes: 1 << 31,
            used_bytes: 12345 * 512,
            creation_txg: 4,
            logical_bytes: 1 << 20,
            physical_bytes: 1 << 19,
            prev_snapshot_txg: 3,
            origin_txg: 2,
            bonus: {
                let mut bonus = Bonus::default();
                bonus.0[0] = 7;
                bonus.0[BONUS_BYTES - 1] = 9;
                bonus
            },
            root: BlockPointer {
                dvas: [
                    Dva {
                        vdev: 0,
                        asize: 32768,
                        offset: 65536,
                    },
                    Dva {
                        vdev: 0,
                        asize: 32768,
                        offset: 1 << 20,
                    },
                    Dva::default(),
                ],
                birth_txg: 7,
                physical_birth: 0,
                logical_size: 32768,
                physical_size: 32768,
                level: 2,
                object_type: ObjectType::VolumeData,
                checksum_algo: ChecksumAlgo::Xxh3,
                compression: Compression::Off,
                fill: 100,
                checksum: ChecksumAlgo::Xxh3.compute(b"x"),
                crypt: None,
                digest: None,
            },
            mac: [0x3c; DNODE_MAC_BYTES],
        };
        let mut bytes = [0u8; DNODE_BYTES];
        dnode.encode(&mut bytes);
        assert_eq!(Dnode::decode(&bytes).unwrap(), dnode);
        assert_eq!(dnode.capacity_blocks(), 1 << 16);
        let mut bad = bytes;
        bad[1] = 2; // root level 2 in a 2-level tree
        assert!(Dnode::decode(&bad).is_err());
        let free = Dnode::default();
        free.encode(&mut bytes);
        assert!(Dnode::decode(&bytes).unwrap().is_free());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), DNODE_BYTES)) {
            let _ = Dnode::decode(&bytes);
        }
    }
}
