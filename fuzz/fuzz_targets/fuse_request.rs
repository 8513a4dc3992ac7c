#![no_main]
//! Fuzz target `fuse_request`: the checks are in `ironpool_fuzz::fuse_request` (see
//! src/fuse_request.rs), so the replay test (`cargo test` here) runs exactly what the
//! fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::fuse_request::check(data));
