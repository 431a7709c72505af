#!/usr/bin/env bash
# Sets up what is missing, builds, and runs the main job: storebrokerd with the default sqlite engine on a
# temporary socket and data directory, a storectl round trip (insert, replace, query, watch, an atomic chain,
# a restart that keeps everything), then a graceful shutdown.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

swift build
bin="$(swift build --show-bin-path)"
work="$(mktemp -d /tmp/storebroker-demo.XXXXXX)"
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
ctl() {
    local shown="$ storectl" arg
    for arg in "$@"; do
        if [[ "$arg" =~ ^[A-Za-z0-9._/=-]+$ ]]; then shown+=" $arg"; else shown+=" '$arg'"; fi
    done
    echo "$shown" >&2
    "$bin/storectl" --socket "$socket" "$@"
}

"$bin/storebrokerd" --version
echo "== storebrokerd on $socket, data in $work/data (engine: sqlite)"
start_daemon

"$bin/storectl" --socket "$socket" watch notes >"$work/watch.out" &
watch_pid=$!
# Ready once its first line (the snapshot) is out.
wait_for_line() {
    for _ in $(seq 1 600); do grep -q "$1" "$work/watch.out" 2>/dev/null && return 0; sleep 0.05; done
    echo "watch never printed $1" >&2
    return 1
}
wait_for_line '"op":"loaded"'

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

echo "== restart: order, payloads, timestamps and sequence survive"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
start_daemon
ctl query notes --meta
ctl stores

echo "== daemon log:"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""
cat "$work/daemon.log"
