#!/usr/bin/env bash
# The engine's poll window (IRONPOOL_POLL_US, see rt/uring.rs) measured
# against sleeping at once, side by side: for each setting given, a fresh
# pool (a mirror of two files) served with it, then
#   create/stat/delete  20,000 empty files in one directory of a FUSE
#                       filesystem (the bench crate's `metadata` example)
#   fw1, fw64, fr64     fio io_uring direct=1 on a 512 MiB file of it
#                       (recordsize 16K): 16K random writes at QD1 and QD64,
#                       4K random reads at QD64, IOPS
#   vw1, vw64, vsync1   fio's nbd engine on a 512 MiB-written volume: 16K
#                       random writes at QD1 and QD64, and at QD1 with a
#                       FLUSH after each, IOPS
#   vr1                 4K random reads at QD1 of the volume, mean latency
#   idle_cpu            the server's CPU ticks over 5 s with no client
#
# Usage: scripts/bench-poll.sh [RUNTIME_S] [SETTING...]
#   SETTING: a value for IRONPOOL_POLL_US, or "default" (unset);
#   default: 4 s, "0 default 0 default" (alternated: the disk drifts)
set -euo pipefail
runtime=${1:-4}
shift || true
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(0 default 0 default)
bin=$PWD/target/release/ironpool
metadata=$PWD/target/release/examples/metadata
[ "$(id -u)" -eq 0 ] || { echo "bench-poll: run as root (FUSE mounts)" >&2; exit 1; }
[ -x "$bin" ] && [ -x "$metadata" ] || { echo "bench-poll: build first: cargo build --release --workspace --bins --examples" >&2; exit 1; }
work=""
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && sleep 2
    [ -n "$work" ] && rm -rf "$work"
    return 0
}
trap cleanup EXIT

# fio_result FILE: IOPS of a fio JSON report (reads and writes).
fio_result() {
    python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
print(int(job["read"]["iops"] + job["write"]["iops"]))
PY
}

# fio_latency FILE: mean completion latency (us) of a read job.
fio_latency() {
    python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
print(f'{job["read"]["clat_ns"]["mean"] / 1000:.1f}us')
PY
}

echo "# bench-poll $(date -u +%FT%TZ) runtime=${runtime}s $(git rev-parse --short HEAD 2>/dev/null || true)"
for setting in "${settings[@]}"; do
    work=$(mktemp -d "$PWD/target/bench-poll.XXXXXX")
    export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json
    "$bin" create --size 4G -f bench mirror "$work/d0.img" "$work/d1.img" >/dev/null
    if [ "$setting" = default ]; then
        env -u IRONPOOL_POLL_US "$bin" serve -d "$work" --nbd "unix:$work/nbd.sock" \
            --control "$work/ctl.sock" bench >"$work/serve.log" 2>&1 &
    else
        IRONPOOL_POLL_US=$setting "$bin" serve -d "$work" --nbd "unix:$work/nbd.sock" \
            --control "$work/ctl.sock" bench >"$work/serve.log" 2>&1 &
    fi
    server=$!
    for _ in $(seq 100); do [ -S "$work/ctl.sock" ] && break; sleep 0.1; done
    "$bin" fs create --control "$work/ctl.sock" bench/fs -o "mountpoint=$work/ipfs" -o recordsize=16K >/dev/null
    "$bin" volume create --control "$work/ctl.sock" bench/vol 1G >/dev/null
    for _ in $(seq 600); do grep -q " $work/ipfs fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
    line="setting=$setting $("$metadata" "$work/ipfs" 20000 | awk '{ printf "%s=%s ", $1, $2 }')"
    fio --name=prefill --filename="$work/ipfs/f" --size=512M --rw=write --bs=1M --direct=1 >/dev/null
    fio --name=prefill --ioengine=nbd --uri="nbd+unix:///bench/vol?socket=$work/nbd.sock" \
        --size=512M --rw=write --bs=1M --iodepth=16 >/dev/null 2>&1
    common="--size=512M --runtime=$runtime --time_based --output-format=json"
    for test in "fw1 --rw=randwrite --bs=16k --iodepth=1" \
                "fw64 --rw=randwrite --bs=16k --iodepth=64" \
                "fr64 --rw=randread --bs=4k --iodepth=64"; do
        set -- $test
        label=$1
        shift
        fio --name=t --filename="$work/ipfs/f" --ioengine=io_uring --direct=1 $common "$@" >"$work/$label.json"
        line="$line $label=$(fio_result "$work/$label.json")"
    done
    for test in "vw1 --rw=randwrite --bs=16k --iodepth=1" \
                "vw64 --rw=randwrite --bs=16k --iodepth=64" \
                "vsync1 --rw=randwrite --bs=16k --iodepth=1 --fsync=1" \
                "vr1 --rw=randread --bs=4k --iodepth=1"; do
        set -- $test
        label=$1
        shift
        fio --name=t --ioengine=nbd --uri="nbd+unix:///bench/vol?socket=$work/nbd.sock" \
            $common "$@" >"$work/$label.json" 2>/dev/null
        if [ "$label" = vr1 ]; then
            line="$line $label=$(fio_latency "$work/$label.json")"
        else
            line="$line $label=$(fio_result "$work/$label.json")"
        fi
    done
    before=$(awk '{ print $14 + $15 }' "/proc/$server/stat")
    sleep 5
    after=$(awk '{ print $14 + $15 }' "/proc/$server/stat")
    echo "$line idle_cpu=$((after - before))"
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=""
    rm -rf "$work"
    work=""
done
