#!/usr/bin/env bash
# Is this commit slower than an earlier one? Builds the daemon (release) at COMMIT and at HEAD, then runs the
# two side by side, alternating, ROUNDS times: each time a fresh memory-engine daemon on a temporary socket
# and the same load generator (HEAD's storebroker-benchmark) with insert and get at four client shapes.
# Prints each row's mean and min–max per side and the ratio of the means; a row is slower than before beyond
# its spread only when after's best is under before's worst. Needs a clean working tree (it checks COMMIT
# out in place, for an incremental build, and comes back).
#
#   ./scripts/bench-ab.sh COMMIT [ROUNDS]        (ROUNDS defaults to 5; about 40 s per round)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 1 ] || { echo "usage: $0 COMMIT [ROUNDS]" >&2; exit 64; }
before_commit=$(git rev-parse --verify "$1^{commit}")
rounds=${2:-5}
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "bench-ab: the working tree has changes; commit or stash them first" >&2
    exit 65
fi
source scripts/setup.sh

work=$(mktemp -d /tmp/storebroker-ab.XXXXXX)
here=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
cleanup() {
    git checkout -q "$here"
    rm -rf "$work"
}
trap cleanup EXIT

build() { # COMMIT DIR
    git checkout -q "$1"
    swift build -c release --product storebrokerd >&2
    swift build -c release --product storebroker-engine-memory >&2
    local bin
    bin=$(swift build -c release --show-bin-path)
    mkdir -p "$2"
    cp "$bin/storebrokerd" "$bin/libstorebroker-engine-memory.so" "$2/"
}
build "$before_commit" "$work/before"
git checkout -q "$here"
swift build -c release --product storebroker-benchmark >&2
build "$here" "$work/after"
cp "$(swift build -c release --show-bin-path)/storebroker-benchmark" "$work/"

results="$work/results.csv"
for round in $(seq 1 "$rounds"); do
    for side in before after; do
        run=$(mktemp -d /tmp/storebroker-ab-run.XXXXXX)
        "$work/$side/storebrokerd" --socket "$run/s.sock" --data-dir "$run/data" --engine memory --no-dbus \
            >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 1 200); do [ -S "$run/s.sock" ] && break; sleep 0.05; done
        for shape in "-c 1 -P 1 -n 30000" "-c 1 -P 16 -n 200000" "-c 50 -P 1 -n 100000" "-c 50 -P 16 -n 200000"; do
            # shellcheck disable=SC2086
            "$work/storebroker-benchmark" -s "$run/s.sock" --csv -t insert,get $shape -d 200 -r 100000 \
                | { grep -v '^"test"' || true; } | sed "s/^/$side,${shape// /_},/" >>"$results"
        done
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        rm -rf "$run"
    done
    echo "round $round of $rounds done" >&2
done

python3 - "$results" "$before_commit" <<'EOF'
import csv, sys
rows = {}
for side, shape, test, rps, *_ in csv.reader(open(sys.argv[1])):
    rows.setdefault((test, shape.split("_-n")[0].replace("_", " ")), {}).setdefault(side, []).append(float(rps))
print(f"requests per second, daemon at {sys.argv[2][:10]} (before) and HEAD (after), memory engine, -d 200 -r 100000")
print(f"{'test':7} {'clients':16} {'before mean (min-max)':28} {'after mean (min-max)':28} {'after/before':>12}  beyond spread?")
for (test, shape), sides in sorted(rows.items()):
    b, a = sides["before"], sides["after"]
    mb, ma = sum(b) / len(b), sum(a) / len(a)
    slower = "SLOWER" if max(a) < min(b) else ("faster" if min(a) > max(b) else "no")
    print(f"{test:7} {shape:16} {mb:10.0f} ({min(b):.0f}-{max(b):.0f}){'':3} {ma:10.0f} ({min(a):.0f}-{max(a):.0f}){'':3} {ma / mb:12.2f}  {slower}")
EOF
