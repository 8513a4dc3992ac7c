#!/usr/bin/python3
"""Held and written-through writes racing for a pool's last space, through
libnbd (python3-libnbd).

full_pool.py URI ROOM_MIB

    Fills the upper half of the volume with 1 MiB writes, one at a time,
    until ENOSPC, and FLUSHes; discards ROOM_MIB at the start of that half
    and FLUSHes, leaving that much room. Then keeps 48 writes in flight:
    16 writes of 64 KiB (small enough to be held for write-back) over the
    lower half, then one of 1 MiB (written through) into the freed room,
    round after round until a write gets ENOSPC. Every write may succeed
    or get ENOSPC (any other error fails); then the FLUSH must succeed and
    every write that succeeded must read back: a write acknowledged is
    never lost to one that took its space. Exits 1 naming what failed.
"""

import errno
import sys

import nbd

SMALL = 64 << 10
BIG = 1 << 20
SMALL_PER_BIG = 16
DEPTH = 48


def main():
    uri, room = sys.argv[1], int(sys.argv[2]) << 20
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    half = size // 2
    end = half
    while end + BIG <= size:
        try:
            h.pwrite(bytes([7]) * BIG, end)
        except nbd.Error as error:
            if error.errnum != errno.ENOSPC:
                raise
            break
        end += BIG
    h.flush()
    if end - half < 2 * room:
        sys.exit(f"the pool took {(end - half) >> 20} MiB before ENOSPC: too little to fill")
    h.trim(room, half)
    h.flush()

    acked = {}
    failed = {"enospc": 0, "other": []}

    def done(offset, length, seed, error):
        if error.value == 0:
            acked[offset] = (length, seed)
        elif error.value == errno.ENOSPC:
            failed["enospc"] += 1
        else:
            failed["other"].append((offset, error.value))
        return 0

    def write(offset, length, seed):
        buffer = nbd.Buffer.from_bytearray(bytearray([seed]) * length)
        h.aio_pwrite(buffer, offset,
                     completion=lambda error: done(offset, length, seed, error))

    small, big, round_ = 0, half, 0
    while failed["enospc"] == 0 and not failed["other"] and big + BIG <= half + room:
        for k in range(SMALL_PER_BIG):
            write(small, SMALL, (round_ * SMALL_PER_BIG + k) % 251 + 1)
            small = (small + SMALL) % half
        write(big, BIG, round_ % 251 + 1)
        big += BIG
        round_ += 1
        while h.aio_in_flight() > DEPTH:
            h.poll(-1)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    if failed["other"]:
        sys.exit(f"writes failed with other errors than ENOSPC: {failed['other'][:5]}")
    if failed["enospc"] == 0:
        sys.exit(f"no write got ENOSPC in {room >> 20} MiB of room")
    try:
        h.flush()
    except nbd.Error as error:
        sys.exit(f"FLUSH after ENOSPC failed ({error}): acknowledged writes were not stored")
    bad = [offset for offset, (length, seed) in sorted(acked.items())
           if h.pread(length, offset) != bytes([seed]) * length]
    if bad:
        sys.exit(f"{len(bad)} acknowledged writes read back wrong, the first at {bad[0]}")
    print(f"{len(acked)} writes acknowledged, {failed['enospc']} got ENOSPC")


main()
