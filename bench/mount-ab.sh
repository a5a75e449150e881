#!/usr/bin/env bash
# A/B of two nodup binaries on mount and unmount of one image: a MEDIUM image (default pmem)
# in DIR (default /dev/shm; a directory on a disk shows what the page cache gives a remount)
# of SIZE (default 16G) with DATA MiB of new data written through a mount, then RUNS rounds,
# each mounting and unmounting it with A then B. Prints every run (wall time of `nodup mount`
# and `nodup umount`, the recovery time the mount reports) and the medians and B/A.
# With READ=1 each round reads the data back (not timed) before the unmount, so the image's
# pages are in the page cache when the next mount opens it.
# Usage: bench/mount-ab.sh OLD_BINARY NEW_BINARY   (RUNS=7 SIZE=16G DATA=512 MEDIUM=pmem
#   DIR=/dev/shm READ=0)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
A=${1:?old binary}; B=${2:?new binary}
RUNS=${RUNS:-7}; SIZE=${SIZE:-16G}; DATA=${DATA:-512}; MEDIUM=${MEDIUM:-pmem}
dir=$(mktemp -d "${DIR:-/dev/shm}/nodup-mount-ab.XXXXXX"); mnt=$(mktemp -d /tmp/nodup-mount-ab-mnt.XXXXXX)
trap 'fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$dir"; rmdir "$mnt"' EXIT
"$A" mkfs --medium "$MEDIUM" --size "$SIZE" --force "$dir/img" >/dev/null
"$A" mount "$dir/img" "$mnt" >/dev/null
dd if=/dev/urandom of="$mnt/f" bs=1M count="$DATA" status=none
"$A" umount "$mnt"
now() { date +%s.%N; }
rows=()
for r in $(seq "$RUNS"); do
  for side in A B; do
    bin=${!side}
    t0=$(now); out=$("$bin" mount "$dir/img" "$mnt"); t1=$(now)
    rec=$(grep -o 'recovery [0-9.]* [mu]s' <<<"$out" | awk '{print ($3 == "us") ? $2 / 1000 : $2}')
    [[ ${READ:-0} == 1 ]] && cat "$mnt/f" >/dev/null
    t2=$(now); "$bin" umount "$mnt"; t3=$(now)
    row=$(awk -v s="$side" -v r="$r" -v m="$(echo "$t1 - $t0" | bc)" -v u="$(echo "$t3 - $t2" | bc)" \
      -v c="$rec" 'BEGIN { printf "%s %d %.1f %.1f %.2f", s, r, m * 1000, u * 1000, c }')
    echo "$row"; rows+=("$row")
  done
done
med() { median_col "$1" "$2" "${rows[@]}"; }
awk -v ma="$(med A 3)" -v mb="$(med B 3)" -v ua="$(med A 4)" -v ub="$(med B 4)" \
  -v ca="$(med A 5)" -v cb="$(med B 5)" \
  'BEGIN { printf "median ms: mount A %.1f B %.1f (B/A %.3f); umount A %.1f B %.1f (%.3f); recovery A %.2f B %.2f (%.3f)\n",
    ma, mb, mb / ma, ua, ub, ub / ua, ca, cb, cb / ca }'
