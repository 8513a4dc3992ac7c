#!/usr/bin/env bash
# Device removal against the physical limit of moving the same bytes, in one
# run: a pool of one disk (a sparse file) gets a volume filled by fio (1 MiB
# sequential writes through the NBD engine), a second disk is added, and
# `remove` moves everything off the first while the server runs; its time
# (status polled every 0.2 s) is set against `dd` copying the same number of
# bytes from the first disk's file to a third file, sequentially with
# O_DIRECT, on the same host filesystem. fio then reads the whole volume back
# and `check` must find the pool whole. `ironpool bench` has no removal suite
# yet; this script is that measurement until it does.
#
# Usage: scripts/bench-removal.sh [VOLUME_SIZE] [VOLBLOCKSIZE] [IRONPOOL_BIN]
#   default: 2G, 16K, target/release/ironpool
# Needs fio (with its nbd engine), dd and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-2G}
block=${2:-16K}
bin=${3:-$PWD/target/release/ironpool}
work=$(mktemp -d /tmp/ironpool-removal.XXXXXX)
export IRONPOOL_CACHE="$work/pools.json" IRONPOOL_RUN_DIR="$work/run"
socket="$work/nbd.sock"
uri="nbd+unix:///rmb/vol?socket=$socket"
finish() {
    status=$?
    if [ -f "$work/pid" ]; then
        pid=$(cat "$work/pid" 2>/dev/null || true)
        if [ -n "$pid" ]; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
    fi
    rm -rf "$work"
    exit "$status"
}
trap finish EXIT

# `status --json` field EXPRESSION (python, on `s`).
field() {
    "$bin" --json status rmb | python3 -c "import json, sys; s = json.load(sys.stdin); print($1)"
}

# Each disk holds the volume with half as much again to spare.
disk=$(python3 -c "
units = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
size = '$size'
print(str((int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)) * 3 // 2 >> 20) + 'M')")
"$bin" create --size "$disk" rmb "$work/a.img" >/dev/null
"$bin" volume create -o volblocksize="$block" rmb/vol "$size" -d "$work" >/dev/null
setsid -f "$bin" serve -d "$work" --nbd "unix:$socket" --pidfile "$work/pid" rmb 2>"$work/serve.log"
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size="$size" --output=/dev/null
"$bin" add --size "$disk" rmb "$work/b.img" >/dev/null
held=$(field "s['vdevs'][0]['allocated_bytes']")

start=$(date +%s.%N)
"$bin" remove rmb disk-0 >/dev/null
while [ "$(field "s['removal']['state']")" = removing ]; do sleep 0.2; done
end=$(date +%s.%N)
[ "$(field "s['removal']['state']")" = none ] || { field "s['removal']"; exit 1; }
moved=$(field "s['removal']['removed'][0]['moved_bytes']")
blocks=$(field "s['removal']['removed'][0]['moved_blocks']")
fio --name=check --ioengine=nbd --uri="$uri" --rw=read --bs=1M --iodepth=16 --size="$size" --output=/dev/null

truncate -s "$disk" "$work/c.img"
copy_start=$(date +%s.%N)
dd if="$work/a.img" of="$work/c.img" bs=1M count=$((moved / 1048576)) \
    iflag=direct oflag=direct conv=notrunc,fdatasync status=none
copy_end=$(date +%s.%N)

python3 - "$held" "$moved" "$blocks" "$start" "$end" "$copy_start" "$copy_end" <<'EOF'
import sys
held, moved, blocks = (int(value) for value in sys.argv[1:4])
removal = float(sys.argv[5]) - float(sys.argv[4])
copy = float(sys.argv[7]) - float(sys.argv[6])
mib = moved / 2**20
print(f"disk-0 held {held / 2**20:.0f} MiB; removal moved {mib:.0f} MiB in {blocks} blocks "
      f"in {removal:.2f} s ({mib / removal:.0f} MiB/s)")
print(f"dd of the same bytes: {copy:.2f} s ({mib / copy:.0f} MiB/s); removal/dd rate: {copy / removal:.2f}x")
EOF
"$bin" check rmb | head -1
