#!/usr/bin/env bash
# The table of issue 18 (the read cache) in one run, against baselines of
# the same run: the raw file (fio io_uring direct=1) and nbdkit's memory
# plugin (the same NBD transport with its data in RAM: the ceiling for
# cached reads), then each ironpool binary given (so before and after are
# measured side by side): a mirror of two files, a 1 GiB prefilled volume
# of 16K blocks, fio's nbd engine.
#
#   cached_r4k_qd64/qd1   4K random reads over a 512 MiB working set,
#                         after a warm-up pass over it
#   seqr_1m_qd1           1 MiB sequential reads at QD1 of the uncached
#                         volume (one pass, cache dropped first)
#   send                  `ironpool send` of a 1 GiB snapshot to /dev/null
#                         (cache dropped first), in MiB/s
#   none_*                the same reads with primarycache=none
#   hot_hit_ratio         a hot 256 MiB set read at random (QD16) while
#                         another volume is read sequentially once (4 GiB,
#                         1 MiB at QD16): the hot volume's cache hit ratio
#                         over that time
#
# Usage: scripts/bench-cache.sh [RUNTIME_S] [IRONPOOL_BIN...]
#   default: 8 s, target/release/ironpool
# Prints one line per test: label, IOPS, p99/mean latency (us), MiB/s.
set -euo pipefail
runtime=${1:-8}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
work=$(mktemp -d /tmp/bench-cache.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT
export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json

# run LABEL FIO-ARGS...: one fio job; prints "LABEL IOPS P99_US MEAN_US MIB_S".
run() {
    local label=$1
    shift
    fio --name=t --numjobs=1 --output-format=json --lat_percentiles=1 "$@" \
        >"$work/$label.json" 2>"$work/$label.err" || true
    python3 - "$work/$label.json" "$label" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    job = json.loads(text[text.index("{"):])["jobs"][0]["read"]
except Exception:
    print(sys.argv[2], 0, 0, 0, 0)
    sys.exit()
p99 = job["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000
mean = job["lat_ns"]["mean"] / 1000
print(f"{sys.argv[2]} {int(job['iops'])} {int(p99)} {mean:.1f} {job['bw_bytes'] / 2**20:.0f}")
PY
}
timed="--runtime=$runtime --time_based"

echo "# bench-cache $(date -u +%FT%TZ) runtime=${runtime}s $(git rev-parse --short HEAD 2>/dev/null || true)"
dd if=/dev/zero of="$work/raw.img" bs=1M count=1024 oflag=direct status=none
raw="--ioengine=io_uring --direct=1 --filename=$work/raw.img --size=1G"
run raw_r4k_qd64 $raw $timed --rw=randread --bs=4k --iodepth=64
run raw_r4k_qd1 $raw $timed --rw=randread --bs=4k --iodepth=1
run raw_seqr_1m_qd1 $raw --rw=read --bs=1m --iodepth=1
run raw_seqr_1m_qd16 $raw --rw=read --bs=1m --iodepth=16
rm -f "$work/raw.img"

nbdkit -f --unix "$work/m.sock" memory 1G &
pids+=($!)
sleep 1
memory="--ioengine=nbd --uri=nbd+unix:///?socket=$work/m.sock --size=512M"
fio --name=fill $memory --rw=write --bs=1m --iodepth=8 >/dev/null 2>&1
run nbdkit_memory_r4k_qd64 $memory $timed --rw=randread --bs=4k --iodepth=64
run nbdkit_memory_r4k_qd1 $memory $timed --rw=randread --bs=4k --iodepth=1
kill "${pids[-1]}" 2>/dev/null || true

# hits POOL VOLUME: "hit_blocks miss_blocks" of the volume now (0 0 on a
# binary without the counters).
hits() {
    "$binary" --json iostat "$1" | python3 -c '
import json, sys
stats = json.load(sys.stdin)
volume = next(v for v in stats["volumes"] if v["name"] == sys.argv[1])
print(volume.get("cache_hit_blocks", 0), volume.get("cache_miss_blocks", 0))
' "$2"
}

index=0
for binary in "${binaries[@]}"; do
    index=$((index + 1))
    pool=c$index
    label=ironpool$index
    "$binary" create --size 8G "$pool" mirror "$work/$pool-a.img" "$work/$pool-b.img" >/dev/null
    "$binary" serve -d "$work" --nbd "unix:$work/$pool.sock" "$pool" >"$work/$pool.log" 2>&1 &
    server=$!
    pids+=($server)
    for _ in $(seq 100); do [ -S "$work/$pool.sock" ] && break; sleep 0.1; done
    "$binary" volume create "$pool/v" 1G >/dev/null
    "$binary" volume create "$pool/scan" 4G >/dev/null
    volume="--ioengine=nbd --uri=nbd+unix:///$pool/v?socket=$work/$pool.sock"
    scan="--ioengine=nbd --uri=nbd+unix:///$pool/scan?socket=$work/$pool.sock"
    fio --name=fill $volume --size=1G --rw=write --bs=1m --iodepth=16 >/dev/null 2>&1
    fio --name=fill $scan --size=4G --rw=write --bs=1m --iodepth=16 >/dev/null 2>&1
    "$binary" snapshot "$pool/v@s" >/dev/null

    for mode in cached none; do
        prefix=${label}_$mode
        if [ "$mode" = none ]; then
            "$binary" set primarycache=none "$pool/v" >/dev/null 2>&1 || echo "# $binary: no primarycache (today's code: no data cache)"
        fi
        "$binary" tune "$pool" arc_drop 1 >/dev/null 2>&1 || true
        run "${prefix}_warmup" $volume --size=512M $timed --rw=randread --bs=4k --iodepth=64 >/dev/null
        run "${prefix}_r4k_qd64" $volume --size=512M $timed --rw=randread --bs=4k --iodepth=64
        run "${prefix}_r4k_qd1" $volume --size=512M $timed --rw=randread --bs=4k --iodepth=1
        "$binary" tune "$pool" arc_drop 1 >/dev/null 2>&1 || true
        run "${prefix}_seqr_1m_qd1" $volume --size=1G --rw=read --bs=1m --iodepth=1
        "$binary" tune "$pool" arc_drop 1 >/dev/null 2>&1 || true
        start=$(date +%s.%N)
        "$binary" send "$pool/v@s" >/dev/null
        end=$(date +%s.%N)
        python3 -c "print('${prefix}_send 0 0 0', round(1024 / ($end - $start)))"
    done
    "$binary" inherit primarycache "$pool/v" >/dev/null 2>&1 || true

    # The hot set against a scan of another volume.
    "$binary" tune "$pool" arc_drop 1 >/dev/null 2>&1 || true
    run "${label}_hot_warmup" $volume --size=256M $timed --rw=randread --bs=4k --iodepth=16 >/dev/null
    before=$(hits "$pool" "$pool/v")
    fio --name=scan $scan --size=4G --rw=read --bs=1m --iodepth=16 --output-format=json >"$work/scan.json" 2>&1 &
    scanner=$!
    fio --name=hot $volume --size=256M --rw=randread --bs=4k --iodepth=16 \
        --runtime=600 --time_based --output-format=json >"$work/hot.json" 2>&1 &
    hot=$!
    wait "$scanner" || true
    kill -INT "$hot" 2>/dev/null || true
    wait "$hot" || true
    after=$(hits "$pool" "$pool/v")
    python3 - "$label" "$before" "$after" <<'PY'
import sys
b = [int(x) for x in sys.argv[2].split()]
a = [int(x) for x in sys.argv[3].split()]
hit, miss = a[0] - b[0], a[1] - b[1]
ratio = hit / (hit + miss) if hit + miss else 0
print(f"{sys.argv[1]}_hot_hit_ratio_during_scan {ratio:.3f} (hits {hit}, misses {miss})")
PY
    "$binary" arcstat "$pool" | sed "s/^/# /"
    kill "$server"
    wait "$server" 2>/dev/null || true
    rm -f "$work/$pool-a.img" "$work/$pool-b.img"
    echo "# ironpool$index = $binary"
done
