#!/usr/bin/env bash
# A/B of two nodup binaries on the mounted write path: fio (sync writes, one job, end_fsync)
# on a fresh pmem image in /dev/shm per run, the two binaries interleaved run by run so machine
# noise hits both alike; prints each point's median MiB/s and the ratio B/A.
# Usage: bench/ab-binaries.sh OLD_BINARY NEW_BINARY   (RUNS=5 SIZE=512m POINTS="1m:0 1m:75 4k:0")
#   A_MOUNT / B_MOUNT: extra `nodup mount` options of each side, e.g. one binary against itself
#   with B_MOUNT=--async-writes; A_MKFS / B_MKFS: extra `nodup mkfs` options, e.g. one binary
#   against itself with A_MKFS="--policy none" (B/A is then light / none). FIO_ARGS: extra fio
#   options for every run, e.g. FIO_ARGS=--fsync=16 (an fsync every 16 writes) with
#   A_MKFS=B_MKFS="--medium blockfile" to weigh what each fence of a block-file image costs.
#   IMG_DIR: where the image goes (default /dev/shm; a directory on a disk for a block-file
#   image there).
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
A=${1:?old binary}
B=${2:?new binary}
RUNS=${RUNS:-5}
SIZE=${SIZE:-512m}
POINTS=${POINTS:-"1m:0 1m:75 4k:0"}
IMG=${IMG_DIR:-/dev/shm}/nodup-ab.img
MNT=/tmp/nodup-ab-mnt
mkdir -p "$MNT"
source bench/lib.sh
cleanup() { mountpoint -q "$MNT" && fusermount3 -u -z "$MNT" || true; rm -f "$IMG"; }
trap cleanup EXIT
read -ra A_OPTS <<<"${A_MOUNT:-}"
read -ra B_OPTS <<<"${B_MOUNT:-}"
read -ra A_MK <<<"${A_MKFS:-}"
read -ra B_MK <<<"${B_MKFS:-}"
read -ra FIO_EXTRA <<<"${FIO_ARGS:-}"
one() { # one SIDE BS DUP: MiB/s of one fio run of side A or B
  local bin bs=$2 dup=$3 out mk mount
  if [[ $1 == A ]]; then bin=$A mk=("${A_MK[@]}") mount=("${A_OPTS[@]}"); else bin=$B mk=("${B_MK[@]}") mount=("${B_OPTS[@]}"); fi
  rm -f "$IMG"
  "$bin" mkfs "$IMG" --size 2G "${mk[@]}" >/dev/null
  "$bin" mount "$IMG" "$MNT" "${mount[@]}" >/dev/null
  out=$(fio --name=w --directory="$MNT" --rw=write --bs="$bs" --size="$SIZE" --ioengine=psync \
    --end_fsync=1 --dedupe_percentage="$dup" "${FIO_EXTRA[@]}" --output-format=json)
  "$bin" umount "$MNT"
  python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["jobs"][0]["write"]["bw"]/1024)' <<<"$out"
}
echo "| point | A MiB/s | B MiB/s | B/A |"
echo "|---|---:|---:|---:|"
for p in $POINTS; do
  bs=${p%%:*}; dup=${p##*:}
  ra=() rb=()
  for r in $(seq "$RUNS"); do
    if ((r % 2)); then ra+=("$(one A "$bs" "$dup")"); rb+=("$(one B "$bs" "$dup")")
    else rb+=("$(one B "$bs" "$dup")"); ra+=("$(one A "$bs" "$dup")"); fi
  done
  ma=$(printf '%s\n' "${ra[@]}" | median); mb=$(printf '%s\n' "${rb[@]}" | median)
  echo "| $bs ${dup}% | $(printf '%.1f' "$ma") | $(printf '%.1f' "$mb") | $(python3 -c "print('%.3f' % ($mb / $ma))") |"
done
