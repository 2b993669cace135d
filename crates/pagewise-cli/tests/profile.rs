//! `pagewise run --profile DIR`: the heap profile of a C program built
//! with -O2 and without frame pointers (three call sites of about 60, 30
//! and 10 % of the live bytes, and a leak), as the report's top call sites,
//! pprof (read back by `go tool pprof`, Debian's golang-go), collapsed
//! stacks and flamegraphs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn pagewise_and_library() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_pagewise"));
    let profile = exe.parent().unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "pagewise-c", "--target-dir"])
        .arg(profile.parent().unwrap());
    if profile.file_name().unwrap() == "release" {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success());
    exe.to_path_buf()
}

fn program(dir: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/bin/cc").exists() {
        common::missing("/usr/bin/cc", "gcc");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pagewise-c/tests/c/prof_sites.c");
    let out = dir.join("prof_sites");
    let o = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-no-pie"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(out)
}

/// The functions of the top lines of one part of the report.
fn top_functions(report: &str, heading: &str) -> Vec<String> {
    report
        .lines()
        .skip_while(|l| !l.contains(heading))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .filter_map(|l| l.split("allocations  ").nth(1))
        .map(|f| f.split(' ').next().unwrap().to_string())
        .collect()
}

#[test]
fn run_profile_names_the_sites_and_writes_pprof_folded_and_svg() {
    let dir = std::env::temp_dir().join(format!("pagewise-cli-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(prog) = program(&dir) else { return };
    let out_dir = dir.join("out");
    let o = Command::new(pagewise_and_library())
        .env_remove("LD_PRELOAD")
        .env_remove("PAGEWISE_LIB")
        .arg("run")
        .arg("--profile")
        .arg(&out_dir)
        .arg("--")
        .arg(&prog)
        .arg(dir.join("in-use.prof"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{report}");
    let peak = top_functions(&report, "top call sites by bytes in use at the peak");
    assert_eq!(
        peak[..3],
        ["site_a_small", "site_b_medium", "site_c_large"],
        "{report}"
    );
    let leaks = top_functions(&report, "still in use at exit");
    assert_eq!(
        leaks.first().map(String::as_str),
        Some("site_leaking"),
        "{report}"
    );
    // The files, for the one process of the run.
    let pid = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| n.strip_suffix(".pb.gz").map(str::to_string))
        .expect("a pprof file");
    for part in ["peak", "leaks", "alloc"] {
        let folded = std::fs::read_to_string(out_dir.join(format!("{pid}.{part}.folded"))).unwrap();
        for line in folded.lines() {
            let (stack, bytes) = line.rsplit_once(' ').unwrap();
            assert!(!stack.is_empty() && bytes.parse::<u64>().is_ok(), "{line}");
        }
        let svg = std::fs::read_to_string(out_dir.join(format!("{pid}.{part}.svg"))).unwrap();
        assert!(
            svg.starts_with("<?xml") && svg.contains("<svg"),
            "{part}.svg"
        );
        let want = if part == "leaks" {
            "site_leaking"
        } else {
            "site_a_small"
        };
        assert!(
            folded.contains(want) && svg.contains(want),
            "{part}: {folded}"
        );
    }
    // pprof, read by Go's own tool.
    let Some(go) = common::go() else { return };
    let pb = out_dir.join(format!("{pid}.pb.gz"));
    let top = Command::new(go)
        .args(["tool", "pprof", "-top", "-sample_index=peak_space"])
        .arg(&pb)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let order: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|f| f.starts_with("site_"))
        .collect();
    assert_eq!(
        order[..3],
        ["site_a_small", "site_b_medium", "site_c_large"],
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
