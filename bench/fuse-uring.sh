#!/usr/bin/env bash
# Issue 20 item 4: what FUSE over io_uring gives the FUSE ceiling. The null file system of
# crates/nodup-uring-null (writes discarded, reads zeros, no engine) is served by the same
# handler over classic /dev/fuse read/write (THREADS threads, nodup's default 4) and over the
# ring (one queue per CPU), and fio writes through each:
#   fio --ioengine=sync --rw=write --end_fsync=1, bs 4k and 1m, numjobs 1 and 2 (SIZE in total,
#   split between the jobs), without and with the writeback cache.
# Each round runs every configuration with every variant back to back (the order of the
# variants alternates between rounds); MiB/s is the median of RUNS rounds and the ratio the
# median of the per-round ratios against classic. Each fio runs under /work/tools/cpu-exclusive.
# /sys/module/fuse/parameters/enable_uring is set to Y for the duration and restored.
#
# Variants (VARIANTS, default "classic uring"): classic, uring (io_uring default task work),
# uring-coop (COOP_TASKRUN), uring-defer (SINGLE_ISSUER + DEFER_TASKRUN), and fuser when
# FUSEREF names a command that mounts fuser's null file system as `$FUSEREF MNT
# [--writeback-cache]` (e.g. branch ceiling's `nodup-fuseref null`). A variant written
# TRANSPORT+SINK (classic+store, uring+copy, ...) gives that transport's WRITE data to one of
# the reference data paths of crates/nodup-uring-null/src/sink.rs instead of discarding it:
# what the ring gives a daemon that stores data, not only the ceiling. A trailing +dio opens
# every file with FOPEN_DIRECT_IO (classic+dio, classic+store+dio).
#
# Usage: bench/fuse-uring.sh   (env: RUNS=5 SIZE=1g THREADS=4 VARIANTS=... BSS="4k 1m"
#                               JOBS="1 2" WBS="0 1" OUT=docs/results/fuse-uring.md)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
RUNS=${RUNS:-5}
SIZE=${SIZE:-1g}
THREADS=${THREADS:-4}
VARIANTS=${VARIANTS:-classic uring}
[[ -n ${FUSEREF:-} && $VARIANTS != *fuser* ]] && VARIANTS="$VARIANTS fuser"
BSS=${BSS:-4k 1m}
JOBS=${JOBS:-1 2}
WBS=${WBS:-0 1}
OUT=${OUT:-docs/results/fuse-uring.md}
PARAM=/sys/module/fuse/parameters/enable_uring
EXCL=/work/tools/cpu-exclusive
[[ -x $EXCL ]] || EXCL=""
SHARED=/work/tools/cpu-shared
[[ -x $SHARED ]] || SHARED=""

[[ $(id -u) == 0 ]] || { echo "needs root (mount(2), $PARAM)" >&2; exit 1; }
[[ -e /dev/fuse ]] || { echo "no /dev/fuse" >&2; exit 1; }
[[ -w $PARAM ]] || { echo "no $PARAM: kernel without CONFIG_FUSE_IO_URING" >&2; exit 1; }
command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
if [[ -z ${BIN:-} ]]; then
  $SHARED cargo build --release -q -p nodup-uring-null
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/nodup-uring-null
fi
bytes() { numfmt --from=iec "${1^^}"; }
SIZE_B=$(bytes "$SIZE")

W=$(mktemp -d /dev/shm/nodup-fuse-uring.XXXXXX)
MNT=$W/mnt
mkdir -p "$MNT"
OLD_PARAM=$(cat "$PARAM")
DPID=""
cleanup() {
  if [[ -n $DPID ]]; then kill -TERM "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; fi
  if mountpoint -q "$MNT"; then umount -l "$MNT" || true; fi
  echo "$OLD_PARAM" >"$PARAM"
  rm -rf "$W"
}
trap cleanup EXIT
echo Y >"$PARAM"
if [[ -n ${FUSEREF:-} ]]; then
  # Run a private copy: the binary may belong to another worktree that rebuilds it meanwhile.
  read -r ref_bin ref_args <<<"$FUSEREF"
  cp "$ref_bin" "$W/fuseref"
  FUSEREF_RUN="$W/fuseref $ref_args"
fi

# up VARIANT WB: mount the null file system with VARIANT's transport at $MNT, in the background.
up() {
  local args=()
  [[ $2 == 1 ]] && args+=(--writeback-cache)
  local v=$1
  # TRANSPORT+SINK: that transport with WRITE data going to a reference data path.
  if [[ $v == *+dio ]]; then args+=(--direct-io); v=${v%+dio}; fi
  if [[ $v == *+* ]]; then args+=(--sink "${v#*+}"); v=${v%%+*}; fi
  case $v in
    classic) "$BIN" "$MNT" --classic --threads "$THREADS" "${args[@]}" >"$W/daemon.out" & ;;
    uring) "$BIN" "$MNT" "${args[@]}" >"$W/daemon.out" & ;;
    uring-coop) "$BIN" "$MNT" --taskrun coop "${args[@]}" >"$W/daemon.out" & ;;
    uring-defer) "$BIN" "$MNT" --taskrun defer "${args[@]}" >"$W/daemon.out" & ;;
    fuser) $FUSEREF_RUN "$MNT" "${args[@]}" >"$W/daemon.out" 2>&1 & ;;
    *) echo "unknown variant $1" >&2; exit 1 ;;
  esac
  DPID=$!
  local i
  for i in $(seq 200); do
    if [[ $v == fuser ]]; then mountpoint -q "$MNT" && stat "$MNT" >/dev/null && return 0
    else grep -q '^ready ' "$W/daemon.out" && return 0; fi
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.05
  done
  echo "variant $1 did not come up: $(cat "$W/daemon.out")" >&2
  exit 1
}
# down: unmount through the daemon (SIGTERM); sets SERVED to its `served ...` line.
down() {
  kill -TERM "$DPID"
  wait "$DPID" || true
  DPID=""
  if mountpoint -q "$MNT"; then umount "$MNT"; fi
  SERVED=$(grep '^served ' "$W/daemon.out" || true)
}
# fio_bw BS JOBS: MiB/s of a sequential write of SIZE in total, split between JOBS jobs.
fio_bw() {
  $EXCL fio --name=w --directory="$MNT" --ioengine=sync --rw=write --bs="$1" \
    --size=$((SIZE_B / $2)) --numjobs="$2" --end_fsync=1 --group_reporting \
    --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw"]/1024))'
}

declare -A BW RATIO PERWRITE
CONFIGS=()
for bs in $BSS; do for jobs in $JOBS; do for wb in $WBS; do CONFIGS+=("$bs/$jobs/$wb"); done; done; done
read -ra VS <<<"$VARIANTS"
echo "RUNS=$RUNS SIZE=$SIZE variants: ${VS[*]}; configs (bs/jobs/wb): ${CONFIGS[*]}" >&2
for r in $(seq "$RUNS"); do
  order=("${VS[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#VS[@]} - 1; i >= 0; i--)); do order+=("${VS[i]}"); done
  fi
  for c in "${CONFIGS[@]}"; do
    IFS=/ read -r bs jobs wb <<<"$c"
    declare -A this=()
    for v in "${order[@]}"; do
      up "$v" "$wb"
      bw=$(fio_bw "$bs" "$jobs")
      down
      if [[ $v == uring* && $SERVED == *"ring=0 "* ]]; then
        echo "variant $v served nothing over the ring: $SERVED" >&2
        exit 1
      fi
      # Requests per write(2): all requests served / fio's write calls (fuser prints no count).
      PERWRITE[$c/$v]=-
      if [[ -n $SERVED ]]; then
        total=$(awk '{for (i = 2; i <= 3; i++) { split($i, kv, "="); s += kv[2] }} END {print s+0}' <<<"$SERVED")
        PERWRITE[$c/$v]=$(awk -v t="$total" -v n="$((SIZE_B / $(bytes "$bs")))" 'BEGIN {printf "%.2f", t / n}')
      fi
      this[$v]=$bw
      BW[$c/$v]+="$bw "
    done
    for v in "${VS[@]}"; do
      RATIO[$c/$v]+="$(awk -v a="${this[$v]}" -v b="${this[classic]:-0}" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "nan"}') "
    done
    echo "run $r $c: $(for v in "${VS[@]}"; do printf '%s=%s ' "$v" "${this[$v]}"; done)" >&2
    unset this
  done
done

{
  echo "# FUSE over io_uring vs classic /dev/fuse on a null file system (issue 20, item 4)"
  echo
  echo "Generated by \`bench/fuse-uring.sh\` on $(date -u +%F), tree $(git rev-parse --short HEAD)."
  echo
  echo "- Machine: $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM, possible CPUs $(cat /sys/devices/system/cpu/possible) (= ring queues)"
  echo "- Kernel: $(uname -r), \`fuse.enable_uring\` Y for the run (was $OLD_PARAM); $(fio --version)"
  echo "- File system: \`nodup-uring-null\` (crates/nodup-uring-null): flat root, WRITE discarded and answered with its size, READ zeros; INIT flags as nodup's (max_write 1 MiB, max_pages 256, HANDLE_KILLPRIV_V2, ...); one handler for every transport"
  echo "- Variants: classic = \`nodup-uring-null MNT --classic --threads $THREADS\` (read/write on cloned /dev/fuse descriptors); uring = \`nodup-uring-null MNT\` (one queue per possible CPU, thread pinned to it, 8 entries of 1 MiB per queue)$( [[ $VARIANTS == *coop* ]] && echo "; uring-coop = \`--taskrun coop\`")$( [[ $VARIANTS == *defer* ]] && echo "; uring-defer = \`--taskrun defer\`")$( [[ $VARIANTS == *fuser* ]] && echo "; fuser = \`$FUSEREF MNT\`"); \`--writeback-cache\` added where wb = 1"
  echo "- fio: \`fio --name=w --directory=MNT --ioengine=sync --rw=write --bs=BS --size=SIZE/JOBS --numjobs=JOBS --end_fsync=1 --group_reporting\`, SIZE = $SIZE in total, under \`/work/tools/cpu-exclusive\`, on a fresh mount each run"
  echo "- $RUNS rounds; each round runs every configuration with every variant back to back (variant order reversed every other round). MiB/s: median of the rounds; ratio: median of the per-round ratios against classic; req/write: requests the daemon served per write(2) (last round)"
  echo
  printf '| bs | jobs | wb |'
  for v in "${VS[@]}"; do printf ' %s MiB/s |' "$v"; done
  for v in "${VS[@]}"; do [[ $v != classic ]] && printf ' %s/classic |' "$v"; done
  printf ' req/write (%s) |\n' "$(tr ' ' '/' <<<"${VS[*]}")"
  printf '|---|---|---|'
  for v in "${VS[@]}"; do printf -- '---:|'; done
  for v in "${VS[@]}"; do [[ $v != classic ]] && printf -- '---:|'; done
  printf -- '---|\n'
  for c in "${CONFIGS[@]}"; do
    IFS=/ read -r bs jobs wb <<<"$c"
    printf '| %s | %s | %s |' "$bs" "$jobs" "$wb"
    for v in "${VS[@]}"; do printf ' %.1f |' "$(median_of "${BW[$c/$v]}")"; done
    for v in "${VS[@]}"; do [[ $v != classic ]] && printf ' %.3f |' "$(median_of "${RATIO[$c/$v]}")"; done
    printf ' %s |\n' "$(for v in "${VS[@]}"; do printf '%s/' "${PERWRITE[$c/$v]}"; done | sed 's|/$||')"
  done
  echo
  echo "All runs (MiB/s, in round order):"
  echo
  for c in "${CONFIGS[@]}"; do
    for v in "${VS[@]}"; do echo "- $c $v: ${BW[$c/$v]% }"; done
  done
} >"$OUT"
cat "$OUT"
