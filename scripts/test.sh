#!/usr/bin/env bash
# Sets up what is missing, builds, and runs every test. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

# An independent reading of docs/PROTOCOL.md: a decoder written in Python from the document alone must agree
# with every test vector.
/usr/bin/python3 Tests/python/check_vectors.py docs/protocol-vectors.json

swift build --build-tests
swift test

# The reliability suite's quick mode (docs/RELIABILITY.md): kill -9 rounds per persistent engine, live fuzzing,
# load with watchers, libFuzzer on the wire codec.
bash scripts/reliability.sh --quick
