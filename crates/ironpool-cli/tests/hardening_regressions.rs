//! Regression tests for the behaviours issue 21 ("Hardening") found right and
//! that must stay so: a running server (the real binary) under real NBD
//! clients (fio, qemu-io, nbdinfo, a raw NBD client) on pools of real sparse
//! files, while its devices are truncated or deleted, admin commands race a
//! writer, the process is stopped or killed, or a client misbehaves.
//!
//! Items of the issue covered elsewhere: another pool's device at create
//! (cli_errors.rs `create_refuses_devices_of_another_pool_unless_forced`),
//! kill -9 mid-scrub (scrub_nbd.rs `an_interrupted_scrub_resumes_at_the_next_import`),
//! kill -9 mid-receive (import_hardening.rs
//! `a_receive_killed_mid_stream_is_discarded_at_import_unless_started_with_s`),
//! hostile streams (replication.rs
//! `damaged_truncated_and_mismatched_streams_leave_the_target_unchanged`, the
//! `send_stream` fuzz target) and hostile NBD input (nbd_bad_input.rs).
//!
//! Two of these found bugs, fixed with them: a scrub walking a volume or
//! snapshot destroyed under it "repaired" blocks that had reused its freed
//! space (admin commands racing a writer), and reads queued for a replaced
//! device charged the new one with checksum errors (replace under load).

mod common;

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    assert_check_clean, dir, distinct_bytes, qemu_io, stop_and_check, tool, tool_fails, NbdClient,
    TestPool, NBD_CMD_FLUSH, NBD_CMD_READ, NBD_CMD_WRITE,
};

const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const NBD_CMD_TRIM: u16 = 4;
const NBD_CMD_CACHE: u16 = 5;
const NBD_CMD_WRITE_ZEROES: u16 = 6;

// ---------------------------------------------------------------------------
// Helpers

/// Starts fio on `uri`: random 16 KiB writes at queue depth 64, each block
/// read back and checked (crc32c) while the job runs, for `seconds`, over the
/// first `size` of the volume.
fn start_verified_writer(uri: &str, size: &str, seconds: u64) -> Child {
    start_fio(
        uri,
        &[
            "--rw=randwrite",
            "--iodepth=64",
            &format!("--size={size}"),
            "--verify_backlog=1024",
            "--time_based",
            &format!("--runtime={seconds}"),
        ],
    )
}

/// Starts fio on `uri` writing 16 KiB blocks that it reads back and checks
/// (crc32c), with `job` saying where, how and how long.
fn start_fio(uri: &str, job: &[&str]) -> Child {
    Command::new("fio")
        .args([
            "--name=verified",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--bs=16k",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--output-format=json",
        ])
        .args(job)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio (is it installed?)")
}

/// Waits for a fio started by [`start_fio`] and fails the test unless it
/// exited 0, reported no error, wrote and verified data it had written.
fn verified_writer_passed(fio: Child) -> serde_json::Value {
    let job = fio_passed(fio);
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0,
        "fio wrote nothing: {job}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap_or(0) > 0,
        "fio verified nothing: {job}"
    );
    job
}

/// Waits for fio and fails the test unless it exited 0 with no error.
fn fio_passed(fio: Child) -> serde_json::Value {
    let output = fio.wait_with_output().expect("wait for fio");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "fio failed ({}): {stderr}\n{stdout}",
        output.status
    );
    let json: serde_json::Value = serde_json::from_str(
        &stdout[stdout
            .find('{')
            .unwrap_or_else(|| panic!("no fio JSON: {stdout}"))..],
    )
    .expect("fio JSON");
    let job = json["jobs"][0].clone();
    assert_eq!(job["error"], 0, "fio: {job}");
    assert!(!stderr.contains("verify:"), "{stderr}");
    job
}

fn still_running(child: &mut Child) -> bool {
    child.try_wait().expect("try_wait").is_none()
}

fn server_alive(pool: &mut TestPool) -> bool {
    pool.server
        .as_mut()
        .is_some_and(|child| child.try_wait().ok().flatten().is_none())
}

fn server_pid(pool: &TestPool) -> i32 {
    pool.server.as_ref().expect("a running server").id() as i32
}

/// The server is running and never panicked.
fn assert_server_healthy(pool: &mut TestPool) {
    assert!(server_alive(pool), "the server died: {}", pool.log());
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

/// The status entry of the device at `path`.
fn device<'a>(status: &'a serde_json::Value, path: &Path) -> &'a serde_json::Value {
    let path = path.display().to_string();
    status["vdevs"][0]["children"]
        .as_array()
        .expect("children")
        .iter()
        .find(|child| child["path"] == path.as_str())
        .unwrap_or_else(|| panic!("no device {path} in {status}"))
}

fn errors_of(device: &serde_json::Value) -> u64 {
    ["read_errors", "write_errors", "checksum_errors"]
        .iter()
        .map(|counter| device[counter].as_u64().expect("error counter"))
        .sum()
}

/// Polls `status` until no resilver runs (at most two minutes).
fn wait_resilvered(pool: &TestPool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = pool.status_json();
        if status["resilver"]["state"] != "resilvering" {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the resilver never ended: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn truncate(path: &Path, bytes: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open the device file")
        .set_len(bytes)
        .expect("truncate the device file");
}

fn send_request(client: &mut NbdClient, command: u16, cookie: u64, offset: u64, length: u32) {
    client
        .stream
        .write_all(&NbdClient::request(command, cookie, offset, length))
        .expect("send a request");
}

/// One READ: its data, or the error the server replied with.
fn try_read(client: &mut NbdClient, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
    send_request(client, NBD_CMD_READ, 7, offset, length);
    let (error, cookie) = NbdClient::reply(&mut client.stream);
    assert_eq!(cookie, 7);
    if error != 0 {
        return Err(error);
    }
    let mut data = vec![0u8; length as usize];
    client.stream.read_exact(&mut data).expect("read data");
    Ok(data)
}

/// A hash of every byte of a volume, read over NBD 4 MiB at a time.
fn volume_digest(pool: &TestPool, volume: &str) -> u64 {
    let mut client = NbdClient::connect(&pool.socket(), &format!("{}/{volume}", pool.name));
    let mut hasher = DefaultHasher::new();
    let mut offset = 0;
    while offset < client.size_bytes {
        let length = (client.size_bytes - offset).min(4 << 20) as u32;
        hasher.write(&client.read(offset, length));
        offset += length as u64;
    }
    hasher.finish()
}

// ---------------------------------------------------------------------------
// Devices going away under load

/// Issue 21, item 1: one side of a mirror truncated to 1 MiB while fio writes
/// and verifies at queue depth 64: every verification passes (reads come from
/// the intact side), the truncated side is taken out of service or at least
/// counted, the intact side has no error, and the pool stays consistent.
#[test]
fn a_mirror_side_truncated_under_verified_qd64_writes_keeps_serving_right_data() {
    let mut pool = TestPool::new("trunc");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x3c 192M 32M", "flush"]);
    let mut fio = start_verified_writer(&uri, "128M", 5);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(still_running(&mut fio), "fio ended before the truncation");
    truncate(&pool.path("b.img"), 1 << 20);
    verified_writer_passed(fio);
    // Data written before the truncation, outside fio's range.
    qemu_io(&uri, &["read -P 0x3c 192M 32M"]);
    // Whether fio's own reads met the truncated side depends on how far it
    // got before the cut and on which side the mirror read from; a scrub
    // reads every copy, so the loss is found however the race went.
    pool.admin(&["scrub", "-w", "trunc"]);

    let status = pool.status_json();
    let (a, b) = (
        device(&status, &pool.path("a.img")),
        device(&status, &pool.path("b.img")),
    );
    assert!(
        b["state"] == "FAULTED" || errors_of(b) > 0,
        "the truncated side is neither faulted nor counted: {status}"
    );
    if b["state"] == "FAULTED" {
        assert_eq!(status["health"], "DEGRADED", "{status}");
    }
    assert_eq!(a["state"], "ONLINE", "{status}");
    assert_eq!(errors_of(a), 0, "{status}");
    assert_eq!(status["unrecoverable_reads"], 0, "{status}");
    assert!(status["suspended"].is_null(), "{status}");
    assert_check_clean(&pool);
    assert_server_healthy(&mut pool);
    // The pool exports, and imports again without the truncated side.
    stop_and_check(&mut pool);
}

/// Issue 21, item 2: the only device of a pool truncated under a served
/// volume: a read of data that lay past the new end fails with EIO, it never
/// returns zeros (or anything but what was written).
#[test]
fn a_truncated_single_device_gives_eio_never_zeros() {
    let mut pool = TestPool::new("one");
    pool.create("512M", &["a.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x5a 0 64M", "flush"]);
    truncate(&pool.path("a.img"), 16 << 20);

    let mut client = NbdClient::connect(&pool.socket(), "one/vol");
    let mut failed = 0;
    for megabyte in 0..64u64 {
        match try_read(&mut client, megabyte << 20, 1 << 20) {
            Ok(data) => {
                let wrong = data.iter().position(|byte| *byte != 0x5a);
                assert!(
                    wrong.is_none(),
                    "a read at {megabyte} MiB of a truncated device succeeded with wrong data \
                     (byte {:?} is {:#x})",
                    wrong,
                    data[wrong.unwrap()]
                );
            }
            Err(error) => {
                assert_eq!(error, EIO, "a read at {megabyte} MiB");
                failed += 1;
            }
        }
    }
    assert!(
        failed > 0,
        "every read succeeded though most of the data lay past the truncation"
    );
    // A real client sees the error too.
    let output = tool_fails("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x5a 32M 1M"]);
    assert!(output.contains("Input/output error"), "{output}");
    assert!(!output.contains("Pattern verification failed"), "{output}");
    let status = pool.status_json();
    assert!(
        status["unrecoverable_reads"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert!(
        errors_of(device(&status, &pool.path("a.img"))) > 0,
        "{status}"
    );
    assert_server_healthy(&mut pool);
    // SIGTERM still ends it (the export fails: nothing left to write to).
    pool.stop();
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

/// Issue 21, item 3: a mirror side deleted (unlinked) under verified writers
/// (random at QD64, and sequential, each block once), then `ironpool replace`
/// while they go on: every verification passes, the resilver completes
/// without error, the pool is ONLINE after, and the new side and the old one
/// each hold the whole volume (read with the other offline, they agree byte
/// for byte), and no device counts an error: reads queued for the deleted
/// file when it was swapped out went to the new, still empty device, which
/// was charged checksum errors for them.
#[test]
fn a_deleted_mirror_side_replaced_under_verified_load_resilvers_to_a_healthy_pool() {
    let mut pool = TestPool::new("del");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x11 224M 32M", "flush"]);
    let (a, b, new) = (pool.path("a.img"), pool.path("b.img"), pool.path("new.img"));
    // Both writers run long enough (10 s, 8 s) that a replace slowed by a
    // loaded machine still starts while they write.
    let mut random = start_verified_writer(&uri, "128M", 10);
    // Blocks written once and not read back until the new side is alone: what
    // it missed stays missed (a read would heal it from a).
    let sequential_job = [
        "--rw=write",
        "--iodepth=16",
        "--offset=128M",
        "--size=96M",
        "--rate=12m",
        "--do_verify=0",
    ];
    let mut sequential = start_fio(&uri, &sequential_job);
    // And reads at queue depth 64, so that reads are queued for b when it is
    // swapped out.
    let mut reader = start_fio(
        &uri,
        &[
            "--rw=randread",
            "--verify=0",
            "--iodepth=64",
            "--offset=224M",
            "--size=32M",
            "--time_based",
            "--runtime=4",
        ],
    );
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::remove_file(&b).expect("delete side b");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        still_running(&mut random) && still_running(&mut sequential) && still_running(&mut reader),
        "fio ended before the replace"
    );
    pool.admin(&[
        "replace",
        "--size",
        "512M",
        "del",
        &b.display().to_string(),
        &new.display().to_string(),
    ]);
    assert!(
        still_running(&mut random) && still_running(&mut sequential),
        "fio ended before the resilver began"
    );
    let status = wait_resilvered(&pool);
    verified_writer_passed(random);
    let job = fio_passed(sequential);
    assert_eq!(job["write"]["io_bytes"].as_u64(), Some(96 << 20), "{job}");
    let job = fio_passed(reader);
    assert!(job["read"]["io_bytes"].as_u64().unwrap_or(0) > 0, "{job}");

    assert_eq!(status["resilver"]["state"], "finished", "{status}");
    assert_eq!(status["resilver"]["errors"], 0, "{status}");
    assert_eq!(
        status["resilver"]["devices"][0],
        new.display().to_string().as_str(),
        "{status}"
    );
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_eq!(
        status["vdevs"][0]["children"].as_array().unwrap().len(),
        2,
        "{status}"
    );
    for side in [&a, &new] {
        let side = device(&status, side);
        assert_eq!(side["state"], "ONLINE", "{status}");
        assert_eq!(side["needs_resilver"], false, "{status}");
        assert_eq!(errors_of(side), 0, "{status}");
    }
    assert_eq!(status["unrecoverable_reads"], 0, "{status}");
    // Each side alone holds the whole volume.
    let (a_name, new_name) = (a.display().to_string(), new.display().to_string());
    pool.admin(&["offline", "del", &a_name]);
    qemu_io(&uri, &["read -P 0x11 224M 32M"]);
    let verify: Vec<&str> = sequential_job
        .iter()
        .copied()
        .filter(|option| *option != "--do_verify=0")
        .chain(["--verify_only"])
        .collect();
    let job = fio_passed(start_fio(&uri, &verify));
    assert_eq!(job["read"]["io_bytes"].as_u64(), Some(96 << 20), "{job}");
    let through_new = volume_digest(&pool, "vol");
    pool.admin(&["online", "del", &a_name]);
    wait_resilvered(&pool);
    pool.admin(&["offline", "del", &new_name]);
    let through_a = volume_digest(&pool, "vol");
    pool.admin(&["online", "del", &new_name]);
    assert_eq!(
        through_new, through_a,
        "the resilvered side and the old one differ"
    );
    let status = wait_resilvered(&pool);
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_check_clean(&pool);
    assert_server_healthy(&mut pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 4 (replace; create is covered in cli_errors.rs, and there is
/// no `add`): a device of another pool is refused as a replacement without
/// -f, naming that pool, and changes nothing; one that another server holds
/// is refused even with -f; with -f an exported pool's device is taken over.
#[test]
fn replace_refuses_another_pools_device_unless_forced_and_a_served_one_always() {
    let mut other = TestPool::new("other");
    other.create("512M", &["x.img"]);
    let x = other.path("x.img").display().to_string();
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x21 0 32M", "flush"]);
    let b = pool.path("b.img").display().to_string();

    other.serve();
    let error = pool.admin_fails(&["replace", "-f", "tank", &b, &x]);
    assert!(error.contains("in use"), "{error}");
    assert_server_healthy(&mut other);
    other.stop();

    let error = pool.admin_fails(&["replace", "tank", &b, &x]);
    assert!(
        error.contains("belongs to pool 'other'") && error.contains("-f"),
        "{error}"
    );
    // Nothing changed: b is still in service, other still imports from x.
    let status = pool.status_json();
    assert_eq!(
        device(&status, Path::new(&b))["state"],
        "ONLINE",
        "{status}"
    );
    assert_eq!(status["resilver"]["state"], "none", "{status}");
    assert_eq!(status["health"], "ONLINE", "{status}");
    let other_status = other.ok(&["status", "other", "-d", &dir(&other)]);
    assert!(other_status.contains("ONLINE"), "{other_status}");

    pool.admin(&["replace", "-f", "-w", "tank", &b, &x]);
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    assert_eq!(status["resilver"]["errors"], 0, "{status}");
    assert_eq!(
        device(&status, Path::new(&x))["state"],
        "ONLINE",
        "{status}"
    );
    qemu_io(&uri, &["read -P 0x21 0 32M"]);
    let error = other.fails(&["status", "other", "-d", &dir(&other)]);
    assert!(error.contains("belongs to pool 'tank'"), "{error}");
    assert_server_healthy(&mut pool);
    stop_and_check(&mut pool);
}

// ---------------------------------------------------------------------------
// The server under admin commands, SIGSTOP and kill -9

/// Issue 21, item 5: snapshot, list, status, set, iostat, scrub and volume
/// create/destroy of other volumes, round after round while fio writes and
/// verifies at queue depth 64: fio's verification passes, the server lives,
/// no device counts an error, and `check` finds nothing wrong.
#[test]
fn admin_commands_racing_a_verified_qd64_writer_leave_data_and_pool_intact() {
    /// How many rounds of commands must race a writer (it still runs once
    /// the round's snapshot is taken).
    const ADMIN_ROUNDS_WHILE_WRITING: usize = 4;
    let mut pool = TestPool::new("adm");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    let mut fio = start_verified_writer(&uri, "192M", 6);
    std::thread::sleep(Duration::from_millis(500));
    // Rounds are counted, not timed: a slow or busy machine gets a new
    // verified writer (each checks its own writes) until enough rounds have
    // overlapped one, so the race is exercised however long a round takes.
    let mut rounds_while_writing = 0;
    let mut writers = 1;
    let mut round = 0;
    while rounds_while_writing < ADMIN_ROUNDS_WHILE_WRITING {
        assert!(
            round < 10 * ADMIN_ROUNDS_WHILE_WRITING,
            "only {rounds_while_writing} of {round} rounds overlapped {writers} writers"
        );
        if !still_running(&mut fio) {
            verified_writer_passed(fio);
            fio = start_verified_writer(&uri, "192M", 6);
            writers += 1;
        }
        pool.admin(&["snapshot", &format!("adm/vol@r{round}")]);
        // The round raced the writer if it still wrote once the snapshot was
        // taken (a round slower than a whole writer still counts then).
        let raced = still_running(&mut fio);
        let snapshots = pool.admin(&["list", "-t", "snapshot", "adm"]);
        assert!(
            snapshots.contains(&format!("adm/vol@r{round}")),
            "{snapshots}"
        );
        let status = pool.admin(&["status", "adm"]);
        assert!(status.contains("ONLINE"), "{status}");
        let iostat: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "iostat", "adm"])).expect("iostat JSON");
        assert_eq!(iostat["devices"].as_array().map(Vec::len), Some(2));
        let compression = if round % 2 == 0 { "lz4" } else { "off" };
        pool.admin(&["set", &format!("compression={compression}"), "adm/vol"]);
        pool.admin(&["set", &format!("test:round={round}"), "adm/vol"]);
        let extra = format!("adm/extra{round}");
        pool.admin(&["volume", "create", &extra, "32M"]);
        qemu_io(
            &pool.uri(&format!("extra{round}")),
            &["write -P 0x42 0 4M", "flush", "read -P 0x42 0 4M"],
        );
        if pool.status_json()["scrub"]["state"] != "scanning" {
            pool.admin(&["scrub", "adm"]);
        }
        pool.admin(&["volume", "destroy", &extra]);
        if round >= 2 {
            pool.admin(&["destroy", &format!("adm/vol@r{}", round - 2)]);
        }
        if raced {
            rounds_while_writing += 1;
        }
        round += 1;
    }
    verified_writer_passed(fio);
    assert_server_healthy(&mut pool);
    let volumes = pool.admin(&["volume", "list", "adm"]);
    assert!(!volumes.contains("extra"), "{volumes}");
    let property: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "get", "test:round", "adm/vol"])).unwrap();
    assert_eq!(
        property["properties"][0]["value"],
        (round - 1).to_string().as_str(),
        "{property}"
    );
    // The last snapshot reads as a volume.
    tool("nbdinfo", &[&pool.uri(&format!("vol@r{}", round - 1))]);
    let scrub: serde_json::Value = loop {
        // A scrub started in the last round may still run.
        let status = pool.status_json();
        if status["scrub"]["state"] != "scanning" {
            let text = pool.admin(&["--json", "scrub", "-w", "adm"]);
            break serde_json::from_str(text.lines().last().expect("scrub output"))
                .expect("scrub JSON");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        (scrub["errors"].as_u64(), scrub["bad_copies"].as_u64()),
        (Some(0), Some(0)),
        "{scrub}"
    );
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    for side in ["a.img", "b.img"] {
        assert_eq!(errors_of(device(&status, &pool.path(side))), 0, "{status}");
    }
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 6: the server stopped (SIGSTOP) for 20 s while fio has 64
/// verified writes in flight, a raw client sends writes and a flush, and
/// another client connects: after SIGCONT every request completes without
/// error, fio's verification passes, the writes read back, and no device was
/// blamed for the pause.
#[test]
fn sigstop_for_20_seconds_under_io_then_sigcont_completes_every_request() {
    let mut pool = TestPool::new("stop");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    let pid = server_pid(&pool);
    let mut raw = NbdClient::connect(&pool.socket(), "stop/vol");
    let mut fio = start_verified_writer(&uri, "128M", 4);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(still_running(&mut fio));
    // SAFETY: kill(2) on the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    // Requests sent while it is stopped: 32 writes of 64 KiB, then a flush.
    let sender = std::thread::spawn(move || {
        for cookie in 0..32u64 {
            let mut bytes =
                NbdClient::request(NBD_CMD_WRITE, cookie, (200 << 20) + cookie * 65536, 65536);
            bytes.extend_from_slice(&[0x80 + cookie as u8; 65536]);
            raw.stream.write_all(&bytes).expect("send a write");
        }
        raw.stream
            .write_all(&NbdClient::request(NBD_CMD_FLUSH, 100, 0, 0))
            .expect("send a flush");
        let mut replies = Vec::new();
        for _ in 0..33 {
            replies.push(NbdClient::reply(&mut raw.stream));
        }
        replies
    });
    // A client that connects while the server is stopped.
    let late = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x66 240M 1M",
            "-c",
            "flush",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-io");
    std::thread::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed()));
    assert!(
        still_running(&mut fio),
        "fio ended while the server was stopped"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);

    let replies = sender.join().expect("the raw client");
    let mut cookies: Vec<u64> = replies
        .iter()
        .map(|(error, cookie)| {
            assert_eq!(*error, 0, "request {cookie} failed after SIGCONT");
            *cookie
        })
        .collect();
    cookies.sort_unstable();
    assert_eq!(cookies, (0..32).chain([100]).collect::<Vec<u64>>());
    let late = late.wait_with_output().expect("qemu-io");
    assert!(
        late.status.success(),
        "a client that connected while the server was stopped failed: {}",
        String::from_utf8_lossy(&late.stderr)
    );
    verified_writer_passed(fio);
    let mut checks = vec!["read -P 0x66 240M 1M".to_string()];
    for cookie in 0..32u64 {
        checks.push(format!(
            "read -P {:#x} {} 64k",
            0x80 + cookie,
            (200u64 << 20) + cookie * 65536
        ));
    }
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let output = qemu_io(&uri, &checks);
    assert!(!output.contains("failed"), "{output}");
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    for side in ["a.img", "b.img"] {
        assert_eq!(errors_of(device(&status, &pool.path(side))), 0, "{status}");
    }
    assert_server_healthy(&mut pool);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 7 (resilver; scrub and receive are covered elsewhere, but a
/// scrub killed here is followed by `check` too): kill -9 while a replaced
/// side resilvers: the next server finishes the resilver, both sides hold
/// the same data, the data flushed before is intact and `check` is clean;
/// the same after a kill -9 mid-scrub.
#[test]
fn kill_9_mid_resilver_or_scrub_imports_consistent_and_the_resilver_finishes() {
    let mut pool = TestPool::new("rk");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0x44 0 224M", "flush"]);
    pool.stop();
    let (a, b, new) = (pool.path("a.img"), pool.path("b.img"), pool.path("new.img"));
    std::fs::remove_file(&b).unwrap();
    // One rebuild I/O at a time: a resilver that lasts long enough to be killed.
    pool.serve_with(&["-o", "rebuild_min_active=1", "-o", "rebuild_max_active=1"]);
    pool.admin(&[
        "replace",
        "--size",
        "512M",
        "rk",
        &b.display().to_string(),
        &new.display().to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = pool.status_json();
        let resilver = &status["resilver"];
        assert_eq!(
            resilver["state"], "resilvering",
            "the resilver ended before it could be killed: {status}"
        );
        if resilver["rewritten_bytes"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.kill9();
    pool.serve();
    let status = wait_resilvered(&pool);
    assert_eq!(status["resilver"]["state"], "finished", "{status}");
    assert_eq!(status["resilver"]["errors"], 0, "{status}");
    assert_eq!(status["health"], "ONLINE", "{status}");
    let resilvered = device(&status, &new);
    assert_eq!(resilvered["needs_resilver"], false, "{status}");
    assert_eq!(resilvered["state"], "ONLINE", "{status}");
    assert_check_clean(&pool);
    let (a_name, new_name) = (a.display().to_string(), new.display().to_string());
    pool.admin(&["offline", "rk", &a_name]);
    qemu_io(&uri, &["read -P 0x44 0 224M"]);
    let through_new = volume_digest(&pool, "vol");
    pool.admin(&["online", "rk", &a_name]);
    wait_resilvered(&pool);
    pool.admin(&["offline", "rk", &new_name]);
    let through_a = volume_digest(&pool, "vol");
    pool.admin(&["online", "rk", &new_name]);
    assert_eq!(
        through_new, through_a,
        "the sides differ after the resilver"
    );
    wait_resilvered(&pool);

    // kill -9 mid-scrub: the import is consistent too.
    pool.admin(&["tune", "rk", "scrub_rate_bytes", "32M"]);
    pool.admin(&["scrub", "rk"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.status_json()["scrub"]["examined_bytes"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the scrub never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.kill9();
    pool.ok(&["check", "rk", "-d", &dir(&pool)]);
    pool.serve();
    qemu_io(&uri, &["read -P 0x44 0 224M"]);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 7 (volume destroy): kill -9 at several moments of a
/// `volume destroy -r` of a volume with a snapshot and many small blocks:
/// after each, the pool imports, the volume is either gone (always when the
/// command had succeeded) or whole with its data, another volume's flushed
/// data is intact, and `check` is clean (no leaked or doubly freed space).
#[test]
fn kill_9_mid_volume_destroy_leaves_it_destroyed_or_whole() {
    let mut pool = TestPool::new("kd");
    pool.create("1G", &["a.img"]);
    pool.create_volume("keep", "32M");
    pool.serve();
    qemu_io(&pool.uri("keep"), &["write -P 0x61 0 16M", "flush"]);
    let control = pool.control().display().to_string();
    let mut outcomes = Vec::new();
    for (round, delay_ms) in [0u64, 8, 15, 30, 200].into_iter().enumerate() {
        let name = format!("big{round}");
        let full = format!("kd/{name}");
        pool.admin(&["volume", "create", &full, "128M", "-o", "volblocksize=4K"]);
        let uri = pool.uri(&name);
        qemu_io(&uri, &["write -P 0x70 0 96M", "flush"]);
        pool.admin(&["snapshot", &format!("{full}@s")]);
        qemu_io(&uri, &["write -P 0x71 0 8M", "flush"]);
        let destroy = pool
            .command()
            .args(["--control", &control, "volume", "destroy", "-r", &full])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start volume destroy");
        std::thread::sleep(Duration::from_millis(delay_ms));
        pool.kill9();
        let destroy: Output = destroy.wait_with_output().expect("volume destroy");
        pool.ok(&["check", "kd", "-d", &dir(&pool)]);
        pool.serve();
        let volumes = pool.admin(&["volume", "list", "kd"]);
        let present = volumes.contains(&full);
        if destroy.status.success() {
            assert!(!present, "a destroy that succeeded came back: {volumes}");
        }
        if present {
            qemu_io(&uri, &["read -P 0x71 0 8M", "read -P 0x70 8M 88M"]);
            let snapshot = pool.uri(&format!("{name}@s"));
            tool(
                "qemu-io",
                &["-r", "-f", "raw", &snapshot, "-c", "read -P 0x70 0 96M"],
            );
        }
        outcomes.push((delay_ms, destroy.status.success(), present));
        qemu_io(&pool.uri("keep"), &["read -P 0x61 0 16M"]);
        assert_check_clean(&pool);
        if present {
            pool.admin(&["volume", "destroy", "-r", &full]);
            assert_check_clean(&pool);
        }
    }
    eprintln!("(delay ms, destroy exited 0, volume present after): {outcomes:?}");
    assert_server_healthy(&mut pool);
    stop_and_check(&mut pool);
}

// ---------------------------------------------------------------------------
// NBD clients

/// Issue 21, item 8: NBD says a flush covers every write completed on the
/// export, whichever connection sent it (the server offers multi-conn).
/// Writes acknowledged on one connection and flushed on another survive
/// kill -9; a write acknowledged and never flushed, with commits held off,
/// does not (so the kill really drops what no flush covered).
#[test]
fn a_flush_on_one_connection_makes_writes_completed_on_another_durable() {
    let mut pool = TestPool::new("mc");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    // No commit on a timer: only the flush makes the writes durable.
    pool.serve_with(&["-o", "txg_timeout_ms=600000"]);
    let mut writer = NbdClient::connect(&pool.socket(), "mc/vol");
    let mut flusher = NbdClient::connect(&pool.socket(), "mc/vol");
    let flushed = distinct_bytes(4 << 20, 0xa1);
    for megabyte in 0..4usize {
        let part = &flushed[megabyte << 20..(megabyte + 1) << 20];
        assert_eq!(writer.write_at((megabyte as u64) << 20, part), 0);
    }
    assert_eq!(flusher.flush(), 0);
    let unflushed = distinct_bytes(1 << 20, 0xb2);
    assert_eq!(writer.write_at(32 << 20, &unflushed), 0);
    assert_eq!(writer.read(32 << 20, 1 << 20), unflushed);
    pool.kill9();
    drop((writer, flusher));
    pool.serve();
    let mut reader = NbdClient::connect(&pool.socket(), "mc/vol");
    assert!(
        reader.read(0, 4 << 20) == flushed,
        "writes flushed from another connection were lost by kill -9"
    );
    assert!(
        reader.read(32 << 20, 1 << 20) == vec![0u8; 1 << 20],
        "a write nobody flushed survived kill -9: the test cannot tell a flush's effect"
    );
    drop(reader);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 9: a 32 MiB request (the largest) ending at the last byte
/// of the volume, a sector at the very end, zero-length requests of every
/// command and an unaligned write through the raw protocol; then a real
/// client's unaligned, last-byte and 32 MiB requests. Each gets its
/// documented answer, the connection stays in step, and the data is right
/// before and after a restart.
#[test]
fn largest_last_byte_zero_length_and_unaligned_requests() {
    let mut pool = TestPool::new("edge");
    pool.create("512M", &["a.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let size: u64 = 128 << 20;
    let mut client = NbdClient::connect(&pool.socket(), "edge/vol");
    assert_eq!(client.size_bytes, size);
    // 32 MiB ending at the last byte.
    let largest = distinct_bytes(32 << 20, 0x32);
    assert_eq!(client.write_at(size - (32 << 20), &largest), 0);
    assert!(try_read(&mut client, size - (32 << 20), 32 << 20).unwrap() == largest);
    // The last sector.
    let last = vec![0xeeu8; 512];
    assert_eq!(client.write_at(size - 512, &last), 0);
    assert_eq!(try_read(&mut client, size - 512, 512).unwrap(), last);
    let tail = try_read(&mut client, size - 4096, 4096).unwrap();
    assert!(tail[..3584] == largest[largest.len() - 4096..largest.len() - 512]);
    assert!(tail[3584..] == last[..]);
    // One sector past the end: refused, and the payload consumed.
    assert_eq!(try_read(&mut client, size, 512), Err(EINVAL));
    assert_eq!(client.write_at(size, &[1u8; 512]), ENOSPC);
    assert_eq!(client.write_at(size - 512, &[1u8; 1024]), ENOSPC);
    // Zero-length requests, at the start and at the end: an answer (success or
    // EINVAL: the protocol leaves them unspecified), no payload, no change.
    for offset in [0, size] {
        for command in [
            NBD_CMD_READ,
            NBD_CMD_WRITE,
            NBD_CMD_TRIM,
            NBD_CMD_CACHE,
            NBD_CMD_WRITE_ZEROES,
        ] {
            send_request(&mut client, command, 40 + command as u64, offset, 0);
            let (error, cookie) = NbdClient::reply(&mut client.stream);
            assert_eq!(cookie, 40 + command as u64);
            assert!(
                error == 0 || error == EINVAL,
                "zero-length command {command} at {offset}: error {error}"
            );
        }
    }
    // An unaligned length: EINVAL, its payload consumed.
    assert_eq!(client.write_at(1 << 20, &[0x99u8; 100]), EINVAL);
    assert_eq!(try_read(&mut client, 1 << 20, 512).unwrap(), vec![0u8; 512]);
    assert_eq!(try_read(&mut client, size - 512, 512).unwrap(), last);
    assert!(
        try_read(&mut client, size - (32 << 20), 32 << 20).unwrap()[..(32 << 20) - 512]
            == largest[..(32 << 20) - 512]
    );
    drop(client);

    // A real client: unaligned requests (read-modify-write in qemu), the
    // last byte, a 32 MiB request.
    let uri = pool.uri("vol");
    let end = size - 1;
    let reads = [
        "read -P 0x7b 1000 3000".to_string(),
        "read -P 0 0 1000".to_string(),
        "read -P 0 4000 96".to_string(),
        format!("read -P 0x7c {end} 1"),
        format!("read -P 0xee {} 511", end - 511),
        "read -P 0x7d 16M 32M".to_string(),
    ];
    let mut commands = vec![
        "write -P 0x7b 1000 3000".to_string(),
        format!("write -P 0x7c {end} 1"),
        "write -P 0x7d 16M 32M".to_string(),
        "flush".to_string(),
    ];
    commands.extend(reads.iter().cloned());
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let output = qemu_io(&uri, &commands);
    assert!(!output.contains("failed"), "{output}");
    // All of it after a restart.
    pool.stop();
    pool.serve();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let output = qemu_io(&uri, &reads);
    assert!(!output.contains("failed"), "{output}");
    let mut client = NbdClient::connect(&pool.socket(), "edge/vol");
    let tail = try_read(&mut client, size - (32 << 20), 32 << 20).unwrap();
    assert!(tail[..(32 << 20) - 512] == largest[..(32 << 20) - 512]);
    drop(client);
    assert_server_healthy(&mut pool);
    stop_and_check(&mut pool);
}

/// Issue 21, item 10: clients that send a WRITE header and only part of its
/// payload, then close: the server lives, a verified writer on another
/// volume goes on, and the target range still holds exactly what was there
/// (nothing of an incomplete request is applied), also after kill -9.
#[test]
fn a_client_gone_mid_payload_applies_nothing_and_harms_no_one() {
    let mut pool = TestPool::new("mid");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.create_volume("other", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    qemu_io(&uri, &["write -P 0xaa 4M 1M", "flush"]);
    let mut fio = start_verified_writer(&pool.uri("other"), "96M", 10);
    std::thread::sleep(Duration::from_millis(500));
    for cut in [0usize, 1, 4096, 512 << 10, (1 << 20) - 1] {
        let mut client = NbdClient::connect(&pool.socket(), "mid/vol");
        let mut bytes = NbdClient::request(NBD_CMD_WRITE, 1, 4 << 20, 1 << 20);
        bytes.extend(vec![0xbbu8; cut]);
        client
            .stream
            .write_all(&bytes)
            .expect("send part of a write");
        drop(client);
        // Half-closed instead: the server sees EOF but could still reply.
        let mut client = NbdClient::connect(&pool.socket(), "mid/vol");
        client
            .stream
            .write_all(&bytes)
            .expect("send part of a write");
        client
            .stream
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        let mut rest = Vec::new();
        let _ = client.stream.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "a reply to an incomplete write (cut at {cut}): {rest:?}"
        );
    }
    assert!(still_running(&mut fio), "fio ended before the bad clients");
    qemu_io(&uri, &["read -P 0xaa 4M 1M"]);
    verified_writer_passed(fio);
    assert_server_healthy(&mut pool);
    qemu_io(&uri, &["read -P 0xaa 4M 1M", "flush"]);
    pool.kill9();
    pool.serve();
    qemu_io(&uri, &["read -P 0xaa 4M 1M"]);
    assert_check_clean(&pool);
    stop_and_check(&mut pool);
}

/// Fault 1's remainder: destroying a volume or a snapshot ends the NBD
/// connections that serve it (an idle client is disconnected, not left
/// attached to a name that may be created again with other data), and no
/// other export's connection.
#[test]
fn destroying_a_volume_or_snapshot_disconnects_its_clients_and_only_them() {
    let mut pool = TestPool::new("dc");
    pool.create("1G", &["a.img"]);
    pool.create_volume("gone", "32M");
    pool.create_volume("kept", "32M");
    pool.serve();
    qemu_io(&pool.uri("kept"), &["write -P 0x6b 0 1M", "flush"]);
    pool.admin(&["snapshot", "dc/kept@s"]);
    let disconnected = |client: &mut NbdClient, what: &str| {
        client
            .stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut byte = [0u8; 1];
        let read = client.stream.read(&mut byte);
        assert!(
            matches!(read, Ok(0)),
            "the client of the destroyed {what} is disconnected: {read:?}"
        );
    };
    let mut of_volume = NbdClient::connect(&pool.socket(), "dc/gone");
    let mut of_snapshot = NbdClient::connect(&pool.socket(), "dc/kept@s");
    let mut other = NbdClient::connect(&pool.socket(), "dc/kept");
    pool.admin(&["volume", "destroy", "dc/gone"]);
    disconnected(&mut of_volume, "volume");
    pool.admin(&["destroy", "dc/kept@s"]);
    disconnected(&mut of_snapshot, "snapshot");
    // The other export's client goes on, and a volume created again under
    // the destroyed name is a new export with its own data.
    assert_eq!(other.read(0, 4096), vec![0x6b; 4096]);
    pool.admin(&["volume", "create", "dc/gone", "16M"]);
    qemu_io(&pool.uri("gone"), &["read -P 0 0 1M"]);
    pool.stop();
    pool.ok(&["check", "dc", "-d", &dir(&pool)]);
}
