//! A simulated device: memory with a volatile write cache, seeded latency and
//! injectable faults.
//!
//! Writes land in a volatile cache (a log of pending writes, in order); a flush
//! makes every pending write durable. A [`SimDevice::crash`] keeps a random subset
//! of the pending sectors (each pending write may be lost, kept, or torn at a
//! sector boundary; a later write may survive while an earlier one to the same
//! sector is lost, as with a real reordering cache) and drops the rest. A flush
//! covers only the writes that completed before it was issued, as on a real
//! device. Latency is drawn from the device's own seeded generator and spent in
//! virtual time, so concurrent I/Os complete in a seed-determined order.
//!
//! Faults (all drawn from the device's seed, so a run replays exactly): EIO and
//! bit flips on reads, EIO, ENOSPC, bit flips and misdirection on writes, bit rot
//! at rest, latency spikes, and the device vanishing. Each kind is counted, so the
//! simulator can report what it injected. The media is kept in ordered maps, so
//! nothing depends on hash iteration order.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use super::{check_range, Device, DeviceError, DeviceFuture, DeviceInfo};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sim::Rng;

/// Sector granularity of the simulated media (and of tearing).
pub const SIM_SECTOR_BYTES: usize = 4096;

/// Faults a test turns on; probabilities are in parts per million per I/O.
#[derive(Clone, Debug, Default)]
pub struct SimFaults {
    /// A read fails with EIO.
    pub read_error_ppm: u32,
    /// A read returns data with one flipped bit (the media is intact).
    pub read_corruption_ppm: u32,
    /// A write fails with EIO (nothing is written).
    pub write_error_ppm: u32,
    /// A write is stored with one flipped bit.
    pub write_corruption_ppm: u32,
    /// A write lands at the wrong offset: the intended sectors keep their old
    /// contents and other sectors of the device are clobbered (a firmware bug).
    pub misdirected_write_ppm: u32,
    /// A write fails with ENOSPC (a thin-provisioned device out of backing space);
    /// nothing is written.
    pub write_nospace_ppm: u32,
    /// Every operation fails: the device has vanished.
    pub offline: bool,
}

impl SimFaults {
    /// True when no fault is switched on.
    pub fn is_quiet(&self) -> bool {
        self.read_error_ppm == 0
            && self.read_corruption_ppm == 0
            && self.write_error_ppm == 0
            && self.write_corruption_ppm == 0
            && self.misdirected_write_ppm == 0
            && self.write_nospace_ppm == 0
            && !self.offline
    }
}

/// Latency distribution in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct SimLatency {
    pub minimum_us: u64,
    pub maximum_us: u64,
    /// One I/O in this many takes `spike_us` extra (0: never).
    pub spike_every: u64,
    pub spike_us: u64,
}

impl Default for SimLatency {
    fn default() -> SimLatency {
        SimLatency {
            minimum_us: 20,
            maximum_us: 200,
            spike_every: 500,
            spike_us: 5_000,
        }
    }
}

struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

#[derive(Clone)]
struct Media {
    /// Durable sectors (absent = zero).
    durable: BTreeMap<u64, Box<[u8]>>,
    /// Writes completed but not yet flushed, oldest first.
    pending: Vec<PendingWrite>,
}

impl Clone for PendingWrite {
    fn clone(&self) -> PendingWrite {
        PendingWrite {
            offset: self.offset,
            data: self.data.clone(),
        }
    }
}

/// Counters of what the device did, for test assertions and the simulator's
/// summary. `injected_faults` is the sum of the fault kinds below it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimCounters {
    pub reads: u64,
    pub writes: u64,
    /// Writes durable on completion (FUA), counted in `writes` too.
    pub durable_writes: u64,
    pub flushes: u64,
    /// Discards (each a write of zeros into the volatile cache).
    pub trims: u64,
    /// Discards refused by a device without discard.
    pub refused_trims: u64,
    pub injected_faults: u64,
    pub read_errors: u64,
    pub read_corruptions: u64,
    pub write_errors: u64,
    pub write_corruptions: u64,
    pub misdirected_writes: u64,
    pub nospace_errors: u64,
    /// Operations refused because the device was offline (vanished).
    pub offline_errors: u64,
    /// Sectors whose bits were flipped at rest by [`SimDevice::rot`].
    pub rotted_sectors: u64,
    /// I/Os that took a latency spike.
    pub latency_spikes: u64,
    /// I/Os that completed while an I/O issued before them was still in flight.
    pub reordered_completions: u64,
}

/// Which fault counter a drawn fault goes to.
#[derive(Clone, Copy)]
enum FaultKind {
    ReadError,
    ReadCorruption,
    WriteError,
    WriteCorruption,
    Misdirected,
    NoSpace,
}

pub struct SimDevice {
    info: DeviceInfo,
    media: RefCell<Media>,
    rng: RefCell<Rng>,
    faults: RefCell<SimFaults>,
    latency: Cell<SimLatency>,
    counters: Cell<SimCounters>,
    /// Issue numbers of the I/Os in flight (to count reordered completions).
    in_flight: RefCell<BTreeSet<u64>>,
    next_issue: Cell<u64>,
    /// False for a device without discard (a disk or filesystem that cannot
    /// TRIM): every discard is refused as unsupported.
    discard: Cell<bool>,
}

impl SimDevice {
    pub fn new(name: &str, size_bytes: u64, seed: u64) -> Rc<SimDevice> {
        assert!(size_bytes.is_multiple_of(SIM_SECTOR_BYTES as u64));
        Rc::new(SimDevice {
            info: DeviceInfo {
                path: format!("sim:{name}"),
                size_bytes,
                logical_sector_bytes: SIM_SECTOR_BYTES as u32,
                physical_sector_bytes: SIM_SECTOR_BYTES as u32,
                rotational: false,
                direct: true,
            },
            media: RefCell::new(Media {
                durable: BTreeMap::new(),
                pending: Vec::new(),
            }),
            rng: RefCell::new(Rng::new(seed)),
            faults: RefCell::new(SimFaults::default()),
            latency: Cell::new(SimLatency::default()),
            counters: Cell::new(SimCounters::default()),
            in_flight: RefCell::new(BTreeSet::new()),
            next_issue: Cell::new(0),
            discard: Cell::new(true),
        })
    }

    /// A new device holding a copy of this one's media (durable and pending), with
    /// no faults and its own generator: lets a checker try something destructive
    /// (an import at an older uberblock) without touching the original.
    pub fn clone_media(&self, name: &str, seed: u64) -> Rc<SimDevice> {
        let copy = SimDevice::new(name, self.info.size_bytes, seed);
        *copy.media.borrow_mut() = self.media.borrow().clone();
        copy.latency.set(self.latency.get());
        copy
    }

    pub fn faults(&self) -> SimFaults {
        self.faults.borrow().clone()
    }

    /// Gives the device discard, or takes it away (see the field).
    pub fn set_discard(&self, discard: bool) {
        self.discard.set(discard);
    }

    /// Makes the device vanish (every operation fails) or come back.
    pub fn set_offline(&self, offline: bool) {
        self.faults.borrow_mut().offline = offline;
    }

    /// Flips one bit in each of `sectors` randomly chosen written sectors of the
    /// durable media (bit rot). Pending writes are left alone, so a later crash
    /// still decides their fate. Returns the number of sectors flipped.
    pub fn rot(&self, sectors: usize, rng: &mut Rng) -> usize {
        let mut media = self.media.borrow_mut();
        if media.durable.is_empty() {
            return 0;
        }
        let keys: Vec<u64> = media.durable.keys().copied().collect();
        let mut flipped = 0;
        for _ in 0..sectors {
            let key = keys[rng.below(keys.len() as u64) as usize];
            if let Some(sector) = media.durable.get_mut(&key) {
                let bit = rng.below(SIM_SECTOR_BYTES as u64 * 8) as usize;
                sector[bit / 8] ^= 1 << (bit % 8);
                flipped += 1;
            }
        }
        drop(media);
        self.count(|counters| {
            counters.rotted_sectors += flipped as u64;
            counters.injected_faults += flipped as u64;
        });
        flipped
    }

    /// A digest of the media (durable sectors, then pending writes in order): two
    /// runs of one seed must end with equal digests.
    pub fn digest(&self) -> u64 {
        let media = self.media.borrow();
        use std::hash::Hasher as _;
        let mut hash = twox_hash::XxHash3_64::new();
        for (sector, bytes) in &media.durable {
            hash.write(&sector.to_le_bytes());
            hash.write(bytes);
        }
        for write in &media.pending {
            hash.write(&write.offset.to_le_bytes());
            hash.write(&write.data);
        }
        hash.finish()
    }

    /// Bytes of unflushed writes (what a crash now could lose or tear).
    pub fn pending_bytes(&self) -> u64 {
        self.media
            .borrow()
            .pending
            .iter()
            .map(|write| write.data.len() as u64)
            .sum()
    }

    pub fn set_faults(&self, faults: SimFaults) {
        *self.faults.borrow_mut() = faults;
    }

    pub fn set_latency(&self, latency: SimLatency) {
        self.latency.set(latency);
    }

    pub fn counters(&self) -> SimCounters {
        self.counters.get()
    }

    /// Loses power: each pending sector is independently kept or lost.
    /// Returns the number of sectors lost.
    pub fn crash(&self, rng: &mut Rng) -> usize {
        let mut media = self.media.borrow_mut();
        let pending = std::mem::take(&mut media.pending);
        let mut lost = 0;
        for write in pending {
            for (index, sector) in write.data.chunks(SIM_SECTOR_BYTES).enumerate() {
                if rng.chance(1, 2) {
                    let sector_number = write.offset / SIM_SECTOR_BYTES as u64 + index as u64;
                    media
                        .durable
                        .insert(sector_number, sector.to_vec().into_boxed_slice());
                } else {
                    lost += 1;
                }
            }
        }
        lost
    }

    /// Flips bits in the durable media (a test's "dd over the device").
    pub fn corrupt(&self, offset: u64, length: u64, rng: &mut Rng) {
        self.flush_now();
        let mut media = self.media.borrow_mut();
        let mut position = offset;
        while position < offset + length {
            let sector_number = position / SIM_SECTOR_BYTES as u64;
            let sector = media
                .durable
                .entry(sector_number)
                .or_insert_with(|| vec![0u8; SIM_SECTOR_BYTES].into_boxed_slice());
            let within = (position % SIM_SECTOR_BYTES as u64) as usize;
            sector[within] ^= 1 << rng.below(8);
            position += 1;
        }
    }

    /// Makes every pending write durable immediately (outside any I/O).
    pub fn flush_now(&self) {
        let count = self.media.borrow().pending.len();
        self.flush_prefix(count);
    }

    /// Makes the oldest `count` pending writes durable (a flush covers the writes
    /// that had completed when it was issued, not those completing meanwhile).
    fn flush_prefix(&self, count: usize) {
        let mut media = self.media.borrow_mut();
        let count = count.min(media.pending.len());
        let flushed: Vec<PendingWrite> = media.pending.drain(..count).collect();
        for write in flushed {
            apply(&mut media.durable, write.offset, &write.data);
        }
    }

    /// Reads current contents (pending writes included), outside any I/O.
    pub fn peek(&self, offset: u64, length: usize) -> Vec<u8> {
        let media = self.media.borrow();
        let mut out = vec![0u8; length];
        read_durable(&media.durable, offset, &mut out);
        for write in &media.pending {
            overlay(&mut out, offset, write.offset, &write.data);
        }
        out
    }

    fn draw_latency(&self) -> Duration {
        let latency = self.latency.get();
        let mut rng = self.rng.borrow_mut();
        let spread = latency.maximum_us.saturating_sub(latency.minimum_us) + 1;
        let mut micros = latency.minimum_us + rng.below(spread);
        if latency.spike_every > 0 && rng.below(latency.spike_every) == 0 {
            micros += latency.spike_us;
            drop(rng);
            self.count(|counters| counters.latency_spikes += 1);
        }
        Duration::from_micros(micros)
    }

    /// Waits out one I/O's latency, counting it as reordered when an I/O issued
    /// earlier is still in flight as it completes.
    async fn spend_latency(&self) {
        let issue = self.next_issue.get();
        self.next_issue.set(issue + 1);
        self.in_flight.borrow_mut().insert(issue);
        let wait = crate::rt::sleep(self.draw_latency());
        // The guard keeps the in-flight set right when the I/O is dropped (crash).
        struct InFlight<'a>(&'a RefCell<BTreeSet<u64>>, u64);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.borrow_mut().remove(&self.1);
            }
        }
        let guard = InFlight(&self.in_flight, issue);
        wait.await;
        let overtook = self
            .in_flight
            .borrow()
            .first()
            .is_some_and(|first| *first < issue);
        drop(guard);
        if overtook {
            self.count(|counters| counters.reordered_completions += 1);
        }
    }

    fn draw_fault(&self, parts_per_million: u32, kind: FaultKind) -> bool {
        if parts_per_million == 0 {
            return false;
        }
        let hit = self.rng.borrow_mut().below(1_000_000) < parts_per_million as u64;
        if hit {
            self.count(|counters| {
                counters.injected_faults += 1;
                match kind {
                    FaultKind::ReadError => counters.read_errors += 1,
                    FaultKind::ReadCorruption => counters.read_corruptions += 1,
                    FaultKind::WriteError => counters.write_errors += 1,
                    FaultKind::WriteCorruption => counters.write_corruptions += 1,
                    FaultKind::Misdirected => counters.misdirected_writes += 1,
                    FaultKind::NoSpace => counters.nospace_errors += 1,
                }
            });
        }
        hit
    }

    /// Where a misdirected write of `length` bytes meant for `offset` lands: a
    /// nearby sector-aligned offset (a wrong LBA) that fits on the device and
    /// differs from the intended one.
    fn misdirect(&self, offset: u64, length: u64) -> u64 {
        let sector = SIM_SECTOR_BYTES as u64;
        let sectors = self.info.size_bytes / sector;
        let wanted = offset / sector;
        let span = length.div_ceil(sector);
        let mut rng = self.rng.borrow_mut();
        let distance = 1 + rng.below(64);
        let target = if rng.chance(1, 2) {
            wanted.saturating_add(distance)
        } else {
            wanted.saturating_sub(distance)
        };
        let target = target.min(sectors.saturating_sub(span));
        if target == wanted {
            // Pinned against an end of the device: go the other way.
            return if wanted >= distance {
                (wanted - distance) * sector
            } else {
                (wanted + distance).min(sectors - span) * sector
            };
        }
        target * sector
    }

    fn count(&self, update: impl FnOnce(&mut SimCounters)) {
        let mut counters = self.counters.get();
        update(&mut counters);
        self.counters.set(counters);
    }
}

fn apply(durable: &mut BTreeMap<u64, Box<[u8]>>, offset: u64, data: &[u8]) {
    for (index, sector) in data.chunks(SIM_SECTOR_BYTES).enumerate() {
        let sector_number = offset / SIM_SECTOR_BYTES as u64 + index as u64;
        durable.insert(sector_number, sector.to_vec().into_boxed_slice());
    }
}

fn read_durable(durable: &BTreeMap<u64, Box<[u8]>>, offset: u64, out: &mut [u8]) {
    for (index, chunk) in out.chunks_mut(SIM_SECTOR_BYTES).enumerate() {
        let sector_number = offset / SIM_SECTOR_BYTES as u64 + index as u64;
        match durable.get(&sector_number) {
            Some(sector) => chunk.copy_from_slice(&sector[..chunk.len()]),
            None => chunk.fill(0),
        }
    }
}

/// Copies the part of a pending write at `write_offset` that overlaps `out` (at `offset`).
fn overlay(out: &mut [u8], offset: u64, write_offset: u64, data: &[u8]) {
    let start = offset.max(write_offset);
    let end = (offset + out.len() as u64).min(write_offset + data.len() as u64);
    if start >= end {
        return;
    }
    let length = (end - start) as usize;
    out[(start - offset) as usize..][..length]
        .copy_from_slice(&data[(start - write_offset) as usize..][..length]);
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn read(
        &self,
        offset: u64,
        mut buffers: Vec<AlignedBuf>,
    ) -> DeviceFuture<'_, (Result<(), DeviceError>, Vec<AlignedBuf>)> {
        Box::pin(async move {
            if let Err(error) = check_range(
                &self.info,
                offset,
                buffers.iter().map(|buffer| buffer.len()),
            ) {
                return (Err(error), buffers);
            }
            self.spend_latency().await;
            self.count(|counters| counters.reads += 1);
            let faults = self.faults.borrow().clone();
            if faults.offline {
                self.count(|counters| counters.offline_errors += 1);
                return (Err(DeviceError::Missing), buffers);
            }
            if self.draw_fault(faults.read_error_ppm, FaultKind::ReadError) {
                return (Err(DeviceError::Io("simulated read error".into())), buffers);
            }
            let mut position = offset;
            for buffer in buffers.iter_mut() {
                let contents = self.peek(position, buffer.len());
                buffer.copy_from_slice(&contents);
                position += buffer.len() as u64;
            }
            if self.draw_fault(faults.read_corruption_ppm, FaultKind::ReadCorruption) {
                let total: usize = buffers.iter().map(|buffer| buffer.len()).sum();
                if total > 0 {
                    let mut bit = self.rng.borrow_mut().below(total as u64 * 8) as usize;
                    for buffer in buffers.iter_mut() {
                        if bit < buffer.len() * 8 {
                            buffer[bit / 8] ^= 1 << (bit % 8);
                            break;
                        }
                        bit -= buffer.len() * 8;
                    }
                }
            }
            (Ok(()), buffers)
        })
    }

    fn write(
        &self,
        offset: u64,
        slices: Vec<BufSlice>,
        durable: bool,
    ) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            check_range(&self.info, offset, slices.iter().map(|slice| slice.len()))?;
            self.spend_latency().await;
            self.count(|counters| {
                counters.writes += 1;
                counters.durable_writes += durable as u64;
            });
            let faults = self.faults.borrow().clone();
            if faults.offline {
                self.count(|counters| counters.offline_errors += 1);
                return Err(DeviceError::Missing);
            }
            if self.draw_fault(faults.write_error_ppm, FaultKind::WriteError) {
                return Err(DeviceError::Io("simulated write error".into()));
            }
            if self.draw_fault(faults.write_nospace_ppm, FaultKind::NoSpace) {
                return Err(DeviceError::Io(
                    "simulated ENOSPC: no space left on device".into(),
                ));
            }
            let mut data: Vec<u8> =
                Vec::with_capacity(slices.iter().map(|slice| slice.len()).sum());
            for slice in &slices {
                data.extend_from_slice(slice);
            }
            if !data.is_empty()
                && self.draw_fault(faults.write_corruption_ppm, FaultKind::WriteCorruption)
            {
                let bit = self.rng.borrow_mut().below(data.len() as u64 * 8) as usize;
                data[bit / 8] ^= 1 << (bit % 8);
            }
            let mut landing = offset;
            if !data.is_empty()
                && self.draw_fault(faults.misdirected_write_ppm, FaultKind::Misdirected)
            {
                landing = self.misdirect(offset, data.len() as u64);
            }
            let mut media = self.media.borrow_mut();
            if durable {
                // On the media now. Older writes still in the cache hold these
                // bytes too where they overlap, so that neither a later flush
                // nor a crash that keeps them brings back what this replaced.
                for older in media.pending.iter_mut() {
                    overlay(&mut older.data, older.offset, landing, &data);
                }
                apply(&mut media.durable, landing, &data);
            } else {
                media.pending.push(PendingWrite {
                    offset: landing,
                    data,
                });
            }
            // The write reports success wherever it landed: that is the fault.
            Ok(())
        })
    }

    /// A discard is a write of zeros into the volatile cache: a crash before
    /// the next flush keeps each of its sectors or not, like any write (a
    /// device may also ignore a discard). It fails as writes do.
    fn trim(&self, offset: u64, length: u64) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            check_range(&self.info, offset, std::iter::once(length as usize))?;
            if !self.discard.get() {
                self.count(|counters| counters.refused_trims += 1);
                return Err(DeviceError::Unsupported {
                    path: self.info.path.clone(),
                });
            }
            self.spend_latency().await;
            self.count(|counters| counters.trims += 1);
            let faults = self.faults.borrow().clone();
            if faults.offline {
                self.count(|counters| counters.offline_errors += 1);
                return Err(DeviceError::Missing);
            }
            if self.draw_fault(faults.write_error_ppm, FaultKind::WriteError) {
                return Err(DeviceError::Io("simulated trim error".into()));
            }
            self.media.borrow_mut().pending.push(PendingWrite {
                offset,
                data: vec![0u8; length as usize],
            });
            Ok(())
        })
    }

    fn flush(&self) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            let covered = self.media.borrow().pending.len();
            self.spend_latency().await;
            self.count(|counters| counters.flushes += 1);
            if self.faults.borrow().offline {
                self.count(|counters| counters.offline_errors += 1);
                return Err(DeviceError::Missing);
            }
            self.flush_prefix(covered);
            Ok(())
        })
    }
}
