//! Heavily multi-threaded programs that fork, under
//! `LD_PRELOAD=libpagewise.so`: the same output, byte for byte, as under
//! glibc, every process's allocations through pagewise, and no hang (each
//! run is killed, with its whole process group, after a generous limit, so
//! a deadlock is a failure rather than a hung test run).
//!
//! - python3 (`tests/programs/parallel.py`): 8 threads in SQLite queries
//!   (outside the GIL, so inside malloc in parallel) and 16 pool threads
//!   keep allocating while the process forks 12 `ProcessPoolExecutor`
//!   workers and 4 `os.fork()` children, which allocate and run threads
//!   of their own.
//! - git (`tests/programs/git_workload.sh`): commits three versions of a
//!   generated 1500-file tree, then `gc --aggressive` and `repack` with 8
//!   delta-search threads (gc forks repack, pack-objects, prune...),
//!   `index-pack --threads=8`, `grep --threads=8`, `fsck`.
//!
//! Every process writes its report to `stats.<pid>.json` (`%p`); python's
//! children, which leave through `os._exit()`, write theirs themselves as
//! they start (`<pid>-start`) and end.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Generous: each run needs seconds (tens on a loaded machine, in a debug
/// build); the limit only turns a hang into a failure.
const LIMIT: Duration = Duration::from_secs(600);

/// Runs `cmd` in its own process group (killed whole after [`LIMIT`]);
/// returns its pid and output.
fn run(what: &str, mut cmd: Command) -> (u32, Output) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let out = wait_or_kill(child, LIMIT)
        .unwrap_or_else(|| panic!("{what}: still running after {LIMIT:?}: killed (a hang)"));
    (pid, out)
}

/// Runs `build(false)` plainly, then `build(true)` preloaded with its
/// reports written to `dir`; both must succeed with the same stdout and
/// stderr. Returns the preloaded run's pid and stdout.
fn compare(what: &str, dir: &Path, build: impl Fn(bool) -> Command) -> (u32, String) {
    let (_, plain) = run(&format!("{what} (plain)"), build(false));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        plain.status.success(),
        "{what} (plain): {}\n{}",
        plain.status,
        text(&plain.stderr)
    );
    let mut cmd = build(true);
    cmd.env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_STATS_FILE", dir.join("stats.%p.json"));
    let (pid, pre) = run(&format!("{what} (LD_PRELOAD)"), cmd);
    assert!(
        pre.status.success(),
        "{what} under LD_PRELOAD: {}\n{}",
        pre.status,
        text(&pre.stderr)
    );
    assert_eq!(
        text(&pre.stdout),
        text(&plain.stdout),
        "{what}: stdout differs under LD_PRELOAD"
    );
    assert_eq!(
        text(&pre.stderr),
        text(&plain.stderr),
        "{what}: stderr differs under LD_PRELOAD"
    );
    assert!(!plain.stdout.is_empty());
    (pid, text(&pre.stdout))
}

/// Every report in `dir`, by what `%p` became (`<pid>` or `<pid>-start`).
fn reports(dir: &Path) -> BTreeMap<String, serde_json::Value> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|name| {
            let key = name
                .strip_prefix("stats.")?
                .strip_suffix(".json")?
                .to_owned();
            let text = std::fs::read_to_string(dir.join(&name)).unwrap();
            let v = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("bad JSON in {name}: {e}\n{text}"));
            Some((key, v))
        })
        .collect()
}

#[test]
fn python3_threads_with_forked_process_pools() {
    let Some(py) = debian_program("python3", "python3") else {
        return;
    };
    let dir = scratch("parallel-python3");
    let (pid, stdout) = compare("python3 parallel.py", &dir, |_| {
        let mut c = command(&py);
        c.arg(program_file("parallel.py"))
            .env("PYTHONMALLOC", "malloc")
            .env("PYTHONHASHSEED", "0");
        c
    });
    // The premise: all 8 query threads were running through every fork.
    assert!(
        stdout.contains("query threads alive through the forks: 8 wrong results: 0"),
        "{stdout}"
    );
    assert!(stdout.contains("forked child 3 status 0"), "{stdout}");
    let reports = reports(&dir);
    let parent = &reports[&pid.to_string()];
    assert!(
        total_allocs(parent) > 5_000_000,
        "the parent's objects went through pagewise: {}",
        total_allocs(parent)
    );
    // 12 pool workers and 4 forked children reported as they started and
    // as they ended: each allocated through pagewise in between (the start
    // report counts what it inherited from the parent).
    let starts: Vec<&String> = reports.keys().filter(|k| k.ends_with("-start")).collect();
    assert_eq!(starts.len(), 16, "{:?}", reports.keys());
    assert_eq!(reports.len(), 1 + 2 * 16, "{:?}", reports.keys());
    let mut made = Vec::new();
    for start in starts {
        let child = start.strip_suffix("-start").unwrap();
        let end = reports
            .get(child)
            .unwrap_or_else(|| panic!("no final report from {child}"));
        let n = total_allocs(end) - total_allocs(&reports[start.as_str()]);
        assert!(n > 0, "{child} allocated nothing through pagewise");
        made.push(n);
    }
    // The 24 pool tasks (however the workers shared them) and the 16
    // thread tasks of the forked children, some 200,000 allocations each;
    // each forked child ran 4 of them.
    let total: u64 = made.iter().sum();
    assert!(total > 40 * 100_000, "children's allocations: {made:?}");
    let busy = made.iter().filter(|&&n| n > 4 * 100_000).count();
    assert!(busy >= 4, "children's allocations: {made:?}");
}

/// Three versions of a 1500-file tree (40 directories, ~3 KB files of
/// generated words): v2 changes a third of v1's files, v3 a fifth of v2's.
fn write_trees(dir: &Path) {
    const WORDS: [&str; 32] = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
        "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi",
        "chi", "psi", "omega", "malloc", "free", "page", "slab", "heap", "span", "segment",
        "thread",
    ];
    for (v, version) in ["v1", "v2", "v3"].iter().enumerate() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..1500 {
            let d = dir.join(version).join(format!("d{:02}", i % 40));
            std::fs::create_dir_all(&d).unwrap();
            let mut lines: Vec<String> = (0..60)
                .map(|j| {
                    let mut line = String::new();
                    for _ in 0..6 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        line.push_str(WORDS[(x % 32) as usize]);
                        line.push(' ');
                    }
                    line + &j.to_string()
                })
                .collect();
            if v >= 1 && i % 3 == 0 {
                lines[i % 60] = "changed in v2".into();
                lines.push("more in v2".into());
            }
            if v >= 2 && i % 5 == 0 {
                lines.insert(5, "inserted in v3".into());
            }
            std::fs::write(d.join(format!("f{i}.txt")), lines.join("\n") + "\n").unwrap();
        }
    }
}

#[test]
fn git_threaded_repack_and_index_pack() {
    let Some(git) = debian_program("git", "git") else {
        return;
    };
    let bin = git.parent().unwrap().to_str().unwrap().to_owned();
    let script = program_file("git_workload.sh");
    let work = scratch("parallel-git");
    let dir = work.join("stats");
    std::fs::create_dir_all(&dir).unwrap();
    for side in ["plain", "preloaded"] {
        write_trees(&work.join(side));
    }
    // Each run in a fresh copy of the trees.
    let (_, stdout) = compare("git_workload.sh", &dir, |preloaded| {
        let mut c = command("/bin/sh");
        c.arg(&script)
            .current_dir(work.join(if preloaded { "preloaded" } else { "plain" }))
            // Debian's git and coreutils, not another git earlier on PATH.
            .env("PATH", format!("{bin}:/usr/bin:/bin"));
        c
    });
    assert!(stdout.ends_with("done\n"), "{stdout}");
    assert!(stdout.contains("in-pack: "), "{stdout}");
    let reports = reports(&dir);
    // Each of the script's processes (sh, cp, sha256sum, and some 25 git
    // commands and the ones gc forks) reported.
    assert!(reports.len() >= 30, "{} reports", reports.len());
    // The threaded ones (pack-objects, index-pack and grep with 8 threads)
    // each made a heap per thread.
    let threaded = reports
        .values()
        .filter(|v| field(v, &["heaps"]) >= 5)
        .count();
    assert!(threaded >= 3, "{threaded} processes with 5 heaps or more");
    let allocs: u64 = reports.values().map(total_allocs).sum();
    assert!(allocs > 500_000, "allocations through pagewise: {allocs}");
}
