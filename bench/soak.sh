#!/usr/bin/env bash
# Soak, now `ironpool bench --suite soak`: 8 NBD clients at queue depth 64
# (one connection each) doing 16K random reads and writes (70/30), each in
# its own eighth of a 4 GiB volume on a mirror, with crc32c verification of
# what they read back, for MINUTES minutes (10), beside the raw file doing
# the same. The server's RSS, its CPU and the pool's free space are sampled
# 20 times over the run (results.json's `samples`; the notes sum them up)
# and memory still growing over the second half is a warning. Not part of
# CI.
#   report in OUT (bench-out/soak)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironpool-cli >/dev/null
exec target/release/ironpool bench --suite soak --target ironpool:mirror:2x8G --size 4G \
    --runtime "$(( ${MINUTES:-10} * 60 ))" --out "${OUT:-bench-out/soak}"
