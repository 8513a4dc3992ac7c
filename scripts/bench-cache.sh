#!/usr/bin/env bash
# The read cache's table (issue 18), now `ironpool bench --suite cache`: 4K
# random reads at QD64 and QD1 from the cache of a 1 GiB volume beside
# nbdkit's memory plugin (the ceiling) and the raw file, a 1 MiB sequential
# read at QD1 from a cold cache (one pass), and the three with
# primarycache=none; several binaries side by side with bin=.
#
# Usage: [OUT=DIR] scripts/bench-cache.sh [RUNTIME_S] [IRONPOOL_BIN...]
#   default: 8 s, target/release/ironpool; report in OUT (target/bench-cache)
set -euo pipefail
runtime=${1:-8}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
targets=(--target nbdkit-memory)
for bin in "${binaries[@]}"; do targets+=(--target "ironpool:mirror:2x4G:bin=$bin"); done
exec "${binaries[0]}" bench --suite cache "${targets[@]}" --size 1G --runtime "$runtime" \
    --out "${OUT:-target/bench-cache}"
