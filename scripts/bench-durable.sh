#!/usr/bin/env bash
# The table of issue 17 in one run: 16K random writes with a FLUSH after every
# write at QD1 and after every 32 at QD64, every write synchronous at QD64
# (raw: O_DSYNC; ironpool: sync=always), and plain writes at QD64, on the raw
# file (fio io_uring direct=1), on two raw files at once (raw_mirror_*: the
# most a mirror of two files can do on this one disk, every byte written and
# made durable twice), nbdkit's file plugin and ironpool (mirror of two files,
# and the same with a log device, a third file; 1 GiB prefilled volume, fio's
# nbd engine), with one or more ironpool binaries so that before and after are
# measured side by side.
#
# Usage: [WRITTEN_OUT=1] [HALT_POLL_NS=N] scripts/bench-durable.sh [RUNTIME_S] [IRONPOOL_BIN...]
#   default: 8 s, target/release/ironpool
# WRITTEN_OUT=1 writes the pool's device files out (zeros, as the raw file
# is) before `create`, instead of leaving the data devices sparse: a sparse
# file makes the host filesystem allocate (and journal) on the first write of
# every block, which a log block at a fresh address pays on each durable
# write, and a real device does not. HALT_POLL_NS=N runs with a virtual
# machine's guest halt polling at N ns (see scripts/halt-poll.sh: the QD1
# rows wait for each answer).
# Prints one line per test: label, IOPS, p99 latency (us), and for ironpool
# the device syncs per client flush (flushes and durable FUA writes, all
# devices; a mirror's log block is two), the log bytes written per client
# byte, and the bytes per second written to all devices (dev_MB/s: both
# files of a mirror are on the one disk). The raw file's plain QD64 line
# also says its MB/s, for 16K random writes; the larger writes of
# ironpool's write-back (aggregated, mostly sequential) go faster on the
# same disk.
set -euo pipefail
runtime=${1:-8}
shift || true
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
work=$(mktemp -d /tmp/bench-durable.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
    sleep 1
    rm -rf "$work"
    halt_poll_restore
}
source "$(dirname "$0")/halt-poll.sh"
trap cleanup EXIT
halt_poll_apply
export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json

# run LABEL FIO-ARGS... [--name=JOB --filename=FILE]...: prints "LABEL IOPS
# P99_US". The arguments apply to every job; without jobs of its own the run
# is one job. With several (run_pair), the slowest job's IOPS and the worst
# p99: a mirror's write waits for both of its copies.
run() {
    local label=$1
    shift
    local job=(--name=t)
    [[ " $* " == *" --name="* ]] && job=()
    fio --output-format=json --lat_percentiles=1 \
        --runtime="$runtime" --time_based --rw=randwrite --bs=16k "$@" "${job[@]}" \
        >"$work/$label.json" 2>"$work/$label.err" || true
    python3 - "$work/$label.json" "$label" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    jobs = [job["write"] for job in json.loads(text[text.index("{"):])["jobs"]]
except Exception:
    print(sys.argv[2], 0, 0)
    sys.exit()
iops = min(job["iops"] for job in jobs)
p99 = max(job["clat_ns"].get("percentile", {}).get("99.000000", 0) for job in jobs) / 1000
print(f"{sys.argv[2]} {int(iops)} {int(p99)}")
PY
}

# run_pair LABEL FIO-ARGS...: the job on raw.img and raw2.img at once.
run_pair() {
    run "$@" --name=a --filename="$work/raw.img" --name=b --filename="$work/raw2.img"
}

echo "# bench-durable $(date -u +%FT%TZ) runtime=${runtime}s written_out=${WRITTEN_OUT:-0} $(git rev-parse --short HEAD 2>/dev/null || true) $(halt_poll_describe)"
dd if=/dev/zero of="$work/raw.img" bs=1M count=1024 oflag=direct status=none
raw="--ioengine=io_uring --direct=1 --filename=$work/raw.img --size=1G"
run raw_qd1_fsync1 $raw --iodepth=1 --fsync=1
run raw_qd64_fsync32 $raw --iodepth=64 --fsync=32
run raw_qd64_dsync $raw --iodepth=64 --sync=dsync
line=$(run raw_qd64_plain $raw --iodepth=64)
echo "$line MB/s=$(echo "$line" | awk '{printf "%.0f", $2 * 16384 / 1e6}')"

nbdkit -f --unix "$work/k.sock" file "$work/raw.img" &
pids+=($!)
sleep 1
kit="--ioengine=nbd --uri=nbd+unix:///?socket=$work/k.sock --size=1G"
run nbdkit_qd1_fsync1 $kit --iodepth=1 --fsync=1
run nbdkit_qd64_fsync32 $kit --iodepth=64 --fsync=32
kill "${pids[-1]}" 2>/dev/null || true

# The most a mirror of two files can do on this one disk: the same job on two
# raw files at once (every client byte written, and made durable, on both).
dd if=/dev/zero of="$work/raw2.img" bs=1M count=1024 oflag=direct status=none
pair="--ioengine=io_uring --direct=1 --size=1G"
run_pair raw_mirror_qd1_fsync1 $pair --iodepth=1 --fsync=1
run_pair raw_mirror_qd64_fsync32 $pair --iodepth=64 --fsync=32
run_pair raw_mirror_qd64_dsync $pair --iodepth=64 --sync=dsync
run_pair raw_mirror_qd64_plain $pair --iodepth=64
rm -f "$work/raw.img" "$work/raw2.img"

# counters POOL: "device_syncs log_bytes client_flushes client_bytes
# device_write_bytes" now.
counters() {
    "$binary" --json iostat "$1" | python3 -c '
import json, sys
stats = json.load(sys.stdin)
flushes = sum(device.get("flush_ops", 0) + device.get("durable_write_ops", 0) for device in stats["devices"])
log = sum(v.get("intent_log", {}).get("bytes_written", 0) for v in stats["volumes"])
client_flushes = sum(v.get("flush_ops", 0) for v in stats["volumes"])
client_bytes = sum(v.get("write_bytes", 0) for v in stats["volumes"])
device_bytes = sum(device.get("write_bytes", 0) for device in stats["devices"])
print(flushes, log, client_flushes, client_bytes, device_bytes)
'
}

# measured LABEL POOL FIO-ARGS...: run, then the ratios over that run.
measured() {
    local label=$1 pool=$2
    shift 2
    local before after
    before=$(counters "$pool")
    local line
    line=$(run "$label" "$@")
    after=$(counters "$pool")
    python3 - "$line" "$before" "$after" "$runtime" <<'PY'
import sys
line = sys.argv[1]
b = [int(x) for x in sys.argv[2].split()]
a = [int(x) for x in sys.argv[3].split()]
flushes, log, client_flushes, client_bytes, device_bytes = (a[i] - b[i] for i in range(5))
per_flush = f"{flushes / client_flushes:.2f}" if client_flushes else "-"
per_byte = f"{log / client_bytes:.2f}" if client_bytes else "-"
print(f"{line} dev_syncs/flush={per_flush} log_bytes/byte={per_byte} dev_MB/s={device_bytes / float(sys.argv[4]) / 1e6:.0f}")
PY
}

index=0
for binary in "${binaries[@]}"; do
    index=$((index + 1))
    for variant in mirror slog; do
        pool=d$index$variant
        layout=(mirror "$work/$pool-a.img" "$work/$pool-b.img")
        [ "$variant" = slog ] && layout+=(log "$work/$pool-c.img")
        if [ "${WRITTEN_OUT:-0}" = 1 ]; then
            for device in "${layout[@]}"; do
                case $device in
                /*) dd if=/dev/zero of="$device" bs=1M count=4096 conv=fsync status=none ;;
                esac
            done
            sleep 5 # the host's write-back of those gigabytes settles first
        fi
        "$binary" create --size 4G "$pool" "${layout[@]}" >/dev/null
        "$binary" serve -d "$work" --nbd "unix:$work/$pool.sock" "$pool" >"$work/$pool.log" 2>&1 &
        server=$!
        pids+=($server)
        for _ in $(seq 100); do [ -S "$work/$pool.sock" ] && break; sleep 0.1; done
        "$binary" volume create "$pool/v" 1G >/dev/null
        uri="--ioengine=nbd --uri=nbd+unix:///$pool/v?socket=$work/$pool.sock --size=1G"
        fio --name=fill $uri --rw=write --bs=1m --iodepth=16 >/dev/null 2>&1
        label="ironpool${index}_${variant}"
        measured "${label}_qd1_fsync1" "$pool" $uri --iodepth=1 --fsync=1
        measured "${label}_qd64_fsync32" "$pool" $uri --iodepth=64 --fsync=32
        "$binary" set sync=always "$pool/v" >/dev/null
        measured "${label}_qd64_syncalways" "$pool" $uri --iodepth=64
        "$binary" set sync=standard "$pool/v" >/dev/null
        measured "${label}_qd64_plain" "$pool" $uri --iodepth=64
        kill "$server"
        wait "$server" 2>/dev/null || true
        rm -f "$work/$pool"-*.img # written out, each pool's files take 8-12 GB
    done
    echo "# ironpool$index = $binary"
done
