//! Helpers for tests of mounted filesystems: the server's FUSE mounts and
//! extended attributes through the kernel.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{dir, TestPool};

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

/// Whether a FUSE filesystem at `path` answers a `statfs` (which the
/// kernel always asks the server, where a `stat` may be answered from
/// its cache). The type is checked because a new server detaches the dead
/// mount a killed one left: between that and its own mount, `path` is the
/// bare directory below, which answers too (a test once read its files
/// there and found none).
fn answers(path: &Path) -> bool {
    /// `FUSE_SUPER_MAGIC` of linux/magic.h: the `f_type` of every FUSE mount.
    const FUSE_SUPER_MAGIC: libc::__fsword_t = 0x6573_5546;
    let path = c_string(&path.display().to_string());
    // SAFETY: a NUL-terminated path and a zeroed statfs to fill.
    unsafe {
        let mut stats: libc::statfs = std::mem::zeroed();
        libc::statfs(path.as_ptr(), &mut stats) == 0 && stats.f_type == FUSE_SUPER_MAGIC
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

/// Detaches the test's mount when the test ends, passed or not, so that a
/// failed test leaves no mount behind (a dead one answers ENOTCONN).
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let path = std::ffi::CString::new(self.0.display().to_string()).unwrap();
            // SAFETY: a NUL-terminated path; umount2 reads it only.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// A served mirrored pool with filesystem `fs` mounted (as
/// `filesystem_pool` makes it), and the guard that unmounts it at the end.
pub fn served_filesystem(name: &str) -> (TestPool, PathBuf, Unmount) {
    let (mut pool, mnt) = filesystem_pool(name);
    let unmount = Unmount(mnt.clone());
    pool.serve();
    wait_mounted(&pool, &mnt);
    (pool, mnt, unmount)
}

/// Waits (10 s at most, else fails saying `what`) until nothing is
/// mounted at `path`.
pub fn wait_unmounted(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while mounted(path) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn filesystem_pool(name: &str) -> (TestPool, PathBuf) {
    let pool = TestPool::new(name);
    let mountpoint = pool.path("mnt");
    filesystem_pool_at(pool, mountpoint)
}

/// A mirrored pool with filesystem `fs` mounting at `mountpoint`.
pub fn filesystem_pool_at(pool: TestPool, mountpoint: PathBuf) -> (TestPool, PathBuf) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests need /dev/fuse (the FUSE module) and root"
    );
    pool.create("2G", &["mirror", "a.img", "b.img"]);
    create_filesystem(&pool, "fs", &mountpoint, &["recordsize=16K"]);
    (pool, mountpoint)
}

/// Creates filesystem `POOL/name` of the pool (not being served), mounting
/// at `mountpoint`, with `properties` (`NAME=VALUE` each).
pub fn create_filesystem(pool: &TestPool, name: &str, mountpoint: &Path, properties: &[&str]) {
    let target = format!("{}/{name}", pool.name);
    let mountpoint = format!("mountpoint={}", mountpoint.display());
    let directory = dir(pool);
    let mut args = vec!["fs", "create", &target, "-o", &mountpoint];
    for property in properties {
        args.extend(["-o", property]);
    }
    args.extend(["-d", &directory]);
    pool.ok(&args);
}

pub fn listed_filesystem(pool: &TestPool) -> serde_json::Value {
    let text = pool.admin(&["--json", "fs", "list", &pool.name]);
    let list: serde_json::Value = serde_json::from_str(&text).expect("fs list JSON");
    list["filesystems"]
        .as_array()
        .expect("filesystems")
        .iter()
        .find(|fs| fs["name"] == format!("{}/fs", pool.name))
        .expect("the filesystem is listed")
        .clone()
}

pub fn fs_objects(pool: &TestPool) -> u64 {
    listed_filesystem(pool)["objects"]
        .as_u64()
        .expect("objects")
}

pub fn wait_objects(pool: &TestPool, wanted: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs_objects(pool) != wanted {
        assert!(
            Instant::now() < deadline,
            "{} objects, waited for {wanted}",
            fs_objects(pool)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first filesystem's intent log commits and txg fallbacks
/// (`iostat --json`).
pub fn fs_log_stats(pool: &TestPool) -> (u64, u64) {
    let stats: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).unwrap();
    let log = &stats["filesystems"][0]["intent_log"];
    (
        log["commits"].as_u64().unwrap(),
        log["txg_fallbacks"].as_u64().unwrap(),
    )
}
