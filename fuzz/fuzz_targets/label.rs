#![no_main]
//! Fuzz target `label`: the checks are in `ironpool_fuzz::label` (see src/label.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::label::check(data));
