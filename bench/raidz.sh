#!/usr/bin/env bash
# RAID-Z figures (issue 4), release build, fio's nbd engine against ironpool;
# a raw file with fio io_uring direct=1 on the same disk as the reference, in
# the same run. For raidz2 of 6 files and raidz1 of 4 files:
#   - 16K random writes QD64 (IOPS), after a sequential fill so they overwrite;
#   - 1 MiB sequential writes QD16 (MiB/s);
#   - write amplification: bytes written to the devices (data, parity, pads,
#     metadata, labels; from iostat) per byte the client wrote;
#   - average device write size during the random writes (after aggregation).
# Then parity generation speed against memcpy (examples/raidz_parity_speed.rs).
# Prints markdown tables; fio JSON and server logs go to $OUT (pool files are
# deleted after each layout: the disk is shared, peak use is about
# 6 x DEVICE + SIZE).
#   RT=seconds per run (default 15), SIZE=volume and raw file size (default 1G),
#   DEVICE=size of each pool file (default 768M), LAYOUTS (default
#   "raidz2:6 raidz1:4"; KIND:WIDTH:through measures the layout with
#   write-back off, every write written through before its reply, for a
#   same-run comparison), TUNE="NAME=VALUE ..." tunables set on the server
#   before the runs (see `ironpool tune`).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out/raidz}; RT=${RT:-15}; SIZE=${SIZE:-1G}; DEVICE=${DEVICE:-768M}
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build --release -p ironpool-cli >/dev/null 2>&1
cargo build --release -p ironpool --example raidz_parity_speed >/dev/null 2>&1
bin=$PWD/target/release/ironpool
export IRONPOOL_CACHE=$OUT/cache.json IRONPOOL_RUN_DIR=$OUT/run

# fio_json FILE: the job's summed (iops, MiB/s, bytes) for its direction.
fio_figures() {
    python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read(); jobs = json.loads(text[text.index('{'):])['jobs']
kind = 'write' if jobs[0]['write']['io_bytes'] > 0 else 'read'
iops = sum(j[kind]['iops'] for j in jobs); bw = sum(j[kind]['bw_bytes'] for j in jobs) / 2**20
print(f"{iops:.0f} {bw:.0f} {sum(j[kind]['io_bytes'] for j in jobs)}")
PY
}

# device_writes BEFORE AFTER: total device write bytes and ops between two iostat samples.
device_writes() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = json.loads(open(sys.argv[1]).read()), json.loads(open(sys.argv[2]).read())
pairs = list(zip(a['devices'], b['devices']))
print(sum(y['write_bytes'] - x['write_bytes'] for x, y in pairs), sum(y['write_ops'] - x['write_ops'] for x, y in pairs))
PY
}

# raw NAME FIO-ARGS...: the raw file's figures for the same job.
raw() {
    local name=$1; shift
    fio --output-format=json --name="$name" --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --size="$SIZE" \
        --runtime="$RT" --time_based "$@" > "$OUT/raw-$name.json" 2>/dev/null
    fio_figures "$OUT/raw-$name.json"
}

fio --name=fill --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --rw=write --bs=1M --iodepth=8 --size="$SIZE" >/dev/null
read -r raw_rand_iops _ _ < <(raw randwrite --rw=randwrite --bs=16k --iodepth=64)
read -r _ raw_seq_mib _ < <(raw seqwrite --rw=write --bs=1M --iodepth=16)

echo "Load average at the start (2 CPUs, shared): $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Raw file ($SIZE, fio io_uring direct=1): 16K randwrite QD64 $raw_rand_iops IOPS; 1 MiB seq write QD16 $raw_seq_mib MiB/s"
echo
echo "| layout | test | IOPS | MiB/s | vs raw file | write amplification | avg device write (KiB) |"
echo "|---|---|---|---|---|---|---|"
for layout in ${LAYOUTS:-raidz2:6 raidz1:4}; do
    IFS=: read -r kind width mode <<<"$layout"
    pool="b$kind$mode"; dir="$OUT/$pool"; mkdir -p "$dir"
    label="$kind of $width"; [ "$mode" = through ] && label="$label, write-back off"
    files=()
    for index in $(seq "$width"); do
        # Written once in full like the raw file: ext4 allocates blocks of a
        # sparse file on first write, and such direct writes block in the
        # kernel (io_uring hands them to worker threads), which would be
        # measured instead of ironpool.
        fio --name=prefill --ioengine=io_uring --direct=1 --filename="$dir/d$index.img" --rw=write --bs=1M --iodepth=8 \
            --size="$DEVICE" --zero_buffers >/dev/null
        files+=("$dir/d$index.img")
    done
    "$bin" create "$pool" "$kind" "${files[@]}" >/dev/null
    "$bin" volume create "$pool/vol" "$SIZE" -d "$dir" >/dev/null
    setsid -f "$bin" serve -d "$dir" --nbd "unix:$dir/nbd.sock" --pidfile "$dir/pid" "$pool" 2>"$dir/serve.log"
    for _ in $(seq 100); do [ -f "$dir/pid" ] && break; sleep 0.1; done
    uri="nbd+unix:///$pool/vol?socket=$dir/nbd.sock"
    [ "$mode" = through ] && "$bin" tune "$pool" dirty_data_max_bytes 0 >/dev/null
    for setting in ${TUNE:-}; do
        "$bin" tune "$pool" "${setting%%=*}" "${setting#*=}" >/dev/null
    done
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$SIZE" >/dev/null 2>&1
    for test in randwrite seqwrite; do
        if [ $test = randwrite ]; then args=(--rw=randwrite --bs=16k --iodepth=64); else args=(--rw=write --bs=1M --iodepth=16); fi
        "$bin" --json iostat "$pool" > "$dir/before.json"
        fio --output-format=json --name=$test --ioengine=nbd --uri="$uri" --size="$SIZE" --runtime="$RT" --time_based "${args[@]}" \
            > "$dir/$test.json" 2>/dev/null
        # Count the commit of the run's metadata too (txgs close every 5 s).
        sleep 6
        "$bin" --json iostat "$pool" > "$dir/after.json"
        read -r iops mib client_bytes < <(fio_figures "$dir/$test.json")
        read -r device_bytes device_ops < <(device_writes "$dir/before.json" "$dir/after.json")
        python3 - "$label" "$test" "$iops" "$mib" "$client_bytes" "$device_bytes" "$device_ops" "$raw_rand_iops" "$raw_seq_mib" <<'PY'
import sys
label_layout, test, iops, mib, client, device, ops, raw_iops, raw_mib = sys.argv[1:]
iops, mib, client, device, ops = float(iops), float(mib), int(client), int(device), int(ops)
ratio = iops / float(raw_iops) if test == 'randwrite' else mib / float(raw_mib)
label = '16K randwrite QD64' if test == 'randwrite' else '1 MiB seq write QD16'
print(f"| {label_layout} | {label} | {iops:.0f} | {mib:.0f} | {ratio:.2f}x | {device / max(client, 1):.2f} | {device / max(ops, 1) / 1024:.0f} |")
PY
    done
    pid=$(cat "$dir/pid")
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "${files[@]}"
done
rm -f "$OUT/raw.img"
echo
echo "Load average at the end (2 CPUs, shared): $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Parity generation (examples/raidz_parity_speed.rs):"
echo
"$PWD/target/release/examples/raidz_parity_speed"
