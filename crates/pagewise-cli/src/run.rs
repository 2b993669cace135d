//! `pagewise run [--json FILE] [--plot FILE.svg] [--secure] -- CMD ARGS...`
//!
//! Runs CMD with libpagewise.so preloaded (found next to this binary),
//! asks the library for a JSON report at exit (`PAGEWISE_STATS_FILE`) and
//! for samples while it runs (`PAGEWISE_SAMPLE_FILE`), then prints the
//! report on stderr and exits with CMD's status.
//!
//! Children inherit the environment, so every process of CMD's tree that
//! loads the library writes its own report and samples (`%p` in both paths
//! is the pid). pagewise becomes a child subreaper, so that descendants
//! orphaned by CMD's exit are reparented to it; after CMD exits it waits for
//! all of them, as a shell waits for a whole pipeline, and then reads every
//! report: the report therefore comes after every process's output. ^C
//! while only descendants remain stops the waiting (their reports are then
//! left out, and the report says so).

use crate::report::{AllocatorReport, ProcessReport, RunReport, Sample};
use clap::Args;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Arguments of `pagewise run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Also write the full report (the library's JSON, samples, exit status) here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw RSS and live bytes over the program's lifetime as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Profile the heap of every process of the tree by call site: writes
    /// DIR/PID.pb.gz (pprof: `go tool pprof DIR/PID.pb.gz`), and collapsed
    /// stacks and flamegraphs of the bytes in use at the peak, still in use
    /// at exit and allocated (DIR/PID.{peak,leaks,alloc}.{folded,svg}).
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// Run on the hardened library, libpagewise_secure.so: writes past a
    /// block's end and double frees are reported and stop the program, and
    /// freed blocks are wiped (docs/hardening.md).
    #[arg(long)]
    pub secure: bool,
    /// Sampling period for the plot, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub interval_ms: u64,
    /// The program and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Where the library is looked for: `$PAGEWISE_LIB`, else next to this
/// binary (cargo puts both in `target/<profile>/`), else `../lib/`; the
/// hardened one if `secure`.
pub fn find_library(secure: bool) -> Result<PathBuf, String> {
    let (name, package) = if secure {
        ("libpagewise_secure.so", "pagewise-c-secure")
    } else {
        ("libpagewise.so", "pagewise-c")
    };
    if let Some(p) = std::env::var_os("PAGEWISE_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("PAGEWISE_LIB={} does not exist", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(name), dir.join("../lib").join(name)];
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let release = dir.file_name().is_some_and(|n| n == "release");
    let build = if release {
        format!("cargo build --release -p {package}")
    } else {
        format!("cargo build -p {package}")
    };
    Err(format!(
        "{name} not found next to {} (looked for {}).\nBuild it with: {build}",
        exe.display(),
        candidates[0].display()
    ))
}

/// Runs the subcommand; returns the process exit code.
pub fn main(args: RunArgs) -> i32 {
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pagewise: {e}");
            2
        }
    }
}

fn run(args: &RunArgs) -> Result<i32, String> {
    let lib = find_library(args.secure)?;
    let lib = lib.canonicalize().unwrap_or(lib);
    let work = std::env::temp_dir().join(format!("pagewise-run-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let result = run_in(args, &lib, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run_in(args: &RunArgs, lib: &Path, work: &Path) -> Result<i32, String> {
    let mut preload = OsString::from(lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("PAGEWISE_STATS_FILE", work.join("stats.%p.json"))
        .env("PAGEWISE_SAMPLE_FILE", work.join("samples.%p.txt"))
        .env("PAGEWISE_SAMPLE_MS", args.interval_ms.max(1).to_string())
        // Every process of the tree samples, each into its own file.
        .env_remove("PAGEWISE_SAMPLE_PARENT")
        .env_remove("PAGEWISE_STATS");
    if let Some(dir) = &args.profile {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        cmd.env("PAGEWISE_PROF", "1")
            .env("PAGEWISE_PROF_FILE", dir.join("%p.prof"));
    }
    // Orphaned descendants come to us, so that we can wait for them.
    // SAFETY: prctl with integer arguments; failure only means orphans go
    // to init and are not waited for.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let started = Instant::now();
    let started_ms = monotonic_ms();
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // The shell's conventions: 127 not found, 126 not executable.
            eprintln!(
                "pagewise: cannot run {}: {e}",
                args.command[0].to_string_lossy()
            );
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pid = child.id() as libc::pid_t;
    // The program gets ^C; we stay to report.
    catch_interrupts();
    let status = wait(pid)?;
    let elapsed = started.elapsed();
    let stopped_waiting = wait_descendants();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };

    let processes = read_processes(work, pid as u32, &args.command[0], started_ms);
    let top = &processes[0];
    let command_line = shell_line(&args.command);
    let no_report = if top.allocator.is_some() {
        None
    } else if top.samples.is_empty() {
        let shown = format!("`{}`", shell_word(&args.command[0].to_string_lossy()));
        Some(crate::elf::never_loaded(&args.command[0], &shown))
    } else {
        None
    };
    let report = RunReport {
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        command_line,
        pid: pid as u32,
        exit_code: code,
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        elapsed_ms: elapsed.as_millis() as u64,
        peak_rss_bytes: children_maxrss(),
        allocator: top.allocator.clone(),
        samples: top.samples.clone(),
        processes,
        no_report,
        stopped_waiting,
        pagewise_pid: std::process::id(),
    };
    eprint!("{}", crate::report::render(&report));
    if let Some(dir) = &args.profile {
        eprint!("{}", profiles_in(dir, &report.processes));
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        crate::plot::draw(&report, path).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(code)
}

/// Converts the heap profile each process of the run wrote into `dir`,
/// and says what they show.
fn profiles_in(dir: &Path, processes: &[ProcessReport]) -> String {
    let mut text = String::new();
    for p in processes {
        let path = dir.join(format!("{}.prof", p.pid));
        if !path.exists() {
            continue;
        }
        match crate::profile::convert(&path, 10) {
            Ok(t) => text += &t,
            Err(e) => text += &format!("pagewise: {e}\n"),
        }
    }
    if text.is_empty() {
        text = format!(
            "pagewise: no heap profile was written into {}\n",
            dir.display()
        );
    }
    text
}

/// Set by ^C (SIGINT or SIGQUIT) while we wait.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// ^C reaches the program (our process group); for us it only interrupts
/// the wait for descendants. Installed after the spawn: the program starts
/// with the default dispositions (exec resets handlers anyway).
fn catch_interrupts() {
    // SAFETY: a handler that only stores to an atomic; no SA_RESTART, so
    // that wait4 returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGQUIT, &sa, std::ptr::null_mut());
    }
}

fn wait(pid: libc::pid_t) -> Result<libc::c_int, String> {
    let mut status = 0;
    loop {
        // SAFETY: a valid out-pointer; `pid` is our child, not yet reaped
        // (std's Child is never waited on).
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            // A ^C the program survived (or died of) is not for us.
            INTERRUPTED.store(false, Ordering::Relaxed);
            return Ok(status);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("waitpid: {err}"));
        }
    }
}

/// Waits for every remaining child: descendants orphaned by the program's
/// exit, reparented to us. Returns true if ^C stopped the waiting first.
fn wait_descendants() -> bool {
    loop {
        let mut status = 0;
        // SAFETY: a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r > 0 {
            continue;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            if INTERRUPTED.load(Ordering::Relaxed) {
                return true;
            }
            continue;
        }
        // ECHILD: none left.
        return false;
    }
}

/// The highest peak RSS among the children we waited for (and, through
/// theirs, their descendants).
fn children_maxrss() -> u64 {
    // SAFETY: zeroed rusage is a valid out-value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as u64 * 1024
}

/// Every process that left a report or samples in `work`: the top one
/// (`top`, always present, even with neither) first, then the others in
/// tree order (parents before children, siblings by pid).
fn read_processes(
    work: &Path,
    top: u32,
    command: &std::ffi::OsStr,
    start_ms: u64,
) -> Vec<ProcessReport> {
    let mut pids = vec![top];
    if let Ok(dir) = std::fs::read_dir(work) {
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let pid = name
                .strip_prefix("stats.")
                .and_then(|n| n.strip_suffix(".json"))
                .or_else(|| {
                    name.strip_prefix("samples.")
                        .and_then(|n| n.strip_suffix(".txt"))
                })
                .and_then(|n| n.parse::<u32>().ok());
            if let Some(pid) = pid.filter(|p| !pids.contains(p)) {
                pids.push(pid);
            }
        }
    }
    let mut procs: Vec<ProcessReport> = pids
        .into_iter()
        .map(|pid| {
            let allocator = read_allocator_report(&work.join(format!("stats.{pid}.json")));
            let samples = read_samples(&work.join(format!("samples.{pid}.txt")), start_ms);
            let name = match &allocator {
                Some(a) if !a.comm.is_empty() => a.comm.clone(),
                _ if pid == top => Path::new(command)
                    .file_name()
                    .unwrap_or(command)
                    .to_string_lossy()
                    .into_owned(),
                _ => "?".into(),
            };
            let mut p = ProcessReport {
                pid,
                ppid: allocator.as_ref().map_or(0, |a| a.ppid),
                name,
                allocator,
                samples,
                peak: None,
            };
            p.find_peak();
            p
        })
        .collect();
    // Tree order: the top first; then, repeatedly, the children of what is
    // placed; then the rest (parents unknown, or reparented to us) by pid.
    let mut rest = procs.split_off(1);
    rest.sort_by_key(|p| p.pid);
    let mut i = 0;
    while i < procs.len() {
        let parent = procs[i].pid;
        let (kids, others): (Vec<_>, Vec<_>) = rest.into_iter().partition(|p| p.ppid == parent);
        rest = others;
        for (k, kid) in kids.into_iter().enumerate() {
            procs.insert(i + 1 + k, kid);
        }
        i += 1;
    }
    procs.extend(rest);
    procs
}

/// The library's report, or None if there is none (or it is unreadable:
/// a process killed while writing it; said on stderr).
fn read_allocator_report(path: &Path) -> Option<AllocatorReport> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(a) => Some(a),
        Err(e) => {
            eprintln!(
                "pagewise: ignoring malformed report {}: {e}",
                path.display()
            );
            None
        }
    }
}

/// `word` as a POSIX shell would need it typed: as is if it holds only
/// characters no shell treats specially, else in single quotes (a quote
/// inside becoming `'\''`).
pub fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-+=%@:,./".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The command line, each word quoted as needed.
pub fn shell_line(words: &[OsString]) -> String {
    words
        .iter()
        .map(|w| shell_word(&w.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Milliseconds on `CLOCK_MONOTONIC`, the clock of the library's samples.
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Reads the sample lines, with times made relative to `start_ms`: four
/// fields from every library, nine (the breakdown) from current ones.
fn read_samples(path: &Path, start_ms: u64) -> Vec<Sample> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut samples: Vec<Sample> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<u64> = l
                .split(' ')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            let detailed = f.len() >= 9;
            let at = |i: usize| if detailed { f[i] } else { 0 };
            (f.len() >= 4).then(|| Sample {
                t_ms: f[0].saturating_sub(start_ms),
                rss: f[1],
                live: f[2],
                committed: f[3],
                live_requested: at(4),
                free_slot: at(5),
                retained: at(6),
                metadata: at(7),
                file_rss: at(8),
                detailed,
            })
        })
        .collect();
    // Successive images of one pid append in time order; the exit sample
    // may race the sampler thread's last line.
    samples.sort_by_key(|s| s.t_ms);
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_a_shell_needs() {
        assert_eq!(shell_word("plain/path-1.txt"), "plain/path-1.txt");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("$HOME"), "'$HOME'");
        let line = shell_line(&["sh".into(), "-c".into(), "echo *".into()]);
        assert_eq!(line, "sh -c 'echo *'");
    }
}
