#!/usr/bin/env bash
# Issue 21, the fio write sweep (Light-Dedup Fig. 7): sequential writes (ioengine=sync,
# end_fsync=1) at 0/25/50/75/100 % duplicates, bs 4 KiB and 1 MiB, 1 and 2 jobs (a file each),
# through every system of bench/systems.sh: nodup none, light, strong, weak-verify, smart,
# selective; zfs-fuse dedup=off, dedup=on with its default 128 KiB records and with 4 KiB
# records; ext4 and btrfs on a loop image; bindfs over a directory; and the FUSE ceiling (null,
# passthrough); and at 1 MiB light mounted with --async-writes (light-async: large writes answered
# before they are stored, durable at fsync). Everything is backed by /dev/shm; every system starts empty for every run.
# Throughput and the share of the data each system reports as deduplicated.
#
# Usage: bench/sweep.sh   (QUICK=1: 64 MiB per cell, one round — the `make bench` size;
#   default: 512 MiB per cell, RUNS=3 rounds; SYSTEMS="..." DUPS="..." BSS="..." JOBS="..."
#   narrow it; NODUP=/FUSEREF= skip the build)
# Writes docs/results/sweep.md, and sweep/sweep.tsv and the plots sweep/sweep-1m.png and
# sweep/sweep-4k.png; sweep/reading.md (hand-written) is appended to sweep.md.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_matplotlib
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-3}
SIZE=${SIZE:-512M}
[[ $QUICK == 1 ]] && { RUNS=1; SIZE=64M; }
SIZE_MIB=$(($(numfmt --from=iec "$SIZE") >> 20))
SYSTEMS=${SYSTEMS:-"null pass none light light-async strong weak-verify smart selective zfs-off zfs zfs-4k ext4 btrfs bindfs"}
DUPS=${DUPS:-"0 25 50 75 100"}
BSS=${BSS:-"1m 4k"}
JOBS=${JOBS:-"1 2"}
IMG_SIZE=4G
OUT=docs/results

say() { echo "sweep: $*" >&2; }

systems_setup sweep fio:fio btrfs-progs:mkfs.btrfs bindfs:bindfs e2fsprogs:mkfs.ext4
# systems_available may start zfs-fuse, which must happen in this shell (not a subshell).
[[ " $SYSTEMS " == *" zfs"* ]] && start_zfs
mapfile -t avail < <(systems_available $SYSTEMS)

mkdir -p "$OUT/sweep"
tsv=$OUT/sweep/sweep.tsv
printf 'round\tbs\tjobs\tdup\ttotal_mib\tsystem\tmibs\tdedup_saved\n' >"$tsv"
t0=$(date +%s)
for ((r = 1; r <= RUNS; r++)); do
  for bs in $BSS; do
    # 4 KiB writes without a writeback cache are a FUSE round trip each: a quarter of the data.
    total=$SIZE_MIB
    [[ $bs == 4k ]] && total=$((SIZE_MIB / 4))
    for jobs in $JOBS; do
      for dup in $DUPS; do
        for sys in $(rotate "$r" "${avail[@]}"); do
          # 4 KiB writes are never answered early: light-async would repeat light.
          [[ $sys == light-async && $bs != 1m ]] && continue
          up "$sys" 0
          v=$(fio_mibs "$(dir "$sys")" "$bs" $((total / jobs)) "$jobs" "$dup" distinct)
          d=$(dedup_saved "$sys")
          down "$sys"
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$bs" "$jobs" "$dup" "$total" "$sys" "$v" "$d" >>"$tsv"
          say "round $r/$RUNS bs=$bs jobs=$jobs dups=$dup% $sys: $v MiB/s, dedup $d"
        done
      done
    done
  done
done
stop_zfs
secs=$(($(date +%s) - t0))
versions="$(fio --version), zfs-fuse $(dpkg-query -W -f '${Version}' zfs-fuse 2>/dev/null || echo -), btrfs-progs $(dpkg-query -W -f '${Version}' btrfs-progs 2>/dev/null || echo -), e2fsprogs $(dpkg-query -W -f '${Version}' e2fsprogs 2>/dev/null || echo -), bindfs $(dpkg-query -W -f '${Version}' bindfs 2>/dev/null || echo -)"
machine=$(machine_line)
python3 bench/sweep_report.py "$tsv" "$FIO_CMD" "$versions" "$machine" "$(bench_tree)" "$secs" "$OUT"
say "wrote $OUT/sweep.md ($secs s)"
