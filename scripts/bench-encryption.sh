#!/usr/bin/env bash
# Encrypted volumes against unencrypted ones on the same pool, in one run
# (issue 73's figures): a mirror of two written-out files holds two volumes
# of 16K blocks, one with encryption=on (a raw key in a file), one without;
# each is prefilled, then fio's nbd engine runs the same rows on each, the
# two volumes' rows interleaved so that the disk's drift falls on both:
# 16K random writes at QD64, 1 MiB sequential writes and reads at QD16, and
# 4K random reads at QD64 of a region the read cache holds. Each row runs
# on the plain volume, the sealed one, the sealed one and the plain one
# again, after a sync each (the disk's drift falls on both alike). Prints
# each row's IOPS, MiB/s and the server's CPU per operation (means of the
# two runs), and the ratio encrypted / plain; then the speed of a whole
# snapshot's send, plain, sealed and sealed raw (`send -w`). `ironpool bench` makes
# encrypted targets (`ironpool:mirror:2x2G:encryption=on`), one pool per
# target run one after the other; this script puts both volumes on one pool
# and pairs their rows, so the disk's drift cannot favour either.
#
#
# Filesystems the same way: two filesystems of 16K records on the same
# pool, one encrypted, mounted over FUSE; fio's io_uring engine with
# direct=1 on a file of each runs the same rows (the read cache's row reads
# a region the server's cache holds, opened). Then file creations with an
# fsync each, and SQLite's rollback-journal pattern (create, fsync, unlink,
# fsync the directory), whose fsyncs commit a transaction group in an
# encrypted filesystem (its intent log carries no names). Needs root and
# /dev/fuse; skipped without them.
#
# Usage: scripts/bench-encryption.sh [RUNTIME_S] [VOLUME_SIZE] [IRONPOOL_BIN]
#   default: 8, 1G, target/release/ironpool
# Needs fio (with its nbd engine) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=${1:-8}
size=${2:-1G}
bin=${3:-$PWD/target/release/ironpool}
work=$(mktemp -d "$PWD/target/bench-encryption.XXXXXX")
export IRONPOOL_CACHE="$work/pools.json" IRONPOOL_RUN_DIR="$work/run" IRONPOOL_CONTROL="$work/ctl.sock"
socket="$work/nbd.sock"
pid=""
finish() {
    status=$?
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "$work"
    exit "$status"
}
trap finish EXIT

device_mib=$(( $(python3 -c "
s='$size'.upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))") * 3 / (1 << 20) ))
for disk in d0 d1; do
    dd if=/dev/zero of="$work/$disk.img" bs=1M count="$device_mib" oflag=direct status=none
done
dd if=/dev/zero of="$work/d0.img" bs=1M count=0 seek=$(( device_mib * 2 )) status=none
dd if=/dev/zero of="$work/d1.img" bs=1M count=0 seek=$(( device_mib * 2 )) status=none
"$bin" create -f encb mirror "$work/d0.img" "$work/d1.img" >/dev/null
"$bin" serve -d "$work" --nbd "unix:$socket" --pidfile "$work/pid" encb >"$work/serve.log" 2>&1 &
for _ in $(seq 100); do [ -S "$socket" ] && [ -s "$work/pid" ] && break; sleep 0.1; done
pid=$(cat "$work/pid")
head -c 32 /dev/urandom >"$work/key"
"$bin" volume create encb/plain "$size" >/dev/null
"$bin" volume create encb/sealed "$size" -o encryption=on -o keyformat=raw \
    -o "keylocation=file://$work/key" >/dev/null
for volume in plain sealed; do
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///encb/$volume?socket=$socket" \
        --rw=write --bs=1M --iodepth=16 --size="$size" >/dev/null
done
"$bin" sync encb >/dev/null

# Where fio finds DATASET: a volume's NBD URI, or a filesystem's file.
target_args() {
    case $1 in
        plain|sealed) echo "--ioengine=nbd --uri=nbd+unix:///encb/$1?socket=$socket" ;;
        *) echo "--ioengine=io_uring --direct=1 --filename=$work/$1/data" ;;
    esac
}

# row LABEL DATASET FIO-ARGS...: "LABEL DATASET IOPS MIBS US_PER_OP", after
# a sync so that no row pays for the write-out of the one before.
row() {
    local label=$1 volume=$2
    shift 2
    local before after
    "$bin" sync encb >/dev/null
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    # shellcheck disable=SC2046
    fio --name=row $(target_args "$volume") \
        --output-format=json --runtime="$runtime" --time_based --size="$size" "$@" >"$work/row.json"
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    python3 - "$work/row.json" "$label" "$volume" "$before" "$after" "$runtime" <<'PY'
import json, sys
path, label, volume, before, after, runtime = sys.argv[1:]
text = open(path).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
iops = job["read"]["iops"] + job["write"]["iops"]
mib = (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / 2**20
cpu = (float(after) - float(before)) / 100
print(label, volume, int(iops), round(mib, 1), round(cpu * 1e6 / max(iops * float(runtime), 1), 1))
PY
}

# create_row LABEL FS MODE: "LABEL FS OPS/S 0 US_PER_OP" for RUNTIME seconds
# of file creations in FS, each a 4 KiB write and an fsync of the new file
# (MODE create); or as SQLite's rollback journal does it, the file then
# unlinked and its directory fsynced (MODE journal). An encrypted
# filesystem's intent log carries no names (docs/FORMAT.md), so each such
# fsync commits a transaction group: this row measures that cost.
create_row() {
    local label=$1 fs=$2 mode=$3 before after
    "$bin" sync encb >/dev/null
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    python3 - "$work/$fs/creates-$label-$RANDOM" "$mode" "$runtime" "$label" "$fs" "$pid" "$before" <<'PY'
import os, sys, time
path, mode, runtime, label, fs, pid, before = sys.argv[1:]
os.makedirs(path)
directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
block = os.urandom(4096)
count, start = 0, time.monotonic()
while time.monotonic() - start < float(runtime):
    name = f"{path}/f{count}"
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    if mode == "journal":
        os.unlink(name)
        os.fsync(directory)
    count += 1
elapsed = time.monotonic() - start
with open(f"/proc/{pid}/stat") as stat:
    fields = stat.read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12]) - float(before)) / 100
print(label, fs, int(count / elapsed), 0, round(cpu * 1e6 / max(count, 1), 1))
PY
}

# Filesystems too, when this machine can mount them.
filesystems=""
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ]; then
    mkdir -p "$work/pfs" "$work/sfs"
    "$bin" fs create encb/pfs -o recordsize=16K -o "mountpoint=$work/pfs" >/dev/null
    "$bin" fs create encb/sfs -o recordsize=16K -o "mountpoint=$work/sfs" \
        -o encryption=on -o keyformat=raw -o "keylocation=file://$work/key" >/dev/null
    for fs in pfs sfs; do
        for _ in $(seq 100); do grep -q " $work/$fs fuse" /proc/mounts && break; sleep 0.1; done
        fio --name=fill --ioengine=io_uring --direct=1 --filename="$work/$fs/data" \
            --rw=write --bs=1M --iodepth=16 --size="$size" >/dev/null
    done
    "$bin" sync encb >/dev/null
    filesystems="pfs sfs"
fi

# Each row runs plain, sealed, sealed, plain: the disk's drift over the
# four falls on both alike, and each dataset's figure is its two runs'
# mean. Rows of filesystems are labelled fs_*.
{
    for pair in "plain sealed" ${filesystems:+"pfs sfs"}; do
        read -r p s <<<"$pair"
        prefix=""
        [ "$p" = pfs ] && prefix="fs_"
        for volume in "$p" "$s" "$s" "$p"; do
            row "${prefix}w16k_qd64" "$volume" --rw=randwrite --bs=16k --iodepth=64
        done
        for volume in "$p" "$s" "$s" "$p"; do
            row "${prefix}seqw_1m_qd16" "$volume" --rw=write --bs=1M --iodepth=16
        done
        for volume in "$p" "$s" "$s" "$p"; do
            row "${prefix}seqr_1m_qd16" "$volume" --rw=read --bs=1M --iodepth=16
        done
        # A 64 MiB region read once first: the cache holds it. A file's is
        # read buffered: an O_DIRECT read keeps nothing in the read cache
        # (README, `direct`), so warmed with direct=1 the row read the
        # devices (the nbd engine ignores the option).
        for volume in "$p" "$s"; do
            # shellcheck disable=SC2046
            fio --name=warm $(target_args "$volume") --direct=0 --rw=read --bs=1M --size=64M >/dev/null
            row "${prefix}r4k_qd64_cached" "$volume" --rw=randread --bs=4k --iodepth=64 --size=64M
        done
        if [ -n "$prefix" ]; then
            for fs in "$p" "$s" "$s" "$p"; do
                create_row fs_create_fsync "$fs" create
            done
            for fs in "$p" "$s" "$s" "$p"; do
                create_row fs_journal_fsync "$fs" journal
            done
        fi
    done
} >"$work/rows"

# Sends of a snapshot of each volume to /dev/null: the plain one, the
# sealed one opened (plaintext stream, the key loaded) and the sealed one
# raw (send -w: blocks as stored, never opened), in the order A B C C B A,
# each from the devices.
"$bin" snapshot encb/plain@s encb/sealed@s >/dev/null
# With no read cache: every send reads the devices (a raw send never uses
# opened blocks, and the others would find the rows' blocks cached).
"$bin" tune encb arc_max_bytes 0 >/dev/null
send_row() {
    local label=$1
    shift
    local start end
    "$bin" sync encb >/dev/null
    start=$(date +%s.%N)
    "$bin" send "$@" >/dev/null 2>"$work/send.err"
    end=$(date +%s.%N)
    python3 -c "print('$label', round($(numfmt --from=iec "$size") / 2**20 / ($end - $start), 1))"
}
{
    send_row plain encb/plain@s
    send_row sealed encb/sealed@s
    send_row raw -w encb/sealed@s
    send_row raw -w encb/sealed@s
    send_row sealed encb/sealed@s
    send_row plain encb/plain@s
} >"$work/sends"

echo "# bench-encryption $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) runtime=${runtime}s size=$size"
python3 - "$work/rows" <<'PY'
import sys
runs = {}
order = []
for line in open(sys.argv[1]):
    label, volume, iops, mib, us = line.split()
    # A filesystem's pair reads as the volumes' does.
    volume = {"pfs": "plain", "sfs": "sealed"}.get(volume, volume)
    runs.setdefault((label, volume), []).append((int(iops), float(mib), float(us)))
    if label not in order:
        order.append(label)
rows = {
    key: (
        int(sum(run[0] for run in values) / len(values)),
        round(sum(run[1] for run in values) / len(values), 1),
        round(sum(run[2] for run in values) / len(values), 1),
    )
    for key, values in runs.items()
}
print(f"{'row':18} {'plain IOPS':>11} {'sealed IOPS':>12} {'ratio':>6} {'plain MiB/s':>12} {'sealed MiB/s':>13} {'plain us/op':>12} {'sealed us/op':>13}")
for label in order:
    p, s = rows[(label, "plain")], rows[(label, "sealed")]
    print(f"{label:18} {p[0]:>11} {s[0]:>12} {s[0] / max(p[0], 1):>6.2f} {p[1]:>12} {s[1]:>13} {p[2]:>12} {s[2]:>13}")
PY
python3 - "$work/sends" <<'PY'
import sys
runs = {}
for line in open(sys.argv[1]):
    label, mib = line.split()
    runs.setdefault(label, []).append(float(mib))
mean = {label: sum(values) / len(values) for label, values in runs.items()}
print(f"send of the whole volume, MiB/s: plain {mean['plain']:.0f}, sealed {mean['sealed']:.0f} "
      f"({mean['sealed'] / mean['plain']:.2f}x), sealed raw (-w) {mean['raw']:.0f} ({mean['raw'] / mean['plain']:.2f}x)")
PY
