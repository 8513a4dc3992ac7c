//! How a received dataset takes the target's place: in one txg, with the
//! stream's snapshot, renamed (a full stream) or its tree swapped in (an
//! incremental one, after the target is rolled back to the stream's
//! source), and the stream's properties set.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::format::dnode::DNODE_FLAG_READ_ONLY;
use crate::format::stream::StreamBegin;
use crate::object::Object;
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};

impl Pool {
    /// Makes the hidden volume the target, with the stream's snapshot, in one txg.
    pub(super) async fn finish_receive(
        self: &Rc<Self>,
        short: &str,
        hidden_short: &str,
        begin: &StreamBegin,
        snapshot_name: &str,
        force: bool,
    ) -> Result<(), PoolError> {
        if begin.filesystem.is_some() {
            return self
                .finish_fs_receive(short, hidden_short, begin, snapshot_name, force)
                .await;
        }
        // Everything received is committed first: the hidden tree is then clean
        // on disk and can change hands as a whole.
        self.drain_volume(&self.volume(hidden_short)?).await?;
        self.txg.wait_durable(self, self.txg.open()).await?;
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let hidden = self.volume(hidden_short)?;
        let _hidden_writers = self.exclusive(&hidden).await?;
        if begin.from_guid == 0 {
            self.check_not_created_meanwhile(short)?;
            let mut record = self
                .datasets
                .directory
                .edit()
                .volumes
                .remove(hidden_short)
                .ok_or_else(|| PoolError::NoSuchVolume(hidden_short.to_string()))?;
            record.receive = None;
            let settings = self.volume_settings(short, &record.own_properties());
            let volume = Volume::new(
                format!("{}/{short}", self.name),
                hidden.object.clone(),
                &record,
                settings,
            );
            self.datasets
                .directory
                .edit()
                .volumes
                .insert(short.to_string(), record);
            self.datasets.volumes.remove(hidden_short);
            self.datasets.volumes.insert(short.to_string(), volume);
        } else {
            let head = self.volume(short)?;
            self.roll_back_for_receive(short, begin, force).await?;
            let _head_writers = self.exclusive(&head).await?;
            // A client may have written between the rollback and this point:
            // the head's own blocks would leak under the swap. Refuse; nothing
            // is lost (the received data stays in the hidden volume's tree
            // until the failure path discards or keeps it for resume).
            if self.changed_since_latest_snapshot(short)? {
                return Err(PoolError::InvalidArgument(format!("{}/{short} was written while the receive finished; stop its writers and receive again", self.name)));
            }
            if hidden.object.has_dirty_nodes() {
                return Err(PoolError::Corrupt(format!(
                    "{hidden_short} changed while it was being received"
                )));
            }
            self.take_received_tree(short, &head.object, hidden_short, &hidden.object)?;
            head.size_bytes
                .set(begin.size_bytes.max(head.size_bytes.get()));
            {
                let mut directory = self.datasets.directory.edit();
                let record = directory
                    .volumes
                    .get_mut(short)
                    .ok_or_else(|| PoolError::NoSuchVolume(short.to_string()))?;
                record.size_bytes = head.size_bytes.get();
            }
            self.datasets.volumes.remove(hidden_short);
            hidden.begin_destroy();
            self.drop_dnode(hidden.object.id)?;
        }
        self.datasets
            .request_snapshot(short, snapshot_name, begin.to_guid);
        self.commit().await
    }
}

impl Pool {
    /// Makes a receive's hidden filesystem the target, with the stream's
    /// snapshot, in one txg: renamed for a full stream; for an incremental
    /// one, its dnode table takes the place of the target's (as a rollback
    /// does), and the target is mounted again by the server.
    async fn finish_fs_receive(
        self: &Rc<Self>,
        short: &str,
        hidden_short: &str,
        begin: &StreamBegin,
        snapshot_name: &str,
        force: bool,
    ) -> Result<(), PoolError> {
        // Everything received is committed first: the hidden tree is then
        // clean on disk and can change hands as a whole.
        self.txg.wait_durable(self, self.txg.open()).await?;
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let hidden = self.filesystem(hidden_short)?;
        let _hidden_exclusive = hidden.exclusive().await;
        if begin.from_guid == 0 {
            self.check_not_created_meanwhile(short)?;
            let mut record = self
                .datasets
                .directory
                .edit()
                .filesystems
                .remove(hidden_short)
                .ok_or_else(|| PoolError::NoSuchVolume(hidden_short.to_string()))?;
            record.receive = None;
            record.intent_log = None;
            self.datasets.filesystems.remove(hidden_short);
            hidden.retire();
            self.abandon_log_chain(crate::pool::Owner::Filesystem(&hidden));
            self.datasets
                .directory
                .edit()
                .filesystems
                .insert(short.to_string(), record.clone());
            let fs = self
                .open_head_filesystem(short, hidden.table.clone(), &record)
                .await?;
            self.datasets.filesystems.insert(short.to_string(), fs);
        } else {
            self.roll_back_for_receive(short, begin, force).await?;
            let head = self.filesystem(short)?;
            let _head_exclusive = head.exclusive().await;
            // A client may have changed it between the rollback and this
            // point: the head's own blocks would leak under the swap.
            // Refuse; nothing is lost (the received objects stay in the
            // hidden filesystem until the failure path discards or keeps it).
            if self.changed_since_latest_snapshot(short)? {
                return Err(PoolError::InvalidArgument(format!("{}/{short} was changed while the receive finished; stop its writers and receive again", self.name)));
            }
            if hidden.table.has_dirty_nodes() || hidden.table.dirty.get() {
                return Err(PoolError::Corrupt(format!(
                    "{hidden_short} changed while it was being received"
                )));
            }
            // No txg build between the swap and the new filesystem over it.
            let hold = self.txg.hold_builds();
            self.take_received_tree(short, &head.table, hidden_short, &hidden.table)?;
            self.datasets.filesystems.remove(hidden_short);
            hidden.retire();
            self.drop_dnode(hidden.table.id)?;
            self.reopen_filesystem(short, &head).await?;
            drop(hold);
        }
        self.datasets
            .request_snapshot(short, snapshot_name, begin.to_guid);
        let committed = self.commit().await;
        self.notify_filesystems_changed();
        committed
    }

    /// Before an incremental stream's tree takes the target's place: rolls
    /// the target back to the stream's source snapshot when it has later
    /// snapshots or changes (`force` allowing: see `incremental_source`).
    async fn roll_back_for_receive(
        self: &Rc<Self>,
        short: &str,
        begin: &StreamBegin,
        force: bool,
    ) -> Result<(), PoolError> {
        let from = self.incremental_source(short, begin, force)?;
        let latest_is_source = self
            .datasets
            .directory
            .read()
            .lineage(short)
            .and_then(|lineage| lineage.snapshots.last())
            .is_some_and(|latest| latest.name == from);
        if !latest_is_source || self.changed_since_latest_snapshot(short)? {
            self.rollback_locked(&format!("{}/{short}@{from}", self.name), true)
                .await?;
        }
        Ok(())
    }

    /// The head of dataset `short` (`head`: a volume's tree, a
    /// filesystem's table) takes the received tree of hidden dataset
    /// `hidden_short` (`hidden`), whose record leaves the directory; what
    /// the received data replaced of the source snapshot is the head's
    /// dead list now. No await: one txg sees the swap whole.
    fn take_received_tree(
        &self,
        short: &str,
        head: &Object,
        hidden_short: &str,
        hidden: &Object,
    ) -> Result<(), PoolError> {
        let current = head.dnode();
        let mut dnode = hidden.dnode();
        dnode.flags &= !DNODE_FLAG_READ_ONLY;
        dnode.creation_txg = current.creation_txg;
        dnode.origin_txg = current.origin_txg;
        self.objects.reset_tree(head, dnode);
        let pending_dead = std::mem::take(&mut *hidden.dead.borrow_mut());
        head.dead.borrow_mut().extend(pending_dead);
        let dead_list = hidden.dead_list.replace(0);
        head.dead_list.set(dead_list);
        let mut directory = self.datasets.directory.edit();
        let origin = match directory.volumes.remove(hidden_short) {
            Some(record) => record.lineage.origin,
            None => directory
                .filesystems
                .remove(hidden_short)
                .and_then(|record| record.lineage.origin),
        };
        if let Some(origin) = origin {
            if let Some(snapshot) = directory.lineage_mut(&origin.volume).and_then(|lineage| {
                lineage
                    .snapshots
                    .iter_mut()
                    .find(|snapshot| snapshot.name == origin.snapshot)
            }) {
                snapshot.clones.retain(|clone| clone != hidden_short);
            }
        }
        directory
            .lineage_mut(short)
            .ok_or_else(|| PoolError::NoSuchVolume(short.to_string()))?
            .dead_list = dead_list;
        Ok(())
    }

    /// A full stream's target must still be free when the receive ends.
    fn check_not_created_meanwhile(&self, short: &str) -> Result<(), PoolError> {
        if self.datasets.directory.read().lineage(short).is_some() {
            return Err(PoolError::VolumeExists(format!(
                "{}/{short} was created while receiving",
                self.name
            )));
        }
        Ok(())
    }

    /// `receive -o`'s properties, checked (and normalised) before anything
    /// is received, as the dataset the stream makes or updates takes them.
    pub(super) fn receive_properties(
        &self,
        begin: &StreamBegin,
        properties: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, PoolError> {
        let mut checked = BTreeMap::new();
        for (key, value) in properties {
            let value = if begin.filesystem.is_some() {
                crate::pool::dataset::props::validate_filesystem(key, value)?
            } else {
                crate::pool::dataset::props::validate(key, value, false)?
            };
            checked.insert(key.clone(), value);
        }
        Ok(checked)
    }
}
