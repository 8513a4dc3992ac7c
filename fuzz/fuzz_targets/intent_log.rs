#![no_main]
//! Fuzz target `intent_log`: the checks are in `ironpool_fuzz::intent_log` (see src/intent_log.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::intent_log::check(data));
