//! The pool: devices assembled into top-level vdevs, the objects on them, and the
//! transaction groups that move them atomically from one consistent state to the
//! next.
//!
//! - [`Pool::create`] writes labels and the first txg.
//! - [`Pool::import`] (both in `open.rs`) finds the devices, picks the newest valid uberblock, loads the
//!   directory and the space maps.
//! - Changes (volume writes, administration) go into the open txg; [`txg`] commits
//!   them: data, then the metadata tree, then uberblocks, with flushes in between.
//! - [`volume`] serves reads and writes; [`scrub`] verifies and repairs everything.

pub(crate) mod clones;
pub(crate) mod data;
pub mod dataset;
pub mod datasets;
pub mod devices;
pub mod dirty;
pub mod filesystem;
pub mod history;
pub mod labels;
mod open;
pub mod removal;
pub mod scan;
pub mod spares;
pub mod split;
#[cfg(test)]
pub(crate) mod test_pool;
pub mod tunables;
pub mod txg;
pub mod volume;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use crate::alloc::RangeError;
use crate::block::{BlockError, BlockStore};
use crate::dev::file::OpenError;
use crate::dev::Device;
use crate::events::EventLog;
use crate::format::dnode::DNODE_BYTES;
use crate::format::label::{PoolConfig, PoolState, TopVdevKind};
use crate::format::ObjectType;
use crate::object::{new_dnode, Object, ObjectError, ObjectSet};
use crate::queue::QueueTunables;
use crate::rt::sync::Notify;
use crate::vdev::VdevHealth;
use dataset::directory::{valid_dataset_name, valid_name, Directory};
pub(crate) use open::{build_top_vdev, vdev_space};
pub use open::{create_sparse_file, create_written_file};
pub use txg::TxgState;
pub use volume::Volume;

/// Whose intent log: a volume's or a filesystem's. The head of each chain is
/// in that dataset's directory record.
#[derive(Clone, Copy)]
pub(crate) enum Owner<'a> {
    Volume(&'a volume::Volume),
    Filesystem(&'a filesystem::Filesystem),
}

impl<'a> Owner<'a> {
    pub(in crate::pool) fn log(self) -> &'a dataset::intent_log::IntentLog {
        match self {
            Owner::Volume(volume) => &volume.log,
            Owner::Filesystem(fs) => &fs.log,
        }
    }

    /// The dataset's full name, for messages.
    pub(crate) fn name(self) -> String {
        match self {
            Owner::Volume(volume) => volume.name(),
            Owner::Filesystem(fs) => fs.name(),
        }
    }
}

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
    /// A write past a dataset's `quota` or `refquota` (EDQUOT for a file,
    /// ENOSPC for a volume).
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
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
    #[error("invalid name '{0}': use letters, digits, '-', '_' and '.', starting with a letter or digit (a nested dataset: such names joined by '/', fewer than 50 levels deep and at most 255 bytes with the pool's name)")]
    InvalidName(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the pool is suspended after write errors: {0}")]
    Suspended(String),
    #[error("the pool is being exported")]
    Closing,
    /// An encrypted dataset's data asked for while its key is not loaded.
    #[error("key not loaded: {0} (ironpool load-key)")]
    KeyUnavailable(String),
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
            error @ ObjectError::KeyUnavailable { .. } => {
                PoolError::KeyUnavailable(error.to_string())
            }
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
    /// at the txg build ([`datasets::snapshot::DEAD_SPILL_POINTERS`] by
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
    /// A filesystem's direct writes are made durable before they are
    /// answered while its client calls `fsync` at most this many writes
    /// apart with writes in parallel (0: never); the `fsync` then finds
    /// nothing to commit. Default
    /// [`dataset::intent_log::DURABLE_WRITES_FSYNC_GAP_MAX`], where the
    /// measurements are.
    pub fs_durable_writes_fsync_gap: u64,
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

/// Waits for space ([`Pool::wait_for_freed_space`]) that brought no freed
/// space back a write that found no room makes before its ENOSPC: space
/// other writes only held may go to them, so one such wait is not enough,
/// and a few bound how long a write on a pool that really is full waits
/// for its answer (each wait is a few commits).
pub const NO_SPACE_WAITS_MAX: u32 = 4;

/// Waits for space, of any kind, a write that found no room makes before
/// its ENOSPC. A wait that brought freed space back does not count against
/// [`NO_SPACE_WAITS_MAX`] (the pool is being overwritten, and space comes
/// back every txg, but others may take it first: 256 KiB overwrites by 8
/// jobs at 90% full met ENOSPC after 4 such waits); this bounds them all,
/// so that a write's answer comes in at most this many times a few commits.
pub const SPACE_WAITS_MAX: u32 = 64;

/// What one [`Pool::wait_for_freed_space`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceWait {
    /// Nothing was on its way back, or not enough of it to make room: the
    /// write has its ENOSPC now.
    Hopeless,
    /// Other writes held space, and nothing was freed: they may give some
    /// back, or take it.
    HeldByOthers,
    /// Freed space was on its way back, and the wait's commits returned it.
    Freed,
}

impl Default for PoolTunables {
    fn default() -> PoolTunables {
        PoolTunables {
            txg_timeout: Duration::from_secs(5),
            dirty_sync_bytes: DIRTY_SYNC_BYTES,
            dirty_max_bytes: 512 << 20,
            cache_budget_bytes: 256 << 20,
            arc_max_bytes: crate::cache::default_max_bytes(),
            dirty_data_max_bytes: dirty::DIRTY_DATA_MAX_BYTES,
            queue: QueueTunables::default(),
            scrub_rate_bytes: 0,
            fs_objects_loaded_max: FS_OBJECTS_LOADED_MAX,
            dead_spill_pointers: datasets::snapshot::DEAD_SPILL_POINTERS as u64,
            discard_missing_log: false,
            log_group_wait_percent: 0,
            log_commits_in_flight: dataset::intent_log::DEFAULT_LOG_COMMITS_IN_FLIGHT,
            fs_durable_writes_fsync_gap: dataset::intent_log::DURABLE_WRITES_FSYNC_GAP_MAX as u64,
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
    /// A hot spare (one device; see `spares`).
    #[serde(default)]
    pub spare: bool,
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
    /// Dirty data and the metadata reserve (see `pressure`).
    pressure: dirty::Pressure,
    /// The directory and the datasets open (see `dataset`).
    datasets: datasets::Datasets,
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
    writeback: dirty::PoolWriteback,
    /// Intent log blocks no longer needed, with the txg that stopped naming
    /// them: their space returns once that txg is past the defer depth.
    log_releases: dataset::intent_log::LogReleases,
    /// What happened to the pool and its devices (`ironpool events`).
    events: Rc<EventLog>,
    /// Commands that changed the pool, kept on disk (`ironpool history`).
    history: RefCell<history::History>,
    /// The block reference table's object (block cloning).
    clone_table: clones::CloneTableObject,
    /// The removal of a data vdev (see `removal`).
    removal: removal::Removal,
    /// Read-aheads of sequential readers in flight (see `volume::prefetch`).
    prefetch: volume::prefetch::PrefetchState,
    /// Hot spares ready to stand in for a failed leaf (see `spares`).
    spares: spares::Spares,
    /// Data blocks of concurrent writes gathered into runs (see
    /// `data::write_blocks_gathered`).
    gather: data::Gather,
    /// A refresh of the reserving datasets' figures is running
    /// (`dataset::quota`).
    reservations_refreshing: Cell<bool>,
    /// The space every open dataset reserved and does not use, as last
    /// counted (`dataset::quota`).
    reserved_unused: Cell<u64>,
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
    /// Asks every volume's and filesystem's write-out to go now rather than
    /// when its batch fills: writers wait for room under the dirty-data
    /// limit (`dirty.rs`, which knows neither room, calls this).
    pub(crate) fn nudge_write_outs(&self) {
        for volume in self.datasets.volumes.all() {
            volume.writeback.nudge();
        }
        for (_, fs) in self.all_filesystems() {
            fs.nudge_write_outs();
        }
    }

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
        let (id, _) = self.create_metadata_object(ObjectType::MetaslabArray, 1);
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

    /// Creates an empty pool-level object of `kind` made of metadata blocks
    /// (the directory, a space map or log, a metaslab array, a dead list,
    /// the history, the block reference table, a removal's mapping), born
    /// in `txg`, and returns its number and the object. The caller names
    /// it where it belongs (the directory, a metaslab).
    pub(in crate::pool) fn create_metadata_object(
        &self,
        kind: ObjectType,
        txg: u64,
    ) -> (u64, Rc<crate::object::Object>) {
        let id = self.allocate_object_id();
        let dnode = new_dnode(kind, METADATA_BLOCK_SHIFT, INDIRECT_BLOCK_SHIFT, 0, txg);
        (id, self.objects.create(id, dnode))
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

    /// The short name of a dataset about to be made ("POOL/A/B" or "A/B"),
    /// if it is a valid one whose parent exists.
    pub(crate) fn new_dataset_short_name(&self, name: &str) -> Result<String, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name)
            .to_string();
        if !valid_dataset_name(&self.name, &short) {
            return Err(PoolError::InvalidName(short));
        }
        self.check_parent(&short)?;
        Ok(short)
    }

    /// Refuses a dataset `short` whose parent is missing or is not a
    /// filesystem: as in OpenZFS, only filesystems have children (a
    /// volume's bytes have nowhere to put a child's mountpoint).
    pub(crate) fn check_parent(&self, short: &str) -> Result<(), PoolError> {
        let Some(parent) = dataset::directory::parent_name(short) else {
            return Ok(());
        };
        let directory = self.datasets.directory.read();
        if directory.filesystems.contains_key(parent) {
            return Ok(());
        }
        let why = if directory.volumes.contains_key(parent) {
            "is a volume: only filesystems have children"
        } else {
            "does not exist: create it first, or give -p to create every missing parent"
        };
        Err(PoolError::InvalidArgument(format!(
            "cannot create {}/{short}: parent {}/{parent} {why}",
            self.name, self.name
        )))
    }

    /// The datasets below `short` (not itself), hidden ones of receives
    /// in progress too, deepest last: a name sorts after its parent's, so
    /// destroying them in reverse takes children before parents.
    pub fn descendants(&self, short: &str) -> Vec<String> {
        let directory = self.datasets.directory.read();
        let mut below: Vec<String> = directory
            .lineages()
            .map(|(name, _)| name.clone())
            .filter(|name| name != short && dataset::directory::is_within(name, short))
            .collect();
        below.sort();
        below
    }

    /// The missing parents of dataset `name` ("POOL/A/B/C": `A` and `A/B`
    /// if absent), outermost first: what `create -p` makes as filesystems.
    pub fn missing_parents(&self, name: &str) -> Vec<String> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name);
        let directory = self.datasets.directory.read();
        let mut missing: Vec<String> = dataset::directory::ancestors(short)
            .take_while(|name| directory.lineage(name).is_none())
            .map(|name| format!("{}/{name}", self.name))
            .collect();
        missing.reverse();
        missing
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
        self.create_volume_with(name, size_bytes, block_bytes, properties, None)
            .await
    }

    /// [`Pool::create_volume`], encrypted as `encryption` says (a new
    /// encryption root, its key loaded; `Off`: refused under an encrypted
    /// filesystem; none: that filesystem's key, if any).
    pub async fn create_volume_with(
        self: &Rc<Self>,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        properties: BTreeMap<String, String>,
        encryption: Option<dataset::keys::CreateKey>,
    ) -> Result<Rc<Volume>, PoolError> {
        let short = self.new_dataset_short_name(name)?;
        // A volume appearing during `check` would take writes the walk
        // never sees: creation waits for it like other administrative changes.
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.create_volume_named(short, size_bytes, block_bytes, properties, encryption)
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
        encryption: Option<dataset::keys::CreateKey>,
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
        if properties.get("refreservation").map(String::as_str) == Some("auto") {
            properties.insert(
                "refreservation".into(),
                volume::thick_reservation(size_bytes, block_bytes).to_string(),
            );
        }
        for (key, value) in properties.iter_mut() {
            *value = dataset::props::validate(key, value, false)?;
        }
        if properties.contains_key("volsize") {
            return Err(PoolError::InvalidArgument(
                "the volume's size is given by its size argument".into(),
            ));
        }
        self.check_new_limits(&format!("{}/{short}", self.name), &properties)?;
        let checksum = self.volume_settings(&short, &properties).checksum;
        self.txg.ensure_writable()?;
        // The key is made (and a passphrase stretched) before anything is
        // created: a bad key leaves nothing behind.
        let (crypt, _) = self.crypt_of_new(&short, encryption).await?;
        self.check_name_free(&short)?;
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
        let mut record = volume::record(id, size_bytes, block_bytes, open_txg, properties);
        record.crypt = crypt;
        let volume = Volume::new(
            format!("{}/{short}", self.name),
            object,
            &record,
            self.volume_settings(&short, &record.own_properties()),
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
        self.spares_stop().await;
        self.prefetch.stop().await;
        self.scrub_pause().await;
        self.removal_pause().await;
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
        self.close_spares();
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

    /// Waits for space that may come back to a write of `bytes` that found
    /// no room, and returns whether it waited, that is whether a retry may
    /// now fit. Space comes back two ways: freed blocks, which return only
    /// once their txg and the `DEFER_TXGS` after it are durable (right after
    /// a large file is removed a write would get ENOSPC for that long
    /// although the space is as good as free), and space other writes hold
    /// (claimed by writes in flight, promised to blocks held in memory),
    /// which a commit turns into blocks whose overwritten predecessors are
    /// then freed. A pool being overwritten at full speed near full has
    /// most of its free space in those two states at any moment: 64 writes
    /// of 256 KiB at 90% full met ENOSPC on a pool with 10% free when the
    /// space others held was counted as gone. Commits (at most
    /// [`FREE_WAIT_COMMITS`] txgs) until nothing is on its way back;
    /// returns [`SpaceWait::Hopeless`] at once when nothing is, or when
    /// even all of it would not make room.
    pub async fn wait_for_freed_space(self: &Rc<Self>, bytes: u64) -> Result<SpaceWait, PoolError> {
        let (freeing, available) = {
            let allocator = self.store.allocator.borrow();
            (allocator.deferred_bytes(), allocator.data_available_bytes())
        };
        let held = self.promised_bytes();
        if freeing.saturating_add(held) == 0 || available.saturating_add(freeing) < bytes {
            return Ok(SpaceWait::Hopeless);
        }
        for _ in 0..FREE_WAIT_COMMITS {
            self.commit().await?;
            if self.store.allocator.borrow().deferred_bytes() == 0 {
                break;
            }
        }
        Ok(if freeing > 0 {
            SpaceWait::Freed
        } else {
            SpaceWait::HeldByOthers
        })
    }

    /// Runs `attempt` (a claim of `bytes`, or a whole write) until it
    /// succeeds or fails for another reason than room (`no_room` tells),
    /// waiting for space on its way back ([`Pool::wait_for_freed_space`])
    /// before each new try: the one rule every writer that meets ENOSPC
    /// follows. It gives up after [`NO_SPACE_WAITS_MAX`] waits that brought
    /// no freed space back (a full pool answers soon), or
    /// [`SPACE_WAITS_MAX`] waits in all (a pool overwritten at full speed
    /// keeps a write trying while frees keep coming). `attempt` must hold
    /// no lock a commit takes between tries.
    pub(crate) async fn retry_while_space_returns<T, E, Attempt>(
        self: &Rc<Self>,
        bytes: u64,
        no_room: impl Fn(&E) -> bool,
        mut attempt: impl FnMut() -> Attempt,
    ) -> Result<T, E>
    where
        Attempt: std::future::Future<Output = Result<T, E>>,
        E: From<PoolError>,
    {
        let (mut fruitless, mut waits) = (0, 0);
        loop {
            match attempt().await {
                Err(error)
                    if no_room(&error)
                        && fruitless < NO_SPACE_WAITS_MAX
                        && waits < SPACE_WAITS_MAX =>
                {
                    match self.wait_for_freed_space(bytes).await? {
                        SpaceWait::Hopeless => return Err(error),
                        SpaceWait::HeldByOthers => fruitless += 1,
                        SpaceWait::Freed => {}
                    }
                    waits += 1;
                }
                result => return result,
            }
        }
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

pub(crate) fn hostname() -> String {
    // A simulated pool records a fixed host, so its labels replay bit for bit.
    if crate::rt::in_simulation() {
        return "simulator".to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}
