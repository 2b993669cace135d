#!/usr/bin/env bash
# CI beyond x86-64 Linux with glibc (README, "Platforms"): the declared
# rust-version builds; macOS builds (cargo check: no linker or SDK needed);
# musl passes the pagewise crate's whole test suite; aarch64 Linux passes
# its unit and integration tests under qemu-user (two of them in a
# slightly different setting, said below). Called from .ci/run after the x86-64
# tests; run alone with `bash .ci/platforms.sh` (as root, for apt-get).
# About 9 minutes on 2 cores from a clean checkout (the timings are printed).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive CARGO_TERM_COLOR=never
start=$(date +%s)
step() { echo "== platforms: $* ($(( $(date +%s) - start )) s)"; }

step "packages: qemu-user, the aarch64 cross toolchain, musl-tools"
need=()
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
command -v musl-gcc >/dev/null 2>&1 || need+=(musl-tools)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
rustup target add aarch64-apple-darwin aarch64-unknown-linux-gnu x86_64-unknown-linux-musl

# The workspace declares 1.85; pagewise-c declares 1.88 (naked functions),
# and so does pagewise-cli (gimli's addr2line, its symbolizer, needs it).
step "rust-version: 1.85 (pagewise, pagewise-bench), 1.88 (pagewise-c, pagewise-cli)"
rustup toolchain install 1.85 1.88 --profile minimal
cargo +1.85 check --locked -p pagewise -p pagewise-bench
cargo +1.88 check --locked -p pagewise-c -p pagewise-cli

# Only the crate: the C library and `pagewise run` are Linux drop-ins.
# Clippy rather than check, so code left unused there fails too.
step "macOS (aarch64-apple-darwin): the pagewise crate builds"
cargo clippy --target aarch64-apple-darwin -p pagewise -- -D warnings

# The whole suite of the crate, doctests included. pagewise-c is not built
# for musl: Rust's musl target links statically and has no cdylib, and a
# preloaded malloc needs a dynamic program.
step "musl (x86_64-unknown-linux-musl): the pagewise crate's tests"
cargo test --target x86_64-unknown-linux-musl -p pagewise
# A static musl binary is where the `override` feature matters most (musl's
# own malloc is slow): it replaces musl's malloc at static link time.
cargo test --target x86_64-unknown-linux-musl -p pagewise --features override --test override_malloc

# The crate's unit and integration tests under qemu-user, release build
# (the tests' loops run ~10x slower emulated). Test binaries that re-execute
# themselves must go through qemu too (no binfmt_misc in a container):
# PAGEWISE_TEST_RUNNER. idle_return's exact resident-set check is replaced
# by pagewise's own committed bytes there (it says so: qemu's RSS includes
# the emulator's memory).
step "aarch64 Linux under qemu-user: the crate's tests (doctests aside)"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export PAGEWISE_TEST_RUNNER="$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"
# Optimised as shipped but without the fat LTO pass on one codegen unit,
# which took most of this step linking each test binary (as the x86-64
# release tests in .ci/run).
export CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
cargo test --release --target aarch64-unknown-linux-gnu -p pagewise --lib --tests -- \
    --skip stress_global_allocator --skip stress_small_reservations_no_decay --skip fork_while \
    --skip a_forked_child_gets_its_own_copy_of_a_meshed_heap
# qemu 7.2 aborts (cpu_exec: "cpu == current_cpu", plugins/core.c
# "success") when a forked child of a multi-threaded process creates a
# thread, which a child's first purge does (the background purger starts
# again in the child), and so does the meshing fork test (a thread
# allocates while the process forks). The stress tests that fork in that state run here
# with the background purger off; tests/fork.rs above forks with it on.
step "aarch64 Linux under qemu-user: the forking stress tests, PAGEWISE_BACKGROUND=0 (qemu bug, see above)"
PAGEWISE_BACKGROUND=0 cargo test --release --target aarch64-unknown-linux-gnu -p pagewise \
    --test stress --test stress_fork
step "done"
