#!/usr/bin/env bash
# Issue 21, Memory (Light-Dedup §6; SmartDedup's fixed budgets): dedup index memory against
# data written. `light` keeps every unique block's fingerprint in DRAM, so its index grows with
# the unique data; `smart` keeps its structures inside --mem-budget whatever the data. For each
# size and duplication level: a fresh image in /dev/shm, fio through the mount (1 MiB writes,
# files of 256 MiB), then the daemon's own report: index memory (light) or dedup memory
# (smart's total), index entries, daemon anonymous memory, block maps.
#
# Usage: bench/memory.sh   (QUICK=1: 256 MiB and 1 GiB, the `make bench` size; default
#   1, 2, 4 and 8 GiB; SIZES="..." in MiB, DUPS="0 25 50 75", BUDGETS="512K 3M" override;
#   NODUP= skips the build)
# Writes docs/results/memory.md, memory/memory.tsv and memory/memory.png; memory/reading.md
# (hand-written) is appended.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_matplotlib
source bench/systems.sh
QUICK=${QUICK:-0}
SIZES=${SIZES:-$([[ $QUICK == 1 ]] && echo "256 1024" || echo "1024 2048 4096 8192")}
DUPS=${DUPS:-"0 25 50 75"}
BUDGETS=${BUDGETS:-"512K 3M"}
OUT=docs/results
say() { echo "memory: $*" >&2; }

systems_setup memory fio:fio
mkdir -p "$OUT/memory"
tsv=$OUT/memory/memory.tsv
printf 'policy\tbudget\tdup\tdata_mib\tunique_blocks\tdedup_memory_bytes\tdaemon_anon_bytes\tblock_map_bytes\n' >"$tsv"

# one POLICY BUDGET DUP MIB: fill a fresh image and record the daemon's memory report.
one() {
  local policy=$1 budget=$2 dup=$3 mib=$4 extra=()
  [[ $budget != - ]] && extra=(--mem-budget "$budget")
  rm -f "$IMG"
  "$NODUP" mkfs "$IMG" --size "$((mib * 2 + 1024))M" --policy "$policy" "${extra[@]}" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  local files=$(((mib + 255) / 256))
  $EXCL fio --name=fill --directory="$MNT" --ioengine=sync --rw=write --bs=1m --size="$((mib / files))M" \
    --numjobs="$files" --dedupe_percentage="$dup" --end_fsync=1 --fallocate=none >/dev/null 2>&1
  local row
  row=$("$NODUP" stats "$MNT" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)
mem = s['smart']['memory']['total_bytes'] if 'smart' in s else s['index_memory_bytes']
unique = s['physical_bytes'] // s['block_size']
print(f\"{unique}\t{mem}\t{s['daemon_anon_bytes']}\t{s['block_map_bytes']}\")")
  "$NODUP" umount "$MNT" >/dev/null
  printf '%s\t%s\t%s\t%s\t%s\n' "$policy" "$budget" "$dup" "$mib" "$row" >>"$tsv"
  say "$policy budget $budget, $dup % duplicates, $mib MiB: $(cut -f2 <<<"$row") bytes of dedup memory"
}

for mib in $SIZES; do
  for dup in $DUPS; do one light - "$dup" "$mib"; done
  for b in $BUDGETS; do one smart "$b" 50 "$mib"; done
done
machine=$(machine_line)
python3 bench/memory_report.py "$tsv" "$machine" "$(bench_tree)" "$OUT"
say "wrote $OUT/memory.md"
