#!/usr/bin/env bash
# Writes after `add` of an empty mirror to a full-ish pool (issue 71's must-show):
# 16K random writes QD64 (fio's nbd engine) on a volume of a mirror of two 2 GiB
# files filled to about 75%, before and after a second mirror of two empty 2 GiB
# files is added; the new writes must not collapse onto the new vdev (OpenZFS
# weights metaslab groups by free space). The raw-pair row (fio on two raw files
# at once, the mirror's physical limit on this one disk) is measured before and
# after too, so disk drift shows as drift and not as a change of ironpool. Prints
# a markdown table; fio JSON and logs go to $OUT. A script until `ironpool bench`
# can reshape a pool between its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out/grow}; RT=${RT:-10}
rm -rf "$OUT"; mkdir -p "$OUT"
cargo build --release -p ironpool-cli >/dev/null 2>&1
bin=$PWD/target/release/ironpool
export IRONPOOL_CACHE=$OUT/cache.json IRONPOOL_RUN_DIR=$OUT/run
"$bin" create --size 2G grow mirror "$OUT/a.img" "$OUT/b.img" >/dev/null
"$bin" volume create -s grow/vol 1536M -d "$OUT" >/dev/null
setsid -f "$bin" serve -d "$OUT" --nbd "unix:$OUT/nbd.sock" --pidfile "$OUT/pid" grow 2>"$OUT/serve.log"
for _ in $(seq 100); do [ -f "$OUT/pid" ] && break; sleep 0.1; done
trap 'kill -TERM $(cat "$OUT/pid") 2>/dev/null || true' EXIT
uri="nbd+unix:///grow/vol?socket=$OUT/nbd.sock"
iops() { python3 -c "
import json; t=open('$1').read(); j=json.loads(t[t.index('{'):])['jobs']; print(round(sum(x['write']['iops'] for x in j)))"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
vdevs() { "$bin" --json list -v grow | python3 -c "
import json,sys
pool=json.load(sys.stdin)['pools'][0]
print(', '.join(f\"{v['name']}: {v['allocated_bytes']>>20} MiB\" for v in pool.get('vdevs', [])))"; }

# Fill: 1.4 GiB of the 2 GiB mirror, and the raw files the same.
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1400M >/dev/null
for raw in r1 r2; do
    fio --name=fill --ioengine=io_uring --direct=1 --filename="$OUT/$raw.img" --rw=write --bs=1M --iodepth=8 --size=1400M >/dev/null
done
"$bin" sync grow >/dev/null
writes=(--rw=randwrite --bs=16k --iodepth=64 --size=1400M --runtime="$RT" --time_based --output-format=json)
raw_pair() {
    fio --ioengine=io_uring --direct=1 "${writes[@]}" \
        --name=r1 --filename="$OUT/r1.img" --name=r2 --filename="$OUT/r2.img" >"$OUT/raw-$1.json" 2>/dev/null
}
volume() { fio --name=vol --ioengine=nbd --uri="$uri" "${writes[@]}" >"$OUT/vol-$1.json" 2>/dev/null; }

raw_pair before; volume before
allocated_before=$(vdevs)
"$bin" add --size 2G grow mirror "$OUT/c.img" "$OUT/d.img" >/dev/null
volume after; raw_pair after
"$bin" sync grow >/dev/null
allocated_after=$(vdevs)

# The raw pair is two jobs of one run: its IOPS is the sum, per mirror write two
# device writes, so the mirror's limit is half of it.
rb=$(iops "$OUT/raw-before.json"); ra=$(iops "$OUT/raw-after.json")
vb=$(iops "$OUT/vol-before.json"); va=$(iops "$OUT/vol-after.json")
echo "| 16K random writes QD64, 1.4 GiB written on a 2 GiB mirror | before add | after add | after/before |"
echo "|---|---|---|---|"
echo "| ironpool volume (fio nbd) | $vb | $va | $(ratio "$va" "$vb")x |"
echo "| raw pair (fio io_uring on two raw files at once, summed) | $rb | $ra | $(ratio "$ra" "$rb")x |"
echo "| volume / (raw pair / 2) | $(ratio "$vb" "($rb / 2)") | $(ratio "$va" "($ra / 2)") | |"
echo
echo "allocated before the add: $allocated_before"
echo
echo "allocated after ($RT s of writes after it): $allocated_after"
