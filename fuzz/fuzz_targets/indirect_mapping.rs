#![no_main]
//! Fuzz target `indirect_mapping`: the checks are in `ironpool_fuzz::indirect_mapping` (see src/indirect_mapping.rs),
//! so the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::indirect_mapping::check(data));
