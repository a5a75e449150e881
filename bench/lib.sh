# Shared helpers of the bench scripts (sourced, not run).

# bench_tree: the commit the nodup binary ($NODUP, else target/release/nodup) was built from, as
# its --version reports it ("-dirty" when built from changed sources), so that the figures name
# the code that produced them; the checkout's HEAD when the binary does not say.
bench_tree() {
  local v
  v=$("${NODUP:-target/release/nodup}" --version 2>/dev/null | sed -n 's/.*(commit \([^)]*\)).*/\1/p' || true)
  if [[ -n $v && $v != unknown ]]; then echo "$v"; else git rev-parse --short HEAD 2>/dev/null || echo unknown; fi
}

# median: the median of the numbers on stdin, one per line ("nan" when there are none).
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# median_of "N N ...": the median of a space-separated list.
median_of() { tr ' ' '\n' <<<"${1:-}" | grep . | median; }
# median_col SIDE N ROW...: the median of field N of the rows (space-separated) whose first
# field is SIDE (an A/B script's "A 3 31.2 ..." lines).
median_col() {
  local side=$1 n=$2
  shift 2
  printf '%s\n' "$@" | awk -v s="$side" -v n="$n" '$1 == s {print $n}' | median
}

# small_files MNT: 100 directories of 1 000 files of 4 KiB of unique data each under MNT.
small_files() {
  python3 - "$1" <<'PY'
import os, sys
m = sys.argv[1]
for d in range(100):
    os.makedirs(f"{m}/d{d}")
    for i in range(1000):
        with open(f"{m}/d{d}/f{i}", "wb") as f:
            f.write(os.urandom(4096))
PY
}
# every_other_gone MNT: delete every other file of small_files (50 000 one-block holes, the most
# fragmented free space a delete leaves).
every_other_gone() {
  python3 - "$1" <<'PY'
import os, sys
m = sys.argv[1]
for d in range(100):
    for i in range(0, 1000, 2):
        os.unlink(f"{m}/d{d}/f{i}")
PY
}

# Stolen CPU time so far, in clock ticks summed over all CPUs (8th value of /proc/stat's cpu line):
# time the hypervisor gave to other guests instead of ours, which slows a run without any cause in it.
steal_ticks() { awk '/^cpu / {print $9}' /proc/stat; }

# steal_share TICKS WALL_SECONDS: stolen ticks as a share of the machine's CPU time over WALL_SECONDS.
steal_share() {
  awk -v d="$1" -v w="$2" -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" \
    'BEGIN { printf "%.3f\n", (w > 0) ? d / hz / (w * n) : 0 }'
}

# kernel_tree DIR: unpack the Linux source tree (linux-source-6.1, installed when missing) into
# DIR, or copy /usr/share/doc there with QUICK=1 or when the package cannot be had; sets WHAT
# to what was used.
kernel_tree() {
  local tarball=/usr/src/linux-source-6.1.tar.xz
  [[ -f $tarball ]] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-source-6.1 >/dev/null 2>&1 || true
  mkdir -p "$1"
  if [[ -f $tarball && "${QUICK:-0}" != 1 ]]; then
    WHAT=linux-source-6.1
    tar -xJf "$tarball" -C "$1"
  else
    WHAT=/usr/share/doc
    cp -a /usr/share/doc "$1/"
  fi
}

# zfs_fuse_install: install zfs-fuse when missing, without letting its package start the service;
# fails when it cannot be had.
zfs_fuse_install() {
  command -v zfs-fuse >/dev/null && return 0
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zfs-fuse >/dev/null || true
  rm -f /usr/sbin/policy-rc.d
  command -v zfs-fuse >/dev/null
}

# zfs_fuse_start PIDFILE: start the zfs-fuse daemon with no remembered pools, and give it time to
# come up. zfs_fuse_stop PIDFILE: stop it and forget its pools.
zfs_fuse_start() {
  rm -f /etc/zfs/zpool.cache /var/lib/zfs/zpool.cache
  zfs-fuse --pidfile "$1" && sleep 2
}
zfs_fuse_stop() {
  if [[ -f $1 ]]; then
    local pid i
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    # Wait until it is gone: a new daemon cannot start while the old one holds its socket.
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
  fi
  rm -f "$1" /etc/zfs/zpool.cache /var/lib/zfs/zpool.cache
}

# fio_mibs_of RW: the aggregate MiB/s of direction RW (read or write) in fio's JSON output on
# stdin (group reporting: the first job is the group).
fio_mibs_of() { python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0][sys.argv[1]]["bw"] / 1024))' "$1"; }

# rotate R ITEMS...: the items rotated left by R-1 (round R's order).
rotate() {
  local r=$1
  shift
  local a=("$@") n=$# i
  for ((i = 0; i < n; i++)); do echo "${a[$(((i + r - 1) % n))]}"; done
}

# machine_line: "N cores (CPU), M GiB RAM, kernel K", for the reports' headers.
machine_line() {
  echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/^Mem/ {print $2}') GiB RAM, kernel $(uname -r)"
}

# nodup_stat EXPR: a Python expression over the stats JSON `s` of the nodup mount at $MNT
# (the caller sets NODUP and MNT).
nodup_stat() { "$NODUP" stats "$MNT" --json | python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }

# pid_of_mount: the daemon pid of the nodup mount at $MNT (the caller sets NODUP and MNT).
pid_of_mount() { "$NODUP" list --json | python3 -c "import json,sys; print([m['pid'] for m in json.load(sys.stdin) if m['mountpoint'] == sys.argv[1]][0])" "$MNT"; }

# smart_settle: let the `smart` mount's out-of-line worker run at full speed until nothing is
# queued (fails after 10 minutes).
smart_settle() {
  # `--wait-idle` asks the worker's state through a small attribute: polling the stats instead
  # built their JSON five times a second in the FUSE threads, whose freed pieces stayed in their
  # malloc arenas (about 0.1 MiB over a 2 GiB settle, counted against smart's budget).
  "$NODUP" ctl "$MNT" --worker-rate 1000000 --wait-idle --timeout 600 >/dev/null || {
    echo "the worker did not settle" >&2
    return 1
  }
}

# nodup_fresh POLICY [mount args...]: a fresh image IMG of POLICY (IMG_SIZE, default 4G),
# mounted at MNT with the args given (the caller sets NODUP, IMG and MNT).
nodup_fresh() {
  local policy=$1
  shift
  rm -f "$IMG"
  "$NODUP" mkfs "$IMG" --size "${IMG_SIZE:-4G}" --policy "$policy" >/dev/null
  "$NODUP" mount "$IMG" "$MNT" "$@" >/dev/null
}

# scratch_mount NAME: a scratch directory W in /dev/shm with a mount point MNT inside, both
# removed on exit (a nodup mount still there is unmounted first; the caller sets NODUP).
scratch_mount() {
  W=$(mktemp -d "/dev/shm/nodup-$1.XXXXXX")
  MNT=$W/mnt
  mkdir -p "$MNT"
  trap 'if mountpoint -q "$MNT"; then "$NODUP" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true; fi; rm -rf "$W"' EXIT
}

# ensure_nodup: NODUP as given, else the repository's release build (dependencies installed and
# the binary built first). Run from the repository root.
ensure_nodup() {
  if [[ -z ${NODUP:-} ]]; then
    bash scripts/deps.sh
    cargo build --release -q -p nodup-cli
    NODUP=${CARGO_TARGET_DIR:-$PWD/target}/release/nodup
  fi
}

# ensure_matplotlib: the plots of the *_report.py scripts need it; installed when missing (pip,
# else the Debian package), so a fresh machine needs nothing installed by hand.
ensure_matplotlib() {
  python3 -c 'import matplotlib' 2>/dev/null && return
  python3 -m pip install -q matplotlib >/dev/null 2>&1 ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null 2>&1 || true
  python3 -c 'import matplotlib' 2>/dev/null || { echo "matplotlib is missing and could not be installed (pip install matplotlib)" >&2; return 1; }
}
