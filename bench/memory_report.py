"""Report of bench/memory.sh: docs/results/memory.md and memory/memory.png.

Usage: memory_report.py TSV MACHINE TREE OUTDIR
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from reading import reading  # noqa: E402

tsv, machine, tree, out = sys.argv[1:5]
rows = list(csv.DictReader(open(tsv), delimiter="\t"))
MiB = 2**20
md = ["# Dedup memory against data written (issue 21, Light-Dedup §6, SmartDedup budgets)", "",
      f"Produced by `bench/memory.sh` on {machine}; tree {tree}. A fresh pmem image in /dev/shm "
      "per row, filled through the mount by fio (1 MiB writes, files of 256 MiB, "
      "`--dedupe_percentage`), then the daemon's report: dedup memory is the DRAM index for "
      "`light` (`index_memory_bytes`) and every dedup structure for `smart` (its "
      "`memory.total_bytes`, which the budget bounds); unique blocks are the blocks stored.", "",
      "| policy | budget | dups | data MiB | unique blocks | dedup memory MiB | bytes per unique block | "
      "dedup MiB per GiB written | daemon anonymous MiB | block maps MiB |",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    mem, uniq, data = int(r["dedup_memory_bytes"]), int(r["unique_blocks"]), int(r["data_mib"])
    md.append(f"| {r['policy']} | {r['budget']} | {r['dup']} % | {data} | {uniq} | {mem / MiB:.2f} | "
              f"{mem / uniq if uniq else 0:.1f} | {mem / MiB / (data / 1024):.2f} | "
              f"{int(r['daemon_anon_bytes']) / MiB:.1f} | {int(r['block_map_bytes']) / MiB:.2f} |")
md += ["", "Every run: `memory/memory.tsv`.", "", "![memory](memory/memory.png)", ""]
md += reading(f"{out}/memory")
open(f"{out}/memory.md", "w").write("\n".join(md))

fig, ax = plt.subplots(figsize=(9, 5.5))
series = {}
for r in rows:
    key = (f"light, {r['dup']} % duplicates" if r["policy"] == "light"
           else f"smart, budget {r['budget']} (50 % duplicates)")
    series.setdefault(key, []).append((int(r["data_mib"]) / 1024, int(r["dedup_memory_bytes"]) / MiB))
for key, pts in series.items():
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if key.startswith("light") else "s--",
            label=key)
ax.set_xlabel("data written (GiB)")
ax.set_ylabel("dedup memory (MiB)")
ax.set_title("DRAM for deduplication: light's full index grows, smart's budget holds")
ax.set_ylim(bottom=0)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{out}/memory/memory.png", dpi=110)
