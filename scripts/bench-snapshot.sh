#!/usr/bin/env bash
# The snapshot table, now `ironpool bench --suite snapshot`: 4K random
# reads at QD64 and 1 MiB sequential reads at QD16 of a 1 GiB file through
# MOUNTPOINT/.zfs/snapshot/NAME beside the same reads of the head (the
# summary's ratio), then `ironpool snapshot` once the filesystem holds FILES
# more files and a listing of them in that snapshot; the raw file beside.
#
# Usage: [OUT=DIR] scripts/bench-snapshot.sh [FILES] [RUNTIME_S] [IRONPOOL_BIN]
#   default: 20000 files, 8 s, target/release/ironpool; report in OUT
#   (target/bench-snapshot)
set -euo pipefail
exec "${3:-$PWD/target/release/ironpool}" bench --suite snapshot \
    --target ironpool-fs:mirror:2x4G:recordsize=16K --size 1G --files "${1:-20000}" \
    --runtime "${2:-8}" --out "${OUT:-target/bench-snapshot}"
