//! The hardened library, `libpagewise_secure.so`, against the default one
//! and glibc: one C program per kind of heap misuse and size range (tiny,
//! page-sized, large, huge), preloaded into each. The hardened library must
//! stop each one it claims to with its one-line report; the table of what
//! each allocator does is printed (docs/hardening.md keeps it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `tests/c/misuse.c`, built; None without a C compiler.
fn misuse_program() -> Option<&'static Path> {
    common::c_compiler()?;
    static P: OnceLock<PathBuf> = OnceLock::new();
    Some(P.get_or_init(|| {
        let out = common::scratch("cc-misuse").join("misuse");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/misuse.c");
        let o = Command::new("cc")
            .args(["-O0", "-fno-builtin", "-o"])
            .arg(&out)
            .arg(src)
            .output()
            .expect("running cc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    }))
}

/// What a run did: `Ok(report)` if it stopped (with the allocator's line,
/// if any), `Err(stdout)` if it went on.
fn run(program: &Path, preload: Option<&Path>, kind: &str, size: usize) -> Result<String, String> {
    let mut c = Command::new(program);
    c.args([kind, &size.to_string()]);
    if let Some(lib) = preload {
        c.env("LD_PRELOAD", lib);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if stdout.contains("still running") && out.status.success() {
        return Err(stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok(stderr.lines().next().unwrap_or("(signal)").to_owned())
}

const SIZES: [usize; 4] = [8, 4000, 1 << 20, 64 << 20];

/// Requests a few bytes short of their slot's size.
const SHORT_SIZES: [usize; 2] = [12, 4093];

/// The kinds the hardened library stops at every size, and its report.
const STOPPED: [(&str, &str); 7] = [
    ("overflow-1", "heap buffer overflow"),
    ("overflow-32", "heap buffer overflow"),
    ("overflow-memcpy", "heap buffer overflow"),
    ("double-free", "double free"),
    ("double-free-later", "double free"),
    // After a write over the freed block's first 16 bytes (all of an
    // 8-byte block's slot, its key and tail word). A large or huge block
    // faults at that write instead (`FAULTS_FIRST`).
    ("double-free-written", "double free"),
    ("invalid-free", "not the start of an allocation"),
];

/// The kinds that write to the block after its free: a large or huge
/// block's span is kept shut then, and the write faults (no report line).
const FAULTS_FIRST: [&str; 1] = ["double-free-written"];

#[test]
fn the_hardened_library_stops_each_misuse_with_its_report() {
    let Some(program) = misuse_program() else {
        return;
    };
    let secure = common::secure_lib_so();
    for (kind, report) in STOPPED {
        // And requests one to seven bytes short of their slot (16 and
        // 4,096 bytes), which get a short tail rather than a tail word.
        for size in SIZES.into_iter().chain(SHORT_SIZES) {
            let report = if FAULTS_FIRST.contains(&kind) && size > 256 << 10 {
                "(signal)"
            } else {
                report
            };
            match run(program, Some(&secure), kind, size) {
                Ok(line) => assert!(
                    (line.starts_with("pagewise: ") || report == "(signal)")
                        && line.contains(report),
                    "{kind} at {size}: {line}"
                ),
                Err(out) => panic!("{kind} at {size}: went on: {out}"),
            }
        }
    }
    // A write after free to a small block: over its link (8 B: the slot is
    // all link and key) or its zeroed bytes, reported when the slot is
    // handed out again.
    // The byte before a small block: the tail word of the slot before it;
    // before a large or huge one: a guard page (a fault, no report line).
    for (kind, size, report) in [
        ("write-after-free", 8, "write after free"),
        ("write-after-free", 4000, "write after free"),
        // A write after free over a block's bytes (its free key, and the
        // free slot's tail word of one with a short tail), then a second
        // free past the quarantine or by another thread.
        // A write after free to a large or huge block: its span is kept
        // shut, and the write faults.
        ("write-after-free", 1 << 20, "(signal)"),
        ("write-after-free", 64 << 20, "(signal)"),
        ("double-free-rewritten-later", 8, "double free"),
        ("double-free-rewritten-later", 12, "double free"),
        ("double-free-rewritten-later", 4000, "double free"),
        ("double-free-rewritten-later", 4093, "double free"),
        ("double-free-rewritten-thread", 8, "double free"),
        ("double-free-rewritten-thread", 12, "double free"),
        ("double-free-rewritten-thread", 4000, "double free"),
        ("double-free-rewritten-thread", 4093, "double free"),
        ("underflow-1", 8, "heap buffer underflow"),
        ("underflow-1", 4000, "heap buffer underflow"),
        ("underflow-1", 12, "heap buffer underflow"),
        ("underflow-1", 4093, "heap buffer underflow"),
        ("underflow-1", 1 << 20, "(signal)"),
        ("underflow-1", 64 << 20, "(signal)"),
        // The same byte, then the block moved by realloc: its old place is
        // freed as `free` frees a block, word before it checked.
        ("underflow-realloc", 8, "heap buffer underflow"),
        ("underflow-realloc", 4000, "heap buffer underflow"),
        // malloc(0): touching the block faults at once (no report line).
        ("zero-write", 0, "(signal)"),
    ] {
        match run(program, Some(&secure), kind, size) {
            Ok(line) => assert!(
                (line.starts_with("pagewise: ") || report == "(signal)") && line.contains(report),
                "{kind} at {size}: {line}"
            ),
            Err(out) => panic!("{kind} at {size}: went on: {out}"),
        }
    }
    // A write far past the end, by memcpy, memmove or memset: stopped at the
    // call, before a byte is written.
    for kind in ["memcpy-far", "memmove-far", "memset-far"] {
        for size in SIZES {
            let out = Command::new(program)
                .args([kind, &size.to_string()])
                .env("LD_PRELOAD", &secure)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && !stdout.contains("copied"),
                "{kind} at {size}: not stopped at the call: {stdout}{stderr}"
            );
            assert!(
                stderr.starts_with("pagewise: heap buffer overflow"),
                "{kind} at {size}: {stderr}"
            );
            // Then the stack of the call: the library's own frames left
            // out, the first is the program's (misuse.c's `main`).
            let lines: Vec<&str> = stderr.lines().collect();
            assert!(
                lines
                    .get(1)
                    .is_some_and(|l| l.starts_with("  found at (thread "))
                    && lines.get(2).is_some_and(|l| l.contains(" main+")),
                "{kind} at {size}: the stack of the call: {stderr}"
            );
        }
    }
    // A short write across a 16-byte slot's end, by memcpy or memset:
    // stopped at the call too (a write that stays in the 16 bytes around
    // its first byte is not looked up; this one leaves them).
    for kind in ["memcpy-near", "memset-near"] {
        for size in [8, 12] {
            let out = Command::new(program)
                .args([kind, &size.to_string()])
                .env("LD_PRELOAD", &secure)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && !stdout.contains("copied"),
                "{kind} at {size}: not stopped at the call: {stdout}{stderr}"
            );
            assert!(
                stderr.starts_with("pagewise: heap buffer overflow"),
                "{kind} at {size}: {stderr}"
            );
        }
    }
    // A freed block handed out again once out of quarantine holds none of
    // its last owner's bytes, and is not taken for one written after free.
    for size in [64, 4000] {
        match run(program, Some(&secure), "read-after-quarantine", size) {
            Err(out) => assert!(
                out.contains("reused") && !out.contains("stale data"),
                "read-after-quarantine at {size}: {out}"
            ),
            Ok(line) => panic!("read-after-quarantine at {size}: stopped: {line}"),
        }
    }
    // Freed blocks up to 4 KiB are wiped: stale data is never seen there.
    for size in [8, 64, 4000] {
        let r = run(program, Some(&secure), "read-after-free", size);
        assert!(
            !r.as_ref().is_err_and(|o| o.contains("stale data")),
            "read-after-free at {size}: {r:?}"
        );
    }
}

/// `tests/c/refuse_record.c`, built as a library to preload; None without
/// a C compiler.
fn refusing_shim() -> Option<&'static Path> {
    common::c_compiler()?;
    static P: OnceLock<PathBuf> = OnceLock::new();
    Some(P.get_or_init(|| {
        let out = common::scratch("cc-refuse-record").join("refuse_record.so");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/refuse_record.c");
        let o = Command::new("cc")
            .args(["-O1", "-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(src)
            .arg("-ldl")
            .output()
            .expect("running cc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    }))
}

#[test]
fn where_the_record_of_blocks_handed_out_is_refused_the_free_key_still_names_a_double_free() {
    let (Some(program), Some(shim)) = (misuse_program(), refusing_shim()) else {
        return;
    };
    let secure = common::secure_lib_so();
    let mut preload = shim.as_os_str().to_owned();
    preload.push(":");
    preload.push(&secure);
    let preload = PathBuf::from(preload);
    // The slot's free key says it is free: in the quarantine, or past it.
    for kind in ["double-free", "double-free-later"] {
        for size in [8, 12, 4000, 4093] {
            match run(program, Some(&preload), kind, size) {
                Ok(line) => assert!(
                    line.starts_with("pagewise: double free"),
                    "{kind} at {size}: {line}"
                ),
                Err(out) => panic!("{kind} at {size}: went on: {out}"),
            }
        }
    }
    // The quarantine's slots hold the key there: a slot whose bytes past
    // its key a write after free overwrote, its free slot's tail word
    // among them, is still named by its key.
    // (Sizes eight bytes short of a slot: 112 and 4,096 bytes.)
    for size in [104, 4088] {
        match run(program, Some(&preload), "double-free-end-written", size) {
            Ok(line) => assert!(
                line.starts_with("pagewise: double free"),
                "double-free-end-written at {size}: {line}"
            ),
            Err(out) => panic!("double-free-end-written at {size}: went on: {out}"),
        }
    }
    // The record is refused indeed: a 16-byte slot whose key a write after
    // free overwrote is judged by its bytes, where the record names it.
    let line = run(program, Some(&preload), "double-free-written", 8);
    assert!(
        line.as_ref()
            .is_ok_and(|l| l.starts_with("pagewise: heap buffer overflow")),
        "{line:?}"
    );
}

/// Prints what glibc, libpagewise.so and libpagewise_secure.so do with
/// each program (`cargo test -p pagewise-c --test secure -- --nocapture`).
#[test]
fn table_of_what_each_allocator_catches() {
    let Some(program) = misuse_program() else {
        return;
    };
    common::build_library();
    let libs = [
        ("glibc", None),
        ("libpagewise.so", Some(common::lib_so())),
        ("libpagewise_secure.so", Some(common::secure_lib_so())),
    ];
    let kinds = [
        "overflow-1",
        "overflow-32",
        "overflow-memcpy",
        "memcpy-far",
        "memset-far",
        "underflow-1",
        "underflow-realloc",
        "double-free",
        "double-free-later",
        "double-free-written",
        "double-free-rewritten-later",
        "double-free-rewritten-thread",
        "write-after-free",
        "read-after-free",
        "invalid-free",
        "zero-write",
    ];
    for kind in kinds {
        // A zero-byte block, at 0 bytes only.
        let sizes = if kind == "zero-write" {
            &[0][..]
        } else {
            &SIZES[..]
        };
        for &size in sizes {
            let row: Vec<String> = libs
                .iter()
                .map(|(name, lib)| {
                    let r = match run(program, lib.as_deref(), kind, size) {
                        Ok(line) => format!("stopped: {line}"),
                        Err(out) if out.contains("stale data") => "went on, stale data".into(),
                        Err(_) => "went on".into(),
                    };
                    format!("{name}: {r}")
                })
                .collect();
            println!("{kind} {size}: {}", row.join(" | "));
        }
    }
}
