#!/usr/bin/env python3
"""Every workload of PRODUCT.md's speed section, storebroker and its counterpart side by side in one run.

Called by scripts/bench-side-by-side.sh (which installs redis, builds release and passes --bin). Each row is
the median of --runs runs that alternate which side goes first; the spread (min-max over the runs) is printed.
Prints one table with every ratio; unless --quick, rewrites the generated section of docs/BENCHMARKS.md
(between its markers) and docs/benchmarks-side-by-side.json. Standard library only.
"""
import argparse
import glob
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODEGA_READ_10K = 0.055  # s: Bodega's recorded read of 10,000 items on this kind of machine (not run here)


def log(message):
    print(message, file=sys.stderr, flush=True)


class Work:
    """A temporary directory for daemons, Redis and databases, removed at the end."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="sb-side-")
        self.processes = []

    def path(self, name):
        return os.path.join(self.directory, name)

    def spawn(self, arguments, log_name, cpu=None):
        out = open(self.path(log_name), "ab")
        process = subprocess.Popen(arguments, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=pinned(cpu) if cpu is not None else None)
        self.processes.append(process)
        return process

    def stop(self, process):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process in self.processes:
            self.processes.remove(process)

    def close(self):
        for process in list(self.processes):
            self.stop(process)
        shutil.rmtree(self.directory, ignore_errors=True)


def wait_for_socket(path, process, what):
    for _ in range(1200):
        if os.path.exists(path):
            return
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited at start-up")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not create {path}")


class Redis:
    def __init__(self, work, *config, cpu=None):
        self.work = work
        self.socket = work.path("redis.sock")
        data = work.path("redis-data")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.process = work.spawn(
            ["redis-server", "--port", "0", "--unixsocket", self.socket, "--dir", data, "--save", ""] + list(config),
            "redis.log", cpu=cpu)
        wait_for_socket(self.socket, self.process, "redis-server")

    def stop(self):
        self.work.stop(self.process)


class Postgres:
    """A private PostgreSQL server: a new cluster in the work directory, on a Unix socket only, with the
    server's default durability (fsync, synchronous_commit on). As root, it runs as the postgres user."""

    def __init__(self, work):
        self.work = work
        # A directory of its own (the server's user owns it; the brokers refuse a work directory that is not
        # theirs).
        self.directory = tempfile.mkdtemp(prefix="sb-pg-")
        versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
        if not versions:
            raise RuntimeError("no PostgreSQL server under /usr/lib/postgresql (scripts/setup.sh installs it)")
        bin_dir = os.path.dirname(versions[-1])
        prefix = []
        if os.getuid() == 0:
            import pwd
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
            prefix = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
        run(prefix + [os.path.join(bin_dir, "initdb"), "-D", os.path.join(self.directory, "data"), "-A", "trust",
                      "-U", "postgres", "-E", "UTF8", "--no-locale"])
        self.process = work.spawn(prefix + [os.path.join(bin_dir, "postgres"), "-D", os.path.join(self.directory, "data"),
                                            "-k", self.directory, "-p", "5432", "-c", "listen_addresses="], "postgres.log")
        wait_for_socket(os.path.join(self.directory, ".s.PGSQL.5432"), self.process, "postgres")
        time.sleep(0.5)
        self.conninfo = f"host={self.directory} port=5432 user=postgres dbname=postgres"

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        self.work.stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


class Broker:
    """storebrokerd (release) on a fresh socket and data directory."""

    def __init__(self, work, bin_dir, engine="memory", options=(), dbus=None, data=None, keep=False, cpu=None,
                 name="broker"):
        self.work = work
        self.bin = bin_dir
        self.socket = work.path(f"{name}.sock")
        self.data = data or work.path(f"{name}-data")
        if not keep:
            shutil.rmtree(self.data, ignore_errors=True)
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        arguments = [os.path.join(bin_dir, "storebrokerd"), "--socket", self.socket, "--data-dir", self.data,
                     "--engine", engine, "--log-level", "warning"]
        for option in options:
            arguments += ["--engine-option", option]
        arguments += ["--dbus-address", dbus] if dbus else ["--no-dbus"]
        self.started = time.monotonic()
        self.process = work.spawn(arguments, f"{name}.log", cpu=cpu)
        wait_for_socket(self.socket, self.process, "storebrokerd")

    def rss_bytes(self):
        return rss_of(self.process.pid)

    def stop(self):
        self.work.stop(self.process)


def rss_of(pid):
    """A process's resident memory in bytes, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(process):
    """User + system CPU time a process has used so far (all its threads), from /proc."""
    with open(f"/proc/{process.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# A Redis client that sends MSETs of COUNT random keys below KEYS, VALUE each, one at a time, until it is killed.
MSET_LOOP = """
import random, socket, sys
path, count, keys, value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
def command(arguments):
    out = [b"*%d\\r\\n" % len(arguments)]
    for argument in arguments:
        out.append(b"$%d\\r\\n%s\\r\\n" % (len(argument), argument))
    return b"".join(out)
commands = []
for _ in range(8):
    arguments = [b"MSET"]
    for _ in range(count):
        arguments += [b"big:%d" % random.randrange(keys), value]
    commands.append(command(arguments))
connection = socket.socket(socket.AF_UNIX)
connection.connect(path)
while True:
    for message in commands:
        connection.sendall(message)
        reply = b""
        while not reply.endswith(b"\\r\\n"):
            reply += connection.recv(64)
"""


def csv_rows(text):
    """redis-benchmark's (and storebroker-benchmark's) CSV: test -> {rps, p50, p99, max} (latencies in µs)."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip('"') for cell in line.split('","')]
        if len(cells) != 8 or cells[0] == "test":
            continue
        rows[cells[0]] = {"rps": float(cells[1]), "p50": float(cells[4]) * 1000, "p99": float(cells[6]) * 1000,
                          "max": float(cells[7]) * 1000}
    return rows


def pinned(cpu):
    """A `preexec_fn` that keeps a child process (and every thread it starts) on one core."""
    return lambda: os.sched_setaffinity(0, {cpu})


def placements(server):
    """Where a one-client round puts its client: on the core `server` is pinned to (the first this process may
    use), then on another, if there is one. [(label, cpu)]"""
    cpus = sorted(os.sched_getaffinity(0))
    return [(f"client on the {server}'s core", cpus[0])] + ([("client on another core", cpus[1])] if len(cpus) > 1 else [])


def paired(ours, theirs):
    """The median of paired rounds' ratios (each round's own against the counterpart's beside it)."""
    return statistics.median(a / b for a, b in zip(ours, theirs))


def run(arguments, timeout=900, preexec_fn=None):
    result = subprocess.run(arguments, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments[:6])}... failed ({result.returncode}): {result.stderr[-800:]}")
    return result.stdout


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin
        self.quick = args.quick
        # --quick makes one run of each row unless --runs says how many (to see the spread of a change).
        self.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
        self.rows = []
        self.work = Work()

    def n(self, full, quick):
        return quick if self.quick else full

    def ours(self, socket, *arguments, cpu=None):
        return csv_rows(run([os.path.join(self.bin, "storebroker-benchmark"), "-s", socket, "--csv"] + list(arguments),
                            preexec_fn=pinned(cpu) if cpu is not None else None))

    def redis(self, socket, *arguments, cpu=None):
        return csv_rows(run(["redis-benchmark", "-s", socket, "--csv"] + list(arguments),
                            preexec_fn=pinned(cpu) if cpu is not None else None))

    def pair(self, title, ours, theirs, metrics, runs=None):
        """Runs ours() and theirs() --runs times (or `runs`), alternating which goes first. Each returns
        {metric: value}; metrics: [(row name, metric, unit, better, counterpart name)]."""
        collected = {"ours": [], "theirs": []}
        for index in range(runs or self.runs):
            order = [("ours", ours), ("theirs", theirs)] if index % 2 == 0 else [("theirs", theirs), ("ours", ours)]
            for side, function in order:
                if function is not None:
                    collected[side].append(function())
        log(f"  {title}: done")
        for name, metric, unit, better, counterpart in metrics:
            our_values = [values[metric] for values in collected["ours"]]
            their_values = [values[metric] for values in collected["theirs"] if metric in values] if theirs else []
            self.add(name, our_values, their_values, unit, better, counterpart)

    def add(self, name, our_values, their_values, unit, better, counterpart, ratio=None):
        """A row: the medians of both sides and their ratio (or `ratio`, the median of paired rounds' ratios)."""
        row = {"row": name, "unit": unit, "better": better, "counterpart": counterpart,
               "ours": statistics.median(our_values), "ours_runs": our_values}
        if their_values:
            row["theirs"] = statistics.median(their_values)
            row["theirs_runs"] = their_values
            row["ratio"] = ratio if ratio is not None else (row["ours"] / row["theirs"] if row["theirs"] else None)
        self.rows.append(row)

    # --- the workloads ---

    def floor_and_shapes(self):
        requests = self.n(100_000, 20_000)
        single = self.n(20_000, 5_000)
        shapes = [
            ("1 client", ["-c", "1", "-n", str(single)]),
            ("1 client -P 16", ["-c", "1", "-P", "16", "-n", str(requests)]),
            ("50 clients", ["-c", "50", "-n", str(requests)]),
            ("50 clients -P 16", ["-c", "50", "-P", "16", "-n", str(requests * 2)]),
        ]
        for label, shape in shapes:
            # With 50 clients -P 16 each server's CPU per request is measured too (each test run on its own, Redis's
            # as well): what the daemon spends per request against what Redis spends, the accounting behind the
            # pipelined rows.
            per_request_cpu = label == "50 clients -P 16"
            count = int(shape[shape.index("-n") + 1])

            def ours(shape=shape, per_request_cpu=per_request_cpu, count=count):
                broker = Broker(self.work, self.bin, engine="memory")
                try:
                    values = {}
                    for test, arguments in [("ping", []), ("insert", ["-d", "200", "-r", "100000"]),
                                            ("get", ["-d", "200", "-r", "100000"])]:
                        before = cpu_seconds(broker.process)
                        rows = self.ours(broker.socket, "-t", test, *arguments, *shape)
                        if per_request_cpu:
                            values[f"{test}_cpu"] = (cpu_seconds(broker.process) - before) / count * 1e6
                        for metric, value in rows[test].items():
                            values[f"{test}_{metric}"] = value
                    return values
                finally:
                    broker.stop()

            def theirs(shape=shape, per_request_cpu=per_request_cpu, count=count):
                redis = Redis(self.work, "--appendonly", "no")
                try:
                    values = {}
                    runs = [("ping,set,get", None)] if not per_request_cpu else [
                        ("ping_mbulk", "ping"), ("set", "insert"), ("get", "get")]
                    for tests, test in runs:
                        before = cpu_seconds(redis.process)
                        rows = self.redis(redis.socket, "-t", tests, "-d", "200", "-r", "100000", *shape)
                        if test:
                            values[f"{test}_cpu"] = (cpu_seconds(redis.process) - before) / count * 1e6
                        for name, metric_test in [("PING_MBULK", "ping"), ("SET", "insert"), ("GET", "get")]:
                            for metric, value in rows.get(name, {}).items():
                                values[f"{metric_test}_{metric}"] = value
                    return values
                finally:
                    redis.stop()

            metrics = [(f"ping, {label}: requests/s", "ping_rps", "/s", "higher", "PING_MBULK"),
                       (f"insert, {label}: requests/s", "insert_rps", "/s", "higher", "SET"),
                       (f"get, {label}: requests/s", "get_rps", "/s", "higher", "GET")]
            if per_request_cpu:
                metrics += [(f"server CPU per request, {label}: ping", "ping_cpu", "µs", "lower", "Redis PING_MBULK"),
                            (f"server CPU per request, {label}: insert", "insert_cpu", "µs", "lower", "Redis SET"),
                            (f"server CPU per request, {label}: get", "get_cpu", "µs", "lower", "Redis GET")]
            if label == "1 client":
                metrics = [("ping, 1 client: p50", "ping_p50", "µs", "lower", "PING_MBULK"),
                           ("insert (memory), 1 client: p50", "insert_p50", "µs", "lower", "SET"),
                           ("insert (memory), 1 client: p99", "insert_p99", "µs", "lower", "SET"),
                           ("get, 1 client: p50", "get_p50", "µs", "lower", "GET"),
                           ("get, 1 client: p99", "get_p99", "µs", "lower", "GET")] + metrics
            self.pair(label, ours, theirs, metrics)

    def ping_floor(self):
        # One waiting client: ping, get and insert p50, ours against Redis's PING, GET and SET, and our get and
        # insert against our own ping (issue 14's targets). One run of each (the "1 client" rows above) moves by
        # more than the 5-10% a target allows here, and left to itself the kernel put the client beside the server
        # in some runs (a ping p50 of ~10 µs) and away from it in others (~80 µs). So: each server pinned to one
        # core and the client pinned to that core and to another in turn; on one daemon and one Redis, rounds of
        # ping, insert and get on both sides (4,000 requests each, the order turned round every round); each ratio
        # is the median of its rounds' ratios, each within one round and placement.
        count = str(self.n(4_000, 1_000))
        places = placements("server")
        tests = [("ping", "PING_MBULK", "ping_mbulk", "ping"), ("insert", "SET", "set", "insert (memory)"),
                 ("get", "GET", "get", "get")]
        ours = {(test, place): [] for test, *_ in tests for place, _ in places}
        theirs = {(test, place): [] for test, *_ in tests for place, _ in places}
        server_cpu = places[0][1]
        for run_index in range(self.runs):
            broker = Broker(self.work, self.bin, engine="memory", cpu=server_cpu)
            redis = Redis(self.work, "--appendonly", "no", cpu=server_cpu)
            try:
                self.ours(broker.socket, "-t", "insert", "-c", "1", "-d", "200", "-r", "100000", "-n", "2000")
                self.redis(redis.socket, "-t", "set", "-c", "1", "-d", "200", "-r", "100000", "-n", "2000")
                for round_index in range(self.n(5, 2)):
                    order = tests if (run_index + round_index) % 2 == 0 else tests[::-1]
                    for place, cpu in places:
                        for test, redis_name, redis_test, _ in order:
                            shape = ["-c", "1", "-d", "200", "-r", "100000", "-n", count]
                            ours[(test, place)].append(self.ours(broker.socket, "-t", test, *shape, cpu=cpu)[test]["p50"])
                            theirs[(test, place)].append(
                                self.redis(redis.socket, "-t", redis_test, *shape, cpu=cpu)[redis_name]["p50"])
            finally:
                broker.stop()
                redis.stop()
        log("  ping_floor: done")
        for place, _ in places:
            for test, redis_name, _, row in tests:
                self.add(f"{row}, 1 client: p50 ({place}; paired rounds)", ours[(test, place)], theirs[(test, place)],
                         "µs", "lower", f"Redis {redis_name} (same rounds and placement)",
                         ratio=paired(ours[(test, place)], theirs[(test, place)]))
            for test, _, _, row in tests[1:]:
                self.add(f"{row} against our ping, 1 client: p50 ({place}; paired rounds)", ours[(test, place)],
                         ours[("ping", place)], "µs", "lower", "our own ping (same rounds and placement)",
                         ratio=paired(ours[(test, place)], ours[("ping", place)]))

    def batch(self):
        requests = self.n(200, 40)
        value = "x" * 200

        def ours():
            broker = Broker(self.work, self.bin, engine="memory")
            try:
                rows = self.ours(broker.socket, "-t", "batch", "-b", "1000", "-d", "200", "-r", "10000000", "-c", "1",
                                 "-n", str(requests))
                return {"items": rows["batch"]["rps"] * 1000}
            finally:
                broker.stop()

        def theirs():
            redis = Redis(self.work, "--appendonly", "no")
            try:
                command = ["MSET"]
                for _ in range(1000):
                    command += ["key:__rand_int__", value]
                out = run(["redis-benchmark", "-s", redis.socket, "--csv", "-c", "1", "-n", str(requests),
                           "-r", "10000000"] + command)
                row = list(csv_rows(out).values())[0]
                return {"items": row["rps"] * 1000}
            finally:
                redis.stop()

        # One run of 200 batches lasts 0.2 s a side, where this VM's hiccups moved either side by a third (Redis
        # 0.82-1.27 M items/s within one run of the table): the median of 9 alternating runs, 4 s in all.
        self.pair("batch", ours, theirs, [("batch of 1,000 × 200 B (memory): items/s", "items", "/s", "higher",
                                           "MSET of 1,000")], runs=max(self.runs, self.n(9, 1)))

    def durable(self):
        single = self.n(5_000, 1_000)
        many = self.n(20_000, 5_000)
        for engine, synchronous, fsync in [(engine, synchronous, fsync) for engine in ["wal", "sqlite"]
                                           for synchronous, fsync in [("FULL", "always"), ("NORMAL", "everysec")]]:
            for label, shape in [("1 client", ["-c", "1", "-n", str(single)]), ("50 clients", ["-c", "50", "-n", str(many)])]:
                def ours(shape=shape, synchronous=synchronous, engine=engine):
                    return self.broker_inserts(engine, [f"{engine}.synchronous={synchronous}"], shape)

                def theirs(shape=shape, fsync=fsync):
                    redis = Redis(self.work, "--appendonly", "yes", "--appendfsync", fsync)
                    try:
                        row = self.redis(redis.socket, "-t", "set", "-d", "200", "-r", "1000000", *shape)["SET"]
                        return {"rps": row["rps"], "p50": row["p50"]}
                    finally:
                        redis.stop()

                counterpart = f"SET, appendfsync {fsync}"
                metrics = [(f"durable insert, {engine} {synchronous}, {label}: requests/s", "rps", "/s", "higher", counterpart)]
                if label == "1 client":
                    metrics.append((f"durable insert, {engine} {synchronous}, 1 client: p50", "p50", "µs", "lower", counterpart))
                self.pair(f"durable {engine} {synchronous} {label}", ours, theirs, metrics)

    def wal(self):
        """The wal engine against our memory engine of the same shape, in paired rounds (its targets isolate the
        engine's own cost), and the floor: a plain program appending a record of the same size (260 bytes: a
        200-byte item's record) with one fdatasync each, so that the distance to the disk shows."""
        single = self.n(5_000, 1_000)
        many = self.n(20_000, 5_000)
        for synchronous in ["FULL", "NORMAL"]:
            for label, shape in [("1 client", ["-c", "1", "-n", str(single)]), ("50 clients", ["-c", "50", "-n", str(many)])]:
                def ours(shape=shape, synchronous=synchronous):
                    return self.broker_inserts("wal", [f"wal.synchronous={synchronous}"], shape)

                def theirs(shape=shape):
                    return self.broker_inserts("memory", [], shape)

                metrics = [(f"wal {synchronous}, {label}: inserts/s against the memory engine", "rps", "/s", "higher",
                            "memory engine, same shape")]
                if label == "1 client":
                    metrics.append((f"wal {synchronous}, 1 client: insert p50 against the memory engine", "p50", "µs",
                                     "lower", "memory engine, same shape"))
                self.pair(f"wal {synchronous} {label}", ours, theirs, metrics)

        def floor():
            path = self.work.path("floor.log")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            record, latencies = b"x" * 260, []
            try:
                started = time.monotonic()
                for _ in range(single):
                    before = time.monotonic()
                    os.write(fd, record)
                    os.fdatasync(fd)
                    latencies.append((time.monotonic() - before) * 1e6)
                elapsed = time.monotonic() - started
            finally:
                os.close(fd)
                os.unlink(path)
            return {"p50": statistics.median(latencies), "rps": single / elapsed}

        floors = [floor() for _ in range(self.runs)]
        log("  floor: done")
        self.add("floor: 260-byte append + fdatasync (plain program): p50", [f["p50"] for f in floors], [], "µs",
                 "lower", "—")
        self.add("floor: 260-byte append + fdatasync (plain program): appends/s", [f["rps"] for f in floors], [], "/s",
                 "higher", "—")
        full = next(row for row in self.rows if row["row"] == "wal FULL, 1 client: insert p50 against the memory engine")
        budget = [memory + floor["p50"] + 25 for memory, floor in zip(full["theirs_runs"], floors)]
        self.add("wal FULL, 1 client: insert p50 against memory p50 + floor p50 + 25 µs", full["ours_runs"], budget,
                 "µs", "lower", "memory + floor + 25 µs (target ≤ 1.0×)")

    def broker_inserts(self, engine, options, shape):
        """Inserts of 200 bytes (random ids) into a fresh broker on `engine`: requests/s and p50."""
        broker = Broker(self.work, self.bin, engine=engine, options=options)
        try:
            row = self.ours(broker.socket, "-t", "insert", "-d", "200", "-r", "1000000", *shape)["insert"]
            return {"rps": row["rps"], "p50": row["p50"]}
        finally:
            broker.stop()

    def library(self):
        # Paired rounds on one daemon: the load generator, then each shape of the library, 1,000 sequential
        # inserts each, again and again; a shape's ratio is the median of its rounds' ratios (each against the
        # generator's round beside it), so the machine's drift between rounds moves both sides of a ratio alike.
        # The daemon is pinned to one core, and each round runs the generator and the library both on that core
        # and both on another: where the kernel puts a client decides its latency more than the client does (in
        # this project's VM a wake-up across cores cost 70-100 µs, on the same core a few), and left to itself
        # it put the one-threaded generator beside the daemon and the library's threads away from it.
        shapes = [("connection", "BrokerConnection insert p50"),
                  ("client_executor", "BrokerClient.send insert p50, task on client.executor, no JSON or mirror"),
                  ("remotestore", "RemoteStore.insert p50"),
                  ("remotestore_executor", "RemoteStore.insert p50, task on client.executor")]
        places = placements("daemon")
        rounds = {(name, place): [] for name, _ in shapes for place, _ in places}
        generator = {place: [] for place, _ in places}
        generator_cpu = {place: [] for place, _ in places}
        mirrors = []
        for _ in range(self.runs):
            broker = Broker(self.work, self.bin, engine="memory", cpu=places[0][1])
            try:
                for _ in range(self.n(5, 2)):
                    for place, cpu in places:
                        pin = pinned(cpu)
                        result = subprocess.run([os.path.join(self.bin, "storebroker-benchmark"), "-s", broker.socket,
                                                 "--csv", "-t", "insert", "-c", "1", "-d", "200", "-r", "100000", "-n",
                                                 "1000"], capture_output=True, text=True, timeout=900, check=True,
                                                preexec_fn=pin)
                        generator[place].append(csv_rows(result.stdout)["insert"]["p50"])
                        generator_cpu[place].append(float(re.search(r"client CPU ([0-9.]+)", result.stderr).group(1)))
                        out = run([os.path.join(self.bin, "broker-bench"), "--library", broker.socket, "--shapes",
                                   "connection,client_executor,remotestore,executor", "--count", "1000"], preexec_fn=pin)
                        values = {k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}
                        for name, _ in shapes:
                            rounds[(name, place)].append(
                                {key: values[f"{name}_{key}"] for key in ["p50_us", "cpu_us", "switches"]})
                out = run([os.path.join(self.bin, "broker-bench"), "--library", broker.socket, "--shapes", "mirror"])
                mirrors.append({k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())})
            finally:
                broker.stop()
        log("  library: done")
        for place, _ in places:
            for name, row in shapes:
                measured = rounds[(name, place)]
                p50s = [r["p50_us"] for r in measured]
                self.add(f"{row} (memory; {place})", p50s, generator[place], "µs", "lower",
                         "load generator insert p50 (paired rounds, same placement)",
                         ratio=paired(p50s, generator[place]))
                self.rows[-1]["client"] = (
                    f"client {statistics.median(r['cpu_us'] for r in measured):.0f} µs CPU and "
                    f"{statistics.median(r['switches'] for r in measured):.1f} context switches per insert; "
                    f"the generator {statistics.median(generator_cpu[place]):.0f} µs CPU")
        # An event applied to a 100,000-item mirror costs what it changes: the same rate as a 100-item mirror's.
        self.add("RemoteStore mirror of 100,000 items: events applied/s",
                 [r["mirror_100000_events_per_s"] for r in mirrors], [r["mirror_100_events_per_s"] for r in mirrors],
                 "/s", "higher", "a 100-item mirror")

    def four_writers(self):
        count = self.n(10_000, 2_000)
        # NORMAL: durable against a crash of the process; FULL: against power loss too (an fsync per commit, which
        # the broker shares among the writes of one group and four SQLite processes cannot).
        for synchronous in ["NORMAL", "FULL"]:
            self.four_writers_at(count, synchronous)

    def four_writers_at(self, count, synchronous):
        def ours():
            # Each writer waits for each acknowledgement (as each SQLite process waits for its commit), then
            # again with 16 requests in flight: still one acknowledged single-item insert each, as an app using
            # the client library asynchronously writes.
            figures = {}
            for metric, pipeline in [("seconds", "1"), ("pipelined", "16")]:
                broker = Broker(self.work, self.bin, engine="sqlite", options=[f"sqlite.synchronous={synchronous}"])
                try:
                    start = time.monotonic()
                    writers = [subprocess.Popen(
                        [os.path.join(self.bin, "storebroker-benchmark"), "-s", broker.socket, "--csv", "-t",
                         "insert", "-c", "1", "-P", pipeline, "-d", "200", "-r", "1000000000", "-n", str(count)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
                    if any(writer.wait() != 0 for writer in writers):
                        raise RuntimeError("a writer failed")
                    figures[metric] = time.monotonic() - start
                finally:
                    broker.stop()
            return figures

        def theirs():
            database = self.work.path("shared.sqlite3")
            for suffix in ["", "-wal", "-shm"]:
                if os.path.exists(database + suffix):
                    os.unlink(database + suffix)
            run([os.path.join(self.bin, "sqlite-direct"), "writer", database, "1", synchronous, "init"])
            start = time.monotonic()
            writers = [subprocess.Popen(
                [os.path.join(self.bin, "sqlite-direct"), "writer", database, str(count), synchronous, f"p{index}"],
                stdout=subprocess.DEVNULL) for index in range(4)]
            if any(writer.wait() != 0 for writer in writers):
                raise RuntimeError("a direct writer failed")
            seconds = time.monotonic() - start
            return {"seconds": seconds, "pipelined": seconds}

        self.pair(f"four writers {synchronous}", ours, theirs, [
            (f"4 writer processes × {count:,} single inserts (sqlite {synchronous}): total", "seconds", "s", "lower",
             "4 processes on one SQLite file"),
            (f"4 writer processes × {count:,} single inserts, 16 in flight each (sqlite {synchronous}): total",
             "pipelined", "s", "lower", "4 processes on one SQLite file")])

    def large_store(self):
        # A single insert into a store of 1,000,000 items against one into an empty store, same daemon, same
        # shape (memory engine, 1 client, new random ids): what the store's size adds to a write.
        count = 1_000_000
        requests = str(self.n(20_000, 5_000))

        def both():
            broker = Broker(self.work, self.bin, engine="memory")
            try:
                self.ours(broker.socket, "-t", "batch", "--sequential-ids", "-b", "1000", "-d", "200", "-c", "1",
                          "-P", "4", "-n", str(count // 1000), "--store", "large")
                large = self.ours(broker.socket, "-t", "insert", "-d", "200", "-r", "1000000000", "-c", "1",
                                  "-n", requests, "--store", "large")["insert"]
                empty = self.ours(broker.socket, "-t", "insert", "-d", "200", "-r", "1000000000", "-c", "1",
                                  "-n", requests, "--store", "empty")["insert"]
                # The slowest of 3,000 single inserts into a store of 1,047,000: one of them takes it past 2^20
                # items, where its index (and the memory engine's) doubles.
                self.ours(broker.socket, "-t", "batch", "--sequential-ids", "-b", "1000", "-d", "200", "-c", "1",
                          "-P", "4", "-n", "1047", "--store", "crossing")
                crossing = self.ours(broker.socket, "-t", "insert", "-d", "200", "-r", "1000000000", "-c", "1",
                                     "-n", "3000", "--store", "crossing")["insert"]
                return {"large": large["p50"], "empty": empty["p50"], "crossing": crossing["max"]}
            finally:
                broker.stop()

        collected = [both() for _ in range(self.runs)]
        log("  large store: done")
        self.add(f"insert p50 into a {count:,}-item store (memory)", [c["large"] for c in collected],
                 [c["empty"] for c in collected], "µs", "lower", "into an empty store (target ≤ 1.2×)")
        self.add("slowest of 3,000 inserts taking a store past 2^20 items (memory)", [c["crossing"] for c in collected],
                 [], "µs", "lower", "—")

    def batch_and_read(self):
        def ours():
            broker = Broker(self.work, self.bin, engine="sqlite")
            try:
                batch = self.ours(broker.socket, "-t", "batch", "-b", "5000", "-d", "1024", "-r", "1000000000",
                                  "-c", "1", "-n", "3")["batch"]
                read = self.ours(broker.socket, "-t", "range", "--range-limit", "0", "-r", "10000", "-d", "1024",
                                 "-c", "1", "-n", "20", "--store", "read")["range"]
                return {"batch": batch["p50"] / 1e6, "read": read["p50"] / 1e6}
            finally:
                broker.stop()

        def theirs():
            values = {}
            for name, arguments in [("batch", ["batch", "5000", "1024", "NORMAL"]), ("read", ["read", "10000", "1024"])]:
                database = self.work.path(f"direct-{name}.sqlite3")
                for suffix in ["", "-wal", "-shm"]:
                    if os.path.exists(database + suffix):
                        os.unlink(database + suffix)
                values[name] = float(run([os.path.join(self.bin, "sqlite-direct"), arguments[0], database] + arguments[1:]))
            return values

        self.pair("batch and read", ours, theirs, [
            ("durable batch of 5,000 × 1 KB (sqlite NORMAL)", "batch", "s", "lower", "in-process SQLite"),
            ("read 10,000 × 1 KB over the socket (sqlite)", "read", "s", "lower", "in-process SQLite read")])
        def wal_batch():
            broker = Broker(self.work, self.bin, engine="wal", options=["wal.synchronous=FULL"])
            try:
                batch = self.ours(broker.socket, "-t", "batch", "-b", "5000", "-d", "1024", "-r", "1000000000",
                                  "-c", "1", "-n", "3")["batch"]
                return {"batch": batch["p50"] / 1e6}
            finally:
                broker.stop()

        def sqlite_full_batch():
            database = self.work.path("direct-batch-full.sqlite3")
            for suffix in ["", "-wal", "-shm"]:
                if os.path.exists(database + suffix):
                    os.unlink(database + suffix)
            return {"batch": float(run([os.path.join(self.bin, "sqlite-direct"), "batch", database, "5000", "1024", "FULL"]))}

        self.pair("wal batch", wal_batch, sqlite_full_batch, [
            ("durable batch of 5,000 × 1 KB (wal FULL)", "batch", "s", "lower", "in-process SQLite FULL (target ≤ 0.5×)")])
        read = next(row for row in self.rows if row["row"].startswith("read 10,000"))
        self.add("read 10,000 × 1 KB over the socket (sqlite), against Bodega", read["ours_runs"],
                 [BODEGA_READ_10K], "s", "lower", "Bodega's recorded 0.055 s (not run; target ≤ 0.2×)")

    def fanout(self):
        commits = self.n(5000, 2000)

        def ours():
            broker = Broker(self.work, self.bin, engine="sqlite")
            try:
                row = self.ours(broker.socket, "-t", "fanout", "--subscribers", "32", "--rate", "1000",
                                "-n", str(commits), "-d", "200")["fanout"]
                return {"p50": row["p50"], "p99": row["p99"]}
            finally:
                broker.stop()

        self.pair("fan-out", ours, None, [
            ("fan-out, 1 writer at 1,000 commits/s, 32 subscribers: insert-to-delivery p50", "p50", "µs", "lower", "—"),
            ("fan-out, 1 writer at 1,000 commits/s, 32 subscribers: insert-to-delivery p99", "p99", "µs", "lower", "—")])

        # D-Bus on against off: writer throughput, 50 clients -P 16 (memory engine).
        bus_socket = self.work.path("bus")
        bus = self.work.spawn(["dbus-daemon", "--session", "--nofork", "--address=unix:path=" + bus_socket], "bus.log")
        wait_for_socket(bus_socket, bus, "dbus-daemon")
        requests = str(self.n(100_000, 20_000))

        def on():
            broker = Broker(self.work, self.bin, engine="memory", dbus="unix:path=" + bus_socket)
            try:
                return {"rps": self.ours(broker.socket, "-t", "insert", "-c", "50", "-P", "16", "-d", "200",
                                         "-r", "100000", "-n", requests)["insert"]["rps"]}
            finally:
                broker.stop()

        def off():
            broker = Broker(self.work, self.bin, engine="memory")
            try:
                return {"rps": self.ours(broker.socket, "-t", "insert", "-c", "50", "-P", "16", "-d", "200",
                                         "-r", "100000", "-n", requests)["insert"]["rps"]}
            finally:
                broker.stop()

        try:
            self.pair("D-Bus", on, off, [("insert, 50 clients -P 16, D-Bus signals on: requests/s", "rps", "/s",
                                          "higher", "D-Bus off")])
        finally:
            self.work.stop(bus)

    def distributed(self):
        """Brokers sharing stores through PostgreSQL (docs/DISTRIBUTED.md): durable inserts through the postgres
        engine against the sqlite engine (FULL: both on disk before the answer), and how long a commit through one
        broker takes to reach a subscriber of another."""
        server = Postgres(self.work)
        try:
            for label, shape in [("1 client", ["-c", "1", "-n", str(self.n(2_000, 500))]),
                                 ("50 clients", ["-c", "50", "-n", str(self.n(20_000, 5_000))])]:
                def ours(shape=shape):
                    return self.broker_inserts("postgres", [f"postgres.conninfo={server.conninfo}"], shape)

                def theirs(shape=shape):
                    return self.broker_inserts("sqlite", ["sqlite.synchronous=FULL"], shape)

                metrics = [(f"durable insert through postgres, {label}: requests/s", "rps", "/s", "higher",
                            "the sqlite engine, FULL")]
                if label == "1 client":
                    metrics.append(("durable insert through postgres, 1 client: p50", "p50", "µs", "lower",
                                    "the sqlite engine, FULL"))
                self.pair(f"postgres {label}", ours, theirs, metrics)

            commits = str(self.n(2_000, 500))

            def fanout(writer_socket, subscriber_socket):
                return self.ours(subscriber_socket, "-t", "fanout", "--writer-socket", writer_socket,
                                 "--subscribers", "4", "--rate", "200", "-n", commits, "-d", "200",
                                 "--store", f"fan-{time.monotonic_ns()}")["fanout"]

            def across():
                options = [f"postgres.conninfo={server.conninfo}"]
                a = Broker(self.work, self.bin, engine="postgres", options=options, name="broker-a")
                b = Broker(self.work, self.bin, engine="postgres", options=options, name="broker-b")
                try:
                    row = fanout(a.socket, b.socket)
                    return {"p50": row["p50"], "p99": row["p99"]}
                finally:
                    a.stop()
                    b.stop()

            def one():
                broker = Broker(self.work, self.bin, engine="postgres", options=[f"postgres.conninfo={server.conninfo}"])
                try:
                    row = fanout(broker.socket, broker.socket)
                    return {"p50": row["p50"], "p99": row["p99"]}
                finally:
                    broker.stop()

            self.pair("cross-broker latency", across, one, [
                ("cross-broker event latency, 200 commits/s through A, 4 subscribers on B: p50", "p50", "µs", "lower",
                 "writer and subscribers on one broker"),
                ("cross-broker event latency, 200 commits/s through A, 4 subscribers on B: p99", "p99", "µs", "lower",
                 "writer and subscribers on one broker")])
        finally:
            server.stop()

    def cold_start(self):
        sizes = [100_000] if self.quick else [100_000, 1_000_000]
        for engine, count in [(engine, count) for engine in ["sqlite", "wal"] for count in sizes]:
            data = self.work.path(f"cold-{engine}-{count}")
            broker = Broker(self.work, self.bin, engine=engine, data=data)
            try:
                self.ours(broker.socket, "-t", "batch", "--sequential-ids", "-b", "1000", "-d", "200", "-c", "1",
                          "-P", "4", "-n", str(count // 1000), "--store", "cold")
            finally:
                broker.stop()
            times, rss = [], []
            for _ in range(self.runs):
                broker = Broker(self.work, self.bin, engine=engine, data=data, keep=True)
                try:
                    while True:
                        result = subprocess.run([os.path.join(self.bin, "storectl"), "--socket", broker.socket,
                                                 "count", "cold"], capture_output=True, text=True)
                        if result.returncode == 0:
                            break
                        time.sleep(0.01)
                    times.append(time.monotonic() - broker.started)
                    if int(result.stdout) != count:
                        raise RuntimeError(f"cold start: count {result.stdout.strip()}, not {count}")
                    rss.append(broker.rss_bytes() / 2**20)
                finally:
                    broker.stop()
            log(f"  cold start {engine} {count:,}: done")
            payload_mib = count * 200 / 2**20
            self.add(f"cold start, {count:,} × 200 B ({engine}): exec to count answered", times, [], "s", "lower", "—")
            self.add(f"cold start, {count:,} × 200 B ({engine}): resident memory then", rss, [payload_mib], "MiB",
                     "lower", f"the payload, {payload_mib:.0f} MiB")

    def flood(self):
        """16 clients pipelining 100,000 requests each without reading (pings, then 200-byte inserts over 1,000
        ids), four waves each, a probe pinging meanwhile; resident memory 10 s after the last wave (scripts/flood.py)."""
        import flood
        requests = self.n(100_000, 20_000)
        settle = self.n(10.0, 2.0)
        results = {"ours": [], "theirs": []}
        for index in range(self.runs):
            order = ["ours", "theirs"] if index % 2 == 0 else ["theirs", "ours"]
            for side in order:
                if side == "ours":
                    server = Broker(self.work, self.bin, engine="memory")
                    socket_path, rss = server.socket, server.rss_bytes
                else:
                    server = Redis(self.work)
                    socket_path = server.socket
                    rss = lambda pid=server.process.pid: rss_of(pid)
                try:
                    start = rss()
                    pings = flood.flood("ours" if side == "ours" else "redis", socket_path, "ping", requests=requests,
                                        settle=0)
                    inserts = flood.flood("ours" if side == "ours" else "redis", socket_path, "insert",
                                          requests=requests, settle=settle)
                    results[side].append({"ping_p99": pings["probe_p99_ms"] * 1000,
                                          "insert_p99": inserts["probe_p99_ms"] * 1000,
                                          "ping_taken": 100 * pings["sent_bytes"] / pings["offered_bytes"],
                                          "insert_taken": 100 * inserts["sent_bytes"] / inserts["offered_bytes"],
                                          "rss_start": start / 2**20, "rss_after": rss() / 2**20})
                finally:
                    server.stop()
        log("  flood: done")
        for name, metric, unit, better in [
            ("16 clients flooding pipelined pings without reading, 4 waves: another client's ping p99", "ping_p99", "µs", "lower"),
            ("16 clients flooding pipelined 200 B inserts without reading, 4 waves: another client's ping p99",
             "insert_p99", "µs", "lower"),
            # The server that stops reading a flooder takes in less of the flood than one that answers it all:
            # the share taken in says which shape each latency and memory row measured.
            ("the same ping waves: share of the flooders' bytes the server took in", "ping_taken", "%", "higher"),
            ("the same insert waves: share of the flooders' bytes the server took in", "insert_taken", "%", "higher"),
            ("resident memory at start (memory engine)", "rss_start", "MiB", "lower"),
            (f"resident memory {settle:.0f} s after the last flooding wave (1,000 items kept)", "rss_after", "MiB", "lower"),
        ]:
            self.add(name, [r[metric] for r in results["ours"]], [r[metric] for r in results["theirs"]], unit, better,
                     "Redis, same clients")

    def isolation(self):
        """One client's gets on a store of 1,000 items while another client commits batches of 10,000 × 200 B into
        another store (ids below 200,000), against the same gets on Redis while another client's MSETs of 10,000
        run: how long a large commit keeps a read of another store waiting."""
        gets = self.n(20_000, 5_000)
        value = "x" * 200

        def measured(socket, loader, get):
            loader_process = subprocess.Popen(loader, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.3)  # the batches under way
                return get()
            finally:
                loader_process.kill()
                loader_process.wait()

        def ours():
            broker = Broker(self.work, self.bin, engine="memory")
            try:
                self.ours(broker.socket, "-t", "insert", "--store", "small", "-c", "1", "-P", "16", "-n", "1000",
                          "-d", "200", "-r", "1000", "--sequential-ids")
                loader = [os.path.join(self.bin, "storebroker-benchmark"), "-s", broker.socket, "-t", "batch",
                          "-b", "10000", "-c", "1", "-n", "1000000", "--store", "big", "-d", "200", "-r", "200000"]
                row = measured(broker.socket, loader, lambda: self.ours(
                    broker.socket, "-t", "get", "--store", "small", "-c", "1", "-n", str(gets), "-d", "200",
                    "-r", "1000")["get"])
                return {"p99": row["p99"], "max": row["max"]}
            finally:
                broker.stop()

        def theirs():
            redis = Redis(self.work, "--appendonly", "no")
            try:
                self.redis(redis.socket, "-t", "set", "-c", "1", "-P", "16", "-n", "1000", "-d", "200", "-r", "1000")
                # MSETs of 10,000 keys below 200,000 (redis-benchmark cannot: its command line would be 2 MB long).
                loader = [sys.executable, "-c", MSET_LOOP, redis.socket, "10000", "200000", value]
                row = measured(redis.socket, loader, lambda: list(self.redis(
                    redis.socket, "-t", "get", "-c", "1", "-n", str(gets), "-d", "200", "-r", "1000").values())[0])
                return {"p99": row["p99"], "max": row["max"]}
            finally:
                redis.stop()

        self.pair("isolation", ours, theirs, [
            ("1 client's get p99 on one store while another commits batches of 10,000 × 200 B into another",
             "p99", "µs", "lower", "Redis GET beside MSETs of 10,000"),
            ("the same gets: the slowest", "max", "µs", "lower", "Redis GET beside MSETs of 10,000"),
        ])

    def all(self):
        steps = [self.floor_and_shapes, self.ping_floor, self.batch, self.large_store, self.durable, self.wal, self.library,
                 self.four_writers, self.batch_and_read, self.fanout, self.flood, self.isolation, self.cold_start,
                 self.distributed]
        if self.args.only:
            wanted = self.args.only.split(",")
            unknown = [name for name in wanted if name not in [step.__name__ for step in steps]]
            if unknown:
                raise SystemExit(f"--only: no step {', '.join(unknown)} (steps: "
                                 f"{', '.join(step.__name__ for step in steps)})")
            steps = [step for step in steps if step.__name__ in wanted]
        try:
            for step in steps:
                log(f"{step.__name__} ...")
                step()
        finally:
            self.work.close()


def fmt(value, unit):
    if value is None:
        return "—"
    if unit in ("/s",):
        return f"{value:,.0f}"
    if unit == "µs":
        return f"{value:,.2f} µs" if value < 10 else f"{value:,.0f} µs"
    if unit == "s":
        return f"{value:.4f} s"
    return f"{value:,.1f} {unit}"


def spread(values, unit):
    if len(values) < 2:
        return ""
    return f"{fmt(min(values), unit)}–{fmt(max(values), unit)}"


def table(rows):
    lines = ["| workload | storebroker (spread) | counterpart | its figure (spread) | ratio |",
             "|---|---:|---|---:|---:|"]
    for row in rows:
        ratio = row.get("ratio")
        ratio_text = "—" if ratio is None else f"**{ratio:.2f}×** ({'lower' if row['better'] == 'lower' else 'higher'} is better)"
        ours = fmt(row["ours"], row["unit"])
        if spread(row["ours_runs"], row["unit"]):
            ours += f" ({spread(row['ours_runs'], row['unit'])})"
        theirs = fmt(row.get("theirs"), row["unit"])
        if spread(row.get("theirs_runs", []), row["unit"]):
            theirs += f" ({spread(row['theirs_runs'], row['unit'])})"
        name = row["row"] + (f" ({row['client']})" if "client" in row else "")
        lines.append(f"| {name} | {ours} | {row['counterpart']} | {theirs} | {ratio_text} |")
    return "\n".join(lines)


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:  # --only steps without Redis, run before bench-side-by-side.sh installed it
        redis = "no redis-server"
    return f"{os.cpu_count()} cores, {cpu}, Linux {platform.release()}; {redis.split(' sha=')[0]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bin", required=True, help="the release build's bin directory")
    parser.add_argument("--runs", type=int, default=None, help="runs of each row (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smaller runs, one each unless --runs, docs untouched (< 3 min)")
    parser.add_argument("--only", default=None,
                        help="comma-separated steps to run (e.g. batch,large_store), docs untouched")
    args = parser.parse_args()
    started = time.monotonic()
    bench = Bench(args)
    bench.all()
    elapsed = time.monotonic() - started
    command = "./scripts/bench-side-by-side.sh" + (" --quick" if args.quick else "")
    date = datetime.date.today().isoformat()
    text = table(bench.rows)
    print(text)
    print(f"\n{len(bench.rows)} rows, {bench.runs} run(s) each, {elapsed:.0f} s; {machine()}")
    if args.quick or args.only:
        return
    section = (f"<!-- side-by-side:begin (generated by {command}; edit outside the markers) -->\n"
               f"Machine: {machine()}. Command: `{command}`. Date: {date}. Each figure is the median of "
               f"{bench.runs} runs alternating which side goes first (the batch row's: of 9, a run of it lasts 0.2 s); the "
               f"spread is min–max over the runs.\n\n"
               f"{text}\n<!-- side-by-side:end -->")
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    with open(path) as document:
        content = document.read()
    pattern = re.compile(r"<!-- side-by-side:begin.*?<!-- side-by-side:end -->", re.S)
    content = pattern.sub(lambda _: section, content) if pattern.search(content) else content.rstrip() + "\n\n" + section + "\n"
    with open(path, "w") as document:
        document.write(content)
    with open(os.path.join(ROOT, "docs", "benchmarks-side-by-side.json"), "w") as out:
        json.dump({"date": date, "machine": machine(), "command": command, "runs": bench.runs, "rows": bench.rows},
                  out, indent=1, ensure_ascii=False)
        out.write("\n")
    log(f"wrote docs/BENCHMARKS.md (the generated section) and docs/benchmarks-side-by-side.json")


if __name__ == "__main__":
    main()
