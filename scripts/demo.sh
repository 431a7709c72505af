#!/usr/bin/env bash
# The README's main job: sets up what is missing, builds, then runs storebrokerd with the default sqlite
# engine on a temporary socket and data directory and walks through storectl (examples/storectl-walkthrough.sh),
# then the two-process RemoteStore demo (examples/notes-demo.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

swift build
export STOREBROKER_BIN="$(swift build --show-bin-path)"
./examples/storectl-walkthrough.sh
echo
echo "== Two processes sharing a store through the Swift client library (examples/notes-demo.sh):"
./examples/notes-demo.sh
