#!/usr/bin/env bash
# A/B of two nodup binaries on the engine write path (`nodup bench engine`, no FUSE): the two
# binaries alternate round by round on the same host so drift hits both alike; per point the
# median MiB/s of each and the ratio B/A. For engine changes, where code layout alone moves a
# point by several percent, read the ratios only beside the run-to-run spread.
# Usage: bench/engine-ab.sh OLD_BINARY NEW_BINARY
#        (ROUNDS=9 SIZE=1GiB POLICIES=light,none,weak-verify DUPS=0,75,100)
set -euo pipefail
A=${1:?old binary}
B=${2:?new binary}
ROUNDS=${ROUNDS:-9}
SIZE=${SIZE:-1GiB}
POLICIES=${POLICIES:-light,none,weak-verify}
DUPS=${DUPS:-0,75,100}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    exe=$A
    [[ $side == B ]] && exe=$B
    "$exe" bench engine --size "$SIZE" --runs 1 --policy "$POLICIES" --dup "$DUPS" \
      --no-variants --json >"$W/$side-$r.json"
  done
done
python3 - "$W" "$ROUNDS" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
pts = {}
for side in "AB":
    for r in range(1, rounds + 1):
        for x in json.load(open(f"{w}/{side}-{r}.json"))["runs"]:
            key = (x["policy"], x["dup_percent"], x["pass"])
            pts.setdefault(key, {}).setdefault(side, []).append(x["mib_per_s"])
print("| policy | dup % | pass | A MiB/s | B MiB/s | B/A |")
print("|---|---:|---:|---:|---:|---:|")
for k in sorted(pts):
    a, b = statistics.median(pts[k]["A"]), statistics.median(pts[k]["B"])
    print(f"| {k[0]} | {k[1]} | {k[2]} | {a:.0f} | {b:.0f} | {b / a:.3f} |")
PY
