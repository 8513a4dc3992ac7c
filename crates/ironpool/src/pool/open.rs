//! Creating a pool on devices or files, importing one (finding its devices,
//! choosing the newest config, loading its space maps), and assembling top
//! vdevs from devices.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use super::dataset::directory::{valid_name, Directory, DIRECTORY_OBJECT};
use super::labels::Probe;
use super::txg::TxgState;
use super::volume::Volume;
use super::{
    datasets, describe_open_error, devices, history, hostname, labels, metaslab_shift_for, scan,
    txg, watch_memory, LayoutGroup, NewDevice, NewTopVdev, Pool, PoolError, PoolSelector,
    PoolTunables, INDIRECT_BLOCK_SHIFT, METADATA_BLOCK_SHIFT, WRITTEN_FILE_CHUNK_BYTES,
};
use crate::alloc::{Allocator, VdevSpace};
use crate::block::BlockStore;
use crate::dev::file::{FileDevice, OpenError};
use crate::dev::Device;
use crate::events::{EventClass, EventLog, NewEvent};
use crate::format::dnode::DNODE_BYTES;
use crate::format::label::{LeafConfig, PoolConfig, PoolState, TopVdevConfig, TopVdevKind};
use crate::format::spacemap::decode_records;
use crate::format::{
    data_area_bytes, new_guid, ObjectType, Uberblock, DEVICE_SIZE_MIN_BYTES, FORMAT_VERSION,
};
use crate::object::{new_dnode, ObjectSet};
use crate::rt::sync::Notify;
use crate::vdev::{LeafVdev, TopVdev};

impl Pool {
    /// Creates a pool on open devices and commits its first txg.
    pub async fn create_on_devices(
        name: &str,
        layout: Vec<NewTopVdev>,
        force: bool,
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        if !valid_name(name) {
            return Err(PoolError::InvalidName(name.to_string()));
        }
        if layout.is_empty() {
            return Err(PoolError::InvalidArgument(
                "a pool needs at least one device".into(),
            ));
        }
        let mut vdevs = Vec::new();
        let mut top_configs = Vec::new();
        let mut create_command = format!("create {name}");
        let mut logs_named = false;
        for top in &layout {
            if top.log && !logs_named {
                create_command.push_str(" log");
                logs_named = true;
            }
            if top.kind != TopVdevKind::Disk {
                let keyword = top.kind.vdev_name(0);
                create_command.push(' ');
                create_command.push_str(keyword.trim_end_matches("-0"));
            }
            for new in &top.devices {
                create_command.push(' ');
                create_command.push_str(&new.path);
            }
        }
        if layout.iter().all(|top| top.log) {
            return Err(PoolError::InvalidArgument(
                "a pool needs at least one device that is not a log device".into(),
            ));
        }
        for (id, top) in layout.into_iter().enumerate() {
            let (top_vdev, config) = build_top_vdev(id, top, force, &tunables).await?;
            top_configs.push(config);
            vdevs.push(Rc::new(top_vdev));
        }
        let config = PoolConfig {
            name: name.to_string(),
            pool_guid: new_guid(),
            version: FORMAT_VERSION,
            config_txg: 1,
            state: PoolState::Active,
            hostname: hostname(),
            vdevs: top_configs,
            spares: Vec::new(),
        };
        let spaces = vdevs.iter().map(|top| vdev_space(top)).collect();
        let store = BlockStore::new(vdevs, Allocator::new(spaces), tunables.arc_max_bytes);
        // Slot 0 is reserved: the dnode table's own dnode lives in the uberblock.
        let table = new_dnode(
            ObjectType::DnodeTable,
            METADATA_BLOCK_SHIFT,
            INDIRECT_BLOCK_SHIFT,
            DNODE_BYTES as u64,
            1,
        );
        let objects = ObjectSet::new(store.clone(), table, tunables.cache_budget_bytes);
        let pool = Rc::new(Pool {
            name: name.to_string(),
            guid: config.pool_guid,
            config: RefCell::new(config),
            config_dirty: Cell::new(true),
            store,
            objects,
            datasets: datasets::Datasets::new(
                Directory {
                    version: 1,
                    ..Directory::default()
                },
                true,
            ),
            txg: TxgState::new(1, 0),
            pressure: Default::default(),
            mounts: RefCell::default(),
            mounts_noted: Notify::new(),
            tunables: RefCell::new(tunables),
            scans: scan::Scans::default(),
            imported_txg: 0,
            import_notes: RefCell::new(Vec::new()),
            missing_at_import: Vec::new(),
            export_asked: Notify::new(),
            writeback: Default::default(),
            log_releases: Default::default(),
            events: Rc::new(EventLog::new()),
            history: RefCell::new(history::History::default()),
            clone_table: Default::default(),
            removal: Default::default(),
            prefetch: Default::default(),
            spares: Default::default(),
            gather: Default::default(),
            reservations_refreshing: Cell::new(false),
            reserved_unused: Cell::new(0),
        });
        // Object 0 is the dnode table, 1 the directory, then one metaslab array per
        // top-level vdev.
        let (directory_id, _) = pool.create_metadata_object(ObjectType::Directory, 1);
        assert_eq!(directory_id, DIRECTORY_OBJECT);
        let vdev_count = pool.store.vdevs().len();
        for vdev in 0..vdev_count {
            let id = pool.create_metaslab_array();
            pool.store.allocator.borrow_mut().vdevs[vdev].array_object = id;
        }
        pool.wire_events();
        // The first record, which a full history keeps.
        pool.log_history(create_command);
        pool.events.post(
            EventClass::PoolCreate,
            NewEvent::detail(format!("{} top-level vdevs", pool.store.vdevs().len())),
        );
        pool.start();
        pool.commit().await?;
        Ok(pool)
    }

    /// Creates a pool on device paths (files are created sparse with `size_bytes`
    /// when given and missing).
    /// A failed create removes the sparse files it made itself (never a file
    /// that was there before), so a corrected command can be run again.
    pub async fn create(
        name: &str,
        layout: Vec<LayoutGroup>,
        force: bool,
        size_bytes: Option<u64>,
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        let mut created = Vec::new();
        let result =
            Pool::create_files_and_pool(name, layout, force, size_bytes, tunables, &mut created)
                .await;
        if result.is_err() {
            for path in &created {
                let _ = std::fs::remove_file(path);
            }
        }
        result
    }

    /// `create`'s work; records in `created` each file it made.
    async fn create_files_and_pool(
        name: &str,
        layout: Vec<LayoutGroup>,
        force: bool,
        size_bytes: Option<u64>,
        tunables: PoolTunables,
        created: &mut Vec<PathBuf>,
    ) -> Result<Rc<Pool>, PoolError> {
        let mut seen = std::collections::BTreeSet::new();
        let mut tops = Vec::new();
        let mut spares = Vec::new();
        for LayoutGroup {
            kind,
            paths,
            log,
            spare,
        } in layout
        {
            let mut devices = Vec::new();
            for path in paths {
                if let Some(size) = size_bytes {
                    if !path.exists() {
                        if log {
                            create_written_file(&path, size)?;
                        } else {
                            create_sparse_file(&path, size)?;
                        }
                        created.push(path.clone());
                    }
                }
                let canonical = std::fs::canonicalize(&path)
                    .map_err(|error| PoolError::Device(format!("{}: {error}", path.display())))?;
                if !seen.insert(canonical.clone()) {
                    return Err(PoolError::InvalidArgument(format!(
                        "{} is listed twice",
                        path.display()
                    )));
                }
                let device = FileDevice::open(&canonical)
                    .map_err(|error| PoolError::Device(describe_open_error(&error)))?;
                devices.push(NewDevice {
                    path: canonical.display().to_string(),
                    device: Rc::new(device),
                });
            }
            if spare {
                spares.extend(devices);
            } else {
                tops.push(NewTopVdev { kind, devices, log });
            }
        }
        // The spares are checked before anything is written, so a bad one
        // leaves no pool behind: no other pool's label (unless `force`),
        // and a data area as large as the smallest data device's (what
        // any child of the new vdevs needs, or more).
        let smallest = tops
            .iter()
            .filter(|top| !top.log)
            .flat_map(|top| top.devices.iter())
            .map(|new| data_area_bytes(new.device.info().size_bytes))
            .min()
            .unwrap_or(0);
        for spare in &spares {
            if data_area_bytes(spare.device.info().size_bytes) < smallest {
                return Err(PoolError::InvalidArgument(format!(
                    "spare {} is smaller than the pool's data devices",
                    spare.path
                )));
            }
            labels::check_unlabelled(spare, force).await?;
        }
        let pool = Pool::create_on_devices(name, tops, force, tunables).await?;
        if !spares.is_empty() {
            pool.add_spares(spares, force).await?;
        }
        Ok(pool)
    }

    /// Imports pool `name` from the devices in `directories`.
    pub async fn import(
        name: &str,
        directories: &[PathBuf],
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        let mut probes = Vec::new();
        for directory in directories {
            let found = labels::probe_directory(directory)
                .await
                .map_err(|error| PoolError::Device(format!("{}: {error}", directory.display())))?;
            probes.extend(found);
        }
        let searched = directories
            .iter()
            .map(|path| path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mine: Vec<&Probe> = probes
            .iter()
            .filter(|probe| {
                probe
                    .label
                    .as_ref()
                    .is_some_and(|label| label.config.name == name)
            })
            .collect();
        let guids = labels::pool_guids(mine.iter().copied());
        match guids.len() {
            0 => {
                let mut others: Vec<String> = probes
                    .iter()
                    .filter_map(|probe| {
                        probe.label.as_ref().map(|label| {
                            format!(
                                "{} belongs to pool '{}' (guid {:#x})",
                                probe.path.display(),
                                label.config.name,
                                label.pool_guid
                            )
                        })
                    })
                    .collect();
                others.sort();
                let others = if others.is_empty() {
                    String::new()
                } else {
                    format!("; {}", others.join(", "))
                };
                return Err(PoolError::NotFound {
                    name: name.to_string(),
                    searched,
                    others,
                });
            }
            1 => {}
            _ => {
                return Err(PoolError::Ambiguous {
                    name: name.to_string(),
                    guids: guids
                        .iter()
                        .map(|guid| format!("{guid:#x}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        }
        // Open (and lock) the devices that belong to it.
        let mut devices: Vec<(String, Rc<dyn Device>)> = Vec::new();
        for probe in mine {
            let device = open_when_free(&probe.path).await?;
            devices.push((probe.path.display().to_string(), Rc::new(device)));
        }
        Pool::import_from_devices(name, devices, tunables).await
    }

    /// Imports pool `name` from open devices.
    pub async fn import_from_devices(
        name: &str,
        devices: Vec<(String, Rc<dyn Device>)>,
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        Pool::import_selected(PoolSelector::Name(name), devices, tunables).await
    }

    /// Imports the pool with guid `guid` from the devices in `directories`,
    /// whatever its name (two pools of one name, or a rename cut short that
    /// left some labels with each name).
    pub async fn import_guid(
        guid: u64,
        directories: &[PathBuf],
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        let mut devices: Vec<(String, Rc<dyn Device>)> = Vec::new();
        for directory in directories {
            let found = labels::probe_directory(directory)
                .await
                .map_err(|error| PoolError::Device(format!("{}: {error}", directory.display())))?;
            for probe in found {
                if probe
                    .label
                    .as_ref()
                    .is_some_and(|label| label.pool_guid == guid)
                {
                    let device = open_when_free(&probe.path).await?;
                    devices.push((probe.path.display().to_string(), Rc::new(device)));
                }
            }
        }
        Pool::import_selected(PoolSelector::Guid(guid), devices, tunables).await
    }

    async fn import_selected(
        selector: PoolSelector<'_>,
        devices: Vec<(String, Rc<dyn Device>)>,
        tunables: PoolTunables,
    ) -> Result<Rc<Pool>, PoolError> {
        let mut probes: Vec<(Probe, Rc<dyn Device>)> = Vec::new();
        for (path, device) in devices {
            let probe = labels::probe_device(&*device, Path::new(&path)).await;
            if probe
                .label
                .as_ref()
                .is_some_and(|label| selector.matches(label))
            {
                probes.push((probe, device));
            }
        }
        let Some((config, uberblocks)) = choose_config(&probes) else {
            return Err(PoolError::NotFound {
                name: selector.to_string(),
                searched: "the given devices".into(),
                others: String::new(),
            });
        };
        let name = config.name.clone();
        let name = name.as_str();
        let mut notes = Vec::new();
        for (probe, _) in &probes {
            for (index, reason) in &probe.damaged_labels {
                notes.push(format!(
                    "{}: label {index} is damaged ({reason}); the other labels were used",
                    probe.path.display()
                ));
            }
        }
        if config.state == PoolState::Active {
            notes.push(
                "the pool was not exported cleanly; it was recovered to its last committed txg"
                    .to_string(),
            );
        }
        // Assemble the vdev tree from the config, matching devices by guid.
        let (vdevs, missing) = devices::assemble(name, &config, &probes, &tunables)?;
        let lost_logs: Vec<String> = vdevs
            .iter()
            .filter(|top| top.log && !top.is_available())
            .flat_map(|top| top.children.iter().map(|leaf| leaf.path.borrow().clone()))
            .collect();
        if !lost_logs.is_empty() {
            if config.state == PoolState::Active && !tunables.discard_missing_log {
                return Err(PoolError::MissingLogDevice {
                    pool: name.to_string(),
                    devices: lost_logs.join(", "),
                });
            }
            notes.push(format!(
                "log device {} is unavailable: the intent log is kept in the main devices until it is replaced or removed",
                lost_logs.join(", ")
            ));
        }
        if uberblocks.is_empty() {
            return Err(PoolError::NoValidUberblock(name.to_string()));
        }
        // A device whose newest uberblock is older than the pool's (an old
        // copy put back, a device that missed commits) lacks the txgs since:
        // its log says so before anything is read, so reads do not trust it
        // for them and a resilver brings it up to date.
        notes.extend(devices::mark_stale_leaves(
            &vdevs,
            &probes,
            config.pool_guid,
            uberblocks[0].txg,
        ));
        // The newest uberblock whose metadata loads wins; an older one is tried
        // only if the newest's tree is unreadable (its frees are still deferred, so
        // the previous trees are intact).
        let mut last_error = None;
        for uberblock in uberblocks
            .iter()
            .take(1 + crate::alloc::DEFER_TXGS as usize)
        {
            match Pool::load(
                name,
                &config,
                vdevs.clone(),
                uberblock,
                tunables.clone(),
                notes.clone(),
                missing.clone(),
            )
            .await
            {
                Ok(pool) => {
                    let spare_notes = pool.open_spares(&probes);
                    pool.import_notes.borrow_mut().extend(spare_notes);
                    if uberblock.txg != uberblocks[0].txg {
                        pool.import_notes.borrow_mut().push(format!(
                            "rewound from txg {} to txg {}: the newer one was unreadable",
                            uberblocks[0].txg, uberblock.txg
                        ));
                    }
                    // Before anything allocates: replay claims the space of
                    // what the intent logs name.
                    let prepared = datasets::intent_log::prepare_replay(&pool).await;
                    pool.start_after_import();
                    let replayed = datasets::intent_log::apply_replay(&pool, prepared).await;
                    pool.import_notes.borrow_mut().extend(replayed.notes);
                    if replayed.changes > 0 {
                        // A file the log left with no names (unlinked while
                        // open) goes, as at any import.
                        pool.reclaim_unlinked().await?;
                        // Replayed writes are durable before anything is served.
                        pool.commit().await?;
                    }
                    // A receive interrupted by a crash that was not started
                    // with -s can never finish: its hidden volume goes, with
                    // the space it holds.
                    let discarded = pool.discard_unresumable_receives().await;
                    pool.import_notes.borrow_mut().extend(discarded);
                    // A removal the pool was making goes on, once the logs
                    // are replayed (it moves their chains off the vdev).
                    pool.removal_resume();
                    let notes = pool.notes();
                    pool.events.post(
                        EventClass::PoolImport,
                        NewEvent::detail(format!(
                            "at txg {}{}{}",
                            pool.imported_txg,
                            if notes.is_empty() { "" } else { ": " },
                            notes.join("; ")
                        )),
                    );
                    // A leaf found missing takes a spare (after replay:
                    // the activation commits).
                    pool.start_spare_activation();
                    // Reservations hold space back from the first write.
                    pool.refresh_reservations();
                    return Ok(pool);
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| PoolError::NoValidUberblock(name.to_string())))
    }

    async fn load(
        name: &str,
        config: &PoolConfig,
        vdevs: Vec<Rc<TopVdev>>,
        uberblock: &Uberblock,
        tunables: PoolTunables,
        notes: Vec<String>,
        missing: Vec<(u64, String)>,
    ) -> Result<Rc<Pool>, PoolError> {
        let spaces = vdevs.iter().map(|top| vdev_space(top)).collect();
        let store = BlockStore::new(vdevs, Allocator::new(spaces), tunables.arc_max_bytes);
        store.set_open_txg(uberblock.txg + 1);
        let objects = ObjectSet::new(
            store.clone(),
            uberblock.dnode_table,
            tunables.cache_budget_bytes,
        );
        objects.set_durable_txg(uberblock.txg);
        // Metadata objects stay cached: read the whole dnode table and directory.
        let table = objects.dnode_table();
        let table_length = table.length_bytes();
        objects.prefetch(&table, 0, table_length).await?;
        let directory_object = objects.open(DIRECTORY_OBJECT).await?;
        let length = directory_object.length_bytes() as usize;
        let bytes = objects.read_bytes(&directory_object, 0, length).await?;
        let directory = Directory::decode(&bytes).map_err(PoolError::Corrupt)?;
        if directory.metaslab_arrays.len() != config.vdevs.len() {
            return Err(PoolError::Corrupt(format!(
                "{} metaslab arrays for {} vdevs",
                directory.metaslab_arrays.len(),
                config.vdevs.len()
            )));
        }
        load_space(&objects, &store, &directory, uberblock.txg).await?;
        store.allocator.borrow_mut().recount();
        let mut imported_config = config.clone();
        imported_config.state = PoolState::Active;
        // A pool of an older format version is written in this one from
        // its first commit (labels and uberblocks): see FORMAT_VERSION.
        imported_config.version = FORMAT_VERSION;
        let pool = Rc::new(Pool {
            name: name.to_string(),
            guid: config.pool_guid,
            config: RefCell::new(imported_config),
            config_dirty: Cell::new(true),
            store,
            objects,
            datasets: datasets::Datasets::new(directory.clone(), false),
            txg: TxgState::new(uberblock.txg + 1, uberblock.txg),
            pressure: Default::default(),
            mounts: RefCell::default(),
            mounts_noted: Notify::new(),
            tunables: RefCell::new(tunables),
            scans: scan::Scans::default(),
            imported_txg: uberblock.txg,
            import_notes: RefCell::new(notes),
            missing_at_import: missing,
            export_asked: Notify::new(),
            writeback: Default::default(),
            log_releases: Default::default(),
            events: Rc::new(EventLog::new()),
            history: RefCell::new(history::History::default()),
            clone_table: Default::default(),
            removal: Default::default(),
            prefetch: Default::default(),
            spares: Default::default(),
            gather: Default::default(),
            reservations_refreshing: Cell::new(false),
            reserved_unused: Cell::new(0),
        });
        pool.load_history().await;
        pool.load_clone_table().await?;
        pool.load_removals().await?;
        for (volume_name, record) in &directory.volumes {
            let object = pool.objects.open(record.object).await?;
            object.dead_list.set(record.lineage.dead_list);
            // Dead lists are opened here, with what the txg build needs of
            // them (`ObjectSet::load_dead_list`); the rest is read when asked.
            for list in std::iter::once(record.lineage.dead_list).chain(
                record
                    .lineage
                    .snapshots
                    .iter()
                    .map(|snapshot| snapshot.dead_list),
            ) {
                if list != 0 {
                    let list_object = pool.objects.open(list).await?;
                    pool.objects.load_dead_list(&list_object).await?;
                }
            }
            let volume = Volume::new(
                format!("{name}/{volume_name}"),
                object,
                record,
                pool.volume_settings(volume_name, &record.own_properties()),
            );
            pool.datasets.volumes.insert(volume_name.clone(), volume);
        }
        pool.open_filesystems().await?;
        pool.reclaim_unlinked().await?;
        Ok(pool)
    }

    /// Starts the background txg sync, and the memory watcher of the read
    /// cache (not under the simulator, whose memory is not the machine's).
    fn start(self: &Rc<Self>) {
        txg::start_sync_task(self);
        if !crate::rt::is_simulated() {
            let pool = Rc::downgrade(self);
            crate::rt::spawn(async move { watch_memory(pool).await });
        }
    }

    /// Starts an imported pool: devices that came back have their dirty time
    /// logs closed and get a resilver, devices away get theirs opened. A
    /// scrub the pool was running when it was last open resumes.
    fn start_after_import(self: &Rc<Self>) {
        self.wire_events();
        devices::maintain(self, self.txg.open());
        self.start();
        self.resilver_start();
        self.scrub_resume();
    }
}

/// Rebuilds every metaslab's free space: its checkpoint (space map) followed by
/// the space log's records of later txgs.
async fn load_space(
    objects: &ObjectSet,
    store: &BlockStore,
    directory: &Directory,
    imported_txg: u64,
) -> Result<(), PoolError> {
    use crate::format::spacemap::Record;
    use txg::METASLAB_ENTRY_BYTES;
    // Route the log's records to their metaslabs: (vdev, metaslab) -> (txg, record).
    let mut logged: BTreeMap<(usize, usize), Vec<(u64, Record)>> = BTreeMap::new();
    for log in &directory.space_logs {
        let object = objects.open(log.object).await?;
        let length = object.length_bytes() as usize;
        let bytes = objects.read_bytes(&object, 0, length).await?;
        let records = decode_records(&bytes)
            .map_err(|error| PoolError::Corrupt(format!("space log {}: {error}", log.object)))?;
        let (mut txg, mut vdev) = (0u64, None::<usize>);
        let allocator = store.allocator.borrow();
        for record in records {
            match record {
                Record::Txg(value) => txg = value,
                Record::Vdev(value) => vdev = Some(value as usize),
                Record::Allocate { offset, .. } | Record::Free { offset, .. } => {
                    let vdev_index = vdev
                        .filter(|index| *index < allocator.vdevs.len())
                        .ok_or_else(|| {
                            PoolError::Corrupt(format!(
                                "space log {}: record without a valid vdev",
                                log.object
                            ))
                        })?;
                    // The records of a vdev removed since: its space is gone.
                    if store
                        .vdev(vdev_index as u32)
                        .is_some_and(|top| top.kind == TopVdevKind::Indirect)
                    {
                        continue;
                    }
                    let metaslab = (offset >> allocator.vdevs[vdev_index].metaslab_shift) as usize;
                    if metaslab >= allocator.vdevs[vdev_index].metaslabs.len() || txg > imported_txg
                    {
                        return Err(PoolError::Corrupt(format!(
                            "space log {}: record {record:?} of txg {txg} out of range",
                            log.object
                        )));
                    }
                    logged
                        .entry((vdev_index, metaslab))
                        .or_default()
                        .push((txg, record));
                }
            }
        }
    }
    for (vdev_index, &array_id) in directory.metaslab_arrays.iter().enumerate() {
        let indirect = store
            .vdev(vdev_index as u32)
            .is_some_and(|top| top.kind == TopVdevKind::Indirect);
        if indirect != (array_id == 0) {
            return Err(PoolError::Corrupt(format!(
                "vdev {vdev_index}: metaslab array {array_id} for a {} vdev",
                if indirect { "removed" } else { "present" }
            )));
        }
        if indirect {
            continue;
        }
        let array = objects.open(array_id).await?;
        let count = store.allocator.borrow().vdevs[vdev_index].metaslabs.len();
        let entries = objects
            .read_bytes(&array, 0, count * METASLAB_ENTRY_BYTES as usize)
            .await?;
        store.allocator.borrow_mut().vdevs[vdev_index].array_object = array_id;
        for metaslab_index in 0..count {
            let entry = &entries[metaslab_index * METASLAB_ENTRY_BYTES as usize..]
                [..METASLAB_ENTRY_BYTES as usize];
            let map_id = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
            let flushed_txg = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
            let mut records = Vec::new();
            if map_id != 0 {
                let map = objects.open(map_id).await?;
                let length = map.length_bytes() as usize;
                let bytes = objects.read_bytes(&map, 0, length).await?;
                records = decode_records(&bytes)
                    .map_err(|error| PoolError::Corrupt(format!("space map {map_id}: {error}")))?;
            }
            let mut unflushed_txg = 0;
            let mut last_marker = None;
            for (txg, record) in logged
                .remove(&(vdev_index, metaslab_index))
                .unwrap_or_default()
            {
                if txg <= flushed_txg {
                    continue;
                }
                if unflushed_txg == 0 {
                    unflushed_txg = txg;
                }
                if last_marker != Some(txg) {
                    records.push(Record::Txg(txg));
                    last_marker = Some(txg);
                }
                records.push(record);
            }
            let mut allocator = store.allocator.borrow_mut();
            let metaslab = &mut allocator.vdevs[vdev_index].metaslabs[metaslab_index];
            metaslab.space_map_object = map_id;
            metaslab.flushed_txg = flushed_txg;
            metaslab.unflushed_txg = unflushed_txg;
            metaslab.replay(&records, imported_txg).map_err(|error| {
                PoolError::Corrupt(format!(
                    "space of vdev {vdev_index} metaslab {metaslab_index}: {error}"
                ))
            })?;
        }
    }
    Ok(())
}

/// How long import waits for a device held by another opener: a server killed
/// a moment ago keeps its devices locked until the kernel has torn down its
/// io_uring (in-flight operations hold the files).
const DEVICE_BUSY_WAIT: Duration = Duration::from_secs(5);

async fn open_when_free(path: &Path) -> Result<FileDevice, PoolError> {
    let started = crate::rt::now();
    loop {
        match FileDevice::open(path) {
            Err(OpenError::InUse { .. })
                if crate::rt::now().duration_since(started) < DEVICE_BUSY_WAIT =>
            {
                crate::rt::sleep(Duration::from_millis(100)).await;
            }
            result => return result.map_err(PoolError::from),
        }
    }
}

/// The pool config to import with and its uberblocks, newest first: the
/// newest config some uberblock was written with (matching its device guid
/// sum). A commit that changed the devices (a replace) can be cut short after
/// the new config reached some labels but before any uberblock did; then the
/// previous config is the pool's state.
fn choose_config(probes: &[(Probe, Rc<dyn Device>)]) -> Option<(PoolConfig, Vec<Uberblock>)> {
    let mut configs: Vec<&PoolConfig> = probes
        .iter()
        .flat_map(|(probe, _)| probe.label.iter().chain(probe.older_labels.iter()))
        .map(|label| &label.config)
        .collect();
    configs.sort_by_key(|config| std::cmp::Reverse(config.config_txg));
    configs.dedup_by_key(|config| config.config_txg);
    let newest = (*configs.first()?).clone();
    for config in configs {
        let mut uberblocks: Vec<Uberblock> = probes
            .iter()
            .flat_map(|(probe, _)| probe.uberblocks.iter().copied())
            .filter(|uberblock| {
                uberblock.pool_guid == config.pool_guid && uberblock.guid_sum == config.guid_sum()
            })
            .collect();
        if uberblocks.is_empty() {
            continue;
        }
        uberblocks.sort_by_key(|uberblock| std::cmp::Reverse(uberblock.txg));
        uberblocks.dedup_by_key(|uberblock| uberblock.txg);
        return Some((config.clone(), uberblocks));
    }
    Some((newest, Vec::new()))
}

/// Allocatable bytes of a new top-level vdev from its children's data areas:
/// the smallest for a disk or mirror (every child holds everything); for
/// RAID-Z, the group's sector space dealt round-robin over the children (see
/// docs/FORMAT.md, "RAID-Z"), so every child contributes the smallest's sectors.
fn group_data_bytes(
    kind: TopVdevKind,
    child_data_bytes: impl Iterator<Item = u64>,
    ashift: u8,
) -> u64 {
    let sizes: Vec<u64> = child_data_bytes.collect();
    let smallest = sizes.iter().copied().min().unwrap_or(0);
    if kind.is_raidz() {
        ((smallest >> ashift) * sizes.len() as u64) << ashift
    } else {
        smallest
    }
}

/// The allocator's view of a top-level vdev.
/// Builds top-level vdev `id` of a new pool or one being added to (`add`)
/// from `top`'s open devices: checks its shape and each device (size, no
/// other pool's label unless `force`), sizes it, and returns it with its
/// config.
pub(crate) async fn build_top_vdev(
    id: usize,
    top: NewTopVdev,
    force: bool,
    tunables: &PoolTunables,
) -> Result<(TopVdev, TopVdevConfig), PoolError> {
    if top.log && top.kind.is_raidz() {
        return Err(PoolError::InvalidArgument(
            "a log device is a disk or a mirror, not RAID-Z".into(),
        ));
    }
    let expected = top.kind.children_range();
    if !expected.contains(&top.devices.len()) {
        return Err(PoolError::InvalidArgument(format!(
            "a {} vdev takes {} to {} devices, got {}",
            top.kind
                .vdev_name(id as u32)
                .rsplit_once('-')
                .map_or("", |(kind, _)| kind),
            expected.start(),
            expected.end(),
            top.devices.len()
        )));
    }
    for new in &top.devices {
        let info = new.device.info();
        if info.size_bytes < DEVICE_SIZE_MIN_BYTES {
            return Err(PoolError::InvalidArgument(format!(
                "{} is {} bytes; a device needs at least {} bytes",
                new.path, info.size_bytes, DEVICE_SIZE_MIN_BYTES
            )));
        }
        labels::check_unlabelled(new, force).await?;
    }
    let ashift = top
        .devices
        .iter()
        .map(|new| {
            (new.device
                .info()
                .physical_sector_bytes
                .max(new.device.info().logical_sector_bytes) as u64)
                .trailing_zeros() as u8
        })
        .max()
        .unwrap_or(crate::format::ASHIFT_DEFAULT)
        .clamp(crate::format::ASHIFT_DEFAULT, crate::format::ASHIFT_MAX);
    let data_bytes = group_data_bytes(
        top.kind,
        top.devices
            .iter()
            .map(|new| data_area_bytes(new.device.info().size_bytes)),
        ashift,
    );
    let metaslab_shift = metaslab_shift_for(data_bytes);
    let asize_bytes = data_bytes >> metaslab_shift << metaslab_shift;
    if asize_bytes == 0 {
        return Err(PoolError::InvalidArgument(
            "devices too small for one metaslab".into(),
        ));
    }
    let guid = new_guid();
    let mut children = Vec::new();
    let mut leaves = Vec::new();
    for new in top.devices {
        let leaf_guid = new_guid();
        children.push(LeafConfig::new(
            leaf_guid,
            new.path.clone(),
            new.device.info().size_bytes,
        ));
        leaves.push(LeafVdev::new(
            leaf_guid,
            new.path,
            Some(new.device),
            tunables.queue.clone(),
        ));
    }
    let mut top_vdev = TopVdev::new(
        id as u32,
        guid,
        top.kind,
        ashift,
        asize_bytes,
        metaslab_shift,
        leaves,
    )
    .map_err(|error| PoolError::InvalidArgument(error.to_string()))?;
    if top.log {
        top_vdev = top_vdev.into_log();
    }
    let config = TopVdevConfig {
        id: id as u32,
        guid,
        kind: top.kind,
        ashift,
        asize_bytes,
        metaslab_shift,
        children,
        log: top.log,
    };
    Ok((top_vdev, config))
}

pub(crate) fn vdev_space(top: &TopVdev) -> VdevSpace {
    let mut space = VdevSpace::new(
        top.id,
        top.asize_bytes,
        top.metaslab_shift,
        top.sector_bytes(),
    );
    if top.log {
        space = space.for_log();
    }
    if top.kind == TopVdevKind::Indirect {
        // A removed vdev has no space (see `removal`).
        space = VdevSpace::new(top.id, 0, top.metaslab_shift, top.sector_bytes());
    }
    match top.raidz_geometry() {
        Some(geometry) => space.with_raidz(*geometry),
        None => space,
    }
}

/// Creates a file of `size_bytes` with every byte written (zeros), for a log
/// device: a log write into a sparse file's hole makes the flush after it
/// commit the host filesystem's allocation too (about 40% fewer flushed
/// writes per second at queue depth 1 on ext4), and log blocks are written
/// all over the device. Fails without leaving a partial file behind.
pub fn create_written_file(path: &Path, size_bytes: u64) -> Result<(), PoolError> {
    use std::io::Write;
    let fail = |error: std::io::Error| PoolError::Device(format!("{}: {error}", path.display()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(fail)?;
    let zeros = vec![0u8; WRITTEN_FILE_CHUNK_BYTES];
    let mut left = size_bytes;
    let result = (|| {
        while left > 0 {
            let chunk = left.min(WRITTEN_FILE_CHUNK_BYTES as u64) as usize;
            file.write_all(&zeros[..chunk])?;
            left -= chunk as u64;
        }
        file.sync_all()
    })();
    if let Err(error) = result {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(fail(error));
    }
    Ok(())
}

/// Creates a sparse file of `size_bytes`.
pub fn create_sparse_file(path: &Path, size_bytes: u64) -> Result<(), PoolError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|error| PoolError::Device(format!("{}: {error}", path.display())))?;
    file.set_len(size_bytes)
        .map_err(|error| PoolError::Device(format!("{}: {error}", path.display())))?;
    Ok(())
}
