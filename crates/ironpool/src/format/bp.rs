//! Block pointers: where a block lives, how big it is, when it was born, and the
//! checksum it must have.
//!
//! Layout (128 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | DVA 0: vdev u32, asize u32 (bytes), offset u64 (bytes from the data area start) |
//! | 16 | 16 | DVA 1 (a second copy: metadata "ditto" blocks) |
//! | 32 | 16 | DVA 2 (reserved for a third copy); of an encrypted block: its IV (12 bytes), then zeros |
//! | 48 | 8 | birth txg (for a hole: the txg the hole was made, 0 if never written) |
//! | 56 | 4 | logical size (bytes) |
//! | 60 | 4 | physical size (bytes stored, after compression) |
//! | 64 | 1 | level (0 = data, >0 = indirect) |
//! | 65 | 1 | object type |
//! | 66 | 1 | checksum algorithm |
//! | 67 | 1 | compression |
//! | 68 | 1 | flags: bit 0 encrypted (format 5) |
//! | 69 | 3 | reserved, zero |
//! | 72 | 8 | fill: number of non-hole level-0 blocks beneath (1 for a data block) |
//! | 80 | 8 | physical birth: the txg that wrote a cloned block's bytes (0: the birth txg; format 3) |
//! | 88 | 8 | an encrypted block's salt (format 5), else zero |
//! | 96 | 32 | checksum of the physical bytes; of an encrypted block: 16 bytes (XXH3-128) of the ciphertext, then its MAC |
//!
//! A hole has an empty DVA 0 (asize 0). A DVA's asize is the space allocated on
//! its top-level vdev, a multiple of that vdev's sector size.

use super::checksum::{Checksum, ChecksumAlgo};
use super::dnode::ObjectType;
use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError};

/// Encoded size of a block pointer.
pub const BLOCK_POINTER_BYTES: usize = 128;
/// Copies a block pointer can carry.
pub const DVA_COUNT: usize = 3;
/// Largest block (logical or physical) the format allows: 16 MiB.
pub const BLOCK_SIZE_MAX_BYTES: u32 = 16 * 1024 * 1024;
/// Deepest tree: 2^64 bytes in 512-byte blocks with 4 KiB indirect blocks needs 11.
pub const LEVEL_MAX: u8 = 12;

/// Compression of a block's physical bytes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    Off,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn code(self) -> u8 {
        match self {
            Compression::Off => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }
    pub fn from_code(code: u8) -> Option<Compression> {
        match code {
            0 => Some(Compression::Off),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// A data virtual address: one copy of a block on one top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Dva {
    pub vdev: u32,
    pub asize: u32,
    pub offset: u64,
}

impl Dva {
    pub fn is_empty(&self) -> bool {
        self.asize == 0
    }

    /// One past the last byte of the allocation.
    pub fn end(&self) -> u64 {
        self.offset + self.asize as u64
    }
}

/// Bytes of an IV (AES-GCM's 96-bit nonce).
pub const IV_BYTES: usize = 12;
/// Bytes of a MAC (AES-GCM's tag).
pub const MAC_BYTES: usize = 16;
/// Flag bit of offset 68: the block's physical bytes are encrypted.
const FLAG_ENCRYPTED: u8 = 1;
/// Flag bit 1 (version 8): the checksum's second half is the block's
/// portable digest ([`BlockPointer::digest`]).
const FLAG_DIGEST: u8 = 2;
/// Bytes of a portable digest (`format::portable`): the second half of
/// an XXH3 checksum's 32 bytes, where a sealed block keeps its MAC.
pub const DIGEST_BYTES: usize = 16;

/// What opening an encrypted block takes besides its key: the salt its
/// block key was derived with, its IV and its MAC (docs/FORMAT.md,
/// "Encryption"). An encrypted block has one copy (its IV takes DVA 2's
/// place) and an XXH3-128 checksum (its MAC takes the checksum's second
/// half).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct BlockCrypt {
    pub salt: u64,
    pub iv: [u8; IV_BYTES],
    pub mac: [u8; MAC_BYTES],
}

/// Bytes of a [`BlockCrypt`] held outside a block pointer: the salt (u64,
/// little-endian), the IV, 4 zero bytes, the MAC. A raw stream's WRITE_RAW
/// record, a sealed bonus and a sealed attribute record of the intent log
/// hold it so (docs/FORMAT.md): one layout, written and read here.
pub const SEALING_BYTES: usize = 8 + IV_BYTES + 4 + MAC_BYTES;

impl BlockCrypt {
    /// The [`SEALING_BYTES`] layout of this sealing.
    pub fn to_bytes(&self) -> [u8; SEALING_BYTES] {
        let mut out = [0u8; SEALING_BYTES];
        put_u64(&mut out, 0, self.salt);
        out[8..8 + IV_BYTES].copy_from_slice(&self.iv);
        out[8 + IV_BYTES + 4..].copy_from_slice(&self.mac);
        out
    }

    /// The sealing [`BlockCrypt::to_bytes`] wrote; None when its 4
    /// reserved bytes are not zero (damaged, or a layout this build does
    /// not know).
    pub fn from_bytes(bytes: &[u8; SEALING_BYTES]) -> Option<BlockCrypt> {
        if bytes[8 + IV_BYTES..8 + IV_BYTES + 4] != [0; 4] {
            return None;
        }
        Some(BlockCrypt {
            salt: get_u64(bytes, 0),
            iv: bytes[8..8 + IV_BYTES].try_into().expect("IV bytes"),
            mac: bytes[8 + IV_BYTES + 4..].try_into().expect("MAC bytes"),
        })
    }
}

/// A pointer to one block, with everything needed to find and verify it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockPointer {
    pub dvas: [Dva; DVA_COUNT],
    /// The txg that linked the block into this tree (its logical birth):
    /// what snapshots, dead lists, rollback and incremental send compare.
    pub birth_txg: u64,
    /// The txg whose commit wrote the block's bytes, when earlier than
    /// `birth_txg`: a block cloned from another file (block cloning) keeps
    /// the txg its bytes were written in, which is what the devices'
    /// dirty time logs, resilver and the read cache go by. 0: the same as
    /// `birth_txg` (every block that was not cloned).
    pub physical_birth: u64,
    pub logical_size: u32,
    pub physical_size: u32,
    pub level: u8,
    pub object_type: ObjectType,
    pub checksum_algo: ChecksumAlgo,
    pub compression: Compression,
    pub fill: u64,
    pub checksum: Checksum,
    /// Set when the block's physical bytes are encrypted (a data block of
    /// an encrypted dataset).
    pub crypt: Option<BlockCrypt>,
    /// The portable digest of a metadata block of an authenticated tree
    /// (an encrypted dataset's, `format::portable`): what its content
    /// says, less where things are, so that the dataset's MAC covers the
    /// whole tree through it. Stored in the checksum's second half.
    pub digest: Option<[u8; DIGEST_BYTES]>,
}

impl BlockPointer {
    /// A hole born in `birth_txg` (0: never written).
    pub fn hole(level: u8, object_type: ObjectType, birth_txg: u64) -> BlockPointer {
        BlockPointer {
            level,
            object_type,
            birth_txg,
            ..BlockPointer::default()
        }
    }

    pub fn is_hole(&self) -> bool {
        self.dvas[0].is_empty()
    }

    /// The txg the block's bytes were written in: `physical_birth` for a
    /// cloned block, else its birth.
    pub fn written_txg(&self) -> u64 {
        if self.physical_birth == 0 {
            self.birth_txg
        } else {
            self.physical_birth
        }
    }

    /// The copies that exist.
    pub fn copies(&self) -> impl Iterator<Item = &Dva> {
        self.dvas.iter().take_while(|dva| !dva.is_empty())
    }

    /// Total space allocated for all copies.
    pub fn allocated_bytes(&self) -> u64 {
        self.copies().map(|dva| dva.asize as u64).sum()
    }

    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), BLOCK_POINTER_BYTES);
        out.fill(0);
        for (index, dva) in self.dvas.iter().enumerate() {
            put_u32(out, index * 16, dva.vdev);
            put_u32(out, index * 16 + 4, dva.asize);
            put_u64(out, index * 16 + 8, dva.offset);
        }
        put_u64(out, 48, self.birth_txg);
        put_u32(out, 56, self.logical_size);
        put_u32(out, 60, self.physical_size);
        out[64] = self.level;
        out[65] = self.object_type.code();
        out[66] = if self.is_hole() {
            0
        } else {
            self.checksum_algo.code()
        };
        out[67] = self.compression.code();
        put_u64(out, 72, self.fill);
        put_u64(out, 80, self.physical_birth);
        out[96..128].copy_from_slice(&self.checksum.0);
        if let Some(crypt) = &self.crypt {
            assert!(
                self.dvas[2].is_empty() && self.checksum.0[16..].iter().all(|byte| *byte == 0),
                "an encrypted block has no third copy and a 16-byte checksum"
            );
            out[68] = FLAG_ENCRYPTED;
            out[32..32 + IV_BYTES].copy_from_slice(&crypt.iv);
            put_u64(out, 88, crypt.salt);
            out[112..128].copy_from_slice(&crypt.mac);
        }
        if let Some(digest) = &self.digest {
            assert!(
                self.crypt.is_none()
                    && self.checksum_algo == ChecksumAlgo::Xxh3
                    && self.checksum.0[16..].iter().all(|byte| *byte == 0),
                "a digest takes an XXH3 checksum's second half, and no sealed block has one"
            );
            out[68] |= FLAG_DIGEST;
            out[112..128].copy_from_slice(digest);
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<BlockPointer, FormatError> {
        const WHAT: &str = "block pointer";
        if bytes.len() != BLOCK_POINTER_BYTES {
            return Err(invalid(
                WHAT,
                format!("{} bytes, expected {BLOCK_POINTER_BYTES}", bytes.len()),
            ));
        }
        let flags = bytes[68];
        if flags & !(FLAG_ENCRYPTED | FLAG_DIGEST) != 0 {
            return Err(invalid(WHAT, format!("unknown flags {flags:#x}")));
        }
        let encrypted = flags & FLAG_ENCRYPTED != 0;
        let digested = flags & FLAG_DIGEST != 0;
        let mut dvas = [Dva::default(); DVA_COUNT];
        // An encrypted block's DVA 2 holds its IV, not a copy.
        let copies = if encrypted { DVA_COUNT - 1 } else { DVA_COUNT };
        for (index, dva) in dvas.iter_mut().enumerate().take(copies) {
            *dva = Dva {
                vdev: get_u32(bytes, index * 16),
                asize: get_u32(bytes, index * 16 + 4),
                offset: get_u64(bytes, index * 16 + 8),
            };
        }
        let level = bytes[64];
        let object_type = ObjectType::from_code(bytes[65])
            .ok_or_else(|| invalid(WHAT, format!("unknown object type {}", bytes[65])))?;
        let compression = Compression::from_code(bytes[67])
            .ok_or_else(|| invalid(WHAT, format!("unknown compression {}", bytes[67])))?;
        if level > LEVEL_MAX {
            return Err(invalid(WHAT, format!("level {level} above {LEVEL_MAX}")));
        }
        let mut checksum = Checksum::default();
        checksum.0.copy_from_slice(&bytes[96..128]);
        let crypt = encrypted.then(|| {
            checksum.0[16..].fill(0);
            BlockCrypt {
                salt: get_u64(bytes, 88),
                iv: bytes[32..32 + IV_BYTES].try_into().expect("12 bytes"),
                mac: bytes[112..128].try_into().expect("16 bytes"),
            }
        });
        let digest = digested.then(|| {
            checksum.0[16..].fill(0);
            bytes[112..128].try_into().expect("16 bytes")
        });
        let hole = dvas[0].is_empty();
        if digested && (encrypted || hole || bytes[66] != ChecksumAlgo::Xxh3.code()) {
            return Err(invalid(
                WHAT,
                "a pointer with a digest must be a block with an XXH3 checksum, not sealed",
            ));
        }
        if encrypted && (hole || level != 0 || bytes[66] != ChecksumAlgo::Xxh3.code()) {
            return Err(invalid(
                WHAT,
                "an encrypted pointer must be a data block with an XXH3 checksum",
            ));
        }
        let checksum_algo = if hole {
            ChecksumAlgo::default()
        } else {
            ChecksumAlgo::from_code(bytes[66])
                .ok_or_else(|| invalid(WHAT, format!("unknown checksum algorithm {}", bytes[66])))?
        };
        let pointer = BlockPointer {
            dvas,
            birth_txg: get_u64(bytes, 48),
            physical_birth: get_u64(bytes, 80),
            logical_size: get_u32(bytes, 56),
            physical_size: get_u32(bytes, 60),
            level,
            object_type,
            checksum_algo,
            compression,
            fill: get_u64(bytes, 72),
            checksum,
            crypt,
            digest,
        };
        if !hole {
            pointer.validate()?;
        }
        Ok(pointer)
    }

    /// Checks the fields of a non-hole pointer for internal consistency.
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "block pointer";
        if self.logical_size == 0
            || self.logical_size > BLOCK_SIZE_MAX_BYTES
            || !self.logical_size.is_multiple_of(512)
        {
            return Err(invalid(WHAT, format!("logical size {}", self.logical_size)));
        }
        if self.physical_size == 0 || self.physical_size > self.logical_size {
            return Err(invalid(
                WHAT,
                format!(
                    "physical size {} for logical {}",
                    self.physical_size, self.logical_size
                ),
            ));
        }
        if self.compression == Compression::Off && self.physical_size != self.logical_size {
            return Err(invalid(
                WHAT,
                "uncompressed block with physical size != logical size",
            ));
        }
        let mut ended = false;
        for dva in &self.dvas {
            if dva.is_empty() {
                ended = true;
                if dva.vdev != 0 || dva.offset != 0 {
                    return Err(invalid(WHAT, "empty DVA with a location"));
                }
                continue;
            }
            if ended {
                return Err(invalid(WHAT, "DVA after an empty one"));
            }
            if dva.offset % 512 != 0
                || dva.asize % 512 != 0
                || (dva.asize as u64) < self.physical_size as u64
            {
                return Err(invalid(
                    WHAT,
                    format!("DVA {dva:?} cannot hold {} bytes", self.physical_size),
                ));
            }
            if dva.offset.checked_add(dva.asize as u64).is_none() {
                return Err(invalid(WHAT, "DVA past the end of the address space"));
            }
        }
        if self.physical_birth != 0 && (self.level != 0 || self.physical_birth >= self.birth_txg) {
            return Err(invalid(
                WHAT,
                format!(
                    "level {} block written in txg {} and born in {}",
                    self.level, self.physical_birth, self.birth_txg
                ),
            ));
        }
        if self.level == 0 && self.fill != 1 {
            return Err(invalid(WHAT, format!("data block with fill {}", self.fill)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> BlockPointer {
        BlockPointer {
            dvas: [
                Dva {
                    vdev: 1,
                    asize: 16384,
                    offset: 1 << 30,
                },
                Dva {
                    vdev: 0,
                    asize: 16384,
                    offset: 4096,
                },
                Dva::default(),
            ],
            birth_txg: 42,
            physical_birth: 0,
            logical_size: 16384,
            physical_size: 16384,
            level: 0,
            object_type: ObjectType::VolumeData,
            checksum_algo: ChecksumAlgo::Xxh3,
            compression: Compression::Off,
            fill: 1,
            checksum: ChecksumAlgo::Xxh3.compute(b"abc"),
            crypt: None,
            digest: None,
        }
    }

    /// A metadata block's digest round-trips in the checksum's second
    /// half; a pointer that claims one with another checksum, or sealed,
    /// is refused.
    #[test]
    fn a_digest_round_trips_and_is_refused_where_it_cannot_be() {
        let mut pointer = sample();
        pointer.level = 1;
        pointer.digest = Some([0x5a; DIGEST_BYTES]);
        let mut bytes = [0u8; BLOCK_POINTER_BYTES];
        pointer.encode(&mut bytes);
        assert_eq!(bytes[68], FLAG_DIGEST);
        assert_eq!(&bytes[112..128], &[0x5a; DIGEST_BYTES]);
        assert_eq!(BlockPointer::decode(&bytes).unwrap(), pointer);
        let mut fletcher = bytes;
        fletcher[66] = ChecksumAlgo::Fletcher4.code();
        assert!(BlockPointer::decode(&fletcher).is_err());
        let mut sealed = bytes;
        sealed[68] |= FLAG_ENCRYPTED;
        assert!(BlockPointer::decode(&sealed).is_err());
    }

    #[test]
    fn a_sealing_outside_a_pointer_has_one_layout() {
        let crypt = BlockCrypt {
            salt: 0x1122_3344_5566_7788,
            iv: [0xa5; IV_BYTES],
            mac: [0x3c; MAC_BYTES],
        };
        let bytes = crypt.to_bytes();
        // docs/FORMAT.md: salt (little-endian), IV, 4 zero bytes, MAC.
        assert_eq!(bytes[..8], 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(bytes[8..20], [0xa5; IV_BYTES]);
        assert_eq!(bytes[20..24], [0; 4]);
        assert_eq!(bytes[24..], [0x3c; MAC_BYTES]);
        assert_eq!(BlockCrypt::from_bytes(&bytes), Some(crypt));
        for reserved in 20..24 {
            let mut damaged = bytes;
            damaged[reserved] = 1;
            assert_eq!(BlockCrypt::from_bytes(&damaged), None);
        }
    }

    /// An encrypted block's IV, salt and MAC come back; its second copy
    /// slot and checksum stay as they were, and the format's rules hold.
    #[test]
    fn encrypted_pointers_round_trip() {
        let mut pointer = sample();
        pointer.dvas[1] = Dva::default();
        pointer.crypt = Some(BlockCrypt {
            salt: 0x1122_3344_5566_7788,
            iv: std::array::from_fn(|index| index as u8 + 1),
            mac: std::array::from_fn(|index| 0xf0 | index as u8),
        });
        let mut bytes = [0u8; BLOCK_POINTER_BYTES];
        pointer.encode(&mut bytes);
        assert_eq!(bytes[68], FLAG_ENCRYPTED);
        let decoded = BlockPointer::decode(&bytes).unwrap();
        assert_eq!(decoded, pointer);
        assert_eq!(decoded.copies().count(), 1, "the IV is no copy");
        // An unknown flag, an encrypted indirect block or another checksum
        // algorithm is refused.
        for (at, value) in [(68, 2u8), (64, 1), (66, ChecksumAlgo::Blake3.code())] {
            let mut bad = bytes;
            bad[at] = value;
            assert!(BlockPointer::decode(&bad).is_err(), "byte {at} = {value}");
        }
    }

    #[test]
    fn round_trips() {
        let pointer = sample();
        let mut bytes = [0u8; BLOCK_POINTER_BYTES];
        pointer.encode(&mut bytes);
        assert_eq!(BlockPointer::decode(&bytes).unwrap(), pointer);
        let hole = BlockPointer::hole(2, ObjectType::VolumeData, 9);
        hole.encode(&mut bytes);
        let decoded = BlockPointer::decode(&bytes).unwrap();
        assert!(decoded.is_hole());
        assert_eq!(decoded.birth_txg, 9);
        assert_eq!(decoded.level, 2);
    }

    #[test]
    fn rejects_inconsistent_fields() {
        let mut bytes = [0u8; BLOCK_POINTER_BYTES];
        let mut pointer = sample();
        pointer.physical_size = 32768;
        pointer.encode(&mut bytes);
        assert!(BlockPointer::decode(&bytes).is_err());
        let mut pointer = sample();
        pointer.dvas[0].offset = 1001;
        pointer.encode(&mut bytes);
        assert!(BlockPointer::decode(&bytes).is_err());
        let mut pointer = sample();
        pointer.dvas[1] = Dva::default();
        pointer.dvas[2] = Dva {
            vdev: 0,
            asize: 16384,
            offset: 0,
        };
        pointer.encode(&mut bytes);
        assert!(BlockPointer::decode(&bytes).is_err());
        sample().encode(&mut bytes);
        bytes[66] = 99;
        assert!(BlockPointer::decode(&bytes).is_err());
        sample().encode(&mut bytes);
        bytes[64] = LEVEL_MAX + 1;
        assert!(BlockPointer::decode(&bytes).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), BLOCK_POINTER_BYTES)) {
            let _ = BlockPointer::decode(&bytes);
        }

        #[test]
        fn valid_pointers_round_trip(vdev in 0u32..8, sectors in 1u32..256, offset_sectors in 0u64..(1 << 40), birth in 1u64..u64::MAX, level in 0u8..=LEVEL_MAX, fill in 1u64..1000) {
            let size = sectors * 512;
            let pointer = BlockPointer {
                dvas: [Dva { vdev, asize: size, offset: offset_sectors * 512 }, Dva::default(), Dva::default()],
                birth_txg: birth,
                physical_birth: 0,
                logical_size: size,
                physical_size: size,
                level,
                object_type: ObjectType::DnodeTable,
                checksum_algo: ChecksumAlgo::Blake3,
                compression: Compression::Off,
                fill: if level == 0 { 1 } else { fill },
                checksum: ChecksumAlgo::Blake3.compute(&offset_sectors.to_le_bytes()),
                crypt: None,
                digest: None,
            };
            let mut bytes = [0u8; BLOCK_POINTER_BYTES];
            pointer.encode(&mut bytes);
            prop_assert_eq!(BlockPointer::decode(&bytes).unwrap(), pointer);
        }
    }
}
