//! Transaction groups: how the open txg's changes become durable atomically.
//!
//! One task commits txgs, one at a time, when a client asks for durability (FLUSH,
//! FUA), when dirty metadata passes a threshold, or on a timer. A commit has two
//! steps:
//!
//! 1. **Build** (synchronous: nothing else runs meanwhile, so the image is the
//!    tree at one instant). Dirty nodes of every object are written out
//!    copy-on-write, bottom-up; each object's dnode goes into the dnode table;
//!    the allocator's changes are logged into space maps — which dirties them, so
//!    this repeats (blocks already written by this txg are rewritten in place)
//!    until nothing changes. The open txg number then moves on: later changes
//!    belong to the next txg.
//! 2. **Write**: the metadata blocks; flush every device (data written directly by
//!    clients earlier is covered by this flush too); labels 0 and 2 if the config
//!    changed, flush; the uberblock to every label's ring, flush; labels 1 and 3,
//!    flush. Only then is the txg durable and are waiters released.
//!
//! If the write step fails (devices gone), the pool is suspended: waiters get an
//! error, and the same txg is retried every second until it lands.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use crate::events::{EventClass, NewEvent};
use crate::format::dnode::DNODE_BYTES;
use crate::format::label::{Label, PoolConfig};
use crate::format::spacemap::{encode_records, Record};
use crate::format::{ObjectType, Uberblock};
use crate::object::sync::SyncContext;
use crate::object::ObjectError;
use crate::pool::dataset::directory::{SpaceLogRecord, DIRECTORY_OBJECT};
use crate::pool::dirty::{data_sync_bytes, update_dirty_percent, update_metadata_reserve};
use crate::pool::labels::{write_labels, write_uberblock};
use crate::pool::{Pool, PoolError};
use crate::queue::IoClass;
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Notify;
use crate::rt::{self, Instant, JoinHandle};

/// Passes of the build step before giving up: each pass only rewrites blocks in
/// place unless a space map grows by a block, so it settles in 3-5 passes; 64
/// means something loops, which is a bug.
const SYNC_PASSES_MAX: usize = 64;
/// Delay between attempts to write a txg that failed.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Figures about commits, for `status` and `iostat`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct TxgStats {
    pub commits: u64,
    pub failed_commits: u64,
    pub last_commit_us: u64,
    /// Microseconds every commit took, summed (with `commits`, the mean).
    pub commit_time_us: u64,
    pub last_commit_metadata_bytes: u64,
    pub last_commit_passes: u64,
}

/// The txg counters and the rendezvous between writers, flushers and the sync task.
pub struct TxgState {
    open: Cell<u64>,
    durable: Cell<u64>,
    requested: Cell<u64>,
    wake: Notify,
    /// Ends the wait before a failed txg is written again.
    retry_wake: Notify,
    done: Notify,
    health: RefCell<TxgHealth>,
    /// `stop` was called: the task ends once idle.
    stopping: Cell<bool>,
    /// `close` (an export began) or `stop` was called: no new change is
    /// accepted, while the sync task goes on committing what was.
    closing: Cell<bool>,
    task: RefCell<Option<JoinHandle<()>>>,
    last_commit: Cell<Instant>,
    stats: Cell<TxgStats>,
    /// Holders of `hold_builds`: while any, no txg is built (a full walk needs
    /// the trees and the allocator of one txg; see `Pool::check_space`).
    build_holds: Cell<u32>,
}

/// Whether txgs can be committed: one state machine for the sync task's
/// outcome (the lifecycle, `closing` then `stopping`, is separate: a
/// suspended pool can be closing and stopping too).
#[derive(Clone, Debug, Default)]
enum TxgHealth {
    /// The last commit landed (or none failed yet).
    #[default]
    Committing,
    /// Writing a txg failed (devices gone, host filesystem full): the same
    /// txg is written again every `RETRY_DELAY` until it lands. The reason.
    Suspended(String),
    /// Building a txg failed: the in-memory image is half rewritten and can
    /// never be committed; the last durable txg on disk stays intact. The
    /// reason.
    Failed(String),
}

/// Keeps the sync task from building a txg while it lives.
pub struct BuildHold<'a> {
    state: &'a TxgState,
}

impl Drop for BuildHold<'_> {
    fn drop(&mut self) {
        self.state.build_holds.set(self.state.build_holds.get() - 1);
        self.state.wake.notify_all();
    }
}

impl TxgState {
    pub fn new(open: u64, durable: u64) -> TxgState {
        TxgState {
            open: Cell::new(open),
            durable: Cell::new(durable),
            requested: Cell::new(0),
            wake: Notify::new(),
            retry_wake: Notify::new(),
            done: Notify::new(),
            health: RefCell::new(TxgHealth::Committing),
            stopping: Cell::new(false),
            closing: Cell::new(false),
            task: RefCell::new(None),
            last_commit: Cell::new(Instant(0)),
            stats: Cell::new(TxgStats::default()),
            build_holds: Cell::new(0),
        }
    }

    /// Holds off txg builds until the guard drops: the sync task waits, as do
    /// commits requested meanwhile.
    pub fn hold_builds(&self) -> BuildHold<'_> {
        self.build_holds.set(self.build_holds.get() + 1);
        BuildHold { state: self }
    }

    /// Whether something holds txg builds off now: it counts on the open
    /// txg's pending changes staying where they are until it lets go.
    pub fn builds_held(&self) -> bool {
        self.build_holds.get() > 0
    }

    /// Counts data linked in the open txg and starts a commit when it is time
    /// (see `data_sync_bytes`).
    pub fn add_data(&self, pool: &Pool, bytes: u64) {
        if pool.pressure.add_data_bytes(bytes) >= data_sync_bytes(pool) {
            self.request(self.open.get());
        }
        update_dirty_percent(pool);
    }

    /// The txg that changes made now belong to.
    pub fn open(&self) -> u64 {
        self.open.get()
    }

    /// The newest txg on stable storage.
    pub fn durable(&self) -> u64 {
        self.durable.get()
    }

    pub fn stats(&self) -> TxgStats {
        self.stats.get()
    }

    /// The reason the pool is suspended, if it is.
    pub fn suspended(&self) -> Option<String> {
        match &*self.health.borrow() {
            TxgHealth::Committing => None,
            TxgHealth::Suspended(reason) | TxgHealth::Failed(reason) => Some(reason.clone()),
        }
    }

    /// No txg can ever be committed again (see [`TxgHealth::Failed`]).
    fn failed(&self) -> bool {
        matches!(*self.health.borrow(), TxgHealth::Failed(_))
    }

    /// Refuses changes when the pool cannot commit them, or is being
    /// exported (`close`: the export commits only what came before).
    pub fn ensure_writable(&self) -> Result<(), PoolError> {
        if self.closing.get() {
            return Err(PoolError::Closing);
        }
        if self.failed() {
            return Err(PoolError::Suspended(self.suspended().unwrap_or_default()));
        }
        Ok(())
    }

    /// Refuses every change from now on (an export's first step): what was
    /// taken before is committed by the export, and a change taken after
    /// its final txg would be lost with the devices closing under it.
    pub fn close(&self) {
        self.closing.set(true);
    }

    /// Retries a txg whose write failed now, not at the end of its delay
    /// (`ironpool clear`).
    pub fn retry_now(&self) {
        self.retry_wake.notify_all();
        self.wake.notify_all();
    }

    /// Asks for `target` to be committed (without waiting).
    pub fn request(&self, target: u64) {
        if target > self.requested.get() {
            self.requested.set(target);
        }
        self.wake.notify_all();
    }

    /// Waits until txg `target` is durable.
    pub async fn wait_durable(&self, _pool: &Pool, target: u64) -> Result<(), PoolError> {
        let mut seen_failures = self.stats.get().failed_commits;
        loop {
            if self.durable.get() >= target {
                return Ok(());
            }
            if self.failed() || (self.stopping.get() && self.task.borrow().is_none()) {
                return Err(PoolError::Suspended(
                    self.suspended()
                        .unwrap_or_else(|| "the pool is closed".into()),
                ));
            }
            if self.stats.get().failed_commits > seen_failures {
                return Err(PoolError::Suspended(self.suspended().unwrap_or_default()));
            }
            seen_failures = self.stats.get().failed_commits;
            self.request(target);
            self.done.notified().await;
        }
    }

    /// The write throttle: holds a writer while dirty metadata is over the limit.
    pub async fn throttle(&self, pool: &Pool) {
        let limit = pool.tunables.borrow().dirty_max_bytes;
        while pool.dirty_metadata_bytes() > limit && !self.failed() && !self.stopping.get() {
            self.request(self.open.get());
            self.done.notified().await;
        }
        if pool.dirty_metadata_bytes() > pool.tunables.borrow().dirty_sync_bytes {
            self.request(self.open.get());
        }
    }

    /// True once the export stops the sync task (after its final commit;
    /// `close` came before it): background tasks end.
    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Stops the sync task after it finishes what it is doing, and commits
    /// what is left to commit.
    pub async fn stop(&self, _pool: &Pool) {
        self.close();
        self.stopping.set(true);
        self.wake.notify_all();
        let task = self.task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
        self.done.notify_all();
    }
}

/// Starts the task that commits txgs.
pub fn start_sync_task(pool: &Rc<Pool>) {
    pool.txg.last_commit.set(rt::now());
    let task_pool = pool.clone();
    let handle = rt::spawn(async move { sync_loop(task_pool).await });
    *pool.txg.task.borrow_mut() = Some(handle);
}

/// A built txg, ready to write (kept for retries when writing fails).
struct BuiltTxg {
    txg: u64,
    context: SyncContext,
    uberblock: Uberblock,
    config: Option<PoolConfig>,
    passes: usize,
}

async fn sync_loop(pool: Rc<Pool>) {
    let state = &pool.txg;
    let mut retry: Option<BuiltTxg> = None;
    // Empty commits in a row made only to release deferred frees: each commit
    // frees a little of its own metadata, so this must stop by count.
    let mut idle_commits = 0u64;
    // The timeout's timer, armed once per commit (its deadline moves only
    // when a commit ends), not at every wake-up.
    let mut timer = rt::Timer::new();
    loop {
        let timeout = pool.tunables.borrow().txg_timeout;
        let since = rt::now().duration_since(state.last_commit.get());
        let requested = state.requested.get() >= state.open.get();
        let dirty = pool.dirty_metadata_bytes() >= pool.tunables.borrow().dirty_sync_bytes
            || pool.pressure.data_bytes_open() >= data_sync_bytes(&pool);
        if state.stopping.get() && retry.is_none() && !pool.has_changes() {
            break;
        }
        if retry.is_none() && state.build_holds.get() > 0 && !state.stopping.get() {
            state.wake.notified().await;
            continue;
        }
        if retry.is_none() && !requested && !dirty && since < timeout && !state.stopping.get() {
            let deadline = state.last_commit.get().saturating_add(timeout);
            timer.timeout_at(deadline, state.wake.notified()).await;
            continue;
        }
        // An idle pool still commits (empty txgs) while frees wait in the defer
        // slots, so freed space becomes usable without new writes.
        let changes = pool.has_changes();
        if changes || requested {
            idle_commits = 0;
        }
        let deferred = pool.store.allocator.borrow().deferred_bytes() > 0
            && idle_commits <= crate::alloc::DEFER_TXGS;
        if retry.is_none() && !requested && !changes && !deferred {
            state.last_commit.set(rt::now());
            continue;
        }
        if !changes && !requested {
            idle_commits += 1;
        }
        let started = rt::now();
        let built = match retry.take() {
            Some(built) => built,
            None => match build(&pool) {
                Ok(built) => built,
                Err(error) => {
                    // The in-memory image is half rewritten: it can never be
                    // committed. The last committed txg on disk stays intact.
                    *state.health.borrow_mut() =
                        TxgHealth::Failed(format!("txg build failed: {error}"));
                    bump(state, |stats| stats.failed_commits += 1);
                    state.done.notify_all();
                    break;
                }
            },
        };
        match write(&pool, &built).await {
            Ok(()) => {
                finish(&pool, &built, started).await;
            }
            Err(error) => {
                if state.suspended().is_none() {
                    eprintln!("ironpool: {}: suspended: writing txg {} failed: {error}; retrying every {RETRY_DELAY:?}", pool.name, built.txg);
                    pool.events.post(
                        EventClass::PoolSuspended,
                        NewEvent::detail(format!("writing txg {} failed: {error}", built.txg)),
                    );
                }
                *state.health.borrow_mut() =
                    TxgHealth::Suspended(format!("txg {}: {error}", built.txg));
                bump(state, |stats| stats.failed_commits += 1);
                state.done.notify_all();
                retry = Some(built);
                if state.stopping.get() && pool.store.vdevs().iter().all(|top| !top.is_available())
                {
                    break;
                }
                rt::timeout(RETRY_DELAY, state.retry_wake.notified()).await;
            }
        }
    }
    *state.task.borrow_mut() = None;
    state.done.notify_all();
}

fn bump(state: &TxgState, update: impl FnOnce(&mut TxgStats)) {
    let mut stats = state.stats.get();
    update(&mut stats);
    state.stats.set(stats);
}

/// Txgs recorded in one space log object before the next one starts: old
/// objects are freed whole once every metaslab is checkpointed past them.
const LOG_TXGS_PER_OBJECT: u64 = 8;
/// Every metaslab with changes only in the log is checkpointed within about this
/// many txgs: bounds the log (and the import time spent replaying it).
const CHECKPOINT_SPREAD_TXGS: u64 = 32;
/// Bytes per metaslab array entry: the space map object and its checkpoint txg.
pub const METASLAB_ENTRY_BYTES: u64 = 16;

/// Sets the MAC of an encrypted dataset's root object (its head, or a
/// snapshot's copy) over its dnode as this txg writes it
/// (docs/FORMAT.md, "Object-set MAC"). Without the key loaded the MAC
/// stays: every change to what it covers is made with the key (a keyless
/// writer, such as device removal, changes only what the digests leave
/// out). A keyless build that changed what it covers all the same says
/// so, once: the next `load-key` will refuse the dataset.
fn renew_mac(pool: &Pool, object: &crate::object::Object) -> Result<(), PoolError> {
    let digest = crate::format::portable::dnode_digest(&object.dnode())
        .map_err(|error| PoolError::Corrupt(format!("object {}: {error}", object.id)))?;
    let guid = pool.datasets.directory.read().key_guid_of_object(object.id);
    let Some(key) = guid.and_then(|guid| pool.datasets.keys.keys.get(guid)) else {
        if object.mac_digest.get().is_some_and(|known| known != digest) {
            eprintln!(
                "ironpool: object {} was changed without its key: its MAC no longer holds, and load-key will refuse it",
                object.id
            );
            object.mac_digest.set(None);
        }
        return Ok(());
    };
    let mac = key
        .objset_mac(&digest)
        .map_err(|error| PoolError::Io(format!("object {}: {error}", object.id)))?;
    object.dnode.borrow_mut().mac = mac;
    object.mac_digest.set(Some(digest));
    Ok(())
}

/// Step 1: rewrites every dirty object into `SyncContext` and closes the txg.
fn build(pool: &Pool) -> Result<BuiltTxg, PoolError> {
    let txg = pool.txg.open.get();
    // One txg is built at a time, once the one before it is durable: the
    // defer slots, the space log and the intent log's frees count on it.
    assert_eq!(
        pool.txg.durable.get() + 1,
        txg,
        "txg {txg} built before the txg before it is durable"
    );
    let objects = &pool.objects;
    let mut context = SyncContext::new(txg);
    checkpoint_metaslabs(pool, txg)?;
    rotate_space_log(pool, txg)?;
    crate::pool::datasets::intent_log::build_step(pool, txg);
    let table = objects.dnode_table();
    let mut passes = 0;
    loop {
        passes += 1;
        assert!(
            passes <= SYNC_PASSES_MAX,
            "txg {txg} did not settle after {SYNC_PASSES_MAX} passes"
        );
        let mut changed = false;
        if crate::pool::history::build_step(pool, txg)? {
            changed = true;
        }
        // After the snapshots' step of the pass before, which may free
        // cloned blocks (the loop runs until nothing changes).
        if crate::pool::clones::build_step(pool, txg)? {
            changed = true;
        }
        // Before the directory: the first entry names its object there.
        if crate::pool::removal::build_step(pool, txg)? {
            changed = true;
        }
        if pool.datasets.directory.take_dirty() {
            write_directory(pool)?;
            changed = true;
        }
        // Filesystems' objects first: their dnodes go into their tables,
        // which are pool objects synced next.
        if crate::pool::filesystem::build_step(pool, &mut context)? {
            changed = true;
        }
        for object in objects.open_objects() {
            if object.id == 0 || !object.dirty.get() {
                continue;
            }
            objects.sync_object(&object, &mut context)?;
            if object.dnode().is_authenticated() {
                renew_mac(pool, &object)?;
            }
            object.dirty.set(false);
            let mut bytes = [0u8; DNODE_BYTES];
            object.dnode().encode(&mut bytes);
            objects.write_bytes_cached(&table, object.id * DNODE_BYTES as u64, &bytes)?;
            changed = true;
        }
        if crate::pool::datasets::snapshot::build_step(pool, txg)? {
            changed = true;
        }
        let records = pool.store.allocator.borrow_mut().take_pending(txg);
        if !records.is_empty() {
            append_space_log(pool, records, txg)?;
            changed = true;
        }
        if table.dirty.get() || table.has_dirty_nodes() {
            objects.sync_object(&table, &mut context)?;
            table.dirty.set(false);
            changed = true;
        }
        if !changed {
            break;
        }
    }
    // The txg holds every change made to it: nothing it would leave out.
    assert!(
        !pool.datasets.directory.is_dirty()
            && !pool.store.clones.borrow().has_pending()
            && crate::pool::filesystem::all_synced(pool)
            && objects
                .open_objects()
                .iter()
                .all(|object| !object.dirty.get()),
        "txg {txg} built with changes left out"
    );
    // Devices that went away or came back since the last commit: their dirty
    // time logs and states go into this txg's config.
    crate::pool::devices::maintain(pool, txg);
    let config = if pool.config_dirty.replace(false) {
        let mut config = pool.config.borrow_mut();
        config.config_txg = txg;
        Some(config.clone())
    } else {
        None
    };
    let config_now = pool.config.borrow();
    let uberblock = Uberblock {
        txg,
        pool_guid: pool.guid,
        guid_sum: config_now.guid_sum(),
        timestamp_ns: crate::rt::wall_clock_ns(),
        config_txg: config_now.config_txg,
        dnode_table: table.dnode(),
    };
    pool.txg.open.set(txg + 1);
    pool.store.set_open_txg(txg + 1);
    pool.pressure.txg_closed();
    objects.reset_dirty_bytes();
    update_dirty_percent(pool);
    update_metadata_reserve(pool);
    Ok(BuiltTxg {
        txg,
        context,
        uberblock,
        config,
        passes,
    })
}

fn write_directory(pool: &Pool) -> Result<(), ObjectError> {
    let bytes = pool.datasets.directory.read().encode();
    let directory = pool
        .objects
        .get(DIRECTORY_OBJECT)
        .ok_or(ObjectError::NoSuchObject(DIRECTORY_OBJECT))?;
    pool.objects.write_bytes_cached(&directory, 0, &bytes)?;
    if directory.length_bytes() > bytes.len() as u64 {
        pool.objects
            .truncate_cached(&directory, bytes.len() as u64)?;
    }
    Ok(())
}

/// Checkpoints the metaslabs whose changes have waited longest in the space
/// log: each gets its space map rewritten as its state at the end of the
/// previous txg. Runs before this txg's changes are taken, so the log's records
/// of this txg apply on top of the checkpoint.
fn checkpoint_metaslabs(pool: &Pool, txg: u64) -> Result<(), ObjectError> {
    let previous = txg - 1;
    let chosen: Vec<(usize, usize)> = {
        let allocator = pool.store.allocator.borrow();
        let mut waiting: Vec<(u64, usize, usize)> = allocator
            .vdevs
            .iter()
            .enumerate()
            .flat_map(|(vdev, space)| {
                space
                    .metaslabs
                    .iter()
                    .enumerate()
                    .filter(|(_, metaslab)| metaslab.unflushed_txg > 0)
                    .map(move |(index, metaslab)| (metaslab.unflushed_txg, vdev, index))
            })
            .collect();
        waiting.sort_unstable();
        let count = (waiting.len() as u64)
            .div_ceil(CHECKPOINT_SPREAD_TXGS)
            .max(1) as usize;
        waiting
            .into_iter()
            .take(count)
            .map(|(_, vdev, index)| (vdev, index))
            .collect()
    };
    for (vdev, index) in chosen {
        let (records, map_id, array_id) = {
            let allocator = pool.store.allocator.borrow();
            let metaslab = &allocator.vdevs[vdev].metaslabs[index];
            (
                metaslab.checkpoint_records(previous),
                metaslab.space_map_object,
                allocator.vdevs[vdev].array_object,
            )
        };
        let map = if map_id == 0 {
            let (id, map) = pool.create_metadata_object(ObjectType::SpaceMap, txg);
            pool.store.allocator.borrow_mut().vdevs[vdev].metaslabs[index].space_map_object = id;
            map
        } else {
            pool.objects
                .get(map_id)
                .ok_or(ObjectError::NoSuchObject(map_id))?
        };
        pool.objects.truncate_cached(&map, 0)?;
        pool.objects
            .write_bytes_cached(&map, 0, &encode_records(&records))?;
        let array = pool
            .objects
            .get(array_id)
            .ok_or(ObjectError::NoSuchObject(array_id))?;
        let mut entry = [0u8; METASLAB_ENTRY_BYTES as usize];
        entry[..8].copy_from_slice(&map.id.to_le_bytes());
        entry[8..].copy_from_slice(&previous.to_le_bytes());
        pool.objects
            .write_bytes_cached(&array, index as u64 * METASLAB_ENTRY_BYTES, &entry)?;
        let mut allocator = pool.store.allocator.borrow_mut();
        let metaslab = &mut allocator.vdevs[vdev].metaslabs[index];
        metaslab.flushed_txg = previous;
        metaslab.unflushed_txg = 0;
    }
    Ok(())
}

/// Starts a new space log object every `LOG_TXGS_PER_OBJECT` txgs and frees
/// the objects every metaslab has been checkpointed past.
fn rotate_space_log(pool: &Pool, txg: u64) -> Result<(), ObjectError> {
    let needs_new = pool
        .datasets
        .directory
        .read()
        .space_logs
        .last()
        .is_none_or(|current| current.first_txg + LOG_TXGS_PER_OBJECT <= txg);
    if needs_new {
        let (id, _) = pool.create_metadata_object(ObjectType::SpaceMap, txg);
        pool.datasets
            .directory
            .edit()
            .space_logs
            .push(SpaceLogRecord {
                object: id,
                first_txg: txg,
            });
    }
    // The oldest txg whose changes exist only in the log.
    let oldest_needed = {
        let allocator = pool.store.allocator.borrow();
        allocator
            .vdevs
            .iter()
            .flat_map(|space| space.metaslabs.iter())
            .filter(|metaslab| metaslab.unflushed_txg > 0)
            .map(|metaslab| metaslab.unflushed_txg)
            .min()
            .unwrap_or(txg)
    };
    loop {
        let obsolete = {
            let directory = pool.datasets.directory.read();
            let logs = &directory.space_logs;
            // A log object ends where the next one begins.
            (logs.len() >= 2 && logs[1].first_txg <= oldest_needed).then(|| logs[0].object)
        };
        let Some(object_id) = obsolete else { break };
        let object = pool
            .objects
            .get(object_id)
            .ok_or(ObjectError::NoSuchObject(object_id))?;
        pool.objects.truncate_cached(&object, 0)?;
        pool.objects.free_object_cached(&object)?;
        pool.datasets.directory.edit().space_logs.remove(0);
    }
    Ok(())
}

/// Appends this txg's allocations and frees of every metaslab to the space log.
fn append_space_log(
    pool: &Pool,
    records: Vec<(u32, u32, Vec<Record>)>,
    txg: u64,
) -> Result<(), ObjectError> {
    let log_id = pool
        .datasets
        .directory
        .read()
        .space_logs
        .last()
        .map(|log| log.object)
        .ok_or(ObjectError::NoSuchObject(0))?;
    let log = pool
        .objects
        .get(log_id)
        .ok_or(ObjectError::NoSuchObject(log_id))?;
    let mut all = Vec::with_capacity(
        records
            .iter()
            .map(|(_, _, batch)| batch.len())
            .sum::<usize>()
            + 4,
    );
    all.push(Record::Txg(txg));
    let mut current_vdev = None;
    for (vdev, _, batch) in records {
        if current_vdev != Some(vdev) {
            all.push(Record::Vdev(vdev));
            current_vdev = Some(vdev);
        }
        all.extend(batch);
    }
    let end = log.length_bytes();
    pool.objects
        .write_bytes_cached(&log, end, &encode_records(&all))
}

/// Step 2: writes a built txg in the order that makes it atomic.
async fn write(pool: &Rc<Pool>, built: &BuiltTxg) -> Result<(), PoolError> {
    let store = &pool.store;
    let mut writes = Vec::with_capacity(built.context.writes.len());
    for (dva, buffer) in built.context.writes.values() {
        let length = store.vdevs()[dva.vdev as usize].io_bytes(buffer.len() as u64) as usize;
        let data = if buffer.len() == length {
            BufSlice::whole(buffer.clone())
        } else {
            let mut padded = AlignedBuf::zeroed(length);
            padded[..buffer.len()].copy_from_slice(buffer);
            BufSlice::whole(padded.into_shared())
        };
        writes.push(store.write_linked(*dva, data, IoClass::AsyncWrite, built.txg));
    }
    for result in futures_util::future::join_all(writes).await {
        result.map_err(|error| PoolError::Io(format!("metadata write: {error}")))?;
    }
    store.flush_all().await?;
    let leaves: Vec<_> = store
        .vdevs()
        .iter()
        .flat_map(|top| {
            top.children
                .iter()
                .map(move |leaf| (top.clone(), leaf.clone()))
        })
        .collect();
    if let Some(config) = &built.config {
        write_config_labels(&leaves, config, &[0, 2]).await?;
        store.flush_all().await?;
    }
    let mut uberblock_writes = Vec::new();
    for (top, leaf) in &leaves {
        if !leaf.is_online() {
            continue;
        }
        let size = device_size_of(pool, leaf.guid());
        uberblock_writes.push(write_uberblock(leaf, &built.uberblock, size, top.ashift));
    }
    let results = futures_util::future::join_all(uberblock_writes).await;
    if !results.iter().any(|result| result.is_ok()) {
        let reasons: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        return Err(PoolError::Io(format!(
            "no uberblock could be written: {}",
            reasons.join("; ")
        )));
    }
    store.flush_all().await?;
    if let Some(config) = &built.config {
        write_config_labels(&leaves, config, &[1, 3]).await?;
        store.flush_all().await?;
        pool.write_spare_labels(config).await;
    }
    Ok(())
}

fn device_size_of(pool: &Pool, leaf_guid: u64) -> u64 {
    let config = pool.config.borrow();
    config
        .find_leaf(leaf_guid)
        .map(|(top, index)| top.children[index].device_size_bytes)
        .unwrap_or(0)
}

async fn write_config_labels(
    leaves: &[(Rc<crate::vdev::TopVdev>, Rc<crate::vdev::LeafVdev>)],
    config: &PoolConfig,
    indexes: &[usize],
) -> Result<(), PoolError> {
    let mut any_ok = false;
    let mut reasons = Vec::new();
    for (_, leaf) in leaves {
        if !leaf.is_online() {
            continue;
        }
        let Some((top, index)) = config.find_leaf(leaf.guid()) else {
            continue;
        };
        let label = Label::of(config, leaf.guid());
        match write_labels(leaf, &label, top.children[index].device_size_bytes, indexes).await {
            Ok(()) => any_ok = true,
            Err(reason) => reasons.push(reason),
        }
    }
    if any_ok {
        Ok(())
    } else {
        Err(PoolError::Io(format!(
            "no label could be written: {}",
            reasons.join("; ")
        )))
    }
}

/// After a txg is durable: deferred frees move on, waiters are released.
async fn finish(pool: &Rc<Pool>, built: &BuiltTxg, started: Instant) {
    let store = &pool.store;
    // No space freed two txgs ago may be reused while a repair or an older read
    // could still be using it.
    store.repairs_quiesced().await;
    if built.txg > crate::alloc::DEFER_TXGS {
        store
            .reads_quiesced(built.txg - crate::alloc::DEFER_TXGS)
            .await;
    }
    // Txgs become durable one after another, none skipped: the uberblock
    // ring and the defer slots depend on it.
    assert_eq!(
        pool.txg.durable.get() + 1,
        built.txg,
        "txg {} durable out of order",
        built.txg
    );
    store
        .allocator
        .borrow_mut()
        .sync_done(built.txg, pool.autotrim());
    pool.start_autotrim();
    pool.start_spare_activation();
    pool.refresh_reservations();
    pool.objects.set_durable_txg(built.txg);
    crate::pool::filesystem::txg_durable(pool, built.txg);
    crate::pool::dataset::intent_log::txg_durable(pool, built.txg);
    let state = &pool.txg;
    state.durable.set(built.txg);
    state.last_commit.set(rt::now());
    let was_suspended = matches!(*state.health.borrow(), TxgHealth::Suspended(_));
    if was_suspended {
        *state.health.borrow_mut() = TxgHealth::Committing;
        eprintln!(
            "ironpool: {}: resumed: txg {} is durable",
            pool.name, built.txg
        );
        pool.events.post(
            EventClass::PoolResumed,
            NewEvent::detail(format!("txg {} is durable", built.txg)),
        );
    }
    let elapsed = rt::now().duration_since(started);
    bump(state, |stats| {
        stats.commits += 1;
        stats.last_commit_us = elapsed.as_micros() as u64;
        stats.commit_time_us += elapsed.as_micros() as u64;
        stats.last_commit_metadata_bytes = built.context.bytes();
        stats.last_commit_passes = built.passes as u64;
    });
    state.done.notify_all();
    pool.resilver_if_needed();
}
