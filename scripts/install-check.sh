#!/usr/bin/env bash
# `make install` into a staging directory (binary, man pages, mount helper), then the mount(8)
# paths an operator uses: `mount -t fuse.nodup IMAGE DIR -o OPTIONS` and an fstab line (from a
# scratch fstab, `mount -T`), each unmounted with plain umount(8) and checked with fsck.
# mount(8) only looks for helpers in /sbin: the helper is linked there for the run and the
# previous state is put back afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
NODUP=$PWD/target/release/nodup
TMP=$(mktemp -d /tmp/nodup-install.XXXXXX)
HELPER=/sbin/mount.fuse.nodup
IMG=/dev/shm/nodup-install-$$.img
MNT=$TMP/mnt
saved=""
cleanup() {
  mountpoint -q "$MNT" 2>/dev/null && { umount "$MNT" || fusermount3 -u -z "$MNT" || true; }
  rm -f "$IMG"
  if [ -n "$saved" ]; then mv -f "$saved" "$HELPER"; elif [ -L "$HELPER" ] && [ "$(readlink "$HELPER")" = "$NODUP" ]; then rm -f "$HELPER"; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "install-check: FAIL: $*" >&2; exit 1; }

make -s install DESTDIR="$TMP/stage" PREFIX=/usr/local >/dev/null
for f in usr/local/bin/nodup usr/local/share/man/man1/nodup.1 usr/local/share/man/man1/nodup-mount.1 usr/local/share/man/man1/nodup-du.1; do
  [ -e "$TMP/stage/$f" ] || fail "make install did not install $f"
done
[ "$(readlink "$TMP/stage/sbin/mount.fuse.nodup")" = /usr/local/bin/nodup ] || fail "helper link"
man -l "$TMP/stage/usr/local/share/man/man1/nodup-mkfs.1" 2>/dev/null | grep -q -- "--force" || \
  grep -q -- "force" "$TMP/stage/usr/local/share/man/man1/nodup-mkfs.1" || fail "mkfs man page lacks --force"

if [ "$(id -u)" != 0 ]; then echo "install-check: not root, mount(8) part skipped"; exit 0; fi
if [ -e "$HELPER" ] || [ -L "$HELPER" ]; then saved=$TMP/helper.saved; mv "$HELPER" "$saved"; fi
ln -s "$NODUP" "$HELPER"
mkdir -p "$MNT"
"$NODUP" mkfs "$IMG" --size 64M >/dev/null
mount -t fuse.nodup "$IMG" "$MNT" -o prefetch=sp,threads=2,noatime,x-systemd.automount >/dev/null
grep -q " $MNT .*fuse.nodup" /proc/self/mountinfo || fail "mount -t fuse.nodup did not mount"
echo hello > "$MNT/a"; cp "$MNT/a" "$MNT/b"
"$NODUP" list | grep -q "$MNT" || fail "nodup list does not show the mount"
umount "$MNT"
for _ in $(seq 100); do "$NODUP" fsck "$IMG" >/dev/null 2>&1 && break; sleep 0.1; done
"$NODUP" fsck "$IMG" >/dev/null || fail "fsck after umount(8)"
if mount -t fuse.nodup "$IMG" "$MNT" -o bogus 2>"$TMP/err"; then fail "an unknown option was accepted"; fi
grep -q "unknown mount option" "$TMP/err" || fail "unknown option message: $(cat "$TMP/err")"
echo "$IMG $MNT fuse.nodup defaults,prefetch=cbp,nofail 0 0" > "$TMP/fstab"
mount -T "$TMP/fstab" "$MNT"
[ "$(cat "$MNT/b")" = hello ] || fail "fstab mount does not show the data"
umount "$MNT"
for _ in $(seq 100); do "$NODUP" fsck "$IMG" >/dev/null 2>&1 && break; sleep 0.1; done
"$NODUP" fsck "$IMG" >/dev/null || fail "fsck after the fstab mount"
# An encrypted selective image through mount(8): the key file and the cache options as -o.
rm -f "$IMG"
head -c 32 /dev/urandom >"$TMP/key"
"$NODUP" mkfs "$IMG" --size 64M --policy selective --encrypt-key-file "$TMP/key" >/dev/null
mount -t fuse.nodup "$IMG" "$MNT" -o "encrypt_key_file=$TMP/key,fp_cache=64K,prefetch_cache=0,refresh_ms=500" >/dev/null
echo secret-marker-9f2 > "$MNT/c"
"$NODUP" stats "$MNT" --json | grep -q '"encrypted":true' || fail "the -o mount is not the encrypted image"
"$NODUP" stats "$MNT" --json | grep -q '"budget_bytes":65536' || fail "fp_cache= did not reach the daemon"
umount "$MNT"
for _ in $(seq 100); do "$NODUP" fsck "$IMG" --encrypt-key-file "$TMP/key" >/dev/null 2>&1 && break; sleep 0.1; done
"$NODUP" fsck "$IMG" --encrypt-key-file "$TMP/key" >/dev/null || fail "fsck of the encrypted image"
if grep -q secret-marker-9f2 "$IMG"; then fail "plaintext on the encrypted image"; fi
# A smart image through mount(8): the budget and the smart options as -o.
rm -f "$IMG"
"$NODUP" mkfs "$IMG" --size 64M --policy smart --mem-budget 1M >/dev/null
mount -t fuse.nodup "$IMG" "$MNT" -o "mem_budget=2M,eviction=lru,min_run=2,worker_rate=0" >/dev/null
smart=$("$NODUP" stats "$MNT" --json)
grep -q '"eviction":"lru"' <<<"$smart" || fail "eviction= did not reach the daemon"
grep -q '"min_run":2' <<<"$smart" || fail "min_run= did not reach the daemon"
grep -q '"total":2097152' <<<"$smart" || fail "mem_budget= did not reach the daemon"
umount "$MNT"
for _ in $(seq 100); do "$NODUP" fsck "$IMG" >/dev/null 2>&1 && break; sleep 0.1; done
"$NODUP" fsck "$IMG" >/dev/null || fail "fsck of the smart image"
echo "install-check: make install, mount -t fuse.nodup, fstab line, umount(8), encrypted -o, smart -o: ok"
