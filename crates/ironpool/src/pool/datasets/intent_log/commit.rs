//! Commits of the intent log: a volume's FLUSH and a filesystem's `fsync`
//! (group commit, log writes in flight, copies of small blocks), moving a
//! chain off a log device, and quiescing or discarding chains.

use std::rc::Rc;

use crate::format::intent_log::{
    self as format, LogBlockHeader, LogPointer, LogRecord, LOG_BLOCK_BYTES_MIN,
};
use crate::format::Dva;
use crate::pool::dataset::directory::LogHead;
use crate::pool::dataset::intent_log::{
    block_record, block_size_for, record_txg, Commit, FileAttr, InFlightEnd, LogWrite, WrittenCopy,
    COMMIT_BLOCKS_MAX, COPY_BLOCK_BYTES_MAX, COPY_BYTES_PER_COMMIT_MAX,
};
use crate::pool::dataset::props::LogBias;
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::pool::Owner;
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};

impl Pool {
    /// Allocates a log block of `bytes` and records it as used from the open
    /// txg on (so a durable head or block pointing at it points at space the
    /// durable space maps hold, or that replay claims).
    fn allocate_log_block(&self, bytes: u32) -> Result<LogPointer, PoolError> {
        let dva = self
            .store
            .allocate_log(bytes as u64)
            .map_err(|_| PoolError::NoSpace)?;
        Ok(LogPointer { dva, bytes })
    }

    /// Returns log blocks' space once txg `txg` (which stopped naming them)
    /// is past the defer depth.
    pub(in crate::pool) fn release_log_blocks_after(
        &self,
        txg: u64,
        blocks: impl IntoIterator<Item = LogPointer>,
    ) {
        let mut releases = self.log_releases.0.borrow_mut();
        releases.extend(blocks.into_iter().map(|pointer| (txg, pointer)));
    }

    /// Starts a new chain for `owner`: its head block is allocated and named
    /// in the directory, usable once the open txg is durable.
    pub(in crate::pool) fn start_log_chain(&self, owner: Owner) -> Result<(), PoolError> {
        let head = self.allocate_log_block(LOG_BLOCK_BYTES_MIN as u32)?;
        let guid = crate::format::new_guid();
        owner.log().begin_chain(guid, head, self.txg.open());
        self.set_log_head(owner, Some(LogHead::at(guid, 1, head)));
        Ok(())
    }

    /// Whether `owner`'s chain can take a commit now: it has one, and the
    /// txg naming its head is durable. A dataset without one starts it here
    /// (usable once the open txg is durable); until then, and on a pool too
    /// full for its head block, commits go through a txg.
    fn chain_usable(&self, owner: Owner) -> bool {
        let log = owner.log();
        // A claimed chain waits for its replay: no new one replaces it.
        if log.is_claimed() {
            return false;
        }
        let usable = log.usable_next(self.txg.durable()).is_some();
        if !log.has_chain() {
            let _ = self.start_log_chain(owner);
        }
        usable
    }

    /// Names `head` as where `owner`'s log starts (None: it has none), in
    /// the directory the open or building txg writes.
    pub(in crate::pool) fn set_log_head(&self, owner: Owner, head: Option<LogHead>) {
        let mut directory = self.datasets.directory.edit();
        let slot = match owner {
            Owner::Volume(volume) => directory
                .volumes
                .get_mut(&volume.short_name())
                .map(|record| &mut record.intent_log),
            Owner::Filesystem(fs) => directory
                .filesystems
                .get_mut(&fs.short_name())
                .map(|record| &mut record.intent_log),
        };
        if let Some(slot) = slot {
            *slot = head;
        }
        drop(directory);
    }

    /// Starts the FLUSH that `volume`'s client is about to send, once its
    /// WRITE is answered: when the client has flushed after every single
    /// write lately ([`crate::pool::dataset::intent_log::LOG_AHEAD_STREAK`] times) and this write's blocks
    /// would be copied into the log, the commit copying them starts now.
    /// Its log write then runs while the answer travels to the client and
    /// the FLUSH comes back, and the FLUSH finds its write logged and waits
    /// only for that commit to end. Without it, each write then FLUSH at
    /// QD1 pays the round trip and the durable log write one after the
    /// other. A client whose FLUSH does not come costs one log write of
    /// its held blocks (the streak ends at its next FLUSH), which a txg
    /// frees as it does any log block.
    ///
    /// Nothing is promised by it, so it never waits and never does more
    /// than that one log write: when the commit lock is taken or a commit
    /// is in flight, the chain is not usable or the blocks would not be
    /// copied, it does nothing; it never writes held blocks out or commits
    /// a txg, and when its log write fails, what it took goes back for the
    /// FLUSH, which commits again (through a txg if the chain failed).
    /// It outlives its WRITE's answer; [`Pool::export`] waits for it.
    pub async fn log_ahead(self: &Rc<Self>, volume: &Rc<Volume>) {
        if !volume.log.flush_expected()
            || volume.is_destroyed()
            || volume.settings().sync != crate::pool::dataset::props::SyncMode::Standard
            || volume.writeback.unlogged_bytes() == 0
            || !self.copy_fits(volume)
        {
            return;
        }
        let in_flight_max = self.tunables.borrow().log_commits_in_flight;
        let Some((permit, number)) = volume.log.try_begin_commit(in_flight_max) else {
            return;
        };
        // `commit_locked` checks that the pool takes writes and the chain is
        // usable, as for any commit, and returns at once if not.
        if let Ok(true) = self
            .commit_locked(volume, true, true, permit, Commit::Ahead)
            .await
        {
            volume.log.covered(number, true);
        }
    }

    /// Makes every change linked into `volume`'s tree so far durable, and
    /// with `held` (a FLUSH) every block the write-back holds for it too:
    /// through its intent log when it has a durable chain, else through a
    /// txg. (A FUA write linked its own blocks before calling this.)
    pub(crate) async fn log_commit(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
    ) -> Result<(), PoolError> {
        // Held blocks too many or too large to copy are written out before
        // the commit lock is taken, so that FLUSHes waiting for their blocks
        // wait together and share the commit that follows.
        let mut copy = held && self.copy_fits(volume);
        let (_commit, number) = loop {
            if held && !copy {
                self.drain_volume(volume).await?;
            }
            // Everything this caller needs is linked now, or (when its held
            // blocks are to be copied) held: a commit that starts after this
            // point covers it, whoever asked for it, if it logs what is
            // linked at its start, and for held blocks, if it also took
            // every block held at its start under the lock (a copying commit
            // does; one whose caller wrote its held blocks out before the
            // lock does not).
            let (wait_percent, in_flight_max) = {
                let tunables = self.tunables.borrow();
                (
                    tunables.log_group_wait_percent,
                    tunables.log_commits_in_flight,
                )
            };
            let Some((permit, number)) = volume
                .log
                .begin_commit(copy, wait_percent, in_flight_max)
                .await
            else {
                return Ok(());
            };
            if copy && !self.copy_fits(volume) {
                // More blocks were held while this caller waited for the
                // lock than a commit copies: they are written out after the
                // lock is let go, as above, not under it, where every
                // commit behind this one would wait for those writes too
                // (under `sync=always` at QD64, that wait was half of each
                // commit).
                drop(permit);
                copy = false;
                continue;
            }
            break (permit, number);
        };
        let result = self
            .commit_locked(volume, held, copy, _commit, Commit::Asked)
            .await;
        if result.is_ok() {
            volume.log.covered(number, copy);
        }
        result.map(|_| ())
    }

    /// A commit, under the volume's commit lock (`lock`): through the log
    /// when its chain is usable, else (or when writing the log fails)
    /// through a txg. The lock is let go once the commit's blocks are
    /// reserved in the chain, so the next commit can be prepared and
    /// written while this one's are. Returns whether everything linked
    /// (and with `copy`, held) at its start is durable: always, when it
    /// succeeds, for a commit that was asked for; for one started ahead
    /// ([`Commit::Ahead`]), only when it wrote its blocks (it neither waits
    /// on commits in flight nor falls back to a txg).
    async fn commit_locked(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
        copy: bool,
        lock: crate::rt::sync::Permit,
        kind: Commit,
    ) -> Result<bool, PoolError> {
        self.txg.ensure_writable()?;
        let owner = Owner::Volume(volume);
        if !self.chain_usable(owner) {
            return self.commit_instead(volume, held, kind).await;
        }
        let mut lock = Some(lock);
        let started = crate::rt::now();
        let commit = owner.log().open_commit();
        // Held blocks first: copied (the caller found they fit, under the
        // lock, with nothing awaited since), or written in place before the
        // lock (then linked, and logged below as pointers).
        let copies = match copy {
            true => self.copy_held_blocks(volume, commit),
            false => Vec::new(),
        };
        let durable = self.txg.durable();
        volume.log.forget_durable(durable);
        let unlogged = volume.log.take_unlogged();
        let mut records = Vec::with_capacity(unlogged.len() + copies.len());
        let mut max_txg = 0;
        for (object, blkid, linked_txg) in newest_changes(&unlogged, durable) {
            let pointer = match self.logged_pointer(owner, object, blkid).await {
                Ok(Some(pointer)) => pointer,
                Ok(None) => continue,
                Err(error) => {
                    owner.log().requeue_unlogged(&unlogged);
                    self.forget_commit(volume, commit, &copies);
                    return Err(error.into());
                }
            };
            if let Some(record) =
                block_record(object, blkid, linked_txg, pointer, self.txg.durable())
            {
                max_txg = max_txg.max(record_txg(&record));
                records.push(record);
            }
        }
        // Copies after the pointers: a held block's bytes are newer than
        // whatever its pointer held when they were taken (replay takes the
        // last record of a block).
        let copied = copies.len() as u64;
        records.extend(copies.iter().map(|(blkid, data)| LogRecord::Copy {
            object: volume.object.id,
            blkid: *blkid,
            data: data.to_vec(),
        }));
        let finished = self
            .finish_commit(
                owner, &mut lock, kind, commit, records, max_txg, copied, started,
            )
            .await;
        match finished {
            Finished::Durable => Ok(true),
            Finished::NotCarried => self.commit_instead(volume, held, kind).await,
            Finished::WriteFailed => {
                // Nothing awaited since the write failed: a commit after it
                // that failed with it finds these copies held again.
                owner.log().requeue_unlogged(&unlogged);
                self.forget_commit(volume, commit, &copies);
                self.commit_instead(volume, held, kind).await
            }
        }
    }

    /// The part of every commit, a volume's or a filesystem's, once its
    /// records are gathered (commit `commit`, opened by [`open_commit`],
    /// under the commit lock `lock`). With no record of its own, the
    /// commits in flight before it must end well (found by engine_sim's
    /// crash test, seed 16: a FLUSH answered at once lost a write whose
    /// record was in flight), and one started ahead promised nothing. Else
    /// its place in the chain is reserved, the commit lock let go (so the
    /// next commit is prepared while this one's blocks are written) and its
    /// blocks written. Nothing awaits from a failed write to the return, so
    /// the caller gives back what it took before any other commit runs.
    #[allow(clippy::too_many_arguments)]
    async fn finish_commit(
        self: &Rc<Self>,
        owner: Owner<'_>,
        lock: &mut Option<crate::rt::sync::Permit>,
        kind: Commit,
        commit: u64,
        records: Vec<LogRecord>,
        max_txg: u64,
        copied: u64,
        started: crate::rt::Instant,
    ) -> Finished {
        let log = owner.log();
        if records.is_empty() {
            let (last, failures) = log.drop_empty_commit(commit);
            if kind == Commit::Ahead {
                // Nothing of its own to write: the FLUSH or fsync will wait.
                return Finished::NotCarried;
            }
            if let Some(last) = last {
                drop(lock.take());
                log.wait_ended(last).await;
                if log.failed_commits() != failures {
                    return Finished::NotCarried;
                }
            }
            log.count(|stats| stats.shared_commits += 1);
            return Finished::Durable;
        }
        // A record is of a change already made: its txg is open or past.
        assert!(
            max_txg <= self.txg.open(),
            "commit {commit} logs a change of txg {max_txg}, past the open txg {}",
            self.txg.open()
        );
        log.commit_needs_txg(commit, max_txg);
        let written = match self.reserve_log_blocks(owner, &records, commit) {
            Ok(write) => {
                drop(lock.take());
                self.write_reserved(owner, write).await
            }
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => {
                log.note_commit_time(started);
                log.count(|stats| {
                    stats.copied_blocks += copied;
                    if kind == Commit::Ahead {
                        stats.ahead_commits += 1;
                    }
                });
                Finished::Durable
            }
            Err(error) => {
                // A write that failed abandoned the chain (a new one
                // starts): a txg makes everything durable instead.
                let instead = match kind {
                    Commit::Ahead => "the next FLUSH or fsync commits again",
                    Commit::Asked => "committing a txg instead",
                };
                eprintln!(
                    "ironpool: {}: intent log write failed ({error}); {instead}",
                    owner.name()
                );
                Finished::WriteFailed
            }
        }
    }

    /// The pointer of block `blkid` of `owner`'s object `object`, as a
    /// commit logs it; None for a filesystem's object freed since (its
    /// freed record says so, in this commit or the next).
    async fn logged_pointer(
        &self,
        owner: Owner<'_>,
        object: u64,
        blkid: u64,
    ) -> Result<Option<crate::format::BlockPointer>, crate::object::ObjectError> {
        let looked_up = match owner {
            Owner::Volume(volume) => self.objects.block_pointer(&volume.object, blkid).await,
            Owner::Filesystem(fs) => match fs.objects.open(object).await {
                Ok(opened) => fs.objects.block_pointer(&opened, blkid).await,
                Err(error) => Err(error),
            },
        };
        match looked_up {
            Ok(pointer) => Ok(Some(pointer)),
            Err(crate::object::ObjectError::NoSuchObject(_))
                if matches!(owner, Owner::Filesystem(_)) =>
            {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// What a volume's commit does when its log cannot carry it (no usable
    /// chain, a failed log write, or a failed commit it was waiting on): one
    /// that was asked for makes everything durable through a txg and
    /// returns true; one started ahead ([`Commit::Ahead`]) promised nothing,
    /// so it returns false at once and the FLUSH's own commit does the work.
    async fn commit_instead(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
        kind: Commit,
    ) -> Result<bool, PoolError> {
        match kind {
            Commit::Ahead => Ok(false),
            Commit::Asked => {
                volume.log.count(|stats| stats.txg_fallbacks += 1);
                self.commit_through_txg(volume, held).await.map(|()| true)
            }
        }
    }

    /// [`Pool::log_ahead`] for a filesystem: once a direct WRITE is
    /// answered, when its client has called `fsync` after every single
    /// write lately ([`crate::pool::dataset::intent_log::LOG_AHEAD_STREAK`] times), the commit that `fsync`
    /// will ask for starts now. Its log write then runs while the answer
    /// travels and the FSYNC comes back; the FSYNC's own commit waits for
    /// the commit lock, which this one holds until its log write has ended
    /// (a filesystem writes one commit at a time), and finds nothing left
    /// to log. At QD1 that hides the commit's preparation and part of its
    /// log write behind the round trip.
    ///
    /// Nothing is promised by it, so it never waits for the lock and never
    /// commits a txg: when the lock is taken, the pool closing, or the
    /// changes cannot be logged (no chain yet, a change the log does not
    /// carry, a failed log write), it does nothing, or gives back what it
    /// took, and the FSYNC's commit does the work as it would have. It
    /// outlives its WRITE's answer; [`Pool::export`] waits for it.
    pub async fn fs_log_ahead(self: &Rc<Self>, fs: &Rc<Filesystem>) {
        if !fs.log.flush_expected()
            || fs.is_snapshot()
            || fs.is_retired()
            || fs.settings().sync != crate::pool::dataset::props::SyncMode::Standard
            || self.txg.ensure_writable().is_err()
        {
            return;
        }
        let in_flight_max = self.tunables.borrow().log_commits_in_flight;
        let Some((permit, number)) = fs.log.try_begin_commit(in_flight_max) else {
            return;
        };
        // A write held is copied, as an `fsync`'s commit would.
        let copy = fs.copy_fits();
        if let Ok(FsLogged::Durable) = self
            .fs_log_shared(fs, &mut Some(permit), Commit::Ahead, copy)
            .await
        {
            fs.log.covered(number, copy);
        }
    }

    /// Makes every change to `fs` so far durable (`fsync`, `fdatasync`, a
    /// write under `O_SYNC`, `O_DSYNC` or `sync=always`): through its intent
    /// log (the records: each changed object's state and entry, each block's
    /// pointer, hole or bytes, each written file's size and times, each
    /// changed list of extended attributes) unless a change it does not
    /// carry is newer than the last durable txg, else through a txg.
    /// Commits of one filesystem are prepared one at a time and written
    /// side by side (up to the `log_commits_in_flight` tunable), and
    /// `fsync`s that arrive during one share the next, as a volume's
    /// FLUSHes.
    pub async fn fs_log_commit(self: &Rc<Self>, fs: &Rc<Filesystem>) -> Result<(), PoolError> {
        if fs.is_snapshot() {
            // Read-only and durable since it was taken: nothing to log, and
            // no chain to start (its name has no directory record).
            return Ok(());
        }
        // Every answer counted so far rests on changes noted before it was
        // counted (a write written behind: once linked, below): this commit
        // covers them all.
        let answered = fs.log.answers_so_far();
        // Writes held are copied into the commit when they fit (as a
        // volume's FLUSH copies its held blocks); otherwise those answered
        // before this are linked (and noted) first, before the lock, so
        // that `fsync`s waiting for them wait together.
        let mut copy = fs.copy_fits();
        let (wait_percent, in_flight_max) = {
            let tunables = self.tunables.borrow();
            (
                tunables.log_group_wait_percent,
                tunables.log_commits_in_flight,
            )
        };
        loop {
            let (permit, number) = loop {
                if !copy {
                    fs.settle_writes(None).await;
                }
                let Some((permit, number)) =
                    fs.log.begin_commit(copy, wait_percent, in_flight_max).await
                else {
                    fs.log.note_answers_durable(answered);
                    return Ok(());
                };
                if copy && !fs.copy_fits() {
                    // More was held while this caller waited for the lock
                    // than a commit copies: written out after the lock is
                    // let go.
                    drop(permit);
                    copy = false;
                    continue;
                }
                break (permit, number);
            };
            self.txg.ensure_writable()?;
            // Kept through a txg that commits instead (unless the log write
            // let it go): `fsync`s arriving meanwhile share that txg rather
            // than each finding the chain unusable and committing its own.
            let mut lock = Some(permit);
            match self
                .fs_log_shared(fs, &mut lock, Commit::Asked, copy)
                .await?
            {
                FsLogged::Durable => {}
                FsLogged::CopyDoesNotFit => {
                    // As above, found once the filesystem's lock was had.
                    drop(lock);
                    copy = false;
                    continue;
                }
                FsLogged::Instead => {
                    fs.log.count(|stats| stats.txg_fallbacks += 1);
                    if copy {
                        // What it would have copied is written out and
                        // linked for the txg.
                        fs.settle_writes(None).await;
                    }
                    self.commit_linked().await?;
                }
            }
            drop(lock);
            fs.log.covered(number, copy);
            fs.log.note_answers_durable(answered);
            return Ok(());
        }
    }

    /// [`Pool::fs_log_write`] under the filesystem's lock taken shared, so
    /// that no change of names or attributes runs meanwhile and a rollback,
    /// destroy or receive waits for the log write to end;
    /// [`FsLogged::Instead`], logging nothing, when the filesystem was
    /// retired (destroyed, rolled back or received over) before the lock
    /// was had.
    /// `lock` holds the commit lock, taken out and let go once the
    /// commit's place in the chain is reserved (or while it waits for
    /// commits in flight).
    async fn fs_log_shared(
        self: &Rc<Self>,
        fs: &Filesystem,
        lock: &mut Option<crate::rt::sync::Permit>,
        kind: Commit,
        copy: bool,
    ) -> Result<FsLogged, PoolError> {
        let _shared = fs.shared().await;
        if fs.is_retired() {
            return Ok(FsLogged::Instead);
        }
        self.fs_log_write(fs, lock, kind, copy).await
    }

    /// Writes the changes of `fs` not yet logged into its chain (with
    /// `copy`, copies of what is held). [`FsLogged::Instead`] when they
    /// must go through a txg instead: no usable chain yet, a change the
    /// log does not carry since the last durable txg, a file's block size
    /// changed or a file freed while the pointers were read, or a failed log
    /// write, or a commit in flight before it that failed.
    /// The caller holds the filesystem's lock shared; `lock` (the commit
    /// lock) is let go once the log blocks are reserved, so the next commit
    /// is prepared while this one's blocks are written (as a volume's,
    /// `commit_locked`): with one commit in flight, each `fsync` at QD64
    /// waited for the whole log write of the one before it.
    async fn fs_log_write(
        self: &Rc<Self>,
        fs: &Filesystem,
        lock: &mut Option<crate::rt::sync::Permit>,
        kind: Commit,
        copy: bool,
    ) -> Result<FsLogged, PoolError> {
        let owner = Owner::Filesystem(fs);
        let log = &fs.log;
        let unloggable = log.unloggable_after(self.txg.durable());
        if !self.chain_usable(owner) || unloggable {
            return Ok(FsLogged::Instead);
        }
        if copy && !fs.copy_fits() {
            return Ok(FsLogged::CopyDoesNotFit);
        }
        let started = crate::rt::now();
        let commit = owner.log().open_commit();
        let durable = self.txg.durable();
        log.forget_durable(durable);
        let (unlogged, mut taken, reshapes) = log.take_file_changes();
        // The held versions, copied with no await since the check above:
        // each is this commit's live copy of its block until a newer
        // change is linked, and its write-out tells the commit once linked.
        let copies = match copy {
            true => fs.take_held_copies(commit),
            false => Vec::new(),
        };
        log.note_copies(
            commit,
            copies.iter().map(|(key, number, _)| (*key, *number)),
        );
        let give_back = |unlogged: &[(u64, u64, u64)], taken| {
            log.requeue_unlogged(unlogged);
            log.requeue_file_changes(taken);
            fs.give_back_held_copies(commit, &copies, self.txg.open());
            log.drop_commit(commit);
        };
        // Objects first, then names (which may name them), then extended
        // attributes, then blocks, then the sizes and times writes set after
        // the objects' states were taken: replay applies them in that order.
        let mut records = Vec::with_capacity(
            unlogged.len() + taken.attrs.len() + taken.objects.len() + taken.entries.len(),
        );
        let mut max_txg = 0;
        let mut objects: Vec<_> = taken.objects.iter().collect();
        objects.sort_unstable_by_key(|(object, _)| **object);
        for (object, (txg, state)) in objects {
            max_txg = max_txg.max(*txg);
            records.push(match state {
                Some(state) => LogRecord::Object {
                    object: *object,
                    txg: *txg,
                    state: *state,
                },
                None => LogRecord::Freed {
                    object: *object,
                    txg: *txg,
                },
            });
        }
        let mut entries: Vec<_> = taken.entries.iter().collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        for ((dir, name), (txg, target)) in entries {
            max_txg = max_txg.max(*txg);
            records.push(LogRecord::Entry {
                dir: *dir,
                txg: *txg,
                name: name.clone(),
                target: *target,
            });
        }
        let mut xattrs: Vec<_> = taken.xattrs.iter().collect();
        xattrs.sort_unstable_by_key(|(object, _)| **object);
        for (object, (txg, list)) in xattrs {
            max_txg = max_txg.max(*txg);
            records.push(LogRecord::Xattrs {
                object: *object,
                txg: *txg,
                list: list.clone(),
            });
        }
        // Blocks whose kept bytes may go into the log instead of their
        // pointer: the indices of their pointer records.
        let mut copyable = Vec::new();
        for (object, blkid, linked_txg) in newest_changes(&unlogged, durable) {
            let pointer = match self.logged_pointer(owner, object, blkid).await {
                Ok(Some(pointer)) => pointer,
                Ok(None) => continue,
                Err(error) => {
                    give_back(&unlogged, taken);
                    return Err(error.into());
                }
            };
            // A copy of newer bytes is in the chain (this commit's or an
            // earlier one's) and the tree's pointer is older: its record
            // would follow the copy and undo it at replay.
            if fs.held_copy_is_newer(object, blkid) {
                continue;
            }
            let Some(record) = block_record(object, blkid, linked_txg, pointer, self.txg.durable())
            else {
                continue;
            };
            // The tree still points where the kept bytes went.
            if let Some(copy) = taken.small_writes.get(&(object, blkid)) {
                if copy.dva == pointer.dvas[0] && copy.txg == pointer.birth_txg {
                    copyable.push(records.len());
                }
            }
            max_txg = max_txg.max(record_txg(&record));
            records.push(record);
        }
        copy_where_it_spares_a_flush(&mut records, &copyable, &taken.small_writes);
        // Held bytes after the pointers: newer than whatever the tree held
        // when they were taken (replay takes a block's last record).
        let held_copies = copies.len() as u64;
        records.extend(
            copies
                .iter()
                .map(|((object, blkid), _, data)| LogRecord::Copy {
                    object: *object,
                    blkid: *blkid,
                    data: data.to_vec(),
                }),
        );
        let mut files: Vec<(&u64, &FileAttr)> = taken.attrs.iter().collect();
        files.sort_unstable_by_key(|(object, _)| **object);
        // An encrypted filesystem's times are attributes, which it keeps
        // sealed: sealed in its log too.
        let key = match fs.data_key() {
            Ok(key) => key,
            Err(_) => {
                give_back(&unlogged, taken);
                return Ok(FsLogged::Instead);
            }
        };
        for (object, attr) in files {
            if attr.txg > self.txg.durable() {
                max_txg = max_txg.max(attr.txg);
                let sealed = match &key {
                    None => None,
                    Some(key) => match crate::crypto::seal_times(
                        key,
                        *object,
                        attr.txg,
                        attr.length,
                        attr.mtime,
                        attr.ctime,
                    ) {
                        Ok(sealed) => Some(sealed),
                        Err(_) => {
                            give_back(&unlogged, taken);
                            return Ok(FsLogged::Instead);
                        }
                    },
                };
                let clear = |time| {
                    if sealed.is_some() {
                        Default::default()
                    } else {
                        time
                    }
                };
                records.push(LogRecord::Attr {
                    object: *object,
                    txg: attr.txg,
                    length: attr.length,
                    mtime: clear(attr.mtime),
                    ctime: clear(attr.ctime),
                    sealed,
                });
            }
        }
        // A file's block grew, or a file was freed, while the pointers were
        // read: they may not fit the object states taken before, and a
        // change the log does not carry may have come too. No await from
        // this check to the records being fixed.
        let changed = log.moved_since(reshapes, self.txg.durable());
        if changed {
            give_back(&unlogged, taken);
            return Ok(FsLogged::Instead);
        }
        // An encrypted filesystem's names, attributes and extended
        // attributes are sealed whole (their object and txg stay in the
        // clear): its replay opens them with the key.
        if let Some(key) = &key {
            debug_assert!(
                !records.iter().any(|record| matches!(
                    record,
                    LogRecord::Copy { .. } | LogRecord::Written { .. }
                )),
                "{}: a copy of bytes in an encrypted filesystem's log",
                fs.name()
            );
            for record in records.iter_mut() {
                if !matches!(
                    record,
                    LogRecord::Object { .. } | LogRecord::Entry { .. } | LogRecord::Xattrs { .. }
                ) {
                    continue;
                }
                match crate::crypto::seal_record(key, record) {
                    Ok(sealed) => *record = sealed,
                    Err(_) => {
                        give_back(&unlogged, taken);
                        return Ok(FsLogged::Instead);
                    }
                }
            }
        }
        let copied = held_copies
            + records
                .iter()
                .filter(|record| matches!(record, LogRecord::Written { .. }))
                .count() as u64;
        let finished = self
            .finish_commit(owner, lock, kind, commit, records, max_txg, copied, started)
            .await;
        match finished {
            Finished::Durable => {
                log.count(|stats| stats.held_copies += held_copies);
                Ok(FsLogged::Durable)
            }
            Finished::NotCarried => Ok(FsLogged::Instead),
            Finished::WriteFailed => {
                // (A write that failed abandoned the chain, which forgets
                // this commit with the rest.)
                give_back(&unlogged, std::mem::take(&mut taken));
                Ok(FsLogged::Instead)
            }
        }
    }

    /// What a commit does without a usable log: held blocks written out and
    /// linked (for a FLUSH), then the txg committed.
    async fn commit_through_txg(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
        held: bool,
    ) -> Result<(), PoolError> {
        if held {
            self.drain_volume(volume).await?;
        }
        self.commit_linked().await
    }

    /// Takes a copy of every block the write-back holds for `volume` and has
    /// not logged, for commit `commit` (each is marked as logged there). The
    /// caller has checked that they are to be copied ([`Pool::copy_fits`]).
    fn copy_held_blocks(&self, volume: &Rc<Volume>, commit: u64) -> Vec<(u64, BufSlice)> {
        debug_assert!(
            self.copy_fits(volume),
            "held blocks copied past what a commit copies"
        );
        let held = volume.writeback.unlogged();
        let mut copies = Vec::with_capacity(held.len());
        // Nothing awaits from the look-up to the marks: each block's bytes
        // are the ones held now, and a link or a new write after this sees
        // the mark.
        for (blkid, data) in held {
            if volume.writeback.mark_logged(blkid, &data, commit) {
                copies.push((blkid, data));
            }
        }
        let object = volume.object.id;
        volume.log.note_copies(
            commit,
            copies.iter().map(|(blkid, _)| ((object, *blkid), 0)),
        );
        copies
    }

    /// Whether a FLUSH now would copy `volume`'s held blocks into the log
    /// (`logbias=latency`, small blocks, few enough of them).
    fn copy_fits(&self, volume: &Volume) -> bool {
        // An encrypted volume's records would hold its data in the clear:
        // its held blocks are written out (sealed) and logged as pointers.
        volume.key_guid().is_none()
            && volume.settings().log_bias == LogBias::Latency
            && volume.block_bytes <= COPY_BLOCK_BYTES_MAX
            && volume.writeback.unlogged_bytes() <= COPY_BYTES_PER_COMMIT_MAX
    }

    /// Undoes the marks of a commit that will not be written: the blocks
    /// still holding the bytes it copied are copied again by the next one.
    fn forget_commit(&self, volume: &Volume, commit: u64, copies: &[(u64, BufSlice)]) {
        for (blkid, _) in copies {
            volume.writeback.unmark_logged(*blkid, commit);
        }
        volume.log.drop_commit(commit);
    }

    /// Cuts `records` into blocks of `owner`'s chain (the pre-allocated next
    /// one first, then blocks allocated to fit the rest; the last names a
    /// new next block), encodes them, and takes their place in the chain:
    /// the commit is in flight from here, and the next commit goes after it.
    /// Nothing awaits here. On an error nothing is reserved.
    fn reserve_log_blocks(
        &self,
        owner: Owner<'_>,
        records: &[LogRecord],
        commit: u64,
    ) -> Result<LogWrite, PoolError> {
        // The chain was usable when the commit began, but a commit in
        // flight may have failed since (while this one read block pointers)
        // and a new chain started, whose head is not durable yet: a commit
        // written there would be found by no replay.
        let Some((guid, first)) = owner.log().usable_next(self.txg.durable()) else {
            return Err(PoolError::Io(
                "the log chain was restarted by a failed commit".to_string(),
            ));
        };
        let mut blocks: Vec<(u64, LogPointer, &[LogRecord])> = Vec::new();
        let mut current = first;
        let mut start = 0;
        let mut allocated = Vec::new();
        while start < records.len() {
            let capacity = current.1.bytes as usize;
            let mut end = start;
            let mut used = format::LOG_HEADER_BYTES;
            while end < records.len() && used + records[end].encoded_bytes() <= capacity {
                used += records[end].encoded_bytes();
                end += 1;
            }
            // A record larger than this block leaves it empty: the record goes
            // into the next one, sized for it.
            blocks.push((current.0, current.1, &records[start..end]));
            start = end;
            if blocks.len() > COMMIT_BLOCKS_MAX {
                self.release_log_blocks(&allocated);
                return Err(PoolError::InvalidArgument(format!(
                    "{} log records need more than {COMMIT_BLOCKS_MAX} log blocks",
                    records.len()
                )));
            }
            // The next block fits the records left, or, for the block after
            // this commit, what this commit needed (clamped to the sizes).
            let bytes = if start < records.len() {
                block_size_for(format::block_bytes_for(&records[start..]))
            } else {
                block_size_for(format::block_bytes_for(records))
            };
            match self.allocate_log_block(bytes) {
                Ok(pointer) => {
                    allocated.push(pointer);
                    current = (current.0 + 1, pointer);
                }
                Err(error) => {
                    self.release_log_blocks(&allocated);
                    return Err(error);
                }
            }
        }
        let new_next = current;
        let encoded = blocks
            .iter()
            .enumerate()
            .map(|(index, (seq, pointer, block_records))| {
                let next = blocks
                    .get(index + 1)
                    .map(|(seq, pointer, _)| (*seq, *pointer))
                    .unwrap_or(new_next);
                let mut buffer = AlignedBuf::zeroed(pointer.bytes as usize);
                format::encode_block(
                    &LogBlockHeader {
                        chain_guid: guid,
                        seq: *seq,
                        next: next.1,
                        commit,
                        ends_commit: index + 1 == blocks.len(),
                    },
                    block_records,
                    &mut buffer,
                );
                (*seq, *pointer, buffer, block_records.len())
            })
            .collect::<Vec<_>>();
        // What the commit needs durable besides its log blocks: the blocks
        // its pointer records name (see `write_reserved`).
        let mut needed: Vec<u32> = records.iter().flat_map(flushed_vdevs).collect();
        needed.sort_unstable();
        needed.dedup();
        owner.log().enter_chain(
            commit,
            guid,
            encoded
                .iter()
                .map(|(seq, pointer, _, _)| (*seq, *pointer))
                .collect(),
            new_next,
        );
        Ok(LogWrite {
            commit,
            chain_guid: guid,
            blocks: encoded,
            needed,
        })
    }

    /// Writes a commit's reserved blocks and flushes the devices it needs,
    /// then waits for the commits before it in the chain: it succeeds only
    /// if they all did (a block that failed cuts the chain there), and they
    /// are answered in order.
    async fn write_reserved(
        self: &Rc<Self>,
        owner: Owner<'_>,
        write: LogWrite,
    ) -> Result<(), PoolError> {
        let mut end = InFlightEnd {
            pool: self,
            owner,
            commit: write.commit,
            armed: true,
        };
        let mut records_written = 0;
        let mut bytes_written = 0;
        let blocks_written = write.blocks.len() as u64;
        let writes = write
            .blocks
            .into_iter()
            .map(|(_, pointer, buffer, records)| {
                records_written += records as u64;
                bytes_written += pointer.bytes as u64;
                let store = self.store.clone();
                async move {
                    store
                        .write_durable(
                            &[pointer.dva],
                            BufSlice::whole(buffer.into_shared()),
                            IoClass::SyncWrite,
                        )
                        .await
                }
            })
            .collect::<Vec<_>>();
        // The log blocks are written durable (FUA: the kernel makes them
        // durable before they complete, and the engine waits once instead of
        // for a write and then a flush). The blocks the pointer records name
        // were written in place and linked before the commit, so a flush
        // sent now covers them. It runs while the log blocks are written:
        // replay verifies every block a pointer record names and stops at
        // the first that does not, so the two need no order. Copies carry
        // their bytes; holes have none. Devices holding none are not
        // flushed (write-back's batches keep the main devices busy, and a
        // commit on a log device need not wait for their caches). Where the
        // log lives beside the data, writing its blocks plainly and flushing
        // once after them (one sync per device, not two) measured slower:
        // the write and the flush in turn wait longer than the FUA write and
        // the flush side by side (mirror of two files, fio nbd 16K QD64:
        // --fsync=32 33.6k -> 29.8k IOPS, sync=always 27.2k -> 20.0k).
        let (written, flushed) = futures_util::future::join(
            futures_util::future::join_all(writes),
            self.store.flush_for_log(&write.needed),
        )
        .await;
        let failed = written
            .into_iter()
            .find_map(Result::err)
            .map(PoolError::from)
            .or(flushed.err().map(PoolError::from));
        // Its turn: every commit before it in the chain has ended (this one
        // is still in flight, so the front is now this one).
        let log = owner.log();
        log.wait_ended(write.commit.saturating_sub(1)).await;
        // Only its own `InFlightEnd` takes a commit out of the queue.
        debug_assert_eq!(
            log.front_in_flight(),
            Some(write.commit),
            "commit {} is not the front of the chain in its turn",
            write.commit
        );
        let failed = failed.or_else(|| {
            (log.chain_guid() != write.chain_guid)
                .then(|| PoolError::Io("a log commit before this one failed".to_string()))
        });
        if let Some(error) = failed {
            end.end(false);
            return Err(error);
        }
        end.end(true);
        log.count(|stats| {
            stats.blocks_written += blocks_written;
            stats.bytes_written += bytes_written;
            stats.records_written += records_written;
            stats.commits += 1;
        });
        Ok(())
    }

    /// Returns log blocks allocated for a commit that failed: nothing durable
    /// names them (a block that names one was never acknowledged).
    fn release_log_blocks(&self, blocks: &[LogPointer]) {
        let dvas: Vec<Dva> = blocks.iter().map(|pointer| pointer.dva).collect();
        self.store.release(&dvas);
    }

    /// Moves `volume`'s intent log off a log device being removed (marked
    /// `removing`, so no new block goes there): with its commits held off,
    /// what the chain made durable is made durable by a txg instead (held
    /// blocks written in place), then the chain is dropped and a new one
    /// started on the devices left. Its old blocks are dropped from the
    /// releases of `vdev` by the caller.
    pub(crate) async fn move_log_off(
        self: &Rc<Self>,
        volume: &Rc<Volume>,
    ) -> Result<(), PoolError> {
        let _commit = volume.log.quiesce().await;
        self.drain_volume(volume).await?;
        self.commit_linked().await?;
        self.abandon_log_chain(Owner::Volume(volume));
        // Without space for a head the volume commits through txgs, and a
        // later commit starts the chain.
        let _ = self.start_log_chain(Owner::Volume(volume));
        Ok(())
    }

    /// [`Pool::move_log_off`] for a filesystem's log.
    pub(crate) async fn move_fs_log_off(
        self: &Rc<Self>,
        fs: &Rc<Filesystem>,
    ) -> Result<(), PoolError> {
        // A chain an import claimed stays until its key's load replays it
        // (a removal is refused while it holds space on the vdev).
        if fs.log.is_claimed() {
            return Ok(());
        }
        let _commit = fs.log.quiesce().await;
        // Held writes copied into the chain are linked first, so that the
        // txg makes them durable before the chain goes (a newer version
        // held after a settle began carries an older one's copy: settled
        // again; with commits held off no new copy is taken).
        fs.settle_writes(None).await;
        for _ in 0..SETTLE_ROUNDS_MAX {
            if !fs.held_copies_pending() || fs.is_retired() {
                break;
            }
            fs.settle_writes(None).await;
        }
        let _shared = fs.shared().await;
        self.commit_linked().await?;
        self.abandon_log_chain(Owner::Filesystem(fs));
        let _ = self.start_log_chain(Owner::Filesystem(fs));
        Ok(())
    }

    /// Forgets the pending releases of log blocks on top-level vdev `vdev`
    /// (a log device leaving the pool: its space goes with it).
    pub(crate) fn drop_log_releases_on(&self, vdev: u32) {
        self.log_releases
            .0
            .borrow_mut()
            .retain(|(_, pointer)| pointer.dva.vdev != vdev);
    }

    /// True when some dataset's chain has a block on top-level vdev `vdev`.
    pub(crate) fn log_chains_use(&self, vdev: u32) -> bool {
        self.datasets
            .volumes
            .any(|volume| volume.log.uses_vdev(vdev))
            || self.datasets.filesystems.any(|fs| fs.log.uses_vdev(vdev))
    }

    /// Waits for the log commits in flight of every open dataset and keeps
    /// new ones out while the returned permits live (an export, whose final
    /// txg and the closing of the devices must come after the last log
    /// write). A commit may outlive whoever started it: one started ahead of
    /// a FLUSH ([`Pool::log_ahead`]) runs on after its WRITE is answered.
    pub(crate) async fn quiesce_logs(&self) -> Vec<crate::rt::sync::Permit> {
        let mut permits = Vec::new();
        for volume in self.datasets.volumes.all() {
            permits.push(volume.log.quiesce().await);
        }
        for fs in self.datasets.filesystems.all() {
            permits.push(fs.log.quiesce().await);
        }
        permits
    }

    /// Waits for `volume`'s log commits in flight, then frees its chain; the
    /// returned permit keeps new commits out (the volume is being destroyed).
    pub(crate) async fn discard_log(&self, volume: &Volume) -> crate::rt::sync::Permit {
        let permit = volume.log.quiesce().await;
        self.abandon_log_chain(Owner::Volume(volume));
        permit
    }

    /// Frees `owner`'s whole chain (written blocks and the next one) and
    /// forgets it: the dataset is destroyed, rolled back or received over,
    /// or its chain is broken. The directory's head is cleared in the open
    /// txg.
    pub(crate) fn abandon_log_chain(&self, owner: Owner) {
        let txg = self.txg.open();
        let blocks = owner.log().abandon_chain();
        if let Owner::Filesystem(fs) = owner {
            fs.forget_held_copies();
        }
        // A chain an import claimed is in the space maps: freed there.
        if let Some(claimed) = owner.log().take_claimed() {
            for block in &claimed.blocks {
                self.store.free(block);
            }
            self.store
                .free_dvas(claimed.chain.iter().map(|pointer| &pointer.dva));
        }
        self.release_log_blocks_after(txg, blocks);
        self.set_log_head(owner, None);
    }
}

/// Settles of a filesystem's held writes before its chain moves off a log
/// device, at most, while a held version still has a copy in the chain:
/// each settle links what was answered before it, and a version that
/// replaced a copied one since is linked by the next (one or two suffice;
/// a writer rewriting one block faster than it is written out is not
/// waited for past this).
const SETTLE_ROUNDS_MAX: usize = 8;

/// How a filesystem's log write ended ([`Pool::fs_log_write`]).
enum FsLogged {
    /// What it gathered, and every commit before it, is durable.
    Durable,
    /// It logged nothing and promised nothing: the caller commits a txg
    /// instead (no usable chain, a change the log does not carry, a failed
    /// log write, a commit before it that failed).
    Instead,
    /// It was to copy what is held, and more was held by the time it had
    /// the filesystem's lock than a commit copies: the caller lets go of
    /// the commit lock, has them written out and commits again.
    CopyDoesNotFit,
}

/// How the part of a commit both front ends share ended
/// ([`Pool::finish_commit`]).
enum Finished {
    /// What the commit gathered, and every commit before it, is durable.
    Durable,
    /// It had nothing of its own and promised nothing (started ahead), or
    /// a commit in flight before it failed: the caller falls back.
    NotCarried,
    /// Its log write failed (the chain was abandoned): the caller gives
    /// back what it took, then falls back.
    WriteFailed,
}

/// The top-level vdevs a commit flushes for `record`: those holding the
/// block a pointer record names (a copy or any other record needs none).
fn flushed_vdevs(record: &LogRecord) -> impl Iterator<Item = u32> + '_ {
    let pointer = match record {
        LogRecord::Block { pointer, .. } => Some(pointer),
        _ => None,
    };
    pointer
        .into_iter()
        .flat_map(|pointer| pointer.copies().map(|dva| dva.vdev))
}

/// Turns the pointer records at indices `copyable` into copies of the
/// bytes `small_writes` kept, where that spares the commit a device flush:
/// a copy is logged so that the devices holding its block need no flush,
/// and it spares none when a pointer record left in the commit names those
/// devices anyway (the commit flushes them for it). Then the copy only adds
/// its bytes to the log write: on a mirror, fio's 16K random writes at QD64
/// with `--fsync=32` copied 4 blocks into each commit of 13-20, and a
/// quarter of the bytes written to the log and the devices again were such
/// copies. A commit of copies only (one write, then `fsync`) keeps them all.
fn copy_where_it_spares_a_flush(
    records: &mut [LogRecord],
    copyable: &[usize],
    small_writes: &rustc_hash::FxHashMap<(u64, u64), WrittenCopy>,
) {
    let flushed: rustc_hash::FxHashSet<u32> = records
        .iter()
        .enumerate()
        .filter(|(index, _)| !copyable.contains(index))
        .flat_map(|(_, record)| flushed_vdevs(record))
        .collect();
    for &index in copyable {
        if flushed_vdevs(&records[index]).all(|vdev| flushed.contains(&vdev)) {
            continue;
        }
        let LogRecord::Block { object, blkid, .. } = records[index] else {
            unreachable!("a copyable block's record is its pointer");
        };
        let copy = &small_writes[&(object, blkid)];
        records[index] = LogRecord::Written {
            object,
            blkid,
            txg: copy.txg,
            data: copy.data.clone(),
        };
    }
}

/// The newest change of each block in `unlogged` (object, block, txg
/// linked) linked after `durable`, in the order they were linked: what a
/// commit logs of blocks linked into the tree.
fn newest_changes(unlogged: &[(u64, u64, u64)], durable: u64) -> Vec<(u64, u64, u64)> {
    let mut seen = rustc_hash::FxHashSet::default();
    let mut blocks: Vec<(u64, u64, u64)> = unlogged
        .iter()
        .rev()
        .filter(|(object, blkid, txg)| *txg > durable && seen.insert((*object, *blkid)))
        .copied()
        .collect();
    blocks.reverse();
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BlockPointer, ObjectType};

    /// Block `blkid` of file 7, one 16K copy on top-level vdev `vdev`.
    fn pointer(vdev: u32, blkid: u64) -> BlockPointer {
        let mut pointer = BlockPointer::hole(0, ObjectType::FsFile, 9);
        pointer.dvas[0] = Dva {
            vdev,
            asize: 16384,
            offset: blkid * 16384,
        };
        pointer
    }

    fn kept(pointers: &[BlockPointer]) -> rustc_hash::FxHashMap<(u64, u64), WrittenCopy> {
        pointers
            .iter()
            .map(|pointer| {
                let blkid = pointer.dvas[0].offset / 16384;
                let copy = WrittenCopy {
                    dva: pointer.dvas[0],
                    txg: 9,
                    data: vec![blkid as u8; 16384],
                };
                ((7, blkid), copy)
            })
            .collect()
    }

    fn block(pointer: BlockPointer) -> LogRecord {
        LogRecord::Block {
            object: 7,
            blkid: pointer.dvas[0].offset / 16384,
            pointer,
        }
    }

    fn copied(records: &[LogRecord]) -> Vec<u64> {
        records
            .iter()
            .filter_map(|record| match record {
                LogRecord::Written { blkid, data, .. } => {
                    assert_eq!(data[0], *blkid as u8, "block {blkid}'s own bytes");
                    Some(*blkid)
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_commit_of_copies_only_keeps_them_all() {
        let (a, b) = (pointer(0, 1), pointer(0, 2));
        let mut records = vec![block(a), block(b)];
        copy_where_it_spares_a_flush(&mut records, &[0, 1], &kept(&[a, b]));
        assert_eq!(copied(&records), vec![1, 2]);
    }

    #[test]
    fn a_copy_whose_devices_are_flushed_anyway_stays_a_pointer() {
        // Block 3 has no kept bytes: its pointer record makes the commit
        // flush vdev 0, so copying block 1 (on vdev 0) spares nothing, while
        // block 2, alone on vdev 1, spares vdev 1 its flush.
        let (a, b, c) = (pointer(0, 1), pointer(1, 2), pointer(0, 3));
        let mut records = vec![
            block(a),
            block(b),
            LogRecord::Attr {
                object: 7,
                txg: 9,
                length: 65536,
                mtime: Default::default(),
                ctime: Default::default(),
                sealed: None,
            },
            block(c),
        ];
        copy_where_it_spares_a_flush(&mut records, &[0, 1], &kept(&[a, b]));
        assert_eq!(copied(&records), vec![2]);
        assert!(matches!(records[0], LogRecord::Block { blkid: 1, .. }));
        assert!(matches!(records[3], LogRecord::Block { blkid: 3, .. }));
    }
}
