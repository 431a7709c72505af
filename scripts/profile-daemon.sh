#!/usr/bin/env bash
# Where the daemon's time goes under one workload (docs/BENCHMARKS.md, "Where the time goes"): a release
# storebrokerd on a temporary socket, storebroker-benchmark driving it, `perf record -e cpu-clock --call-graph
# dwarf` of the daemon meanwhile (Swift frames lack frame pointers), the top frames by self time, and thread
# hand-offs per request: the daemon's context switches (`perf stat -e context-switches`) over the requests.
#
#   ./scripts/profile-daemon.sh ENGINE BENCHMARK-ARGUMENTS...
#   ./scripts/profile-daemon.sh memory -t insert -c 50 -P 16 -n 200000 -d 200 -r 100000
#
# With PERF_DATA=FILE the recording is kept there, for `perf report -i FILE --children` and the like.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
engine="$1"
shift
source scripts/setup.sh
if ! command -v perf >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends linux-perf
fi
swift build -c release >&2
bin="$(swift build -c release --show-bin-path)"
work="$(mktemp -d /tmp/sb-profile.XXXXXX)"
daemon=""
cleanup() {
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$bin/storebrokerd" --socket "$work/s.sock" --data-dir "$work/data" --engine "$engine" --no-dbus --log-level warning &
daemon=$!
"$bin/storectl" --socket "$work/s.sock" ping --wait 30 >/dev/null

requests=0
previous=""
for argument in "$@"; do
    [ "$previous" = "-n" ] && requests="$argument"
    previous="$argument"
done

perf stat -e context-switches -p "$daemon" -o "$work/stat.txt" &
stat_pid=$!
perf record -q -e cpu-clock --call-graph dwarf,16384 -p "$daemon" -o "$work/perf.data" 2>/dev/null &
record_pid=$!
sleep 0.5
"$bin/storebroker-benchmark" -s "$work/s.sock" -q "$@"
kill -INT "$stat_pid" "$record_pid"
wait "$stat_pid" "$record_pid" 2>/dev/null || true

switches="$(awk '/context-switches/ { gsub(",", "", $1); print $1 }' "$work/stat.txt")"
echo "daemon context switches: $switches for $requests requests = $(python3 -c "print(f'{$switches / max($requests, 1):.3f}')") per request"
echo "top frames by self time (perf report --no-children):"
perf report -i "$work/perf.data" --stdio --no-children --sort dso,symbol --percent-limit 1.5 2>/dev/null \
    | grep -E '^ +[0-9]+\.[0-9]+%' | head -25 | awk '{ printf "  %s  %s  ", $1, $2; $1 = $2 = $3 = ""; print }' \
    | sed -E 's/ +- +- *$//' | swift demangle --simplified
if [ -n "${PERF_DATA:-}" ]; then cp "$work/perf.data" "$PERF_DATA"; fi
