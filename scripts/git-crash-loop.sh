#!/usr/bin/env bash
# Kills the server under a git repository, over and over, and checks the
# repository with `git fsck` after each restart (issue 74).
#
# One pool (a mirror of two files, created by the first round and kept, so
# the host filesystem has allocated its files after the first round); each
# round a new filesystem mounted by `serve`, then on it, in order:
#   1. fio direct=1 writes to a file (a fill, then random 16K writes at QD64
#      and at QD1);
#   2. sqlite3: a WAL database, ten transactions of 500 rows;
#   3. cp -a /usr/share/doc into the filesystem;
#   4. git init, cp -a /usr/share/doc/bash ., git add -A, git commit, git gc;
#   5. a file written, fsynced, renamed, its directory fsynced; sync -f;
#   6. kill -9 of the server, the mount taken down, serve started again.
# Every other round (MODE=mixed, the default) kills the server at a random
# moment during step 4 instead, while git runs. MODE=end or MODE=during
# keeps to one of the two.
#
# After the restart: `git fsck --full` in the repository, the sqlite
# database's integrity check and row count, the renamed file's contents.
# A round that fails keeps its evidence under $WORK/failed-N: git fsck's
# output, the server's log and events, listings of .git before the kill and
# after the restart (with sizes and checksums of every file), and stops the
# loop.
#
# Usage: scripts/git-crash-loop.sh [ROUNDS]   (default 50)
# Environment: IRONPOOL_BIN (default target/release/ironpool), WORK (default
# /tmp/ironpool-git-crash), FIO_SIZE (default 1G), FIO_SECONDS (default 8),
# POOL_SIZE (default 4G), MODE (mixed|end|during), SKIP_FIO=1, SKIP_DOC=1,
# FRESH_POOL=1 (a new pool of new sparse files every round).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
bin=${IRONPOOL_BIN:-$PWD/target/release/ironpool}
work=${WORK:-/tmp/ironpool-git-crash}
fio_size=${FIO_SIZE:-1G}
fio_seconds=${FIO_SECONDS:-8}
pool_size=${POOL_SIZE:-4G}
mode=${MODE:-mixed}
[ -x "$bin" ] || { echo "no ironpool binary at $bin (cargo build --release -p ironpool-cli)" >&2; exit 1; }
for tool in fio sqlite3 git python3; do
    command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps.sh)" >&2; exit 1; }
done

export IRONPOOL_CACHE="$work/pools.json" IRONPOOL_RUN_DIR="$work/run"
mnt="$work/mnt"
pidfile="$work/pid"
log="$work/serve.log"

server_pid() { cat "$pidfile" 2>/dev/null || true; }

filesystems() {
    "$bin" list --json -t filesystem gc 2>/dev/null \
        | python3 -c 'import json, sys; [print(f["name"]) for f in json.load(sys.stdin)["datasets"]]' 2>/dev/null || true
}

stop_server() {
    local pid
    pid=$(server_pid)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
    if grep -q " $mnt fuse" /proc/self/mounts; then umount -l "$mnt" || true; fi
}
trap stop_server EXIT

start_server() {
    rm -f "$pidfile"
    setsid -f "$bin" serve -d "$work/disks" --pidfile "$pidfile" gc >>"$log" 2>&1
    for _ in $(seq 300); do
        if [ -f "$pidfile" ] && [ -S "$work/run/gc.ctl" ]; then
            # A round's filesystem, once there is one, is mounted too.
            [ -n "$(filesystems)" ] || return 0
            grep -q " $mnt fuse" /proc/self/mounts && return 0
        fi
        sleep 0.05
    done
    echo "the server did not start and mount:" >&2
    tail -20 "$log" >&2
    return 1
}

kill_server() {
    local pid
    pid=$(server_pid)
    kill -9 "$pid"
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    umount -l "$mnt" 2>/dev/null || true
}

# Every file under .git with its size and checksum (what a listing can say of
# a state); directories too.
listing() {
    (cd "$1" && find .git -printf '%y %s %p\n' 2>&1 | sort -k3 | while read -r kind size path; do
        if [ "$kind" = f ]; then
            echo "$kind $size $path $(cksum <"$path" 2>&1 | cut -d' ' -f1)"
        else
            echo "$kind $size $path"
        fi
    done)
}

fsync_rename() {
    python3 - "$1" <<'EOF'
import os, sys
d = sys.argv[1]
tmp, final = os.path.join(d, "renamed.tmp"), os.path.join(d, "renamed")
with open(tmp, "wb") as f:
    f.write(b"renamed file, fsynced before its rename\n" * 100)
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, final)
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(fd)
os.close(fd)
EOF
}

git_steps() {
    local repo=$1
    mkdir -p "$repo"
    cd "$repo"
    git init -q .
    git config user.email crash@ironpool.test
    git config user.name crash
    cp -a /usr/share/doc/bash .
    git add -A
    git commit -q -m "bash docs"
    git gc -q
    cd - >/dev/null
}

round() {
    local n=$1 during=$2
    mkdir -p "$mnt"
    : >"$log"
    if [ -n "${FRESH_POOL:-}" ] && [ -f "$work/disks/a.img" ]; then
        # A new pool of new sparse files each round: first writes are slow
        # while the host allocates, so more is in flight at the kill.
        stop_server
        rm -rf "$work/disks" "$work/run" "$work/pools.json"
    fi
    if [ ! -f "$work/disks/a.img" ]; then
        mkdir -p "$work/disks"
        "$bin" create --size "$pool_size" gc mirror "$work/disks/a.img" "$work/disks/b.img" >/dev/null
    fi
    # The server the last round restarted serves this one.
    local pid
    pid=$(server_pid)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then start_server; fi
    # The last round's filesystem goes; this round's is new.
    local old
    for old in $(filesystems); do
        "$bin" destroy -r "$old" >/dev/null
    done
    "$bin" fs create "gc/r$n" -o mountpoint="$mnt" >/dev/null
    for _ in $(seq 300); do grep -q " $mnt fuse" /proc/self/mounts && break; sleep 0.05; done
    if [ -z "${SKIP_FIO:-}" ]; then
        fio --name=fill --filename="$mnt/fio.dat" --ioengine=io_uring --direct=1 --rw=write \
            --bs=1M --iodepth=16 --size="$fio_size" >/dev/null
        for depth in 64 1; do
            fio --name=rw$depth --filename="$mnt/fio.dat" --ioengine=io_uring --direct=1 \
                --rw=randwrite --bs=16k --iodepth=$depth --size="$fio_size" \
                --runtime="$fio_seconds" --time_based >/dev/null
        done
    fi
    sqlite3 "$mnt/db.sqlite" "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);" >/dev/null
    for t in $(seq 10); do
        sqlite3 "$mnt/db.sqlite" "BEGIN; WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<500) INSERT INTO t(v) SELECT 'row $t ' || x FROM c; COMMIT;"
    done
    if [ -z "${SKIP_DOC:-}" ]; then
        cp -a /usr/share/doc "$mnt/doc"
    fi
    local killed_during=""
    if [ "$during" = 1 ]; then
        # Killed at a random moment of git's work: 0.2 to 3 s into it.
        local delay
        delay=$(python3 -c "import random; print(round(random.uniform(0.2, 3.0), 2))")
        (git_steps "$mnt/repo" >/dev/null 2>&1 || true) &
        local git_pid=$!
        sleep "$delay"
        listing "$mnt/repo" >"$work/before.txt" 2>&1 || true
        kill_server
        wait "$git_pid" || true
        killed_during="after ${delay}s of git"
    else
        git_steps "$mnt/repo"
        fsync_rename "$mnt"
        sync -f "$mnt"
        listing "$mnt/repo" >"$work/before.txt"
        kill_server
    fi
    "$bin" events gc -d "$work/disks" >"$work/events-before.txt" 2>&1 || true
    start_server
    local failed=""
    local fsck_out="$work/fsck.txt"
    # A repository whose `git init` was cut short (no HEAD yet) is no
    # repository: a legal prefix that git fsck cannot check.
    if [ -f "$mnt/repo/.git/HEAD" ]; then
        if ! (cd "$mnt/repo" && git fsck --full) >"$fsck_out" 2>&1; then
            failed="git fsck failed"
        fi
    else
        echo "no repository (killed before git init ended)" >"$fsck_out"
    fi
    local rows
    if ! rows=$(sqlite3 "$mnt/db.sqlite" "PRAGMA integrity_check; SELECT count(*) FROM t;" 2>&1) \
        || [ "$rows" != "$(printf 'ok\n5000')" ]; then
        failed="$failed sqlite: $rows"
    fi
    if [ "$during" != 1 ] && ! grep -q "fsynced before its rename" "$mnt/renamed" 2>/dev/null; then
        failed="$failed the renamed file is not whole"
    fi
    if [ -n "$failed" ]; then
        local keep="$work/failed-$n"
        rm -rf "$keep"; mkdir -p "$keep"
        cp "$fsck_out" "$work/before.txt" "$log" "$work/events-before.txt" "$keep/"
        listing "$mnt/repo" >"$keep/after.txt" 2>&1 || true
        "$bin" events gc >"$keep/events-after.txt" 2>&1 || true
        "$bin" status gc >"$keep/status.txt" 2>&1 || true
        echo "round $n ${killed_during:-killed after sync}: FAILED ($failed); evidence in $keep"
        cat "$fsck_out"
        return 1
    fi
    echo "round $n ${killed_during:-killed after sync}: git fsck clean ($(grep -c . "$fsck_out" || true) lines), sqlite ok, rename ok"
}

mkdir -p "$work"
started=$(date +%s)
for n in $(seq "$rounds"); do
    case "$mode" in
        end) during=0 ;;
        during) during=1 ;;
        *) during=$((n % 2 == 0 ? 1 : 0)) ;;
    esac
    round "$n" "$during"
done
echo "$rounds rounds, no failure, in $(( $(date +%s) - started )) s"
