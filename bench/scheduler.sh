#!/usr/bin/env bash
# The I/O scheduler's figures (issue: the vdev I/O scheduler), on a mirror of two
# files, release build, fio's nbd engine; a raw file with fio io_uring as the
# reference. Prints a markdown table; raw fio JSON goes to $OUT.
#   1. queue depth reaching the device: 4K random reads at QD64, average device
#      I/Os active (sampled through iostat's time integral);
#   2. aggregation: 16K random writes QD64 and 4K sequential reads QD16, with the
#      aggregation limit at 1 MiB (default) and at 1 byte (off): IOPS and average
#      device I/O size;
#   3. fairness: p99 latency of QD1 4K random reads while a QD64 16K random-write
#      load runs, with priority classes on and off.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out/scheduler}; RT=${RT:-10}
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build --release -p ironpool-cli >/dev/null
bin=$PWD/target/release/ironpool
export IRONPOOL_CACHE=$OUT/cache.json IRONPOOL_RUN_DIR=$OUT/run
"$bin" create --size 4G bench mirror "$OUT/a.img" "$OUT/b.img" >/dev/null
"$bin" volume create bench/vol 2G -d "$OUT" >/dev/null
setsid -f "$bin" serve -d "$OUT" --nbd "unix:$OUT/nbd.sock" --pidfile "$OUT/pid" bench 2>"$OUT/serve.log"
for _ in $(seq 100); do [ -f "$OUT/pid" ] && break; sleep 0.1; done
trap 'kill -TERM $(cat "$OUT/pid") 2>/dev/null || true' EXIT
uri="nbd+unix:///bench/vol?socket=$OUT/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=2G >/dev/null
fio --name=fill --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --rw=write --bs=1M --iodepth=8 --size=2G >/dev/null

iostat() { "$bin" --json iostat bench; }
# run NAME FIO-ARGS... : runs fio, prints "iops p99us dev_avg_kib aqd"
run() {
    local name=$1; shift
    local before after
    before=$(iostat)
    fio --output-format=json --runtime="$RT" --time_based "$@" > "$OUT/$name.json" 2>/dev/null || true
    after=$(iostat)
    python3 - "$OUT/$name.json" "$before" "$after" <<'PY'
import json, sys
text = open(sys.argv[1]).read(); job = json.loads(text[text.index('{'):])['jobs']
a, b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
kind = 'write' if job[0]['write']['io_bytes'] > 0 else 'read'
iops = sum(j[kind]['iops'] for j in job)
d0, d1 = a['devices'][0], b['devices'][0]
ops = d1[kind + '_ops'] - d0[kind + '_ops']; size = (d1[kind + '_bytes'] - d0[kind + '_bytes']) / max(ops, 1) / 1024
aqd = (d1['active_time_weighted_ns'] - d0['active_time_weighted_ns']) / (b['timestamp_ns'] - a['timestamp_ns'])
print(f"{iops:.0f} {size:.1f} {aqd:.1f}")
PY
}
p99() { python3 -c "
import json,sys; t=open('$OUT/$1.json').read(); j=[x for x in json.loads(t[t.index('{'):])['jobs'] if x['jobname']=='$2'][0]
print(round(j['read']['clat_ns']['percentile']['99.000000']/1000))"; }

nbd=(--ioengine=nbd --uri="$uri" --size=2G)
echo "| measurement | setting | IOPS | avg device I/O (KiB) | avg active device I/Os |"
echo "|---|---|---|---|---|"
read -r i s q < <(run reads-qd64 --name=r "${nbd[@]}" --rw=randread --bs=4k --iodepth=64)
echo "| 4K randread QD64 | default | $i | $s | $q |"
raw=$(fio --name=raw --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --rw=randread --bs=4k --iodepth=64 --runtime="$RT" --time_based --output-format=json | python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['iops']))")
echo "| 4K randread QD64 | raw file, io_uring | $raw | | |"
for limit in 1M 1; do
    "$bin" tune bench aggregation_limit_bytes $limit >/dev/null
    label=$([ $limit = 1 ] && echo "aggregation off" || echo "aggregation 1 MiB")
    read -r i s q < <(run "write-$limit" --name=w "${nbd[@]}" --rw=randwrite --bs=16k --iodepth=64)
    echo "| 16K randwrite QD64 | $label | $i | $s | $q |"
    read -r i s q < <(run "seqread-$limit" --name=s "${nbd[@]}" --rw=read --bs=4k --iodepth=16)
    echo "| 4K seq read QD16 | $label | $i | $s | $q |"
done
"$bin" tune bench aggregation_limit_bytes 1M >/dev/null
echo
echo "| fairness: QD1 4K randread under a QD64 16K randwrite load | p99 read latency (us) | reads IOPS |"
echo "|---|---|---|"
for classes in on off; do
    "$bin" tune bench classes $classes >/dev/null
    fio --output-format=json --runtime="$RT" --time_based --name=load "${nbd[@]}" --rw=randwrite --bs=16k --iodepth=64 \
        --name=probe "${nbd[@]}" --rw=randread --bs=4k --iodepth=1 > "$OUT/fair-$classes.json" 2>/dev/null || true
    iops=$(python3 -c "
import json; t=open('$OUT/fair-$classes.json').read(); j=[x for x in json.loads(t[t.index('{'):])['jobs'] if x['jobname']=='probe'][0]; print(round(j['read']['iops']))")
    echo "| classes $classes | $(p99 fair-$classes probe) | $iops |"
done
"$bin" tune bench classes on >/dev/null
