#!/usr/bin/env bash
# The write-path figures of issue 3 that depend on the FUSE layer, measured back to back:
#   fio bs=4k, light, with vs without --writeback-cache (target >= 5x);
#   fio bs=1m, 0 % dups, light vs none (target >= 0.90);
#   fio bs=4k and 1m, none vs bindfs over tmpfs (target >= 0.8 at 4k).
# fio: ioengine=sync, rw=write, one job, end_fsync=1, 0 % duplicates; MiB/s, median of RUNS.
# With BDI=1 it also runs the writeback job with the mount's bdi set to max_ratio=100 and
# strict_limit=0 (is the kernel's FUSE dirty throttling the limit?). With DURABLE=1 it checks
# that data written through a writeback-cache mount survives kill -9 of the daemon after
# fsync and after a plain close.
#
# Usage: bench/fuse-writeback.sh   (env: RUNS=3 SIZE=1g NODUP=<binary> WORK=<dir in /dev/shm>
#                                   MNT=<mount point> BDI=0 DURABLE=0 NOBINDFS=0)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SIZE=${SIZE:-1g}
WORK=${WORK:-/dev/shm/nodup-fusewb}
MNT=${MNT:-/tmp/nodup-fusewb-mnt}
IMG=$WORK/img
IMG_SIZE=4G
if [[ -z ${NODUP:-} ]]; then
  cargo build --release -q -p nodup-cli
  NODUP=${CARGO_TARGET_DIR:-$PWD/target}/release/nodup
fi
command -v fio >/dev/null || { echo "fio is needed" >&2; exit 1; }

cleanup() {
  if mountpoint -q "$MNT"; then
    "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK" "$MNT"

source bench/lib.sh
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b+0 == 0) print "nan"; else printf "%.2f", a/b }'; }

# fio_bw DIR BS -> MiB/s of a sequential write of SIZE (all unique) with end_fsync.
fio_bw() {
  fio --name=w --directory="$1" --ioengine=sync --rw=write --bs="$2" --size="$SIZE" --numjobs=1 \
    --end_fsync=1 --dedupe_percentage=0 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw"]/1024))'
}

nodup_down() { "$NODUP" umount "$MNT"; rm -f "$IMG"; }
# The bdi of the mounted FUSE connection: /sys/class/bdi/<major:minor of the mount>.
bdi_dir() { echo "/sys/class/bdi/$(mountpoint -d "$MNT")"; }

# run KEY POLICY BS [mount args...]: one fio job on a fresh nodup mount.
declare -A BW
run() {
  local key=$1 policy=$2 bs=$3; shift 3
  nodup_fresh "$policy" "$@"
  if [[ $key == wb-bdi ]]; then
    echo 100 >"$(bdi_dir)/max_ratio"
    echo 0 >"$(bdi_dir)/strict_limit"
  fi
  BW[$key]+="$(fio_bw "$MNT" "$bs") "
  nodup_down
}
run_bindfs() {
  local key=$1 bs=$2
  mkdir -p "$WORK/bindsrc"
  bindfs "$WORK/bindsrc" "$MNT"
  BW[$key]+="$(fio_bw "$MNT" "$bs") "
  fusermount3 -u "$MNT"
  rm -rf "$WORK/bindsrc"
}
HAVE_BINDFS=0
[[ ${NOBINDFS:-0} != 1 ]] && command -v bindfs >/dev/null && HAVE_BINDFS=1

echo "fio runs: RUNS=$RUNS SIZE=$SIZE binary=$NODUP" >&2
nodup_fresh light --writeback-cache
echo "bdi $(mountpoint -d "$MNT"): max_ratio=$(cat "$(bdi_dir)/max_ratio") strict_limit=$(cat "$(bdi_dir)/strict_limit") max_bytes=$(cat "$(bdi_dir)/max_bytes" 2>/dev/null || echo -)" >&2
nodup_down
for r in $(seq "$RUNS"); do
  # Each group runs back to back so that the ratios see the same machine load.
  run light-4k light 4k
  run wb light 4k --writeback-cache
  [[ ${BDI:-0} == 1 ]] && run wb-bdi light 4k --writeback-cache
  run light-1m light 1m
  run none-1m none 1m
  run none-4k none 4k
  if [[ $HAVE_BINDFS == 1 ]]; then
    run_bindfs bindfs-4k 4k
    run_bindfs bindfs-1m 1m
  fi
  echo "run $r: $(for k in "${!BW[@]}"; do printf '%s=%s ' "$k" "$(echo "${BW[$k]}" | awk '{print $NF}')"; done)" >&2
done

med() { echo "${BW[$1]:-}" | tr ' ' '\n' | grep . | median; }
# RUNS=0 DURABLE=1: only the durability check.
if [[ $RUNS -gt 0 ]]; then
  echo "fio ioengine=sync rw=write numjobs=1 end_fsync=1 size=$SIZE, 0 % dups; MiB/s, median of $RUNS (all runs)"
  for k in light-4k wb wb-bdi light-1m none-1m none-4k bindfs-4k bindfs-1m; do
    [[ -n ${BW[$k]:-} ]] && printf '  %-10s %7.1f   (%s)\n' "$k" "$(med "$k")" "${BW[$k]% }"
  done
  echo "writeback cache, light 4k: $(ratio "$(med wb)" "$(med light-4k)")x   (target >= 5)"
  [[ -n ${BW[wb-bdi]:-} ]] && echo "  with bdi max_ratio=100 strict_limit=0: $(ratio "$(med wb-bdi)" "$(med light-4k)")x"
  echo "light/none 1m: $(ratio "$(med light-1m)" "$(med none-1m)")   (target >= 0.90)"
  if [[ $HAVE_BINDFS == 1 ]]; then
    echo "none/bindfs 4k: $(ratio "$(med none-4k)" "$(med bindfs-4k)")   (target >= 0.8); 1m: $(ratio "$(med none-1m)" "$(med bindfs-1m)")"
  fi
fi

if [[ ${DURABLE:-0} == 1 ]]; then
  # Written through the writeback cache, then the daemon is killed: what fsync (or close,
  # which flushes the file's dirty pages to the daemon) returned must be on the image.
  nodup_fresh light --writeback-cache
  head -c 64M /dev/urandom >"$WORK/ref"
  dd if="$WORK/ref" of="$MNT/synced" bs=4k conv=fsync status=none
  cp "$WORK/ref" "$MNT/closed"
  # The daemon's command line is "<binary> mount IMG MNT ...", whatever the binary is called.
  pid=$(pgrep -f -- " mount $IMG $MNT" | head -1)
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT"
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  for f in synced closed; do
    if cmp -s "$WORK/ref" "$MNT/$f"; then echo "durable after kill -9 ($f): yes"; else echo "durable after kill -9 ($f): NO"; fi
  done
  nodup_down
  rm -f "$WORK/ref"
fi
