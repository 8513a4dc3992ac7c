//! What import must not take at face value, and `check` on a busy pool: the
//! real binary, real NBD clients (qemu-io, nbdinfo, fio) and pools of real
//! files.
//!
//! - A stale copy of a mirror side put back in place is resilvered, not
//!   trusted, and counts as lacking data until it is caught up.
//! - A receive killed mid-stream without `-s` is discarded at import (its
//!   space comes back, NBD lists no hidden export); with `-s` it resumes.
//! - `check` on a served pool under random writes and a snapshot finds no
//!   false problems.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{dir, tool, TestPool};

/// qemu-io requests of at most this many MiB (well under any NBD client's
/// largest request).
const CHUNK_MIB: u64 = 16;

fn qemu_io(uri: &str, commands: &[String]) -> String {
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let output = common::qemu_io(uri, &commands);
    assert!(
        !output.contains("failed") && !output.contains("error"),
        "qemu-io {commands:?}: {output}"
    );
    output
}

/// Writes `pattern` over `offset_mib..offset_mib+length_mib` and flushes.
fn write_pattern(uri: &str, pattern: u8, offset_mib: u64, length_mib: u64) {
    let mut commands: Vec<String> = (0..length_mib / CHUNK_MIB)
        .map(|chunk| {
            format!(
                "write -P {pattern:#x} {}M {CHUNK_MIB}M",
                offset_mib + chunk * CHUNK_MIB
            )
        })
        .collect();
    commands.push("flush".into());
    qemu_io(uri, &commands);
}

/// Reads `offset_mib..offset_mib+length_mib` back, checking every byte is `pattern`.
fn verify_pattern(uri: &str, pattern: u8, offset_mib: u64, length_mib: u64) {
    let commands: Vec<String> = (0..length_mib / CHUNK_MIB)
        .map(|chunk| {
            format!(
                "read -P {pattern:#x} {}M {CHUNK_MIB}M",
                offset_mib + chunk * CHUNK_MIB
            )
        })
        .collect();
    let output = qemu_io(uri, &commands);
    assert!(!output.contains("Pattern verification failed"), "{output}");
}

/// `ironpool ARGS` against the running server, whatever its outcome.
fn admin_output(pool: &TestPool, args: &[&str]) -> std::process::Output {
    let control = pool.control().display().to_string();
    pool.command()
        .args(["--control", &control])
        .args(args)
        .output()
        .expect("run ironpool")
}

/// Waits for the served pool's resilver to end; returns the final status.
fn wait_resilvered(pool: &TestPool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let status = pool.status_json();
        if status["resilver"]["state"] != "resilvering" {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the resilver did not end: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The status entry of the device at `path`.
fn child<'a>(status: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    status["vdevs"][0]["children"]
        .as_array()
        .expect("children")
        .iter()
        .find(|child| child["path"] == path)
        .unwrap_or_else(|| panic!("no device {path} in {status}"))
}

/// Copies a sparse file (the copy stays sparse: these are 1 GiB images).
fn copy_sparse(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
}

/// With each side of the mirror alone in turn (the other offline), every
/// byte reads back as written; each comes back and is caught up after.
fn each_side_alone_reads_right(pool: &TestPool, sides: [&str; 2]) {
    let uri = pool.uri("vol");
    for (alone, away) in [(sides[0], sides[1]), (sides[1], sides[0])] {
        pool.admin(&["offline", "tank", away]);
        let status = pool.status_json();
        assert_eq!(child(&status, away)["state"], "OFFLINE", "{status}");
        verify_pattern(&uri, 0x11, 0, 64);
        verify_pattern(&uri, 0x22, 64, 128);
        let status = pool.status_json();
        assert_eq!(
            child(&status, alone)["checksum_errors"],
            0,
            "{alone} alone serves right data: {status}"
        );
        assert_eq!(child(&status, alone)["read_errors"], 0, "{status}");
        pool.admin(&["online", "tank", away]);
        let status = wait_resilvered(pool);
        assert_eq!(status["resilver"]["errors"], 0, "{status}");
        assert_eq!(status["health"], "ONLINE", "{status}");
    }
}

#[test]
fn a_stale_copy_of_a_mirror_side_is_resilvered_and_not_trusted_until_then() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    let (a, b) = (
        pool.path("a.img").display().to_string(),
        pool.path("b.img").display().to_string(),
    );
    pool.serve();
    let uri = pool.uri("vol");
    write_pattern(&uri, 0x11, 0, 64);
    pool.stop();
    // An old copy of side a (outside the pool's directory, which import scans).
    std::fs::create_dir(pool.path("aside")).unwrap();
    let old_a = pool.path("aside/a.img");
    copy_sparse(Path::new(&a), &old_a);
    pool.serve();
    write_pattern(&uri, 0x22, 64, 128);
    pool.stop();
    copy_sparse(&old_a, Path::new(&a));

    pool.serve();
    let status = pool.status_json();
    // The old side is known to lack the 128 MiB written since its copy: it
    // is resilvered (or already was), not ONLINE with checksum errors.
    let resilver = &status["resilver"];
    assert!(
        resilver["state"] == "resilvering" || resilver["state"] == "finished",
        "{status}"
    );
    assert!(
        resilver["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|device| device == a.as_str()),
        "a is resilvered: {status}"
    );
    if resilver["state"] == "resilvering" {
        assert_eq!(status["health"], "DEGRADED", "{status}");
    }
    let notes = status["notes"].to_string();
    assert!(notes.contains("a.img is behind the pool"), "{notes}");
    // The current side cannot go while the old one is not caught up.
    let offline = admin_output(&pool, &["offline", "tank", &b]);
    if offline.status.success() {
        // Allowed only because the resilver had already finished.
        let status = pool.status_json();
        assert_eq!(
            child(&status, &a)["needs_resilver"],
            false,
            "b went offline while a lacked data: {status}"
        );
        pool.admin(&["online", "tank", &b]);
    } else {
        let error = String::from_utf8_lossy(&offline.stderr);
        assert!(error.contains("no valid copy"), "{error}");
    }
    let status = wait_resilvered(&pool);
    assert_eq!(status["resilver"]["errors"], 0, "{status}");
    assert!(
        status["resilver"]["rewritten_bytes"].as_u64().unwrap() >= 128 << 20,
        "a got the 128 MiB it missed: {status}"
    );
    assert_eq!(status["health"], "ONLINE", "{status}");
    for side in [&a, &b] {
        assert_eq!(
            child(&status, side)["checksum_errors"],
            0,
            "the old copy was never read for what it lacked: {status}"
        );
        assert_eq!(child(&status, side)["needs_resilver"], false, "{status}");
    }
    each_side_alone_reads_right(&pool, [&a, &b]);

    // Again, with the refusal checked before any resilver can have run: the
    // pool opened by the command itself finds a behind and keeps b.
    pool.stop();
    copy_sparse(&old_a, Path::new(&a));
    let error = pool.fails(&["offline", "tank", &b, "-d", &dir(&pool)]);
    assert!(error.contains("no valid copy"), "{error}");
    // That import recorded what a missed in the config (its uberblocks are
    // current now): serving resilvers it all the same.
    pool.serve();
    let status = wait_resilvered(&pool);
    assert_eq!(status["resilver"]["errors"], 0, "{status}");
    assert!(
        status["resilver"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|device| device == a.as_str()),
        "{status}"
    );
    assert_eq!(status["health"], "ONLINE", "{status}");
    each_side_alone_reads_right(&pool, [&a, &b]);
    pool.stop();
    pool.ok(&["check", "tank", "-d", &dir(&pool)]);
}

/// Allocated bytes once deferred frees are released: `check` commits, and
/// three commits move every free through its defer slots.
fn settled_allocated_bytes(pool: &TestPool) -> u64 {
    for _ in 0..3 {
        let report: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "check", "tank"])).expect("check JSON");
        assert_eq!(
            report["problems"].as_array().map(Vec::len),
            Some(0),
            "{report}"
        );
    }
    pool.status_json()["allocated_bytes"]
        .as_u64()
        .expect("allocated bytes")
}

/// Stream bytes fed to a receive before the server is killed: most of the
/// 256 MiB stream, and enough to see in the pool's allocation.
const PARTIAL_STREAM_BYTES: u64 = 160 << 20;

/// Starts `receive EXTRA TARGET` fed from a pipe, feeds it the first
/// `PARTIAL_STREAM_BYTES` of `stream` and never the rest, waits until that
/// data is committed, and kills the server. Returns the allocated bytes seen
/// meanwhile.
fn kill_mid_receive(
    pool: &mut TestPool,
    target: &str,
    extra: &[&str],
    stream: &Path,
    before: u64,
) -> u64 {
    let control = pool.control().display().to_string();
    let mut receive = pool
        .command()
        .args(["--control", &control, "receive"])
        .args(extra)
        .arg(target)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ironpool receive");
    let mut input = receive.stdin.take().expect("stdin");
    let mut part = std::fs::File::open(stream).expect("stream");
    std::io::copy(
        &mut std::io::Read::take(&mut part, PARTIAL_STREAM_BYTES),
        &mut input,
    )
    .expect("feed the stream");
    input.flush().expect("flush");
    let deadline = Instant::now() + Duration::from_secs(120);
    let during = loop {
        let allocated = pool.status_json()["allocated_bytes"].as_u64().unwrap();
        if allocated >= before + (128 << 20) {
            break allocated;
        }
        assert!(
            Instant::now() < deadline,
            "the receive did not apply the data fed ({allocated} allocated, {before} before)"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Commit what was applied (check commits first), so the partial receive
    // is on disk when the server dies.
    pool.admin(&["--json", "check", "tank"]);
    pool.kill9();
    drop(input);
    let _ = receive.wait();
    during
}

/// `nbdinfo --list` of the whole server: it must succeed (every export
/// listed can be opened); returns the export names.
fn listed_exports(pool: &TestPool) -> Vec<String> {
    let list = tool(
        "nbdinfo",
        &[
            "--list",
            "--json",
            &format!("nbd+unix://?socket={}", pool.socket().display()),
        ],
    );
    let json: serde_json::Value = serde_json::from_str(&list).expect("nbdinfo JSON");
    json["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|export| {
            export["export-name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn a_receive_killed_mid_stream_is_discarded_at_import_unless_started_with_s() {
    let mut pool = TestPool::new("tank");
    pool.create("2G", &["a.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    write_pattern(&uri, 0x5a, 0, 256);
    pool.admin(&["snapshot", "tank/vol@s"]);
    let stream = pool.path("full.stream");
    pool.send_to_file(&["send", "tank/vol@s"], &stream);
    assert!(std::fs::metadata(&stream).unwrap().len() > PARTIAL_STREAM_BYTES);
    let before = settled_allocated_bytes(&pool);

    // Without -s: nothing can resume it, so import discards it.
    let during = kill_mid_receive(&mut pool, "tank/copy", &[], &stream, before);
    pool.serve();
    let exports = listed_exports(&pool);
    assert!(
        exports.iter().all(|name| !name.contains('%')),
        "{exports:?}"
    );
    assert!(exports.iter().any(|name| name == "tank/vol"), "{exports:?}");
    let after = settled_allocated_bytes(&pool);
    assert!(
        after < before + (16 << 20),
        "the partial receive's space came back: {before} before, {during} during, {after} after"
    );
    let notes = pool.status_json()["notes"].to_string();
    assert!(
        notes.contains("discarded the interrupted receive into tank/copy"),
        "{notes}"
    );
    // The name is free again: a receive into it starts afresh.
    let output = pool.receive_from_file(&["receive", "tank/copy"], &stream);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let compare = tool(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &pool.uri("vol@s"),
            &pool.uri("copy"),
        ],
    );
    assert!(compare.contains("identical"), "{compare}");

    // With -s: kept across the kill, hidden from NBD, and resumable.
    let before = settled_allocated_bytes(&pool);
    kill_mid_receive(&mut pool, "tank/kept", &["-s"], &stream, before);
    pool.serve();
    let exports = listed_exports(&pool);
    assert!(
        exports.iter().all(|name| !name.contains('%')),
        "{exports:?}"
    );
    let token: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "get", "receive_resume_token", "tank/kept"]))
            .unwrap();
    let token = token["properties"][0]["value"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        token.starts_with("1-"),
        "the -s receive is resumable: {token}"
    );
    let rest = pool.path("rest.stream");
    pool.send_to_file(&["send", "-t", &token], &rest);
    let output = pool.receive_from_file(&["receive", "-s", "tank/kept"], &rest);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let compare = tool(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &pool.uri("vol@s"),
            &pool.uri("kept"),
        ],
    );
    assert!(compare.contains("identical"), "{compare}");
    pool.stop();
    pool.ok(&["check", "tank", "-d", &dir(&pool)]);
}

/// How long one fio run writes: long enough for a snapshot and several
/// checks while it runs on an idle machine; on a loaded one fio is started
/// again until `CHECKS_WHILE_WRITING` checks overlapped a writer.
const FIO_SECONDS: u64 = 12;

/// Checks that must run while fio writes (each counted only if fio was
/// running when it started and still is when it ended).
const CHECKS_WHILE_WRITING: u32 = 3;

/// Random writes through fio at depth 16 on `uri` for `FIO_SECONDS`.
fn start_random_writer(uri: &str) -> std::process::Child {
    Command::new("fio")
        .args([
            "--name=busy",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--iodepth=16",
            "--size=256M",
            "--time_based",
            &format!("--runtime={FIO_SECONDS}"),
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio (is it installed?)")
}

fn assert_fio_passed(fio: std::process::Child) {
    let output = fio.wait_with_output().expect("fio");
    assert!(
        output.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn check_finds_no_problems_on_a_pool_under_random_writes_and_a_snapshot() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let uri = pool.uri("vol");
    let mut fio = start_random_writer(&uri);
    std::thread::sleep(Duration::from_secs(2));
    let mut checks_while_writing = 0;
    let mut round = 0;
    while checks_while_writing < CHECKS_WHILE_WRITING {
        assert!(
            round < 10 * CHECKS_WHILE_WRITING,
            "only {checks_while_writing} of {round} checks ran while fio wrote"
        );
        if fio.try_wait().expect("fio").is_some() {
            assert_fio_passed(fio);
            fio = start_random_writer(&uri);
            std::thread::sleep(Duration::from_secs(1));
        }
        if round == 1 {
            pool.admin(&["snapshot", "tank/vol@during"]);
        }
        let writing_before = fio.try_wait().expect("fio").is_none();
        let report: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "check", "tank"])).expect("check JSON");
        assert_eq!(
            report["problems"].as_array().map(Vec::len),
            Some(0),
            "round {round}: {report}"
        );
        assert!(report["block_copies"].as_u64().unwrap() > 0, "{report}");
        if writing_before && fio.try_wait().expect("fio").is_none() {
            checks_while_writing += 1;
        }
        round += 1;
    }
    assert_fio_passed(fio);
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE", "{status}");
    pool.stop();
    pool.ok(&["check", "tank", "-d", &dir(&pool)]);
}
