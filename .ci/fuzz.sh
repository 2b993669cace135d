#!/usr/bin/env bash
# Fuzzing: builds the cargo-fuzz targets (fuzz/) and runs each one for
# SECONDS (default 30) from its committed corpus; any crash, panic, abort
# or timeout fails the script. See docs/fuzzing.md.
#
#   bash .ci/fuzz.sh [SECONDS]
#   FUZZ_TARGETS="heap pool" bash .ci/fuzz.sh 60     # a subset
#
# The corpus is copied to a scratch directory first, so the run adds
# nothing to the tree; a crashing input is kept in fuzz/artifacts/TARGET/
# (ignored by git) and printed in base64.
#
# Sanitizer: none (`-s none`). pagewise maps its own memory, so AddressSanitizer
# sees neither the blocks it hands out nor its metadata as anything but
# plain mapped memory: no redzones, no use-after-free poisoning, nothing
# inside an allocation. The targets' model checks (patterns, overlap, zeroes,
# exact counters) are what find allocator bugs; ASan would only add checks
# of the harness and of FakePages' C-heap mappings, at 2-3x fewer runs per
# second (docs/fuzzing.md has the measurements).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
SECS=${1:-30}
TARGETS=${FUZZ_TARGETS:-global_alloc heap arena pool}
start=$(date +%s)

echo "== fuzzing: tools"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
if ! command -v c++ >/dev/null 2>&1; then # libfuzzer-sys compiles libFuzzer
    apt-get update -qq && apt-get install -y -qq g++
fi

cd fuzz
# Debug assertions stay on (cargo fuzz's default): pagewise's own
# debug_assert!s are more checks the fuzzer can trip.
echo "== fuzzing: build ($TARGETS)"
for t in $TARGETS; do
    cargo +nightly fuzz build -s none "$t"
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in $TARGETS; do
    echo "== fuzzing: $t for ${SECS}s"
    mkdir -p "$scratch/$t"
    cp corpus/"$t"/* "$scratch/$t/" 2>/dev/null || true
    if ! cargo +nightly fuzz run -s none "$t" "$scratch/$t" -- \
        -max_total_time="$SECS" -timeout=30 -max_len=4096 \
        -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
        failed+=("$t")
        # What the target said (its panic or pagewise's abort message),
        # then libFuzzer's summary and how to reproduce.
        grep -a -A1 -E 'panicked at|^pagewise: ' "$scratch/$t.log" | head -n 20 || true
        grep -a -v -E '^#[0-9]|^ +[0-9]+: |^ +at ' "$scratch/$t.log" | tail -n 30
    fi
    grep -E '^#[0-9]+.*(INITED|DONE)|^stat::number_of_executed_units|^stat::peak_rss_mb' \
        "$scratch/$t.log" || true
done

echo "== fuzzing: $(($(date +%s) - start)) s in all"
total=$(echo $TARGETS | wc -w)
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzzing: crashed: ${failed[*]} (inputs in fuzz/artifacts/)"
fi
echo "fuzzing: $((total - ${#failed[@]})) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
