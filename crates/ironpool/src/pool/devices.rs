//! The pool's devices over time: assembling the vdev tree at import (and
//! refusing a pool that lost more devices than its redundancy), keeping each
//! leaf's state and dirty time log in the config, and the operator's commands
//! `offline`, `online` and `replace`.
//!
//! A leaf that goes away (offline, missing, faulted) gets an open range in its
//! dirty time log at the next commit; when it comes back the range is closed
//! at the txg then open and a resilver rewrites what it missed. A replacement
//! starts with a log covering every txg so far. The logs travel in the label
//! config, written whenever one changes.

use std::path::Path;
use std::rc::Rc;

use crate::dev::file::FileDevice;
use crate::dev::Device;
use crate::events::{EventClass, NewEvent};
use crate::format::label::{LeafConfig, PoolConfig, TopVdevKind};
use crate::format::{data_area_bytes, new_guid};
use crate::pool::labels::Probe;
use crate::pool::{Pool, PoolError, PoolTunables};
use crate::vdev::dtl::Dtl;
use crate::vdev::{LeafState, LeafVdev, TopVdev};

/// The vdevs built at import, and every unavailable device (guid, why).
pub(super) type Assembled = (Vec<Rc<TopVdev>>, Vec<(u64, String)>);

/// Builds the top-level vdevs of `config` from the devices found, matched by
/// guid. Fails, before anything is written, when a vdev has more children
/// unavailable (not found, truncated, offline) than its redundancy covers.
/// Returns the vdevs and, for every unavailable device, its guid and a
/// description.
pub(super) fn assemble(
    name: &str,
    config: &PoolConfig,
    probes: &[(Probe, Rc<dyn Device>)],
    tunables: &PoolTunables,
) -> Result<Assembled, PoolError> {
    let mut vdevs = Vec::new();
    let mut all_missing = Vec::new();
    for top in &config.vdevs {
        let mut leaves = Vec::new();
        let mut missing = Vec::new();
        let mut missing_guids = Vec::new();
        for leaf in &top.children {
            let found = probes.iter().find(|(probe, _)| {
                probe.label.as_ref().is_some_and(|label| {
                    label.leaf_guid == leaf.guid && label.pool_guid == config.pool_guid
                })
            });
            let device = match found {
                Some((probe, _)) if probe.size_bytes < leaf.device_size_bytes => {
                    missing.push(format!(
                        "{} (truncated: {} of {} bytes)",
                        probe.path.display(),
                        probe.size_bytes,
                        leaf.device_size_bytes
                    ));
                    None
                }
                Some((_, device)) => Some(device.clone()),
                None => {
                    missing.push(format!("{} (guid {:#x}, not found)", leaf.path, leaf.guid));
                    None
                }
            };
            let path = found
                .map(|(probe, _)| probe.path.display().to_string())
                .unwrap_or_else(|| leaf.path.clone());
            let vdev = LeafVdev::new(leaf.guid, path, device, tunables.queue.clone());
            if leaf.offline && vdev.is_online() {
                vdev.set_offline();
                missing.push(format!("{} (offline)", leaf.path));
            }
            // One guid per description added for this leaf.
            missing_guids.resize(missing.len(), leaf.guid);
            *vdev.dtl.borrow_mut() = Dtl::from_config(&leaf.dtl);
            leaves.push(vdev);
        }
        let mut top_vdev = TopVdev::new(
            top.id,
            top.guid,
            top.kind,
            top.ashift,
            top.asize_bytes,
            top.metaslab_shift,
            leaves,
        )
        .map_err(|error| PoolError::Corrupt(format!("vdev {}: {error}", top.id)))?;
        if top.log {
            top_vdev = top_vdev.into_log();
        }
        // A log device away loses no pool data: it is taken out of use (log
        // blocks go to the main devices). What its log held is replay's
        // business (see `Pool::import`).
        if !top_vdev.is_available() && !top.log {
            let redundancy = top_vdev.redundancy();
            return Err(PoolError::MissingDevices {
                pool: name.to_string(),
                devices: format!(
                    "{} ({} can lose at most {redundancy} of its {} devices, {} are unavailable)",
                    missing.join(", "),
                    top.kind.vdev_name(top.id),
                    top.children.len(),
                    top_vdev.children_away()
                ),
            });
        }
        all_missing.extend(missing_guids.into_iter().zip(missing));
        vdevs.push(Rc::new(top_vdev));
    }
    Ok((vdevs, all_missing))
}

/// Marks the leaves in service whose device is behind the pool: its newest
/// uberblock (every txg up to it reached the device before its uberblock did)
/// is older than `pool_txg`, the newest uberblock of the pool. Such a device
/// is an old copy put back in place, or one that missed commits without the
/// pool noticing; it missed every txg after its newest, so those go into its
/// dirty time log (resilvered after import, and not trusted by reads until
/// then). Returns a note per device marked.
pub(super) fn mark_stale_leaves(
    vdevs: &[Rc<TopVdev>],
    probes: &[(Probe, Rc<dyn Device>)],
    pool_guid: u64,
    pool_txg: u64,
) -> Vec<String> {
    let mut notes = Vec::new();
    for top in vdevs {
        for leaf in &top.children {
            if !leaf.is_online() {
                // Away: its log already has an open range.
                continue;
            }
            let probe = probes.iter().map(|(probe, _)| probe).find(|probe| {
                probe.label.as_ref().is_some_and(|label| {
                    label.leaf_guid == leaf.guid() && label.pool_guid == pool_guid
                })
            });
            let Some(probe) = probe else { continue };
            let newest = probe
                .uberblocks
                .iter()
                .filter(|uberblock| uberblock.pool_guid == pool_guid)
                .map(|uberblock| uberblock.txg)
                .max();
            if newest.is_some_and(|txg| txg >= pool_txg) {
                continue;
            }
            // No uberblock at all: nothing on it can be trusted.
            let first = newest.map_or(0, |txg| txg + 1);
            leaf.dtl.borrow_mut().add_range(first, pool_txg);
            notes.push(format!(
                "{} is behind the pool (its newest txg is {}, the pool's {pool_txg}): it missed txgs {first}..{pool_txg}, which are resilvered onto it",
                probe.path.display(),
                newest.map_or_else(|| "none".to_string(), |txg| txg.to_string())
            ));
        }
    }
    notes
}

/// Brings every leaf's dirty time log in line with its state at txg `txg`
/// (the open txg): a leaf away gets an open range, a leaf back has it closed.
/// Then copies changed logs and states into the config and marks it dirty.
/// Runs at every commit's build step and after every state change.
pub(super) fn maintain(pool: &Pool, txg: u64) {
    let mut changed = false;
    for top in pool.store.vdevs().iter() {
        for leaf in &top.children {
            let mut dtl = leaf.dtl.borrow_mut();
            match (leaf.is_online(), dtl.is_open()) {
                (false, false) => dtl.open(txg),
                (true, true) => dtl.close(txg),
                _ => {}
            }
            if dtl.take_dirty() {
                changed = true;
            }
        }
    }
    post_state_changes(pool);
    let mut config = pool.config.borrow_mut();
    for (top, top_config) in pool.store.vdevs().iter().zip(config.vdevs.iter_mut()) {
        for (leaf, leaf_config) in top.children.iter().zip(top_config.children.iter_mut()) {
            let offline = leaf.state() == LeafState::Offline;
            let dtl = leaf.dtl.borrow().to_config();
            if leaf_config.offline != offline || leaf_config.dtl != dtl {
                leaf_config.offline = offline;
                leaf_config.dtl = dtl;
                changed = true;
            }
        }
    }
    if changed {
        pool.config_dirty.set(true);
    }
}

/// Posts an event for every leaf whose state changed since the last look
/// (at every commit's build step and after the operator's commands: a leaf
/// that faults between commits is reported within a txg).
fn post_state_changes(pool: &Pool) {
    for top in pool.store.vdevs().iter() {
        for leaf in &top.children {
            if let Some((before, now)) = leaf.take_state_change() {
                pool.events.post(
                    EventClass::DeviceState,
                    NewEvent::device(
                        leaf.path.borrow().clone(),
                        format!("{} -> {}", before.name(), now.name()),
                    ),
                );
            }
        }
    }
}

/// Children of `top` other than `except` that cannot serve every block now:
/// away, or holding txgs they missed.
pub(super) fn children_lacking(top: &TopVdev, except: usize) -> usize {
    top.children
        .iter()
        .enumerate()
        .filter(|(index, child)| {
            *index != except && (!child.is_online() || !child.dtl.borrow().is_empty())
        })
        .count()
}

/// A device as the operator names it: its path as the config or `status`
/// shows it, its file name, or its guid (hex with 0x, or decimal). Resolved
/// once, then matched against the devices of the tree, the spares, or the
/// leaves spares took the place of.
pub(super) struct DeviceName<'a> {
    name: &'a str,
    canonical: Option<String>,
    guid: Option<u64>,
}

impl<'a> DeviceName<'a> {
    pub(super) fn new(name: &'a str) -> DeviceName<'a> {
        DeviceName {
            name,
            canonical: std::fs::canonicalize(name)
                .ok()
                .map(|path| path.display().to_string()),
            guid: name.strip_prefix("0x").map_or_else(
                || name.parse::<u64>().ok(),
                |hex| u64::from_str_radix(hex, 16).ok(),
            ),
        }
    }

    /// True when it names the device at `path` with `guid`.
    pub(super) fn names(&self, path: &str, guid: u64) -> bool {
        path == self.name
            || self.canonical.as_deref() == Some(path)
            || Path::new(path)
                .file_name()
                .is_some_and(|file| file == self.name)
            || self.guid == Some(guid)
    }

    /// True when it names `leaf`.
    pub(super) fn names_leaf(&self, leaf: &LeafVdev) -> bool {
        self.names(&leaf.path.borrow(), leaf.guid())
    }
}

impl Pool {
    /// The leaf named `name` (see [`DeviceName`]).
    pub fn find_leaf(&self, name: &str) -> Result<(Rc<TopVdev>, usize), PoolError> {
        let named = DeviceName::new(name);
        let mut found = Vec::new();
        for top in self.store.vdevs().iter() {
            for (index, leaf) in top.children.iter().enumerate() {
                if named.names_leaf(leaf) {
                    found.push((top.clone(), index));
                }
            }
        }
        match found.len() {
            1 => Ok(found.pop().expect("one match")),
            0 => Err(PoolError::InvalidArgument(format!(
                "no device '{name}' in pool '{}'",
                self.name
            ))),
            _ => Err(PoolError::InvalidArgument(format!(
                "'{name}' names more than one device of pool '{}': use its full path or guid",
                self.name
            ))),
        }
    }

    /// Takes a device out of service (`ironpool offline`). Refused when its
    /// vdev would be left unable to serve every block.
    pub async fn offline_device(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let (top, index) = self.find_leaf(name)?;
        let leaf = top.children[index].clone();
        if leaf.state() == LeafState::Offline {
            return Ok(());
        }
        // Children still to be resilvered count as lost: they lack what they
        // missed, so the device may hold the only valid copy of it.
        if leaf.is_online() && children_lacking(&top, index) + 1 > top.redundancy() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot take {} offline: it would leave no valid copy of some data ({} can lose at most {} and would lose {}: the others are away or not yet resilvered)",
                leaf.path.borrow(),
                top.kind.vdev_name(top.id),
                if top.redundancy() == 1 { "1 device".to_string() } else { format!("{} devices", top.redundancy()) },
                children_lacking(&top, index) + 1
            )));
        }
        leaf.set_offline();
        maintain(self, self.txg.open());
        self.config_dirty.set(true);
        self.commit().await
    }

    /// Puts a device back in service (`ironpool online`): one that was taken
    /// offline, faulted, or missing and now present again (opened from its
    /// path unless `device` is given; it must carry this leaf's label). It
    /// then gets what it missed by a resilver.
    pub async fn online_device(
        self: &Rc<Self>,
        name: &str,
        device: Option<Rc<dyn Device>>,
    ) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let (top, index) = self.find_leaf(name)?;
        let leaf = top.children[index].clone();
        if leaf.is_online() {
            self.resilver_start();
            return Ok(());
        }
        let device = match (device, leaf.device()) {
            (Some(device), _) => Some(device),
            (None, Some(_)) => None,
            (None, None) => Some(self.reopen(&leaf).await?),
        };
        leaf.bring_online(device);
        maintain(self, self.txg.open());
        self.config_dirty.set(true);
        self.commit().await?;
        self.resilver_start();
        Ok(())
    }

    /// `ironpool clear` (as `zpool clear`): forgets the error streaks that
    /// faulted devices and puts faulted devices back in service (they resilver
    /// what they missed), lets failed write-backs retry at once, and retries
    /// a suspended txg now rather than at its next timer. For a pool that was
    /// stopped by a full host filesystem or a device that came back. A pool
    /// whose in-memory state cannot be committed any more is refused: export
    /// and import it again.
    pub async fn clear(self: &Rc<Self>) -> Result<Vec<String>, PoolError> {
        self.txg.ensure_writable()?;
        let mut cleared = Vec::new();
        let mut back_in_service = false;
        for top in self.store.vdevs().iter() {
            for leaf in &top.children {
                let faulted = leaf.state() == LeafState::Faulted;
                leaf.queue.reset_consecutive_errors();
                leaf.queue.clear_host_full();
                if faulted {
                    leaf.bring_online(None);
                    back_in_service = true;
                    cleared.push(leaf.path.borrow().clone());
                }
            }
        }
        if back_in_service {
            maintain(self, self.txg.open());
            self.config_dirty.set(true);
        }
        self.retry_writeback();
        self.txg.retry_now();
        // A suspended pool's commit waits for the retry, which succeeds once
        // the cause is gone; a running one (or one with devices back) then
        // resilvers what its devices missed.
        let resilver = self.txg.suspended().is_none() || back_in_service;
        self.commit().await?;
        if resilver {
            self.resilver_start();
        }
        Ok(cleared)
    }

    /// Devices whose last write was refused because the filesystem holding
    /// them is full (with the reason), for `status` and for telling a client
    /// ENOSPC rather than EIO.
    pub fn host_full_devices(&self) -> Vec<String> {
        self.store
            .vdevs()
            .iter()
            .flat_map(|top| top.children.iter())
            .filter(|leaf| leaf.queue.stats().host_full)
            .map(|leaf| leaf.path.borrow().clone())
            .collect()
    }

    /// Opens a missing leaf's device at its recorded path, checking that it is
    /// that leaf of this pool.
    async fn reopen(&self, leaf: &LeafVdev) -> Result<Rc<dyn Device>, PoolError> {
        let path = leaf.path.borrow().clone();
        let device: Rc<dyn Device> = Rc::new(FileDevice::open(Path::new(&path))?);
        let probe = crate::pool::labels::probe_device(&*device, Path::new(&path)).await;
        let ours = probe
            .label
            .as_ref()
            .is_some_and(|label| label.pool_guid == self.guid && label.leaf_guid == leaf.guid());
        if !ours {
            return Err(PoolError::InvalidArgument(format!("{path} is not this pool's device {:#x}; use `ironpool replace` to put a new device in its place", leaf.guid())));
        }
        let expected = self
            .config
            .borrow()
            .find_leaf(leaf.guid())
            .map(|(top, index)| top.children[index].device_size_bytes)
            .unwrap_or(0);
        if device.info().size_bytes < expected {
            return Err(PoolError::Truncated {
                path,
                expected,
                found: device.info().size_bytes,
            });
        }
        Ok(device)
    }

    /// Puts `new` in the place of device `old` (`ironpool replace`) and
    /// resilvers it from the other children. Refused for single-disk vdevs
    /// (nothing to rebuild from) and when the vdev's other children cannot
    /// serve every block.
    pub async fn replace_device(
        self: &Rc<Self>,
        old: &str,
        new: crate::pool::NewDevice,
        force: bool,
    ) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let (top, index) = match self.find_leaf(old) {
            Ok(found) => found,
            // The leaf a spare took the place of: NEW takes the spare's
            // place, and the spare goes back to the spares.
            Err(error) => match self.spare_replacing(old) {
                Some(spare) => self.find_leaf(&spare.guid.to_string())?,
                None => return Err(error),
            },
        };
        if top.log {
            // A log vdev holds nothing a replacement must be rebuilt with:
            // the intent logs leave it first (through a txg), so no flushed
            // write depends on the device being replaced, however many of
            // its sides are gone.
            top.removing.set(true);
            let moved = self.evacuate_log_vdev(&top, old).await;
            top.removing.set(false);
            moved?;
        } else if top.kind == TopVdevKind::Disk {
            return Err(PoolError::InvalidArgument(format!(
                "{old} is a single-disk vdev: there is no redundancy to rebuild a replacement from (use a mirror or RAID-Z)"
            )));
        }
        if !top.log && children_lacking(&top, index) + 1 > top.redundancy() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot replace {old}: the other devices of {} cannot rebuild it ({} of them are away or not resilvered)",
                top.kind.vdev_name(top.id),
                children_lacking(&top, index)
            )));
        }
        // The new device may sit at the old one's path (a disk swapped in the
        // same slot, `zpool replace pool sdb` in ZFS), never at another's.
        self.check_new_side(&top, &new, Some(&top.children[index]), force)
            .await?;
        let size_bytes = new.device.info().size_bytes;
        let guid = new_guid();
        let leaf = top.children[index].clone();
        let old_path = leaf.path.borrow().clone();
        let (old_guid, old_device) = (leaf.guid(), leaf.device());
        leaf.replace_device(guid, new.path.clone(), new.device, self.txg.open());
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(new.path.clone(), format!("replaced {old_path}")),
        );
        {
            let mut config = self.config.borrow_mut();
            let slot = &mut config.vdevs[top.id as usize].children[index];
            *slot = LeafConfig {
                dtl: leaf.dtl.borrow().to_config(),
                ..LeafConfig::new(guid, new.path, size_bytes)
            };
        }
        self.spare_left_tree(old_guid, old_device);
        maintain(self, self.txg.open());
        self.config_dirty.set(true);
        self.commit().await?;
        self.resilver_start();
        Ok(())
    }
}

impl Pool {
    /// Refuses `path` if a device of the pool other than `except` (the leaf
    /// a replacement takes the place of) is there.
    pub(super) fn check_not_in_pool(
        &self,
        path: &str,
        except: Option<&Rc<LeafVdev>>,
    ) -> Result<(), PoolError> {
        let in_pool = self
            .store
            .vdevs()
            .iter()
            .flat_map(|top| top.children.iter())
            .any(|leaf| {
                except.is_none_or(|except| !Rc::ptr_eq(leaf, except)) && *leaf.path.borrow() == path
            });
        if in_pool || self.is_spare_path(path) {
            return Err(PoolError::InvalidArgument(format!(
                "{path} is already a device of pool '{}'",
                self.name
            )));
        }
        Ok(())
    }

    /// The checks a device put into `top` as a side (`replace` in the place
    /// of `replacing`, `attach` beside the others) passes: not the pool's
    /// already, large enough for a child of `top`, and of no other pool
    /// unless `force`.
    async fn check_new_side(
        &self,
        top: &TopVdev,
        new: &crate::pool::NewDevice,
        replacing: Option<&Rc<LeafVdev>>,
        force: bool,
    ) -> Result<(), PoolError> {
        self.check_not_in_pool(&new.path, replacing)?;
        let size_bytes = new.device.info().size_bytes;
        let needed = child_data_bytes_needed(top);
        if data_area_bytes(size_bytes) < needed {
            return Err(PoolError::InvalidArgument(format!(
                "{} is too small: it needs a data area of {needed} bytes, it has {}",
                new.path,
                data_area_bytes(size_bytes)
            )));
        }
        crate::pool::labels::check_unlabelled(new, force).await
    }

    /// Attaches device `new` beside `existing` (`ironpool attach POOL
    /// EXISTING NEW`): a disk becomes a two-way mirror, a mirror one side
    /// wider (at most [`MIRROR_CHILDREN_MAX`]). The new side misses every
    /// txg up to the open one, so reads avoid it until the resilver started
    /// here has copied what the vdev holds onto it; writes go to it at once.
    /// A log vdev's intent logs move off it first (as for `replace`), so
    /// nothing on it needs copying. RAID-Z groups take no attached device.
    pub async fn attach_device(
        self: &Rc<Self>,
        existing: &str,
        new: crate::pool::NewDevice,
        force: bool,
    ) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let (top, _) = self.find_leaf(existing)?;
        let name = top.kind.vdev_name(top.id);
        if top.kind.is_raidz() {
            return Err(PoolError::InvalidArgument(format!(
                "{existing} is in {name}: only a disk or a mirror takes an attached device"
            )));
        }
        if top.children.len() >= crate::format::label::MIRROR_CHILDREN_MAX {
            return Err(PoolError::InvalidArgument(format!(
                "{name} has {} sides, the most a mirror may have",
                top.children.len()
            )));
        }
        if !top.is_available() {
            return Err(PoolError::InvalidArgument(format!(
                "{name} cannot serve every block now: bring its devices back first"
            )));
        }
        let info = new.device.info().clone();
        let sector = u64::from(info.physical_sector_bytes.max(info.logical_sector_bytes));
        if sector > top.sector_bytes() {
            return Err(PoolError::InvalidArgument(format!(
                "{} has {sector}-byte sectors; {name} writes {}-byte ones",
                new.path,
                top.sector_bytes()
            )));
        }
        self.check_new_side(&top, &new, None, force).await?;
        if top.log {
            top.removing.set(true);
            let moved = self.evacuate_log_vdev(&top, existing).await;
            top.removing.set(false);
            moved?;
        }
        // Looked up again: the evacuation awaited.
        let (top, _) = self.find_leaf(existing)?;
        let guid = new_guid();
        let leaf = LeafVdev::new(
            guid,
            new.path.clone(),
            Some(new.device),
            self.tunables.borrow().queue.clone(),
        );
        leaf.queue.set_events(self.events.clone());
        leaf.dtl
            .borrow_mut()
            .reset_to_everything_before(self.txg.open());
        let mut children = top.children.clone();
        children.push(leaf.clone());
        let reshaped = Rc::new(top.reshaped(TopVdevKind::Mirror, children));
        self.store.replace_vdev(reshaped.clone());
        {
            let mut config = self.config.borrow_mut();
            let slot = &mut config.vdevs[top.id as usize];
            slot.kind = TopVdevKind::Mirror;
            slot.children.push(LeafConfig {
                dtl: leaf.dtl.borrow().to_config(),
                ..LeafConfig::new(guid, new.path.clone(), info.size_bytes)
            });
        }
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(
                new.path,
                format!(
                    "attached to {existing}: {}",
                    reshaped.kind.vdev_name(reshaped.id)
                ),
            ),
        );
        maintain(self, self.txg.open());
        self.config_dirty.set(true);
        self.commit().await?;
        self.resilver_start();
        Ok(())
    }

    /// Detaches a mirror's side (`ironpool detach POOL DEV`): refused unless
    /// another side holds every block (online, nothing left to resilver); a
    /// mirror left with one side becomes a disk. The device's labels are
    /// cleared once the txg without it is durable.
    pub async fn detach_device(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let (top, index) = match self.find_leaf(name) {
            Ok(found) => found,
            // The leaf a spare took the place of: the spare stays.
            Err(error) => match self.spare_replacing(name) {
                Some(spare) => return self.keep_spare(spare).await,
                None => return Err(error),
            },
        };
        if top.kind != TopVdevKind::Mirror {
            return Err(PoolError::InvalidArgument(format!(
                "{name} is in {}: only a mirror's side can be detached",
                top.kind.vdev_name(top.id)
            )));
        }
        let complete = top.children.iter().enumerate().any(|(other, child)| {
            other != index && child.is_online() && child.dtl.borrow().is_empty()
        });
        if !complete {
            return Err(PoolError::InvalidArgument(format!(
                "cannot detach {name}: no other side of {} holds every block (away, or still to be resilvered)",
                top.kind.vdev_name(top.id)
            )));
        }
        let leaf = self.take_side_out(&top, index);
        let path = leaf.path.borrow().clone();
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(path.clone(), "detached"),
        );
        // A spare in use goes back to the spares, its label rewritten by
        // the commit.
        let was_spare = self.spare_left_tree(leaf.guid(), leaf.device());
        self.config_dirty.set(true);
        self.commit().await?;
        if was_spare {
            return Ok(());
        }
        crate::pool::labels::clear_leaf_labels(&self.name, &leaf, "detached").await;
        Ok(())
    }

    /// Takes side `index` out of mirror `top`, in the store's tree and in the
    /// config (a mirror left with one side becomes a disk), and returns it:
    /// `detach` and `split`, whose callers checked that another side holds
    /// every block and commit after.
    pub(super) fn take_side_out(&self, top: &TopVdev, index: usize) -> Rc<LeafVdev> {
        assert_eq!(top.kind, TopVdevKind::Mirror, "only a mirror gives a side");
        let mut children = top.children.clone();
        let leaf = children.remove(index);
        let kind = if children.len() == 1 {
            TopVdevKind::Disk
        } else {
            TopVdevKind::Mirror
        };
        self.store
            .replace_vdev(Rc::new(top.reshaped(kind, children)));
        let mut config = self.config.borrow_mut();
        let slot = &mut config.vdevs[top.id as usize];
        assert_eq!(
            slot.children[index].guid,
            leaf.guid(),
            "the config and the tree agree"
        );
        slot.kind = kind;
        slot.children.remove(index);
        leaf
    }

    /// Moves every open dataset's intent-log chain off log vdev `top` (marked
    /// `removing`, so no new log block lands there): each chain is ended by a
    /// txg and restarted elsewhere. Fails if a chain still uses it after.
    async fn evacuate_log_vdev(
        self: &Rc<Self>,
        top: &TopVdev,
        name: &str,
    ) -> Result<(), PoolError> {
        for (_, volume) in self.open_volumes() {
            self.move_log_off(&volume).await?;
        }
        for (_, fs) in self.all_filesystems() {
            self.move_fs_log_off(&fs).await?;
        }
        if self.log_chains_use(top.id) {
            return Err(PoolError::InvalidArgument(format!(
                "an intent log still uses {name}; try again"
            )));
        }
        Ok(())
    }

    /// Adds top-level vdevs (`ironpool add POOL [mirror|raidzN] DEV...`,
    /// `add POOL log [mirror] DEV...`): data vdevs grow the pool, and the
    /// allocator's turns, weighted by free space, send most new data to
    /// the empty vdev until it is as full as the others; log vdevs take the
    /// intent logs' blocks from the next commit on. Every device is checked
    /// before anything changes; the command returns once the txg naming
    /// them is durable.
    pub async fn add_vdevs(
        self: &Rc<Self>,
        layout: Vec<crate::pool::NewTopVdev>,
        force: bool,
    ) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        if layout.is_empty() {
            return Err(PoolError::InvalidArgument("no devices given".into()));
        }
        for new in layout.iter().flat_map(|top| top.devices.iter()) {
            self.check_not_in_pool(&new.path, None)?;
        }
        let first_id = self.store.vdevs().len();
        let tunables = self.tunables.borrow().clone();
        let mut built = Vec::new();
        for (index, top) in layout.into_iter().enumerate() {
            built.push(crate::pool::build_top_vdev(first_id + index, top, force, &tunables).await?);
        }
        for (top_vdev, config) in built {
            let top = Rc::new(top_vdev);
            let role = if top.log {
                "added as a log device"
            } else {
                "added: new data goes to it first, as it is the emptiest"
            };
            for leaf in &top.children {
                leaf.queue.set_events(self.events.clone());
                self.events.post(
                    EventClass::DeviceState,
                    NewEvent::device(leaf.path.borrow().clone(), role),
                );
            }
            let mut space = crate::pool::vdev_space(&top);
            space.array_object = self.create_metaslab_array();
            self.store.add_vdev(top, space);
            self.config.borrow_mut().vdevs.push(config);
        }
        self.config_dirty.set(true);
        self.commit().await
    }
}

impl Pool {
    /// Removes a log device (`ironpool remove POOL DEV`; DEV a device of it
    /// or its vdev's name): no new log block goes to it, every intent log
    /// is moved off it (what the logs made durable goes into a txg first),
    /// and the vdev leaves the config in a txg that the command waits for;
    /// the device's labels are then cleared. Log devices are the last
    /// vdevs of a pool; of several, the last is removed first (vdev ids
    /// are positions).
    pub async fn remove_log_vdev(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let vdevs = self.store.vdevs();
        let top = match vdevs.iter().find(|top| top.kind.vdev_name(top.id) == name) {
            Some(top) => top.clone(),
            None => self.find_leaf(name)?.0,
        };
        if !top.log {
            return Err(PoolError::InvalidArgument(format!(
                "{name} is in {}, which holds pool data: only log devices can be removed",
                top.kind.vdev_name(top.id)
            )));
        }
        self.check_no_claim_on(top.id)?;
        if vdevs[top.id as usize + 1..].iter().any(|later| !later.log) {
            return Err(PoolError::InvalidArgument(format!(
                "{name} was added before data vdevs ({}): vdevs are numbered by position, so it cannot leave; replace it instead",
                vdevs[top.id as usize + 1..]
                    .iter()
                    .filter(|later| !later.log)
                    .map(|later| later.kind.vdev_name(later.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if top.id as usize + 1 != vdevs.len() {
            let after: Vec<String> = vdevs[top.id as usize + 1..]
                .iter()
                .flat_map(|later| later.children.iter().map(|leaf| leaf.path.borrow().clone()))
                .collect();
            return Err(PoolError::InvalidArgument(format!(
                "remove the log devices added after {name} first ({})",
                after.join(", ")
            )));
        }
        drop(vdevs);
        top.removing.set(true);
        if let Err(error) = self.evacuate_log_vdev(&top, name).await {
            top.removing.set(false);
            return Err(error);
        }
        // The newest durable directory names no block on it now.
        self.drop_log_releases_on(top.id);
        let array_id = {
            let allocator = self.store.allocator.borrow();
            let space = &allocator.vdevs[top.id as usize];
            if space
                .metaslabs
                .iter()
                .any(|metaslab| metaslab.space_map_object != 0)
            {
                top.removing.set(false);
                return Err(PoolError::Corrupt(format!(
                    "log device {name} has space maps: it held pool data"
                )));
            }
            space.array_object
        };
        self.store.remove_last_vdev();
        self.config.borrow_mut().vdevs.pop();
        self.datasets.directory.edit().metaslab_arrays.pop();
        self.drop_dead_list(array_id)?;
        self.config_dirty.set(true);
        for leaf in &top.children {
            self.events.post(
                EventClass::DeviceState,
                NewEvent::device(leaf.path.borrow().clone(), "removed"),
            );
        }
        self.commit().await?;
        for leaf in &top.children {
            crate::pool::labels::clear_leaf_labels(&self.name, leaf, "removed").await;
        }
        Ok(())
    }
}

/// The data area a child of `top` must have: everything for a mirror side;
/// for RAID-Z, the child's share of the group's sectors (group sector `g` is
/// sector `g / children` of its child).
pub(super) fn child_data_bytes_needed(top: &TopVdev) -> u64 {
    match top.raidz_geometry() {
        Some(geometry) => {
            (top.asize_bytes / top.sector_bytes()).div_ceil(geometry.children() as u64)
                * top.sector_bytes()
        }
        None => top.asize_bytes,
    }
}
