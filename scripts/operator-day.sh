#!/usr/bin/env bash
# An operator's day (issue 71), on sparse files under a temporary directory:
# a pool of one disk becomes a mirror (attach), grows by a second mirror
# (add), gets a hot spare (add spare); then one side of the new mirror dies
# under load (its file lives on a loop-mounted XFS that is shut down: from
# then on every read, write and flush of it fails with EIO, as a dead disk's
# would), the server faults it and puts the spare in its place on its own,
# and `detach` of the dead device makes the spare permanent. Then a third
# mirror is added and the first one removed: its blocks move to the others
# while the server runs. Nothing written is lost: `check`, a scrub, fio's
# verification of the volume and the checksums of the filesystem's files
# say so.
#
# Needs root (a loop mount, FUSE), xfsprogs, fio and python3. IRONPOOL_BIN picks the binary
# (default: target/release/ironpool, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${IRONPOOL_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release -p ironpool-cli
    bin="$PWD/target/release/ironpool"
fi
work=$(mktemp -d /tmp/ironpool-day.XXXXXX)
export IRONPOOL_CACHE="$work/pools.json" IRONPOOL_RUN_DIR="$work/run"
socket="$work/nbd.sock"
uri="nbd+unix:///day/vol?socket=$socket"
mkdir -p "$work/flaky"
truncate -s 600M "$work/host.img"
mkfs.xfs -q "$work/host.img"
mount -o loop "$work/host.img" "$work/flaky"
finish() {
    status=$?
    if [ -f "$work/pid" ]; then kill -TERM "$(cat "$work/pid")" 2>/dev/null || true; fi
    for _ in $(seq 100); do [ -f "$work/pid" ] && kill -0 "$(cat "$work/pid")" 2>/dev/null || break; sleep 0.1; done
    if grep -q " $work/fs " /proc/self/mounts; then umount -l "$work/fs" || true; fi
    umount -l "$work/flaky" 2>/dev/null || true
    if [ "$status" -ne 0 ] && [ -f "$work/serve.log" ]; then tail -20 "$work/serve.log"; fi
    rm -rf "$work"
    exit "$status"
}
trap finish EXIT

# `status --json` field FIELD of the pool, through python3.
field() {
    "$bin" --json status day | python3 -c "import json, sys; s = json.load(sys.stdin); print($1)"
}

echo "== a pool of one 512 MiB disk, a volume and a filesystem"
"$bin" create --size 512M day "$work/d0.img"
"$bin" volume create day/vol 128M -d "$work"
"$bin" fs create day/fs -o mountpoint="$work/fs" -d "$work"
setsid -f "$bin" serve -d "$work" --nbd "unix:$socket" --pidfile "$work/pid" day 2>"$work/serve.log"
for _ in $(seq 100); do [ -f "$work/pid" ] && break; sleep 0.1; done
for _ in $(seq 100); do grep -q " $work/fs " /proc/self/mounts && break; sleep 0.1; done
grep -q " $work/fs " /proc/self/mounts

echo "== data written before: the volume (fio, crc32c) and 64 MiB of files"
verify=(--name=day --ioengine=nbd --uri="$uri" --rw=randwrite --bs=16k --iodepth=16
        --size=96M --verify=crc32c --verify_fatal=1 --randseed=71)
fio "${verify[@]}" --output=/dev/null
head -c 64M /dev/urandom > "$work/fs/before.bin"
sha256sum "$work/fs/before.bin" > "$work/sums"

echo "== the disk becomes a mirror"
"$bin" attach -w --size 512M day "$work/d0.img" "$work/d1.img"

echo "== the pool grows by a second mirror (one side on the XFS that will die) and gets a spare"
"$bin" add --size 512M day mirror "$work/d2.img" "$work/flaky/d3.img"
"$bin" add --size 512M day spare "$work/s0.img"
"$bin" status day

echo "== more data, and d3.img dies under it: its filesystem is shut down"
head -c 64M /dev/urandom > "$work/fs/after-0.bin"
sha256sum "$work/fs/after-0.bin" >> "$work/sums"
xfs_io -x -c shutdown "$work/flaky"
for part in 1 2 3; do
    head -c 64M /dev/urandom > "$work/fs/after-$part.bin"
    sha256sum "$work/fs/after-$part.bin" >> "$work/sums"
done
sync -f "$work/fs/after-3.bin"

echo "== the server faults d3.img and resilvers the spare in its place"
for _ in $(seq 300); do
    in_use=$(field "[s['state'] for s in s.get('spares', [])]")
    settled=$(field "(s.get('resilver') or {}).get('state') != 'resilvering' and not any(c.get('needs_resilver') for v in s['vdevs'] for c in v['children'])")
    if [[ "$in_use" == *"in use"* && "$settled" == "True" ]]; then break; fi
    sleep 0.2
done
"$bin" status day
[[ "$(field "[s['state'] for s in s.get('spares', [])]")" == *"in use"* ]] || {
    echo "the spare did not take d3.img's place"; exit 1; }

echo "== detach the failed device: the spare stays for good"
"$bin" detach day "$work/flaky/d3.img"
[ "$(field "len(s.get('spares', []))")" = 0 ]

echo "== the first mirror retires: a third mirror joins and mirror-0 is removed"
"$bin" add --size 512M day mirror "$work/d4.img" "$work/d5.img"
"$bin" remove -w day mirror-0
[ "$(field "s['removal']['removed'][0]['vdev']")" = indirect-0 ]
[ "$(field "[v['kind'] for v in s['vdevs']]")" = "['indirect', 'mirror', 'mirror']" ]
for old in d0 d1; do
    if head -c 4M "$work/$old.img" | grep -qa IRONLABL; then
        echo "$old.img still carries the pool's label"; exit 1
    fi
done

echo "== a scrub, check, and every byte written before"
"$bin" scrub -w day
"$bin" check day
sha256sum -c "$work/sums"
fio "${verify[@]}" --verify_only --output=/dev/null && echo "the volume verifies"
"$bin" status day
[ "$(field "s['health']")" = ONLINE ]
echo "operator's day: nothing lost"
