//! A Rust program whose global allocator is pagewise reports as the C
//! library does, from the same variables: `PAGEWISE_STATS=1` (the text
//! report on stderr at exit), `PAGEWISE_STATS_FILE` (the JSON document at
//! exit), `PAGEWISE_STATS_SIGNAL` and `PAGEWISE_STATS_INTERVAL_MS` (a
//! report while it runs, left behind by a process then killed with
//! SIGKILL, which runs no exit handler).
//!
//! Each case re-executes this test binary with the variables set; the
//! child keeps 8 MiB live and exits (or kills itself), the parent reads
//! what it left. Cost: four short child processes.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const CHILD: &str = "PAGEWISE_TEST_REPORTS_CHILD";
/// Bytes the child keeps live to the end.
const LIVE: u64 = 8 << 20;

/// Runs in the child only: keeps `LIVE` bytes, then, by mode, returns
/// (the process exits through `exit()`), or raises SIGUSR2 (`signal`) or
/// only waits (`interval`) until the report file exists, then kills itself
/// with SIGKILL so that no exit report can be what the parent finds.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let keep = std::hint::black_box(vec![1u8; LIVE as usize]);
    std::mem::forget(keep);
    if mode == "exit" {
        return;
    }
    if mode == "signal" {
        // SAFETY: raising a signal pagewise installed a handler for.
        unsafe { libc::raise(libc::SIGUSR2) };
    }
    let template = std::env::var("PAGEWISE_STATS_FILE").unwrap();
    let path = template.replace("%p", &std::process::id().to_string());
    let appears = || {
        let start = Instant::now();
        while !Path::new(&path).exists() && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    appears();
    if mode == "interval" {
        // A report of the periodic writer may have been taken before `keep`
        // was (a slow start: under qemu the first came first). The file
        // that appears after this removal was renamed by a cycle that may
        // also have begun before; the one after the second removal was
        // begun after the first one's rename, so after `keep`.
        for _ in 0..2 {
            let _ = std::fs::remove_file(&path);
            appears();
        }
    }
    println!("reports-child: {mode} done");
    // SAFETY: ends this process, as the OOM killer would.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}

/// Runs the child in `mode` with `vars`; its output and pid.
fn run_child(mode: &str, vars: &[(&str, &Path)]) -> (Output, u32) {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env_remove("PAGEWISE_STATS")
        .env_remove("PAGEWISE_STATS_FILE")
        .env_remove("PAGEWISE_STATS_SIGNAL")
        .env_remove("PAGEWISE_STATS_INTERVAL_MS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagewise-reports-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The child's JSON document, parsed, checked for the fields `pagewise run`
/// reads.
fn document(dir: &Path, pid: u32) -> serde_json::Value {
    let path = dir.join(format!("stats.{pid}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["pid"], pid);
    assert!(v["live_bytes"].as_u64().unwrap() >= LIVE, "{v}");
    assert!(v["os"]["vm_rss"].as_u64().unwrap() > 0, "{v}");
    assert!(v["classes"].as_array().is_some_and(|c| !c.is_empty()));
    v
}

#[test]
fn stats_prints_the_text_report_at_exit() {
    let (o, pid) = run_child("exit", &[("PAGEWISE_STATS", Path::new("1"))]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let header = format!("pagewise report (pid {pid})");
    assert_eq!(stderr.matches(&header).count(), 1, "{stderr}");
    assert!(stderr.contains("free slots in used pages"), "{stderr}");
    assert!(stderr.contains("\n  RSS "), "{stderr}");
}

#[test]
fn stats_file_gets_the_json_document_at_exit() {
    let dir = scratch("exit");
    let file = dir.join("stats.%p.json");
    let (o, pid) = run_child("exit", &[("PAGEWISE_STATS_FILE", &file)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        !stderr.contains("pagewise report"),
        "the file, not stderr: {stderr}"
    );
    document(&dir, pid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stats_signal_writes_a_report_while_running() {
    let dir = scratch("signal");
    let file = dir.join("stats.%p.json");
    let (o, pid) = run_child(
        "signal",
        &[
            ("PAGEWISE_STATS_SIGNAL", Path::new("SIGUSR2")),
            ("PAGEWISE_STATS_FILE", &file),
        ],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("reports-child: signal done"));
    document(&dir, pid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stats_interval_writes_a_report_while_running() {
    let dir = scratch("interval");
    let file = dir.join("stats.%p.json");
    let (o, pid) = run_child(
        "interval",
        &[
            ("PAGEWISE_STATS_INTERVAL_MS", Path::new("20")),
            ("PAGEWISE_STATS_FILE", &file),
        ],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("reports-child: interval done"));
    document(&dir, pid);
    let _ = std::fs::remove_dir_all(&dir);
}
