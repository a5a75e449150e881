#!/usr/bin/env bash
# What giving freed space back at unmount costs: 100 000 files of 4 KiB (unique data, 100
# directories) on a fresh 2 GiB pmem image in /dev/shm, unmounted, mounted again, every other
# file deleted (50 000 one-block holes: the most fragmented free space a delete leaves), then
# the wall time of `nodup umount` and the image file's allocated size after it. The two
# binaries (one with the discard at unmount, one without) run interleaved, RUNS rounds.
# Usage: bench/unmount-punch.sh BINARY_WITHOUT BINARY_WITH   (RUNS=3)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
A=${1:?binary without the discard}
B=${2:?binary with the discard}
RUNS=${RUNS:-3}
IMG=/dev/shm/nodup-punch.img
MNT=/tmp/nodup-punch-mnt
mkdir -p "$MNT"
source "$(dirname "$0")/lib.sh"
cleanup() { mountpoint -q "$MNT" && fusermount3 -u -z "$MNT" || true; rm -f "$IMG"; }
trap cleanup EXIT
one() { # one BINARY: "<umount seconds> <image MiB>"
  local n=$1 t0 t1
  rm -f "$IMG"
  "$n" mkfs "$IMG" --size 2G >/dev/null
  "$n" mount "$IMG" "$MNT" >/dev/null
  small_files "$MNT"
  "$n" umount "$MNT"
  "$n" mount "$IMG" "$MNT" >/dev/null
  every_other_gone "$MNT"
  t0=$(date +%s.%N)
  "$n" umount "$MNT"
  t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc) $(( $(stat -c %b "$IMG") * 512 / 1048576 ))"
}
declare -a ta tb
for r in $(seq "$RUNS"); do
  read -r t s < <(one "$A"); ta+=("$t"); sa=$s
  read -r t s < <(one "$B"); tb+=("$t"); sb=$s
  echo "round $r: without ${ta[-1]} s ($sa MiB held), with ${tb[-1]} s ($sb MiB held)"
done
ma=$(median_of "${ta[*]}") mb=$(median_of "${tb[*]}")
echo "median umount: without $ma s, with $mb s (+$(echo "$mb - $ma" | bc) s); image after: without $sa MiB, with $sb MiB"
