//! The simulator in CI: a fixed set of seeds across layouts and fault sets,
//! through the same `ironpool_sim::run` the `ironpool-sim` command uses. A
//! failure prints the command that replays it.
//!
//! `IRONPOOL_SIM_SEEDS=N` runs N seeds per combination instead of the default.

use ironpool_sim::{run, FaultSet, Layout, Options};

/// Steps per run: enough for several crashes, heals and snapshots per seed
/// while the whole file stays within a couple of minutes in the test profile.
const TICKS: u64 = 150;

fn seeds_per_case(default: u64) -> u64 {
    std::env::var("IRONPOOL_SIM_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn sweep(faults: &str, first_seed: u64, seeds: u64) {
    let faults = FaultSet::parse(faults).expect("a valid fault list");
    let mut failures = Vec::new();
    for layout in Layout::ALL {
        for seed in first_seed..first_seed + seeds_per_case(seeds) {
            let options = Options::new(seed, TICKS, faults, layout);
            match run(&options) {
                Ok(summary) => assert_eq!(
                    summary.steps,
                    TICKS,
                    "seed {seed} {}: ran {} steps",
                    layout.name(),
                    summary.steps
                ),
                Err(failure) => failures.push(failure.to_string()),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn no_faults() {
    sweep("none", 1, 2);
}

#[test]
fn crashes() {
    sweep("crash,latency", 100, 2);
}

#[test]
fn device_damage_within_redundancy() {
    sweep(
        "read-error,read-corrupt,write-error,write-corrupt,misdirect,rot,nospace,vanish",
        200,
        2,
    );
}

#[test]
fn every_fault() {
    sweep("all", 300, 2);
}

/// One seed and commit give the same run: same steps, same faults, same bytes
/// on every device.
#[test]
fn a_seed_replays_bit_for_bit() {
    let options = Options::new(7, 120, FaultSet::all(), Layout::Mirror);
    let first = run(&options).unwrap_or_else(|failure| panic!("{failure}"));
    let second = run(&options).unwrap_or_else(|failure| panic!("{failure}"));
    assert_eq!(first.digest, second.digest);
    assert_eq!(first.simulated_ns, second.simulated_ns);
    assert_eq!(first.operations, second.operations);
    assert_eq!(first.faults, second.faults);
    // And a different seed is a different run (the digest sees the media).
    let other = run(&Options::new(8, 120, FaultSet::all(), Layout::Mirror))
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert_ne!(first.digest, other.digest);
}

/// The checkers can fail: damage beyond redundancy (every copy of the pool's
/// data rotted on a stripe) must be caught, not pass silently.
#[test]
fn the_checkers_catch_damage_beyond_redundancy() {
    let caught = ironpool_sim::damage_beyond_redundancy_is_caught(11);
    assert!(caught.is_ok(), "{caught:?}");
}

/// Regressions: the seeds that found engine bugs (see docs/SIMULATOR.md).
fn replay(seed: u64, ticks: u64, faults: &str, layout: Layout, check_every: u64) {
    let mut options = Options::new(
        seed,
        ticks,
        FaultSet::parse(faults).expect("a valid fault list"),
        layout,
    );
    options.check_every = check_every;
    if let Err(failure) = run(&options) {
        panic!("{failure}");
    }
}

/// Cache eviction dropped the ancestors of a node it had just loaded, and the
/// synchronous link that followed failed with "node not cached".
#[test]
fn regression_eviction_keeps_the_ancestors_of_cached_nodes() {
    replay(1, 200, "none", Layout::Mirror, 25);
}

/// The space check walked trees of one txg and compared them with the
/// allocator of the next (the idle pool committed during the walk).
#[test]
fn regression_space_check_holds_off_txg_builds() {
    replay(6, 40, "reorder,crash", Layout::Stripe, 1);
}

/// Destroying a volume walked its tree across awaits and freed what it
/// collected; a txg built meanwhile had already synced the volume's dirty
/// nodes and freed their old copies, so those were freed twice (the allocator
/// panicked at the next build). Rollback had the same window.
#[test]
fn regression_destroy_holds_off_txg_builds_during_its_walk() {
    replay(15, 230, "all", Layout::Mirror, 25);
}

/// A RAID-Z skip-sector pad (an optional write) queued before the column it
/// follows headed an aggregate, was trimmed from it, and was never dispatched
/// again: the block write waited forever while every queue looked idle. The
/// step watchdog reports it as a hang.
#[test]
fn regression_optional_pads_trimmed_from_an_aggregate_still_complete() {
    replay(1, 60, "latency", Layout::Raidz3, 25);
    replay(4, 60, "latency", Layout::Raidz2, 25);
}

/// Scrubs repaired the columns of devices that had missed txgs but left
/// their logs of missed txgs in place, so every scrub found the same "bad"
/// copies again and reads kept avoiding those devices.
#[test]
fn regression_a_clean_scrub_catches_devices_up() {
    replay(
        200,
        150,
        "read-error,read-corrupt,write-error,write-corrupt,misdirect,rot,nospace,vanish",
        Layout::Raidz2,
        25,
    );
}
