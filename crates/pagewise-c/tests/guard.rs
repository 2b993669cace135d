//! Sampled guard pages from C: `tests/c/guard.c`, built with -O2 and
//! without frame pointers, runs one bug per case under
//! `LD_PRELOAD=libpagewise.so` with `PAGEWISE_GUARD_SAMPLE=1` (every
//! allocation guarded while the pool has a slot). Each report must name
//! the kind on its first line, and the functions of the access, the
//! allocation and the free by name; faults end the program with SIGSEGV
//! (after the handler it had, if any), bad frees with SIGABRT.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn program() -> Option<&'static Path> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| {
        c_compiler()?;
        let out = scratch("guard").join("guard");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/guard.c");
        let o = std::process::Command::new("cc")
            .args([
                "-O2",
                "-fomit-frame-pointer",
                "-g",
                "-Wall",
                "-Werror",
                "-pthread",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Some(out)
    })
    .as_deref()
}

/// What a case printed on stderr, and the signal that ended it.
struct Run {
    stderr: String,
    stdout: String,
    signal: Option<i32>,
    code: Option<i32>,
}

fn run(case: &str, rate: &str) -> Option<Run> {
    let mut cmd = command(program()?);
    cmd.arg(case).env("PAGEWISE_GUARD_SAMPLE", rate);
    let o = preloaded(cmd);
    Some(Run {
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        signal: o.status.signal(),
        code: o.status.code(),
    })
}

/// The report's first line.
fn headline(r: &Run) -> &str {
    r.stderr
        .lines()
        .find(|l| l.starts_with("pagewise: "))
        .unwrap_or_else(|| panic!("no report:\n{}", r.stderr))
}

/// The function names of the stack headed by a line starting with `what`.
fn stack(r: &Run, what: &str) -> Vec<String> {
    let mut lines = r
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with(&format!("  {what}")));
    assert!(lines.next().is_some(), "no `{what}` stack:\n{}", r.stderr);
    lines
        .take_while(|l| l.starts_with("    #"))
        .map(|l| {
            l.split(' ')
                .nth(6)
                .unwrap_or("")
                .split('+')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// Checks the kind, the innermost frame of the access (or the free), and
/// that the allocating and freeing functions are named.
fn check(case: &str, kind: &str, first: (&str, &str), alloc: &str, freed: Option<&str>, sig: i32) {
    let Some(r) = run(case, "1") else { return };
    let head = headline(&r);
    assert!(
        head.starts_with(&format!("pagewise: {kind}: ")),
        "{case}: {head}\n{}",
        r.stderr
    );
    assert_eq!(r.signal, Some(sig), "{case}:\n{}", r.stderr);
    let s = stack(&r, first.0);
    assert!(
        s[0].starts_with(first.1),
        "{case}: {} stack {s:?}\n{}",
        first.0,
        r.stderr
    );
    let a = stack(&r, "allocated by");
    assert!(
        a.iter().any(|f| f.starts_with(alloc)),
        "{case}: allocated by {a:?}\n{}",
        r.stderr
    );
    match freed {
        Some(f) => {
            let s = stack(&r, "freed by");
            assert!(
                s.iter().any(|g| g.starts_with(f)),
                "{case}: freed by {s:?}\n{}",
                r.stderr
            );
        }
        None => assert!(!r.stderr.contains("freed by"), "{case}:\n{}", r.stderr),
    }
}

const SEGV: i32 = libc::SIGSEGV;
const ABRT: i32 = libc::SIGABRT;

#[test]
fn a_write_one_byte_past_the_end_faults_and_is_reported() {
    check(
        "overflow",
        "heap-buffer-overflow",
        ("access", "write_past_end"),
        "make_block",
        None,
        SEGV,
    );
    if let Some(r) = run("overflow", "1") {
        let head = headline(&r);
        assert!(
            head.contains(": write 0 bytes past the end of the 32-byte block"),
            "{head}"
        );
    }
}

#[test]
fn a_write_before_the_start_faults_and_is_reported() {
    check(
        "underflow",
        "heap-buffer-underflow",
        ("access", "write_before_start"),
        "make_block",
        None,
        SEGV,
    );
    if let Some(r) = run("underflow", "1") {
        assert!(headline(&r).contains(": write 1 byte before the 32-byte block"));
    }
}

#[test]
fn reads_and_writes_after_free_are_reported_with_the_free() {
    check(
        "uaf-read",
        "heap-use-after-free",
        ("access", "read_after_free"),
        "make_block",
        Some("release"),
        SEGV,
    );
    check(
        "uaf-write",
        "heap-use-after-free",
        ("access", "write_after_free"),
        "make_block",
        Some("release"),
        SEGV,
    );
    if let Some(r) = run("uaf-read", "1") {
        assert!(
            headline(&r).contains(": read 5 bytes into the 24-byte block"),
            "{}",
            headline(&r)
        );
    }
}

#[test]
fn a_double_free_aborts_with_both_frees() {
    check(
        "double-free",
        "double-free",
        ("free", "release_again"),
        "make_block",
        Some("release"),
        ABRT,
    );
}

#[test]
fn a_free_inside_a_block_aborts() {
    check(
        "invalid-free",
        "invalid-free",
        ("free", "release"),
        "make_block",
        None,
        ABRT,
    );
    if let Some(r) = run("invalid-free", "1") {
        assert!(headline(&r).contains("8 bytes from the start of the 24-byte block"));
    }
}

#[test]
fn a_write_into_the_slack_is_found_at_the_free() {
    check(
        "slack",
        "heap-buffer-overflow",
        ("free", "release"),
        "make_block",
        None,
        ABRT,
    );
    if let Some(r) = run("slack", "1") {
        assert!(headline(&r).contains("(found at its free)"));
    }
}

#[test]
fn the_free_on_another_thread_is_named_with_its_thread() {
    check(
        "threads",
        "heap-use-after-free",
        ("access", "read_after_free"),
        "make_block",
        Some("release"),
        SEGV,
    );
    let Some(r) = run("threads", "1") else { return };
    let tid = |what: &str| {
        let l = r
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("  {what} thread ")))
            .unwrap();
        l.trim_end_matches(':')
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    assert_ne!(tid("allocated by"), tid("freed by"), "{}", r.stderr);
}

#[test]
fn a_block_moved_by_realloc_is_freed_by_it() {
    check(
        "realloc",
        "heap-use-after-free",
        ("access", "read_after_free"),
        "make_block",
        Some("main"),
        SEGV,
    );
}

#[test]
fn a_guarded_block_has_its_requested_size_usable() {
    let Some(r) = run("usable-size", "1") else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        "24 0",
        "usable size, and address modulo 16"
    );
}

#[test]
fn the_programs_own_handler_keeps_its_faults_and_sees_ours_after_the_report() {
    let Some(r) = run("own-handler", "1") else {
        return;
    };
    let lines: Vec<&str> = r.stderr.lines().collect();
    let at = |p: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("{p}:\n{}", r.stderr))
    };
    // Its own fault went to it, not to a report.
    assert!(at("own handler: fault") < at("recovered"));
    assert!(at("recovered") < at("pagewise: heap-buffer-overflow"));
    // The guard's fault was reported, then passed on to its handler.
    assert!(lines[at("pagewise: heap-buffer-overflow")..]
        .iter()
        .any(|l| l.starts_with("own handler: fault")));
    assert_eq!(r.code, Some(3), "its handler's exit:\n{}", r.stderr);
}

#[test]
fn without_the_variable_nothing_is_guarded_and_the_bugs_go_unseen() {
    // The same program, the same bugs: a slab slot's neighbour absorbs
    // the overflow, and the freed slot is still mapped.
    for case in ["overflow", "uaf-read"] {
        let Some(r) = run(case, "0") else { return };
        assert!(!r.stderr.contains("pagewise:"), "{case}: {}", r.stderr);
    }
}
