"""A protocol client written from docs/PROTOCOL.md alone, for tests that run as another user.

    python3 peer_client.py SOCKET OP [ARGS...]

OPs: count STORE | insert STORE ID JSON | list-stores | list-values NS | get-value NS NAME | set-value NS NAME JSON
(NS: 1 value, 2 secure value). Prints one line: "ok TYPE [detail]" or "error 0xCODE MESSAGE" (for an error
answer, or for an error with id 0 that closed the connection), and exits 0; exits 1 when the connection
fails otherwise.
"""
import socket
import struct
import sys


def text(value):
    data = value.encode()
    return struct.pack(">H", len(data)) + data


def frame(kind, ident, payload):
    return struct.pack(">IBBHI", len(payload), kind, 0, 0, ident) + payload


def read_exact(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise EOFError("the server closed the connection")
        data += chunk
    return data


def read_frame(sock):
    length, kind, flags, _reserved, ident = struct.unpack(">IBBHI", read_exact(sock, 12))
    return kind, flags, ident, read_exact(sock, length)


def report_error(payload):
    code = struct.unpack(">H", payload[:2])[0]
    size = struct.unpack(">H", payload[2:4])[0]
    print("error 0x%04x %s" % (code, payload[4 : 4 + size].decode()))


def text_at(payload, offset):
    """The text at offset, and the offset after it."""
    size = struct.unpack(">H", payload[offset : offset + 2])[0]
    return payload[offset + 2 : offset + 2 + size].decode(), offset + 2 + size


def list_names(payload, skip_after_name):
    """The first field (a text) of every element of a list frame; `skip_after_name(payload, offset)` returns the
    offset of the next element."""
    count = struct.unpack(">I", payload[:4])[0]
    offset, names = 4, []
    for _ in range(count):
        name, offset = text_at(payload, offset)
        names.append(name)
        offset = skip_after_name(payload, offset)
    return names


# List answers: their name, and how to skip the rest of an element after its name.
LISTS = {
    0x42: ("storeList", lambda payload, offset: text_at(payload, offset + 24)[1]),  # u64 x3, text engine
    0x4D: ("valueList", lambda payload, offset: offset + 17),  # u64 epoch, u64 sequence, u8 set
}


def main():
    path, op, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(frame(0x01, 0, b"SBRK" + bytes([1]) + struct.pack(">H", 1) + text("peer-client")))
    kind, _flags, _ident, payload = read_frame(sock)
    if kind == 0x7F:
        report_error(payload)
        return
    assert kind == 0x40, "expected welcome, got 0x%02x" % kind
    unconditional = bytes([0])
    if op == "count":
        request = frame(0x1B, 1, text(args[0]))
    elif op == "insert":
        item = text(args[1]) + struct.pack(">I", len(args[2].encode())) + args[2].encode()
        request = frame(0x14, 1, text(args[0]) + unconditional + struct.pack(">I", 1) + item)
    elif op == "list-stores":
        request = frame(0x11, 1, b"")
    elif op == "list-values":
        request = frame(0x23, 1, bytes([int(args[0])]))
    elif op == "get-value":
        request = frame(0x20, 1, bytes([int(args[0])]) + text(args[1]))
    elif op == "set-value":
        value = args[2].encode()
        request = frame(0x21, 1, bytes([int(args[0])]) + text(args[1]) + unconditional + struct.pack(">I", len(value)) + value)
    else:
        raise SystemExit("unknown op " + op)
    sock.sendall(request)
    names = []
    while True:
        kind, flags, _ident, payload = read_frame(sock)
        if kind == 0x7F:
            report_error(payload)
            return
        if kind in LISTS:  # storeList, valueList: collect the names of every frame
            name, skip_after_name = LISTS[kind]
            names += list_names(payload, skip_after_name)
            if flags & 1:
                continue
            print("ok %s %s" % (name, ",".join(names)))
            return
        if kind == 0x48:
            print("ok countResult %d" % struct.unpack(">Q", payload[16:24])[0])
        elif kind == 0x45:
            print("ok writeResult committed=%d sequence=%d" % (payload[0], struct.unpack(">Q", payload[9:17])[0]))
        else:
            print("ok 0x%02x" % kind)
        return


try:
    main()
except (EOFError, ConnectionError, OSError) as error:
    print("failed", error)
    sys.exit(1)
