#!/usr/bin/env bash
# Send and receive, now `ironpool bench --suite send`: `send | receive` of a
# 1 GiB volume and of a filesystem holding a 1 GiB file into a copy in the
# same pool, then an incremental stream after 1% of the records changed,
# onto that copy (its size and time against the full one in the notes);
# the raw file's row is a copy of the same bytes with dd, their limit.
# Then FILES files of 4 KiB: copied with tar through the mount, and sent
# as a stream (files per second, held to tar).
#
# Usage: [OUT=DIR] scripts/bench-send.sh [FILES] [IRONPOOL_BIN]
#   default: 20000 files, target/release/ironpool; report in OUT
#   (target/bench-send)
set -euo pipefail
exec "${2:-$PWD/target/release/ironpool}" bench --suite send --size 1G --files "${1:-20000}" \
    --out "${OUT:-target/bench-send}"
