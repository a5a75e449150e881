#!/usr/bin/env bash
# What `fstrim` on a nodup mount costs (bench/fstrim.sh, RUNS=3):
#  1. Fragmented free space: 100 000 files of 4 KiB (unique data, 100 directories) on a fresh
#     2 GiB pmem image in /dev/shm, every other one deleted (50 000 one-block holes), then
#     `fstrim` on the mount: its wall time, the image file's allocated size before and after,
#     a second `fstrim` (nothing new to give back), and the size again after some more
#     activity (2 000 of the remaining files overwritten, 500 new ones): what of the given-back
#     space the image takes back as the mount goes on.
#  2. A writer beside it: fio writing 2 GiB in 1 MiB requests (75 % duplicates, one job, a
#     fresh 4 GiB image per run) alone, and with `fstrim` every 0.2 s on the same mount (each
#     gives back the free rest of the image, which on pmem also undoes the backing prepared
#     ahead of the writer); medians of RUNS interleaved rounds (which goes first alternates),
#     and their ratio.
# MEDIUM=blockfile IMG_DIR=/var/tmp runs both on a block-file image on the root disk instead
# (each given-back run is an fallocate hole punch there).
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
RUNS=${RUNS:-3}
N=${NODUP:-target/release/nodup}
[[ -x $N ]] || cargo build --release -p nodup-cli >&2
[[ $EUID == 0 ]] || { echo "bench/fstrim.sh: fstrim on a mount needs root" >&2; exit 1; }
command -v fio >/dev/null || apt-get install -y fio >&2
command -v bc >/dev/null || apt-get install -y bc >&2
MEDIUM=${MEDIUM:-pmem}
IMG=${IMG_DIR:-/dev/shm}/nodup-fstrim.img
MNT=/tmp/nodup-fstrim-mnt
mkdir -p "$MNT"
cleanup() { mountpoint -q "$MNT" && fusermount3 -u -z "$MNT" || true; rm -f "$IMG"; }
trap cleanup EXIT
held() { echo $(( $(stat -c %b "$IMG") * 512 / 1048576 )); }
secs() { # secs CMD...: its wall time; the script stops if it fails
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null || { echo "bench/fstrim.sh: $* failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  printf '%.3f\n' "$(echo "$t1 - $t0" | bc)"
}

fragmented() { # "<fstrim s> <second fstrim s> <MiB before> <MiB after> <MiB after more writes>"
  rm -f "$IMG"
  "$N" mkfs "$IMG" --size 2G --medium "$MEDIUM" >/dev/null
  "$N" mount "$IMG" "$MNT" >/dev/null
  small_files "$MNT"
  every_other_gone "$MNT"
  local before first second after
  before=$(held)
  first=$(secs fstrim "$MNT")
  after=$(held)
  second=$(secs fstrim "$MNT")
  python3 - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
for d in range(100):
    for i in range(1, 1000, 50):
        with open(f"{m}/d{d}/f{i}", "r+b") as f:
            f.write(os.urandom(4096))
    for i in range(5):
        with open(f"{m}/d{d}/n{i}", "wb") as f:
            f.write(os.urandom(4096))
PY
  sync "$MNT"
  local later
  later=$(held)
  "$N" umount "$MNT"
  echo "$first $second $before $after $later"
}

writer() { # writer 0|1: MiB/s of fio; with fstrim every 0.2 s when 1, then also the fstrim runs
  rm -f "$IMG"
  "$N" mkfs "$IMG" --size 4G --medium "$MEDIUM" >/dev/null
  "$N" mount "$IMG" "$MNT" >/dev/null
  local loop="" stop=/tmp/nodup-fstrim.stop count=/tmp/nodup-fstrim.count
  rm -f "$stop" "$count"
  if [[ $1 == 1 ]]; then
    ( n=0; while [[ ! -e $stop ]]; do fstrim "$MNT" && n=$((n + 1)); sleep 0.2; done; echo "$n" > "$count" ) &
    loop=$!
  fi
  local bw
  bw=$(fio --name=w --directory="$MNT" --rw=write --bs=1m --size=2G --dedupe_percentage=75 \
    --ioengine=psync --end_fsync=1 --output-format=json | fio_mibs_of write)
  if [[ -n $loop ]]; then
    touch "$stop"; wait "$loop"
    bw="$bw $(cat "$count")"
    rm -f "$stop" "$count"
  fi
  "$N" umount "$MNT"
  echo "$bw"
}

declare -a f1 f2 wa wb
for r in $(seq "$RUNS"); do
  read -r a b before after later < <(fragmented)
  f1+=("$a"); f2+=("$b")
  # Which runs first alternates, so neither always follows the bigger image's removal.
  if (( r % 2 )); then
    wa+=("$(writer 0)"); read -r w n < <(writer 1); wb+=("$w")
  else
    read -r w n < <(writer 1); wb+=("$w"); wa+=("$(writer 0)")
  fi
  echo "round $r: fstrim ${a} s (${before} -> ${after} MiB held, ${later} after more writes), again ${b} s; fio alone ${wa[-1]} MiB/s, beside $n fstrim runs ${wb[-1]} MiB/s"
done
ma=$(median_of "${wa[*]}") mb=$(median_of "${wb[*]}")
echo "median fstrim of 50 000 holes: $(median_of "${f1[*]}") s, again $(median_of "${f2[*]}") s; image held ${before} MiB before, ${after} MiB after, ${later} MiB after more writes (last round)"
echo "median fio 1 MiB 75 % (2 GiB): alone $ma MiB/s, beside fstrim every 0.2 s $mb MiB/s (ratio $(echo "scale=3; $mb / $ma" | bc))"
