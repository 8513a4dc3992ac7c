//! Creates, stats and removes N empty files in one directory, one system call
//! after another, and prints the rate of each phase: the fs suite's metadata
//! tests (`ironpool_bench::ops`) for scripts that read a server's counters
//! between phases (`scripts/bench-stall.sh`, `scripts/bench-poll.sh`).
//!
//!     cargo run --release -p ironpool-bench --example metadata -- DIR [FILES [PHASE...]]
//!
//! PHASE is `create`, `stat`, `absent` (a `stat` of N names that do not
//! exist: on FUSE, one LOOKUP round trip each, which is what a round trip
//! costs) or `delete`; by default `create stat delete`. Prints
//! `PHASE FILES/S`, one line per phase.
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use ironpool_bench::ops;
use ironpool_bench::suites::OpsTest;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: metadata DIR [FILES [PHASE...]]");
        return ExitCode::FAILURE;
    };
    let files: u64 = match args.next().map(|n| n.parse()) {
        None => 100_000,
        Some(Ok(files)) => files,
        Some(Err(_)) => {
            eprintln!("FILES is a number");
            return ExitCode::FAILURE;
        }
    };
    let mut phases: Vec<String> = args.collect();
    if phases.is_empty() {
        phases = ["create", "stat", "delete"].map(String::from).to_vec();
    }
    for phase in phases {
        let test = match phase.as_str() {
            "create" => OpsTest::FilesCreate,
            "stat" => OpsTest::FilesStat,
            "absent" => OpsTest::FilesAbsent,
            "delete" => OpsTest::FilesDelete,
            other => {
                eprintln!("unknown phase {other}: create, stat, absent or delete");
                return ExitCode::FAILURE;
            }
        };
        match ops::run(test, Path::new(&dir), files, Duration::ZERO, &mut || {}) {
            Ok(run) => println!("{phase} {:.0}", run.rate()),
            Err(error) => {
                eprintln!("{phase}: {error:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
