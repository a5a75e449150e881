#!/usr/bin/env bash
# fio through a `light` (or POLICY) mount with glibc's default bound on malloc arenas (A:
# MALLOC_ARENA_MAX = eight per CPU, glibc's default bound, about one per daemon thread) against
# MALLOC_ARENA_MAX=B_ARENAS (B; default: one per CPU), interleaved cell by cell, the order
# alternating from round to round; a fresh image in /dev/shm per run. Prints every run and each
# cell's median MiB/s and B/A (median, min, max of the per-round ratios). Pair it with
# `bench/smart.sh budget` or `bench/memory-phases.sh` under the same MALLOC_ARENA_MAX for the
# memory side.
# Usage: bench/malloc-arenas-ab.sh   (RUNS=5; B_ARENAS=N; POLICY=light; NODUP=binary)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_nodup
RUNS=${RUNS:-5}
B_ARENAS=${B_ARENAS:-$(nproc)}
POLICY=${POLICY:-light}
A_ARENAS=$((8 * $(getconf _NPROCESSORS_ONLN)))
scratch_mount arenas
run() { # BS JOBS DUP SIZE: MiB/s of one fio run on a fresh image
  rm -f "$W/img"
  "$NODUP" mkfs "$W/img" --size 4G --policy "$POLICY" >/dev/null
  "$NODUP" mount "$W/img" "$MNT" >/dev/null
  fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs="$1" --size="$4" --numjobs="$2" \
    --end_fsync=1 --fallocate=none --dedupe_percentage="$3" --group_reporting \
    --output-format=terse 2>/dev/null | awk -F';' '{printf "%.0f", $48/1024}'
  "$NODUP" umount "$MNT" >/dev/null
}
out=$W/runs
for r in $(seq 1 "$RUNS"); do
  for cell in "1m 1 75 512M" "1m 2 75 256M" "4k 1 75 128M" "4k 2 75 64M" "1m 1 0 512M"; do
    set -- $cell
    if ((r % 2)); then
      a=$(MALLOC_ARENA_MAX=$A_ARENAS run "$@"); b=$(MALLOC_ARENA_MAX=$B_ARENAS run "$@")
    else
      b=$(MALLOC_ARENA_MAX=$B_ARENAS run "$@"); a=$(MALLOC_ARENA_MAX=$A_ARENAS run "$@")
    fi
    echo "$r $1 j$2 d$3 A=$a B=$b" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import re, statistics as st, sys
rows = {}
for l in open(sys.argv[1]):
    m = re.match(r"\d+ (\S+) (\S+) (\S+) A=(\d+) B=(\d+)", l)
    rows.setdefault(m.group(1, 2, 3), []).append((int(m[4]), int(m[5])))
print("| bs | jobs | dups | A MiB/s | B MiB/s | B/A median (min-max) |")
print("|---|---|---|---:|---:|---|")
for (bs, j, d), v in rows.items():
    r = [b / a for a, b in v if a]
    print(f"| {bs} | {j[1:]} | {d[1:]} % | {st.median(a for a, _ in v)} | {st.median(b for _, b in v)} | {st.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) |")
PY
