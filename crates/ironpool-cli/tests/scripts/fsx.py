#!/usr/bin/python3
"""Random I/O on one file of a mounted filesystem, checked against a model.

fsx.py FILE SEED OPS MAX_BYTES [IRONPOOL CONTROL_SOCKET DATASET]

    Creates FILE and runs OPS operations chosen by SEED, keeping the bytes
    the file must hold in memory (the model), in the manner of xfstests'
    fsx: buffered writes (random bytes and runs of one byte, which compress),
    O_DIRECT writes and reads of whole pages through a page-aligned buffer,
    buffered reads, truncates up and down, writes through a shared mmap (with
    and without msync), copy_file_range within the file, fsync through either
    descriptor, close and reopen, and dropping the file's cached pages. Every
    read is compared with the model and the size is checked after every
    operation, so buffered, direct and mapped I/O must agree on one file
    whatever the record size. The file never grows past MAX_BYTES.

    Given the ironpool binary, the server's control socket and the dataset
    FILE is in (FILE in the root of its mount), it also takes snapshots at
    random points and reads the file back from the snapshot directory
    (`.zfs/snapshot/NAME/`): it must hold what the model held then, every
    write that returned before the snapshot and none after it.

    At the end it fsyncs the file, reads it whole once more and prints
    "ok SEED SIZE SHA256" (the model's digest, for a check after the
    server restarts). On a mismatch it prints the operation, the first byte
    that differs and the last 30 operations, and exits 1.
"""

import hashlib
import mmap
import os
import random
import subprocess
import sys

# Largest buffered read or write, copy or mapped write: large enough to
# span many records of every record size, small enough for a quick run.
SPAN_MAX = 256 << 10
# Largest O_DIRECT request, in pages (256 KiB).
DIRECT_PAGES_MAX = 64
PAGE = 4096
# Operations kept for the report of a failure.
HISTORY = 30


def main():
    path, seed, ops, max_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    snapshots = sys.argv[5:8] if len(sys.argv) >= 8 else None
    rng = random.Random(seed)
    model = bytearray()
    history = []

    def fail(message):
        print(f"FAIL {path} seed {seed}: {message}")
        for line in history[-HISTORY:]:
            print("   ", line)
        sys.exit(1)

    def check(offset, data, what):
        expected = bytes(model[offset:offset + len(data)])
        if data == expected:
            return
        at = next(i for i in range(len(data)) if i >= len(expected) or data[i] != expected[i])
        fail(f"{what} of {len(data)} bytes at {offset}: byte {offset + at} is "
             f"{data[at:at + 8].hex()}, the model has {expected[at:at + 8].hex()}"
             f" (model size {len(model)})")

    def store(offset, data):
        if offset > len(model):
            model.extend(bytes(offset - len(model)))
        model[offset:offset + len(data)] = data

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    direct = os.open(path, os.O_RDWR | os.O_DIRECT)
    # Anonymous memory is page-aligned, as O_DIRECT wants its buffer.
    aligned = mmap.mmap(-1, DIRECT_PAGES_MAX * PAGE)
    kinds = ["write", "write", "dwrite", "dwrite", "read", "dread", "truncate",
             "mwrite", "fsync", "reopen", "drop", "copy"] + (["snapshot"] if snapshots else [])
    taken = 0
    for n in range(ops):
        kind = rng.choice(kinds)
        size = len(model)
        if kind == "write":
            offset = rng.randrange(0, max_bytes - 1)
            length = rng.randrange(1, min(SPAN_MAX, max_bytes - offset) + 1)
            if rng.random() < 0.3:
                data = bytes([rng.randrange(1, 256)]) * length
            else:
                data = rng.randbytes(length)
            history.append(f"{n} write {length} at {offset}")
            if os.pwrite(fd, data, offset) != length:
                fail("short buffered write")
            store(offset, data)
        elif kind == "dwrite":
            pages = rng.randrange(1, DIRECT_PAGES_MAX + 1)
            offset = rng.randrange(0, max_bytes // PAGE - pages + 1) * PAGE
            data = rng.randbytes(pages * PAGE)
            aligned[0:len(data)] = data
            history.append(f"{n} direct write {len(data)} at {offset}")
            if os.pwritev(direct, [memoryview(aligned)[0:len(data)]], offset) != len(data):
                fail("short direct write")
            store(offset, data)
        elif kind == "read" and size:
            offset = rng.randrange(0, size)
            length = rng.randrange(1, SPAN_MAX + 1)
            history.append(f"{n} read {length} at {offset}")
            check(offset, os.pread(fd, length, offset), "buffered read")
        elif kind == "dread" and size:
            offset = rng.randrange(0, (size + PAGE - 1) // PAGE) * PAGE
            length = rng.randrange(1, DIRECT_PAGES_MAX + 1) * PAGE
            history.append(f"{n} direct read {length} at {offset}")
            got = os.preadv(direct, [memoryview(aligned)[0:length]], offset)
            if got != min(length, size - offset):
                fail(f"direct read of {length} at {offset} returned {got}, size {size}")
            check(offset, bytes(aligned[0:got]), "direct read")
        elif kind == "truncate":
            length = rng.randrange(0, max_bytes)
            history.append(f"{n} truncate to {length}")
            os.ftruncate(fd, length)
            if length < len(model):
                del model[length:]
            else:
                model.extend(bytes(length - len(model)))
        elif kind == "mwrite" and size:
            offset = rng.randrange(0, size)
            length = rng.randrange(1, min(SPAN_MAX, size - offset) + 1)
            data = rng.randbytes(length)
            synced = rng.random() < 0.5
            history.append(f"{n} mapped write {length} at {offset}" + (" + msync" if synced else ""))
            with mmap.mmap(fd, size) as mapped:
                mapped[offset:offset + length] = data
                if synced:
                    mapped.flush()
            store(offset, data)
        elif kind == "snapshot":
            taken += 1
            binary, control, dataset = snapshots
            name = f"fsx-{seed}-{taken}"
            history.append(f"{n} snapshot {name}")
            subprocess.run([binary, "--control", control, "snapshot", f"{dataset}@{name}"],
                           check=True, stdout=subprocess.DEVNULL)
            directory = os.path.join(os.path.dirname(path), ".zfs", "snapshot", name)
            with open(os.path.join(directory, os.path.basename(path)), "rb") as snapshot:
                held = snapshot.read()
            if held != bytes(model):
                at = next((i for i in range(min(len(held), len(model))) if held[i] != model[i]),
                          min(len(held), len(model)))
                fail(f"snapshot {name} holds {len(held)} bytes, the model {len(model)}; "
                     f"they differ first at byte {at}")
        elif kind == "fsync":
            history.append(f"{n} fsync")
            os.fsync(fd if rng.random() < 0.5 else direct)
        elif kind == "reopen":
            history.append(f"{n} close and reopen")
            os.close(fd)
            os.close(direct)
            fd = os.open(path, os.O_RDWR)
            direct = os.open(path, os.O_RDWR | os.O_DIRECT)
        elif kind == "drop":
            history.append(f"{n} fsync and drop cached pages")
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        elif kind == "copy" and size:
            source = rng.randrange(0, size)
            length = rng.randrange(1, min(SPAN_MAX // 2, size - source) + 1)
            target = rng.randrange(0, max_bytes - length)
            if abs(target - source) < length:
                continue
            history.append(f"{n} copy_file_range {length} from {source} to {target}")
            done = 0
            while done < length:
                copied = os.copy_file_range(fd, fd, length - done, source + done, target + done)
                if copied == 0:
                    break
                done += copied
            store(target, bytes(model[source:source + done]))
        actual = os.fstat(fd).st_size
        if actual != len(model):
            fail(f"size {actual}, the model's {len(model)}, after: {history[-1] if history else ''}")
    os.fsync(fd)
    check(0, os.pread(fd, len(model) + PAGE, 0), "final read")
    os.close(fd)
    os.close(direct)
    print(f"ok {seed} {len(model)} {hashlib.sha256(model).hexdigest()}")


if __name__ == "__main__":
    main()
