#!/usr/bin/env bash
# Builds in release mode and runs the storage engine benchmark (docs/BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
swift build -c release
.build/release/engine-bench "$@"
