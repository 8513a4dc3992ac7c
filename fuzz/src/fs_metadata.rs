//! Target `fs_metadata`: a filesystem's attributes (`format::znode::Znode`,
//! `FsHeader`) and directory leaves (`format::fsdir::Leaf`).
//!
//! Input: a selector byte, then the bytes. Selector 2 mod 4: an extended
//! attribute list (`format::xattr`). Other even selectors: a 304-byte dnode
//! bonus (zero-padded or cut), decoded as attributes and as a header. Odd: a
//! directory leaf (zero-padded or cut to 16 KiB), expected at level
//! `selector >> 1 & 7`, prefix 0 or 1.

use ironpool::format::dnode::{Bonus, BONUS_BYTES};
use ironpool::format::fsdir::{prefix_of, Leaf, LeafBlock, LEAF_BYTES};
use ironpool::format::znode::{FsHeader, Znode};

pub fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector % 4 == 2 {
        if let Ok(list) = ironpool::format::xattr::decode(rest) {
            let bytes = ironpool::format::xattr::encode(&list);
            assert_eq!(bytes, rest, "an xattr list re-encodes to other bytes");
            assert_eq!(bytes.len(), ironpool::format::xattr::encoded_len(&list));
        }
    } else if selector % 2 == 0 {
        let mut bonus = Bonus::default();
        let length = rest.len().min(BONUS_BYTES);
        bonus.0[..length].copy_from_slice(&rest[..length]);
        if let Ok(znode) = Znode::decode(&bonus) {
            let again = Znode::decode(&znode.encode()).expect("re-encoded attributes decode");
            assert_eq!(again, znode, "attributes do not round trip");
        }
        if let Ok(header) = FsHeader::decode(&bonus) {
            let again = FsHeader::decode(&header.encode()).expect("re-encoded header decodes");
            assert_eq!(again, header, "header does not round trip");
        }
    } else {
        let mut bytes = vec![0u8; LEAF_BYTES];
        let length = rest.len().min(LEAF_BYTES);
        bytes[..length].copy_from_slice(&rest[..length]);
        let level = (selector >> 1) & 7;
        let prefix = u32::from(selector >> 4 & 1).min((1u32 << level) - 1);
        if let Ok(block) = LeafBlock::parse(bytes, level, prefix) {
            let leaf = block.to_leaf();
            assert!(leaf.fits(), "a decoded leaf fits its block");
            for entry in &leaf.entries {
                assert_eq!(prefix_of(entry.hash(), level), prefix);
                let found = block
                    .find(entry.hash(), &entry.name)
                    .expect("every entry is found");
                assert_eq!(found.name, &entry.name[..]);
                assert!(block.has_cookie(entry.cookie));
            }
            let again =
                Leaf::decode(&leaf.encode(), level, prefix).expect("re-encoded leaf decodes");
            assert_eq!(again, leaf, "leaf does not round trip");
        }
    }
}
