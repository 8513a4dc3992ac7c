//! The pool's side of filesystems: opening them at import, creating,
//! destroying, snapshotting, reopening after a rollback or receive, and
//! the mounts the server keeps.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{
    dir, mountpoint, now, Filesystem, FilesystemRecord, MOUNT_WAIT_SECONDS, ROOT_OBJECT,
    SNAPSHOT_FILESYSTEMS_OPEN_MAX, TABLE_BLOCK_SHIFT,
};
use crate::format::znode::{FsHeader, FsSpace, Znode, S_IFDIR};
use crate::format::ObjectType;
use crate::object::{new_dnode, Object};
use crate::pool::{Pool, PoolError, INDIRECT_BLOCK_SHIFT};

impl Pool {
    /// Opens the filesystems of the directory (at import).
    pub(in crate::pool) async fn open_filesystems(&self) -> Result<(), PoolError> {
        let records: Vec<(String, FilesystemRecord)> = self
            .datasets
            .directory
            .read()
            .filesystems
            .iter()
            .map(|(name, record)| (name.clone(), record.clone()))
            .collect();
        for (short, record) in records {
            let table = self.objects.open(record.object).await?;
            let fs = self.open_head_filesystem(&short, table, &record).await?;
            self.datasets.filesystems.insert(short, fs);
        }
        Ok(())
    }

    /// Opens filesystem `short` (a head, writable) over `table`: loads the
    /// whole table (the txg build writes dnodes into it with no I/O) and
    /// its dead lists (metadata, kept cached as a volume's are).
    pub(in crate::pool) async fn open_head_filesystem(
        &self,
        short: &str,
        table: Rc<Object>,
        record: &FilesystemRecord,
    ) -> Result<Rc<Filesystem>, PoolError> {
        if table.object_type() != ObjectType::FsObjects {
            return Err(PoolError::Corrupt(format!(
                "filesystem {short}: object {} is not a filesystem",
                record.object
            )));
        }
        let length = table.length_bytes();
        self.objects.prefetch(&table, 0, length).await?;
        table.dead_list.set(record.lineage.dead_list);
        for list in std::iter::once(record.lineage.dead_list)
            .chain(
                record
                    .lineage
                    .snapshots
                    .iter()
                    .map(|snapshot| snapshot.dead_list),
            )
            .filter(|list| *list != 0)
        {
            let list_object = self.objects.open(list).await?;
            self.objects.load_dead_list(&list_object).await?;
        }
        let settings = self.volume_settings(short, &record.own_properties());
        let fs = Filesystem::open(
            self,
            format!("{}/{short}", self.name),
            table,
            record,
            settings,
            false,
        )?;
        if fs.header.get().space.is_none() {
            // A header from before the sums (version 1): they are taken
            // once, from the table (no object is loaded yet, nothing changed
            // in it), and kept by the txg builds from now on.
            let space = fs.objects_space_walked().await?;
            fs.set_space(Some(space));
        }
        Ok(fs)
    }

    /// Adds filesystem `short` over `table` (a new object of the open txg)
    /// to the directory and opens it.
    pub(in crate::pool) async fn add_filesystem(
        &self,
        short: &str,
        table: Rc<Object>,
        properties: BTreeMap<String, String>,
        lineage: crate::pool::dataset::directory::Lineage,
        crypt: Option<crate::pool::dataset::directory::CryptRecord>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let record = FilesystemRecord {
            object: table.id,
            created_txg: self.txg.open(),
            guid: crate::format::new_guid(),
            properties,
            received: BTreeMap::new(),
            lineage,
            receive: None,
            intent_log: None,
            crypt,
            replayed_times: Vec::new(),
        };
        let fs = self.open_head_filesystem(short, table, &record).await?;
        self.datasets
            .directory
            .edit()
            .filesystems
            .insert(short.to_string(), record);
        self.datasets
            .filesystems
            .insert(short.to_string(), fs.clone());
        Ok(fs)
    }

    /// A rollback gave filesystem `short` another tree: `old` serves no
    /// more requests, and a new `Filesystem` over the same table takes its
    /// place (the server mounts it again).
    pub(in crate::pool) async fn reopen_filesystem(
        &self,
        short: &str,
        old: &Filesystem,
    ) -> Result<Rc<Filesystem>, PoolError> {
        old.retire();
        // The old tree's log describes changes to it, not to the one opened
        // in its place (the caller holds the old one exclusively: no commit
        // is writing).
        self.abandon_log_chain(crate::pool::Owner::Filesystem(old));
        let record = self
            .filesystem_record(short)
            .ok_or_else(|| PoolError::Corrupt(format!("filesystem {short} has no record")))?;
        let fs = self
            .open_head_filesystem(short, old.table.clone(), &record)
            .await?;
        self.datasets
            .filesystems
            .insert(short.to_string(), fs.clone());
        Ok(fs)
    }

    /// The read-only filesystem of snapshot `POOL/FS@SNAP` (what
    /// `.zfs/snapshot/SNAP` shows), opened on first use and kept (at most
    /// [`SNAPSHOT_FILESYSTEMS_OPEN_MAX`] at once).
    pub async fn snapshot_filesystem(
        self: &Rc<Self>,
        full_name: &str,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let (short, snapshot) = crate::pool::dataset::split_snapshot_name(&self.name, full_name)
            .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.to_string()))?;
        let canonical = format!("{}/{short}@{snapshot}", self.name);
        if let Some(fs) = self.datasets.snapshot_filesystems.get(&canonical) {
            return Ok(fs);
        }
        let record = self
            .filesystem_record(short)
            .ok_or_else(|| PoolError::NoSuchSnapshot(canonical.clone()))?;
        let object = record
            .lineage
            .snapshot(snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(canonical.clone()))?
            .object;
        let table = self.objects.open(object).await?;
        let settings = self.volume_settings(short, &record.own_properties());
        let fs = Filesystem::open(self, canonical.clone(), table, &record, settings, true)?;
        // Another request may have opened it while this one read: that one
        // is kept. Only a cache: a request still using one let go keeps it.
        Ok(self.datasets.snapshot_filesystems.insert_bounded(
            canonical,
            fs,
            SNAPSHOT_FILESYSTEMS_OPEN_MAX,
        ))
    }

    /// Wakes the server's mount keeper: a filesystem was made, destroyed,
    /// cloned or rolled back.
    pub(in crate::pool) fn notify_filesystems_changed(&self) {
        self.datasets.filesystems_changed.notify_all();
    }

    /// Frees every filesystem's files left unlinked while open by a crash
    /// (at import, before anything is served); notes how many.
    pub(in crate::pool) async fn reclaim_unlinked(self: &Rc<Self>) -> Result<(), PoolError> {
        for (short, fs) in self.filesystems() {
            let freed = fs
                .reclaim_unlinked(self)
                .await
                .map_err(|error| PoolError::Corrupt(format!("filesystem {short}: {error}")))?;
            if freed > 0 {
                self.import_notes.borrow_mut().push(format!(
                    "filesystem {short}: freed {freed} objects removed while in use before the last shutdown"
                ));
            }
        }
        Ok(())
    }

    /// The filesystem named `POOL/NAME` (or `NAME`).
    pub fn filesystem(&self, name: &str) -> Result<Rc<Filesystem>, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name);
        self.datasets
            .filesystems
            .get(short)
            .ok_or_else(|| PoolError::InvalidArgument(format!("no filesystem '{name}'")))
    }

    /// Every filesystem users see, by short name (not the hidden ones of
    /// receives in progress: see [`Pool::all_filesystems`]).
    pub fn filesystems(&self) -> Vec<(String, Rc<Filesystem>)> {
        self.datasets
            .filesystems
            .named()
            .into_iter()
            .filter(|(name, _)| !crate::pool::is_hidden_dataset(name))
            .collect()
    }

    /// Every filesystem, the hidden ones of receives in progress too (they
    /// hold space a check must account for).
    pub fn all_filesystems(&self) -> Vec<(String, Rc<Filesystem>)> {
        self.datasets.filesystems.named()
    }

    /// The directory record of filesystem `short`.
    pub fn filesystem_record(&self, short: &str) -> Option<FilesystemRecord> {
        self.datasets
            .directory
            .read()
            .filesystems
            .get(short)
            .cloned()
    }

    /// Where filesystem `short` mounts: its `mountpoint`, set or inherited
    /// (a parent's path with the rest of the name), by default
    /// `/POOL/A/B`; None for `none` and `legacy` (not mounted by the
    /// server), or no such filesystem.
    pub fn filesystem_mountpoint(&self, short: &str) -> Option<String> {
        let record = self.filesystem_record(short)?;
        mountpoint(
            &self.name,
            short,
            &self.effective_properties(short, &record.own_properties()),
        )
    }

    /// Creates a filesystem with an empty root directory.
    pub async fn create_filesystem(
        self: &Rc<Self>,
        name: &str,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        self.create_filesystem_keyed(name, properties, None).await
    }

    /// [`Pool::create_filesystem`], encrypted when `properties` say so
    /// (`encryption=on`, ...: a new encryption root, its key loaded), the
    /// user's key being `material` (read at a prompt) or read from its
    /// `keylocation`.
    pub async fn create_filesystem_keyed(
        self: &Rc<Self>,
        name: &str,
        mut properties: BTreeMap<String, String>,
        material: Option<zeroize::Zeroizing<Vec<u8>>>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let encryption = crate::pool::dataset::keys::CreateKey::take(&mut properties, material)?;
        let short = self.new_dataset_short_name(name)?;
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.check_name_free(&short)?;
        let mut checked = BTreeMap::new();
        for (key, value) in &properties {
            let value = crate::pool::dataset::props::validate_filesystem(key, value)?;
            checked.insert(key.clone(), value);
        }
        self.check_new_limits(name, &checked)?;
        self.txg.ensure_writable()?;
        // The key is made (and a passphrase stretched) before anything is
        // created: a bad key leaves nothing behind.
        let (crypt, new_root) = self.crypt_of_new(&short, encryption).await?;
        let settings = self.volume_settings(&short, &checked);
        let open_txg = self.txg.open();
        let id = self.allocate_object_id();
        let mut dnode = new_dnode(
            ObjectType::FsObjects,
            TABLE_BLOCK_SHIFT,
            INDIRECT_BLOCK_SHIFT,
            0,
            open_txg,
        );
        dnode.checksum_algo = settings.checksum;
        dnode.bonus = FsHeader {
            root: ROOT_OBJECT,
            next_object: ROOT_OBJECT + 1,
            unlinked_object: 0,
            objects: 1,
            // An empty table: the sums start at zero, and each txg build
            // adds what it writes into the table.
            space: Some(FsSpace::default()),
            sealed_bonuses: crypt.is_some(),
        }
        .encode();
        if crypt.is_some() {
            dnode.flags |= crate::format::dnode::DNODE_FLAG_AUTHENTICATED;
        }
        let table = self.objects.create(id, dnode);
        // A key made for it is its own: unloaded again if it is not made.
        let new_key = crypt
            .as_ref()
            .map(|crypt| crypt.key_guid)
            .filter(|_| new_root);
        let fs = match self
            .add_filesystem(&short, table, checked, Default::default(), crypt)
            .await
        {
            Ok(fs) => fs,
            Err(error) => {
                if let Some(guid) = new_key {
                    self.datasets.keys.ring().remove(guid);
                }
                return Err(error);
            }
        };
        let time = now();
        let root = Znode {
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            parent: ROOT_OBJECT,
            generation: ROOT_OBJECT,
            atime: time,
            mtime: time,
            ctime: time,
            birth: time,
            rdev: 0,
            entries: 0,
            hash_salt: crate::format::new_guid(),
            xattr_object: 0,
            project: 0,
            flags: 0,
        };
        let root_object = fs.new_object(self, ROOT_OBJECT, true, &root);
        dir::init(&fs.objects, &root_object)
            .await
            .map_err(|error| PoolError::Io(error.to_string()))?;
        self.commit().await?;
        self.datasets.filesystems_changed.notify_all();
        Ok(fs)
    }

    /// Creates the hidden filesystem a full stream is received into
    /// (`TARGET%recv`): a dnode table with the stream's header and no
    /// objects yet, with `properties` (checked). `clear_attributes`: a raw
    /// stream of an older build, whose objects' attributes are not sealed.
    /// The caller holds the admin lock.
    pub(in crate::pool) async fn create_receive_filesystem(
        &self,
        hidden_short: &str,
        info: &crate::format::stream::FsStreamInfo,
        properties: BTreeMap<String, String>,
        received_key: Option<crate::pool::dataset::directory::CryptRecord>,
        clear_attributes: bool,
    ) -> Result<Rc<Filesystem>, PoolError> {
        self.txg.ensure_writable()?;
        // A raw stream's filesystem is its own encryption root, under the
        // sender's key (`received_key`). Any other takes the key of the
        // encrypted filesystem it is under, as a volume received there
        // does (refused before anything is made when that key is not
        // loaded).
        let (crypt, _) = self
            .crypt_of_new(
                hidden_short,
                received_key.map(crate::pool::dataset::keys::CreateKey::Received),
            )
            .await?;
        let id = self.allocate_object_id();
        let mut dnode = new_dnode(
            ObjectType::FsObjects,
            TABLE_BLOCK_SHIFT,
            INDIRECT_BLOCK_SHIFT,
            0,
            self.txg.open(),
        );
        dnode.checksum_algo = self.volume_settings(hidden_short, &properties).checksum;
        // Its objects' attributes are sealed when it is encrypted, unless
        // a raw stream of an older build brings them in the clear.
        dnode.bonus = FsHeader {
            sealed_bonuses: crypt.is_some() && !clear_attributes,
            ..Filesystem::receive_header(info)
        }
        .encode();
        let table = self.objects.create(id, dnode);
        self.add_filesystem(hidden_short, table, properties, Default::default(), crypt)
            .await
    }

    /// Destroys a filesystem and frees its blocks; with `recursive`, its
    /// snapshots too (which it refuses without). A snapshot with clones
    /// keeps it: destroy or promote the clones first.
    pub async fn destroy_filesystem(
        self: &Rc<Self>,
        name: &str,
        recursive: bool,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let fs = self.filesystem(name)?;
        let short = fs.short_name().to_string();
        if let Some(child) = self.descendants(&short).last() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot destroy {name}: it has children ({}/{child}): destroy them first, or use destroy -r",
                self.name
            )));
        }
        let record = self
            .filesystem_record(&short)
            .ok_or_else(|| PoolError::Corrupt(format!("filesystem {short} has no record")))?;
        let snapshots = self.snapshots_to_destroy(name, &short, &record.lineage, recursive)?;
        let _exclusive = fs.exclusive().await;
        let hold = self.txg.hold_builds();
        for snapshot in snapshots.iter().rev() {
            self.destroy_snapshot_locked(snapshot).await?;
        }
        // Blocks born after the origin are its own (all of them when it is
        // not a clone); older ones, and its dead list, are the origin's.
        let origin_txg = fs.table.dnode().origin_txg;
        let pointers = self
            .pointers_born_after(&fs.table, Some(&fs), origin_txg)
            .await?;
        self.free_in_slices(&pointers).await;
        fs.table.dead.borrow_mut().clear();
        self.drop_dead_list(fs.table.dead_list.replace(0))?;
        self.objects.clear_dnode(fs.table.id).await?;
        fs.retire();
        self.abandon_log_chain(crate::pool::Owner::Filesystem(&fs));
        self.datasets.filesystems.remove(&short);
        {
            let mut directory = self.datasets.directory.edit();
            directory.filesystems.remove(&short);
            if let Some(origin) = &record.lineage.origin {
                if let Some(lineage) = directory.lineage_mut(&origin.volume) {
                    for snapshot in lineage.snapshots.iter_mut() {
                        snapshot.clones.retain(|clone| clone != &short);
                    }
                }
            }
        }
        drop(hold);
        let committed = self.commit().await;
        self.datasets.filesystems_changed.notify_all();
        // A removal that waited for this filesystem's claimed log goes on.
        self.removal_resume();
        committed
    }

    /// Where filesystem `short` is mounted by this server, if it is.
    pub fn mounted_at(&self, short: &str) -> Option<String> {
        self.mounts.borrow().mounted.get(short).cloned()
    }

    /// Whether filesystem `short` should be mounted: an administrator's
    /// `unmount` holds it off until `mount` (or the next `serve`), and one
    /// whose intent log an import claimed waits for its replay (its key's
    /// load replays it before it is served: a write before would be undone).
    pub fn mount_wanted(&self, short: &str) -> bool {
        !self.mounts.borrow().held_off.contains(short)
            && self
                .filesystem(short)
                .is_ok_and(|fs| self.filesystem_key_available(&fs) && !fs.log.is_claimed())
    }

    /// Filesystem `old` is now `new`: an `unmount` of it still holds.
    pub(in crate::pool) fn rename_mount_state(&self, old: &str, new: &str) {
        let mut mounts = self.mounts.borrow_mut();
        if mounts.held_off.remove(old) {
            mounts.held_off.insert(new.to_string());
        }
    }

    /// The server mounted filesystem `short` at `path` (None: unmounted it).
    pub fn note_mount(&self, short: &str, path: Option<String>) {
        let mut mounts = self.mounts.borrow_mut();
        match path {
            Some(path) => mounts.mounted.insert(short.to_string(), path),
            None => mounts.mounted.remove(short),
        };
        drop(mounts);
        self.mounts_noted.notify_all();
    }

    /// `ironpool mount` (`wanted`) or `unmount` of filesystem `name`: asks
    /// the server to mount or unmount it and waits until it did, up to
    /// [`MOUNT_WAIT_SECONDS`]. Returns where it is mounted.
    pub async fn set_mounted(&self, name: &str, wanted: bool) -> Result<Option<String>, PoolError> {
        let fs = self.filesystem(name)?;
        let short = fs.short_name().to_string();
        if wanted && !self.filesystem_key_available(&fs) {
            return Err(PoolError::KeyUnavailable(format!(
                "{name} is encrypted: load its key first (ironpool load-key {name})"
            )));
        }
        if wanted {
            self.check_log_not_claimed(&fs)?;
        }
        if wanted && self.filesystem_mountpoint(&short).is_none() {
            return Err(PoolError::InvalidArgument(format!(
                "{name} has mountpoint=none or legacy: set a mountpoint first"
            )));
        }
        {
            let mut mounts = self.mounts.borrow_mut();
            if wanted {
                mounts.held_off.remove(&short);
            } else {
                mounts.held_off.insert(short.clone());
            }
        }
        self.datasets.filesystems_changed.notify_all();
        let deadline =
            crate::rt::now().saturating_add(std::time::Duration::from_secs(MOUNT_WAIT_SECONDS));
        loop {
            let noted = self.mounts_noted.notified();
            let at = self.mounted_at(&short);
            if at.is_some() == wanted {
                return Ok(at);
            }
            if crate::rt::now() >= deadline {
                return Err(PoolError::Io(format!(
                    "{name} is not {} after {MOUNT_WAIT_SECONDS} s (is the pool served by `ironpool serve`? see its log)",
                    if wanted { "mounted" } else { "unmounted" }
                )));
            }
            let _ = crate::rt::timeout(std::time::Duration::from_millis(200), noted).await;
        }
    }

    /// Completes once a filesystem is created or destroyed after the call
    /// (the server mounts and unmounts them).
    pub fn filesystems_changed(&self) -> crate::rt::sync::Notified<'_> {
        self.datasets.filesystems_changed.notified()
    }
}
