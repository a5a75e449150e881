"""Report of bench/sweep.sh: docs/results/sweep.md and the Fig. 7-style plots (docs/results/sweep/).

Usage: sweep_report.py TSV FIO_CMD VERSIONS MACHINE TREE SECONDS OUTDIR
"""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from reading import reading  # noqa: E402

tsv, cmd, versions, machine, tree, secs, outdir = sys.argv[1:8]
ORDER = ["null", "pass", "none", "light", "light-async", "strong", "weak-verify", "smart", "selective",
         "zfs-off", "zfs", "zfs-4k", "ext4", "btrfs", "bindfs"]
LABEL = {
    "null": "null FUSE (ceiling)", "pass": "passthrough FUSE", "none": "nodup none",
    "light": "nodup light", "light-async": "nodup light, --async-writes",
    "strong": "nodup strong", "weak-verify": "nodup weak-verify",
    "smart": "nodup smart", "selective": "nodup selective", "zfs-off": "zfs-fuse dedup=off",
    "zfs": "zfs-fuse dedup=on 128K", "zfs-4k": "zfs-fuse dedup=on 4K", "ext4": "ext4 (loop)",
    "btrfs": "btrfs (loop)", "bindfs": "bindfs",
}
PEERS = ["zfs-off", "zfs", "zfs-4k", "ext4", "btrfs", "bindfs", "pass"]
# One distinct colour per system: nodup in reds and purples, zfs in blues, kernel file systems
# in greens, FUSE references in greys and browns.
COLOR = {
    "null": "black", "pass": "#7f7f7f", "bindfs": "#8c564b", "none": "#ff9896",
    "light": "#d62728", "light-async": "#7b0d0d", "strong": "#9467bd", "weak-verify": "#e377c2", "smart": "#ff7f0e",
    "selective": "#bcbd22", "zfs-off": "#9ecae1", "zfs": "#1f77b4", "zfs-4k": "#17becf",
    "ext4": "#2ca02c", "btrfs": "#98df8a",
}
NODUP = ("none", "light", "light-async", "strong", "weak-verify", "smart", "selective")

mibs = defaultdict(list)
saved = defaultdict(list)
rounds = set()
sizes = {}
for row in csv.DictReader(open(tsv), delimiter="\t"):
    key = (row["bs"], int(row["jobs"]), int(row["dup"]), row["system"])
    mibs[key].append(float(row["mibs"]))
    if row["dedup_saved"] not in ("-", ""):
        saved[key].append(float(row["dedup_saved"]))
    rounds.add(int(row["round"]))
    sizes[row["bs"]] = int(row["total_mib"])
systems = [s for s in ORDER if any(k[3] == s for k in mibs)]
cells = sorted({k[:3] for k in mibs}, key=lambda c: (c[0] != "1m", c[1], c[2]))


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, f="%.0f"):
    return "-" if x is None else f % x


out = ["# fio write sweep: every system at 0-100 % duplicates (issue 21, Light-Dedup Fig. 7)", "",
       f"Produced by `bench/sweep.sh` in {int(secs) // 60} min {int(secs) % 60} s on {machine}; "
       f"tree {tree}; {versions}.", "",
       f"`{cmd}` (PER_JOB = the cell's MiB / jobs, each job its own file), on each system freshly "
       f"made and empty, everything backed by /dev/shm (loop images and zfs vdevs are files "
       f"there). {len(rounds)} round(s); MiB/s are medians. Data per cell: "
       + ", ".join(f"{v} MiB at bs {k}" for k, v in sorted(sizes.items()))
       + " (4 KiB writes without a writeback cache are one FUSE round trip each). "
       "Systems: " + "; ".join(f"**{s}** = {LABEL[s]}" for s in systems) + ".", ""]
for bs in sorted({c[0] for c in cells}, key=lambda b: b != "1m"):
    for jobs in sorted({c[1] for c in cells if c[0] == bs}):
        dups = sorted({c[2] for c in cells if c[0] == bs and c[1] == jobs})
        out += [f"## bs {bs}, {jobs} job(s): MiB/s (share reported as deduplicated)", "",
                "| system | " + " | ".join(f"{d} %" for d in dups) + " |",
                "|---|" + "---:|" * len(dups)]
        for s in systems:
            if not any(mibs[(bs, jobs, d, s)] for d in dups):
                continue  # not run at this size (light-async runs at 1 MiB only)
            vals = []
            for d in dups:
                m = med(mibs[(bs, jobs, d, s)])
                sv = med(saved[(bs, jobs, d, s)])
                vals.append(fmt(m) + ("" if sv is None else f" ({sv:.2f})"))
            out.append(f"| {s} | " + " | ".join(vals) + " |")
        out.append("")

# Light against the best peer and the ceiling, one job.
out += ["## nodup light against the best peer and the ceiling (one job)", "",
        "| bs | dups | light MiB/s | best peer | its MiB/s | light / best peer | light / zfs dedup=on 128K | light / zfs dedup=on 4K | light / null |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
for bs, jobs, d in cells:
    if jobs != 1:
        continue
    lt = med(mibs[(bs, jobs, d, "light")])
    peers = [(med(mibs[(bs, jobs, d, p)]), p) for p in PEERS if mibs[(bs, jobs, d, p)]]
    nl = med(mibs[(bs, jobs, d, "null")])
    if lt is None or not peers:
        continue
    bv, bp = max(peers)
    z, z4 = med(mibs[(bs, jobs, d, "zfs")]), med(mibs[(bs, jobs, d, "zfs-4k")])
    out.append(f"| {bs} | {d} % | {lt:.0f} | {bp} | {bv:.0f} | {lt / bv:.2f} | "
               f"{fmt(lt / z if z else None, '%.2f')} | {fmt(lt / z4 if z4 else None, '%.2f')} | "
               f"{fmt(lt / nl if nl else None, '%.2f')} |")
# The opt-in early answers next to light (1 MiB only: smaller writes are never answered early).
async_rows = [(bs, d) for bs, jobs, d in cells if jobs == 1 and mibs[(bs, 1, d, "light-async")]]
if async_rows:
    out += ["", "## nodup light mounted with `--async-writes` (one job)", "",
            "Writes of 128 KiB and up answered once admitted and stored after the answer, so the "
            "daemon's work overlaps the writer's next write; such data is durable at fsync (close "
            "waits for it) instead of when write(2) returns (docs/choices.md). Off by default.",
            "",
            "| bs | dups | light MiB/s | light-async MiB/s | light-async / light | "
            "light-async / zfs dedup=on 128K | light-async / null |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for bs, d in async_rows:
        lt, la = med(mibs[(bs, 1, d, "light")]), med(mibs[(bs, 1, d, "light-async")])
        z, nl = med(mibs[(bs, 1, d, "zfs")]), med(mibs[(bs, 1, d, "null")])
        out.append(f"| {bs} | {d} % | {fmt(lt, '%.0f')} | {la:.0f} | "
                   f"{fmt(la / lt if lt else None, '%.2f')} | {fmt(la / z if z else None, '%.2f')} | "
                   f"{fmt(la / nl if nl else None, '%.2f')} |")
out += ["", "Every run: `sweep/sweep.tsv`.", "",
        "![bs 1m](sweep/sweep-1m.png)", "", "![bs 4k](sweep/sweep-4k.png)", ""]
# The hand-written reading of the numbers (update it when they change).
out += reading(f"{outdir}/sweep")
open(f"{outdir}/sweep.md", "w").write("\n".join(out))

# Fig. 7 form: throughput vs duplication, a line per system, one job.
for bs in sorted({c[0] for c in cells}):
    dups = sorted({c[2] for c in cells if c[0] == bs and c[1] == 1})
    if not dups:
        continue
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for s in systems:
        ys = [med(mibs[(bs, 1, d, s)]) for d in dups]
        if all(y is None for y in ys):
            continue
        style = "-" if s in NODUP else (":" if s == "null" else "--")
        lw = 2.8 if s == "light" else 1.5
        ax.plot(dups, ys, style, color=COLOR[s], marker="o", ms=4, lw=lw, label=LABEL[s])
    ax.set_xlabel("duplicate share of the data written (%)")
    ax.set_ylabel("write throughput (MiB/s)")
    ax.set_title(f"fio sequential writes, bs {bs}, one job, end_fsync (median of {len(rounds)})")
    ax.set_xticks(dups)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="solid = nodup, dashed = peers")
    fig.tight_layout()
    fig.savefig(f"{outdir}/sweep/sweep-{bs}.png", dpi=110)
    plt.close(fig)
