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
    // Dropped from the cache: read from the devices, the bad side found and
    // the data still right.
    pool.admin(&["tune", &pool.name, "arc_drop", "1"]);
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
