#!/usr/bin/env bash
# Issue 21, Copy (Light-Dedup Fig. 10b / Table 3): a source tree copied twice with `cp -a` into
# each system, freshly made; the time of each copy, the space the medium holds after each, the
# share of the second copy the system saved, and the resident memory of the daemon serving it
# after both. Beside them, whole-tree ingest by backup tools: restic and borg take the tree
# twice (two paths, same contents) into a repository; and btrfs + duperemove (the two copies on
# btrfs, then `duperemove -dr`: its time and the space after).
#
# The tree: linux-source-6.1 (1.4 GiB, 78,579 files) by default; QUICK=1 (the `make bench`
# size) uses /usr/share/doc. Everything is backed by /dev/shm.
#
# Usage: bench/copy.sh   (QUICK=1; RUNS=1 rounds by default; SYSTEMS="..." narrows it;
#   NODUP=/FUSEREF= skip the build; NAME=copy names the outputs)
# Writes docs/results/NAME.md and copy/NAME.tsv, copy/NAME.png; copy/reading.md (hand-written)
# is appended to copy.md.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_matplotlib
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-1}
SYSTEMS=${SYSTEMS:-"null pass none light smart selective zfs-off zfs zfs-4k ext4 btrfs bindfs"}
IMG_SIZE=8G
OUT=docs/results
NAME=${NAME:-copy}

say() { echo "copy: $*" >&2; }

systems_setup copy btrfs-progs:mkfs.btrfs bindfs:bindfs duperemove:duperemove restic:restic borgbackup:borg
mkdir -p "$OUT/copy"

say "unpacking the source tree"
kernel_tree "$W/tree"
tree=$(find "$W/tree" -mindepth 1 -maxdepth 1 | head -1)
# A second path with the same contents, for the backup tools' second ingest.
cp -a "$tree" "$W/tree2"
tree_bytes=$(du -sb --apparent-size "$tree" | cut -f1)
what="$WHAT, $((tree_bytes >> 20)) MiB, $(find "$tree" -type f | wc -l) files"
say "tree: $what"

[[ " $SYSTEMS " == *" zfs"* ]] && start_zfs
mapfile -t avail < <(systems_available $SYSTEMS)

# mem_mib PID FIELD: a /proc/PID/status memory field in MiB ("-" without a daemon). RssAnon is
# the daemon's own memory; VmRSS adds the file pages it maps (nodup maps its image).
mem_mib() { [[ -n $1 ]] && awk -v f="$2:" '$1 == f {printf "%.1f\n", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo -; }

tsv=$OUT/copy/$NAME.tsv
printf 'round\tsystem\tcopy1_s\tused1_mib\tcopy2_s\tused2_mib\tdaemon_rss_mib\tdaemon_anon_mib\textra\n' >"$tsv"
for ((r = 1; r <= RUNS; r++)); do
  for sys in $(rotate "$r" "${avail[@]}"); do
    up "$sys" 0
    base=$(space_used "$sys")
    t1=$(timed cp -a "$tree" "$(dir "$sys")/copy1")
    sync
    u1=$((($(space_used "$sys") - base) >> 20))
    t2=$(timed cp -a "$tree" "$(dir "$sys")/copy2")
    sync
    u2=$((($(space_used "$sys") - base) >> 20))
    pid=$(daemon_pid "$sys")
    rss=$(mem_mib "$pid" VmRSS)
    anon=$(mem_mib "$pid" RssAnon)
    extra=-
    if [[ $sys == btrfs ]] && command -v duperemove >/dev/null; then
      # Out-of-line dedup of the two copies, then the space the medium holds.
      td=$(timed duperemove -dr -q "$MNT")
      sync
      extra="duperemove ${td}s, after $((($(space_used btrfs) - base) >> 20)) MiB"
    fi
    down "$sys"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$sys" "$t1" "$u1" "$t2" "$u2" "$rss" "$anon" "$extra" >>"$tsv"
    say "round $r/$RUNS $sys: copy 1 ${t1}s ($u1 MiB), copy 2 ${t2}s ($u2 MiB), daemon RSS ${rss} MiB (anonymous ${anon}); $extra"
  done
  # Backup tools: the tree twice into a fresh repository in /dev/shm.
  if command -v restic >/dev/null; then
    rm -rf "$W/restic"
    export RESTIC_PASSWORD=nodup-bench
    export RESTIC_CACHE_DIR=$W/restic-cache
    restic init -q --repo "$W/restic" >/dev/null
    t1=$(timed restic backup -q --repo "$W/restic" "$tree")
    u1=$(($(du -sb "$W/restic" | cut -f1) >> 20))
    t2=$(timed restic backup -q --repo "$W/restic" "$W/tree2")
    u2=$(($(du -sb "$W/restic" | cut -f1) >> 20))
    rm -rf "$W/restic" "$W/restic-cache"
    printf '%s\trestic\t%s\t%s\t%s\t%s\t-\t-\t-\n' "$r" "$t1" "$u1" "$t2" "$u2" >>"$tsv"
    say "round $r/$RUNS restic: ${t1}s ($u1 MiB), ${t2}s ($u2 MiB)"
  fi
  if command -v borg >/dev/null; then
    rm -rf "$W/borg"
    export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_BASE_DIR=$W/borgbase
    borg init -e none "$W/borg" >/dev/null 2>&1
    t1=$(timed borg create "$W/borg::one" "$tree")
    u1=$(($(du -sb "$W/borg" | cut -f1) >> 20))
    t2=$(timed borg create "$W/borg::two" "$W/tree2")
    u2=$(($(du -sb "$W/borg" | cut -f1) >> 20))
    rm -rf "$W/borg" "$W/borgbase"
    printf '%s\tborg\t%s\t%s\t%s\t%s\t-\t-\t-\n' "$r" "$t1" "$u1" "$t2" "$u2" >>"$tsv"
    say "round $r/$RUNS borg: ${t1}s ($u1 MiB), ${t2}s ($u2 MiB)"
  fi
done
stop_zfs
versions="zfs-fuse $(dpkg-query -W -f '${Version}' zfs-fuse 2>/dev/null || echo -), btrfs-progs $(dpkg-query -W -f '${Version}' btrfs-progs 2>/dev/null || echo -), duperemove $(dpkg-query -W -f '${Version}' duperemove 2>/dev/null || echo -), restic $(dpkg-query -W -f '${Version}' restic 2>/dev/null || echo -), borgbackup $(dpkg-query -W -f '${Version}' borgbackup 2>/dev/null || echo -), bindfs $(dpkg-query -W -f '${Version}' bindfs 2>/dev/null || echo -)"
machine=$(machine_line)
python3 bench/copy_report.py "$tsv" "$what" "$tree_bytes" "$versions" "$machine" "$(bench_tree)" "$OUT" "$NAME"
say "wrote $OUT/$NAME.md"
