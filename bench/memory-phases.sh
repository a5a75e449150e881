#!/usr/bin/env bash
# Where a daemon's anonymous memory lives, phase by phase: the budget workload of
# `bench/smart.sh budget` (a 4 MiB warm-up, MIB of unique blocks in 256 KiB writes, the same
# blocks again shuffled in 4 KiB writes, then, for `smart`, the worker settled), with the
# daemon's RssAnon split by mapping after each phase:
#
#   main heap      the main thread's malloc arena ([heap])
#   thread arenas  the other threads' malloc arenas (FUSE threads, the worker, the checkpoint
#                  thread), their count, and the three largest
#   stacks+other   thread stacks, the binary's data, our own anonymous mappings
#
# Run it for two policies on the same data and compare the columns: what one policy costs
# beyond the other, and in which allocator's hands (a free chunk in a thread's arena is
# resident until that arena is trimmed). Not a benchmark: one run, no timing.
#
# Usage: bench/memory-phases.sh POLICY MIB [BUDGET]   (e.g. `smart 2048 512K`, `none 2048`;
# NODUP=binary; MALLOC_ARENA_MAX and other glibc tunables pass through to the daemon)
set -euo pipefail
case ${1:-} in -h | --help | "") sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; [[ -n ${1:-} ]]; exit $? ;; esac
POLICY=$1
MIB=${2:?MIB: unique data to write, in MiB}
BUDGET=${3:-512K}
[[ $MIB =~ ^[0-9]+$ && $MIB -gt 0 ]] || { echo "memory-phases: MIB must be a positive whole number, not '$MIB'" >&2; exit 2; }
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_nodup
scratch_mount memphase
extra=()
margs=()
[[ $POLICY == smart ]] && extra=(--mem-budget "$BUDGET") && margs=(--worker-rate 0)
"$NODUP" mkfs "$W/img" --size "$((MIB * 4))M" --policy "$POLICY" "${extra[@]}" >/dev/null
"$NODUP" mount "$W/img" "$MNT" "${margs[@]}" >/dev/null
PID=$(pid_of_mount)

# snap PHASE: one table row from /proc/PID/smaps.
snap() {
  python3 - "$PID" "$1" <<'PY'
import re, sys
pid, phase = sys.argv[1], sys.argv[2]
maps, cur = [], None
for line in open(f"/proc/{pid}/smaps"):
    if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
        f = line.split()
        lo = int(f[0].split("-")[0], 16)
        cur = {"lo": lo, "name": f[5] if len(f) > 5 else "", "anon": 0}
        maps.append(cur)
    elif line.startswith("Anonymous:"):
        cur["anon"] = int(line.split()[1])
# glibc's thread arenas: anonymous mappings starting on a 64 MiB boundary (HEAP_MAX_SIZE).
arenas = [m for m in maps if m["name"] == "" and m["lo"] % (64 << 20) == 0 and m["anon"]]
heap = sum(m["anon"] for m in maps if m["name"] == "[heap]")
sizes = sorted((m["anon"] for m in arenas), reverse=True)
total = sum(m["anon"] for m in maps)
rest = total - heap - sum(sizes)
rss = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("RssAnon:"))
top = ", ".join(str(x) for x in sizes[:3])
print(f"| {phase} | {rss} | {heap} | {sum(sizes)} ({len(sizes)}: {top}) | {rest} |")
PY
}
echo "$POLICY, $MIB MiB$([[ $POLICY == smart ]] && echo ", --mem-budget $BUDGET"), binary $("$NODUP" --version), ${MALLOC_ARENA_MAX:+MALLOC_ARENA_MAX=$MALLOC_ARENA_MAX, }KiB:"
echo
echo "| phase | RssAnon | main heap | thread arenas (count: largest) | stacks+other |"
echo "|---|---:|---:|---:|---:|"
snap mount
"$NODUP" bench fill "$MNT/warm" --blocks 1024 --per-write 64 >/dev/null
rm "$MNT/warm"
snap warm-up
"$NODUP" bench fill "$MNT/a" --blocks "$((MIB * 256))" --per-write 64 >/dev/null
snap "unique fill"
"$NODUP" bench fill "$MNT/b" --blocks "$((MIB * 256))" --order shuffle >/dev/null
snap "shuffled fill"
if [[ $POLICY == smart ]]; then
  smart_settle
  snap settled
fi
maps=$(nodup_stat "s['block_map_bytes'] // 1024")
dedup=$(nodup_stat "s['smart']['memory']['total_bytes'] // 1024 if 'smart' in s else '-'")
echo
echo "Block maps: $maps KiB; the policy's dedup memory (smart's own accounting): $dedup KiB."
