#!/usr/bin/env bash
# Issue 17's table, now `ironpool bench --suite durable`: 16K random writes
# with a flush after each at QD1 and after every 32 at QD64, every write
# durable at QD64 (O_DSYNC; a volume with sync=always), plain at QD64, on
# the raw file, two raw files at once (raw-pair: a mirror's limit), nbdkit,
# and for each binary an ironpool mirror of two files and the same with a
# log device (1 GiB prefilled volume; device syncs per client flush and log
# bytes per client byte in the report).
#
# Usage: [WRITTEN_OUT=0] [HALT_POLL_NS=N] [OUT=DIR] scripts/bench-durable.sh [RUNTIME_S] [IRONPOOL_BIN...]
#   default: 8 s, target/release/ironpool; report in OUT (target/bench-durable)
# The pool's device files are written out with zeros first (as a real
# device's blocks exist); WRITTEN_OUT=0 leaves them sparse.
set -euo pipefail
runtime=${1:-8}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
source "$(dirname "$0")/halt-poll.sh"
trap halt_poll_restore EXIT
halt_poll_apply
echo "# bench-durable $(git rev-parse --short HEAD 2>/dev/null || true) $(halt_poll_describe)"
targets=(--target nbdkit)
for binary in "${binaries[@]}"; do
    targets+=(--target "ironpool:mirror:2x4G:bin=$binary" --target "ironpool:mirror+log:2x4G:bin=$binary")
done
write_out=(--write-out)
[ "${WRITTEN_OUT:-1}" = 0 ] && write_out=()
"${binaries[0]}" bench --suite durable "${targets[@]}" --size 1G --runtime "$runtime" \
    "${write_out[@]}" --out "${OUT:-target/bench-durable}"
