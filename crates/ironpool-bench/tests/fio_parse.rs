//! fio JSON parsing against real fio 3.33 outputs recorded in tests/data/fio.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use ironpool_bench::fio_json::{parse, FioOutput};
use ironpool_bench::fio_runner::FioRun;

fn recorded(name: &str) -> String {
    let path = format!("{}/tests/data/fio/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parsed(name: &str) -> FioOutput {
    parse(&recorded(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

#[test]
fn io_uring_random_writes() {
    let output = parsed("randwrite.json");
    assert!(output.preamble.is_empty());
    assert_eq!(output.report.fio_version, "fio-3.33");
    let job = &output.report.jobs[0];
    assert_eq!(job.error, 0);
    assert!(
        job.read.summary().is_none(),
        "a write-only job has no read figures"
    );
    let write = job.write.summary().unwrap();
    assert_eq!(write.ops, 70_809);
    assert!((write.iops - 70_738.262).abs() < 0.01);
    assert_eq!(write.latency.p99_ns, 1_302_528);
    assert!(write.latency.p50_ns > 0 && write.latency.p50_ns <= write.latency.p95_ns);
    assert!(
        write.latency.p95_ns <= write.latency.p99_ns
            && write.latency.p99_ns <= write.latency.max_ns
    );
    assert_eq!(write.io_bytes, 70_809 * 16_384);
    assert_eq!(output.report.disk_util[0].name, "vda");
}

#[test]
fn mixed_workload_has_both_directions() {
    let job = &parsed("randrw.json").report.jobs[0];
    let (read, write) = (job.read.summary().unwrap(), job.write.summary().unwrap());
    assert_eq!((read.ops, write.ops), (5_582, 2_493));
    assert_eq!(
        (read.latency.p99_ns, write.latency.p99_ns),
        (14_221_312, 14_745_600)
    );
    let share = read.ops as f64 / (read.ops + write.ops) as f64;
    assert!((0.65..0.75).contains(&share), "rwmixread=70 gave {share}");
}

#[test]
fn flushes_are_in_the_sync_section() {
    let fsync = parsed("fsync-qd16.json").report.jobs[0]
        .sync
        .summary()
        .unwrap();
    assert_eq!((fsync.samples, fsync.p99_ns), (27_018, 708_608));
    // psync's fdatasync counts only in lat_ns.N, not total_ios.
    let fdatasync = parsed("psync-fdatasync.json").report.jobs[0]
        .sync
        .summary()
        .unwrap();
    assert_eq!((fdatasync.samples, fdatasync.p99_ns), (8_103, 119_296));
    assert!(parsed("dsync.json").report.jobs[0].sync.summary().is_none());
    let nbd_flush = parsed("nbd-fsync.json").report.jobs[0]
        .sync
        .summary()
        .unwrap();
    assert_eq!(nbd_flush.samples, 13_106);
}

#[test]
fn sequential_read_uses_total_latency() {
    let read = parsed("seqread.json").report.jobs[0]
        .read
        .summary()
        .unwrap();
    assert_eq!((read.ops, read.latency.p99_ns), (921, 1_597_440));
    let prefill = parsed("prefill.json").report.jobs[0]
        .write
        .summary()
        .unwrap();
    assert_eq!(
        prefill.io_bytes,
        256 << 20,
        "the prefill wrote the whole file"
    );
}

#[test]
fn nbd_engine_stray_lines_are_skipped() {
    let output = parsed("nbd-randwrite.json");
    assert_eq!(output.preamble, ["fio: connected to NBD server"]);
    assert_eq!(output.report.jobs[0].write.summary().unwrap().ops, 105_283);
    let four = parsed("nbd-4j.json");
    assert_eq!(four.preamble.len(), 4, "one line per job's connection");
    assert_eq!(four.report.jobs[0].read.summary().unwrap().ops, 111_211);
}

fn run_of(name: &str, exit_code: i32, stderr: &str) -> FioRun {
    FioRun {
        output: parse(&recorded(name)).map_err(|e| format!("{e:#}")),
        status: ExitStatus::from_raw(exit_code << 8),
        wall_seconds: 1.0,
        stderr: stderr.to_string(),
        stopped: false,
    }
}

#[test]
fn failures_are_explained_with_fios_own_words() {
    let error = run_of("nbd-fdatasync.json", 1, "").report().unwrap_err();
    assert!(
        error.contains("errno 22") && error.contains("err=22"),
        "{error}"
    );
    assert!(!error.contains("connected to NBD server"), "{error}");

    let stderr = recorded("nbd-noserver.stderr");
    let error = run_of("nbd-noserver.json", 1, &stderr)
        .report()
        .unwrap_err();
    assert!(
        error.contains("exit status: 1") && error.contains("nbd_connect_uri"),
        "{error}"
    );

    assert!(run_of("randwrite.json", 0, "").report().is_ok());
    let mut stopped = run_of("randwrite.json", 0, "");
    stopped.stopped = true;
    assert!(
        stopped.report().is_err(),
        "an interrupted run is not a result"
    );
}

#[test]
fn garbage_is_an_error() {
    assert!(parse("fio: no jobs\n").is_err());
    assert!(parse("{\"jobs\": []}").is_err());
    assert!(parse("{ not json").is_err());
}
