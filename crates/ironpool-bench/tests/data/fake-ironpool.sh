#!/bin/bash
# A stand-in for the `ironpool` binary that speaks the CLI contract
# ironpool-bench drives (see src/target/ironpool.rs), so the ironpool target
# code runs end to end before the engine exists:
#   create --size SIZE -f POOL [LAYOUT] DISK...   checks the disks exist
#   serve -d DIR --nbd unix:SOCK --control CTL --pidfile PID POOL
#                                                 execs nbdkit on DIR/d0.img (same PID)
#   volume create --control CTL POOL/NAME SIZE [-o k=v]...   records the volume
#   list --json --control CTL                     capacity from the disk sizes,
#                                                 allocation from du
#   iostat --json --control CTL POOL              counters that grow per call
#   sync --control CTL POOL                       nothing to commit (nbdkit)
#   set --control CTL PROP=VALUE DATASET          records the setting
# Figures measured through it are nbdkit's, not ironpool's.
set -euo pipefail

die() { echo "fake-ironpool: $*" >&2; exit 2; }

control_dir() {
    while [ $# -gt 0 ]; do
        if [ "$1" = "--control" ]; then dirname "$2"; return; fi
        shift
    done
    die "no --control"
}

disk_bytes() { stat -c %s "$1/d0.img"; }

cmd="${1:-}"; shift || true
case "$cmd" in
--version)
    echo "ironpool 0.0.0-fake"
    ;;
create)
    for arg in "$@"; do
        case "$arg" in
        *.img) [ -f "$arg" ] || die "no disk $arg" ;;
        esac
    done
    ;;
serve)
    dir="" sock="" ctl="" pidfile=""
    while [ $# -gt 0 ]; do
        case "$1" in
        -d) dir="$2"; shift 2 ;;
        --nbd) sock="${2#unix:}"; shift 2 ;;
        --control) ctl="$2"; shift 2 ;;
        --pidfile) pidfile="$2"; shift 2 ;;
        *) shift ;;
        esac
    done
    [ -n "$dir" ] && [ -n "$sock" ] && [ -n "$ctl" ] && [ -n "$pidfile" ] || die "serve needs -d, --nbd, --control, --pidfile"
    : > "$ctl"
    exec "${NBDKIT:-nbdkit}" -f -P "$pidfile" --unix "$sock" file "$dir/d0.img"
    ;;
volume)
    [ "${1:-}" = "create" ] || die "volume $1?"
    dir=$(control_dir "$@")
    echo "$*" >> "$dir/fake-volumes"
    ;;
sync)
    control_dir "$@" >/dev/null
    ;;
set)
    dir=$(control_dir "$@")
    echo "$*" >> "$dir/fake-settings"
    ;;
list)
    dir=$(control_dir "$@")
    size=$(disk_bytes "$dir")
    allocated=$(du --block-size=1 "$dir/d0.img" | cut -f1)
    printf '{"pools":[{"name":"bench","size_bytes":%d,"allocated_bytes":%d,"free_bytes":%d,"health":"ONLINE"}]}\n' \
        "$size" "$allocated" $((size - allocated))
    ;;
iostat)
    dir=$(control_dir "$@")
    count_file="$dir/fake-iostat-calls"
    n=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$count_file"
    now=$(date +%s%N)
    ops=$((n * 1000)); bytes=$((ops * 524288)); requests=$((ops * 32))
    device() {
        printf '{"path":"%s","top_vdev":"mirror-0","read_ops":%d,"write_ops":%d,"read_bytes":%d,"write_bytes":%d,' \
            "$1" "$ops" "$ops" "$bytes" "$bytes"
        printf '"read_requests":%d,"write_requests":%d,"active_time_weighted_ns":%d,"busy_ns":0,' \
            "$requests" "$requests" $((now * 4))
        printf '"queued_total":0,"active_total":0,"read_errors":0,"write_errors":0,"checksum_errors":0}'
    }
    printf '{"pool":"bench","timestamp_ns":%d,"devices":[' "$now"
    device "$dir/d0.img"; printf ','; device "$dir/d1.img"
    printf '],"volumes":[{"name":"bench/vol","read_ops":%d,"write_ops":%d,"read_bytes":0,"write_bytes":0,' "$ops" "$ops"
    printf '"direct_read_ops":%d,"direct_write_ops":0,"rmw_write_ops":%d,"hole_read_ops":0}]}\n' "$((ops * 100))" "$ops"
    ;;
*)
    die "unknown command ${cmd:-(none)}"
    ;;
esac
