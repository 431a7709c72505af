#!/usr/bin/env bash
# Is this commit slower than an earlier one? Builds the daemon (release) at COMMIT and at HEAD, then runs the
# two side by side, alternating, ROUNDS times: each time a fresh memory-engine daemon on a temporary socket
# and the same load generator (HEAD's storebroker-benchmark) with insert and get at four client shapes.
# Prints each row's mean and min–max per side and the ratio of the means, for requests per second and for the
# daemon's CPU per request (read from /proc: steadier on a noisy VM); a row is slower than before beyond its
# spread only when after's best is worse than before's worst. Needs a clean working tree (it checks COMMIT
# out in place, for an incremental build, and comes back).
#
#   ./scripts/bench-ab.sh COMMIT [ROUNDS]        (ROUNDS defaults to 5; about 40 s per round)
#
# ENGINE=sqlite [ENGINE_OPTION=sqlite.synchronous=FULL] measures durable inserts instead (1 and 50 clients, each
# waiting for its answer): the engine's thread hand-offs and group commit.
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

engine=${ENGINE:-memory}
engine_arguments=(--engine "$engine")
if [ -n "${ENGINE_OPTION:-}" ]; then engine_arguments+=(--engine-option "$ENGINE_OPTION"); fi
if [ "$engine" = memory ]; then
    shapes=("-c 1 -P 1 -n 30000" "-c 1 -P 16 -n 200000" "-c 50 -P 1 -n 100000" "-c 50 -P 16 -n 200000")
    tests="insert get"
else
    shapes=("-c 1 -P 1 -n 3000" "-c 50 -P 1 -n 30000")
    tests="insert"
fi
build() { # COMMIT DIR
    git checkout -q "$1"
    swift build -c release --product storebrokerd >&2
    swift build -c release --product "storebroker-engine-$engine" >&2
    local bin
    bin=$(swift build -c release --show-bin-path)
    mkdir -p "$2"
    cp "$bin/storebrokerd" "$bin/libstorebroker-engine-$engine.so" "$2/"
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
        "$work/$side/storebrokerd" --socket "$run/s.sock" --data-dir "$run/data" "${engine_arguments[@]}" --no-dbus \
            >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 1 200); do [ -S "$run/s.sock" ] && break; sleep 0.05; done
        for shape in "${shapes[@]}"; do
            for test in $tests; do
                # The daemon's CPU (user + system ticks, /proc) over the requests: on a noisy VM a steadier
                # figure than requests per second, which moves with every wake-up of an idle core.
                ticks_before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
                # shellcheck disable=SC2086
                line=$("$work/storebroker-benchmark" -s "$run/s.sock" --csv -t $test $shape -d 200 -r 100000 \
                    | { grep -v '^"test"' || true; })
                ticks_after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
                echo "$side,${shape// /_},$line,$((ticks_after - ticks_before))" >>"$results"
            done
        done
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        rm -rf "$run"
    done
    echo "round $round of $rounds done" >&2
done

python3 - "$results" "$before_commit" "$(getconf CLK_TCK)" "$engine ${ENGINE_OPTION:-}" <<'EOF'
import csv, sys
rows, cpu = {}, {}
for side, shape, test, rps, *rest in csv.reader(open(sys.argv[1])):
    if not test:  # the load generator printed nothing for this run
        continue
    key = (test, shape.split("_-n")[0].replace("_", " "))
    requests = int(shape.split("_-n_")[1])
    rows.setdefault(key, {}).setdefault(side, []).append(float(rps))
    cpu.setdefault(key, {}).setdefault(side, []).append(int(rest[-1]) * 1e6 / int(sys.argv[3]) / requests)

def table(title, data, unit_format, lower_is_better):
    print(title)
    print(f"{'test':7} {'clients':16} {'before mean (min-max)':28} {'after mean (min-max)':28} {'after/before':>12}  beyond spread?")
    for (test, shape), sides in sorted(data.items()):
        b, a = sides["before"], sides["after"]
        mb, ma = sum(b) / len(b), sum(a) / len(a)
        worse, better = (min(a) > max(b), max(a) < min(b)) if lower_is_better else (max(a) < min(b), min(a) > max(b))
        verdict = "SLOWER" if worse else ("faster" if better else "no")
        cells = [f"{unit_format(m)} ({unit_format(min(v))}-{unit_format(max(v))})" for m, v in ((mb, b), (ma, a))]
        print(f"{test:7} {shape:16} {cells[0]:28} {cells[1]:28} {ma / mb:12.2f}  {verdict}")

table(f"requests per second, daemon at {sys.argv[2][:10]} (before) and HEAD (after), engine {sys.argv[4].strip()}, -d 200 -r 100000",
      rows, lambda v: f"{v:.0f}", lower_is_better=False)
print()
table("the daemon's CPU per request (us, user + system from /proc), same runs", cpu, lambda v: f"{v:.2f}",
      lower_is_better=True)
EOF
