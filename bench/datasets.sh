#!/usr/bin/env bash
# Datasets under load and replication, now `ironpool bench --suite datasets
# --suite send` on a volume and a filesystem of a mirror beside the raw file:
#   1. 16K randwrite QD64 over 256 MiB with a snapshot every 2 s, held to the
#      same writes without (the notes give the snapshot command's median and
#      longest time);
#   2. `send | receive` of the 1 GiB working set and an incremental stream,
#      held to dd copying the same bytes on the raw file (the send suite);
#   3. 16K randwrite QD64 with compression=lz4 held to compression=off, on
#      random data and on data that compresses to 60% (`dev write amp` shows
#      what lz4 saved on the devices).
#   RT=seconds per test (10); report in OUT (bench-out/datasets)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironpool-cli >/dev/null
exec target/release/ironpool bench --suite datasets --suite send --size 1G \
    --runtime "${RT:-10}" --out "${OUT:-bench-out/datasets}"
