#!/usr/bin/env bash
# Writes after `add` of an empty mirror to a full-ish pool, now `ironpool
# bench --suite grow`: 16K random writes QD64 on a volume of a mirror of two
# 2 GiB files with 1.4 GiB written, before and after `ironpool add` of a
# second mirror of two 2 GiB files; the new writes must not collapse onto
# the new vdev (OpenZFS weights metaslab groups by free space). raw-pair
# (two raw files at once, the mirror's physical limit on this one disk) and
# the raw file run the writes twice too, so disk drift shows as drift. The
# notes give each vdev's allocation before the add and after the writes.
#   RT=seconds per test (10); report in OUT (bench-out/grow)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironpool-cli >/dev/null
exec target/release/ironpool bench --suite grow --target ironpool:mirror:2x2G --size 1400M \
    --runtime "${RT:-10}" --out "${OUT:-bench-out/grow}"
