#!/usr/bin/env bash
# Install the system packages nodup's mount, demo and tests need, only those that are missing.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v fio >/dev/null 2>&1 || need+=(fio)
# pjdfstest links libacl; the FUSE tests use these everyday tools as clients.
[ -e /usr/include/sys/acl.h ] || need+=(libacl1-dev)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v git >/dev/null 2>&1 || need+=(git)
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
# setfacl/getfacl for the POSIX ACL test.
command -v setfacl >/dev/null 2>&1 || need+=(acl)
# An ext4 on a loop device whose write-back fails (the media's failed write-back tests).
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need+=(mount)
command -v fstrim >/dev/null 2>&1 || need+=(util-linux)
# strace shows mkfs fsyncing the new image's directory (ext4, btrfs and xfs commit a new
# file's name with its own fsync, so the power-loss test cannot show it).
command -v strace >/dev/null 2>&1 || need+=(strace)
# A btrfs on a loop device: an image on a copy-on-write file system is named as such.
command -v mkfs.btrfs >/dev/null 2>&1 || need+=(btrfs-progs)
# xfs under an image in the power-loss test (crates/nodup-fuseref/tests/power_loss).
command -v mkfs.xfs >/dev/null 2>&1 || need+=(xfsprogs)
if ((${#need[@]})); then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Dummy users pjdfstest switches to.
for u in tests pjdfstest; do
  if ! id -u "$u" >/dev/null 2>&1; then
    if getent group "$u" >/dev/null; then useradd -M -g "$u" -s /usr/sbin/nologin "$u"; else useradd -M -U -s /usr/sbin/nologin "$u"; fi
  fi
done
[ -e /dev/fuse ] || { echo "deps: /dev/fuse is missing; FUSE cannot work on this machine" >&2; exit 1; }
