//! ironpool-sim: the real engine on simulated devices, driven by a seeded random
//! workload and checked after every step (see docs/SIMULATOR.md).
//!
//! One run is a pure function of its [`Options`] and the commit: the runtime is
//! the simulator's (virtual time, one thread, FIFO tasks), every device draws its
//! latency and faults from its own seed, the workload draws from the run's seed,
//! and nothing reads the wall clock or iterates a hash map. A failing run reports
//! the one command that replays it.

mod checks;
pub mod faults;
pub mod layout;
pub mod model;
mod run;

use std::collections::BTreeMap;
use std::fmt;

pub use faults::{FaultKind, FaultSet};
pub use layout::Layout;

/// Steps run when `--ticks` is not given.
pub const TICKS_DEFAULT: u64 = 400;
/// Steps between full checks (space walk and a read of every dataset) when
/// `--check-every` is not given: often enough to catch damage near its cause,
/// rarely enough that the commits a check makes do not hide crash windows.
pub const CHECK_EVERY_DEFAULT: u64 = 25;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Workload steps (one operation and its checks each).
    pub ticks: u64,
    pub faults: FaultSet,
    pub layout: Layout,
    pub check_every: u64,
    /// Print each step as it runs (to stderr).
    pub trace: bool,
    /// For testing the checkers themselves: before this step, rot sectors on
    /// every device, far beyond what redundancy covers. A run with it must fail.
    pub sabotage_step: Option<u64>,
}

impl Options {
    pub fn new(seed: u64, ticks: u64, faults: FaultSet, layout: Layout) -> Options {
        Options {
            seed,
            ticks,
            faults,
            layout,
            check_every: CHECK_EVERY_DEFAULT,
            trace: false,
            sabotage_step: None,
        }
    }

    /// The command that replays this run exactly.
    pub fn replay_command(&self) -> String {
        let mut command = format!("cargo run --release --bin ironpool-sim -- --seed {} --ticks {} --faults {} --layout {}", self.seed, self.ticks, self.faults, self.layout.name());
        if self.check_every != CHECK_EVERY_DEFAULT {
            command.push_str(&format!(" --check-every {}", self.check_every));
        }
        command
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub steps: u64,
    /// Virtual time spent, over every session (create or import to crash or end).
    pub simulated_ns: u64,
    pub sessions: u64,
    /// Operations run, by name.
    pub operations: BTreeMap<&'static str, u64>,
    /// Faults injected, by kind (device counters plus the simulator's own events).
    pub faults: BTreeMap<&'static str, u64>,
    /// Checks run, by name.
    pub checks: BTreeMap<&'static str, u64>,
    /// Digest of every device's media at the end: equal for runs of one seed.
    pub digest: u64,
}

impl Summary {
    pub fn simulated_seconds(&self) -> f64 {
        self.simulated_ns as f64 / 1e9
    }

    fn counts(map: &BTreeMap<&'static str, u64>) -> String {
        if map.is_empty() {
            return "none".to_string();
        }
        map.iter()
            .map(|(name, count)| format!("{name} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            formatter,
            "  simulated time {:.1} s in {} sessions, {} steps",
            self.simulated_seconds(),
            self.sessions,
            self.steps
        )?;
        writeln!(
            formatter,
            "  operations: {}",
            Summary::counts(&self.operations)
        )?;
        writeln!(
            formatter,
            "  faults injected: {}",
            Summary::counts(&self.faults)
        )?;
        writeln!(formatter, "  checks: {}", Summary::counts(&self.checks))?;
        write!(formatter, "  digest {:#018x}", self.digest)
    }
}

/// A run that broke an invariant (or panicked in the engine).
#[derive(Clone, Debug)]
pub struct Failure {
    pub options: Options,
    pub step: u64,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            formatter,
            "seed {} failed at step {}: {}",
            self.options.seed, self.step, self.message
        )?;
        write!(formatter, "replay: {}", self.options.replay_command())
    }
}

/// Runs one simulation. Panics inside the engine are caught and reported as a
/// failure of this seed (with its replay command), so a sweep goes on.
pub fn run(options: &Options) -> Result<Summary, Failure> {
    let step = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let step_seen = step.clone();
    let options_copy = options.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        run::Sim::new(options_copy, step_seen).run()
    }));
    match outcome {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            Err(Failure {
                options: options.clone(),
                step: step.get(),
                message: format!("panic: {message}"),
            })
        }
    }
}

/// Shows that the checkers can fail: a run whose devices are all damaged beyond
/// redundancy part way through must be reported as failed (a read error or
/// wrong data caught by the model, or a scrub or space check error). Returns
/// the failure it caught, or an error if the damage went unnoticed.
pub fn damage_beyond_redundancy_is_caught(seed: u64) -> Result<String, String> {
    let mut options = Options::new(seed, 120, FaultSet::none(), Layout::Stripe);
    options.sabotage_step = Some(60);
    match run(&options) {
        Ok(summary) => Err(format!(
            "seed {seed}: damage on every device went unnoticed ({} steps)",
            summary.steps
        )),
        Err(failure) if failure.step >= 60 => Ok(failure.message),
        Err(failure) => Err(format!("seed {seed} failed before the damage: {failure}")),
    }
}
