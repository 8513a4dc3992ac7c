#![no_main]
//! Fuzz target `spacemap`: the checks are in `ironpool_fuzz::spacemap` (see src/spacemap.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::spacemap::check(data));
