//! Every pitfall check on crafted inputs, including a fake ZFS kstat file.

use std::path::{Path, PathBuf};

use ironpool_bench::pitfalls::{self, check};
use ironpool_bench::results::{Finding, Severity, VolumeDelta};
use ironpool_bench::target::files;
use ironpool_bench::zfs_kstat;

const KIB: u64 = 1024;

/// A fresh scratch directory under Cargo's per-target tmp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pitfalls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn target_smaller_than_record() {
    let finding = pitfalls::smaller_than_record("t", 8 * KIB, Some(16 * KIB)).unwrap();
    assert_eq!(
        (finding.severity, finding.check.as_str()),
        (Severity::Warning, check::SMALLER_THAN_RECORD)
    );
    assert!(
        finding.message.contains("8.00 KiB") && finding.message.contains("16.0 KiB"),
        "{}",
        finding.message
    );
    assert!(pitfalls::smaller_than_record("t", 1 << 30, Some(16 * KIB)).is_none());
    assert!(
        pitfalls::smaller_than_record("t", 1, None).is_none(),
        "unknown record size: nothing to say"
    );
}

#[test]
fn block_sizes_against_record_and_page() {
    let tests: Vec<(String, u64)> = [
        ("randread-4k", 4),
        ("odd-6k", 6),
        ("randwrite-16k", 16),
        ("big-24k", 24),
        ("seq-1m", 1024),
    ]
    .iter()
    .map(|(n, k)| (n.to_string(), k * KIB))
    .collect();
    let findings = pitfalls::alignment("ip", &tests, Some(16 * KIB), 4 * KIB);
    let messages: Vec<&str> = findings.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(findings.len(), 4, "{messages:#?}");
    assert!(
        messages[0].starts_with("4K I/O on a 16K record size") && messages[0].contains("4x"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("6K is not a multiple of the 4K page"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("6K is not a multiple of the 16K record"),
        "{}",
        messages[2]
    );
    assert!(
        messages[3].contains("24K is not a multiple of the 16K record"),
        "{}",
        messages[3]
    );
    assert!(findings
        .iter()
        .all(|f| f.check == check::ALIGNMENT && f.severity == Severity::Warning));
    // A 4K-record filesystem has nothing to say about 4K, 16K or 1M I/O.
    let fine = [
        ("a".to_string(), 4 * KIB),
        ("b".to_string(), 16 * KIB),
        ("c".to_string(), 1024 * KIB),
    ];
    assert!(pitfalls::alignment("raw", &fine, Some(4 * KIB), 4 * KIB).is_empty());
}

#[test]
fn ironpool_direct_counters() {
    let engaged = VolumeDelta {
        write_ops: 1000,
        direct_write_ops: 950,
        ..VolumeDelta::default()
    };
    assert!(
        pitfalls::direct_ironpool("ip", "w", 0, 1000, &engaged).is_none(),
        "95% is engaged"
    );
    let cached = VolumeDelta {
        write_ops: 1000,
        direct_write_ops: 10,
        rmw_write_ops: 990,
        ..VolumeDelta::default()
    };
    let finding = pitfalls::direct_ironpool("ip", "randwrite-4k", 0, 1000, &cached).unwrap();
    assert_eq!(finding.check, check::DIRECT_IO);
    assert_eq!(finding.test.as_deref(), Some("randwrite-4k"));
    assert!(
        finding.message.contains("10 of 1000 writes (1%)")
            && finding
                .message
                .contains("990 writes needed a read-modify-write")
    );
    let reads = VolumeDelta {
        read_ops: 500,
        direct_read_ops: 0,
        ..VolumeDelta::default()
    };
    assert!(pitfalls::direct_ironpool("ip", "r", 500, 0, &reads)
        .unwrap()
        .message
        .contains("0 of 500 reads"));
}

/// Writes a kstat file the way OpenZFS 2.3 formats pool iostats.
fn write_kstat(
    dir: &Path,
    pool: &str,
    arc_writes: u64,
    direct_reads: u64,
    direct_writes: u64,
) -> PathBuf {
    let path = zfs_kstat::iostats_path(dir, pool);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = format!(
        "30 1 0x01 15 4080 6315283014 86736224826461\n\
         name                            type data\n\
         trim_extents_written            4    0\n\
         arc_read_count                  4    12\n\
         arc_read_bytes                  4    49152\n\
         arc_write_count                 4    {arc_writes}\n\
         arc_write_bytes                 4    {}\n\
         direct_read_count               4    {direct_reads}\n\
         direct_read_bytes               4    {}\n\
         direct_write_count              4    {direct_writes}\n\
         direct_write_bytes              4    {}\n",
        arc_writes * 4096,
        direct_reads * 16384,
        direct_writes * 16384
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn zfs_direct_io_from_a_fake_kstat() {
    let dir = scratch("kstat");
    let path = write_kstat(&dir, "tank", 0, 0, 100);
    let before = zfs_kstat::read(&path).unwrap().unwrap();

    // Engaged: 1000 writes went direct.
    write_kstat(&dir, "tank", 0, 0, 1100);
    let after = zfs_kstat::read(&path).unwrap().unwrap();
    let delta = zfs_kstat::direct_delta(&before, &after);
    assert!(pitfalls::direct_zfs("file:/tank/f", "w", "tank", 0, 1000, delta).is_none());

    // Not engaged: the writes went through the ARC.
    write_kstat(&dir, "tank", 1000, 0, 100);
    let after = zfs_kstat::read(&path).unwrap().unwrap();
    let delta = zfs_kstat::direct_delta(&before, &after);
    let finding = pitfalls::direct_zfs("file:/tank/f", "w", "tank", 0, 1000, delta).unwrap();
    assert!(
        finding.message.contains("0 of 1000 writes") && finding.message.contains("ARC"),
        "{}",
        finding.message
    );

    // A ZFS before 2.3: iostats without Direct I/O counters.
    std::fs::write(
        &path,
        "30 1 0x01 2 544 1 2\nname type data\ntrim_extents_written 4 0\n",
    )
    .unwrap();
    let old = zfs_kstat::read(&path).unwrap().unwrap();
    let finding = pitfalls::direct_zfs(
        "file:/tank/f",
        "w",
        "tank",
        0,
        1000,
        zfs_kstat::direct_delta(&old, &old),
    )
    .unwrap();
    assert!(
        finding.message.contains("before 2.3"),
        "{}",
        finding.message
    );

    // No such pool: no file, no error.
    assert!(zfs_kstat::read(&zfs_kstat::iostats_path(&dir, "nopool"))
        .unwrap()
        .is_none());
}

#[test]
fn never_written_space() {
    let finding = pitfalls::never_written_ironpool("ip", "randread-4k", 7, 1000).unwrap();
    assert!(finding
        .message
        .starts_with("7 of 1000 reads hit never-written blocks"));
    assert!(pitfalls::never_written_ironpool("ip", "randread-4k", 0, 1000).is_none());

    assert!(pitfalls::never_written_prefill("nbd", 512 << 20, 1 << 30)
        .unwrap()
        .message
        .contains("512 MiB of 1.00 GiB"));
    assert!(pitfalls::never_written_prefill("nbd", 1 << 30, 1 << 30).is_none());

    // A file that was only sized (not written) is all hole; a written one none.
    let dir = scratch("holes");
    let path = dir.join("target.img");
    files::create_sparse(&path, 4 << 20).unwrap();
    let holes = files::hole_bytes(&path, 4 << 20).unwrap();
    let finding = pitfalls::never_written_file("raw", holes, 4 << 20).unwrap();
    assert!(
        finding.message.contains("4.00 MiB of 4.00 MiB"),
        "{}",
        finding.message
    );
    std::fs::write(&path, vec![0xabu8; 4 << 20]).unwrap();
    assert!(pitfalls::never_written_file(
        "raw",
        files::hole_bytes(&path, 4 << 20).unwrap(),
        4 << 20
    )
    .is_none());
}

#[test]
fn fill_level_above_eighty_percent() {
    let accidental = pitfalls::fill_level("ip", None, 85.4, "pool", false).unwrap();
    assert_eq!(accidental.severity, Severity::Warning);
    assert!(
        accidental
            .message
            .starts_with("the pool is 85% full (over 80%)"),
        "{}",
        accidental.message
    );
    let intended = pitfalls::fill_level("ip", Some("fill-90"), 90.0, "pool", true).unwrap();
    assert_eq!(intended.severity, Severity::Info);
    assert!(pitfalls::fill_level("ip", None, 80.0, "pool", false).is_none());
    // statvfs on a real filesystem gives a sane percentage.
    let space = files::fs_space(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    assert!((0.0..=100.0).contains(&space.used_percent()) && space.capacity_bytes() > 0);
}

#[test]
fn loop_devices_without_direct_io() {
    let finding = pitfalls::loop_device_buffered("dir:/mnt", "/dev/loop0", Some(false)).unwrap();
    assert!(finding.message.contains("/dev/loop0") && finding.message.contains("page cache"));
    assert!(pitfalls::loop_device_buffered("dir:/mnt", "/dev/loop0", Some(true)).is_none());
    assert!(pitfalls::loop_device_buffered("dir:/mnt", "/dev/vda", None).is_none());
    assert_eq!(files::loop_direct_io("/dev/vda"), None);
}

#[test]
fn device_errors_and_collapsing() {
    assert!(pitfalls::device_errors("ip", "t", 0).is_none());
    let first = pitfalls::device_errors("ip", "t1", 3).unwrap();
    let second = pitfalls::device_errors("ip", "t2", 1).unwrap();
    let other = pitfalls::fill_level("ip", None, 95.0, "pool", false).unwrap();
    let collapsed: Vec<Finding> = pitfalls::collapse(vec![first, other.clone(), second]);
    assert_eq!(collapsed.len(), 2);
    assert!(
        collapsed[0]
            .message
            .starts_with("t1: the devices reported 3"),
        "{}",
        collapsed[0].message
    );
    assert!(
        collapsed[0].message.ends_with("the same in test: t2"),
        "{}",
        collapsed[0].message
    );
    assert_eq!(collapsed[1], other);
}

#[test]
fn nbd_direct_note() {
    let note = pitfalls::direct_over_nbd(
        "nbdkit",
        Some("nbdkit's file plugin serves through the page cache"),
    );
    assert_eq!(
        (note.severity, note.check.as_str()),
        (Severity::Info, check::DIRECT_IO)
    );
    assert!(note.message.contains("ignores direct=1") && note.message.ends_with("page cache"));
}

#[test]
fn debug_builds_of_the_server() {
    let finding =
        pitfalls::debug_build("ip", Path::new("/work/main/target/debug/ironpool")).unwrap();
    assert_eq!(finding.check, check::DEBUG_BUILD);
    assert!(finding.message.contains("debug build"));
    assert!(pitfalls::debug_build("ip", Path::new("/work/main/target/release/ironpool")).is_none());
    assert!(pitfalls::debug_build("ip", Path::new("/usr/bin/ironpool")).is_none());
}

#[test]
fn reads_of_the_cache_that_were_not() {
    // From the cache: the devices read little of what fio read.
    assert!(pitfalls::cache_reads("ip", "t", true, 1 << 30, 1 << 20).is_none());
    let missed = pitfalls::cache_reads("ip", "t", true, 1 << 30, 600 << 20).unwrap();
    assert_eq!(missed.check, check::CACHE_READS);
    assert!(missed.message.contains("59%"), "{}", missed.message);
    // With the cache off: the devices read at least half of it (whole
    // blocks, often more).
    assert!(pitfalls::cache_reads("ip", "t", false, 1 << 30, 4 << 30).is_none());
    let cached = pitfalls::cache_reads("ip", "t", false, 1 << 30, 0).unwrap();
    assert!(
        cached.message.contains("came from a cache"),
        "{}",
        cached.message
    );
    // Nothing read, nothing to say.
    assert!(pitfalls::cache_reads("ip", "t", true, 0, 1 << 20).is_none());
}
