# Builds and drops dicts of N strings of 1-300 bytes, in PHASES phases: the
# python3 workload of docs/benchmarks.md, "python3: dicts of strings". Run
# with PYTHONMALLOC=malloc so that every object goes through malloc:
#   env LD_PRELOAD=target/release/libpagewise.so PYTHONMALLOC=malloc \
#       python3 scripts/python_dict_phases.py 200000 8
import random
import sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
PHASES = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rng = random.Random(1)
base = "".join(chr(97 + rng.randrange(26)) for _ in range(4096))
total = 0
for phase in range(PHASES):
    d = {}
    for i in range(N):
        n = rng.randrange(1, 301)
        o = rng.randrange(0, 4096 - n)
        d["k%d_%d" % (phase, i)] = base[o:o + n]
    total += sum(len(v) for v in d.values())
    del d
print(total)
