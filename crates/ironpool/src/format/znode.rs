//! Filesystem attributes, kept in the bonus area of a dnode (`format::dnode`).
//!
//! A filesystem object's dnode (a file, a directory, a symbolic link) carries
//! its POSIX attributes in the bonus, so that `stat` costs one dnode read, as
//! a znode's system attributes do in OpenZFS. The file's size is the dnode's
//! length. Layout of the bonus (little-endian; offsets from the bonus start):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version (1) |
//! | 4 | 4 | mode: file type and permission bits, as `st_mode` |
//! | 8 | 4 | uid |
//! | 12 | 4 | gid |
//! | 16 | 8 | link count |
//! | 24 | 8 | parent directory's object (a directory's `..`; for a file, the directory it was created or last renamed into) |
//! | 32 | 8 | generation: the filesystem's object counter when created, so an object number reused later has a new handle |
//! | 40 | 12 | atime: seconds (i64), nanoseconds (u32) |
//! | 52 | 12 | mtime |
//! | 64 | 12 | ctime |
//! | 76 | 12 | birth time |
//! | 88 | 8 | rdev (device nodes) |
//! | 96 | 8 | directories: entries (without `.` and `..`) |
//! | 104 | 8 | directories: the salt of the entry-name hash |
//! | 112 | 8 | the object holding extended attributes (0: none) |
//! | 120 | 4 | project id (`chattr -p`; project quotas count by it; 0: the default project) |
//! | 124 | 4 | flags: [`ZNODE_IMMUTABLE`], [`ZNODE_APPEND`], [`ZNODE_NODUMP`], [`ZNODE_PROJINHERIT`] |
//!
//! Bytes 120 to 127 were zero before projects and flags were kept, which
//! reads as the default project and no flags: older znodes need no change.
//!
//! The dnode of a filesystem's dnode table (the pool-level `FsObjects`
//! object) carries the filesystem's header in its bonus instead
//! ([`FsHeader`]).

use super::dnode::{Bonus, BONUS_BYTES};
use super::{get_u32, get_u64, invalid, put_u64, FormatError};

const ZNODE_VERSION: u8 = 1;
/// Bytes of the bonus a znode used before projects and flags: what an
/// intent log object record of a znode with neither copies of it.
pub const ZNODE_BYTES: usize = 120;
/// Bytes of the bonus a znode uses (the rest is zero): what an intent log
/// extended object record copies of it.
pub const ZNODE_EXT_BYTES: usize = 128;

/// Flag: nothing changes the object (`chattr +i`): no write, truncate,
/// attribute change, link, rename or removal; a directory takes no new
/// entries and loses none. As OpenZFS's `ZFS_IMMUTABLE`.
pub const ZNODE_IMMUTABLE: u32 = 1 << 0;
/// Flag: a file is only appended to (`chattr +a`): no overwrite or
/// truncate, no rename or removal; a directory's entries are only added.
/// As OpenZFS's `ZFS_APPENDONLY`.
pub const ZNODE_APPEND: u32 = 1 << 1;
/// Flag: backup tools skip it (`chattr +d`); the filesystem only keeps it.
pub const ZNODE_NODUMP: u32 = 1 << 2;
/// Flag (directories): objects made in it take its project id, and
/// directories made in it this flag (`chattr +P`); a link or rename into
/// it from another project is refused (`EXDEV`), as XFS and OpenZFS do.
pub const ZNODE_PROJINHERIT: u32 = 1 << 3;
/// Every flag this version knows; others are kept as they are.
pub const ZNODE_FLAGS_KNOWN: u32 =
    ZNODE_IMMUTABLE | ZNODE_APPEND | ZNODE_NODUMP | ZNODE_PROJINHERIT;
/// Version 1 headers have no space sums; version 2 adds them.
const FS_HEADER_VERSION_NO_SPACE: u8 = 1;
const FS_HEADER_VERSION: u8 = 2;

/// `st_mode` file type bits (as Linux defines them; they are on-disk values).
pub const S_IFMT: u32 = 0o170000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFIFO: u32 = 0o010000;
pub const S_IFCHR: u32 = 0o020000;
pub const S_IFBLK: u32 = 0o060000;
pub const S_IFSOCK: u32 = 0o140000;
/// `st_mode` permission bits that a write, truncate or chown may drop.
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_IXGRP: u32 = 0o010;

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// Nanoseconds since the epoch (the clock the engine keeps).
    pub fn from_ns(ns: u64) -> Timestamp {
        Timestamp {
            seconds: (ns / 1_000_000_000) as i64,
            nanos: (ns % 1_000_000_000) as u32,
        }
    }

    fn encode(&self, out: &mut [u8], at: usize) {
        put_u64(out, at, self.seconds as u64);
        out[at + 8..at + 12].copy_from_slice(&self.nanos.to_le_bytes());
    }

    fn decode(bytes: &[u8], at: usize) -> Timestamp {
        Timestamp {
            seconds: get_u64(bytes, at) as i64,
            nanos: u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes")),
        }
    }
}

/// The attributes of a filesystem object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Znode {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub parent: u64,
    pub generation: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub birth: Timestamp,
    pub rdev: u64,
    pub entries: u64,
    pub hash_salt: u64,
    pub xattr_object: u64,
    /// Project id (project quotas).
    pub project: u32,
    /// `ZNODE_*` flags.
    pub flags: u32,
}

impl Znode {
    /// Whether a write, truncate, attribute change, link, rename or
    /// removal of it is refused by its flags (immutable).
    pub fn is_immutable(&self) -> bool {
        self.flags & ZNODE_IMMUTABLE != 0
    }

    /// Whether it may only grow (append-only) or not change at all.
    pub fn is_append_only(&self) -> bool {
        self.flags & ZNODE_APPEND != 0
    }

    /// Whether its project id and flags need the extended intent log
    /// record (both zero: the short one carries it whole).
    pub fn needs_ext_record(&self) -> bool {
        self.project != 0 || self.flags != 0
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    pub fn is_regular(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    pub fn encode(&self) -> Bonus {
        let mut bonus = Bonus::default();
        let out = &mut bonus.0;
        out[0] = ZNODE_VERSION;
        out[4..8].copy_from_slice(&self.mode.to_le_bytes());
        out[8..12].copy_from_slice(&self.uid.to_le_bytes());
        out[12..16].copy_from_slice(&self.gid.to_le_bytes());
        put_u64(out, 16, self.nlink);
        put_u64(out, 24, self.parent);
        put_u64(out, 32, self.generation);
        self.atime.encode(out, 40);
        self.mtime.encode(out, 52);
        self.ctime.encode(out, 64);
        self.birth.encode(out, 76);
        put_u64(out, 88, self.rdev);
        put_u64(out, 96, self.entries);
        put_u64(out, 104, self.hash_salt);
        put_u64(out, 112, self.xattr_object);
        out[120..124].copy_from_slice(&self.project.to_le_bytes());
        out[124..128].copy_from_slice(&self.flags.to_le_bytes());
        bonus
    }

    pub fn decode(bonus: &Bonus) -> Result<Znode, FormatError> {
        let bytes = &bonus.0;
        if bytes[0] != ZNODE_VERSION {
            return Err(invalid("znode", format!("version {}", bytes[0])));
        }
        let znode = Znode {
            mode: get_u32(bytes, 4),
            uid: get_u32(bytes, 8),
            gid: get_u32(bytes, 12),
            nlink: get_u64(bytes, 16),
            parent: get_u64(bytes, 24),
            generation: get_u64(bytes, 32),
            atime: Timestamp::decode(bytes, 40),
            mtime: Timestamp::decode(bytes, 52),
            ctime: Timestamp::decode(bytes, 64),
            birth: Timestamp::decode(bytes, 76),
            rdev: get_u64(bytes, 88),
            entries: get_u64(bytes, 96),
            hash_salt: get_u64(bytes, 104),
            xattr_object: get_u64(bytes, 112),
            project: get_u32(bytes, 120),
            flags: get_u32(bytes, 124),
        };
        let kind = znode.mode & S_IFMT;
        if ![
            S_IFREG, S_IFDIR, S_IFLNK, S_IFIFO, S_IFCHR, S_IFBLK, S_IFSOCK,
        ]
        .contains(&kind)
        {
            return Err(invalid("znode", format!("file type {kind:o}")));
        }
        Ok(znode)
    }
}

/// What a filesystem keeps about itself, in the bonus of its dnode table's
/// dnode (so it changes with the table, in the same txg):
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 1 | version (2; 1: no space sums) |
/// | 8 | 8 | the root directory's object |
/// | 16 | 8 | the next object number to hand out |
/// | 24 | 8 | the unlinked set: objects unlinked while open, freed at last close or at import (0: none) |
/// | 32 | 8 | objects in use (files, directories, links) |
/// | 40 | 8 | version 2: bytes allocated by the objects in the table (the sum of their dnodes' `used_bytes`) |
/// | 48 | 8 | version 2: their logical bytes |
/// | 56 | 8 | version 2: their physical bytes |
/// | 64 | 8 | flags: [`FS_HEADER_SEALED_BONUSES`] |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsHeader {
    pub root: u64,
    pub next_object: u64,
    pub unlinked_object: u64,
    pub objects: u64,
    /// The sums of the space of every object the table holds, as the last
    /// txg wrote them: a filesystem's `referenced` without a walk of its
    /// objects. None in a version 1 header (written before the sums were
    /// kept), whose filesystem is walked instead.
    pub space: Option<FsSpace>,
    /// Every object's attributes are sealed ([`FS_HEADER_SEALED_BONUSES`]).
    pub sealed_bonuses: bool,
}

/// Header flag: an encrypted filesystem made by a build that seals its
/// objects' attributes (`format::sealed_bonus`), so an object's attributes
/// found in the clear were not written by it and are refused, as a forged
/// znode would be. An encrypted filesystem made before has attributes in
/// the clear, each sealed when its object next changes; headers written
/// before flags have zeros here.
pub const FS_HEADER_SEALED_BONUSES: u64 = 1;

/// Bytes allocated, logical and physical (as a dnode counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsSpace {
    pub used: u64,
    pub logical: u64,
    pub physical: u64,
}

impl FsSpace {
    /// Replaces an object's `old` figures with its `new` ones. Wrapping:
    /// the sum of what the table holds is never negative, so adding the
    /// new before taking the old away gives it exactly in any order.
    pub fn replace(&mut self, old: FsSpace, new: FsSpace) {
        self.used = self.used.wrapping_add(new.used).wrapping_sub(old.used);
        self.logical = self
            .logical
            .wrapping_add(new.logical)
            .wrapping_sub(old.logical);
        self.physical = self
            .physical
            .wrapping_add(new.physical)
            .wrapping_sub(old.physical);
    }
}

impl FsHeader {
    pub fn encode(&self) -> Bonus {
        let mut bonus = Bonus::default();
        let out = &mut bonus.0;
        put_u64(out, 8, self.root);
        put_u64(out, 16, self.next_object);
        put_u64(out, 24, self.unlinked_object);
        put_u64(out, 32, self.objects);
        if self.sealed_bonuses {
            put_u64(out, 64, FS_HEADER_SEALED_BONUSES);
        }
        match self.space {
            Some(space) => {
                out[0] = FS_HEADER_VERSION;
                put_u64(out, 40, space.used);
                put_u64(out, 48, space.logical);
                put_u64(out, 56, space.physical);
            }
            None => out[0] = FS_HEADER_VERSION_NO_SPACE,
        }
        bonus
    }

    pub fn decode(bonus: &Bonus) -> Result<FsHeader, FormatError> {
        let bytes = &bonus.0;
        let space = match bytes[0] {
            FS_HEADER_VERSION_NO_SPACE => None,
            FS_HEADER_VERSION => Some(FsSpace {
                used: get_u64(bytes, 40),
                logical: get_u64(bytes, 48),
                physical: get_u64(bytes, 56),
            }),
            version => return Err(invalid("filesystem header", format!("version {version}"))),
        };
        let header = FsHeader {
            root: get_u64(bytes, 8),
            next_object: get_u64(bytes, 16),
            unlinked_object: get_u64(bytes, 24),
            objects: get_u64(bytes, 32),
            space,
            sealed_bonuses: get_u64(bytes, 64) & FS_HEADER_SEALED_BONUSES != 0,
        };
        if get_u64(bytes, 64) & !FS_HEADER_SEALED_BONUSES != 0 {
            return Err(invalid(
                "filesystem header",
                format!("flags {:#x}", get_u64(bytes, 64)),
            ));
        }
        if header.root == 0 || header.next_object <= header.root {
            return Err(invalid(
                "filesystem header",
                format!("root {} next object {}", header.root, header.next_object),
            ));
        }
        Ok(header)
    }
}

const _: () = assert!(BONUS_BYTES >= ZNODE_EXT_BYTES);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let znode = Znode {
            mode: S_IFDIR | 0o755,
            uid: 1000,
            gid: 100,
            nlink: 3,
            parent: 1,
            generation: 77,
            atime: Timestamp {
                seconds: -5,
                nanos: 999_999_999,
            },
            mtime: Timestamp::from_ns(1_700_000_000_123_456_789),
            ctime: Timestamp {
                seconds: 1,
                nanos: 2,
            },
            birth: Timestamp {
                seconds: 3,
                nanos: 4,
            },
            rdev: 0x0801,
            entries: 12,
            hash_salt: 0xfeed,
            xattr_object: 9,
            project: 42,
            flags: ZNODE_APPEND | ZNODE_PROJINHERIT,
        };
        assert_eq!(Znode::decode(&znode.encode()).unwrap(), znode);
        // A znode written before projects and flags: zeroes there.
        let mut old = znode.encode();
        old.0[120..128].fill(0);
        let old = Znode::decode(&old).unwrap();
        assert_eq!((old.project, old.flags), (0, 0));
        assert!(Znode::decode(&Bonus::default()).is_err());
        let old = FsHeader {
            root: 1,
            next_object: 40,
            unlinked_object: 2,
            objects: 30,
            space: None,
            sealed_bonuses: false,
        };
        // A version 1 header (no sums) still reads, and is written back as
        // it was.
        assert_eq!(old.encode().0[0], 1);
        assert_eq!(FsHeader::decode(&old.encode()).unwrap(), old);
        let header = FsHeader {
            space: Some(FsSpace {
                used: 1 << 40,
                logical: 3 << 30,
                physical: 5,
            }),
            ..old
        };
        assert_eq!(header.encode().0[0], 2);
        assert_eq!(FsHeader::decode(&header.encode()).unwrap(), header);
        let sealed = FsHeader {
            sealed_bonuses: true,
            ..header
        };
        assert_eq!(FsHeader::decode(&sealed.encode()).unwrap(), sealed);
        let mut bonus = sealed.encode();
        bonus.0[64] = 2;
        assert!(FsHeader::decode(&bonus).is_err(), "an unknown flag");
        assert!(FsHeader::decode(&FsHeader::default().encode()).is_err());
        let mut bonus = header.encode();
        bonus.0[0] = 3;
        assert!(FsHeader::decode(&bonus).is_err(), "an unknown version");
    }

    #[test]
    fn space_sums_replace_in_any_order() {
        let mut sum = FsSpace::default();
        let a = FsSpace {
            used: 100,
            logical: 200,
            physical: 50,
        };
        let b = FsSpace {
            used: 30,
            logical: 10,
            physical: 7,
        };
        // Freed before it was counted (wraps below zero), then counted.
        sum.replace(a, FsSpace::default());
        sum.replace(FsSpace::default(), b);
        sum.replace(FsSpace::default(), a);
        assert_eq!(sum, b);
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), BONUS_BYTES)) {
            let bonus = Bonus(bytes.try_into().unwrap());
            let _ = Znode::decode(&bonus);
            let _ = FsHeader::decode(&bonus);
        }
    }
}
