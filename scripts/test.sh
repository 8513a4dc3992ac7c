#!/usr/bin/env bash
# Runs every test: unit and property tests, the deterministic simulator (crashes
# at seeded points), and integration tests against real NBD clients (nbdinfo,
# qemu-io, fio) on pools of real files, plus the benchmark tool's tests and a short fuzzing pass over every decoder.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Formatting and lints first: they take seconds and fail fast.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
export IRONPOOL_BIN="$PWD/target/debug/ironpool"
cargo test --workspace -- --test-threads=2
# Every on-disk and wire decoder under libFuzzer, briefly: the committed seeds and
# saved crashes must pass, and a short random search must find nothing new.
FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/fuzz.sh
echo "all tests passed"
