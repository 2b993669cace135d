# Phases that build and drop dicts, lists and strings: the python3 workload of
# the benchmarks (run with PYTHONMALLOC=malloc so every object goes through
# malloc; docs/benchmarks.md, "python3 with PYTHONMALLOC=malloc").
import sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
keep = []
total = 0
for r in range(ROUNDS):
    objs = []
    for i in range(N):
        d = {"name": "n%d" % i, "id": str(i * 7), "tags": [str(j) for j in range(i % 6)]}
        objs.append(d)
    # work over them (read phase)
    for d in objs:
        total += len(d["name"]) + len(d["tags"])
    # drop most, keep every 10th
    keep.extend(objs[::10])
    del objs
    # string phase
    s = [("abc%d" % i) * (i % 5 + 1) for i in range(N)]
    total += sum(len(x) for x in s)
    del s
    # list growth phase
    L = []
    for i in range(N // 4):
        L.append([i] * (i % 9))
    total += len(L)
    del L
    if len(keep) > N:
        keep = keep[len(keep) // 2:]
print(total, len(keep))
