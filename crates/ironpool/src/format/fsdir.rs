//! Directory leaves of a filesystem: entries hashed by name into leaves of
//! a directory object, split by hash bits as they fill (extendible hashing,
//! as OpenZFS's fat ZAP, with the leaf table made implicit).
//!
//! Every entry has a 64-bit cookie: the top 32 bits of a salted XXH3 hash
//! of its name (never 0), and below them a collision number, the smallest
//! not taken by another entry with the same hash. A leaf holds every entry
//! whose hash starts with its `level`-bit prefix; leaf (level L >= 1,
//! prefix p) is data block `2^L + p` of the directory object. The root leaf
//! (level 0) is block 0 ([`ROOT_LEAF_BLKID`]); directories made before
//! version 2 of this layout have it at block 1 (`2^0 + 0`), which readers
//! still look at. A leaf that fills splits into its two children (the next
//! hash bit) and its own block becomes a hole. So along the path of a hash,
//! from the root down, every block is a hole until the one leaf that holds
//! the hash: lookup, insert and remove read O(log n) blocks, and no table
//! needs rewriting as the directory grows.
//!
//! A new directory's root leaf is small ([`ROOT_LEAF_BYTES_MIN`]), the
//! directory object's only block, with no indirect block above it: an
//! empty directory costs one sector per copy, as OpenZFS's micro-ZAP fits
//! a small directory in one block. When it fills, it grows to
//! [`LEAF_BYTES`] (the object's block size changes with it, as a one-block
//! file's does); only a full leaf of that size splits. Every other leaf is
//! [`LEAF_BYTES`].
//!
//! `readdir` walks entries in cookie order; a cookie says where to go on no
//! matter what was inserted or removed since (entries keep their cookies
//! for life), so offsets stay valid across concurrent changes.
//!
//! Leaf layout (the leaf's size: [`LEAF_BYTES`], or a power of two from
//! [`ROOT_LEAF_BYTES_MIN`] for a root leaf; little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `IPDL` |
//! | 4 | 1 | level L (0..=`LEVEL_MAX`) |
//! | 5 | 1 | reserved |
//! | 6 | 2 | entries |
//! | 8 | 4 | prefix (the top L bits of every entry's hash) |
//! | 12 | 4 | bytes used by entries |
//! | 16 | .. | entries, in cookie order: cookie (8), object (8), type (1, `DT_*`), name length (1), name |

use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError};

/// Bytes of a directory leaf (the directory object's data block size):
/// room for about 270 entries of 40-byte names.
pub const LEAF_BYTES: usize = 16 * 1024;
pub const LEAF_SHIFT: u8 = 14;
/// Bytes of a new directory's root leaf: one 4 KiB sector, the smallest
/// block the pool's devices write (room for about 70 entries of 40-byte
/// names). It grows to [`LEAF_BYTES`] before it splits.
pub const ROOT_LEAF_SHIFT_MIN: u8 = 12;
pub const ROOT_LEAF_BYTES_MIN: usize = 1 << ROOT_LEAF_SHIFT_MIN;
/// The root leaf's block in directories of this layout's version 2.
pub const ROOT_LEAF_BLKID: u64 = 0;
/// The root leaf's block in directories made before version 2.
pub const ROOT_LEAF_BLKID_V1: u64 = 1;
/// Longest entry name (Linux's NAME_MAX).
pub const NAME_BYTES_MAX: usize = 255;
/// Deepest leaf: 2^24 leaves of at least 60 entries each is far beyond any
/// directory; a leaf at this depth that fills (only a hash flood could)
/// refuses the insert.
pub const LEVEL_MAX: u8 = 24;
/// Cookies below this are `readdir`'s own: 0 is the start, 1 and 2 are `.`
/// and `..`. Every entry's cookie has a nonzero hash in its top half.
pub const COOKIE_FIRST: u64 = 1 << 32;

/// Bits of a cookie's collision number a directory offset keeps: an offset
/// ([`offset_of_cookie`]) must be a positive `loff_t` (`telldir` returns
/// it, `lseek`/`seekdir` refuse a negative one), so the 32-bit hash and
/// the collision number share 63 bits. Entries with one hash all sit in
/// one leaf (a split cannot part them), at most `LEAF_BYTES / 19` of them,
/// far below 2^31.
const OFFSET_COLLISION_BITS: u32 = 31;

/// The directory offset (what `readdir` hands the kernel, `telldir`
/// returns and `seekdir` takes) of a position in cookie order: the hash in
/// bits 62..31, the collision number below, so offsets keep cookie order
/// and fit a positive 63-bit `loff_t`. Positions below [`COOKIE_FIRST`]
/// (the start, `.` and `..`) are their own offsets.
pub fn offset_of_cookie(cookie: u64) -> u64 {
    let collision_max = (1u64 << OFFSET_COLLISION_BITS) - 1;
    debug_assert!(cookie & 0xffff_ffff <= collision_max, "cookie {cookie:#x}");
    ((cookie >> 32) << OFFSET_COLLISION_BITS) | (cookie & 0xffff_ffff).min(collision_max)
}

/// The position in cookie order of directory offset `offset`
/// ([`offset_of_cookie`]'s inverse); any offset a caller makes up is a
/// position too (`seekdir` to it lists from there).
pub fn cookie_of_offset(offset: u64) -> u64 {
    let collision_mask = (1u64 << OFFSET_COLLISION_BITS) - 1;
    ((offset >> OFFSET_COLLISION_BITS) << 32) | (offset & collision_mask)
}

const LEAF_MAGIC: &[u8; 4] = b"IPDL";
const LEAF_HEADER_BYTES: usize = 16;
const ENTRY_FIXED_BYTES: usize = 18;

/// Directory entry types (as `DT_*` in `dirent.h`).
pub const DT_FIFO: u8 = 1;
pub const DT_CHR: u8 = 2;
pub const DT_DIR: u8 = 4;
pub const DT_BLK: u8 = 6;
pub const DT_REG: u8 = 8;
pub const DT_LNK: u8 = 10;
pub const DT_SOCK: u8 = 12;

/// The entry type of a file with `mode`.
pub fn dirent_type(mode: u32) -> u8 {
    ((mode >> 12) & 0xf) as u8
}

/// One name in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub cookie: u64,
    pub object: u64,
    pub kind: u8,
    pub name: Vec<u8>,
}

impl DirEntry {
    fn encoded_bytes(&self) -> usize {
        ENTRY_FIXED_BYTES + self.name.len()
    }

    /// The hash part of the cookie.
    pub fn hash(&self) -> u32 {
        (self.cookie >> 32) as u32
    }
}

/// A name a directory may hold: 1 to 255 bytes, no `/` or NUL, not `.` or `..`.
pub fn valid_entry_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|byte| *byte == b'/' || *byte == 0)
}

/// The hash of `name` in a directory salted with `salt` (never 0).
pub fn name_hash(salt: u64, name: &[u8]) -> u32 {
    ((twox_hash::XxHash3_64::oneshot_with_seed(salt, name) >> 32) as u32).max(1)
}

/// The top `level` bits of `hash`.
pub fn prefix_of(hash: u32, level: u8) -> u32 {
    if level == 0 {
        0
    } else {
        hash >> (32 - level as u32)
    }
}

/// The data block of leaf (`level`, `prefix`) below the root (level 1 and
/// deeper); the root is [`ROOT_LEAF_BLKID`] (or [`ROOT_LEAF_BLKID_V1`]).
pub fn leaf_blkid(level: u8, prefix: u32) -> u64 {
    debug_assert!(level > 0, "the root leaf's block is the directory's own");
    (1u64 << level) + prefix as u64
}

/// Whether `bytes` is a size a leaf at `level` may have: [`LEAF_BYTES`],
/// or for the root a power of two from [`ROOT_LEAF_BYTES_MIN`] up to it.
pub fn valid_leaf_bytes(bytes: usize, level: u8) -> bool {
    bytes == LEAF_BYTES
        || (level == 0
            && bytes.is_power_of_two()
            && (ROOT_LEAF_BYTES_MIN..LEAF_BYTES).contains(&bytes))
}

/// The first hash after every hash of leaf (`level`, `prefix`), if any.
pub fn next_hash_after(level: u8, prefix: u32) -> Option<u32> {
    if level == 0 {
        return None;
    }
    let next = prefix as u64 + 1;
    if next >= 1u64 << level {
        None
    } else {
        Some((next << (32 - level as u32)) as u32)
    }
}

/// A leaf: the entries whose hashes start with `prefix`, in cookie order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub level: u8,
    pub prefix: u32,
    pub entries: Vec<DirEntry>,
    /// Its size encoded ([`valid_leaf_bytes`]).
    pub bytes: usize,
}

impl Leaf {
    /// An empty leaf of [`LEAF_BYTES`].
    pub fn new(level: u8, prefix: u32) -> Leaf {
        Leaf::of_size(level, prefix, LEAF_BYTES)
    }

    /// An empty leaf of `bytes` ([`valid_leaf_bytes`]).
    pub fn of_size(level: u8, prefix: u32, bytes: usize) -> Leaf {
        debug_assert!(valid_leaf_bytes(bytes, level), "{bytes} at level {level}");
        Leaf {
            level,
            prefix,
            entries: Vec::new(),
            bytes,
        }
    }

    /// Bytes the leaf takes encoded.
    pub fn encoded_bytes(&self) -> usize {
        LEAF_HEADER_BYTES
            + self
                .entries
                .iter()
                .map(DirEntry::encoded_bytes)
                .sum::<usize>()
    }

    pub fn fits(&self) -> bool {
        self.encoded_bytes() <= self.bytes
    }

    /// Where `cookie` is, or would go, in the entries.
    pub fn position(&self, cookie: u64) -> Result<usize, usize> {
        self.entries
            .binary_search_by_key(&cookie, |entry| entry.cookie)
    }

    /// Splits into the two leaves one level down (of [`LEAF_BYTES`]).
    pub fn split(self) -> (Leaf, Leaf) {
        let level = self.level + 1;
        let mut low = Leaf::new(level, self.prefix << 1);
        let mut high = Leaf::new(level, (self.prefix << 1) | 1);
        for entry in self.entries {
            if prefix_of(entry.hash(), level) & 1 == 0 {
                low.entries.push(entry);
            } else {
                high.entries.push(entry);
            }
        }
        (low, high)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.bytes];
        out[0..4].copy_from_slice(LEAF_MAGIC);
        out[4] = self.level;
        out[6..8].copy_from_slice(&(self.entries.len() as u16).to_le_bytes());
        put_u32(&mut out, 8, self.prefix);
        let mut at = LEAF_HEADER_BYTES;
        for entry in &self.entries {
            assert!(at + entry.encoded_bytes() <= self.bytes, "leaf overfull");
            put_entry(&mut out, at, entry);
            at += entry.encoded_bytes();
        }
        put_u32(&mut out, 12, (at - LEAF_HEADER_BYTES) as u32);
        out
    }

    /// Decodes the leaf expected at (`level`, `prefix`).
    pub fn decode(bytes: &[u8], level: u8, prefix: u32) -> Result<Leaf, FormatError> {
        Ok(LeafBlock::parse(bytes.to_vec(), level, prefix)?.to_leaf())
    }
}

/// One entry of an encoded leaf, read where it lies.
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    /// Its first byte in the leaf.
    at: usize,
    pub cookie: u64,
    pub object: u64,
    pub kind: u8,
    pub name: &'a [u8],
}

impl EntryRef<'_> {
    pub fn hash(&self) -> u32 {
        (self.cookie >> 32) as u32
    }

    fn encoded_bytes(&self) -> usize {
        ENTRY_FIXED_BYTES + self.name.len()
    }

    pub fn to_entry(&self) -> DirEntry {
        DirEntry {
            cookie: self.cookie,
            object: self.object,
            kind: self.kind,
            name: self.name.to_vec(),
        }
    }
}

/// A leaf kept encoded, checked once when read and changed in place. A
/// leaf holds hundreds of entries; a lookup, insert or remove touches one,
/// so decoding every name into a [`Leaf`] (an allocation each) cost most
/// of a file create's time in the server. A [`Leaf`] is made only to split.
#[derive(Clone, Debug)]
pub struct LeafBlock {
    bytes: Vec<u8>,
    level: u8,
    prefix: u32,
    count: usize,
    /// End of the entries (the header's bytes used, plus the header).
    end: usize,
}

impl LeafBlock {
    /// Checks the leaf expected at (`level`, `prefix`): magic, place, and
    /// every entry (in bounds, a valid name, cookies ascending and of this
    /// leaf's prefix, no name twice). Every method after relies on these
    /// checks.
    pub fn parse(bytes: Vec<u8>, level: u8, prefix: u32) -> Result<LeafBlock, FormatError> {
        LeafBlock::open(bytes, level, prefix, false).map_err(|(_, error)| error)
    }

    /// [`LeafBlock::parse`], handing the bytes back with the error: a leaf
    /// lent in place by the object layer (`ObjectSet::lend_block`) must go
    /// back whole even when it is found corrupt. With `checked`, the bytes
    /// are ones `parse` accepted before and that changed since only through
    /// this type's own methods (which keep every check true): only the
    /// header is read again. The object layer says which bytes those are.
    pub fn open(
        bytes: Vec<u8>,
        level: u8,
        prefix: u32,
        checked: bool,
    ) -> Result<LeafBlock, (Vec<u8>, FormatError)> {
        let (count, end) = match LeafBlock::check_header(&bytes, level, prefix) {
            Ok(shape) => shape,
            Err(error) => return Err((bytes, error)),
        };
        let leaf = LeafBlock {
            bytes,
            level,
            prefix,
            count,
            end,
        };
        if !checked {
            if let Err(error) = leaf.check_entries() {
                return Err((leaf.bytes, error));
            }
        }
        Ok(leaf)
    }

    /// The magic, place and size fields, checked; the entries not yet.
    /// Returns the entry count and where the entries end.
    fn check_header(bytes: &[u8], level: u8, prefix: u32) -> Result<(usize, usize), FormatError> {
        const WHAT: &str = "directory leaf";
        if !valid_leaf_bytes(bytes.len(), level) || &bytes[0..4] != LEAF_MAGIC {
            return Err(invalid(WHAT, "bad magic or size"));
        }
        if bytes[4] != level || get_u32(bytes, 8) != prefix {
            return Err(invalid(
                WHAT,
                format!(
                    "leaf {}/{:#x} found where {level}/{prefix:#x} belongs",
                    bytes[4],
                    get_u32(bytes, 8)
                ),
            ));
        }
        let count = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
        let used = get_u32(bytes, 12) as usize;
        if used > bytes.len() - LEAF_HEADER_BYTES {
            return Err(invalid(WHAT, format!("{used} bytes of entries")));
        }
        Ok((count, LEAF_HEADER_BYTES + used))
    }

    /// The encoded leaf back, to be stored (as long as it came).
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Every entry in bounds, a valid name, cookies ascending and of this
    /// leaf's prefix, no name twice.
    fn check_entries(&self) -> Result<(), FormatError> {
        const WHAT: &str = "directory leaf";
        let (bytes, level, prefix, count, end) =
            (&self.bytes, self.level, self.prefix, self.count, self.end);
        let mut at = LEAF_HEADER_BYTES;
        let mut last_cookie = None;
        // Where the entries of the current hash begin: a name twice would
        // have its hash twice, and entries of one hash are neighbours.
        let mut same_hash_from = at;
        for _ in 0..count {
            if at + ENTRY_FIXED_BYTES > end {
                return Err(invalid(WHAT, "entries overrun the leaf"));
            }
            let length = bytes[at + 17] as usize;
            if at + ENTRY_FIXED_BYTES + length > end {
                return Err(invalid(WHAT, "entries overrun the leaf"));
            }
            let entry = entry_at(bytes, at);
            if !valid_entry_name(entry.name)
                || entry.object == 0
                || entry.cookie < COOKIE_FIRST
                || prefix_of(entry.hash(), level) != prefix
                || last_cookie.is_some_and(|last| last >= entry.cookie)
            {
                return Err(invalid(WHAT, format!("bad entry at byte {at}")));
            }
            if last_cookie.is_some_and(|last| last >> 32 != entry.cookie >> 32) {
                same_hash_from = at;
            }
            let mut earlier = same_hash_from;
            while earlier < at {
                let other = entry_at(bytes, earlier);
                if other.name == entry.name {
                    return Err(invalid(WHAT, format!("name twice at byte {at}")));
                }
                earlier += other.encoded_bytes();
            }
            last_cookie = Some(entry.cookie);
            at += entry.encoded_bytes();
        }
        if at != end {
            return Err(invalid(WHAT, "entry bytes do not add up"));
        }
        Ok(())
    }

    pub fn level(&self) -> u8 {
        self.level
    }

    pub fn prefix(&self) -> u32 {
        self.prefix
    }

    /// The encoded leaf.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The entries in cookie order.
    pub fn entries(&self) -> impl Iterator<Item = EntryRef<'_>> {
        self.entries_at(LEAF_HEADER_BYTES)
    }

    /// The entries from the first whose cookie is at or after `cookie`.
    pub fn entries_from(&self, cookie: u64) -> impl Iterator<Item = EntryRef<'_>> {
        self.entries_at(self.seek(cookie))
    }

    /// The entries from byte `at` (where one begins) to the end.
    fn entries_at(&self, mut at: usize) -> impl Iterator<Item = EntryRef<'_>> {
        std::iter::from_fn(move || {
            (at < self.end).then(|| {
                let entry = entry_at(&self.bytes, at);
                at += entry.encoded_bytes();
                entry
            })
        })
    }

    /// Where the first entry whose cookie is at or after `cookie` begins
    /// (the end if none). Entries vary in length, so this walks them; it
    /// reads only each one's cookie and name length, as every lookup,
    /// insert and remove starts here and a leaf holds hundreds.
    fn seek(&self, cookie: u64) -> usize {
        let mut at = LEAF_HEADER_BYTES;
        while at < self.end && get_u64(&self.bytes, at) < cookie {
            at += ENTRY_FIXED_BYTES + self.bytes[at + 17] as usize;
        }
        at
    }

    /// The entries with hash `hash` (in cookie order).
    fn with_hash(&self, hash: u32) -> impl Iterator<Item = EntryRef<'_>> {
        self.entries_from((hash as u64) << 32)
            .take_while(move |entry| entry.hash() == hash)
    }

    /// The entry named `name` with hash `hash`.
    pub fn find(&self, hash: u32, name: &[u8]) -> Option<EntryRef<'_>> {
        self.with_hash(hash).find(|entry| entry.name == name)
    }

    /// Whether an entry has `cookie`.
    pub fn has_cookie(&self, cookie: u64) -> bool {
        self.entries_from(cookie)
            .next()
            .is_some_and(|entry| entry.cookie == cookie)
    }

    /// The cookie a new entry with `hash` gets: the smallest collision number
    /// free among the entries with that hash.
    pub fn free_cookie(&self, hash: u32) -> u64 {
        let mut cookie = (hash as u64) << 32;
        for entry in self.with_hash(hash) {
            if entry.cookie != cookie {
                break;
            }
            cookie += 1;
        }
        cookie
    }

    /// Adds `entry` in cookie order (its cookie is free and of this leaf's
    /// prefix, its name valid: the caller's checks); false, and nothing
    /// changed, when it does not fit (the leaf must split).
    pub fn insert(&mut self, entry: &DirEntry) -> bool {
        debug_assert!(!self.has_cookie(entry.cookie));
        debug_assert_eq!(prefix_of(entry.hash(), self.level), self.prefix);
        let size = entry.encoded_bytes();
        if self.end + size > self.bytes.len() {
            return false;
        }
        let at = self.seek(entry.cookie);
        self.bytes.copy_within(at..self.end, at + size);
        put_entry(&mut self.bytes, at, entry);
        self.set_shape(self.count + 1, self.end + size);
        true
    }

    /// Removes the entry named `name` with hash `hash`; returns it.
    pub fn remove(&mut self, hash: u32, name: &[u8]) -> Option<DirEntry> {
        let found = self.find(hash, name)?;
        let (at, size, entry) = (found.at, found.encoded_bytes(), found.to_entry());
        self.bytes.copy_within(at + size..self.end, at);
        // The freed tail is zero again, as `Leaf::encode` leaves it.
        self.bytes[self.end - size..self.end].fill(0);
        self.set_shape(self.count - 1, self.end - size);
        Some(entry)
    }

    /// Points the entry named `name` with hash `hash` at `target` (object,
    /// type); returns its cookie.
    pub fn repoint(&mut self, hash: u32, name: &[u8], target: (u64, u8)) -> Option<u64> {
        let found = self.find(hash, name)?;
        let (at, cookie) = (found.at, found.cookie);
        put_u64(&mut self.bytes, at + 8, target.0);
        self.bytes[at + 16] = target.1;
        Some(cookie)
    }

    fn set_shape(&mut self, count: usize, end: usize) {
        self.count = count;
        self.end = end;
        self.bytes[6..8].copy_from_slice(&(count as u16).to_le_bytes());
        put_u32(&mut self.bytes, 12, (end - LEAF_HEADER_BYTES) as u32);
    }

    /// The leaf decoded (to split it).
    pub fn to_leaf(&self) -> Leaf {
        Leaf {
            level: self.level,
            prefix: self.prefix,
            entries: self.entries().map(|entry| entry.to_entry()).collect(),
            bytes: self.bytes.len(),
        }
    }
}

/// The entry at byte `at` of a leaf (in bounds: `LeafBlock::parse` checked).
fn entry_at(bytes: &[u8], at: usize) -> EntryRef<'_> {
    let length = bytes[at + 17] as usize;
    EntryRef {
        at,
        cookie: get_u64(bytes, at),
        object: get_u64(bytes, at + 8),
        kind: bytes[at + 16],
        name: &bytes[at + ENTRY_FIXED_BYTES..at + ENTRY_FIXED_BYTES + length],
    }
}

fn put_entry(bytes: &mut [u8], at: usize, entry: &DirEntry) {
    put_u64(bytes, at, entry.cookie);
    put_u64(bytes, at + 8, entry.object);
    bytes[at + 16] = entry.kind;
    bytes[at + 17] = entry.name.len() as u8;
    bytes[at + ENTRY_FIXED_BYTES..at + ENTRY_FIXED_BYTES + entry.name.len()]
        .copy_from_slice(&entry.name);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The decoded leaf's lookups, written plainly: the model `LeafBlock`'s
    /// in-place ones are checked against.
    impl Leaf {
        fn find(&self, hash: u32, name: &[u8]) -> Option<&DirEntry> {
            let start = self.position((hash as u64) << 32).unwrap_or_else(|at| at);
            self.entries[start..]
                .iter()
                .take_while(|entry| entry.hash() == hash)
                .find(|entry| entry.name == name)
        }

        /// The cookie a new entry with `hash` gets: the smallest collision number
        /// free among the entries with that hash.
        fn free_cookie(&self, hash: u32) -> u64 {
            let mut cookie = (hash as u64) << 32;
            let start = self.position(cookie).unwrap_or_else(|at| at);
            for entry in self.entries[start..]
                .iter()
                .take_while(|entry| entry.hash() == hash)
            {
                if entry.cookie != cookie {
                    break;
                }
                cookie += 1;
            }
            cookie
        }
    }

    fn entry(salt: u64, leaf: &Leaf, name: &str, object: u64) -> DirEntry {
        let hash = name_hash(salt, name.as_bytes());
        DirEntry {
            cookie: leaf.free_cookie(hash),
            object,
            kind: DT_REG,
            name: name.as_bytes().to_vec(),
        }
    }

    #[test]
    fn round_trips_finds_and_splits() {
        let salt = 42;
        let mut leaf = Leaf::new(0, 0);
        for index in 0..200u64 {
            let new = entry(salt, &leaf, &format!("file-{index}"), index + 10);
            let at = leaf.position(new.cookie).unwrap_err();
            leaf.entries.insert(at, new);
        }
        assert!(leaf.fits());
        let decoded = Leaf::decode(&leaf.encode(), 0, 0).unwrap();
        assert_eq!(decoded, leaf);
        let hash = name_hash(salt, b"file-7");
        assert_eq!(leaf.find(hash, b"file-7").unwrap().object, 17);
        assert!(leaf.find(hash, b"file-8").is_none());
        let (low, high) = leaf.clone().split();
        assert_eq!(low.entries.len() + high.entries.len(), 200);
        assert!(low.entries.iter().all(|e| e.hash() >> 31 == 0));
        assert!(high.entries.iter().all(|e| e.hash() >> 31 == 1));
        assert_eq!(Leaf::decode(&high.encode(), 1, 1).unwrap(), high);
        assert!(Leaf::decode(&high.encode(), 1, 0).is_err());
        assert_eq!(leaf_blkid(1, 0), 2);
        assert_eq!(leaf_blkid(1, 1), 3);
        assert_eq!(leaf_blkid(2, 3), 7);
        // Only the root may be small, and it fits fewer entries.
        assert!(valid_leaf_bytes(ROOT_LEAF_BYTES_MIN, 0));
        assert!(!valid_leaf_bytes(ROOT_LEAF_BYTES_MIN, 1));
        assert!(!valid_leaf_bytes(ROOT_LEAF_BYTES_MIN / 2, 0));
        let mut small = Leaf::of_size(0, 0, ROOT_LEAF_BYTES_MIN);
        small.entries = leaf.entries.clone();
        assert!(!small.fits());
        small.entries.truncate(10);
        assert!(small.fits());
        let encoded = small.encode();
        assert_eq!(encoded.len(), ROOT_LEAF_BYTES_MIN);
        assert_eq!(Leaf::decode(&encoded, 0, 0).unwrap(), small);
        let mut block = LeafBlock::parse(encoded, 0, 0).unwrap();
        let big = DirEntry {
            cookie: (name_hash(salt, &[b'x'; 200]) as u64) << 32,
            object: 99,
            kind: DT_REG,
            name: vec![b'x'; 200],
        };
        let mut inserted = 0;
        while block.insert(&DirEntry {
            cookie: big.cookie + inserted,
            ..big.clone()
        }) {
            inserted += 1;
        }
        assert!(inserted < 20, "a 4 KiB leaf fills: {inserted} more");
        assert_eq!(next_hash_after(1, 0), Some(1 << 31));
        assert_eq!(next_hash_after(1, 1), None);
        assert_eq!(next_hash_after(0, 0), None);
    }

    /// Directory offsets are positive 63-bit values in cookie order, and
    /// give back the cookie they were made of: `telldir` returned negative
    /// offsets for every hash with its top bit set, which `seekdir` (an
    /// `lseek` of the directory) refused.
    #[test]
    fn directory_offsets_fit_a_positive_loff_t_and_keep_cookie_order() {
        let cookies = [
            0,
            1,
            2,
            COOKIE_FIRST,
            COOKIE_FIRST + 7,
            0x7fff_ffff_0000_0003,
            0x8120_39b7_0000_0000,
            0x8120_39b7_0000_0001,
            0xffff_ffff_0000_0000,
            0xffff_ffff_0000_0400,
        ];
        let mut last = None;
        for cookie in cookies {
            let offset = offset_of_cookie(cookie);
            assert!(offset <= i64::MAX as u64, "{cookie:#x} -> {offset:#x}");
            assert_eq!(cookie_of_offset(offset), cookie);
            assert!(last.is_none_or(|last| last < offset), "order kept");
            last = Some(offset);
        }
        assert_eq!(offset_of_cookie(2), 2);
    }

    #[test]
    fn colliding_hashes_get_distinct_cookies() {
        let mut leaf = Leaf::new(0, 0);
        for (index, name) in ["a", "b", "c"].iter().enumerate() {
            let cookie = leaf.free_cookie(7);
            leaf.entries.push(DirEntry {
                cookie,
                object: index as u64 + 1,
                kind: DT_DIR,
                name: name.as_bytes().to_vec(),
            });
        }
        let cookies: Vec<u64> = leaf.entries.iter().map(|e| e.cookie).collect();
        assert_eq!(cookies, vec![7 << 32, (7 << 32) + 1, (7 << 32) + 2]);
        assert_eq!(leaf.find(7, b"b").unwrap().object, 2);
        assert_eq!(Leaf::decode(&leaf.encode(), 0, 0).unwrap(), leaf);
        // A name twice among the entries of its hash is refused, even
        // with another name between.
        let mut twice = leaf.clone();
        twice.entries[2].name = b"a".to_vec();
        let error = Leaf::decode(&twice.encode(), 0, 0).unwrap_err();
        assert!(error.to_string().contains("name twice"), "{error}");
        leaf.entries.remove(1);
        assert_eq!(leaf.free_cookie(7), (7 << 32) + 1);
    }

    #[test]
    fn names() {
        assert!(valid_entry_name(b"a"));
        assert!(!valid_entry_name(b""));
        assert!(!valid_entry_name(b"."));
        assert!(!valid_entry_name(b".."));
        assert!(!valid_entry_name(b"a/b"));
        assert!(!valid_entry_name(b"a\0"));
        assert!(valid_entry_name(&[b'x'; 255]));
        assert!(!valid_entry_name(&[b'x'; 256]));
        assert_eq!(dirent_type(0o040755), DT_DIR);
        assert_eq!(dirent_type(0o100644), DT_REG);
        assert_eq!(dirent_type(0o120777), DT_LNK);
    }

    /// Inserts, removes and repoints on a `LeafBlock` leave the bytes a
    /// `Leaf` with the same changes encodes to, and find what it finds.
    #[test]
    fn a_leaf_changed_in_place_matches_the_decoded_one() {
        let salt = 9;
        let mut model = Leaf::new(1, 1);
        let mut block = LeafBlock::parse(model.encode(), 1, 1).unwrap();
        let names: Vec<String> = (0..2000)
            .map(|index| format!("name-{index}"))
            .filter(|name| name_hash(salt, name.as_bytes()) >> 31 == 1)
            .collect();
        let mut inserted = 0;
        for (index, name) in names.iter().enumerate() {
            let hash = name_hash(salt, name.as_bytes());
            assert_eq!(block.free_cookie(hash), model.free_cookie(hash));
            let new = entry(salt, &model, name, index as u64 + 1);
            let cookie = new.cookie;
            if !block.insert(&new) {
                let mut grown = model.clone();
                grown.entries.push(new);
                assert!(!grown.fits(), "{name} fits a leaf but was refused");
                break;
            }
            let at = model.position(new.cookie).unwrap_err();
            model.entries.insert(at, new);
            inserted += 1;
            if index % 3 == 2 {
                let gone = &names[index - 1];
                let hash = name_hash(salt, gone.as_bytes());
                let expected = model.find(hash, gone.as_bytes()).cloned().unwrap();
                model.entries.retain(|entry| entry != &expected);
                assert_eq!(block.remove(hash, gone.as_bytes()), Some(expected));
                assert!(block.remove(hash, gone.as_bytes()).is_none());
            }
            if index % 7 == 0 {
                let at = model.position(cookie).unwrap();
                model.entries[at].object += 1000;
                let repointed = block.repoint(hash, name.as_bytes(), (index as u64 + 1001, DT_REG));
                assert_eq!(repointed, Some(cookie));
            }
            assert_eq!(block.bytes(), &model.encode()[..], "after {name}");
        }
        assert!(inserted > 300, "only {inserted} entries fit");
        let reparsed = LeafBlock::parse(block.bytes().to_vec(), 1, 1).unwrap();
        assert_eq!(reparsed.to_leaf(), model);
        for name in &names[..inserted] {
            let hash = name_hash(salt, name.as_bytes());
            let found = block
                .find(hash, name.as_bytes())
                .map(|entry| entry.to_entry());
            assert_eq!(found.as_ref(), model.find(hash, name.as_bytes()));
        }
        let middle = model.entries[model.entries.len() / 2].cookie;
        let listed: Vec<u64> = block
            .entries_from(middle)
            .map(|entry| entry.cookie)
            .collect();
        let expected: Vec<u64> = model
            .entries
            .iter()
            .map(|entry| entry.cookie)
            .filter(|c| *c >= middle)
            .collect();
        assert_eq!(listed, expected);
        assert!(block.has_cookie(middle));
        assert_eq!(
            block.has_cookie(middle + 1),
            model.position(middle + 1).is_ok()
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), LEAF_BYTES), level in 0u8..4, prefix in 0u32..4) {
            let mut bytes = bytes;
            bytes[0..4].copy_from_slice(LEAF_MAGIC);
            let _ = Leaf::decode(&bytes, level, prefix);
        }
    }
}
