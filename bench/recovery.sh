#!/usr/bin/env bash
# Issue 21, Recovery (Light-Dedup Table 5): unmount time, normal remount time and failure
# recovery time against the amount of data on the image. For each size: a fresh `light` image
# in /dev/shm, filled through the mount by fio (sequential 1 MiB writes, 50 % duplicates, files
# of 256 MiB); `nodup umount` timed; a remount (normal recovery: the saved index and the
# checkpoint are loaded), its recovery time as the daemon reports it; then the daemon killed
# with SIGKILL mid-life (after more writes, so the log has records to replay) and a remount
# (failure recovery: the engine rebuilds reference counts and the index from the file system's
# block maps), its recovery time and the wall time of `nodup mount`.
#
# Usage: bench/recovery.sh   (QUICK=1: 256 MiB and 1 GiB, the `make bench` size; default
#   256 MiB to 8 GiB; SIZES="..." in MiB overrides; NODUP= skips the build)
# Writes docs/results/recovery.md, recovery/recovery.tsv and recovery/recovery.png;
# recovery/reading.md (hand-written) is appended.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_matplotlib
source bench/systems.sh
QUICK=${QUICK:-0}
SIZES=${SIZES:-$([[ $QUICK == 1 ]] && echo "256 1024" || echo "256 1024 4096 8192")}
OUT=docs/results
say() { echo "recovery: $*" >&2; }

systems_setup recovery fio:fio
mkdir -p "$OUT/recovery"
tsv=$OUT/recovery/recovery.tsv
printf 'data_mib\tunmount_s\tnormal_recovery_s\tnormal_mount_s\tfailure_recovery_s\tfailure_mount_s\treplayed_records\n' >"$tsv"

# wall SECONDS of a command (not under the exclusive wrapper's queue: mount and unmount are
# the measured operations themselves).
wall() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); python3 -c "print('%.3f' % ($t1 - $t0))"; }
recovery_field() { nodup_stat "(lambda r: $1)(s['recovery'])"; }

for mib in $SIZES; do
  rm -f "$IMG"
  # Room for the data, its metadata and the extra writes before the kill.
  "$NODUP" mkfs "$IMG" --size "$((mib * 2 + 1024))M" --policy light >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  files=$(((mib + 255) / 256))
  per=$((mib / files))
  $EXCL fio --name=fill --directory="$MNT" --ioengine=sync --rw=write --bs=1m --size="${per}M" \
    --numjobs="$files" --dedupe_percentage=50 --end_fsync=1 --fallocate=none >/dev/null 2>&1
  tu=$(wall "$NODUP" umount "$MNT")
  tm=$(wall "$NODUP" mount "$IMG" "$MNT")
  [[ $(recovery_field "r['kind']") == clean ]] || { say "the remount after umount was not clean"; exit 1; }
  tn=$(recovery_field "'%.4f' % r['seconds']")
  # More writes, then SIGKILL: the next mount must recover from a crash.
  $EXCL fio --name=more --directory="$MNT" --ioengine=sync --rw=write --bs=4k --size=16M \
    --dedupe_percentage=50 --fallocate=none >/dev/null 2>&1
  pid=$(daemon_pid light)
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
  tf=$(wall "$NODUP" mount "$IMG" "$MNT")
  kind=$(recovery_field "r['kind']")
  [[ $kind != clean ]] || { say "the mount after SIGKILL reports a clean image"; exit 1; }
  tr=$(recovery_field "'%.4f' % r['seconds']")
  rep=$(recovery_field "r['replayed_records']")
  "$NODUP" umount "$MNT" >/dev/null
  "$NODUP" fsck "$IMG" >/dev/null || { say "fsck failed after failure recovery at $mib MiB"; exit 1; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mib" "$tu" "$tn" "$tm" "$tr" "$tf" "$rep" >>"$tsv"
  say "$mib MiB: umount ${tu}s, normal recovery ${tn}s (mount ${tm}s), failure recovery ${tr}s (mount ${tf}s, $rep records replayed, kind $kind)"
done
machine=$(machine_line)
python3 bench/recovery_report.py "$tsv" "$machine" "$(bench_tree)" "$OUT"
say "wrote $OUT/recovery.md"
