#!/usr/bin/env bash
# Send and receive of a filesystem, in one run, against same-run baselines:
# - 1 GiB in one file: `send | receive` of the filesystem's snapshot against
#   the same of a volume holding the same bytes (MiB/s, and the ratio);
# - FILES files of 4 KiB in 20 directories: `send | receive` of the snapshot
#   against copying the same tree through the mount with `tar c | tar x`
#   (files per second, and the ratio);
# - an incremental stream after 1% of those files changed: its size and time
#   against the full stream's (atime=off: the tar read changes nothing).
# Needs root, /dev/fuse, fio and a release build.
#
# Usage: scripts/bench-send.sh [FILES] [IRONPOOL_BIN]
#   default: 20000 files, target/release/ironpool
set -euo pipefail
files=${1:-20000}
bin=${2:-$PWD/target/release/ironpool}
source "$(dirname "$0")/bench-lib.sh"
bench_start bench-send "$bin"
bench_serve sendb 8G
"$bin" fs create sendb/fs -o "mountpoint=$work/mnt" >/dev/null
"$bin" fs create sendb/small -o "mountpoint=$work/small" -o atime=off >/dev/null
"$bin" volume create sendb/vol 1G >/dev/null
grep -q " $work/mnt fuse.ironpool" /proc/self/mounts || { echo "bench-send: not mounted: $(cat "$work/serve.log")" >&2; exit 1; }

# The same 1 GiB of incompressible bytes in a file and in the volume.
head -c 1G /dev/urandom >"$work/data"
dd if="$work/data" of="$work/mnt/file" bs=1M oflag=direct status=none
qemu-img convert -n -f raw -O raw "$work/data" "nbd+unix:///sendb/vol?socket=$work/nbd.sock"
rm -f "$work/data"
"$bin" snapshot sendb/fs@a sendb/vol@a >/dev/null

seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$@"; }
# timed COMMAND...: runs it through bash, prints the seconds it took.
timed() {
    local start
    start=$(date +%s.%N)
    bash -c "set -o pipefail; $*" >/dev/null
    seconds "$start" "$(date +%s.%N)"
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$@"; }
rate() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.0f}')" "$@"; }

echo "# bench-send $(date -u +%FT%TZ) files=$files $(git rev-parse --short HEAD) $(uname -r)"
vol_s=$(timed "'$bin' send sendb/vol@a | '$bin' receive sendb/volcopy")
fs_s=$(timed "'$bin' send sendb/fs@a | '$bin' receive -o mountpoint=$work/fscopy sendb/fscopy")
printf "%-34s %10s %10s %7s\n" test volume filesystem ratio
printf "%-34s %10s %10s %7s\n" "1 GiB send|receive MiB/s" "$(rate 1024 "$vol_s")" \
    "$(rate 1024 "$fs_s")" "$(ratio "$vol_s" "$fs_s")"
"$bin" destroy -r sendb/volcopy >/dev/null
"$bin" destroy -r sendb/fscopy >/dev/null

python3 - "$work/small" "$files" <<'PY'
import os, sys
root, count = sys.argv[1], int(sys.argv[2])
block = os.urandom(4096)
for index in range(count):
    directory = os.path.join(root, f"d{index % 20}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"f{index}"), "wb") as out:
        out.write(block[index % 64:] + block[:index % 64])
PY
"$bin" snapshot sendb/small@a >/dev/null
mkdir "$work/mnt/tarcopy"
tar_s=$(timed "tar -C '$work/small' -cf - . | tar -C '$work/mnt/tarcopy' -xf -")
full_bytes=$("$bin" send sendb/small@a | wc -c)
recv_s=$(timed "'$bin' send sendb/small@a | '$bin' receive -o mountpoint=$work/smallcopy sendb/smallcopy")
printf "%-34s %10s %10s %7s\n" test "tar|tar" send\|recv ratio
printf "%-34s %10s %10s %7s\n" "$files files of 4 KiB, files/s" "$(rate "$files" "$tar_s")" \
    "$(rate "$files" "$recv_s")" "$(ratio "$tar_s" "$recv_s")"

# 1% of the files change; the incremental stream against the full one.
python3 - "$work/small" "$files" <<'PY'
import os, sys
root, count = sys.argv[1], int(sys.argv[2])
for index in range(0, count, 100):
    with open(os.path.join(root, f"d{index % 20}", f"f{index}"), "r+b") as out:
        out.write(b"changed")
PY
"$bin" snapshot sendb/small@b >/dev/null
incremental_bytes=$("$bin" send -i @a sendb/small@b | wc -c)
full_send_s=$(timed "'$bin' send sendb/small@b > /dev/null")
incremental_s=$(timed "'$bin' send -i @a sendb/small@b > /dev/null")
printf "%-34s %10s %10s %7s\n" "1% changed: stream bytes" "$full_bytes" "$incremental_bytes" \
    "$(ratio "$incremental_bytes" "$full_bytes")"
printf "%-34s %10s %10s %7s\n" "1% changed: send seconds" "$full_send_s" "$incremental_s" \
    "$(ratio "$incremental_s" "$full_send_s")"
"$bin" export sendb >/dev/null
server=""
