//! `pagewise run [--json FILE] [--plot FILE.svg] -- CMD ARGS...`
//!
//! Runs CMD with libpagewise.so preloaded (found next to this binary),
//! asks the library for a JSON report at exit (`PAGEWISE_STATS_FILE`) and
//! for samples while it runs (`PAGEWISE_SAMPLE_FILE`), then prints the
//! report on stderr and exits with CMD's status.

use crate::report::{AllocatorReport, RunReport, Sample};
use clap::Args;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
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
/// binary (cargo puts both in `target/<profile>/`), else `../lib/`.
pub fn find_library() -> Result<PathBuf, String> {
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
    let candidates = [
        dir.join("libpagewise.so"),
        dir.join("../lib/libpagewise.so"),
    ];
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let release = dir.file_name().is_some_and(|n| n == "release");
    let build = if release {
        "cargo build --release -p pagewise-c"
    } else {
        "cargo build -p pagewise-c"
    };
    Err(format!(
        "libpagewise.so not found next to {} (looked for {}).\nBuild it with: {build}",
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
    let lib = find_library()?;
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
        // Only CMD samples, not its descendants.
        .env("PAGEWISE_SAMPLE_PARENT", std::process::id().to_string())
        .env_remove("PAGEWISE_STATS");
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
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions;
    // the child has already been spawned with the default ones.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let (status, rusage) = wait(pid)?;
    let elapsed = started.elapsed();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };

    let allocator = read_allocator_report(&work.join(format!("stats.{pid}.json")))?;
    let samples = read_samples(&work.join(format!("samples.{pid}.txt")), started_ms);
    let report = RunReport {
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: pid as u32,
        exit_code: code,
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        elapsed_ms: elapsed.as_millis() as u64,
        peak_rss_bytes: rusage.ru_maxrss as u64 * 1024,
        allocator,
        samples,
    };
    eprint!("{}", crate::report::render(&report));
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

fn wait(pid: libc::pid_t) -> Result<(libc::c_int, libc::rusage), String> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out-pointers; `pid` is our child, not yet reaped
        // (std's Child is never waited on).
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((status, usage));
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4: {err}"));
        }
    }
}

fn read_allocator_report(path: &Path) -> Result<Option<AllocatorReport>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("malformed report {}: {e}", path.display())),
        Err(_) => Ok(None),
    }
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

/// Reads the sample lines, with times made relative to `start_ms`.
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
            (f.len() >= 4).then(|| Sample {
                t_ms: f[0].saturating_sub(start_ms),
                rss: f[1],
                live: f[2],
                committed: f[3],
            })
        })
        .collect();
    // Successive images of one pid append in time order; the exit sample
    // may race the sampler thread's last line.
    samples.sort_by_key(|s| s.t_ms);
    samples
}
