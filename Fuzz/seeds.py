#!/usr/bin/env python3
"""Seed corpora for the fuzz targets from the protocol's test vectors (docs/protocol-vectors.json).

    python3 Fuzz/seeds.py docs/protocol-vectors.json OUTDIR

writes OUTDIR/FuzzFrames, OUTDIR/FuzzMessages, OUTDIR/FuzzServerSession and OUTDIR/FuzzWALRecords, one file
per seed.
"""
import json
import os
import struct
import sys

vectors = json.load(open(sys.argv[1]))["vectors"]
out = sys.argv[2]
frames = [bytes.fromhex(v["hex"]) for v in vectors]
client = [bytes.fromhex(v["hex"]) for v in vectors if v["direction"] == "client"]
hello = next(bytes.fromhex(v["hex"]) for v in vectors if v["type"] == "hello")

def write(target, seeds):
    directory = os.path.join(out, target)
    os.makedirs(directory, exist_ok=True)
    for index, seed in enumerate(seeds):
        with open(os.path.join(directory, f"seed-{index:03d}"), "wb") as f:
            f.write(seed)

# Whole frames, one per seed, and all of them in one stream.
write("FuzzFrames", frames + [b"".join(frames)])
# A message past the frame layer: its type byte, then its payload.
write("FuzzMessages", [frame[4:5] + frame[12:] for frame in frames])
# A client's stream: the piece size, the hello, then one request (and every request at once).
write("FuzzServerSession", [bytes([size]) + hello + frame for frame in client if frame != hello for size in (7, 63)]
      + [bytes([0]) + hello + b"".join(f for f in client if f != hello)])

# Log records of the wal engine (docs/ENGINE-ABI.md, "wal"): a put, a remove, a remove-all, and all of them in
# one segment's worth, each with its CRC-32C.
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF

def wal_record(sequence, steps):
    body = struct.pack("<QI", sequence, len(steps)) + b"".join(steps)
    return struct.pack("<QI", len(body), crc32c(body)) + body

put = bytes([1]) + struct.pack("<IIQQ", 2, 5, 1000, 2000) + b"k1" + b"hello"
remove = bytes([2]) + struct.pack("<I", 2) + b"k1"
remove_all = bytes([3])
records = [wal_record(1, [put]), wal_record(2, [remove, put]), wal_record(3, [remove_all, put, put]), wal_record(4, [])]
write("FuzzWALRecords", records + [b"".join(records)])
