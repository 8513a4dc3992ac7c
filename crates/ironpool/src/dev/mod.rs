//! Leaf devices: the only code that touches storage.
//!
//! A [`Device`] reads and writes sector-aligned ranges and flushes its volatile
//! cache, asynchronously. Two implementations share the trait, so the same engine
//! code runs on both:
//! - [`file::FileDevice`]: a regular file or a block device, opened O_DIRECT and
//!   locked, driven by the io_uring core.
//! - [`sim::SimDevice`]: memory with a volatile write cache, seeded latency and
//!   injectable faults, for deterministic tests (crashes lose unflushed writes).

pub mod file;
pub mod sim;

use std::future::Future;
use std::pin::Pin;

use crate::rt::buf::{AlignedBuf, BufSlice};

/// A boxed future borrowing the device.
pub type DeviceFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What the engine needs to know about a device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Where the device was opened from (or `sim:N`).
    pub path: String,
    /// Usable size in bytes.
    pub size_bytes: u64,
    /// Smallest aligned unit of direct I/O (the logical sector).
    pub logical_sector_bytes: u32,
    /// The device's physical sector (ashift is chosen from this).
    pub physical_sector_bytes: u32,
    /// True for spinning disks (affects aggregation limits).
    pub rotational: bool,
    /// True when the device bypasses the page cache (O_DIRECT engaged).
    pub direct: bool,
}

/// Why a device operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("I/O error: {0}")]
    Io(String),
    #[error("short transfer: {done} of {wanted} bytes")]
    Short { done: usize, wanted: usize },
    #[error("range {offset}+{length} is outside the device ({size} bytes)")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("device is not available")]
    Missing,
    /// The filesystem holding a device file is full (ENOSPC, EDQUOT): the
    /// device itself is fine, its reads work, and writes work again once
    /// space is freed. It must never fault the device.
    #[error("the filesystem holding {path} is full (no space left on device): free space there, then run `ironpool clear`")]
    NoSpace { path: String },
    /// The device (or the filesystem holding the file) has no discard.
    #[error("{path} does not support discard (TRIM)")]
    Unsupported { path: String },
}

impl DeviceError {
    /// The error of a failed I/O on the device at `path`: ENOSPC and EDQUOT
    /// become [`DeviceError::NoSpace`], everything else an I/O error.
    pub fn from_io(path: &str, error: std::io::Error) -> DeviceError {
        match error.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => DeviceError::NoSpace {
                path: path.to_string(),
            },
            _ => DeviceError::Io(error.to_string()),
        }
    }

    /// True for a full host filesystem (see [`DeviceError::NoSpace`]).
    pub fn is_no_space(&self) -> bool {
        matches!(self, DeviceError::NoSpace { .. })
    }
}

impl From<std::io::Error> for DeviceError {
    fn from(error: std::io::Error) -> DeviceError {
        DeviceError::Io(error.to_string())
    }
}

/// A leaf device. Offsets and lengths are multiples of `logical_sector_bytes`, and
/// buffers are aligned (callers guarantee it; implementations assert it).
pub trait Device {
    fn info(&self) -> &DeviceInfo;

    /// Reads into `buffers`, in order, starting at `offset` (one vectored I/O).
    fn read(
        &self,
        offset: u64,
        buffers: Vec<AlignedBuf>,
    ) -> DeviceFuture<'_, (Result<(), DeviceError>, Vec<AlignedBuf>)>;

    /// Writes `slices`, in order, starting at `offset` (one vectored I/O).
    /// With `durable`, the bytes are durable when it completes (a FUA write,
    /// `RWF_DSYNC`): no flush is needed for them. A log commit writes its
    /// blocks so, and the kernel makes them durable on its own way back
    /// instead of the engine waking once for the write and once more for a
    /// flush.
    fn write(
        &self,
        offset: u64,
        slices: Vec<BufSlice>,
        durable: bool,
    ) -> DeviceFuture<'_, Result<(), DeviceError>>;

    /// Makes every write completed before this call durable.
    fn flush(&self) -> DeviceFuture<'_, Result<(), DeviceError>>;

    /// Tells the device `length` bytes at `offset` hold nothing worth
    /// keeping (TRIM): a file gives the space back to its filesystem, an SSD
    /// or thin volume to its pool. Afterwards the range may read as zeros or
    /// as its old bytes; like a write, it may be lost by a crash before a
    /// flush. [`DeviceError::Unsupported`] when the device cannot.
    fn trim(&self, offset: u64, length: u64) -> DeviceFuture<'_, Result<(), DeviceError>>;
}

/// Checks that an I/O is inside the device and aligned; returns its length.
pub(crate) fn check_range(
    info: &DeviceInfo,
    offset: u64,
    lengths: impl Iterator<Item = usize>,
) -> Result<u64, DeviceError> {
    let mut total = 0u64;
    for length in lengths {
        assert!(
            (length as u64).is_multiple_of(info.logical_sector_bytes as u64),
            "unaligned I/O length {length} on {}",
            info.path
        );
        total += length as u64;
    }
    assert!(
        offset.is_multiple_of(info.logical_sector_bytes as u64),
        "unaligned I/O offset {offset} on {}",
        info.path
    );
    if offset
        .checked_add(total)
        .is_none_or(|end| end > info.size_bytes)
    {
        return Err(DeviceError::OutOfRange {
            offset,
            length: total,
            size: info.size_bytes,
        });
    }
    Ok(total)
}
