//! A simulated device: memory with a volatile write cache, seeded latency and
//! injectable faults.
//!
//! Writes land in a volatile cache (a log of pending writes, in order); a flush
//! makes every pending write durable. A [`SimDevice::crash`] keeps a random subset
//! of the pending sectors (each pending write may be lost, kept, or torn at a
//! sector boundary; a later write may survive while an earlier one to the same
//! sector is lost, as with a real reordering cache) and drops the rest. Latency is
//! drawn from the device's own seeded generator and spent in virtual time, so
//! concurrent I/Os complete in a seed-determined order.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
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
    /// Every operation fails: the device has vanished.
    pub offline: bool,
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
        SimLatency { minimum_us: 20, maximum_us: 200, spike_every: 500, spike_us: 5_000 }
    }
}

struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

struct Media {
    /// Durable sectors (absent = zero).
    durable: HashMap<u64, Box<[u8]>>,
    /// Writes completed but not yet flushed, oldest first.
    pending: Vec<PendingWrite>,
}

/// Counters of what the device did, for test assertions.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub injected_faults: u64,
}

pub struct SimDevice {
    info: DeviceInfo,
    media: RefCell<Media>,
    rng: RefCell<Rng>,
    faults: RefCell<SimFaults>,
    latency: Cell<SimLatency>,
    counters: Cell<SimCounters>,
}

impl SimDevice {
    pub fn new(name: &str, size_bytes: u64, seed: u64) -> Rc<SimDevice> {
        assert!(size_bytes % SIM_SECTOR_BYTES as u64 == 0);
        Rc::new(SimDevice {
            info: DeviceInfo {
                path: format!("sim:{name}"),
                size_bytes,
                logical_sector_bytes: SIM_SECTOR_BYTES as u32,
                physical_sector_bytes: SIM_SECTOR_BYTES as u32,
                rotational: false,
                direct: true,
            },
            media: RefCell::new(Media { durable: HashMap::new(), pending: Vec::new() }),
            rng: RefCell::new(Rng::new(seed)),
            faults: RefCell::new(SimFaults::default()),
            latency: Cell::new(SimLatency::default()),
            counters: Cell::new(SimCounters::default()),
        })
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
                    media.durable.insert(sector_number, sector.to_vec().into_boxed_slice());
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
            let sector = media.durable.entry(sector_number).or_insert_with(|| vec![0u8; SIM_SECTOR_BYTES].into_boxed_slice());
            let within = (position % SIM_SECTOR_BYTES as u64) as usize;
            sector[within] ^= 1 << rng.below(8);
            position += 1;
        }
    }

    /// Makes every pending write durable immediately (outside any I/O).
    pub fn flush_now(&self) {
        let mut media = self.media.borrow_mut();
        let pending = std::mem::take(&mut media.pending);
        for write in pending {
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
        }
        Duration::from_micros(micros)
    }

    fn draw_fault(&self, parts_per_million: u32) -> bool {
        if parts_per_million == 0 {
            return false;
        }
        let hit = self.rng.borrow_mut().below(1_000_000) < parts_per_million as u64;
        if hit {
            let mut counters = self.counters.get();
            counters.injected_faults += 1;
            self.counters.set(counters);
        }
        hit
    }

    fn count(&self, update: impl FnOnce(&mut SimCounters)) {
        let mut counters = self.counters.get();
        update(&mut counters);
        self.counters.set(counters);
    }
}

fn apply(durable: &mut HashMap<u64, Box<[u8]>>, offset: u64, data: &[u8]) {
    for (index, sector) in data.chunks(SIM_SECTOR_BYTES).enumerate() {
        let sector_number = offset / SIM_SECTOR_BYTES as u64 + index as u64;
        durable.insert(sector_number, sector.to_vec().into_boxed_slice());
    }
}

fn read_durable(durable: &HashMap<u64, Box<[u8]>>, offset: u64, out: &mut [u8]) {
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
    out[(start - offset) as usize..][..length].copy_from_slice(&data[(start - write_offset) as usize..][..length]);
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn read(&self, offset: u64, mut buffers: Vec<AlignedBuf>) -> DeviceFuture<'_, (Result<(), DeviceError>, Vec<AlignedBuf>)> {
        Box::pin(async move {
            if let Err(error) = check_range(&self.info, offset, buffers.iter().map(|buffer| buffer.len())) {
                return (Err(error), buffers);
            }
            crate::rt::sleep(self.draw_latency()).await;
            self.count(|counters| counters.reads += 1);
            let faults = self.faults.borrow().clone();
            if faults.offline {
                return (Err(DeviceError::Missing), buffers);
            }
            if self.draw_fault(faults.read_error_ppm) {
                return (Err(DeviceError::Io("simulated read error".into())), buffers);
            }
            let mut position = offset;
            for buffer in buffers.iter_mut() {
                let contents = self.peek(position, buffer.len());
                buffer.copy_from_slice(&contents);
                position += buffer.len() as u64;
            }
            if self.draw_fault(faults.read_corruption_ppm) {
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

    fn write(&self, offset: u64, slices: Vec<BufSlice>) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            check_range(&self.info, offset, slices.iter().map(|slice| slice.len()))?;
            crate::rt::sleep(self.draw_latency()).await;
            self.count(|counters| counters.writes += 1);
            let faults = self.faults.borrow().clone();
            if faults.offline {
                return Err(DeviceError::Missing);
            }
            if self.draw_fault(faults.write_error_ppm) {
                return Err(DeviceError::Io("simulated write error".into()));
            }
            let mut data: Vec<u8> = Vec::with_capacity(slices.iter().map(|slice| slice.len()).sum());
            for slice in &slices {
                data.extend_from_slice(slice);
            }
            if !data.is_empty() && self.draw_fault(faults.write_corruption_ppm) {
                let bit = self.rng.borrow_mut().below(data.len() as u64 * 8) as usize;
                data[bit / 8] ^= 1 << (bit % 8);
            }
            self.media.borrow_mut().pending.push(PendingWrite { offset, data });
            Ok(())
        })
    }

    fn flush(&self) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            crate::rt::sleep(self.draw_latency()).await;
            self.count(|counters| counters.flushes += 1);
            if self.faults.borrow().offline {
                return Err(DeviceError::Missing);
            }
            self.flush_now();
            Ok(())
        })
    }
}
