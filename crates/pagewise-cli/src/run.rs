//! `pagewise run [--json FILE] [--plot FILE.svg] [--secure] -- CMD ARGS...`
//!
//! Runs CMD with libpagewise.so preloaded (found next to this binary),
//! asks the library for a JSON report at exit (`PAGEWISE_STATS_FILE`) and
//! for samples while it runs (`PAGEWISE_SAMPLE_FILE`), then prints the
//! report on stderr and exits with CMD's status.
//!
//! Children inherit the environment, so every process of CMD's tree that
//! loads the library writes its own report and samples (`%p` in both paths
//! is the pid). pagewise follows the tree itself (src/trace.rs: ptrace, at
//! fork, exec and exit only) and reads every process's RSS while it runs
//! (src/rss_sampler.rs), so that a process that leaves no report (`_exit`,
//! a signal, a static program) is still in the report, with how it ended
//! and its peak RSS. It is also a child subreaper, so that descendants
//! orphaned by CMD's exit are reparented to it; after CMD exits it waits
//! for all of them, as a shell waits for a whole pipeline, and then reads
//! every report: the report therefore comes after every process's output.
//! ^C while only descendants remain stops the waiting (their reports are
//! then left out, and the report says so).

use crate::report::{ProcessReport, RunReport};
use crate::rss_sampler::RssSampler;
use crate::trace;
use clap::Args;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    /// Do not follow the process tree with ptrace. Needed for a program
    /// that is itself a debugger or traces its children, or a
    /// set-user-ID program run by a user other than root (a traced one
    /// runs without its privileges); processes that leave no report
    /// (`_exit`, killed, static) are then missing from the report.
    #[arg(long)]
    pub no_trace: bool,
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
    let env = child_env(args, lib, work)?;
    // Orphaned descendants come to us, so that we can wait for them.
    // SAFETY: prctl with integer arguments; failure only means orphans go
    // to init and are not waited for.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let started_ms = monotonic_ms();
    START_MS.store(started_ms, Ordering::Relaxed);
    let mut child = trace::fork_child(&args.command, &env).map_err(|e| format!("fork: {e}"))?;
    let pid = child.pid;
    let trace_error = if args.no_trace {
        Some("--no-trace".to_string())
    } else {
        child.seize().err().map(|e| format!("ptrace: {e}"))
    };
    child.release();
    // The program gets ^C; we stay to report.
    catch_interrupts();
    let (tree, readings) = if trace_error.is_none() {
        let sampler = RssSampler::start(args.interval_ms, run_ms);
        let tree = trace::follow(&child, &|pid, alive| sampler.watch(pid, alive), &run_ms);
        (tree, sampler.finish())
    } else {
        let status = wait(pid)?;
        let elapsed_ms = run_ms();
        let stopped_waiting = wait_descendants();
        let tree = trace::Tree {
            status,
            elapsed_ms,
            stopped_waiting,
            ..Default::default()
        };
        (tree, Vec::new())
    };
    if let Some(e) = child.exec_error() {
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
    let status = tree.status;
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };

    let processes = crate::tree::processes(
        work,
        pid as u32,
        &args.command[0],
        &tree.processes,
        &readings,
        started_ms,
    );
    let top = &processes[0];
    let no_report = if top.allocator.is_some() || !top.samples.is_empty() {
        None
    } else {
        let shown = format!("`{}`", shell_word(&args.command[0].to_string_lossy()));
        Some(crate::elf::never_loaded(&args.command[0], &shown))
    };
    let traced = trace_error.is_none();
    let peak_rss_bytes = if traced {
        processes
            .iter()
            .map(|p| p.peak_rss_bytes)
            .max()
            .unwrap_or(0)
    } else {
        children_maxrss()
    };
    let report = RunReport {
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        command_line: shell_line(&args.command),
        pid: pid as u32,
        exit_code: code,
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        elapsed_ms: tree.elapsed_ms,
        peak_rss_bytes,
        allocator: top.allocator.clone(),
        samples: top.samples.clone(),
        no_report,
        stopped_waiting: tree.stopped_waiting,
        pagewise_pid: std::process::id(),
        traced,
        trace_error: trace_error.filter(|e| e != "--no-trace"),
        processes,
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

/// The program's environment: ours, with the library preloaded and told
/// where to write each process's report and samples (`%p`: its pid).
fn child_env(args: &RunArgs, lib: &Path, work: &Path) -> Result<Vec<(OsString, OsString)>, String> {
    let mut preload = OsString::from(lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut set: Vec<(OsString, OsString)> = vec![
        ("LD_PRELOAD".into(), preload),
        (
            "PAGEWISE_STATS_FILE".into(),
            work.join("stats.%p.json").into(),
        ),
        (
            "PAGEWISE_SAMPLE_FILE".into(),
            work.join("samples.%p.txt").into(),
        ),
        (
            "PAGEWISE_SAMPLE_MS".into(),
            args.interval_ms.max(1).to_string().into(),
        ),
    ];
    if let Some(dir) = &args.profile {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        set.push(("PAGEWISE_PROF".into(), "1".into()));
        set.push(("PAGEWISE_PROF_FILE".into(), dir.join("%p.prof").into()));
    }
    // Every process of the tree samples, each into its own file; the text
    // report is ours, not each process's.
    let removed = ["PAGEWISE_SAMPLE_PARENT", "PAGEWISE_STATS"];
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !removed.iter().any(|r| k == r) && !set.iter().any(|(s, _)| s == k))
        .collect();
    env.extend(set);
    Ok(env)
}

/// The run's start on `CLOCK_MONOTONIC`, in ms.
static START_MS: AtomicU64 = AtomicU64::new(0);

/// Milliseconds since the run started.
fn run_ms() -> u64 {
    monotonic_ms().saturating_sub(START_MS.load(Ordering::Relaxed))
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
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether ^C came while we waited.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

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
