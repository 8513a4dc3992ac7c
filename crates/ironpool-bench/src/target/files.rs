//! Facts about files, block devices and the filesystems under them: the
//! filesystem type and source (from /proc/self/mountinfo), free space
//! (statvfs), never-written ranges (SEEK_DATA/SEEK_HOLE) and sizes.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// ext4, xfs, btrfs, zfs, tmpfs, …
    pub fs_type: String,
    /// The device, or for ZFS the dataset (`tank/data`).
    pub source: String,
}

impl MountEntry {
    /// The ZFS pool of a ZFS mount: the first component of the dataset.
    pub fn zfs_pool(&self) -> Option<String> {
        (self.fs_type == "zfs").then(|| {
            self.source
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string()
        })
    }
}

/// Parses /proc/self/mountinfo (see proc(5)): `… mount_point … - fs_type source …`.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            Some(MountEntry {
                mount_point: PathBuf::from(unescape_octal(mount_point)),
                fs_type: right.next()?.to_string(),
                source: unescape_octal(right.next()?),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\040` etc.
fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount that holds `path`: the last-mounted entry whose mount point is
/// the longest prefix of the canonical path.
pub fn find_mount<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.mount_point))
        .max_by_key(|(index, e)| (e.mount_point.as_os_str().len(), *index))
        .map(|(_, e)| e)
}

/// The mount holding `path` on this machine.
pub fn mount_of(path: &Path) -> Result<Option<MountEntry>> {
    let canonical = path
        .canonicalize()
        .with_context(|| format!("resolving {}", path.display()))?;
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(find_mount(&parse_mountinfo(&text), &canonical).cloned())
}

/// Whether a loop device (`/dev/loop3`) does direct I/O to its backing
/// file; `None` when `device` is not a loop device or the kernel does not say.
pub fn loop_direct_io(device: &str) -> Option<bool> {
    let name = device.strip_prefix("/dev/")?;
    if !name.starts_with("loop") {
        return None;
    }
    let flag = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).ok()?;
    Some(flag.trim() == "1")
}

/// Used space of the filesystem holding `path`, as df computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
}

impl FsSpace {
    /// df's Use%: used over used plus available.
    pub fn used_percent(&self) -> f64 {
        let total = self.used_bytes + self.available_bytes;
        if total == 0 {
            0.0
        } else {
            100.0 * self.used_bytes as f64 / total as f64
        }
    }

    /// The capacity df's Use% is relative to.
    pub fn capacity_bytes(&self) -> u64 {
        self.used_bytes + self.available_bytes
    }
}

/// statvfs of the filesystem holding `path`.
pub fn fs_space(path: &Path) -> Result<FsSpace> {
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_bytes()).context("path contains a NUL byte")?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stat a writable
    // statvfs that outlives the call.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    let fragment = stat.f_frsize as u64;
    Ok(FsSpace {
        used_bytes: (stat.f_blocks as u64).saturating_sub(stat.f_bfree as u64) * fragment,
        available_bytes: stat.f_bavail as u64 * fragment,
    })
}

/// Bytes of `[0, size)` that are holes or unwritten extents, found with
/// SEEK_DATA/SEEK_HOLE (filesystems without support report no holes).
pub fn hole_bytes(path: &Path, size_bytes: u64) -> Result<u64> {
    let file = File::open(path)
        .with_context(|| format!("opening {} to look for holes", path.display()))?;
    let fd = file.as_raw_fd();
    let mut holes = 0u64;
    let mut offset = 0u64;
    while offset < size_bytes {
        // SAFETY: lseek on an fd we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, offset as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENXIO) {
                // No data after `offset`: the rest is a hole.
                return Ok(holes + (size_bytes - offset));
            }
            return Err(error).with_context(|| format!("SEEK_DATA on {}", path.display()));
        }
        let data = (data as u64).min(size_bytes);
        holes += data - offset;
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("SEEK_HOLE on {}", path.display()));
        }
        offset = (hole as u64).max(data + 1);
    }
    Ok(holes)
}

/// True for a block device.
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

/// Size of a block device or file, by seeking to its end.
pub fn device_size(path: &Path) -> Result<u64> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(SeekFrom::End(0))
        .with_context(|| format!("finding the size of {}", path.display()))
}

/// st_blksize: the filesystem's preferred I/O size for the file (the
/// recordsize on ZFS, the block size elsewhere).
pub fn preferred_block_size(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .blksize())
}

/// Creates (or truncates to) a sparse file of `size_bytes`; refuses block
/// devices and directories.
pub fn create_sparse(path: &Path, size_bytes: u64) -> Result<()> {
    if path.is_dir() {
        bail!("{} is a directory", path.display());
    }
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.set_len(size_bytes)
        .with_context(|| format!("sizing {} to {size_bytes} bytes", path.display()))
}

/// Removes a file we created; a missing file is fine.
pub fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("removing {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /tank rw shared:20 - zfs tank rw,xattr
41 40 0:36 / /tank/my\\040data rw shared:21 - zfs tank/my\\040data rw,xattr
50 22 0:40 / /mnt rw - tmpfs tmpfs rw
";

    #[test]
    fn finds_the_mount_of_a_path() {
        let entries = parse_mountinfo(MOUNTINFO);
        assert_eq!(entries.len(), 4);
        let mount = find_mount(&entries, Path::new("/tank/my data/f.img")).unwrap();
        assert_eq!(mount.fs_type, "zfs");
        assert_eq!(mount.source, "tank/my data");
        assert_eq!(mount.zfs_pool().as_deref(), Some("tank"));
        assert_eq!(
            find_mount(&entries, Path::new("/work/x")).unwrap().fs_type,
            "ext4"
        );
        assert_eq!(
            find_mount(&entries, Path::new("/mntx")).unwrap().fs_type,
            "ext4"
        );
        assert_eq!(
            find_mount(&entries, Path::new("/mnt/y"))
                .unwrap()
                .zfs_pool(),
            None
        );
    }

    #[test]
    fn counts_holes() {
        let path =
            std::env::temp_dir().join(format!("ironpool-bench-holes-{}", std::process::id()));
        create_sparse(&path, 1 << 20).unwrap();
        assert_eq!(hole_bytes(&path, 1 << 20).unwrap(), 1 << 20);
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        assert_eq!(hole_bytes(&path, 1 << 20).unwrap(), 0);
        assert_eq!(device_size(&path).unwrap(), 1 << 20);
        remove_if_present(&path).unwrap();
        remove_if_present(&path).unwrap();
    }
}
