#!/usr/bin/env bash
# Compares ironpool binaries on flush-heavy writes, now `ironpool bench
# --suite durable`: for each binary given, a pool of two 4 GiB sparse files
# (a stripe, or a mirror with MIRROR=1), a 1 GiB prefilled volume, fio's nbd
# engine: 16K random writes with a flush after each at QD1 and after every
# 32 at QD64 (and the suite's other durable rows), beside the raw file (and
# the raw pair for a mirror); the report gives device syncs per client
# flush, with the flushes skipped. Only same-run ratios mean anything here.
#
#   [MIRROR=1] [OUT=DIR] scripts/compare-flush.sh /tmp/ironpool-old target/release/ironpool
set -euo pipefail
layout=stripe
[ "${MIRROR:-0}" = 1 ] && layout=mirror
targets=()
for bin in "$@"; do targets+=(--target "ironpool:$layout:2x4G:bin=$bin"); done
exec "$1" bench --suite durable "${targets[@]}" --size 1G --runtime 8 --out "${OUT:-$PWD/compare-flush}"
