#!/usr/bin/env bash
# The demo: builds ironpool, creates a mirrored pool of two sparse files under
# ./demo, creates a volume and a filesystem, serves them (NBD and a FUSE mount
# at ./demo/fs), and has real clients use them: nbdinfo shows the export,
# qemu-io writes and verifies patterns, fio runs a verified random-write load
# at queue depth 64 and a short throughput run on the volume, then a verified
# O_DIRECT io_uring run at queue depth 64 on a file of the filesystem, whose
# snapshot is then read back verified under .zfs/snapshot after the file was
# overwritten, and sent and received as a new filesystem, compared.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release -p ironpool-cli
bin="$PWD/target/release/ironpool"
demo="$PWD/demo"
# Keep the demo's state (pool cache, control socket) inside ./demo.
export IRONPOOL_CACHE="$demo/pools.json" IRONPOOL_RUN_DIR="$demo/run"
if [ -f "$demo/pid" ] && kill -0 "$(cat "$demo/pid")" 2>/dev/null; then
    kill -TERM "$(cat "$demo/pid")"; sleep 1
fi
# A mount left by an earlier run whose server was killed.
for mount in fs copy; do
    if grep -q " $demo/$mount fuse.ironpool" /proc/self/mounts; then umount -l "$demo/$mount"; fi
done
rm -rf "$demo"; mkdir -p "$demo"
socket="$demo/nbd.sock"
uri="nbd+unix:///demo/vol?socket=$socket"

echo "== create a mirrored pool of two 4 GiB sparse files, a 2 GiB volume and a filesystem"
"$bin" create --size 4G demo mirror "$demo/disk0.img" "$demo/disk1.img"
"$bin" volume create demo/vol 2G -o volblocksize=16K -d "$demo"
"$bin" fs create demo/fs -o mountpoint="$demo/fs" -o recordsize=16K -d "$demo"

echo "== serve it over NBD"
setsid -f "$bin" serve -d "$demo" --nbd "unix:$socket" --pidfile "$demo/pid" demo 2>"$demo/serve.log"
for _ in $(seq 100); do [ -f "$demo/pid" ] && break; sleep 0.1; done
[ -f "$demo/pid" ] || { cat "$demo/serve.log"; exit 1; }
cat "$demo/serve.log"
trap 'kill -TERM "$(cat "$demo/pid" 2>/dev/null)" 2>/dev/null || true' EXIT

echo "== nbdinfo"
nbdinfo "$uri"

echo "== qemu-io: write patterns, flush, read them back"
qemu-io -f raw "$uri" -c 'write -P 0xab 0 1M' -c 'write -P 0xcd 1M 4k' -c flush -c 'read -P 0xab 0 1M' -c 'read -P 0xcd 1M 4k'

echo "== fio: 16K random writes at queue depth 64 with crc32c verification"
fio --name=verify --ioengine=nbd --uri="$uri" --rw=randwrite --bs=16k --iodepth=64 \
    --size=256M --verify=crc32c --verify_fatal=1 --group_reporting | grep -E "IOPS|err="

echo "== fio: 10 s of 16K random writes at queue depth 64"
fio --name=randwrite --ioengine=nbd --uri="$uri" --rw=randwrite --bs=16k --iodepth=64 \
    --size=2G --runtime=10 --time_based --group_reporting | grep -E "IOPS|lat \(usec\): min"

echo "== the filesystem, mounted over FUSE by the server at $demo/fs"
for _ in $(seq 100); do grep -q " $demo/fs fuse.ironpool" /proc/self/mounts && break; sleep 0.1; done
grep " $demo/fs " /proc/self/mounts
mkdir -p "$demo/fs/docs" && cp -r /etc/apt "$demo/fs/docs/" && diff -r /etc/apt "$demo/fs/docs/apt" && echo "copied /etc/apt and compared: equal"
"$bin" fs list demo

echo "== fio on a file of the filesystem: io_uring, O_DIRECT, queue depth 64, crc32c verification"
fio --name=fsverify --filename="$demo/fs/fio.dat" --ioengine=io_uring --direct=1 --rw=randwrite \
    --bs=16k --iodepth=64 --size=128M --verify=crc32c --verify_fatal=1 | grep -E "IOPS|err="

echo "== a snapshot of the filesystem, read back under .zfs/snapshot"
"$bin" snapshot demo/fs@demo
echo "overwritten after the snapshot" > "$demo/fs/fio.dat"
ls "$demo/fs/.zfs/snapshot"
fio --name=fsverify --filename="$demo/fs/.zfs/snapshot/demo/fio.dat" --ioengine=io_uring \
    --direct=1 --rw=randread --bs=16k --iodepth=64 --size=128M --verify=crc32c \
    --verify_fatal=1 --readonly | grep -E "IOPS|err="
"$bin" list -t snapshot demo

echo "== the snapshot sent and received as a new filesystem, compared"
"$bin" send demo/fs@demo | "$bin" receive -o mountpoint="$demo/copy" -o atime=off demo/copy
for _ in $(seq 100); do grep -q " $demo/copy fuse.ironpool" /proc/self/mounts && break; sleep 0.1; done
cmp "$demo/fs/.zfs/snapshot/demo/fio.dat" "$demo/copy/fio.dat" && echo "demo/copy/fio.dat is identical to demo/fs@demo's"

echo "== pool status and device statistics"
"$bin" status demo
"$bin" iostat -q demo

echo "== what happened to the pool (events) while it is served"
"$bin" events demo

echo "== stop the server (SIGTERM: finish requests, commit, export)"
kill -TERM "$(cat "$demo/pid")"
for _ in $(seq 100); do [ -f "$demo/pid" ] || break; sleep 0.1; done
trap - EXIT
tail -2 "$demo/serve.log"
"$bin" check demo -d "$demo"
echo "== the commands that changed it, from the pool itself"
"$bin" history demo -d "$demo"
echo "demo done: the pool's files are in $demo"
