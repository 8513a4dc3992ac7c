#![no_main]
//! Fuzz target `block_pointer`: the checks are in `ironpool_fuzz::block_pointer` (see src/block_pointer.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::block_pointer::check(data));
