#!/usr/bin/env python3
"""Seed corpora for the fuzz targets from the protocol's test vectors (docs/protocol-vectors.json).

    python3 Fuzz/seeds.py docs/protocol-vectors.json OUTDIR

writes OUTDIR/FuzzFrames, OUTDIR/FuzzMessages and OUTDIR/FuzzServerSession, one file per seed.
"""
import json
import os
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
