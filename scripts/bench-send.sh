#!/usr/bin/env bash
# Send and receive, now `ironpool bench --suite send`: `send | receive` of a
# 1 GiB volume and of a filesystem holding a 1 GiB file into a copy in the
# same pool, then an incremental stream after 1% of the records changed,
# onto that copy (its size and time against the full one in the notes);
# the raw file's row is a copy of the same bytes with dd, their limit.
#
# Usage: [OUT=DIR] scripts/bench-send.sh [IRONPOOL_BIN]
#   default: target/release/ironpool; report in OUT (target/bench-send)
set -euo pipefail
exec "${1:-$PWD/target/release/ironpool}" bench --suite send --size 1G \
    --out "${OUT:-target/bench-send}"
