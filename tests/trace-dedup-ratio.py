#!/usr/bin/env python3
"""Independent duplication-ratio check for FIU traces (standard library only).

Re-implements, separately from the Rust code, the definition documented in
crates/nodup-trace/src/stats.rs: a written 4 KiB block is a duplicate when the
block's content after the write (sector by sector; unwritten sectors empty) is
present at that moment in some live block of any device.  Prints one JSON
object: writes, duplicate_writes, dedup_ratio, bad_lines.

With --files, checks `nodup estimate` instead: what nodup would store after
`cp -a PATH... MOUNT/`.  Each argument is walked without following symlinks;
every regular file counts once per (st_dev, st_ino); a file is its 4 KiB
blocks (last one zero-padded), minus the blocks lying wholly inside a hole
(SEEK_DATA/SEEK_HOLE); zero-filled data blocks count.  Prints one JSON object:
files, logical_bytes, physical_bytes, dedup_ratio.

usage: trace-dedup-ratio.py TRACE
       trace-dedup-ratio.py --files PATH...
"""
import errno
import hashlib
import json
import os
import stat
import sys
from collections import defaultdict

HEX = set("0123456789abcdefABCDEF")


def main(path):
    blocks = {}                 # (major, minor, block) -> tuple of 8 sector contents
    live = defaultdict(int)     # block content -> number of blocks holding it
    writes = dups = bad = 0
    sticky = "block"            # digest variant of the last unambiguous line
    with open(path, "rb") as f:
        for raw in f:
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                bad += 1
                continue
            if not line or line.startswith("#"):
                continue
            fld = line.split()
            try:
                if len(fld) < 9:
                    raise ValueError
                lba, size = int(fld[-6]), int(fld[-5])
                op, major, minor, dig = fld[-4], int(fld[-3]), int(fld[-2]), fld[-1]
                int(fld[0]), int(fld[1])
                if size <= 0 or op not in ("W", "w", "R", "r") or len(dig) % 32 or not set(dig) <= HEX:
                    raise ValueError
                n = len(dig) // 32
                per_block, per_sector = (size + 7) // 8, size
                if n == per_block and n == per_sector:
                    unit = sticky
                elif n == per_block:
                    unit = "block"
                elif n == per_sector:
                    unit = "sector"
                else:
                    raise ValueError
            except ValueError:
                bad += 1
                continue
            sticky = unit
            if op not in ("W", "w"):
                continue
            dig = dig.lower()
            digests = [dig[i * 32:(i + 1) * 32] for i in range(n)]
            first, end = lba // 8, (lba + size + 7) // 8
            for b in range(first, end):
                key = (major, minor, b)
                old = blocks.get(key, (None,) * 8)
                new = list(old)
                for s in range(8):
                    sector = b * 8 + s
                    i = sector - lba
                    if 0 <= i < size:
                        new[s] = (digests[i // 8], i % 8) if unit == "block" else (digests[i], "s")
                new = tuple(new)
                writes += 1
                if live.get(new, 0) > 0:
                    dups += 1
                if old != (None,) * 8:
                    live[old] -= 1
                live[new] += 1
                blocks[key] = new
    ratio = dups / writes if writes else 0.0
    print(json.dumps({"writes": writes, "duplicate_writes": dups, "dedup_ratio": ratio, "bad_lines": bad}))


BS = 4096


def file_blocks(path):
    """Yield the stored 4 KiB blocks of one regular file (zero-padded at the end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        nblk = (size + BS - 1) // BS
        nxt = 0
        while nxt < nblk:
            try:
                data = os.lseek(fd, nxt * BS, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    break
                if e.errno != errno.EINVAL:
                    raise
                data = nxt * BS         # no SEEK_DATA support: all data
            try:
                hole = os.lseek(fd, data, os.SEEK_HOLE)
            except OSError:
                hole = size
            start = max(data // BS, nxt)
            end = min(max((hole + BS - 1) // BS, start + 1), nblk)
            for b in range(start, end):
                blk = os.pread(fd, BS, b * BS)
                if not blk:
                    return
                yield blk.ljust(BS, b"\0")
            nxt = end
    finally:
        os.close(fd)


def walk(root, seen, out):
    """Append the regular files under root (root included), one per (dev, ino)."""
    st = os.lstat(root)
    if stat.S_ISREG(st.st_mode):
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(root)
    elif stat.S_ISDIR(st.st_mode):
        for name in sorted(os.listdir(root)):
            walk(os.path.join(root, name), seen, out)


def files_main(paths):
    seen, files = set(), []
    for p in paths:
        walk(p, seen, files)
    blocks, contents = 0, set()
    for f in files:
        for blk in file_blocks(f):
            blocks += 1
            contents.add(hashlib.sha256(blk).digest())
    logical, physical = blocks * BS, len(contents) * BS
    ratio = 1.0 - physical / logical if logical else 0.0
    print(json.dumps({"files": len(files), "logical_bytes": logical,
                      "physical_bytes": physical, "dedup_ratio": ratio}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--files":
        files_main(sys.argv[2:])
    elif len(sys.argv) == 2 and sys.argv[1] != "--files":
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
