#!/usr/bin/env bash
# Issue 21, Prefetch breakdown (Light-Dedup Fig. 10a and Fig. 11): the same data written twice,
# the second write measured, for each of `light`'s seven prefetch variants (none = the paper's
# NP / LD-w/o-P, p64, ibp, pc, sp, pn, cbp) at 1-4 writer threads.
#   - engine: `nodup bench engine` (no FUSE, one thread), its variant table: pass 2 of a unique
#     stream (Fig. 10a's setting);
#   - mount: fio, JOBS writers each writing its own file of SIZE_MIB with 1 MiB calls, then the
#     same files again in another directory (same seed and job name, so the same contents): the second run's
#     aggregate MiB/s (Fig. 11's setting, 1-4 threads on 2 cores).
# Each mount row: a fresh `light` image in /dev/shm mounted with `--prefetch VARIANT`.
#
# Usage: bench/prefetch.sh   (QUICK=1: 128 MiB per writer and a 256 MiB engine stream, the
#   `make bench` size; default 512 MiB and 2 GiB; RUNS=3 rounds, variants rotated each round;
#   THREADS="1 2 3 4"; NODUP= skips the build)
# Writes docs/results/prefetch.md, prefetch/prefetch.tsv and prefetch/engine.json;
# prefetch/reading.md (hand-written) is appended.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_matplotlib
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-$([[ $QUICK == 1 ]] && echo 128 || echo 512)}
ENGINE_SIZE=${ENGINE_SIZE:-$([[ $QUICK == 1 ]] && echo 256MiB || echo 2GiB)}
THREADS=${THREADS:-1 2 3 4}
VARIANTS="none p64 ibp pc sp pn cbp"
OUT=docs/results
say() { echo "prefetch: $*" >&2; }

systems_setup prefetch fio:fio
mkdir -p "$OUT/prefetch"
tsv=$OUT/prefetch/prefetch.tsv
printf 'round\tthreads\tvariant\tsecond_mibs\tfirst_mibs\tdedup_ratio\n' >"$tsv"

say "engine variants ($ENGINE_SIZE, $RUNS runs)"
$EXCL "$NODUP" bench engine --size "$ENGINE_SIZE" --runs "$RUNS" --policy light --dup 100 \
  --json >"$OUT/prefetch/engine.json"

# fio_pass DIR JOBS: JOBS writers of SIZE_MIB each into DIR (created), fixed seed and job name
# (fio derives the contents from both), so every DIR gets the same contents; MiB/s.
fio_pass() {
  mkdir -p "$1"
  $EXCL fio --name=w --directory="$1" --ioengine=sync --rw=write --bs=1m --size="${SIZE_MIB}M" \
    --numjobs="$2" --randseed=7 --refill_buffers --scramble_buffers=0 --end_fsync=1 --fallocate=none --group_reporting \
    --output-format=json 2>/dev/null |
    fio_mibs_of write
}

IMG_SIZE=$((SIZE_MIB * 4 * 2 + 1024))M
for ((r = 1; r <= RUNS; r++)); do
  for t in $THREADS; do
    for v in $(rotate "$r" $VARIANTS); do
      rm -f "$IMG"
      "$NODUP" mkfs "$IMG" --size "$IMG_SIZE" --policy light >/dev/null
      "$NODUP" mount "$IMG" "$MNT" --prefetch "$v" >/dev/null
      first=$(fio_pass "$MNT/first" "$t")
      second=$(fio_pass "$MNT/second" "$t")
      ratio=$(nodup_stat "'%.3f' % s['dedup_ratio']")
      "$NODUP" umount "$MNT" >/dev/null
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$t" "$v" "$second" "$first" "$ratio" >>"$tsv"
      say "round $r: $t threads, $v: second write $second MiB/s (first $first), dedup $ratio"
    done
  done
done
rm -f "$IMG"

machine=$(machine_line)
python3 bench/prefetch_report.py "$tsv" "$OUT/prefetch/engine.json" "$machine" \
  "$(bench_tree)" "$OUT" "$SIZE_MIB" "$ENGINE_SIZE"
say "wrote $OUT/prefetch.md"
