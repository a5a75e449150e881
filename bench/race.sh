#!/usr/bin/env bash
# Issue 15, item 7: concurrent identical first writes are stored once (the hash lock).
#
# 1. Engine: `nodup bench race` — 4 threads write the same 256 MiB of unique blocks at once,
#    1 MiB and 128 KiB calls, RUNS fresh pmem images in /dev/shm each; figure: physical / size.
# 2. Mount: 4 `dd` processes copy the same 256 MiB file into 4 new files of one fresh mount at
#    once (pmem and blockfile images in /dev/shm), then `nodup stats`: physical / size.
# Target: at most 1.05 everywhere.
#
# Usage: bench/race.sh   (RUNS=5 SIZE=256MiB NODUP=<binary> OUT=<markdown file>)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
SIZE=${SIZE:-256MiB}
OUT=${OUT:-docs/results/race.md}
WORK=${WORK:-/dev/shm/nodup-race}
MNT=${MNT:-/tmp/nodup-race-mnt}
if [[ -z ${NODUP:-} ]]; then
  bash scripts/deps.sh
  cargo build --release -q -p nodup-cli
  NODUP=${CARGO_TARGET_DIR:-$PWD/target}/release/nodup
fi
source bench/lib.sh
cleanup() {
  if mountpoint -q "$MNT"; then "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
rm -rf "$WORK"; mkdir -p "$WORK" "$MNT"
MIB=${SIZE%MiB}
[[ $MIB =~ ^[0-9]+$ ]] || { echo "SIZE must be given in MiB, e.g. 256MiB" >&2; exit 2; }

{
echo "# Concurrent identical first writes (issue 15, item 7)"
echo
echo "Binary $NODUP ($("$NODUP" --version 2>/dev/null || true)), tree $(bench_tree), $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
echo "Target: physical bytes / data size ≤ 1.05 with 4 writers of the same data."
echo
echo "## Engine (\`nodup bench race\`, pmem image in /dev/shm, $RUNS runs)"
echo
if "$NODUP" bench race --help >/dev/null 2>&1; then
  for call in 1MiB 128KiB; do
    echo "- \`nodup bench race --size $SIZE --threads 4 --call $call --runs $RUNS\`:"
    echo "  $("$NODUP" bench race --size "$SIZE" --threads 4 --call "$call" --runs "$RUNS" --dir "$WORK")"
  done
else
  echo "(this binary has no \`nodup bench race\`: engine part skipped)"
fi
echo
echo "## Mount (4 concurrent \`dd bs=1M conv=fsync\` of the same $MIB MiB file into one fresh mount)"
echo
echo "| image | run | physical / size |"
echo "|---|---:|---:|"
head -c "$((MIB << 20))" /dev/urandom >"$WORK/src"
worst=0
for kind in pmem blockfile; do
  for r in $(seq 1 "$RUNS"); do
    rm -f "$WORK/img"
    "$NODUP" mkfs "$WORK/img" --size $((MIB * 6 + 512))M --medium "$kind" >/dev/null
    "$NODUP" mount "$WORK/img" "$MNT" >/dev/null
    for k in 1 2 3 4; do dd if="$WORK/src" of="$MNT/f$k" bs=1M conv=fsync status=none & done
    wait
    phys=$("$NODUP" stats "$MNT" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['physical_bytes'])")
    ratio=$(python3 -c "print(f'{$phys / ($MIB << 20):.4f}')")
    for k in 1 2 3 4; do cmp -s "$WORK/src" "$MNT/f$k" || { echo "f$k differs from its source" >&2; exit 1; }; done
    "$NODUP" umount "$MNT" >/dev/null
    echo "| $kind | $r | $ratio |"
    worst=$(python3 -c "print(max($worst, $ratio))")
  done
done
echo
echo "Largest mounted ratio: $worst ($(python3 -c "print('met' if $worst <= 1.05 else 'NOT met')"))."
} | tee "$OUT"
