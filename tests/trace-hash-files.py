#!/usr/bin/env python3
"""Hash what a replay left in DIR, reading only the 4 KiB blocks TRACE writes (standard library).

FIU LBAs reach hundreds of GiB, so replay files are huge and sparse; hashing them whole would
read zeros for hours (and SEEK_DATA is not available on every FUSE file system). This reads the
blocks the trace's write records touch, in (file, block) order, and prints one SHA-256 over
file name, block number and data, plus the apparent file sizes. Two replays of one trace left
identical contents when the printed lines are identical.

usage: trace-hash-files.py TRACE DIR
"""
import hashlib
import os
import sys


def main(trace, d):
    touched = {}
    with open(trace, "rb") as f:
        for raw in f:
            fld = raw.split()
            if len(fld) < 9 or fld[-4] not in (b"W", b"w"):
                continue
            try:
                lba, size, major, minor = int(fld[-6]), int(fld[-5]), int(fld[-3]), int(fld[-2])
            except ValueError:
                continue
            if size <= 0:
                continue
            name = f"dev-{major}-{minor}.img"
            touched.setdefault(name, set()).update(range(lba // 8, (lba + size + 7) // 8))
    h = hashlib.sha256()
    sizes = []
    for name in sorted(touched):
        path = os.path.join(d, name)
        sizes.append(f"{name}={os.path.getsize(path)}")
        with open(path, "rb") as f:
            for b in sorted(touched[name]):
                f.seek(b * 4096)
                data = f.read(4096)
                h.update(f"{name}:{b}:".encode() + data.ljust(4096, b"\0"))
    print(h.hexdigest(), " ".join(sizes))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
