#!/usr/bin/env bash
# Issue 20, item 1: the ceiling, measured. Every nodup figure next to the same workload through
# a null FUSE file system (`nodup-fuseref null`: nodup's fuser, thread count, max_write, init
# flags and mount options; accepts and discards data) and a passthrough one (`nodup-fuseref
# passthrough` over a /dev/shm directory), everything backed by /dev/shm:
#   fio    sequential writes (ioengine=sync, end_fsync=1, fallocate=none), bs 4k and 1m, 0 and
#          75 % duplicates, with and without the writeback cache, 1 and 2 jobs (distinct files):
#          null, passthrough, nodup light, nodup none, and zfs-fuse dedup=on (128 KiB records; one
#          job, no writeback variant: it has no such switch)
#   scale  1, 2 and 4 jobs at 1 MiB, 75 %: distinct files and one shared file; light and null
#   ktree  cp -a of the Linux source tree: light, passthrough, null (and tmpfs for reference)
#   meta   200 000 4 KiB files in 1 000 directories (`nodup-fuseref bench-files`, one writer),
#          then `ls -lR` on a fresh mount: light, passthrough (and tmpfs for reference)
# Each round runs every system once per cell, in an order rotated from round to round; figures
# are medians over RUNS rounds, ratios medians of the per-round ratios. Every benchmark command
# runs under /work/tools/cpu-exclusive when that exists.
#
# Usage: bench/fs-ceiling.sh [fio|scale|ktree|meta|join ...]   (the four sections by default;
#   `join` only reassembles fs-ceiling.md, with NODUP/FUSEREF given so nothing is built)
#   RUNS=5 SIZE=512M (bytes per fio cell; 4 KiB writes without the writeback cache write a
#   quarter of it); QUICK=1: a smoke run (64M, one round, 20 000 files, /usr/share/doc as tree).
#   NODUP=<binary> FUSEREF=<binary> skip the build. A focused fio run: FIO_BS="1m" FIO_WB="0"
#   FIO_JOBS="1" (defaults "1m 4k", "0 1", "1 2"), written under FIO_NAME (default fio).
#   FLOORS=1 (default) adds, in the 1 MiB one-job cells without the writeback cache, the null
#   file system's own transport alone and with a reference data path behind it
#   (bench/systems.sh: sink-discard, sink-copy, sink-land, sink-store; see
#   crates/nodup-uring-null/src/sink.rs): what a daemon's data work and the memory for new data
#   cost on top of the transport. URING_NULL=<binary> skips its build. ASYNC=1 (default) adds
#   light mounted with --async-writes (large writes answered before they are stored, durable at
#   fsync) in the 1 MiB cells without the writeback cache, in a table of its own. DIRECT=1
#   (default) adds null and light with --direct-writes=read-write there (fio's read-write
#   handles bypass the page cache too), in a table of its own.
# Writes docs/results/fs-ceiling/SECTION.md and SECTION.tsv (every run) and assembles
# docs/results/fs-ceiling.md; progress goes to stderr.
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/systems.sh
QUICK=${QUICK:-0}
RUNS=${RUNS:-5}
SIZE=${SIZE:-512M}
FILES=${FILES:-200000}
FLOORS=${FLOORS:-1}
ASYNC=${ASYNC:-1}
DIRECT=${DIRECT:-1}
[[ $QUICK == 1 ]] && { RUNS=1; SIZE=64M; FILES=20000; }
SIZE_MIB=$(($(numfmt --from=iec "$SIZE") >> 20))
OUTDIR=docs/results/fs-ceiling
IMG_SIZE=4G

systems_setup ceiling
SRC=$W/passthrough-src
mkdir -p "$OUTDIR"

say() { echo "fs-ceiling: $*" >&2; }

dedup_ratio() { dedup_saved light; }
# The kernel's dirty-page limit of the FUSE mount at $MNT (writeback cache), in MiB.
bdi_max_mib() { echo $(($(cat "/sys/class/bdi/$(mountpoint -d "$MNT")/max_bytes" 2>/dev/null || echo 0) >> 20)); }

fio_section() {
  local name=${FIO_NAME:-fio}
  local tsv=$OUTDIR/$name.tsv
  start_zfs
  printf 'round\tbs\tdup\twb\tjobs\ttotal_mib\tsystem\tmibs\tdedup_ratio\n' >"$tsv"
  : >"$W/bdi"
  local r bs wb jobs dup total sys v d
  for ((r = 1; r <= RUNS; r++)); do
    for bs in ${FIO_BS:-1m 4k}; do
      for wb in ${FIO_WB:-0 1}; do
        total=$SIZE_MIB
        [[ $bs == 4k && $wb == 0 ]] && total=$((SIZE_MIB / 4))
        for jobs in ${FIO_JOBS:-1 2}; do
          for dup in 0 75; do
            local systems=(null pass light none)
            [[ $ZFS_OK == 1 && $jobs == 1 && $wb == 0 ]] && systems+=(zfs)
            [[ $ASYNC == 1 && $wb == 0 && $bs == 1m ]] && systems+=(light-async)
            [[ $DIRECT == 1 && $wb == 0 && $bs == 1m ]] && systems+=(null-direct light-direct)
            [[ $FLOORS == 1 && $jobs == 1 && $wb == 0 && $bs == 1m ]] && systems+=(sink-discard sink-copy sink-land sink-store)
            for sys in $(rotate "$r" "${systems[@]}"); do
              up "$sys" "$wb"
              if [[ $r == 1 && $wb == 1 && $jobs == 1 && $dup == 0 && $bs == 1m && $sys =~ ^(null|light)$ ]]; then
                echo "$sys $(bdi_max_mib)" >>"$W/bdi"
              fi
              v=$(fio_mibs "$MNT" "$bs" $((total / jobs)) "$jobs" "$dup" distinct)
              d=-
              [[ $sys == light ]] && d=$(dedup_ratio)
              down "$sys"
              printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$bs" "$dup" "$wb" "$jobs" "$total" "$sys" "$v" "$d" >>"$tsv"
              say "fio round $r/$RUNS: bs=$bs dups=$dup% wb=$wb jobs=$jobs $sys: $v MiB/s"
            done
          done
        done
      done
    done
  done
  stop_zfs
  python3 bench/fs_ceiling_report.py fio "$tsv" "$FIO_CMD" "$(cat "$W/bdi")" >"$OUTDIR/$name.md"
}

scale_section() {
  local tsv=$OUTDIR/scale.tsv r layout jobs sys v
  printf 'round\tlayout\tjobs\ttotal_mib\tsystem\tmibs\n' >"$tsv"
  for ((r = 1; r <= RUNS; r++)); do
    for layout in distinct shared; do
      for jobs in 1 2 4; do
        for sys in $(rotate "$r" null light); do
          up "$sys" 0
          v=$(fio_mibs "$MNT" 1m $((SIZE_MIB / jobs)) "$jobs" 75 "$layout")
          down "$sys"
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$layout" "$jobs" "$SIZE_MIB" "$sys" "$v" >>"$tsv"
          say "scale round $r/$RUNS: $layout jobs=$jobs $sys: $v MiB/s"
        done
      done
    done
  done
  python3 bench/fs_ceiling_report.py scale "$tsv" "$FIO_CMD" >"$OUTDIR/scale.md"
}

ktree_section() {
  local tsv=$OUTDIR/ktree.tsv r sys t
  say "ktree: unpacking the source tree"
  kernel_tree "$W/ktree"
  local src
  src=$(find "$W/ktree" -mindepth 1 -maxdepth 1 | head -1)
  local what="$WHAT, $(du -sm "$src" | cut -f1) MiB, $(find "$src" -type f | wc -l) files, $(find "$src" -type d | wc -l) directories"
  printf 'round\tsystem\tseconds\n' >"$tsv"
  for ((r = 1; r <= RUNS; r++)); do
    for sys in $(rotate "$r" pass light null tmpfs); do
      up "$sys" 0
      t=$(timed cp -a "$src" "$(dir "$sys")/copy")
      down "$sys"
      printf '%s\t%s\t%s\n' "$r" "$sys" "$t" >>"$tsv"
      say "ktree round $r/$RUNS: $sys: ${t}s"
    done
  done
  rm -rf "$W/ktree"
  python3 bench/fs_ceiling_report.py ktree "$tsv" "$what" >"$OUTDIR/ktree.md"
}

meta_section() {
  local tsv=$OUTDIR/meta.tsv r sys tc tl
  printf 'round\tsystem\tfiles\tcreate_s\tls_s\n' >"$tsv"
  for ((r = 1; r <= RUNS; r++)); do
    for sys in $(rotate "$r" pass light tmpfs); do
      up "$sys" 0
      tc=$(timed "$FUSEREF" bench-files "$(dir "$sys")/m" --dirs 1000 --files "$FILES" --size 4096)
      remount "$sys"
      tl=$(timed ls -lR "$(dir "$sys")/m")
      down "$sys"
      printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$sys" "$FILES" "$tc" "$tl" >>"$tsv"
      say "meta round $r/$RUNS: $sys: create ${tc}s, ls -lR ${tl}s"
    done
  done
  python3 bench/fs_ceiling_report.py meta "$tsv" >"$OUTDIR/meta.md"
}

sections=("$@")
[[ ${#sections[@]} -eq 0 ]] && sections=(fio scale ktree meta)
for s in "${sections[@]}"; do
  case $s in
    fio | scale | ktree | meta) "${s}_section" ;;
    join) ;; # only reassemble fs-ceiling.md (after editing fs-ceiling/reading.md)
    *) echo "unknown section $s (fio, scale, ktree, meta, join)" >&2; exit 2 ;;
  esac
done

fuser=$(grep -A1 '^name = "fuser"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
# The header names the machine and tree of the last section run; a join alone keeps the line
# it finds (the tables were not measured on the machine that joins them).
header="Produced by \`bench/fs-ceiling.sh\` (each section regenerated by \`bench/fs-ceiling.sh SECTION\`): $(machine_line); fuser $fuser, $(fio --version), zfs-fuse $(dpkg-query -W -f '${Version}' zfs-fuse 2>/dev/null || echo 'not installed'); tree $(bench_tree), $(date -u +%F)."
if [[ ${sections[*]} == join && -f docs/results/fs-ceiling.md ]]; then
  old=$(sed -n '3{/^Produced by /p}' docs/results/fs-ceiling.md)
  header=${old:-$header}
fi
{
  echo "# The FUSE ceiling, measured (issue 20)"
  echo
  echo "$header"
  echo
  echo "Systems, all backed by /dev/shm: **null** = \`nodup-fuseref null\` (the ceiling: a namespace in memory, data accepted and discarded, same fuser, 4 threads with cloned fds, max_write 1 MiB, init flags, mount options, open flags (write-only handles bypass the page cache unless the writeback cache is on, nodup's \`--direct-writes\` default; fio's read-write handles use it) and 1 s TTL as nodup); **null-direct** / **light-direct** = null and light with \`--direct-writes=read-write\` (read-write handles bypass the page cache too; DIRECT=1, see its table); **pass** = \`nodup-fuseref passthrough\` over a /dev/shm directory (pread/pwrite on an fd per open file); **light** / **none** = \`nodup mkfs --size $IMG_SIZE --policy light|none\` then \`nodup mount\` (fresh image per run); **light-async** = light mounted with \`--async-writes\` (ASYNC=1; see its table); **zfs** = zfs-fuse, \`zpool create -O dedup=on\` (default 128 KiB records) on a file vdev in /dev/shm, fresh pool per run; **tmpfs** = a plain /dev/shm directory (reference only); **discard** / **copy** / **land** / **store** = \`nodup-uring-null --classic --threads 4 --sink KIND\`: that tool's own null transport, alone or with a reference data path behind it (FLOORS=1; see the table under the 1 MiB cells)."
  echo
  # reading.md is the hand-written reading of the numbers (update it when they change).
  # fio-*.md: focused fio runs (FIO_NAME), after the full table.
  for f in "$OUTDIR"/fio.md "$OUTDIR"/fio-*.md "$OUTDIR"/{scale,ktree,meta,reading}.md; do
    [[ -f $f ]] && cat "$f"
  done
} >docs/results/fs-ceiling.md
say "wrote docs/results/fs-ceiling.md"
