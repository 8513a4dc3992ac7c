//! Extended attributes (`getxattr`, `setxattr`, `listxattr`, `removexattr`).
//!
//! An object's attributes are one list in one block of its xattr object
//! (`format::xattr`). A change encodes the whole list anew, writes it as a
//! new block before txg builds are held off (an allocation may wait for a
//! txg on a nearly full pool), then swaps the block pointer and updates the
//! owner's attributes with builds held off: a txg holds the old list or the
//! new one. The intent log carries the whole new list (up to
//! `XATTRS_LOGGED_BYTES_MAX`), so an `fsync` after a change is one log
//! write, and replay swaps the list in the same way. The `xattr` property
//! (on by default) turns them off: every call then fails with
//! `EOPNOTSUPP`, as on a filesystem without them.
//!
//! POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`) are
//! not extended attributes to keep as they come: setting one changes the
//! mode too. With `acltype=posix` they are kept by the rules of `acl`;
//! else refused with `EOPNOTSUPP` (as by a filesystem mounted `noacl`), so
//! that tools fall back to `chmod`: `cp -a` would otherwise store the ACL,
//! believe the mode set, and leave the file with the mode it was created
//! with.

use std::rc::Rc;

use super::{block_shift_for, now, padded_to_block, without_setid, Filesystem, FsError};
use crate::format::xattr::{
    self, Xattr, XATTR_LIST_BYTES_MAX, XATTR_NAMES_LIST_BYTES_MAX, XATTR_VALUE_BYTES_MAX,
};
use crate::format::znode::{Znode, S_IFREG};
use crate::format::{BlockPointer, ObjectType};
use crate::object::{Object, ObjectError};
use crate::pool::data::release_unlinked;
use crate::pool::Pool;

/// `setxattr` flags (Linux's): fail if the attribute exists...
pub const XATTR_CREATE: u32 = 1;
/// ...or if it does not.
pub const XATTR_REPLACE: u32 = 2;

/// The attribute holding a file's capabilities (`setcap`), dropped when
/// the file is written, truncated or changes owner.
const CAPABILITY: &[u8] = b"security.capability";

impl Filesystem {
    fn check_xattrs_on(&self) -> Result<(), FsError> {
        if self.xattrs.get() {
            Ok(())
        } else {
            Err(FsError::XattrsOff)
        }
    }

    /// Drops what a write (or truncate, or chown) of `ino` takes away
    /// (the server's job under FUSE's `HANDLE_KILLPRIV_V2`): its
    /// `security.capability`, and with `kill_setid` its set-user-id and
    /// set-group-id bits ([`SetAttr::drop_setid`]). Returns whether anything
    /// changed (the kernel's cached attributes are then stale). A file
    /// with neither costs one attribute lookup, under the shared lock.
    pub async fn drop_privileges(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        kill_setid: bool,
        data_change: super::DataChange,
    ) -> Result<bool, FsError> {
        let attr = self.getattr(ino).await?;
        // What the file's flags forbid is refused before anything is taken
        // away.
        super::attrs::check_data_change(&attr.znode, attr.size, data_change)?;
        let znode = attr.znode;
        let mut changed = false;
        // Looked up first (under the shared lock): removing takes the
        // filesystem's change lock, which would hold up every other
        // request on each write of a file with attributes of its own.
        if znode.xattr_object != 0 && self.xattrs.get() {
            match self.getxattr(ino, CAPABILITY).await {
                Ok(_) => {
                    match self.remove_xattr(pool, ino, CAPABILITY, false).await {
                        Ok(()) | Err(FsError::NoAttribute) => {}
                        Err(error) => return Err(error),
                    }
                    changed = true;
                }
                Err(FsError::NoAttribute) => {}
                Err(error) => return Err(error),
            }
        }
        if kill_setid && without_setid(znode.mode) != znode.mode {
            let change = super::SetAttr {
                drop_setid: true,
                ..Default::default()
            };
            self.setattr(pool, ino, change).await?;
            changed = true;
        }
        Ok(changed)
    }

    /// The object holding extended attributes numbered `id`.
    pub(super) async fn load_xattr_object(&self, id: u64) -> Result<Rc<Object>, FsError> {
        let object = match self.objects.open(id).await {
            Ok(object) => object,
            Err(ObjectError::NoSuchObject(_)) => {
                return Err(FsError::Corrupt(format!(
                    "{}: xattr object {id} is missing",
                    self.name()
                )))
            }
            Err(error) => return Err(error.into()),
        };
        let dnode = object.dnode();
        if dnode.object_type != ObjectType::FsXattr || dnode.levels != 1 {
            return Err(FsError::Corrupt(format!(
                "{}: object {id} is not an xattr object",
                self.name()
            )));
        }
        Ok(object)
    }

    /// The extended attributes of the object whose attributes are `znode`.
    pub(super) async fn xattr_list(&self, znode: &Znode) -> Result<Vec<Xattr>, FsError> {
        if znode.xattr_object == 0 {
            return Ok(Vec::new());
        }
        let object = self.load_xattr_object(znode.xattr_object).await?;
        let length = object.length_bytes() as usize;
        if length > XATTR_LIST_BYTES_MAX {
            return Err(FsError::Corrupt(format!(
                "{}: xattr object {} of {length} bytes",
                self.name(),
                object.id
            )));
        }
        let usage = self.settings.get().data_cache_use();
        let bytes = self.read_locked(&object, 0, length, usage).await?;
        xattr::decode(&bytes).map_err(|error| {
            FsError::Corrupt(format!(
                "{} xattr object {}: {error}",
                self.name(),
                object.id
            ))
        })
    }

    /// The value of attribute `name` of object `ino`.
    pub async fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>, FsError> {
        self.check_xattrs_on()?;
        self.check_acl_name(name)?;
        let _shared = self.lock.acquire(1).await;
        let (_, znode) = self.load(ino).await?;
        self.xattr_list(&znode)
            .await?
            .into_iter()
            .find(|xattr| xattr.name == name)
            .map(|xattr| xattr.value)
            .ok_or(FsError::NoAttribute)
    }

    /// The names of the attributes of object `ino`, in order.
    pub async fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>, FsError> {
        self.check_xattrs_on()?;
        let _shared = self.lock.acquire(1).await;
        let (_, znode) = self.load(ino).await?;
        Ok(self
            .xattr_list(&znode)
            .await?
            .into_iter()
            .map(|xattr| xattr.name)
            .collect())
    }

    /// Sets attribute `name` of object `ino` to `value`; `flags` as
    /// `setxattr(2)`'s ([`XATTR_CREATE`], [`XATTR_REPLACE`]).
    pub async fn setxattr(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        self.check_xattrs_on()?;
        self.check_acl_name(name)?;
        if !xattr::valid_name(name) {
            return Err(FsError::Invalid("extended attribute name".into()));
        }
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(FsError::TooBig);
        }
        let _room = self.claim_name_room(pool, value.len() as u64).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        let (object, mut znode) = self.load(ino).await?;
        super::attrs::refuse_if_fixed(&znode, "change of its extended attributes")?;
        let mut list = self.xattr_list(&znode).await?;
        if self.set_acl(&mut znode, &mut list, name, value)? {
            return self
                .store_xattrs(&change, pool, &object, znode, &list)
                .await
                .map(drop);
        }
        match list.binary_search_by(|xattr| xattr.name.as_slice().cmp(name)) {
            Ok(_) if flags & XATTR_CREATE != 0 => return Err(FsError::Exists),
            Ok(at) => list[at].value = value.to_vec(),
            Err(_) if flags & XATTR_REPLACE != 0 => return Err(FsError::NoAttribute),
            Err(at) => list.insert(
                at,
                Xattr {
                    name: name.to_vec(),
                    value: value.to_vec(),
                },
            ),
        }
        if xattr::encoded_len(&list) > XATTR_LIST_BYTES_MAX
            || xattr::names_list_len(&list) > XATTR_NAMES_LIST_BYTES_MAX
        {
            return Err(FsError::NoSpace);
        }
        self.store_xattrs(&change, pool, &object, znode, &list)
            .await
            .map(drop)
    }

    /// Removes attribute `name` of object `ino`.
    pub async fn removexattr(&self, pool: &Rc<Pool>, ino: u64, name: &[u8]) -> Result<(), FsError> {
        self.remove_xattr(pool, ino, name, true).await
    }

    /// [`Filesystem::removexattr`]; `as_caller`: a caller's request, which
    /// an immutable or append-only object refuses (the server's own
    /// removal of `security.capability` on a write is not one).
    async fn remove_xattr(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        name: &[u8],
        as_caller: bool,
    ) -> Result<(), FsError> {
        self.check_xattrs_on()?;
        self.check_acl_name(name)?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        let (object, znode) = self.load(ino).await?;
        if as_caller {
            super::attrs::refuse_if_fixed(&znode, "change of its extended attributes")?;
        }
        let mut list = self.xattr_list(&znode).await?;
        let at = list
            .binary_search_by(|xattr| xattr.name.as_slice().cmp(name))
            .map_err(|_| FsError::NoAttribute)?;
        list.remove(at);
        self.store_xattrs(&change, pool, &object, znode, &list)
            .await
            .map(drop)
    }

    /// Makes `list` the attributes of `owner` (whose attributes are
    /// `znode`), noted for the intent log: one new block, swapped in with
    /// builds held off; an empty list frees the xattr object. The caller
    /// holds the filesystem's lock (`change`). Returns the owner's
    /// attributes as saved.
    pub(super) async fn store_xattrs(
        &self,
        change: &super::Change<'_>,
        pool: &Rc<Pool>,
        owner: &Rc<Object>,
        mut znode: Znode,
        list: &[Xattr],
    ) -> Result<Znode, FsError> {
        let bytes = xattr::encode(list);
        let written = self.write_xattr_block(pool, &bytes).await?;
        let _hold = pool.txg.hold_builds();
        let written = written.map(|pointer| (bytes.len() as u64, pointer));
        self.swap_xattrs(pool, owner, &mut znode, written).await?;
        znode.ctime = now();
        change.save(owner, &znode);
        self.log.note_xattrs(owner.id, pool.txg.open(), bytes);
        Ok(znode)
    }

    /// Writes an encoded list of extended attributes as a new block (None:
    /// the list is empty), before txg builds are held off (a change, or
    /// replay before [`Filesystem::replay_xattrs`] swaps it in).
    pub(in crate::pool) async fn write_xattr_block(
        &self,
        pool: &Rc<Pool>,
        bytes: &[u8],
    ) -> Result<Option<BlockPointer>, FsError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let pointer = self
            .write_block(pool, &padded_to_block(bytes), ObjectType::FsXattr)
            .await?;
        Ok(Some(pointer))
    }

    /// Makes the written list (its length and block; None: no attributes)
    /// the attributes of `owner`, whose attributes `znode` then names its
    /// xattr object: the block pointer swapped into the xattr object (made
    /// if there is none), or the object freed. The caller holds builds off
    /// and saves `znode`. A block it does not take is released.
    pub(super) async fn swap_xattrs(
        &self,
        pool: &Rc<Pool>,
        owner: &Rc<Object>,
        znode: &mut Znode,
        written: Option<(u64, BlockPointer)>,
    ) -> Result<(), FsError> {
        let Some((length, pointer)) = written else {
            if znode.xattr_object != 0 {
                let object = self.load_xattr_object(znode.xattr_object).await?;
                self.free_object(pool, &object).await?;
                znode.xattr_object = 0;
            }
            return Ok(());
        };
        let object = if znode.xattr_object == 0 {
            let id = self.allocate_ino();
            let time = now();
            let attributes = Znode {
                mode: S_IFREG,
                nlink: 1,
                parent: owner.id,
                generation: id,
                atime: time,
                mtime: time,
                ctime: time,
                birth: time,
                ..Znode::default()
            };
            let object = self.new_object(pool, id, false, &attributes);
            object.dnode.borrow_mut().object_type = ObjectType::FsXattr;
            znode.xattr_object = id;
            object
        } else {
            match self.load_xattr_object(znode.xattr_object).await {
                Ok(object) => object,
                Err(error) => {
                    release_unlinked(pool, &pointer);
                    return Err(error);
                }
            }
        };
        self.replace_only_block(pool, &object, block_shift_for(length), length, pointer)
    }

    /// Replay of the intent log: makes the written list (its length and
    /// block; None: no attributes) the extended attributes of object `ino`
    /// (the caller holds builds off). Its attributes' times come from its
    /// own object record.
    pub(in crate::pool) async fn replay_xattrs(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        written: Option<(u64, BlockPointer)>,
    ) -> Result<(), FsError> {
        let release = || {
            if let Some((_, pointer)) = &written {
                release_unlinked(pool, pointer);
            }
        };
        let (owner, mut znode) = match self.load(ino).await {
            Ok(loaded) => loaded,
            Err(error) => {
                release();
                return Err(error);
            }
        };
        self.swap_xattrs(pool, &owner, &mut znode, written).await?;
        Self::save(&owner, &znode);
        Ok(())
    }
}
