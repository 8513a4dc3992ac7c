#![no_main]
//! Fuzz target `nbd_request`: the checks are in `ironpool_fuzz::nbd_request` (see src/nbd_request.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::nbd_request::check(data));
