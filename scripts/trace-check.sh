#!/usr/bin/env bash
# Acceptance checks of the trace tools (issue 4) that need the built binary:
#  1. `nodup trace stats --json` dedup_ratio equals the independent tests/trace-dedup-ratio.py
#     on every shared FIU sample, a generated trace and a deliberately corrupted copy;
#  2. FIU -> own -> FIU conversion gives back the same lines;
#  3. replaying each sample in block and batch mode (1 and 3 threads) into a scratch directory
#     gives zero verify errors and identical file hashes;
#  4. --strict stops at a bad line with its line number and a non-zero exit.
# Runs in a few seconds. NODUP may point at a prebuilt binary.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NODUP:-}" ]; then
  cargo build --release -q -p nodup-cli
  NODUP=target/release/nodup
fi
SAMPLES=${FIU_DIR:-../shared/data/fiu}
[ -d "$SAMPLES" ] || SAMPLES=/work/shared/data/fiu
TMP=$(mktemp -d /tmp/trace-check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "trace-check: FAIL: $*" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

# Inputs: the samples, a generated trace with reads, a corrupted copy of the homes sample.
traces=("$SAMPLES"/*.blkparse)
"$NODUP" trace gen --size 8M --dup-ratio 0.6 --run-length geom:6 --read-ratio 0.2 --seed 9 -o "$TMP/gen.fiu" 2>/dev/null
awk 'NR==3{print "garbage line"} NR==7{$5="x"} {print}' "$SAMPLES/homes-sample.1.blkparse" > "$TMP/corrupt.fiu"
# Unaligned variants (every request shifted by 3 sectors): exercises sector-granular read-modify-write.
awk '{$4 = $4 + 3; print}' "$SAMPLES/homes-sample.1.blkparse" > "$TMP/homes-unaligned.fiu"
awk '$6 == "W" {$4 = $4 + 3; print}' "$SAMPLES/mail-01-sample.blkparse" > "$TMP/mail-unaligned.fiu"
traces+=("$TMP/gen.fiu" "$TMP/corrupt.fiu" "$TMP/homes-unaligned.fiu" "$TMP/mail-unaligned.fiu")

for t in "${traces[@]}"; do
  name=$(basename "$t")
  ours=$("$NODUP" trace stats --json "$t" 2>/dev/null)
  ref=$(python3 tests/trace-dedup-ratio.py "$t")
  for k in writes duplicate_writes bad_lines; do
    a=$(field $k <<<"$ours"); b=$(field $k <<<"$ref")
    [ "$a" = "$b" ] || fail "$name: $k nodup=$a independent=$b"
  done
  python3 - "$ours" "$ref" "$name" <<'PY' || fail "$name: dedup_ratio differs"
import json, sys
a, b = json.loads(sys.argv[1])["dedup_ratio"], json.loads(sys.argv[2])["dedup_ratio"]
print(f"trace-check: {sys.argv[3]}: dedup_ratio nodup={a:.6f} independent={b:.6f}")
sys.exit(abs(a - b) > 1e-12)
PY
done
[ "$(field bad_lines <<<"$("$NODUP" trace stats --json "$TMP/corrupt.fiu" 2>/dev/null)")" = 2 ] || fail "corrupt trace: bad_lines != 2"

# --strict: first bad line is line 3 (the inserted garbage line).
if "$NODUP" trace stats --strict "$TMP/corrupt.fiu" >/dev/null 2>"$TMP/err"; then fail "--strict accepted a bad line"; fi
grep -q "line 3" "$TMP/err" || fail "--strict did not name line 3: $(cat "$TMP/err")"
if "$NODUP" replay --strict "$TMP/corrupt.fiu" --dir "$TMP/strict" >/dev/null 2>"$TMP/err"; then fail "replay --strict accepted a bad line"; fi
grep -q "line 3" "$TMP/err" || fail "replay --strict did not name line 3"

# Round trip through the own format.
for t in "$SAMPLES"/*.blkparse "$TMP/gen.fiu"; do
  "$NODUP" trace convert "$t" -o "$TMP/rt.own" 2>/dev/null
  "$NODUP" trace convert "$TMP/rt.own" -o "$TMP/rt.fiu" 2>/dev/null
  cmp -s <(tr -s ' ' <"$t" | sed 's/ *$//') "$TMP/rt.fiu" || fail "$(basename "$t"): FIU -> own -> FIU changed the trace"
  a=$(field dedup_ratio <<<"$("$NODUP" trace stats --json "$TMP/rt.own")"); b=$(field dedup_ratio <<<"$("$NODUP" trace stats --json "$t")")
  [ "$a" = "$b" ] || fail "$(basename "$t"): own-format stats differ"
done
echo "trace-check: convert round trip ok"

# Replays: same contents in every mode and thread count, no verify errors.
for t in "$SAMPLES"/*.blkparse "$TMP/gen.fiu" "$TMP/homes-unaligned.fiu"; do
  ref=""
  for m in block batch; do
    for th in 1 3; do
      d="$TMP/r-$m-$th"; rm -rf "$d"
      out=$("$NODUP" replay "$t" --dir "$d" --mode $m --threads $th --json)
      [ "$(field verify_errors <<<"$out")" = 0 ] || fail "$(basename "$t") $m/$th: verify errors"
      h=$(python3 tests/trace-hash-files.py "$t" "$d")
      [ -z "$ref" ] || [ "$h" = "$ref" ] || fail "$(basename "$t") $m/$th: contents differ from block/1"
      ref=$h
    done
  done
  echo "trace-check: replay $(basename "$t"): block/batch x 1/3 threads identical, 0 verify errors"
done
echo "trace-check: all passed"
