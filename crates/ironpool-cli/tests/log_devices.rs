//! Log devices (SLOG) against the real binary: FLUSHes write their log
//! blocks to the log device, the records survive kill -9, a log device lost
//! with a crash refuses the import until the operator accepts the loss, a
//! log device that fails while the server writes moves the log to the main
//! devices without losing a flushed write, and `add`/`remove` change the
//! log devices of a served pool. `remove` of a data vdev moves its blocks
//! to the other vdevs before it leaves.

mod common;

use std::process::{Command, Stdio};

use common::{
    assert_check_clean, dir, distinct_bytes, stop_and_check, tool, NbdClient, SmallFilesystem,
    TestPool,
};

/// The devices of `iostat --json`, by file name.
fn devices(pool: &TestPool) -> Vec<(String, serde_json::Value)> {
    let text = pool.admin(&["--json", "iostat", &pool.name]);
    let stats: serde_json::Value = serde_json::from_str(&text).expect("iostat JSON");
    stats["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|device| {
            let path = device["path"].as_str().unwrap_or_default();
            let name = path.rsplit('/').next().unwrap_or_default().to_string();
            (name, device.clone())
        })
        .collect()
}

fn counter(devices: &[(String, serde_json::Value)], name: &str, key: &str) -> u64 {
    devices
        .iter()
        .find(|(device, _)| device == name)
        .unwrap_or_else(|| panic!("no device {name} in iostat"))
        .1[key]
        .as_u64()
        .unwrap_or(0)
}

/// The state of the leaf named `name` in `status --json`, and whether its
/// top-level vdev is a log.
fn leaf_state(status: &serde_json::Value, name: &str) -> Option<(String, bool)> {
    for top in status["vdevs"].as_array()? {
        for leaf in top["children"].as_array()? {
            if leaf["path"].as_str().unwrap_or_default().ends_with(name) {
                let state = leaf["state"].as_str().unwrap_or_default().to_string();
                return Some((state, top["log"].as_bool().unwrap_or(false)));
            }
        }
    }
    None
}

/// 24 writes each followed by a FLUSH on a pool whose txgs wait for their
/// timer: every log block goes to the log device (its write and flush
/// counters rise with each commit), the main devices write nothing, and
/// every flushed write is in the volume after kill -9 and a new `serve`.
#[test]
fn a_log_device_takes_every_flush_and_its_records_survive_kill_9() {
    let mut pool = TestPool::new("sl");
    pool.create("512M", &["mirror", "a.img", "b.img", "log", "c.img"]);
    pool.create_volume("vol", "64M");
    pool.serve_with(&["-o", "txg_timeout_ms=600000"]);
    let status = pool.status_json();
    assert_eq!(leaf_state(&status, "c.img"), Some(("ONLINE".into(), true)));
    let text = pool.admin(&["status", "sl"]);
    assert!(text.contains("logs"), "status has no logs section: {text}");
    // `--size` wrote the log device out (a sparse one makes every log flush
    // commit the host filesystem's allocation); the data devices are sparse.
    use std::os::unix::fs::MetadataExt;
    let allocated = |name: &str| {
        let metadata = std::fs::metadata(pool.path(name)).unwrap();
        (metadata.blocks() * 512, metadata.len())
    };
    let (log_allocated, log_length) = allocated("c.img");
    assert!(log_allocated >= log_length, "the log device file is sparse");
    let (data_allocated, data_length) = allocated("a.img");
    assert!(
        data_allocated < data_length / 2,
        "a data device file was written out"
    );
    let mut client = NbdClient::connect(&pool.socket(), "sl/vol");
    // The volume's first FLUSH starts its chain through a txg.
    assert_eq!(client.write_at(0, &distinct_bytes(16384, 9)), 0);
    assert_eq!(client.flush(), 0);
    let before = devices(&pool);
    let mut expected = Vec::new();
    for round in 0..24u64 {
        let offset = (round * 2 + 1) << 20;
        let data = distinct_bytes(16384, round as u8 ^ 0x33);
        assert_eq!(client.write_at(offset, &data), 0);
        assert_eq!(client.flush(), 0);
        expected.push((offset, data));
    }
    let after = devices(&pool);
    let grew = |name: &str, key: &str| counter(&after, name, key) - counter(&before, name, key);
    // Each commit is one durable (FUA) write of its log block: no flush.
    assert!(
        grew("c.img", "write_ops") >= 24 && grew("c.img", "durable_write_ops") >= 24,
        "the log device did not take the log blocks durably: {after:?}"
    );
    for main in ["a.img", "b.img"] {
        assert_eq!(
            (grew(main, "write_ops"), grew(main, "flush_ops")),
            (0, 0),
            "{main} was written or flushed by log commits"
        );
    }
    pool.kill9();
    drop(client);
    pool.serve();
    let mut reader = NbdClient::connect(&pool.socket(), "sl/vol");
    for (offset, data) in &expected {
        assert!(
            reader.read(*offset, data.len() as u32) == *data,
            "a write flushed to the log device at {offset:#x} was lost by kill -9"
        );
    }
    let notes = pool.status_json()["notes"].to_string();
    assert!(notes.contains("intent log: replayed"), "{notes}");
    drop(reader);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// The log device is gone when the pool comes back from a crash: its records
/// are lost with it, so `serve` refuses the pool with a message that names
/// the device and `-m`; with `-m` the pool imports DEGRADED, what txgs made
/// durable is intact, and `remove` of the missing device brings it ONLINE.
#[test]
fn a_log_device_lost_with_a_crash_refuses_the_import_until_its_loss_is_accepted() {
    let mut pool = TestPool::new("sm");
    pool.create("512M", &["mirror", "a.img", "b.img", "log", "c.img"]);
    pool.create_volume("vol", "64M");
    pool.serve_with(&["-o", "txg_timeout_ms=600000"]);
    let mut client = NbdClient::connect(&pool.socket(), "sm/vol");
    let committed = distinct_bytes(65536, 0x42);
    assert_eq!(client.write_at(0, &committed), 0);
    // The volume's first FLUSH commits a txg (it starts the log chain).
    assert_eq!(client.flush(), 0);
    for round in 1..8u64 {
        assert_eq!(client.write_at(round << 20, &distinct_bytes(16384, 1)), 0);
        assert_eq!(client.flush(), 0);
    }
    pool.kill9();
    drop(client);
    std::fs::remove_file(pool.path("c.img")).unwrap();
    let refused = pool.serve_refused();
    assert!(
        refused.contains("log device") && refused.contains("-m"),
        "the refusal does not say what is missing and how to go on: {refused}"
    );
    pool.serve_with(&["-m"]);
    let status = pool.status_json();
    assert_eq!(status["health"], "DEGRADED", "{status}");
    let mut reader = NbdClient::connect(&pool.socket(), "sm/vol");
    assert!(
        reader.read(0, 65536) == committed,
        "a committed write was lost"
    );
    drop(reader);
    let removed = pool.admin(&["remove", "sm", "c.img"]);
    assert!(removed.contains("ONLINE"), "{removed}");
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_eq!(leaf_state(&status, "c.img"), None, "{status}");
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
    // The pool no longer needs the device: a plain serve imports it.
    pool.serve();
    stop_and_check(&mut pool);
}

/// The filesystem under the log device shuts down (every I/O on it fails
/// with EIO) while fio writes and flushes after every write: fio sees no
/// error, the device is faulted and the pool DEGRADED with the log moved to
/// the main devices; `replace` with a new device brings the pool ONLINE;
/// after kill -9 every flushed write verifies.
#[test]
fn a_log_device_failing_under_a_flushing_writer_loses_no_flushed_write() {
    let mut pool = TestPool::new("sf");
    let host = SmallFilesystem::new(pool.dir.path(), 300);
    let a = pool.path("a.img").display().to_string();
    let b = pool.path("b.img").display().to_string();
    let c = host.mount_point.join("c.img").display().to_string();
    // Made here at 192 MiB: `--size` would write out a 512 MiB log file,
    // more than the small filesystem holds.
    std::fs::File::create(&c)
        .and_then(|file| file.set_len(192 << 20))
        .expect("the log device file");
    pool.ok(&[
        "create", "--size", "512M", "sf", "mirror", &a, &b, "log", &c,
    ]);
    let host_dir = host.mount_point.display().to_string();
    pool.ok(&[
        "volume",
        "create",
        "sf/v",
        "128M",
        "-d",
        &dir(&pool),
        "-d",
        &host_dir,
    ]);
    pool.serve_with(&["-d", &host_dir, "-o", "txg_timeout_ms=600000"]);
    let uri = pool.uri("v");
    let fio_args = |phase: &str| {
        let mut args = vec![
            "--name=w".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--rw=randwrite".into(),
            "--bs=16k".into(),
            "--size=96M".into(),
            "--verify=crc32c".into(),
        ];
        if phase == "write" {
            // Every write flushed, the last one too (fio flushes after a
            // write only when another follows, unless end_fsync is set).
            args.extend(["--fsync=1".into(), "--end_fsync=1".into()]);
            args.push("--do_verify=1".into());
        } else {
            args.push("--verify_only".into());
        }
        args
    };
    let mut writer = Command::new("fio")
        .args(fio_args("write"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio");
    // Let the log device take commits, then kill its filesystem.
    let started = std::time::Instant::now();
    loop {
        let log_writes = counter(&devices(&pool), "c.img", "write_ops");
        if log_writes >= 100 || started.elapsed() > std::time::Duration::from_secs(30) {
            assert!(log_writes >= 100, "the log device took no log blocks");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    host.shut_down();
    assert!(
        writer.try_wait().expect("fio status").is_none(),
        "fio ended before the log device failed: the test would prove nothing"
    );
    let output = writer.wait_with_output().expect("fio exits");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && text.contains("err= 0"),
        "fio failed when the log device died: {text}"
    );
    let status = pool.status_json();
    assert_eq!(status["health"], "DEGRADED", "{status}");
    let (state, log) = leaf_state(&status, "c.img").expect("c.img in status");
    assert!(log && state == "FAULTED", "{status}");
    let iostat = pool.admin(&["--json", "iostat", "sf"]);
    let iostat: serde_json::Value = serde_json::from_str(&iostat).unwrap();
    let fallbacks = iostat["volumes"][0]["intent_log"]["txg_fallbacks"]
        .as_u64()
        .unwrap_or(0);
    let commits = iostat["volumes"][0]["intent_log"]["commits"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        fallbacks < 64 && commits > 1000,
        "the log did not move to the main devices: {fallbacks} txg fallbacks, {commits} commits"
    );
    // A new log device in its place: nothing to rebuild (the log moves off
    // the failed one first), the pool is ONLINE at once.
    let new = pool.path("n.img").display().to_string();
    let replaced = pool.admin(&["replace", "--size", "512M", "sf", &c, &new]);
    assert!(replaced.contains("n.img"), "{replaced}");
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_eq!(leaf_state(&status, "n.img"), Some(("ONLINE".into(), true)));
    pool.kill9();
    pool.serve();
    let verify = tool(
        "fio",
        &fio_args("verify")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(verify.contains("err= 0"), "{verify}");
    assert_eq!(pool.status_json()["health"], "ONLINE");
    stop_and_check(&mut pool);
    drop(host);
}

/// `add` and `remove` on a served pool: a mirrored log device added while
/// the server runs takes the next FLUSHes; bad requests are refused with a
/// clear message and change nothing; after `remove` FLUSHes go to the main
/// devices again and the removed devices carry no label (a new pool can be
/// made of them without `-f`).
#[test]
fn log_devices_are_added_to_and_removed_from_a_served_pool() {
    let mut pool = TestPool::new("sa");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve_with(&["-o", "txg_timeout_ms=600000"]);
    let path = |name: &str| pool.path(name).display().to_string();
    let (c, d, e) = (path("c.img"), path("d.img"), path("e.img"));
    // A group of the wrong shape is refused; a log is a disk or a mirror.
    let message = pool.fails(&[
        "--control",
        &pool.control().display().to_string(),
        "add",
        "--size",
        "256M",
        "sa",
        "raidz1",
        &c,
    ]);
    assert!(message.contains("takes 2 to"), "{message}");
    assert_eq!(pool.status_json()["vdevs"].as_array().unwrap().len(), 1);
    let control = pool.control().display().to_string();
    let message = pool.fails(&[
        "--control",
        &control,
        "add",
        "--size",
        "256M",
        "sa",
        "log",
        "raidz1",
        &c,
        &d,
        &e,
    ]);
    assert!(message.contains("not RAID-Z"), "{message}");
    let message = pool.fails(&["--control", &control, "add", "sa", "log", &path("a.img")]);
    assert!(message.contains("a.img"), "{message}");
    let added = pool.admin(&["add", "--size", "256M", "sa", "log", "mirror", &c, &d]);
    assert!(added.contains("logs"), "{added}");
    let status = pool.status_json();
    assert_eq!(leaf_state(&status, "c.img"), Some(("ONLINE".into(), true)));
    assert_eq!(leaf_state(&status, "d.img"), Some(("ONLINE".into(), true)));
    assert_eq!(status["health"], "ONLINE");

    let mut client = NbdClient::connect(&pool.socket(), "sa/vol");
    assert_eq!(client.write_at(0, &distinct_bytes(16384, 3)), 0);
    assert_eq!(client.flush(), 0);
    let before = devices(&pool);
    let mut expected = Vec::new();
    for round in 1..=12u64 {
        let data = distinct_bytes(16384, round as u8);
        assert_eq!(client.write_at(round << 20, &data), 0);
        assert_eq!(client.flush(), 0);
        expected.push((round << 20, data));
    }
    let after = devices(&pool);
    for log in ["c.img", "d.img"] {
        let writes = counter(&after, log, "write_ops") - counter(&before, log, "write_ops");
        assert!(
            writes >= 12,
            "{log} took {writes} log writes for 12 FLUSHes"
        );
    }
    assert_eq!(
        counter(&after, "a.img", "write_ops"),
        counter(&before, "a.img", "write_ops")
    );

    // The only data vdev cannot be removed: its blocks have nowhere to go.
    let message = pool.fails(&["--control", &control, "remove", "sa", "a.img"]);
    assert!(message.contains("only data vdev"), "{message}");
    let removed = pool.admin(&["remove", "sa", "c.img"]);
    assert!(removed.contains("ONLINE"), "{removed}");
    assert_eq!(leaf_state(&pool.status_json(), "d.img"), None);
    let before = devices(&pool);
    for round in 20..26u64 {
        let data = distinct_bytes(16384, round as u8);
        assert_eq!(client.write_at(round << 20, &data), 0);
        assert_eq!(client.flush(), 0);
        expected.push((round << 20, data));
    }
    let after = devices(&pool);
    assert!(
        counter(&after, "a.img", "write_ops") > counter(&before, "a.img", "write_ops"),
        "FLUSHes after the removal did not write the main devices"
    );
    pool.kill9();
    drop(client);
    pool.serve();
    let mut reader = NbdClient::connect(&pool.socket(), "sa/vol");
    for (offset, data) in &expected {
        assert!(
            reader.read(*offset, data.len() as u32) == *data,
            "a flushed write at {offset:#x} was lost"
        );
    }
    drop(reader);
    let history = pool.admin(&["history", "sa"]);
    assert!(
        history.contains("add sa log mirror") && history.contains("remove sa"),
        "{history}"
    );
    stop_and_check(&mut pool);
    // The removed devices belong to no pool any more.
    pool.ok(&["create", "np", "mirror", &c, &d]);
}

/// A data vdev removed from a pool that is not served: `remove` waits for
/// the move, the vdev becomes `indirect-0` in `status --json` (shown on
/// the `remove:` line, not in the config), what was written reads back
/// through a server after it (qemu-io and NBD), and the refusals say why.
#[test]
fn a_data_vdev_leaves_a_pool_that_is_not_served_with_its_blocks() {
    let mut pool = TestPool::new("rd");
    pool.create("256M", &["a.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    let mut client = NbdClient::connect(&pool.socket(), "rd/vol");
    let mut expected = Vec::new();
    for round in 0..32u64 {
        let data = distinct_bytes(65536, round as u8 + 1);
        assert_eq!(client.write_at(round << 20, &data), 0);
        expected.push((round << 20, data));
    }
    assert_eq!(client.flush(), 0);
    drop(client);
    pool.stop();
    let dir = dir(&pool);
    let path = |name: &str| pool.path(name).display().to_string();
    // The only data vdev has nowhere to send its blocks; nothing is running
    // to stop.
    let message = pool.fails(&["remove", "rd", &path("a.img"), "-d", &dir]);
    assert!(message.contains("only data vdev"), "{message}");
    let message = pool.fails(&["remove", "-s", "rd", "-d", &dir]);
    assert!(message.contains("no vdev is being removed"), "{message}");
    pool.ok(&["add", "--size", "256M", "rd", &path("b.img"), "-d", &dir]);
    let out = pool.ok(&["remove", "rd", "disk-0", "-d", &dir]);
    assert!(out.contains("remove: removed indirect-0"), "{out}");
    assert!(!out.contains("a.img"), "{out}");
    let status: serde_json::Value =
        serde_json::from_str(&pool.ok(&["--json", "status", "rd", "-d", &dir])).unwrap();
    assert_eq!(status["vdevs"][0]["kind"], "indirect", "{status}");
    assert_eq!(status["vdevs"][0]["children"], serde_json::json!([]));
    assert_eq!(status["removal"]["state"], "none", "{status}");
    let removed = &status["removal"]["removed"][0];
    assert!(
        removed["moved_blocks"].as_u64().unwrap() >= 32
            && removed["moved_bytes"].as_u64().unwrap() >= 2 << 20,
        "{status}"
    );
    // The removed file is no longer the pool's: a new pool takes it
    // without -f.
    pool.ok(&["create", "other", &path("a.img")]);
    pool.ok(&["export", "other"]);
    pool.serve();
    let mut reader = NbdClient::connect(&pool.socket(), "rd/vol");
    for (offset, data) in &expected {
        assert!(
            reader.read(*offset, data.len() as u32) == *data,
            "the block at {offset:#x} did not move with the vdev"
        );
    }
    drop(reader);
    let history = pool.admin(&["history", "rd"]);
    assert!(history.contains("remove rd disk-0"), "{history}");
    stop_and_check(&mut pool);
}
