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
#   MUTANTS_TESTS="--test sampling" MUTANTS_FILES="..." bash .ci/mutants.sh
#                                        # more test targets (besides those below)
#
# The set is fixed (every mutant of the files, in source order, minus the
# triaged ones): no sampling. CI runs half of it, the mutants of even or of
# odd index (round-robin, so every file has its share), chosen by the
# commit's hash: two runs of one commit test the same mutants, and
# consecutive commits cover the whole set between them (the whole set took
# 25 minutes of the CI's 90). MUTANTS_SHARD=all runs all of it, and
# MUTANTS_SHARD=k/n shard k of n.
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
    crates/pagewise/src/memory/cache_handshake.rs
    crates/pagewise/src/memory/hollow.rs
    crates/pagewise/src/memory/page.rs
    crates/pagewise/src/memory/segment.rs
"}
# Which of their mutants (to keep the step near 15 minutes on 2 cores): all
# of free.rs, remote.rs, block.rs and cache_handshake.rs (the free and
# double-free checks, the remote-free counts, the free-slot keys, the
# cached free's handshake with its page); cache.rs's accounting and its
# cacheability test (`frees`, `cached`, `count_alloc`, `starts_slot`), not
# its compile-time tables (`ClassState::all`, `build_limits`, `build_grown`) nor the
# requested-bytes estimate behind stats(); in hollow.rs, page.rs and segment.rs the
# decisions about hollow slots and cacheability, and the collection of
# remote frees with its hollow-slot check, only, not the slot-set and
# OS-page arithmetic (docs/testing.md, "Mutation testing", says what is
# left out). With MUTANTS_FILES set, every mutant of those files.
P=crates/pagewise/src
select=()
if [ -z "${MUTANTS_FILES:-}" ]; then
    select=(
        --re "^$P/(heap/(free|remote|cache)|memory/(block|cache_handshake))\\.rs:"
        --re "^$P/memory/hollow\\.rs:.*[ :]Page::(is_hollow_slot|is_hollow_slot_of_hollow_page|can_refill_hollow|hollow_pages|can_hollow|stop_caching|relink_without_hollow|back_in_use)( |\$)"
        --re "^$P/memory/page\\.rs:.*[ :]Page::(hollow_slots|set_hollow_slots|set_cacheable|collect_thread_free)( |\$)"
        --re "^$P/memory/segment\\.rs:.*[ :]Segment::set_cacheable( |\$)"
        --exclude-re "^$P/heap/cache\\.rs:.*(ClassState::all|ClassState::requested_estimate|build_limits|build_grown)( |\$)"
    )
fi
file_args=("${select[@]}")
shard=${MUTANTS_SHARD:-}
if [ -z "$shard" ] && [ -z "${MUTANTS_FILES:-}" ]; then
    # The last hex digit of the commit's hash, even or odd (no git: shard 0).
    digit=$(git rev-parse HEAD 2>/dev/null | tail -c 2 || true)
    shard="$(( 16#${digit:-0} % 2 ))/2"
fi
if [ -n "$shard" ] && [ "$shard" != all ]; then
    file_args+=(--shard "$shard" --sharding round-robin)
fi
for f in $FILES; do file_args+=(--file "$f"); done

# The tests that see these files fail, and nothing slower: the unit tests
# (the thread cache, the free-slot keys, lookup_page's offset check), the
# misuse aborts (double frees on every path), the guard pool's frees and
# usable sizes, the hollow pages, the thread
# cache and transfer cache counts, turnover's syscall counts, the heap on
# the fake page source, stats() over pending remote frees, and the stress
# at reduced work (no forks, 5,000 operations per thread; its test of many
# live huge blocks is left out, 40 s in a debug build for nothing these
# files hold). They are given to every cargo call (`--cargo-arg`), the
# build included: cargo-mutants' build step is `cargo test --no-run`,
# which would otherwise link all ~30 test binaries for each mutant (two
# thirds of its time). cargo stops at the first test binary that fails, so
# a caught mutant usually costs a build and the unit tests; a missed one
# costs all of them (about 15 s).
targets=(--lib --test misuse --test hollow --test cache --test transfer
    --test turnover --test miri_heap --test pending_remote --test stress --test guard
    --test thread_bytes)
# MUTANTS_TESTS adds targets for files outside the CI set (the sampler's,
# heap/sample.rs and profile/gap.rs, are seen by `--test sampling`).
# shellcheck disable=SC2206
targets+=(${MUTANTS_TESTS:-})
cargo_args=()
for t in "${targets[@]}"; do cargo_args+=("--cargo-arg=$t"); done
export PAGEWISE_TEST_STRESS_OPS=${PAGEWISE_TEST_STRESS_OPS:-5000} PAGEWISE_TEST_STRESS_FORKS=0
# No debug info: each mutant links the test binaries again, twice as fast
# without it (a failing test still names its file and line).
export CARGO_PROFILE_DEV_DEBUG=0

out=target/mutants
rm -rf "$out/mutants.out"
mkdir -p "$out" # cargo-mutants makes one level only (a clean tree has no target/)
echo "== cargo-mutants over:" $FILES "(shard ${shard:-all})"
echo "== $(cargo mutants --list -p pagewise "${file_args[@]}" | wc -l) mutants (after the triaged exclusions)"
status=0
# --timeout: a mutant that makes a test hang (a loop that never ends) is
# stopped and counted as caught; the whole test set takes about 15 s.
cargo mutants -p pagewise "${file_args[@]}" "${cargo_args[@]}" \
    --jobs "${MUTANTS_JOBS:-2}" --timeout 90 --build-timeout 300 --output "$out" \
    -- -- --skip many_live_huge_blocks || status=$?

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
