#!/usr/bin/env bash
# Issue 19 acceptance: Freewrite (SYSTOR'17, ../shared/papers/freewrite-systor17.txt) on nodup
# mounts with policy light. Every run gets a fresh image, a fresh mount and a fresh store;
# media_bytes_written is read from `nodup stats` around the measured phase (FAWN: the garbage
# collection, after a separate load process; LSM: the whole load with its compactions).
#
#   matrix MEDIUM STORE KEYS [VALUE]  the 4 value sizes (or VALUE) x freewrite off/on, at SIZE
#                             (default 1G, the paper's size)
#   sweep MEDIUM              FAWN, mixed keys, 512 B values: off and bubble caps 12.5..96 %
#                             (Figs. 7, 8), at SWEEP_SIZE (default 1G)
#   speed MEDIUM STORE RUN    one off/on pair at 1 KiB values, mixed keys, SPEED_SIZE (1G);
#                             odd RUN runs on first, even off first (interleaved pairs)
#   report                    docs/results/freewrite.md and the PNG plots from the raw results
#   all                       every part above, each under /work/tools/cpu-exclusive when it exists, then report
#
# MEDIUM is pmem (image in /dev/shm) or blockfile (image file on the root disk, /var/tmp).
# Raw results: one JSON object per run appended to RAW (docs/results/freewrite.jsonl).
# Env: SIZE, SWEEP_SIZE, SPEED_SIZE, RUNS (speed pairs for `all`, default 3), NODUP (binary; else
# built), RAW, OUT, MNT. Each part call takes minutes; `all` takes hours at the default sizes.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
case ${1:-} in
  matrix | sweep | speed | report | all) ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
SIZE=${SIZE:-1G}
SWEEP_SIZE=${SWEEP_SIZE:-1G}
SPEED_SIZE=${SPEED_SIZE:-1G}
RUNS=${RUNS:-3}
RAW=${RAW:-docs/results/freewrite.jsonl}
OUT=${OUT:-docs/results/freewrite.md}
MNT=${MNT:-/tmp/nodup-freewrite-mnt}
VALUES=(128 256 512 1024)
KEYS=(uniform clustered mixed)
CAPS=(0.125 0.25 0.5 0.75 0.96)
source bench/lib.sh
[[ ${1:-} == report ]] || ensure_nodup >/dev/null

workdir() { if [[ $1 == pmem ]]; then echo /dev/shm/nodup-freewrite; else echo /var/tmp/nodup-freewrite; fi; }
cleanup() {
  if mountpoint -q "$MNT"; then "$NODUP" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u "$MNT" || true; fi
  rm -rf /dev/shm/nodup-freewrite /var/tmp/nodup-freewrite
}
media() { "$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["media_bytes_written"], d["dedup_hits"], d["blocks_written"])'; }
bytes_of() { python3 -c "s='$1'.upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))"; }

# one MEDIUM STORE KEYS VALUE FW CAP SIZE PART RUN: a fresh image and store, one measured phase,
# one JSON line appended to RAW.
one() {
  local medium=$1 store=$2 keys=$3 value=$4 fw=$5 cap=$6 size=$7 part=$8 run=$9
  local w img isize rep m0 m1 h0 h1 b0 b1 s0 t0 steal args
  w=$(workdir "$medium"); img=$w/img
  isize=$(( $(bytes_of "$size") * 4 / (1 << 20) + 2048 ))M
  mkdir -p "$w" "$MNT"
  rm -f "$img"
  "$NODUP" mkfs "$img" --size "$isize" --policy light --medium "$medium" -f >/dev/null
  "$NODUP" mount "$img" "$MNT" >/dev/null
  args=(--store "$store" --dir "$MNT/store" --size "$size" --value-size "$value" --keys "$keys"
        --freewrite "$fw" --bubble-cap "$cap" --json)
  if [[ $store == fawn ]]; then
    "$NODUP" freewrite bench "${args[@]}" --phase load >/dev/null
    read -r m0 h0 b0 < <(media)
    s0=$(steal_ticks); t0=$(date +%s.%N)
    rep=$("$NODUP" freewrite bench "${args[@]}" --phase gc)
  else
    read -r m0 h0 b0 < <(media)
    s0=$(steal_ticks); t0=$(date +%s.%N)
    rep=$("$NODUP" freewrite bench "${args[@]}")
  fi
  steal=$(steal_share $(( $(steal_ticks) - s0 )) "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')")
  read -r m1 h1 b1 < <(media)
  "$NODUP" umount "$MNT" >/dev/null
  rm -f "$img"
  python3 - "$rep" "$medium" "$part" "$run" $((m1 - m0)) $((h1 - h0)) $((b1 - b0)) "$steal" >>"$RAW" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
r.update(medium=sys.argv[2], part=sys.argv[3], run=int(sys.argv[4]), media_bytes_written=int(sys.argv[5]),
         dedup_hits=int(sys.argv[6]), blocks_written=int(sys.argv[7]), steal=float(sys.argv[8]))
print(json.dumps(r))
EOF
  echo "  $part $medium $store $keys ${value}B fw=$fw cap=$cap: $(tail -1 "$RAW" | python3 -c "import json,sys; r=json.load(sys.stdin); print('%.0f ops/s, media %.1f MiB, bubbles %.2f MiB' % (r['ops_per_sec'], r['media_bytes_written']/2**20, r['bubble_bytes']/2**20))")" >&2
}

part=${1:-}
case $part in
  matrix)
    trap cleanup EXIT
    medium=$2 store=$3 keys=$4
    for v in ${5:-${VALUES[@]}}; do
      for fw in off on; do one "$medium" "$store" "$keys" "$v" $fw 0.125 "$SIZE" matrix 1; done
    done ;;
  sweep)
    trap cleanup EXIT
    one "$2" fawn mixed 512 off 0.125 "$SWEEP_SIZE" sweep 1
    for c in "${CAPS[@]}"; do one "$2" fawn mixed 512 on "$c" "$SWEEP_SIZE" sweep 1; done ;;
  speed)
    trap cleanup EXIT
    medium=$2 store=$3 run=$4
    if (( run % 2 )); then order=(on off); else order=(off on); fi
    for fw in "${order[@]}"; do one "$medium" "$store" mixed 1024 $fw 0.125 "$SPEED_SIZE" speed "$run"; done ;;
  report)
    ensure_matplotlib
    NODUP=${NODUP:-} python3 bench/freewrite_report.py "$RAW" "$OUT" ;;
  all)
    # The exclusive-CPU wrapper where this machine has one (as bench/systems.sh); plain otherwise.
    X=/work/tools/cpu-exclusive
    [[ -x $X ]] || X=""
    for medium in pmem blockfile; do
      for store in fawn lsm; do
        for keys in "${KEYS[@]}"; do
          for v in "${VALUES[@]}"; do NODUP=$NODUP $X "$0" matrix $medium $store $keys "$v"; done
        done
      done
      NODUP=$NODUP $X "$0" sweep $medium
      for store in fawn lsm; do
        for run in $(seq "$RUNS"); do NODUP=$NODUP $X "$0" speed $medium $store "$run"; done
      done
    done
    NODUP=$NODUP "$0" report ;;
esac
