//! Short real runs (1 s per test, small files): fio against a raw file and
//! a file on a pretend ZFS pool (fake kstat), and against nbdkit and the
//! stand-in ironpool of tests/data/fake-ironpool.sh. Needs fio and nbdkit.

mod common;

use std::path::Path;

use common::{bench_args, check_outputs, require_tool, scratch, ONE_RUN_AT_A_TIME};
use ironpool_bench::results::Outcome;
use ironpool_bench::suites::{Durability, Suite};

#[test]
fn raw_file_and_fake_zfs_file() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    let dir = scratch("real-raw");
    let out = dir.join("out");
    let kstat = dir.join("kstat");
    // A ZFS pool whose Direct I/O counters never move: every test must be
    // reported as direct I/O requested but not engaged.
    std::fs::create_dir_all(kstat.join("tank")).unwrap();
    std::fs::write(
        kstat.join("tank/iostats"),
        "30 1 0x01 4 1088 1 2\nname type data\ndirect_read_count 4 5\ndirect_write_count 4 7\n",
    )
    .unwrap();
    let file_target = format!("file:{}", dir.join("zfs/f.img").display());
    let args = bench_args(&[
        "--target",
        "raw",
        "--target",
        &file_target,
        "--suite",
        "qd-scaling",
        "--suite",
        "pool-report",
        "--qd",
        "1,8",
        "--jobs",
        "1",
        "--runtime",
        "1",
        "--size",
        "32M",
        "--out",
        out.to_str().unwrap(),
        "--zfs-kstat-dir",
        kstat.to_str().unwrap(),
        "--assume-zfs-pool",
        "tank",
    ]);
    ironpool_bench::run(args, Path::new("/nonexistent/ironpool")).unwrap();
    let results = check_outputs(&out);

    assert_eq!(results.targets.len(), 2);
    let raw = &results.targets[0];
    assert!(raw.baseline && raw.label == "raw");
    assert_eq!(raw.tests.len(), 4 + 5);
    assert!(raw.tests.iter().all(|t| t.is_ok()));
    assert_eq!(raw.record_size_bytes, Some(4096));
    // How full the host's filesystem is belongs to the machine, not to this
    // run: a CI machine's disk over 80% full is reported, truthfully, as a
    // fill-level warning. Nothing else may be found on a raw file.
    let (fill, others): (Vec<_>, Vec<_>) =
        raw.pitfalls.iter().partition(|f| f.check == "fill-level");
    assert!(others.is_empty(), "{:#?}", raw.pitfalls);
    assert!(
        fill.iter()
            .all(|f| f.message.contains("filesystem is") && f.message.contains("% full")),
        "{fill:#?}"
    );
    assert!(
        !out.join("raw.img").exists(),
        "the raw file is removed without --keep"
    );

    let file = &results.targets[1];
    let direct: Vec<_> = file
        .pitfalls
        .iter()
        .filter(|f| f.check == "direct-io")
        .collect();
    assert_eq!(
        direct.len(),
        1,
        "one collapsed direct-io finding: {:#?}",
        file.pitfalls
    );
    assert!(
        direct[0].message.contains("ZFS pool tank") && direct[0].message.contains("and 5 more"),
        "{}",
        direct[0].message
    );
    assert!(
        !dir.join("zfs/f.img").exists(),
        "a file the tool created is removed"
    );

    // Findings computed from the data made it into results.json and the report.
    let qd = results
        .findings
        .iter()
        .filter(|f| f.check == "qd-scaling")
        .count();
    assert_eq!(
        qd, 4,
        "two workloads on two targets: {:#?}",
        results.findings
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("QD8 gives"),
        "no queue-depth finding in the report"
    );
    assert!(
        report.contains("= ") && report.contains("x raw"),
        "no ratio to raw in the findings"
    );
}

#[test]
fn nbdkit_and_stand_in_ironpool() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("fio", "fio");
    require_tool("nbdkit", "nbdkit");
    require_tool("nbdinfo", "libnbd-bin");
    let dir = scratch("real-nbd");
    let out = dir.join("out");
    let fake = format!("{}/tests/data/fake-ironpool.sh", env!("CARGO_MANIFEST_DIR"));
    let args = bench_args(&[
        "--target",
        "nbdkit",
        "--target",
        "ironpool:mirror:2x1G",
        "--no-raw",
        "--suite",
        "qd-scaling",
        "--suite",
        "durable",
        "--qd",
        "1,4",
        "--jobs",
        "1",
        "--runtime",
        "1",
        "--size",
        "32M",
        "--out",
        out.to_str().unwrap(),
        "--ironpool-bin",
        &fake,
    ]);
    ironpool_bench::run(args, Path::new("/nonexistent/ironpool")).unwrap();
    let results = check_outputs(&out);
    assert!(results.baseline().is_none());
    assert_eq!(
        results.machine.ironpool_version.as_deref(),
        Some("ironpool 0.0.0-fake")
    );
    assert!(results
        .machine
        .nbdkit_version
        .as_deref()
        .is_some_and(|v| v.starts_with("nbdkit")));

    for target in &results.targets {
        let ok: Vec<_> = target.tests.iter().filter(|t| t.is_ok()).collect();
        // The volume makes every write durable by sync=always; nbdkit cannot.
        let by_property = usize::from(target.kind == "ironpool");
        assert_eq!(
            ok.len(),
            4 + 3 + by_property,
            "{}: qd-scaling, the flush tests and plain writes run over NBD",
            target.label
        );
        // Every test measured its server; CPU time comes in clock ticks
        // (10 ms), so a short test of a light server can read 0: the sum over
        // the tests cannot.
        assert!(
            ok.iter().all(|t| t.server.is_some()),
            "{}: a test without server figures",
            target.label
        );
        let cpu: f64 = ok
            .iter()
            .filter_map(|t| t.server.map(|s| s.cpu_seconds))
            .sum();
        assert!(cpu > 0.0, "{}: server CPU", target.label);
        let skipped = target
            .tests
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Skipped { .. }))
            .count();
        assert_eq!(
            skipped,
            2 - by_property,
            "{}: no FUA (but sync=always on a volume) and no fdatasync over fio's nbd engine",
            target.label
        );
        let flushed = ok
            .iter()
            .filter(|t| t.suite == Suite::Durable)
            .filter(|t| {
                matches!(
                    t.workload.durability,
                    Durability::Fsync | Durability::FsyncEvery(_)
                )
            })
            .all(|t| t.sync.is_some_and(|s| s.samples > 0));
        assert!(flushed, "{}: the -fsync tests flushed", target.label);
    }

    let ironpool = &results.targets[1];
    assert_eq!(ironpool.kind, "ironpool");
    let settings = std::fs::read_to_string(out.join("ironpool-mirror-2x1G/fake-settings"))
        .expect("the dsync test set sync");
    assert!(
        settings.contains("sync=always bench/vol") && settings.contains("sync=standard bench/vol"),
        "sync=always for the dsync test, then back: {settings}"
    );
    assert_eq!(ironpool.record_size_bytes, Some(16 * 1024));
    assert_eq!(ironpool.setup_commands[0][1..4], ["create", "--size", "1G"]);
    assert!(ironpool
        .setup_commands
        .iter()
        .any(|c| c.contains(&"volblocksize=16K".to_string())));
    let device = ironpool.tests[0]
        .device
        .expect("device figures from iostat");
    assert_eq!(device.average_write_size_bytes, 524_288.0);
    assert_eq!(device.write_aggregation, 32.0);
    assert!(ironpool.tests[0].volume.is_some());
    // The stand-in reports no direct writes, and 4K reads on 16K blocks.
    assert!(
        ironpool.pitfalls.iter().any(|f| f.check == "direct-io"),
        "{:#?}",
        ironpool.pitfalls
    );
    assert!(
        ironpool.pitfalls.iter().any(|f| f.check == "alignment"),
        "{:#?}",
        ironpool.pitfalls
    );
    for leftover in ["nbd.sock", "ctl.sock", "serve.pid", "d0.img", "d1.img"] {
        assert!(
            !out.join("ironpool-mirror-2x1G").join(leftover).exists(),
            "{leftover} left behind"
        );
    }
    assert!(
        !out.join("nbdkit").join("nbd.sock").exists(),
        "nbdkit socket left behind"
    );
}
