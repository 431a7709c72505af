#!/usr/bin/env sh
# Builds the C example engine with nothing but a C compiler:
#   examples/c-engine/build.sh [OUTPUT_DIRECTORY]
# then run the daemon with --engine-path OUTPUT_DIRECTORY --engine c-example.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
cc -std=c11 -O2 -Wall -Wextra -shared -fPIC -I "$here/../../Sources/CStorageEngine/include" \
    -o "$out/libstorebroker-engine-c-example.so" "$here/engine.c"
echo "$out/libstorebroker-engine-c-example.so"
