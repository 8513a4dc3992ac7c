//! A snapshot taken under load holds exactly the writes acknowledged before it
//! and nothing written after it: checked block by block against a writer at
//! queue depth 64 whose every write carries its sequence number, while fio
//! adds its own QD64 random writes to the same volume.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{tool, NbdClient, TestPool, NBD_CMD_WRITE};

/// The writer's unit: one 4 KiB piece (a quarter of a 16 KiB volume block, so
/// neighbours in one block exercise the read-modify-write path concurrently).
const PIECE_BYTES: u64 = 4096;
/// Pieces in the region the sequenced writer owns (32 MiB).
const PIECES: u64 = 8192;
/// Writes the sequenced writer keeps in flight.
const DEPTH: usize = 64;
/// Total writes of the sequenced writer.
const WRITES: u64 = 60_000;

/// A piece's content: its index and the write's sequence number, repeated.
fn piece(index: u64, sequence: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(PIECE_BYTES as usize);
    while bytes.len() < PIECE_BYTES as usize {
        bytes.extend_from_slice(&index.to_le_bytes());
        bytes.extend_from_slice(&sequence.to_le_bytes());
    }
    bytes
}

/// What happened to each write: when it was sent and when acknowledged.
#[derive(Default)]
struct Log {
    /// sequence -> (piece, sent, acknowledged)
    writes: HashMap<u64, (u64, Instant, Option<Instant>)>,
}

#[test]
fn a_snapshot_under_qd64_writes_holds_exactly_the_acknowledged_writes() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    // fio's own QD64 random writes to the other half of the volume.
    let fio = std::process::Command::new("fio")
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", pool.uri("vol")),
            "--rw=randwrite",
            "--bs=16k",
            "--iodepth=64",
            "--offset=64M",
            "--size=64M",
            "--time_based",
            "--runtime=30",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start fio");

    let client = NbdClient::connect(&pool.socket(), "tank/vol");
    let mut sender = client.stream.try_clone().unwrap();
    let mut receiver = client.stream;
    let log = Arc::new(Mutex::new(Log::default()));
    // Pieces with a write in flight: the writer never has two writes to one
    // piece in flight, so each piece's writes land in the order they were sent.
    let in_flight = Arc::new(Mutex::new(BTreeSet::new()));
    let slots = Arc::new((Mutex::new(DEPTH), std::sync::Condvar::new()));

    let reader = {
        let log = log.clone();
        let in_flight = in_flight.clone();
        let slots = slots.clone();
        std::thread::spawn(move || {
            for _ in 0..WRITES {
                let (error, sequence) = NbdClient::reply(&mut receiver);
                assert_eq!(error, 0, "write {sequence} failed");
                let now = Instant::now();
                let piece = {
                    let mut log = log.lock().unwrap();
                    let entry = log
                        .writes
                        .get_mut(&sequence)
                        .expect("a reply to a write sent");
                    entry.2 = Some(now);
                    entry.0
                };
                in_flight.lock().unwrap().remove(&piece);
                let (count, ready) = &*slots;
                *count.lock().unwrap() += 1;
                ready.notify_one();
            }
        })
    };
    let writer = {
        let log = log.clone();
        let in_flight = in_flight.clone();
        let slots = slots.clone();
        std::thread::spawn(move || {
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            for sequence in 1..=WRITES {
                {
                    let (count, ready) = &*slots;
                    let mut available = count.lock().unwrap();
                    while *available == 0 {
                        available = ready.wait(available).unwrap();
                    }
                    *available -= 1;
                }
                let index = loop {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let candidate = state % PIECES;
                    if in_flight.lock().unwrap().insert(candidate) {
                        break candidate;
                    }
                };
                log.lock()
                    .unwrap()
                    .writes
                    .insert(sequence, (index, Instant::now(), None));
                let mut request = NbdClient::request(
                    NBD_CMD_WRITE,
                    sequence,
                    index * PIECE_BYTES,
                    PIECE_BYTES as u32,
                );
                request.extend_from_slice(&piece(index, sequence));
                sender.write_all(&request).unwrap();
            }
        })
    };

    // Snapshot in the middle of the run.
    loop {
        let acknowledged = log
            .lock()
            .unwrap()
            .writes
            .values()
            .filter(|entry| entry.2.is_some())
            .count() as u64;
        if acknowledged > WRITES / 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let snapshot_started = Instant::now();
    pool.admin(&["snapshot", "tank/vol@mid"]);
    let snapshot_ended = Instant::now();
    writer.join().unwrap();
    reader.join().unwrap();
    let mut fio = fio;
    let _ = fio.kill();
    let _ = fio.wait();

    // Per piece: the newest write acknowledged before the snapshot began (the
    // snapshot must hold it or a later one) and the newest sent before it ended
    // (the snapshot cannot hold anything later).
    let log = log.lock().unwrap();
    let mut acknowledged_before: HashMap<u64, u64> = HashMap::new();
    let mut sent_before_end: HashMap<u64, u64> = HashMap::new();
    for (&sequence, &(index, sent, acknowledged)) in &log.writes {
        if acknowledged.is_some_and(|at| at < snapshot_started) {
            let newest = acknowledged_before.entry(index).or_insert(0);
            *newest = (*newest).max(sequence);
        }
        if sent < snapshot_ended {
            let newest = sent_before_end.entry(index).or_insert(0);
            *newest = (*newest).max(sequence);
        }
    }
    let image = pool.path("mid.raw");
    tool(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &pool.uri("vol@mid"),
            &image.display().to_string(),
        ],
    );
    let bytes = std::fs::read(&image).unwrap();
    let mut checked_after = 0;
    for index in 0..PIECES {
        let content = &bytes[(index * PIECE_BYTES) as usize..((index + 1) * PIECE_BYTES) as usize];
        let floor = acknowledged_before.get(&index).copied().unwrap_or(0);
        let ceiling = sent_before_end.get(&index).copied().unwrap_or(0);
        if content.iter().all(|byte| *byte == 0) {
            assert_eq!(
                floor, 0,
                "piece {index}: zeros, but write {floor} was acknowledged before the snapshot"
            );
            continue;
        }
        let found_index = u64::from_le_bytes(content[..8].try_into().unwrap());
        let sequence = u64::from_le_bytes(content[8..16].try_into().unwrap());
        assert_eq!(
            content,
            &piece(found_index, sequence)[..],
            "piece {index}: torn content"
        );
        assert_eq!(
            found_index, index,
            "piece {index} holds piece {found_index}'s data"
        );
        assert!(sequence >= floor, "piece {index}: holds write {sequence}, older than write {floor} acknowledged before the snapshot");
        assert!(sequence <= ceiling, "piece {index}: holds write {sequence}, sent after the snapshot returned (newest before: {ceiling})");
        if ceiling > floor {
            checked_after += 1;
        }
    }
    eprintln!(
        "{} pieces checked; {checked_after} had writes in flight across the snapshot",
        PIECES
    );
    // The live volume has moved on: it holds the final writes.
    let mut final_write: HashMap<u64, u64> = HashMap::new();
    for (&sequence, &(index, _, _)) in &log.writes {
        let newest = final_write.entry(index).or_insert(0);
        *newest = (*newest).max(sequence);
    }
    let mut check = NbdClient::connect(&pool.socket(), "tank/vol");
    for (&index, &sequence) in final_write.iter().take(500) {
        assert_eq!(
            check.read(index * PIECE_BYTES, PIECE_BYTES as u32),
            piece(index, sequence),
            "piece {index} of the live volume"
        );
    }
    drop(check);
    pool.stop();
    pool.ok(&[
        "check",
        "tank",
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}
