#!/usr/bin/env bash
# The broker next to Redis, in one run on this machine (docs/BENCHMARKS.md): installs redis-server and
# redis-tools when missing, starts a private Redis on a Unix socket under /tmp, and runs redis-benchmark and
# broker-bench (release) one after the other. Prints both and the ratios.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
if ((${#need[@]} > 0)); then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

swift build -c release >&2
work="$(mktemp -d /tmp/sb-side.XXXXXX)"
redis_pid=""
cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

start_redis() {  # extra redis-server arguments
    [ -n "$redis_pid" ] && kill "$redis_pid" && wait "$redis_pid" 2>/dev/null || true
    rm -f "$work/redis.sock"
    redis-server --port 0 --unixsocket "$work/redis.sock" --dir "$work" --save '' "$@" >"$work/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 1 200); do [ -S "$work/redis.sock" ] && return 0; sleep 0.05; done
    echo "redis did not start" >&2
    exit 1
}
# redis-benchmark --csv: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
redis() {  # label, redis-benchmark arguments
    local label="$1"
    shift
    redis-benchmark -s "$work/redis.sock" --csv "$@" | awk -F'","' -v label="$label" 'NR > 1 {
        gsub(/"/, "", $1); gsub(/"/, "", $5); printf "%s\t%s\t%.0f\t%.0f\n", label, $1, $2, $5 * 1000 }'
}

start_redis --appendonly no
{
    redis "1 client" -t set,get -n 20000 -c 1 -d 200
    redis "1 client -P 16" -t set -n 200000 -c 1 -P 16 -d 200
    redis "50 clients" -t set -n 100000 -c 50 -d 200
} >"$work/redis.tsv"
start_redis --appendonly yes --appendfsync always
redis "1 client, appendfsync always" -t set -n 5000 -c 1 -d 200 >>"$work/redis.tsv"

.build/release/broker-bench --runs 3 | tee "$work/broker.md" >&2

echo
echo "== Redis (redis-benchmark, Unix socket): case, test, requests/s, p50 µs"
cat "$work/redis.tsv"
python3 - "$work/redis.tsv" "$work/broker.md" <<'PY'
import sys
redis = {}
for line in open(sys.argv[1]):
    label, test, rps, p50 = line.rstrip("\n").split("\t")
    redis[(label, test)] = (float(rps), float(p50))
rows = {}
for line in open(sys.argv[2]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 8 and cells[0] in ("sqlite", "memory"):
        rows[cells[0]] = cells
def us(cell): return float(cell.split()[0])
def num(cell): return float(cell.replace(",", ""))
print()
print("== Ratios, broker / Redis (latency: lower is better; throughput: higher is better)")
for engine, cells in rows.items():
    set1 = redis[("1 client", "SET")]
    get1 = redis[("1 client", "GET")]
    durable = redis[("1 client, appendfsync always", "SET")]
    print(f"{engine}: insert p50 {us(cells[1]):.0f} µs vs SET {set1[1]:.0f} µs = {us(cells[1]) / set1[1]:.2f}x", end="")
    if engine == "sqlite":
        print(f" (vs appendfsync always {durable[1]:.0f} µs = {us(cells[1]) / durable[1]:.2f}x)", end="")
    print()
    print(f"{engine}: get p50 {us(cells[3]):.0f} µs vs GET {get1[1]:.0f} µs = {us(cells[3]) / get1[1]:.2f}x")
    print(f"{engine}: pipelined {num(cells[4]):.0f}/s vs SET -P 16 {redis[('1 client -P 16', 'SET')][0]:.0f}/s = "
          f"{num(cells[4]) / redis[('1 client -P 16', 'SET')][0]:.2f}x")
    print(f"{engine}: 8 clients {num(cells[5]):.0f}/s vs SET 50 clients {redis[('50 clients', 'SET')][0]:.0f}/s = "
          f"{num(cells[5]) / redis[('50 clients', 'SET')][0]:.2f}x")
PY
