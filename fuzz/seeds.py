#!/usr/bin/env python3
"""Writes starting inputs for the fuzz targets (how fuzz/corpus/ began).

    python3 fuzz/seeds.py OUT_DIR     # writes OUT_DIR/<target>/seed-*

Every byte string is a valid input (see fuzz/src/lib.rs), so most seeds are
random programs long enough to reach deep states (full thread caches, many
pages, retained spans) that libFuzzer's short early inputs do not; a few are
scenarios spelled out with the targets' encodings. The committed corpus is
what `cargo fuzz cmin` kept after fuzzing from these.
"""
import os
import random
import struct
import sys

TARGETS = ["global_alloc", "heap", "arena", "pool"]


def u16(x):
    return struct.pack("<H", x & 0xFFFF)


def u32(x):
    return struct.pack("<I", x & 0xFFFFFFFF)


# Size encodings of fuzz/src/lib.rs::size
def small(n):  # 1..=256
    return bytes([0, n - 1])


def huge(extra):  # 16 MiB + extra
    return bytes([255]) + u32(extra)


def edge(i):
    return bytes([208, i])


ALIGN_1 = bytes([0])
ALIGN_1M = bytes([196])  # 196 % 22 == 20
ALIGN_2M = bytes([197])  # 197 % 22 == 21


def global_scenarios():
    out = []
    # Small churn past the 128-slot thread cache, then free everything.
    s = b""
    for _ in range(300):
        s += bytes([0]) + small(48) + ALIGN_1
    s += (bytes([15, 63]) + (u16(0) + bytes([0])) * 63) * 5
    out.append(s)
    # A realloc chain from 1 byte up through every regime (GlobalAlloc and raw).
    s = bytes([0]) + small(1) + ALIGN_1
    for i in range(24):
        s += bytes([9]) + u16(0) + edge(i)
        s += bytes([10]) + u16(0) + edge(23 - i) + bytes([0])
    out.append(s)
    # Dirty large/huge memory, free it, then calloc/alloc_zeroed into it.
    s = b""
    for sz in (bytes([232, 3]) + u32(12345), huge(4096)):
        s += bytes([0]) + sz + ALIGN_1 + bytes([7]) + u16(0) + bytes([0])
        s += bytes([3]) + sz + ALIGN_1 + bytes([5]) + sz + ALIGN_1 + bytes([0])
    out.append(s)
    # Objects sent to the worker in batches, the worker restarted, trim.
    s = b""
    for _ in range(200):
        s += bytes([0]) + small(100) + ALIGN_1
    for _ in range(10):
        s += bytes([11, 15]) + u16(7) * 16
    s += bytes([14, 12, 13])
    out.append(s)
    return out


def random_input(rng, n):
    return bytes(rng.randrange(256) for _ in range(n))


def main():
    out = sys.argv[1]
    rng = random.Random(1)
    for t in TARGETS:
        d = os.path.join(out, t)
        os.makedirs(d, exist_ok=True)
        seeds = []
        for _ in range(24):
            seeds.append(random_input(rng, rng.choice([256, 1024, 4096])))
        if t == "global_alloc":
            seeds += global_scenarios()
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
                f.write(s)


if __name__ == "__main__":
    main()
