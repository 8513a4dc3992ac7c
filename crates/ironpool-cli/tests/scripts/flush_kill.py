#!/usr/bin/python3
"""Durability under a deep queue, through libnbd (python3-libnbd).

write URI LOG FIRST COUNT
    Writes blocks FIRST..FIRST+COUNT of 16 KiB, each once, in a shuffled
    order, keeping 64 commands in flight: one write in 16 carries FUA and a
    FLUSH follows every 32 writes. Whenever a command makes writes durable (a
    FUA write that completed; a FLUSH that completed, for every write that had
    completed before it was sent, as the NBD spec defines) their block numbers
    are appended to LOG at once. Ends when every block is written or the
    server goes away (the test kills it with SIGKILL): prints what it did.

verify URI LOG
    Reads back every block LOG names and exits 1 naming those that do not
    hold their data.
"""

import hashlib
import random
import sys

import nbd

BLOCK = 16384
DEPTH = 64
FLUSH_EVERY = 32
FUA_EVERY = 16


def data_of(block):
    """The 16 KiB a block holds: distinct for every block number."""
    seed = hashlib.blake2b(block.to_bytes(8, "little"), digest_size=64).digest()
    return seed * (BLOCK // len(seed))


def write(uri, log_path, first, count):
    handle = nbd.NBD()
    handle.connect_uri(uri)
    order = list(range(first, first + count))
    random.Random(first).shuffle(order)
    log = open(log_path, "a", buffering=1)
    # cookie -> ("write", block, fua) or ("flush", blocks it makes durable)
    inflight = {}
    completed = []  # writes completed and not yet covered by a FLUSH sent
    issued = durable = 0
    try:
        while order or inflight:
            while order and len(inflight) < DEPTH:
                block = order.pop()
                fua = issued % FUA_EVERY == FUA_EVERY - 1
                flags = nbd.CMD_FLAG_FUA if fua else 0
                cookie = handle.aio_pwrite(data_of(block), block * BLOCK, flags=flags)
                inflight[cookie] = ("write", block, fua)
                issued += 1
                if issued % FLUSH_EVERY == 0:
                    # (One over DEPTH at most: the FLUSH follows its writes.)
                    cookie = handle.aio_flush()
                    inflight[cookie] = ("flush", completed)
                    completed = []
            handle.poll(-1)
            while handle.aio_in_flight() > 0 or inflight:
                cookie = handle.aio_peek_command_completed()
                if cookie == 0:
                    break
                entry = inflight.pop(cookie)
                handle.aio_command_completed(cookie)  # raises if it failed
                if entry[0] == "write":
                    if entry[2]:
                        log.write(f"{entry[1]}\n")
                        durable += 1
                    else:
                        completed.append(entry[1])
                else:
                    for block in entry[1]:
                        log.write(f"{block}\n")
                    durable += len(entry[1])
    except nbd.Error as error:
        print(f"server gone after {issued} writes, {durable} durable: {error}")
        return 0
    handle.flush()
    for block in completed:
        log.write(f"{block}\n")
    durable += len(completed)
    handle.shutdown()
    print(f"all {issued} writes done, {durable} durable")
    return 0


def verify(uri, log_path):
    handle = nbd.NBD()
    handle.connect_uri(uri)
    blocks = sorted({int(line) for line in open(log_path) if line.strip()})
    lost = [block for block in blocks if handle.pread(BLOCK, block * BLOCK) != data_of(block)]
    handle.shutdown()
    if lost:
        print(f"{len(lost)} of {len(blocks)} durable blocks lost: {lost[:20]}")
        return 1
    print(f"{len(blocks)} durable blocks intact")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        sys.exit(write(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    sys.exit(verify(sys.argv[2], sys.argv[3]))
