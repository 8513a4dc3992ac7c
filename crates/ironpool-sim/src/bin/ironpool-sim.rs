//! `ironpool-sim`: runs the deterministic simulator for one seed or a sweep.
//!
//!     ironpool-sim --seed 7 --ticks 2000 --faults all --layout mirror
//!     ironpool-sim --seeds 1..1000 --faults all --layout mirror3
//!
//! Exits non-zero when a seed fails, after printing the command that replays it.

use std::process::ExitCode;

use clap::Parser;
use ironpool_sim::{run, FaultSet, Layout, Options, Summary, CHECK_EVERY_DEFAULT, TICKS_DEFAULT};

/// Runs the real ironpool engine on simulated devices with seeded faults and
/// checks it after every step.
#[derive(Parser)]
#[command(name = "ironpool-sim", version, about)]
struct Cli {
    /// The seed of one run.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A sweep of seeds, A..B (B excluded).
    #[arg(long)]
    seeds: Option<String>,
    /// Workload steps per run (one operation and its checks each).
    #[arg(long, default_value_t = TICKS_DEFAULT)]
    ticks: u64,
    /// Faults to inject: none, all, or a comma-separated list of latency,
    /// reorder, read-error, read-corrupt, write-error, write-corrupt, misdirect,
    /// rot, nospace, vanish, crash.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Pool layout: stripe, mirror (two 2-way mirrors), mirror3 (one 3-way),
    /// raidz1 (4 devices), raidz2 (6), raidz3 (7), mirror-log (a 2-way mirror and a log device).
    /// A sweep may name several, comma-separated, or "every".
    #[arg(long, default_value = "mirror")]
    layout: String,
    /// Steps between full checks (a space walk and a read of every dataset).
    #[arg(long, default_value_t = CHECK_EVERY_DEFAULT)]
    check_every: u64,
    /// Print every step.
    #[arg(long)]
    trace: bool,
    /// Keep going after a failing seed (a sweep reports all of them).
    #[arg(long)]
    keep_going: bool,
}

fn parse_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("'{text}': a sweep is A..B"))?;
    let start: u64 = start
        .parse()
        .map_err(|_| format!("'{start}' is not a number"))?;
    let end: u64 = end
        .parse()
        .map_err(|_| format!("'{end}' is not a number"))?;
    if end <= start {
        return Err(format!("'{text}' is empty"));
    }
    Ok(start..end)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let faults = match FaultSet::parse(&cli.faults) {
        Ok(faults) => faults,
        Err(error) => {
            eprintln!("ironpool-sim: {error}");
            return ExitCode::from(2);
        }
    };
    let layouts: Result<Vec<Layout>, String> = if cli.layout == "every" {
        Ok(Layout::ALL.to_vec())
    } else {
        cli.layout.split(',').map(Layout::parse).collect()
    };
    let layouts = match layouts {
        Ok(layouts) => layouts,
        Err(error) => {
            eprintln!("ironpool-sim: {error}");
            return ExitCode::from(2);
        }
    };
    let seeds = match (&cli.seed, &cli.seeds) {
        (Some(seed), _) => *seed..*seed + 1,
        (None, Some(range)) => match parse_range(range) {
            Ok(range) => range,
            Err(error) => {
                eprintln!("ironpool-sim: {error}");
                return ExitCode::from(2);
            }
        },
        (None, None) => 0..1,
    };
    // Engine panics are reported as the seed's failure, with its replay command;
    // the default hook's message would only repeat it (with --trace it stays,
    // for its backtrace).
    if !cli.trace {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let single = seeds.end - seeds.start == 1 && layouts.len() == 1;
    let mut total = Summary::default();
    let mut failures = 0u64;
    let mut runs = 0u64;
    for seed in seeds {
        for layout in &layouts {
            let options = Options {
                seed,
                ticks: cli.ticks,
                faults,
                layout: *layout,
                check_every: cli.check_every.max(1),
                trace: cli.trace,
                sabotage_step: None,
            };
            runs += 1;
            match run(&options) {
                Ok(summary) => {
                    if single {
                        println!(
                            "ironpool-sim: seed {seed} layout {} faults {faults} ticks {}: ok",
                            layout.name(),
                            cli.ticks
                        );
                        println!("{summary}");
                    } else {
                        println!(
                            "seed {seed} {}: ok, {:.1} s simulated, digest {:#018x}",
                            layout.name(),
                            summary.simulated_seconds(),
                            summary.digest
                        );
                    }
                    merge(&mut total, &summary);
                }
                Err(failure) => {
                    failures += 1;
                    println!("FAILED {failure}");
                    if !cli.keep_going {
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
    }
    if !single {
        println!(
            "ironpool-sim: {runs} runs, {failures} failed, faults {faults}, ticks {} each",
            cli.ticks
        );
        println!("{total}");
    }
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Adds one run's figures to a sweep's totals.
fn merge(total: &mut Summary, summary: &Summary) {
    total.steps += summary.steps;
    total.simulated_ns += summary.simulated_ns;
    total.sessions += summary.sessions;
    for (target, source) in [
        (&mut total.operations, &summary.operations),
        (&mut total.faults, &summary.faults),
        (&mut total.checks, &summary.checks),
    ] {
        for (name, count) in source {
            *target.entry(name).or_insert(0) += count;
        }
    }
    total.digest ^= summary.digest;
}
