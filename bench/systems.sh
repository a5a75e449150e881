# The file systems the bench scripts compare, each brought up empty at $MNT and taken down again
# (sourced, not run; bench/lib.sh first). The caller defines a `say` function for progress,
# sets IMG_SIZE, and calls `systems_setup NAME [PACKAGE:COMMAND...]`, which installs what is
# missing, builds the binaries unless NODUP and FUSEREF name them (nodup-uring-null for the
# sink-* systems when first needed, unless URING_NULL names it), and sets W (a work directory
# in /dev/shm, removed at exit), MNT, IMG (nodup image path), SRC (a directory for the
# passthrough systems), ZPOOL, ZPID, EXCL and SHARED (the CPU wrappers, or empty).
# Systems: null, pass (nodup-fuseref null / passthrough), the nodup policies (none, light,
# strong, weak-verify, smart, selective; light-async = light mounted with --async-writes), zfs (dedup=on, 128 KiB records), zfs-off (dedup=off),
# null-direct and light-direct (null and light with --direct-writes=read-write: read-write
# handles bypass the page cache too, which fio's are),
# zfs-4k (dedup=on, 4 KiB records), ext4 and btrfs (on a loop image), bindfs (over a /dev/shm
# directory), tmpfs (a plain /dev/shm directory, reference only), and sink-discard, sink-copy,
# sink-land, sink-store (`nodup-uring-null --classic --sink KIND`: its own null transport, alone
# or with a reference data path behind it, crates/nodup-uring-null/src/sink.rs; classic
# /dev/fuse, 4 threads).

NODUP_POLICIES="none light strong weak-verify smart selective"

systems_setup() {
  local name=$1 pkg
  shift
  EXCL=/work/tools/cpu-exclusive
  [[ -x $EXCL ]] || EXCL=""
  SHARED=/work/tools/cpu-shared
  [[ -x $SHARED ]] || SHARED=""
  bash scripts/deps.sh >&2
  # The peers the experiment runs (Debian packages; installed when missing).
  for pkg in "$@"; do
    command -v "${pkg#*:}" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg%%:*}" >/dev/null 2>&1 || true
  done
  local t=${CARGO_TARGET_DIR:-$PWD/target}/release
  if [[ -z ${NODUP:-} || -z ${FUSEREF:-} ]]; then
    $SHARED cargo build --release -q -p nodup-cli -p nodup-fuseref
    NODUP=${NODUP:-$t/nodup}
    FUSEREF=${FUSEREF:-$t/nodup-fuseref}
  fi
  # Built when a sink-* system first comes up, unless given.
  URING_NULL_GIVEN=${URING_NULL:+1}
  URING_NULL=${URING_NULL:-$t/nodup-uring-null}
  W=$(mktemp -d "/dev/shm/nodup-$name.XXXXXX")
  MNT=$W/mnt
  SRC=$W/src
  IMG=$W/img
  ZPOOL=nodup$name$$
  ZPID=$W/zfs-fuse.pid
  ZFS_OK=0
  FPID=
  mkdir -p "$MNT"
  trap 'systems_cleanup; rm -rf "$W"' EXIT
}

# systems_available SYSTEM...: those of the systems that can run here, one per line (a peer
# whose tool is missing is left out, and said). The zfs ones need zfs-fuse started first, by
# the caller (`start_zfs` in the script's own shell, so ZFS_OK and the cleanup see it).
systems_available() {
  local s
  for s in "$@"; do
    case $s in
      zfs | zfs-off | zfs-4k)
        if [[ $ZFS_OK == 1 ]]; then echo "$s"; else say "zfs-fuse is not running: $s left out"; fi
        ;;
      ext4) if command -v mkfs.ext4 >/dev/null; then echo "$s"; else say "no mkfs.ext4: ext4 left out"; fi ;;
      btrfs) if command -v mkfs.btrfs >/dev/null; then echo "$s"; else say "no mkfs.btrfs: btrfs left out"; fi ;;
      bindfs) if command -v bindfs >/dev/null; then echo "$s"; else say "no bindfs: bindfs left out"; fi ;;
      *) echo "$s" ;;
    esac
  done
}

is_nodup() { [[ " $NODUP_POLICIES light-async light-direct " == *" $1 "* ]]; }
is_zfs() { [[ $1 == zfs || $1 == zfs-off || $1 == zfs-4k ]]; }

wait_mounted() {
  local i
  for ((i = 0; i < 400; i++)); do
    mountpoint -q "$MNT" && return 0
    sleep 0.025
  done
  echo "$MNT did not get mounted" >&2
  return 1
}

# fuseref KIND WB [args...]: start nodup-fuseref KIND at $MNT in the background.
fuseref() {
  local kind=$1 wb=$2
  shift 2
  local extra=()
  [[ $wb == 1 ]] && extra=(--writeback-cache)
  "$FUSEREF" "$kind" "$@" "$MNT" "${extra[@]}" &
  FPID=$!
  wait_mounted
}
# sinkfs KIND WB: start nodup-uring-null with sink KIND at $MNT in the background, and wait
# for it to serve (its sinks are set up before it says `ready`).
sinkfs() {
  local extra=() i
  if [[ -z $URING_NULL_GIVEN ]]; then
    $SHARED cargo build --release -q -p nodup-uring-null
    URING_NULL_GIVEN=1
  fi
  [[ $2 == 1 ]] && extra=(--writeback-cache)
  "$URING_NULL" "$MNT" --classic --threads 4 --sink "$1" "${extra[@]}" >"$W/sink.out" &
  FPID=$!
  for ((i = 0; i < 800; i++)); do
    grep -q '^ready' "$W/sink.out" 2>/dev/null && return 0
    kill -0 "$FPID" 2>/dev/null || break
    sleep 0.025
  done
  echo "nodup-uring-null --sink $1 did not start" >&2
  return 1
}
stop_fuseref() {
  kill -TERM "$FPID"
  wait "$FPID"
  FPID=
}
# wb_arg WB: nodup's writeback-cache switch, on when WB is 1.
wb_arg() { echo "--writeback-cache=$([[ $1 == 1 ]] && echo true || echo false)"; }
nodup_mount() { "$NODUP" mount "$IMG" "$MNT" "$(wb_arg "$1")" "${@:2}" >/dev/null; }

# fresh_nodup POLICY WB [mount args...]: a fresh image of POLICY (IMG_SIZE), mounted at $MNT
# with the writeback cache when WB is 1.
fresh_nodup() { nodup_fresh "$1" "$(wb_arg "$2")" "${@:3}"; }

# up SYSTEM WB: a fresh, empty SYSTEM, writeback cache on when WB is 1 (FUSE systems that have
# the switch); `dir SYSTEM` is where it is.
up() {
  case $1 in
    null) fuseref null "$2" ;;
    null-direct) fuseref null "$2" --direct-writes=read-write ;;
    sink-discard | sink-copy | sink-land | sink-store) sinkfs "${1#sink-}" "$2" ;;
    pass) rm -rf "$SRC" && mkdir -p "$SRC" && fuseref passthrough "$2" "$SRC" ;;
    zfs | zfs-off | zfs-4k)
      local props=(-O dedup=on)
      [[ $1 == zfs-off ]] && props=(-O dedup=off)
      [[ $1 == zfs-4k ]] && props+=(-O recordsize=4K)
      rm -f "$W/zvdev" && truncate -s "$IMG_SIZE" "$W/zvdev"
      zpool create -f "${props[@]}" -m "$MNT" "$ZPOOL" "$W/zvdev" >/dev/null 2>"$W/zerr" || { cat "$W/zerr" >&2; return 1; }
      ;;
    ext4 | btrfs)
      rm -f "$W/loopimg" && truncate -s "$IMG_SIZE" "$W/loopimg"
      if [[ $1 == ext4 ]]; then mkfs.ext4 -q -F "$W/loopimg"; else mkfs.btrfs -q -f "$W/loopimg" >/dev/null; fi
      mount -o loop "$W/loopimg" "$MNT"
      ;;
    bindfs) rm -rf "$SRC" && mkdir -p "$SRC" && bindfs "$SRC" "$MNT" ;;
    tmpfs) rm -rf "$W/tmpfs" && mkdir -p "$W/tmpfs" ;;
    light-async) fresh_nodup light "$2" --async-writes ;;
    light-direct) fresh_nodup light "$2" --direct-writes=read-write ;;
    *)
      is_nodup "$1" || { echo "unknown system $1" >&2; return 1; }
      fresh_nodup "$1" "$2"
      ;;
  esac
}
down() {
  case $1 in
    null | null-direct | pass | sink-*) stop_fuseref ;;
    zfs | zfs-off | zfs-4k) zfs_destroy && rm -f "$W/zvdev" ;;
    ext4 | btrfs) umount "$MNT" && rm -f "$W/loopimg" ;;
    bindfs) fusermount3 -u "$MNT" 2>/dev/null || fusermount -u "$MNT"; rm -rf "$SRC" ;;
    tmpfs) rm -rf "$W/tmpfs" ;;
    *) "$NODUP" umount "$MNT" >/dev/null ;;
  esac
}
# zfs_destroy: destroy the pool; zfs-fuse calls it busy for a moment after a run, so retry.
zfs_destroy() {
  local i
  for ((i = 0; i < 40; i++)); do
    zpool destroy -f "$ZPOOL" 2>/dev/null && return 0
    sleep 0.5
  done
  zpool destroy -f "$ZPOOL"
}
# remount SYSTEM: the same contents on a fresh mount (cold kernel caches); tmpfs stays as it is.
remount() {
  case $1 in
    pass) stop_fuseref && fuseref passthrough 0 "$SRC" ;;
    light | none) "$NODUP" umount "$MNT" >/dev/null && nodup_mount 0 ;;
  esac
}
dir() { if [[ $1 == tmpfs ]]; then echo "$W/tmpfs"; else echo "$MNT"; fi; }

# systems_cleanup: take down whatever is still up (for the caller's EXIT trap).
systems_cleanup() {
  if [[ -n ${FPID:-} ]]; then kill -TERM "$FPID" 2>/dev/null || true; wait "$FPID" 2>/dev/null || true; fi
  if [[ ${ZFS_OK:-0} == 1 ]] && zpool list "$ZPOOL" >/dev/null 2>&1; then zfs_destroy || true; fi
  [[ -f $ZPID ]] && zfs_fuse_stop "$ZPID"
  if mountpoint -q "$MNT"; then
    "$NODUP" umount "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true
  fi
}

# fio_mibs DIR BS PER_JOB_MIB JOBS DUP LAYOUT: aggregate MiB/s of one fio run; LAYOUT distinct
# (a file per job) or shared (one file, job i writing from i x PER_JOB_MIB).
fio_mibs() {
  local where=(--directory="$1")
  [[ $6 == shared ]] && where=(--filename="$1/shared" --offset_increment="${3}M")
  $EXCL fio --name=w "${where[@]}" --ioengine=sync --rw=write --bs="$2" --size="${3}M" --numjobs="$4" \
    --end_fsync=1 --fallocate=none --dedupe_percentage="$5" --group_reporting --output-format=json 2>/dev/null |
    fio_mibs_of write
}
FIO_CMD='fio --name=w --directory=MNT --ioengine=sync --rw=write --bs=BS --size=PER_JOB --numjobs=JOBS --end_fsync=1 --fallocate=none --dedupe_percentage=DUP --group_reporting'

# timed CMD...: wall seconds of CMD (run exclusively; its output discarded); fails when CMD
# fails (GNU time still writes the seconds then), so a broken run never passes for a fast one.
timed() {
  $EXCL /usr/bin/time -f %e -o "$W/time" "$@" >/dev/null || true
  if grep -q "exited with non-zero status\|terminated by signal" "$W/time"; then
    echo "failed: $* ($(head -1 "$W/time"))" >&2
    return 1
  fi
  tail -1 "$W/time"
}

# space_used SYSTEM: bytes the system's medium holds for what was written (zfs: the pool's
# allocation, which dedup shrinks; the passthrough systems: their directory's; the others: the
# file system's used bytes).
space_used() {
  if is_zfs "$1"; then
    # The pool's allocation follows a transaction-group commit (every 5 s). It is printed
    # with 3 significant digits (about ±5 MiB at 1.5 GiB).
    sleep 6
    zpool list -H -o allocated "$ZPOOL" | numfmt --from=iec
  elif [[ $1 == pass || $1 == bindfs ]]; then
    # Their backing directory, not the whole /dev/shm (which others may be using): the bytes
    # allocated (as df counts for the others), not the apparent size, which a sparse file
    # (a replayed trace's device image) inflates.
    du -s -B1 "$SRC" | cut -f1
  elif [[ $1 == tmpfs ]]; then
    du -s -B1 "$W/tmpfs" | cut -f1
  else
    df --output=used -B1 "$(dir "$1")" | tail -1 | tr -d ' '
  fi
}

# daemon_pid SYSTEM: the process serving the system (empty for kernel file systems).
daemon_pid() {
  if is_nodup "$1"; then
    "$NODUP" list --json | python3 -c "import json,sys; print([m['pid'] for m in json.load(sys.stdin) if m['mountpoint'] == '$MNT'][0])"
  elif is_zfs "$1"; then
    cat "$ZPID"
  elif [[ $1 == null || $1 == pass ]]; then
    echo "$FPID"
  elif [[ $1 == bindfs ]]; then
    pgrep -n -x bindfs || true
  fi
}

# dedup_saved SYSTEM: the share of written data the system reports as deduplicated (nodup's
# dedup_ratio; zfs: 1 - 1/dedupratio), "-" for systems that do not deduplicate.
dedup_saved() {
  if is_nodup "$1"; then
    nodup_stat "'%.3f' % s['dedup_ratio']"
  elif is_zfs "$1"; then
    # zfs-fuse's zpool has no -H/-o for `get`: the value is the third column of the second line.
    zpool get dedupratio "$ZPOOL" | awk 'NR == 2 { sub(/x$/, "", $3); printf "%.3f\n", 1 - 1 / $3 }'
  else
    echo -
  fi
}

start_zfs() {
  ZFS_OK=0
  if zfs_fuse_install && zfs_fuse_start "$ZPID"; then
    ZFS_OK=1
  else
    say "zfs-fuse not available: its columns stay empty"
  fi
}
stop_zfs() {
  [[ -f $ZPID ]] && zfs_fuse_stop "$ZPID"
  ZFS_OK=0
}
