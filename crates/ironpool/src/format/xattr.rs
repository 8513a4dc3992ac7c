//! Extended attributes of a filesystem object, as stored in its xattr object.
//!
//! A file, directory or link with extended attributes names, in its
//! attributes ([`super::znode::Znode::xattr_object`]), an object of type
//! `FsXattr` in the same filesystem. That object has one data block holding
//! every attribute of its owner, encoded here; a change writes the whole list
//! anew as a new block and swaps the object's one block pointer, so a crash
//! keeps the old list or the new one, never a mix. The list is bounded
//! ([`XATTR_LIST_BYTES_MAX`]), so the rewrite is too.
//!
//! Layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version (1) |
//! | 1 | 3 | zero |
//! | 4 | 4 | count: attributes that follow |
//! | 8 | | each attribute: name length (u16), value length (u32), the name, the value |
//!
//! Names are sorted bytewise and unique, 1 to [`XATTR_NAME_BYTES_MAX`]
//! bytes without NUL; values are 0 to [`XATTR_VALUE_BYTES_MAX`] bytes. The
//! object's length is the encoding's length; an empty object is an empty
//! list.

use super::{invalid, FormatError};

const XATTR_VERSION: u8 = 1;
const HEADER_BYTES: usize = 8;
const ENTRY_HEADER_BYTES: usize = 6;
/// Longest attribute name: Linux's `XATTR_NAME_MAX`.
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest value: Linux's `XATTR_SIZE_MAX` (the kernel refuses larger ones
/// before they reach a filesystem).
pub const XATTR_VALUE_BYTES_MAX: usize = 65536;
/// Largest encoded list of one object: 128 KiB, one block, so that a change
/// is one block write and one pointer swap (atomic), and its cost bounded.
/// It holds two values of the largest size, or thousands of small ones (ext4
/// keeps one 4 KiB block; a list that would not fit is refused with ENOSPC,
/// as there).
pub const XATTR_LIST_BYTES_MAX: usize = 128 * 1024;

/// Longest list of names (each followed by a NUL) one object's attributes
/// may have: Linux's `XATTR_LIST_MAX`, the most `listxattr(2)` can return.
/// A name past it would make the list unreadable (`E2BIG`), and `cp -a`,
/// `tar` and `rsync -X` could not copy the file, so it is refused (`ENOSPC`,
/// as ext4 refuses one past its block).
pub const XATTR_NAMES_LIST_BYTES_MAX: usize = 65536;

/// The bytes `listxattr(2)` returns for `list`: every name and its NUL.
pub fn names_list_len(list: &[Xattr]) -> usize {
    list.iter().map(|xattr| xattr.name.len() + 1).sum()
}

/// One extended attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// Whether `name` can name an attribute.
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= XATTR_NAME_BYTES_MAX && !name.contains(&0)
}

/// The encoded length of `list`.
pub fn encoded_len(list: &[Xattr]) -> usize {
    if list.is_empty() {
        return 0;
    }
    HEADER_BYTES
        + list
            .iter()
            .map(|xattr| ENTRY_HEADER_BYTES + xattr.name.len() + xattr.value.len())
            .sum::<usize>()
}

/// Encodes `list` (sorted, unique and valid names; see [`decode`]). An empty
/// list encodes to nothing.
pub fn encode(list: &[Xattr]) -> Vec<u8> {
    if list.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(encoded_len(list));
    out.push(XATTR_VERSION);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for xattr in list {
        out.extend_from_slice(&(xattr.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&(xattr.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&xattr.name);
        out.extend_from_slice(&xattr.value);
    }
    out
}

/// Decodes a list, refusing anything [`encode`] would not write.
pub fn decode(bytes: &[u8]) -> Result<Vec<Xattr>, FormatError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    if bytes.len() > XATTR_LIST_BYTES_MAX {
        return Err(invalid("xattr list", format!("{} bytes", bytes.len())));
    }
    if bytes.len() < HEADER_BYTES {
        return Err(invalid("xattr list", "shorter than its header"));
    }
    if bytes[0] != XATTR_VERSION || bytes[1..4] != [0; 3] {
        return Err(invalid("xattr list", format!("version {}", bytes[0])));
    }
    let count = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    if count == 0 {
        return Err(invalid("xattr list", "an empty list is stored as no bytes"));
    }
    let mut list: Vec<Xattr> = Vec::new();
    let mut rest = &bytes[HEADER_BYTES..];
    for _ in 0..count {
        if rest.len() < ENTRY_HEADER_BYTES {
            return Err(invalid("xattr list", "attribute header cut short"));
        }
        let name_len = u16::from_le_bytes(rest[0..2].try_into().expect("2 bytes")) as usize;
        let value_len = u32::from_le_bytes(rest[2..6].try_into().expect("4 bytes")) as usize;
        rest = &rest[ENTRY_HEADER_BYTES..];
        if value_len > XATTR_VALUE_BYTES_MAX || rest.len() < name_len + value_len {
            return Err(invalid("xattr list", "attribute cut short"));
        }
        let name = &rest[..name_len];
        if !valid_name(name) {
            return Err(invalid("xattr list", "attribute name"));
        }
        if list.last().is_some_and(|last| last.name.as_slice() >= name) {
            return Err(invalid("xattr list", "names out of order"));
        }
        list.push(Xattr {
            name: name.to_vec(),
            value: rest[name_len..name_len + value_len].to_vec(),
        });
        rest = &rest[name_len + value_len..];
    }
    if !rest.is_empty() {
        return Err(invalid("xattr list", "bytes after the last attribute"));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xattr(name: &str, value: &[u8]) -> Xattr {
        Xattr {
            name: name.as_bytes().to_vec(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn round_trips_and_refuses_what_encode_would_not_write() {
        assert_eq!(decode(&[]).unwrap(), Vec::new());
        assert!(encode(&[]).is_empty());
        let list = vec![
            xattr("security.selinux", b"system_u:object_r:etc_t:s0\0"),
            xattr("user.empty", b""),
            xattr("user.mime_type", b"text/plain"),
        ];
        let bytes = encode(&list);
        assert_eq!(bytes.len(), encoded_len(&list));
        assert_eq!(decode(&bytes).unwrap(), list);
        // Each cut is refused.
        for cut in 1..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_err());
        let unsorted = encode(&[list[2].clone(), list[0].clone()]);
        assert!(decode(&unsorted).is_err());
        let twice = encode(&[list[0].clone(), list[0].clone()]);
        assert!(decode(&twice).is_err());
        assert!(decode(&encode(&[xattr("a\0b", b"")])).is_err());
        let mut version = bytes;
        version[0] = 2;
        assert!(decode(&version).is_err());
    }
}
