//! `pagewise run` end to end: the report, its agreement with /proc, --json,
//! --plot, the exit status, and the message when the library is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `cargo build -p pagewise-c` for this test's profile and target directory
/// (cargo test builds only this package's targets; cargo releases its
/// build lock while tests run).
fn build_library(profile_dir: &Path) {
    let profile = profile_dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "pagewise-c", "--target-dir"])
        .arg(profile_dir.parent().unwrap());
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let o = cmd.output().expect("running cargo");
    assert!(
        o.status.success(),
        "cargo build -p pagewise-c failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `pagewise` as installed: the binary and libpagewise.so side by side, in
/// a directory of their own (hard links: a copy is open for writing while
/// other tests fork, and exec would then fail with ETXTBSY).
fn installed() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = Path::new(env!("CARGO_BIN_EXE_pagewise"));
        let profile = exe.parent().unwrap();
        build_library(profile);
        let lib = profile.join("libpagewise.so");
        let dir = profile.join("pagewise-cli-installed");
        std::fs::create_dir_all(&dir).unwrap();
        for (from, name) in [(exe, "pagewise"), (lib.as_path(), "libpagewise.so")] {
            let to = dir.join(name);
            let _ = std::fs::remove_file(&to);
            std::fs::hard_link(from, &to).unwrap();
        }
        dir
    })
}

fn pagewise() -> Command {
    let mut c = Command::new(installed().join("pagewise"));
    c.env_remove("PAGEWISE_LIB").env_remove("LD_PRELOAD");
    c
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagewise-cli-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Debian's python3, or None if it is not installed (`common::missing`: a
/// failure in CI, a visible skip elsewhere).
fn python() -> Option<&'static str> {
    let p = "/usr/bin/python3";
    if Path::new(p).exists() {
        Some(p)
    } else {
        common::missing(p, "python3");
        None
    }
}

const SCRIPT: &str = "
import sys
keep = []
for r in range(3):
    d = {i: 'x' * (i % 300) for i in range(40000)}
    keep.append(len(d))
    del d
print('done', sum(keep))
sys.exit(3)
";

#[test]
fn run_reports_attributes_rss_and_keeps_the_exit_status() {
    let Some(py) = python() else { return };
    let dir = scratch("report");
    let json = dir.join("report.json");
    let svg = dir.join("plot.svg");
    let o = pagewise()
        .args(["run", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .args(["--", py, "-c", SCRIPT])
        .env("PYTHONMALLOC", "malloc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "CMD's exit status:\n{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done 120000\n");
    for part in [
        "peak RSS",
        "final RSS",
        "live (requested by the program)",
        "internal rounding",
        "free slots in used pages",
        "retained empty pages",
        "allocator metadata",
        "attributed total",
        "System calls",
        "Busiest size classes",
    ] {
        assert!(stderr.contains(part), "missing {part:?} in:\n{stderr}");
    }

    // The JSON: the attributed total is within a few percent of the RSS the
    // kernel reported in the process at exit.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["exit_code"], 3);
    let a = &v["allocator"];
    let get = |k: &[&str]| {
        let mut x = a;
        for s in k {
            x = &x[*s];
        }
        x.as_u64().unwrap()
    };
    let attributed = get(&["committed_bytes"])
        + get(&["metadata_bytes"])
        + get(&["os", "other_anon_rss"])
        + get(&["os", "file_rss"]);
    let rss = get(&["os", "vm_rss"]);
    let err = (attributed as f64 - rss as f64).abs() / rss as f64;
    assert!(err < 0.05, "attributed {attributed} vs RSS {rss}");
    let allocs: u64 = a["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["total_allocs"].as_u64().unwrap())
        .sum();
    assert!(
        allocs > 100_000,
        "python allocated through pagewise: {allocs}"
    );
    assert!(!v["samples"].as_array().unwrap().is_empty());
    assert!(v["peak_rss_bytes"].as_u64().unwrap() >= rss / 2);

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"));
    assert!(plot.contains("RSS") && plot.contains("live") && plot.contains("<polyline"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_signal_becomes_128_plus_its_number() {
    let o = pagewise()
        .args(["run", "--", "sh", "-c", "kill -TERM $$"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(128 + 15));
    assert!(String::from_utf8_lossy(&o.stderr).contains("killed by signal 15"));
}

#[test]
fn missing_library_says_which_command_builds_it() {
    // A hard link in a directory without the library (beside the target
    // directory, so on the same file system). A copy would be open for
    // writing while other tests fork, and exec would fail with ETXTBSY.
    let exe = Path::new(env!("CARGO_BIN_EXE_pagewise"));
    let dir = exe
        .parent()
        .unwrap()
        .join(format!("pagewise-cli-nolib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("pagewise");
    let _ = std::fs::remove_file(&link);
    std::fs::hard_link(exe, &link).unwrap();
    let o = Command::new(&link)
        .env_remove("PAGEWISE_LIB")
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr.contains("libpagewise.so not found"), "{stderr}");
    assert!(stderr.contains("Build it with: cargo build"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_needs_a_command() {
    let o = pagewise().arg("run").output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("CMD"));
}

#[test]
fn a_missing_command_exits_127() {
    let o = pagewise()
        .args(["run", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot run /nonexistent/program"));
}
