//! The run: sessions of the engine on the simulated devices, each from create
//! or import to a crash, a clean export or the end, and the steps inside them.
//!
//! A step is one operation drawn from the run's generator, followed by its
//! checks: the blocks it touched are read back against the model, and so is a
//! random range of a random dataset. Every `check_every` steps a full check walks
//! the pool's space and reads every dataset.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ironpool::dev::sim::{SimDevice, SimFaults, SimLatency};
use ironpool::dev::Device;
use ironpool::pool::dataset::send::SendRequest;
use ironpool::pool::dataset::stream_io::MemoryStream;
use ironpool::pool::datasets::receive::ReceiveOptions;
use ironpool::pool::volume::{ReadPiece, Volume};
use ironpool::pool::{NewDevice, NewTopVdev, Pool, PoolError, PoolTunables};
use ironpool::rt::buf::{AlignedBuf, BufSlice};
use ironpool::rt::sim::Rng;
use ironpool::rt::{self, Runtime};

use crate::faults::{BadState, Budget, FaultKind};
use crate::model::{decode_sector, fill_sector, DatasetModel, Model, Value, MODEL_SECTOR_BYTES};
use crate::{Failure, Options, Summary};

/// Pool name used by every run.
pub const POOL: &str = "sim";
/// Size of every simulated device: a few metaslabs each (16 MiB), small enough
/// that a full check and a scrub stay cheap, large enough that the workload's
/// volumes and their snapshots rarely fill the pool.
const DEVICE_BYTES: u64 = 160 << 20;
/// Volumes (clones included) the workload keeps at most: bounds the work of a
/// full check.
const VOLUMES_MAX: usize = 4;
/// Snapshots per volume at most, for the same reason.
const SNAPSHOTS_PER_VOLUME_MAX: usize = 4;
/// Largest single write or zero (bytes): several blocks, up to a few dozen.
const IO_BYTES_MAX: u64 = 256 << 10;
/// Concurrent writes in a burst (and in the writes a crash interrupts).
const BURST_WRITES_MAX: u64 = 24;
/// Sectors rotted on every device by a sabotage step (testing the checkers):
/// enough to hit data and metadata on each device.
const SABOTAGE_SECTORS: usize = 4000;
/// The raw key of the run's encrypted volumes (a user's key the simulator
/// holds, as `load-key` would be given it after each import).
const SIM_KEY: [u8; 32] = *b"ironpool-sim raw key, 32 bytes!!";
/// Blocks read by a step's random sample check.
const SAMPLE_BLOCKS_MAX: u64 = 16;

/// How a session ended.
enum SessionEnd {
    Done,
    Crash,
    Reimport,
}

/// Result of a step or check: a description of what broke.
type Check = Result<(), String>;

pub struct Sim {
    options: Options,
    /// Workload choices.
    rng: Rng,
    devices: Vec<Rc<SimDevice>>,
    /// Devices taken out by a replacement: their fault counters still count.
    retired: Vec<Rc<SimDevice>>,
    /// Replacements so far (seeds the new devices' names).
    replacements: u64,
    budget: Budget,
    model: Rc<RefCell<Model>>,
    summary: Summary,
    step: Rc<Cell<u64>>,
    tunables: PoolTunables,
    /// True while some device has been bad since the last heal that left none:
    /// until then a scrub may find bad copies; afterwards it must find none.
    damage_possible: bool,
    /// The first read of each block after a crash is checked against what may
    /// have survived, not against what was current.
    after_crash: bool,
}

/// Simulated time one step may take before it counts as a hang: far above
/// anything a step does legitimately (an idle pause is at most three txg
/// timeouts, a latency spike at most 0.1 s per I/O), cheap to reach since
/// the clock jumps from timer to timer.
const STEP_SIMULATED_TIME_MAX: Duration = Duration::from_secs(3600);

/// Queued and active I/Os per device and class, for a hang report.
fn queue_states(pool: &Rc<Pool>) -> String {
    let mut states = Vec::new();
    for top in pool.store().vdevs().iter() {
        for leaf in &top.children {
            let stats = leaf.queue.stats();
            let classes: Vec<String> = stats
                .classes
                .iter()
                .enumerate()
                .filter(|(_, class)| class.queued + class.active > 0)
                .map(|(index, class)| {
                    format!(
                        "class {index}: {} queued, {} active",
                        class.queued, class.active
                    )
                })
                .collect();
            states.push(format!(
                "{} ({}): {}",
                leaf.path.borrow(),
                if leaf.is_online() { "online" } else { "away" },
                if classes.is_empty() {
                    "idle".to_string()
                } else {
                    classes.join(", ")
                }
            ));
        }
    }
    states.join("; ")
}

fn io_error(what: &str, error: PoolError) -> String {
    format!("{what}: {error}")
}

impl Sim {
    pub fn new(options: Options, step: Rc<Cell<u64>>) -> Sim {
        let mut rng = Rng::new(options.seed);
        let layout = options.layout;
        let devices: Vec<Rc<SimDevice>> = layout
            .device_groups()
            .iter()
            .enumerate()
            .map(|(index, _)| SimDevice::new(&format!("d{index}"), DEVICE_BYTES, rng.next_u64()))
            .collect();
        for device in &devices {
            device.set_latency(latency_for(&options, &mut rng));
        }
        let tolerated = layout
            .groups()
            .iter()
            .map(|group| group.tolerated_bad)
            .collect();
        let budget = Budget::new(layout.device_groups(), tolerated);
        // Commit timing spans the interesting range: commits after nearly every
        // step, to many steps per txg (crashes then lose more).
        let timing = rng.below(5) as usize;
        let txg_timeout_ms = [10u64, 50, 200, 1000, 5000][timing];
        // Write-back: off (every write written through) with the shortest
        // timeout, a 1 MiB limit (writers held back all the time) or the
        // default. Tied to the timing draw so the seeds' other draws stay put.
        let dirty_data_max_bytes = [
            0u64,
            1 << 20,
            PoolTunables::default().dirty_data_max_bytes,
            1 << 20,
            PoolTunables::default().dirty_data_max_bytes,
        ][timing];
        let cache_draw = rng.below(3) as usize;
        let tunables = PoolTunables {
            txg_timeout: Duration::from_millis(txg_timeout_ms),
            dirty_data_max_bytes,
            cache_budget_bytes: [1usize << 20, 8 << 20, 64 << 20][cache_draw],
            // The read cache from tiny (evicting all the time) to roomy, on
            // the metadata cache's draw so the seeds' other draws stay put.
            arc_max_bytes: [256u64 << 10, 4 << 20, 64 << 20][cache_draw],
            // Log commits in flight: one at a time (the default), two, and
            // the most, on the same draw.
            log_commits_in_flight: [1, 2, 8][cache_draw],
            ..PoolTunables::default()
        };
        Sim {
            options,
            rng,
            devices,
            retired: Vec::new(),
            replacements: 0,
            budget,
            model: Rc::new(RefCell::new(Model::default())),
            summary: Summary::default(),
            step,
            tunables,
            damage_possible: false,
            after_crash: false,
        }
    }

    fn count_operation(&mut self, name: &'static str) {
        *self.summary.operations.entry(name).or_insert(0) += 1;
    }

    fn count_check(&mut self, name: &'static str) {
        *self.summary.checks.entry(name).or_insert(0) += 1;
    }

    fn count_fault(&mut self, name: &'static str) {
        *self.summary.faults.entry(name).or_insert(0) += 1;
    }

    fn trace(&self, text: impl FnOnce() -> String) {
        if self.options.trace {
            eprintln!("[step {}] {}", self.step.get(), text());
        }
    }

    fn fail(&self, message: String) -> Failure {
        Failure {
            options: self.options.clone(),
            step: self.step.get(),
            message,
        }
    }

    /// Runs every session to the end.
    pub fn run(mut self) -> Result<Summary, Failure> {
        let mut session = 0u64;
        let mut end = SessionEnd::Reimport;
        loop {
            let runtime =
                Runtime::new_sim(self.options.seed.wrapping_mul(0x100).wrapping_add(session));
            let first = session == 0;
            let crashed = matches!(end, SessionEnd::Crash);
            let result = runtime.block_on(self.session(first, crashed));
            self.summary.simulated_ns += runtime.now().0;
            self.summary.sessions += 1;
            session += 1;
            // Whatever the engine had in memory is gone; only the devices remain.
            runtime.drop_all_tasks();
            drop(runtime);
            end = result.map_err(|message| self.fail(message))?;
            match end {
                SessionEnd::Done => break,
                SessionEnd::Crash => {
                    let mut crash_rng = Rng::new(self.rng.next_u64());
                    for device in &self.devices {
                        device.crash(&mut crash_rng);
                    }
                    self.after_crash = true;
                }
                SessionEnd::Reimport => {}
            }
        }
        self.collect_device_faults();
        let mut digest = 0u64;
        for device in &self.devices {
            digest = digest.rotate_left(7) ^ device.digest();
        }
        self.summary.digest = digest;
        self.summary.steps = self.step.get();
        Ok(self.summary)
    }

    fn collect_device_faults(&mut self) {
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        for device in self.devices.iter().chain(&self.retired) {
            let counters = device.counters();
            for (name, value) in [
                ("read-error", counters.read_errors),
                ("read-corrupt", counters.read_corruptions),
                ("write-error", counters.write_errors),
                ("write-corrupt", counters.write_corruptions),
                ("misdirect", counters.misdirected_writes),
                ("nospace", counters.nospace_errors),
                ("rot (sectors)", counters.rotted_sectors),
                ("vanished-io", counters.offline_errors),
                ("latency-spike", counters.latency_spikes),
                ("reordered", counters.reordered_completions),
            ] {
                *totals.entry(name).or_insert(0) += value;
            }
        }
        for (name, value) in totals {
            if value > 0 {
                *self.summary.faults.entry(name).or_insert(0) += value;
            }
        }
        // Not a fault: the discards the devices took (autotrim and trims),
        // which every crash and check runs against.
        let trims: u64 = self
            .devices
            .iter()
            .chain(&self.retired)
            .map(|device| device.counters().trims)
            .sum();
        if trims > 0 {
            *self
                .summary
                .operations
                .entry("device-discards")
                .or_insert(0) += trims;
        }
    }

    /// The devices an import sees: all but the vanished ones.
    fn present_devices(&self) -> Vec<(String, Rc<dyn Device>)> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(index, _)| self.budget.bad[*index] != Some(BadState::Vanished))
            .map(|(index, device)| (format!("sim:d{index}"), device.clone() as Rc<dyn Device>))
            .collect()
    }

    async fn session(&mut self, first: bool, crashed: bool) -> Result<SessionEnd, String> {
        let pool = if first {
            self.create().await?
        } else {
            if crashed || std::env::var_os("SIM_REWIND_ALWAYS").is_some() {
                crate::checks::older_uberblocks(self).await?;
                self.count_check("uberblock-rewind");
            }
            let pool =
                Pool::import_from_devices(POOL, self.present_devices(), self.tunables.clone())
                    .await
                    .map_err(|error| io_error("import", error))?;
            self.count_check("import");
            load_keys(&pool).await?;
            self.trace(|| {
                format!(
                    "imported at txg {}: {:?}",
                    pool.imported_txg(),
                    pool.notes()
                )
            });
            // A crash in a commit can leave a device whose labels missed the
            // last txg: the import marks it behind (its missed txgs in its
            // dirty time log) and resilvers it. Until that is healed, a scrub
            // (one resumed at import runs beside the resilver) finds its
            // stale copies and repairs them, as it must.
            let behind = pool
                .store()
                .vdevs()
                .iter()
                .flat_map(|top| top.children.iter())
                .any(|leaf| !leaf.dtl.borrow().is_empty());
            if behind {
                self.damage_possible = true;
            }
            self.full_check(&pool).await?;
            pool
        };
        loop {
            if self.step.get() >= self.options.ticks {
                self.heal(&pool).await?;
                self.full_check(&pool).await?;
                pool.export()
                    .await
                    .map_err(|error| io_error("export", error))?;
                return Ok(SessionEnd::Done);
            }
            self.step.set(self.step.get() + 1);
            let Some(end) = rt::timeout(STEP_SIMULATED_TIME_MAX, self.step_once(&pool)).await
            else {
                return Err(format!("the step did not finish within {STEP_SIMULATED_TIME_MAX:?} of simulated time (a hang); queues: {}", queue_states(&pool)));
            };
            let end = end?;
            if let Some(end) = end {
                return Ok(end);
            }
            self.sample_check(&pool).await?;
            if self.step.get() % self.options.check_every == 0 {
                self.full_check(&pool).await?;
            }
        }
    }

    async fn create(&mut self) -> Result<Rc<Pool>, String> {
        let mut tops = Vec::new();
        let mut index = 0;
        for group in self.options.layout.groups() {
            let mut devices = Vec::new();
            for _ in 0..group.devices {
                devices.push(NewDevice {
                    path: format!("sim:d{index}"),
                    device: self.devices[index].clone() as Rc<dyn Device>,
                });
                index += 1;
            }
            tops.push(NewTopVdev {
                log: group.log,
                kind: group.kind,
                devices,
            });
        }
        let pool = Pool::create_on_devices(POOL, tops, false, self.tunables.clone())
            .await
            .map_err(|error| io_error("create", error))?;
        // Autotrim in most runs: its discards race everything after.
        if self.rng.chance(3, 4) {
            let on = std::collections::BTreeMap::from([("autotrim".to_string(), "on".to_string())]);
            pool.set_properties(POOL, &on)
                .await
                .map_err(|error| io_error("set autotrim", error))?;
        }
        self.create_volume(&pool).await?;
        Ok(pool)
    }

    /// One operation. Returns how the session ends if the operation ends it.
    async fn step_once(&mut self, pool: &Rc<Pool>) -> Result<Option<SessionEnd>, String> {
        if self.options.sabotage_step == Some(self.step.get()) {
            for device in &self.devices {
                device.flush_now();
                device.rot(SABOTAGE_SECTORS, &mut self.rng);
            }
        }
        let faults = self.options.faults;
        // Weights: the data path dominates, administration and faults season it.
        let mut table: Vec<(u64, &'static str)> = vec![
            (30, "write"),
            (4, "write-fua"),
            (6, "zero"),
            (8, "read"),
            (8, "flush"),
            (5, "burst"),
            (4, "idle"),
            (4, "snapshot"),
            (2, "rollback"),
            (2, "clone"),
            (3, "destroy-snapshot"),
            (1, "destroy-volume"),
            (1, "create-volume"),
            (2, "scrub"),
            (1, "trim"),
            (1, "race-destroy"),
            (1, "race-scrub"),
            (1, "race-receive"),
            (1, "export-import"),
        ];
        if faults.any_damage() {
            table.extend([(4, "turn-bad"), (3, "heal")]);
        }
        if faults.has(FaultKind::Rot) {
            table.push((2, "rot"));
        }
        if faults.has(FaultKind::Vanish) {
            table.extend([(1, "vanish"), (2, "return")]);
        }
        if faults.any_damage()
            && self
                .options
                .layout
                .groups()
                .iter()
                .any(|group| group.tolerated_bad > 0)
        {
            table.push((1, "replace"));
        }
        if faults.has(FaultKind::Crash) {
            table.push((3, "crash"));
        }
        let total: u64 = table.iter().map(|(weight, _)| weight).sum();
        let mut draw = self.rng.below(total);
        let mut chosen = table[0].1;
        for (weight, name) in &table {
            if draw < *weight {
                chosen = name;
                break;
            }
            draw -= weight;
        }
        self.trace(|| format!("{chosen} (bad set {:?})", self.budget.bad));
        self.count_operation(chosen);
        match chosen {
            "write" => self.write(pool, false, false).await?,
            "write-fua" => self.write(pool, true, false).await?,
            "zero" => {
                let fua = self.rng.chance(1, 8);
                self.write(pool, fua, true).await?
            }
            "read" => self.read_random(pool).await?,
            "flush" => {
                // A client's FLUSH of one volume (through its intent log),
                // or the pool-wide one (through a txg).
                let volumes = self.model.borrow().volumes();
                let one = if self.rng.chance(1, 2) {
                    self.pick(&volumes)
                } else {
                    None
                };
                match one {
                    Some(name) => {
                        let volume = self.handle(pool, &name).await?;
                        self.trace(|| format!("flush {name}"));
                        pool.flush_volume(&volume)
                            .await
                            .map_err(|error| io_error("flush", error))?;
                        if let Some(dataset) = self.model.borrow_mut().datasets.get_mut(&name) {
                            dataset.flushed();
                        }
                    }
                    None => {
                        pool.flush_all()
                            .await
                            .map_err(|error| io_error("flush", error))?;
                        self.model.borrow_mut().flushed();
                    }
                }
            }
            "burst" => self.burst(pool, false).await?,
            "idle" => {
                let timeout = self.tunables.txg_timeout;
                let pause = Duration::from_nanos(self.rng.below(3 * timeout.as_nanos() as u64 + 1));
                rt::sleep(pause).await;
            }
            "snapshot" => self.snapshot(pool).await?,
            "rollback" => self.rollback(pool).await?,
            "clone" => self.clone_snapshot(pool).await?,
            "destroy-snapshot" => self.destroy_snapshot(pool).await?,
            "destroy-volume" => self.destroy_volume(pool).await?,
            "create-volume" => {
                if self.model.borrow().volumes().len() < VOLUMES_MAX {
                    self.create_volume(pool).await?;
                }
            }
            "scrub" => self.scrub(pool).await?,
            "trim" => {
                // A trim of all free space, left running: the steps that
                // follow (writes, frees, a crash) race its discards, as do
                // autotrim's after every commit.
                if pool.trim_start().is_ok() {
                    self.trace(|| "trim of all free space started".to_string());
                }
            }
            "race-destroy" => self.race(pool, true).await?,
            "race-scrub" => self.race(pool, false).await?,
            "race-receive" => self.race_receive(pool).await?,
            "export-import" => {
                pool.export()
                    .await
                    .map_err(|error| io_error("export", error))?;
                self.model.borrow_mut().flushed();
                return Ok(Some(SessionEnd::Reimport));
            }
            "turn-bad" => self.turn_bad(),
            "heal" => self.heal(pool).await?,
            "rot" => self.rot(),
            "vanish" => self.vanish(),
            "return" => self.come_back(),
            "replace" => self.replace(pool).await?,
            "crash" => {
                self.crash_window(pool).await?;
                return Ok(Some(SessionEnd::Crash));
            }
            other => unreachable!("operation {other} has no handler"),
        }
        Ok(None)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.rng.below(items.len() as u64) as usize].clone())
    }

    /// A volume handle: the head of `name` or a snapshot's read-only view.
    async fn handle(&self, pool: &Rc<Pool>, name: &str) -> Result<Rc<Volume>, String> {
        if name.contains('@') {
            pool.snapshot_volume(&format!("{POOL}/{name}"))
                .await
                .map_err(|error| io_error(&format!("open {name}"), error))
        } else {
            pool.volume(name)
                .map_err(|error| io_error(&format!("open {name}"), error))
        }
    }

    /// Draws a range to write: whole blocks, a piece of one block, or an
    /// unaligned run over several.
    fn draw_range(&mut self, dataset: &DatasetModel) -> (u64, u64) {
        let sector = MODEL_SECTOR_BYTES;
        let block = dataset.block_bytes;
        let size = dataset.size_bytes;
        match self.rng.below(3) {
            0 => {
                let blocks = 1 + self.rng.below((IO_BYTES_MAX / block).max(1));
                let first = self.rng.below(size / block);
                let count = blocks.min(size / block - first);
                (first * block, count * block)
            }
            1 => {
                let first = self.rng.below(size / block);
                let within = self.rng.below(block / sector);
                let count = 1 + self.rng.below(block / sector - within);
                (first * block + within * sector, count * sector)
            }
            _ => {
                let offset = self.rng.below(size / sector) * sector;
                let length = (1 + self.rng.below(IO_BYTES_MAX / sector)) * sector;
                (offset, length.min(size - offset))
            }
        }
    }

    /// Builds the buffer of a write of `tag` at `offset` and the values each
    /// block it covers takes.
    fn prepare(
        dataset: &DatasetModel,
        offset: u64,
        length: u64,
        tag: u64,
    ) -> (Option<BufSlice>, Vec<(u64, Vec<Value>)>) {
        let buffer = (tag != 0).then(|| {
            let mut buffer = AlignedBuf::zeroed(length as usize);
            for (index, chunk) in buffer.chunks_mut(MODEL_SECTOR_BYTES as usize).enumerate() {
                fill_sector(tag, offset / MODEL_SECTOR_BYTES + index as u64, chunk);
            }
            BufSlice::whole(buffer.into_shared())
        });
        let block = dataset.block_bytes;
        let mut changes = Vec::new();
        let mut position = offset;
        while position < offset + length {
            let blkid = position / block;
            let within = position % block;
            let chunk = (block - within).min(offset + length - position);
            let values = dataset.merged(
                blkid,
                (within / MODEL_SECTOR_BYTES) as usize,
                (chunk / MODEL_SECTOR_BYTES) as usize,
                tag,
            );
            changes.push((blkid, values));
            position += chunk;
        }
        (buffer, changes)
    }

    /// A write (or with `zero`, a zero or trim) of a random range of a volume,
    /// then a read-back of the blocks it touched.
    async fn write(&mut self, pool: &Rc<Pool>, fua: bool, zero: bool) -> Check {
        let volumes = self.model.borrow().volumes();
        let Some(name) = self.pick(&volumes) else {
            return Ok(());
        };
        let dataset = self.model.borrow().datasets[&name].clone();
        let (offset, length) = self.draw_range(&dataset);
        let tag = if zero {
            0
        } else {
            self.model.borrow_mut().tag()
        };
        let (buffer, changes) = Sim::prepare(&dataset, offset, length, tag);
        {
            let mut model = self.model.borrow_mut();
            let target = model
                .datasets
                .get_mut(&name)
                .expect("picked from the model");
            for (blkid, values) in &changes {
                target.issued(*blkid, values);
            }
        }
        let volume = self.handle(pool, &name).await?;
        let trim = self.rng.chance(1, 2);
        self.trace(|| {
            format!(
                "{} {name} {offset}+{length} tag {tag} fua {fua}",
                if zero { "zero" } else { "write" }
            )
        });
        let result = match buffer {
            Some(buffer) => pool.write(&volume, offset, buffer, fua).await,
            None => pool.zero(&volume, offset, length, fua, trim).await,
        };
        self.settle(&name, &changes, result, fua)?;
        let first = changes.first().map(|(blkid, _)| *blkid).unwrap_or(0);
        let last = changes.last().map(|(blkid, _)| *blkid).unwrap_or(0);
        self.verify_blocks(pool, &name, first, last - first + 1)
            .await
    }

    /// Applies a write's outcome to the model. Out of space is the one failure
    /// a correct pool may give (the write then may or may not have landed);
    /// anything else is a bug, since faults stay within redundancy.
    fn settle(
        &mut self,
        name: &str,
        changes: &[(u64, Vec<Value>)],
        result: Result<(), PoolError>,
        fua: bool,
    ) -> Check {
        let mut model = self.model.borrow_mut();
        let Some(target) = model.datasets.get_mut(name) else {
            return Ok(());
        };
        match result {
            Ok(()) => {
                for (blkid, values) in changes {
                    target.acknowledged(*blkid, values);
                    if fua {
                        target.flushed_block(*blkid);
                    }
                }
                Ok(())
            }
            Err(PoolError::NoSpace) => {
                for (blkid, values) in changes {
                    target.failed(*blkid, values);
                }
                drop(model);
                self.count_check("write-nospace");
                Ok(())
            }
            Err(error) => Err(io_error(&format!("write to {name}"), error)),
        }
    }

    /// Reads blocks `first..first+count` of dataset `name` and checks each
    /// against the model.
    async fn verify_blocks(
        &mut self,
        pool: &Rc<Pool>,
        name: &str,
        first: u64,
        count: u64,
    ) -> Check {
        let Some(dataset) = self.model.borrow().datasets.get(name).cloned() else {
            return Ok(());
        };
        let block = dataset.block_bytes;
        let count = count.min(dataset.size_bytes / block - first);
        if count == 0 {
            return Ok(());
        }
        let volume = self.handle(pool, name).await?;
        let pieces = pool
            .read(&volume, first * block, count * block)
            .await
            .map_err(|error| io_error(&format!("read {name} blocks {first}+{count}"), error))?;
        let bytes = ReadPiece::concat(pieces);
        let mut model = self.model.borrow_mut();
        let target = model.datasets.get_mut(name).expect("present above");
        for index in 0..count {
            let blkid = first + index;
            let value = decode_block(
                &bytes[(index * block) as usize..((index + 1) * block) as usize],
                blkid * block / MODEL_SECTOR_BYTES,
            );
            let checked = if self.after_crash {
                target.observe_after_crash(blkid, value)
            } else {
                target.observe(blkid, value)
            };
            checked.map_err(|problem| format!("{name}: {problem}"))?;
        }
        Ok(())
    }

    async fn read_random(&mut self, pool: &Rc<Pool>) -> Check {
        let names: Vec<String> = self.model.borrow().datasets.keys().cloned().collect();
        let Some(name) = self.pick(&names) else {
            return Ok(());
        };
        let blocks = self.model.borrow().datasets[&name].blocks.len() as u64;
        let first = self.rng.below(blocks);
        let count = 1 + self.rng.below(64);
        self.verify_blocks(pool, &name, first, count).await
    }

    /// After every step: a random range of a random dataset reads as modelled.
    async fn sample_check(&mut self, pool: &Rc<Pool>) -> Check {
        let names: Vec<String> = self.model.borrow().datasets.keys().cloned().collect();
        let Some(name) = self.pick(&names) else {
            return Ok(());
        };
        let blocks = self.model.borrow().datasets[&name].blocks.len() as u64;
        let first = self.rng.below(blocks);
        let count = 1 + self.rng.below(SAMPLE_BLOCKS_MAX);
        self.count_check("sample-read");
        self.verify_blocks(pool, &name, first, count).await?;
        // The read cache never holds more than its bound.
        let cache = pool.store().cache.stats();
        if cache.size_bytes > cache.target_bytes {
            return Err(format!(
                "read cache holds {} bytes, above its bound of {}",
                cache.size_bytes, cache.target_bytes
            ));
        }
        Ok(())
    }

    /// Every dataset read whole against the model, the dataset list against the
    /// pool's, and the space accounting walked (no leak, no double reference).
    pub(crate) async fn full_check(&mut self, pool: &Rc<Pool>) -> Check {
        self.count_check("full");
        let mut listed: Vec<String> = Vec::new();
        for (volume, record) in pool.directory().volumes.iter() {
            listed.push(volume.clone());
            listed.extend(
                record
                    .lineage
                    .snapshots
                    .iter()
                    .map(|snapshot| format!("{volume}@{}", snapshot.name)),
            );
        }
        listed.sort();
        let expected: Vec<String> = self.model.borrow().datasets.keys().cloned().collect();
        if listed != expected {
            return Err(format!(
                "the pool lists datasets {listed:?}, the model {expected:?}"
            ));
        }
        for name in expected {
            let blocks = self.model.borrow().datasets[&name].blocks.len() as u64;
            let mut first = 0;
            while first < blocks {
                let count = (blocks - first).min(256);
                self.verify_blocks(pool, &name, first, count).await?;
                first += count;
            }
        }
        self.after_crash = false;
        let report = pool
            .check_space()
            .await
            .map_err(|error| io_error("space check", error))?;
        self.count_check("space");
        if !report.problems.is_empty() {
            let owners = if self.options.trace {
                describe_owners(pool, &report.problems).await
            } else {
                String::new()
            };
            return Err(format!(
                "space check: {}{owners}",
                report.problems.join("; ")
            ));
        }
        Ok(())
    }

    /// Concurrent writes to disjoint ranges (several tasks, one per range).
    /// With `leave_running`, they are not waited for (a crash interrupts them).
    async fn burst(&mut self, pool: &Rc<Pool>, leave_running: bool) -> Check {
        let volumes = self.model.borrow().volumes();
        let Some(name) = self.pick(&volumes) else {
            return Ok(());
        };
        let (handles, touched) = self.start_burst(pool, &name, false).await?;
        if leave_running {
            return Ok(());
        }
        for handle in handles {
            handle.await?;
        }
        for (first, count) in touched {
            self.verify_blocks(pool, &name, first, count).await?;
        }
        Ok(())
    }

    /// Starts a burst of writes to volume `name`; returns the write tasks and
    /// the block ranges they touch. With `may_vanish` (a destroy races them),
    /// a write may fail because the volume is gone.
    #[allow(clippy::type_complexity)]
    async fn start_burst(
        &mut self,
        pool: &Rc<Pool>,
        name: &str,
        may_vanish: bool,
    ) -> Result<(Vec<rt::JoinHandle<Check>>, Vec<(u64, u64)>), String> {
        let name = name.to_string();
        let dataset = self.model.borrow().datasets[&name].clone();
        let volume = self.handle(pool, &name).await?;
        let block = dataset.block_bytes;
        let blocks = dataset.size_bytes / block;
        let writes = 1 + self.rng.below(BURST_WRITES_MAX);
        let mut taken = std::collections::BTreeSet::new();
        let mut handles = Vec::new();
        let mut touched = Vec::new();
        for _ in 0..writes {
            let first = self.rng.below(blocks);
            let count = 1 + self.rng.below(4.min(blocks - first));
            if (first..first + count).any(|blkid| taken.contains(&blkid)) {
                continue;
            }
            taken.extend(first..first + count);
            // Whole blocks or a piece of the first one.
            let (offset, length) = if self.rng.chance(1, 3) {
                let within = self.rng.below(block / MODEL_SECTOR_BYTES);
                (
                    first * block + within * MODEL_SECTOR_BYTES,
                    (block / MODEL_SECTOR_BYTES - within) * MODEL_SECTOR_BYTES,
                )
            } else {
                (first * block, count * block)
            };
            let zero = self.rng.chance(1, 8);
            // Some writes of a burst are FUA: their log commits run side by
            // side (several in flight, answered in chain order), and a crash
            // window's burst cuts them anywhere.
            let fua = self.rng.chance(1, 4);
            let tag = if zero {
                0
            } else {
                self.model.borrow_mut().tag()
            };
            let current = self.model.borrow().datasets[&name].clone();
            let (buffer, changes) = Sim::prepare(&current, offset, length, tag);
            {
                let mut model = self.model.borrow_mut();
                let target = model
                    .datasets
                    .get_mut(&name)
                    .expect("picked from the model");
                for (blkid, values) in &changes {
                    target.issued(*blkid, values);
                }
            }
            touched.push((first, count));
            self.trace(|| format!("burst {name} {offset}+{length} tag {tag} fua {fua}"));
            let task_pool = pool.clone();
            let task_volume = volume.clone();
            let model = self.model.clone();
            let task_name = name.clone();
            handles.push(rt::spawn(async move {
                let result = match buffer {
                    Some(buffer) => task_pool.write(&task_volume, offset, buffer, fua).await,
                    None => {
                        task_pool
                            .zero(&task_volume, offset, length, fua, true)
                            .await
                    }
                };
                let mut model = model.borrow_mut();
                let Some(target) = model.datasets.get_mut(&task_name) else {
                    return Ok(());
                };
                match result {
                    Ok(()) => {
                        for (blkid, values) in &changes {
                            target.acknowledged(*blkid, values);
                            if fua {
                                target.flushed_block(*blkid);
                            }
                        }
                        Ok(())
                    }
                    Err(PoolError::NoSpace) => {
                        for (blkid, values) in &changes {
                            target.failed(*blkid, values);
                        }
                        Ok(())
                    }
                    Err(PoolError::NoSuchVolume(_)) if may_vanish => {
                        for (blkid, values) in &changes {
                            target.failed(*blkid, values);
                        }
                        Ok(())
                    }
                    Err(error) => Err(io_error(
                        &format!("burst write to {task_name} at {offset}+{length}"),
                        error,
                    )),
                }
            }));
        }
        Ok((handles, touched))
    }

    /// Administration racing client writes: a burst of writes to a volume is
    /// started and, while it runs, the volume is destroyed (the writes either
    /// land before it or fail as gone; nothing may be freed twice, no other
    /// volume may change) or a scrub runs (every block stays verifiable).
    /// A full check follows (every dataset against the model, and the space
    /// walk), so a block linked into a destroyed tree or a free counted twice
    /// is found here.
    async fn race(&mut self, pool: &Rc<Pool>, destroy: bool) -> Check {
        let volumes = self.model.borrow().volumes();
        if destroy && volumes.len() <= 1 {
            return Ok(());
        }
        let Some(name) = self.pick(&volumes) else {
            return Ok(());
        };
        let (handles, touched) = self.start_burst(pool, &name, destroy).await?;
        // Let some of the writes start before the administrative operation.
        rt::sleep(Duration::from_nanos(self.rng.below(2_000_000))).await;
        if destroy {
            self.trace(|| format!("race: destroy {name} under writes"));
            self.destroy_named_volume(pool, &name).await?;
            for handle in handles {
                handle.await?;
            }
            if self.model.borrow().datasets.contains_key(&name) {
                for (first, count) in touched {
                    self.verify_blocks(pool, &name, first, count).await?;
                }
            }
        } else {
            self.trace(|| format!("race: scrub under writes to {name}"));
            let _ = pool.scrub_start();
            for handle in handles {
                handle.await?;
            }
            self.scrub_result(pool).await?;
            for (first, count) in touched {
                self.verify_blocks(pool, &name, first, count).await?;
            }
        }
        self.full_check(pool).await
    }

    /// A snapshot sent into memory and received back as a new volume while
    /// client writes run: to the snapshot's volume during the send (copy on
    /// write must keep the stream to the snapshot as it was), and to a random
    /// volume during the receive (whose writes, commits and final switch of
    /// the hidden volume into place share the txgs with them). The received
    /// volume and its snapshot must hold exactly the sent snapshot, every
    /// write must land, and a full check follows.
    async fn race_receive(&mut self, pool: &Rc<Pool>) -> Check {
        if self.model.borrow().volumes().len() >= VOLUMES_MAX {
            return Ok(());
        }
        let snapshots: Vec<String> = self
            .model
            .borrow()
            .datasets
            .keys()
            .filter(|name| name.contains('@'))
            .cloned()
            .collect();
        let Some(snapshot) = self.pick(&snapshots) else {
            return Ok(());
        };
        let (source, snapshot_name) = snapshot.split_once('@').expect("a snapshot name");
        let (source, snapshot_name) = (source.to_string(), snapshot_name.to_string());
        let target = self.model.borrow_mut().name("r");
        self.trace(|| format!("race: send {snapshot} and receive it as {target} under writes"));
        let mut bursts = vec![(
            source.clone(),
            self.start_burst(pool, &source, false).await?,
        )];
        let stream = MemoryStream::new();
        let request = SendRequest {
            snapshot: format!("{POOL}/{snapshot}"),
            from: None,
            resume_block: None,
            resume_object: None,
            raw: false,
        };
        pool.send(request, &stream)
            .await
            .map_err(|error| io_error(&format!("send {snapshot}"), error))?;
        let volumes = self.model.borrow().volumes();
        let written = self.pick(&volumes);
        if let Some(name) = written {
            // The model follows one write per block at a time: a second burst
            // on the same volume starts once the first has landed.
            if name == source {
                for handle in std::mem::take(&mut bursts[0].1 .0) {
                    handle.await?;
                }
            }
            let burst = self.start_burst(pool, &name, false).await?;
            bursts.push((name, burst));
        }
        let input = MemoryStream::from_bytes(stream.into_bytes());
        let options = ReceiveOptions {
            target: format!("{POOL}/{target}"),
            force: false,
            save_partial: false,
            properties: Default::default(),
            received: None,
        };
        let received = pool.receive(options, &input).await;
        let mut touched = Vec::new();
        for (name, (handles, ranges)) in bursts {
            for handle in handles {
                handle.await?;
            }
            touched.extend(ranges.into_iter().map(|range| (name.clone(), range)));
        }
        match received {
            Ok(_) => {
                let mut model = self.model.borrow_mut();
                let content = model.datasets[&snapshot].frozen();
                model
                    .datasets
                    .insert(format!("{target}@{snapshot_name}"), content.clone());
                model.datasets.insert(target.clone(), content);
            }
            // A full pool fails the receive and leaves nothing behind.
            Err(error) if error.to_string().contains(&PoolError::NoSpace.to_string()) => {
                self.count_check("receive-nospace");
                if pool.volume(&format!("{POOL}/{target}")).is_ok() {
                    return Err(format!("{target} exists after its receive failed: {error}"));
                }
            }
            Err(error) => return Err(io_error(&format!("receive {snapshot} as {target}"), error)),
        }
        for (name, (first, count)) in touched {
            if self.model.borrow().datasets.contains_key(&name) {
                self.verify_blocks(pool, &name, first, count).await?;
            }
        }
        self.full_check(pool).await
    }

    /// Sets the stage for a crash: writes in flight, maybe a scrub, and the
    /// background commit at some point of its work; then the power goes.
    async fn crash_window(&mut self, pool: &Rc<Pool>) -> Check {
        if self.rng.chance(1, 4) {
            let _ = pool.scrub_start();
        }
        self.burst(pool, true).await?;
        let timeout = self.tunables.txg_timeout.as_nanos() as u64;
        let pause = Duration::from_nanos(self.rng.below(2 * timeout + 2_000_000));
        rt::sleep(pause).await;
        self.count_fault("crash");
        let pending: u64 = self
            .devices
            .iter()
            .map(|device| device.pending_bytes())
            .sum();
        self.trace(|| format!("crash after {pause:?} with {pending} unflushed bytes"));
        Ok(())
    }

    async fn create_volume(&mut self, pool: &Rc<Pool>) -> Check {
        let name = self.model.borrow_mut().name("v");
        let block_bytes = [4096u64, 8192, 16384, 65536][self.rng.below(4) as usize];
        let size_bytes = (4 + self.rng.below(13)) << 20;
        // Every other volume is encrypted (which ones, by the seed and the
        // name's number: no draw from the workload's generator, so a
        // seed's workload stays what it was before encryption).
        let number: u64 = name[1..].parse().expect("a numbered name");
        let encryption = ((self.options.seed + number) % 2 == 0).then(|| {
            self.count_operation("encrypted-volume");
            ironpool::pool::dataset::keys::CreateKey::New(
                ironpool::pool::dataset::keys::NewEncryption {
                    suite: ironpool::crypto::Suite::Aes256Gcm,
                    params: ironpool::crypto::KeyParams::new(
                        ironpool::crypto::KeyFormat::Raw,
                        None,
                    )
                    .expect("raw key parameters"),
                    keylocation: "prompt".into(),
                    material: Some(zeroize::Zeroizing::new(SIM_KEY.to_vec())),
                },
            )
        });
        pool.create_volume_with(
            &format!("{POOL}/{name}"),
            size_bytes,
            block_bytes as u32,
            BTreeMap::new(),
            encryption,
        )
        .await
        .map_err(|error| io_error(&format!("create volume {name}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        model
            .datasets
            .insert(name, DatasetModel::new(size_bytes, block_bytes));
        Ok(())
    }

    async fn snapshot(&mut self, pool: &Rc<Pool>) -> Check {
        let volumes = self.model.borrow().volumes();
        let Some(volume) = self.pick(&volumes) else {
            return Ok(());
        };
        if self.model.borrow().snapshots_of(&volume).len() >= SNAPSHOTS_PER_VOLUME_MAX {
            return Ok(());
        }
        let snapshot = self.model.borrow_mut().name("s");
        pool.snapshot(&[format!("{POOL}/{volume}@{snapshot}")])
            .await
            .map_err(|error| io_error(&format!("snapshot {volume}@{snapshot}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        let frozen = model.datasets[&volume].frozen();
        model
            .datasets
            .insert(format!("{volume}@{snapshot}"), frozen);
        Ok(())
    }

    async fn rollback(&mut self, pool: &Rc<Pool>) -> Check {
        let volumes = self.model.borrow().volumes();
        let Some(volume) = self.pick(&volumes) else {
            return Ok(());
        };
        let snapshots = self.model.borrow().snapshots_of(&volume);
        let Some(target) = self.pick(&snapshots) else {
            return Ok(());
        };
        let index = snapshots
            .iter()
            .position(|name| *name == target)
            .expect("picked from the list");
        let blocked = snapshots[index + 1..]
            .iter()
            .any(|later| self.model.borrow().has_clones(later));
        self.trace(|| format!("rollback to {target}"));
        let result = pool.rollback(&format!("{POOL}/{target}"), true).await;
        if blocked {
            return match result {
                Err(_) => Ok(()),
                Ok(()) => Err(format!(
                    "rollback to {target} destroyed later snapshots that have clones"
                )),
            };
        }
        result.map_err(|error| io_error(&format!("rollback to {target}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        for later in &snapshots[index + 1..] {
            model.datasets.remove(later);
        }
        let content = model.datasets[&target].frozen();
        model.datasets.insert(volume, content);
        Ok(())
    }

    async fn clone_snapshot(&mut self, pool: &Rc<Pool>) -> Check {
        if self.model.borrow().volumes().len() >= VOLUMES_MAX {
            return Ok(());
        }
        let snapshots: Vec<String> = self
            .model
            .borrow()
            .datasets
            .keys()
            .filter(|name| name.contains('@'))
            .cloned()
            .collect();
        let Some(origin) = self.pick(&snapshots) else {
            return Ok(());
        };
        let clone = self.model.borrow_mut().name("c");
        pool.clone_snapshot(&format!("{POOL}/{origin}"), &format!("{POOL}/{clone}"))
            .await
            .map_err(|error| io_error(&format!("clone {origin} as {clone}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        let content = model.datasets[&origin].frozen();
        model.datasets.insert(clone.clone(), content);
        model.origins.insert(clone, origin);
        Ok(())
    }

    async fn destroy_snapshot(&mut self, pool: &Rc<Pool>) -> Check {
        let snapshots: Vec<String> = self
            .model
            .borrow()
            .datasets
            .keys()
            .filter(|name| name.contains('@'))
            .cloned()
            .collect();
        let Some(target) = self.pick(&snapshots) else {
            return Ok(());
        };
        let blocked = self.model.borrow().has_clones(&target);
        let result = pool.destroy_snapshot(&format!("{POOL}/{target}")).await;
        if blocked {
            return match result {
                Err(_) => Ok(()),
                Ok(()) => Err(format!("destroyed {target}, which has clones")),
            };
        }
        result.map_err(|error| io_error(&format!("destroy {target}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        model.datasets.remove(&target);
        Ok(())
    }

    async fn destroy_volume(&mut self, pool: &Rc<Pool>) -> Check {
        let volumes = self.model.borrow().volumes();
        if volumes.len() <= 1 {
            return Ok(());
        }
        let Some(volume) = self.pick(&volumes) else {
            return Ok(());
        };
        self.destroy_named_volume(pool, &volume).await
    }

    /// Destroys `volume` with its snapshots (refused while a snapshot has
    /// clones) and drops it from the model.
    async fn destroy_named_volume(&mut self, pool: &Rc<Pool>, volume: &str) -> Check {
        let volume = volume.to_string();
        let snapshots = self.model.borrow().snapshots_of(&volume);
        let blocked = snapshots
            .iter()
            .any(|snapshot| self.model.borrow().has_clones(snapshot));
        self.trace(|| {
            format!(
                "destroy {volume} (snapshots {snapshots:?}, origin {:?}, blocked {blocked})",
                self.model.borrow().origins.get(&volume)
            )
        });
        let result = pool.destroy_volume(&format!("{POOL}/{volume}"), true).await;
        if blocked {
            return match result {
                Err(_) => Ok(()),
                Ok(()) => Err(format!("destroyed {volume}, whose snapshots have clones")),
            };
        }
        result.map_err(|error| io_error(&format!("destroy {volume}"), error))?;
        let mut model = self.model.borrow_mut();
        model.flushed();
        model.datasets.remove(&volume);
        for snapshot in snapshots {
            model.datasets.remove(&snapshot);
        }
        model.origins.remove(&volume);
        Ok(())
    }

    /// A scrub with faults still on: no block may be left without a good copy.
    async fn scrub(&mut self, pool: &Rc<Pool>) -> Check {
        // An import may have resumed a scrub cut short by a crash: let it end.
        pool.scrub_wait().await;
        pool.scrub_start()
            .map_err(|error| io_error("scrub start", error))?;
        self.scrub_result(pool).await
    }

    /// Waits for the running scrub and judges what it found.
    async fn scrub_result(&mut self, pool: &Rc<Pool>) -> Check {
        pool.scrub_wait().await;
        self.count_check("scrub");
        let status = pool.scrub_status();
        if status.errors > 0 {
            return Err(format!(
                "scrub found {} unrecoverable blocks with faults within redundancy: {:?}",
                status.errors, status.error_details
            ));
        }
        if !self.damage_possible && status.bad_copies > 0 {
            return Err(format!(
                "scrub found {} bad copies though no device was ever bad: {:?}",
                status.bad_copies, status.error_details
            ));
        }
        Ok(())
    }

    /// Turns a device bad: some of the enabled damage faults at random rates.
    fn turn_bad(&mut self) {
        let candidates = self.budget.may_turn_bad();
        let Some(device) = self.pick(&candidates) else {
            return;
        };
        let faults = self.options.faults;
        let rate = |kind: FaultKind, rng: &mut Rng| -> u32 {
            if faults.has(kind) && rng.chance(2, 3) {
                [1_000u32, 10_000, 50_000, 200_000][rng.below(4) as usize]
            } else {
                0
            }
        };
        let plan = SimFaults {
            read_error_ppm: rate(FaultKind::ReadError, &mut self.rng),
            read_corruption_ppm: rate(FaultKind::ReadCorrupt, &mut self.rng),
            write_error_ppm: rate(FaultKind::WriteError, &mut self.rng),
            write_corruption_ppm: rate(FaultKind::WriteCorrupt, &mut self.rng),
            misdirected_write_ppm: rate(FaultKind::Misdirect, &mut self.rng),
            write_nospace_ppm: rate(FaultKind::NoSpace, &mut self.rng),
            offline: false,
        };
        self.trace(|| format!("device {device} turns bad: {plan:?}"));
        self.devices[device].set_faults(plan);
        self.budget.mark(device, BadState::Faulty);
        self.damage_possible = true;
        self.count_fault("device-turned-bad");
    }

    /// Flips bits at rest on a bad device.
    fn rot(&mut self) {
        let bad: Vec<usize> = (0..self.devices.len())
            .filter(|device| self.budget.bad[*device].is_some())
            .collect();
        let Some(device) = self.pick(&bad) else {
            return;
        };
        let sectors = 1 + self.rng.below(32) as usize;
        self.devices[device].rot(sectors, &mut self.rng);
    }

    /// A device (good within budget, or already bad) vanishes.
    fn vanish(&mut self) {
        let mut candidates = self.budget.may_turn_bad();
        candidates.extend(self.budget.devices_in(BadState::Faulty));
        candidates.extend(self.budget.devices_in(BadState::Stale));
        candidates.sort_unstable();
        let Some(device) = self.pick(&candidates) else {
            return;
        };
        self.devices[device].set_offline(true);
        self.budget.mark(device, BadState::Vanished);
        self.damage_possible = true;
        self.count_fault("vanish");
    }

    /// A vanished device comes back (stale: it missed writes) with its other
    /// faults off.
    fn come_back(&mut self) {
        let vanished = self.budget.devices_in(BadState::Vanished);
        let Some(device) = self.pick(&vanished) else {
            return;
        };
        self.devices[device].set_faults(SimFaults::default());
        self.budget.mark(device, BadState::Stale);
        self.count_fault("return");
    }

    /// A bad device (faulty, vanished or back but stale) is swapped for a new
    /// blank one in the same slot (`ironpool replace`), which the resilver
    /// fills from the other devices; it stays in the bad set until a heal
    /// proves it whole. The engine may refuse when the group could not rebuild
    /// it; that is checked against the group's own redundancy.
    async fn replace(&mut self, pool: &Rc<Pool>) -> Check {
        let bad: Vec<usize> = (0..self.devices.len())
            .filter(|device| self.budget.bad[*device].is_some())
            .collect();
        let Some(device) = self.pick(&bad) else {
            return Ok(());
        };
        self.replacements += 1;
        let fresh = SimDevice::new(
            &format!("d{device}r{}", self.replacements),
            DEVICE_BYTES,
            self.rng.next_u64(),
        );
        fresh.set_latency(latency_for(&self.options, &mut self.rng));
        let path = format!("sim:d{device}");
        let new = NewDevice {
            path: path.clone(),
            device: fresh.clone() as Rc<dyn Device>,
        };
        match pool.replace_device(&path, new, false).await {
            Ok(()) => {
                self.trace(|| format!("device {device} replaced"));
                let old = std::mem::replace(&mut self.devices[device], fresh);
                old.set_faults(SimFaults::default());
                self.retired.push(old);
                self.budget.mark(device, BadState::Stale);
                self.count_fault("replaced");
                pool.resilver_wait().await;
                Ok(())
            }
            Err(PoolError::InvalidArgument(reason)) if reason.contains("cannot rebuild") => {
                // Only when the group really has more devices away or stale
                // than its parity or copies cover, counting this one. Stale
                // includes what the engine itself logged as missed and not yet
                // resilvered (an import after a crash in a commit marks every
                // device whose label missed the last txg), which the budget
                // does not see.
                let behind = pool
                    .store()
                    .vdevs()
                    .iter()
                    .find(|top| top.children.iter().any(|leaf| *leaf.path.borrow() == path))
                    .map_or(0, |top| {
                        top.children
                            .iter()
                            .filter(|leaf| {
                                *leaf.path.borrow() != path && !leaf.dtl.borrow().is_empty()
                            })
                            .count()
                    });
                if self.budget.bad_in_group(self.budget.groups[device]) + behind <= 1 {
                    return Err(format!("replace of device {device} refused with no other device of its group bad: {reason}"));
                }
                self.count_operation("replace-refused");
                Ok(())
            }
            Err(error) => Err(io_error("replace", error)),
        }
    }

    /// Heals every bad device that is present: faults off, commit, scrub (which
    /// must repair everything), commit twice (so the repairs and every repair a
    /// read spawned are durable), scrub again: a device whose copies all verify
    /// and whose labels show the newest txg leaves the bad set.
    pub(crate) async fn heal(&mut self, pool: &Rc<Pool>) -> Check {
        let targets: Vec<usize> = (0..self.devices.len())
            .filter(|device| {
                matches!(
                    self.budget.bad[*device],
                    Some(BadState::Faulty) | Some(BadState::Stale)
                )
            })
            .collect();
        if targets.is_empty() {
            return Ok(());
        }
        for device in &targets {
            self.devices[*device].set_faults(SimFaults::default());
            self.budget.mark(*device, BadState::Stale);
        }
        pool.commit()
            .await
            .map_err(|error| io_error("heal commit", error))?;
        self.model.borrow_mut().flushed();
        for pass in 0..2 {
            // An import may have resumed a scrub cut short by a crash: let it end.
            pool.scrub_wait().await;
            pool.scrub_start()
                .map_err(|error| io_error("heal scrub", error))?;
            pool.scrub_wait().await;
            let status = pool.scrub_status();
            self.trace(|| {
                format!(
                    "heal scrub {pass}: {} bad copies, {} repaired, {} unrecoverable",
                    status.bad_copies, status.repaired_copies, status.errors
                )
            });
            if status.errors > 0 {
                return Err(format!(
                    "heal scrub {pass} found {} unrecoverable blocks: {:?}",
                    status.errors, status.error_details
                ));
            }
            pool.commit()
                .await
                .map_err(|error| io_error("heal commit", error))?;
            pool.commit()
                .await
                .map_err(|error| io_error("heal commit", error))?;
        }
        self.count_check("heal-scrub");
        let errors_before: Vec<u64> = self.leaf_errors(pool);
        pool.scrub_start()
            .map_err(|error| io_error("heal verify scrub", error))?;
        pool.scrub_wait().await;
        let errors_after: Vec<u64> = self.leaf_errors(pool);
        self.trace(|| {
            let status = pool.scrub_status();
            format!("heal verify scrub: {} bad copies, {} repaired; leaf errors {errors_before:?} -> {errors_after:?}", status.bad_copies, status.repaired_copies)
        });
        for device in targets {
            let path = format!("sim:d{device}");
            let online = pool
                .store()
                .vdevs()
                .iter()
                .flat_map(|top| top.children.iter())
                .any(|leaf| {
                    *leaf.path.borrow() == path && leaf.is_online() && leaf.device().is_some()
                });
            if !online || errors_after[device] != errors_before[device] {
                self.trace(|| {
                    format!(
                        "device {device} stays bad (online {online}, errors {} -> {})",
                        errors_before[device], errors_after[device]
                    )
                });
                continue;
            }
            let probe = ironpool::pool::labels::probe_device(
                &*self.devices[device],
                std::path::Path::new(&path),
            )
            .await;
            let newest = probe
                .uberblocks
                .iter()
                .filter(|uberblock| uberblock.pool_guid == pool.guid())
                .map(|uberblock| uberblock.txg)
                .max()
                .unwrap_or(0);
            if probe.label.is_none() || newest != pool.txg().durable() {
                self.trace(|| {
                    format!(
                        "device {device} stays bad (newest uberblock {newest}, durable {})",
                        pool.txg().durable()
                    )
                });
                continue;
            }
            self.budget.bad[device] = None;
            self.count_check("device-healed");
        }
        if self.budget.bad.iter().all(Option::is_none) {
            self.damage_possible = false;
        }
        Ok(())
    }

    /// Read errors plus checksum errors of every device's leaf (by device index;
    /// 0 for devices the pool does not have).
    fn leaf_errors(&self, pool: &Rc<Pool>) -> Vec<u64> {
        (0..self.devices.len())
            .map(|device| {
                let path = format!("sim:d{device}");
                pool.store()
                    .vdevs()
                    .iter()
                    .flat_map(|top| top.children.iter())
                    .find(|leaf| *leaf.path.borrow() == path)
                    .map(|leaf| {
                        let stats = leaf.queue.stats();
                        stats.read_errors + stats.checksum_errors
                    })
                    .unwrap_or(0)
            })
            .collect()
    }

    pub(crate) fn devices(&self) -> &[Rc<SimDevice>] {
        &self.devices
    }

    pub(crate) fn is_present(&self, device: usize) -> bool {
        self.budget.bad[device] != Some(BadState::Vanished)
    }

    pub(crate) fn next_seed(&mut self) -> u64 {
        self.rng.next_u64()
    }

    pub(crate) fn tunables(&self) -> PoolTunables {
        self.tunables.clone()
    }
}

/// Device latency for a run: fixed (completions in order) unless reordering is
/// on; spikes when latency faults are on.
fn latency_for(options: &Options, rng: &mut Rng) -> SimLatency {
    let (minimum_us, maximum_us) = if options.faults.has(FaultKind::Reorder) {
        (1, 1 + rng.below(4_000))
    } else {
        (50, 50)
    };
    let (spike_every, spike_us) = if options.faults.has(FaultKind::Latency) {
        (50 + rng.below(500), 1_000 + rng.below(100_000))
    } else {
        (0, 0)
    };
    SimLatency {
        minimum_us,
        maximum_us,
        spike_every,
        spike_us,
    }
}

/// Decodes one block read back into its per-sector tags.
fn decode_block(bytes: &[u8], first_sector: u64) -> Value {
    bytes
        .chunks(MODEL_SECTOR_BYTES as usize)
        .enumerate()
        .map(|(index, sector)| decode_sector(sector, first_sector + index as u64))
        .collect::<Vec<u64>>()
        .into()
}

/// For a failed space check (with --trace): which open objects point at the
/// ranges the problems name, to start the diagnosis.
async fn describe_owners(pool: &Rc<Pool>, problems: &[String]) -> String {
    let mut ranges: Vec<(u32, u64, u64)> = Vec::new();
    for problem in problems {
        let Some(rest) = problem.strip_prefix("vdev ") else {
            continue;
        };
        let Some((vdev, rest)) = rest.split_once(':') else {
            continue;
        };
        let Some(range) = rest.split_whitespace().find(|word| word.contains("..")) else {
            continue;
        };
        let Some((start, end)) = range.split_once("..") else {
            continue;
        };
        let parse = |text: &str| u64::from_str_radix(text.trim_start_matches("0x"), 16).ok();
        if let (Ok(vdev), Some(start), Some(end)) = (vdev.parse::<u32>(), parse(start), parse(end))
        {
            ranges.push((vdev, start, end));
        }
    }
    let mut out = format!(
        "\n  open txg {}, durable txg {}",
        pool.txg().open(),
        pool.txg().durable()
    );
    {
        let allocator = pool.store().allocator.borrow();
        for (vdev, start, end) in &ranges {
            let Some(space) = allocator.vdevs.get(*vdev as usize) else {
                continue;
            };
            for metaslab in &space.metaslabs {
                let sets = [
                    ("free", &metaslab.free),
                    ("allocated", &metaslab.allocated),
                    ("pending_allocs", &metaslab.pending_allocs),
                    ("pending_frees", &metaslab.pending_frees),
                    ("syncing_frees", &metaslab.syncing_frees),
                    ("defer0", &metaslab.defer[0]),
                    ("defer1", &metaslab.defer[1]),
                ];
                let found: Vec<&str> = sets
                    .iter()
                    .filter(|(_, set)| set.overlaps(*start, *end))
                    .map(|(name, _)| *name)
                    .collect();
                if !found.is_empty() {
                    out.push_str(&format!(
                        "\n  vdev {vdev} {start:#x}..{end:#x} in {found:?}"
                    ));
                }
            }
        }
    }
    for object in pool.objects().open_objects() {
        let mut hits = Vec::new();
        let _ = pool
            .objects()
            .visit_pointers(&object, &mut |level, blkid, pointer| {
                for dva in pointer.copies() {
                    if ranges.iter().any(|(vdev, start, end)| {
                        dva.vdev == *vdev && dva.offset < *end && dva.end() > *start
                    }) {
                        hits.push((
                            format!(
                                "L{level}/{blkid} {:#x} birth {}",
                                dva.offset, pointer.birth_txg
                            ),
                            dva.vdev,
                            dva.offset,
                            dva.end(),
                        ));
                    }
                }
            })
            .await;
        if !hits.is_empty() {
            let allocator = pool.store().allocator.borrow();
            let mut described = Vec::new();
            for (hit, vdev, offset, end) in hits {
                let mut sets = Vec::new();
                if let Some(space) = allocator.vdevs.get(vdev as usize) {
                    for metaslab in &space.metaslabs {
                        for (name, set) in [
                            ("free", &metaslab.free),
                            ("allocated", &metaslab.allocated),
                            ("pending_allocs", &metaslab.pending_allocs),
                            ("pending_frees", &metaslab.pending_frees),
                            ("syncing_frees", &metaslab.syncing_frees),
                            ("defer0", &metaslab.defer[0]),
                            ("defer1", &metaslab.defer[1]),
                        ] {
                            if set.overlaps(offset, end) {
                                sets.push(name);
                            }
                        }
                    }
                }
                described.push(format!("{hit} in {sets:?}"));
            }
            out.push_str(&format!(
                "\n  object {} ({:?}) at open txg {}: {}",
                object.id,
                object.dnode().object_type,
                pool.txg().open(),
                described.join(", ")
            ));
        }
    }
    out
}

/// Loads the key of every encrypted volume of `pool` (after an import,
/// none is loaded), as an operator's `load-key -a` would.
pub(crate) async fn load_keys(pool: &Rc<Pool>) -> Result<(), String> {
    for (name, volume) in pool.open_volumes() {
        if volume.key_guid().is_none() || pool.volume_key_available(&volume) {
            continue;
        }
        pool.load_key(&name, Some(zeroize::Zeroizing::new(SIM_KEY.to_vec())))
            .await
            .map_err(|error| io_error(&format!("load-key {name}"), error))?;
    }
    Ok(())
}
