#!/usr/bin/env python3
"""Markdown sections of bench/fs-ceiling.sh (issue 20) from its per-run TSV files.

Usage: fs_ceiling_report.py fio TSV FIO_CMD BDI_LINES
       fs_ceiling_report.py scale TSV FIO_CMD
       fs_ceiling_report.py ktree TSV WHAT
       fs_ceiling_report.py meta TSV
Medians over rounds; a ratio is the median of the per-round ratios (both systems measured in the
same round, next to each other).
"""
import csv
import os
import statistics
import sys
from collections import defaultdict

NAMES = {"null": "null", "pass": "passthrough", "light": "light", "none": "none",
         "zfs": "zfs-fuse", "tmpfs": "tmpfs"}
# The null file system's transport with a reference data path behind it (FLOORS=1).
SINKS = {"sink-discard": "discard", "sink-copy": "copy", "sink-land": "land",
         "sink-store": "store"}


def load(path):
    return list(csv.DictReader(open(path), delimiter="\t"))


class Runs:
    """Values by (cell, system) and round."""

    def __init__(self):
        self.v = defaultdict(dict)

    def add(self, cell, system, rnd, value):
        self.v[(cell, system)][rnd] = value

    def med(self, cell, system):
        d = self.v.get((cell, system))
        return statistics.median(d.values()) if d else None

    def ratio(self, cell_a, sys_a, cell_b, sys_b):
        a, b = self.v.get((cell_a, sys_a), {}), self.v.get((cell_b, sys_b), {})
        rs = [a[r] / b[r] for r in a if r in b and b[r] > 0]
        return statistics.median(rs) if rs else None

    def rounds(self):
        return max((len(d) for d in self.v.values()), default=0)


def f(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def r3(x):
    return f(x, "%.3f")


def verdict(x, target, at_most=False):
    if x is None:
        return "not measured"
    ok = x <= target if at_most else x >= target
    return "**met**" if ok else "**missed**"


def fio(tsv, cmd, bdi):
    rows = load(tsv)
    runs, dedup, totals = Runs(), defaultdict(list), {}
    for row in rows:
        cell = (row["bs"], int(row["dup"]), int(row["wb"]), int(row["jobs"]))
        runs.add(cell, row["system"], int(row["round"]), float(row["mibs"]))
        totals[cell] = int(row["total_mib"])
        if row["dedup_ratio"] != "-":
            dedup[cell].append(float(row["dedup_ratio"]))
    cells = sorted(totals, key=lambda c: (c[0] != "1m", c[2], c[3], c[1]))
    name = os.path.basename(tsv)[:-len(".tsv")]
    title = "## fio: sequential writes through each file system"
    if name != "fio":
        title += f" (focused run `{name}`: only the cells below)"
    out = [title, "",
           f"`{cmd}` (bs 4k or 1m; PER_JOB = the cell's MiB / jobs, each job its own file), "
           f"{runs.rounds()} rounds. MiB/s are medians; each ratio is the median of per-round "
           "ratios. \"light dedup\" is `nodup stats` dedup_ratio after light's run (median). "
           "zfs-fuse runs one job without a writeback variant (it has no such switch).", "",
           "| bs | dups | writeback cache | jobs | MiB | null | passthrough | light | none | "
           "zfs-fuse | light / null | none / null | passthrough / null | light / zfs-fuse | light dedup |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        bs, dup, wb, jobs = c
        m = {s: runs.med(c, s) for s in NAMES}
        dd = statistics.median(dedup[c]) if dedup[c] else None
        out.append(f"| {bs} | {dup} % | {'on' if wb else 'off'} | {jobs} | {totals[c]} | "
                   f"{f(m['null'])} | {f(m['pass'])} | {f(m['light'])} | {f(m['none'])} | "
                   f"{f(m['zfs'])} | **{r3(runs.ratio(c, 'light', c, 'null'))}** | "
                   f"{r3(runs.ratio(c, 'none', c, 'null'))} | {r3(runs.ratio(c, 'pass', c, 'null'))} | "
                   f"{r3(runs.ratio(c, 'light', c, 'zfs'))} | {r3(dd)} |")
    one, two = ("1m", 75, 0, 1), ("1m", 75, 0, 2)
    checks = [
        ("light, 1 MiB, 75 %, one job ≥ 0.9 × null", runs.ratio(one, "light", one, "null"), 0.9),
        ("light, 1 MiB, 75 %, one job ≥ 2.5 × zfs-fuse dedup=on",
         runs.ratio(one, "light", one, "zfs"), 2.5),
        ("light, 1 MiB, 0 %, one job ≥ 0.8 × null",
         runs.ratio(("1m", 0, 0, 1), "light", ("1m", 0, 0, 1), "null"), 0.8),
        ("light, 4 KiB, 0 %, writeback cache ≥ 0.8 × null with writeback cache",
         runs.ratio(("4k", 0, 1, 1), "light", ("4k", 0, 1, 1), "null"), 0.8),
        ("light, 4 KiB, 75 %, writeback cache ≥ 0.8 × null with writeback cache",
         runs.ratio(("4k", 75, 1, 1), "light", ("4k", 75, 1, 1), "null"), 0.8),
        ("light, 1 MiB, 75 %: two jobs ≥ 1.6 × one job", runs.ratio(two, "light", one, "light"), 1.6),
    ]
    out += ["", "Acceptance (issue 20; without the writeback cache unless said):", "",
            "| target | measured | |", "|---|---:|---|"]
    for name, x, t in checks:
        out.append(f"| {name} | {r3(x)} | {verdict(x, t)} |")
    out.append(f"| (for comparison) null, 1 MiB, 75 %: two jobs / one job | "
               f"{r3(runs.ratio(two, 'null', one, 'null'))} | |")
    gaps = [(runs.ratio(c, "light", c, "null"), c) for c in cells]
    gaps = [g for g in gaps if g[0] is not None]
    if gaps:
        x, (bs, dup, wb, jobs) = min(gaps)
        out += ["", f"Farthest from the ceiling: light at bs {bs}, {dup} % duplicates, writeback "
                f"cache {'on' if wb else 'off'}, {jobs} job(s): {x:.3f} of null."]
    out += async_table(runs, cells, totals)
    out += direct_table(runs, cells, totals)
    out += floors(runs, cells, totals)
    if bdi.strip():
        parts = ", ".join(f"{NAMES[s]} {mib} MiB" for s, mib in (ln.split() for ln in bdi.splitlines()))
        out += ["", "Kernel dirty-page limit of the mount with the writeback cache "
                f"(/sys/class/bdi/DEV/max_bytes): {parts}."]
    out += ["", f"Every run: `fs-ceiling/{os.path.basename(tsv)}`.", ""]
    return out


def target_rows(runs, system, null_sys):
    """Issue 20's four 1 MiB targets for an opt-in mount SYSTEM of light, against NULL_SYS."""
    one, two, zero = ("1m", 75, 0, 1), ("1m", 75, 0, 2), ("1m", 0, 0, 1)
    checks = [
        (f"{system}, 1 MiB, 75 %, one job ≥ 0.9 × {null_sys}",
         runs.ratio(one, system, one, null_sys), 0.9),
        (f"{system}, 1 MiB, 75 %, one job ≥ 2.5 × zfs-fuse dedup=on",
         runs.ratio(one, system, one, "zfs"), 2.5),
        (f"{system}, 1 MiB, 0 %, one job ≥ 0.8 × {null_sys}",
         runs.ratio(zero, system, zero, null_sys), 0.8),
        (f"{system}, 1 MiB, 75 %: two jobs ≥ 1.6 × one job",
         runs.ratio(two, system, one, system), 1.6),
    ]
    out = ["| target | measured | |", "|---|---:|---|"]
    for name, x, t in checks:
        out.append(f"| {name} | {r3(x)} | {verdict(x, t)} |")
    return out


def opt_in_table(runs, cells, totals, system, head, columns, targets_intro, null_sys):
    """A table of an opt-in mount SYSTEM in the cells where it ran: HEAD (title and text),
    then per cell bs, dups, jobs, MiB and COLUMNS ((header, value of a cell) pairs), then
    issue 20's targets for it against NULL_SYS."""
    have = [c for c in cells if runs.med(c, system) is not None]
    if not have:
        return []
    heads = ["bs", "dups", "jobs", "MiB"] + [h for h, _ in columns]
    out = ["", *head, "", "| " + " | ".join(heads) + " |",
           "|---|" + "---:|" * (len(heads) - 1)]
    for c in have:
        bs, dup, _, jobs = c
        row = [bs, f"{dup} %", str(jobs), str(totals[c])] + [v(c) for _, v in columns]
        out.append("| " + " | ".join(row) + " |")
    return out + ["", targets_intro, ""] + target_rows(runs, system, null_sys)


def mib(runs, system):
    """An opt-in table's column: SYSTEM's median MiB/s."""
    return system, lambda c: f(runs.med(c, system))


def ratio_col(runs, a, b, bold=False, name=None):
    """An opt-in table's column: the median per-round ratio A / B (in bold when BOLD)."""
    def value(c):
        x = r3(runs.ratio(c, a, c, b))
        return f"**{x}**" if bold else x
    return f"{a} / {name or b}", value


def async_table(runs, cells, totals):
    """light mounted with --async-writes next to light, null and zfs-fuse (ASYNC=1)."""
    head = ["### light with `--async-writes`", "",
            "**light-async** = light mounted with `--async-writes`: writes of 128 KiB and up "
            "are answered once admitted (room reserved, inode locked) and stored after the "
            "answer, so the daemon's work overlaps the writer's next write; such data is "
            "durable at fsync or close, as on ext4 or ZFS, instead of when write(2) returns "
            "(the default, which the table above measures)."]
    cols = [mib(runs, "null"), mib(runs, "light"), mib(runs, "light-async"),
            ratio_col(runs, "light-async", "light"),
            ratio_col(runs, "light-async", "null", bold=True),
            ratio_col(runs, "light-async", "zfs", name="zfs-fuse")]
    return opt_in_table(runs, cells, totals, "light-async", head, cols,
                        "The same targets for light-async:", "null")


def direct_table(runs, cells, totals):
    """null and light with read-write handles direct (--direct-writes=read-write, DIRECT=1)."""
    head = ["### Read-write handles direct (`--direct-writes=read-write`)", "",
            "**null-direct** / **light-direct** = null and light with "
            "`--direct-writes=read-write`: fio's read-write handles bypass the page cache too, "
            "so the kernel sends each write from the writer's own memory instead of copying it "
            "into cached pages first (the table above: the default, where only write-only "
            "handles do, and fio's go through the cache). Reads through such handles come from "
            "the daemon uncached, which is why it is not the default."]
    cols = [mib(runs, "null"), mib(runs, "light"), mib(runs, "null-direct"),
            mib(runs, "light-direct"),
            ratio_col(runs, "light-direct", "light", bold=True),
            ratio_col(runs, "light-direct", "null-direct", bold=True),
            ratio_col(runs, "light-direct", "null"),
            ratio_col(runs, "light-direct", "zfs", name="zfs-fuse")]
    return opt_in_table(runs, cells, totals, "light-direct", head, cols,
                        "The same targets for light-direct (against the null file system "
                        "mounted the same way):", "null-direct")


def floors(runs, cells, totals):
    """The table of the reference data paths, for the cells where they ran."""
    have = [c for c in cells if any(runs.med(c, s) is not None for s in SINKS)]
    if not have:
        return []
    out = ["", "### The data path behind the transport", "",
           "`nodup-uring-null --classic --threads 4` (its own classic /dev/fuse loop) alone "
           "(**discard**) and with a reference data path behind it "
           "(crates/nodup-uring-null/src/sink.rs): **copy** reads each request into a buffer, "
           "then fingerprints (xxh3) and copies every 4 KiB block into memory backed already (a "
           "mapped /dev/shm file reused every 64 MiB): the CPU work of a dedup daemon's new data; "
           "**land** reads the request with readv(2) so its data lands straight in that memory, "
           "then fingerprints it in place (one copy fewer: what reading requests into the image "
           "would save); **store** fingerprints and pwrite(2)s the data into a sparse /dev/shm "
           "file, never at the same place twice: the cheapest way to keep new data in /dev/shm "
           "(the kernel provides a page for every 4 KiB, not zeroed first). The sinks are read "
           "against *discard* (same transport); light against null (fuser, as light). Same "
           "rounds, interleaved with the systems above.", "",
           "| bs | dups | MiB | null | discard | copy | land | store | light | discard / null | "
           "copy / discard | land / discard | store / discard | light / null | light / store |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in have:
        bs, dup, _, _ = c
        m = {s: runs.med(c, s) for s in ("null", "light", *SINKS)}
        d = "sink-discard"
        out.append(f"| {bs} | {dup} % | {totals[c]} | {f(m['null'])} | {f(m[d])} | "
                   f"{f(m['sink-copy'])} | {f(m['sink-land'])} | {f(m['sink-store'])} | "
                   f"{f(m['light'])} | {r3(runs.ratio(c, d, c, 'null'))} | "
                   f"{r3(runs.ratio(c, 'sink-copy', c, d))} | "
                   f"{r3(runs.ratio(c, 'sink-land', c, d))} | "
                   f"{r3(runs.ratio(c, 'sink-store', c, d))} | "
                   f"**{r3(runs.ratio(c, 'light', c, 'null'))}** | "
                   f"{r3(runs.ratio(c, 'light', c, 'sink-store'))} |")
    return out


def scale(tsv, cmd):
    runs, total = Runs(), 0
    for row in load(tsv):
        runs.add((row["layout"], int(row["jobs"])), row["system"], int(row["round"]), float(row["mibs"]))
        total = int(row["total_mib"])
    out = ["## Scaling with fio jobs: 1 MiB writes, 75 % duplicates, no writeback cache", "",
           f"`{cmd}` with bs 1m, DUP 75, {total} MiB in all (PER_JOB = {total} MiB / jobs); "
           "*distinct*: a file per job; *shared*: one file, `--filename=MNT/shared "
           f"--offset_increment=PER_JOB` (job i writes its own range). {runs.rounds()} rounds.", "",
           "| layout | jobs | null MiB/s | light MiB/s | light / null | null × of one job | "
           "light × of one job |", "|---|---:|---:|---:|---:|---:|---:|"]
    for layout in ("distinct", "shared"):
        for jobs in (1, 2, 4):
            c, c1 = (layout, jobs), (layout, 1)
            out.append(f"| {layout} | {jobs} | {f(runs.med(c, 'null'))} | {f(runs.med(c, 'light'))} | "
                       f"**{r3(runs.ratio(c, 'light', c, 'null'))}** | "
                       f"{r3(runs.ratio(c, 'null', c1, 'null'))} | {r3(runs.ratio(c, 'light', c1, 'light'))} |")
    out += ["", "Every run: `fs-ceiling/scale.tsv`.", ""]
    return out


def ktree(tsv, what):
    runs = Runs()
    for row in load(tsv):
        runs.add("cp", row["system"], int(row["round"]), float(row["seconds"]))
    out = [f"## Kernel tree: `cp -a` ({what})", "",
           "`cp -a SRC DIR/copy` from a copy of the tree in /dev/shm into each fresh file system, "
           f"{runs.rounds()} rounds; seconds (median) and ratios of per-round times.", "",
           "| system | seconds | vs passthrough | vs null |", "|---|---:|---:|---:|"]
    for s in ("null", "pass", "light", "tmpfs"):
        out.append(f"| {NAMES[s]} | {f(runs.med('cp', s), '%.2f')} | "
                   f"{r3(runs.ratio('cp', s, 'cp', 'pass'))} | {r3(runs.ratio('cp', s, 'cp', 'null'))} |")
    x = runs.ratio("cp", "light", "cp", "pass")
    out += ["", f"Acceptance: light ≤ 1.3 × passthrough: {r3(x)} {verdict(x, 1.3, at_most=True)}.",
            "", "Every run: `fs-ceiling/ktree.tsv`.", ""]
    return out


def meta(tsv):
    runs, files = Runs(), 0
    for row in load(tsv):
        rnd, s = int(row["round"]), row["system"]
        runs.add("create", s, rnd, float(row["create_s"]))
        runs.add("ls", s, rnd, float(row["ls_s"]))
        files = int(row["files"])
    out = [f"## Metadata: {files} files of 4 KiB in 1 000 directories, then `ls -lR`", "",
           f"`nodup-fuseref bench-files DIR/m --dirs 1000 --files {files} --size 4096` (one thread: "
           "mkdir, then create + write 4 KiB + close per file, every file's content distinct), "
           "then the file system is unmounted and mounted again (cold kernel caches; tmpfs stays "
           f"warm) and `ls -lR DIR/m >/dev/null` is timed. {runs.rounds()} rounds; seconds "
           "(median) and ratios of per-round times.", "",
           "| system | create s | files/s | ls -lR s | create vs passthrough | ls -lR vs passthrough |",
           "|---|---:|---:|---:|---:|---:|"]
    for s in ("pass", "light", "tmpfs"):
        c = runs.med("create", s)
        rate = f"{files / c:.0f}" if c else "-"
        out.append(f"| {NAMES[s]} | {f(c, '%.2f')} | {rate} | {f(runs.med('ls', s), '%.2f')} | "
                   f"{r3(runs.ratio('create', s, 'create', 'pass'))} | {r3(runs.ratio('ls', s, 'ls', 'pass'))} |")
    c, l = runs.ratio("create", "light", "create", "pass"), runs.ratio("ls", "light", "ls", "pass")
    out += ["", f"Acceptance: light ≤ 1.3 × passthrough: create {r3(c)} {verdict(c, 1.3, True)}, "
            f"ls -lR {r3(l)} {verdict(l, 1.3, True)}.", "", "Every run: `fs-ceiling/meta.tsv`.", ""]
    return out


def main():
    section, args = sys.argv[1], sys.argv[2:]
    out = {"fio": fio, "scale": scale, "ktree": ktree, "meta": meta}[section](*args)
    print("\n".join(out))


if __name__ == "__main__":
    main()
