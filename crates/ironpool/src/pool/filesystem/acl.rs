//! POSIX ACLs (`acltype=posix`): kept as the extended attributes Linux
//! names them by (`format::acl`), checked by the kernel.
//!
//! A mount of a filesystem with `acltype=posix` asks for FUSE's
//! `POSIX_ACL`: the kernel then reads a file's ACLs through GETXATTR and
//! checks every access against them (with `default_permissions`), and
//! sets them through SETXATTR. What POSIX.1e ties to the mode is the
//! server's, as OpenZFS's `zpl_set_acl` and `zfs_acl_chmod` do it:
//!
//! - Setting an access ACL sets the mode's permission bits from it (the
//!   group bits from the mask); one the mode says all of (no named entry,
//!   no mask) is not kept, only the mode.
//! - A `chmod` of a file with an access ACL sets the ACL's owner, mask (or
//!   owning group) and other entries.
//! - An object made in a directory with a default ACL starts with an
//!   access ACL from it, each class limited by the mode asked for (a
//!   directory keeps the default too); without one, the creator's umask
//!   applies (the kernel leaves both to the filesystem on such a mount).
//!
//! With `acltype=off` (the default, as OpenZFS on Linux) the attributes
//! are refused with `EOPNOTSUPP`, as by a filesystem mounted `noacl`, so
//! that tools fall back to `chmod`.

use super::{Filesystem, FsError};
use crate::format::acl::{Acl, ACCESS_NAME, DEFAULT_NAME};
use crate::format::xattr::Xattr;
use crate::format::znode::Znode;

/// The prefix of the POSIX ACL attributes' names.
const POSIX_ACL_PREFIX: &[u8] = b"system.posix_acl_";

/// An ACL attribute's value, checked.
fn decode(value: &[u8]) -> Result<Acl, FsError> {
    Acl::decode(value).map_err(|error| FsError::Invalid(error.to_string()))
}

/// Puts `value` as attribute `name` into `list` (kept in name order).
fn put(list: &mut Vec<Xattr>, name: &[u8], value: Vec<u8>) {
    match list.binary_search_by(|xattr| xattr.name.as_slice().cmp(name)) {
        Ok(at) => list[at].value = value,
        Err(at) => list.insert(
            at,
            Xattr {
                name: name.to_vec(),
                value,
            },
        ),
    }
}

/// Takes attribute `name` out of `list`, if it is there.
fn take(list: &mut Vec<Xattr>, name: &[u8]) {
    list.retain(|xattr| xattr.name != name);
}

impl Filesystem {
    /// Refuses the POSIX ACL attributes unless `acltype=posix`; checks
    /// that one of them is one Linux names.
    pub(super) fn check_acl_name(&self, name: &[u8]) -> Result<(), FsError> {
        if !name.starts_with(POSIX_ACL_PREFIX) {
            return Ok(());
        }
        if !self.posix_acls() || (name != ACCESS_NAME && name != DEFAULT_NAME) {
            return Err(FsError::XattrsOff);
        }
        Ok(())
    }

    /// Sets POSIX ACL attribute `name` of the object of attributes `znode`
    /// in its attribute `list`: an access ACL sets the mode's permission
    /// bits too, and is kept only if the mode does not say all of it.
    /// Returns false for an attribute that is not an ACL.
    pub(super) fn set_acl(
        &self,
        znode: &mut Znode,
        list: &mut Vec<Xattr>,
        name: &[u8],
        value: &[u8],
    ) -> Result<bool, FsError> {
        if !name.starts_with(POSIX_ACL_PREFIX) {
            return Ok(false);
        }
        let acl = decode(value)?;
        if name == DEFAULT_NAME {
            if !znode.is_dir() {
                return Err(FsError::NotPermitted(
                    "a default ACL is a directory's".into(),
                ));
            }
            put(list, name, acl.encode());
            return Ok(true);
        }
        let (bits, equivalent) = acl.mode_bits();
        znode.mode = (znode.mode & !0o777) | bits;
        if equivalent {
            take(list, name);
        } else {
            put(list, name, acl.encode());
        }
        Ok(true)
    }

    /// After a `chmod` to `mode`: the access ACL in `list`, if any, takes
    /// the new bits. Returns whether it had one.
    pub(super) fn chmod_acl(list: &mut [Xattr], mode: u32) -> Result<bool, FsError> {
        let Some(xattr) = list.iter_mut().find(|xattr| xattr.name == ACCESS_NAME) else {
            return Ok(false);
        };
        let mut acl = decode(&xattr.value)?;
        acl.chmod(mode);
        xattr.value = acl.encode();
        Ok(true)
    }

    /// What an object made with `mode` in directory `parent` starts with:
    /// its mode and its ACL attributes (see the module's documentation).
    /// `umask`: the creator's, when the kernel left it to the filesystem.
    /// The directory is read only when ACLs are kept (a create then loads
    /// it again to check the name).
    pub(super) async fn new_object_acls(
        &self,
        parent: u64,
        mode: u32,
        is_dir: bool,
        umask: Option<u32>,
    ) -> Result<(u32, Vec<Xattr>), FsError> {
        if mode & crate::format::znode::S_IFMT == crate::format::znode::S_IFLNK {
            return Ok((mode, Vec::new()));
        }
        let umasked = |mode: u32| umask.map_or(mode, |umask| mode & !(umask & 0o777));
        if !self.posix_acls() {
            return Ok((umasked(mode), Vec::new()));
        }
        let (_, dir) = self.load_dir(parent).await?;
        if dir.xattr_object == 0 {
            return Ok((umasked(mode), Vec::new()));
        }
        let parent = self.xattr_list(&dir).await?;
        let Some(default) = parent.iter().find(|xattr| xattr.name == DEFAULT_NAME) else {
            return Ok((umasked(mode), Vec::new()));
        };
        let default = decode(&default.value)?;
        let (mode, access) = default.create_masked(mode);
        let mut list = Vec::new();
        if let Some(access) = access {
            put(&mut list, ACCESS_NAME, access.encode());
        }
        if is_dir {
            put(&mut list, DEFAULT_NAME, default.encode());
        }
        Ok((mode, list))
    }
}
