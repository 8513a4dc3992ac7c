#!/usr/bin/env bash
# Snapshots of a filesystem, in one run: reads of a file through
# MOUNTPOINT/.zfs/snapshot/NAME against the same file in the head (fio
# io_uring direct=1, 4K random reads at QD64 and 1 MiB sequential reads at
# QD16, IOPS and the ratio), then how long `ironpool snapshot` takes once
# the filesystem holds FILES more files, and a listing of them in the new
# snapshot. Needs root, /dev/fuse, fio and a release build.
#
# Usage: scripts/bench-snapshot.sh [FILES] [RUNTIME_S] [IRONPOOL_BIN]
#   default: 20000 files, 8 s, target/release/ironpool
set -euo pipefail
files=${1:-20000}
runtime=${2:-8}
bin=${3:-$PWD/target/release/ironpool}
source "$(dirname "$0")/bench-lib.sh"
bench_start bench-snapshot "$bin"
bench_serve snap 4G
"$bin" fs create snap/fs -o "mountpoint=$work/mnt" -o recordsize=16K >/dev/null
grep -q " $work/mnt fuse.ironpool" /proc/self/mounts || { echo "bench-snapshot: not mounted: $(cat "$work/serve.log")" >&2; exit 1; }
fio --name=fill --filename="$work/mnt/file" --size=1G --rw=write --bs=1M \
    --ioengine=io_uring --direct=1 --iodepth=16 >/dev/null
"$bin" snapshot snap/fs@one >/dev/null

# read_iops FILE RW BS DEPTH: fio's read IOPS.
read_iops() {
    fio --name=read --filename="$1" --size=1G --rw="$2" --bs="$3" --ioengine=io_uring \
        --direct=1 --iodepth="$4" --runtime="$runtime" --time_based --output-format=json |
        python3 -c 'import json, sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$@"; }

echo "# bench-snapshot $(date -u +%FT%TZ) files=$files runtime=${runtime}s $(git rev-parse --short HEAD) $(uname -r)"
printf "%-16s %10s %10s %7s\n" test head snapshot ratio
for test in "randread 4k 64" "read 1M 16"; do
    set -- $test
    head=$(read_iops "$work/mnt/file" "$1" "$2" "$3")
    snapshot=$(read_iops "$work/mnt/.zfs/snapshot/one/file" "$1" "$2" "$3")
    printf "%-16s %10s %10s %6.2fx\n" "${1}_${2}_qd$3" "$head" "$snapshot" \
        "$(python3 -c "print($snapshot / $head)")"
done
python3 - "$work/mnt/many" "$files" <<'PY'
import os, sys
directory, count = sys.argv[1], int(sys.argv[2])
os.mkdir(directory)
for index in range(count):
    open(os.path.join(directory, f"f{index}"), "w").close()
PY
start=$(date +%s.%N)
"$bin" snapshot snap/fs@many >/dev/null
echo "snapshot with $files more files: $(seconds "$start" "$(date +%s.%N)") s"
start=$(date +%s.%N)
listed=$(ls "$work/mnt/.zfs/snapshot/many/many" | wc -l)
echo "listing the $listed of them in the snapshot: $(seconds "$start" "$(date +%s.%N)") s"
"$bin" export snap >/dev/null
server=""
