#!/usr/bin/env bash
# How long an administrative action holds the pool's other clients, now
# `ironpool bench --suite stall`: a QD1 4K read probe of another dataset of
# the pool while list, scrub, send, a snapshot's destroy, a rollback, rm -rf
# of FILES files, a truncate and an rm of the working set's file and the
# destroy of its dataset run (the read cache emptied before each), each
# against the probe with no action (stall-none); a volume and a filesystem,
# each binary given side by side (bin=). The notes give each action's time and the probe's
# longest read; a stall 10x the probe's longest with no action is a warning.
#
# Usage: [OUT=DIR] scripts/bench-stall.sh [FILES] [IRONPOOL_BIN...]
#   default: 100000 files, target/release/ironpool; report in OUT
#   (target/bench-stall)
set -euo pipefail
files=${1:-100000}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
targets=()
for bin in "${binaries[@]}"; do
    targets+=(--target "ironpool:mirror:2x8G:bin=$bin,volblocksize=16K"
        --target "ironpool-fs:mirror:2x8G:bin=$bin,recordsize=16K")
done
exec "${binaries[0]}" bench --suite stall "${targets[@]}" --no-raw --size 3G \
    --files "$files" --runtime 12 --out "${OUT:-target/bench-stall}"
