#!/usr/bin/env python3
"""A second, independent decoder of the storebroker protocol, written from docs/PROTOCOL.md alone.

It decodes every vector in docs/protocol-vectors.json and checks that the result equals the vector's body, so
the document, the vectors and the Swift implementation cannot drift apart unnoticed. Standard library only.

Usage: check_vectors.py docs/protocol-vectors.json
"""
import json
import struct
import sys


class Malformed(Exception):
    pass


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise Malformed("truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self):
        return self.take(1)[0]

    def u16(self):
        return struct.unpack(">H", self.take(2))[0]

    def u32(self):
        return struct.unpack(">I", self.take(4))[0]

    def u64(self):
        return struct.unpack(">Q", self.take(8))[0]

    def boolean(self):
        v = self.u8()
        if v not in (0, 1):
            raise Malformed("bool")
        return v == 1

    def text(self):
        return self.take(self.u16()).decode("utf-8")  # strict: invalid UTF-8 raises

    def bytes_hex(self):
        return self.take(self.u32()).hex()

    def list_of(self, element, min_size):
        count = self.u32()
        if count * min_size > len(self.data) - self.pos:
            raise Malformed("count larger than the bytes left")
        return [element(self) for _ in range(count)]

    def done(self):
        if self.pos != len(self.data):
            raise Malformed("trailing bytes")


# Composite types (PROTOCOL.md section 5). Tagged types become {"caseName": {fields}} as in the JSON vectors.

def condition(r):
    tag = r.u8()
    if tag == 0:
        return {"unconditional": {}}
    if tag == 1:
        return {"sequence": {"_0": r.u64()}}
    if tag == 2:
        return {"absent": {}}
    if tag == 3:
        return {"epochSequence": {"epoch": r.u64(), "sequence": r.u64()}}
    raise Malformed("condition tag")


def cursor(r):
    return r.text() if r.boolean() else None


def start(r):
    tag = r.u8()
    if tag == 0:
        return {"snapshot": {}}
    if tag == 1:
        return {"resume": {"epoch": r.u64(), "sequence": r.u64()}}
    raise Malformed("start tag")


def value_state(r):
    tag = r.u8()
    if tag == 0:
        return {"unset": {}}
    if tag == 1:
        return {"set": {"_0": r.bytes_hex()}}
    if tag == 2:
        return {"setWithheld": {}}
    raise Malformed("value state tag")


def item(r):
    return {"id": r.text(), "payload": r.bytes_hex()}


def record(r):
    return {"id": r.text(), "createdAt": r.u64(), "updatedAt": r.u64(), "payload": r.bytes_hex()}


def slot(r):
    if r.boolean():
        return {"present": {"_0": record(r)}}
    return {"missing": {"_0": r.text()}}


def chain_step(r):
    op = r.u8()
    if op == 1:
        return {"insert": {"items": r.list_of(item, 6)}}
    if op == 2:
        return {"remove": {"ids": r.list_of(Reader.text, 2)}}
    if op == 3:
        return {"removeAll": {}}
    raise Malformed("chain op")


def event_step(r):
    op = r.u8()
    if op == 1:
        return {"insert": {"records": r.list_of(record, 22)}}
    if op == 2:
        return {"remove": {"ids": r.list_of(Reader.text, 2)}}
    raise Malformed("event op")


def store_info(r):
    return {"name": r.text(), "epoch": r.u64(), "sequence": r.u64(), "count": r.u64(), "engine": r.text()}


def value_info(r):
    return {"name": r.text(), "epoch": r.u64(), "sequence": r.u64(), "isSet": r.boolean()}


def engine_info(r):
    info = {"name": r.text(), "path": r.text(), "status": r.u8(), "abiMajor": r.u16(), "abiMinor": r.u16(),
            "capabilities": r.u32(), "detail": r.text()}
    if info["status"] > 2:
        raise Malformed("engine status")
    return info


def hello(r):
    if r.take(4) != b"SBRK":
        raise Malformed("magic")
    n = r.u8()
    return {"versions": [r.u16() for _ in range(n)], "clientName": r.text()}


def namespace(r):
    v = r.u8()
    if v > 2:
        raise Malformed("namespace")
    return v


def seq_list(element, size):
    return lambda r: {"epoch": r.u64(), "sequence": r.u64(), "elements": r.list_of(element, size)}


def epoch_seq(r):
    return {"epoch": r.u64(), "sequence": r.u64()}


def value_msg(r):
    return {"epoch": r.u64(), "sequence": r.u64(), "state": value_state(r)}


def code_msg(r):
    return {"code": r.u16(), "message": r.text()}


# Message types (PROTOCOL.md section 7): name and payload decoder; True where the message may span frames.
MESSAGES = {
    0x01: ("hello", hello, False),
    0x10: ("ping", lambda r: {}, False),
    0x11: ("listStores", lambda r: {}, False),
    0x12: ("listEngines", lambda r: {}, False),
    0x13: ("getStoreInfo", lambda r: {"store": r.text()}, False),
    0x14: ("insert", lambda r: {"store": r.text(), "condition": condition(r), "elements": r.list_of(item, 6)}, False),
    0x15: ("remove", lambda r: {"store": r.text(), "condition": condition(r), "elements": r.list_of(Reader.text, 2)},
           False),
    0x16: ("removeAll", lambda r: {"store": r.text(), "condition": condition(r)}, False),
    0x17: ("drop", lambda r: {"store": r.text(), "condition": condition(r)}, False),
    0x18: ("chain", lambda r: {"store": r.text(), "condition": condition(r), "elements": r.list_of(chain_step, 1)},
           False),
    0x19: ("getItems", lambda r: {"store": r.text(), "ids": r.list_of(Reader.text, 2)}, False),
    0x1A: ("queryRange", lambda r: {"store": r.text(), "after": cursor(r), "limit": r.u32()}, False),
    0x1B: ("count", lambda r: {"store": r.text()}, False),
    0x1C: ("listIDs", lambda r: {"store": r.text(), "after": cursor(r), "limit": r.u32()}, False),
    0x1D: ("subscribe", lambda r: {"namespace": namespace(r), "name": r.text(), "start": start(r)}, False),
    0x1E: ("unsubscribe", lambda r: {"subscriptionID": r.u32()}, False),
    0x20: ("getValue", lambda r: {"namespace": namespace(r), "name": r.text()}, False),
    0x21: ("setValue", lambda r: {"namespace": namespace(r), "name": r.text(), "condition": condition(r),
                                  "value": r.bytes_hex()}, False),
    0x22: ("resetValue", lambda r: {"namespace": namespace(r), "name": r.text(), "condition": condition(r)}, False),
    0x23: ("listValues", lambda r: {"namespace": namespace(r)}, False),
    0x24: ("quietChain", lambda r: {"subscriptionID": r.u32(), "store": r.text(), "condition": condition(r),
                                    "elements": r.list_of(chain_step, 1)}, False),
    0x40: ("welcome", lambda r: {"version": r.u16(), "serverVersion": r.text(), "maxFrameLength": r.u32(),
                                 "maxItemLength": r.u32(), "maxBatch": r.u32(), "maxInFlight": r.u32()}, False),
    0x41: ("pong", lambda r: {}, False),
    0x42: ("storeList", lambda r: {"elements": r.list_of(store_info, 28)}, True),
    0x43: ("engineList", lambda r: {"elements": r.list_of(engine_info, 15)}, True),
    0x44: ("storeInfoResult", lambda r: {"info": store_info(r)}, False),
    0x45: ("writeResult", lambda r: {"committed": r.boolean(), "epoch": r.u64(), "sequence": r.u64()}, False),
    0x46: ("itemsResult", seq_list(slot, 3), True),
    0x47: ("rangeResult", seq_list(record, 22), True),
    0x48: ("countResult", lambda r: {"epoch": r.u64(), "sequence": r.u64(), "count": r.u64()}, False),
    0x49: ("idList", seq_list(Reader.text, 2), True),
    0x4A: ("subscribed", lambda r: {"subscriptionID": r.u32()}, False),
    0x4B: ("unsubscribed", lambda r: {"subscriptionID": r.u32()}, False),
    0x4C: ("valueResult", value_msg, False),
    0x4D: ("valueList", lambda r: {"elements": r.list_of(value_info, 19)}, True),
    0x7F: ("error", code_msg, False),
    0x80: ("storeLoaded", lambda r: {"epoch": r.u64(), "sequence": r.u64(), "count": r.u64(),
                                     "elements": r.list_of(record, 22)}, True),
    0x81: ("storeEvent", seq_list(event_step, 5), True),
    0x82: ("valueLoaded", value_msg, False),
    0x83: ("valueEvent", value_msg, False),
    0x84: ("lagged", epoch_seq, False),
    0x85: ("historyGone", epoch_seq, False),
    0x86: ("dropped", epoch_seq, False),
    0xBF: ("goodbye", code_msg, False),
}


def decode_stream(data):
    """Yields (id, type name, body) for each whole message; joins frames flagged 'more'."""
    pos = 0
    pending = {}
    while pos < len(data):
        if len(data) - pos < 12:
            raise Malformed("stream ends inside a header")
        length, mtype, flags, reserved, ident = struct.unpack(">IBBHI", data[pos:pos + 12])
        if reserved != 0 or flags & ~0x01:
            raise Malformed("reserved bits")
        payload = data[pos + 12:pos + 12 + length]
        if len(payload) != length:
            raise Malformed("stream ends inside a payload")
        pos += 12 + length
        if mtype not in MESSAGES:
            raise Malformed("unknown type 0x%02x" % mtype)
        name, decode, spans = MESSAGES[mtype]
        more = bool(flags & 0x01)
        if more and not spans:
            raise Malformed("more flag on " + name)
        r = Reader(payload)
        body = decode(r)
        r.done()
        key = (mtype >= 0x80, ident)
        if key in pending:
            first_name, first = pending.pop(key)
            head = {k: v for k, v in first.items() if k != "elements"}
            if first_name != name or head != {k: v for k, v in body.items() if k != "elements"}:
                raise Malformed("continuation does not match")
            first["elements"] += body["elements"]
            body = first
        if more:
            pending[key] = (name, body)
        else:
            yield ident, name, body
    if pending:
        raise Malformed("stream ends before the last frame")


def normalize(value):
    """The JSON vectors omit absent optionals; drop None the same way."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def main(path):
    with open(path) as f:
        vectors = json.load(f)["vectors"]
    failures = 0
    for vector in vectors:
        try:
            messages = list(decode_stream(bytes.fromhex(vector["hex"])))
            assert len(messages) == 1, "%d messages" % len(messages)
            ident, name, body = messages[0]
            assert name == vector["type"], "type %s != %s" % (name, vector["type"])
            assert ident == vector["id"], "id %d != %d" % (ident, vector["id"])
            assert normalize(body) == vector["body"], "body %s != %s" % (normalize(body), vector["body"])
        except (AssertionError, Malformed, UnicodeDecodeError) as error:
            failures += 1
            print("FAIL %s: %s" % (vector["name"], error))
    types = {v["type"] for v in vectors}
    missing = sorted(name for name, _, _ in MESSAGES.values() if name not in types)
    if missing:
        failures += 1
        print("FAIL no vector for: " + ", ".join(missing))
    print("check_vectors: %d passed, %d failed" % (len(vectors) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/protocol-vectors.json"))
