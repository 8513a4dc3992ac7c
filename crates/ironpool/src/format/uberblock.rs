//! Uberblocks: the root of one committed transaction group.
//!
//! Each txg commit writes a new uberblock into slot `txg % slots` of the ring in
//! every label of every device. Import reads all rings and takes the valid
//! uberblock with the highest txg; a torn or lost write of the newest one leaves
//! the previous txg's uberblock, in another slot, as the answer.
//!
//! Layout (1024 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic "IRONUBER" |
//! | 8 | 4 | format version |
//! | 12 | 4 | reserved |
//! | 16 | 8 | txg |
//! | 24 | 8 | pool guid |
//! | 32 | 8 | guid sum: wrapping sum of every leaf vdev's guid in the config |
//! | 40 | 8 | timestamp, ns since the Unix epoch |
//! | 48 | 8 | txg of the config in force |
//! | 56 | 8 | reserved |
//! | 64 | 512 | the dnode of the dnode table (the root of everything) |
//! | 576 | 432 | reserved, zero |
//! | 1008 | 16 | XXH3-128 of bytes 0..1008 |

use super::checksum::embedded;
use super::dnode::{Dnode, DNODE_BYTES};
use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError, FORMAT_VERSION};

pub const UBERBLOCK_BYTES: usize = 1024;
pub const UBERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"IRONUBER");
const CHECKSUM_OFFSET: usize = UBERBLOCK_BYTES - 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Uberblock {
    pub txg: u64,
    pub pool_guid: u64,
    pub guid_sum: u64,
    pub timestamp_ns: u64,
    pub config_txg: u64,
    pub dnode_table: Dnode,
}

impl Uberblock {
    pub fn encode(&self) -> [u8; UBERBLOCK_BYTES] {
        let mut out = [0u8; UBERBLOCK_BYTES];
        put_u64(&mut out, 0, UBERBLOCK_MAGIC);
        put_u32(&mut out, 8, FORMAT_VERSION);
        put_u64(&mut out, 16, self.txg);
        put_u64(&mut out, 24, self.pool_guid);
        put_u64(&mut out, 32, self.guid_sum);
        put_u64(&mut out, 40, self.timestamp_ns);
        put_u64(&mut out, 48, self.config_txg);
        self.dnode_table.encode(&mut out[64..64 + DNODE_BYTES]);
        let checksum = embedded(&out[..CHECKSUM_OFFSET]);
        out[CHECKSUM_OFFSET..].copy_from_slice(&checksum);
        out
    }

    /// Decodes a slot. An all-zero slot (never written) is `BadMagic`.
    pub fn decode(bytes: &[u8]) -> Result<Uberblock, FormatError> {
        const WHAT: &str = "uberblock";
        if bytes.len() < UBERBLOCK_BYTES {
            return Err(invalid(WHAT, format!("{} bytes", bytes.len())));
        }
        let bytes = &bytes[..UBERBLOCK_BYTES];
        if get_u64(bytes, 0) != UBERBLOCK_MAGIC {
            return Err(FormatError::BadMagic(WHAT));
        }
        if embedded(&bytes[..CHECKSUM_OFFSET]) != bytes[CHECKSUM_OFFSET..] {
            return Err(FormatError::ChecksumMismatch(WHAT));
        }
        let version = get_u32(bytes, 8);
        if !super::format_version_readable(version) {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: version,
            });
        }
        let uberblock = Uberblock {
            txg: get_u64(bytes, 16),
            pool_guid: get_u64(bytes, 24),
            guid_sum: get_u64(bytes, 32),
            timestamp_ns: get_u64(bytes, 40),
            config_txg: get_u64(bytes, 48),
            dnode_table: Dnode::decode(&bytes[64..64 + DNODE_BYTES])?,
        };
        if uberblock.txg == 0 {
            return Err(invalid(WHAT, "txg 0"));
        }
        if uberblock.dnode_table.is_free() {
            return Err(invalid(WHAT, "no dnode table"));
        }
        Ok(uberblock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dnode::ObjectType;
    use crate::format::BlockPointer;
    use proptest::prelude::*;

    fn sample() -> Uberblock {
        Uberblock {
            txg: 17,
            pool_guid: 0xdead_beef,
            guid_sum: 99,
            timestamp_ns: 1_700_000_000_000_000_000,
            config_txg: 4,
            dnode_table: Dnode {
                object_type: ObjectType::DnodeTable,
                levels: 1,
                data_block_shift: 14,
                indirect_block_shift: 15,
                root: BlockPointer::hole(0, ObjectType::DnodeTable, 0),
                ..Dnode::default()
            },
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let bytes = sample().encode();
        assert_eq!(Uberblock::decode(&bytes).unwrap(), sample());
        for position in [0usize, 17, 100, 700, 1010] {
            let mut damaged = bytes;
            damaged[position] ^= 0x40;
            assert!(
                Uberblock::decode(&damaged).is_err(),
                "damage at {position} not detected"
            );
        }
        assert_eq!(
            Uberblock::decode(&[0u8; UBERBLOCK_BYTES]),
            Err(FormatError::BadMagic("uberblock"))
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = Uberblock::decode(&bytes);
        }
    }
}
