//! RAID-Z pools of real files served over NBD, checked with qemu-io, for
//! parity 1, 2 and 3: device files destroyed, columns corrupted, more failures
//! than parity, and replace with resilver.

mod common;

use std::process::Command;

use common::{corrupt_file, dir, qemu_io, tool, TestPool};

/// (kind, devices): narrow groups keep CI fast while every parity level runs.
const LAYOUTS: [(&str, usize); 3] = [("raidz1", 3), ("raidz2", 5), ("raidz3", 6)];
const DEVICE_SIZE: &str = "128M";
const DEVICE_BYTES: u64 = 128 << 20;
/// Where a device's data area begins and ends (labels before and after).
const DATA_START: u64 = 1 << 20;
const DATA_END: u64 = DEVICE_BYTES - (512 << 10);

fn device(index: usize) -> String {
    format!("d{index}.img")
}

fn create(kind: &str, width: usize) -> TestPool {
    let pool = TestPool::new("tank");
    let names: Vec<String> = (0..width).map(device).collect();
    let mut layout = vec![kind];
    layout.extend(names.iter().map(String::as_str));
    pool.create(DEVICE_SIZE, &layout);
    pool.create_volume("vol", "32M");
    pool
}

fn parity(kind: &str) -> usize {
    kind.trim_start_matches("raidz").parse().expect("raidzN")
}

/// Full blocks of three patterns, 20 MiB in all.
const WRITES: [&str; 3] = [
    "write -P 0x11 0 8M",
    "write -P 0x22 8M 8M",
    "write -P 0x33 16M 4M",
];
const READS: [&str; 4] = [
    "read -P 0x11 0 8M",
    "read -P 0x22 8M 8M",
    "read -P 0x33 16M 4M",
    "read -P 0 24M 1M",
];

/// A served pool of `kind` whose volume holds `WRITES`, then `more`, flushed;
/// and the volume's URI.
fn written_pool(kind: &str, width: usize, more: &[&str]) -> (TestPool, String) {
    let mut pool = create(kind, width);
    pool.serve();
    let uri = pool.uri("vol");
    let mut writes = WRITES.to_vec();
    writes.extend(more);
    writes.push("flush");
    qemu_io(&uri, &writes);
    (pool, uri)
}

/// Overwrites a device file's whole data area with garbage, 16 MiB at a time.
fn corrupt_data_area(pool: &TestPool, file: &str) {
    let path = pool.path(file);
    let mut offset = DATA_START;
    while offset < DATA_END {
        let length = (DATA_END - offset).min(16 << 20);
        corrupt_file(&path, offset, length as usize);
        offset += length;
    }
}

fn checksum_errors(status: &serde_json::Value, child: usize) -> u64 {
    status["vdevs"][0]["children"][child]["checksum_errors"]
        .as_u64()
        .unwrap()
}

fn scrub(pool: &TestPool) -> serde_json::Value {
    let text = pool.admin(&["--json", "scrub", "-w", &pool.name.clone()]);
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

#[test]
fn any_parity_device_files_destroyed_the_data_reads_back_and_one_more_is_refused() {
    for (kind, width) in LAYOUTS {
        let p = parity(kind);
        let (mut pool, uri) = written_pool(kind, width, &["write -P 0x44 21M 12k"]);
        pool.stop();
        // Destroy p files spread over the group: truncate some, delete others.
        let destroyed: Vec<usize> = (0..p).map(|step| (step * 2 + 1) % width).collect();
        for (step, index) in destroyed.iter().enumerate() {
            let path = pool.path(&device(*index));
            if step % 2 == 0 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(0)
                    .unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        pool.serve();
        let status = pool.status_json();
        assert_eq!(status["health"], "DEGRADED", "{kind}: {status}");
        assert_eq!(status["vdevs"][0]["state"], "DEGRADED");
        for index in &destroyed {
            assert_eq!(
                status["vdevs"][0]["children"][*index]["state"], "MISSING",
                "{kind}: {status}"
            );
        }
        let mut reads = READS.to_vec();
        reads.push("read -P 0x44 21M 12k");
        qemu_io(&uri, &reads);
        // Degraded, it still takes writes.
        qemu_io(
            &uri,
            &["write -P 0x55 28M 2M", "flush", "read -P 0x55 28M 2M"],
        );
        let text = pool.admin(&["status", &pool.name.clone()]);
        assert!(
            text.contains(&format!("{kind}-0"))
                && text.contains("DEGRADED")
                && text.contains("MISSING"),
            "{text}"
        );
        pool.stop();
        // One more gone: the pool is refused, the error names every missing
        // device, and nothing was written to the survivors.
        let extra = (0..width).find(|index| !destroyed.contains(index)).unwrap();
        std::fs::remove_file(pool.path(&device(extra))).unwrap();
        let survivors: Vec<(String, Vec<u8>)> = (0..width)
            .filter(|index| *index != extra && !destroyed.contains(index))
            .map(|index| {
                (
                    device(index),
                    std::fs::read(pool.path(&device(index))).unwrap(),
                )
            })
            .collect();
        let error = pool.serve_refused();
        assert!(
            error.contains("cannot be opened") && error.contains(&format!("can lose at most {p}")),
            "{kind}: {error}"
        );
        for index in destroyed.iter().chain([&extra]) {
            assert!(
                error.contains(&device(*index)),
                "{kind}: {error} should name {}",
                device(*index)
            );
        }
        for (name, bytes) in survivors {
            assert!(
                std::fs::read(pool.path(&name)).unwrap() == bytes,
                "{kind}: {name} changed during a refused import"
            );
        }
    }
}

#[test]
fn corrupted_columns_on_parity_devices_read_correctly_and_are_repaired() {
    for (kind, width) in LAYOUTS {
        let p = parity(kind);
        let (mut pool, uri) = written_pool(kind, width, &["write -P 0x44 21M 12k"]);
        pool.stop();
        // Every byte of p devices' data areas: every block (data and metadata)
        // has up to p bad columns. The last p hold the data columns of most
        // blocks, so reads meet the damage too, not only scrubs.
        let damaged: Vec<usize> = (width - p..width).collect();
        for index in &damaged {
            corrupt_data_area(&pool, &device(*index));
        }
        pool.serve();
        let mut reads = READS.to_vec();
        reads.push("read -P 0x44 21M 12k");
        qemu_io(&uri, &reads);
        let status = pool.status_json();
        let found: u64 = damaged
            .iter()
            .map(|index| checksum_errors(&status, *index))
            .sum();
        assert!(
            found > 0,
            "{kind}: reads found and counted the damage: {status}"
        );
        let healthy: u64 = (0..width - p)
            .map(|index| checksum_errors(&status, index))
            .sum();
        assert_eq!(healthy, 0, "{kind}: no blame on intact devices: {status}");
        let first = scrub(&pool);
        assert_eq!(first["errors"], 0, "{kind}: {first}");
        let second = scrub(&pool);
        assert_eq!(
            (second["errors"].as_u64(), second["bad_copies"].as_u64()),
            (Some(0), Some(0)),
            "{kind}: the first scrub repaired everything: {second}"
        );
        let status = pool.status_json();
        for index in &damaged {
            assert!(
                status["vdevs"][0]["children"][*index]["repaired_bytes"]
                    .as_u64()
                    .unwrap()
                    > 0,
                "{kind}: {status}"
            );
        }
        pool.stop();
        // The repaired devices now carry the pool without the others.
        for index in 0..p {
            std::fs::remove_file(pool.path(&device(index))).unwrap();
        }
        pool.serve();
        qemu_io(&uri, &reads);
        pool.stop();
    }
}

#[test]
fn more_bad_columns_than_parity_give_read_errors_never_wrong_data() {
    let (kind, width) = LAYOUTS[0];
    let (mut pool, uri) = written_pool(kind, width, &[]);
    pool.stop();
    // Two of three devices damaged where the volume's data lives (the first
    // MiBs of each data area; metadata sits in later metaslabs).
    for index in [1, 2] {
        corrupt_file(&pool.path(&device(index)), DATA_START, 12 << 20);
    }
    pool.serve();
    let chunks: Vec<String> = (0..20)
        .map(|mib| {
            format!(
                "read -P {} {mib}M 1M",
                ["0x11", "0x22", "0x33"][if mib < 8 {
                    0
                } else if mib < 16 {
                    1
                } else {
                    2
                }]
            )
        })
        .collect();
    let mut args = vec!["-f".to_string(), "raw".to_string(), uri.clone()];
    for chunk in &chunks {
        args.push("-c".into());
        args.push(chunk.clone());
    }
    let output = Command::new("qemu-io")
        .args(&args)
        .output()
        .expect("run qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !text.contains("Pattern verification failed"),
        "wrong data returned:\n{text}"
    );
    assert!(
        text.contains("Input/output error"),
        "the damage must surface as read errors:\n{text}"
    );
    let status = pool.status_json();
    assert!(
        status["unrecoverable_reads"].as_u64().unwrap() > 0,
        "{status}"
    );
    pool.stop();
}

#[test]
fn a_replaced_device_is_resilvered_to_the_old_ones_content_and_scrubs_clean() {
    for (kind, width) in LAYOUTS {
        let p = parity(kind);
        let (mut pool, uri) = written_pool(kind, width, &[]);
        let old = std::fs::read(pool.path(&device(1))).unwrap();
        let new = pool.path("new.img").display().to_string();
        let result = pool.admin(&[
            "--json",
            "replace",
            "-w",
            "--size",
            DEVICE_SIZE,
            &pool.name.clone(),
            &device(1),
            &new,
        ]);
        let status: serde_json::Value =
            serde_json::from_str(result.lines().last().unwrap()).unwrap();
        assert_eq!(status["health"], "ONLINE", "{kind}: {status}");
        assert_eq!(status["vdevs"][0]["children"][1]["path"], new.as_str());
        assert_eq!(status["resilver"]["state"], "finished", "{status}");
        assert_eq!(status["resilver"]["errors"], 0, "{status}");
        assert!(
            status["resilver"]["rewritten_blocks"].as_u64().unwrap() > 0,
            "{status}"
        );
        let scrubbed = scrub(&pool);
        assert_eq!(
            (scrubbed["errors"].as_u64(), scrubbed["bad_copies"].as_u64()),
            (Some(0), Some(0)),
            "{kind}: {scrubbed}"
        );
        pool.stop();
        // The volume's data fills the first metaslab(s) of the group from the
        // start: this device's share of it is its first 20 MiB * width /
        // (width - p) / width of data area. There the new device must equal
        // the old one byte for byte (later metaslabs hold metadata rewritten
        // since the replace, which the old device never saw).
        let share = (20u64 << 20) / (width - p) as u64 / 4096 * 4096;
        let replaced = std::fs::read(pool.path("new.img")).unwrap();
        let range = DATA_START as usize..(DATA_START + share) as usize;
        assert!(
            replaced[range.clone()] == old[range.clone()],
            "{kind}: the data columns on the new device differ from the old device's"
        );
        assert!(replaced[range].iter().any(|byte| *byte != 0));
        // And it carries the pool with p others gone.
        for index in (0..width).filter(|index| *index != 1).take(p) {
            std::fs::remove_file(pool.path(&device(index))).unwrap();
        }
        pool.serve();
        qemu_io(&uri, &READS);
        pool.stop();
        let error = pool.run(&["check", "tank", "-d", &dir(&pool)]);
        assert!(
            error.status.success(),
            "{}",
            String::from_utf8_lossy(&error.stderr)
        );
    }
}

/// Total (bytes, ops) written to the pool's devices so far, from `iostat`.
fn device_writes(pool: &TestPool) -> (u64, u64) {
    let text = pool.admin(&["--json", "iostat", &pool.name]);
    let json: serde_json::Value = serde_json::from_str(&text).expect("iostat JSON");
    let devices = json["devices"].as_array().expect("devices in iostat");
    devices.iter().fold((0, 0), |(bytes, ops), device| {
        (
            bytes + device["write_bytes"].as_u64().unwrap(),
            ops + device["write_ops"].as_u64().unwrap(),
        )
    })
}

/// fio's 16K random writes at QD64 over `uri`, then a read of everything
/// written, checked against fio's own checksums.
fn random_writes_verified(uri: &str) {
    let output = tool(
        "fio",
        &[
            "--name=randwrite",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=16k",
            "--iodepth=64",
            "--size=96M",
            "--io_size=64M",
            "--verify=crc32c",
            "--output-format=json",
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&output[output.find('{').expect("fio JSON")..]).expect("fio JSON");
    assert_eq!(json["jobs"][0]["error"], 0, "{}", json["jobs"][0]);
}

/// Write-back: random 16K writes at QD64 on raidz2 of 6 reach the children as
/// writes of 128 KiB and more on average (written as they arrived, each child
/// saw 50 KiB writes: one 4 KiB column per block, merged only with the columns
/// queued beside it), and read back as written, before and after the flush
/// that writes them out. With `dirty_data_max_bytes=0` (write-back off) the
/// same load is written through and reads back too.
#[test]
fn random_writes_reach_raidz_children_as_large_writes() {
    let mut pool = TestPool::new("tank");
    let names: Vec<String> = (0..6).map(device).collect();
    let mut layout = vec!["raidz2"];
    layout.extend(names.iter().map(String::as_str));
    pool.create("256M", &layout);
    pool.create_volume("vol", "128M");
    pool.serve();
    let uri = pool.uri("vol");
    let before = device_writes(&pool);
    random_writes_verified(&uri);
    qemu_io(&uri, &["flush"]);
    let after = device_writes(&pool);
    let (bytes, ops) = (after.0 - before.0, after.1 - before.1);
    let average = bytes / ops.max(1);
    eprintln!("average device write {average} bytes ({bytes} bytes in {ops} writes)");
    assert!(
        average >= 128 << 10,
        "average device write {average} bytes ({bytes} bytes in {ops} writes)"
    );
    let stats = &pool.status_json();
    assert_eq!(stats["health"], "ONLINE", "{stats}");

    pool.admin(&["tune", &pool.name, "dirty_data_max_bytes", "0"]);
    random_writes_verified(&uri);
    pool.stop();
    pool.ok(&["check", &pool.name.clone(), "-d", &dir(&pool)]);
}
