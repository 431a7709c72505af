#!/usr/bin/env bash
# The two-process demo in one command: a temporary storebrokerd, a watcher process and a writer process
# sharing the `notes` store through RemoteStore (examples/notes-demo/main.swift).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${STOREBROKER_BIN:-}"
if [ -z "$bin" ]; then
    swift build --product notes-demo >&2
    swift build --product storebrokerd >&2
    bin="$(swift build --show-bin-path)"
fi
work="$(mktemp -d /tmp/notes-demo.XXXXXX)"
socket="$work/s.sock"
"$bin/storebrokerd" --socket "$socket" --data-dir "$work/data" --no-dbus --log-level warning &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$work"' EXIT
"$bin/storectl" --socket "$socket" ping --wait 30 >/dev/null

# The watcher prints "ready" once it has loaded the store, then every event; 9 events end it.
"$bin/notes-demo" watcher --socket "$socket" --count 9 >"$work/watcher.out" &
watcher=$!
for _ in $(seq 1 600); do grep -q ready "$work/watcher.out" 2>/dev/null && break; sleep 0.05; done

echo "== writer:"
"$bin/notes-demo" writer --socket "$socket" --count 5
wait $watcher
echo "== watcher (another process):"
cat "$work/watcher.out"
