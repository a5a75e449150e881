#!/usr/bin/env bash
# `make bench` / `make bench-full` (issue 21): the side-by-side benchmark suite. Runs each
# experiment in turn (quick sizes unless FULL=1), each writing its docs/results files, reports
# how long each took, and writes the summary docs/results/README.md (bench/summary.py).
#
# Experiments (each names the figure or table it mirrors):
#   sweep      fio write sweep, every system at 0-100 % duplicates (Light-Dedup Fig. 7): sweep.md
#   copy       a tree copied twice into every system, restic and borg, btrfs + duperemove
#              (Fig. 10b / Table 3): copy.md (quick: /usr/share/doc; full: linux-source-6.1)
#   trace      FIU samples and generated traces replayed into every system, block and batch
#              (Fig. 9): trace-suite.md
#   prefetch   light's seven prefetch variants, engine and mount, 1-4 writers (Figs. 10a, 11):
#              prefetch.md
#   metadata   metadata I/O per block of the region, entry and hashtable layouts, fresh and aged
#              (Tables 2 and 4): aging.md (quick: 1 GiB, the issue-2 size; full: 8 GiB, aging-full.md)
#   recovery   unmount, normal and failure recovery time vs size (Table 5): recovery.md
#   memory     index memory vs data written; smart at fixed budgets (§6): memory.md
#   readpath   cold reads of deduplicated data, the dedup-aware read cache: readpath.md
#   smart, selective, sim, freewrite
#              the other papers' own evaluations (SmartDedup; FSDedup on the file system and its
#              cache-line simulator; Freewrite), through their issues' scripts. Those scripts
#              write their issues' acceptance tables at full size, so the quick suite runs them
#              at smoke sizes into docs/results/quick/ and leaves the acceptance tables alone;
#              `make bench-full` runs them at their own sizes into docs/results/.
#
# Every experiment runs the same binaries: nodup, nodup-fuseref and nodup-uring-null are built
# once at the start and copied aside, so a build of the tree during the run (an edit, another
# session's cargo) cannot change what the later experiments measure; NODUP, FUSEREF and
# URING_NULL given from outside are used as they are.
#
# Usage: bench/suite.sh [EXPERIMENT...]   (FULL=1 for the paper-scale sizes)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
FULL=${FULL:-0}
quick=1
[[ $FULL == 1 ]] && quick=0
exps=("$@")
all=(sweep copy trace prefetch metadata recovery memory readpath smart selective sim freewrite)
[[ ${#exps[@]} -eq 0 ]] && exps=("${all[@]}")
# The frozen copies sit beside cargo's own binaries (a /tmp mounted noexec could not run them).
tgt=${CARGO_TARGET_DIR:-$PWD/target}
mkdir -p "$tgt"
frozen=$(mktemp -d "$tgt/bench-bin.XXXXXX")
trap 'rm -rf "$frozen"' EXIT
if [[ -z ${NODUP:-} || -z ${FUSEREF:-} || -z ${URING_NULL:-} ]]; then
  bash scripts/deps.sh >/dev/null
  cargo build --release -q -p nodup-cli -p nodup-fuseref -p nodup-uring-null
fi
for b in NODUP:nodup FUSEREF:nodup-fuseref URING_NULL:nodup-uring-null; do
  var=${b%%:*}
  if [[ -z ${!var:-} ]]; then
    cp "$tgt/release/${b#*:}" "$frozen/"
    export "$var=$frozen/${b#*:}"
  fi
done
echo "bench: binaries $NODUP ($("$NODUP" --version)), $FUSEREF, $URING_NULL"
# Where the other papers' scripts write in a quick run (see above).
Q=docs/results/quick
summary=()
for e in "${exps[@]}"; do
  t0=$(date +%s)
  case $e in
    sweep) QUICK=$quick bash bench/sweep.sh ;;
    copy) QUICK=$quick bash bench/copy.sh ;;
    recovery) QUICK=$quick bash bench/recovery.sh ;;
    memory) QUICK=$quick bash bench/memory.sh ;;
    readpath) QUICK=$quick bash bench/readpath.sh ;;
    trace) QUICK=$quick bash bench/trace.sh ;;
    prefetch) QUICK=$quick bash bench/prefetch.sh ;;
    metadata)
      if [[ $quick == 1 ]]; then bash bench/aging.sh; else SIZE=8GiB OUT=docs/results/aging-full.md bash bench/aging.sh; fi
      ;;
    smart | selective)
      if [[ $quick == 1 ]]; then mkdir -p $Q && RESULTS=$Q QUICK=1 bash bench/$e.sh; else bash bench/$e.sh; fi
      ;;
    sim)
      if [[ $quick == 1 ]]; then OUT=$Q/sim QUICK=1 bash bench/sim.sh; else bash bench/sim.sh; fi
      ;;
    freewrite)
      if [[ $quick == 1 ]]; then
        mkdir -p $Q && rm -f $Q/freewrite.jsonl
        RAW=$Q/freewrite.jsonl OUT=$Q/freewrite.md SIZE=64M SWEEP_SIZE=64M SPEED_SIZE=64M RUNS=1 bash bench/freewrite.sh all
      else
        bash bench/freewrite.sh all
      fi
      ;;
    *) echo "bench: unknown experiment $e (${all[*]})" >&2; exit 2 ;;
  esac
  summary+=("$e: $(($(date +%s) - t0)) s")
done
# The side-by-side summary, from whatever the experiments have written so far.
python3 bench/summary.py docs/results "$("$NODUP" --version | sed -n 's/.*(commit \([^)]*\)).*/\1/p')"
echo "bench ($([[ $quick == 1 ]] && echo quick || echo full)): ${summary[*]}; summary in docs/results/README.md"
