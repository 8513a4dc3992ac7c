#!/bin/bash
# Compares ironpool binaries on flush-heavy writes: for each binary given, a
# pool of two 4 GiB sparse files (a stripe, or a mirror with MIRROR=1) under
# $OUT (default ./compare-flush), a 1 GiB prefilled volume, then fio's nbd
# engine: 16K random writes at QD1 with a flush after every write and at
# QD64 with one every 32, 8 s each; prints IOPS and each device's flushes
# sent and skipped. Run it twice with the binaries alternated: the disk of
# these machines is shared and noisy, only same-run ratios mean anything.
#
#   scripts/compare-flush.sh /tmp/ironpool-old target/release/ironpool
set -euo pipefail
out=${OUT:-$PWD/compare-flush}
for bin in "$@"; do
    tag=$(basename "$bin")-$RANDOM
    dir="$out/$tag"
    rm -rf "$dir"; mkdir -p "$dir"
    export IRONPOOL_CACHE="$dir/cache.json" IRONPOOL_RUN_DIR="$dir/run"
    layout=("$dir/a.img" "$dir/b.img")
    [ "${MIRROR:-0}" = 1 ] && layout=(mirror "${layout[@]}")
    "$bin" create --size 4G p "${layout[@]}" >/dev/null
    "$bin" volume create p/v 1G -d "$dir" >/dev/null
    setsid -f "$bin" serve -d "$dir" p --nbd "unix:$dir/nbd.sock" --control "$dir/ctl.sock" \
        --pidfile "$dir/pid" >"$dir/serve.log" 2>&1
    for _ in $(seq 100); do [ -f "$dir/pid" ] && break; sleep 0.1; done
    trap 'kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true' EXIT
    uri="nbd+unix:///p/v?socket=$dir/nbd.sock"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size=1G --iodepth=16 >/dev/null
    for spec in "1 1" "64 32"; do
        set -- $spec
        fio --name=t --ioengine=nbd --uri="$uri" --rw=randwrite --bs=16k --size=1G \
            --iodepth="$1" --fsync="$2" --time_based --runtime=8 --output-format=json \
            2>/dev/null | sed -n '/^{/,$p' >"$dir/fio-qd$1.json"
        iops=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['jobs'][0]['write']['iops']))" "$dir/fio-qd$1.json")
        echo "$bin: QD$1 fsync=$2: $iops IOPS"
    done
    "$bin" --control "$dir/ctl.sock" --json iostat p | python3 -c '
import json, sys
for device in json.load(sys.stdin)["devices"]:
    print("  %s: %s flushes sent, %s skipped" % (device.get("path", "?"), device.get("flush_ops"), device.get("flushes_skipped", "n/a")))'
    kill "$(cat "$dir/pid")"
    for _ in $(seq 100); do [ -f "$dir/pid" ] || break; sleep 0.1; done
    trap - EXIT
done
