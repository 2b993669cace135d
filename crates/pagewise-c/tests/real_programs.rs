//! Debian's python3, lua5.4 and sqlite3 under `LD_PRELOAD=libpagewise.so`
//! give the same output as without it, exit 0, really allocate through
//! pagewise, and pagewise's accounting agrees with the kernel's RSS.

mod common;

use common::*;
use std::process::{Command, Stdio};

/// Runs `build()` plainly and preloaded; compares outputs; returns the
/// preloaded run's JSON report.
fn compare(name: &str, build: impl Fn() -> Command, stdin: Option<&str>) -> serde_json::Value {
    let run = |mut c: Command| {
        if let Some(f) = stdin {
            c.stdin(Stdio::from(std::fs::File::open(program_file(f)).unwrap()));
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = c.spawn().unwrap();
        let pid = child.id();
        // Generous (each needs seconds): a hang becomes a failure.
        let out = wait_or_kill(child, std::time::Duration::from_secs(300))
            .unwrap_or_else(|| panic!("{name}: still running after 300 s, killed"));
        (pid, out)
    };
    let (_, plain) = run(build());
    assert!(plain.status.success(), "{name} plain run: {plain:?}");
    let dir = scratch(name);
    let mut c = build();
    c.env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_STATS_FILE", dir.join("stats.%p.json"));
    let (pid, pre) = run(c);
    assert!(
        pre.status.success(),
        "{name} under LD_PRELOAD: {:?}\n{}",
        pre.status,
        String::from_utf8_lossy(&pre.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&pre.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "{name}: stdout differs under LD_PRELOAD"
    );
    assert_eq!(
        String::from_utf8_lossy(&pre.stderr),
        String::from_utf8_lossy(&plain.stderr),
        "{name}: stderr differs under LD_PRELOAD"
    );
    assert!(!plain.stdout.is_empty());
    stats_of(&dir, pid)
}

#[test]
fn python3_with_pythonmalloc_malloc() {
    let Some(py) = debian_program("python3", "python3") else {
        return;
    };
    let v = compare(
        "python3",
        || {
            let mut c = command(&py);
            c.arg(program_file("workload.py"))
                .env("PYTHONMALLOC", "malloc")
                .env("PYTHONHASHSEED", "0");
            c
        },
        None,
    );
    // Python's objects went through pagewise, not glibc.
    assert!(total_allocs(&v) > 1_000_000, "allocs: {}", total_allocs(&v));
    assert_attribution(&v, 5.0);
}

#[test]
fn lua54() {
    let Some(lua) = debian_program("lua5.4", "lua5.4") else {
        return;
    };
    let v = compare(
        "lua",
        || {
            let mut c = command(&lua);
            c.arg(program_file("workload.lua"));
            c
        },
        None,
    );
    assert!(total_allocs(&v) > 500_000, "allocs: {}", total_allocs(&v));
    assert_attribution(&v, 5.0);
}

#[test]
fn sqlite3_100k_rows() {
    let Some(sqlite) = debian_program("sqlite3", "sqlite3") else {
        return;
    };
    let v = compare(
        "sqlite3",
        || {
            let mut c = command(&sqlite);
            c.args([":memory:", "-batch", "-init", "/dev/null"]);
            c
        },
        Some("workload.sql"),
    );
    assert!(total_allocs(&v) > 100_000, "allocs: {}", total_allocs(&v));
    assert_attribution(&v, 5.0);
}
