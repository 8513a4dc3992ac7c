//! Files and block devices through the io_uring core.
//!
//! Opened O_DIRECT (no page cache between the engine and the device: the engine
//! does its own caching of metadata and none of data) and locked with an exclusive
//! `flock`, so a second ironpool process — or a second pool — cannot open the same
//! device. Block devices are also opened O_EXCL, which the kernel enforces against
//! mounts and other exclusive openers.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{check_range, Device, DeviceError, DeviceFuture, DeviceInfo};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::uring;

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: no such file or device")]
    NotFound { path: String },
    #[error("{path}: permission denied")]
    PermissionDenied { path: String },
    #[error(
        "{path}: in use by another process (another ironpool server holds it, or it is mounted)"
    )]
    InUse { path: String },
    #[error("{path}: not a regular file or block device")]
    NotADevice { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// A file or block device driven by io_uring.
pub struct FileDevice {
    fd: OwnedFd,
    info: DeviceInfo,
    /// A block device (discarded with the block layer's discard) rather
    /// than a regular file (whose range is punched out).
    block: bool,
}

// ioctl numbers from <linux/fs.h>.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127b;

impl FileDevice {
    /// Opens `path` for direct I/O and takes an exclusive lock on it.
    pub fn open(path: &Path) -> Result<FileDevice, OpenError> {
        FileDevice::open_with(path, true)
    }

    /// Opens `path` read-only without locking it: to read labels while looking for
    /// a pool's devices, without disturbing the server that may hold them.
    pub fn open_for_probe(path: &Path) -> Result<FileDevice, OpenError> {
        FileDevice::open_with(path, false)
    }

    fn open_with(path: &Path, exclusive: bool) -> Result<FileDevice, OpenError> {
        let display = path.display().to_string();
        let metadata = std::fs::metadata(path).map_err(|error| map_open_error(&display, error))?;
        let is_block = std::os::unix::fs::FileTypeExt::is_block_device(&metadata.file_type());
        if !is_block && !metadata.is_file() {
            return Err(OpenError::NotADevice { path: display });
        }
        let c_path =
            CString::new(path.as_os_str().as_bytes()).map_err(|_| OpenError::NotFound {
                path: display.clone(),
            })?;
        let base_flags = if exclusive {
            libc::O_RDWR | if is_block { libc::O_EXCL } else { 0 }
        } else {
            libc::O_RDONLY
        } | libc::O_CLOEXEC;
        // SAFETY: c_path is a valid NUL-terminated string.
        let mut raw = unsafe { libc::open(c_path.as_ptr(), base_flags | libc::O_DIRECT) };
        let mut direct = true;
        if raw < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // The filesystem refuses O_DIRECT (rare today; old tmpfs). Buffered I/O
            // is still correct — fsync makes it durable — only slower; status
            // reports it so an operator knows.
            // SAFETY: as above.
            raw = unsafe { libc::open(c_path.as_ptr(), base_flags) };
            direct = false;
        }
        if raw < 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EBUSY) {
                return Err(OpenError::InUse { path: display });
            }
            return Err(map_open_error(&display, error));
        }
        // SAFETY: raw is a descriptor we just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: flock on a valid descriptor.
        if exclusive && unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(OpenError::InUse { path: display });
            }
            return Err(OpenError::Io {
                path: display,
                source: error,
            });
        }
        let info = if is_block {
            block_device_info(&fd, &display, direct)?
        } else {
            regular_file_info(&fd, &display, &metadata, direct)
        };
        Ok(FileDevice {
            fd,
            info,
            block: is_block,
        })
    }
}

fn map_open_error(path: &str, error: std::io::Error) -> OpenError {
    match error.kind() {
        std::io::ErrorKind::NotFound => OpenError::NotFound {
            path: path.to_string(),
        },
        std::io::ErrorKind::PermissionDenied => OpenError::PermissionDenied {
            path: path.to_string(),
        },
        _ => OpenError::Io {
            path: path.to_string(),
            source: error,
        },
    }
}

fn block_device_info(fd: &OwnedFd, path: &str, direct: bool) -> Result<DeviceInfo, OpenError> {
    let mut size: u64 = 0;
    let mut logical: libc::c_int = 512;
    let mut physical: libc::c_uint = 4096;
    // SAFETY: each ioctl writes one integer of the stated type into a local.
    unsafe {
        if libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) != 0 {
            return Err(OpenError::Io {
                path: path.to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        libc::ioctl(fd.as_raw_fd(), BLKSSZGET, &mut logical as *mut libc::c_int);
        libc::ioctl(
            fd.as_raw_fd(),
            BLKPBSZGET,
            &mut physical as *mut libc::c_uint,
        );
    }
    let rotational = rotational_flag(fd).unwrap_or(false);
    Ok(DeviceInfo {
        path: path.to_string(),
        size_bytes: size,
        logical_sector_bytes: logical.max(512) as u32,
        physical_sector_bytes: physical.max(logical as u32).max(512),
        rotational,
        direct,
    })
}

fn regular_file_info(
    fd: &OwnedFd,
    path: &str,
    metadata: &std::fs::Metadata,
    direct: bool,
) -> DeviceInfo {
    // Direct I/O on a file must be aligned to the filesystem's direct I/O unit;
    // statx tells it (Linux 6.1+), else assume 4 KiB, which every filesystem accepts.
    let alignment = dio_offset_alignment(fd).unwrap_or(4096).max(512);
    DeviceInfo {
        path: path.to_string(),
        size_bytes: metadata.len(),
        logical_sector_bytes: alignment,
        physical_sector_bytes: alignment.max(4096),
        rotational: false,
        direct,
    }
}

fn dio_offset_alignment(fd: &OwnedFd) -> Option<u32> {
    const STATX_DIOALIGN: u32 = 0x2000;
    // SAFETY: statx is plain old data; all zeroes is a valid value.
    let mut buffer: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: statx fills the struct, which outlives the call; an empty path
    // with AT_EMPTY_PATH refers to the open descriptor itself.
    let result = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_DIOALIGN,
            &mut buffer,
        )
    };
    if result != 0 || buffer.stx_mask & STATX_DIOALIGN == 0 || buffer.stx_dio_offset_align == 0 {
        return None;
    }
    Some(buffer.stx_dio_offset_align)
}

fn rotational_flag(fd: &OwnedFd) -> Option<bool> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat fills the struct, which outlives the call, for a
    // descriptor that is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return None;
    }
    let (major, minor) = (libc::major(stat.st_rdev), libc::minor(stat.st_rdev));
    let text =
        std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/rotational")).ok()?;
    Some(text.trim() == "1")
}

impl Device for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn read(
        &self,
        offset: u64,
        buffers: Vec<AlignedBuf>,
    ) -> DeviceFuture<'_, (Result<(), DeviceError>, Vec<AlignedBuf>)> {
        Box::pin(async move {
            let wanted = match check_range(
                &self.info,
                offset,
                buffers.iter().map(|buffer| buffer.len()),
            ) {
                Ok(total) => total as usize,
                Err(error) => return (Err(error), buffers),
            };
            let _io = uring::DeviceIo::start();
            let (result, buffers) = if buffers.len() == 1 {
                let mut buffers = buffers;
                let buffer = buffers.pop().expect("one buffer");
                let (result, buffer) = uring::read_at(self.fd.as_raw_fd(), buffer, offset).await;
                (result, vec![buffer])
            } else {
                uring::readv_at(self.fd.as_raw_fd(), buffers, offset).await
            };
            let result = match result {
                Ok(done) if done == wanted => Ok(()),
                Ok(done) => Err(DeviceError::Short { done, wanted }),
                Err(error) => Err(DeviceError::from(error)),
            };
            (result, buffers)
        })
    }

    fn write(
        &self,
        offset: u64,
        slices: Vec<BufSlice>,
        durable: bool,
    ) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            let wanted =
                check_range(&self.info, offset, slices.iter().map(|slice| slice.len()))? as usize;
            let _io = uring::DeviceIo::start();
            let flags = if durable { libc::RWF_DSYNC } else { 0 };
            let done = uring::writev_at_with(self.fd.as_raw_fd(), slices, offset, flags)
                .await
                .map_err(|error| DeviceError::from_io(&self.info.path, error))?;
            if done != wanted {
                return Err(DeviceError::Short { done, wanted });
            }
            Ok(())
        })
    }

    fn flush(&self) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            let _io = uring::DeviceIo::start();
            uring::fsync(self.fd.as_raw_fd(), true)
                .await
                .map_err(|error| DeviceError::from_io(&self.info.path, error))?;
            Ok(())
        })
    }

    fn trim(&self, offset: u64, length: u64) -> DeviceFuture<'_, Result<(), DeviceError>> {
        Box::pin(async move {
            check_range(&self.info, offset, std::iter::once(length as usize))?;
            let fd = self.fd.as_raw_fd();
            let result = if self.block {
                uring::block_discard(fd, offset, length).await
            } else {
                uring::punch_hole(fd, offset, length).await
            };
            result.map_err(|error| match error.raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOTTY) => {
                    DeviceError::Unsupported {
                        path: self.info.path.clone(),
                    }
                }
                _ => DeviceError::from_io(&self.info.path, error),
            })
        })
    }
}
