//! The read cache on a served pool of real files, through real NBD clients:
//! a cached block is served over damage on disk and healed from the other
//! side once dropped; `arcstat`, `tune arc_max_bytes` and `primarycache`
//! do what they say.

mod common;

use common::*;

fn arcstat(pool: &TestPool) -> serde_json::Value {
    let text = pool.admin(&["--json", "arcstat", &pool.name]);
    serde_json::from_str(&text).expect("arcstat JSON")
}

fn checksum_errors(pool: &TestPool, side: usize) -> u64 {
    pool.status_json()["vdevs"][0]["children"][side]["checksum_errors"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_cached_block_is_served_over_damage_and_healed_from_the_other_side_once_dropped() {
    let mut pool = TestPool::new("arcdamage");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("v", "64M");
    pool.serve();
    let uri = pool.uri("v");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x42 0 32M",
            "-c",
            "flush",
        ],
    );
    // Written out and committed (a snapshot writes out held blocks), then
    // read once: the blocks are cached.
    pool.admin(&["snapshot", &format!("{}/v@written", pool.name)]);
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x42 0 32M"]);
    let cached = arcstat(&pool)["cache"]["data_bytes"].as_u64().unwrap();
    assert!(cached >= 32 << 20, "{cached} bytes of data cached");
    // Side a's data area rots (the labels at the ends are left alone).
    corrupt_file(&pool.path("a.img"), 1 << 20, 200 << 20);
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x42 0 32M"]);
    assert_eq!(
        checksum_errors(&pool, 0),
        0,
        "a cached read went to the devices"
    );
    // Dropped from the cache: read from the devices (at random, so that
    // reads go to both sides), the bad side found and the data still right.
    pool.admin(&["tune", &pool.name, "arc_drop", "1"]);
    random_reads(&uri, "32M", 1024);
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x42 0 32M"]);
    assert!(
        checksum_errors(&pool, 0) > 0,
        "no damage found once uncached"
    );
    assert_eq!(checksum_errors(&pool, 1), 0);
    let scrub = pool.admin(&["--json", "scrub", "-w", &pool.name]);
    let scrub: serde_json::Value = serde_json::from_str(scrub.lines().last().unwrap()).unwrap();
    assert_eq!(scrub["errors"], 0, "{scrub}");
    pool.stop();
}

#[test]
fn arcstat_tune_and_primarycache_on_a_served_pool() {
    let mut pool = TestPool::new("arcstat");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("v", "64M");
    pool.serve();
    let uri = pool.uri("v");
    let name = pool.name.clone();
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x17 0 16M",
            "-c",
            "flush",
        ],
    );
    pool.admin(&["snapshot", &format!("{name}/v@written")]);
    for _ in 0..2 {
        tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x17 0 16M"]);
    }
    let stats = arcstat(&pool);
    let cache = &stats["cache"];
    assert!(
        cache["demand_data"]["hits"].as_u64().unwrap() >= 1024,
        "{stats}"
    );
    assert!(cache["size_bytes"].as_u64() <= cache["target_bytes"].as_u64());
    // The same counters in iostat.
    let iostat: serde_json::Value =
        serde_json::from_str(&pool.admin(&["--json", "iostat", &name])).unwrap();
    assert_eq!(iostat["cache"]["cache"]["inserts"], cache["inserts"]);
    let volume = &iostat["volumes"][0];
    assert!(
        volume["cache_hit_blocks"].as_u64().unwrap() >= 1024,
        "{volume}"
    );
    // The text report: a header and a line.
    let text = pool.admin(&["arcstat", &name]);
    assert!(text.lines().next().unwrap().contains("hit%"), "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");

    // A smaller cache at run time: the target follows and the size with it.
    pool.admin(&["tune", &name, "arc_max_bytes", "4M"]);
    let cache = arcstat(&pool)["cache"].clone();
    assert_eq!(cache["target_bytes"], 4 << 20);
    assert!(cache["size_bytes"].as_u64().unwrap() <= 4 << 20, "{cache}");
    pool.admin(&["tune", &name, "arc_max_bytes", "256M"]);

    // primarycache=none: the volume's data is read and not kept.
    let volume_name = format!("{name}/v");
    pool.admin(&["set", "primarycache=none", &volume_name]);
    let shown = pool.admin(&["get", "primarycache", &volume_name]);
    assert!(shown.contains("none") && shown.contains("local"), "{shown}");
    pool.admin(&["tune", &name, "arc_drop", "1"]);
    for _ in 0..2 {
        tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x17 0 16M"]);
    }
    assert_eq!(arcstat(&pool)["cache"]["data_bytes"], 0);
    let refused = pool
        .command()
        .args(["--control", &pool.control().display().to_string()])
        .args(["set", "direct=sometimes", &volume_name])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("use standard, always or disabled"),
        "{message}"
    );
    pool.stop();
}

/// A little generator (xorshift64*): the same sequence each run.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

const NBD_CMD_TRIM: u16 = 4;

fn trim(client: &mut NbdClient, offset: u64, length: u32) {
    use std::io::Write;
    let request = NbdClient::request(NBD_CMD_TRIM, 5, offset, length);
    client.stream.write_all(&request).unwrap();
    let (error, _) = NbdClient::reply(&mut client.stream);
    assert_eq!(error, 0, "trim at {offset}");
}

/// Random writes, trims and reads of a volume on real files, with snapshots,
/// rollbacks, a clone and a send/receive, against an in-memory model, while
/// a 1 MiB read cache evicts all the time: every read equals the model.
#[test]
fn every_read_equals_the_model_while_a_tiny_cache_evicts_all_the_time() {
    const SIZE: u64 = 16 << 20;
    let mut pool = TestPool::new("arcmodel");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("v", "16M");
    // Write-back off: every write is on disk and linked when acknowledged,
    // so reads go through block pointers, and the cache, at once.
    pool.serve_with(&[
        "-o",
        "arc_max_bytes=1M",
        "-o",
        "dirty_data_max_bytes=0",
        "-o",
        "txg_timeout_ms=50",
    ]);
    let name = pool.name.clone();
    let socket = pool.socket();
    let mut client = NbdClient::connect(&socket, &format!("{name}/v"));
    let mut model = vec![0u8; SIZE as usize];
    let mut snapshots: Vec<(String, Vec<u8>)> = Vec::new();
    let mut draw = Draw(0x5eed);
    let check = |client: &mut NbdClient, model: &[u8], offset: u64, length: u64| {
        let got = client.read(offset, length as u32);
        assert!(
            got == model[offset as usize..(offset + length) as usize],
            "read at {offset}+{length} differs from the model"
        );
    };
    for step in 0..600u64 {
        let offset = draw.below(SIZE / 4096) * 4096;
        let length = ((1 + draw.below(16)) * 4096).min(SIZE - offset);
        match draw.below(20) {
            0..=7 => {
                let data = distinct_bytes(length as usize, step as u8);
                assert_eq!(client.write_at(offset, &data), 0);
                model[offset as usize..(offset + length) as usize].copy_from_slice(&data);
            }
            8 => {
                trim(&mut client, offset, length as u32);
                model[offset as usize..(offset + length) as usize].fill(0);
            }
            9 if snapshots.len() < 4 && step >= 120 * snapshots.len() as u64 => {
                let snapshot = format!("s{step}");
                pool.admin(&["snapshot", &format!("{name}/v@{snapshot}")]);
                snapshots.push((snapshot, model.clone()));
            }
            10 if !snapshots.is_empty() && draw.below(8) == 0 => {
                // Back to the latest snapshot (a new connection: rollback
                // ends the old one).
                drop(client);
                let (snapshot, state) = snapshots.last().unwrap().clone();
                pool.admin(&["rollback", &format!("{name}/v@{snapshot}")]);
                model = state;
                client = NbdClient::connect(&socket, &format!("{name}/v"));
            }
            _ => check(&mut client, &model, offset, length),
        }
    }
    // Whole volume, twice (the second pass after the first evicted it).
    for _ in 0..2 {
        for offset in (0..SIZE).step_by(1 << 20) {
            check(&mut client, &model, offset, 1 << 20);
        }
    }
    // A clone of the first snapshot and a received copy of the last read as
    // their models.
    let (first, first_state) = snapshots.first().expect("a snapshot was taken").clone();
    pool.admin(&["clone", &format!("{name}/v@{first}"), &format!("{name}/c")]);
    let mut clone = NbdClient::connect(&socket, &format!("{name}/c"));
    for offset in (0..SIZE).step_by(1 << 20) {
        check(&mut clone, &first_state, offset, 1 << 20);
    }
    let (last, last_state) = snapshots.last().unwrap().clone();
    let stream = pool.path("stream");
    pool.send_to_file(&["send", &format!("{name}/v@{last}")], &stream);
    let received = pool.receive_from_file(&["receive", &format!("{name}/r")], &stream);
    assert!(received.status.success(), "{received:?}");
    let mut copy = NbdClient::connect(&socket, &format!("{name}/r"));
    for offset in (0..SIZE).step_by(1 << 20) {
        check(&mut copy, &last_state, offset, 1 << 20);
    }
    let cache = arcstat(&pool)["cache"].clone();
    assert!(cache["size_bytes"].as_u64().unwrap() <= 1 << 20, "{cache}");
    assert!(
        cache["policy"]["evictions"].as_u64().unwrap() > 100,
        "{cache}"
    );
    drop((client, clone, copy));
    pool.stop();
}
