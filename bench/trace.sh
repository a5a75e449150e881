#!/usr/bin/env bash
# Issue 21, Trace replay (Light-Dedup Fig. 9): block traces replayed with `nodup replay` into
# every system — the shared FIU samples as recorded (their reads included) and two generated
# write traces: long duplicate runs (75 %, geom:256, the shape speculation is built for) and
# short ones (50 %, geom:4, where it rarely pays). Block mode is one 4 KiB call per block,
# batch mode up to 512 consecutive blocks per call. Each row: the system brought up empty,
# one replay (ends with fsync), throughput, the share the system reports deduplicated and the
# space it holds afterwards.
#
# Usage: bench/trace.sh   (QUICK=1: 128 MiB generated traces, one round, no zfs 128K, the `make
#   bench` size; default 2 GiB, RUNS=3 rounds, systems rotated each round;
#   SYSTEMS="none light smart zfs zfs-4k ext4 pass tmpfs";
#   MODES="block batch"; NODUP=/FUSEREF= skip the build)
# Writes docs/results/trace-suite.md and trace-suite/trace.tsv; trace-suite/reading.md
# (hand-written) is appended.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-$([[ $QUICK == 1 ]] && echo 1 || echo 3)}
GEN=${GEN:-$([[ $QUICK == 1 ]] && echo 128M || echo 2G)}
# zfs with its default 128 KiB records finds almost none of a block trace's duplicates (each
# record must repeat whole); the quick run keeps only zfs with 4 KiB records.
SYSTEMS=${SYSTEMS:-$([[ $QUICK == 1 ]] && echo "none light smart zfs-4k ext4 pass tmpfs" || echo "none light smart zfs zfs-4k ext4 pass tmpfs")}
MODES=${MODES:-block batch}
# The shared samples beside the repository (a clean clone with ../shared next to it).
SAMPLES=${FIU_DIR:-$PWD/../shared/data/fiu}
[[ -n ${FIU_DIR:-} || -d $SAMPLES ]] || SAMPLES=/work/shared/data/fiu
OUT=docs/results
say() { echo "trace: $*" >&2; }

gen_bytes=$(numfmt --from=iec "$GEN")
IMG_SIZE=$(((gen_bytes * 2 >> 20) + 1024))M
systems_setup trace zfs-fuse:zfs-fuse
mkdir -p "$OUT/trace-suite"
tsv=$OUT/trace-suite/trace.tsv
printf 'round\ttrace\tmode\tsystem\tmibs\tsaved\tspace_mib\n' >"$tsv"

# The traces: the samples as shipped, and the two generated ones (made once, reused each round).
traces=()
for t in "$SAMPLES"/*.blkparse; do [[ -f $t ]] && traces+=("$t"); done
[[ ${#traces[@]} -gt 0 ]] || say "no FIU samples in $SAMPLES: only generated traces"
"$NODUP" trace gen --size "$GEN" --dup-ratio 0.75 --run-length geom:256 --seed 42 -o "$W/gen-75-long.fiu" 2>/dev/null
"$NODUP" trace gen --size "$GEN" --dup-ratio 0.5 --run-length geom:4 --seed 43 -o "$W/gen-50-short.fiu" 2>/dev/null
traces+=("$W/gen-75-long.fiu" "$W/gen-50-short.fiu")

start_zfs
mapfile -t systems < <(systems_available $SYSTEMS)

for ((r = 1; r <= RUNS; r++)); do
  for t in "${traces[@]}"; do
    name=$(basename "$t")
    name=${name%.blkparse}
    name=${name%.fiu}
    for mode in $MODES; do
      for s in $(rotate "$r" "${systems[@]}"); do
        up "$s" 0
        d=$(dir "$s")/replay
        mkdir -p "$d"
        out=$($EXCL "$NODUP" replay "$t" --dir "$d" --mode "$mode" --json) || {
          say "round $r: $name $mode $s: replay failed"
          down "$s"
          continue
        }
        mibs=$(python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["mib_per_s"])' <<<"$out")
        [[ $s == smart ]] && smart_settle
        space=$(space_used "$s")
        saved=$(dedup_saved "$s")
        down "$s"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$name" "$mode" "$s" "$mibs" "$saved" "$((space >> 20))" >>"$tsv"
        say "round $r: $name $mode $s: $mibs MiB/s, saved $saved, $((space >> 20)) MiB held"
      done
    done
  done
done
stop_zfs

machine=$(machine_line)
python3 bench/trace_report.py "$tsv" "$machine" "$(bench_tree)" "$OUT" "$GEN"
say "wrote $OUT/trace-suite.md"
