#!/usr/bin/env python3
"""Independent duplication-ratio check for FIU traces (standard library only).

Re-implements, separately from the Rust code, the definition documented in
crates/nodup-trace/src/stats.rs: a written 4 KiB block is a duplicate when the
block's content after the write (sector by sector; unwritten sectors empty) is
present at that moment in some live block of any device.  Prints one JSON
object: writes, duplicate_writes, dedup_ratio, bad_lines.

usage: trace-dedup-ratio.py TRACE
"""
import json
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
