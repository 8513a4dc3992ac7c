//! Helpers for tests of mounted filesystems: the server's FUSE mounts and
//! extended attributes through the kernel.

use std::path::Path;
use std::time::{Duration, Instant};

use super::TestPool;

/// The fields of the line of /proc/self/mounts for the ironpool mount at
/// `path` (the newest, if several), if there is one.
pub fn ironpool_mount(path: &Path) -> Option<Vec<String>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let wanted = path.display().to_string();
    mounts
        .lines()
        .rev()
        .map(|line| line.split(' ').map(str::to_string).collect::<Vec<_>>())
        .find(|fields| {
            fields.get(1) == Some(&wanted)
                && fields.get(2).map(String::as_str) == Some("fuse.ironpool")
        })
}

pub fn mounted(path: &Path) -> bool {
    ironpool_mount(path).is_some()
}

/// Whether the filesystem mounted at `path` answers a `statfs` (which the
/// kernel always asks the server, where a `stat` may be answered from
/// its cache).
fn answers(path: &Path) -> bool {
    let path = c_string(&path.display().to_string());
    // SAFETY: a NUL-terminated path and a zeroed statvfs to fill.
    unsafe {
        let mut stats: libc::statvfs = std::mem::zeroed();
        libc::statvfs(path.as_ptr(), &mut stats) == 0
    }
}

/// Waits until `path` is an ironpool mount that answers: a mount left dead
/// by a killed server is listed too until the next server replaces it, and
/// answers `ENOTCONN` meanwhile.
pub fn wait_mounted(pool: &TestPool, path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mounted(path) || !answers(path) {
        assert!(
            Instant::now() < deadline,
            "{} not mounted: {}",
            path.display(),
            pool.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn c_string(text: &str) -> std::ffi::CString {
    std::ffi::CString::new(text).unwrap()
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let (path, name) = (c_string(&path.display().to_string()), c_string(name));
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let result = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

pub fn get_xattr(path: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (path, name) = (c_string(&path.display().to_string()), c_string(name));
    // SAFETY: a size of 0 asks for the length and writes nothing.
    let length = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if length < 0 {
        return Err(errno());
    }
    let mut value = vec![0u8; length as usize];
    // SAFETY: the buffer is as long as the length passed.
    let read = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if read < 0 {
        return Err(errno());
    }
    value.truncate(read as usize);
    Ok(value)
}

pub fn list_xattrs(path: &Path) -> Result<Vec<String>, i32> {
    let path = c_string(&path.display().to_string());
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is as long as the length passed.
    let length = unsafe { libc::listxattr(path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if length < 0 {
        return Err(errno());
    }
    names.truncate(length as usize);
    Ok(names
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect())
}

pub fn remove_xattr(path: &Path, name: &str) -> Result<(), i32> {
    let (path, name) = (c_string(&path.display().to_string()), c_string(name));
    // SAFETY: NUL-terminated strings.
    if unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}
