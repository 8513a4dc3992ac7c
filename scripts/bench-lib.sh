# Shared by the filesystem benchmarks (sourced, not run): a work directory
# under target/ removed at exit, and a pool of two mirrored files served
# from it, whose server is stopped at exit.
#
#   bench_start NAME BIN      checks root and BIN, makes $work, sets the
#                             IRONPOOL_* variables, arms the cleanup
#   bench_serve POOL SIZE     creates POOL (a mirror of two files of SIZE)
#                             in $work and serves it: control socket
#                             $work/ctl.sock, NBD at $work/nbd.sock

bench_start() {
    bench_name=$1
    bin=$2
    [ "$(id -u)" -eq 0 ] || { echo "$bench_name: run as root (FUSE mounts)" >&2; exit 1; }
    [ -x "$bin" ] || { echo "$bench_name: build first: cargo build --release --workspace --bins" >&2; exit 1; }
    work=$(mktemp -d "$PWD/target/$bench_name.XXXXXX")
    server=""
    trap bench_cleanup EXIT
    export IRONPOOL_CONTROL=$work/ctl.sock IRONPOOL_RUN_DIR=$work/run IRONPOOL_CACHE=$work/pools.json
}

bench_cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && sleep 2
    rm -rf "$work"
}

bench_serve() {
    "$bin" create --size "$2" -f "$1" mirror "$work/d0.img" "$work/d1.img" >/dev/null
    "$bin" serve -d "$work" --nbd "unix:$work/nbd.sock" --control "$work/ctl.sock" \
        "$1" >"$work/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do [ -S "$work/ctl.sock" ] && break; sleep 0.1; done
}
