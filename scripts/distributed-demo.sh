#!/usr/bin/env bash
# Two brokers sharing stores through one PostgreSQL database (docs/DISTRIBUTED.md), on this machine: sets up
# what is missing, builds, starts a private PostgreSQL server (its own cluster and Unix socket in a temporary
# directory, no TCP) and two storebrokerd with the postgres engine, writes through both and shows that each
# broker's watcher sees every commit in the same order; then stops everything and removes the directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

swift build
bin="$(swift build --show-bin-path)"
pg="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
work="$(mktemp -d /tmp/sb-distributed-XXXXXX)"
as_postgres=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$work"
    as_postgres=(setpriv --reuid=postgres --regid=postgres --init-groups --)
fi
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"${as_postgres[@]}" "$pg/initdb" -D "$work/pgdata" -A trust -U postgres --no-sync -E UTF8 --no-locale >/dev/null
"${as_postgres[@]}" "$pg/postgres" -D "$work/pgdata" -k "$work" -p 5432 -c listen_addresses= >"$work/postgres.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do grep -q "ready to accept connections" "$work/postgres.log" && break; sleep 0.05; done
conninfo="host=$work port=5432 user=postgres dbname=postgres"
echo "== PostgreSQL ready on $work/.s.PGSQL.5432"

for broker in a b; do
    mkdir -p "$work/$broker"
    "$bin/storebrokerd" --socket "$work/$broker/s.sock" --data-dir "$work/$broker/data" --no-dbus \
        --engine postgres --engine-option "postgres.conninfo=$conninfo" >"$work/$broker/log" 2>&1 &
    pids+=($!)
    "$bin/storectl" --socket "$work/$broker/s.sock" ping --wait 10 >/dev/null
done
echo "== brokers a and b ready"
a=("$bin/storectl" --socket "$work/a/s.sock")
b=("$bin/storectl" --socket "$work/b/s.sock")

"${b[@]}" watch notes >"$work/watch-b.out" &
pids+=($!)
"${a[@]}" watch notes >"$work/watch-a.out" &
pids+=($!)
sleep 0.5
echo "\$ storectl (a) insert notes milk";  "${a[@]}" insert notes '{"id":"1","text":"milk"}'
echo "\$ storectl (b) insert notes eggs";  "${b[@]}" insert notes '{"id":"2","text":"eggs"}'
echo "\$ storectl (a) remove notes 1";     "${a[@]}" remove notes 1
echo "\$ storectl (b) value set theme dark, read through a"
"${b[@]}" value set theme '"dark"' >/dev/null
sleep 0.5
"${a[@]}" value get theme
sleep 0.5
echo "== what b's watcher printed:"
cat "$work/watch-b.out"
if diff <(grep -v '"op":"loaded"' "$work/watch-a.out") <(grep -v '"op":"loaded"' "$work/watch-b.out") >/dev/null; then
    echo "== a's watcher printed the same events, in the same order"
else
    echo "== the watchers differ:"; diff "$work/watch-a.out" "$work/watch-b.out" || true; exit 1
fi
echo "\$ storectl (b) query notes"; "${b[@]}" query notes
