#![no_main]
//! Fuzz target `directory`: the checks are in `ironpool_fuzz::directory` (see src/directory.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::directory::check(data));
