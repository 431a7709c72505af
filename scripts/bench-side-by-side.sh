#!/usr/bin/env bash
# Every workload of PRODUCT.md's speed section, storebroker next to its counterpart (Redis, SQLite, the load
# generator itself), in one run on this machine (docs/BENCHMARKS.md). Installs redis-server and redis-tools when
# missing, builds release, and runs scripts/bench_side_by_side.py: each row the median of 3 runs alternating the
# two sides, with the spread; one table with every ratio. Without --quick it rewrites the generated section of
# docs/BENCHMARKS.md and docs/benchmarks-side-by-side.json; --quick (one smaller run, no 1,000,000-item cold
# start) takes under 3 minutes after an up-to-date release build and writes nothing; --quick --runs 3 gives the
# spread of each row in quick sizes (to compare two commits).
#
#   ./scripts/bench-side-by-side.sh [--quick] [--runs N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
if ((${#need[@]} > 0)); then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

swift build -c release >&2
exec python3 scripts/bench_side_by_side.py --bin "$(swift build -c release --show-bin-path)" "$@"
