//! `rename POOL/A POOL/B/C`: a dataset and everything below it take new
//! names within the pool, as `zfs rename` does.
//!
//! The tree is only in the names (see `directory`), so a rename rewrites
//! the keys of the moved datasets, every reference to them (a clone's
//! origin, a snapshot's list of clones) and the names the open datasets
//! carry, all between two awaits: a request, an intent-log commit or a
//! txg build sees either every old name or every new one. No data moves.
//! A running server mounts moved filesystems at their new mountpoints
//! (files open in the old mount keep working until closed, as after a
//! `set mountpoint`); NBD clients already connected keep their volume,
//! new ones ask for the new name. Settings inherited from a new parent
//! apply at once.
//!
//! `rename [-r] POOL/DS@OLD POOL/DS@NEW` renames a snapshot (with `-r`, the
//! snapshot of that name of every dataset below too, in one txg, as
//! `zfs rename -r` does): its record, and the origin its clones name. A
//! client reading it over NBD or in `.zfs/snapshot` keeps what it has
//! open; new lookups find it under the new name.

use std::rc::Rc;

use crate::format::valid_name;
use crate::pool::dataset::directory::{is_within, valid_dataset_name, Directory};
use crate::pool::dataset::split_snapshot_name;
use crate::pool::datasets::receive::RECEIVE_SUFFIX;
use crate::pool::{is_hidden_dataset, Pool, PoolError};

/// `name` (`old` or below it) renamed so that `old` becomes `new`.
fn moved(name: &str, old: &str, new: &str) -> String {
    format!("{new}{}", &name[old.len()..])
}

/// Rewrites the keys of the datasets in `names` (`old` and those below it)
/// and every reference to them in `directory`.
fn rename_in_directory(directory: &mut Directory, names: &[String], old: &str, new: &str) {
    for name in names {
        let renamed = moved(name, old, new);
        if let Some(record) = directory.volumes.remove(name) {
            directory.volumes.insert(renamed, record);
        } else if let Some(record) = directory.filesystems.remove(name) {
            directory.filesystems.insert(renamed, record);
        }
    }
    for lineage in directory.lineages_mut() {
        if let Some(origin) = &mut lineage.origin {
            if is_within(&origin.volume, old) {
                origin.volume = moved(&origin.volume, old, new);
            }
        }
        for snapshot in &mut lineage.snapshots {
            for clone in &mut snapshot.clones {
                if is_within(clone, old) {
                    *clone = moved(clone, old, new);
                }
            }
        }
    }
}

/// Renames snapshot `old` of each dataset in `datasets` to `new`, and the
/// origin every clone of it names.
fn rename_snapshots_in_directory(
    directory: &mut Directory,
    datasets: &[String],
    old: &str,
    new: &str,
) {
    for dataset in datasets {
        if let Some(lineage) = directory.lineage_mut(dataset) {
            for snapshot in &mut lineage.snapshots {
                if snapshot.name == old {
                    snapshot.name = new.to_string();
                }
            }
        }
    }
    for lineage in directory.lineages_mut() {
        if let Some(origin) = &mut lineage.origin {
            if origin.snapshot == old && datasets.contains(&origin.volume) {
                origin.snapshot = new.to_string();
            }
        }
    }
}

impl Pool {
    /// Renames snapshot `from` (`POOL/DS@OLD`) to `to` (`POOL/DS@NEW`,
    /// `@NEW` or `NEW`); with `recursive`, snapshot OLD of every dataset
    /// below DS that has one too, in one txg. Returns the names given, old
    /// and new.
    pub async fn rename_snapshot(
        self: &Rc<Self>,
        from: &str,
        to: &str,
        recursive: bool,
    ) -> Result<Vec<(String, String)>, PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let (dataset, old) = split_snapshot_name(&self.name, from).ok_or_else(|| {
            PoolError::InvalidArgument(format!("'{from}': snapshots are named POOL/DATASET@NAME"))
        })?;
        let new = match to.split_once('@') {
            Some((to_dataset, new)) => {
                let to_dataset = to_dataset
                    .strip_prefix(&self.name)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .unwrap_or(to_dataset);
                if !to_dataset.is_empty() && to_dataset != dataset {
                    return Err(PoolError::InvalidArgument(format!(
                        "cannot rename {from} to {to}: a snapshot stays with its dataset (rename the dataset to move it)"
                    )));
                }
                new
            }
            None => to,
        };
        if !valid_name(new) {
            return Err(PoolError::InvalidName(new.to_string()));
        }
        let datasets: Vec<String> = {
            let directory = self.datasets.directory.read();
            let lineage = directory
                .lineage(dataset)
                .filter(|_| !is_hidden_dataset(dataset))
                .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{dataset}", self.name)))?;
            if lineage.snapshot(old).is_none() {
                return Err(PoolError::NoSuchVolume(format!(
                    "{}/{dataset}@{old}",
                    self.name
                )));
            }
            let mut datasets = vec![dataset.to_string()];
            if recursive {
                datasets.extend(self.descendants(dataset).into_iter().filter(|below| {
                    !is_hidden_dataset(below)
                        && directory
                            .lineage(below)
                            .is_some_and(|lineage| lineage.snapshot(old).is_some())
                }));
            }
            for name in &datasets {
                if directory
                    .lineage(name)
                    .is_some_and(|lineage| lineage.snapshot(new).is_some())
                {
                    return Err(PoolError::VolumeExists(format!(
                        "{}/{name}@{new}",
                        self.name
                    )));
                }
            }
            datasets
        };
        if old == new {
            return Ok(Vec::new());
        }
        let full = |dataset: &str, snapshot: &str| format!("{}/{dataset}@{snapshot}", self.name);
        {
            let holds = self.datasets.snapshot_holds.borrow();
            if let Some(name) = datasets
                .iter()
                .find(|name| holds.contains_key(&full(name, old)))
            {
                return Err(PoolError::InvalidArgument(format!(
                    "cannot rename {}: it is being sent or compared; try again when that ends",
                    full(name, old)
                )));
            }
        }
        // From here to the commit nothing awaits.
        rename_snapshots_in_directory(&mut self.datasets.directory.edit(), &datasets, old, new);
        let gone: Vec<String> = datasets.iter().map(|name| full(name, old)).collect();
        self.datasets.forget_snapshots(&gone);
        self.datasets.filesystems_changed.notify_all();
        self.commit().await?;
        Ok(datasets
            .iter()
            .map(|name| (full(name, old), full(name, new)))
            .collect())
    }

    /// Renames dataset `from` (`POOL/A` or `A`) and every dataset below it
    /// to `to`, whose parent must exist (the caller makes missing ones for
    /// `-p`). Returns the names given, old and new, parents first.
    pub async fn rename_dataset(
        self: &Rc<Self>,
        from: &str,
        to: &str,
    ) -> Result<Vec<(String, String)>, PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        if from.contains(['@', '#']) || to.contains(['@', '#']) {
            return Err(PoolError::InvalidArgument(format!(
                "cannot rename {from}: snapshots and bookmarks keep their names (rename the dataset they belong to)"
            )));
        }
        let prefix = format!("{}/", self.name);
        let old = from.strip_prefix(&prefix).unwrap_or(from).to_string();
        let new = to.strip_prefix(&prefix).unwrap_or(to).to_string();
        if is_hidden_dataset(&old) || self.datasets.directory.read().lineage(&old).is_none() {
            return Err(PoolError::InvalidArgument(format!("no dataset '{from}'")));
        }
        if !valid_dataset_name(&self.name, &new) {
            return Err(PoolError::InvalidName(new));
        }
        if is_within(&new, &old) {
            return Err(PoolError::InvalidArgument(format!(
                "cannot rename {from} to {to}: a dataset cannot move below itself"
            )));
        }
        self.check_parent(&new)?;
        self.check_name_free(&new)?;
        // Its key, and whether it shares its parent's (took it when made).
        let (key_guid, inherits) = {
            let directory = self.datasets.directory.read();
            let key_guid = directory.crypt(&old).flatten().map(|crypt| crypt.key_guid);
            let parent_guid = directory.parent_crypt(&old).map(|crypt| crypt.key_guid);
            (key_guid, key_guid.is_some() && parent_guid == key_guid)
        };
        self.check_key_placement(&new, key_guid, inherits)?;
        let mut names = vec![old.clone()];
        names.extend(self.descendants(&old));
        {
            let directory = self.datasets.directory.read();
            for name in &names {
                let receiving = format!("{name}{RECEIVE_SUFFIX}");
                if is_hidden_dataset(name) || directory.lineage(&receiving).is_some() {
                    return Err(PoolError::InvalidArgument(format!(
                        "cannot rename {from}: a receive into {}/{} is in progress: let it finish or abort it (receive -A)",
                        self.name,
                        name.trim_end_matches(RECEIVE_SUFFIX)
                    )));
                }
            }
            // A receive may be waiting to create a dataset of the new name.
            if directory
                .lineage(&format!("{new}{RECEIVE_SUFFIX}"))
                .is_some()
            {
                return Err(PoolError::InvalidArgument(format!(
                    "cannot rename {from} to {to}: a receive into {to} is in progress"
                )));
            }
        }
        if let Some(sent) = self.datasets.held_snapshot_within(&self.name, &old) {
            return Err(PoolError::InvalidArgument(format!(
                "cannot rename {from}: {sent} is being sent or compared; try again when that ends"
            )));
        }
        // From here to the end of the switch nothing awaits.
        rename_in_directory(&mut self.datasets.directory.edit(), &names, &old, &new);
        let mut renamed = Vec::new();
        for name in &names {
            let short = moved(name, &old, &new);
            let full = format!("{}/{short}", self.name);
            if let Some(volume) = self.datasets.volumes.remove(name) {
                volume.set_name(full.clone());
                self.datasets.volumes.insert(short.clone(), volume);
            }
            if let Some(fs) = self.datasets.filesystems.remove(name) {
                fs.set_name(full.clone());
                self.datasets.filesystems.insert(short.clone(), fs);
            }
            self.rename_mount_state(name, &short);
            renamed.push((format!("{}/{name}", self.name), full));
        }
        self.datasets.forget_renamed(&self.name, &old, &new);
        self.refresh_settings();
        self.datasets.filesystems_changed.notify_all();
        self.datasets.exports_gone.notify_all();
        self.commit().await?;
        Ok(renamed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::dataset::directory::{SnapshotName, SnapshotRecord};

    #[test]
    fn a_rename_moves_the_subtree_and_every_reference_to_it() {
        let mut directory = Directory::default();
        let volume = |directory: &mut Directory, name: &str| {
            directory.volumes.insert(
                name.into(),
                crate::pool::volume::record(9, 1 << 20, 16384, 1, Default::default()),
            );
        };
        volume(&mut directory, "a/v");
        volume(&mut directory, "ab");
        volume(&mut directory, "copy");
        let snapshot = SnapshotRecord {
            name: "s".into(),
            object: 10,
            txg: 2,
            guid: 3,
            dead_list: 0,
            created_unix_seconds: 0,
            clones: vec!["copy".into(), "a/v2".into()],
            holds: Default::default(),
        };
        directory
            .volumes
            .get_mut("a/v")
            .unwrap()
            .lineage
            .snapshots
            .push(snapshot);
        directory.volumes.get_mut("copy").unwrap().lineage.origin = Some(SnapshotName {
            volume: "a/v".into(),
            snapshot: "s".into(),
        });
        let names = vec!["a/v".to_string()];
        rename_in_directory(&mut directory, &names, "a", "b/c");
        assert!(directory.volumes.contains_key("b/c/v"));
        assert!(
            directory.volumes.contains_key("ab"),
            "a sibling named alike stays"
        );
        assert!(!directory.volumes.contains_key("a/v"));
        assert_eq!(
            directory.volumes["copy"]
                .lineage
                .origin
                .as_ref()
                .unwrap()
                .volume,
            "b/c/v"
        );
        assert_eq!(
            directory.volumes["b/c/v"].lineage.snapshots[0].clones,
            ["copy", "b/c/v2"]
        );
    }
}
