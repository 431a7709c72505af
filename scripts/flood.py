"""Clients that pipeline without reading, against storebrokerd or Redis, with the same shape on both sides.

A wave: CLIENTS connections each write REQUESTS pipelined requests (pings, or 200-byte inserts over 1,000 ids) as
fast as their sockets take them and never read an answer; a connection whose socket has taken nothing for
STALL seconds stops writing (the server stopped reading it); then every connection closes. Meanwhile a probe
connection pings, one request at a time, and times each round trip. After the last wave the server's resident
memory is read once it has had SETTLE seconds.

Used by bench_side_by_side.py (the `flood` step); runnable alone:
    python3 scripts/flood.py ours|redis SOCKET [--kind ping|insert] [--waves 4] [--clients 16] [--requests 100000]
"""

import argparse
import select
import socket
import statistics
import struct
import threading
import time

PAYLOAD = b"x" * 200
IDS = 1000


# --- our protocol (docs/PROTOCOL.md): a 12-byte header (length, type, flags, reserved, id), then the payload ---

def _frame(message_type, payload, ident):
    return struct.pack(">IBBHI", len(payload), message_type, 0, 0, ident) + payload


def _text(value):
    data = value.encode()
    return struct.pack(">H", len(data)) + data


def _hello():
    return _frame(0x01, b"SBRK" + struct.pack(">BH", 1, 1) + _text("flood"), 0)


def _ours_requests(kind, count):
    """`count` requests, ids 1..count wrapping, as one bytes object (built from a block of 1,000)."""
    block = []
    for n in range(IDS):
        if kind == "ping":
            block.append(_frame(0x10, b"", n + 1))
        else:
            item = _text(f"key:{n:06d}") + struct.pack(">I", len(PAYLOAD)) + PAYLOAD
            block.append(_frame(0x14, _text("flood") + b"\x00" + struct.pack(">I", 1) + item, n + 1))
    block = b"".join(block)
    return block * (count // IDS) + block[: len(block) * (count % IDS) // IDS]


def _ours_connect(path):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    connection.sendall(_hello())
    header = _read_exactly(connection, 12)
    length = struct.unpack(">I", header[:4])[0]
    _read_exactly(connection, length)  # the welcome
    return connection


def _ours_ping(connection):
    connection.sendall(_frame(0x10, b"", 1))
    header = _read_exactly(connection, 12)
    _read_exactly(connection, struct.unpack(">I", header[:4])[0])


# --- Redis's protocol (RESP) ---

def _redis_requests(kind, count):
    block = []
    for n in range(IDS):
        if kind == "ping":
            block.append(b"*1\r\n$4\r\nPING\r\n")
        else:
            key = f"key:{n:06d}".encode()
            block.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(PAYLOAD), PAYLOAD))
    block = b"".join(block)
    return block * (count // IDS) + block[: len(block) * (count % IDS) // IDS]


def _redis_connect(path):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    return connection


def _redis_ping(connection):
    connection.sendall(b"*1\r\n$4\r\nPING\r\n")
    answer = b""
    while not answer.endswith(b"\r\n"):
        chunk = connection.recv(64)
        if not chunk:
            raise RuntimeError("redis closed the probe")
        answer += chunk


def _read_exactly(connection, count):
    out = b""
    while len(out) < count:
        chunk = connection.recv(count - len(out))
        if not chunk:
            raise RuntimeError("the server closed the connection")
        out += chunk
    return out


SIDES = {
    "ours": (_ours_connect, _ours_requests, _ours_ping),
    "redis": (_redis_connect, _redis_requests, _redis_ping),
}


def _wave(side, path, requests, clients, stall):
    connect = SIDES[side][0]
    connections = [connect(path) for _ in range(clients)]
    for connection in connections:
        connection.setblocking(False)
    sent = [0] * clients
    last_progress = [time.monotonic()] * clients
    active = set(range(clients))
    while active:
        _, writable, _ = select.select([], [connections[i] for i in active], [], 0.2)
        now = time.monotonic()
        ready = {connection.fileno() for connection in writable}
        for index in list(active):
            connection = connections[index]
            if connection.fileno() in ready:
                try:
                    count = connection.send(memoryview(requests)[sent[index]: sent[index] + 262144])
                except BlockingIOError:
                    count = 0
                except (BrokenPipeError, ConnectionResetError):
                    active.discard(index)
                    continue
                if count > 0:
                    sent[index] += count
                    last_progress[index] = now
            if sent[index] >= len(requests) or now - last_progress[index] > stall:
                active.discard(index)
    for connection in connections:
        connection.close()
    return sum(sent)


def flood(side, path, kind="ping", waves=4, clients=16, requests=100_000, stall=2.0, settle=10.0, rss=None):
    """Runs the waves with the probe; returns {"probe_p50_ms", "probe_p99_ms", "probe_max_ms", "rss_start",
    "rss_after", "sent_bytes", "offered_bytes"} (memory in bytes, read with `rss()` when given; `sent_bytes` of
    `offered_bytes` is what the server took in before the flooders stopped)."""
    connect, build, ping = SIDES[side]
    payload = build(kind, requests)
    start_rss = rss() if rss else 0
    probe = connect(path)
    latencies = []
    stop = threading.Event()

    def probing():
        while not stop.is_set():
            began = time.perf_counter()
            ping(probe)
            latencies.append((time.perf_counter() - began) * 1000)
            time.sleep(0.001)

    thread = threading.Thread(target=probing, daemon=True)
    thread.start()
    sent = 0
    try:
        for _ in range(waves):
            sent += _wave(side, path, payload, clients, stall)
    finally:
        stop.set()
        thread.join(timeout=30)
        probe.close()
    time.sleep(settle)
    if not latencies:
        raise RuntimeError("the probe got no answer during the waves")
    latencies.sort()
    return {
        "probe_p50_ms": statistics.median(latencies),
        "probe_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "probe_max_ms": latencies[-1],
        "rss_start": start_rss,
        "rss_after": rss() if rss else 0,
        "sent_bytes": sent,
        "offered_bytes": len(payload) * clients * waves,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=sorted(SIDES))
    parser.add_argument("socket")
    parser.add_argument("--kind", choices=["ping", "insert"], default="ping")
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--pid", type=int, help="the server's pid, to read its resident memory")
    args = parser.parse_args()

    def rss():
        with open(f"/proc/{args.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    result = flood(args.side, args.socket, args.kind, args.waves, args.clients, args.requests,
                   rss=rss if args.pid else None)
    for key, value in result.items():
        print(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}")


if __name__ == "__main__":
    main()
