#!/usr/bin/env bash
# What the tests of crates/pagewise-c and crates/pagewise-cli need: a C
# compiler for the C test program, a C++ compiler for the C++ one (operator
# new and delete), and Debian's python3, lua5.4, sqlite3 and
# git to run under LD_PRELOAD; crates/pagewise-bench's need tcmalloc (a
# built-in peer of `pagewise bench`, preloaded from libtcmalloc_minimal.so.4)
# and redis-server (its real-program workload, under each allocator);
# golang-go's `go tool pprof` reads the heap profiles.
# Called from .ci/run before `cargo test`; with PAGEWISE_TEST_CI=1 a test whose
# program is missing fails instead of skipping.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/bin/lua5.4 ] || need+=(lua5.4)
[ -x /usr/bin/sqlite3 ] || need+=(sqlite3)
[ -x /usr/bin/git ] || need+=(git)
dpkg-query -W -f='${Status}' libtcmalloc-minimal4 2>/dev/null | grep -q 'ok installed' || need+=(libtcmalloc-minimal4)
[ -x /usr/bin/redis-server ] || need+=(redis-server)
# redis-cli drives the server the heap profiler's test profiles.
[ -x /usr/bin/redis-cli ] || need+=(redis-tools)
# `go tool pprof` reads the heap profiles of `pagewise run --profile`.
[ -x /usr/bin/go ] || need+=(golang-go)
# addr2line, for the C library's profiler test.
command -v addr2line >/dev/null 2>&1 || need+=(binutils)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "clib-deps: cc $(cc -dumpversion), c++ $(c++ -dumpversion), $(/usr/bin/python3 --version), $(/usr/bin/lua5.4 -v 2>&1 | cut -d' ' -f1-2), sqlite3 $(/usr/bin/sqlite3 --version | cut -d' ' -f1), $(/usr/bin/git --version), libtcmalloc-minimal4 $(dpkg-query -W -f='${Version}' libtcmalloc-minimal4), $(/usr/bin/redis-server --version | cut -d' ' -f1-3), $(/usr/bin/go version | cut -d' ' -f3)"
