#!/usr/bin/env bash
# Instructions per block of the engine write path, old binary against new: a measure the noisy
# shared host cannot move. Each binary runs `nodup bench engine` for one point under valgrind's
# callgrind, counting only inside `Engine::write_blocks` (everything the write path executes:
# fingerprinting, lookup, comparison, stores, flushes, locks; not the data generator or the
# floors the bench also measures). Both passes of the point are counted (first write and
# rewrite), so Ir/block = collected / (2 x blocks). The count is deterministic to a few hundred
# instructions in a hundred million; it says nothing about cache misses or stalls, so it
# complements the interleaved timings of engine-ab.sh rather than replacing them.
# Usage: bench/engine-instr.sh OLD_BINARY NEW_BINARY   (SIZE=64MiB POLICIES=light,none,weak-verify DUPS=0,75,100)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
A=${1:?old binary}
B=${2:?new binary}
SIZE=${SIZE:-64MiB}
POLICIES=${POLICIES:-light,none,weak-verify}
DUPS=${DUPS:-0,75,100}
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
bytes=$(numfmt --from=iec "${SIZE%B}" 2>/dev/null || numfmt --from=iec-i "${SIZE%B}")
blocks=$((2 * bytes / 4096))
count() {
  valgrind --tool=callgrind --toggle-collect='*::write_blocks' --callgrind-out-file="$W/cg.out" \
    "$1" bench engine --size "$SIZE" --runs 1 --policy "$2" --dup "$3" --no-variants --json \
    2>"$W/err" >/dev/null || { echo "engine-instr: $1 failed: $(tail -1 "$W/err")" >&2; exit 1; }
  awk '/Collected :/ {print $NF}' "$W/err"
}
echo "| policy | dup % | A Ir/block | B Ir/block | B/A |"
echo "|---|---:|---:|---:|---:|"
for p in ${POLICIES//,/ }; do
  for d in ${DUPS//,/ }; do
    a=$(count "$A" "$p" "$d")
    b=$(count "$B" "$p" "$d")
    awk -v p="$p" -v d="$d" -v a="$a" -v b="$b" -v n="$blocks" \
      'BEGIN { printf "| %s | %s | %.0f | %.0f | %.3f |\n", p, d, a / n, b / n, b / a }'
  done
done
