#!/usr/bin/env bash
# The filesystem table of issue 19 in one run, against baselines of the same
# run. Needs root, /dev/fuse, fio, mkfs.ext4 and a release build
# (cargo build --release --workspace --bins --examples).
#
#   metadata    create, stat and remove FILES empty files in one directory
#               (and stat FILES names that do not exist: a round trip each)
#               (the bench crate's `metadata` example: a compiled loop of
#               system calls; fio's file engines cost more than ext4 does):
#               ext4 on a loop device (a file beside the pool's, loop
#               direct I/O on) against an ironpool filesystem (a mirror of
#               two files); files per second and the ratio, per phase
#   data        fio direct=1 on a 1 GiB file: 16K random writes at QD1 and
#               QD64 (io_uring, then libaio), 4K random reads at QD64, 1 MiB
#               sequential writes and reads at QD16 (io_uring), on the raw
#               file and on a file of the ironpool filesystem (recordsize
#               16K; the 4K reads also on a file of 4K records, which
#               reads no more than it returns); IOPS and the ratio, QD64
#               over QD1, and the transport and requests in flight at the
#               server; then what the disk allows two of those rows (the
#               raw file's 16K reads, which a 4K read of a 16K record
#               costs, and its 16K writes on two files at once, as a
#               mirror of two files on one disk writes)
#   sync        16K random writes made durable, fio io_uring direct=1 on a
#               1 GiB file: fsync after every write at QD1, after every 32
#               at QD64, and O_DSYNC at QD1 (psync), on the raw file and on
#               a file of the ironpool filesystem; IOPS, the ratio, and the
#               filesystem's intent log commits against txg fallbacks
#   names       durable changes of names, each for RUNTIME_S on ext4 (as
#               above) and on the ironpool filesystem: sqlite transactions
#               (python's sqlite3, default rollback journal, synchronous=
#               FULL: the journal is created, fsynced and deleted per
#               commit), new files (create, write 4 KiB, fsync the file and
#               the directory) and atomic replaces (write a temporary file,
#               fsync, rename over the target, fsync the directory); per
#               second and the ratio, and the intent log's commits against
#               txg fallbacks
#   buffered    writes through the page cache (not O_DIRECT) to a 256 MiB
#               file of a filesystem of the default recordsize, fsync at
#               the end: 4K random at QD1 (psync) and QD64 (io_uring), 128K
#               sequential; against ext4 (as above), IOPS and the ratio
#   seq         1 MiB sequential writes and reads at QD16 on a file of a
#               filesystem of the default recordsize (128K), fio io_uring
#               direct=1, against an ironpool volume of the same pool over
#               NBD (fio's nbd engine): the issue's 0.8x comparison; then
#               the reads of the volume again with direct=always (no cache,
#               no read-ahead, as the file's O_DIRECT reads)
#   cached      random reads of 1 MiB, 128K and 4K at QD16, fio io_uring
#               direct=1, of a 256 MiB file the read cache holds
#               (recordsize 128K), against the same reads of a 256 MiB
#               volume of the same pool over NBD, also cached: the FUSE
#               path's own cost (request, copies, reply) with no device
#               in the way; IOPS and the ratio
#
# Usage: [WRITTEN_OUT=1] [HALT_POLL_NS=N] [FUSE_URING=Y|N] scripts/bench-fs.sh [FILES] [RUNTIME_S] [IRONPOOL_BIN] [PARTS]
#   default: 100000 files, 8 s, target/release/ironpool,
#   "metadata data seq cached sync names"
# HALT_POLL_NS=N runs with a virtual machine's guest halt polling at N ns
# (see scripts/halt-poll.sh: the metadata rows wait for each answer).
# FUSE_URING=Y (or N) sets /sys/module/fuse/parameters/enable_uring for the
# run, so the filesystem is mounted with FUSE over io_uring (or /dev/fuse),
# and puts the old value back at exit; unset, the machine's setting stands.
# The last line of the data part says which transport served.
# WRITTEN_OUT=1 writes the device files out (zeros, as the raw file is
# prefilled) before the pool and the ext4 baseline are made on them,
# instead of leaving them sparse: on a sparse file the host filesystem
# allocates (and journals) on the first write of every block, which
# copy-on-write pays on each write to fresh space and a real device does
# not (fio, same disk: a 16K O_DSYNC write took 132 us on a sparse file,
# 67 us on a written one). The header says which.
set -euo pipefail
files=${1:-100000}
runtime=${2:-8}
bin=${3:-$PWD/target/release/ironpool}
parts=${4:-metadata data seq cached sync names}
metadata=$PWD/target/release/examples/metadata
[ "$(id -u)" -eq 0 ] || { echo "bench-fs: run as root (FUSE mounts, loop devices)" >&2; exit 1; }
[ -x "$bin" ] && [ -x "$metadata" ] || { echo "bench-fs: build first: cargo build --release --workspace --bins --examples" >&2; exit 1; }
work=$(mktemp -d "$PWD/target/bench-fs.XXXXXX")
loop=""
server=""
source "$(dirname "$0")/halt-poll.sh"
uring_knob=/sys/module/fuse/parameters/enable_uring
uring_saved=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && sleep 2
    mountpoint -q "$work/ext4" && umount "$work/ext4"
    [ -n "$loop" ] && losetup -d "$loop"
    rm -rf "$work"
    halt_poll_restore
    [ -n "$uring_saved" ] && echo "$uring_saved" >"$uring_knob"
}
trap cleanup EXIT
halt_poll_apply
if [ -n "${FUSE_URING:-}" ]; then
    [ -w "$uring_knob" ] || { echo "FUSE_URING: $uring_knob is not writable (no FUSE over io_uring, or not root)" >&2; exit 1; }
    uring_saved=$(cat "$uring_knob")
    echo "$FUSE_URING" >"$uring_knob"
fi
export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json

# fio_iops LABEL FIO-ARGS... [--name=JOB --filename=FILE]...: runs fio,
# prints the IOPS (reads and writes; for the file engines, files per
# second). The arguments apply to every job; without jobs of its own the run
# is one job. With several, the slowest job's (a mirror's write waits for
# both of its copies).
fio_iops() {
    local label=$1
    shift
    local job=(--name=t)
    [[ " $* " == *" --name="* ]] && job=()
    fio --output-format=json "$@" "${job[@]}" >"$work/$label.json" 2>"$work/$label.err" || {
        echo "bench-fs: fio $label failed: $(cat "$work/$label.err")" >&2
        echo 0
        return
    }
    python3 - "$work/$label.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
jobs = json.loads(text[text.index("{"):])["jobs"]
print(int(min(job["read"]["iops"] + job["write"]["iops"] for job in jobs)))
PY
}

ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}x' if b else '-')" "$1" "$2"; }

echo "# bench-fs $(date -u +%FT%TZ) files=$files runtime=${runtime}s $(git rev-parse --short HEAD 2>/dev/null || true) $(uname -r) $(halt_poll_describe) enable_uring=$(cat "$uring_knob" 2>/dev/null || echo absent) devices=$([ "${WRITTEN_OUT:-0}" = 1 ] && echo written || echo sparse)"

# Device files: sparse, or written out (WRITTEN_OUT=1, see above).
devices() {
    local file
    for file in "$@"; do
        if [ "${WRITTEN_OUT:-0}" = 1 ]; then
            dd if=/dev/zero of="$file" bs=1M count=4096 conv=fsync status=none
        else
            truncate -s 4G "$file"
        fi
    done
    # The host's write-back of those gigabytes settles first.
    [ "${WRITTEN_OUT:-0}" = 1 ] && sleep 5
    return 0
}
devices "$work/ext4.img" "$work/d0.img" "$work/d1.img"

# The ext4 baseline on a loop device over a file of the same disk.
loop=$(losetup --find --show --direct-io=on "$work/ext4.img")
mkfs.ext4 -q "$loop"
mkdir -p "$work/ext4"
mount "$loop" "$work/ext4"

# The ironpool filesystem.
"$bin" create --size 4G -f bench mirror "$work/d0.img" "$work/d1.img" >/dev/null
"$bin" serve -d "$work" --nbd "unix:$work/nbd.sock" --control "$work/ctl.sock" \
    --pidfile "$work/serve.pid" bench >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 600); do [ -S "$work/ctl.sock" ] && break; sleep 0.05; done
"$bin" fs create --control "$work/ctl.sock" bench/fs -o "mountpoint=$work/ipfs" -o recordsize=16K >/dev/null
for _ in $(seq 600); do grep -q " $work/ipfs fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
grep -q " $work/ipfs fuse.ironpool" /proc/self/mounts || { echo "bench-fs: not mounted: $(cat "$work/serve.log")" >&2; exit 1; }

if [[ " $parts " == *" metadata "* ]]; then
echo "## metadata: $files empty files in one directory, files/s"
# fs_ops: bench/fs's FUSE requests by kind so far, as JSON.
fs_ops() {
    "$bin" iostat --json --control "$work/ctl.sock" bench | python3 -c '
import json, sys
for fs in json.load(sys.stdin)["filesystems"]:
    if fs["name"] == "bench/fs":
        print(json.dumps(fs["front_end"].get("ops", {})))
'
}
fs_ops >"$work/ops-start.json"
for phase in create stat absent delete; do
    "$metadata" "$work/ext4" "$files" "$phase" >>"$work/meta-ext4.txt"
    "$metadata" "$work/ipfs" "$files" "$phase" >>"$work/meta-ipfs.txt"
    fs_ops >"$work/ops-$phase.json"
done
# Per phase: the rates and their ratio, then the requests each file cost
# the ironpool filesystem (those the application waits on are round
# trips; RELEASE and FORGET go in the background) and the server's mean
# time for each. `absent` (a stat of a name that does not exist: one
# LOOKUP) measures a round trip.
python3 - "$work" "$files" <<'PY'
import json, sys
work, files = sys.argv[1], int(sys.argv[2])
def rates(name):
    return {line.split()[0]: float(line.split()[1]) for line in open(f"{work}/{name}")}
ext4, ipfs = rates("meta-ext4.txt"), rates("meta-ipfs.txt")
background = {"RELEASE", "RELEASEDIR", "FORGET", "BATCH_FORGET", "INTERRUPT"}
before = json.load(open(f"{work}/ops-start.json"))
phases = {}
for phase in ["create", "stat", "absent", "delete"]:
    after = json.load(open(f"{work}/ops-{phase}.json"))
    phases[phase] = {op: (v["count"] - before.get(op, {}).get("count", 0),
                          v["service_us"] - before.get(op, {}).get("service_us", 0))
                     for op, v in after.items()}
    before = after
print(f"{'phase':<8} {'ext4':>10} {'ironpool':>10} {'ratio':>7}   requests per file (server us each)")
for phase, ops in phases.items():
    shown = ", ".join(f"{op} {n / files:.2f} ({us / n:.1f})" for op, (n, us) in
                      sorted(ops.items(), key=lambda kv: -kv[1][0]) if n >= files / 100)
    print(f"{phase:<8} {ext4[phase]:>10.0f} {ipfs[phase]:>10.0f} {ipfs[phase] / ext4[phase]:>6.2f}x   {shown or '-'}")
absent = phases["absent"].get("LOOKUP", (0, 0))
print(f"one round trip (an absent-name stat): {1e6 / ipfs['absent']:.1f} us, the server's LOOKUP "
      f"{absent[1] / absent[0] if absent[0] else 0:.1f} us of it, ext4's whole stat {1e6 / ext4['absent']:.1f} us")
for phase in ["create", "delete"]:
    trips = sum(n for op, (n, _) in phases[phase].items() if op not in background) / files
    served = sum(us for op, (_, us) in phases[phase].items()) / files
    print(f"{phase}: {trips:.2f} round trips per file, {1e6 / ipfs[phase]:.1f} us per file, "
          f"{served:.1f} us of it in the server's requests")
PY
fi

# log_counts: the filesystem bench/fs's intent log commits and txg fallbacks.
log_counts() {
    "$bin" iostat --json --control "$work/ctl.sock" bench | python3 -c '
import json, sys
for fs in json.load(sys.stdin)["filesystems"]:
    if fs["name"] == "bench/fs" and "intent_log" in fs:
        log = fs["intent_log"]
        print("intent log: %d commits, %d shared, %d through a txg" % (log["commits"], log["shared_commits"], log["txg_fallbacks"]))
'
}

if [[ " $parts " == *" names "* ]]; then
echo "## names: durable changes of names for ${runtime}s each, per second"
# names.py DIR TEST SECONDS: how many of TEST it completes per second in DIR.
cat >"$work/names.py" <<'PY'
import os, sqlite3, sys, time
root, test, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
work = os.path.join(root, "names-" + test)
os.mkdir(work)
dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
block = os.urandom(4096)
done = 0
if test == "sqlite":
    db = sqlite3.connect(os.path.join(work, "t.db"), isolation_level=None)
    db.execute("pragma journal_mode=delete")
    db.execute("pragma synchronous=full")
    db.execute("create table t(id integer primary key, v blob)")
start = time.monotonic()
while time.monotonic() - start < seconds:
    if test == "sqlite":
        db.execute("begin")
        db.execute("insert into t(v) values (?)", (block[:100],))
        db.execute("commit")
    elif test == "create":
        fd = os.open(os.path.join(work, "f%d" % done), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
        os.fsync(dfd)
    else:
        tmp = os.path.join(work, "target.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, os.path.join(work, "target"))
        os.fsync(dfd)
    done += 1
print("%.0f" % (done / (time.monotonic() - start)))
PY
printf "%-20s %10s %10s %8s\n" test ext4 ironpool ratio
for test in sqlite create replace; do
    ext4=$(python3 "$work/names.py" "$work/ext4" "$test" "$runtime")
    ip=$(python3 "$work/names.py" "$work/ipfs" "$test" "$runtime")
    printf "%-20s %10s %10s %8s\n" "$test" "$ext4" "$ip" "$(ratio "$ip" "$ext4")"
done
log_counts
fi

if [[ " $parts " == *" seq "* ]]; then
echo "## seq: 1 MiB at QD16, IOPS: a volume over NBD against a file (recordsize 128K)"
"$bin" fs create --control "$work/ctl.sock" bench/fs128 -o "mountpoint=$work/ip128" >/dev/null
"$bin" volume create --control "$work/ctl.sock" bench/vol 1G >/dev/null
for _ in $(seq 600); do grep -q " $work/ip128 fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
printf "%-20s %10s %10s %8s\n" test volume file ratio
for rw in write read; do
    vol=$(fio_iops "seq-$rw-vol" --ioengine=nbd --uri="nbd+unix:///bench/vol?socket=$work/nbd.sock" \
        --size=1G --rw=$rw --bs=1M --iodepth=16 --runtime="$runtime" --time_based)
    file=$(fio_iops "seq-$rw-file" --filename="$work/ip128/f.img" --ioengine=io_uring --direct=1 \
        --size=1G --rw=$rw --bs=1M --iodepth=16 --runtime="$runtime" --time_based)
    printf "%-20s %10s %10s %8s\n" "seq${rw}_1m_qd16" "$vol" "$file" "$(ratio "$file" "$vol")"
done
# The volume's reads above are read ahead (prefetch, as OpenZFS's zfetch):
# NBD carries no direct flag, so a volume's reads use the cache. A file's
# O_DIRECT reads bypass it, with no read-ahead. The same reads of the volume
# with direct=always (to the devices, keeping nothing, no read-ahead) are the
# like-for-like figure.
"$bin" set --control "$work/ctl.sock" direct=always bench/vol >/dev/null
vol=$(fio_iops "seq-read-vol-direct" --ioengine=nbd --uri="nbd+unix:///bench/vol?socket=$work/nbd.sock" \
    --size=1G --rw=read --bs=1M --iodepth=16 --runtime="$runtime" --time_based)
printf "%-20s %10s %10s %8s\n" "seqread_1m_qd16" "$vol" "$file" "$(ratio "$file" "$vol") (volume direct=always)"
# Their gigabytes go back to the pool (4G): the data part writes two more.
rm -f "$work/ip128/f.img"
"$bin" destroy --control "$work/ctl.sock" bench/vol >/dev/null
fi

if [[ " $parts " == *" cached "* ]]; then
echo "## cached: random reads at QD16 of 256 MiB the read cache holds, direct=1, IOPS"
"$bin" fs create --control "$work/ctl.sock" bench/fscache -o "mountpoint=$work/ipc" >/dev/null
"$bin" volume create --control "$work/ctl.sock" bench/volcache 256M >/dev/null
for _ in $(seq 600); do grep -q " $work/ipc fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
cache_uri="nbd+unix:///bench/volcache?socket=$work/nbd.sock"
fio --name=fill --filename="$work/ipc/f.img" --rw=write --bs=1M --size=256M --direct=1 >/dev/null
# O_DIRECT reads take what the cache holds but do not fill it: one
# buffered read of the file fills it.
fio --name=warm --filename="$work/ipc/f.img" --rw=read --bs=1M --size=256M >/dev/null
fio --name=fill --ioengine=nbd --uri="$cache_uri" --rw=write --bs=1M --size=256M >/dev/null
printf "%-20s %10s %10s %8s\n" test volume file ratio
for bs in 1M 128k 4k; do
    vol=$(fio_iops "cached-$bs-vol" --ioengine=nbd --uri="$cache_uri" --size=256M \
        --rw=randread --bs=$bs --iodepth=16 --runtime="$runtime" --time_based)
    file=$(fio_iops "cached-$bs-file" --filename="$work/ipc/f.img" --ioengine=io_uring --direct=1 \
        --size=256M --rw=randread --bs=$bs --iodepth=16 --runtime="$runtime" --time_based)
    printf "%-20s %10s %10s %8s\n" "randread_${bs}_qd16" "$vol" "$file" "$(ratio "$file" "$vol")"
done
"$bin" iostat --json --control "$work/ctl.sock" bench | python3 -c '
import json, sys
cache = json.load(sys.stdin)["cache"]["cache"]
data = cache.get("demand_data", {})
print("read cache, data read on demand since the start: %d hits, %d misses" % (data.get("hits", 0), data.get("misses", 0)))
'
rm -f "$work/ipc/f.img"
"$bin" destroy --control "$work/ctl.sock" bench/volcache >/dev/null
fi

if [[ " $parts " == *" buffered "* ]]; then
echo "## buffered: writes through the page cache to a 256 MiB file (recordsize 128K), fsync at the end, IOPS"
mountpoint -q "$work/ip128" || "$bin" fs create --control "$work/ctl.sock" bench/fs128 -o "mountpoint=$work/ip128" >/dev/null
for _ in $(seq 600); do grep -q " $work/ip128 fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
printf "%-20s %10s %10s %8s\n" test ext4 ironpool ratio
for test in "w4k_rand_qd1 --ioengine=psync --rw=randwrite --bs=4k" \
            "w4k_rand_qd64 --ioengine=io_uring --iodepth=64 --rw=randwrite --bs=4k" \
            "w128k_seq_qd1 --ioengine=psync --rw=write --bs=128k"; do
    set -- $test
    label=$1
    shift
    ext4=$(fio_iops "$label-ext4" --filename="$work/ext4/b.img" --size=256M --end_fsync=1 \
        --runtime="$runtime" "$@")
    ip=$(fio_iops "$label-ip" --filename="$work/ip128/b.img" --size=256M --end_fsync=1 \
        --runtime="$runtime" "$@")
    printf "%-20s %10s %10s %8s\n" "$label" "$ext4" "$ip" "$(ratio "$ip" "$ext4")"
done
"$bin" iostat --json --control "$work/ctl.sock" bench | python3 -c '
import json, sys
for fs in json.load(sys.stdin)["filesystems"]:
    if fs["name"] == "bench/fs128":
        print("bench/fs128: %d writes, %d answered from memory, %d write-outs failed" % (fs["write_ops"], fs.get("behind_write_ops", 0), fs.get("behind_failures", 0)))
'
fi

[[ " $parts " == *" data "* || " $parts " == *" sync "* ]] || exit 0
common="--direct=1 --size=1G --runtime=$runtime --time_based"
fio --name=prefill --filename="$work/raw.img" --rw=write --bs=1M --size=1G --direct=1 >/dev/null
fio --name=prefill --filename="$work/ipfs/f.img" --rw=write --bs=1M --size=1G --direct=1 >/dev/null

if [[ " $parts " == *" sync "* ]]; then
# The prefill's data is made durable before the timed jobs.
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); os.fsync(fd)' "$work/ipfs/f.img"
echo "## sync: 16K random writes made durable on a 1 GiB file, fio direct=1, IOPS"
printf "%-20s %10s %10s %8s\n" test raw ironpool ratio
for test in "fsync1_qd1 --ioengine=io_uring --iodepth=1 --fsync=1" \
            "fsync32_qd64 --ioengine=io_uring --iodepth=64 --fsync=32" \
            "dsync_qd1 --ioengine=psync --sync=dsync"; do
    set -- $test
    label=$1
    shift
    raw=$(fio_iops "$label-raw" --filename="$work/raw.img" $common --rw=randwrite --bs=16k "$@")
    ip=$(fio_iops "$label-ip" --filename="$work/ipfs/f.img" $common --rw=randwrite --bs=16k "$@")
    printf "%-20s %10s %10s %8s\n" "$label" "$raw" "$ip" "$(ratio "$ip" "$raw")"
done
log_counts
fi

[[ " $parts " == *" data "* ]] || exit 0
echo "## data: a 1 GiB file, fio direct=1 (io_uring unless _aio: libaio), IOPS"
printf "%-20s %10s %10s %8s\n" test raw ironpool ratio
declare -A iops raw_iops
for test in "w16k_qd1 --ioengine=io_uring --rw=randwrite --bs=16k --iodepth=1" \
            "w16k_qd64 --ioengine=io_uring --rw=randwrite --bs=16k --iodepth=64" \
            "w16k_qd1_aio --ioengine=libaio --rw=randwrite --bs=16k --iodepth=1" \
            "w16k_qd64_aio --ioengine=libaio --rw=randwrite --bs=16k --iodepth=64" \
            "r4k_qd64 --ioengine=io_uring --rw=randread --bs=4k --iodepth=64" \
            "seqw_1m_qd16 --ioengine=io_uring --rw=write --bs=1M --iodepth=16" \
            "seqr_1m_qd16 --ioengine=io_uring --rw=read --bs=1M --iodepth=16"; do
    set -- $test
    label=$1
    shift
    raw=$(fio_iops "$label-raw" --filename="$work/raw.img" $common "$@")
    ip=$(fio_iops "$label-ip" --filename="$work/ipfs/f.img" $common "$@")
    iops[$label]=$ip
    raw_iops[$label]=$raw
    printf "%-20s %10s %10s %8s\n" "$label" "$raw" "$ip" "$(ratio "$ip" "$raw")"
done
# A 4K read of a 16K record reads and verifies the whole record (16K
# random reads are about half as many per second as 4K ones on this kind
# of disk): the same reads on a file of 4K records, as a database sets
# recordsize to its page.
"$bin" fs create --control "$work/ctl.sock" bench/fs4k -o "mountpoint=$work/ip4k" -o recordsize=4K >/dev/null
for _ in $(seq 600); do grep -q " $work/ip4k fuse.ironpool" /proc/self/mounts && break; sleep 0.05; done
fio --name=prefill --filename="$work/ip4k/f.img" --rw=write --bs=1M --size=1G --direct=1 >/dev/null
ip=$(fio_iops "r4k_qd64_rs4k-ip" --filename="$work/ip4k/f.img" $common --ioengine=io_uring --rw=randread --bs=4k --iodepth=64)
printf "%-20s %10s %10s %8s\n" "r4k_qd64_rs4k" "${raw_iops[r4k_qd64]}" "$ip" "$(ratio "$ip" "${raw_iops[r4k_qd64]}")"
# What this disk allows those rows: a 4K read of a 16K record reads the
# whole record (the raw file's 16K reads), and a mirror of two files writes
# every byte on both, here on one disk (the raw file's 16K writes on two
# files at once, the slower of the two jobs).
r16k=$(fio_iops "r16k_qd64-raw" --filename="$work/raw.img" $common --ioengine=io_uring --rw=randread --bs=16k --iodepth=64)
printf "%-20s %10s %10s %8s  (raw: its 16K reads)\n" "r4k_qd64" "$r16k" "${iops[r4k_qd64]}" "$(ratio "${iops[r4k_qd64]}" "$r16k")"
fio --name=prefill --filename="$work/raw2.img" --rw=write --bs=1M --size=1G --direct=1 >/dev/null
pair=$(fio_iops "w16k_qd64-raw-pair" $common --ioengine=io_uring --rw=randwrite --bs=16k --iodepth=64 \
    --name=a --filename="$work/raw.img" --name=b --filename="$work/raw2.img")
rm -f "$work/raw2.img"
printf "%-20s %10s %10s %8s  (raw: two files at once)\n" "w16k_qd64" "$pair" "${iops[w16k_qd64]}" "$(ratio "${iops[w16k_qd64]}" "$pair")"
# The issue asks QD64 to reach at least 4x QD1 (OpenZFS: about 1x).
echo "ironpool 16K write QD64/QD1: io_uring $(ratio "${iops[w16k_qd64]}" "${iops[w16k_qd1]}"), libaio $(ratio "${iops[w16k_qd64_aio]}" "${iops[w16k_qd1_aio]}")"
# The transport and the most requests the server had in flight at once
# (since the mount: the QD64 jobs above set it).
"$bin" fs list --json --control "$work/ctl.sock" bench | python3 -c '
import json, sys
for fs in json.load(sys.stdin)["filesystems"]:
    if fs["name"] == "bench/fs":
        front = fs["front_end"]
        print("server:", front.get("transport"), "; at most", front.get("in_flight_max"), "requests in flight at once")
'
