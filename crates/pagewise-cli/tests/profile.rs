//! `pagewise run --profile DIR`: the heap profile of a C program built
//! with -O2 and without frame pointers (three call sites of about 60, 30
//! and 10 % of the live bytes, and a leak), as the report's top call sites
//! (function and `file:line`), pprof (read back by `go tool pprof`,
//! Debian's golang-go), collapsed stacks and flamegraphs; one file set per
//! process of a tree of several; and Debian's `redis-server` (built
//! without frame pointers), unwound through its own functions.

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

/// The call sites of the top lines of one part of the report: the
/// function and what follows it (`(file:line)`, or the module).
fn top_sites(report: &str, heading: &str) -> Vec<String> {
    report
        .lines()
        .skip_while(|l| !l.contains(heading))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .filter_map(|l| l.split("allocations  ").nth(1))
        .map(str::to_string)
        .collect()
}

/// The functions of the top lines of one part of the report.
fn top_functions(report: &str, heading: &str) -> Vec<String> {
    top_sites(report, heading)
        .iter()
        .map(|f| f.split(' ').next().unwrap().to_string())
        .collect()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagewise-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The pids of the processes whose profiles were converted in `dir`
/// (those with a pprof file).
fn profiled_pids(dir: &Path) -> Vec<String> {
    let mut pids: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".pb.gz").map(str::to_string))
        .collect();
    pids.sort();
    pids
}

#[test]
fn run_profile_names_the_sites_and_writes_pprof_folded_and_svg() {
    let dir = scratch("profile");
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
    // Built with -g: each of the top sites is named with its file and line.
    for site in &top_sites(&report, "top call sites by bytes in use at the peak")[..3] {
        let (_, place) = site.split_once(" (").unwrap_or_default();
        let line = place
            .strip_suffix(')')
            .and_then(|p| p.rsplit_once("prof_sites.c:"))
            .map(|(_, line)| line);
        assert!(
            line.is_some_and(|l| l.parse::<u32>().is_ok()),
            "{site}: no prof_sites.c:LINE\n{report}"
        );
    }
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

/// `pagewise run --profile`, a command run as `pagewise run` runs it in
/// the tests (no inherited library or profiler settings).
fn run_profile(out_dir: &Path) -> Command {
    let mut c = Command::new(pagewise_and_library());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PAGEWISE_") || k == "LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c.arg("run").arg("--profile").arg(out_dir).arg("--");
    c
}

#[test]
fn run_profile_writes_a_file_set_for_each_process_of_the_tree() {
    // A shell that runs the program twice: two processes that leak, each
    // with its own profile, converted into its own files.
    let dir = scratch("profile-tree");
    let Some(prog) = program(&dir) else { return };
    let out_dir = dir.join("out");
    let prog = prog.display();
    let o = run_profile(&out_dir)
        .args(["sh", "-c"])
        .arg(format!("{prog} --hold; {prog} --hold"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{report}");
    let pids = profiled_pids(&out_dir);
    assert!(pids.len() >= 2, "profiles of {pids:?}\n{report}");
    let mut leaking = 0;
    for pid in &pids {
        for file in ["prof", "pb.gz"].into_iter().map(str::to_string).chain(
            ["peak", "leaks", "alloc"]
                .iter()
                .flat_map(|v| [format!("{v}.folded"), format!("{v}.svg")]),
        ) {
            let path = out_dir.join(format!("{pid}.{file}"));
            assert!(path.is_file(), "{} missing\n{report}", path.display());
        }
        assert!(
            report.contains(&format!("heap profile of process {pid} ")),
            "{pid}\n{report}"
        );
        let leaks = std::fs::read_to_string(out_dir.join(format!("{pid}.leaks.folded"))).unwrap();
        leaking += usize::from(leaks.contains("site_leaking"));
    }
    assert_eq!(leaking, 2, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for `child` at most `limit`, killing it then (None).
fn wait_at_most(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn run_profile_unwinds_redis_server_through_its_own_functions() {
    // Debian's redis-server is built with -O2 and without frame pointers,
    // and exports its functions' names (for its own crash reports): the
    // stacks of its SETs, from the unwind tables alone, must go from its
    // main through the event loop to the command.
    let Some(server) = common::debian_program("redis-server", "redis-server") else {
        return;
    };
    let Some(cli) = common::debian_program("redis-cli", "redis-tools") else {
        return;
    };
    let dir = scratch("profile-redis");
    let out_dir = dir.join("out");
    let socket = dir.join("redis.sock");
    let mut run = run_profile(&out_dir);
    run.arg(server)
        .args(["--port", "0", "--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .arg("--unixsocket")
        .arg(&socket)
        // 20 MB of values at one sample per 64 KiB: some 300 samples.
        .env("PAGEWISE_PROF_SAMPLE", "65536")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("report.txt")).unwrap());
    let child = run.spawn().unwrap();
    let start = std::time::Instant::now();
    // Connectable, not only bound: the socket file appears at `bind`,
    // before `listen`, and a connect in between is refused.
    while std::os::unix::net::UnixStream::connect(&socket).is_err()
        && start.elapsed() < std::time::Duration::from_secs(20)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let value = "v".repeat(1000);
    let sets: String = (0..20_000)
        .map(|i| format!("SET key:{i} {value}\r\n"))
        .collect();
    let mut pipe = Command::new(&cli)
        .arg("-s")
        .arg(&socket)
        .arg("--pipe")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(pipe.stdin.as_mut().unwrap(), sets.as_bytes()).unwrap();
    drop(pipe.stdin.take());
    let piped = pipe.wait_with_output().unwrap();
    // What redis counts it holds (every allocation through its zmalloc).
    let info = Command::new(&cli)
        .arg("-s")
        .arg(&socket)
        .args(["info", "memory"])
        .output()
        .unwrap();
    let used_memory: Option<u64> = String::from_utf8_lossy(&info.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok());
    let shutdown = Command::new(&cli)
        .arg("-s")
        .arg(&socket)
        .args(["shutdown", "nosave"])
        .output()
        .unwrap();
    let status = wait_at_most(child, std::time::Duration::from_secs(60));
    let report = std::fs::read_to_string(dir.join("report.txt")).unwrap_or_default();
    assert!(
        piped.status.success(),
        "redis-cli --pipe: {}\n{report}",
        String::from_utf8_lossy(&piped.stdout)
    );
    assert!(
        status.is_some(),
        "redis-server still running after SHUTDOWN ({}){report}",
        String::from_utf8_lossy(&shutdown.stderr)
    );
    let pids = profiled_pids(&out_dir);
    assert_eq!(pids.len(), 1, "{report}");
    let folded =
        std::fs::read_to_string(out_dir.join(format!("{}.alloc.folded", pids[0]))).unwrap();
    // Bytes of the stacks that pass through `chain` (outermost first).
    let through = |chain: &[&str]| -> u64 {
        folded
            .lines()
            .filter_map(|line| {
                let (stack, bytes) = line.rsplit_once(' ')?;
                let mut frames = stack.split(';');
                chain
                    .iter()
                    .all(|f| frames.any(|x| x == *f))
                    .then(|| bytes.parse::<u64>().unwrap())
            })
            .sum()
    };
    // The requests read (20 MB of values), from main through the event
    // loop; and the SETs, through the command's own function.
    let read = through(&["main", "aeMain", "readQueryFromClient"]);
    assert!(
        read > 10 << 20,
        "{read} bytes allocated from main through aeMain and readQueryFromClient\n{folded}"
    );
    let set = through(&["main", "aeMain", "processCommand", "call", "setCommand"]);
    assert!(
        set > 0,
        "nothing allocated from main through aeMain to setCommand\n{folded}"
    );
    // Still in use at exit (SHUTDOWN NOSAVE frees nothing): what redis
    // counted it held, within a quarter (its values are resized in place
    // after they are read, as sampled objects must be too).
    let used = used_memory.expect("INFO memory's used_memory") as f64;
    let leaks: u64 = std::fs::read_to_string(out_dir.join(format!("{}.leaks.folded", pids[0])))
        .unwrap()
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert!(
        (leaks as f64 / used - 1.0).abs() < 0.25,
        "still in use at exit: {leaks} bytes estimated, redis counted {used}\n{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_profile_reads_lines_from_a_detached_debug_file() {
    // The program's debug information moved to prof_sites.debug, named by
    // its .gnu_debuglink (as distributions ship it): the report's sites
    // still carry file and line.
    let dir = scratch("profile-debuglink");
    let Some(prog) = program(&dir) else { return };
    if Command::new("objcopy").arg("--version").output().is_err() {
        common::missing("objcopy", "binutils");
        return;
    }
    let debug = dir.join("prof_sites.debug");
    for args in [
        vec!["--only-keep-debug".into(), prog.clone(), debug.clone()],
        vec![
            "--strip-debug".into(),
            format!("--add-gnu-debuglink={}", debug.display()).into(),
            prog.clone(),
        ],
    ] {
        let o = Command::new("objcopy").args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = run_profile(&dir.join("out"))
        .arg(&prog)
        .arg("--hold")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{report}");
    let leaks = top_sites(&report, "still in use at exit");
    let top = leaks.first().map(String::as_str).unwrap_or_default();
    assert!(
        top.starts_with("site_leaking (") && top.contains("prof_sites.c:"),
        "{top}\n{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
