//! The intent log against the real binary and a raw NBD client: a FLUSH or a
//! FUA write is made durable by a log write, not a transaction group, and
//! survives kill -9 through replay at the next import.

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    assert_check_clean, distinct_bytes, stop_and_check, NbdClient, TestPool, NBD_CMD_FLUSH,
    NBD_CMD_WRITE,
};

const NBD_CMD_TRIM: u16 = 4;
const NBD_CMD_FLAG_FUA: u16 = 1;

/// One request with `flags`, its payload, and the error replied.
fn request(
    client: &mut NbdClient,
    flags: u16,
    command: u16,
    offset: u64,
    data: &[u8],
    length: u32,
) -> u32 {
    let mut bytes = NbdClient::request(command, 21, offset, length);
    // The request's flags are bytes 4..6 (big-endian), after the magic.
    bytes[4..6].copy_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(data);
    client.stream.write_all(&bytes).expect("send a request");
    let (error, cookie) = NbdClient::reply(&mut client.stream);
    assert_eq!(cookie, 21);
    error
}

fn write_at(client: &mut NbdClient, offset: u64, data: &[u8], flags: u16) -> u32 {
    request(
        client,
        flags,
        NBD_CMD_WRITE,
        offset,
        data,
        data.len() as u32,
    )
}

fn flush(client: &mut NbdClient) -> u32 {
    request(client, 0, NBD_CMD_FLUSH, 0, &[], 0)
}

fn iostat(pool: &TestPool) -> serde_json::Value {
    serde_json::from_str(&pool.admin(&["--json", "iostat", &pool.name])).expect("iostat JSON")
}

fn txg_commits(pool: &TestPool) -> u64 {
    iostat(pool)["txg"]["commits"]
        .as_u64()
        .expect("txg commits")
}

/// `volume`'s counters in `iostat --json` (its intent log's under
/// `intent_log`).
fn volume_stats(pool: &TestPool, volume: &str) -> serde_json::Value {
    let stats = iostat(pool);
    let volumes = stats["volumes"].as_array().expect("volumes").clone();
    volumes
        .into_iter()
        .find(|entry| entry["name"] == format!("{}/{volume}", pool.name))
        .expect("the volume in iostat")
}

/// With commits on a timer turned off, FLUSHes, a FUA write and a TRIM that
/// was flushed are made durable by the log alone (no txg commits while they
/// happen), and all of them are in the volume after kill -9 and a new
/// `serve`; a write nobody flushed is not (so the test can tell). On the
/// mirror the held blocks are copied into the log (`logbias=latency`); on
/// RAID-Z they are written in place and logged as pointers
/// (`logbias=throughput`).
#[test]
fn flushes_and_fua_writes_survive_kill_9_through_the_log_without_a_txg() {
    for (layout, log_bias) in [
        (vec!["mirror", "a.img", "b.img"], "latency"),
        (vec!["raidz1", "a.img", "b.img", "c.img"], "throughput"),
    ] {
        let mut pool = TestPool::new("zl");
        pool.create("512M", &layout);
        pool.create_volume("vol", "64M");
        pool.serve_with(&[
            "-o",
            "txg_timeout_ms=600000",
            "-o",
            "log_group_wait_percent=10",
        ]);
        pool.admin(&["set", &format!("logbias={log_bias}"), "zl/vol"]);
        let mut client = NbdClient::connect(&pool.socket(), "zl/vol");
        // The first FLUSH of a volume starts its chain through a txg.
        assert_eq!(write_at(&mut client, 0, &distinct_bytes(65536, 1), 0), 0);
        assert_eq!(flush(&mut client), 0);
        let commits_before = txg_commits(&pool);
        let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();
        for round in 0..24u64 {
            let offset = (round * 2 + 1) << 20;
            // One to three 16K blocks: small enough for a FLUSH to copy them
            // (at most 64 KiB of held blocks are copied).
            let data = distinct_bytes(16384 * (1 + round as usize % 3), round as u8 ^ 0x5a);
            assert_eq!(write_at(&mut client, offset, &data, 0), 0);
            assert_eq!(flush(&mut client), 0);
            expected.push((offset, data));
        }
        // A FUA write is durable on its own.
        let fua = distinct_bytes(16384, 0xf0);
        assert_eq!(write_at(&mut client, 60 << 20, &fua, NBD_CMD_FLAG_FUA), 0);
        expected.push((60 << 20, fua));
        // A trim that was flushed: the range reads as zeros after the crash.
        // (Round 1 wrote 32 KiB at 3 MiB: its last 16 KiB stay.)
        assert_eq!(
            request(&mut client, 0, NBD_CMD_TRIM, 3 << 20, &[], 16384),
            0
        );
        assert_eq!(flush(&mut client), 0);
        let (_, round_1) = expected.remove(1);
        expected.push((3 << 20, vec![0u8; 16384]));
        expected.push(((3 << 20) + 16384, round_1[16384..].to_vec()));
        let stats = volume_stats(&pool, "vol")["intent_log"].clone();
        assert_eq!(
            txg_commits(&pool),
            commits_before,
            "a FLUSH committed a txg instead of writing the log: {stats}"
        );
        assert!(stats["commits"].as_u64().unwrap_or(0) >= 26, "{stats}");
        assert!(
            stats["records_written"].as_u64().unwrap_or(0) >= 26,
            "{stats}"
        );
        // One client waiting for each answer: no commit waits for company,
        // though the server would let one (`log_group_wait_percent`).
        assert_eq!(
            stats["group_commit_waits"].as_u64(),
            Some(0),
            "a lone writer's commit waited for others: {stats}"
        );
        let copied = stats["copied_blocks"].as_u64().unwrap_or(0);
        let ahead = stats["ahead_commits"].as_u64().unwrap_or(0);
        match log_bias {
            // A client flushing after every write: from the fifth, its
            // writes are logged as they are answered, and each FLUSH finds
            // its write in the log.
            "latency" => {
                assert!(copied >= 24, "held blocks were not copied: {stats}");
                assert!(
                    ahead >= 16,
                    "writes were not logged ahead of their FLUSH: {stats}"
                );
            }
            _ => {
                assert_eq!(copied, 0, "logbias=throughput copied blocks: {stats}");
                assert_eq!(ahead, 0, "logbias=throughput logged ahead: {stats}");
            }
        }
        // Written, never flushed. The first may be logged ahead of the FLUSH
        // that this client's pattern says comes next; the second breaks the
        // pattern, so it is neither in the log nor in a txg.
        let maybe_logged = distinct_bytes(16384, 0xed);
        assert_eq!(write_at(&mut client, 38 << 20, &maybe_logged, 0), 0);
        let unflushed = distinct_bytes(65536, 0xee);
        assert_eq!(write_at(&mut client, 40 << 20, &unflushed, 0), 0);
        assert_eq!(client.read(40 << 20, 65536), unflushed);
        pool.kill9();
        drop(client);
        pool.serve();
        let mut reader = NbdClient::connect(&pool.socket(), "zl/vol");
        for (offset, data) in &expected {
            assert!(
                reader.read(*offset, data.len() as u32) == *data,
                "{layout:?}: a write made durable at {offset:#x} was lost by kill -9"
            );
        }
        assert!(
            reader.read(40 << 20, 65536) == vec![0u8; 65536],
            "{layout:?}: a write nobody flushed survived: the test cannot tell the log's effect"
        );
        let first = reader.read(38 << 20, 16384);
        assert!(
            first == maybe_logged || first == vec![0u8; 16384],
            "{layout:?}: a write logged ahead came back damaged"
        );
        let notes = pool.status_json()["notes"].to_string();
        assert!(notes.contains("intent log: replayed"), "{notes}");
        drop(reader);
        assert_check_clean(&pool);
        stop_and_check(&mut pool);
    }
}

/// Four fio jobs on four connections, each flushing after every write and
/// verifying what it wrote: with `log_group_wait_percent` set, commits wait
/// for company (group commit); every FLUSH is accounted for as a log
/// commit, one that found its writes logged by the commit before (group
/// commit), or one through a txg (the volume's first), and the data is
/// intact. (How many share a commit depends on timing;
/// `scripts/bench-durable.sh` reports it.)
#[test]
fn concurrent_flushing_connections_keep_their_data_and_every_flush_is_accounted_for() {
    let mut pool = TestPool::new("gc");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "64M");
    pool.serve_with(&["-o", "log_group_wait_percent=10"]);
    let uri = pool.uri("vol");
    let mut client = NbdClient::connect(&pool.socket(), "gc/vol");
    assert_eq!(flush(&mut client), 0);
    drop(client);
    let output = std::process::Command::new("fio")
        .args([
            "--name=gc",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=16k",
            "--iodepth=1",
            "--numjobs=4",
            "--size=8M",
            "--offset_increment=16M",
            "--fsync=1",
            "--verify=crc32c",
            "--output-format=json",
        ])
        .output()
        .expect("run fio");
    assert!(
        output.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let volume = volume_stats(&pool, "vol");
    let stats = &volume["intent_log"];
    let flushes = volume["flush_ops"].as_u64().unwrap_or(0);
    let commits = stats["commits"].as_u64().unwrap_or(0);
    let shared = stats["shared_commits"].as_u64().unwrap_or(0);
    let fallbacks = stats["txg_fallbacks"].as_u64().unwrap_or(0);
    assert!(flushes >= 2000, "fio sent {flushes} flushes: {stats}");
    assert!(commits > 0, "no log commit: {stats}");
    // FLUSHes of four connections meet at the commit lock: commits wait for
    // more of them (group commit, turned on for this server), which a lone
    // writer never does (above).
    let waits = stats["group_commit_waits"].as_u64().unwrap_or(0);
    assert!(waits > 0, "no commit waited for company: {stats}");
    // A commit started ahead of a FLUSH (a job alone for a while) is a
    // commit no FLUSH asked for; its FLUSH then counts as shared.
    let ahead = stats["ahead_commits"].as_u64().unwrap_or(0);
    assert_eq!(
        commits + shared + fallbacks,
        flushes + ahead,
        "FLUSHes not accounted for: {stats}"
    );
    // Every commit that wrote blocks is in the latency histogram, and
    // `iostat -l` shows the log's commits with their mean and p99 latency.
    let timed: u64 = stats["commit_latency_us_log2"]
        .as_array()
        .expect("the commit latency histogram")
        .iter()
        .map(|bucket| bucket.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        timed, commits,
        "commits missing from the histogram: {stats}"
    );
    let mean_us = stats["commit_time_us"].as_u64().unwrap_or(0) as f64 / commits as f64;
    assert!(mean_us >= 1.0, "{stats}");
    let report = pool.admin(&["iostat", "-l", "gc"]);
    let line = report
        .lines()
        .find(|line| line.starts_with("gc/vol "))
        .unwrap_or_else(|| panic!("no intent log line in iostat -l:\n{report}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 7, "{line}");
    let shown: f64 = fields[5].parse().expect("a mean latency");
    assert!(
        (shown - mean_us).abs() <= 1.0,
        "mean commit latency {mean_us}: {report}"
    );
    assert!(fields[6].starts_with('<'), "p99 bucket: {report}");
    pool.stop();
    assert!(!pool.log().contains("panicked"), "{}", pool.log());
}

/// The libnbd client of the kill -9 rounds (`tests/scripts/flush_kill.py`),
/// run by Debian's python3, which has the `nbd` module.
fn flush_kill_script(args: &[&str]) -> std::process::Command {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/flush_kill.py");
    let mut command = std::process::Command::new("/usr/bin/python3");
    command.arg(script).args(args);
    command
}

/// Durable blocks that trigger the kill: enough FLUSHes and FUA writes to
/// have completed (a FLUSH covers 32 writes) that the log holds many commits.
const DURABLE_BEFORE_KILL: usize = 256;

/// kill -9 while a libnbd client keeps 64 writes in flight, with a FUA write
/// in every 16 and a FLUSH after every 32: every write a completed FLUSH
/// covered and every completed FUA write reads back after a new `serve`,
/// round after round, on a mirror and on a mirror with a log device.
#[test]
fn flushed_and_fua_writes_at_qd64_survive_kill_9_round_after_round() {
    const ROUNDS: u64 = 4;
    const BLOCKS_PER_ROUND: u64 = 4096;
    for layout in [
        vec!["mirror", "a.img", "b.img"],
        vec!["mirror", "a.img", "b.img", "log", "c.img"],
    ] {
        let mut pool = TestPool::new("fk");
        pool.create("512M", &layout);
        pool.create_volume("vol", "320M");
        let uri = pool.uri("vol");
        let log = pool.path("durable.txt");
        let log_arg = log.display().to_string();
        let durable_lines = || {
            std::fs::read_to_string(&log)
                .map(|text| text.lines().count())
                .unwrap_or(0)
        };
        for round in 0..ROUNDS {
            pool.serve();
            let durable_before = durable_lines();
            let first = (round * BLOCKS_PER_ROUND).to_string();
            let mut writer = flush_kill_script(&[
                "write",
                &uri,
                &log_arg,
                &first,
                &BLOCKS_PER_ROUND.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the libnbd writer (python3-libnbd)");
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if durable_lines() >= durable_before + DURABLE_BEFORE_KILL {
                    break;
                }
                if let Some(status) = writer.try_wait().expect("writer") {
                    let output = writer.wait_with_output().expect("writer output");
                    panic!(
                        "{layout:?} round {round}: the writer ended ({status}) before the kill: {}{}",
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "{layout:?}: nothing became durable"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            pool.kill9();
            let output = writer.wait_with_output().expect("writer output");
            let text = String::from_utf8_lossy(&output.stdout).to_string()
                + &String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success() && text.contains("server gone"),
                "{layout:?} round {round}: the kill did not hit the writer mid-flight: {text}"
            );
            pool.serve();
            let verify = flush_kill_script(&["verify", &uri, &log_arg])
                .output()
                .expect("run the verifier");
            let report = String::from_utf8_lossy(&verify.stdout).to_string()
                + &String::from_utf8_lossy(&verify.stderr);
            assert!(
                verify.status.success(),
                "{layout:?} round {round} ({text}): {report}"
            );
            pool.kill9();
        }
        pool.serve();
        assert_check_clean(&pool);
        stop_and_check(&mut pool);
    }
}
