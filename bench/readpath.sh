#!/usr/bin/env bash
# Issue 21, Read path: cold sequential reads of deduplicated data against `none` (what
# deduplication costs a reader: a file's blocks are scattered where their first copies were
# written), and two files with the same contents read in lockstep with `smart`'s dedup-aware
# read cache. Each row: a fresh image in /dev/shm, files written by fio, the file system
# unmounted and mounted again (cold page cache and engine caches), then fio reads everything
# back (1 MiB sequential reads, one job per file).
#
# Usage: bench/readpath.sh   (QUICK=1: 256 MiB per file, the `make bench` size; default 1 GiB;
#   RUNS=3 rounds; NODUP= skips the build)
# Writes docs/results/readpath.md and readpath/readpath.tsv; readpath/reading.md (hand-written)
# is appended.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-3}
FILE_MIB=${FILE_MIB:-$([[ $QUICK == 1 ]] && echo 256 || echo 1024)}
OUT=docs/results
say() { echo "readpath: $*" >&2; }

systems_setup readpath fio:fio
mkdir -p "$OUT/readpath"
tsv=$OUT/readpath/readpath.tsv
printf 'round\tcase\tpolicy\twrite_dup\tfiles\tread_mibs\tmedia_read_mib\tdedup_ratio\n' >"$tsv"

# one CASE POLICY DUP FILES: write FILES files of FILE_MIB (fio, DUP % duplicates; FILES=2 with
# DUP=same writes two files of the same contents), remount, read them back.
one() {
  local case=$1 policy=$2 dup=$3 files=$4 extra=()
  [[ $policy == smart ]] && extra=(--mem-budget 3M)
  rm -f "$IMG"
  "$NODUP" mkfs "$IMG" --size "$((FILE_MIB * files * 2 + 1024))M" --policy "$policy" "${extra[@]}" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  if [[ $dup == same ]]; then
    # fio's first job file, then a copy of it under the second job's name: the same contents,
    # which the copy shares (copy_file_range or dedup, whichever the copy takes).
    $EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs=1m --size="${FILE_MIB}M" \
      --numjobs=1 --end_fsync=1 --fallocate=none >/dev/null 2>&1
    cp "$MNT/w.0.0" "$MNT/w.1.0"
    [[ $policy == smart ]] && { "$NODUP" ctl "$MNT" --worker-rate 1000000 >/dev/null; settle_smart; }
  else
    $EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs=1m --size="${FILE_MIB}M" \
      --numjobs="$files" --dedupe_percentage="$dup" --end_fsync=1 --fallocate=none >/dev/null 2>&1
  fi
  local ratio
  ratio=$("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["dedup_ratio"])')
  "$NODUP" umount "$MNT" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  local r0 bw r1
  r0=$("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["media_bytes_read"])')
  bw=$($EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=read --bs=1m --size="${FILE_MIB}M" \
    --numjobs="$files" --group_reporting --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw"] / 1024))')
  r1=$("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["media_bytes_read"])')
  "$NODUP" umount "$MNT" >/dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$case" "$policy" "$dup" "$files" "$bw" "$(((r1 - r0) >> 20))" "$ratio" >>"$tsv"
  say "round $r: $case $policy: read $bw MiB/s, $(((r1 - r0) >> 20)) MiB from the medium (dedup $ratio)"
}
settle_smart() {
  local i
  for ((i = 0; i < 3000; i++)); do
    [[ $("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["smart"]["fs"]["idle"])') == True ]] && return 0
    sleep 0.2
  done
  say "smart's worker did not settle"
  return 1
}

for ((r = 1; r <= RUNS; r++)); do
  for d in 0 75; do
    one "one file, $d % duplicates" none "$d" 1
    one "one file, $d % duplicates" light "$d" 1
  done
  one "two identical files, read together" none same 2
  one "two identical files, read together" light same 2
  one "two identical files, read together" smart same 2
done
machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/^Mem/ {print $2}') GiB RAM, kernel $(uname -r)"
python3 - "$tsv" "$machine" "$(git rev-parse --short HEAD)" "$OUT" "$FILE_MIB" <<'PY'
import csv, statistics, sys
from collections import defaultdict
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
try:
    md += ["", open(f"{out}/readpath/reading.md").read()]
except FileNotFoundError:
    pass
open(f"{out}/readpath.md", "w").write("\n".join(md))
PY
say "wrote $OUT/readpath.md"
