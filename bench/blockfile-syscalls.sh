#!/usr/bin/env bash
# System calls of the daemon behind a block-file image, counted: one fio run (sync writes, one
# job, end_fsync) on a fresh `--medium blockfile` image, the daemon traced with strace; prints
# each kind of write-side call with its count (pwrite by size), then fio's MiB/s (slowed by
# the tracing: a count, not a speed). For a speed, bench/ab-binaries.sh.
# Usage: bench/blockfile-syscalls.sh [BINARY]   (SIZE=64m BS=1m DUP=0 IMG_DIR=/work/abdisk TOP=10:
# the commonest TOP calls are listed, the rest summed)
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/nodup}")
SIZE=${SIZE:-64m}
BS=${BS:-1m}
DUP=${DUP:-0}
DIR=${IMG_DIR:-/work/abdisk}
TOP=${TOP:-10}
command -v strace >/dev/null || apt-get install -y strace >/dev/null
command -v fio >/dev/null || apt-get install -y fio >/dev/null
mkdir -p "$DIR"
IMG=$DIR/nodup-syscalls.img
MNT=$(mktemp -d /tmp/nodup-syscalls-mnt.XXXXXX)
TRACE=$(mktemp /tmp/nodup-syscalls-trace.XXXXXX)
SP=
cleanup() {
  [[ -n $SP ]] && kill "$SP" 2>/dev/null || true
  mountpoint -q "$MNT" && fusermount3 -u -z "$MNT" || true
  rm -rf "$IMG" "$MNT" "$TRACE"
}
trap cleanup EXIT
rm -f "$IMG"
"$BIN" mkfs "$IMG" --size 2G --medium blockfile >/dev/null
"$BIN" mount "$IMG" "$MNT" >/dev/null
PID=$(pgrep -f "mount $IMG $MNT" | head -1)
[[ -n $PID ]] || { echo "blockfile-syscalls: no daemon found for $MNT" >&2; exit 1; }
strace -f -p "$PID" -e trace=pwrite64,pwritev,fdatasync,fallocate,pread64 -o "$TRACE" 2>/dev/null &
SP=$!
sleep 1
bw=$(fio --name=w --directory="$MNT" --rw=write --bs="$BS" --size="$SIZE" --ioengine=psync \
  --end_fsync=1 --dedupe_percentage="$DUP" --output-format=json |
  python3 -c 'import json,sys; print("%.1f" % (json.loads(sys.stdin.read())["jobs"][0]["write"]["bw"]/1024))')
sleep 1
kill "$SP"; wait "$SP" 2>/dev/null || true; SP=
"$BIN" umount "$MNT"
echo "| call | count |"
echo "|---|---:|"
# The TOP commonest calls (pwrite by size), the rest summed, and the total.
awk '$2 ~ /^(pwrite64|pwritev|fdatasync|fallocate|pread64)\(/ {
       split($2, c, "(");
       if (c[1] == "pwrite64") { n = split($0, a, ", "); k = "pwrite64 of " a[n-1] " B" } else k = c[1];
       cnt[k]++ }
     END { for (k in cnt) printf "%d\t%s\n", cnt[k], k }' "$TRACE" |
  sort -rn | awk -F'\t' -v top="$TOP" 'NR <= top { printf "| %s | %d |\n", $2, $1; tot += $1; next }
                          { rest += $1; tot += $1 }
                          END { if (rest) printf "| others | %d |\n", rest; printf "| all | %d |\n", tot }'
echo "fio $BS ${DUP}% $SIZE under strace: $bw MiB/s ($(basename "$BIN"), $("$BIN" --version 2>/dev/null | head -1))"
