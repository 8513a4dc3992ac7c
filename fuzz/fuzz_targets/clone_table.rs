#![no_main]
//! Fuzz target `clone_table`: the checks are in `ironpool_fuzz::clone_table` (see src/clone_table.rs),
//! so the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::clone_table::check(data));
