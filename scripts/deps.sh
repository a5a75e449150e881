#!/usr/bin/env bash
# Install the system packages nodup's mount, demo and tests need, only those that are missing.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v fio >/dev/null 2>&1 || need+=(fio)
if ((${#need[@]})); then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -e /dev/fuse ] || { echo "deps: /dev/fuse is missing; FUSE cannot work on this machine" >&2; exit 1; }
