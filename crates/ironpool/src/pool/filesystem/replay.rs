//! What the intent log's replay applies to a filesystem: blocks, attributes,
//! objects, entries and frees, after a crash, before the filesystem is served.

use std::rc::Rc;

use super::{
    dir, Filesystem, FsError, FILE_BLOCK_SHIFT_MIN, FILE_SIZE_MAX_BYTES, OBJECTS_MAX,
    RECORD_BYTES_MAX,
};
use crate::format::intent_log::{EntryTarget, ObjectState};
use crate::format::sealed_bonus::is_sealed;
use crate::format::znode::{Timestamp, Znode};
use crate::format::{BlockPointer, ObjectType};
use crate::object::ObjectError;
use crate::pool::data::release_unlinked;
use crate::pool::dataset::intent_log::FileAttr;
use crate::pool::Pool;

impl Filesystem {
    /// Replay of the intent log: links `pointer` (its space claimed by
    /// replay; committed by an import's claim, when `claimed`), or a hole,
    /// as block `blkid` of file (or link) `ino`. Refused, the space let go
    /// (freed, when `claimed`), when it is neither or its blocks are not
    /// that size (an object record set the block size first).
    pub(in crate::pool) async fn replay_block(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        blkid: u64,
        pointer: BlockPointer,
        claimed: bool,
    ) -> Result<(), FsError> {
        let release = |error: FsError| {
            match claimed {
                true => pool.store.free(&pointer),
                false => release_unlinked(pool, &pointer),
            }
            Err(error)
        };
        let object = match self.load_object(ino).await {
            Ok(object) => object,
            Err(error) => return release(error),
        };
        let dnode = object.dnode();
        // A symbolic link's target is its one block. Attributes sealed
        // (the key not loaded at import): files and links are of one type.
        let file = if is_sealed(&dnode.bonus) {
            dnode.object_type == ObjectType::FsFile
        } else {
            Znode::decode(&dnode.bonus).is_ok_and(|znode| znode.is_regular() || znode.is_symlink())
        };
        if !file {
            return release(FsError::Corrupt("not a file or link".into()));
        }
        let block = object.data_block_bytes();
        if (!pointer.is_hole() && u64::from(pointer.logical_size) != block)
            || blkid.saturating_mul(block) >= FILE_SIZE_MAX_BYTES
        {
            return release(FsError::Corrupt(format!(
                "a block of {} bytes at {blkid}, the file's are {block}",
                pointer.logical_size
            )));
        }
        match claimed {
            true => self.link_claimed(pool, &object, blkid, pointer).await?,
            false => self.link_block(pool, &object, blkid, pointer).await?,
        };
        Ok(())
    }

    /// Replay of the intent log: writes a copied block's bytes to new space
    /// (a hole for zeros), to be linked by [`Filesystem::replay_block`].
    pub(in crate::pool) async fn replay_store(
        &self,
        pool: &Rc<Pool>,
        data: &[u8],
    ) -> Result<BlockPointer, FsError> {
        self.write_block(pool, data, ObjectType::FsFile).await
    }

    /// Replay of the intent log: sets file `ino`'s size and times as a
    /// logged write left them. When its attributes are sealed (an encrypted
    /// filesystem imported without its key), or its times are sealed and
    /// the key is not loaded, the size is set and the times returned: the
    /// pool keeps them until the key is loaded
    /// ([`Filesystem::set_replayed_times`]).
    pub(in crate::pool) async fn replay_attr(
        &self,
        ino: u64,
        attr: &FileAttr,
    ) -> Result<Option<FileAttr>, FsError> {
        let object = self.load_object(ino).await?;
        // The attributes in the clear (None: sealed, the key not loaded);
        // decoded and saved with no await between.
        let bonus = object.dnode().bonus;
        let znode = match is_sealed(&bonus) {
            true => None,
            false => Some(Znode::decode(&bonus).map_err(|error| {
                FsError::Corrupt(format!("{} object {ino}: {error}", self.name()))
            })?),
        };
        let regular = znode.map_or(object.object_type() == ObjectType::FsFile, |znode| {
            znode.is_regular()
        });
        if attr.length > FILE_SIZE_MAX_BYTES || !regular {
            return Err(FsError::Corrupt("not a regular file, or too large".into()));
        }
        // The size whatever the times (they may be kept, or fail their MAC).
        object.dnode.borrow_mut().length_bytes = attr.length;
        object.dirty.set(true);
        let key = self.data_key().ok().flatten();
        let Some(mut znode) = znode.filter(|_| attr.sealed.is_none() || key.is_some()) else {
            return Ok(Some(*attr));
        };
        let (mtime, ctime) = self.times_of(ino, attr, key.as_deref())?;
        znode.mtime = mtime;
        znode.ctime = ctime;
        Self::save(&object, &znode);
        Ok(None)
    }

    /// The times of file `ino` an attribute record `attr` carries: opened
    /// with `key` when sealed (their MAC checked).
    pub(in crate::pool) fn times_of(
        &self,
        ino: u64,
        attr: &FileAttr,
        key: Option<&crate::crypto::DatasetKey>,
    ) -> Result<(Timestamp, Timestamp), FsError> {
        let Some(sealed) = &attr.sealed else {
            return Ok((attr.mtime, attr.ctime));
        };
        let key = key.ok_or_else(|| {
            FsError::Pool(crate::pool::PoolError::KeyUnavailable(format!(
                "{}: file {ino}: its times are sealed and its key is not loaded",
                self.name()
            )))
        })?;
        crate::crypto::open_times(key, ino, attr.txg, attr.length, sealed).map_err(|error| {
            FsError::Corrupt(format!(
                "{}: file {ino}: the times its intent log kept: {error}",
                self.name()
            ))
        })
    }

    /// Sets the times of file `ino` that a replay without its key kept
    /// ([`Filesystem::replay_attr`]): its key is loaded now. Times newer
    /// than these (a change since) stay.
    pub(in crate::pool) async fn set_replayed_times(
        &self,
        ino: u64,
        attr: &FileAttr,
    ) -> Result<(), FsError> {
        let key = self.data_key().map_err(FsError::Pool)?;
        let (mtime, ctime) = self.times_of(ino, attr, key.as_deref())?;
        let (object, mut znode) = self.load(ino).await?;
        if znode.ctime > ctime {
            return Ok(());
        }
        znode.mtime = mtime;
        znode.ctime = ctime;
        Self::save(&object, &znode);
        Ok(())
    }

    /// Replay of the intent log: makes object `ino` (a file, directory or
    /// link) what a logged change of names or attributes left it: created
    /// if it does not exist (a new directory with no entries: its entries
    /// have records of their own), with its attributes, size and block
    /// size. The object holding its extended attributes stays as it is
    /// (their changes have records of their own).
    pub(in crate::pool) async fn replay_object(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
        state: &ObjectState,
    ) -> Result<(), FsError> {
        let is_dir = state.znode.is_dir();
        let shift_max = RECORD_BYTES_MAX.trailing_zeros() as u8;
        if ino == 0
            || ino >= OBJECTS_MAX
            || ino == self.root() && !is_dir
            || !(FILE_BLOCK_SHIFT_MIN..=shift_max).contains(&state.block_shift)
            || state.length > FILE_SIZE_MAX_BYTES
        {
            return Err(FsError::Corrupt("an object state out of range".into()));
        }
        let (object, xattr_object) = match self.objects.open(ino).await {
            Ok(object) => {
                let dnode = object.dnode();
                let kind = if is_dir {
                    ObjectType::FsDirectory
                } else {
                    ObjectType::FsFile
                };
                if dnode.object_type != kind {
                    return Err(FsError::Corrupt(format!(
                        "a {kind:?} state for a {:?} object",
                        dnode.object_type
                    )));
                }
                let xattr_object = Znode::decode(&dnode.bonus).map_or(0, |old| old.xattr_object);
                (object, xattr_object)
            }
            Err(ObjectError::NoSuchObject(_)) => {
                self.keep_number(ino);
                let mut header = self.header.get();
                header.objects += 1;
                self.set_header(header);
                let object = self.new_object(pool, ino, is_dir, &state.znode);
                if is_dir {
                    dir::init(&self.objects, &object).await?;
                } else {
                    object.dnode.borrow_mut().data_block_shift = state.block_shift;
                }
                (object, 0)
            }
            Err(error) => return Err(error.into()),
        };
        if !is_dir {
            let dnode = object.dnode();
            if dnode.data_block_shift != state.block_shift {
                // The file's one block grew: the new block has a record.
                if dnode.levels != 1 || dnode.data_block_shift > state.block_shift {
                    return Err(FsError::Corrupt(format!(
                        "blocks of {} bytes for a file of {}",
                        1u64 << state.block_shift,
                        dnode.data_block_bytes()
                    )));
                }
                let hole = BlockPointer::hole(0, ObjectType::FsFile, 0);
                self.replace_only_block(pool, &object, state.block_shift, state.length, hole)?;
            }
            object.dnode.borrow_mut().length_bytes = state.length;
        }
        let mut znode = state.znode;
        znode.xattr_object = xattr_object;
        Self::save(&object, &znode);
        Ok(())
    }

    /// Replay met these object numbers: the header's counter passes them.
    pub(in crate::pool) fn replay_keep_numbers(&self, numbers: impl Iterator<Item = u64>) {
        for ino in numbers {
            self.keep_number(ino);
        }
    }

    /// Replay met object number `ino`: the header's counter passes it, so it
    /// is not handed out again.
    fn keep_number(&self, ino: u64) {
        let mut header = self.header.get();
        if ino < OBJECTS_MAX && header.next_object <= ino {
            header.next_object = ino + 1;
            self.set_header(header);
        }
    }

    /// Replay of the intent log: makes entry `name` of directory `dir` name
    /// `target` (None: removes it), with the cookie it had.
    pub(in crate::pool) async fn replay_entry(
        &self,
        dir: u64,
        name: &[u8],
        target: Option<EntryTarget>,
    ) -> Result<(), FsError> {
        let (dir_object, dir_znode) = match self.load_dir(dir).await {
            Ok(loaded) => loaded,
            // Removed from a directory freed since.
            Err(FsError::NotFound) if target.is_none() => return Ok(()),
            Err(error) => return Err(error),
        };
        let salt = dir_znode.hash_salt;
        dir::remove(&self.objects, &dir_object, salt, name).await?;
        if let Some(target) = target {
            dir::insert(
                &self.objects,
                &dir_object,
                salt,
                name,
                (target.object, target.kind),
                Some(target.cookie),
            )
            .await?;
        }
        Ok(())
    }

    /// Replay of the intent log: frees object `ino` (if it exists), as its
    /// last name going did. Its number is not handed out again.
    pub(in crate::pool) async fn replay_free(
        &self,
        pool: &Rc<Pool>,
        ino: u64,
    ) -> Result<(), FsError> {
        self.keep_number(ino);
        match self.objects.open(ino).await {
            Ok(object) if ino != self.root() => self.free_object(pool, &object).await,
            Ok(_) => Err(FsError::Corrupt("the root freed".into())),
            Err(ObjectError::NoSuchObject(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}
