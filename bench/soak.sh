#!/usr/bin/env bash
# Soak: 8 NBD clients at queue depth 64 each (fio's nbd engine, one connection
# per job) doing 16K random reads and writes (70/30) with crc32c verification
# of what they read back, for $MINUTES minutes (default 10), against a release
# build serving a mirror of two files. Every $SAMPLE seconds it records the
# server's RSS, its CPU use (user+system, % of one core) and the pool's free
# space; at the end it prints those samples, fio's throughput and latency
# percentiles, and whether RSS stayed bounded (its growth over the second half
# of the run). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out/soak}; MINUTES=${MINUTES:-10}; SAMPLE=${SAMPLE:-10}
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build --release -p ironpool-cli >/dev/null
bin=$PWD/target/release/ironpool
export IRONPOOL_CACHE=$OUT/cache.json IRONPOOL_RUN_DIR=$OUT/run
"$bin" create --size 8G soak mirror "$OUT/a.img" "$OUT/b.img" >/dev/null
"$bin" volume create soak/vol 4G -d "$OUT" >/dev/null
setsid -f "$bin" serve -d "$OUT" --nbd "unix:$OUT/nbd.sock" --pidfile "$OUT/pid" soak 2>"$OUT/serve.log"
for _ in $(seq 100); do [ -f "$OUT/pid" ] && break; sleep 0.1; done
pid=$(cat "$OUT/pid")
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
uri="nbd+unix:///soak/vol?socket=$OUT/nbd.sock"
seconds=$((MINUTES * 60))
fio --name=soak --ioengine=nbd --uri="$uri" --rw=randrw --rwmixread=70 --bs=16k --iodepth=64 --numjobs=8 \
    --size=512M --offset_increment=512M --time_based --runtime="$seconds" --verify=crc32c --verify_fatal=1 \
    --group_reporting --output-format=json > "$OUT/fio.json" 2>"$OUT/fio.err" &
fio_pid=$!
ticks=$(getconf CLK_TCK)
echo "seconds rss_mib cpu_percent pool_free_gib" > "$OUT/samples.txt"
previous_cpu=$(awk '{print $14 + $15}' "/proc/$pid/stat")
elapsed=0
while kill -0 $fio_pid 2>/dev/null; do
    sleep "$SAMPLE"
    elapsed=$((elapsed + SAMPLE))
    [ -e "/proc/$pid" ] || { echo "the server died" >&2; exit 1; }
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status")
    cpu=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    percent=$(( (cpu - previous_cpu) * 100 / ticks / SAMPLE ))
    previous_cpu=$cpu
    free=$("$bin" --json list soak | python3 -c "import json,sys; print(round(json.load(sys.stdin)['pools'][0]['free_bytes'] / 2**30, 2))")
    echo "$elapsed $rss $percent $free" >> "$OUT/samples.txt"
done
wait $fio_pid
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
text = open(out + '/fio.json').read(); job = json.loads(text[text.index('{'):])['jobs'][0]
samples = [list(map(float, line.split())) for line in open(out + '/samples.txt').read().splitlines()[1:]]
print(f"| soak: 8 clients x QD64, 16K randrw 70/30 with crc32c verify, {samples[-1][0]/60:.0f} min | value |")
print("|---|---|")
print(f"| fio errors | {job['error']} |")
for kind in ('read', 'write'):
    part = job[kind]; pct = part['clat_ns']['percentile']
    print(f"| {kind} IOPS / MiB/s | {part['iops']:.0f} / {part['bw_bytes']/2**20:.0f} |")
    print(f"| {kind} latency p50 / p99 / p99.9 / max (ms) | {pct['50.000000']/1e6:.2f} / {pct['99.000000']/1e6:.2f} / {pct['99.900000']/1e6:.2f} / {part['clat_ns']['max']/1e6:.1f} |")
rss = [sample[1] for sample in samples]; cpu = [sample[2] for sample in samples]
half = rss[len(rss)//2:]
print(f"| server RSS min / median / max (MiB) | {min(rss):.0f} / {sorted(rss)[len(rss)//2]:.0f} / {max(rss):.0f} |")
print(f"| server RSS growth over the second half (MiB) | {half[-1] - half[0]:+.0f} |")
print(f"| server CPU median / max (% of one core) | {sorted(cpu)[len(cpu)//2]:.0f} / {max(cpu):.0f} |")
print(f"| samples | {len(samples)} every {samples[0][0]:.0f} s (in {out}/samples.txt) |")
PY
