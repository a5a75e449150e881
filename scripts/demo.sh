#!/usr/bin/env bash
# make demo: make an image in /dev/shm, mount it, copy a real tree (the Linux 6.1 source, or
# /usr/share when that cannot be had) twice, print the stats, unmount, remount, diff both copies
# against the source, unmount and remove the image. Safe to run twice; cleans up on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
NODUP=${NODUP:-target/release/nodup}
[ -x "$NODUP" ] || cargo build --release -p nodup-cli

IMG=/dev/shm/nodup-demo.img
MNT=/tmp/nodup-demo-mnt
CACHE=/var/tmp/nodup-demo          # the unpacked source tree, kept between runs
TARBALL=/usr/src/linux-source-6.1.tar.xz

cleanup() {
  if mountpoint -q "$MNT" 2>/dev/null; then "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || true; fi
  rm -f "$IMG"
  rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT

# The source tree: the kernel tarball unpacked once, else /usr/share.
if [ ! -e "$TARBALL" ]; then
  echo "demo: installing linux-source-6.1"
  (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq >/dev/null && apt-get install -y -qq linux-source-6.1 >/dev/null) \
    || echo "demo: linux-source-6.1 unavailable; falling back to /usr/share"
fi
if [ -e "$TARBALL" ]; then
  SRC=$CACHE/linux-source-6.1
  if [ ! -e "$CACHE/.unpacked" ]; then
    echo "demo: unpacking $TARBALL into $CACHE (once)"
    rm -rf "$CACHE"; mkdir -p "$CACHE"
    tar -xJf "$TARBALL" -C "$CACHE"
    touch "$CACHE/.unpacked"
  fi
else
  SRC=/usr/share
fi
echo "demo: source tree $SRC ($(du -sh --apparent-size "$SRC" 2>/dev/null | cut -f1))"

echo "demo: nodup estimate (what one copy would save, reading only)"
"$NODUP" estimate "$SRC"

# A stale mount or image from an interrupted run goes first.
cleanup
mkdir -p "$MNT"
"$NODUP" mkfs "$IMG" --size 8G
"$NODUP" mount "$IMG" "$MNT"

copy() {
  local t0 ms
  t0=$(date +%s%N)
  cp -a "$SRC" "$MNT/$1"
  ms=$((($(date +%s%N) - t0) / 1000000))
  printf 'demo: copy %s took %d.%03d s\n' "$1" $((ms / 1000)) $((ms % 1000))
}
copy copy1
copy copy2
echo "demo: nodup stats $MNT"
"$NODUP" stats "$MNT"

"$NODUP" umount "$MNT"
"$NODUP" mount "$IMG" "$MNT"
echo "demo: diff -r against the source after remount"
diff -r --no-dereference "$SRC" "$MNT/copy1"
diff -r --no-dereference "$SRC" "$MNT/copy2"
echo "demo: both copies identical to the source"
"$NODUP" umount "$MNT"
"$NODUP" fsck "$IMG"
echo "demo: OK"
