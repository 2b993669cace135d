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
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "pagewise-c",
        "-p",
        "pagewise-c-secure",
    ])
    .arg("--target-dir")
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
        "cargo build -p pagewise-c -p pagewise-c-secure failed:\n{}",
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
        let secure = profile.join("libpagewise_secure.so");
        let dir = profile.join("pagewise-cli-installed");
        std::fs::create_dir_all(&dir).unwrap();
        for (from, name) in [
            (exe, "pagewise"),
            (lib.as_path(), "libpagewise.so"),
            (secure.as_path(), "libpagewise_secure.so"),
        ] {
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
        "live objects (requested size)",
        "internal rounding",
        "free slots in used pages",
        "retained empty pages",
        "allocator metadata",
        "attributed total",
        "System calls",
        "Busiest size classes",
        "page faults",
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
    // Each OS page the process touched first faulted once (python3's own
    // code and data too): at least a fault per 2 MiB resident, whatever
    // huge pages backed.
    assert!(get(&["os", "minor_faults"]) >= rss >> 21, "{v}");
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

/// Compiles `source` with `cc` and `flags` into `dir/name`; None (after
/// `common::missing`) if there is no C compiler, or, with `-static`, no
/// static C library.
fn compile(dir: &Path, name: &str, source: &str, flags: &[&str]) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let out = dir.join(name);
    let o = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .output();
    match o {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => {
            let what = format!(
                "cc {} (it failed: {})",
                flags.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            );
            common::missing(&what, "gcc libc6-dev");
            None
        }
        Err(_) => {
            common::missing("cc (a C compiler)", "gcc libc6-dev");
            None
        }
    }
}

/// Byte figures of the report (`12 B`, `-3.5 MiB`) that are negative.
fn negative_byte_figures(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(2).any(|w| {
                w[0].starts_with('-')
                    && w[0][1..].parse::<f64>().is_ok()
                    && ["B", "KiB", "MiB", "GiB", "TiB"]
                        .contains(&w[1].trim_end_matches([',', ')']))
            })
        })
        .collect()
}

#[test]
fn negative_figures_are_found() {
    assert_eq!(
        negative_byte_figures("a\n  minus: x   -37.2 MiB  -3.0%\n  b 3 B"),
        vec!["  minus: x   -37.2 MiB  -3.0%"]
    );
    assert!(negative_byte_figures("gap -3.0% of 2 MiB, exit -1").is_empty());
}

#[test]
fn a_pipeline_gets_one_report_per_process() {
    let dir = scratch("pipeline");
    let json = dir.join("report.json");
    let o = pagewise()
        .args(["run", "--json"])
        .arg(&json)
        .args(["--", "sh", "-c", "seq 1 100000 | sort -n | tail -1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "100000\n");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let top = v["pid"].as_u64().unwrap();
    let procs = v["processes"].as_array().expect("processes in the JSON");
    // sh and the three programs of its pipeline, each with its own report.
    assert_eq!(procs.len(), 4, "{stderr}");
    assert_eq!(procs[0]["pid"].as_u64(), Some(top), "the top process first");
    let mut pids: Vec<u64> = procs.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 4);
    for name in ["seq", "sort", "tail"] {
        let p = procs
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no report for {name}:\n{stderr}"));
        let pid = p["pid"].as_u64().unwrap();
        assert_ne!(pid, top);
        assert!(p["allocator"]["os"]["vm_hwm"].as_u64().unwrap() > 0);
        // The text has a section for it, with its name and pid.
        assert!(
            stderr.contains(&format!("`{name}` (pid {pid}")),
            "no section for {name} (pid {pid}):\n{stderr}"
        );
    }
    // sort held the most, and the tree's largest peak is its, not the top
    // process's (dash leaves through _exit, without a report: its own peak
    // is then the sampled one).
    let sort = procs.iter().find(|p| p["name"] == "sort").unwrap();
    let sort_hwm = sort["allocator"]["os"]["vm_hwm"].as_u64().unwrap();
    let top_peak = match procs[0]["allocator"]["os"]["vm_hwm"].as_u64() {
        Some(hwm) => hwm,
        None => procs[0]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["rss"].as_u64().unwrap())
            .max()
            .expect("the top process sampled"),
    };
    assert!(sort_hwm > top_peak, "{stderr}");
    assert!(negative_byte_figures(&stderr).is_empty(), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn descendants_that_outlive_the_command_are_waited_for() {
    let dir = scratch("orphan");
    let json = dir.join("report.json");
    // The subshell's seq outlives sh, which exits at once.
    let o = pagewise()
        .args(["run", "--json"])
        .arg(&json)
        .args(["--", "sh", "-c", "(sleep 0.3; seq 1 3) & exit 0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n2\n3\n");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let procs = v["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["name"] == "seq" && p["allocator"].is_object()),
        "seq's report is in:\n{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_static_program_is_named_as_such() {
    let dir = scratch("static");
    let Some(prog) = compile(
        &dir,
        "static_prog",
        "#include <stdio.h>\n#include <stdlib.h>\nint main(void) { char *p = malloc(100); printf(\"%p\\n\", (void *)p); return 5; }\n",
        &["-static", "-O1"],
    ) else {
        return;
    };
    let o = pagewise().args(["run", "--"]).arg(&prog).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{stderr}");
    let shown = prog.display().to_string();
    assert!(
        stderr.contains(&format!(
            "`{shown}` is statically linked: LD_PRELOAD cannot reach it"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("_exit"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_command_is_echoed_with_its_quoting() {
    let o = pagewise()
        .args([
            "run", "--", "sh", "-c", "exit 0", "a b", "it's", "plain", "",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(r#"pagewise run: sh -c 'exit 0' 'a b' 'it'\''s' plain '' (pid "#),
        "{stderr}"
    );
}

/// Allocates 64 MiB and writes it, keeps it while samples are taken, frees
/// it and gives it back (so that RSS is lower at exit than at the peak),
/// and leaves 64 MiB allocated but never touched at exit.
const PEAK_AND_UNTOUCHED: &str = r#"
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    size_t n = 64u << 20;
    char *volatile touched = malloc(n);
    memset(touched, 1, n);
    char *volatile untouched = malloc(n);
    usleep(300 * 1000);
    free(touched);
    malloc_trim(0);
    printf("%d\n", untouched != NULL);
    return 0;
}
"#;

#[test]
fn the_report_has_no_negative_lines_and_a_breakdown_at_the_peak() {
    let dir = scratch("peak");
    let Some(prog) = compile(&dir, "peak", PEAK_AND_UNTOUCHED, &["-O0"]) else {
        return;
    };
    let json = dir.join("report.json");
    // Freed memory goes back at the free itself (no decay), so RSS drops
    // there: with the default decay a sample taken between the free and
    // `malloc_trim` has the peak's RSS (a page more if the free touched
    // one) and only one block live, and could be picked as the peak.
    let o = pagewise()
        .args(["run", "--interval-ms", "5", "--json"])
        .arg(&json)
        .arg("--")
        .arg(&prog)
        .env("PAGEWISE_DECAY_MS", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n");
    assert!(
        negative_byte_figures(&stderr).is_empty(),
        "negative lines in:\n{stderr}"
    );
    // The 64 MiB never touched is a note, not a line of its own.
    assert!(stderr.contains("committed but never touched"), "{stderr}");
    // Live objects (now) and allocations so far are named apart.
    assert!(stderr.contains("live objects"), "{stderr}");
    assert!(stderr.contains("allocations so far"), "{stderr}");
    // The breakdown at the peak: both blocks were live then.
    let at_peak = stderr
        .find("Where the resident bytes were at the peak")
        .unwrap_or_else(|| panic!("no breakdown at the peak:\n{stderr}"));
    let at_exit = stderr.find("Where the resident bytes are at exit").unwrap();
    assert!(at_peak < at_exit, "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let peak = &v["processes"][0]["peak"];
    assert!(
        peak["live_requested"].as_u64().unwrap() >= 128 << 20,
        "{peak}"
    );
    assert!(peak["rss"].as_u64().unwrap() >= 64 << 20, "{peak}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_secure_stops_a_program_that_writes_past_a_block() {
    let Some(py) = python() else { return };
    // 16 bytes asked for, 8 written past them, then freed.
    let script = "import ctypes\n\
        libc = ctypes.CDLL(None)\n\
        libc.malloc.restype = ctypes.c_void_p\n\
        libc.free.argtypes = [ctypes.c_void_p]\n\
        p = libc.malloc(16)\n\
        ctypes.memset(p + 16, 1, 8)\n\
        libc.free(p)\n\
        print('still running')\n";
    for secure in [false, true] {
        let mut c = pagewise();
        c.arg("run");
        if secure {
            c.arg("--secure");
        }
        let out = c.args(["--", py, "-c", script]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if secure {
            assert!(
                !stdout.contains("still running")
                    && stderr.contains("pagewise: heap buffer overflow")
                    && !out.status.success(),
                "{stdout}{stderr}"
            );
        } else {
            assert!(stdout.contains("still running"), "{stdout}{stderr}");
        }
    }
}

/// The `pagewise run --json` document of `args` (after `--`), its text
/// report and the command's stdout; asserts the command's exit status.
fn run_json(
    name: &str,
    args: &[&std::ffi::OsStr],
    code: i32,
) -> (serde_json::Value, String, String) {
    let dir = scratch(name);
    let json = dir.join("report.json");
    let o = pagewise()
        .args(["run", "--json"])
        .arg(&json)
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{stderr}");
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{e}:\n{stderr}"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (v, stderr, String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The process of pid `pid` in the JSON document.
fn process(v: &serde_json::Value, pid: u64, stderr: &str) -> serde_json::Value {
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("process {pid} is not in the JSON:\n{stderr}"))
        .clone()
}

/// The report's line for process `pid` (the first line naming it).
fn line_of(stderr: &str, pid: u64) -> &str {
    let pid = pid.to_string();
    stderr
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == pid))
        .unwrap_or_else(|| panic!("no line names process {pid}:\n{stderr}"))
}

/// Three children of 20, 40 and 60 MiB (each written); the third leaves
/// through `_exit`, which runs no exit handler, so the library writes no
/// report for it. Prints `pid MiB` for each.
const THREE_CHILDREN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    size_t mib[3] = {20, 40, 60};
    for (int i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            char *volatile p = malloc(mib[i] << 20);
            memset(p, 1, mib[i] << 20);
            if (i == 2)
                _exit(0);
            exit(0);
        }
        printf("%d %zu\n", (int)pid, mib[i]);
    }
    while (wait(NULL) > 0) {}
    return 0;
}
"#;

#[test]
fn every_child_appears_with_its_size_even_one_that_leaves_through_exit() {
    let dir = scratch("three-children");
    let Some(prog) = compile(&dir, "three_children", THREE_CHILDREN, &["-O0"]) else {
        return;
    };
    let (v, stderr, stdout) = run_json("three-children-run", &[prog.as_os_str()], 0);
    assert_eq!(v["processes"].as_array().unwrap().len(), 4, "{stderr}");
    for line in stdout.lines() {
        let (pid, mib) = line.split_once(' ').unwrap();
        let (pid, mib): (u64, u64) = (pid.parse().unwrap(), mib.parse().unwrap());
        let p = process(&v, pid, &stderr);
        let peak = p["peak_rss_bytes"].as_u64().unwrap();
        assert!(
            peak >= mib << 20 && peak < (mib + 24) << 20,
            "child {pid} of {mib} MiB: peak {peak}\n{stderr}"
        );
        // The row's first figure is the peak RSS.
        let row = line_of(&stderr, pid);
        let words: Vec<&str> = row.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "MiB").unwrap();
        let shown: f64 = words[at - 1].parse().unwrap();
        assert!(
            shown >= mib as f64 && shown < (mib + 24) as f64,
            "{row}\n{stderr}"
        );
        if mib == 60 {
            assert!(p["allocator"].is_null(), "{p}");
            assert!(p["ending"].as_str().unwrap().contains("_exit"), "{p}");
            assert!(row.contains("_exit"), "{row}\n{stderr}");
        } else {
            assert!(p["allocator"].is_object(), "{p}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A child that writes 30 MiB and is killed by SIGKILL (no exit handler,
/// and no stop at exit for a tracer either). Prints its pid.
const KILLED_CHILD: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char *volatile p = malloc(30u << 20);
        memset(p, 1, 30u << 20);
        raise(SIGKILL);
    }
    printf("%d\n", (int)pid);
    int status;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 0 : 1;
}
"#;

#[test]
fn a_child_killed_by_a_signal_appears_as_such() {
    let dir = scratch("killed-child");
    let Some(prog) = compile(&dir, "killed_child", KILLED_CHILD, &["-O0"]) else {
        return;
    };
    let (v, stderr, stdout) = run_json("killed-child-run", &[prog.as_os_str()], 0);
    let pid: u64 = stdout.trim().parse().unwrap();
    let p = process(&v, pid, &stderr);
    assert_eq!(p["signal"].as_i64(), Some(9), "{p}");
    assert!(p["peak_rss_bytes"].as_u64().unwrap() >= 30 << 20, "{p}");
    assert!(
        line_of(&stderr, pid).contains("killed by SIGKILL"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_plot_of_a_pipeline_shows_its_biggest_process() {
    let Some(py) = python() else { return };
    let dir = scratch("pipeline-plot");
    let svg = dir.join("plot.svg");
    let json = dir.join("report.json");
    let script = format!(
        "seq 1 300000 | sort -r | {py} -c 'import sys; l = sys.stdin.readlines(); \
         k = [x * 8 for x in l]; print(len(k))' | cat"
    );
    let o = pagewise()
        .args(["run", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "300000\n");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let procs = v["processes"].as_array().unwrap();
    // sh, seq, sort, python3 and cat.
    assert_eq!(procs.len(), 5, "{stderr}");
    let biggest = procs
        .iter()
        .max_by_key(|p| p["peak_rss_bytes"].as_u64().unwrap())
        .unwrap();
    assert!(
        biggest["name"].as_str().unwrap().starts_with("python3"),
        "{stderr}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    // The whole tree, and the biggest process on a line of its own,
    // each named in the legend.
    assert!(plot.contains("whole tree"), "{plot}");
    let label = format!("python3 (pid {})", biggest["pid"]);
    assert!(plot.contains(&label), "no {label:?} in the plot");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn forty_short_lived_processes_give_a_bounded_report() {
    let (v, stderr, _) = run_json(
        "forty",
        &[
            "sh".as_ref(),
            "-c".as_ref(),
            "for i in $(seq 40); do /bin/true; done".as_ref(),
        ],
        0,
    );
    let procs = v["processes"].as_array().unwrap();
    let trues = procs.iter().filter(|p| p["name"] == "true").count();
    assert_eq!(trues, 40, "{stderr}");
    let lines = stderr.lines().count();
    assert!(lines <= 80, "{lines} lines:\n{stderr}");
    // The summary comes first and counts every process.
    let summary = stderr.lines().take(6).collect::<Vec<_>>().join("\n");
    assert!(
        summary.contains(&format!("{} processes", procs.len())),
        "{stderr}"
    );
    // The short-lived ones are one line, not forty.
    assert!(stderr.contains("40 × true"), "{stderr}");
}

/// Stops, signals, threads and exec as a program sees them: a child stops
/// itself and its parent sees it stopped (WUNTRACED), and still stopped a
/// while later, before continuing it;
/// a signal reaches its handler; a thread forks and waits for a child; a
/// thread execs `echo`. Its output must be the same with and without
/// `pagewise run` following the tree.
const BEHAVIOUR: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile sig_atomic_t got;
static void on_usr1(int s) { (void)s; got = 1; }
static void *fork_in_thread(void *a) {
    (void)a;
    pid_t p = fork();
    if (p == 0) {
        execlp("true", "true", (char *)0);
        _exit(9);
    }
    int st;
    waitpid(p, &st, 0);
    printf("thread's child %d\n", WEXITSTATUS(st));
    return 0;
}
static void *exec_in_thread(void *a) {
    (void)a;
    execlp("echo", "echo", "exec from a thread", (char *)0);
    return 0;
}
int main(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        raise(SIGSTOP);
        printf("child resumed\n");
        fflush(stdout);
        _exit(4);
    }
    int st;
    waitpid(pid, &st, WUNTRACED);
    printf("stopped %d by %d\n", WIFSTOPPED(st), WIFSTOPPED(st) ? WSTOPSIG(st) : 0);
    usleep(100 * 1000);
    printf("still stopped %d\n", waitpid(pid, &st, WNOHANG) == 0);
    fflush(stdout);
    kill(pid, SIGCONT);
    waitpid(pid, &st, 0);
    printf("child %d\n", WEXITSTATUS(st));
    signal(SIGUSR1, on_usr1);
    kill(getpid(), SIGUSR1);
    printf("handler %d\n", got);
    pthread_t t;
    pthread_create(&t, 0, fork_in_thread, 0);
    pthread_join(t, 0);
    fflush(stdout);
    pthread_create(&t, 0, exec_in_thread, 0);
    pause();
    return 1;
}
"#;

#[test]
fn following_the_tree_changes_nothing_the_program_sees() {
    let dir = scratch("behaviour");
    let Some(prog) = compile(&dir, "behaviour", BEHAVIOUR, &["-O1", "-pthread"]) else {
        return;
    };
    let alone = Command::new(&prog).output().unwrap();
    let expected = "stopped 1 by 19\nstill stopped 1\nchild resumed\nchild 4\n\
                    handler 1\nthread's child 0\nexec from a thread\n";
    assert_eq!(String::from_utf8_lossy(&alone.stdout), expected);
    let (v, stderr, stdout) = run_json("behaviour-run", &[prog.as_os_str()], 0);
    assert_eq!(stdout, expected, "{stderr}");
    // The top process became echo; the stopped child and the thread's
    // child are its children.
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "{stderr}");
    assert_eq!(procs[0]["name"], "echo", "{stderr}");
    let top = v["pid"].as_u64();
    assert!(
        procs[1..].iter().all(|p| p["ppid"].as_u64() == top),
        "{stderr}"
    );
    assert!(procs
        .iter()
        .any(|p| p["ending"] == "ended by _exit(4): no report"));
    std::fs::remove_dir_all(&dir).unwrap();
}
