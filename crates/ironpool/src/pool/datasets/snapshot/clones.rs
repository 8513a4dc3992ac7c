//! Clones of snapshots (volumes and filesystems), rollback to a snapshot,
//! and promotion of a clone over its origin.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::Pool;
use crate::format::dnode::DNODE_FLAG_READ_ONLY;
use crate::object::Object;
use crate::pool::dataset::directory::{Lineage, SnapshotName, SnapshotRecord};
use crate::pool::dataset::split_snapshot_name;
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::pool::PoolError;

impl Pool {
    /// Creates volume `clone` from snapshot `origin`, sharing its blocks.
    pub async fn clone_snapshot(
        self: &Rc<Self>,
        origin: &str,
        clone: &str,
    ) -> Result<Rc<Volume>, PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let clone_short = self.new_dataset_short_name(clone)?;
        let clone_volume = self.clone_locked(origin, &clone_short).await?;
        self.commit().await?;
        Ok(clone_volume)
    }

    /// The snapshot `origin` names, and a new head object for a clone of
    /// it: a copy of its dnode, writable, whose blocks born at or before
    /// the snapshot stay the origin's.
    async fn clone_head(
        &self,
        origin: &str,
    ) -> Result<(SnapshotName, Lineage, Rc<Object>), PoolError> {
        let (volume, snapshot) = split_snapshot_name(&self.name, origin).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{origin}' is not a snapshot name"))
        })?;
        let record = self.record(volume)?;
        let source = record
            .snapshot(snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(origin.to_string()))?;
        let snapshot_object = self.objects.open(source.object).await?;
        let id = self.allocate_object_id();
        let mut dnode = snapshot_object.dnode();
        dnode.flags &= !DNODE_FLAG_READ_ONLY;
        dnode.creation_txg = self.txg.open();
        dnode.prev_snapshot_txg = source.txg;
        dnode.origin_txg = source.txg;
        let object = self.objects.create(id, dnode);
        let name = SnapshotName {
            volume: volume.to_string(),
            snapshot: snapshot.to_string(),
        };
        let lineage = Lineage {
            origin: Some(name.clone()),
            ..Lineage::default()
        };
        Ok((name, lineage, object))
    }

    /// Lists `clone` among the dependents of snapshot `origin`.
    fn note_clone(&self, origin: &SnapshotName, clone: &str) {
        let mut directory = self.datasets.directory.edit();
        if let Some(source) = directory.lineage_mut(&origin.volume).and_then(|lineage| {
            lineage
                .snapshots
                .iter_mut()
                .find(|existing| existing.name == origin.snapshot)
        }) {
            source.clones.push(clone.to_string());
        }
        drop(directory);
    }

    /// Creates the clone in the open txg (the caller holds the admin lock).
    pub(crate) async fn clone_locked(
        self: &Rc<Self>,
        origin: &str,
        clone_short: &str,
    ) -> Result<Rc<Volume>, PoolError> {
        let clone_short = clone_short.to_string();
        let (volume, _) = split_snapshot_name(&self.name, origin).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{origin}' is not a snapshot name"))
        })?;
        let record = self.volume_record(volume)?;
        self.check_name_free(&clone_short)?;
        self.check_key_placement(
            &clone_short,
            record.crypt.as_ref().map(|crypt| crypt.key_guid),
            false,
        )?;
        let (origin_name, lineage, object) = self.clone_head(origin).await?;
        let mut clone_record = crate::pool::volume::record(
            object.id,
            record.size_bytes,
            record.block_bytes,
            self.txg.open(),
            record.own_properties(),
        );
        clone_record.lineage = lineage;
        // The clone shares its origin's blocks, so its key: one encryption
        // root (`dataset::keys`).
        clone_record.crypt = record.crypt.clone();
        let clone_volume = Volume::new(
            format!("{}/{clone_short}", self.name),
            object,
            &clone_record,
            self.volume_settings(&clone_short, &clone_record.properties),
        );
        self.datasets
            .directory
            .edit()
            .volumes
            .insert(clone_short.clone(), clone_record);
        self.note_clone(&origin_name, &clone_short);
        self.datasets
            .volumes
            .insert(clone_short, clone_volume.clone());
        Ok(clone_volume)
    }

    /// Creates filesystem `clone` from snapshot `origin` of a filesystem,
    /// sharing its blocks. It takes the origin's properties but its
    /// mountpoint (its own default, `/POOL/CLONE`), then `properties`.
    pub async fn clone_filesystem(
        self: &Rc<Self>,
        origin: &str,
        clone: &str,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        let mut checked = BTreeMap::new();
        for (key, value) in &properties {
            let value = crate::pool::dataset::props::validate_filesystem(key, value)?;
            checked.insert(key.clone(), value);
        }
        self.check_new_limits(clone, &checked)?;
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let clone_short = self.new_dataset_short_name(clone)?;
        let fs = self
            .clone_filesystem_locked(origin, &clone_short, checked)
            .await?;
        self.commit().await?;
        self.notify_filesystems_changed();
        Ok(fs)
    }

    /// Creates the clone in the open txg (the caller holds the admin lock
    /// and checked `properties`).
    pub(crate) async fn clone_filesystem_locked(
        self: &Rc<Self>,
        origin: &str,
        clone_short: &str,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Filesystem>, PoolError> {
        self.check_name_free(clone_short)?;
        let (source, _) = split_snapshot_name(&self.name, origin).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{origin}' is not a snapshot name"))
        })?;
        let source_record = self
            .filesystem_record(source)
            .ok_or_else(|| PoolError::InvalidArgument(format!("{origin}: not a filesystem's")))?;
        let mut inherited = source_record.own_properties();
        inherited.remove("mountpoint");
        inherited.extend(properties);
        self.check_key_placement(
            clone_short,
            source_record.crypt.as_ref().map(|crypt| crypt.key_guid),
            false,
        )?;
        let (origin_name, lineage, table) = self.clone_head(origin).await?;
        // The clone shares its origin's blocks, so its key: one encryption
        // root (`dataset::keys`).
        let fs = self
            .add_filesystem(clone_short, table, inherited, lineage, source_record.crypt)
            .await?;
        self.note_clone(&origin_name, clone_short);
        Ok(fs)
    }

    /// Rolls a volume or a filesystem back to `snapshot` (the latest, or
    /// with `recursive` an older one: the later snapshots are destroyed).
    /// A mounted filesystem is mounted again by the server: files open in
    /// it fail from then on, as after a forced unmount.
    pub async fn rollback(
        self: &Rc<Self>,
        full_name: &str,
        recursive: bool,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        self.rollback_locked(full_name, recursive).await?;
        let committed = self.commit().await;
        self.notify_filesystems_changed();
        committed
    }

    /// Rolls back in the open txg (the caller holds the admin lock).
    pub(crate) async fn rollback_locked(
        self: &Rc<Self>,
        full_name: &str,
        recursive: bool,
    ) -> Result<(), PoolError> {
        let (volume, snapshot) = split_snapshot_name(&self.name, full_name).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{full_name}' is not a snapshot name"))
        })?;
        let record = self.record(volume)?;
        let index = record
            .snapshots
            .iter()
            .position(|existing| existing.name == snapshot)
            .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.to_string()))?;
        let later: Vec<String> = record.snapshots[index + 1..]
            .iter()
            .map(|later| format!("{}/{volume}@{}", self.name, later.name))
            .collect();
        if !later.is_empty() && !recursive {
            return Err(PoolError::InvalidArgument(format!(
                "more recent snapshots exist ({}); use -r to destroy them",
                later.join(", ")
            )));
        }
        // Refuse before changing anything: all or nothing.
        for name in &later {
            self.check_not_held(name)?;
        }
        self.check_no_clones(volume, &record.snapshots[index + 1..])?;
        let fs = self.datasets.filesystems.get(volume);
        if let Some(fs) = &fs {
            self.check_log_not_claimed(fs)?;
        }
        let head_volume = match &fs {
            Some(_) => None,
            None => Some(self.volume(volume)?),
        };
        let head = self.head_object(volume)?;
        // No writes (or any other change) while the tree is swapped.
        let _writers = match &head_volume {
            Some(head) => Some(self.exclusive(head).await?),
            None => None,
        };
        let _changes = match &fs {
            Some(fs) => Some(fs.exclusive().await),
            None => None,
        };
        // Nor txg builds: the walk below awaits reads, and a build meanwhile
        // would sync the dataset's dirty nodes (freeing their old copies)
        // under the pointers already collected, which would then be freed
        // twice.
        let hold = self.txg.hold_builds();
        for name in later.iter().rev() {
            self.destroy_snapshot_locked(name).await?;
        }
        let target = self.record(volume)?.snapshots[index].clone();
        let snapshot_object = self.objects.open(target.object).await?;
        // Blocks born after the snapshot belong to the dataset alone: free
        // them (for a filesystem, those of its table and of every object).
        let born_after = self
            .pointers_born_after(&head, fs.as_deref(), target.txg)
            .await?;
        self.free_in_slices(&born_after).await;
        // What the dataset let go of since the snapshot is the snapshot's again.
        head.dead.borrow_mut().clear();
        let dead_list = head.dead_list.replace(0);
        self.drop_dead_list(dead_list)?;
        let mut dnode = snapshot_object.dnode();
        dnode.flags &= !DNODE_FLAG_READ_ONLY;
        let current = head.dnode();
        dnode.creation_txg = current.creation_txg;
        dnode.prev_snapshot_txg = target.txg;
        dnode.origin_txg = current.origin_txg;
        self.objects.reset_tree(&head, dnode);
        {
            let mut directory = self.datasets.directory.edit();
            directory
                .lineage_mut(volume)
                .expect("checked above")
                .dead_list = 0;
            // Times a replay kept for files of the state rolled back from
            // (a replay after the snapshot).
            if let Some(record) = directory.filesystems.get_mut(volume) {
                record
                    .replayed_times
                    .retain(|times| times.txg <= target.txg);
            }
            // The volume takes back the size it had then (it may have grown since).
            if let (Some(head_volume), Some(record)) =
                (&head_volume, directory.volumes.get_mut(volume))
            {
                if dnode.length_bytes > 0 {
                    record.size_bytes = dnode.length_bytes;
                    head_volume.size_bytes.set(dnode.length_bytes);
                }
            }
        }
        if let Some(fs) = fs {
            // The filesystem's objects are the snapshot's now: a new set
            // over the table, and the old one serves no more requests.
            let fs = self.reopen_filesystem(volume, &fs).await?;
            // Files the snapshot holds open with no names left are freed
            // now, as an import would.
            fs.reclaim_unlinked(self)
                .await
                .map_err(|error| PoolError::Io(format!("{}: {error}", fs.name())))?;
        }
        drop(hold);
        Ok(())
    }

    /// Makes clone `clone` independent of its origin: the origin snapshot and the
    /// ones before it move to the clone; the former origin dataset becomes a clone.
    pub async fn promote(self: &Rc<Self>, clone: &str) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let clone_short = clone
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(clone)
            .to_string();
        let clone_record = self.record(&clone_short)?;
        let origin = clone_record
            .origin
            .clone()
            .ok_or_else(|| PoolError::InvalidArgument(format!("{clone} is not a clone")))?;
        let origin_record = self.record(&origin.volume)?;
        let split = origin_record
            .snapshots
            .iter()
            .position(|snapshot| snapshot.name == origin.snapshot)
            .ok_or_else(|| {
                PoolError::Corrupt(format!(
                    "origin {}@{} is missing",
                    origin.volume, origin.snapshot
                ))
            })?;
        for moving in &origin_record.snapshots[..=split] {
            if clone_record
                .snapshots
                .iter()
                .any(|own| own.name == moving.name)
            {
                return Err(PoolError::InvalidArgument(format!(
                    "{clone} already has a snapshot named {}; rename it first",
                    moving.name
                )));
            }
        }
        let origin_head = self.head_object(&origin.volume)?;
        let clone_head = self.head_object(&clone_short)?;
        let origin_txg = origin_record.snapshots[split].txg;
        let clone_origin_txg = self.origin_txg(&origin_record);
        {
            let mut directory = self.datasets.directory.edit();
            let moved: Vec<SnapshotRecord> = {
                let origin_record = directory
                    .lineage_mut(&origin.volume)
                    .expect("checked above");
                let mut moved: Vec<SnapshotRecord> =
                    origin_record.snapshots.drain(..=split).collect();
                // The former origin volume now depends on the moved snapshot.
                if let Some(last) = moved.last_mut() {
                    last.clones.retain(|name| name != &clone_short);
                    last.clones.push(origin.volume.clone());
                }
                let new_origin = origin_record.origin.take();
                origin_record.origin = Some(SnapshotName {
                    volume: clone_short.clone(),
                    snapshot: origin.snapshot.clone(),
                });
                // The clone inherits the origin volume's own origin (if any): that
                // snapshot now lists the clone among its dependents instead.
                if let Some(grand) = &new_origin {
                    if let Some(grand_snapshot) =
                        directory.lineage_mut(&grand.volume).and_then(|record| {
                            record
                                .snapshots
                                .iter_mut()
                                .find(|snapshot| snapshot.name == grand.snapshot)
                        })
                    {
                        for dependent in grand_snapshot.clones.iter_mut() {
                            if *dependent == origin.volume {
                                *dependent = clone_short.clone();
                            }
                        }
                    }
                }
                let clone_record = directory.lineage_mut(&clone_short).expect("checked above");
                clone_record.origin = new_origin;
                let own = std::mem::take(&mut clone_record.snapshots);
                clone_record.snapshots = moved.clone();
                clone_record.snapshots.extend(own);
                moved
            };
            // Clones of the moved snapshots now name the clone as their origin.
            for snapshot in &moved {
                for dependent in &snapshot.clones {
                    if dependent == &origin.volume {
                        continue;
                    }
                    if let Some(dependent_record) = directory.lineage_mut(dependent) {
                        if let Some(origin_name) = dependent_record.origin.as_mut() {
                            origin_name.volume = clone_short.clone();
                        }
                    }
                }
            }
        }
        origin_head.dnode.borrow_mut().origin_txg = origin_txg;
        origin_head.dirty.set(true);
        clone_head.dnode.borrow_mut().origin_txg = clone_origin_txg;
        clone_head.dirty.set(true);
        // Cached snapshot exports keep working: only their names moved.
        self.datasets.snapshot_volumes.take();
        // Snapshots of filesystems are opened again under their new names.
        for fs in self.datasets.snapshot_filesystems.take().into_values() {
            fs.retire();
        }
        self.commit().await
    }
}
