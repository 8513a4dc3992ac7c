#!/usr/bin/env bash
# The engine's poll window (IRONPOOL_POLL_US, see rt/uring.rs) against
# sleeping at once, now `ironpool bench --suite poll`: for each setting, a
# filesystem and a volume served with it (target property poll_us=N;
# "default" leaves it unset): creates, stats and deletes of 20,000 files,
# 16K random writes at QD1 and QD64, 4K random reads at QD64 and QD1, 16K
# writes with a flush after each at QD1, and the server's CPU while idle.
#
# Usage: [OUT=DIR] scripts/bench-poll.sh [RUNTIME_S] [SETTING...]
#   SETTING: microseconds, or "default"; default: 4 s, "0 default 0
#   default" (alternated: the disk drifts); report in OUT (target/bench-poll)
set -euo pipefail
runtime=${1:-4}
shift || true
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(0 default 0 default)
targets=()
for setting in "${settings[@]}"; do
    poll=""
    [ "$setting" = default ] || poll="poll_us=$setting,"
    targets+=(--target "ironpool-fs:mirror:2x4G:${poll}recordsize=16K"
        --target "ironpool:mirror:2x4G${poll:+:${poll%,}}")
done
exec "$PWD/target/release/ironpool" bench --suite poll "${targets[@]}" --size 512M \
    --files 20000 --runtime "$runtime" --out "${OUT:-target/bench-poll}"
