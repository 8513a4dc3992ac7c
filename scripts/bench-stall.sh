#!/usr/bin/env bash
# How long an administrative action, or the txg that commits it, holds the
# pool's other clients: the longest answer of a QD1 4K read probe on another
# dataset of the same pool while the action runs, against the probe with no
# action. The engine serves everything from one loop, so a step of it that
# runs long without a turn (a walk, a free, a build) delays every request.
#
# Two setups, each made fresh for every action, on a mirror of two sparse
# files:
# - vol-*: a 4 GiB volume (16K blocks) written with 3 GiB, snapshotted and
#   overwritten the same way; the probe reads volume p/probe (fio's nbd
#   engine). Actions: vol-none, vol-list (`list -t all`), vol-destroy-snap,
#   vol-destroy (`destroy -r` of the volume).
# - fs-*: a filesystem (recordsize 16K) with a 3 GiB file and 100k empty
#   files, snapshotted, on a pool imported afresh; the probe reads a file
#   of another filesystem (O_DIRECT, psync). Actions: fs-none, fs-rm (of
#   the 3 GiB file), fs-truncate (of it, to 0), fs-rmrf (of the 100k
#   files), fs-destroy-snap (rm, then the snapshot's destroy), fs-rollback
#   (rm, then a rollback), fs-destroy (`destroy -r`), fs-list, fs-scrub
#   (the scrub runs on after the command returns), fs-send (of the
#   snapshot, to /dev/null).
#
# Usage: [ACTIONS="vol-none fs-rm ..."] scripts/bench-stall.sh [IRONPOOL_BIN...]
#   default: every action, target/release/ironpool
# Prints one line per binary and action: the action's own time, the
# probe's IOPS, p99 and max latency (ms). Only max against the same run's
# *-none line means anything (the host's disk cache moves the rest).
set -euo pipefail
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=("$PWD/target/release/ironpool")
known=" vol-none vol-list vol-destroy-snap vol-destroy fs-none fs-rm fs-truncate fs-rmrf fs-destroy-snap fs-rollback fs-destroy fs-list fs-scrub fs-send "
actions=${ACTIONS:-$known}
for action in $actions; do
    [[ $known == *" $action "* ]] || { echo "unknown action $action (known:$known)" >&2; exit 1; }
done
metadata=$PWD/target/release/examples/metadata
[ -x "$metadata" ] || { echo "build the metadata example first: cargo build --release -p ironpool-bench --examples" >&2; exit 1; }
# Under the repository's target directory, not /tmp: the pools' files are
# sparse but take up to 7 GB each, and /tmp may be a small tmpfs.
mkdir -p "$PWD/target"
work=""
server=""
cleanup() {
    if [ -n "$server" ]; then
        kill -TERM "$server" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    fi
    server=""
    [ -n "$work" ] && rm -rf "$work"
    work=""
}
trap cleanup EXIT

# probe_result JSON ACTION SECONDS BINARY: the line for one run.
probe_result() {
    python3 - "$@" <<'PY'
import json, sys
path, action, seconds, binary = sys.argv[1:5]
text = open(path).read()
job = json.loads(text[text.index("{"):])["jobs"][0]["read"]
clat = job["clat_ns"]
print(f"{binary} {action} action_s={float(seconds):.3f} probe_iops={int(job['iops'])} "
      f"p99_ms={clat['percentile']['99.000000'] / 1e6:.2f} max_ms={clat['max'] / 1e6:.2f}")
PY
}

# wait_for CONDITION-COMMAND...: up to 10 s.
wait_for() {
    for _ in $(seq 100); do "$@" && return 0; sleep 0.1; done
    echo "timed out waiting for: $*" >&2
    return 1
}

mounted() { grep -q " $1 fuse.ironpool" /proc/self/mounts; }

# act BIN ACTION: the action itself (see the header), on the pool set up.
act() {
    local bin=$1 action=$2
    case $action in
    vol-list) "$bin" list -t all p >/dev/null ;;
    vol-destroy-snap) "$bin" destroy p/v@s1 >/dev/null ;;
    vol-destroy) "$bin" destroy -r p/v >/dev/null ;;
    fs-rm) rm "$work/fs/big" ;;
    fs-truncate) truncate -s 0 "$work/fs/big" ;;
    fs-rmrf) rm -rf "$work/fs/ironpool-bench-metadata" ;;
    fs-destroy-snap) rm "$work/fs/big" && "$bin" destroy st/fs@s1 >/dev/null ;;
    fs-rollback) rm "$work/fs/big" && "$bin" rollback st/fs@s1 >/dev/null ;;
    fs-destroy) "$bin" destroy -r st/fs >/dev/null ;;
    fs-list) "$bin" list -t all st >/dev/null ;;
    fs-scrub) "$bin" scrub st >/dev/null ;;
    fs-send) "$bin" send st/fs@s1 >/dev/null 2>&1 ;;
    vol-none | fs-none) ;;
    *) echo "unknown action $action" >&2; return 1 ;;
    esac
}

# probe_during BIN ACTION FIO-ARGS...: a 12 s QD1 4K random read probe
# (FIO-ARGS say where), the action 3 s into it; prints the run's line.
probe_during() {
    local bin=$1 action=$2
    shift 2
    fio --name=probe "$@" --rw=randread --bs=4k --iodepth=1 --runtime=12 --time_based \
        --output-format=json >"$work/probe.json" &
    local fio_pid=$! start end
    sleep 3
    start=$(date +%s.%N)
    act "$bin" "$action"
    end=$(date +%s.%N)
    wait "$fio_pid"
    probe_result "$work/probe.json" "$action" "$(awk "BEGIN {print $end - $start}")" "$(basename "$bin")"
}

run_volume() {
    local bin=$1 action=$2
    export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json
    "$bin" create --size 16G p mirror "$work/a.img" "$work/b.img" >/dev/null
    "$bin" serve -d "$work" --nbd "unix:$work/s.sock" p >"$work/serve.log" 2>&1 &
    server=$!
    wait_for test -S "$work/s.sock"
    "$bin" volume create -o volblocksize=16K p/v 4G >/dev/null
    "$bin" volume create p/probe 64M >/dev/null
    local uri="--ioengine=nbd --uri=nbd+unix:///p/v?socket=$work/s.sock"
    local probe="--ioengine=nbd --uri=nbd+unix:///p/probe?socket=$work/s.sock --size=64M"
    fio --name=fill $uri --rw=write --bs=1M --iodepth=16 --size=3G >/dev/null
    "$bin" snapshot p/v@s1 >/dev/null
    fio --name=over $uri --rw=write --bs=1M --iodepth=16 --size=3G >/dev/null
    fio --name=probefill $probe --rw=write --bs=1M >/dev/null
    sleep 6 # the overwrite's txgs commit first
    probe_during "$bin" "$action" $probe
}

run_filesystem() {
    local bin=$1 action=$2
    unset IRONPOOL_CONTROL
    export IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json
    "$bin" create --size 16G st mirror "$work/a.img" "$work/b.img" >/dev/null
    "$bin" fs create st/fs -o mountpoint="$work/fs" -o recordsize=16K -d "$work" >/dev/null
    "$bin" fs create st/other -o mountpoint="$work/other" -o recordsize=16K -d "$work" >/dev/null
    start_fs_server() {
        setsid -f "$bin" serve -d "$work" --pidfile "$work/pid" st 2>>"$work/serve.log"
        wait_for mounted "$work/other"
        wait_for mounted "$work/fs"
        server=$(cat "$work/pid")
    }
    start_fs_server
    fio --name=big --filename="$work/fs/big" --rw=write --bs=1M --size=3G --direct=1 \
        --ioengine=io_uring --iodepth=16 >/dev/null
    "$metadata" "$work/fs" 100000 create >/dev/null
    "$bin" snapshot st/fs@s1 >/dev/null
    fio --name=probefill --filename="$work/other/probe" --rw=write --bs=1M --size=64M --direct=1 >/dev/null
    # A fresh import: nothing of the setup is in memory but what it loads.
    kill -TERM "$server"
    wait_for sh -c "! kill -0 $server 2>/dev/null"
    server=""
    start_fs_server
    sleep 2
    probe_during "$bin" "$action" --filename="$work/other/probe" --ioengine=psync --direct=1 --size=64M
}

echo "# bench-stall $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || true)"
for action in $actions; do
    for bin in "${binaries[@]}"; do
        work=$(mktemp -d "$PWD/target/bench-stall.XXXXXX")
        case $action in
        vol-*) run_volume "$bin" "$action" ;;
        fs-*) run_filesystem "$bin" "$action" ;;
        *) echo "unknown action $action" >&2; exit 1 ;;
        esac
        cleanup
    done
done
