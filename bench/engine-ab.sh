#!/usr/bin/env bash
# A/B of two nodup binaries on the engine write path (`nodup bench engine`, no FUSE): the
# binaries alternate round by round on the same host (the order rotates) so drift hits them
# alike; per point the median MiB/s of each and the ratio B/A. For engine changes, where code
# layout alone moves a point by several percent, read the ratios only beside the run-to-run
# spread: a third binary CONTROL (a byte copy of A) is run in the same rounds, and its A'/A
# column is that spread, measured in the same minutes.
# Compare binaries built the same way: the workspace aligns every loop (.cargo/config.toml), so
# build an older tree with RUSTFLAGS="-C llvm-args=-align-loops=64" too, or its loops' placement
# shows up as a difference (up to 15 % at the rewrite points, docs/results/engine-ab-issue15.md).
# Usage: bench/engine-ab.sh OLD_BINARY NEW_BINARY [CONTROL_BINARY]
#        (ROUNDS=9 SIZE=1GiB POLICIES=light,none,weak-verify DUPS=0,75,100; METRIC=cpu compares
#        MiB per second of the writing thread's CPU time instead of wall-clock time, which
#        leaves out time the thread was not running)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
A=${1:?old binary}
B=${2:?new binary}
C=${3:-}
ROUNDS=${ROUNDS:-9}
SIZE=${SIZE:-1GiB}
POLICIES=${POLICIES:-light,none,weak-verify}
DUPS=${DUPS:-0,75,100}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
sides=(A B)
[[ -n $C ]] && sides+=(C)
declare -A exe=([A]=$A [B]=$B [C]=$C)
for r in $(seq 1 "$ROUNDS"); do
  n=${#sides[@]}
  for ((i = 0; i < n; i++)); do
    side=${sides[$(((i + r) % n))]}
    "${exe[$side]}" bench engine --size "$SIZE" --runs 1 --policy "$POLICIES" --dup "$DUPS" \
      --no-variants --json >"$W/$side-$r.json"
  done
done
# Name each side's binary and the commit it was built from (its --version), so a table pasted
# elsewhere still says what was compared.
for side in "${sides[@]}"; do
  c=$("${exe[$side]}" --version 2>/dev/null | sed -n 's/.*(commit \([^)]*\)).*/\1/p' || true)
  echo "- $side: \`${exe[$side]}\` (commit ${c:-unknown: built before --version named it})"
done
echo "- $ROUNDS rounds, $SIZE per point, ${METRIC:-wall} MiB/s"
echo
python3 - "$W" "$ROUNDS" "${sides[*]}" "${METRIC:-wall}" <<'PY'
import json, statistics, sys
w, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
field = "mib_per_s_cpu" if sys.argv[4] == "cpu" else "mib_per_s"
pts = {}
for side in sides:
    for r in range(1, rounds + 1):
        for x in json.load(open(f"{w}/{side}-{r}.json"))["runs"]:
            key = (x["policy"], x["dup_percent"], x["pass"])
            pts.setdefault(key, {}).setdefault(side, []).append(x[field])
ctl = "C" in sides
print("| policy | dup % | pass | A MiB/s | B MiB/s | B/A |" + (" A'/A (control) |" if ctl else ""))
print("|---|---:|---:|---:|---:|---:|" + ("---:|" if ctl else ""))
for k in sorted(pts):
    a, b = statistics.median(pts[k]["A"]), statistics.median(pts[k]["B"])
    row = f"| {k[0]} | {k[1]} | {k[2]} | {a:.0f} | {b:.0f} | {b / a:.3f} |"
    if ctl:
        row += f" {statistics.median(pts[k]['C']) / a:.3f} |"
    print(row)
PY
