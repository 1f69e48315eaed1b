"""Writes crafted `.pyebpf` files (issue 15) into the directory given: each is small and claims
far more than any recording holds. Protobuf is encoded by hand (schema:
sampler-user/src/saved/schema.rs), chunks as the format describes (sampler-user/src/saved/mod.rs).

Usage: python3 crafted_saved.py DIR
"""

import gzip
import os
import struct
import sys

MAGIC = b"\x89PYEBPF\n"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def packed(number, values):
    return field(number, b"".join(varint(v) for v in values))


def chunk(kind, message):
    body = gzip.compress(message, 9)
    return bytes([kind]) + struct.pack("<I", len(body)) + body


def batch(depth, samples, name=b"x"):
    """One frame named `name`, one stack of `depth` copies of it, `samples` samples on it."""
    frame = varint(1 << 3) + varint(4) + varint(2 << 3) + varint(0)  # NATIVE, name 0
    cols = b"".join(packed(f, [0] * samples) for f in range(1, 9))
    return field(4, name) + field(5, frame) + field(6, packed(1, [0] * depth)) + field(7, cols)


def v2(*chunks):
    start = chunk(1, field(1, b"pyebpf") + field(3, b""))
    return MAGIC + struct.pack("<I", 2) + start + b"".join(chunks)


def main():
    out = sys.argv[1]
    files = {
        # Millions of samples of one deep stack: `script` would print billions of lines.
        "many.pyebpf": v2(chunk(2, batch(1000, 3_000_000))),
        # A stack far deeper than any recording.
        "deep.pyebpf": v2(chunk(2, batch(200_000, 1))),
        # A decompression bomb: 300 MiB of zeros in one chunk.
        "bomb.pyebpf": v2(chunk(2, bytes(300 << 20))),
        # A chunk that claims 4 GiB.
        "claim.pyebpf": v2(bytes([2]) + struct.pack("<I", 0xFFFFFFFF) + b"x" * 100),
        # Version 1 (one message) with the same many samples.
        "many_v1.pyebpf": MAGIC
        + struct.pack("<I", 1)
        + gzip.compress(field(1, b"pyebpf") + field(3, b"") + batch(1000, 3_000_000), 9),
        # Long names in many deep unique stacks: the flame graph would be gigabytes.
        "wide.pyebpf": v2(
            chunk(
                2,
                field(4, b"n" * 60000)
                + field(5, varint(1 << 3) + varint(4) + varint(2 << 3) + varint(0))
                + b"".join(field(6, packed(1, [0] * (1000 - i))) for i in range(500))
                + field(7, b"".join(packed(f, [0]) for f in range(1, 9))),
            )
        ),
    }
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
