//! Real NBD clients (nbdinfo, qemu-io, fio) against a served pool of real files.

mod common;

use common::{corrupt_file, random_reads, tool, TestPool};

#[test]
fn nbdinfo_shows_the_export_and_its_flags() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve();
    let info: serde_json::Value =
        serde_json::from_str(&tool("nbdinfo", &["--json", &pool.uri("vol")]))
            .expect("nbdinfo JSON");
    let export = &info["exports"][0];
    assert_eq!(export["export-name"], "tank/vol");
    assert_eq!(export["export-size"], 256u64 << 20);
    for flag in [
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
        "can_df",
        "can_cache",
    ] {
        assert_eq!(export[flag], true, "{flag} in {export}");
    }
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 16384);
    assert_eq!(export["block_size_maximum"], 32 << 20);
    assert!(export["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|context| context == "base:allocation"));
    // LIST shows the export too.
    let list = tool(
        "nbdinfo",
        &[
            "--list",
            "--json",
            &format!("nbd+unix://?socket={}", pool.socket().display()),
        ],
    );
    assert!(list.contains("tank/vol"), "{list}");
    pool.stop();
}

#[test]
fn qemu_io_patterns_survive_restart_and_map_shows_holes() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 0 64k",
            // Partial blocks: 4 KiB inside a 16 KiB block, and across two blocks.
            "-c",
            "write -P 0xcd 1M 4k",
            "-c",
            "write -P 0xef 2052k 24k",
            "-c",
            "write -z 4M 1M",
            "-c",
            "flush",
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "read -P 0xcd 1M 4k",
            "-c",
            "read -P 0 1028k 12k",
            "-c",
            "read -P 0xef 2052k 24k",
            "-c",
            "read -P 0 4M 1M",
        ],
    );
    let map = tool("nbdinfo", &["--map", "--json", &uri]);
    let extents: serde_json::Value = serde_json::from_str(&map).expect("map JSON");
    let first = &extents[0];
    assert_eq!(first["offset"], 0);
    assert_eq!(first["length"], 65536);
    assert_eq!(first["type"], 0, "written data is allocated: {map}");
    assert!(
        extents
            .as_array()
            .unwrap()
            .iter()
            .any(|extent| extent["type"] == 3),
        "holes read as zeros: {map}"
    );
    pool.stop();
    pool.serve();
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "read -P 0xcd 1M 4k",
            "-c",
            "read -P 0xef 2052k 24k",
        ],
    );
    pool.stop();
    pool.ok(&[
        "check",
        &pool.name.clone(),
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

#[test]
fn fio_verifies_crc32c_at_queue_depth_64_with_four_jobs() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "512M");
    pool.serve();
    let uri = pool.uri("vol");
    let output = tool(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=16k",
            "--iodepth=64",
            "--numjobs=4",
            "--size=96M",
            "--offset_increment=96M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_backlog=1024",
            "--group_reporting",
            "--output-format=json",
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&output[output.find('{').expect("fio JSON")..]).expect("fio JSON");
    let job = &json["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= (4 * 96) << 20);
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() > 0,
        "verification read the data back"
    );
    // Mixed sizes, unaligned to the volblocksize (read-modify-write path).
    tool(
        "fio",
        &[
            "--name=mixed",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bsrange=512-64k",
            "--bs_unaligned=0",
            "--iodepth=32",
            "--numjobs=2",
            "--size=32M",
            "--offset_increment=32M",
            "--offset=400M",
            "--verify=crc32c",
            "--verify_fatal=1",
        ],
    );
    let status = pool.status_json();
    assert_eq!(status["health"], "ONLINE");
    pool.stop();
    pool.ok(&[
        "check",
        &pool.name.clone(),
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

#[test]
fn the_front_end_on_its_own_thread_serves_verified_io_and_stops_cleanly() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "256M");
    pool.serve_with(&["--nbd-thread"]);
    let uri = pool.uri("vol");
    let output = tool(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=16k",
            "--iodepth=64",
            "--numjobs=2",
            "--size=64M",
            "--offset_increment=64M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--group_reporting",
            "--output-format=json",
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&output[output.find('{').expect("fio JSON")..]).expect("fio JSON");
    assert_eq!(json["jobs"][0]["error"], 0, "{}", json["jobs"][0]);
    assert!(
        json["jobs"][0]["read"]["io_bytes"].as_u64().unwrap() > 0,
        "verification read the data back"
    );
    pool.stop();
    assert!(
        pool.log().contains("exported"),
        "no clean export: {}",
        pool.log()
    );
    pool.ok(&[
        "check",
        &pool.name.clone(),
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

/// Random 4K overwrites on a 4K-volblocksize volume leave free space in 4 KiB
/// holes; the commits' 32 KiB indirect blocks must still find room (they once
/// did not, and the pool suspended with half its space free).
#[test]
fn small_random_overwrites_at_half_full_keep_the_pool_online() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    let name = format!("{}/vol", pool.name);
    let dir = pool.dir.path().display().to_string();
    pool.ok(&[
        "volume",
        "create",
        &name,
        "256M",
        "-o",
        "volblocksize=4K",
        "-d",
        &dir,
    ]);
    pool.serve();
    let uri = pool.uri("vol");
    tool(
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=write",
            "--bs=1M",
            "--iodepth=16",
            "--size=256M",
        ],
    );
    let output = tool(
        "fio",
        &[
            "--name=overwrite",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--numjobs=4",
            "--size=256M",
            // A byte count, not a time: 320 MiB in all turns the volume's
            // free space over however slow the machine is today.
            "--io_size=80M",
            "--group_reporting",
            "--output-format=json",
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&output[output.find('{').expect("fio JSON")..]).expect("fio JSON");
    assert_eq!(json["jobs"][0]["error"], 0, "{}", json["jobs"][0]);
    let written = json["jobs"][0]["write"]["io_bytes"].as_u64().unwrap();
    assert!(
        written > 256 << 20,
        "the overwrites did not turn the free space over: {written} bytes"
    );
    assert_eq!(pool.status_json()["health"], "ONLINE");
    pool.stop();
    pool.ok(&["check", &pool.name.clone(), "-d", &dir]);
}

#[test]
fn kill_9_after_flush_keeps_the_flushed_data() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x5a 0 8M",
            "-c",
            "write -P 0x3c 64M 1M",
            "-c",
            "flush",
        ],
    );
    // A FUA write is durable on its own.
    tool(
        "qemu-io",
        &["-f", "raw", &uri, "-c", "write -P 0x77 100M 256k -f"],
    );
    pool.kill9();
    pool.serve();
    assert!(
        pool.log().contains("not exported cleanly"),
        "{}",
        pool.log()
    );
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "read -P 0x5a 0 8M",
            "-c",
            "read -P 0x3c 64M 1M",
            "-c",
            "read -P 0x77 100M 256k",
        ],
    );
    pool.stop();
    pool.ok(&[
        "check",
        &pool.name.clone(),
        "-d",
        &pool.dir.path().display().to_string(),
    ]);
}

#[test]
fn corruption_of_one_mirror_side_is_detected_returned_correct_and_repaired() {
    let mut pool = TestPool::new("tank");
    pool.create("512M", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x42 0 64M",
            "-c",
            "flush",
        ],
    );
    pool.stop();
    // Damage most of side a's data area (labels at the ends are left alone).
    corrupt_file(&pool.path("a.img"), 1 << 20, 200 << 20);
    pool.serve();
    // Reads (at random, so that they go to both sides) find the damage, and
    // return correct data from side b...
    random_reads(&uri, "64M", 1024);
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x42 0 64M"]);
    let status = pool.status_json();
    let side_a = &status["vdevs"][0]["children"][0];
    let checksum_errors = side_a["checksum_errors"].as_u64().unwrap();
    assert!(
        checksum_errors > 0,
        "checksum errors should be counted on a.img: {status}"
    );
    assert_eq!(status["vdevs"][0]["children"][1]["checksum_errors"], 0);
    // ...and a scrub repairs what is left.
    let scrub = pool.admin(&["--json", "scrub", "-w", &pool.name.clone()]);
    let scrub: serde_json::Value = serde_json::from_str(scrub.lines().last().unwrap()).unwrap();
    assert_eq!(scrub["errors"], 0, "{scrub}");
    let second = pool.admin(&["--json", "scrub", "-w", &pool.name.clone()]);
    let second: serde_json::Value = serde_json::from_str(second.lines().last().unwrap()).unwrap();
    assert_eq!(
        second["bad_copies"], 0,
        "the first scrub should have repaired everything: {second}"
    );
    assert_eq!(second["errors"], 0);
    pool.stop();
    // Side b alone now holds good data everywhere too: damage it, read through a.
    corrupt_file(&pool.path("b.img"), 1 << 20, 200 << 20);
    pool.serve();
    tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x42 0 64M"]);
    pool.stop();
}
