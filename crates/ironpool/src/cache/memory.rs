//! How much memory the server may use, and how the cache yields it.
//!
//! A server in a cgroup with `memory.max` (v2) or `memory.limit_in_bytes`
//! (v1) is killed when it crosses the limit, whatever holds the memory; one
//! without shares the machine's RAM. Either way the cache is the one large
//! consumer that can give memory back, so a watcher ([`next_limit`], run
//! every [`MEMORY_WATCH_INTERVAL`] by the pool) lets it grow only into the
//! headroom left, shrinks it when headroom runs low, and lifts the bound as
//! headroom returns.

use std::time::Duration;

/// How often the pool checks memory: often enough to yield before a burst
/// of writes (whose buffers are bounded by write-back) meets the limit. A
/// check reads `/proc/self/cgroup` and two small cgroup files, and touches
/// no device.
pub const MEMORY_WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// Headroom kept below the limit, as a share of it (1/10): the cache may
/// grow only into the headroom above this mark, and below it shrinks by
/// the shortfall. The mark is what other memory (write-back's held blocks,
/// I/O buffers) may take between two checks.
pub const HEADROOM_LOW_DIVISOR: u64 = 10;
/// Least headroom kept below the limit, whatever its size: the memory one
/// client reading at device speed takes at once besides the cache, its
/// payload in flight and the pool's read-ahead in flight, 64 MiB each (the
/// NBD server, a layer above, checks at build time that they fit). Under a
/// 640 MiB cgroup limit a tenth (64 MiB) was not enough: a 1 GiB sequential
/// read with qemu-io (32 MiB requests) grew the server's memory by 45 to 60
/// MB within 100 ms, while the cache's shrinking gave nothing back that fast
/// (the allocator keeps freed blocks in partly used pages), and the kernel
/// killed the server in one run of four.
pub const HEADROOM_RESERVE_BYTES: u64 = 128 << 20;
/// A cgroup "limit" at or above this is no limit (v1 reports "unlimited" as
/// a number near 2^63).
const NO_LIMIT_BYTES: u64 = 1 << 60;

/// A memory limit and what is used of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryState {
    pub max_bytes: u64,
    pub used_bytes: u64,
}

/// RAM of the machine (MemTotal).
pub fn ram_bytes() -> Option<u64> {
    meminfo_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:")
}

/// The machine's memory as a limit: MemTotal, and what MemAvailable leaves.
pub fn machine_memory() -> Option<MemoryState> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo_field(&meminfo, "MemTotal:")?;
    let available = meminfo_field(&meminfo, "MemAvailable:")?;
    Some(MemoryState {
        max_bytes: total,
        used_bytes: total.saturating_sub(available),
    })
}

fn meminfo_field(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The server's cgroup memory limit and usage, if it has a limit (v2's
/// `memory.max`/`memory.current`, else v1's `memory.limit_in_bytes`/
/// `memory.usage_in_bytes`).
pub fn cgroup_limit() -> Option<MemoryState> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut candidates = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                candidates.push((format!("{root}/{path}"), "memory.max", "memory.current"));
                candidates.push((root.to_string(), "memory.max", "memory.current"));
            }
        } else if controllers.split(',').any(|name| name == "memory") {
            let root = "/sys/fs/cgroup/memory";
            let names = ("memory.limit_in_bytes", "memory.usage_in_bytes");
            candidates.push((format!("{root}/{path}"), names.0, names.1));
            // Inside a container the group is often mounted as the root.
            candidates.push((root.to_string(), names.0, names.1));
        }
    }
    candidates.into_iter().find_map(|(dir, max, used)| {
        let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
        let max: u64 = read(max)?.trim().parse().ok()?;
        let used: u64 = read(used)?.trim().parse().ok()?;
        (max < NO_LIMIT_BYTES).then_some(MemoryState {
            max_bytes: max,
            used_bytes: used,
        })
    })
}

/// The memory state that binds: the cgroup's if it has a limit, else the
/// machine's.
pub fn current() -> Option<MemoryState> {
    cgroup_limit().or_else(machine_memory)
}

/// The headroom kept below a limit of `max_bytes`: a tenth of it, at least
/// [`HEADROOM_RESERVE_BYTES`], and never more than half of it (a limit that
/// small leaves the cache its floor).
fn headroom_low_mark(max_bytes: u64) -> u64 {
    (max_bytes / HEADROOM_LOW_DIVISOR)
        .max(HEADROOM_RESERVE_BYTES)
        .min(max_bytes / 2)
}

/// The cache's next bound, given memory now, the cache's size and its bound
/// so far (`u64::MAX`: none): the cache may grow by the headroom above the
/// low mark and no more, so that it cannot outgrow the limit between two
/// checks (a reader at 1 GiB/s would otherwise fill a second's worth past
/// it, and a cgroup's limit kills); below the low mark it shrinks by the
/// shortfall (never under `floor`). A bound at or past `max` (the cache's
/// own size limit) is no bound.
pub fn next_limit(memory: MemoryState, cache_bytes: u64, limit: u64, floor: u64, max: u64) -> u64 {
    let headroom = memory.max_bytes.saturating_sub(memory.used_bytes);
    let low = headroom_low_mark(memory.max_bytes);
    if headroom < low {
        let shrunk = cache_bytes.saturating_sub(low - headroom).max(floor);
        return shrunk.min(limit);
    }
    let allowed = cache_bytes.saturating_add(headroom - low);
    if allowed >= max {
        u64::MAX
    } else {
        allowed.max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn short_headroom_shrinks_the_cache_by_the_shortfall_down_to_the_floor() {
        let memory = MemoryState {
            max_bytes: 10 * GIB,
            used_bytes: 9 * GIB + GIB / 2,
        };
        // Half a GiB short of the 1 GiB headroom: a 4 GiB cache goes to 3.5.
        assert_eq!(
            next_limit(memory, 4 * GIB, u64::MAX, 64 << 20, 8 * GIB),
            3 * GIB + GIB / 2
        );
        assert_eq!(
            next_limit(memory, 100 << 20, u64::MAX, 64 << 20, 8 * GIB),
            64 << 20
        );
    }

    #[test]
    fn the_cache_may_grow_by_the_headroom_above_the_low_mark_and_no_more() {
        let memory = MemoryState {
            max_bytes: 10 * GIB,
            used_bytes: 5 * GIB,
        };
        // 5 GiB free, 1 GiB kept: a 1 GiB cache may reach 5 GiB.
        assert_eq!(next_limit(memory, GIB, GIB, 0, 8 * GIB), 5 * GIB);
        assert_eq!(next_limit(memory, GIB, u64::MAX, 0, 8 * GIB), 5 * GIB);
        // Room past the cache's own maximum: no bound.
        assert_eq!(next_limit(memory, 4 * GIB, 5 * GIB, 0, 8 * GIB), u64::MAX);
        // At the low mark the cache keeps its size.
        let full = MemoryState {
            max_bytes: 10 * GIB,
            used_bytes: 9 * GIB,
        };
        assert_eq!(next_limit(full, 3 * GIB, u64::MAX, 0, 8 * GIB), 3 * GIB);
        // A small cache is never bound under the floor.
        assert_eq!(next_limit(full, 0, u64::MAX, 64 << 20, 8 * GIB), 64 << 20);
    }

    #[test]
    fn a_small_limit_keeps_the_reserve_free_not_a_tenth() {
        const MIB: u64 = 1 << 20;
        assert_eq!(headroom_low_mark(10 * GIB), GIB);
        assert_eq!(headroom_low_mark(640 * MIB), HEADROOM_RESERVE_BYTES);
        assert_eq!(headroom_low_mark(128 * MIB), 64 * MIB);
        // 640 MiB with 600 used: 40 MiB free is short of the 128 MiB
        // reserve, so a 400 MiB cache gives back the 88 MiB shortfall.
        let memory = MemoryState {
            max_bytes: 640 * MIB,
            used_bytes: 600 * MIB,
        };
        assert_eq!(
            next_limit(memory, 400 * MIB, u64::MAX, 64 * MIB, 8 * GIB),
            312 * MIB
        );
    }

    #[test]
    fn this_machine_reports_its_memory() {
        let machine = machine_memory().expect("/proc/meminfo");
        assert!(machine.max_bytes > 0 && machine.used_bytes <= machine.max_bytes);
        assert_eq!(ram_bytes(), Some(machine.max_bytes));
    }
}
