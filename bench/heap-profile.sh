#!/usr/bin/env bash
# Where the daemon's heap goes: heaptrack a foreground mount through the budget workload of
# bench/smart.sh (N MiB of unique 256 KiB writes, the same blocks again shuffled, the smart
# worker settled), then list the largest consumers at the heap's peak by the first nodup/fuser
# frame. Peaks are allocated bytes (a zeroed buffer counts whole even if never touched: the
# FUSE sessions' 4 x 16 MiB request buffers are mostly never faulted in).
# Usage: bench/heap-profile.sh POLICY MIB [BUDGET]   e.g. bench/heap-profile.sh smart 2048 512K
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
policy=${1:?policy} mib=${2:?MiB of unique data} budget=${3:-3M}
command -v heaptrack >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq heaptrack >/dev/null
cargo build --release -q -p nodup-cli
NODUP=$PWD/target/release/nodup
W=$(mktemp -d /dev/shm/nodup-heap.XXXXXX)
MNT=$W/mnt
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && fusermount3 -u "$MNT"; rm -rf "$W"' EXIT
extra=() margs=()
[[ $policy == smart ]] && extra=(--mem-budget "$budget") && margs=(--worker-rate 0)
"$NODUP" mkfs "$W/img" --size "$((mib * 4))M" --policy "$policy" "${extra[@]}" >/dev/null
# The tunable the daemon sets for itself (cmd/malloc_tune.rs), given here so that the
# foreground mount does not re-execute itself under heaptrack.
GLIBC_TUNABLES=glibc.malloc.tcache_max=64 heaptrack -o "$W/heap" "$NODUP" mount "$W/img" "$MNT" --foreground "${margs[@]}" >"$W/heaptrack.log" 2>&1 &
hp=$!
for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.2; done
"$NODUP" bench fill "$MNT/a" --blocks $((mib * 256)) --per-write 64 >/dev/null
"$NODUP" bench fill "$MNT/b" --blocks $((mib * 256)) --order shuffle >/dev/null
if [[ $policy == smart ]]; then
  "$NODUP" ctl "$MNT" --worker-rate 1000000
  for _ in $(seq 3000); do
    [[ $("$NODUP" stats "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["smart"]["fs"]["idle"])') == True ]] && break
    sleep 0.2
  done
fi
"$NODUP" umount "$MNT" >/dev/null
wait "$hp" || true
echo "$policy, $mib MiB unique + the same shuffled${extra:+, budget $budget}: heap at its peak by first nodup/fuser frame"
heaptrack_print -f "$W"/heap.* --print-peaks 1 --print-allocators 0 --print-temporary 0 \
  --print-leaks 0 -n 40 -s 40 2>/dev/null |
  awk '/peak memory consumed/ {h=""; next}   # a group header: its callers follow
       /consumed over .* calls from:/ {h=$1; s=0; next}
       /nodup_|fuser::/ && !s && h != "" {sub(/::h[0-9a-f]+$/, "", $1); print h "\t" $1; s=1}' |
  sort -h -r | head -16
