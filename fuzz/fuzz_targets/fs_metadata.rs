#![no_main]
//! Fuzz target `fs_metadata`: the checks are in `ironpool_fuzz::fs_metadata` (see
//! src/fs_metadata.rs), so the replay test (`cargo test` here) runs exactly what the
//! fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::fs_metadata::check(data));
