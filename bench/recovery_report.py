"""Report of bench/recovery.sh: docs/results/recovery.md and recovery/recovery.png.

Usage: recovery_report.py TSV MACHINE TREE OUTDIR
"""
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from reading import reading  # noqa: E402
tsv, machine, tree, out = sys.argv[1:5]
rows = list(csv.DictReader(open(tsv), delimiter="\t"))
md = ["# Recovery time against data on the image (issue 21, Light-Dedup Table 5)", "",
      f"Produced by `bench/recovery.sh` on {machine}; tree {tree}. Policy light, a pmem image "
      "in /dev/shm filled through the mount by fio (1 MiB writes, 50 % duplicates); recovery "
      "times as the daemon reports them (`nodup stats` recovery.seconds), mount and unmount as "
      "wall time of the command (a mount also starts the daemon and the FUSE session).", "",
      "| data MiB | unmount s | normal recovery s | normal mount s | failure recovery s | failure mount s | log records replayed |",
      "|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    md.append(f"| {r['data_mib']} | {r['unmount_s']} | {r['normal_recovery_s']} | {r['normal_mount_s']} | "
              f"{r['failure_recovery_s']} | {r['failure_mount_s']} | {r['replayed_records']} |")
md += ["", "Every run: `recovery/recovery.tsv`.", "", "![recovery](recovery/recovery.png)", ""]
md += reading(f"{out}/recovery")
open(f"{out}/recovery.md", "w").write("\n".join(md))
x = [int(r["data_mib"]) / 1024 for r in rows]
fig, ax = plt.subplots(figsize=(8, 5))
for key, label, style in (("unmount_s", "unmount", "s-"), ("normal_recovery_s", "normal recovery", "o-"),
                          ("failure_recovery_s", "failure recovery (after SIGKILL)", "^-")):
    ax.plot(x, [float(r[key]) for r in rows], style, label=label)
ax.set_xlabel("data written to the image (GiB)")
ax.set_ylabel("seconds")
ax.set_title("nodup light: unmount and recovery time vs data on the image")
ax.set_ylim(bottom=0)
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(f"{out}/recovery/recovery.png", dpi=110)