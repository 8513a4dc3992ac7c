//! A short real run against a real ironpool volume, beside the raw file and
//! nbdkit. The binary is `IRONPOOL_BIN` if set, else the workspace's
//! `target/debug/ironpool` (built by `cargo test --workspace` before any test
//! runs); a missing binary fails the test.

mod common;

use std::path::PathBuf;

use common::{bench_args, check_outputs, require_tool, run_bench, scratch, ONE_RUN_AT_A_TIME};

fn ironpool_bin() -> PathBuf {
    let bin = std::env::var_os("IRONPOOL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/ironpool")
        });
    assert!(
        bin.is_file(),
        "{} is not a file: build it (cargo build -p ironpool) or set IRONPOOL_BIN",
        bin.display()
    );
    bin
}

#[test]
fn ironpool_mirror_beside_raw_and_nbdkit() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    require_tool("nbdkit", "nbdkit");
    let bin = ironpool_bin();
    let out = scratch("ironpool-mirror").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x1G",
        "--target",
        "nbdkit",
        "--suite",
        "qd-scaling",
        "--suite",
        "pool-report",
        "--qd",
        "16",
        "--jobs",
        "1",
        "--runtime",
        "1",
        "--size",
        "256M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);

    let labels: Vec<&str> = results.targets.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["raw", "ironpool:mirror:2x1G", "nbdkit"]);
    let pool = &results.targets[1];
    assert_eq!(pool.record_size_bytes, Some(16 * 1024));
    for test in &pool.tests {
        let name = test.label();
        let server = test
            .server
            .unwrap_or_else(|| panic!("{name}: no server CPU"));
        assert!(server.cpu_seconds > 0.0, "{name}: the server used no CPU?");
        let volume = test
            .volume
            .unwrap_or_else(|| panic!("{name}: no volume counters from iostat"));
        assert_eq!(
            volume.hole_read_ops, 0,
            "{name}: reads of never-written blocks after the prefill"
        );
        let device = test
            .device
            .unwrap_or_else(|| panic!("{name}: no device counters from iostat"));
        assert_eq!(device.errors, 0, "{name}: device errors");
    }
    // Writes may sit in memory until a transaction group syncs, so a single
    // short test need not show device writes; the run as a whole must.
    let device_writes: u64 = pool
        .tests
        .iter()
        .filter_map(|t| t.device)
        .map(|d| d.write_bytes)
        .sum();
    assert!(device_writes > 0, "client writes never reached the devices");
    assert!(
        !pool.pitfalls.iter().any(|f| f.check == "never-written"),
        "{:#?}",
        pool.pitfalls
    );
    for leftover in ["nbd.sock", "ctl.sock", "d0.img", "d1.img"] {
        assert!(
            !out.join("ironpool-mirror-2x1G").join(leftover).exists(),
            "{leftover} left behind"
        );
    }
}

#[test]
fn ironpool_layouts_and_properties() {
    // raidz targets (ironpool:raidz2:6x1G) wait for the engine's raidz.
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-layouts").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:stripe:2x512M",
        "--target",
        "ironpool:mirror:3x512M:volblocksize=64K",
        "--no-raw",
        "--suite",
        "qd-scaling",
        "--qd",
        "1,16",
        "--jobs",
        "1",
        "--runtime",
        "1",
        "--size",
        "128M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let (stripe, mirror) = (&results.targets[0], &results.targets[1]);
    assert_eq!(mirror.record_size_bytes, Some(64 * 1024));
    let create = &mirror.setup_commands[0];
    assert!(
        create.contains(&"mirror".to_string())
            && create.iter().filter(|w| w.ends_with(".img")).count() == 3
    );
    let create = &stripe.setup_commands[0];
    assert!(
        !create.contains(&"mirror".to_string())
            && create.iter().filter(|w| w.ends_with(".img")).count() == 2
    );
    // 16K writes on 64K blocks are partial-block writes.
    assert!(mirror
        .pitfalls
        .iter()
        .any(|f| f.check == "alignment" && f.message.contains("16K I/O on a 64K")));
}

#[test]
fn ironpool_filesystem_over_fuse_beside_raw() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    assert!(
        std::path::Path::new("/dev/fuse").exists(),
        "ironpool-fs targets need /dev/fuse (the FUSE module) and root"
    );
    let bin = ironpool_bin();
    let out = scratch("ironpool-fs").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool-fs:mirror:2x1G",
        "--suite",
        "qd-scaling",
        "--qd",
        "1,16",
        "--jobs",
        "1",
        "--runtime",
        "1",
        "--size",
        "128M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let labels: Vec<&str> = results.targets.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["raw", "ironpool-fs:mirror:2x1G"]);
    let fs = &results.targets[1];
    assert_eq!(fs.record_size_bytes, Some(16 * 1024));
    assert!(
        fs.setup_commands
            .iter()
            .any(|command| command.contains(&"fs".to_string())
                && command.contains(&"bench/fs".to_string())),
        "{:?}",
        fs.setup_commands
    );
    for test in &fs.tests {
        let name = test.label();
        assert!(test.is_ok(), "{name} failed");
        // The filesystem's own counters, from iostat: every read fio made
        // with O_DIRECT bypassed the cache, and the prefill left no holes.
        let counters = test
            .volume
            .unwrap_or_else(|| panic!("{name}: no filesystem counters from iostat"));
        assert!(
            counters.read_ops + counters.write_ops > 0,
            "{name}: the filesystem saw no I/O"
        );
        assert_eq!(
            counters.direct_read_ops, counters.read_ops,
            "{name}: O_DIRECT reads that went through the cache"
        );
        assert_eq!(
            counters.hole_read_ops, 0,
            "{name}: reads of holes after the prefill"
        );
    }
    assert!(
        !fs.pitfalls.iter().any(|f| f.check == "direct-io"),
        "{:#?}",
        fs.pitfalls
    );
    let dir = out.join("ironpool-fs-mirror-2x1G");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&dir.join("mnt").display().to_string()),
        "the filesystem is still mounted after the run"
    );
    for leftover in ["ctl.sock", "d0.img", "d1.img"] {
        assert!(!dir.join(leftover).exists(), "{leftover} left behind");
    }
}

/// The fill suite measures what it says: the working set is what `--size`
/// asks, each level is the one measured (near the one asked), and its
/// random reads at every level come from the devices, not the read cache
/// (a working set the cache held read 0 bytes from the devices at every
/// level on 6093ca7, and the volume was 5% of the pool whatever `--size`
/// said).
#[test]
fn ironpool_fill_suite_reads_the_devices_at_each_level() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-fill").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x1G",
        "--no-raw",
        "--suite",
        "fill",
        "--fill-levels",
        "40,90",
        "--runtime",
        "1",
        "--size",
        "192M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let pool = &results.targets[0];
    assert_eq!(pool.size_bytes, 192 << 20, "the working set --size asked");
    assert!(
        pool.description.contains("primarycache=metadata"),
        "{}",
        pool.description
    );
    let mut levels = std::collections::BTreeSet::new();
    for test in &pool.tests {
        let name = test.label();
        assert!(test.is_ok(), "{name}: {:?}", test.outcome);
        let target = test
            .fill_target_percent
            .unwrap_or_else(|| panic!("{name}: no fill level"));
        levels.insert(target);
        let measured = test
            .fill_measured_percent
            .unwrap_or_else(|| panic!("{name}: fill level not measured"));
        assert!(
            (measured - f64::from(target)).abs() <= 5.0,
            "{name}: level {target}% measured at {measured:.1}%"
        );
        if test.workload.pattern == ironpool_bench::suites::Pattern::RandRead {
            let device = test
                .device
                .unwrap_or_else(|| panic!("{name}: no device counters"));
            let volume = test
                .volume
                .unwrap_or_else(|| panic!("{name}: no volume counters"));
            // Every read came from the devices: at least the bytes the
            // volume served (a mirror reads one copy of each block).
            let served = volume.read_ops * test.workload.block_size_bytes;
            assert!(
                volume.read_ops > 0 && device.read_bytes >= served,
                "{name}: {served} bytes served, {} read from the devices",
                device.read_bytes
            );
        }
    }
    // 90% too, after the tests' overwrites (at this size and runtime they
    // fragment too little to show what 2 GiB did: 128K fillers met ENOSPC
    // with a third of the pool free, as ironpool has no gang blocks).
    assert_eq!(levels.into_iter().collect::<Vec<_>>(), [40, 90]);
}

/// The durable suite on a real mirror with a log device, held to two raw
/// files written at once (`scripts/bench-durable.sh`'s table in one run):
/// the raw pair runs each test on both files, the mirror's ratios are to
/// it, its flush tests count device syncs and log bytes, and its every-write
/// -durable test runs with `sync=always` (fio's nbd engine sends no FUA)
/// and puts `sync` back after.
#[test]
fn ironpool_durable_suite_beside_the_raw_pair() {
    use ironpool_bench::suites::Durability;
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-durable").join("out");
    let args = bench_args(&[
        "--target",
        "raw-pair",
        "--target",
        "ironpool:mirror+log:2x256M",
        "--no-raw",
        "--suite",
        "durable",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--write-out",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [pair, pool] = &results.targets[..] else {
        panic!("two targets: {:?}", results.targets.len())
    };
    assert_eq!(pair.kind, "raw-pair");
    assert!(pair.tests.iter().all(|t| t.is_ok()), "{:#?}", pair.tests);
    assert_eq!(pair.prefills[0].bytes, 2 * (64 << 20), "both files written");
    assert!(pair.tests[0]
        .command
        .iter()
        .any(|a| a.ends_with("raw-pair-b.img")));

    assert_eq!(pool.limit.as_deref(), Some("raw-pair"));
    assert!(
        pool.description.contains("log device"),
        "{}",
        pool.description
    );
    let test = |durability: Durability| {
        pool.tests
            .iter()
            .find(|t| t.workload.durability == durability)
            .unwrap_or_else(|| panic!("no {durability:?} test"))
    };
    for durability in [Durability::Fsync, Durability::FsyncEvery(32)] {
        let flushed = test(durability);
        assert!(flushed.is_ok(), "{:?}", flushed.outcome);
        let device = flushed.device.expect("device counters");
        let volume = flushed.volume.expect("volume counters");
        assert!(
            volume.flush_ops > 0 && device.syncs > 0 && volume.log_bytes > 0,
            "{durability:?}: {volume:?} {device:?}"
        );
        assert!(results.limit_for(pool, flushed).is_some());
    }
    let dsync = test(Durability::Dsync);
    assert!(dsync.is_ok(), "{:?}", dsync.outcome);
    assert!(!dsync.command.iter().any(|a| a.starts_with("--sync")));
    assert!(
        dsync.volume.is_some_and(|v| v.log_bytes > 0),
        "sync=always logs every write: {:?}",
        dsync.volume
    );
    let set: Vec<String> = pool
        .setup_commands
        .iter()
        .filter(|c| c.get(1).is_some_and(|w| w == "set"))
        .map(|c| c[c.len() - 2].clone())
        .collect();
    assert_eq!(set, ["sync=always", "sync=standard"]);
    assert!(
        pool.tests
            .iter()
            .any(|t| t.server.is_some_and(|s| s.cpu_us_per_op > 0.0)),
        "server CPU per operation"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| vs raw-pair |") && report.contains("dev syncs/flush"));
}

/// The fs suite (`scripts/bench-fs.sh`'s table) in one run: an ironpool
/// filesystem beside ext4 on a loop device, its limit for what a
/// filesystem answers on its own. Every row runs on both: direct data
/// through io_uring and libaio, durable writes, buffered writes, the
/// metadata phases and the names tests; and the ext4 target leaves no
/// loop device or mount behind.
#[test]
fn fs_suite_beside_ext4_on_a_loop_device() {
    use ironpool_bench::suites::{Engine, OpsTest, Suite};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    require_tool("mkfs.ext4", "e2fsprogs");
    require_tool("python3", "python3");
    let bin = ironpool_bin();
    let out = scratch("ironpool-fs-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool-fs:mirror:2x512M",
        "--target",
        "ext4",
        "--no-raw",
        "--suite",
        "fs",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--files",
        "500",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    assert_eq!(results.settings.files, Some(500));
    let [fs, ext4] = &results.targets[..] else {
        panic!("two targets: {:?}", results.targets.len())
    };
    assert_eq!(ext4.kind, "ext4");
    assert_eq!(
        ext4.filesystem.as_deref(),
        Some("ext4"),
        "{}",
        ext4.description
    );
    assert!(
        ext4.description.contains("/dev/loop"),
        "{}",
        ext4.description
    );
    let planned = ironpool_bench::suites::fs_workloads().len();
    for target in [fs, ext4] {
        assert_eq!(target.tests.len(), planned, "{}", target.label);
        for test in &target.tests {
            assert!(
                test.is_ok(),
                "{} {}: {:?}",
                target.label,
                test.label(),
                test.outcome
            );
            assert_eq!(test.suite, Suite::Fs);
        }
    }
    let find = |name: &str| {
        fs.tests
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // The metadata phases count the files asked for.
    for name in ["files-create", "files-stat", "files-absent", "files-delete"] {
        let test = find(name);
        assert_eq!(test.operations(), 500, "{name}");
        let limit = results.limit_for(fs, test).expect("held to ext4");
        assert!(limit.ops_per_second.is_some());
        assert!(std::ptr::eq(
            limit,
            ext4.tests.iter().find(|t| t.name == name).unwrap()
        ));
    }
    assert!(find("names-sqlite").operations() > 0);
    // Server CPU per operation of a test of system calls: one that runs
    // for the runtime (500 creates take tens of milliseconds, within the
    // 10 ms tick of /proc/PID/stat's CPU times, and read 0 in CI).
    let created = find("names-create");
    assert!(
        created.server.is_some_and(|s| s.cpu_us_per_op > 0.0),
        "server CPU per new file: {:?}",
        created.server
    );
    // Buffered writes go through the page cache and end in an fsync; the
    // direct-I/O check leaves them alone.
    let buffered: Vec<_> = fs.tests.iter().filter(|t| t.workload.buffered).collect();
    assert_eq!(buffered.len(), 3);
    for test in buffered {
        assert!(test.command.contains(&"--direct=0".to_string()));
        assert!(test.command.contains(&"--end_fsync=1".to_string()));
        assert!(results.limit_for(fs, test).is_some());
    }
    assert!(
        !fs.pitfalls.iter().any(|f| f.check == "direct-io"),
        "{:#?}",
        fs.pitfalls
    );
    let aio = fs
        .tests
        .iter()
        .find(|t| t.workload.engine == Engine::Libaio && t.workload.iodepth == 64)
        .expect("a libaio QD64 row");
    assert!(aio.command.contains(&"--ioengine=libaio".to_string()));
    assert!(fs
        .tests
        .iter()
        .any(|t| t.workload.ops == Some(OpsTest::NamesReplace)));
    // The fs rows' queue-depth scaling is judged, per engine.
    let findings = ironpool_bench::analysis::findings(&results);
    for engine in ["libaio", ""] {
        assert!(
            findings.iter().any(|f| f.check == "qd-scaling"
                && f.target.as_deref() == Some(fs.label.as_str())
                && f.message.contains("QD64 gives")
                && (engine.is_empty() || f.message.contains(engine))),
            "no qd-scaling finding ({engine}): {findings:#?}"
        );
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("held to `ext4`"),
        "the summary names the limit"
    );
    assert!(report.contains("| fs | files-create |"));
    assert!(out.join("fs.png").is_file());
    // Nothing of the ext4 target is left: no mount, no loop device.
    let image = out.join("ext4").join("ext4.img");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(&out.join("ext4").join("mnt").display().to_string()));
    let attached = std::process::Command::new("losetup")
        .args(["-j", image.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        attached.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&attached.stdout)
    );
    assert!(!image.exists(), "the image is removed");
}

/// The snapshot suite (what `scripts/bench-snapshot.sh` measured): the
/// reads of the snapshot go through `.zfs/snapshot` and are held to the
/// same reads of the head; the snapshot with many more files is taken and
/// its listing counts every file; the raw baseline skips what it has no
/// snapshot for, with the reason.
#[test]
fn snapshot_suite_reads_the_snapshot_beside_the_head() {
    use ironpool_bench::suites::{OpsTest, Suite, SNAPSHOT_FILES_NAME, SNAPSHOT_READ_NAME};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-snapshot-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool-fs:mirror:2x512M",
        "--suite",
        "snapshot",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--files",
        "300",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    assert_eq!(results.settings.files, Some(300));
    let [raw, fs] = &results.targets[..] else {
        panic!("two targets: {:?}", results.targets.len())
    };
    let planned = ironpool_bench::suites::snapshot_workloads();
    for target in [raw, fs] {
        assert_eq!(target.tests.len(), planned.len(), "{}", target.label);
    }
    for test in &raw.tests {
        let of_snapshot =
            test.workload.snapshot || test.workload.ops.is_some_and(OpsTest::of_snapshot);
        match &test.outcome {
            ironpool_bench::results::Outcome::Skipped { reason } => {
                assert!(of_snapshot, "raw {} skipped: {reason}", test.label());
                assert!(reason.contains("ironpool-fs"), "{reason}");
            }
            outcome => assert!(!of_snapshot, "raw {}: {outcome:?}", test.label()),
        }
    }
    for test in &fs.tests {
        assert!(test.is_ok(), "{}: {:?}", test.label(), test.outcome);
        assert_eq!(test.suite, Suite::Snapshot);
        if test.workload.snapshot {
            let path = format!("/.zfs/snapshot/{SNAPSHOT_READ_NAME}/");
            assert!(
                test.command.iter().any(|arg| arg.contains(&path)),
                "{:?}",
                test.command
            );
            assert!(test.total_iops() > 0.0, "{}", test.label());
            // Held to the head's same reads, on the same target.
            let (limit_target, limit) = results.limit_with_target(fs, test).expect("a limit");
            assert_eq!(limit_target.label, fs.label);
            assert!(!limit.workload.snapshot);
            assert_eq!(
                limit.workload.block_size_bytes,
                test.workload.block_size_bytes
            );
        }
    }
    let find = |name: &str| fs.tests.iter().find(|t| t.name == name).unwrap();
    assert_eq!(find("snapshot-take").operations(), 1);
    assert_eq!(find("snapshot-list").operations(), 300);
    for name in [SNAPSHOT_READ_NAME, SNAPSHOT_FILES_NAME] {
        let snapshot = format!("bench/fs@{name}");
        assert!(
            fs.setup_commands.iter().any(|c| c.contains(&snapshot)),
            "{snapshot} not among {:?}",
            fs.setup_commands
        );
    }
}

/// The send suite (what `scripts/bench-send.sh` measured): the full stream
/// of a volume and of a filesystem goes whole into a copy in the pool,
/// the incremental one after 1% of the records changed is about 1% of it,
/// and the raw file's row is the copy that is their limit.
#[test]
fn send_suite_streams_a_volume_and_a_filesystem() {
    use ironpool_bench::suites::{OpsTest, Suite};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    require_tool("dd", "coreutils");
    let bin = ironpool_bin();
    let out = scratch("ironpool-send-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x512M",
        "--target",
        "ironpool-fs:mirror:2x512M",
        "--suite",
        "send",
        "--size",
        "64M",
        "--files",
        "300",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [raw, volume, fs] = &results.targets[..] else {
        panic!("three targets: {:?}", results.targets.len())
    };
    let find = |target: &ironpool_bench::results::TargetResult, test: OpsTest| {
        target
            .tests
            .iter()
            .find(|t| t.workload.ops == Some(test))
            .unwrap_or_else(|| panic!("{}: no {}", target.label, test.name()))
            .clone()
    };
    let copy = find(raw, OpsTest::SendReceive);
    assert!(copy.is_ok(), "{:?}", copy.outcome);
    assert_eq!(copy.read.unwrap().io_bytes, 64 << 20);
    assert_eq!(copy.command.first().map(String::as_str), Some("dd"));
    assert!(!find(raw, OpsTest::SendIncremental).is_ok());
    // Many small files: tar through the mount, then their stream, on the
    // filesystem only, the stream held to tar.
    for target in [raw, volume] {
        for test in [OpsTest::FilesTar, OpsTest::SendFiles] {
            assert!(
                !find(target, test).is_ok(),
                "{} {}",
                target.label,
                test.name()
            );
        }
    }
    let tar = find(fs, OpsTest::FilesTar);
    let sent = find(fs, OpsTest::SendFiles);
    for test in [&tar, &sent] {
        assert!(test.is_ok(), "{}: {:?}", test.label(), test.outcome);
        assert_eq!(test.operations(), 300, "{}", test.label());
    }
    let limit = results
        .limit_for(fs, &sent)
        .expect("send-files is held to files-tar");
    assert_eq!(limit.workload.ops, Some(OpsTest::FilesTar));
    assert!(fs
        .notes
        .iter()
        .any(|n| n.starts_with("send-files: a stream of")));
    for target in [volume, fs] {
        let full = find(target, OpsTest::SendReceive);
        let incremental = find(target, OpsTest::SendIncremental);
        for test in [&full, &incremental] {
            assert!(
                test.is_ok(),
                "{} {}: {:?}",
                target.label,
                test.label(),
                test.outcome
            );
            assert_eq!(test.suite, Suite::Send);
            assert!(
                test.command.contains(&"|".to_string()),
                "{:?}",
                test.command
            );
            // Held to the raw file's copy.
            let limit = results.limit_for(target, test);
            assert!(
                test.workload.ops != Some(OpsTest::SendReceive)
                    || limit.is_some_and(|l| std::ptr::eq(l, &raw.tests[0])),
                "{}: limit {limit:?}",
                target.label
            );
        }
        // The full stream carries the working set; the incremental one
        // about the 1% that changed (records and the stream's own
        // records), far below the full one.
        let full_bytes = full.read.unwrap().io_bytes;
        let incremental_bytes = incremental.read.unwrap().io_bytes;
        assert!(full_bytes >= 64 << 20, "{}: {full_bytes}", target.label);
        assert!(
            incremental_bytes >= (64 << 20) / 100 && incremental_bytes < full_bytes / 20,
            "{}: {incremental_bytes} of {full_bytes}",
            target.label
        );
        assert!(
            target
                .notes
                .iter()
                .any(|n| n.starts_with("send-incremental after 1%")),
            "{:?}",
            target.notes
        );
        // The copy is gone with the incremental row.
        assert!(
            target
                .setup_commands
                .iter()
                .any(|c| c.contains(&"destroy".to_string())
                    && c.contains(&"bench/send-copy".to_string())),
            "{:?}",
            target.setup_commands
        );
    }
}

/// The cache suite (what `scripts/bench-cache.sh` measured): the cached
/// reads come from the cache and are held to nbdkit's memory plugin, the
/// cold read is one pass from the devices, and with `primarycache=none`
/// (put back after) every read goes to the devices.
#[test]
fn cache_suite_reads_from_the_cache_and_without_it() {
    use ironpool_bench::suites::Suite;
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    require_tool("nbdkit", "nbdkit");
    let bin = ironpool_bin();
    let out = scratch("ironpool-cache-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x512M",
        "--target",
        "nbdkit-memory",
        "--suite",
        "cache",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [_raw, volume, memory] = &results.targets[..] else {
        panic!("three targets: {:?}", results.targets.len())
    };
    assert_eq!(memory.kind, "nbdkit-memory");
    assert!(
        !volume.pitfalls.iter().any(|f| f.check == "cache-reads"),
        "{:#?}",
        volume.pitfalls
    );
    for test in &volume.tests {
        assert!(test.is_ok(), "{}: {:?}", test.label(), test.outcome);
        assert_eq!(test.suite, Suite::Cache);
        let read = test.read.expect("reads");
        let device = test.device.expect("device counters");
        if test.workload.cached {
            let limit = results.limit_for(volume, test).expect("a limit");
            assert!(
                std::ptr::eq(limit, memory.same_workload(test).unwrap()),
                "{} is held to nbdkit-memory",
                test.label()
            );
            assert!(
                device.read_bytes * 10 <= read.io_bytes,
                "{}: the devices read {} of {}",
                test.label(),
                device.read_bytes,
                read.io_bytes
            );
        }
        if test.workload.cold {
            assert_eq!(read.io_bytes, 64 << 20, "one pass over the working set");
            assert!(device.read_bytes >= 64 << 20, "{}", device.read_bytes);
        }
        if test.workload.nocache {
            assert!(
                device.read_bytes >= read.io_bytes,
                "{}: the devices read {} of {}",
                test.label(),
                device.read_bytes,
                read.io_bytes
            );
        }
    }
    for value in ["primarycache=none", "primarycache=all"] {
        assert!(
            volume
                .setup_commands
                .iter()
                .any(|c| c.contains(&value.to_string())),
            "{value} not among {:?}",
            volume.setup_commands
        );
    }
    for test in memory.tests.iter().filter(|t| t.workload.nocache) {
        assert!(!test.is_ok(), "{}", test.label());
    }
}

/// The poll suite (what `scripts/bench-poll.sh` measured): a target's
/// `poll_us` reaches the server's environment, a filesystem runs the
/// metadata rows a volume skips, and `idle` holds the server's CPU with no
/// client.
#[test]
fn poll_suite_beside_a_server_that_never_polls() {
    use ironpool_bench::suites::{OpsTest, Suite};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-poll-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool-fs:mirror:2x512M:poll_us=0",
        "--target",
        "ironpool:mirror:2x512M",
        "--no-raw",
        "--suite",
        "poll",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--files",
        "200",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [fs, volume] = &results.targets[..] else {
        panic!("two targets: {:?}", results.targets.len())
    };
    assert!(
        fs.setup_commands
            .iter()
            .any(
                |c| c.first().map(String::as_str) == Some("IRONPOOL_POLL_US=0")
                    && c.contains(&"serve".to_string())
            ),
        "{:?}",
        fs.setup_commands
    );
    assert!(!volume
        .setup_commands
        .iter()
        .any(|c| c.iter().any(|word| word.contains("IRONPOOL_POLL_US"))));
    for target in [fs, volume] {
        for test in &target.tests {
            assert_eq!(test.suite, Suite::Poll);
            let metadata = test.workload.ops.is_some_and(|ops| ops != OpsTest::Idle);
            assert_eq!(
                test.is_ok(),
                target.kind == "ironpool-fs" || !metadata,
                "{} {}: {:?}",
                target.label,
                test.label(),
                test.outcome
            );
        }
        let idle = target
            .tests
            .iter()
            .find(|t| t.workload.ops == Some(OpsTest::Idle))
            .unwrap();
        let usage = idle.server.expect("the server's CPU while idle");
        assert!(idle.wall_seconds >= 4.9, "{}", idle.wall_seconds);
        assert!(usage.cores_used < 2.0, "{usage:?}");
    }
}

/// The stall suite (what `scripts/bench-stall.sh` measured): each action
/// runs during a probe of another dataset of the pool, the probe's rows
/// are held to stall-none's, a filesystem's file is truncated and removed,
/// and the last action destroys the working set's dataset.
#[test]
fn stall_suite_probes_while_actions_run() {
    use ironpool_bench::suites::{OpsTest, Suite};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-stall-suite").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x512M",
        "--target",
        "ironpool-fs:mirror:2x512M",
        "--no-raw",
        "--suite",
        "stall",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--files",
        "500",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let planned = ironpool_bench::suites::stall_workloads();
    for target in &results.targets {
        assert_eq!(target.tests.len(), planned.len());
        let filesystem = target.kind == "ironpool-fs";
        for test in &target.tests {
            assert_eq!(test.suite, Suite::Stall);
            let files_only = [
                OpsTest::StallRemoveTree,
                OpsTest::StallTruncate,
                OpsTest::StallRemove,
            ];
            if !filesystem && files_only.contains(&test.workload.ops.unwrap()) {
                assert!(!test.is_ok(), "a volume has no files");
                continue;
            }
            assert!(
                test.is_ok(),
                "{} {}: {:?}",
                target.label,
                test.label(),
                test.outcome
            );
            // The probe ran its shortest time (the runtime is shorter), on
            // the probe dataset.
            assert!(test.wall_seconds >= 1.5, "{}", test.wall_seconds);
            assert!(
                test.command.iter().any(|a| a.contains("probe")),
                "{:?}",
                test.command
            );
            if test.workload.ops != Some(OpsTest::StallNone) {
                let limit = results.limit_for(target, test).expect("held to stall-none");
                assert_eq!(limit.workload.ops, Some(OpsTest::StallNone));
            }
        }
        // One note per probe, the action and the probe's longest read.
        let notes = target
            .notes
            .iter()
            .filter(|n| n.contains("the probe's longest read"))
            .count();
        let probes = planned.len() - if filesystem { 0 } else { 3 };
        assert_eq!(notes, probes, "{:?}", target.notes);
        let mut actions = vec![if filesystem {
            "-r bench/fs`"
        } else {
            "-r bench/vol`"
        }];
        if filesystem {
            actions.extend(["stall-truncate: `truncate -s 0 ", "stall-remove: `rm "]);
        }
        for action in actions {
            assert!(
                target.notes.iter().any(|n| n.contains(action)),
                "{action}: {:?}",
                target.notes
            );
        }
    }
}

/// The raidz suite (what `bench/raidz.sh` measured) on a layout with a
/// tunable set by the target (`tune.NAME=VALUE`): the writes' device
/// amplification counts parity.
#[test]
fn raidz_suite_with_a_tunable() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("raidz").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:raidz1:3x256M:tune.dirty_data_max_bytes=0",
        "--no-raw",
        "--suite",
        "raidz",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [target] = &results.targets[..] else {
        panic!("one target: {:?}", results.targets.len())
    };
    assert!(
        target
            .setup_commands
            .iter()
            .any(|c| c.contains(&"tune".to_string())
                && c.contains(&"dirty_data_max_bytes".to_string())
                && c.last().map(String::as_str) == Some("0")),
        "{:?}",
        target.setup_commands
    );
    assert_eq!(target.tests.len(), 2);
    for test in &target.tests {
        assert!(test.is_ok(), "{}: {:?}", test.label(), test.outcome);
        // Three disks of RAID-Z1: a parity sector for every two of data.
        let amplification = test.device.expect("device counters").write_amplification;
        assert!(amplification > 1.3, "{}: {amplification}", test.label());
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("dev write amp"));
}

/// The scheduler suite (what `bench/scheduler.sh` measured): the fairness
/// row's figures are its own QD1 reads, not the write load beside it.
#[test]
fn scheduler_suite_reads_beside_a_write_load() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("sched").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x512M:tune.classes=off",
        "--no-raw",
        "--suite",
        "scheduler",
        "--runtime",
        "1",
        "--size",
        "64M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let [target] = &results.targets[..] else {
        panic!("one target: {:?}", results.targets.len())
    };
    assert_eq!(target.tests.len(), 4);
    let loaded = target
        .tests
        .iter()
        .find(|t| t.workload.under_load)
        .expect("the fairness row");
    assert!(loaded.is_ok(), "{:?}", loaded.outcome);
    assert!(
        loaded.write.is_none(),
        "the load's writes counted as the test's"
    );
    assert!(loaded.read.is_some_and(|r| r.iops > 0.0));
    assert!(
        loaded.command.contains(&"--name=load".to_string())
            && !loaded.command.contains(&"--group_reporting".to_string()),
        "{:?}",
        loaded.command
    );
    // The devices saw the load's writes.
    assert!(loaded.device.is_some_and(|d| d.write_bytes > 0));
}

/// The datasets, soak and grow suites (what `bench/datasets.sh`,
/// `bench/soak.sh` and `bench/grow.sh` measured) on one small mirror:
/// snapshots taken during the writes and destroyed after, lz4 held to
/// compression off and writing fewer device bytes on compressible data,
/// a verifying soak sampled through, and a second mirror added between
/// the grow suite's two rows.
#[test]
fn datasets_soak_and_grow_suites() {
    use ironpool_bench::suites::{Compression, Suite};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let bin = ironpool_bin();
    let out = scratch("ironpool-dsg").join("out");
    let args = bench_args(&[
        "--target",
        "ironpool:mirror:2x512M",
        "--no-raw",
        "--suite",
        "datasets",
        "--suite",
        "soak",
        "--suite",
        "grow",
        "--runtime",
        "3",
        "--size",
        "128M",
        "--out",
        out.to_str().unwrap(),
    ]);
    run_bench(args, &bin, &out);
    let results = check_outputs(&out);
    let target = &results.targets[0];
    let find = |suite: Suite, name: &str| {
        target
            .tests
            .iter()
            .find(|t| t.suite == suite && t.name == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", target.tests))
    };
    for test in &target.tests {
        assert!(test.is_ok(), "{}: {:?}", test.label(), test.outcome);
    }
    // Snapshots: taken while the writes ran, held to the writes without.
    let snapshots = find(Suite::Datasets, "randwrite-16k-qd64-1j-in256m-snapshots");
    let limit = results
        .limit_for(target, snapshots)
        .expect("held to its load");
    assert!(!limit.workload.snapshots);
    assert!(
        target
            .notes
            .iter()
            .any(|n| n.contains("taken during the writes, one every 2 s")),
        "{:?}",
        target.notes
    );
    // lz4 is held to off, and on compressible data writes fewer device
    // bytes per byte fio wrote.
    let amp = |name: &str| {
        let test = find(Suite::Datasets, name);
        test.device.expect("device counters").write_amplification
    };
    let lz4 = find(Suite::Datasets, "randwrite-16k-qd64-1j-compressible-lz4");
    let limit = results.limit_for(target, lz4).expect("held to off");
    assert_eq!(limit.workload.compression, Some(Compression::Off));
    let (off, on) = (
        amp("randwrite-16k-qd64-1j-compressible-off"),
        amp("randwrite-16k-qd64-1j-compressible-lz4"),
    );
    assert!(on < 0.9 * off, "lz4 wrote {on:.2}x, off {off:.2}x");
    assert!(lz4
        .command
        .iter()
        .any(|a| a.starts_with("--buffer_compress_percentage")));
    assert!(
        target.notes.iter().any(|n| n.contains("compressratio")),
        "{:?}",
        target.notes
    );
    // The soak verified 8 regions and sampled the server through.
    let soak = find(Suite::Soak, "randrw70-16k-qd64-8j-verify");
    assert!(soak.command.iter().any(|a| a == "--verify=crc32c"));
    assert!(
        soak.command.iter().any(|a| a == "--offset_increment=16M"),
        "{:?}",
        soak.command
    );
    assert!(!soak.samples.is_empty());
    assert!(soak
        .samples
        .iter()
        .all(|s| s.server_rss_bytes.unwrap_or(0) > 0));
    assert!(soak.samples.iter().any(|s| s.pool_free_bytes.is_some()));
    // Grow: a second mirror between the two rows, which the writes after
    // reached; a quarter-full pool gets the notice.
    let grown = find(Suite::Grow, "randwrite-16k-qd64-1j-grown");
    let limit = results.limit_for(target, grown).expect("held to before");
    assert!(!limit.workload.grown && limit.suite == Suite::Grow);
    let after = target
        .notes
        .iter()
        .find(|n| n.starts_with("randwrite-16k-qd64-1j-grown: allocated"))
        .unwrap_or_else(|| panic!("{:?}", target.notes));
    assert!(
        after.contains("mirror-0") && after.contains("mirror-1"),
        "{after}"
    );
    assert!(
        target.pitfalls.iter().any(|f| f.check == "grow-fill"),
        "{:?}",
        target.pitfalls
    );
}
