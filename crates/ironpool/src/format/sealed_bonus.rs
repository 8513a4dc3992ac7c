//! The attributes of an encrypted filesystem's object as stored: its
//! znode sealed (`format::znode`), in the dnode's bonus area.
//!
//! An encrypted filesystem's dnodes would otherwise show every object's
//! mode, owner, group, times, link count and parent in the clear; OpenZFS
//! encrypts its dnodes' bonus buffers for the same reason. Layout of a
//! sealed bonus (little-endian; offsets from the bonus start):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | [`SEALED_BONUS_VERSION`] (a znode's first byte is its version, 1: one is never taken for the other) |
//! | 1 | 1 | flags: [`SEALED_NO_NAMES`] |
//! | 2 | 6 | zero |
//! | 8 | 8 | owner: of an extended attribute object, the object whose attributes it holds; else 0 |
//! | 16 | 8 | salt of the key it is sealed under |
//! | 24 | 12 | IV |
//! | 36 | 4 | zero |
//! | 40 | 16 | MAC |
//! | 56 | 128 | the znode's 128 bytes, sealed |
//! | 184 | 120 | zero |
//!
//! Bytes 0 to 16 stay in the clear, authenticated with the rest: what a
//! raw send needs without the key, to leave out a file that has no names
//! left and the extended attributes of one (as OpenZFS's unlinked set,
//! which is in the clear too). The sealing itself is `crypto::seal_bonus`.

use super::bp::{BlockCrypt, SEALING_BYTES};
use super::dnode::{Bonus, BONUS_BYTES};
use super::znode::ZNODE_EXT_BYTES;
use super::{get_u64, invalid, put_u64, FormatError, ObjectType};

/// First byte of a sealed bonus.
pub const SEALED_BONUS_VERSION: u8 = 0x81;
/// Flag: a file or directory whose link count is zero (removed while in
/// use): a send leaves it out, and it is freed when its key is next loaded
/// or at import.
pub const SEALED_NO_NAMES: u8 = 1;
/// Bytes of the sealed znode.
pub const SEALED_ZNODE_BYTES: usize = ZNODE_EXT_BYTES;
/// Offset of the sealed znode in the bonus.
const CIPHERTEXT_AT: usize = 56;
/// Bytes in the clear that the MAC covers (version, flags, owner).
const CLEAR_BYTES: usize = 16;

/// Domain of a sealed bonus's associated data.
const AAD_DOMAIN: &[u8; 16] = b"ironpool bonus 1";
/// Bytes of a sealed bonus's associated data.
pub const SEALED_BONUS_AAD_BYTES: usize = 16 + 8 + 1 + CLEAR_BYTES;

/// A sealed bonus, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedBonus {
    /// The object has no names left ([`SEALED_NO_NAMES`]).
    pub no_names: bool,
    /// An extended attribute object's owner; 0 for other objects.
    pub owner: u64,
    /// The salt, IV and MAC of the sealing.
    pub crypt: BlockCrypt,
    /// The znode's bytes, sealed.
    pub ciphertext: [u8; SEALED_ZNODE_BYTES],
}

const _: () = assert!(CIPHERTEXT_AT + SEALED_ZNODE_BYTES <= BONUS_BYTES);
const _: () = assert!(16 + SEALING_BYTES == CIPHERTEXT_AT);

/// Whether `bonus` holds sealed attributes.
pub fn is_sealed(bonus: &Bonus) -> bool {
    bonus.0[0] == SEALED_BONUS_VERSION
}

impl SealedBonus {
    pub fn encode(&self) -> Bonus {
        let mut bonus = Bonus::default();
        self.encode_clear(&mut bonus.0[..CLEAR_BYTES]);
        let out = &mut bonus.0;
        out[16..CIPHERTEXT_AT].copy_from_slice(&self.crypt.to_bytes());
        out[CIPHERTEXT_AT..CIPHERTEXT_AT + SEALED_ZNODE_BYTES].copy_from_slice(&self.ciphertext);
        bonus
    }

    /// The clear part (bytes 0 to 16).
    fn encode_clear(&self, out: &mut [u8]) {
        out[0] = SEALED_BONUS_VERSION;
        out[1] = if self.no_names { SEALED_NO_NAMES } else { 0 };
        put_u64(out, 8, self.owner);
    }

    /// A sealed bonus; None when `bonus` is not one (a znode in the clear).
    pub fn decode(bonus: &Bonus) -> Result<Option<SealedBonus>, FormatError> {
        let bytes = &bonus.0;
        if !is_sealed(bonus) {
            return Ok(None);
        }
        if bytes[1] & !SEALED_NO_NAMES != 0 {
            return Err(invalid(
                "sealed attributes",
                format!("flags {:#x}", bytes[1]),
            ));
        }
        let crypt = BlockCrypt::from_bytes(
            bytes[16..CIPHERTEXT_AT]
                .try_into()
                .expect("the sealing's bytes"),
        );
        let zero = bytes[2..8]
            .iter()
            .chain(&bytes[CIPHERTEXT_AT + SEALED_ZNODE_BYTES..]);
        let (Some(crypt), false) = (crypt, zero.into_iter().any(|byte| *byte != 0)) else {
            return Err(invalid("sealed attributes", "reserved bytes not zero"));
        };
        Ok(Some(SealedBonus {
            no_names: bytes[1] & SEALED_NO_NAMES != 0,
            owner: get_u64(bytes, 8),
            crypt,
            ciphertext: bytes[CIPHERTEXT_AT..CIPHERTEXT_AT + SEALED_ZNODE_BYTES]
                .try_into()
                .expect("znode bytes"),
        }))
    }

    /// What the MAC authenticates besides the znode: the object it belongs
    /// to (its number and type: one object's attributes moved to another
    /// fail) and the clear part.
    pub fn aad(&self, object: u64, object_type: ObjectType) -> [u8; SEALED_BONUS_AAD_BYTES] {
        let mut aad = [0u8; SEALED_BONUS_AAD_BYTES];
        aad[..16].copy_from_slice(AAD_DOMAIN);
        aad[16..24].copy_from_slice(&object.to_le_bytes());
        aad[24] = object_type.code();
        self.encode_clear(&mut aad[25..]);
        aad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bp::{IV_BYTES, MAC_BYTES};
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_is_told_from_a_znode() {
        let sealed = SealedBonus {
            no_names: true,
            owner: 77,
            crypt: BlockCrypt {
                salt: 0x1122_3344_5566_7788,
                iv: [9; IV_BYTES],
                mac: [7; MAC_BYTES],
            },
            ciphertext: [0xa5; SEALED_ZNODE_BYTES],
        };
        let bonus = sealed.encode();
        assert!(is_sealed(&bonus));
        assert_eq!(SealedBonus::decode(&bonus).unwrap(), Some(sealed));
        // A znode is not sealed, and cannot be read as one.
        let znode = super::super::znode::Znode {
            mode: super::super::znode::S_IFREG,
            ..Default::default()
        };
        assert_eq!(SealedBonus::decode(&znode.encode()).unwrap(), None);
        assert!(super::super::znode::Znode::decode(&bonus).is_err());
        // The clear part is in the associated data.
        let other = SealedBonus {
            owner: 78,
            ..sealed
        };
        assert_ne!(
            sealed.aad(5, ObjectType::FsXattr),
            other.aad(5, ObjectType::FsXattr)
        );
        assert_ne!(
            sealed.aad(5, ObjectType::FsXattr),
            sealed.aad(6, ObjectType::FsXattr)
        );
        let mut bad = bonus;
        bad.0[1] = 2;
        assert!(SealedBonus::decode(&bad).is_err());
        let mut bad = bonus;
        bad.0[BONUS_BYTES - 1] = 1;
        assert!(SealedBonus::decode(&bad).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), BONUS_BYTES)) {
            let _ = SealedBonus::decode(&Bonus(bytes.try_into().unwrap()));
        }
    }
}
