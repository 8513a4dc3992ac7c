#![no_main]
//! Fuzz target `dnode`: the checks are in `ironpool_fuzz::dnode` (see src/dnode.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::dnode::check(data));
