#!/usr/bin/env bash
# The daemon's request path in allocations against the committed thresholds (docs/BENCHMARKS.md, "Allocations
# on the request path"). Run by the README's test command; exits non-zero when a count moved beyond its tolerance,
# up or down. `--update` writes the thresholds from a run instead (commit them with the change that moved them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
cd Benchmarks/Allocations
if [ "${1:-}" = "--update" ]; then
    exec swift package --disable-sandbox --allow-writing-to-package-directory \
        benchmark thresholds update --path Thresholds --no-progress
fi
if ! swift package --disable-sandbox benchmark thresholds check --path Thresholds --no-progress; then
    echo "check-allocations: the request path's allocations differ from Benchmarks/Allocations/Thresholds." >&2
    echo "  More: find the new allocation (docs/BENCHMARKS.md says how). Fewer: ./scripts/check-allocations.sh --update" >&2
    echo "  and commit the lower thresholds." >&2
    exit 1
fi
