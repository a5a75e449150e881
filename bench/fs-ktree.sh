#!/usr/bin/env bash
# Issue 3's kernel-tree figure: the Linux source tree (linux-source-6.1; /usr/share/doc when it
# cannot be had, or with QUICK=1) copied twice with `cp -a` into a fresh nodup mount (policy
# light, Pmem image in /dev/shm). Then `nodup stats` gives dedup_ratio, and after a remount
# `diff -r` checks both copies. This is repeated KRUNS times on fresh images. A single copy's
# time varies by up to ±50 % on this shared machine, so each second copy is compared with the
# first copy of its own pair, and the figure is the median of those per-pair ratios (the median
# times are reported too), not one pair.
#
# Steal time. This VM shares its host: during some copies the hypervisor runs other guests
# instead of ours (the `steal` column of /proc/stat), and a copy that normally takes ~30 s
# then takes 50 s with ~45 CPU-seconds stolen. Such a pair says nothing about the file system,
# so every copy's stolen time is recorded, and a pair counts towards the figure only when
# neither copy lost more than STEAL_MAX (default 5 %) of its CPU time (stolen CPU-seconds /
# (wall seconds x CPUs)). Pairs are run until KRUNS pairs count, or 3 x KRUNS were tried; the
# report lists every pair and gives the medians of all pairs as well.
#
# Usage: bench/fs-ktree.sh   (KRUNS=5 by default; NODUP=<binary> WORK=<dir in /dev/shm>
#                             MNT=<mount point> OUT=<markdown file> QUICK=1 STEAL_MAX=0.05)
# Output: a markdown section on stdout and in $OUT (docs/results/fs-ktree.md); the last line is
# a one-line summary that bench/fs-accept.sh quotes. Exit 0 even when a target is missed (the
# report says which); non-zero only when the measurement itself failed.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
KRUNS=${KRUNS:-5}
OUT=${OUT:-docs/results/fs-ktree.md}
WORK=${WORK:-/dev/shm/nodup-ktree}
MNT=${MNT:-/tmp/nodup-ktree-mnt}
IMG=$WORK/img
if [[ -z ${NODUP:-} ]]; then
  bash scripts/deps.sh
  cargo build --release -q -p nodup-cli
  NODUP=${CARGO_TARGET_DIR:-$PWD/target}/release/nodup
fi

cleanup() {
  if mountpoint -q "$MNT"; then "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK" "$MNT"

STEAL_MAX=${STEAL_MAX:-0.05}
source bench/lib.sh
# timed_copy DEST: cp -a the source to DEST; prints "wall_seconds stolen_share".
timed_copy() {
  local s0 s1 wall
  s0=$(steal_ticks)
  wall=$( { /usr/bin/time -f %e cp -a "$SRC" "$1"; } 2>&1 | tail -1)
  s1=$(steal_ticks)
  echo "$wall $(steal_share $((s1 - s0)) "$wall")"
}


SRC=$WORK/src
kernel_tree "$SRC"
src_mib=$(du -sm "$SRC" | cut -f1)
src_files=$(find "$SRC" -type f | wc -l)

T1=() T2=() RATIOS=() DEDUP=() DIFFS=() ST1=() ST2=() USED=()
C1=() C2=() CRATIOS=()
r=0
while ((${#C1[@]} < KRUNS && r < 3 * KRUNS)); do
  r=$((r + 1))
  rm -f "$IMG"
  "$NODUP" mkfs "$IMG" --size 4G --policy light >/dev/null
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  read -r t1 st1 < <(timed_copy "$MNT/copy1")
  read -r t2 st2 < <(timed_copy "$MNT/copy2")
  d=$("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["dedup_ratio"])')
  "$NODUP" umount "$MNT"
  "$NODUP" mount "$IMG" "$MNT" >/dev/null
  diffs=clean
  # Symlinks are compared as links (their targets), not followed: a source tree may hold
  # dangling ones, which diff would report as errors on both sides.
  diff -r --no-dereference "$SRC" "$MNT/copy1" >/dev/null && diff -r --no-dereference "$SRC" "$MNT/copy2" >/dev/null || diffs=DIFFERENT
  "$NODUP" umount "$MNT"
  ratio=$(awk -v a="$t2" -v b="$t1" 'BEGIN { printf "%.3f", a/b }')
  used=$(awk -v a="$st1" -v b="$st2" -v m="$STEAL_MAX" 'BEGIN { print (a <= m && b <= m) ? "yes" : "no (steal)" }')
  T1+=("$t1") T2+=("$t2") DEDUP+=("$d") DIFFS+=("$diffs") RATIOS+=("$ratio") ST1+=("$st1") ST2+=("$st2") USED+=("$used")
  if [[ $used == yes ]]; then C1+=("$t1") C2+=("$t2") CRATIOS+=("$ratio"); fi
  echo "fs-ktree: pair $r: first ${t1}s (steal $st1), second ${t2}s (steal $st2), dedup_ratio $d, diff $diffs, counted: $used" >&2
done
counted=${#C1[@]}
basis="over $counted pairs without steal"
if ((counted == 0)); then
  # Nothing to filter on: fall back to every pair, and say so in the report.
  echo "fs-ktree: no pair ran without steal above $STEAL_MAX in $r tries" >&2
  C1=("${T1[@]}") C2=("${T2[@]}") CRATIOS=("${RATIOS[@]}")
  basis="over all $r pairs (none ran without steal)"
fi

m1=$(printf '%s\n' "${C1[@]}" | median)
m2=$(printf '%s\n' "${C2[@]}" | median)
mr=$(printf '%s\n' "${CRATIOS[@]}" | median)
a1=$(printf '%s\n' "${T1[@]}" | median)
a2=$(printf '%s\n' "${T2[@]}" | median)
ar=$(printf '%s\n' "${RATIOS[@]}" | median)
mind=$(printf '%s\n' "${DEDUP[@]}" | sort -g | head -1)
alldiff=clean
for d in "${DIFFS[@]}"; do [[ $d == clean ]] || alldiff=DIFFERENT; done
# The verdict compares each second copy with the first copy of the same pair (same fresh image,
# same host state) and takes the median of those ratios. Comparing the median first time with
# the median second time would pair copies from different images: at 54f1494 it called a run a
# miss (25.98 s vs 26.06 s) in which the second copy was faster in 4 of 5 pairs.
faster=$(awk -v r="$mr" 'BEGIN { print (r <= 1) ? "yes" : "no" }')
okratio=$(awk -v a="$mind" 'BEGIN { print (a >= 0.49) ? "yes" : "no" }')

{
  echo "## Kernel tree copied twice ($WHAT, $src_mib MiB, $src_files files; $counted of $r fresh images counted)"
  echo
  echo "Generated by \`bench/fs-ktree.sh\` on $(date -u +%F) at commit \`$(bench_tree)\`."
  echo "Policy light, Pmem image (4 GiB) in /dev/shm, \`cp -a\` into a fresh mount, then \`nodup stats\`,"
  echo "umount, mount, \`diff -r --no-dereference\` of both copies against the source."
  echo "\"steal\" is the share of the machine's CPU time the hypervisor gave to other guests during"
  echo "that copy (/proc/stat); a pair counts only when both copies stayed at or below $STEAL_MAX."
  echo
  echo "| pair | first copy (s) | steal | second copy (s) | steal | second / first | counted | dedup_ratio | diff -r after remount |"
  echo "|---:|---:|---:|---:|---:|---:|---|---:|---|"
  for i in "${!T1[@]}"; do
    echo "| $((i + 1)) | ${T1[$i]} | ${ST1[$i]} | ${T2[$i]} | ${ST2[$i]} | ${RATIOS[$i]} | ${USED[$i]} | ${DEDUP[$i]} | ${DIFFS[$i]} |"
  done
  echo "| median of counted pairs | $m1 | | $m2 | | $mr | | | |"
  echo "| median of all pairs | $a1 | | $a2 | | $ar | | | |"
  echo
  echo "kernel tree: median first copy ${m1}s, second ${m2}s $basis (median per-pair second/first ratio $mr, second <= first: $faster; all $r pairs: ${a1}s, ${a2}s, ratio $ar); lowest dedup_ratio $mind (>= 0.49: $okratio); diff -r after remount: $alldiff"
} | tee "$OUT"
