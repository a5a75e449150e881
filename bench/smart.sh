#!/usr/bin/env bash
# Acceptance of policy `smart` (issue 16), through real mounts of images in /dev/shm:
#
#   budget     1 GiB of unique blocks, then the same blocks shuffled (4 KiB writes), with
#              --mem-budget 3MiB; 2 GiB with 512KiB. Daemon anonymous memory (peak minus the
#              value after a 4 MiB warm-up, and minus the value at mount) against budget +
#              block maps; dedup ratio inline-only and after the worker
#              settles, against light on the same data.
#   eviction   group LRU vs per-fingerprint LRU on one generated trace (ratio, store I/O);
#              recency (LRU) vs reference-count eviction on a fill with temporal locality.
#   adaptive   alternating 0 % / 75 % duplicate phases: daemon CPU per GiB and ratio, adaptive
#              vs fixed 100 % selectivity.
#   readcache  two identical 1 GiB files read back from a fresh mount (cmp, and two cat at
#              once): media bytes read, smart vs none.
#   filter     run filter T = 1..4: ratio and file extents, on the FIU samples and a trace.
#   replay     FIU samples and a generated 75 % trace replayed with --mem-budget 3MiB: media
#              bytes written vs none, ratio vs light.
#
# Usage: bench/smart.sh [SECTION...|join]   (default: all; QUICK=1 shrinks the sizes; NODUP=binary;
# BUDGET_CASES="MIB:BUDGET ...", BUDGET_POLICIES="none smart" and BUDGET_RUNS=N set the budget
# section's cases, policies and runs per case (medians over the runs))
# Each section writes docs/results/smart/SECTION.md; docs/results/smart.md joins them (RESULTS=DIR
# writes under DIR instead of docs/results: `make bench` puts its quick runs in docs/results/quick).
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
source bench/lib.sh
# `join` alone only reassembles smart.md: no binary needed, and building one would replace the
# release binary under any benchmark using it.
[[ "$*" == join ]] || ensure_nodup
QUICK=${QUICK:-0}
RESULTS=${RESULTS:-docs/results}
OUTDIR=$RESULTS/smart
mkdir -p "$OUTDIR"
W=$(mktemp -d /dev/shm/nodup-smart.XXXXXX)
MNT=$W/mnt
mkdir -p "$MNT"
SAMPLER=
cleanup() {
  [[ -n $SAMPLER ]] && kill "$SAMPLER" 2>/dev/null || true
  if mountpoint -q "$MNT"; then "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true; fi
  rm -rf "$W"
}
trap cleanup EXIT

# ---- helpers ---------------------------------------------------------------------------------

# up POLICY SIZE [mount args...]: fresh image and mount.
up() {
  local policy=$1 size=$2; shift 2
  rm -f "$W/img"
  local extra=()
  [[ $policy == smart ]] && extra=(--mem-budget "${MKFS_BUDGET:-3M}")
  [[ -n ${MKFS_FP:-} ]] && extra+=(--fingerprint "$MKFS_FP")
  "$NODUP" mkfs "$W/img" --size "$size" --policy "$policy" "${extra[@]}" >/dev/null
  "$NODUP" mount "$W/img" "$MNT" "$@" >/dev/null
}
down() { "$NODUP" umount "$MNT" >/dev/null; }
anon_kib() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }
cpu_secs() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# peak_start PID: sample RssAnon every 0.1 s into $W/peak until peak_stop.
peak_start() { ( p=0; while kill -0 "$1" 2>/dev/null; do a=$(anon_kib "$1" 2>/dev/null || echo 0); ((a > p)) && p=$a && echo "$p" >"$W/peak"; sleep 0.1; done ) & SAMPLER=$!; }
peak_stop() { kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=; cat "$W/peak"; }
ratio() { nodup_stat "'%.4f' % s['dedup_ratio']"; }
store_io() { nodup_stat "'%.1f / %.1f' % (s['smart']['store_io_read_bytes'] / 1048576, s['smart']['store_io_written_bytes'] / 1048576)"; }
header() {
  echo "Binary $("$NODUP" --version 2>/dev/null || true), tree $(bench_tree), $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); images in /dev/shm (pmem)."
}

# ---- budget ----------------------------------------------------------------------------------

budget() {
  # The acceptance's two cases, and 512K at three sizes: what grows beyond budget + maps
  # should not grow with the data.
  local cases=${BUDGET_CASES:-"1024:3M 2048:512K 512:512K 1024:512K"}
  [[ $QUICK == 1 ]] && cases="128:512K"
  {
    echo "## Budget: unique data, then the same blocks shuffled"
    echo
    echo "\`nodup bench fill a --blocks N --per-write 64\` (unique, 256 KiB writes), then \`nodup bench fill b --blocks N --order shuffle\` (the same contents, one 4 KiB write each). \`smart\` is mounted with \`--worker-rate 0\` while writing (the inline-only ratio is read then), then the worker runs until nothing is queued. Memory: the daemon's \`RssAnon\`, sampled every 0.1 s; growth is the peak minus a baseline. *From warm-up*: the baseline is taken after 4 MiB of other unique data was written in 256 KiB writes and deleted, which touches the daemon's fixed working buffers (the FUSE request buffers a 256 KiB write reaches, the checkpoint's scratch) and at most 1024 of the policy's fingerprint slots; *from mount*: right after mount. \`none\` (no dedup) shows what the file system itself needs beyond its block maps. *Maps' index + scratch*: what the file system keeps per block-map unit (2 MiB of file) to checkpoint the maps, from \`nodup stats\`: the record of where each unit is persisted (\`block_map_index_bytes\`, an estimated 48 B a unit) and the most the checkpoint's per-unit working vectors have filled (\`checkpoints.scratch_peak_bytes\`); *maps* in *budget + maps* and *beyond* counts both with the maps. *Beyond*: growth from warm-up minus budget + maps (minus maps for \`none\` and \`light\`); the 512K rows at 512 MiB, 1 GiB and 2 GiB show whether anything grows with the data. *Peak over none's peak*: \`smart\`'s peak minus \`none\`'s peak on the same data, both absolute (no baseline): what dedup costs the daemon beyond the file system without it, against the budget. With BUDGET_RUNS=N each case is run N times (the policies in turn within a run) and every column is the median over the runs of its per-run value, differences taken within a run; *runs* says how many."
    echo
    echo "| data | budget | policy | runs | ratio inline-only | ratio settled | vs light | growth from warm-up MiB | block maps MiB | maps' index + scratch MiB | budget + maps MiB | beyond MiB | growth from mount MiB | budget + none's from mount MiB | budget + none's from warm-up MiB | peak over none's peak MiB | dedup memory MiB | store I/O read / written MiB |"
    echo "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/budget.md"
  local runs=${BUDGET_RUNS:-1}
  [[ $QUICK == 1 ]] && runs=1
  : >"$W/budget.tsv"
  for c in $cases; do
    local mib=${c%%:*} b=${c#*:} n=$(( ${c%%:*} * 256 ))
    for r in $(seq 1 "$runs"); do
      for policy in ${BUDGET_POLICIES:-none light smart}; do
        local margs=()
        [[ $policy == smart ]] && margs=(--worker-rate 0)
        MKFS_BUDGET=$b up "$policy" "$(( mib * 4 ))M" "${margs[@]}"
        local pid; pid=$(pid_of_mount)
        local a0; a0=$(anon_kib "$pid")
        "$NODUP" bench fill "$MNT/warm" --blocks 1024 --per-write 64 >/dev/null
        rm "$MNT/warm"
        local aw; aw=$(anon_kib "$pid")
        peak_start "$pid"
        "$NODUP" bench fill "$MNT/a" --blocks "$n" --per-write 64 >/dev/null
        "$NODUP" bench fill "$MNT/b" --blocks "$n" --order shuffle >/dev/null
        local inline; inline=$(ratio)
        [[ $policy == smart ]] && smart_settle
        local final; final=$(ratio)
        local peak; peak=$(peak_stop)
        local maps; maps=$(nodup_stat "s['block_map_bytes']")
        local mapx; mapx=$(nodup_stat "s['block_map_index_bytes'] + s['checkpoints']['scratch_peak_bytes']")
        local dm=0 ior=0 iow=0
        if [[ $policy == smart ]]; then
          dm=$(nodup_stat "s['smart']['memory']['total_bytes']")
          ior=$(nodup_stat "s['smart']['store_io_read_bytes']")
          iow=$(nodup_stat "s['smart']['store_io_written_bytes']")
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mib" "$b" "$r" "$policy" \
          "$inline" "$final" "$a0" "$aw" "$peak" "$maps" "$mapx" "$dm" "$ior" "$iow" >>"$W/budget.tsv"
        down
      done
    done
    # One row per policy: the median over the runs of each column, every difference taken
    # within a run (smart against none and light of the same run).
    python3 - "$W/budget.tsv" "$mib" "$b" >>"$OUTDIR/budget.md" <<'PY'
import statistics as st, sys
path, mib, b = sys.argv[1:]
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
bud = int(b[:-1]) * u[b[-1]] / 1048576
runs = {}
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if f[0] != mib or f[1] != b:
        continue
    runs.setdefault(int(f[2]), {})[f[3]] = dict(
        inline=float(f[4]), final=float(f[5]), a0=int(f[6]), aw=int(f[7]), peak=int(f[8]),
        maps=int(f[9]) / 1048576, mapx=int(f[10]) / 1048576, dm=int(f[11]) / 1048576,
        ior=int(f[12]) / 1048576, iow=int(f[13]) / 1048576)
pols = []
for r in runs.values():
    for p in r:
        if p not in pols:
            pols.append(p)
med = lambda xs: st.median(xs) if xs else None
fmt = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
for pol in pols:
    cols = {k: [] for k in ("inline", "final", "vs", "growth", "maps", "mapx", "limit", "beyond",
                            "mount", "lim_mount", "lim_warm", "over", "dm", "ior", "iow")}
    for r in runs.values():
        x = r.get(pol)
        if x is None:
            continue
        smart = pol == "smart"
        growth = (x["peak"] - x["aw"]) / 1024
        need = x["maps"] + x["mapx"]
        cols["inline"].append(x["inline"]); cols["final"].append(x["final"])
        cols["growth"].append(growth); cols["maps"].append(x["maps"]); cols["mapx"].append(x["mapx"])
        cols["beyond"].append(growth - need - (bud if smart else 0))
        cols["mount"].append((x["peak"] - x["a0"]) / 1024)
        if smart:
            cols["limit"].append(bud + need)
            cols["dm"].append(x["dm"]); cols["ior"].append(x["ior"]); cols["iow"].append(x["iow"])
            if "light" in r and r["light"]["final"] > 0:
                cols["vs"].append(x["final"] / r["light"]["final"])
            if "none" in r:
                nn = r["none"]
                cols["lim_mount"].append(bud + (nn["peak"] - nn["a0"]) / 1024)
                cols["lim_warm"].append(bud + (nn["peak"] - nn["aw"]) / 1024)
                cols["over"].append((x["peak"] - nn["peak"]) / 1024)
    m = {k: med(v) for k, v in cols.items()}
    io = "-" if m["ior"] is None else f"{m['ior']:.1f} / {m['iow']:.1f}"
    print(f"| {mib} MiB | {b if pol == 'smart' else '-'} | {pol} | {len(cols['growth'])} | {fmt(m['inline'], 4)} | {fmt(m['final'], 4)} | {fmt(m['vs'], 3)} | {fmt(m['growth'])} | {fmt(m['maps'])} | {fmt(m['mapx'])} | {fmt(m['limit'])} | {fmt(m['beyond'])} | {fmt(m['mount'])} | {fmt(m['lim_mount'])} | {fmt(m['lim_warm'])} | {fmt(m['over'])} | {fmt(m['dm'])} | {io} |")
PY
  done
  {
    echo
    echo "Every run: \`smart/budget.tsv\` (\`RssAnon\` in KiB at mount, after the warm-up and at the peak; maps, their index + scratch, dedup memory and store I/O in bytes)."
  } >>"$OUTDIR/budget.md"
  {
    printf 'mib\tbudget\trun\tpolicy\tinline\tsettled\tanon_mount_kib\tanon_warm_kib\tanon_peak_kib\tmaps\tmaps_index_scratch\tdedup_memory\tstore_read\tstore_written\n'
    cat "$W/budget.tsv"
  } >"$OUTDIR/budget.tsv"
  echo >>"$OUTDIR/budget.md"
}

# ---- eviction --------------------------------------------------------------------------------

eviction() {
  local size=1G blocks=131072
  [[ $QUICK == 1 ]] && size=128M blocks=16384
  "$NODUP" trace gen --size "$size" --dup-ratio 0.5 --seed 7 -o "$W/evict.trace" >/dev/null
  {
    echo "## Eviction: group LRU vs per-fingerprint LRU vs reference count"
    echo
    echo "Generated trace (\`nodup trace gen --size $size --dup-ratio 0.5 --seed 7\`) replayed in batch mode with \`--mem-budget 512K\`; the worker paused while replaying (inline-only ratio), then settled. Store I/O: bytes of on-media groups read and written (evictions, merges, promotions, and the worker's lookups while settling, which binary-search a group's blocks in place on this mapped medium and are charged per cache line loaded); *while writing*: the same before the worker runs, i.e. what eviction itself costs."
    echo
    echo "| workload | eviction | ratio inline-only | ratio settled | store I/O read MiB | store I/O written MiB | while writing: read / written MiB | groups evicted | fingerprints evicted |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/eviction.md"
  for ev in group-lru lru refcount; do
    MKFS_BUDGET=512K up smart 4G --eviction "$ev" --worker-rate 0
    "$NODUP" replay "$W/evict.trace" --dir "$MNT" --mode batch --no-reads >/dev/null
    local inline; inline=$(ratio)
    local wio; wio=$(store_io)
    smart_settle
    nodup_stat "'| trace, uniform duplicates | $ev | $inline | %.4f | %.1f | %.1f | $wio | %d | %d |' % (s['dedup_ratio'], s['smart']['store_io_read_bytes']/1048576, s['smart']['store_io_written_bytes']/1048576, s['smart']['engine']['store']['counters']['group_evictions'], s['smart']['engine']['store']['counters']['fp_evictions'])" >>"$OUTDIR/eviction.md"
    down
  done
  # Temporal locality: a duplicate repeats one of the last 2048 new contents.
  for ev in lru refcount group-lru; do
    MKFS_BUDGET=512K up smart 4G --eviction "$ev" --worker-rate 0
    "$NODUP" bench fill "$MNT/f" --blocks "$blocks" --phase-dups 50 --dup-window 2048 --seed 3 >/dev/null
    local inline; inline=$(ratio)
    local wio; wio=$(store_io)
    smart_settle
    nodup_stat "'| fill, 50 %% duplicates of the last 2048 | $ev | $inline | %.4f | %.1f | %.1f | $wio | %d | %d |' % (s['dedup_ratio'], s['smart']['store_io_read_bytes']/1048576, s['smart']['store_io_written_bytes']/1048576, s['smart']['engine']['store']['counters']['group_evictions'], s['smart']['engine']['store']['counters']['fp_evictions'])" >>"$OUTDIR/eviction.md"
    down
  done
  echo >>"$OUTDIR/eviction.md"
  # The acceptance's comparisons, from the table just written.
  python3 - "$OUTDIR/eviction.md" >>"$OUTDIR/eviction.md" <<'PY' || echo "(the comparisons could not be computed from the table)" >>"$OUTDIR/eviction.md"
import sys
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 9 and c[1] in ("group-lru", "lru", "refcount"):
        w = c[6].split("/")
        rows[(c[0].split(",")[0], c[1])] = dict(inline=float(c[2]), settled=float(c[3]),
            whole=float(c[4]) + float(c[5]), writing=float(w[0]) + float(w[1]))
for wl in ("trace", "fill"):
    g, l = rows.get((wl, "group-lru")), rows.get((wl, "lru"))
    if g and l:
        print(f"- {wl}: group LRU vs per-fingerprint LRU: store I/O {100 * (1 - g['whole'] / l['whole']):.1f} % less over the whole run "
              f"({g['whole']:.1f} vs {l['whole']:.1f} MiB), {100 * (1 - g['writing'] / l['writing']):.1f} % less while writing; "
              f"ratio {100 * (g['inline'] - l['inline']):+.2f} points inline, {100 * (g['settled'] - l['settled']):+.2f} settled (target: ≥ 50 % less, within 3 points)")
l, r = rows.get(("fill", "lru")), rows.get(("fill", "refcount"))
if l and r and r['inline'] > 0:
    print(f"- fill: recency vs reference count, inline ratio {100 * (l['inline'] / r['inline'] - 1):.1f} % higher ({l['inline']:.4f} vs {r['inline']:.4f}; paper: 41.8 % higher)")
print()
PY
}

# ---- adaptive --------------------------------------------------------------------------------

adaptive() {
  local blocks=262144
  [[ $QUICK == 1 ]] && blocks=32768
  {
    echo "## Adaptive selectivity: alternating 0 % and 75 % duplicate phases"
    echo
    echo "\`nodup bench fill f --blocks $blocks --phase-dups 0,75 --phase-blocks 16384\` (64 MiB phases, one 4 KiB write each), worker paused while writing, then settled. CPU: the daemon's user + system time during the fill, per GiB written, and the worker's while settling; RUNS=${RUNS:-3} runs each, adaptive and fixed interleaved, medians. With xxh3 (the default fingerprint) and with sha256 (a cryptographic fingerprint, as the paper's MD5)."
    echo
    echo "| fingerprint | selectivity | daemon CPU s/GiB (fill) | ratio inline-only | ratio settled | blocks fingerprinted inline | worker CPU s/GiB (settling) |"
    echo "|---|---|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/adaptive.md"
  local runs=${RUNS:-3}
  : >"$W/adaptive.raw"
  for fp in xxh3 sha256; do
    for r in $(seq 1 "$runs"); do
      for sel in adaptive 1; do
        MKFS_FP=$fp up smart 4G --selectivity "$sel" --worker-rate 0
        local pid; pid=$(pid_of_mount)
        local c0; c0=$(cpu_secs "$pid")
        "$NODUP" bench fill "$MNT/f" --blocks "$blocks" --phase-dups 0,75 --phase-blocks 16384 --seed 5 >/dev/null
        local c1; c1=$(cpu_secs "$pid")
        local inline; inline=$(ratio)
        local fpd; fpd=$(nodup_stat "s['smart']['engine']['policy']['selectivity']['blocks_fingerprinted_inline']")
        smart_settle
        local c2; c2=$(cpu_secs "$pid")
        echo "$fp $sel $(python3 -c "print(round(($c1 - $c0) / ($blocks / 262144), 3))") $inline $(ratio) $fpd $(python3 -c "print(round(($c2 - $c1) / ($blocks / 262144), 3))")" >>"$W/adaptive.raw"
        down
      done
    done
    for sel in adaptive 1; do
      local med; med=$(awk -v f="$fp" -v s="$sel" '$1 == f && $2 == s {print $3}' "$W/adaptive.raw" | median)
      local wmed; wmed=$(awk -v f="$fp" -v s="$sel" '$1 == f && $2 == s {print $7}' "$W/adaptive.raw" | median)
      local last; last=$(awk -v f="$fp" -v s="$sel" '$1 == f && $2 == s' "$W/adaptive.raw" | tail -1)
      read -r _ _ _ inl fin fpd _ <<<"$last"
      local name=$sel; [[ $sel == 1 ]] && name="fixed 100 %"
      printf '| %s | %s | %.3f | %s | %s | %s | %.3f |\n' "$fp" "$name" "$med" "$inl" "$fin" "$fpd" "$wmed" >>"$OUTDIR/adaptive.md"
    done
  done
  {
    echo
    echo "Per run (fingerprint, selectivity, fill CPU s/GiB, inline ratio, settled ratio, fingerprinted inline, worker CPU s/GiB):"
    echo
    sed 's/^/    /' "$W/adaptive.raw"
    echo
  } >>"$OUTDIR/adaptive.md"
}

# ---- readcache -------------------------------------------------------------------------------

readcache() {
  local blocks=262144
  [[ $QUICK == 1 ]] && blocks=32768
  {
    echo "## Dedup-aware read cache: two identical files read back from a fresh mount"
    echo
    echo "Two files written from the same $((blocks / 256)) MiB of contents (\`nodup bench fill --per-write 64\`, same salt), the worker settled, unmounted, mounted again; then read back by \`cmp a b\` (the two files in lockstep), and again after another remount by two \`cat\` at once. Media bytes read: the engine's \`media_bytes_read\` (data blocks read from the image)."
    echo
    echo "| policy | budget | reader | media MiB read | of none | read-cache hits |"
    echo "|---|---:|---|---:|---:|---:|"
  } >"$OUTDIR/readcache.md"
  local none_cmp= none_cat=
  for policy in none smart; do
    up "$policy" 4G
    "$NODUP" bench fill "$MNT/a" --blocks "$blocks" --per-write 64 >/dev/null
    "$NODUP" bench fill "$MNT/b" --blocks "$blocks" --per-write 64 >/dev/null
    [[ $policy == smart ]] && smart_settle
    for reader in cmp cat; do
      down
      "$NODUP" mount "$W/img" "$MNT" >/dev/null
      local r0; r0=$(nodup_stat "s['media_bytes_read']")
      if [[ $reader == cmp ]]; then
        cmp "$MNT/a" "$MNT/b"
      else
        cat "$MNT/a" >/dev/null & cat "$MNT/b" >/dev/null; wait
      fi
      local r1; r1=$(nodup_stat "s['media_bytes_read']")
      local hits; hits=$(nodup_stat "s['read_cache_hits']")
      local mib; mib=$(python3 -c "print('%.1f' % (($r1 - $r0) / 1048576))")
      local of="-"
      if [[ $policy == none ]]; then
        [[ $reader == cmp ]] && none_cmp=$((r1 - r0)) || none_cat=$((r1 - r0))
        of="1.00"
      else
        local base=$none_cmp; [[ $reader == cat ]] && base=$none_cat
        of=$(python3 -c "print('%.3f' % (($r1 - $r0) / $base))")
      fi
      local bud="-"; [[ $policy == smart ]] && bud=3M
      echo "| $policy | $bud | \`$reader\` | $mib | $of | $hits |" >>"$OUTDIR/readcache.md"
    done
    down
  done
  echo >>"$OUTDIR/readcache.md"
}

# ---- filter ----------------------------------------------------------------------------------

filter() {
  local size=512M
  [[ $QUICK == 1 ]] && size=64M
  "$NODUP" trace gen --size "$size" --dup-ratio 0.5 --run-length geom:3 --seed 11 -o "$W/filter.trace" >/dev/null
  {
    echo "## Run filter (fragmentation): threshold T vs ratio vs extents"
    echo
    echo "Each trace replayed in batch mode (\`nodup replay --mode batch --no-reads\`) on a fresh \`smart\` image (\`--mem-budget 3M\`), the worker settled; extents: runs of consecutive file blocks on consecutive physical blocks over all files (\`file_extents\`). \`none\` gives the extents without dedup."
    echo
    echo "| trace | T | ratio | extents | extents / none |"
    echo "|---|---:|---:|---:|---:|"
  } >"$OUTDIR/filter.md"
  for t in ../shared/data/fiu/homes-sample.1.blkparse ../shared/data/fiu/mail-01-sample.blkparse "$W/filter.trace"; do
    local name; name=$(basename "$t")
    [[ $t == "$W/filter.trace" ]] && name="generated $size, 50 pct dup, runs geom:3"
    up none 4G
    "$NODUP" replay "$t" --dir "$MNT" --mode batch --no-reads >/dev/null
    local base; base=$(nodup_stat "s['file_extents']")
    echo "| $name | none | $(ratio) | $base | 1.00 |" >>"$OUTDIR/filter.md"
    down
    for T in 1 2 3 4; do
      up smart 4G --min-run "$T"
      "$NODUP" replay "$t" --dir "$MNT" --mode batch --no-reads >/dev/null
      smart_settle
      nodup_stat "'| $name | $T | %.4f | %d | %.3f |' % (s['dedup_ratio'], s['file_extents'], s['file_extents'] / $base)" >>"$OUTDIR/filter.md"
      down
    done
  done
  echo >>"$OUTDIR/filter.md"
}

# ---- replay ----------------------------------------------------------------------------------

replay() {
  local size=2G
  [[ $QUICK == 1 ]] && size=128M
  "$NODUP" trace gen --size "$size" --dup-ratio 0.75 --seed 13 -o "$W/replay.trace" >/dev/null
  {
    echo "## Trace replay with \`--mem-budget 3MiB\`"
    echo
    echo "Each trace replayed in batch mode with reads skipped, on fresh images; \`smart\` settled afterwards. Written: data blocks (\`media_bytes_written\`), plus, for \`smart\`, its fingerprint-store groups; metadata (entries, log, checkpoints) is in the last column."
    echo
    echo "| trace | policy | ratio | vs light | data MiB written | store MiB written | total vs none | metadata MiB written |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
  } >"$OUTDIR/replay.md"
  for t in ../shared/data/fiu/homes-sample.1.blkparse ../shared/data/fiu/mail-01-sample.blkparse "$W/replay.trace"; do
    local name; name=$(basename "$t")
    [[ $t == "$W/replay.trace" ]] && name="generated $size, 75 %"
    local none_w= light_r=
    for policy in none light smart; do
      up "$policy" 8G
      "$NODUP" replay "$t" --dir "$MNT" --mode batch --no-reads >/dev/null
      [[ $policy == smart ]] && smart_settle
      local r; r=$(ratio)
      local dw; dw=$(nodup_stat "s['media_bytes_written']")
      local sw=0
      [[ $policy == smart ]] && sw=$(nodup_stat "s['smart']['store_io_written_bytes']")
      local mw; mw=$(nodup_stat "s['meta_bytes_written']")
      [[ $policy == none ]] && none_w=$dw
      [[ $policy == light ]] && light_r=$r
      python3 - "$name" "$policy" "$r" "$light_r" "$dw" "$sw" "$none_w" "$mw" >>"$OUTDIR/replay.md" <<'PY'
import sys
name, pol, r, lr, dw, sw, nw, mw = sys.argv[1:]
vs = f"{float(r) / float(lr):.3f}" if lr and pol == "smart" and float(lr) > 0 else "-"
tot = (int(dw) + int(sw)) / int(nw)
print(f"| {name} | {pol} | {r} | {vs} | {int(dw)/1048576:.1f} | {int(sw)/1048576:.1f} | {tot:.3f} | {int(mw)/1048576:.1f} |")
PY
      down
    done
  done
  echo >>"$OUTDIR/replay.md"
}

# ---- main ------------------------------------------------------------------------------------

sections=("$@")
[[ ${#sections[@]} -eq 0 ]] && sections=(budget eviction adaptive readcache filter replay)
for s in "${sections[@]}"; do
  case $s in
    budget | eviction | adaptive | readcache | filter | replay)
      "$s"
      # Each section names the tree it ran at (sections are rerun one at a time).
      # (the binary's commit; "-dirty" when it was built from uncommitted changes).
      tree=$(bench_tree)
      sed -i "2i\\\n_Run at tree $tree, $(date -u +%F)._" "$OUTDIR/$s.md"
      ;;
    join) ;; # only join the sections already written (after editing reading.md)
    *) echo "bench/smart.sh: unknown section '$s' (budget, eviction, adaptive, readcache, filter, replay, join)" >&2; exit 2 ;;
  esac
done
# The header names the binary and tree that produced the tables: a `join` alone keeps it.
if [[ " ${sections[*]} " == " join " && -f $RESULTS/smart.md ]]; then
  head_line=$(sed -n 3p "$RESULTS/smart.md")
else
  [[ -n ${NODUP:-} ]] || ensure_nodup
  head_line=$(header)
fi
{
  echo "# Policy smart: acceptance (issue 16)"
  echo
  echo "$head_line"
  echo "Produced by \`bench/smart.sh\`; each section below is regenerated by \`bench/smart.sh SECTION\`."
  echo
  # reading.md is the hand-written reading of the numbers (update it when they change).
  for s in budget eviction adaptive readcache filter replay ab reading; do
    [[ -f $OUTDIR/$s.md ]] && cat "$OUTDIR/$s.md"
  done
} >"$RESULTS/smart.md"
echo "wrote $RESULTS/smart.md"
