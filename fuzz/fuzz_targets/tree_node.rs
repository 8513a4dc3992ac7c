#![no_main]
//! Fuzz target `tree_node`: the checks are in `ironpool_fuzz::tree_node` (see src/tree_node.rs), so
//! the replay test (`cargo test` here) runs exactly what the fuzzer runs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironpool_fuzz::tree_node::check(data));
