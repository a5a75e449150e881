#!/usr/bin/env bash
# `make bench` / `make bench-full` (issue 21): the side-by-side benchmark suite. Runs each
# experiment in turn (quick sizes unless FULL=1), each writing its docs/results files, reports
# how long each took, and writes the summary docs/results/README.md (bench/summary.py).
#
# Experiments so far:
#   sweep   fio write sweep, every system at 0-100 % duplicates (Light-Dedup Fig. 7):
#           bench/sweep.sh -> docs/results/sweep.md, sweep/ (tsv, plots)
#   copy    a tree copied twice into every system, restic and borg ingesting it twice, btrfs +
#           duperemove (Fig. 10b / Table 3): bench/copy.sh -> docs/results/copy.md, copy/
#           (quick: /usr/share/doc; full: linux-source-6.1)
# Not yet part of the suite (issue 21 lists them): trace replay, prefetch breakdown, metadata amplification, recovery,
# memory, read path, and the other papers' scripts (bench/smart.sh, selective.sh, sim.sh,
# freewrite.sh), which today run at their own acceptance sizes only.
#
# Usage: bench/suite.sh [EXPERIMENT...]   (FULL=1 for the paper-scale sizes)
set -euo pipefail
cd "$(dirname "$0")/.."
FULL=${FULL:-0}
quick=1
[[ $FULL == 1 ]] && quick=0
exps=("$@")
[[ ${#exps[@]} -eq 0 ]] && exps=(sweep copy recovery memory readpath)
summary=()
for e in "${exps[@]}"; do
  t0=$(date +%s)
  case $e in
    sweep) QUICK=$quick bash bench/sweep.sh ;;
    copy) QUICK=$quick bash bench/copy.sh ;;
    recovery) QUICK=$quick bash bench/recovery.sh ;;
    memory) QUICK=$quick bash bench/memory.sh ;;
    readpath) QUICK=$quick bash bench/readpath.sh ;;
    *) echo "bench: unknown experiment $e (sweep, copy, recovery, memory, readpath)" >&2; exit 2 ;;
  esac
  summary+=("$e: $(($(date +%s) - t0)) s")
done
# The side-by-side summary, from whatever the experiments have written so far.
python3 bench/summary.py docs/results
echo "bench ($([[ $quick == 1 ]] && echo quick || echo full)): ${summary[*]}; summary in docs/results/README.md"
