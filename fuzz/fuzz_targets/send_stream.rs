#![no_main]
//! Fuzz target `send_stream`: the checks are in `ironpool_fuzz::send_stream` (see src/send_stream.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::send_stream::check(data));
