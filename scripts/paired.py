#!/usr/bin/env python3
"""Times two commands in turn, A B A B ..., and prints the ratio A/B of
their CPU time (user + system, from the kernel's accounting of each
finished process) pair by pair: the median and the range. Pairs, rather
than two series, keep a comparison honest on a machine whose speed
drifts (other work, frequency changes).

    python3 scripts/paired.py -n 9 \\
        --a 'env LD_PRELOAD=target/release/libpagewise_secure.so sqlite3 :memory: < w.sql' \\
        --b 'env LD_PRELOAD=target/release/libpagewise.so sqlite3 :memory: < w.sql'

Each command runs through `sh -c`, its output thrown away; one warm-up
pair is not counted.
"""
import argparse
import os
import statistics
import subprocess
import sys


def cpu_seconds(command):
    p = subprocess.Popen(["sh", "-c", command], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        print(f"note: exit status {status >> 8} from: {command}", file=sys.stderr)
    return usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=9, help="counted pairs (9)")
    ap.add_argument("--a", required=True, help="command A")
    ap.add_argument("--b", required=True, help="command B")
    args = ap.parse_args()
    cpu_seconds(args.a)
    cpu_seconds(args.b)
    ratios, a_all, b_all = [], [], []
    for _ in range(args.n):
        a = cpu_seconds(args.a)
        b = cpu_seconds(args.b)
        a_all.append(a)
        b_all.append(b)
        ratios.append(a / b if b > 0 else float("inf"))
    med = statistics.median
    print(f"A cpu s   median {med(a_all):.3f}  min {min(a_all):.3f}  max {max(a_all):.3f}")
    print(f"B cpu s   median {med(b_all):.3f}  min {min(b_all):.3f}  max {max(b_all):.3f}")
    print(f"A/B cpu   median {med(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
