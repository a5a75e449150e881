#!/usr/bin/env bash
# POSIX syscall semantics: pjdfstest (the Rust rewrite, crates.io 0.2.x) against a nodup mount.
# The skip list is in scripts/fs-pjdfstest.toml (expected_failures, each entry commented).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
TOOLS=$PWD/target/fs-tools
CONF=$PWD/scripts/fs-pjdfstest.toml
if [ ! -x "$TOOLS/bin/pjdfstest" ]; then
  echo "fs-pjdfstest: installing pjdfstest into $TOOLS"
  CARGO_TARGET_DIR=$TOOLS/build cargo install --quiet --locked --root "$TOOLS" pjdfstest --version '^0.2'
fi
NODUP=${NODUP:-$PWD/target/release/nodup}
[ -x "$NODUP" ] || cargo build --release -p nodup-cli

IMG=/dev/shm/nodup-pjdfstest-$$.img
MNT=/tmp/nodup-pjdfstest-$$
cleanup() {
  if mountpoint -q "$MNT" 2>/dev/null; then "$NODUP" umount "$MNT" || fusermount3 -u -z "$MNT" || true; fi
  rm -f "$IMG"; rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$MNT"
"$NODUP" mkfs "$IMG" --size 1G >/dev/null
"$NODUP" mount "$IMG" "$MNT" >/dev/null
mkdir "$MNT/work"
chmod 755 "$MNT/work"
echo "fs-pjdfstest: running pjdfstest on $MNT/work"
rc=0
(cd "$MNT/work" && "$TOOLS/bin/pjdfstest" -c "$CONF" -p "$MNT/work") || rc=$?
"$NODUP" umount "$MNT"
"$NODUP" fsck "$IMG" >/dev/null || { echo "fs-pjdfstest: fsck found problems after the run" >&2; "$NODUP" fsck "$IMG" | tail -5; exit 1; }
if [ $rc -ne 0 ]; then echo "fs-pjdfstest: FAILED" >&2; exit $rc; fi
echo "fs-pjdfstest: passed"
