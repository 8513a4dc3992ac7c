//! Per-object flags and project ids (`chattr`, `lsattr`, `chattr -p`): what
//! OpenZFS keeps as a znode's `pflags` and `projid`.
//!
//! - Immutable (`+i`): the object does not change at all: no write,
//!   truncate, attribute or extended-attribute change, link, rename or
//!   removal; a directory takes no new entry and loses none.
//! - Append-only (`+a`): a file is only written at its end (opened for
//!   writing only with `O_APPEND`), never truncated; it is not renamed or
//!   removed; a directory's entries are only added.
//! - No dump (`+d`): kept for backup tools, nothing else.
//! - Project inherit (`+P`, directories): what is made in it takes its
//!   project id (and a directory, the flag), so a tree stays in one
//!   project; a link or rename into it from another project is refused
//!   with `EXDEV` (`mv` then copies, and the copy takes the project).
//!
//! The kernel checks who may set them (the owner; `CAP_LINUX_IMMUTABLE`
//! for `+i` and `+a`; a project id only from the initial user namespace)
//! before it asks; the server keeps the flags and refuses what they
//! forbid, since a FUSE inode carries no flags the kernel would check.

use std::rc::Rc;

use super::{now, Filesystem, FsError};
use crate::format::znode::{
    Znode, ZNODE_APPEND, ZNODE_FLAGS_KNOWN, ZNODE_IMMUTABLE, ZNODE_PROJINHERIT,
};
use crate::pool::Pool;

/// A change to a file's data, checked against its flags before it is
/// made (and before what it takes away, `security.capability` or the
/// set-id bits, goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataChange {
    /// A write at this offset.
    Write { offset: u64 },
    /// An `fallocate` of this mode.
    Allocate { mode: u32 },
    /// A truncate or an owner change (`setattr`, which checks the rest).
    Attributes,
}

/// EPERM when `znode`'s flags forbid any change to it.
pub(super) fn refuse_if_immutable(znode: &Znode, what: &str) -> Result<(), FsError> {
    if znode.is_immutable() {
        return Err(FsError::NotPermitted(format!(
            "{what}: it is immutable (chattr -i to change it)"
        )));
    }
    Ok(())
}

/// EPERM when `znode`'s flags forbid removing it, or from it (immutable
/// or append-only).
pub(super) fn refuse_if_fixed(znode: &Znode, what: &str) -> Result<(), FsError> {
    refuse_if_immutable(znode, what)?;
    if znode.is_append_only() {
        return Err(FsError::NotPermitted(format!(
            "{what}: it is append-only (chattr -a to change it)"
        )));
    }
    Ok(())
}

/// Refuses `change` of a file of attributes `znode` and `size` bytes that
/// its flags forbid.
pub(super) fn check_data_change(
    znode: &Znode,
    size: u64,
    change: DataChange,
) -> Result<(), FsError> {
    refuse_if_immutable(znode, "change of the file")?;
    if !znode.is_append_only() {
        return Ok(());
    }
    let allowed = match change {
        DataChange::Write { offset } => offset >= size,
        // Only reserving space past the end leaves what is there as it is.
        DataChange::Allocate { mode } => mode & !(libc::FALLOC_FL_KEEP_SIZE as u32) == 0,
        DataChange::Attributes => false,
    };
    if allowed {
        Ok(())
    } else {
        refuse_if_fixed(znode, "change of the file before its end")
    }
}

/// Refuses opening a file of attributes `znode` with open flags `flags`
/// (`O_*`) that its flags forbid: for writing when immutable; for writing
/// without `O_APPEND`, or with `O_TRUNC`, when append-only (as Linux's
/// `may_open` does for a local filesystem).
pub fn check_open(znode: &Znode, flags: u32) -> Result<(), FsError> {
    let writes = flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
    let truncates = flags & libc::O_TRUNC as u32 != 0;
    if writes || truncates {
        refuse_if_immutable(znode, "open for writing")?;
    }
    if znode.is_append_only() && (truncates || (writes && flags & libc::O_APPEND as u32 == 0)) {
        return Err(FsError::NotPermitted(
            "open for writing: it is append-only (open with O_APPEND)".into(),
        ));
    }
    Ok(())
}

/// The flags and project id a new object made in a directory of
/// attributes `dir` starts with: with the directory's project-inherit
/// flag, its project (and for a directory, the flag); else none.
pub(super) fn inherited(dir: &Znode, is_dir: bool) -> (u32, u32) {
    if dir.flags & ZNODE_PROJINHERIT == 0 {
        return (0, 0);
    }
    let flags = if is_dir { ZNODE_PROJINHERIT } else { 0 };
    (flags, dir.project)
}

/// EXDEV when object `moving` may not get a name in directory `dir`: the
/// directory keeps its tree in one project and the object is of another
/// (as XFS and OpenZFS refuse; `mv` then copies).
pub(super) fn check_project_move(dir: &Znode, moving: &Znode) -> Result<(), FsError> {
    if dir.flags & ZNODE_PROJINHERIT != 0 && dir.project != moving.project {
        return Err(FsError::CrossDevice);
    }
    Ok(())
}

impl Filesystem {
    /// The flags (`ZNODE_*`) and project id of object `ino`.
    pub async fn file_flags(&self, ino: u64) -> Result<(u32, u32), FsError> {
        let znode = self.getattr(ino).await?.znode;
        Ok((znode.flags, znode.project))
    }

    /// Sets the flags (`ZNODE_*`) of object `ino` and, if given, its
    /// project id. Flags this filesystem does not keep are refused
    /// (`EOPNOTSUPP`); project-inherit on a file is dropped, as ext4 does.
    /// A new project counts the object's space from now on (as `chown`
    /// does for a user).
    pub async fn set_file_flags(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        flags: u32,
        project: Option<u32>,
    ) -> Result<(), FsError> {
        if flags & !ZNODE_FLAGS_KNOWN != 0 {
            return Err(FsError::Unsupported(format!(
                "file flags {:#x}: kept are immutable, append-only, no-dump and project-inherit",
                flags & !ZNODE_FLAGS_KNOWN
            )));
        }
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        let (object, mut znode) = self.load(ino).await?;
        let flags = if znode.is_dir() {
            flags
        } else {
            flags & !ZNODE_PROJINHERIT
        };
        let project = project.unwrap_or(znode.project);
        if (flags, project) == (znode.flags, znode.project) {
            return Ok(());
        }
        // An immutable object changes only by losing the flag.
        if znode.flags & ZNODE_IMMUTABLE != 0 && flags & ZNODE_IMMUTABLE != 0 {
            let other = |flags: u32| flags & !(ZNODE_IMMUTABLE | ZNODE_APPEND);
            if project != znode.project || other(flags) != other(znode.flags) {
                refuse_if_immutable(&znode, "change of its flags")?;
            }
        }
        if project != znode.project {
            self.note_owner_change(
                &[(super::id_space::IdKind::Project, project)],
                object.dnode().used_bytes,
            );
        }
        znode.flags = flags;
        znode.project = project;
        znode.ctime = now();
        change.save(&object, &znode);
        Ok(())
    }
}
