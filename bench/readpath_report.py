"""Report of bench/readpath.sh: docs/results/readpath.md.

Usage: readpath_report.py TSV MACHINE TREE OUTDIR FILE_MIB
"""
import csv, statistics, sys
from collections import defaultdict
from reading import reading  # noqa: E402
tsv, machine, tree, out, mib = sys.argv[1:6]
v = defaultdict(lambda: defaultdict(list))
order = []
for r in csv.DictReader(open(tsv), delimiter="\t"):
    k = (r["case"], r["policy"])
    if k not in order:
        order.append(k)
    for f in ("read_mibs", "media_read_mib", "dedup_ratio"):
        v[k][f].append(float(r[f]))
med = lambda k, f: statistics.median(v[k][f])
md = ["# Read path: cold reads of deduplicated data (issue 21)", "",
      f"Produced by `bench/readpath.sh` on {machine}; tree {tree}. Files of {mib} MiB written by "
      "fio on a fresh pmem image in /dev/shm, the file system remounted (cold caches), then read "
      "back with `fio --rw=read --bs=1m` (one job per file; two identical files are read at "
      "once). Media MiB read: the engine's `media_bytes_read` during the read. `smart` runs "
      f"with `--mem-budget 3M`, its worker settled before the remount. Medians of "
      f"{max(len(x['read_mibs']) for x in v.values())} rounds.", "",
      "| case | policy | read MiB/s | against none | media MiB read | dedup ratio |",
      "|---|---|---:|---:|---:|---:|"]
for k in order:
    base = (k[0], "none")
    rel = med(k, "read_mibs") / med(base, "read_mibs") if base in v else None
    md.append(f"| {k[0]} | {k[1]} | {med(k, 'read_mibs'):.0f} | "
              f"{'-' if rel is None else '%.2f' % rel} | {med(k, 'media_read_mib'):.0f} | "
              f"{med(k, 'dedup_ratio'):.3f} |")
md += ["", "Every run: `readpath/readpath.tsv`.", ""]
md += reading(f"{out}/readpath")
open(f"{out}/readpath.md", "w").write("\n".join(md))