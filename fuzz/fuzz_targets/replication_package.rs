#![no_main]
//! Fuzz target `replication_package`: the checks are in `ironpool_fuzz::replication_package` (see
//! src/replication_package.rs), so the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::replication_package::check(data));
