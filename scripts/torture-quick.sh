#!/usr/bin/env bash
# make torture-quick (part of make test): a reduced run of every campaign, well under 5 minutes
# on 2 cores. Fuzzing uses the stable driver over fuzz/corpus plus seeded mutations. The
# documented findings (docs/results/torture.md) are reported but do not fail this gate.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p nodup-cli -p nodup-torture >&2
exec ./target/release/nodup-torture --quick --seconds "${TORTURE_QUICK_SECONDS:-150}" \
  --seed "${TORTURE_SEED:-1}" --threads 4 --known-findings-ok "$@"
