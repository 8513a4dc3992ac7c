//! The I/O queue end to end: a client's queue depth reaches the devices.

mod common;

use std::time::Duration;

use common::{tool, TestPool};

/// Average number of device I/Os active between two `iostat --json` samples,
/// for the busiest device.
fn average_active(before: &serde_json::Value, after: &serde_json::Value, field: &str) -> f64 {
    let elapsed =
        after["timestamp_ns"].as_f64().unwrap() - before["timestamp_ns"].as_f64().unwrap();
    after["devices"]
        .as_array()
        .unwrap()
        .iter()
        .zip(before["devices"].as_array().unwrap())
        .map(|(now, then)| (now[field].as_f64().unwrap() - then[field].as_f64().unwrap()) / elapsed)
        .fold(0.0, f64::max)
}

/// Average size of the device writes between two `iostat --json` samples, all
/// devices together (0 without writes).
fn average_write_bytes(before: &serde_json::Value, after: &serde_json::Value) -> f64 {
    let total = |sample: &serde_json::Value, field: &str| {
        sample["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|device| device[field].as_f64().unwrap())
            .sum::<f64>()
    };
    let ops = total(after, "write_ops") - total(before, "write_ops");
    if ops == 0.0 {
        return 0.0;
    }
    (total(after, "write_bytes") - total(before, "write_bytes")) / ops
}

/// (device I/Os active, queue requests inside them, average device write in
/// bytes) during a load: two samples 2 s apart, taken 2 s after fio starts.
/// On a machine loaded by other tests fio may start late or its runtime end
/// inside the window, which would average idle time in: such a window is
/// thrown away and the load run again.
fn sample_during(pool: &TestPool, fio_args: Vec<String>) -> (f64, f64, f64) {
    const ATTEMPTS: u32 = 3;
    for _ in 0..ATTEMPTS {
        let args = fio_args.clone();
        let runner = std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tool("fio", &args)
        });
        std::thread::sleep(Duration::from_millis(2000));
        let before: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "iostat", "tank"])).unwrap();
        std::thread::sleep(Duration::from_millis(2000));
        let after: serde_json::Value =
            serde_json::from_str(&pool.admin(&["--json", "iostat", "tank"])).unwrap();
        let inside = !runner.is_finished();
        runner.join().expect("fio thread");
        if inside {
            return (
                average_active(&before, &after, "active_time_weighted_ns"),
                average_active(&before, &after, "active_requests_time_weighted_ns"),
                average_write_bytes(&before, &after),
            );
        }
    }
    panic!("fio ended inside the sampling window {ATTEMPTS} times");
}

#[test]
fn a_deep_client_queue_reaches_the_devices() {
    let mut pool = TestPool::new("tank");
    pool.create("1G", &["mirror", "a.img", "b.img"]);
    pool.create_volume("vol", "512M");
    pool.serve();
    let uri = format!("--uri={}", pool.uri("vol"));
    tool(
        "fio",
        &[
            "--name=fill",
            "--ioengine=nbd",
            &uri,
            "--rw=write",
            "--bs=1M",
            "--iodepth=8",
            "--size=256M",
        ],
    );
    let common = |rw: &str, bs: &str| -> Vec<String> {
        [
            "--name=load",
            "--ioengine=nbd",
            &uri,
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            "--iodepth=64",
            "--size=256M",
            "--runtime=6",
            "--time_based",
        ]
        .iter()
        .map(|text| text.to_string())
        .collect()
    };
    // The depth that reaches the devices: reads bypass the read cache.
    pool.admin(&["set", "direct=always", &format!("{}/vol", pool.name)]);
    let (reads, _, _) = sample_during(&pool, common("randread", "4k"));
    assert!(
        reads >= 8.0,
        "QD64 random reads kept only {reads:.1} I/Os active on the busiest device"
    );
    // Writes aggregate (several client writes per device I/O): the depth that
    // reaches the device is the client requests inside active device I/Os.
    // Held by the write-back, they reach the devices in batches of 4 MiB: few
    // device I/Os, each carrying many client writes (a batch's blocks that
    // follow each other on a device are already one queue request, so the
    // depth shows in the size of the device writes).
    let (held_ios, held_requests, held_write_bytes) =
        sample_during(&pool, common("randwrite", "16k"));
    let held_writes_per_io = held_write_bytes / 16384.0;
    eprintln!("random writes, write-back: {held_ios:.1} device I/Os, {held_requests:.1} queue requests active on average; {held_writes_per_io:.1} client writes per device write");
    assert!(held_writes_per_io >= 8.0, "QD64 random writes held: device writes carried only {held_writes_per_io:.1} client writes of 16 KiB on average");
    // Written through, each client write goes to the queue as it arrives: the
    // client's depth must reach the device as several I/Os at once.
    pool.admin(&["tune", "tank", "dirty_data_max_bytes", "0"]);
    let (write_ios, write_requests, _) = sample_during(&pool, common("randwrite", "16k"));
    eprintln!("random writes, written through: {write_ios:.1} device I/Os, {write_requests:.1} client requests active on average");
    assert!(write_requests >= 8.0, "QD64 random writes: only {write_requests:.1} client requests were at the device on average");
    assert!(
        write_ios > 1.0,
        "QD64 random writes: {write_ios:.1} device I/Os active on average"
    );
    let queues = pool.admin(&["--json", "iostat", "-q", "tank"]);
    assert!(
        queues.contains("\"classes\""),
        "per-class queue figures in iostat JSON"
    );
    pool.stop();
}
