#!/bin/bash
# What meshing costs in speed, and why: each of the bench's growing
# workloads under the pagewise worker, meshing on and off, and off without
# huge pages (the fault count meshing had before its own pages got huge
# pages, and has under PAGEWISE_THP=never), interleaved, RUNS times. One line per run: throughput of the
# timed workload (ops/s from the worker's JSON), then user and system CPU
# seconds and minor page faults of the whole process (/usr/bin/time).
#
#   cargo build --release -p pagewise-bench
#   scripts/mesh-cost.sh [RUNS=5] [WORKLOADS="phases survivors-sparse"] [SCALE=full]
#
# With REDIS=1, redis-server instead (cargo build --release -p pagewise-c;
# redis-server and redis-benchmark installed): the server under
# libpagewise.so on 127.0.0.1 (PORT, 7399), driven by redis-benchmark; one
# line per run with its throughput per command and the server's minor
# faults and CPU (clock ticks, /proc/PID/stat).
#
# Meshing on against off without huge pages is the cost of shared memory
# per fault (same fault count); off against off without huge pages is what
# huge pages change on this host. The fourth line of each round, "private",
# is meshing on under `ulimit -f 1`, where the page source cannot have its
# memfd files and takes private memory instead: everything meshing does
# but the shared memory. PAGEWISE_BACKGROUND=0 with meshing on adds no pass
# at all (the heap grows throughout, so none runs anyway).
#
# The settings' order is rotated from round to round: on a shared machine
# a setting's place in the round moved its median by a fifth, more than
# the difference being measured.
set -eu
runs=${1:-5}
workloads=${2:-phases survivors-sparse}
scale=${3:-full}
here=$(cd "$(dirname "$0")/.." && pwd)
w=${WORKER:-$here/target/release/pagewise-bench-worker-pagewise}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
settings=("PAGEWISE_MESH=1" "PAGEWISE_MESH=0" "PAGEWISE_MESH=0 PAGEWISE_THP=never")
if [ "${REDIS:-0}" = 1 ]; then
    lib=$here/target/release/libpagewise.so
    port=${PORT:-7399}
    for round in $(seq 0 $((runs - 1))); do
        for k in "${!settings[@]}"; do
            s=${settings[$(((k + round) % ${#settings[@]}))]}
            # shellcheck disable=SC2086 # $s is several assignments
            env $s LD_PRELOAD="$lib" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
            pid=$!
            for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
            rps=$(redis-benchmark -p "$port" -t set,get,lpush,lpop -n 300000 -r 1000000 -d 512 -P 16 -q 2>/dev/null |
                tr '\r' '\n' | grep "requests per second" | awk '{printf "%s %s ", $1, $2}')
            read -r -a st <"/proc/$pid/stat"
            echo "redis $s | $rps| faults ${st[9]} user ${st[13]} sys ${st[14]} ticks"
            kill "$pid"
            wait "$pid" 2>/dev/null || true
        done
    done
    exit 0
fi
all=("${settings[@]}" private)
for round in $(seq 0 $((runs - 1))); do
    for wl in $workloads; do
        for k in "${!all[@]}"; do
            s=${all[$(((k + round) % ${#all[@]}))]}
            if [ "$s" = private ]; then
                # The worker's output goes through a pipe: a file would
                # meet the limit too.
                PAGEWISE_MESH=1 /usr/bin/time -f "%U %S %R" -o "$tmp/time" \
                    sh -c 'ulimit -f 1; exec "$0" "$@" 2>/dev/null' "$w" "$wl" "$scale" --idle-ms 0 | cat >"$tmp/json"
            else
                # shellcheck disable=SC2086 # $s is several assignments
                env $s /usr/bin/time -f "%U %S %R" -o "$tmp/time" "$w" "$wl" "$scale" --idle-ms 0 >"$tmp/json" 2>/dev/null
            fi
            python3 - "$tmp/json" "$tmp/time" "$wl" "$s" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
user, sys_s, faults = open(sys.argv[2]).read().split()
print(f"{sys.argv[3]:18} {sys.argv[4]:36} {j['ops'] / j['elapsed_ns'] * 1e3:6.2f} Mops/s  user {user}  sys {sys_s}  faults {faults}")
EOF
        done
    done
done
