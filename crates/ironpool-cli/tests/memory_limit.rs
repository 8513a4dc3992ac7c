//! The read cache under a real cgroup memory limit: a served pool whose
//! reads would cache more than the server may use keeps its cache inside
//! the limit (the memory watcher reads the cgroup's limit and usage) and is
//! not killed by the kernel's out-of-memory handling, while every read stays
//! right.
//!
//! The test makes a child memory cgroup under its own (cgroup v1's memory
//! controller, or v2's when the unified hierarchy has it), moves the server
//! into it, and removes it at the end. It needs root and a writable cgroup
//! filesystem, as CI's machines have; it fails, not skips, without them.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// The server's memory limit: well below the volume the reads cover, so a
/// cache that ignored it would be killed.
const LIMIT_BYTES: u64 = 640 << 20;

/// How near the limit the server's peak may come: the headroom the memory
/// watcher keeps (at least 128 MiB) less what one sequential reader takes
/// between two checks (measured 45 to 60 MB).
const NEAR_LIMIT_BYTES: u64 = 32 << 20;

/// A memory cgroup made for the test, removed when dropped.
struct MemoryGroup {
    dir: PathBuf,
    /// Cgroup v1's memory controller, whose files have v1's names
    /// (`memory.limit_in_bytes`, `memory.oom_control`,
    /// `memory.max_usage_in_bytes`) rather than v2's.
    v1: bool,
}

impl MemoryGroup {
    fn new(name: &str, limit: u64) -> MemoryGroup {
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mut made = None;
        for line in membership.lines() {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (
                fields.next().unwrap(),
                fields.next().unwrap_or(""),
                fields.next().unwrap_or("").trim_start_matches('/'),
            );
            if controllers.split(',').any(|name| name == "memory") {
                made = Some((Path::new("/sys/fs/cgroup/memory").join(path), true));
                break;
            }
            if controllers.is_empty() {
                for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                    let parent = Path::new(root).join(path);
                    let offered = std::fs::read_to_string(parent.join("cgroup.controllers"))
                        .unwrap_or_default();
                    if offered.split_whitespace().any(|name| name == "memory") {
                        let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
                        made = Some((parent, false));
                    }
                }
            }
        }
        let (parent, v1) = made.expect("no memory cgroup controller on this machine");
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|error| panic!("cannot make {}: {error}", dir.display()));
        let group = MemoryGroup { dir, v1 };
        let limit_file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(group.dir.join(limit_file), limit.to_string()).unwrap();
        group
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn read(&self, v1: &str, v2: &str) -> String {
        let file = if self.v1 { v1 } else { v2 };
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Times the group was out of memory and the kernel killed in it.
    fn oom_kills(&self) -> u64 {
        let events = self.read("memory.oom_control", "memory.events");
        events
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .map_or(0, |count| count.trim().parse().unwrap())
    }

    fn peak_bytes(&self) -> u64 {
        let text = self.read("memory.max_usage_in_bytes", "memory.peak");
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("no memory peak in {}: {text:?}", self.dir.display()))
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn the_cache_stays_inside_a_cgroup_memory_limit_and_the_server_lives() {
    // Made first, so that it is removed after the server (dropped with the
    // pool) has left it.
    let group = MemoryGroup::new("ironpool-memlimit", LIMIT_BYTES);
    let mut pool = TestPool::new("memlimit");
    pool.create("3G", &["a.img"]);
    pool.create_volume("v", "1G");
    pool.serve();
    let pid: u32 = std::fs::read_to_string(pool.path("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    group.add(pid);
    let uri = pool.uri("v");
    qemu_io(&uri, &["write -P 0x5a 0 1G", "flush"]);
    // Random 16K reads over the whole volume: each block read is cached
    // (random reads are not dropped behind), so the cache wants 1 GiB.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(12);
    let mut largest = 0;
    let mut limited = false;
    while Instant::now() < deadline {
        tool(
            "fio",
            &[
                "--name=fill-cache",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randread",
                "--bs=16k",
                "--size=1G",
                "--iodepth=16",
                "--runtime=2",
                "--time_based",
            ],
        );
        let stats: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "arcstat", &pool.name])).unwrap();
        let size = stats["cache"]["size_bytes"].as_u64().unwrap();
        largest = largest.max(size);
        limited |= stats["cache"]["memory_limit_bytes"].as_u64().unwrap() < LIMIT_BYTES;
    }
    assert_eq!(group.oom_kills(), 0, "the kernel killed in the group");
    assert!(
        pool.server.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the server died: {}",
        pool.log()
    );
    assert!(
        limited,
        "the watcher never bounded the cache (largest {largest} bytes)"
    );
    assert!(
        largest < LIMIT_BYTES,
        "the cache held {largest} bytes under a {LIMIT_BYTES} byte limit"
    );
    assert!(
        largest >= 128 << 20,
        "the cache held only {largest} bytes: the reads did not fill it"
    );
    // Every read still right, after the cache gave memory back: this read
    // is sequential, in 32 MiB requests, and takes memory besides the cache
    // faster than the watcher can shrink it (before the headroom kept at
    // least 128 MiB free, the kernel killed the server here in one CI run
    // of four). A failure says whether the kernel killed the server
    // meanwhile, with its log.
    let read = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "read -P 0x5a 0 1G"])
        .output()
        .expect("cannot run qemu-io");
    let alive = pool.server.as_mut().unwrap().try_wait().unwrap().is_none();
    assert!(
        read.status.success(),
        "the read back failed ({}): {} {}; out-of-memory kills in the group: {}; server alive: {alive}; its log:\n{}",
        read.status,
        String::from_utf8_lossy(&read.stdout).trim(),
        String::from_utf8_lossy(&read.stderr).trim(),
        group.oom_kills(),
        pool.log()
    );
    assert_eq!(
        group.oom_kills(),
        0,
        "the kernel killed in the group during the read back"
    );
    assert!(
        alive,
        "the server died during the read back: {}",
        pool.log()
    );
    // The server never came near the limit: at it the kernel must reclaim,
    // and without swap it kills when that fails (it sat at the limit in
    // every run, 64 MiB of headroom; 120 MB below it with 128 MiB).
    let peak = group.peak_bytes();
    eprintln!("cache peak {largest} bytes, group peak {peak} bytes, limit {LIMIT_BYTES}");
    assert!(
        peak + NEAR_LIMIT_BYTES <= LIMIT_BYTES,
        "the group's memory peaked at {peak} bytes, within {NEAR_LIMIT_BYTES} of its {LIMIT_BYTES} byte limit"
    );
    pool.stop();
}
