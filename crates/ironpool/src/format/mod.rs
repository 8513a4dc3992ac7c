//! Every on-disk structure, with its encoding, decoding and checks, in one place.
//! `docs/FORMAT.md` describes the same layout in prose; the two are kept in step.
//!
//! All integers are little-endian. Every structure either checksums itself
//! (labels, uberblocks) or is checksummed by the block pointer that points to it
//! (everything else), so a decoder is only ever given bytes whose integrity was
//! verified — and it still validates every field, because a checksum proves the
//! bytes are what was written, not that what was written is sane.

pub mod acl;
pub mod bp;
pub mod checksum;
pub mod clones;
pub mod dnode;
pub mod fsdir;
pub mod intent_log;
pub mod label;
pub mod package;
pub mod portable;
pub mod remap;
pub mod sealed_bonus;
pub mod spacemap;
pub mod stream;
pub mod uberblock;
pub mod xattr;
pub mod znode;

pub use bp::{BlockPointer, Dva};
pub use checksum::{Checksum, ChecksumAlgo};
pub use dnode::{Dnode, ObjectType};
pub use uberblock::Uberblock;

/// The on-disk format version this build writes. Version 2 (directories
/// whose root leaf is block 0 and may be small, see `fsdir`) is read by no
/// build before it; a version 1 pool is read as it is and written as
/// version 2 from its first commit here (a one-way upgrade: older builds
/// then refuse it with a clear error instead of misreading new
/// directories). Version 3 adds block cloning: a block pointer's physical
/// birth (offset 80) and the pool's block reference table, which counts
/// the extra references of a cloned block; an older build would free a
/// cloned block while another file still points at it, so it must refuse
/// the pool. Versions 1 and 2 are read as they are and written as 3 from
/// the first commit, as 1 became 2. Version 4 adds device removal: a
/// removed top-level vdev stays in the config as an `indirect` vdev whose
/// blocks are found through its mapping (`format::remap`), and a removal
/// in progress is in the directory; an older build would read a removed
/// vdev's blocks where they no longer are, or allocate on a vdev being
/// emptied, so it must refuse the pool. Older versions are written as 4
/// from the first commit. Version 5 adds encryption: a block pointer's
/// flags (offset 68), IV (in DVA 2's place), salt (offset 88) and MAC (the
/// checksum's second half), and a volume record's wrapped key; an older
/// build would serve an encrypted block's ciphertext as its data (its
/// checksum, which covers the ciphertext, passes), so it must refuse the
/// pool. Older versions are written as 5 from the first commit. Version 6
/// seals the attributes of an encrypted filesystem's objects in their
/// dnodes' bonus (`format::sealed_bonus`); an older build would take them
/// for damaged znodes, so it must refuse the pool. Older versions are
/// written as 6 from the first commit. Version 7 claims an encrypted
/// filesystem's intent log at import without its key (the head's
/// `claimed`, its blocks committed in the space maps) and replays it at
/// the key's load; an older build would take the claimed blocks for
/// durable changes already in the tree and drop the chain, losing what it
/// made durable and leaking its space, so it must refuse the pool. Older
/// versions are written as 7 from the first commit. Version 8
/// authenticates encrypted datasets made by it: their metadata blocks'
/// pointers carry portable digests (flag bit 1, in the checksum's second
/// half), their objects' dnodes flag bit 1, and their root dnodes the
/// dataset's MAC (`format::portable`); an older build refuses such a
/// pointer as unknown mid-read, and would write such a tree without its
/// digests, so it must refuse the pool. Older versions are written as 8
/// from the first commit.
pub const FORMAT_VERSION: u32 = 8;
/// The oldest on-disk format version this build reads (6093ca7 and before
/// wrote 1, which is a subset of 2).
pub const FORMAT_VERSION_MIN: u32 = 1;

/// Checks a pool, dataset or snapshot name component as the pool directory
/// and the send streams store it: letters, digits, `-`, `_`, `.`, starting
/// with a letter or digit, at most 200 bytes (a nested dataset's name is
/// such components joined by `/`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .next()
            .is_some_and(|first| first.is_ascii_alphanumeric())
        && name.chars().all(|character| {
            character.is_ascii_alphanumeric() || matches!(character, '-' | '_' | '.')
        })
}

/// Whether this build reads structures of format version `version`.
pub fn format_version_readable(version: u32) -> bool {
    (FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version)
}

/// Size of one label: a config area and an uberblock ring.
pub const LABEL_SIZE_BYTES: u64 = 256 * 1024;
/// Size of a label's config area (header + config document).
pub const LABEL_CONFIG_BYTES: u64 = 128 * 1024;
/// Size of a label's uberblock ring.
pub const UBERBLOCK_RING_BYTES: u64 = 128 * 1024;
/// Labels per device: two at the front, two at the end, so that a device
/// overwritten at either end keeps a copy.
pub const LABEL_COUNT: usize = 4;
/// Bytes reserved at the front of a device: labels 0 and 1, then padding so that
/// the data area starts 1 MiB aligned (good for every SSD's erase geometry).
pub const DATA_START_BYTES: u64 = 1024 * 1024;
/// Bytes reserved at the end of a device: labels 2 and 3.
pub const DATA_END_RESERVE_BYTES: u64 = 2 * LABEL_SIZE_BYTES;
/// Smallest device accepted: room for labels and a few metaslabs.
pub const DEVICE_SIZE_MIN_BYTES: u64 = 64 * 1024 * 1024;

/// Largest ashift (sector size 2^ashift) supported: 64 KiB sectors.
pub const ASHIFT_MAX: u8 = 16;
/// Smallest ashift: 512-byte sectors.
pub const ASHIFT_MIN: u8 = 9;
/// Ashift used when the device does not report one (4 KiB, as on all modern SSDs).
pub const ASHIFT_DEFAULT: u8 = 12;

/// Size of an uberblock slot in the ring: at least 1 KiB, or one sector.
pub fn uberblock_slot_bytes(ashift: u8) -> u64 {
    (1u64 << ashift).max(1024)
}

/// Number of uberblock slots in a ring for a given ashift.
pub fn uberblock_slot_count(ashift: u8) -> u64 {
    UBERBLOCK_RING_BYTES / uberblock_slot_bytes(ashift)
}

/// Byte offset of label `index` on a device whose label-aligned size is `size`.
pub fn label_offset(index: usize, device_size_bytes: u64) -> u64 {
    let aligned = device_size_bytes / LABEL_SIZE_BYTES * LABEL_SIZE_BYTES;
    match index {
        0 => 0,
        1 => LABEL_SIZE_BYTES,
        2 => aligned - 2 * LABEL_SIZE_BYTES,
        _ => aligned - LABEL_SIZE_BYTES,
    }
}

/// Usable data bytes of a device of `device_size_bytes`.
pub fn data_area_bytes(device_size_bytes: u64) -> u64 {
    let aligned = device_size_bytes / LABEL_SIZE_BYTES * LABEL_SIZE_BYTES;
    aligned.saturating_sub(DATA_START_BYTES + DATA_END_RESERVE_BYTES)
}

/// A structure could not be decoded.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad magic number in {0}")]
    BadMagic(&'static str),
    #[error("{what} has format version {found}, this build reads versions {FORMAT_VERSION_MIN} to {FORMAT_VERSION}")]
    UnsupportedVersion { what: &'static str, found: u32 },
    #[error("checksum mismatch in {0}")]
    ChecksumMismatch(&'static str),
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what,
        reason: reason.into(),
    }
}

pub(crate) fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}
pub(crate) fn put_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}
pub(crate) fn get_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}
pub(crate) fn get_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(word)
}

/// Identity numbers (pool, vdev) are random 64-bit values drawn at creation.
pub fn new_guid() -> u64 {
    // Under the simulator the guid comes from the seed, so a run replays exactly.
    if let Some(value) = crate::rt::simulated_random_u64() {
        return value.max(1);
    }
    let mut bytes = [0u8; 8];
    // getrandom(2) never fails for 8 bytes on Linux >= 3.17 once the pool is seeded;
    // fall back to time and address entropy otherwise.
    // SAFETY: writes at most 8 bytes into a local array.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    let mut guid = u64::from_le_bytes(bytes);
    if got != 8 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        guid = now ^ (&bytes as *const _ as u64).rotate_left(17);
    }
    if guid == 0 {
        1
    } else {
        guid
    }
}
