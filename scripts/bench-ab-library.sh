#!/usr/bin/env bash
# Is the Swift client library at HEAD cheaper per request than at COMMIT? Builds `broker-bench` twice from HEAD's
# harness: once with COMMIT's client library (Sources/StoreBrokerClient, Sources/Wire and Package.swift, for the
# library's dependencies, checked out from COMMIT;
# it stops with the compiler's error if HEAD's harness no longer builds against them), once with HEAD's. Then
# ROUNDS times, each on a fresh memory-engine daemon (HEAD's) pinned to the first CPU this shell may use: the load
# generator (1,000 sequential inserts), then each build's `--library` shapes (5,000 sequential inserts each), the
# clients pinned to the daemon's core (where every microsecond of client CPU is latency), the two builds in
# alternating order. Prints, per shape and build, the median p50, the median of p50 / the generator's p50 of the
# same round, and the median client CPU per insert. Needs a clean working tree (it checks files out in place,
# for an incremental build, and puts them back).
#
#   ./scripts/bench-ab-library.sh COMMIT [ROUNDS] [SHAPES]   (ROUNDS 8; SHAPES executor,remotestore,client_executor;
#   mirror adds its events-per-second figures)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -ge 1 ] || { echo "usage: $0 COMMIT [ROUNDS] [SHAPES]" >&2; exit 64; }
before_commit=$(git rev-parse --verify "$1^{commit}")
rounds=${2:-8}
shapes=${3:-executor,remotestore,client_executor}
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "bench-ab-library: the working tree has changes; commit or stash them first" >&2
    exit 65
fi
source scripts/setup.sh

work=$(mktemp -d /tmp/storebroker-ab-library.XXXXXX)
library=(Sources/StoreBrokerClient Sources/Wire Package.swift)
restore() { # COMMIT: the library's files as they are at COMMIT (working tree only; the index untouched)
    git restore --source="$1" --worktree -- "${library[@]}"
    git clean -qfd -- "${library[@]}"
}
cleanup() {
    restore HEAD
    rm -rf "$work"
}
trap cleanup EXIT

bin=$(swift build -c release --show-bin-path)
for product in storebrokerd storebroker-engine-memory storebroker-benchmark; do swift build -c release --product "$product" >&2; done
cp "$bin/storebrokerd" "$bin/libstorebroker-engine-memory.so" "$bin/storebroker-benchmark" "$work/"
restore "$before_commit"
swift build -c release --product broker-bench >&2
cp "$bin/broker-bench" "$work/broker-bench-before"
restore HEAD
swift build -c release --product broker-bench >&2
cp "$bin/broker-bench" "$work/broker-bench-after"

python3 - "$work" "$rounds" "$shapes" <<'EOF'
import os, shutil, statistics, subprocess, sys, tempfile, time
work, rounds, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpu = sorted(os.sched_getaffinity(0))[0]
pin = lambda: os.sched_setaffinity(0, {cpu})
rows = {}  # (shape, side) -> [(p50, ratio, cpu)]
rates = {}  # (figure, side) -> [per second] (the mirror shape's)
for round in range(rounds):
    run = tempfile.mkdtemp(prefix="storebroker-ab-library-run.")
    sock = os.path.join(run, "s.sock")
    daemon = subprocess.Popen([os.path.join(work, "storebrokerd"), "--socket", sock, "--data-dir", os.path.join(run, "data"),
                               "--engine", "memory", "--no-dbus", "--log-level", "warning"], preexec_fn=pin,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock): break
            time.sleep(0.05)
        generator = subprocess.run([os.path.join(work, "storebroker-benchmark"), "-s", sock, "--csv", "-t", "insert", "-c", "1",
                                    "-d", "200", "-r", "100000", "-n", "1000"], capture_output=True, text=True, check=True,
                                   preexec_fn=pin).stdout.splitlines()
        header = [h.strip('"') for h in generator[0].split(",")]
        values = [v.strip('"') for v in generator[1].split(",")]
        floor = float(values[header.index("p50_latency_ms")]) * 1000
        for side in (["before", "after"] if round % 2 == 0 else ["after", "before"]):
            out = subprocess.run([os.path.join(work, f"broker-bench-{side}"), "--library", sock, "--shapes", shapes,
                                  "--count", "5000"], capture_output=True, text=True, check=True, preexec_fn=pin).stdout
            figures = dict(line.split() for line in out.splitlines() if line.strip())
            for key, rate in figures.items():
                if key.endswith("_per_s"): rates.setdefault((key, side), []).append(float(rate))
            for key, p50 in figures.items():
                if not key.endswith("_p50_us"): continue
                shape = key[:-len("_p50_us")]
                rows.setdefault((shape, side), []).append(
                    (float(p50), float(p50) / floor, float(figures[f"{shape}_cpu_us"])))
    finally:
        daemon.terminate(); daemon.wait()
        shutil.rmtree(run, ignore_errors=True)
print(f"{rounds} rounds, daemon and clients on CPU {cpu}; medians")
print(f"{'shape':24} {'side':7} {'p50 µs':>8} {'/ generator':>12} {'client CPU µs':>14}")
for (shape, side), figures in sorted(rows.items()):
    p50, ratio, used = (statistics.median(f[i] for f in figures) for i in range(3))
    print(f"{shape:24} {side:7} {p50:8.1f} {ratio:11.2f}x {used:14.1f}")
for (figure, side), values in sorted(rates.items()):
    print(f"{figure:32} {side:7} {statistics.median(values):12,.0f}")
EOF
