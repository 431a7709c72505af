#!/usr/bin/env bash
# Builds in release mode and runs the daemon benchmark through its socket (docs/BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
swift build -c release
.build/release/broker-bench "$@"
