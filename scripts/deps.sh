#!/usr/bin/env bash
# Installs what ironpool's demo and tests use, on Debian: the NBD clients (fio,
# qemu-io, nbdinfo), nbdkit (the transport baseline), xfsprogs and build tools.
set -euo pipefail
need=()
command -v fio >/dev/null || need+=(fio)
command -v qemu-io >/dev/null || need+=(qemu-utils)
command -v nbdinfo >/dev/null || need+=(libnbd-bin)
command -v nbdkit >/dev/null || need+=(nbdkit)
# mkfs.xfs: a test fills a small loop-mounted host filesystem under the pool.
command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
command -v cc >/dev/null || need+=(build-essential)
# The operations tests: promtool and a Prometheus server scrape the metrics
# endpoint; systemd-analyze verifies the unit (systemd itself need not run).
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v python3 >/dev/null || need+=(python3)
# The filesystem tests run real applications on a mounted filesystem.
command -v sqlite3 >/dev/null || need+=(sqlite3)
# The compatibility test unpacks a pool made by an older build (tar -J).
command -v xz >/dev/null || need+=(xz-utils)
command -v git >/dev/null || need+=(git)
# The POSIX ACL test sets and reads ACLs with the acl tools; the file-flag
# test uses chattr and lsattr.
command -v setfacl >/dev/null || need+=(acl)
command -v chattr >/dev/null || need+=(e2fsprogs)
# The kill -9 after FLUSH/FUA tests drive a volume at queue depth 64 with
# libnbd's Python binding (Debian's own python3, whatever else is on PATH).
/usr/bin/python3 -c "import nbd" 2>/dev/null || need+=(python3-libnbd)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "cargo is required: install Rust (https://rustup.rs)" >&2; exit 1; }
# The POSIX conformance suite, run on a mounted filesystem by the tests.
command -v pjdfstest >/dev/null || cargo install --quiet --locked pjdfstest
# test.sh checks formatting and lints before it builds.
for component in rustfmt clippy; do
    cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$component"
done
