#!/usr/bin/env bash
# Sets up what is missing, builds, and runs every test. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

# An independent reading of docs/PROTOCOL.md: a decoder written in Python from the document alone must agree
# with every test vector.
/usr/bin/python3 Tests/python/check_vectors.py docs/protocol-vectors.json

swift build --build-tests
# The whole log scrolls by; when something fails, its lines are printed again at the end, where a log cut to its
# tail (CI's) still shows them.
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
status=0
swift test 2>&1 | tee "$test_log" || status=$?
if [ "$status" -ne 0 ]; then
    echo "== swift test failed (exit $status); what failed:"
    grep -E '✘|error:|Fatal error|Test .* failed' "$test_log" | head -200 || true
    exit "$status"
fi

# The reliability suite's quick mode (docs/RELIABILITY.md): kill -9 rounds per persistent engine, live fuzzing,
# load with watchers, libFuzzer on the wire codec.
bash scripts/reliability.sh --quick

# The request path's allocations against the committed thresholds (docs/BENCHMARKS.md): a regression fails here.
bash scripts/check-allocations.sh
