#!/usr/bin/env bash
# A/B of two nodup binaries on cold reads through a mount: a pmem image in /dev/shm (SIZE,
# default 4G) gets two files of DATA MiB of new data written 1 MiB each in turn (so their
# blocks alternate in the image), one is deleted and the image unmounted (its blocks are then
# holes between the other's: the chunks hold data and holes). Then RUNS rounds, each mounting
# the image with A and with B (the order alternating) and reading the remaining file once
# (cold: a new mount has no cached pages). Prints every run (MiB/s) and the medians and B/A.
# Usage: bench/read-ab.sh OLD_BINARY NEW_BINARY   (RUNS=7 SIZE=4G DATA=1024)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
A=${1:?old binary}; B=${2:?new binary}
RUNS=${RUNS:-7}; SIZE=${SIZE:-4G}; DATA=${DATA:-1024}
dir=$(mktemp -d /dev/shm/nodup-read-ab.XXXXXX); mnt=$(mktemp -d /tmp/nodup-read-ab-mnt.XXXXXX)
trap 'fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$dir"; rmdir "$mnt"' EXIT
"$A" mkfs --medium pmem --size "$SIZE" --force "$dir/img" >/dev/null
"$A" mount "$dir/img" "$mnt" >/dev/null
head -c "${DATA}M" /dev/urandom >"$dir/src"
for i in $(seq 0 $((DATA - 1))); do
  for f in keep gone; do
    dd if="$dir/src" of="$mnt/$f" bs=1M skip="$i" seek="$i" count=1 conv=notrunc status=none
  done
done
rm "$mnt/gone" "$dir/src"
"$A" umount "$mnt"
now() { date +%s.%N; }
rows=()
for r in $(seq "$RUNS"); do
  order=(A B); ((r % 2)) || order=(B A)
  for side in "${order[@]}"; do
    bin=${!side}
    "$bin" mount "$dir/img" "$mnt" >/dev/null
    t0=$(now); cat "$mnt/keep" >/dev/null; t1=$(now)
    "$bin" umount "$mnt"
    row=$(awk -v s="$side" -v r="$r" -v t="$(echo "$t1 - $t0" | bc)" -v d="$DATA" \
      'BEGIN { printf "%s %d %.0f", s, r, d / t }')
    echo "$row"; rows+=("$row")
  done
done
a=$(median_col A 3 "${rows[@]}"); b=$(median_col B 3 "${rows[@]}")
awk -v a="$a" -v b="$b" 'BEGIN { printf "median MiB/s of a cold read: A %.0f B %.0f (B/A %.3f)\n", a, b, b / a }'
