#!/usr/bin/env bash
# Sets up what is missing, builds, and shows what this build does: the protocol library decoding real frames.
# and every storage engine at work. (The daemon and storectl arrive with the next issue; this becomes a
# daemon + storectl round trip then.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

swift build
bin="$(swift build --show-bin-path)"
"$bin/storebrokerd" --version

echo
echo "== A client's hello and a server's welcome, captured as hex, decoded by wiredump:"
printf '%s' "00000011 01 00 0000 00000000 5342524b 01 0001 0008 73746f726563746c
             00000019 40 00 0000 00000000 0001 0005 302e312e30 01000000 00100000 00002710 00000080" |
    "$bin/wiredump" --hex

echo
echo "== Every test vector in docs/protocol-vectors.json, decoded:"
"$bin/wiredump" --vectors docs/protocol-vectors.json

echo
echo "== Every storage engine, loaded with dlopen through the C ABI, writing and reading stores"
echo "   (one run of the engine benchmark on a debug build; see docs/BENCHMARKS.md for release figures):"
"$bin/engine-bench" --runs 1
