//! The harness, not the numbers: every workload runs under every built-in
//! allocator, the JSON parses, charts are written, bad allocators are
//! refused with a clear message. No timing is asserted.
//!
//! tcmalloc is a built-in peer, from Debian's `libtcmalloc-minimal4`
//! (`.ci/clib-deps.sh` installs it). Where it is missing, the tests that
//! need it fail in CI and say so and skip it elsewhere (`common::missing`),
//! as the C library's tests do for lua5.4.

mod common;

use pagewise_bench::workloads::{self, allocator_independent, Rec, Scale, WORKLOADS};
use pagewise_bench::{run, BenchArgs};
use std::path::PathBuf;

fn worker_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise-bench-worker-system"))
        .parent()
        .expect("bin dir")
        .to_path_buf()
}

/// The allocator label of every run in a JSON file the runner wrote.
fn run_labels(json: &std::path::Path) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["allocator"].as_str().unwrap().to_string())
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagewise-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d.join(name)
}

/// Where tcmalloc is; None if it is not installed (`common::missing`: a
/// failure in CI, a visible skip elsewhere).
fn tcmalloc_path() -> Option<PathBuf> {
    match pagewise_bench::AllocSpec::parse("tcmalloc") {
        Ok(spec) => Some(spec.preload.expect("preloaded")),
        Err(_) => {
            common::missing(
                "tcmalloc (libtcmalloc_minimal.so.4)",
                "libtcmalloc-minimal4",
            );
            None
        }
    }
}

fn tiny(allocs: &[&str]) -> BenchArgs {
    BenchArgs {
        alloc: allocs.iter().map(|s| s.to_string()).collect(),
        scale: Some("tiny".into()),
        runs: Some(1),
        idle_ms: Some(0),
        worker_dir: Some(worker_dir()),
        ..BenchArgs::default()
    }
}

/// Every workload but `redis`, which runs redis-server rather than a
/// worker (its own test is below).
fn worker_workloads() -> Vec<String> {
    WORKLOADS
        .iter()
        .filter(|w| **w != "redis")
        .map(|w| w.to_string())
        .collect()
}

#[test]
fn every_workload_runs_in_process() {
    for w in worker_workloads() {
        let w = w.as_str();
        let mut rec = Rec::new();
        let survivors = workloads::run(w, Scale::Tiny, 7, &mut rec).expect("known workload");
        assert!(rec.ops > 0, "{w}: no operations counted");
        assert!(!rec.parts.is_empty(), "{w}: no parts recorded");
        for o in survivors.as_slice() {
            pagewise_bench::util::free_obj(*o);
        }
    }
    assert!(workloads::run("nope", Scale::Tiny, 7, &mut Rec::new()).is_err());
}

#[test]
fn suite_runs_under_every_builtin_and_json_parses() {
    let json = tmp("all.json");
    let plots = tmp("plots");
    // Without tcmalloc (a visible skip of that part, a failure in CI), the
    // other four.
    let with_tcmalloc = tcmalloc_path().is_some();
    let all = ["pagewise", "system", "jemalloc", "mimalloc", "tcmalloc"];
    let all = &all[..if with_tcmalloc { 5 } else { 4 }];
    let mut args = tiny(all);
    args.json = Some(json.clone());
    args.plot = Some(plots.clone());
    args.only = worker_workloads();
    let code = run(&args).expect("suite runs");
    let text = std::fs::read_to_string(&json).expect("json written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json parses");
    let runs = v["runs"].as_array().expect("runs array");
    // Allocator-independent workloads run once, under pagewise.
    let independent = WORKLOADS
        .iter()
        .filter(|w| allocator_independent(w))
        .count();
    let expected = (WORKLOADS.len() - 1 - independent) * all.len() + independent;
    assert_eq!(runs.len(), expected);
    for r in runs {
        assert!(
            r["error"].is_null(),
            "{} under {} failed: {}",
            r["workload"],
            r["allocator"],
            r["error"]
        );
        let res = &r["result"];
        assert!(res["ops"].as_u64().unwrap() > 0);
        assert!(res["elapsed_ns"].as_u64().unwrap() > 0);
        assert!(res["peak_rss"].as_u64().is_some());
        assert!(res["samples"].is_array());
        // Counted syscalls exist exactly where they can be counted: not
        // under glibc, nor under a preloaded library.
        let counted = !res["syscalls"].is_null();
        let preloaded = r["allocator"] == "tcmalloc";
        assert_eq!(counted, r["allocator"] != "system" && !preloaded, "{r}");
        if preloaded {
            assert_eq!(res["worker"], "system", "{r}");
            let why = res["syscall_source"].as_str().unwrap();
            assert!(why.starts_with("n/a: preloaded library"), "{r}");
        }
    }
    assert_eq!(code, 0);
    let summary = v["summary"]["cells"].as_array().expect("summary");
    assert_eq!(summary.len(), expected);
    for w in WORKLOADS.iter().filter(|w| allocator_independent(w)) {
        let ran: Vec<&serde_json::Value> = runs.iter().filter(|r| r["workload"] == *w).collect();
        assert_eq!(ran.len(), 1, "{w} runs once");
        assert_eq!(ran[0]["allocator"], "pagewise", "{w} runs under pagewise");
        assert_eq!(
            v["allocator_independent"],
            serde_json::json!([[w, "pagewise"]])
        );
    }
    for w in worker_workloads() {
        assert!(
            plots.join(format!("throughput-{w}.svg")).is_file(),
            "{w} chart"
        );
    }
    let svg = std::fs::read_to_string(plots.join("rss-phases.svg")).expect("rss chart");
    assert!(svg.starts_with("<svg"));
}

#[test]
fn only_filters_workloads() {
    let json = tmp("only.json");
    let mut args = tiny(&["system"]);
    args.only = vec!["churn".into(), "mixed".into()];
    args.json = Some(json.clone());
    assert_eq!(run(&args).expect("runs"), 0);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["workloads"], serde_json::json!(["churn", "mixed"]));
}

fn err_of(args: &BenchArgs) -> String {
    format!("{:#}", run(args).expect_err("must fail"))
}

#[test]
fn missing_so_is_a_clear_error() {
    let e = err_of(&tiny(&[
        "pagewise",
        "/nonexistent/libtcmalloc_minimal.so.4",
    ]));
    assert!(e.contains("/nonexistent/libtcmalloc_minimal.so.4"), "{e}");
    assert!(e.contains("cannot read"), "{e}");
}

#[test]
fn non_elf_so_is_a_clear_error() {
    let p = tmp("fake.so");
    std::fs::write(&p, b"not a library").unwrap();
    let e = err_of(&tiny(&[p.to_str().unwrap()]));
    assert!(e.contains("not an ELF"), "{e}");
}

#[test]
fn so_the_loader_refuses_is_a_clear_error() {
    // ELF magic, then garbage: passes the cheap check, ld.so refuses it.
    let p = tmp("broken.so");
    let mut bytes = b"\x7fELF".to_vec();
    bytes.extend_from_slice(&[0u8; 60]);
    std::fs::write(&p, bytes).unwrap();
    let e = err_of(&tiny(&[p.to_str().unwrap()]));
    assert!(e.contains("cannot be preloaded"), "{e}");
}

#[test]
fn a_real_so_is_preloaded() {
    // Any shared library shows the mechanism (the worker checks that the
    // loader mapped it); libm is on every glibc system.
    let Some(libm) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file()) else {
        common::missing("libm.so.6", "libc6");
        return;
    };
    let mut args = tiny(&[libm]);
    args.only = vec!["churn".into()];
    assert_eq!(run(&args).expect("preload runs"), 0);
}

#[test]
fn unknown_names_are_clear_errors() {
    let e = err_of(&tiny(&["hoard"]));
    assert!(e.contains("unknown allocator `hoard`"), "{e}");
    assert!(
        e.contains("tcmalloc"),
        "the known names include tcmalloc: {e}"
    );
    let mut args = tiny(&["system"]);
    args.only = vec!["nope".into()];
    let e = err_of(&args);
    assert!(e.contains("unknown workload `nope`"), "{e}");
}

#[test]
fn tcmalloc_is_preloaded_from_the_system_library_dirs() {
    let Some(path) = tcmalloc_path() else {
        return;
    };
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(name.starts_with("libtcmalloc_minimal.so.4"), "{path:?}");
    let spec = pagewise_bench::AllocSpec::parse("tcmalloc").unwrap();
    assert_eq!(spec.label, "tcmalloc");
    assert_eq!(spec.worker, "system");
    // Looked up in the directory it is in (and only there): the same file.
    let dir = std::fs::canonicalize(&path).unwrap();
    let dir = dir.parent().unwrap().to_path_buf();
    let spec = pagewise_bench::AllocSpec::parse_in("tcmalloc", &[dir]).unwrap();
    assert_eq!(spec.preload.as_deref(), Some(path.as_path()));
}

/// The runner binary with `args` at tiny scale, one run, no idle period,
/// workers from the test's target dir: (exit code, stderr).
fn runner(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagewise-bench"))
        .args(["--scale", "tiny", "--runs", "1", "--idle-ms", "0"])
        .arg("--worker-dir")
        .arg(worker_dir())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runner starts");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tcmalloc_asked_for_but_missing_is_a_usage_error() {
    let nowhere = tmp("no-libs-here");
    let mut args = tiny(&["pagewise", "tcmalloc"]);
    args.lib_dir = vec![nowhere.clone()];
    let e = err_of(&args);
    assert!(e.contains("allocator `tcmalloc`"), "{e}");
    assert!(e.contains("libtcmalloc_minimal.so.4 not found"), "{e}");
    assert!(e.contains(&nowhere.display().to_string()), "{e}");
    assert!(e.contains("apt-get install libtcmalloc-minimal4"), "{e}");
    // The binary reports it as a usage error: exit code 2.
    let (code, stderr) = runner(&[
        "--alloc",
        "pagewise,tcmalloc",
        "--only",
        "churn",
        "--lib-dir",
        nowhere.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("apt-get install libtcmalloc-minimal4"),
        "{stderr}"
    );
}

#[test]
fn default_list_leaves_out_a_missing_tcmalloc_with_a_note() {
    let json = tmp("default-missing.json");
    let nowhere = tmp("no-libs-either");
    let (code, stderr) = runner(&[
        "--only",
        "churn",
        "--lib-dir",
        nowhere.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("tcmalloc")).collect();
    assert_eq!(notes.len(), 1, "one line on tcmalloc: {stderr}");
    assert!(
        notes[0].contains("apt-get install libtcmalloc-minimal4"),
        "{stderr}"
    );
    let labels = run_labels(&json);
    assert_eq!(labels.len(), 4, "{labels:?}");
    assert!(!labels.iter().any(|l| l == "tcmalloc"), "{labels:?}");
}

#[test]
fn default_list_includes_tcmalloc_when_installed() {
    if tcmalloc_path().is_none() {
        return;
    }
    let json = tmp("default.json");
    let (code, stderr) = runner(&["--only", "churn", "--json", json.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("left out"), "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let labels: Vec<&str> = v["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["pagewise", "system", "jemalloc", "mimalloc", "tcmalloc"]
    );
    let tc = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["allocator"] == "tcmalloc")
        .expect("a tcmalloc run");
    assert!(tc["error"].is_null(), "{tc}");
    assert!(tc["result"]["syscalls"].is_null(), "{tc}");
}

#[test]
fn missing_workers_say_how_to_build_them() {
    let mut args = tiny(&["pagewise"]);
    args.worker_dir = Some(tmp("empty-release-dir"));
    std::fs::create_dir_all(args.worker_dir.as_ref().unwrap()).unwrap();
    let e = err_of(&args);
    assert!(e.contains("pagewise-bench-worker-pagewise"), "{e}");
    assert!(e.contains("cargo build"), "{e}");
    assert!(e.contains("-p pagewise-bench --bins"), "{e}");
}

#[test]
fn page_floor_counts_pages_holding_live_bytes() {
    use pagewise_bench::util::{pages_touched, Obj, PAGE};
    let base = 1 << 30;
    let objs = [
        Obj {
            addr: base,
            size: 16,
        }, // page 0
        Obj {
            addr: base + 100,
            size: 16,
        }, // page 0 again
        Obj {
            addr: base + PAGE - 8,
            size: 16,
        }, // pages 0 and 1
        Obj {
            addr: base + 5 * PAGE,
            size: 3 * PAGE,
        }, // pages 5, 6, 7
    ];
    assert_eq!(pages_touched(&objs), 5);
    assert_eq!(pages_touched(&[]), 0);
}

/// Runs one workload under the given allocators at tiny scale, returns the
/// parsed JSON and the text report's exit code.
fn run_json(name: &str, workload: &str, allocs: &[&str]) -> serde_json::Value {
    let json = tmp(name);
    let mut args = tiny(allocs);
    args.only = vec![workload.into()];
    args.json = Some(json.clone());
    assert_eq!(run(&args).expect("runs"), 0);
    serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
        .expect("json parses")
}

fn figure(part: &serde_json::Value, name: &str) -> f64 {
    part["figures"]
        .as_array()
        .expect("figures")
        .iter()
        .find(|f| f[0] == name)
        .unwrap_or_else(|| panic!("figure {name} in {part}"))[1]
        .as_f64()
        .expect("number")
}

#[test]
fn arena_churn_runs_each_variant_under_each_allocator() {
    let v = run_json(
        "arena-churn.json",
        "arena-churn",
        &["pagewise", "system", "jemalloc", "mimalloc"],
    );
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 4);
    for r in runs {
        let res = &r["result"];
        assert!(r["error"].is_null(), "{r}");
        let parts = res["parts"].as_array().expect("parts");
        let names: Vec<&str> = parts.iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, workloads::ARENA_VARIANTS);
        let mut ops = 0;
        for p in parts {
            assert!(p["ops"].as_u64().unwrap() > 0, "{p}");
            assert!(p["ns"].as_u64().unwrap() > 0, "{p}");
            let peak = p["peak_rss"].as_u64().expect("per-variant peak");
            // The whole run's peak covers every variant's.
            assert!(res["peak_rss"].as_u64().unwrap() >= peak, "{r}");
            ops += p["ops"].as_u64().unwrap();
        }
        assert_eq!(res["ops"].as_u64().unwrap(), ops);
        // Every variant gets the same trace, so the same objects.
        assert!(parts.iter().all(|p| p["ops"] == parts[0]["ops"]), "{r}");
        // The pagewise pool's figures.
        assert!(figure(&parts[0], "fresh blocks") > 0.0);
    }
    let cells = v["summary"]["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4);
    for c in cells {
        assert_eq!(c["parts"].as_array().unwrap().len(), 3);
        assert!(c["parts"][0]["peak_rss_net"].as_f64().is_some(), "{c}");
    }
}

#[test]
fn jit_pools_runs_once_and_its_accounting_adds_up() {
    let v = run_json(
        "jit-pools.json",
        "jit-pools",
        &["system", "pagewise", "jemalloc"],
    );
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "allocator-independent: one run");
    assert_eq!(runs[0]["allocator"], "pagewise");
    let parts = runs[0]["result"]["parts"].as_array().expect("parts");
    let names: Vec<&str> = parts.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(&names[..3], ["first fit", "best fit", "worst fit"]);
    for p in parts {
        let asked = figure(p, "asked_for");
        let allocated = figure(p, "allocated");
        let waste: f64 = ["lwaste", "swaste", "nwaste", "owaste"]
            .iter()
            .map(|w| figure(p, w))
            .sum();
        assert!(asked > 0.0);
        assert_eq!(allocated, asked + waste, "{p}");
        assert!((figure(p, "factor") - allocated / asked).abs() < 1e-9);
    }
    // Same trace for every fit.
    assert!(parts
        .iter()
        .all(|p| figure(p, "asked_for") == figure(&parts[0], "asked_for")));
    assert_eq!(v["summary"]["cells"].as_array().unwrap().len(), 1);
    // The trace is fixed: a second run accounts exactly the same bytes.
    let again = run_json("jit-pools-again.json", "jit-pools", &["pagewise"]);
    let parts2 = again["runs"][0]["result"]["parts"]
        .as_array()
        .expect("parts");
    for (a, b) in parts.iter().zip(parts2) {
        assert_eq!(a["figures"], b["figures"]);
    }
    // Without pagewise in --alloc it runs under the first allocator.
    let v = run_json("jit-pools-system.json", "jit-pools", &["system"]);
    assert_eq!(v["runs"][0]["allocator"], "system");
}

#[test]
fn another_build_runs_beside_pagewise_under_its_own_label() {
    let exe = env!("CARGO_BIN_EXE_pagewise-bench-worker-pagewise");
    let json = tmp("two-builds.json");
    let (code, stderr) = runner(&[
        "--alloc",
        &format!("pagewise,other={exe}"),
        "--only",
        "churn",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let labels = run_labels(&json);
    assert_eq!(labels, ["pagewise", "other"], "{labels:?}");
    let spec = pagewise_bench::AllocSpec::parse(&format!("other={exe}")).unwrap();
    assert_eq!(
        (spec.label.as_str(), spec.worker.as_str()),
        ("other", "pagewise")
    );
    // A built-in name as the label, or a path that is no executable, is
    // refused with a message.
    let e = pagewise_bench::AllocSpec::parse(&format!("jemalloc={exe}")).unwrap_err();
    assert!(format!("{e:#}").contains("a label of its own"), "{e:#}");
    let e = pagewise_bench::AllocSpec::parse("x=/nonexistent/worker").unwrap_err();
    assert!(format!("{e:#}").contains("no worker executable"), "{e:#}");
    let notes = tmp("notes.txt");
    std::fs::write(&notes, "not an ELF file").unwrap();
    let e = pagewise_bench::AllocSpec::parse(&format!("x={}", notes.display())).unwrap_err();
    assert!(format!("{e:#}").contains("not an executable"), "{e:#}");
}

/// `cargo build -p pagewise-c` into this build's target directory and
/// profile (cargo test does not build a cdylib-only library): the redis
/// workload preloads `libpagewise.so` from next to the workers.
fn build_libpagewise() {
    let dir = worker_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "pagewise-c", "--target-dir"])
        .arg(dir.parent().unwrap());
    match dir.file_name().unwrap().to_str().unwrap() {
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
    assert!(dir.join("libpagewise.so").is_file());
}

/// A real program: redis-server under pagewise with and without
/// meshing and under its own jemalloc, with redis's fragmentation ratio
/// and the same with PSS reported for each.
#[test]
fn redis_runs_under_pagewise_with_and_without_meshing() {
    if pagewise_bench::redis_server().is_none() {
        common::missing("redis-server", "redis-server");
        return;
    }
    build_libpagewise();
    let json = tmp("redis.json");
    let mut args = tiny(&["pagewise", "pagewise-mesh", "jemalloc", "system"]);
    args.only = vec!["redis".into()];
    args.idle_ms = Some(1500);
    args.json = Some(json.clone());
    assert_eq!(run(&args).expect("runs"), 0);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    // Not glibc: redis-server is linked with jemalloc, which comes first.
    let labels: Vec<&str> = runs
        .iter()
        .map(|r| r["allocator"].as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert!(!labels.contains(&"system"));
    for r in runs {
        assert!(r["error"].is_null(), "{}: {}", r["allocator"], r["error"]);
        let res = &r["result"];
        let extra = |k: &str| {
            res["extra"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e[0] == k)
                .and_then(|e| e[1].as_f64())
                .unwrap_or_else(|| panic!("{}: no {k}", r["allocator"]))
        };
        assert!(extra("mem_fragmentation_ratio") > 0.0);
        assert!(extra("memory_fragmentation_ratio") > 0.0);
        assert!(res["live_bytes"].as_u64().unwrap() > 0);
        assert!(res["rss_idle"].as_u64().unwrap() > 0);
    }
}

/// A `--quick` run's text, on the smallest set that prints every kind of
/// table (two allocators; churn's parts, jit-pools' named figures,
/// idle-one-thread's idle column): the summary first, no line wider than
/// 120 characters, a line saying that its ratios are not comparable with
/// the published ones, and a syscall legend that says whether the idle
/// period is counted. About 3 s of workers in a debug build.
#[test]
fn a_quick_runs_text_fits_120_columns_summary_first() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagewise-bench"))
        .args(["--quick", "--runs", "1", "--idle-ms", "100"])
        .args(["--alloc", "pagewise,system"])
        .args(["--only", "churn,jit-pools,idle-one-thread"])
        .arg("--worker-dir")
        .arg(worker_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runner starts");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let wide: Vec<&str> = text.lines().filter(|l| l.chars().count() > 120).collect();
    assert!(
        wide.is_empty(),
        "lines over 120 columns:\n{}",
        wide.join("\n")
    );
    let at = |s: &str| {
        text.find(s)
            .unwrap_or_else(|| panic!("no {s:?} in:\n{text}"))
    };
    assert!(at("Summary") < at("### churn"), "{text}");
    assert!(at("NOT COMPARABLE with the published figures") < at("| workload"));
    at("the idle period is NOT counted");
    // Every kind of table: the parts, the named figures, the idle column.
    at("| part");
    at("asked_for");
    at("after idle");
}
