//! The lives of a filesystem's objects: the kernel's holds on them
//! (sessions, opens, forgets), removed objects freed when the last hold
//! goes, their blocks freed a slice at a time, and the walk over live
//! objects.

use std::rc::Rc;

use super::holds::{Hold, SessionId};
use super::{
    table_dnode_space, Filesystem, FsError, ObjectWalk, FREE_BLOCKS_PER_TURN, OBJECTS_PER_TURN,
};
use crate::format::dnode::DNODE_BYTES;
use crate::format::sealed_bonus::SealedBonus;
use crate::format::znode::{FsSpace, Znode};
use crate::format::{BlockPointer, ObjectType};
use crate::object::{Object, ObjectError};
use crate::pool::Pool;

impl Filesystem {
    /// Whether an open handle or a kernel holds object `ino`, in any mount
    /// session.
    pub(super) fn is_held(&self, ino: u64) -> bool {
        self.holds.is_held(ino)
    }

    /// A mount session begins (a FUSE connection): the holds it takes are
    /// its own, and its end lets go of them alone.
    pub fn begin_session(&self) -> SessionId {
        self.holds.begin()
    }

    /// `session`'s kernel was handed node `ino` once more (an entry reply:
    /// LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK).
    pub fn remembered(&self, session: SessionId, ino: u64) {
        if !self.snapshot {
            self.holds.take(session, Hold::Kernel, ino);
        }
    }

    /// `session`'s kernel let go of `count` of its references to node `ino`
    /// (FORGET, or an entry reply it never took); the last hold of any
    /// session on an object with no names left frees it.
    pub async fn forgotten(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        ino: u64,
        count: u64,
    ) -> Result<(), FsError> {
        self.let_go(pool, session, Hold::Kernel, ino, count).await
    }

    /// `session` lets go of `count` holds of `kind` on `ino`; when they
    /// were its last, the object is freed if it has no names left and no
    /// other hold.
    async fn let_go(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        kind: Hold,
        ino: u64,
        count: u64,
    ) -> Result<(), FsError> {
        if !self.holds.let_go(session, kind, ino, count) {
            return Ok(());
        }
        self.free_if_orphan(pool, ino).await
    }

    /// Mount session `session` ended (unmounted, or the server stops): the
    /// nodes its kernel held and the handles it had open are let go, and
    /// the objects among them with no names left that no other session
    /// holds are freed now rather than at the next import.
    pub async fn session_ended(&self, pool: &Rc<Pool>, session: SessionId) -> Result<(), FsError> {
        self.holds.end(session);
        let mut orphans: Vec<u64> = self.orphans.borrow().iter().copied().collect();
        orphans.sort_unstable();
        for ino in orphans {
            self.free_if_orphan(pool, ino).await?;
        }
        Ok(())
    }

    /// Frees object `ino` if it has no names left and nothing holds it any
    /// more; anything else returns at once, without the lock.
    ///
    /// A file's blocks become holes [`FREE_BLOCKS_PER_TURN`] at a time,
    /// each slice under the lock and with builds held off, and the lock let
    /// go between slices: nothing else can reach the object (no name, no
    /// handle, no node the kernel holds, and the mount offers no handles to
    /// open by), so only the filesystem's other files gain. A crash part
    /// way leaves a file with no links, which the next import frees
    /// ([`Filesystem::reclaim_unlinked`]).
    async fn free_if_orphan(&self, pool: &Rc<Pool>, ino: u64) -> Result<(), FsError> {
        if self.snapshot || !self.orphans.borrow().contains(&ino) {
            return Ok(());
        }
        let mut claimed = false;
        // Blocks below this are holes already.
        let mut next = 0;
        loop {
            let change = self.logged_change(pool).await;
            // Opened or handed to the kernel again while this waited (only
            // before it is claimed: a claimed orphan is this task's alone).
            if !claimed && (self.is_held(ino) || !self.orphans.borrow_mut().remove(&ino)) {
                return Ok(());
            }
            claimed = true;
            if self.is_retired() {
                return Ok(());
            }
            let hold = pool.txg.hold_builds();
            let (object, znode) = match self.load(ino).await {
                Ok(loaded) => loaded,
                Err(FsError::NotFound) => return Ok(()),
                Err(error) => return Err(error),
            };
            if znode.nlink != 0 {
                return Ok(());
            }
            let dnode = object.dnode();
            let end = dnode.length_bytes.div_ceil(dnode.data_block_bytes());
            if znode.is_regular() && next < end {
                next = self.punch_slice(pool, &object, next, end).await?;
                drop(hold);
                drop(change);
                pool.spill_dead(&self.table);
                crate::rt::yield_now().await;
                continue;
            }
            return self.free_object(pool, &object).await;
        }
    }

    /// Turns blocks `first..end` of `object` into holes, a slice at a time
    /// ([`Filesystem::punch_slice`]), turning the engine's loop between
    /// slices: other datasets' requests are served meanwhile (this
    /// filesystem's, when the caller holds its lock, wait for it).
    pub(super) async fn punch_range(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let mut blkid = first;
        while blkid < end {
            blkid = self.punch_slice(pool, object, blkid, end).await?;
            if blkid < end {
                crate::rt::yield_now().await;
            }
        }
        Ok(())
    }

    /// Turns the blocks of `object` from `first` on into holes, up to
    /// [`FREE_BLOCKS_PER_TURN`] of them (holes met on the way cost little:
    /// a hole high in the tree is passed whole). A directory's blocks are
    /// punched as its own code does; a file's, or an extended attribute
    /// object's, get a hole linked. Returns the block after the last one
    /// looked at: `end` once none is left before it.
    pub(super) async fn punch_slice(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
        first: u64,
        end: u64,
    ) -> Result<u64, FsError> {
        let mut blkid = first;
        let mut punched = 0;
        let object_type = object.dnode.borrow().object_type;
        while blkid < end && punched < FREE_BLOCKS_PER_TURN {
            let span = self.objects.hole_span(object, blkid).await?;
            if span > 0 {
                blkid = blkid.saturating_add(span);
                continue;
            }
            if object_type == ObjectType::FsDirectory {
                self.objects.punch(object, blkid).await?;
            } else {
                let hole = BlockPointer::hole(0, object_type, 0);
                self.link_block(pool, object, blkid, hole).await?;
            }
            punched += 1;
            blkid += 1;
        }
        Ok(blkid.min(end))
    }

    /// `session` opened a handle to file `ino`.
    pub fn opened(&self, session: SessionId, ino: u64) {
        // A snapshot's files are read-only and freed with it.
        if !self.snapshot {
            self.holds.take(session, Hold::Open, ino);
        }
    }

    /// `session` released a handle to file `ino`; the last hold of any
    /// session on a file with no names left frees it.
    pub async fn release(
        &self,
        pool: &Rc<Pool>,
        session: SessionId,
        ino: u64,
    ) -> Result<(), FsError> {
        if self.snapshot {
            // Read-only: a snapshot's file with no names is freed with it.
            return Ok(());
        }
        self.let_go(pool, session, Hold::Open, ino, 1).await
    }

    /// The next object in use of a walk of the filesystem's objects (its
    /// dnode table excluded) in object order, one loaded at a time (what
    /// is loaded past `fs_objects_loaded_max` goes as the walk opens more);
    /// None at the end. Turns the engine's loop every
    /// [`OBJECTS_PER_TURN`] object numbers: opening the 100k objects of a
    /// filesystem in one go held every client of the pool for 0.12 s.
    pub(in crate::pool) async fn next_object(
        &self,
        walk: &mut ObjectWalk,
    ) -> Result<Option<Rc<Object>>, ObjectError> {
        loop {
            // Numbers come from the header's counter, read each time: the
            // table grows only when a txg writes new dnodes into it.
            if walk.next >= self.header.get().next_object {
                return Ok(None);
            }
            let ino = walk.next;
            walk.next += 1;
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            match self.objects.open(ino).await {
                Ok(object) => return Ok(Some(object)),
                Err(ObjectError::NoSuchObject(_)) => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Every object of the filesystem in use (its dnode table excluded), in
    /// object order.
    pub(in crate::pool) async fn live_objects(&self) -> Result<Vec<Rc<Object>>, ObjectError> {
        let mut walk = ObjectWalk::default();
        let mut objects = Vec::new();
        while let Some(object) = self.next_object(&mut walk).await? {
            objects.push(object);
        }
        Ok(objects)
    }

    /// Frees the files a crash left unlinked but not yet freed (open when
    /// their last name went). Run at import, before anything is served,
    /// and by a rollback (to a snapshot taken while one was open), which
    /// holds txg builds off meanwhile.
    ///
    /// Dnodes are peeked, not loaded: an import loads only the files it
    /// frees, not every file (which held them all in memory at once, past
    /// the `fs_objects_loaded_max` bound: about 1.4 GB for a million).
    /// An encrypted filesystem's whose key is not loaded are left for the
    /// key's load ([`Filesystem::orphans_sealed`]).
    pub(in crate::pool) async fn reclaim_unlinked(&self, pool: &Rc<Pool>) -> Result<u64, FsError> {
        let mut freed = 0;
        let mut sealed = false;
        for ino in 1..self.header.get().next_object {
            if ino.is_multiple_of(OBJECTS_PER_TURN) {
                crate::rt::yield_now().await;
            }
            let Some(dnode) = self.objects.peek_dnode(ino).await? else {
                continue;
            };
            // A directory too: removed while the kernel held it.
            if !matches!(
                dnode.object_type,
                ObjectType::FsFile | ObjectType::FsDirectory
            ) {
                continue;
            }
            match Znode::decode(&dnode.bonus) {
                Ok(znode) if znode.nlink == 0 => {
                    let object = self.objects.open(ino).await?;
                    self.free_object(pool, &object).await?;
                    freed += 1;
                }
                // Freeing it needs its attributes (its extended attributes'
                // object): when its key is loaded.
                Err(_)
                    if SealedBonus::decode(&dnode.bonus)
                        .is_ok_and(|sealed| sealed.is_some_and(|sealed| sealed.no_names)) =>
                {
                    sealed = true;
                }
                _ => {}
            }
        }
        self.orphans_sealed.set(sealed);
        Ok(freed)
    }

    /// Frees every block of `object` and clears its dnode, and so for the
    /// object holding its extended attributes. The caller holds txg builds
    /// off (a build meanwhile would sync the object's dirty nodes, freeing
    /// their old copies under the pointers collected here).
    pub(super) async fn free_object(
        &self,
        pool: &Rc<Pool>,
        object: &Rc<Object>,
    ) -> Result<(), FsError> {
        let dnode = object.dnode();
        if dnode.object_type != ObjectType::FsXattr {
            if let Ok(znode) = Znode::decode(&dnode.bonus) {
                if znode.xattr_object != 0 {
                    let xattrs = self.load_xattr_object(znode.xattr_object).await?;
                    Box::pin(self.free_object(pool, &xattrs)).await?;
                }
            }
        }
        let mut pointers = Vec::new();
        self.objects
            .visit_pointers(object, &mut |_, _, pointer| pointers.push(*pointer))
            .await?;
        for pointer in &pointers {
            self.objects.kill(object, pointer);
        }
        // Its dnode leaves the table now, with the figures the table held
        // for it (the sums are of the table, not of objects in memory): read
        // and cleared with no wait between, so no txg build comes between.
        let offset = object.id * DNODE_BYTES as u64;
        self.objects
            .prefetch(&self.table, offset, DNODE_BYTES as u64)
            .await?;
        let mut space = self.header.get().space;
        if let Some(space) = space.as_mut() {
            let old = table_dnode_space(&self.objects, &self.table, object.id)?;
            space.replace(old, FsSpace::default());
        }
        self.objects.clear_dnode_cached(object.id)?;
        self.set_space(space);
        self.behind.forget(object.id);
        let mut header = self.header.get();
        header.objects -= 1;
        self.set_header(header);
        self.log.note_reshaped();
        // Freeing a file frees the object holding its extended attributes.
        if dnode.object_type != ObjectType::FsXattr {
            self.log.note_object(object.id, pool.txg.open(), None);
        }
        Ok(())
    }
}
