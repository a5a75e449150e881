"""Report of bench/copy.sh: docs/results/copy.md and copy/copy.png.

Usage: copy_report.py TSV WHAT TREE_BYTES VERSIONS MACHINE TREE OUTDIR NAME
"""
import csv
import re
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from reading import reading  # noqa: E402

tsv, what, tree_bytes, versions, machine, tree, outdir, name = sys.argv[1:9]
tree_mib = int(tree_bytes) / 2**20
ORDER = ["null", "pass", "none", "light", "strong", "weak-verify", "smart", "selective",
         "zfs-off", "zfs", "zfs-4k", "ext4", "btrfs", "bindfs", "restic", "borg"]
LABEL = {
    "null": "null FUSE", "pass": "passthrough FUSE", "none": "nodup none", "light": "nodup light",
    "strong": "nodup strong", "weak-verify": "nodup weak-verify", "smart": "nodup smart",
    "selective": "nodup selective", "zfs-off": "zfs-fuse dedup=off", "zfs": "zfs-fuse dedup=on 128K",
    "zfs-4k": "zfs-fuse dedup=on 4K", "ext4": "ext4 (loop)", "btrfs": "btrfs (loop)",
    "bindfs": "bindfs", "restic": "restic (backup)", "borg": "borg (backup)",
}
rows = defaultdict(lambda: defaultdict(list))
extra = {}
rounds = set()
for r in csv.DictReader(open(tsv), delimiter="\t"):
    rounds.add(r["round"])
    for k in ("copy1_s", "used1_mib", "copy2_s", "used2_mib", "daemon_rss_mib", "daemon_anon_mib"):
        if r[k] not in ("-", ""):
            rows[r["system"]][k].append(float(r[k]))
    if r["extra"] not in ("-", ""):
        extra[r["system"]] = r["extra"]
systems = [s for s in ORDER if s in rows]


def med(s, k):
    xs = rows[s][k]
    return statistics.median(xs) if xs else None


def fmt(x, f="%.1f"):
    return "-" if x is None else f % x


out = ["# Copy: a tree copied twice into each system (issue 21, Light-Dedup Fig. 10b / Table 3)", "",
       f"Produced by `bench/copy.sh` on {machine}; tree {tree}; {versions}.", "",
       f"Source: {what}. `cp -a` of it into each system, freshly made and empty (all backed by "
       "/dev/shm), then a second `cp -a` of the same tree beside it. Space: what the medium holds "
       "beyond the empty system (`df` used bytes; zfs-fuse: the pool's ALLOC, which dedup "
       "shrinks). Saved: the share of the second copy that took no new space. Daemon: memory "
       "of the process serving the mount after both copies, resident (VmRSS, which for nodup "
       "includes the pages of its image that it maps) and anonymous (RssAnon: its own memory, "
       "what the comparison uses). restic and borg ingest the "
       f"tree twice from two paths into a repository in /dev/shm. {len(rounds)} round(s); medians.",
       "",
       "| system | copy 1 s | copy 2 s | 2nd / 1st | space after 1 MiB | after 2 MiB | saved of the 2nd copy | daemon RSS MiB | daemon anonymous MiB | note |",
       "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for s in systems:
    c1, c2, u1, u2 = med(s, "copy1_s"), med(s, "copy2_s"), med(s, "used1_mib"), med(s, "used2_mib")
    saved = 1 - (u2 - u1) / u1 if u1 and u2 is not None and u1 > 0 else None
    out.append(f"| {s} | {fmt(c1, '%.2f')} | {fmt(c2, '%.2f')} | "
               f"{fmt(c2 / c1 if c1 and c2 else None, '%.2f')} | {fmt(u1, '%.0f')} | "
               f"{fmt(u2, '%.0f')} | {fmt(saved, '%.3f')} | {fmt(med(s, 'daemon_rss_mib'))} | "
               f"{fmt(med(s, 'daemon_anon_mib'))} | "
               f"{extra.get(s, '')} |")

# Memory at scale: each daemon's own memory after both copies, per file it serves and per GiB
# of unique data (one tree: the second copy adds no unique data).
m = re.search(r"(\d+) files", what)
files = int(m.group(1)) if m else None
mem_rows = [s for s in systems if med(s, "daemon_anon_mib") is not None]
per_gib = {s: med(s, "daemon_anon_mib") / (tree_mib / 1024) for s in mem_rows}
if mem_rows:
    out += ["", "Memory at scale (daemon anonymous memory after both copies):", "",
            "| system | anonymous MiB | KiB per file held | MiB per GiB of unique data |",
            "|---|---:|---:|---:|"]
    for s in mem_rows:
        a = med(s, "daemon_anon_mib")
        out.append(f"| {s} | {a:.1f} | {fmt(a * 1024 / (2 * files) if files else None, '%.2f')} | "
                   f"{per_gib[s]:.1f} |")

checks = []
if "light" in rows and "zfs" in rows:
    lu1, lu2, zu1, zu2 = (med("light", "used1_mib"), med("light", "used2_mib"),
                          med("zfs", "used1_mib"), med("zfs", "used2_mib"))
    l_saved = 1 - (lu2 - lu1) / lu1 if lu1 else None
    z_saved = 1 - (zu2 - zu1) / zu1 if zu1 else None
    lc2, zc2 = med("light", "copy2_s"), med("zfs", "copy2_s")
    lr, zr = med("light", "daemon_anon_mib"), med("zfs", "daemon_anon_mib")
    checks = [
        ("saved of the 2nd copy ≥ zfs-fuse's", l_saved, z_saved,
         l_saved is not None and z_saved is not None and l_saved >= z_saved - 0.005),
        ("2nd copy time ≤ 0.25 × zfs-fuse's", lc2, zc2, lc2 is not None and zc2 and lc2 <= 0.25 * zc2),
        ("daemon anonymous memory after < zfs-fuse's", lr, zr, lr is not None and zr and lr < zr),
        ("2nd copy faster than the 1st", lc2, med("light", "copy1_s"),
         lc2 is not None and lc2 < (med("light", "copy1_s") or 0)),
    ]
    out += ["", "Acceptance (issue 21, light against zfs-fuse dedup=on with 128 KiB records):", "",
            "| target | light | compared with | |", "|---|---:|---:|---|"]
    for target, a, b, ok in checks:
        out.append(f"| {target} | {fmt(a, '%.3f')} | {fmt(b, '%.3f')} | {'met' if ok else '**missed**'} |")
out += ["", f"Every run: `copy/{name}.tsv`.", "", f"![copy](copy/{name}.png)", ""]
if mem_rows:
    out += [f"![daemon memory per GiB of unique data](copy/{name}-memory.png)", ""]
if name == "copy":
    out += reading(f"{outdir}/copy")
open(f"{outdir}/{name}.md", "w").write("\n".join(out))

fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.5))
xs = range(len(systems))
w = 0.38
c1 = [med(s, "copy1_s") or 0 for s in systems]
c2 = [med(s, "copy2_s") or 0 for s in systems]
a1.bar([x - w / 2 for x in xs], c1, w, label="first copy", color="#9ecae1")
a1.bar([x + w / 2 for x in xs], c2, w, label="second copy", color="#1f77b4")
a1.set_ylabel("seconds")
a1.set_title("time of each copy (lower is better)")
u1 = [med(s, "used1_mib") or 0 for s in systems]
u2 = [med(s, "used2_mib") or 0 for s in systems]
a2.bar([x - w / 2 for x in xs], u1, w, label="after the first copy", color="#fdae6b")
a2.bar([x + w / 2 for x in xs], u2, w, label="after the second copy", color="#e6550d")
a2.axhline(tree_mib, color="black", ls=":", lw=1, label=f"one tree ({tree_mib:.0f} MiB)")
a2.set_ylabel("MiB on the medium")
a2.set_title("space used (lower is better)")
for a in (a1, a2):
    a.set_xticks(list(xs))
    a.set_xticklabels([LABEL[s] for s in systems], rotation=50, ha="right", fontsize=8)
    a.grid(axis="y", alpha=0.3)
    # Headroom above the tallest bar, so the legend never hides one.
    a.set_ylim(0, a.get_ylim()[1] * 1.3)
    a.legend(fontsize=8, loc="upper left")
fig.suptitle(f"cp -a of {what.split(',')[0]} twice")
fig.tight_layout()
fig.savefig(f"{outdir}/copy/{name}.png", dpi=110)
plt.close(fig)

if mem_rows:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(mem_rows)), [per_gib[s] for s in mem_rows], color=["#d62728" if s == "light" else "#7f7f7f" for s in mem_rows])
    ax.set_xticks(range(len(mem_rows)))
    ax.set_xticklabels([LABEL[s] for s in mem_rows], rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("MiB per GiB of unique data")
    ax.set_title(f"daemon anonymous memory after copying {what.split(',')[0]} twice\n"
                 "(lower is better)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{outdir}/copy/{name}-memory.png", dpi=100)
    plt.close(fig)
