#!/usr/bin/env bash
# Figures for snapshots, send and compression (issue: snapshots, clones, rollback,
# send/receive, compression and properties), release build, on a mirror of two
# files, fio's nbd engine. Each figure is a ratio against a baseline measured in
# the same run. Prints markdown tables; fio JSON and logs go to $OUT.
#   1. snapshot creation time while a 16K randwrite QD64 load runs (over 256 MiB,
#      so the snapshots it keeps fit the pool), and that
#      load's IOPS with a snapshot every 2 s against the same load without;
#   2. send throughput (full stream of 1 GiB of data to /dev/null, and piped into
#      a receive on a second pool) against fio's sequential 1 MiB read of a raw
#      file of the same size on the same disk;
#   3. 16K randwrite QD64 with compression=lz4 against compression=off, on
#      compressible data (fio buffer_compress_percentage=60) and on random data.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out/datasets}; RT=${RT:-20}
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build --release -p ironpool-cli >/dev/null
bin=$PWD/target/release/ironpool
export IRONPOOL_CACHE=$OUT/cache.json IRONPOOL_RUN_DIR=$OUT/run
"$bin" create --size 8G bench mirror "$OUT/a.img" "$OUT/b.img" >/dev/null
"$bin" create --size 3G copy "$OUT/c.img" >/dev/null
for volume in vol:off lz4:lz4 plain:off; do
    "$bin" volume create "bench/${volume%%:*}" 2G -o "compression=${volume##*:}" -d "$OUT" >/dev/null
done
for pool in bench copy; do
    setsid -f "$bin" serve -d "$OUT" --nbd "unix:$OUT/$pool.sock" --pidfile "$OUT/$pool.pid" "$pool" 2>"$OUT/$pool.log"
done
for _ in $(seq 100); do [ -f "$OUT/bench.pid" ] && [ -f "$OUT/copy.pid" ] && break; sleep 0.1; done
trap 'kill -TERM $(cat "$OUT/bench.pid") $(cat "$OUT/copy.pid") 2>/dev/null || true' EXIT
uri() { echo "nbd+unix:///bench/$1?socket=$OUT/bench.sock"; }
iops() { python3 -c "
import json,sys; t=open('$1').read(); j=json.loads(t[t.index('{'):])['jobs']; k='$2'; print(round(sum(x[k]['iops'] for x in j)))"; }
now() { date +%s.%N; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }

fio --name=fill --ioengine=nbd --uri="$(uri vol)" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
fio --name=fill --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null

# 1. Snapshots under load.
load=(--name=load --ioengine=nbd --uri="$(uri vol)" --rw=randwrite --bs=16k --iodepth=64 --size=256M --runtime="$RT" --time_based --output-format=json)
fio "${load[@]}" > "$OUT/load-plain.json" 2>/dev/null
fio "${load[@]}" > "$OUT/load-snap.json" 2>/dev/null &
fio_pid=$!
times=()
sleep 1
for index in $(seq 1 $((RT / 2 - 1))); do
    start=$(now); "$bin" snapshot "bench/vol@s$index" >/dev/null; end=$(now)
    times+=("$(python3 -c "print(round(($end - $start) * 1000, 1))")")
    sleep 1
done
wait $fio_pid
plain=$(iops "$OUT/load-plain.json" write); snapped=$(iops "$OUT/load-snap.json" write)
echo "| snapshots under a 16K randwrite QD64 load | value |"
echo "|---|---|"
echo "| snapshots taken | ${#times[@]} |"
echo "| snapshot command time, median / max (ms) | $(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " / " a[NR]}') |"
echo "| write IOPS without snapshots | $plain |"
echo "| write IOPS with a snapshot every 2 s | $snapped ($(ratio "$snapped" "$plain")x) |"
echo

# 2. send throughput.
"$bin" snapshot bench/vol@full >/dev/null
raw=$(fio --name=raw --ioengine=io_uring --direct=1 --filename="$OUT/raw.img" --rw=read --bs=1M --iodepth=8 --size=1G --output-format=json \
    | python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 2**20))")
start=$(now); "$bin" send bench/vol@full > /dev/null 2>"$OUT/send.log"; end=$(now)
stream_bytes=$(sed -n 's/.* \([0-9]*\) bytes$/\1/p' "$OUT/send.log")
send=$(python3 -c "print(round($stream_bytes / 2**20 / ($end - $start)))")
start=$(now)
"$bin" send bench/vol@full 2>/dev/null | "$bin" --control "$OUT/run/copy.ctl" receive copy/vol >/dev/null
end=$(now)
piped=$(python3 -c "print(round($stream_bytes / 2**20 / ($end - $start)))")
echo "| send of 1 GiB written data (full stream) | MiB/s | vs raw sequential read |"
echo "|---|---|---|"
echo "| raw file, fio io_uring 1 MiB reads QD8 | $raw | 1.00x |"
echo "| ironpool send > /dev/null | $send | $(ratio "$send" "$raw")x |"
echo "| ironpool send \| ironpool receive (second pool) | $piped | $(ratio "$piped" "$raw")x |"
echo

# 3. Compression at QD64.
echo "| 16K randwrite QD64 | compression=off IOPS | compression=lz4 IOPS | lz4 / off | lz4 compressratio |"
echo "|---|---|---|---|---|"
for data in compressible random; do
    extra=(--refill_buffers)
    [ $data = compressible ] && extra+=(--buffer_compress_percentage=60 --buffer_compress_chunk=4k)
    for volume in plain lz4; do
        fio --name=c --ioengine=nbd --uri="$(uri $volume)" --rw=randwrite --bs=16k --iodepth=64 --size=1G \
            --runtime="$RT" --time_based "${extra[@]}" --output-format=json > "$OUT/comp-$data-$volume.json" 2>/dev/null
    done
    off=$(iops "$OUT/comp-$data-plain.json" write); on=$(iops "$OUT/comp-$data-lz4.json" write)
    compressratio=$("$bin" --json get compressratio bench/lz4 | python3 -c "import json,sys; print(json.load(sys.stdin)['properties'][0]['value'])")
    echo "| $data data | $off | $on | $(ratio "$on" "$off")x | $compressratio |"
done
