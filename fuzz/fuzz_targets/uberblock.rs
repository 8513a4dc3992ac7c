#![no_main]
//! Fuzz target `uberblock`: the checks are in `ironpool_fuzz::uberblock` (see src/uberblock.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::uberblock::check(data));
