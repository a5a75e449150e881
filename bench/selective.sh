#!/usr/bin/env bash
# Issue 17 acceptance: policy `selective` and encrypted images.
#   skew       a generated trace with skewed content popularity (zipf) and the FIU samples,
#              replayed through a mount: selective (default 512 KiB caches) against light --
#              share of light's duplicates found, fingerprint-cache memory.
#   refresh    a zipf trace whose hot set changes halfway (--phases 2): refresh off, the
#              paper's 10 s, and 1 s; dedup ratio of each.
#   prefetch   the skewed trace with the prefetch cache on (512 KiB) and off: media bytes read
#              (every read of the replay is a verification: reads are skipped).
#   encrypt    fio through the mount, plain vs encrypted images, light and selective, 1 MiB and
#              4 KiB writes at 0 % and 75 % duplicates: throughput ratio and dedup ratios.
# Usage: bench/selective.sh [SECTION...]   (SIZE=1G; QUICK=1 for a 128M smoke run)
# Writes docs/results/selective/SECTION.md and docs/results/selective.md (RESULTS=DIR: under DIR
# instead; `make bench` puts its quick runs in docs/results/quick).
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_nodup
QUICK=${QUICK:-0}
EXCL=/work/tools/cpu-exclusive
[[ -x $EXCL ]] || EXCL=""
SIZE=${SIZE:-1G}
[[ $QUICK == 1 ]] && SIZE=128M
# The refresh section's fingerprint cache: small against the hot set, where keeping the first
# half's hot entries costs the second half its duplicates.
REFRESH_CACHE=${REFRESH_CACHE:-32K}
RESULTS=${RESULTS:-docs/results}
OUTDIR=$RESULTS/selective
mkdir -p "$OUTDIR"
scratch_mount selective
FIU=(../shared/data/fiu/homes-sample.1.blkparse ../shared/data/fiu/mail-01-sample.blkparse)

# up POLICY [mount args...]: fresh 4 GiB image in /dev/shm, mounted.
IMG=$W/img
IMG_SIZE=4G
up() { nodup_fresh "$@"; }
down() { "$NODUP" umount "$MNT" >/dev/null; }
replay() { "$NODUP" replay "$1" --dir "$MNT" --mode batch --no-reads >/dev/null; }
header() {
  echo "Binary $("$NODUP" --version 2>/dev/null || true), tree $(bench_tree), $(date -u +%F), $(nproc) cores; images in /dev/shm (pmem), replayed with \`nodup replay --mode batch --no-reads\`."
}
gen() { # gen NAME ARGS...: a generated trace in $W/NAME.trace
  local name=$1
  shift
  [[ -f $W/$name.trace ]] || "$NODUP" trace gen --size "$SIZE" "$@" -o "$W/$name.trace" >/dev/null
}
# row NAME POLICY LIGHT_SAVED: one table row from the mounted image's stats.
row() {
  "$NODUP" stats "$MNT" --json >"$W/s.json"
  python3 - "$W/s.json" "$@" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
name, pol, light = sys.argv[2], sys.argv[3], sys.argv[4]
saved = s["logical_bytes"] - s["physical_bytes"]
sel = s.get("selective") or {}
fpc, pf = sel.get("fp_cache", {}), sel.get("prefetch", {})
vs = f"{saved / int(light):.3f}" if light != "-" and int(light) > 0 else "-"
mem = f"{fpc['memory_bytes'] / 1024:.0f}" if fpc else "-"
ent = f"{fpc['entries']}/{fpc['capacity']}" if fpc else "-"
print(f"| {name} | {pol} | {s['dedup_ratio']:.4f} | {saved / 1048576:.1f} | {vs} | {mem} | {ent} | "
      f"{fpc.get('refreshes', '-')} | {pf.get('hits', '-')} | {s['media_bytes_read'] / 1048576:.1f} |")
PY
}
saved() { nodup_stat "s['logical_bytes'] - s['physical_bytes']"; }
TABLE_HEAD="| trace | policy | dedup ratio | saved MiB | of light's savings | fp cache KiB | entries/capacity | refreshes | prefetch hits | media read MiB |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"

skew() {
  gen skew --dup-ratio 0.6 --popularity zipf:1.2 --run-length fixed:1 --seed 17
  {
    echo "## Skewed popularity: selective with the default caches against light"
    echo
    echo "\`nodup trace gen --size $SIZE --dup-ratio 0.6 --popularity zipf:1.2 --run-length fixed:1\` (a few contents get most duplicate references, a long tail) and the FIU samples. Target: selective finds ≥ 80 % of what light saves, with fingerprint memory ≤ 512 KiB."
    echo
    echo "$TABLE_HEAD"
  } >"$OUTDIR/skew.md"
  for t in "$W/skew.trace" "${FIU[@]}"; do
    local name; name=$(basename "$t" .trace)
    [[ $name == skew ]] && name="zipf:1.2, $SIZE, 60 %"
    up light
    replay "$t"
    local ls; ls=$(saved)
    row "$name" light - >>"$OUTDIR/skew.md"
    down
    up selective
    replay "$t"
    row "$name" selective "$ls" >>"$OUTDIR/skew.md"
    down
  done
  echo >>"$OUTDIR/skew.md"
}

refresh() {
  gen phases --dup-ratio 0.6 --popularity zipf:1.2 --run-length fixed:1 --phases 2 --seed 19
  {
    echo "## Refresh: a hot set that changes halfway"
    echo
    echo "\`nodup trace gen --size $SIZE --dup-ratio 0.6 --popularity zipf:1.2 --run-length fixed:1 --phases 2\`, \`--fp-cache $REFRESH_CACHE\`: the second half copies only contents new in it. Without refresh the cache keeps the first half's hot fingerprints (their counts are high) and new ones enter at frequency 1 and are evicted first; with refresh old hotness halves at every interval. The paper's interval is 10 s of wall time; a replay here lasts seconds (last column), so the table adds 100 ms and refreshes by operation count (lookups that hit + inserts), the test trigger of the issue."
    echo
    echo "| refresh | dedup ratio | saved MiB | of light's savings | refreshes | fp cache hits | replay s |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/refresh.md"
  up light
  replay "$W/phases.trace"
  local ls; ls=$(saved)
  down
  for r in 0 10000 100 ops:20000 ops:5000; do
    if [[ $r == ops:* ]]; then
      up selective --refresh-ms 0 --refresh-ops "${r#ops:}" --fp-cache "$REFRESH_CACHE"
    else
      up selective --refresh-ms "$r" --fp-cache "$REFRESH_CACHE"
    fi
    local t0 t1; t0=$(date +%s.%N)
    replay "$W/phases.trace"
    t1=$(date +%s.%N)
    "$NODUP" stats "$MNT" --json >"$W/s.json"
    python3 - "$W/s.json" "$r" "$ls" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >>"$OUTDIR/refresh.md" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
r, light, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
saved = s["logical_bytes"] - s["physical_bytes"]
f = s["selective"]["fp_cache"]
name = "off" if r == "0" else f"every {r[4:]} cache operations" if r.startswith("ops:") else f"every {int(r) / 1000:g} s"
print(f"| {name} | {s['dedup_ratio']:.4f} | {saved / 1048576:.1f} | {saved / light:.3f} | {f['refreshes']} | {f['hits']} | {secs:.1f} |")
PY
    down
  done
  echo >>"$OUTDIR/refresh.md"
}

prefetch() {
  gen skew --dup-ratio 0.6 --popularity zipf:1.2 --run-length fixed:1 --seed 17
  {
    echo "## Prefetch cache on and off"
    echo
    echo "The skewed trace of the first section. Reads are skipped, so every media read is a verification of a candidate (a duplicate, or a collision). Target: at least 50 % fewer media bytes read with the cache."
    echo
    echo "$TABLE_HEAD"
  } >"$OUTDIR/prefetch.md"
  local off=
  for p in 0 512K; do
    up selective --prefetch-cache "$p"
    replay "$W/skew.trace"
    row "zipf:1.2, prefetch $p" selective - >>"$OUTDIR/prefetch.md"
    local rd; rd=$(nodup_stat "s['media_bytes_read']")
    [[ $p == 0 ]] && off=$rd
    down
  done
  python3 -c "import sys; off, on = int(sys.argv[1]), int(sys.argv[2]); print(); print(f'Media bytes read with the prefetch cache: **{on / off:.3f}** of without ({(1 - on / off) * 100:.1f} % fewer).' if off else '')" "$off" "$rd" >>"$OUTDIR/prefetch.md"
  echo >>"$OUTDIR/prefetch.md"
}

encrypt() {
  # fio through the mount, sequential writes with end_fsync, plain and encrypted images
  # interleaved (median of RUNS pairs; the ratio is the median of the per-pair ratios).
  local runs=${RUNS:-3} fsize=${FIO_SIZE:-512M}
  [[ $QUICK == 1 ]] && runs=1 fsize=64M
  head -c 32 /dev/urandom >"$W/key"
  {
    echo "## Encrypted vs plain images"
    echo
    echo "\`fio --rw=write --ioengine=sync --end_fsync=1 --size=$fsize --dedupe_percentage=D\` through the mount, on a fresh 4 GiB image per run, plain and \`--encrypt-key-file\` (a 32-byte key) interleaved, $runs pairs; MiB/s medians, the ratio is the median of per-pair ratios. Target: encrypted/plain ≥ 0.8 at 1 MiB writes, the same dedup ratio."
    echo
    echo "| policy | bs | dups | plain MiB/s | encrypted MiB/s | encrypted / plain | ratio plain | ratio encrypted |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/encrypt.md"
  for policy in light selective; do
    for bs in 1m 4k; do
      for dup in 0 75; do
        local p=() e=() r=() rp= re=
        for ((i = 0; i < runs; i++)); do
          for mode in plain enc; do
            rm -f "$W/img"
            if [[ $mode == enc ]]; then
              "$NODUP" mkfs "$W/img" --size 4G --policy "$policy" --encrypt-key-file "$W/key" >/dev/null
              "$NODUP" mount "$W/img" "$MNT" --encrypt-key-file "$W/key" >/dev/null
            else
              "$NODUP" mkfs "$W/img" --size 4G --policy "$policy" >/dev/null
              "$NODUP" mount "$W/img" "$MNT" >/dev/null
            fi
            local bw
            bw=$($EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs="$bs" --size="$fsize" \
              --numjobs=1 --end_fsync=1 --dedupe_percentage="$dup" --output-format=json 2>/dev/null |
              python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw"]/1024)')
            local ratio; ratio=$(nodup_stat "'%.4f' % s['dedup_ratio']")
            down
            if [[ $mode == enc ]]; then e+=("$bw"); re=$ratio; else p+=("$bw"); rp=$ratio; fi
          done
          r+=("$(python3 -c "print(${e[-1]} / ${p[-1]})")")
        done
        python3 - "$policy" "$bs" "$dup" "$rp" "$re" "${p[*]}" "${e[*]}" "${r[*]}" >>"$OUTDIR/encrypt.md" <<'PY'
import statistics as st, sys
pol, bs, dup, rp, re_, p, e, r = sys.argv[1:]
med = lambda s: st.median(float(x) for x in s.split())
print(f"| {pol} | {bs} | {dup} % | {med(p):.1f} | {med(e):.1f} | **{med(r):.3f}** | {rp} | {re_} |")
PY
      done
    done
  done
  echo >>"$OUTDIR/encrypt.md"
}

sections=("$@")
[[ ${#sections[@]} -eq 0 ]] && sections=(skew refresh prefetch encrypt)
for s in "${sections[@]}"; do
  case $s in
    skew | refresh | prefetch | encrypt) "$s" ;;
    *) echo "unknown section $s" >&2; exit 2 ;;
  esac
done
{
  echo "# Policy selective and encrypted images: acceptance (issue 17)"
  echo
  header
  echo "Produced by \`bench/selective.sh\`; each section is regenerated by \`bench/selective.sh SECTION\`."
  echo
  # reading.md is the hand-written reading of the numbers (update it when they change).
  for s in skew refresh prefetch encrypt reading; do
    [[ -f $OUTDIR/$s.md ]] && cat "$OUTDIR/$s.md"
  done
} >"$RESULTS/selective.md"
echo "wrote $RESULTS/selective.md"
