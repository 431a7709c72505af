#!/usr/bin/env bash
# A tour of storectl against a temporary storebrokerd (sqlite engine): stores, chains, watch, values,
# secrets, a restart that keeps everything, a graceful shutdown. STOREBROKER_BIN names the directory holding
# the binaries (default: build them with `swift build`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${STOREBROKER_BIN:-}"
if [ -z "$bin" ]; then
    swift build >&2
    bin="$(swift build --show-bin-path)"
fi
work="$(mktemp -d /tmp/storebroker-walkthrough.XXXXXX)"
socket="$work/storebroker.sock"
daemon_pid=""
watch_pid=""
cleanup() {
    [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null || true
    [ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

start_daemon() {
    "$bin/storebrokerd" --socket "$socket" --data-dir "$work/data" --no-dbus 2>>"$work/daemon.log" &
    daemon_pid=$!
    "$bin/storectl" --socket "$socket" ping --wait 30
}
stop_daemon() {
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" || true
    daemon_pid=""
}
ctl() {
    local shown="$ storectl" arg
    for arg in "$@"; do
        if [[ "$arg" =~ ^[A-Za-z0-9._/=-]+$ ]]; then shown+=" $arg"; else shown+=" '$arg'"; fi
    done
    echo "$shown" >&2
    "$bin/storectl" --socket "$socket" "$@"
}
wait_for_line() {
    for _ in $(seq 1 600); do grep -q "$1" "$work/watch.out" 2>/dev/null && return 0; sleep 0.05; done
    echo "watch never printed $1" >&2
    return 1
}

"$bin/storebrokerd" --version
echo "== storebrokerd on $socket, data in $work/data (engine: sqlite)"
start_daemon

"$bin/storectl" --socket "$socket" watch notes >"$work/watch.out" &
watch_pid=$!
wait_for_line '"op":"loaded"'   # ready once its first line (the snapshot) is out

ctl insert notes '{"id":"1","text":"buy milk"}' '{"id":"2","text":"call mum"}'
ctl insert notes '{"id":"1","text":"buy oat milk"}'
ctl query notes
ctl query notes --meta --format json
printf '%s\n' '{"op":"remove","id":"2"}' '{"op":"insert","item":{"id":"3","text":"water plants"}}' | ctl apply notes
ctl count notes
ctl stores
ctl engines --format table

echo "== what 'storectl watch notes' printed meanwhile:"
wait_for_line '"sequence":3'
kill "$watch_pid" 2>/dev/null || true
watch_pid=""
cat "$work/watch.out"

echo "== values and secrets"
ctl value set theme '{"dark":true}'
ctl value get theme
ctl secret set api-token 'hunter2'
ctl secret get api-token

echo "== export, drop, import"
ctl export notes >"$work/notes.ndjson"
cat "$work/notes.ndjson"
ctl drop notes
ctl import notes "$work/notes.ndjson"
ctl query notes

echo "== restart: order, payloads, timestamps, sequences and values survive"
stop_daemon
start_daemon
ctl query notes --meta
ctl stores
ctl value get theme

echo "== daemon log:"
stop_daemon
cat "$work/daemon.log"
