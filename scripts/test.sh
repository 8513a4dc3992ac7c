#!/usr/bin/env bash
# Runs every test: unit and property tests, the deterministic simulator (crashes
# at seeded points), and integration tests against real NBD clients (nbdinfo,
# qemu-io, fio) on pools of real files, plus the benchmark tool's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --workspace --all-targets
export IRONPOOL_BIN="$PWD/target/debug/ironpool"
cargo test --workspace -- --test-threads=2
echo "all tests passed"
