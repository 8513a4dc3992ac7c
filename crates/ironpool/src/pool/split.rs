//! `ironpool split POOL NEWPOOL [DEV...]`: a new pool made of one side of
//! every mirror, as `zpool split` does. The new pool holds the data of the
//! last txg its devices were written in; it is left exported, to be
//! imported by its name.
//!
//! Why it is safe: every side of a mirror with an empty dirty time log
//! holds every block of every txg, so the newest uberblock a split side
//! received names a tree that is whole on that side alone. The steps, each
//! crash-safe:
//! 1. A commit: what was acknowledged before the command is in a txg on
//!    every side.
//! 2. The chosen sides leave the pool's tree in memory (nothing awaited
//!    between the checks and this), and a commit writes the config without
//!    them to the sides that stay. A crash before it is durable leaves the
//!    pool whole, as before the command.
//! 3. The sides that left are given a config of their own (a new pool
//!    guid and name, each mirror a disk), the newest uberblock they hold
//!    rewritten under that guid, in the order a commit writes labels:
//!    front labels, uberblock, back labels, each flushed. A crash part way
//!    leaves devices no pool imports (their config has no matching
//!    uberblock, or their labels name a pool whose config excludes them);
//!    the original pool is not touched by it.
//!
//! What it refuses: RAID-Z or single-disk vdevs (they have no side to
//! give), a pool with log devices (the new pool's directory counts every
//! vdev; remove them first), a resilver in progress or a side that missed
//! txgs (no side would hold everything), a name already taken by a pool in
//! the directories of this pool's devices.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde::Serialize;

use crate::events::{EventClass, NewEvent};
use crate::format::label::{Label, PoolConfig, PoolState, TopVdevConfig, TopVdevKind};
use crate::format::new_guid;
use crate::format::uberblock::Uberblock;
use crate::pool::dataset::directory::valid_name;
use crate::pool::labels::{probe_device, write_labels, write_uberblock};
use crate::pool::{Pool, PoolError};
use crate::vdev::LeafVdev;

/// What `split` made.
#[derive(Clone, Debug, Serialize)]
pub struct SplitOutcome {
    /// The new pool's name and guid.
    pub pool: String,
    pub guid: u64,
    /// The txg whose tree it holds: every change acknowledged before the
    /// command, and perhaps some made while it ran.
    pub txg: u64,
    /// Its devices, one per mirror of the original pool, in vdev order.
    pub devices: Vec<String>,
}

impl Pool {
    /// Splits one side off every mirror into a new pool named `new_name`
    /// (see the module doc). `chosen` names at most one side per mirror
    /// (path, file name or guid); a mirror not named gives its last side.
    pub async fn split(
        self: &Rc<Self>,
        new_name: &str,
        chosen: &[String],
    ) -> Result<SplitOutcome, PoolError> {
        self.txg.ensure_writable()?;
        if !valid_name(new_name) {
            return Err(PoolError::InvalidArgument(format!(
                "'{new_name}' is not a valid pool name (letters, digits, '-', '_', '.'; starting with a letter or digit)"
            )));
        }
        if new_name == self.name {
            return Err(PoolError::InvalidArgument(format!(
                "the new pool needs a name other than '{new_name}'"
            )));
        }
        let taken: Vec<PathBuf> = self.device_directories();
        let found = crate::pool::labels::discover(&taken).await;
        if found.iter().any(|pool| pool.name == new_name) {
            return Err(PoolError::InvalidArgument(format!(
                "a pool named '{new_name}' already exists in {}",
                display_dirs(&taken)
            )));
        }
        self.check_splittable()?;
        // The leaves named, by guid (the tree may be reshaped by the commit
        // below; guids stay).
        let mut named: Vec<(u32, u64)> = Vec::new();
        for name in chosen {
            let (top, index) = self.find_leaf(name)?;
            if named.iter().any(|(id, _)| *id == top.id) {
                return Err(PoolError::InvalidArgument(format!(
                    "{name}: another device of {} is named too; a mirror gives one side",
                    top.kind.vdev_name(top.id)
                )));
            }
            named.push((top.id, top.children[index].guid()));
        }
        // 1. What was acknowledged is on every side.
        self.commit().await?;
        // 2. The checks and the reshape, with nothing awaited between.
        self.check_splittable()?;
        let old_config = self.config.borrow().clone();
        let mut leaving: Vec<(Rc<LeafVdev>, TopVdevConfig)> = Vec::new();
        for top in self.store.vdevs().iter() {
            let index = match named.iter().find(|(id, _)| *id == top.id) {
                Some((_, guid)) => top
                    .children
                    .iter()
                    .position(|leaf| leaf.guid() == *guid)
                    .ok_or_else(|| {
                        PoolError::InvalidArgument(format!(
                            "a device named left {} while the split waited; try again",
                            top.kind.vdev_name(top.id)
                        ))
                    })?,
                None => top.children.len() - 1,
            };
            let leaf = &top.children[index];
            let whole = |child: &Rc<LeafVdev>| {
                child.is_online()
                    && child.dtl.borrow().is_empty()
                    && child.queue.consecutive_errors() == 0
            };
            if !whole(leaf) {
                return Err(PoolError::InvalidArgument(format!(
                    "{} cannot be split off: it is not online with every block (resilver or clear it first)",
                    leaf.path.borrow()
                )));
            }
            let stays_whole = top
                .children
                .iter()
                .enumerate()
                .any(|(other, child)| other != index && whole(child));
            if !stays_whole {
                return Err(PoolError::InvalidArgument(format!(
                    "{} would be left with no side holding every block",
                    top.kind.vdev_name(top.id)
                )));
            }
            let slot = &old_config.vdevs[top.id as usize];
            assert_eq!(slot.guid, top.guid, "the config and the tree agree");
            let mut leaf_config = slot.children[index].clone();
            assert_eq!(leaf_config.guid, leaf.guid());
            leaf_config.dtl.clear();
            leaf_config.offline = false;
            leaving.push((
                leaf.clone(),
                TopVdevConfig {
                    guid: new_guid(),
                    kind: TopVdevKind::Disk,
                    children: vec![leaf_config],
                    ..slot.clone()
                },
            ));
        }
        for (leaf, _) in &leaving {
            let (top, index) = self.find_leaf(&leaf.guid().to_string())?;
            self.take_side_out(&top, index);
        }
        for (leaf, _) in &leaving {
            self.events.post(
                EventClass::DeviceState,
                NewEvent::device(
                    leaf.path.borrow().clone(),
                    format!("split off into pool '{new_name}'"),
                ),
            );
        }
        self.config_dirty.set(true);
        self.commit().await?;
        // 3. The sides that left become the new pool.
        let newest = self.newest_uberblock_of(&leaving).await?;
        let guid = new_guid();
        let config = PoolConfig {
            name: new_name.to_string(),
            pool_guid: guid,
            version: old_config.version,
            // At least every config the devices hold of this pool (none
            // is newer than their newest uberblock), and below the new
            // pool's first commit, which writes its config again.
            config_txg: newest.txg,
            state: PoolState::Exported,
            hostname: old_config.hostname.clone(),
            vdevs: leaving.iter().map(|(_, top)| top.clone()).collect(),
            // Spares stay with the original pool, as in OpenZFS.
            spares: Vec::new(),
        };
        config
            .validate()
            .map_err(|error| PoolError::Corrupt(error.to_string()))?;
        let uberblock = Uberblock {
            pool_guid: guid,
            guid_sum: config.guid_sum(),
            config_txg: config.config_txg,
            ..newest
        };
        write_new_pool(&leaving, &config, &uberblock).await?;
        Ok(SplitOutcome {
            pool: new_name.to_string(),
            guid,
            txg: newest.txg,
            devices: leaving
                .iter()
                .map(|(leaf, _)| leaf.path.borrow().clone())
                .collect(),
        })
    }

    /// Refuses a pool `split` cannot take a side of every data vdev from.
    fn check_splittable(&self) -> Result<(), PoolError> {
        for top in self.store.vdevs().iter() {
            let name = top.kind.vdev_name(top.id);
            if top.log {
                return Err(PoolError::InvalidArgument(format!(
                    "the pool has log device {name}: remove it first (ironpool remove {} {name})",
                    self.name
                )));
            }
            if top.kind == TopVdevKind::Indirect || self.store.remaps.borrow().is_mapped(top.id) {
                return Err(PoolError::InvalidArgument(format!(
                    "{name} is removed or being removed: a pool whose blocks moved off a vdev cannot be split"
                )));
            }
            if top.kind != TopVdevKind::Mirror {
                return Err(PoolError::InvalidArgument(format!(
                    "{name} is not a mirror: split takes one side of every mirror, from a pool of mirrors only"
                )));
            }
        }
        if let Some(spare) = self
            .config
            .borrow()
            .spares
            .iter()
            .find(|spare| spare.replacing.is_some())
        {
            return Err(PoolError::InvalidArgument(format!(
                "spare {} is in use: keep it (detach the device it replaced) or replace it first",
                spare.path
            )));
        }
        if self.resilver_status().state == "resilvering" {
            return Err(PoolError::InvalidArgument(
                "a resilver is in progress: split once it has finished".into(),
            ));
        }
        Ok(())
    }

    /// The directories holding this pool's devices: where a pool of the
    /// new name would be found at import.
    fn device_directories(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self
            .store
            .vdevs()
            .iter()
            .flat_map(|top| top.children.iter())
            .filter_map(|leaf| {
                Path::new(leaf.path.borrow().as_str())
                    .parent()
                    .map(Path::to_path_buf)
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// The newest uberblock of this pool the leaving sides all hold. A side
    /// that missed the last uberblock write (a failed write) still holds
    /// the one before, whose tree is intact while its frees are deferred;
    /// sides further apart than that are refused.
    async fn newest_uberblock_of(
        &self,
        leaving: &[(Rc<LeafVdev>, TopVdevConfig)],
    ) -> Result<Uberblock, PoolError> {
        let mut newest: Vec<Uberblock> = Vec::new();
        let mut probes = Vec::new();
        for (leaf, _) in leaving {
            let path = leaf.path.borrow().clone();
            let device = leaf.device().ok_or_else(|| {
                PoolError::Io(format!("{path}: the device closed during the split"))
            })?;
            let probe = probe_device(&*device, Path::new(&path)).await;
            let mine = probe
                .uberblocks
                .iter()
                .filter(|uberblock| uberblock.pool_guid == self.guid)
                .max_by_key(|uberblock| uberblock.txg)
                .copied()
                .ok_or_else(|| {
                    PoolError::Io(format!("{path}: no uberblock of the pool could be read"))
                })?;
            newest.push(mine);
            probes.push(probe);
        }
        let oldest = newest
            .iter()
            .min_by_key(|uberblock| uberblock.txg)
            .copied()
            .ok_or_else(|| PoolError::InvalidArgument("no device to split off".into()))?;
        let spread = newest.iter().map(|u| u.txg).max().unwrap_or(0) - oldest.txg;
        if spread > crate::alloc::DEFER_TXGS {
            return Err(PoolError::Io(format!(
                "the devices split off hold txgs {} to {} apart: no tree common to all of them",
                oldest.txg,
                oldest.txg + spread
            )));
        }
        // Every side holds that txg's uberblock in its ring.
        for probe in &probes {
            let held = probe
                .uberblocks
                .iter()
                .any(|uberblock| uberblock.pool_guid == self.guid && uberblock.txg == oldest.txg);
            if !held {
                return Err(PoolError::Io(format!(
                    "{}: txg {} is not in its uberblock ring",
                    probe.path.display(),
                    oldest.txg
                )));
            }
        }
        Ok(oldest)
    }
}

/// Writes the new pool's labels and uberblock onto the leaves that left,
/// in a commit's order: front labels, uberblock, back labels, each flushed.
async fn write_new_pool(
    leaving: &[(Rc<LeafVdev>, TopVdevConfig)],
    config: &PoolConfig,
    uberblock: &Uberblock,
) -> Result<(), PoolError> {
    let flush = |leaf: &Rc<LeafVdev>| {
        let leaf = leaf.clone();
        async move {
            let path = leaf.path.borrow().clone();
            let device = leaf
                .device()
                .ok_or_else(|| PoolError::Io(format!("{path}: the device closed")))?;
            device
                .flush()
                .await
                .map_err(|error| PoolError::Io(format!("{path}: {error}")))
        }
    };
    for step in 0..3 {
        for (leaf, top) in leaving {
            let size = top.children[0].device_size_bytes;
            let result = match step {
                0 | 2 => {
                    let label = Label::of(config, leaf.guid());
                    let indexes: &[usize] = if step == 0 { &[0, 2] } else { &[1, 3] };
                    write_labels(leaf, &label, size, indexes).await
                }
                _ => write_uberblock(leaf, uberblock, size, top.ashift).await,
            };
            result.map_err(PoolError::Io)?;
            flush(leaf).await?;
        }
    }
    Ok(())
}

fn display_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
