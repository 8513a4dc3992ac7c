//! Scrub and resilver on pools of real files served over NBD: blocks shared
//! by snapshots read once, a scrub cut short by kill -9 or an export resumed
//! at the next import, and what `status` says after a replace.

mod common;

use std::time::{Duration, Instant};

use common::{corrupt_file, dir, qemu_io, tool, TestPool};

/// Where a device's data area begins (labels before it).
const DATA_START: u64 = 1 << 20;
/// A scrub rate slow enough that a test sees the scrub running for seconds
/// on ~100 MiB of data.
const SLOW_SCRUB_RATE: &str = "16M";

fn scrub(pool: &TestPool) -> serde_json::Value {
    let text = pool.admin(&["--json", "scrub", "-w", &pool.name.clone()]);
    serde_json::from_str(text.lines().last().expect("scrub output")).expect("scrub JSON")
}

/// Bytes read from all the pool's devices so far, from `iostat`.
fn device_reads(pool: &TestPool) -> u64 {
    let text = pool.admin(&["--json", "iostat", &pool.name]);
    let json: serde_json::Value = serde_json::from_str(&text).expect("iostat JSON");
    json["devices"]
        .as_array()
        .expect("devices in iostat")
        .iter()
        .map(|device| device["read_bytes"].as_u64().expect("read_bytes"))
        .sum()
}

/// Polls `status` until `done` accepts its scrub part (at most a minute).
fn wait_for_scrub(
    pool: &TestPool,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = pool.status_json();
        if done(&status["scrub"]) {
            return status;
        }
        assert!(Instant::now() < deadline, "scrub never {what}: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A served mirror pool whose 128 MiB volume holds 96 MiB, then three
/// snapshots with 2 MiB changed before each of the later ones and after the
/// last: the snapshots and the volume share nearly every block.
fn pool_with_snapshots() -> (TestPool, String) {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x11 0 96M", "flush"]);
    pool.admin(&["snapshot", "tank/vol@s1"]);
    qemu_io(&uri, &["write -P 0x22 0 2M", "flush"]);
    pool.admin(&["snapshot", "tank/vol@s2"]);
    qemu_io(&uri, &["write -P 0x33 2M 2M", "flush"]);
    pool.admin(&["snapshot", "tank/vol@s3"]);
    qemu_io(&uri, &["write -P 0x44 4M 2M", "flush"]);
    (pool, uri)
}

#[test]
fn a_scrub_reads_blocks_shared_by_snapshots_once_and_still_repairs_them() {
    let (mut pool, uri) = pool_with_snapshots();
    let reads_before = device_reads(&pool);
    let first = scrub(&pool);
    let reads = device_reads(&pool) - reads_before;
    let (examined, total) = (
        first["examined_bytes"].as_u64().unwrap(),
        first["total_bytes"].as_u64().unwrap(),
    );
    assert!(total > 96 << 20, "{first}");
    // Every block once: the examined bytes are the allocated bytes (the
    // scrub's own commits add a little metadata meanwhile).
    assert!(
        examined <= total + total / 50,
        "examined {examined} of {total} allocated: shared blocks read more than once: {first}"
    );
    assert!(
        examined >= total - total / 10,
        "examined {examined} of {total} allocated: blocks missed: {first}"
    );
    assert!(
        first["progress_percent"].as_f64().unwrap() <= 100.0,
        "{first}"
    );
    assert_eq!(
        (first["bad_copies"].as_u64(), first["errors"].as_u64()),
        (Some(0), Some(0)),
        "{first}"
    );
    // Both sides of the mirror once each, not once per snapshot.
    assert!(
        reads <= 2 * total + total / 5,
        "{reads} bytes read from the devices for {total} allocated (two copies)"
    );
    pool.stop();

    // Damage side a inside the 96 MiB every snapshot and the volume share.
    let damaged = DATA_START + (40 << 20)..DATA_START + (48 << 20);
    corrupt_file(
        &pool.path("a.img"),
        damaged.start,
        (damaged.end - damaged.start) as usize,
    );
    pool.serve();
    let repaired = scrub(&pool);
    let bad = repaired["bad_copies"].as_u64().unwrap();
    assert!(
        bad > 0,
        "the damage in shared blocks was not found: {repaired}"
    );
    assert_eq!(
        repaired["repaired_copies"].as_u64(),
        Some(bad),
        "{repaired}"
    );
    assert_eq!(repaired["errors"], 0, "{repaired}");
    let again = scrub(&pool);
    assert_eq!(
        (again["bad_copies"].as_u64(), again["errors"].as_u64()),
        (Some(0), Some(0)),
        "the first scrub left damage: {again}"
    );
    for snapshot in ["s1", "s2", "s3"] {
        tool(
            "qemu-io",
            &[
                "-r",
                "-f",
                "raw",
                &pool.uri(&format!("vol@{snapshot}")),
                "-c",
                "read -P 0x11 40M 8M",
            ],
        );
    }
    qemu_io(&uri, &["read -P 0x11 40M 8M"]);
    pool.stop();
    // The repair rewrote side a: both sides agree again where it was damaged.
    let side_a = std::fs::read(pool.path("a.img")).unwrap();
    let side_b = std::fs::read(pool.path("b.img")).unwrap();
    let range = damaged.start as usize..damaged.end as usize;
    assert!(
        side_a[range.clone()] == side_b[range],
        "side a still differs from side b where it was damaged"
    );
    pool.ok(&["check", "tank", "-d", &dir(&pool)]);
}

#[test]
fn an_interrupted_scrub_resumes_at_the_next_import() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.create_volume("other", "64M");
    pool.serve_with(&["-o", &format!("scrub_rate_bytes={SLOW_SCRUB_RATE}")]);
    qemu_io(&pool.uri("vol"), &["write -P 0x11 0 64M", "flush"]);
    qemu_io(&pool.uri("other"), &["write -P 0x22 0 32M", "flush"]);

    // kill -9 while it runs: the next server resumes it.
    pool.admin(&["scrub", "tank"]);
    let running = wait_for_scrub(&pool, "started", |scrub| {
        scrub["examined_bytes"].as_u64().unwrap_or(0) > 0
    });
    let started = running["scrub"]["started_unix_seconds"].as_u64().unwrap();
    assert_eq!(running["scrub"]["state"], "scanning", "{running}");
    pool.kill9();
    pool.serve_with(&["-o", &format!("scrub_rate_bytes={SLOW_SCRUB_RATE}")]);
    let resumed = pool.status_json();
    assert_eq!(
        resumed["scrub"]["state"], "scanning",
        "the scrub was not resumed: {resumed}"
    );
    assert_eq!(resumed["scrub"]["resumed"], true, "{resumed}");
    assert_eq!(
        resumed["scrub"]["started_unix_seconds"].as_u64(),
        Some(started),
        "{resumed}"
    );
    let text = pool.admin(&["status", "tank"]);
    assert!(text.contains("resumed after an interruption"), "{text}");

    // An export (SIGTERM) while it runs keeps it for the next import too.
    pool.stop();
    pool.serve();
    let finished = wait_for_scrub(&pool, "finished", |scrub| scrub["state"] == "finished");
    let scrub = &finished["scrub"];
    assert_eq!(scrub["resumed"], true, "{finished}");
    assert_eq!(
        scrub["started_unix_seconds"].as_u64(),
        Some(started),
        "{finished}"
    );
    assert_eq!(scrub["last"]["completed"], true, "{finished}");
    assert_eq!(
        (scrub["errors"].as_u64(), scrub["bad_copies"].as_u64()),
        (Some(0), Some(0)),
        "{finished}"
    );
    // The bookmark's figures carry over without counting a block twice.
    let (examined, total) = (
        scrub["examined_bytes"].as_u64().unwrap(),
        scrub["total_bytes"].as_u64().unwrap(),
    );
    assert!(
        examined <= total + total / 50 && examined > 96 << 20,
        "examined {examined} of {total}: {finished}"
    );

    // A finished scrub is not resumed again...
    pool.kill9();
    pool.serve();
    assert_eq!(pool.status_json()["scrub"]["state"], "none");
    // ...nor one the operator stopped.
    pool.admin(&["tune", "tank", "scrub_rate_bytes", SLOW_SCRUB_RATE]);
    pool.admin(&["scrub", "tank"]);
    wait_for_scrub(&pool, "started", |scrub| {
        scrub["examined_bytes"].as_u64().unwrap_or(0) > 0
    });
    pool.admin(&["scrub", "-s", "tank"]);
    let stopped = wait_for_scrub(&pool, "stopped", |scrub| scrub["state"] == "finished");
    assert_eq!(stopped["scrub"]["last"]["completed"], false, "{stopped}");
    pool.kill9();
    pool.serve();
    let after = pool.status_json();
    assert_eq!(
        after["scrub"]["state"], "none",
        "a stopped scrub came back: {after}"
    );
    assert_eq!(after["scrub"]["last"]["completed"], false, "{after}");
    pool.stop();
}

#[test]
fn status_after_a_replace_shows_one_finished_scan_with_what_the_resilver_wrote() {
    let mut pool = TestPool::new("tank");
    pool.create("128M", &["raidz1", "d0.img", "d1.img", "d2.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    qemu_io(&pool.uri("vol"), &["write -P 0x11 0 40M", "flush"]);
    pool.stop();
    std::fs::remove_file(pool.path("d1.img")).unwrap();
    pool.serve();
    let text = pool.admin(&["status", "tank"]);
    assert!(text.contains("degraded: missing"), "{text}");
    let new = pool.path("new.img").display().to_string();
    pool.admin(&[
        "replace",
        "-w",
        "--size",
        "128M",
        "tank",
        &pool.path("d1.img").display().to_string(),
        &new,
    ]);

    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_eq!(status["resilver"]["state"], "finished", "{status}");
    assert_eq!(status["resilver"]["devices"][0], new.as_str(), "{status}");
    // The figure is what reached the new device: its columns, not whole blocks.
    let iostat: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", "tank"])).unwrap();
    let device = iostat["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|device| device["path"] == new.as_str())
        .expect("new device in iostat");
    let rewritten = status["resilver"]["rewritten_bytes"].as_u64().unwrap();
    assert_eq!(
        Some(rewritten),
        device["repaired_bytes"].as_u64(),
        "resilvered bytes vs the new device's: {status} {device}"
    );
    assert!(
        rewritten > 16 << 20 && rewritten < 32 << 20,
        "a third-ish of 40 MiB of data plus parity: {rewritten}"
    );

    let text = pool.admin(&["status", "tank"]);
    assert_eq!(text.matches("scan:").count(), 1, "{text}");
    assert!(!text.contains("unix time"), "{text}");
    assert!(text.contains(" UTC"), "{text}");
    assert!(!text.contains("degraded: missing"), "{text}");
    assert!(text.contains("in 1 pass with 0 errors"), "{text}");
    assert!(!text.contains("resilver of  in"), "{text}");
    pool.stop();
}
