//! The FUSE wire protocol (kernel ABI 7.x, `include/uapi/linux/fuse.h`):
//! requests decoded from the bytes `/dev/fuse` hands over, replies encoded
//! for it. Pure; no I/O. Every length is checked against the request's
//! own, so a malformed request is refused with `EINVAL`, never a panic.

use crate::rt::buf::BufSlice;

/// The protocol version this server speaks (it accepts any 7.x kernel).
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 31;
/// FUSE's root node id (the filesystem's root directory).
pub const ROOT_ID: u64 = 1;

pub const IN_HEADER_BYTES: usize = 40;
pub const OUT_HEADER_BYTES: usize = 16;
/// Bytes of a WRITE's own header (`fuse_write_in`), before its payload.
pub const WRITE_IN_BYTES: usize = 40;

// Opcodes.
pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const SETXATTR: u32 = 21;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const REMOVEXATTR: u32 = 24;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const CREATE: u32 = 35;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const BATCH_FORGET: u32 = 42;
/// One node of a BATCH_FORGET (`fuse_forget_one`: nodeid, nlookup).
const FORGET_ONE_BYTES: usize = 16;
pub const RENAME2: u32 = 45;
/// A directory listing with each entry's attributes (see `DO_READDIRPLUS`).
pub const READDIRPLUS: u32 = 44;
/// `fallocate(2)`: the modes `Filesystem::fallocate` takes.
pub const FALLOCATE: u32 = 43;
/// `FUSE_IOCTL`: the kernel passes the file-attribute ioctls
/// (`FS_IOC_GETFLAGS`, `FS_IOC_FSGETXATTR` and their setters: `chattr`,
/// `lsattr`) to the server this way.
pub const IOCTL: u32 = 39;
/// `FUSE_TMPFILE`: `open(O_TMPFILE)` in a directory, laid out as CREATE.
pub const TMPFILE: u32 = 51;
/// `FUSE_STATX`: a `statx` asking for more than `stat` has (the birth
/// time): answered with the attributes and the birth time.
pub const STATX: u32 = 52;
/// `statx` mask bits: what `stat` has (`STATX_BASIC_STATS`), and the
/// birth time (`STATX_BTIME`).
const STATX_BASIC_STATS: u32 = 0x7ff;
const STATX_BTIME: u32 = 0x800;
/// `fuse_ioctl_in`'s size: the ioctl's data follows.
const IOCTL_IN_BYTES: usize = 32;
/// `fuse_ioctl_in.flags`: an ioctl whose data the server must fetch itself
/// (CUSE only; never answered here).
pub const IOCTL_UNRESTRICTED: u32 = 1 << 1;
/// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel answers the others).
pub const LSEEK: u32 = 46;
/// `copy_file_range(2)` between files of this mount: records are cloned
/// (`Filesystem::copy_range`). The kernel's newer `COPY_FILE_RANGE_64`
/// gets ENOSYS, and the kernel then asks with this one.
pub const COPY_FILE_RANGE: u32 = 47;

// INIT flags.
pub const ASYNC_READ: u32 = 1 << 0;
pub const ATOMIC_O_TRUNC: u32 = 1 << 3;
pub const BIG_WRITES: u32 = 1 << 5;
pub const DONT_MASK: u32 = 1 << 6;
pub const ASYNC_DIO: u32 = 1 << 15;
pub const WRITEBACK_CACHE: u32 = 1 << 16;
pub const PARALLEL_DIROPS: u32 = 1 << 18;
/// READDIRPLUS offered, and left to the kernel to use when it pays
/// (`READDIRPLUS_AUTO`: the first listing, and while the entries listed
/// are looked up, as `ls -l` does).
pub const DO_READDIRPLUS: u32 = 1 << 13;
pub const READDIRPLUS_AUTO: u32 = 1 << 14;
pub const MAX_PAGES: u32 = 1 << 22;
/// The kernel checks POSIX ACLs, read and set as extended attributes;
/// creating, it leaves the umask (with `DONT_MASK`) to the server, which
/// applies a directory's default ACL instead when it has one.
pub const POSIX_ACL: u32 = 1 << 20;
/// The server, not the kernel, drops set-user-id, set-group-id and
/// `security.capability` on write, truncate and chown (so the kernel need
/// not ask for `security.capability` before every buffered write).
pub const HANDLE_KILLPRIV_V2: u32 = 1 << 28;
/// The reply's `flags2` holds flags 32 and up.
pub const INIT_EXT: u32 = 1 << 30;
// INIT flags2 (flags 32 and up).
/// FUSE over io_uring (flag 41).
pub const OVER_IO_URING_FLAGS2: u32 = 1 << 9;

// OPEN reply flags.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

// SETATTR valid bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
/// The kernel's own ctime of a regular file (`WRITEBACK_CACHE`: the kernel
/// keeps its times and hands them over).
pub const FATTR_CTIME: u32 = 1 << 10;
/// Drop set-user-id and set-group-id (`HANDLE_KILLPRIV_V2`): a truncate by
/// a caller without `CAP_FSETID`, or a chown.
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// WRITE flags (`write_flags`).
/// Drop set-user-id and set-group-id (`HANDLE_KILLPRIV_V2`): the writer
/// has no `CAP_FSETID`.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;

// Notifications (written with unique 0, the code in the error field).
pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;

/// The header of every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Attribute changes of a SETATTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub valid: u32,
    pub size: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub ctime: (u64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A decoded request; names and data borrow from the request's bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    /// FORGET or BATCH_FORGET: the kernel lets go of `(node, count)`
    /// references it was given by entry replies (its lookup counts).
    Forget(Vec<(u64, u64)>),
    Getattr,
    /// STATX (`fuse_statx_in`: nothing the answer depends on).
    Statx,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        new_dir: u64,
        name: &'a [u8],
        new_name: &'a [u8],
        flags: u32,
    },
    Link {
        old_node: u64,
        name: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Create {
        name: &'a [u8],
        flags: u32,
        mode: u32,
        umask: u32,
    },
    /// TMPFILE: `fuse_create_in` (the name the kernel gives is not kept).
    Tmpfile {
        flags: u32,
        mode: u32,
        umask: u32,
    },
    /// `flags`: the file's open flags (`O_DIRECT`...).
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        flags: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        /// `WRITE_KILL_SUIDGID`...
        write_flags: u32,
        /// The file's open flags, with `O_DSYNC`/`O_SYNC` set for a write
        /// that must be durable when answered (`RWF_DSYNC` too).
        flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release,
    Flush,
    Fsync {
        datasync: bool,
    },
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
        /// READDIRPLUS: each entry with its node's attributes.
        plus: bool,
    },
    Releasedir,
    Fsyncdir,
    /// `fuse_fallocate_in`.
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    /// `fuse_ioctl_in` and the `in_size` bytes of the ioctl's argument;
    /// the reply carries at most `out_size` bytes back.
    Ioctl {
        flags: u32,
        cmd: u32,
        out_size: u32,
        data: &'a [u8],
    },
    /// `fuse_lseek_in`: `whence` is `SEEK_DATA` or `SEEK_HOLE`.
    Lseek {
        offset: u64,
        whence: u32,
    },
    /// `fuse_copy_file_range_in`: from the request's node at `offset_in`
    /// to node `node_out` at `offset_out`.
    CopyFileRange {
        offset_in: u64,
        node_out: u64,
        offset_out: u64,
        length: u64,
        flags: u64,
    },
    Access {
        mask: u32,
    },
    /// `fuse_setxattr_in` as before 7.33 (no `FUSE_SETXATTR_EXT`).
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
    },
    /// `size`: the caller's buffer (0: asks for the value's length).
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Interrupt,
    /// Anything else: answered `ENOSYS` (the kernel then stops asking).
    Unsupported(u32),
}

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, Malformed> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(Malformed("request too short"))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, Malformed> {
    bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or(Malformed("request too short"))
}

/// The NUL-terminated string at the start of `bytes`, and what follows it.
fn c_string(bytes: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    let end = bytes
        .iter()
        .position(|byte| *byte == 0)
        .ok_or(Malformed("name without its NUL"))?;
    Ok((&bytes[..end], &bytes[end + 1..]))
}

/// Decodes the header of a request of `bytes` (what one read returned).
pub fn header(bytes: &[u8]) -> Result<InHeader, Malformed> {
    header_apart(bytes, 0)
}

/// Bytes of a WRITE's two headers: what precedes its payload.
pub const WRITE_HEADERS_BYTES: usize = IN_HEADER_BYTES + WRITE_IN_BYTES;

/// The payload size of the WRITE whose headers are `head`, when `head` is
/// exactly a WRITE's two headers and the request is those and `size`
/// bytes more: how a reader that read a payload into a buffer of its own
/// tells it got one.
pub fn write_payload_size(head: &[u8]) -> Option<usize> {
    if head.len() != WRITE_HEADERS_BYTES || u32_at(head, 4).ok()? != WRITE {
        return None;
    }
    let size = u32_at(head, IN_HEADER_BYTES + 16).ok()? as usize;
    (u32_at(head, 0).ok()? as usize == WRITE_HEADERS_BYTES + size).then_some(size)
}

/// [`header`] of a request read in two pieces: `head`, and `apart` more
/// bytes in a buffer of their own (a WRITE's payload).
pub fn header_apart(head: &[u8], apart: usize) -> Result<InHeader, Malformed> {
    if head.len() < IN_HEADER_BYTES {
        return Err(Malformed("shorter than a header"));
    }
    let header = InHeader {
        len: u32_at(head, 0)?,
        opcode: u32_at(head, 4)?,
        unique: u64_at(head, 8)?,
        nodeid: u64_at(head, 16)?,
        uid: u32_at(head, 24)?,
        gid: u32_at(head, 28)?,
        pid: u32_at(head, 32)?,
    };
    if Some(header.len as usize) != head.len().checked_add(apart) {
        return Err(Malformed("length differs from what was read"));
    }
    Ok(header)
}

/// [`request`] of a WRITE read in two pieces: its headers in `head`, its
/// payload in `payload`.
pub fn write_apart<'a>(
    header: &InHeader,
    head: &[u8],
    payload: &'a [u8],
) -> Result<Request<'a>, Malformed> {
    if header.opcode != WRITE || head.len() != WRITE_HEADERS_BYTES {
        return Err(Malformed("a request apart from its headers is a write"));
    }
    let body = &head[IN_HEADER_BYTES..];
    if u32_at(body, 16)? as usize != payload.len() {
        return Err(Malformed("write shorter than its size"));
    }
    write(body, payload)
}

/// A WRITE of `data` with the fields of its `fuse_write_in` (`body`):
/// how [`request`] and [`write_apart`] both build one.
fn write<'a>(body: &[u8], data: &'a [u8]) -> Result<Request<'a>, Malformed> {
    Ok(Request::Write {
        fh: u64_at(body, 0)?,
        offset: u64_at(body, 8)?,
        write_flags: u32_at(body, 20)?,
        flags: u32_at(body, 32)?,
        data,
    })
}

/// Decodes the request after `header` in `bytes`.
pub fn request<'a>(header: &InHeader, bytes: &'a [u8]) -> Result<Request<'a>, Malformed> {
    let body = &bytes[IN_HEADER_BYTES..];
    let name_at = |offset: usize| -> Result<&'a [u8], Malformed> {
        Ok(c_string(body.get(offset..).ok_or(Malformed("request too short"))?)?.0)
    };
    Ok(match header.opcode {
        INIT => Request::Init {
            major: u32_at(body, 0)?,
            minor: u32_at(body, 4)?,
            max_readahead: u32_at(body, 8)?,
            flags: u32_at(body, 12)?,
        },
        DESTROY => Request::Destroy,
        LOOKUP => Request::Lookup { name: name_at(0)? },
        // fuse_forget_in: nlookup.
        FORGET => Request::Forget(vec![(header.nodeid, u64_at(body, 0)?)]),
        // fuse_batch_forget_in: count, dummy; then `count` fuse_forget_one:
        // nodeid, nlookup.
        BATCH_FORGET => {
            let count = u32_at(body, 0)? as usize;
            let ones = body.get(8..).unwrap_or_default();
            if ones.len() / FORGET_ONE_BYTES < count {
                return Err(Malformed("batch forget shorter than its count"));
            }
            let nodes = (0..count)
                .map(|i| {
                    let at = i * FORGET_ONE_BYTES;
                    Ok((u64_at(ones, at)?, u64_at(ones, at + 8)?))
                })
                .collect::<Result<_, _>>()?;
            Request::Forget(nodes)
        }
        GETATTR => Request::Getattr,
        STATX => Request::Statx,
        // fuse_setattr_in: valid, padding, fh, size, lock_owner, atime,
        // mtime, ctime, atimensec, mtimensec, ctimensec, mode, unused, uid,
        // gid, unused.
        SETATTR => Request::Setattr(SetattrIn {
            valid: u32_at(body, 0)?,
            size: u64_at(body, 16)?,
            atime: (u64_at(body, 32)?, u32_at(body, 56)?),
            mtime: (u64_at(body, 40)?, u32_at(body, 60)?),
            ctime: (u64_at(body, 48)?, u32_at(body, 64)?),
            mode: u32_at(body, 68)?,
            uid: u32_at(body, 76)?,
            gid: u32_at(body, 80)?,
        }),
        READLINK => Request::Readlink,
        SYMLINK => {
            let (name, rest) = c_string(body)?;
            let (target, _) = c_string(rest)?;
            Request::Symlink { name, target }
        }
        MKNOD => Request::Mknod {
            mode: u32_at(body, 0)?,
            rdev: u32_at(body, 4)?,
            umask: u32_at(body, 8)?,
            name: name_at(16)?,
        },
        MKDIR => Request::Mkdir {
            mode: u32_at(body, 0)?,
            umask: u32_at(body, 4)?,
            name: name_at(8)?,
        },
        UNLINK => Request::Unlink { name: name_at(0)? },
        RMDIR => Request::Rmdir { name: name_at(0)? },
        RENAME | RENAME2 => {
            let (flags, names) = if header.opcode == RENAME2 {
                (u32_at(body, 8)?, 16)
            } else {
                (0, 8)
            };
            let (name, rest) = c_string(body.get(names..).ok_or(Malformed("request too short"))?)?;
            let (new_name, _) = c_string(rest)?;
            Request::Rename {
                new_dir: u64_at(body, 0)?,
                name,
                new_name,
                flags,
            }
        }
        LINK => Request::Link {
            old_node: u64_at(body, 0)?,
            name: name_at(8)?,
        },
        OPEN => Request::Open {
            flags: u32_at(body, 0)?,
        },
        CREATE => Request::Create {
            flags: u32_at(body, 0)?,
            mode: u32_at(body, 4)?,
            umask: u32_at(body, 8)?,
            name: name_at(16)?,
        },
        TMPFILE => Request::Tmpfile {
            flags: u32_at(body, 0)?,
            mode: u32_at(body, 4)?,
            umask: u32_at(body, 8)?,
        },
        READ => Request::Read {
            fh: u64_at(body, 0)?,
            offset: u64_at(body, 8)?,
            size: u32_at(body, 16)?,
            flags: u32_at(body, 32)?,
        },
        WRITE => {
            let size = u32_at(body, 16)? as usize;
            let data = body
                .get(WRITE_IN_BYTES..WRITE_IN_BYTES + size)
                .ok_or(Malformed("write shorter than its size"))?;
            write(body, data)?
        }
        STATFS => Request::Statfs,
        RELEASE => Request::Release,
        FLUSH => Request::Flush,
        FSYNC => Request::Fsync {
            datasync: u32_at(body, 8)? & 1 != 0,
        },
        OPENDIR => Request::Opendir,
        READDIR | READDIRPLUS => Request::Readdir {
            offset: u64_at(body, 8)?,
            size: u32_at(body, 16)?,
            plus: header.opcode == READDIRPLUS,
        },
        RELEASEDIR => Request::Releasedir,
        FSYNCDIR => Request::Fsyncdir,
        FALLOCATE => Request::Fallocate {
            offset: u64_at(body, 8)?,
            length: u64_at(body, 16)?,
            mode: u32_at(body, 24)?,
        },
        LSEEK => Request::Lseek {
            offset: u64_at(body, 8)?,
            whence: u32_at(body, 16)?,
        },
        COPY_FILE_RANGE => Request::CopyFileRange {
            offset_in: u64_at(body, 8)?,
            node_out: u64_at(body, 16)?,
            offset_out: u64_at(body, 32)?,
            length: u64_at(body, 40)?,
            flags: u64_at(body, 48)?,
        },
        IOCTL => {
            let in_size = u32_at(body, 24)? as usize;
            let data = body
                .get(IOCTL_IN_BYTES..IOCTL_IN_BYTES + in_size)
                .ok_or(Malformed("ioctl shorter than its in_size"))?;
            Request::Ioctl {
                flags: u32_at(body, 8)?,
                cmd: u32_at(body, 12)?,
                out_size: u32_at(body, 28)?,
                data,
            }
        }
        ACCESS => Request::Access {
            mask: u32_at(body, 0)?,
        },
        SETXATTR => {
            let size = u32_at(body, 0)? as usize;
            let flags = u32_at(body, 4)?;
            let (name, rest) = c_string(body.get(8..).ok_or(Malformed("request too short"))?)?;
            let value = rest
                .get(..size)
                .ok_or(Malformed("xattr value shorter than its size"))?;
            Request::Setxattr { name, value, flags }
        }
        GETXATTR => Request::Getxattr {
            size: u32_at(body, 0)?,
            name: name_at(8)?,
        },
        LISTXATTR => Request::Listxattr {
            size: u32_at(body, 0)?,
        },
        REMOVEXATTR => Request::Removexattr { name: name_at(0)? },
        INTERRUPT => Request::Interrupt,
        other => Request::Unsupported(other),
    })
}

/// The node a successful reply `reply` to an `opcode` request handed the
/// kernel (an entry reply: its `fuse_entry_out` starts with the node id;
/// 0, a negative LOOKUP, hands nothing).
pub fn entry_node(opcode: u32, reply: &Reply) -> Option<u64> {
    if !matches!(
        opcode,
        LOOKUP | CREATE | TMPFILE | MKNOD | MKDIR | SYMLINK | LINK
    ) {
        return None;
    }
    if reply.header[4..8] != [0; 4] {
        return None;
    }
    u64_at(&reply.body, 0).ok().filter(|node| *node != 0)
}

/// The kernel's name of `opcode` (`FUSE_LOOKUP` is `LOOKUP`), for the
/// per-request counts `iostat` shows; `OTHER` for one this server does not
/// serve (the kernel gets `ENOSYS` and stops asking for most of them).
pub fn opcode_name(opcode: u32) -> &'static str {
    match opcode {
        LOOKUP => "LOOKUP",
        FORGET => "FORGET",
        GETATTR => "GETATTR",
        SETATTR => "SETATTR",
        READLINK => "READLINK",
        SYMLINK => "SYMLINK",
        MKNOD => "MKNOD",
        MKDIR => "MKDIR",
        UNLINK => "UNLINK",
        RMDIR => "RMDIR",
        RENAME => "RENAME",
        LINK => "LINK",
        OPEN => "OPEN",
        READ => "READ",
        WRITE => "WRITE",
        STATFS => "STATFS",
        RELEASE => "RELEASE",
        FSYNC => "FSYNC",
        SETXATTR => "SETXATTR",
        GETXATTR => "GETXATTR",
        LISTXATTR => "LISTXATTR",
        REMOVEXATTR => "REMOVEXATTR",
        FLUSH => "FLUSH",
        INIT => "INIT",
        OPENDIR => "OPENDIR",
        READDIR => "READDIR",
        READDIRPLUS => "READDIRPLUS",
        RELEASEDIR => "RELEASEDIR",
        FSYNCDIR => "FSYNCDIR",
        ACCESS => "ACCESS",
        CREATE => "CREATE",
        INTERRUPT => "INTERRUPT",
        DESTROY => "DESTROY",
        BATCH_FORGET => "BATCH_FORGET",
        RENAME2 => "RENAME2",
        LSEEK => "LSEEK",
        COPY_FILE_RANGE => "COPY_FILE_RANGE",
        FALLOCATE => "FALLOCATE",
        IOCTL => "IOCTL",
        TMPFILE => "TMPFILE",
        STATX => "STATX",
        _ => "OTHER",
    }
}

/// Whether the kernel expects no reply to this opcode.
pub fn no_reply(opcode: u32) -> bool {
    matches!(opcode, FORGET | BATCH_FORGET | INTERRUPT)
}

/// The header of a reply (`struct fuse_out_header`) whose body is
/// `body_bytes` long, with `error` (a negative errno or 0).
fn out_header(unique: u64, error: i32, body_bytes: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut header = [0u8; OUT_HEADER_BYTES];
    header[0..4].copy_from_slice(&((OUT_HEADER_BYTES + body_bytes) as u32).to_le_bytes());
    header[4..8].copy_from_slice(&error.to_le_bytes());
    header[8..16].copy_from_slice(&unique.to_le_bytes());
    header
}

/// A reply: the header (with `error`, a negative errno or 0) and the body.
pub fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER_BYTES + body.len());
    out.extend_from_slice(&out_header(unique, error, body.len()));
    out.extend_from_slice(body);
    out
}

/// A reply to a request, kept as its header, its body and its data: the
/// transports write them together (`writev`, or each into its place in a
/// ring slot), so a READ's data (up to a megabyte) goes from the blocks
/// read to the kernel without a copy of its own behind the 16-byte header.
#[derive(Debug)]
pub struct Reply {
    pub header: [u8; OUT_HEADER_BYTES],
    pub body: Vec<u8>,
    /// After the body: pieces of the blocks a READ read, in order.
    pub data: Vec<BufSlice>,
}

impl Reply {
    /// `body` as the reply to request `unique`, with `error` (a negative
    /// errno or 0).
    pub fn new(unique: u64, error: i32, body: Vec<u8>) -> Reply {
        Reply {
            header: out_header(unique, error, body.len()),
            body,
            data: Vec::new(),
        }
    }

    /// A successful reply to request `unique` whose body is `data`.
    pub fn data(unique: u64, data: Vec<BufSlice>) -> Reply {
        let bytes = data.iter().map(|piece| piece.len()).sum();
        Reply {
            header: out_header(unique, 0, bytes),
            body: Vec::new(),
            data,
        }
    }

    /// The bytes after the header.
    pub fn body_len(&self) -> usize {
        self.body.len() + self.data.iter().map(|piece| piece.len()).sum::<usize>()
    }
}

/// A notification that the attributes of node `nodeid` changed behind
/// the kernel's back (`FUSE_NOTIFY_INVAL_INODE`, attributes only): it asks
/// for them again.
pub fn notify_inval_attributes(nodeid: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&nodeid.to_le_bytes());
    // Offset -1: no cached data is dropped.
    body.extend_from_slice(&(-1i64).to_le_bytes());
    body.extend_from_slice(&0i64.to_le_bytes());
    reply(0, NOTIFY_INVAL_INODE, &body)
}

/// A notification that node `nodeid` changed behind the kernel's back,
/// attributes and data (`FUSE_NOTIFY_INVAL_INODE` from offset 0 to the
/// end): it asks for its attributes again and drops its cached pages.
pub fn notify_inval_inode(nodeid: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&nodeid.to_le_bytes());
    body.extend_from_slice(&0i64.to_le_bytes());
    // Length 0: to the end.
    body.extend_from_slice(&0i64.to_le_bytes());
    reply(0, NOTIFY_INVAL_INODE, &body)
}

/// A notification that entry `name` of directory `parent` changed behind
/// the kernel's back (`FUSE_NOTIFY_INVAL_ENTRY`): it drops the name, or
/// the absence of it, that it cached, and the directory's attributes.
pub fn notify_inval_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + name.len() + 1);
    body.extend_from_slice(&parent.to_le_bytes());
    body.extend_from_slice(&(name.len() as u32).to_le_bytes());
    // Flags 0: invalidate (not only expire) the entry.
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(name);
    body.push(0);
    reply(0, NOTIFY_INVAL_ENTRY, &body)
}

/// The attributes the kernel caches (`struct fuse_attr`, 88 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Birth time (only STATX carries it).
    pub btime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    fn encode(&self, out: &mut Vec<u8>) {
        for value in [
            self.ino,
            self.size,
            self.blocks,
            self.atime.0 as u64,
            self.mtime.0 as u64,
            self.ctime.0 as u64,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        for value in [
            self.atime.1,
            self.mtime.1,
            self.ctime.1,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            0,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

/// `fuse_entry_out`: a node, its generation and attributes, valid for
/// `valid_seconds`.
pub fn entry_out(attr: &Attr, generation: u64, valid_seconds: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    for value in [attr.ino, generation, valid_seconds, valid_seconds] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    attr.encode(&mut out);
    out
}

/// `fuse_entry_out` of an absent name: node 0, cached as absent for
/// `valid_seconds`.
pub fn negative_entry_out(valid_seconds: u64) -> Vec<u8> {
    entry_out(&Attr::default(), 0, valid_seconds)
}

/// `fuse_attr_out`.
pub fn attr_out(attr: &Attr, valid_seconds: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(104);
    out.extend_from_slice(&valid_seconds.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    attr.encode(&mut out);
    out
}

/// `fuse_statx_out`: the attributes with the birth time, as a `statx`
/// gives them, valid for `valid_seconds`.
pub fn statx_out(attr: &Attr, valid_seconds: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(STATX_OUT_BYTES);
    // attr_valid, attr_valid_nsec, flags, spare[2].
    out.extend_from_slice(&valid_seconds.to_le_bytes());
    out.extend_from_slice(&[0; 24]);
    // fuse_statx: mask, blksize, attributes, nlink, uid, gid, mode (u16),
    // a spare u16, ino, size, blocks, attributes_mask.
    for value in [STATX_BASIC_STATS | STATX_BTIME, attr.blksize] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&0u64.to_le_bytes());
    for value in [attr.nlink, attr.uid, attr.gid] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&(attr.mode as u16).to_le_bytes());
    out.extend_from_slice(&[0; 2]);
    for value in [attr.ino, attr.size, attr.blocks, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    // atime, btime, ctime, mtime: seconds, nanoseconds, a reserved u32.
    for (seconds, nanos) in [attr.atime, attr.btime, attr.ctime, attr.mtime] {
        out.extend_from_slice(&seconds.to_le_bytes());
        out.extend_from_slice(&nanos.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }
    // rdev as major and minor (the kernel's `new_encode_dev` in `rdev`);
    // the device numbers are the kernel's own; then 14 spare u64.
    let major = (attr.rdev & 0xfff00) >> 8;
    let minor = (attr.rdev & 0xff) | ((attr.rdev >> 12) & 0xfff00);
    for value in [major, minor, 0, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.resize(STATX_OUT_BYTES, 0);
    out
}

/// Bytes of `fuse_statx_out`: 32 before `struct fuse_statx`'s 256.
const STATX_OUT_BYTES: usize = 32 + 256;

/// `fuse_open_out`.
pub fn open_out(fh: u64, open_flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&fh.to_le_bytes());
    out.extend_from_slice(&open_flags.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out
}

/// `fuse_getxattr_out`: the length of a value or name list, for a caller
/// that asked with a size of 0.
pub fn getxattr_out(size: u32) -> Vec<u8> {
    let mut out = size.to_le_bytes().to_vec();
    out.extend_from_slice(&[0; 4]);
    out
}

/// `fuse_write_out`.
/// `fuse_lseek_out`: the offset found.
/// `fuse_ioctl_out` (result 0, no retry) and the data the ioctl returns.
pub fn ioctl_out(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out.extend_from_slice(data);
    out
}

pub fn lseek_out(offset: u64) -> Vec<u8> {
    offset.to_le_bytes().to_vec()
}

pub fn write_out(size: u32) -> Vec<u8> {
    let mut out = size.to_le_bytes().to_vec();
    out.extend_from_slice(&[0; 4]);
    out
}

/// `fuse_init_out` (64 bytes).
pub fn init_out(
    minor: u32,
    flags: u32,
    flags2: u32,
    max_background: u16,
    max_write: u32,
    max_pages: u16,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&KERNEL_VERSION.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&max_write.to_le_bytes()); // max_readahead
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&max_background.to_le_bytes());
    out.extend_from_slice(&(max_background / 4 * 3).to_le_bytes()); // congestion threshold
    out.extend_from_slice(&max_write.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // time granularity: 1 ns
    out.extend_from_slice(&max_pages.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
    out.extend_from_slice(&flags2.to_le_bytes());
    out.resize(64, 0);
    out
}

/// `fuse_kstatfs` inside `fuse_statfs_out`.
pub fn statfs_out(blocks: u64, free: u64, files: u64, free_files: u64, block_size: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(80);
    for value in [blocks, free, free, files, free_files] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in [block_size, 255, block_size, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.resize(80, 0);
    out
}

/// Appends one `fuse_dirent` if it fits within `limit` bytes in all;
/// returns whether it did.
/// Appends a `fuse_direntplus` (`entry`, a `fuse_entry_out`, then the
/// dirent) if it fits within `limit` bytes of `out`.
pub fn push_direntplus(
    out: &mut Vec<u8>,
    limit: usize,
    entry: &[u8],
    ino: u64,
    next: u64,
    kind: u8,
    name: &[u8],
) -> bool {
    if out.len() + entry.len() + direntplus_bytes(name.len()) - ENTRY_OUT_BYTES > limit {
        return false;
    }
    let mark = out.len();
    out.extend_from_slice(entry);
    if !push_dirent(out, limit, ino, next, kind, name) {
        out.truncate(mark);
        return false;
    }
    true
}

/// Bytes of a `fuse_entry_out`.
pub const ENTRY_OUT_BYTES: usize = 128;

/// Bytes a `fuse_direntplus` of a `name_len`-byte name takes.
pub fn direntplus_bytes(name_len: usize) -> usize {
    ENTRY_OUT_BYTES + (24 + name_len).next_multiple_of(8)
}

pub fn push_dirent(
    out: &mut Vec<u8>,
    limit: usize,
    ino: u64,
    next: u64,
    kind: u8,
    name: &[u8],
) -> bool {
    let bytes = (24 + name.len()).next_multiple_of(8);
    if out.len() + bytes > limit {
        return false;
    }
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&next.to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&u32::from(kind).to_le_bytes());
    out.extend_from_slice(name);
    out.resize(out.len().next_multiple_of(8), 0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request_bytes(opcode: u32, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((IN_HEADER_BYTES + body.len()) as u32).to_le_bytes());
        bytes.extend_from_slice(&opcode.to_le_bytes());
        bytes.extend_from_slice(&7u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn decodes_requests() {
        let bytes = request_bytes(LOOKUP, b"file\0");
        let header = header(&bytes).unwrap();
        assert_eq!(
            (header.opcode, header.unique, header.nodeid),
            (LOOKUP, 7, 1)
        );
        assert_eq!(
            request(&header, &bytes).unwrap(),
            Request::Lookup { name: b"file" }
        );
        let mut body = 9u64.to_le_bytes().to_vec();
        body.extend_from_slice(b"a\0b\0");
        let bytes = request_bytes(RENAME, &body);
        assert_eq!(
            request(&header_of(&bytes), &bytes).unwrap(),
            Request::Rename {
                new_dir: 9,
                name: b"a",
                new_name: b"b",
                flags: 0
            }
        );
        let mut body = vec![0u8; 40];
        body[8..16].copy_from_slice(&4096u64.to_le_bytes());
        body[16..20].copy_from_slice(&3u32.to_le_bytes());
        body[20..24].copy_from_slice(&WRITE_KILL_SUIDGID.to_le_bytes());
        body[32..36].copy_from_slice(&0o10002u32.to_le_bytes());
        body.extend_from_slice(b"xyz");
        let bytes = request_bytes(WRITE, &body);
        assert_eq!(
            request(&header_of(&bytes), &bytes).unwrap(),
            Request::Write {
                fh: 0,
                offset: 4096,
                write_flags: WRITE_KILL_SUIDGID,
                flags: 0o10002,
                data: b"xyz"
            }
        );
        // A write claiming more than it carries, a name without NUL, a short read.
        body[16..20].copy_from_slice(&4u32.to_le_bytes());
        let bytes = request_bytes(WRITE, &body);
        assert!(request(&header_of(&bytes), &bytes).is_err());
        let bytes = request_bytes(LOOKUP, b"file");
        assert!(request(&header_of(&bytes), &bytes).is_err());
        assert!(super::header(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_write_read_apart_from_its_payload_decodes_as_one_read_whole() {
        let payload = vec![5u8; 8192];
        let mut body = vec![0u8; WRITE_IN_BYTES];
        body[8..16].copy_from_slice(&16384u64.to_le_bytes());
        body[16..20].copy_from_slice(&8192u32.to_le_bytes());
        body[32..36].copy_from_slice(&0o40002u32.to_le_bytes());
        body.extend_from_slice(&payload);
        let whole = request_bytes(WRITE, &body);
        let head = &whole[..WRITE_HEADERS_BYTES];
        assert_eq!(write_payload_size(head), Some(8192));
        let header = header_apart(head, payload.len()).unwrap();
        assert_eq!(header, super::header(&whole).unwrap());
        assert_eq!(
            write_apart(&header, head, &payload).unwrap(),
            request(&header, &whole).unwrap()
        );
        // A payload of another size than the header says, a header that
        // is not a write's, and a head cut short are refused.
        assert!(header_apart(head, 4096).is_err());
        assert!(write_apart(&header, head, &payload[..4096]).is_err());
        let lookup = request_bytes(LOOKUP, &[b'a'; 60]);
        assert_eq!(write_payload_size(&lookup[..WRITE_HEADERS_BYTES]), None);
        let lookup_header = header_of(&lookup);
        assert!(write_apart(&lookup_header, &lookup[..WRITE_HEADERS_BYTES], &[]).is_err());
        assert_eq!(write_payload_size(&head[..WRITE_HEADERS_BYTES - 1]), None);
        assert!(header_apart(&head[..IN_HEADER_BYTES - 1], 0).is_err());
    }

    #[test]
    fn decodes_setattr_at_the_kernel_offsets() {
        let mut body = vec![0u8; 88];
        body[0..4].copy_from_slice(&(FATTR_SIZE | FATTR_MODE).to_le_bytes());
        body[8..16].copy_from_slice(&77u64.to_le_bytes()); // fh
        body[16..24].copy_from_slice(&1_000_000u64.to_le_bytes());
        body[68..72].copy_from_slice(&0o600u32.to_le_bytes());
        body[76..80].copy_from_slice(&1000u32.to_le_bytes());
        body[80..84].copy_from_slice(&100u32.to_le_bytes());
        // The kernel's times (writeback cache): mtime and ctime, seconds
        // then nanoseconds.
        body[40..48].copy_from_slice(&1_700_000_000u64.to_le_bytes());
        body[48..56].copy_from_slice(&1_700_000_001u64.to_le_bytes());
        body[60..64].copy_from_slice(&5u32.to_le_bytes());
        body[64..68].copy_from_slice(&7u32.to_le_bytes());
        let bytes = request_bytes(SETATTR, &body);
        let Request::Setattr(change) = request(&header_of(&bytes), &bytes).unwrap() else {
            panic!("not a setattr")
        };
        assert_eq!(
            (change.size, change.mode, change.uid, change.gid),
            (1_000_000, 0o600, 1000, 100)
        );
        assert_eq!(
            (change.mtime, change.ctime),
            ((1_700_000_000, 5), (1_700_000_001, 7))
        );
    }

    #[test]
    fn decodes_forgets_single_and_batched() {
        let bytes = request_bytes(FORGET, &3u64.to_le_bytes());
        assert_eq!(
            request(&header_of(&bytes), &bytes).unwrap(),
            Request::Forget(vec![(1, 3)])
        );
        let mut body = 2u32.to_le_bytes().to_vec();
        body.extend_from_slice(&[0; 4]);
        for (node, count) in [(9u64, 1u64), (12, 4)] {
            body.extend_from_slice(&node.to_le_bytes());
            body.extend_from_slice(&count.to_le_bytes());
        }
        let bytes = request_bytes(BATCH_FORGET, &body);
        assert_eq!(
            request(&header_of(&bytes), &bytes).unwrap(),
            Request::Forget(vec![(9, 1), (12, 4)])
        );
        // A count past what the request carries.
        body[0..4].copy_from_slice(&3u32.to_le_bytes());
        let bytes = request_bytes(BATCH_FORGET, &body);
        assert!(request(&header_of(&bytes), &bytes).is_err());
        body[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let bytes = request_bytes(BATCH_FORGET, &body);
        assert!(request(&header_of(&bytes), &bytes).is_err());
    }

    fn header_of(bytes: &[u8]) -> InHeader {
        header(bytes).unwrap()
    }

    #[test]
    fn encodes_replies_of_the_kernel_sizes() {
        let attr = Attr {
            ino: 5,
            ..Attr::default()
        };
        assert_eq!(entry_out(&attr, 1, 1).len(), 128);
        assert_eq!(attr_out(&attr, 1).len(), 104);
        assert_eq!(open_out(0, 0).len(), 16);
        assert_eq!(init_out(31, 0, 0, 256, 1 << 20, 256).len(), 64);
        assert_eq!(statfs_out(1, 1, 1, 1, 4096).len(), 80);
        let reply = reply(9, -2, &[1, 2]);
        assert_eq!(reply.len(), 18);
        assert_eq!(&reply[0..4], &18u32.to_le_bytes());
        assert_eq!(&reply[4..8], &(-2i32).to_le_bytes());
        let split = Reply::new(9, -2, vec![1, 2]);
        assert_eq!(split.header[..], reply[..OUT_HEADER_BYTES]);
        assert_eq!(split.body, [1, 2]);
        assert_eq!(split.body_len(), 2);
        let piece = BufSlice::whole(crate::rt::buf::AlignedBuf::copy_from(&[5; 10]).into_shared());
        let data = Reply::data(4, vec![piece.slice(0..3), piece.slice(5..10)]);
        assert_eq!(&data.header[0..4], &24u32.to_le_bytes());
        assert_eq!(data.body_len(), 8);
        let mut entry = Reply::new(9, 0, 7u64.to_le_bytes().to_vec());
        assert_eq!(entry_node(LOOKUP, &entry), Some(7));
        assert_eq!(entry_node(READ, &entry), None);
        entry.header[4..8].copy_from_slice(&(-2i32).to_le_bytes());
        assert_eq!(entry_node(LOOKUP, &entry), None);
        let mut out = Vec::new();
        assert!(push_dirent(&mut out, 64, 2, 3, 8, b"abc"));
        assert_eq!(out.len(), 32);
        assert!(!push_dirent(&mut out, 64, 2, 3, 8, b"abcdefghijklm"));
    }

    proptest! {
        #[test]
        fn decode_never_panics(opcode in 0u32..50, body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let bytes = request_bytes(opcode, &body);
            if let Ok(header) = header(&bytes) {
                let _ = request(&header, &bytes);
            }
        }
    }
}
