#!/bin/bash
# Peak RSS of peers' own thread-churn test programs under five allocators:
# mimalloc-bench's larson server (and its sized-free build) and mimalloc's
# test-stress, each run with LD_PRELOAD, interleaved (glibc jemalloc
# mimalloc tcmalloc pagewise, then again), medians of RUNS runs.
#
#   git clone https://github.com/daanx/mimalloc-bench   # bench/larson/larson.cpp
#   git clone https://github.com/microsoft/mimalloc      # test/test-stress.c
#   cargo build --release -p pagewise-c
#   scripts/peer-churn.sh mimalloc-bench mimalloc [RUNS=3] [OUT=/tmp/peer-churn]
#
# Other programs: PROGRAMS="stress 64;stress" (';' between them).
# Extra allocators: EXTRA="label=/path/lib.so ..." (e.g. an older pagewise).
# Prints one line per program and allocator: median peak RSS (KiB, from
# /usr/bin/time -f %M) and median wall seconds, with every run's RSS.
set -eu
bench=$1; mi=$2; runs=${3:-3}; out=${4:-/tmp/peer-churn}
lib=/usr/lib/$(gcc -dumpmachine)
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
g++ -O2 -DCPP=1 -Wno-unused-result -o "$out/larson" "$bench/bench/larson/larson.cpp" -lpthread
g++ -O2 -DCPP=1 -DSIZED=1 -fsized-deallocation -Wno-unused-result \
    -o "$out/larson-sized" "$bench/bench/larson/larson.cpp" -lpthread
gcc -O2 -DUSE_STD_MALLOC -DNDEBUG -o "$out/stress" "$mi/test/test-stress.c" -lpthread
allocs="glibc= jemalloc=$lib/libjemalloc.so.2 mimalloc=$lib/libmimalloc.so.2"
allocs="$allocs tcmalloc=$lib/libtcmalloc_minimal.so.4 pagewise=$here/target/release/libpagewise.so"
allocs="$allocs ${EXTRA:-}"
programs=(
  "larson 5 8 1000 5000 100 4141 2"          # mimalloc-bench's larsonN at 2 threads
  "larson-sized 5 8 1000 5000 100 4141 2"
  "stress"                                    # 32 threads, scale 50, 50 rounds (the defaults)
  "stress 64"                                 # 64 threads
  "stress 4 200 20"                           # 4 threads, larger objects (scale > 100)
)
# PROGRAMS="stress 64;larson 5 8 1000 5000 100 4141 2" runs those instead.
if [ -n "${PROGRAMS:-}" ]; then IFS=';' read -r -a programs <<< "$PROGRAMS"; fi
for prog in "${programs[@]}"; do
  declare -A rss=() secs=()
  for i in $(seq "$runs"); do
    for a in $allocs; do
      name=${a%%=*}; so=${a#*=}
      r=$(cd "$out" && { LD_PRELOAD=$so nice -n 10 /usr/bin/time -f "RSS %M %e" ./$prog >/dev/null; } 2>&1 | grep '^RSS')
      rss[$name]="${rss[$name]:-} $(echo "$r" | cut -d' ' -f2)"
      secs[$name]="${secs[$name]:-} $(echo "$r" | cut -d' ' -f3)"
    done
  done
  for a in $allocs; do
    name=${a%%=*}
    med() { echo $1 | tr ' ' '\n' | sort -n | sed -n "$(( (runs + 1) / 2 ))p"; }
    printf '%-40s %-10s peak %7s KiB  %6s s   (%s)\n' "$prog" "$name" \
      "$(med "${rss[$name]}")" "$(med "${secs[$name]}")" "${rss[$name]# }"
  done
  unset rss secs
done
