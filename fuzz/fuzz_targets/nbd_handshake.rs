#![no_main]
//! Fuzz target `nbd_handshake`: the checks are in `ironpool_fuzz::nbd_handshake` (see src/nbd_handshake.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::nbd_handshake::check(data));
