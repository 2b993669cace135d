#!/usr/bin/env bash
# Mutation testing (cargo-mutants) over the allocator's hot files: each
# mutant (an operator swapped, a function body replaced by a constant or
# `()`) is applied to a copy of the real source, the crate rebuilt and the
# chosen tests run; a mutant the tests do not fail on is *missed*. The
# script fails on any missed mutant that `.cargo/mutants.toml` does not list
# as triaged (docs/testing.md, "Mutation testing").
#
#   bash .ci/mutants.sh                  # the CI set (below)
#   MUTANTS_FILES="crates/pagewise/src/heap/large.rs" bash .ci/mutants.sh
#   MUTANTS_JOBS=1 bash .ci/mutants.sh   # on a machine shared with others
#
# The set is fixed (every mutant of the files, in source order, minus the
# triaged ones): no sampling, so two runs of one tree test the same mutants.
# cargo-mutants leaves out `unsafe` functions and blocks (a mutant there could
# be undefined behaviour rather than a wrong answer): what it mutates is the
# safe code around them (keys, counts, offsets, limits, the decisions).
#
# Outcomes go to target/mutants/mutants.out/ (caught.txt, missed.txt,
# unviable.txt, timeout.txt; the diff of each mutant in diff/).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
VERSION=27.1.0
start=$(date +%s)

if [ "$(cargo mutants --version 2>/dev/null)" != "cargo-mutants $VERSION" ]; then
    echo "== installing cargo-mutants $VERSION"
    cargo install --locked cargo-mutants --version "$VERSION"
fi

FILES=${MUTANTS_FILES:-"
    crates/pagewise/src/heap/free.rs
    crates/pagewise/src/heap/remote.rs
    crates/pagewise/src/heap/cache.rs
    crates/pagewise/src/memory/block.rs
    crates/pagewise/src/memory/hollow.rs
"}
file_args=()
for f in $FILES; do file_args+=(--file "$f"); done

# The tests that see these files fail, and nothing slower: the unit tests
# (the thread cache, the free-slot keys, the hollow page arithmetic), the
# misuse aborts (double frees on every path), the hollow pages, the thread
# cache and transfer cache counts, turnover's syscall counts, the heap on
# the fake page source, and the stress at reduced work (no forks, 5,000
# operations per thread; its test of many live huge blocks is left out,
# 40 s in a debug build for nothing these files hold). cargo stops at the
# first test binary that fails, so a caught mutant costs a build and
# usually the unit tests; a missed one costs all of them (about 30 s).
tests=(--lib --test misuse --test hollow --test cache --test transfer
    --test turnover --test miri_heap --test stress
    -- --skip many_live_huge_blocks)
export PAGEWISE_STRESS_OPS=${PAGEWISE_STRESS_OPS:-5000} PAGEWISE_STRESS_FORKS=0
# No debug info: each mutant links the test binaries again, twice as fast
# without it (a failing test still names its file and line).
export CARGO_PROFILE_DEV_DEBUG=0

out=target/mutants
rm -rf "$out/mutants.out"
echo "== cargo-mutants over:" $FILES
echo "== $(cargo mutants --list -p pagewise "${file_args[@]}" | wc -l) mutants (after the triaged exclusions)"
status=0
# --timeout: a mutant that makes a test hang (a loop that never ends) is
# stopped and counted as caught; the slowest test set takes under a minute.
cargo mutants -p pagewise "${file_args[@]}" --jobs "${MUTANTS_JOBS:-2}" \
    --timeout 180 --build-timeout 300 --output "$out" \
    -- "${tests[@]}" || status=$?

dir=$out/mutants.out
count() { cat "$dir/$1.txt" 2>/dev/null | grep -c . || true; }
echo "== caught $(count caught), missed $(count missed), unviable $(count unviable), timeout (caught by the time limit) $(count timeout)"
echo "== mutants.sh took $(($(date +%s) - start)) s"
# Exit status of cargo-mutants: 0 all caught or unviable, 2 some missed,
# 3 some timed out (a hang the limit caught: a detection; this status wins
# over 2, so missed.txt decides), 4 the unmutated tree failed its tests.
case $status in
0 | 2 | 3) ;;
*)
    echo "== cargo-mutants failed (status $status): see $dir/debug.log"
    exit 1
    ;;
esac
if [ "$(count missed)" -ne 0 ]; then
    echo "== missed mutants (kill each with a test, or triage it in .cargo/mutants.toml):"
    sed 's/^/    /' "$dir/missed.txt"
    exit 1
fi
