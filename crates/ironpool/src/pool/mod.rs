//! The pool: devices assembled into top-level vdevs, the objects on them, and the
//! transaction groups that move them atomically from one consistent state to the
//! next.
//!
//! - [`Pool::create`] writes labels and the first txg.
//! - [`Pool::import`] finds the devices, picks the newest valid uberblock, loads the
//!   directory and the space maps.
//! - Changes (volume writes, administration) go into the open txg; [`txg`] commits
//!   them: data, then the metadata tree, then uberblocks, with flushes in between.
//! - [`volume`] serves reads and writes; [`scrub`] verifies and repairs everything.

pub(crate) mod data;
pub mod dataset;
pub mod devices;
pub mod filesystem;
pub mod history;
pub mod labels;
pub mod scan;
pub mod tunables;
pub mod txg;
pub mod volume;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::alloc::{Allocator, RangeError, VdevSpace};
use crate::block::{BlockError, BlockStore};
use crate::dev::file::{FileDevice, OpenError};
use crate::dev::Device;
use crate::events::{EventClass, EventLog, NewEvent};
use crate::format::dnode::DNODE_BYTES;
use crate::format::label::{LeafConfig, PoolConfig, PoolState, TopVdevConfig, TopVdevKind};
use crate::format::spacemap::decode_records;
use crate::format::{
    data_area_bytes, new_guid, ObjectType, Uberblock, DEVICE_SIZE_MIN_BYTES, FORMAT_VERSION,
};
use crate::object::{new_dnode, Object, ObjectError, ObjectSet};
use crate::queue::QueueTunables;
use crate::rt::sync::Notify;
use crate::vdev::{LeafVdev, TopVdev, VdevHealth};
use dataset::directory::{valid_name, Directory, DIRECTORY_OBJECT};
use labels::Probe;
pub use txg::TxgState;
pub use volume::Volume;

/// Block shift of metadata objects (16 KiB): small enough that appending to a space
/// map or changing one dnode rewrites little, large enough for few indirect levels.
pub const METADATA_BLOCK_SHIFT: u8 = 14;
/// Indirect block shift of every object (32 KiB, 256 pointers): a 2 GiB volume of
/// 16 KiB blocks has 512 level-1 blocks; each sync rewrites only the dirty ones.
pub const INDIRECT_BLOCK_SHIFT: u8 = 15;

/// Why a pool operation failed. Every variant is an operating condition with a
/// message an operator can act on.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    #[error("no pool named '{name}' found in {searched}{others}")]
    NotFound {
        name: String,
        searched: String,
        /// What the devices there are instead (other pools' devices), so a
        /// device taken over by another pool is named, not just "not found".
        others: String,
    },
    #[error("more than one pool named '{name}' found (guids {guids}); import one by its guid (`ironpool import GUID [NEWNAME]`) or move the other pool's devices away")]
    Ambiguous { name: String, guids: String },
    #[error("pool '{pool}' cannot be opened: missing or unusable devices: {devices}")]
    MissingDevices { pool: String, devices: String },
    #[error("pool '{pool}' was not exported cleanly and its log device {devices} is missing: writes acknowledged by FLUSH since the last txg may be there. Bring the device back, or import with -m to go on without them (they are lost)")]
    MissingLogDevice { pool: String, devices: String },
    #[error("{0}")]
    Device(String),
    #[error("{path} belongs to pool '{pool}' (guid {guid:#x}); use -f to overwrite it")]
    DeviceInUseByPool {
        path: String,
        pool: String,
        guid: u64,
    },
    #[error("{path} is truncated: the pool expects {expected} bytes, the device has {found}")]
    Truncated {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("pool '{0}' has no valid uberblock (its creation never completed, or every label is damaged)")]
    NoValidUberblock(String),
    #[error("damaged pool metadata: {0}")]
    Corrupt(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("the pool is out of space")]
    NoSpace,
    #[error("{0} is read-only")]
    ReadOnly(String),
    #[error("range {offset}+{length} is outside the volume ({size} bytes)")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("offset {offset} and length {length} must be multiples of {alignment}")]
    Misaligned {
        offset: u64,
        length: u64,
        alignment: u64,
    },
    #[error("no volume '{0}'")]
    NoSuchVolume(String),
    /// A snapshot name (`POOL/VOL@SNAP`) that names no snapshot.
    #[error("no snapshot '{0}'")]
    NoSuchSnapshot(String),
    #[error("volume '{0}' already exists")]
    VolumeExists(String),
    #[error("invalid name '{0}': use letters, digits, '-', '_' and '.', starting with a letter or digit")]
    InvalidName(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the pool is suspended after write errors: {0}")]
    Suspended(String),
    #[error("the pool is being exported")]
    Closing,
}

impl From<BlockError> for PoolError {
    fn from(error: BlockError) -> PoolError {
        match error {
            BlockError::NoSpace => PoolError::NoSpace,
            other => PoolError::Io(other.to_string()),
        }
    }
}

impl From<ObjectError> for PoolError {
    fn from(error: ObjectError) -> PoolError {
        match error {
            ObjectError::Block(block) => block.into(),
            other => PoolError::Corrupt(other.to_string()),
        }
    }
}

impl From<OpenError> for PoolError {
    fn from(error: OpenError) -> PoolError {
        PoolError::Device(error.to_string())
    }
}

impl From<RangeError> for PoolError {
    fn from(error: RangeError) -> PoolError {
        PoolError::Corrupt(format!("space map: {error}"))
    }
}

/// Knobs of a pool instance (not stored on disk).
#[derive(Clone, Debug)]
pub struct PoolTunables {
    /// Longest time a change waits in the open txg before a commit starts (as in
    /// OpenZFS, 5 s: long enough to batch metadata rewrites, short enough to bound
    /// what a crash can lose of unflushed, acknowledged writes).
    pub txg_timeout: Duration,
    /// Dirty metadata that starts a commit early ([`DIRTY_SYNC_BYTES`] by
    /// default).
    pub dirty_sync_bytes: u64,
    /// Dirty metadata at which writers wait for a commit (the write throttle).
    pub dirty_max_bytes: u64,
    /// Clean metadata cached in memory (dirty metadata is bounded by the throttle).
    pub cache_budget_bytes: usize,
    /// Bytes the read cache (ARC) may hold: see [`crate::cache`] (0: off).
    pub arc_max_bytes: u64,
    /// Volume data held dirty in memory before writers wait (see `writeback`);
    /// 0 turns write-back off: every write is written through before its reply.
    pub dirty_data_max_bytes: u64,
    /// The I/O queue of every leaf.
    pub queue: QueueTunables,
    /// Bytes a scrub examines per second at most (0: as fast as the queues
    /// let it; its I/O class already yields to client I/O).
    pub scrub_rate_bytes: u64,
    /// Objects (files, directories) each filesystem and each snapshot open
    /// for reading keeps loaded, at most ([`FS_OBJECTS_LOADED_MAX`] by
    /// default).
    pub fs_objects_loaded_max: u64,
    /// Blocks a dataset let go of in the open txg that a snapshot still
    /// holds, past which they go onto its dead list at once rather than
    /// at the txg build ([`dataset::snapshot::DEAD_SPILL_POINTERS`] by
    /// default; see [`Pool::spill_dead`]).
    pub dead_spill_pointers: u64,
    /// Import a pool that was not exported cleanly although a log device is
    /// missing (`serve -m`, `import -m`): flushed writes whose txg had not
    /// committed may be on that device and are lost. Off, such an import is
    /// refused (as OpenZFS's `zpool import` without `-m`).
    pub discard_missing_log: bool,
    /// Percent of the last intent log commit's time a commit first waits
    /// for more FLUSHes (fsyncs) to share it, while they arrive in parallel
    /// (OpenZFS's `zfs_commit_timeout_pct`, 10 there), at most
    /// `GROUP_COMMIT_WAIT_MAX`; a lone client never waits. 0 here: on a
    /// mirror of two files on one virtual disk, 10 measured slower (16K
    /// random writes QD64, `scripts/bench-durable.sh`, both orders:
    /// `sync=always` about 10% and `--fsync=32` about 25% fewer IOPS), the
    /// wait costing more than the device syncs it saves. It can pay where a
    /// commit's syncs are dear and many writers flush at once.
    pub log_group_wait_percent: u64,
    /// Intent log commits of one volume written at once, at most (1 to
    /// [`dataset::intent_log::LOG_COMMITS_IN_FLIGHT_MAX`]): a FLUSH that
    /// arrives while commits are being written starts the next one beside
    /// them instead of waiting for them (OpenZFS's log blocks in flight),
    /// and they are answered in order. 1 by default: see
    /// `DEFAULT_LOG_COMMITS_IN_FLIGHT` for what more measured.
    pub log_commits_in_flight: u64,
}

/// Objects a filesystem (a head, or a snapshot open for reading) keeps
/// loaded, at most: a loaded object costs about 1.4 KB (its dnode, its
/// cached nodes' index, the map entry), so 65,536 are about 90 MB per
/// filesystem. Without a bound every file ever touched stayed in memory
/// (100,000 created files took 135 MB). Past it, clean objects nobody
/// holds are dropped after each durable txg, and by a load a quarter past
/// it, and loaded again from the dnode table when next used.
pub const FS_OBJECTS_LOADED_MAX: u64 = 65_536;

/// Dirty metadata (bytes of changed nodes and dnodes) that starts a commit
/// before the txg timer, by default: 16 MiB. The txg build encodes every
/// dirty node in one step of the engine's loop, so this bounds how long a
/// build holds the pool's clients. At 64 MiB, `rm -rf` of 100k files (51 MB
/// of dnode table dirtied) held a QD1 read probe on another filesystem for
/// 151-168 ms; at 16 MiB for 28-46 ms, the rm as fast (9.6-10.6 s). It cost
/// nothing measured elsewhere: 100k creates ran at 14.7k-16.0k/s against
/// 13.6k-14.3k/s, and 16K random writes at QD64 over a 16 GiB volume (one
/// 32 KiB indirect block dirtied per write) at 33.6k-35.9k IOPS against
/// 26.9k-31.4k, with fewer device bytes per byte written (2.2 against
/// 2.6-3.0).
pub const DIRTY_SYNC_BYTES: u64 = 16 << 20;

/// Commits a write that found no room waits through for freed space: the
/// txg that frees, the one syncing it and the `DEFER_TXGS` after them. It
/// bounds the wait (a few commits, milliseconds each on an idle pool) when
/// frees keep coming, as on a full pool being overwritten.
pub const FREE_WAIT_COMMITS: u64 = crate::alloc::DEFER_TXGS + 2;

impl Default for PoolTunables {
    fn default() -> PoolTunables {
        PoolTunables {
            txg_timeout: Duration::from_secs(5),
            dirty_sync_bytes: DIRTY_SYNC_BYTES,
            dirty_max_bytes: 512 << 20,
            cache_budget_bytes: 256 << 20,
            arc_max_bytes: crate::cache::default_max_bytes(),
            dirty_data_max_bytes: volume::writeback::DIRTY_DATA_MAX_BYTES,
            queue: QueueTunables::default(),
            scrub_rate_bytes: 0,
            fs_objects_loaded_max: FS_OBJECTS_LOADED_MAX,
            dead_spill_pointers: dataset::snapshot::DEAD_SPILL_POINTERS as u64,
            discard_missing_log: false,
            log_group_wait_percent: 0,
            log_commits_in_flight: dataset::intent_log::DEFAULT_LOG_COMMITS_IN_FLIGHT,
        }
    }
}

/// A device for a new pool: where it is and the open device.
pub struct NewDevice {
    pub path: String,
    pub device: Rc<dyn Device>,
}

/// The shape of a new top-level vdev.
pub struct NewTopVdev {
    pub kind: TopVdevKind,
    pub devices: Vec<NewDevice>,
    /// A log device (a disk or a mirror; see [`TopVdev::log`]).
    pub log: bool,
}

/// A top-level vdev of a layout given by paths (`create`, `add`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayoutGroup {
    pub kind: TopVdevKind,
    pub paths: Vec<PathBuf>,
    /// A log device (see [`TopVdev::log`]).
    pub log: bool,
}

/// Which pool an import takes from the devices found.
#[derive(Clone, Copy, Debug)]
enum PoolSelector<'a> {
    Name(&'a str),
    Guid(u64),
}

impl PoolSelector<'_> {
    fn matches(&self, label: &crate::format::label::Label) -> bool {
        match self {
            PoolSelector::Name(name) => label.config.name == *name,
            PoolSelector::Guid(guid) => label.pool_guid == *guid,
        }
    }
}

impl std::fmt::Display for PoolSelector<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolSelector::Name(name) => write!(formatter, "{name}"),
            PoolSelector::Guid(guid) => write!(formatter, "{guid:#x}"),
        }
    }
}

/// An open pool: the owner of its rooms' components (the txg engine, the
/// datasets, the scans, write-back; see docs/ARCHITECTURE.md, "Who owns
/// which state"). Its fields are private: front ends use its methods.
pub struct Pool {
    name: String,
    guid: u64,
    config: RefCell<PoolConfig>,
    /// The config changed and must be written to the labels at the next sync.
    config_dirty: Cell<bool>,
    store: Rc<BlockStore>,
    objects: Rc<ObjectSet>,
    txg: TxgState,
    /// The directory and the datasets open (see `dataset`).
    datasets: dataset::Datasets,
    /// Filesystems the server mounted, and those an administrator unmounted.
    mounts: RefCell<filesystem::MountState>,
    /// Raised when the server mounted or unmounted a filesystem.
    mounts_noted: Notify,
    tunables: RefCell<PoolTunables>,
    /// The scrub, the resilver and trimming (see `scan`).
    scans: scan::Scans,
    /// Uberblock txg the pool was imported at (0 for a new pool).
    imported_txg: u64,
    /// Notes from import (damaged labels, unclean export, stale devices,
    /// discarded receives) for `status`.
    import_notes: RefCell<Vec<String>>,
    /// Devices unavailable at import: guid and what was wrong. [`Pool::notes`]
    /// names those still out of service.
    missing_at_import: Vec<(u64, String)>,
    /// An operator asked for the pool to be exported (`ironpool export` of
    /// a served pool): the server stops serving, as on SIGTERM.
    export_asked: Notify,
    /// Dirty volume data held in memory (see `writeback`).
    writeback: volume::writeback::PoolWriteback,
    /// Intent log blocks no longer needed, with the txg that stopped naming
    /// them: their space returns once that txg is past the defer depth.
    log_releases: dataset::intent_log::LogReleases,
    /// What happened to the pool and its devices (`ironpool events`).
    events: Rc<EventLog>,
    /// Commands that changed the pool, kept on disk (`ironpool history`).
    history: RefCell<history::History>,
    /// Read-aheads of sequential readers in flight (see `volume::prefetch`).
    prefetch: volume::prefetch::PrefetchState,
}

/// Bounds the read cache while the server's memory runs short (see
/// [`crate::cache::memory`]), until the pool is exported or dropped.
async fn watch_memory(pool: std::rc::Weak<Pool>) {
    use crate::cache::memory;
    loop {
        crate::rt::sleep(memory::MEMORY_WATCH_INTERVAL).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        if pool.txg.is_stopping() {
            return;
        }
        let Some(state) = memory::current() else {
            continue;
        };
        let cache = &pool.store.cache;
        let limit = memory::next_limit(
            state,
            cache.size_bytes(),
            cache.memory_limit_bytes(),
            crate::cache::ARC_MIN_BYTES,
            pool.tunables.borrow().arc_max_bytes,
        );
        if limit != cache.memory_limit_bytes() {
            cache.set_memory_limit(limit);
        }
    }
}

fn describe_open_error(error: &OpenError) -> String {
    error.to_string()
}

impl Pool {
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool's guid, which its devices' labels carry.
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// The txg engine: open and durable txgs, health, statistics.
    pub fn txg(&self) -> &TxgState {
        &self.txg
    }

    /// The block store: vdevs, allocator, verified reads, block statistics.
    pub fn store(&self) -> &Rc<BlockStore> {
        &self.store
    }

    /// The object set: every object's tree and the metadata cache.
    pub fn objects(&self) -> &Rc<ObjectSet> {
        &self.objects
    }

    /// The event ring (`ironpool events`): device errors, state changes,
    /// scans, suspension.
    pub fn events(&self) -> &Rc<EventLog> {
        &self.events
    }

    /// Connects every leaf's queue to the event ring. Done once the pool is
    /// open: the reads an import makes of blocks that may never have been
    /// written (the end of an intent log chain) are not device errors.
    /// Creates the (empty) metaslab array of the next top-level vdev and
    /// names it in the directory; returns its object id.
    fn create_metaslab_array(&self) -> u64 {
        let id = self.allocate_object_id();
        self.objects.create(
            id,
            new_dnode(
                ObjectType::MetaslabArray,
                METADATA_BLOCK_SHIFT,
                INDIRECT_BLOCK_SHIFT,
                0,
                1,
            ),
        );
        self.datasets.directory.edit().metaslab_arrays.push(id);
        id
    }

    fn wire_events(&self) {
        self.store.set_events(self.events.clone());
        for top in self.store.vdevs().iter() {
            for leaf in &top.children {
                leaf.queue.set_events(self.events.clone());
            }
        }
    }

    /// A read-only view of the pool directory (datasets, properties).
    pub fn directory(&self) -> std::cell::Ref<'_, Directory> {
        self.datasets.directory.read()
    }

    /// The open volumes by short name, hidden ones (receives) included.
    pub fn open_volumes(&self) -> Vec<(String, Rc<Volume>)> {
        self.datasets.volumes.named()
    }

    /// The uberblock txg the pool was imported at (0 for a new pool).
    pub fn imported_txg(&self) -> u64 {
        self.imported_txg
    }

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
            datasets: dataset::Datasets::new(
                Directory {
                    version: 1,
                    ..Directory::default()
                },
                true,
            ),
            txg: TxgState::new(1, 0),
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
            prefetch: Default::default(),
        });
        // Object 0 is the dnode table, 1 the directory, then one metaslab array per
        // top-level vdev.
        let directory_id = pool.allocate_object_id();
        assert_eq!(directory_id, DIRECTORY_OBJECT);
        pool.objects.create(
            directory_id,
            new_dnode(
                ObjectType::Directory,
                METADATA_BLOCK_SHIFT,
                INDIRECT_BLOCK_SHIFT,
                0,
                1,
            ),
        );
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
        for LayoutGroup { kind, paths, log } in layout {
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
            tops.push(NewTopVdev { kind, devices, log });
        }
        Pool::create_on_devices(name, tops, force, tunables).await
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
                    if uberblock.txg != uberblocks[0].txg {
                        pool.import_notes.borrow_mut().push(format!(
                            "rewound from txg {} to txg {}: the newer one was unreadable",
                            uberblocks[0].txg, uberblock.txg
                        ));
                    }
                    // Before anything allocates: replay claims the space of
                    // what the intent logs name.
                    let prepared = dataset::intent_log::prepare_replay(&pool).await;
                    pool.start_after_import();
                    let replayed = dataset::intent_log::apply_replay(&pool, prepared).await;
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
        let table_length = table.dnode().length_bytes;
        objects.prefetch(&table, 0, table_length).await?;
        let directory_object = objects.open(DIRECTORY_OBJECT).await?;
        let length = directory_object.dnode().length_bytes as usize;
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
            datasets: dataset::Datasets::new(directory.clone(), false),
            txg: TxgState::new(uberblock.txg + 1, uberblock.txg),
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
            prefetch: Default::default(),
        });
        pool.load_history().await;
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
                dataset::props::settings(&record.properties, &directory.properties),
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

    /// Notes for `status` and the server's log: the import's, and which
    /// devices unavailable at import are still out of service (one replaced
    /// or brought back is not named).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = self.import_notes.borrow().clone();
        let out_of_service: Vec<&str> = self
            .missing_at_import
            .iter()
            .filter(|(guid, _)| {
                self.store
                    .vdevs()
                    .iter()
                    .flat_map(|top| top.children.iter())
                    .any(|leaf| leaf.guid() == *guid && !leaf.is_online())
            })
            .map(|(_, description)| description.as_str())
            .collect();
        if !out_of_service.is_empty() {
            notes.push(format!(
                "degraded: missing or unusable devices: {}",
                out_of_service.join(", ")
            ));
        }
        notes
    }

    /// Hands out a new object number (the dnode table's length is the high-water
    /// mark; numbers are never reused, 2^64 is enough).
    pub fn allocate_object_id(&self) -> u64 {
        let table = self.objects.dnode_table();
        let mut dnode = table.dnode.borrow_mut();
        let id = dnode.length_bytes / DNODE_BYTES as u64;
        dnode.length_bytes += DNODE_BYTES as u64;
        table.dirty.set(true);
        id
    }

    /// Completes once a volume or snapshot is destroyed after the call (a
    /// future made before the destroy and polled after it completes too).
    pub fn export_destroyed(&self) -> crate::rt::sync::Notified<'_> {
        self.datasets.exports_gone.notified()
    }

    /// Asks whoever serves the pool to export it (`ironpool export`).
    pub fn request_export(&self) {
        self.export_asked.notify_all();
    }

    /// Completes once an export is asked for after the call.
    pub fn export_requested(&self) -> crate::rt::sync::Notified<'_> {
        self.export_asked.notified()
    }

    /// Volumes users see (not the hidden volumes of receives in progress).
    pub fn visible_volumes(&self) -> Vec<Rc<Volume>> {
        self.datasets
            .volumes
            .named()
            .into_iter()
            .filter(|(short, _)| !is_hidden_dataset(short))
            .map(|(_, volume)| volume)
            .collect()
    }

    pub fn volume(&self, name: &str) -> Result<Rc<Volume>, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name);
        self.datasets
            .volumes
            .get(short)
            .ok_or_else(|| PoolError::NoSuchVolume(name.to_string()))
    }

    /// The short name of a dataset about to be made ("POOL/NAME" or
    /// "NAME"), if it is a valid one.
    pub(crate) fn new_dataset_short_name(&self, name: &str) -> Result<String, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name)
            .to_string();
        if !valid_name(&short) {
            return Err(PoolError::InvalidName(short));
        }
        Ok(short)
    }

    /// Refuses `short` when a volume (hidden ones included) or a filesystem
    /// has it: the two share names.
    pub(crate) fn check_name_free(&self, short: &str) -> Result<(), PoolError> {
        if self.datasets.directory.read().lineage(short).is_some() {
            return Err(PoolError::VolumeExists(format!("{}/{short}", self.name)));
        }
        Ok(())
    }

    /// Creates a volume of `size_bytes` with blocks of `block_bytes`.
    pub async fn create_volume(
        self: &Rc<Self>,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Volume>, PoolError> {
        let short = self.new_dataset_short_name(name)?;
        // A volume appearing during `check` would take writes the walk
        // never sees: creation waits for it like other administrative changes.
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.create_volume_named(short, size_bytes, block_bytes, properties)
            .await
    }

    /// Creates a volume under a name already checked (receive uses names users
    /// cannot give).
    pub(crate) async fn create_volume_named(
        self: &Rc<Self>,
        short: String,
        size_bytes: u64,
        block_bytes: u32,
        properties: BTreeMap<String, String>,
    ) -> Result<Rc<Volume>, PoolError> {
        self.check_name_free(&short)?;
        let max_sector = self
            .store
            .vdevs()
            .iter()
            .map(|top| top.sector_bytes())
            .max()
            .unwrap_or(4096);
        if !block_bytes.is_power_of_two()
            || (block_bytes as u64) < max_sector.max(4096)
            || block_bytes > volume::VOLUME_BLOCK_BYTES_MAX
        {
            return Err(PoolError::InvalidArgument(format!(
                "volblocksize {block_bytes} must be a power of two from {} to {}",
                max_sector.max(4096),
                volume::VOLUME_BLOCK_BYTES_MAX
            )));
        }
        if size_bytes == 0 || !size_bytes.is_multiple_of(block_bytes as u64) {
            return Err(PoolError::InvalidArgument(format!("volume size {size_bytes} must be a positive multiple of the volblocksize {block_bytes}")));
        }
        if size_bytes > volume::VOLUME_SIZE_MAX_BYTES {
            return Err(PoolError::InvalidArgument(format!(
                "volume size {size_bytes} exceeds {}",
                volume::VOLUME_SIZE_MAX_BYTES
            )));
        }
        let mut properties = properties;
        for (key, value) in properties.iter_mut() {
            *value = dataset::props::validate(key, value, false)?;
        }
        if properties.contains_key("volsize") {
            return Err(PoolError::InvalidArgument(
                "the volume's size is given by its size argument".into(),
            ));
        }
        let checksum = self.volume_settings(&properties).checksum;
        self.txg.ensure_writable()?;
        let open_txg = self.txg.open();
        let id = self.allocate_object_id();
        let mut dnode = new_dnode(
            ObjectType::VolumeData,
            block_bytes.trailing_zeros() as u8,
            INDIRECT_BLOCK_SHIFT,
            size_bytes,
            open_txg,
        );
        dnode.checksum_algo = checksum;
        let object = self.objects.create(id, dnode);
        let record = volume::record(id, size_bytes, block_bytes, open_txg, properties);
        let volume = Volume::new(
            format!("{}/{short}", self.name),
            object,
            &record,
            self.volume_settings(&record.properties),
        );
        self.datasets
            .directory
            .edit()
            .volumes
            .insert(short.clone(), record);
        self.datasets.volumes.insert(short, volume.clone());
        self.commit().await?;
        Ok(volume)
    }

    /// Destroys a volume and frees its blocks.
    pub async fn destroy_volume(
        self: &Rc<Self>,
        name: &str,
        recursive: bool,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let volume = self.volume(name)?;
        let short = volume.short_name().to_string();
        let record = self.volume_record(&short)?;
        let snapshots = self.snapshots_to_destroy(name, &short, &record.lineage, recursive)?;
        let _writers = self.exclusive(&volume).await?;
        // A log commit in flight finishes first; the chain goes with the volume.
        let _log = self.discard_log(&volume).await;
        // No txg may be built from here until the tree is gone: the walk below
        // awaits reads, and a build meanwhile would sync the volume's dirty nodes
        // (freeing their old copies) under the pointers already collected, which
        // were then freed twice (found by ironpool-sim seed 15, mirror).
        let hold = self.txg.hold_builds();
        volume.begin_destroy();
        self.datasets.exports_gone.notify_all();
        for snapshot in snapshots.iter().rev() {
            self.destroy_snapshot_locked(snapshot).await?;
        }
        // Blocks born after the origin are the volume's own (all of them when it
        // is not a clone); older ones, and whatever is on its dead list, belong to
        // the origin snapshot.
        let origin_txg = volume.object.dnode().origin_txg;
        // Collected first, then freed: a read that fails part way through
        // the walk must leave nothing freed for the next build to commit.
        let pointers = self
            .pointers_born_after(&volume.object, None, origin_txg)
            .await?;
        self.free_in_slices(&pointers).await;
        volume.object.dead.borrow_mut().clear();
        self.drop_dead_list(volume.object.dead_list.replace(0))?;
        self.objects.clear_dnode(volume.object.id).await?;
        self.datasets.volumes.remove(&short);
        {
            let mut directory = self.datasets.directory.edit();
            directory.volumes.remove(&short);
            if let Some(origin) = &record.lineage.origin {
                if let Some(origin_record) = directory.volumes.get_mut(&origin.volume) {
                    for snapshot in origin_record.lineage.snapshots.iter_mut() {
                        snapshot.clones.retain(|clone| clone != &short);
                    }
                }
            }
        }
        drop(hold);
        self.commit().await
    }

    /// The open object of dead list `object_id`: every dead list a dataset
    /// or snapshot names is opened at import, so a missing one is damage.
    pub(crate) fn dead_list_object(&self, object_id: u64) -> Result<Rc<Object>, PoolError> {
        self.objects
            .get(object_id)
            .ok_or_else(|| PoolError::Corrupt(format!("dead list {object_id} is not open")))
    }

    /// Frees a dead list object (not the blocks it lists).
    pub(crate) fn drop_dead_list(&self, object_id: u64) -> Result<(), PoolError> {
        if object_id == 0 {
            return Ok(());
        }
        self.datasets.dead_space.forget(object_id);
        let object = self.dead_list_object(object_id)?;
        self.objects.truncate_cached(&object, 0)?;
        self.objects.free_object_cached(&object)?;
        Ok(())
    }

    /// Writes out every volume's dirty blocks, commits the open txg and waits
    /// until it is durable: every write acknowledged before it is then on disk
    /// (as an OpenZFS txg sync writes all dirty data). Administrative changes
    /// end with it.
    pub async fn commit(self: &Rc<Self>) -> Result<(), PoolError> {
        self.drain_all().await?;
        let target = self.txg.open();
        self.txg.wait_durable(self, target).await
    }

    /// Makes every write completed so far durable, on every volume: their
    /// dirty blocks are written out, then the txg is committed (if it holds
    /// anything). The pool-wide [`Pool::flush_volume`].
    ///
    /// The durability verbs, weakest first: `drain_volume`/`drain_all`
    /// (written out and linked, not yet durable), `flush_volume`/`flush_all`
    /// (what a client's FLUSH promises), `commit_linked` (what is linked is
    /// durable), `commit` (everything, through a txg even if it is empty).
    pub async fn flush_all(self: &Rc<Self>) -> Result<(), PoolError> {
        self.drain_all().await?;
        self.commit_linked().await
    }

    /// Makes every change linked into the trees so far durable (a FUA write's
    /// own block is linked before this; dirty blocks are not written out).
    pub async fn commit_linked(self: &Rc<Self>) -> Result<(), PoolError> {
        let target = if self.has_changes() {
            self.txg.open()
        } else {
            self.txg.open() - 1
        };
        self.txg.wait_durable(self, target).await
    }

    /// True when the open txg holds any change. A filesystem's own objects
    /// count too: a change of names or attributes alone (a `chmod`, a
    /// `rename`) dirties them and nothing of the pool's until the txg build
    /// writes their dnodes into the table, and without them here the txg
    /// timer let such a change wait in memory for the next other change.
    pub fn has_changes(&self) -> bool {
        self.config_dirty.get()
            || self.datasets.directory.is_dirty()
            || self.history.borrow().is_dirty()
            || self.objects.any_dirty()
            || self.datasets.filesystems.any(|fs| fs.objects.any_dirty())
            || self.store.allocator.borrow().has_pending()
    }

    /// Gives the pool a new name in its labels from the next commit (an
    /// import under a new name): the open pool keeps answering to its old
    /// name until it is imported again.
    pub fn rename_in_labels(&self, name: &str) -> Result<(), PoolError> {
        if !valid_name(name) {
            return Err(PoolError::InvalidArgument(format!(
                "'{name}' is not a valid pool name (letters, digits, '-', '_', '.'; starting with a letter or digit)"
            )));
        }
        self.txg.ensure_writable()?;
        self.config.borrow_mut().name = name.to_string();
        self.config_dirty.set(true);
        Ok(())
    }

    /// Stops taking changes, waits for every log commit in flight, commits
    /// everything, marks the pool exported in its labels and releases the
    /// devices.
    pub async fn export(self: &Rc<Self>) -> Result<(), PoolError> {
        self.prefetch.stop().await;
        self.scrub_pause().await;
        self.resilver_stop().await;
        self.trim_stop().await;
        // Every write, FLUSH or other change that checks `ensure_writable`
        // from here on is refused: one taken after the final txg below
        // would be lost as the devices close. One already past its check
        // goes on: linked before the sync task stops, a txg of `stop`
        // commits it; a FUA write's or FLUSH's commit checks again.
        self.txg.close();
        // The log commits in flight end first (one started ahead of a FLUSH
        // outlives its request), and the permits keep the logs idle to the
        // end.
        let _logs = self.quiesce_logs().await;
        self.config.borrow_mut().state = PoolState::Exported;
        self.config_dirty.set(true);
        self.commit().await?;
        self.txg.stop(self).await;
        for top in self.store.vdevs().iter() {
            for leaf in &top.children {
                leaf.close();
            }
        }
        Ok(())
    }

    /// Pool capacity figures.
    pub fn space(&self) -> (u64, u64) {
        let allocator = self.store.allocator.borrow();
        let size = allocator.size_bytes();
        (size, allocator.free_bytes())
    }

    /// Bytes of data a new write may still take: the free space less what
    /// only metadata may use (see `Allocator::data_available_bytes`) and
    /// less the space promised to blocks held for writing out (volume
    /// write-back, filesystem write-behind), which must find it when they
    /// go out: a write acknowledged is never lost to a later one.
    pub fn data_available_bytes(&self) -> u64 {
        self.store
            .allocator
            .borrow()
            .data_available_bytes()
            .saturating_sub(self.promised_bytes())
    }

    /// Bytes of data writes may take, counting the space being freed: freed
    /// blocks come back to the allocator only a few txgs later, but a write
    /// that needs them waits for them ([`Pool::wait_for_freed_space`]), so
    /// `df` shows a removed file's space as soon as its blocks are freed,
    /// as ext4's does, not when the timer's commits have passed (15 s
    /// after the removal).
    pub fn writable_bytes(&self) -> u64 {
        let freeing = self.store.allocator.borrow().deferred_bytes();
        self.data_available_bytes().saturating_add(freeing)
    }

    /// Waits until space being freed can be allocated again, when it would
    /// make room for `bytes` of data: freed blocks come back only once their
    /// txg and the `DEFER_TXGS` after it are durable, so right after a large
    /// file is removed a write would get ENOSPC for that long although the
    /// space is as good as free. Commits (at most [`FREE_WAIT_COMMITS`]
    /// txgs) until nothing is on its way back; returns whether it waited,
    /// that is whether a retry may now fit.
    pub async fn wait_for_freed_space(self: &Rc<Self>, bytes: u64) -> Result<bool, PoolError> {
        let freeing = self.store.allocator.borrow().deferred_bytes();
        if freeing == 0 || self.writable_bytes() < bytes {
            return Ok(false);
        }
        for _ in 0..FREE_WAIT_COMMITS {
            self.commit().await?;
            if self.store.allocator.borrow().deferred_bytes() == 0 {
                break;
            }
        }
        Ok(true)
    }

    /// ONLINE, DEGRADED (some vdev serves with less redundancy than it
    /// should, or has devices to resilver, or a log device is lost), UNAVAIL (some vdev lost more
    /// devices than it can), or SUSPENDED.
    pub fn health(&self) -> &'static str {
        let worst = self
            .store
            .vdevs()
            .iter()
            .map(|top| match top.health() {
                // A log device lost costs no data (log blocks go to the
                // main devices): the pool is degraded, not unavailable.
                VdevHealth::Unavail if top.log => VdevHealth::Degraded,
                health => health,
            })
            .max_by_key(|health| match health {
                VdevHealth::Online => 0,
                VdevHealth::Degraded => 1,
                VdevHealth::Unavail => 2,
            });
        if self.txg.suspended().is_some() {
            "SUSPENDED"
        } else {
            match worst {
                Some(VdevHealth::Unavail) => "UNAVAIL",
                Some(VdevHealth::Degraded) => "DEGRADED",
                _ => "ONLINE",
            }
        }
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
        let length = object.dnode().length_bytes as usize;
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
                let length = map.dnode().length_bytes as usize;
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
        let probe = labels::probe_device(&*new.device, Path::new(&new.path)).await;
        if let Some(label) = probe.label {
            if !force {
                return Err(PoolError::DeviceInUseByPool {
                    path: new.path.clone(),
                    pool: label.config.name,
                    guid: label.pool_guid,
                });
            }
        }
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
    match top.raidz_geometry() {
        Some(geometry) => space.with_raidz(*geometry),
        None => space,
    }
}

/// True for the hidden dataset (volume or filesystem) of a receive in
/// progress, `TARGET%recv` (see `receive`): not listed, mounted or served.
pub fn is_hidden_dataset(short_name: &str) -> bool {
    short_name.contains('%')
}

/// Metaslab size: about 200 to 400 per vdev, at least 16 MiB, at most 16 GiB.
/// (The allocator looks at every metaslab's largest free extent when a data
/// run starts: the count bounds that.)
pub fn metaslab_shift_for(data_bytes: u64) -> u8 {
    let target = (data_bytes / 200).max(1);
    let shift = 63 - target.leading_zeros() as u8;
    shift.clamp(24, 34)
}

/// Bytes written at a time by `create_written_file`.
const WRITTEN_FILE_CHUNK_BYTES: usize = 1 << 20;

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

pub(crate) fn hostname() -> String {
    // A simulated pool records a fixed host, so its labels replay bit for bit.
    if crate::rt::in_simulation() {
        return "simulator".to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}
