//! Hot spares: devices kept outside the vdev tree that take the place of a
//! leaf that fails, without the operator, as OpenZFS's ZED does.
//!
//! - `create ... spare DEV...` and `add POOL spare DEV...` add them; each
//!   gets a label of the pool (no uberblocks), written again whenever the
//!   config changes, so import finds it. `remove POOL DEV` takes an
//!   available spare out and clears its label.
//! - When a leaf of a redundant data vdev faults or goes missing (seen at a
//!   commit, or at import), the pool's own task puts the first fitting
//!   available spare in its place, as `replace` would, and resilvers it.
//!   The config records the leaf it replaced.
//! - The operator then makes it permanent (`detach POOL OLD`: the spare
//!   becomes an ordinary leaf) or gives it back (`replace POOL OLD NEW`, or
//!   `replace`/`detach` of the spare itself: once out of the tree it is
//!   available again).
//!
//! A spare in use is a leaf of the tree under its own guid, so everything
//! that reads, writes, resilvers or scrubs leaves treats it as one.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde::Serialize;

use crate::events::{EventClass, NewEvent};
use crate::format::data_area_bytes;
use crate::format::label::{Label, LeafConfig, ReplacedLeaf, SpareConfig, TopVdevKind};
use crate::format::new_guid;
use crate::pool::devices::DeviceName;
use crate::pool::labels::{check_unlabelled, clear_labels, write_labels, Probe};
use crate::pool::{NewDevice, Pool, PoolError};
use crate::rt::{self, JoinHandle};
use crate::vdev::{LeafState, LeafVdev, TopVdev};

/// Most spares a pool keeps: each is a device held open and a label
/// written at every config change; a handful covers any pool's failures
/// between two visits of an operator.
pub const SPARES_MAX: usize = 16;

/// The pool's available spares and the task that activates them.
#[derive(Default)]
pub(crate) struct Spares {
    /// Spares not in the tree, devices open (a missing one has none).
    available: RefCell<Vec<Rc<LeafVdev>>>,
    /// The activation task while it runs.
    task: RefCell<Option<JoinHandle<()>>>,
    /// Set by export: no new activation.
    shut: Cell<bool>,
}

/// A spare as `status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SpareStatus {
    pub path: String,
    pub guid: String,
    /// `available`, `in use` or `missing`.
    pub state: &'static str,
    /// The leaf it stands in for, while in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacing: Option<String>,
}

impl Pool {
    /// Opens the config's available spares from the devices an import
    /// found (matched by guid); one not found is noted, not fatal.
    pub(super) fn open_spares(
        &self,
        probes: &[(Probe, Rc<dyn crate::dev::Device>)],
    ) -> Vec<String> {
        let mut notes = Vec::new();
        let config = self.config.borrow();
        let tunables = self.tunables.borrow().queue.clone();
        let mut available = self.spares.available.borrow_mut();
        for spare in config
            .spares
            .iter()
            .filter(|spare| spare.replacing.is_none())
        {
            let found = probes.iter().find(|(probe, _)| {
                probe.label.as_ref().is_some_and(|label| {
                    label.pool_guid == config.pool_guid && label.leaf_guid == spare.guid
                }) && probe.size_bytes >= spare.device_size_bytes
            });
            let (path, device) = match found {
                Some((probe, device)) => (probe.path.display().to_string(), Some(device.clone())),
                None => {
                    notes.push(format!("spare {} is missing", spare.path));
                    (spare.path.clone(), None)
                }
            };
            let leaf = LeafVdev::new(spare.guid, path, device, tunables.clone());
            leaf.queue.set_events(self.events.clone());
            available.push(leaf);
        }
        notes
    }

    /// Adds spares (`add POOL spare DEV...`, `create ... spare DEV...`):
    /// each device is checked (not the pool's, no other pool's label
    /// unless `force`, large enough for some data vdev's child) before
    /// anything changes; the command returns once the config naming them
    /// is durable, their labels written.
    pub async fn add_spares(
        self: &Rc<Self>,
        devices: Vec<NewDevice>,
        force: bool,
    ) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        if self.config.borrow().spares.len() + devices.len() > SPARES_MAX {
            return Err(PoolError::InvalidArgument(format!(
                "a pool keeps at most {SPARES_MAX} spares"
            )));
        }
        let smallest_child = self
            .store
            .vdevs()
            .iter()
            .filter(|top| !top.log && top.kind != TopVdevKind::Indirect)
            .map(|top| super::devices::child_data_bytes_needed(top))
            .min()
            .unwrap_or(0);
        for (index, new) in devices.iter().enumerate() {
            self.check_not_in_pool(&new.path, None)?;
            if devices[..index].iter().any(|other| other.path == new.path) {
                return Err(PoolError::InvalidArgument(format!(
                    "{} is listed twice",
                    new.path
                )));
            }
            let info = new.device.info();
            let sector = u64::from(info.physical_sector_bytes.max(info.logical_sector_bytes));
            let finest = self
                .store
                .vdevs()
                .iter()
                .filter(|top| !top.log)
                .map(|top| top.sector_bytes())
                .max()
                .unwrap_or(512);
            if sector > finest {
                return Err(PoolError::InvalidArgument(format!(
                    "{} has {sector}-byte sectors; the pool's vdevs write {finest}-byte ones",
                    new.path
                )));
            }
            let size = info.size_bytes;
            if data_area_bytes(size) < smallest_child {
                return Err(PoolError::InvalidArgument(format!(
                    "{} is too small to stand in for any device of the pool: it needs a data area of {smallest_child} bytes, it has {}",
                    new.path,
                    data_area_bytes(size)
                )));
            }
            check_unlabelled(new, force).await?;
        }
        let tunables = self.tunables.borrow().queue.clone();
        for new in devices {
            let guid = new_guid();
            let size = new.device.info().size_bytes;
            let leaf = LeafVdev::new(guid, new.path.clone(), Some(new.device), tunables.clone());
            leaf.queue.set_events(self.events.clone());
            self.spares.available.borrow_mut().push(leaf);
            self.config.borrow_mut().spares.push(SpareConfig {
                guid,
                path: new.path.clone(),
                device_size_bytes: size,
                replacing: None,
            });
            self.events.post(
                EventClass::DeviceState,
                NewEvent::device(new.path, "added as a hot spare"),
            );
        }
        self.config_dirty.set(true);
        self.commit().await?;
        // A leaf already failed takes one of them now.
        self.start_spare_activation();
        Ok(())
    }

    /// The available spare named `name` (path, file name or guid), if any.
    fn find_available_spare(&self, name: &str) -> Option<Rc<LeafVdev>> {
        self.spares
            .available
            .borrow()
            .iter()
            .find(|leaf| DeviceName::new(name).names_leaf(leaf))
            .cloned()
    }

    /// True when a spare of the pool (available or not) is at `path`.
    pub(super) fn is_spare_path(&self, path: &str) -> bool {
        self.spares
            .available
            .borrow()
            .iter()
            .any(|leaf| *leaf.path.borrow() == path)
    }

    /// True when `name` is an available spare (what `remove` takes).
    pub fn is_available_spare(&self, name: &str) -> bool {
        self.find_available_spare(name).is_some()
    }

    /// Removes an available spare (`remove POOL DEV`): it leaves the config
    /// in a txg the command waits for, then its labels are cleared.
    pub async fn remove_spare(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        self.txg.ensure_writable()?;
        let leaf = self.find_available_spare(name).ok_or_else(|| {
            PoolError::InvalidArgument(format!("{name} is not an available spare"))
        })?;
        self.spares
            .available
            .borrow_mut()
            .retain(|spare| !Rc::ptr_eq(spare, &leaf));
        self.config
            .borrow_mut()
            .spares
            .retain(|spare| spare.guid != leaf.guid());
        let path = leaf.path.borrow().clone();
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(path.clone(), "hot spare removed"),
        );
        self.config_dirty.set(true);
        self.commit().await?;
        if let Some(device) = leaf.device() {
            if let Err(error) = clear_labels(&*device).await {
                eprintln!(
                    "ironpool: {}: clearing the labels of removed spare {path}: {error}",
                    self.name
                );
            }
        }
        leaf.close();
        Ok(())
    }

    /// The spare in use that took the place of the leaf named `name` (no
    /// longer in the tree): its config entry.
    pub(super) fn spare_replacing(&self, name: &str) -> Option<SpareConfig> {
        let named = DeviceName::new(name);
        self.config
            .borrow()
            .spares
            .iter()
            .find(|spare| {
                spare
                    .replacing
                    .as_ref()
                    .is_some_and(|old| named.names(&old.path, old.guid))
            })
            .cloned()
    }

    /// `detach POOL OLD` where a spare took OLD's place: the spare is
    /// permanent from the next txg, an ordinary leaf.
    pub(super) async fn keep_spare(self: &Rc<Self>, spare: SpareConfig) -> Result<(), PoolError> {
        self.config
            .borrow_mut()
            .spares
            .retain(|entry| entry.guid != spare.guid);
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(
                spare.path.clone(),
                format!(
                    "hot spare made permanent in place of {}",
                    spare.replacing.map(|old| old.path).unwrap_or_default()
                ),
            ),
        );
        self.config_dirty.set(true);
        self.commit().await
    }

    /// Called when leaf `guid` leaves the tree (`replace`, `detach`): if it
    /// was a spare in use, it is available again from the next txg (its
    /// device stays open; the caller must not clear its labels, which
    /// the commit rewrites as a spare's). True if it was.
    pub(super) fn spare_left_tree(
        &self,
        guid: u64,
        device: Option<Rc<dyn crate::dev::Device>>,
    ) -> bool {
        let mut config = self.config.borrow_mut();
        let Some(entry) = config
            .spares
            .iter_mut()
            .find(|spare| spare.guid == guid && spare.replacing.is_some())
        else {
            return false;
        };
        entry.replacing = None;
        let leaf = LeafVdev::new(
            guid,
            entry.path.clone(),
            device,
            self.tunables.borrow().queue.clone(),
        );
        leaf.queue.set_events(self.events.clone());
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(entry.path.clone(), "hot spare available again"),
        );
        self.spares.available.borrow_mut().push(leaf);
        self.config_dirty.set(true);
        true
    }

    /// Spares for `status`: available ones, then those in use.
    pub fn spares_status(&self) -> Vec<SpareStatus> {
        let config = self.config.borrow();
        let available = self.spares.available.borrow();
        config
            .spares
            .iter()
            .map(|spare| {
                let leaf = available.iter().find(|leaf| leaf.guid() == spare.guid);
                let state = match (&spare.replacing, leaf) {
                    (Some(_), _) => "in use",
                    (None, Some(leaf)) if leaf.device().is_some() => "available",
                    _ => "missing",
                };
                SpareStatus {
                    path: leaf
                        .map_or_else(|| spare.path.clone(), |leaf| leaf.path.borrow().clone()),
                    guid: format!("{:#x}", spare.guid),
                    state,
                    replacing: spare.replacing.as_ref().map(|old| old.path.clone()),
                }
            })
            .collect()
    }

    /// Writes the config's label onto every available spare (after a commit
    /// that changed the config). A spare whose label cannot be written is
    /// reported and stays in the config (found at import by its older
    /// label, or noted missing).
    pub(super) async fn write_spare_labels(&self, config: &crate::format::label::PoolConfig) {
        let spares: Vec<Rc<LeafVdev>> = self.spares.available.borrow().clone();
        for leaf in spares {
            if leaf.device().is_none() {
                continue;
            }
            let Some(entry) = config.spare(leaf.guid()) else {
                continue;
            };
            let label = Label::of(config, leaf.guid());
            let written = write_labels(&leaf, &label, entry.device_size_bytes, &[0, 1, 2, 3]).await;
            let flushed = match (written, leaf.device()) {
                (Ok(()), Some(device)) => device.flush().await.map_err(|error| error.to_string()),
                (Ok(()), None) => Ok(()),
                (Err(error), _) => Err(error),
            };
            if let Err(error) = flushed {
                eprintln!("ironpool: {}: spare label: {error}", self.name);
            }
        }
    }

    /// Starts the activation task if a leaf needs a spare and one is
    /// available (after each commit, at import, after `add spare`).
    pub(super) fn start_spare_activation(self: &Rc<Self>) {
        if self.spares.shut.get()
            || self.spares.task.borrow().is_some()
            || self.txg.ensure_writable().is_err()
            || self
                .spares
                .available
                .borrow()
                .iter()
                .all(|leaf| leaf.device().is_none())
            || self.failed_leaf().is_none()
        {
            return;
        }
        let pool = self.clone();
        *self.spares.task.borrow_mut() = Some(rt::spawn(async move {
            pool.activate_spares().await;
            *pool.spares.task.borrow_mut() = None;
        }));
    }

    /// Stops activations (export): one running ends first.
    pub(super) async fn spares_stop(&self) {
        self.spares.shut.set(true);
        let task = self.spares.task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }

    /// Closes the available spares' devices (export).
    pub(super) fn close_spares(&self) {
        for leaf in self.spares.available.borrow().iter() {
            leaf.close();
        }
    }

    /// A leaf a spare should replace: faulted or missing (not taken
    /// offline by the operator) in a data vdev that can rebuild it.
    fn failed_leaf(&self) -> Option<(Rc<TopVdev>, usize)> {
        self.store.vdevs().iter().find_map(|top| {
            if top.log || top.kind == TopVdevKind::Disk {
                return None;
            }
            top.children.iter().enumerate().find_map(|(index, leaf)| {
                let failed = matches!(leaf.state(), LeafState::Faulted | LeafState::Missing);
                let rebuildable = super::devices::children_lacking(top, index) < top.redundancy();
                (failed && rebuildable).then(|| (top.clone(), index))
            })
        })
    }

    async fn activate_spares(self: &Rc<Self>) {
        while !self.spares.shut.get() && self.txg.ensure_writable().is_ok() {
            let Some((top, index)) = self.failed_leaf() else {
                return;
            };
            let needed = super::devices::child_data_bytes_needed(&top);
            let spare = self
                .spares
                .available
                .borrow()
                .iter()
                .find(|leaf| {
                    leaf.device().is_some_and(|device| {
                        let info = device.info();
                        let sector =
                            u64::from(info.physical_sector_bytes.max(info.logical_sector_bytes));
                        data_area_bytes(info.size_bytes) >= needed && sector <= top.sector_bytes()
                    })
                })
                .cloned();
            let Some(spare) = spare else {
                return;
            };
            if let Err(error) = self.activate_spare(&top, index, &spare).await {
                eprintln!(
                    "ironpool: {}: activating spare {}: {error}",
                    self.name,
                    spare.path.borrow()
                );
                return;
            }
        }
    }

    /// Puts `spare` in the place of leaf `index` of `top`: as `replace`
    /// does, under the spare's own guid, recording the leaf replaced.
    async fn activate_spare(
        self: &Rc<Self>,
        top: &Rc<TopVdev>,
        index: usize,
        spare: &Rc<LeafVdev>,
    ) -> Result<(), PoolError> {
        let device = spare
            .device()
            .ok_or_else(|| PoolError::Io("the spare has no device".into()))?;
        let leaf = top.children[index].clone();
        let old = ReplacedLeaf {
            guid: leaf.guid(),
            path: leaf.path.borrow().clone(),
        };
        let spare_guid = spare.guid();
        let spare_path = spare.path.borrow().clone();
        self.spares
            .available
            .borrow_mut()
            .retain(|other| !Rc::ptr_eq(other, spare));
        let size = device.info().size_bytes;
        leaf.replace_device(spare_guid, spare_path.clone(), device, self.txg.open());
        {
            let mut config = self.config.borrow_mut();
            // A spare in use that failed in turn: its entry goes, and the
            // new spare stands for what it stood for.
            let replaced = match config
                .spare(old.guid)
                .and_then(|entry| entry.replacing.clone())
            {
                Some(original) => {
                    config.spares.retain(|entry| entry.guid != old.guid);
                    original
                }
                None => old.clone(),
            };
            let slot = &mut config.vdevs[top.id as usize].children[index];
            *slot = LeafConfig {
                dtl: leaf.dtl.borrow().to_config(),
                ..LeafConfig::new(spare_guid, spare_path.clone(), size)
            };
            if let Some(entry) = config
                .spares
                .iter_mut()
                .find(|entry| entry.guid == spare_guid)
            {
                entry.replacing = Some(replaced);
            }
        }
        self.events.post(
            EventClass::DeviceState,
            NewEvent::device(
                spare_path,
                format!("hot spare activated in place of {}", old.path),
            ),
        );
        super::devices::maintain(self, self.txg.open());
        self.config_dirty.set(true);
        self.commit().await?;
        self.resilver_start();
        Ok(())
    }
}
