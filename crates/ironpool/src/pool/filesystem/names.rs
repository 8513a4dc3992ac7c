//! A filesystem's names: lookups, creates (files, directories, links,
//! nodes), hard links, removes, renames, directory listings, attribute
//! changes and symbolic links' targets.

use std::rc::Rc;

use super::attrs::{check_project_move, inherited, refuse_if_fixed, refuse_if_immutable};
use super::{
    block_shift_for, dir, now, padded_to_block, without_setid, Attr, Change, Filesystem, FsError,
    NewObject, SetAttr, FILE_BLOCK_SHIFT_MIN, FILE_SIZE_MAX_BYTES, LINK_MAX,
    NAME_CHANGE_CLAIM_BYTES, NAME_CHANGE_QUOTA_BYTES, OBJECTS_MAX, RENAME_EXCHANGE,
    RENAME_NOREPLACE, SYMLINK_BYTES_MAX,
};
use crate::format::fsdir::DirEntry;
use crate::format::znode::{Timestamp, Znode, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::format::{fsdir, BlockPointer, ObjectType};
use crate::object::{new_dnode, Object};
use crate::pool::data::release_unlinked;
use crate::pool::{Pool, INDIRECT_BLOCK_SHIFT};

impl Filesystem {
    /// The object named `name` in directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (dir_object, dir_znode) = self.load_dir(parent).await?;
        if name == b"." {
            return Ok(Self::attr(&dir_object, dir_znode));
        }
        if name == b".." {
            let (object, znode) = self.load(dir_znode.parent).await?;
            return Ok(Self::attr(&object, znode));
        }
        Self::check_name(name)?;
        let entry = dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let (object, znode) = self.load(entry.object).await?;
        Ok(Self::attr(&object, znode))
    }

    /// Creates `name` in `parent`: a file of any type but a directory
    /// (`mode` says which), a directory, or a symbolic link to `target`.
    pub async fn create(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        new: &NewObject<'_>,
    ) -> Result<Attr, FsError> {
        self.make_object(pool, parent, Some(name), new).await
    }

    /// Creates a regular file with no name in directory `parent`
    /// (`open(O_TMPFILE)`): it lives while it is open, as a file removed
    /// while open does, unless `linkat` gives it a name
    /// ([`Filesystem::link`]); a crash meanwhile leaves it for the next
    /// import to free. It takes the directory's default ACL as a file made
    /// there would.
    pub async fn create_tmpfile(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        new: &NewObject<'_>,
    ) -> Result<Attr, FsError> {
        if new.mode & S_IFMT != S_IFREG {
            return Err(FsError::Invalid("O_TMPFILE makes regular files".into()));
        }
        self.make_object(pool, parent, None, new).await
    }

    /// [`Filesystem::create`] of `name`, or with None
    /// [`Filesystem::create_tmpfile`].
    async fn make_object(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: Option<&[u8]>,
        new: &NewObject<'_>,
    ) -> Result<Attr, FsError> {
        let NewObject {
            mode,
            uid,
            gid,
            rdev,
            target,
            umask,
        } = *new;
        pool.txg.throttle(pool).await;
        // (A link's target is a block of its own.)
        let stored = target.map_or(0, |target| target.len() as u64);
        let _room = self.claim_name_room(pool, stored).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        if let Some(name) = name {
            Self::check_name(name)?;
        }
        if self.header.get().next_object >= OBJECTS_MAX {
            return Err(FsError::NoSpace);
        }
        let kind = mode & S_IFMT;
        let mode = if kind == 0 { mode | S_IFREG } else { mode };
        if (mode & S_IFMT == S_IFLNK) != target.is_some() {
            return Err(FsError::Invalid("a symbolic link needs a target".into()));
        }
        if let Some(target) = target {
            if mode & S_IFMT != S_IFLNK || target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
                return Err(FsError::Invalid("symbolic link target".into()));
            }
        }
        // The mode and ACLs it starts with (the directory's default ACL,
        // or the umask), their block written before builds are held off.
        let is_dir = mode & S_IFMT == S_IFDIR;
        let (mode, acls) = self.new_object_acls(parent, mode, is_dir, umask).await?;
        let acl_bytes = crate::format::xattr::encode(&acls);
        let acl_block = self.write_xattr_block(pool, &acl_bytes).await?;
        // A link's target is written before builds are held off: allocation
        // may wait for a txg when the pool is nearly full.
        let target_block = match target {
            Some(target) => Some(
                self.write_block(pool, &padded_to_block(target), ObjectType::FsFile)
                    .await?,
            ),
            None => None,
        };
        let release = |pointer: &Option<BlockPointer>| {
            if let Some(pointer) = pointer {
                release_unlinked(pool, pointer);
            }
        };
        let _hold = pool.txg.hold_builds();
        let checked = match name {
            Some(name) => self.check_new_name(parent, name, mode).await,
            None => self.load_dir(parent).await.and_then(|dir| {
                if dir.1.nlink == 0 {
                    Err(FsError::NotFound)
                } else {
                    Ok(dir)
                }
            }),
        };
        let checked = checked.and_then(|dir| {
            refuse_if_immutable(&dir.1, "a new name in the directory")?;
            Ok(dir)
        });
        let (dir_object, mut dir_znode) = match checked {
            Ok(dir) => dir,
            Err(error) => {
                release(&target_block);
                release(&acl_block);
                return Err(error);
            }
        };
        let (flags, project) = inherited(&dir_znode, is_dir);
        // The object counts from here: a failure below frees it again.
        let ino = self.allocate_ino();
        let time = now();
        let znode = Znode {
            mode,
            uid,
            gid,
            // A file with no name yet has no link.
            nlink: match (is_dir, name) {
                (true, _) => 2,
                (false, Some(_)) => 1,
                (false, None) => 0,
            },
            parent,
            generation: ino,
            atime: time,
            mtime: time,
            ctime: time,
            birth: time,
            rdev,
            entries: 0,
            hash_salt: if is_dir { crate::format::new_guid() } else { 0 },
            xattr_object: 0,
            project,
            flags,
        };
        let object = self.new_object(pool, ino, is_dir, &znode);
        change.touch(&object);
        if let Some(pointer) = acl_block {
            let mut znode = znode;
            let written = Some((acl_bytes.len() as u64, pointer));
            if let Err(error) = self.swap_xattrs(pool, &object, &mut znode, written).await {
                release(&target_block);
                self.free_object(pool, &object).await?;
                return Err(error);
            }
            change.save(&object, &znode);
            self.log.note_xattrs(object.id, pool.txg.open(), acl_bytes);
        }
        // Set once the link's target block is handed to the tree (or, on a
        // failed link, released by it).
        let mut target_taken = false;
        let made = async {
            if is_dir {
                dir::init(&self.objects, &object).await?;
            }
            if let (Some(pointer), Some(target)) = (target_block, target) {
                let mut dnode = object.dnode();
                dnode.data_block_shift = block_shift_for(target.len() as u64);
                dnode.length_bytes = target.len() as u64;
                *object.dnode.borrow_mut() = dnode;
                target_taken = true;
                self.link_cached(pool, &object, 0, pointer)?;
            }
            let Some(name) = name else {
                return Ok(());
            };
            let target = (ino, fsdir::dirent_type(mode));
            change
                .set_entry(&dir_object, (dir_znode.hash_salt, name), target, false)
                .await
        }
        .await;
        if let Err(error) = made {
            if !target_taken {
                release(&target_block);
            }
            // Nothing names the object: it goes, with what it holds.
            self.free_object(pool, &object).await?;
            return Err(error);
        }
        let znode = Znode::decode(&object.dnode().bonus).expect("written just now");
        if name.is_none() {
            // Held by the open that made it until linked or closed.
            self.orphans.borrow_mut().insert(ino);
            return Ok(Self::attr(&object, znode));
        }
        dir_znode.entries += 1;
        if is_dir {
            dir_znode.nlink += 1;
        }
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        Ok(Self::attr(&object, znode))
    }

    /// Claims room for the metadata a change that adds a name or an object
    /// may add ([`NAME_CHANGE_CLAIM_BYTES`]): ENOSPC when data could not
    /// have it either, after waiting for space being freed; EDQUOT past the
    /// filesystem's quota (metadata counts against it as data does, so a
    /// loop of `touch` stops at the quota too), counted as
    /// [`NAME_CHANGE_QUOTA_BYTES`] and the `value_bytes` it stores (an
    /// extended attribute's). The caller holds no lock yet (a commit may be
    /// waited for).
    pub(super) async fn claim_name_room<'a>(
        &'a self,
        pool: &'a Rc<Pool>,
        value_bytes: u64,
    ) -> Result<
        (
            crate::pool::dirty::SpaceClaim<'a>,
            crate::pool::dataset::quota::Admitted<'a>,
        ),
        FsError,
    > {
        self.check_writable(pool)?;
        let admitted = {
            let _shared = self.lock.acquire(1).await;
            pool.admit_metadata(
                crate::pool::Owner::Filesystem(self),
                NAME_CHANGE_QUOTA_BYTES + value_bytes,
            )
            .await?
        };
        crate::pool::dirty::update_metadata_reserve(pool);
        Ok((pool.claim_space(NAME_CHANGE_CLAIM_BYTES).await?, admitted))
    }

    /// Checks that `name` can be created in `parent`; returns the directory.
    async fn check_new_name(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
    ) -> Result<(Rc<Object>, Znode), FsError> {
        let (dir_object, dir_znode) = self.load_dir(parent).await?;
        if dir_znode.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .is_some()
        {
            return Err(FsError::Exists);
        }
        if mode & S_IFMT == S_IFDIR && dir_znode.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        Ok((dir_object, dir_znode))
    }

    /// Hands out the next object number and counts the object in the
    /// header (numbers are not reused).
    pub(super) fn allocate_ino(&self) -> u64 {
        let mut header = self.header.get();
        let ino = header.next_object;
        header.next_object += 1;
        header.objects += 1;
        self.set_header(header);
        ino
    }

    /// A new object numbered `ino` (written at the next txg).
    pub(super) fn new_object(
        &self,
        pool: &Pool,
        ino: u64,
        is_dir: bool,
        znode: &Znode,
    ) -> Rc<Object> {
        let (object_type, shift) = if is_dir {
            (ObjectType::FsDirectory, dir::NEW_DIRECTORY_BLOCK_SHIFT)
        } else {
            (ObjectType::FsFile, FILE_BLOCK_SHIFT_MIN)
        };
        let mut dnode = new_dnode(object_type, shift, INDIRECT_BLOCK_SHIFT, 0, pool.txg.open());
        dnode.checksum_algo = self.settings.get().checksum;
        dnode.bonus = znode.encode();
        self.objects.create(ino, dnode)
    }

    /// Adds a link `name` in `parent` to file `ino` (not a directory).
    pub async fn link(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        parent: u64,
        name: &[u8],
    ) -> Result<Attr, FsError> {
        let _room = self.claim_name_room(pool, 0).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        Self::check_name(name)?;
        let _hold = pool.txg.hold_builds();
        let (object, mut znode) = self.load(ino).await?;
        if znode.is_dir() {
            return Err(FsError::NotPermitted("hard links to directories".into()));
        }
        if znode.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        // A file with no name left gets one only if it still lives: the
        // kernel asks so only for an `O_TMPFILE` file (`linkat`).
        let named_again = znode.nlink == 0;
        if named_again && !self.orphans.borrow().contains(&ino) {
            return Err(FsError::NotFound);
        }
        refuse_if_fixed(&znode, "a new link to the file")?;
        let (dir_object, mut dir_znode) = self.load_dir(parent).await?;
        refuse_if_immutable(&dir_znode, "a new name in the directory")?;
        check_project_move(&dir_znode, &znode)?;
        if dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .is_some()
        {
            return Err(FsError::Exists);
        }
        let target = (ino, fsdir::dirent_type(znode.mode));
        change
            .set_entry(&dir_object, (dir_znode.hash_salt, name), target, false)
            .await?;
        let time = now();
        znode.nlink += 1;
        znode.ctime = time;
        if named_again {
            znode.parent = parent;
            self.orphans.borrow_mut().remove(&ino);
        }
        change.save(&object, &znode);
        dir_znode.entries += 1;
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        Ok(Self::attr(&object, znode))
    }

    /// Removes `name` from `parent`: a non-directory (`unlink`), or an
    /// empty directory (`rmdir`, `want_dir`).
    pub async fn remove(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> Result<(), FsError> {
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        if name == b"." {
            return Err(FsError::Invalid("rmdir of .".into()));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        Self::check_name(name)?;
        let _hold = pool.txg.hold_builds();
        let (dir_object, mut dir_znode) = self.load_dir(parent).await?;
        let entry = dir::lookup(&self.objects, &dir_object, dir_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let (object, znode) = self.load(entry.object).await?;
        match (want_dir, znode.is_dir()) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) if znode.entries > 0 => return Err(FsError::NotEmpty),
            _ => {}
        }
        refuse_if_fixed(&dir_znode, "removal from the directory")?;
        refuse_if_fixed(&znode, "removal")?;
        change
            .remove_entry(&dir_object, dir_znode.hash_salt, name)
            .await?;
        let time = now();
        dir_znode.entries -= 1;
        if znode.is_dir() {
            dir_znode.nlink -= 1;
        }
        dir_znode.mtime = time;
        dir_znode.ctime = time;
        change.save(&dir_object, &dir_znode);
        self.drop_link(&change, pool, &object, znode, time).await
    }

    /// One name of `object` is gone: its link count drops, and at zero it
    /// is freed, unless an open handle or the kernel holds it: then it
    /// stays, with no links, until the last one lets go
    /// ([`Filesystem::release`], [`Filesystem::forgotten`]); an import
    /// frees what a crash left so ([`Filesystem::reclaim_unlinked`]).
    async fn drop_link(
        &self,
        change: &Change<'_>,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        mut znode: Znode,
        time: Timestamp,
    ) -> Result<(), FsError> {
        znode.nlink = if znode.is_dir() { 0 } else { znode.nlink - 1 };
        znode.ctime = time;
        if znode.nlink > 0 {
            change.save(object, &znode);
            return Ok(());
        }
        if self.is_held(object.id) {
            change.save(object, &znode);
            self.orphans.borrow_mut().insert(object.id);
            return Ok(());
        }
        self.free_object(pool, object).await
    }

    /// Renames `parent`/`name` to `new_parent`/`new_name`, atomically; with
    /// `RENAME_NOREPLACE` fails if the target exists; with
    /// `RENAME_EXCHANGE` swaps the two (both must exist).
    pub async fn rename(
        &self,
        pool: &Rc<Pool>,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        let _room = self.claim_name_room(pool, 0).await?;
        let change = self.logged_change(pool).await;
        self.check_writable(pool)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(FsError::Invalid(format!("rename flags {flags:#x}")));
        }
        Self::check_name(name)?;
        Self::check_name(new_name)?;
        let _hold = pool.txg.hold_builds();
        let (from_dir, mut from_znode) = self.load_dir(parent).await?;
        let (to_dir, mut to_znode) = if new_parent == parent {
            (from_dir.clone(), from_znode)
        } else {
            self.load_dir(new_parent).await?
        };
        let source = dir::lookup(&self.objects, &from_dir, from_znode.hash_salt, name)
            .await?
            .ok_or(FsError::NotFound)?;
        let target = dir::lookup(&self.objects, &to_dir, to_znode.hash_salt, new_name).await?;
        if parent == new_parent && name == new_name {
            return Ok(());
        }
        let (source_object, mut source_znode) = self.load(source.object).await?;
        refuse_if_fixed(&from_znode, "rename out of the directory")?;
        refuse_if_immutable(&to_znode, "rename into the directory")?;
        refuse_if_fixed(&source_znode, "rename")?;
        if parent != new_parent {
            check_project_move(&to_znode, &source_znode)?;
        }
        // A directory may not move under itself.
        if source_znode.is_dir() && parent != new_parent {
            self.check_not_ancestor(source.object, new_parent).await?;
        }
        let time = now();
        if flags & RENAME_EXCHANGE != 0 {
            let target = target.ok_or(FsError::NotFound)?;
            let (target_object, mut target_znode) = self.load(target.object).await?;
            refuse_if_fixed(&target_znode, "rename")?;
            refuse_if_fixed(&to_znode, "rename out of the directory")?;
            if parent != new_parent {
                check_project_move(&from_znode, &target_znode)?;
            }
            if target_znode.is_dir() && parent != new_parent {
                self.check_not_ancestor(target.object, parent).await?;
            }
            let (source_target, target_target) =
                ((source.object, source.kind), (target.object, target.kind));
            change
                .set_entry(&from_dir, (from_znode.hash_salt, name), target_target, true)
                .await?;
            change
                .set_entry(&to_dir, (to_znode.hash_salt, new_name), source_target, true)
                .await?;
            if parent != new_parent {
                // Every object records the directory it was last named in,
                // as OpenZFS's SA parent: a directory's `..`, and the path
                // `diff` shows for any of them.
                source_znode.parent = new_parent;
                target_znode.parent = parent;
                if source_znode.is_dir() {
                    from_znode.nlink -= 1;
                    to_znode.nlink += 1;
                }
                if target_znode.is_dir() {
                    to_znode.nlink -= 1;
                    from_znode.nlink += 1;
                }
            }
            source_znode.ctime = time;
            target_znode.ctime = time;
            change.save(&source_object, &source_znode);
            change.save(&target_object, &target_znode);
        } else {
            let moving = (source.object, source.kind);
            if let Some(target) = &target {
                if flags & RENAME_NOREPLACE != 0 {
                    return Err(FsError::Exists);
                }
                if target.object == source.object {
                    // Two names of one file: POSIX says do nothing.
                    return Ok(());
                }
                let (target_object, target_znode) = self.load(target.object).await?;
                refuse_if_fixed(&target_znode, "replacing it by a rename")?;
                refuse_if_fixed(&to_znode, "replacing a name in the directory")?;
                match (source_znode.is_dir(), target_znode.is_dir()) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if target_znode.entries > 0 => return Err(FsError::NotEmpty),
                    _ => {}
                }
                let salt = to_znode.hash_salt;
                change
                    .set_entry(&to_dir, (salt, new_name), moving, true)
                    .await?;
                if target_znode.is_dir() {
                    to_znode.nlink -= 1;
                }
                to_znode.entries -= 1;
                self.drop_link(&change, pool, &target_object, target_znode, time)
                    .await?;
            } else {
                let salt = to_znode.hash_salt;
                change
                    .set_entry(&to_dir, (salt, new_name), moving, false)
                    .await?;
            }
            change
                .remove_entry(&from_dir, from_znode.hash_salt, name)
                .await?;
            // In one directory the name moved (replacing a target already
            // counted above); between two, an entry moves across.
            if parent != new_parent {
                from_znode.entries -= 1;
                to_znode.entries += 1;
                source_znode.parent = new_parent;
                if source_znode.is_dir() {
                    from_znode.nlink -= 1;
                    to_znode.nlink += 1;
                }
            }
            source_znode.ctime = time;
            change.save(&source_object, &source_znode);
        }
        from_znode.mtime = time;
        from_znode.ctime = time;
        to_znode.mtime = time;
        to_znode.ctime = time;
        if parent == new_parent {
            // `to_znode` carries every change made to the one directory.
            change.save(&to_dir, &to_znode);
        } else {
            change.save(&from_dir, &from_znode);
            change.save(&to_dir, &to_znode);
        }
        Ok(())
    }

    /// Fails if directory `moving` is `dir` or one of its ancestors.
    async fn check_not_ancestor(&self, moving: u64, dir: u64) -> Result<(), FsError> {
        let mut current = dir;
        let root = self.root();
        // Bounded by the depth of the tree; a loop (damage) is cut off.
        for _ in 0..=self.header.get().next_object {
            if current == moving {
                return Err(FsError::Invalid(
                    "a directory cannot move into itself".into(),
                ));
            }
            if current == root {
                return Ok(());
            }
            current = self.load(current).await?.1.parent;
        }
        Err(FsError::Corrupt(format!(
            "{}: directory parents loop",
            self.name()
        )))
    }

    /// Entries of directory `ino` from directory offset `offset` on (0:
    /// from the start, with `.` and `..` at 1 and 2), at most `max`. Each
    /// comes with the offset to continue after it: a positive 63-bit value
    /// (`fsdir::offset_of_cookie`), as `telldir` and `seekdir` need, that
    /// stays valid across changes to the directory.
    pub async fn readdir(
        &self,
        ino: u64,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(u64, DirEntry)>, FsError> {
        let cookie = fsdir::cookie_of_offset(offset);
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load_dir(ino).await?;
        let mut out = Vec::new();
        let dot = |name: &[u8], object: u64| DirEntry {
            cookie: 0,
            object,
            kind: fsdir::DT_DIR,
            name: name.to_vec(),
        };
        if cookie == 0 && out.len() < max {
            out.push((1, dot(b".", ino)));
        }
        if cookie <= 1 && out.len() < max {
            out.push((2, dot(b"..", znode.parent)));
        }
        let from = cookie.max(fsdir::COOKIE_FIRST);
        let room = max - out.len();
        if room > 0 {
            for entry in dir::list(&self.objects, &object, from, room).await? {
                out.push((fsdir::offset_of_cookie(entry.cookie + 1), entry));
            }
        }
        Ok(out)
    }

    /// Changes attributes; a new size truncates or extends (with zeros).
    pub async fn setattr(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        change: SetAttr,
    ) -> Result<Attr, FsError> {
        if let Some(size) = change.size {
            self.free_ahead_of_truncate(pool, ino, size).await?;
        }
        let guard = self.logged_change(pool).await;
        self.check_writable(pool)?;
        let (object, mut znode) = self.load(ino).await?;
        let old_mode = znode.mode;
        refuse_if_immutable(&znode, "change of its attributes")?;
        // Append-only: only the times may be set to now (`touch`).
        if change.mode.is_some()
            || change.uid.is_some()
            || change.gid.is_some()
            || (change.size.is_some() && !change.allocating)
            || change.explicit_times
        {
            refuse_if_fixed(&znode, "change of its attributes")?;
        }
        let time = now();
        if let Some(size) = change.size {
            if znode.is_dir() {
                return Err(FsError::IsDir);
            }
            if !znode.is_regular() {
                return Err(FsError::Invalid("size of a special file".into()));
            }
            if size > FILE_SIZE_MAX_BYTES {
                return Err(FsError::TooBig);
            }
            self.truncate(pool, &object, size).await?;
            znode.mtime = time;
        }
        if let Some(mode) = change.mode {
            znode.mode = (znode.mode & S_IFMT) | (mode & 0o7777);
        }
        let owners = (znode.uid, znode.gid);
        if let Some(uid) = change.uid {
            znode.uid = uid;
        }
        if let Some(gid) = change.gid {
            znode.gid = gid;
        }
        if owners != (znode.uid, znode.gid) {
            self.note_owner_change(
                &super::id_space::znode_owners(&znode)[..2],
                object.dnode().used_bytes,
            );
        }
        if change.drop_setid {
            znode.mode = without_setid(znode.mode);
        }
        if let Some(atime) = change.atime {
            znode.atime = atime;
        }
        if let Some(mtime) = change.mtime {
            znode.mtime = mtime;
        }
        znode.ctime = change.ctime.unwrap_or(time);
        // A chmod of a file with an access ACL changes the ACL too.
        if (old_mode ^ znode.mode) & 0o777 != 0 && self.posix_acls() && znode.xattr_object != 0 {
            let mut list = self.xattr_list(&znode).await?;
            if Self::chmod_acl(&mut list, znode.mode)? {
                let znode = self
                    .store_xattrs(&guard, pool, &object, znode, &list)
                    .await?;
                return Ok(Self::attr(&object, znode));
            }
        }
        guard.save(&object, &znode);
        Ok(Self::attr(&object, znode))
    }

    /// The target of symbolic link `ino`.
    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let _shared = self.lock.acquire(1).await;
        let (object, znode) = self.load(ino).await?;
        if !znode.is_symlink() {
            return Err(FsError::Invalid("not a symbolic link".into()));
        }
        let size = object.length_bytes();
        let usage = self.settings.get().data_cache_use();
        self.read_locked(&object, 0, size as usize, usage).await
    }
}
