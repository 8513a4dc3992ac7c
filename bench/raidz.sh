#!/usr/bin/env bash
# RAID-Z figures (issue 4), now `ironpool bench --suite raidz`: for each
# layout (default raidz2 of 6 files and raidz1 of 4, DEVICE each), 16K
# random writes at QD64 over the prefilled volume and 1 MiB sequential
# writes at QD16, with write amplification and device write size, beside a
# raw file; then parity generation against memcpy
# (examples/raidz_parity_speed.rs).
#   RT=seconds per test (15), SIZE=working set (1G), DEVICE=each image (768M),
#   LAYOUTS ("raidz2:6 raidz1:4"; KIND:WIDTH:through turns write-back off:
#   tune.dirty_data_max_bytes=0), TUNE="NAME=VALUE ..." tunables of every
#   pool; report in OUT (bench-out/raidz)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironpool-cli -p ironpool --example raidz_parity_speed >/dev/null 2>&1
tunables=""
for setting in ${TUNE:-}; do tunables="$tunables,tune.$setting"; done
targets=()
for layout in ${LAYOUTS:-raidz2:6 raidz1:4}; do
    IFS=: read -r kind width mode <<<"$layout"
    extra=$tunables
    [ "${mode:-}" = through ] && extra="$extra,tune.dirty_data_max_bytes=0"
    targets+=(--target "ironpool:$kind:${width}x${DEVICE:-768M}${extra:+:${extra#,}}")
done
target/release/ironpool bench --suite raidz "${targets[@]}" --size "${SIZE:-1G}" \
    --runtime "${RT:-15}" --out "${OUT:-bench-out/raidz}"
target/release/examples/raidz_parity_speed
