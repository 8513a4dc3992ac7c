//! POSIX ACLs as Linux passes them in the `system.posix_acl_access` and
//! `system.posix_acl_default` extended attributes, which a filesystem with
//! `acltype=posix` stores as they are (OpenZFS on Linux keeps them the
//! same way, as system attributes).
//!
//! The value (little-endian): a 4-byte version (2), then 8 bytes per
//! entry: tag (u16), permissions (u16: read 4, write 2, execute 1), id
//! (u32: the user or group of a named entry, else `u32::MAX`). Entries are
//! in tag order, named ones by id, as Linux's `posix_acl_valid` wants:
//! one owner entry, named users, one owning-group entry, named groups, a
//! mask (required with named entries), one other entry.
//!
//! The rules that tie an ACL to the mode bits are POSIX.1e's, as Linux
//! applies them (`posix_acl_equiv_mode`, `posix_acl_chmod`,
//! `posix_acl_create_masq`): the mode's group bits are the mask when
//! there is one, and a `chmod` sets the owner, mask (or owning group) and
//! other entries.

use super::FormatError;

/// The version Linux writes (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;
/// Bytes of the header and of each entry.
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// Most entries an ACL may have: Linux refuses more than fit in a page
/// from a FUSE server (`fuse_get_acl` reads at most 4 KiB).
pub const ACL_ENTRIES_MAX: usize = (4096 - HEADER_BYTES) / ENTRY_BYTES;

/// The attribute holding a file's access ACL.
pub const ACCESS_NAME: &[u8] = b"system.posix_acl_access";
/// The attribute holding a directory's default ACL (what is made in it
/// starts from).
pub const DEFAULT_NAME: &[u8] = b"system.posix_acl_default";

/// Entry tags (`ACL_USER_OBJ`...).
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;

/// The id of an entry that names no one.
const UNDEFINED_ID: u32 = u32::MAX;

/// One entry: whose (`tag`, `id`) and what it may do (`perm`, 0..=7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A valid ACL, its entries in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

fn invalid(what: &str) -> FormatError {
    super::invalid("POSIX ACL", what.to_string())
}

impl Acl {
    /// Decodes and checks an attribute's value.
    pub fn decode(bytes: &[u8]) -> Result<Acl, FormatError> {
        if bytes.len() < HEADER_BYTES || !(bytes.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
            return Err(invalid("length"));
        }
        if u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) != VERSION {
            return Err(invalid("version"));
        }
        let count = (bytes.len() - HEADER_BYTES) / ENTRY_BYTES;
        if count > ACL_ENTRIES_MAX {
            return Err(invalid("too many entries"));
        }
        let entries = bytes[HEADER_BYTES..]
            .chunks_exact(ENTRY_BYTES)
            .map(|entry| AclEntry {
                tag: u16::from_le_bytes([entry[0], entry[1]]),
                perm: u16::from_le_bytes([entry[2], entry[3]]),
                id: u32::from_le_bytes(entry[4..8].try_into().expect("4 bytes")),
            })
            .collect();
        let acl = Acl { entries };
        acl.check()?;
        Ok(acl)
    }

    /// The attribute's value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.entries.len() * ENTRY_BYTES);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&entry.tag.to_le_bytes());
            out.extend_from_slice(&entry.perm.to_le_bytes());
            let id = if matches!(entry.tag, USER | GROUP) {
                entry.id
            } else {
                UNDEFINED_ID
            };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Checks the order and counts Linux's `posix_acl_valid` checks.
    fn check(&self) -> Result<(), FormatError> {
        let rank = |tag: u16| match tag {
            USER_OBJ => Some(0),
            USER => Some(1),
            GROUP_OBJ => Some(2),
            GROUP => Some(3),
            MASK => Some(4),
            OTHER => Some(5),
            _ => None,
        };
        let mut last: Option<(u8, u32)> = None;
        let mut counts = [0usize; 6];
        for entry in &self.entries {
            let rank = rank(entry.tag).ok_or_else(|| invalid("entry tag"))?;
            if entry.perm & !7 != 0 {
                return Err(invalid("entry permissions"));
            }
            let key = (
                rank,
                if matches!(entry.tag, USER | GROUP) {
                    entry.id
                } else {
                    0
                },
            );
            if last.is_some_and(|last| key <= last) {
                return Err(invalid("entries out of order or repeated"));
            }
            last = Some(key);
            counts[rank as usize] += 1;
        }
        let named = counts[1] + counts[3];
        if counts[0] != 1 || counts[2] != 1 || counts[5] != 1 || (named > 0 && counts[4] != 1) {
            return Err(invalid(
                "owner, group and other entries (and a mask with named ones)",
            ));
        }
        Ok(())
    }

    fn entry_mut(&mut self, tag: u16) -> Option<&mut AclEntry> {
        self.entries.iter_mut().find(|entry| entry.tag == tag)
    }

    /// The permission bits (`0o777` part of a mode) the ACL gives the
    /// owner, the group class (the mask, if any) and others; and whether
    /// the mode says all it does (no named entry, no mask), so it need
    /// not be kept.
    pub fn mode_bits(&self) -> (u32, bool) {
        let mut mode = 0u32;
        let mut equivalent = true;
        for entry in &self.entries {
            let perm = u32::from(entry.perm & 7);
            match entry.tag {
                USER_OBJ => mode |= perm << 6,
                GROUP_OBJ => mode |= perm << 3,
                OTHER => mode |= perm,
                MASK => {
                    mode = (mode & !0o070) | (perm << 3);
                    equivalent = false;
                }
                _ => equivalent = false,
            }
        }
        (mode, equivalent)
    }

    /// The ACL after a `chmod` to `mode`: the owner, mask (or, without
    /// one, owning group) and other entries take its bits.
    pub fn chmod(&mut self, mode: u32) {
        let bits = |shift: u32| ((mode >> shift) & 7) as u16;
        if let Some(owner) = self.entry_mut(USER_OBJ) {
            owner.perm = bits(6);
        }
        let group_class = if self.entries.iter().any(|entry| entry.tag == MASK) {
            MASK
        } else {
            GROUP_OBJ
        };
        if let Some(group) = self.entry_mut(group_class) {
            group.perm = bits(3);
        }
        if let Some(other) = self.entry_mut(OTHER) {
            other.perm = bits(0);
        }
    }

    /// A new object's access ACL from its directory's default ACL (this)
    /// and the `mode` it was asked with: each class's permissions limited
    /// by the mode, and the mode by the ACL. Returns the permission bits
    /// (the rest of `mode` as given) and the ACL, None when the mode says
    /// all of it.
    pub fn create_masked(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut bits = mode & 0o777;
        let mut equivalent = true;
        let has_mask = acl.entries.iter().any(|entry| entry.tag == MASK);
        for entry in &mut acl.entries {
            let class = |shift: u32, bits: u32| ((bits >> shift) & 7) as u16;
            match entry.tag {
                USER_OBJ => {
                    entry.perm &= class(6, bits);
                    bits &= (u32::from(entry.perm) << 6) | !0o700;
                }
                OTHER => {
                    entry.perm &= class(0, bits);
                    bits &= u32::from(entry.perm) | !0o007;
                }
                USER | GROUP => equivalent = false,
                MASK => equivalent = false,
                _ => {}
            }
        }
        let group_class = if has_mask { MASK } else { GROUP_OBJ };
        if let Some(group) = acl.entry_mut(group_class) {
            group.perm &= ((bits >> 3) & 7) as u16;
            bits &= (u32::from(group.perm) << 3) | !0o070;
        }
        let mode = (mode & !0o777) | (bits & 0o777);
        (mode, (!equivalent).then_some(acl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn named() -> Acl {
        Acl {
            entries: vec![
                entry(USER_OBJ, 7, UNDEFINED_ID),
                entry(USER, 6, 1000),
                entry(GROUP_OBJ, 5, UNDEFINED_ID),
                entry(GROUP, 4, 50),
                entry(MASK, 7, UNDEFINED_ID),
                entry(OTHER, 1, UNDEFINED_ID),
            ],
        }
    }

    #[test]
    fn an_acl_round_trips_and_bad_ones_are_refused() {
        let acl = named();
        assert_eq!(Acl::decode(&acl.encode()).unwrap(), acl);
        // Out of order, a named entry without a mask, bad permissions, a
        // stray tag, a wrong version or length: refused.
        let mut swapped = acl.clone();
        swapped.entries.swap(1, 2);
        let mut no_mask = acl.clone();
        no_mask.entries.remove(4);
        let mut bad_perm = acl.clone();
        bad_perm.entries[0].perm = 8;
        let mut bad_tag = acl.clone();
        bad_tag.entries[5].tag = 0x40;
        for bad in [swapped, no_mask, bad_perm, bad_tag] {
            assert!(Acl::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut bytes = acl.encode();
        bytes[0] = 1;
        assert!(Acl::decode(&bytes).is_err());
        assert!(Acl::decode(&acl.encode()[..10]).is_err());
        assert!(Acl::decode(&[]).is_err());
    }

    #[test]
    fn the_mode_follows_the_mask_and_chmod_sets_it() {
        let mut acl = named();
        assert_eq!(acl.mode_bits(), (0o771, false));
        acl.chmod(0o640);
        assert_eq!(acl.mode_bits(), (0o640, false));
        assert_eq!(acl.entries[2].perm, 5, "the owning group keeps its entry");
        assert_eq!(acl.entries[4].perm, 4, "the mask takes the group bits");
        let plain = Acl {
            entries: vec![
                entry(USER_OBJ, 6, UNDEFINED_ID),
                entry(GROUP_OBJ, 4, UNDEFINED_ID),
                entry(OTHER, 0, UNDEFINED_ID),
            ],
        };
        assert_eq!(plain.mode_bits(), (0o640, true));
    }

    #[test]
    fn a_new_object_takes_the_default_acl_limited_by_its_mode() {
        // A file asked 0o666 under default user::rwx user:1000:rw-
        // group::r-x group:50:r-- mask::rwx other::--x.
        let (mode, acl) = named().create_masked(0o100_666);
        let acl = acl.expect("named entries are kept");
        assert_eq!(mode, 0o100_660);
        assert_eq!(acl.mode_bits(), (0o660, false));
        assert_eq!(acl.entries[1].perm, 6, "named entries stay");
        // With base entries only, the mode says it all.
        let plain = Acl {
            entries: vec![
                entry(USER_OBJ, 7, UNDEFINED_ID),
                entry(GROUP_OBJ, 5, UNDEFINED_ID),
                entry(OTHER, 0, UNDEFINED_ID),
            ],
        };
        assert_eq!(plain.create_masked(0o40_777), (0o40_750, None));
    }
}
