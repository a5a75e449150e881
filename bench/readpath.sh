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
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
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
    if [[ $policy == smart ]]; then smart_settle; fi
  else
    $EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs=1m --size="${FILE_MIB}M" \
      --numjobs="$files" --dedupe_percentage="$dup" --end_fsync=1 --fallocate=none >/dev/null 2>&1
  fi
  local ratio
  ratio=$(nodup_stat "'%.3f' % s['dedup_ratio']")
  "$NODUP" umount "$MNT" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  local r0 bw r1
  r0=$(nodup_stat "s['media_bytes_read']")
  bw=$($EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=read --bs=1m --size="${FILE_MIB}M" \
    --numjobs="$files" --group_reporting --output-format=json 2>/dev/null |
    fio_mibs_of read)
  r1=$(nodup_stat "s['media_bytes_read']")
  "$NODUP" umount "$MNT" >/dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$case" "$policy" "$dup" "$files" "$bw" "$(((r1 - r0) >> 20))" "$ratio" >>"$tsv"
  say "round $r: $case $policy: read $bw MiB/s, $(((r1 - r0) >> 20)) MiB from the medium (dedup $ratio)"
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
machine=$(machine_line)
python3 bench/readpath_report.py "$tsv" "$machine" "$(bench_tree)" "$OUT" "$FILE_MIB"
say "wrote $OUT/readpath.md"
