#!/usr/bin/env bash
# The filesystem table of issue 19, now `ironpool bench --suite fs` (see its
# report's summary: every row of an ironpool filesystem beside its limit):
# data (16K random writes at QD1 and QD64 through io_uring and libaio, 4K
# random reads at QD64, 1 MiB sequential at QD16), sync (fsync after each
# write at QD1, after every 32 at QD64, O_DSYNC at QD1), buffered writes,
# cached reads, metadata (create, stat, absent names, delete) and names
# (sqlite commits, new files, atomic replaces). Limits in the same run: the
# raw file, two raw files at once (a mirror's), and ext4 on a loop device
# over a file of the same disk. A volume of the same layout runs the rows a
# volume can (the file-against-volume comparison of issue 69).
#
# Usage: [WRITTEN_OUT=0] [HALT_POLL_NS=N] [FUSE_URING=Y|N] [OUT=DIR] scripts/bench-fs.sh [FILES] [RUNTIME_S] [IRONPOOL_BIN] [TARGET...]
#   default: 100000 files, 8 s, target/release/ironpool, targets
#   ironpool-fs:mirror:2x4G:recordsize=16K and ironpool:mirror:2x4G;
#   report in OUT (target/bench-fs)
# FUSE_URING=Y (or N) mounts with FUSE over io_uring (or /dev/fuse) for the
# run and puts the old setting back at exit. WRITTEN_OUT=0 leaves the device
# files sparse (the host then allocates on each first write).
set -euo pipefail
files=${1:-100000}
runtime=${2:-8}
bin=${3:-$PWD/target/release/ironpool}
shift $(($# < 3 ? $# : 3))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(ironpool-fs:mirror:2x4G:recordsize=16K ironpool:mirror:2x4G)
source "$(dirname "$0")/halt-poll.sh"
knob=/sys/module/fuse/parameters/enable_uring
saved=""
restore() {
    halt_poll_restore
    [ -n "$saved" ] && echo "$saved" >"$knob"
    return 0
}
trap restore EXIT
halt_poll_apply
if [ -n "${FUSE_URING:-}" ]; then
    saved=$(cat "$knob")
    echo "$FUSE_URING" >"$knob"
fi
echo "# bench-fs $(git rev-parse --short HEAD 2>/dev/null || true) $(halt_poll_describe) enable_uring=$(cat "$knob" 2>/dev/null || echo absent)"
args=()
for target in "${targets[@]}"; do args+=(--target "$target"); done
write_out=(--write-out)
[ "${WRITTEN_OUT:-1}" = 0 ] && write_out=()
"$bin" bench --suite fs "${args[@]}" --size 1G --files "$files" --runtime "$runtime" \
    "${write_out[@]}" --out "${OUT:-target/bench-fs}"
