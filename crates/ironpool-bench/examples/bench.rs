//! `ironpool bench` without the main binary, for developing the benchmark:
//! `cargo run -p ironpool-bench --example bench -- --target nbdkit --quick`.
//! ironpool targets need `--ironpool-bin PATH` (or IRONPOOL_BIN).

use clap::Parser;

/// ironpool bench (standalone).
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: ironpool_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Without --ironpool-bin, ironpool targets fail at set-up with a clear
    // message naming this path.
    ironpool_bench::run(cli.bench, std::path::Path::new("ironpool"))
}
