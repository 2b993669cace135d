#!/usr/bin/env bash
# ThreadSanitizer over the multi-thread tests of the global allocator:
# the stress (crates/pagewise/tests/stress.rs, at reduced work: TSan runs
# code 5-15x slower), threads.rs and thread_exit.rs. Needs the nightly
# toolchain (-Zsanitizer=thread) and its rust-src (-Zbuild-std: the
# standard library must be instrumented too, or every race through a
# std type is reported as one). See docs/stress-and-tsan.md.
#
#   bash .ci/tsan.sh                     # the default run (a few minutes)
#   PAGEWISE_TEST_STRESS_OPS=200000 bash .ci/tsan.sh    # a longer one
#
# Exit status: non-zero if a test fails or TSan reports a race
# (TSAN_OPTIONS exitcode). Reports go to stderr and, one file per
# process, to $TSAN_LOG_DIR (default target/tsan/tsan-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
start=$(date +%s)

if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "== installing rust-src for the nightly toolchain (-Zbuild-std)"
    rustup component add --toolchain nightly rust-src
fi

target=x86_64-unknown-linux-gnu
export RUSTFLAGS="-Zsanitizer=thread"
export RUSTDOCFLAGS="-Zsanitizer=thread"
# A target directory of its own: the instrumented std and dependencies
# would otherwise be rebuilt whenever an uninstrumented build ran.
# Absolute paths: cargo runs each test binary in its package's directory
# (crates/pagewise), where a relative log_path would put the reports out of
# reach of the count below (which then always read zero).
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
export CARGO_TARGET_DIR="$(absolute "${TSAN_TARGET_DIR:-${CARGO_TARGET_DIR:-target}/tsan}")"
log_dir="$(absolute "${TSAN_LOG_DIR:-$CARGO_TARGET_DIR/tsan-logs}")"
rm -rf "$log_dir"
mkdir -p "$log_dir"
# Keep going after a report (every distinct race is listed), fail at exit.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0 exitcode=66 second_deadlock_stack=1 history_size=4 log_path=$log_dir/tsan}"

# fork() is left out: TSan does not support fork() in a multi-threaded
# process (its own runtime threads and locks are not fork-safe; the child
# may deadlock inside TSan or die). The fork tests run uninstrumented in
# `cargo test`.
export PAGEWISE_TEST_STRESS_FORKS=0
# Less work, fewer threads, a smaller live cap (TSan keeps shadow memory
# for every byte the test touches).
export PAGEWISE_TEST_STRESS_OPS="${PAGEWISE_TEST_STRESS_OPS:-100000}"
export PAGEWISE_TEST_STRESS_THREADS="${PAGEWISE_TEST_STRESS_THREADS:-12}"
export PAGEWISE_TEST_STRESS_LIVE_MAX="${PAGEWISE_TEST_STRESS_LIVE_MAX:-192M}"

cargo_test() {
    cargo +nightly test -Zbuild-std --target "$target" -p pagewise "$@"
}

echo "== build (instrumented std and crates)"
cargo_test --test stress --test threads --test thread_exit --no-run

status=0
# The stress (twice: as it is, and with one-segment reservations and no
# decay delay), and the reproducers of races between threads. The
# single-threaded reproducers (stale zeroed blocks, purges past a huge run,
# the reservation limit) say nothing about races and are left out.
echo "== stress.rs under TSan (ops $PAGEWISE_TEST_STRESS_OPS, threads $PAGEWISE_TEST_STRESS_THREADS)"
cargo_test --test stress -- --exact --nocapture \
    stress_global_allocator \
    stress_small_reservations_no_decay \
    large_free_racing_slab_page_creation \
    heaps_are_reused_while_stats_and_trim_run || status=$?
echo "== threads.rs and thread_exit.rs under TSan"
cargo_test --test threads --test thread_exit || status=$?

reports=$(cat "$log_dir"/tsan.* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true)
echo "== $reports ThreadSanitizer report(s); logs in $log_dir"
if [ "$reports" -gt 0 ]; then
    # One line per distinct race: the first pagewise frame (its source or
    # its tests) of each of the two accesses (comparison helpers skipped),
    # with how often it came up.
    echo "== distinct races (count, access <-> earlier access):"
    cat "$log_dir"/tsan.* | awk '
        /^WARNING: ThreadSanitizer/ { key = ""; need = 0; next }
        /^  (Read|Write|Previous|Atomic)/ {
            what = $0; sub(/^  /, "", what); sub(/ at 0x.*/, "", what); need = 1; next
        }
        need && /^    #[0-9]+ / && /\/crates\/pagewise\/(src|tests)\// && !/PartialEq/ {
            line = $0
            sub(/^    #[0-9]+ /, "", line); sub(/ \(.*$/, "", line)
            sub(/ \/.*\/crates\//, " crates/", line)
            key = key (key == "" ? "" : "  <->  ") what ": " line
            need = 0; next
        }
        /^SUMMARY/ { count[key == "" ? "(no frame in crates/pagewise)" : key]++ }
        END { for (k in count) printf "%5d  %s\n", count[k], k }' | sort -rn || true
    [ "$status" -ne 0 ] || status=66
fi
echo "== tsan.sh took $(( $(date +%s) - start )) s"
exit "$status"
