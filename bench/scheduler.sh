#!/usr/bin/env bash
# The I/O scheduler's figures, now `ironpool bench --suite scheduler`, on a
# mirror of two files beside a raw file: 4K random reads at QD64 (the device
# queue depth they reach, in the target's table), 16K random writes at QD64
# and 4K sequential reads at QD16 (device I/O size and aggregation), and QD1
# 4K random reads beside a QD64 16K random-write load (fairness: their p99);
# each as configured, with aggregation off (tune.aggregation_limit_bytes=1)
# and with the priority classes off (tune.classes=off).
#   RT=seconds per test (10); report in OUT (bench-out/scheduler)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironpool-cli >/dev/null
exec target/release/ironpool bench --suite scheduler --size 2G --runtime "${RT:-10}" \
    --out "${OUT:-bench-out/scheduler}"
