#!/usr/bin/env bash
# Data integrity under random operations: fsx (fsx-rs, crates.io 0.3.x) on a nodup mount,
# 100 000 operations with a fixed seed (pmem image), then 50 000 with a random seed that is
# printed (blockfile image, writeback cache), then 50 000 with that seed on a pmem image mounted
# with --async-writes (writes of 128 KiB and up answered before they are stored; fsx writes up
# to 256 KiB). FSX_OPS / FSX_RANDOM_OPS override the counts; FSX_SEED replays a random run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
TOOLS=$PWD/target/fs-tools
CONF=$PWD/scripts/fs-fsx.toml
if [ ! -x "$TOOLS/bin/fsx" ]; then
  echo "fs-fsx: installing fsx into $TOOLS"
  CARGO_TARGET_DIR=$TOOLS/build cargo install --quiet --locked --root "$TOOLS" fsx --version '^0.3'
fi
NODUP=${NODUP:-$PWD/target/release/nodup}
[ -x "$NODUP" ] || cargo build --release -p nodup-cli
OPS=${FSX_OPS:-100000}
RANDOM_OPS=${FSX_RANDOM_OPS:-50000}
RANDOM_SEED=${FSX_SEED:-$(( (RANDOM << 15) | RANDOM ))}

IMG=/dev/shm/nodup-fsx-$$.img
MNT=/tmp/nodup-fsx-$$
ART=/tmp/nodup-fsx-$$.artifacts
cleanup() {
  if mountpoint -q "$MNT" 2>/dev/null; then "$NODUP" umount "$MNT" || fusermount3 -u -z "$MNT" || true; fi
  rm -f "$IMG"; rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$MNT" "$ART"
run() { # medium, extra mount flags, seed, operations
  "$NODUP" mkfs "$IMG" --size 512M --medium "$1" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" $2 >/dev/null
  echo "fs-fsx: $4 operations, seed $3, medium $1 ${2:-}"
  if ! "$TOOLS/bin/fsx" -q -N "$4" -S "$3" -f "$CONF" -P "$ART" "$MNT/fsx.data"; then
    echo "fs-fsx: FAILED with seed $3 (artifacts in $ART)" >&2
    exit 1
  fi
  "$NODUP" umount "$MNT"
  "$NODUP" fsck "$IMG" >/dev/null || { echo "fs-fsx: fsck found problems (seed $3)" >&2; exit 1; }
  rm -f "$IMG"
}
run pmem "" 1 "$OPS"
run blockfile "--writeback-cache" "$RANDOM_SEED" "$RANDOM_OPS"
run pmem "--async-writes" "$RANDOM_SEED" "$RANDOM_OPS"
rm -rf "$ART"
echo "fs-fsx: passed (fixed seed 1, random seed $RANDOM_SEED)"
