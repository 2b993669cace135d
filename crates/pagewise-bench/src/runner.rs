//! The runner: allocator specs, worker lookup, the interleaved run loop.

use crate::worker::WorkerResult;
use crate::workloads::{allocator_independent, idle_focused, Scale, WORKLOADS};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Flags of `pagewise bench`. `BenchArgs::default()` is the command line
/// without flags (an empty `alloc` is the default list, [`DEFAULT_ALLOCS`]).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// Allocators to compare, comma-separated: pagewise, pagewise-mesh
    /// (pagewise with `PAGEWISE_MESH=1`), pagewise-prof (with the heap
    /// profiler on, `PAGEWISE_PROF=1`), pagewise-guard (guard pages for
    /// one allocation in 1000, `PAGEWISE_GUARD_SAMPLE=1000`), system (glibc),
    /// jemalloc, mimalloc, tcmalloc (Debian's libtcmalloc_minimal.so.4,
    /// preloaded into the system worker), a path to a malloc `.so` to
    /// preload (run under the system worker with LD_PRELOAD), or
    /// `LABEL=PATH` for a worker executable of another build (to compare
    /// two builds of pagewise side by side, interleaved). Default:
    /// pagewise,system,jemalloc,mimalloc,tcmalloc, leaving tcmalloc out with
    /// a note when it is not installed.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub alloc: Vec<String>,

    /// Workloads to run, comma-separated (default: all): churn,
    /// arena-on-malloc, block-cohorts, phases, survivors-clustered,
    /// survivors-sparse, survivors-random, threads, mixed, arena-churn, jit-pools
    /// (allocator-independent: run under one allocator only), the idle
    /// workloads idle-one-thread, idle-threads-exit, idle-handoff,
    /// idle-handoff-blocked and idle-thread-rounds, big-buffers, and redis
    /// (if redis-server is installed).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,

    /// Small sizes, 3 runs each, a 2 s idle period (unless --idle-ms)
    /// waited only by the idle workloads: about 90 s on 2 cores.
    #[arg(long)]
    pub quick: bool,

    /// Print every column of the per-workload tables (min–max, ns/op,
    /// memory after idle, page floor, the idle period's system calls),
    /// however wide; without it every line fits 120 columns.
    #[arg(long)]
    pub wide: bool,

    /// Write every raw run (and the medians) to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write SVG charts into this directory: throughput bars per workload,
    /// RSS over time per allocator for the phase workloads.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,

    /// Runs per workload and allocator (default: 3 with --quick, 5 otherwise).
    #[arg(long)]
    pub runs: Option<usize>,

    /// Directory holding the worker binaries (default: next to this program).
    #[arg(long, value_name = "DIR")]
    pub worker_dir: Option<PathBuf>,

    /// Workload size: tiny, quick or full (default: quick with --quick, else full).
    #[arg(long, hide = true)]
    pub scale: Option<String>,

    /// Idle period after the frees before RSS is read again, in ms.
    /// Default: the longest purge delay of the allocators run plus 2 s
    /// (12 s with jemalloc's 10 s decay; the report lists every
    /// allocator's rule); 2000 with --quick.
    #[arg(long, value_name = "MS")]
    pub idle_ms: Option<u64>,

    /// How many runs of each workload and allocator (the first ones) wait
    /// the idle period; the others read no idle figure (default 1: the
    /// idle figure hardly varies and the period is long).
    #[arg(long, value_name = "N")]
    pub idle_runs: Option<usize>,

    /// Directories to look for the libraries of built-in preloaded
    /// allocators (tcmalloc) in, instead of the system's library
    /// directories and ldconfig's cache (for tests).
    #[arg(long, value_delimiter = ',', value_name = "DIR", hide = true)]
    pub lib_dir: Vec<PathBuf>,
}

/// An allocator to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSpec {
    /// Name shown in tables.
    pub label: String,
    /// Worker binary suffix (`pagewise`, `system`, `jemalloc`, `mimalloc`).
    pub worker: String,
    /// Library preloaded into the system worker, if any.
    pub preload: Option<PathBuf>,
    /// Worker executable given by path (`LABEL=PATH`), instead of the
    /// built-in worker found next to the runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<PathBuf>,
    /// Environment the worker runs with (`pagewise-mesh`: `PAGEWISE_MESH=1`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

/// Allocators with a worker binary of their own.
const BUILTIN: &[&str] = &["pagewise", "system", "jemalloc", "mimalloc"];

/// A built-in variant: its label, the built-in worker it runs, and the
/// environment it runs it with.
type Variant = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// Built-in variants: a built-in worker run with settings of its own.
const VARIANTS: &[Variant] = &[
    ("pagewise-mesh", "pagewise", &[("PAGEWISE_MESH", "1")]),
    // The heap profiler at its default rate: what sampling costs.
    ("pagewise-prof", "pagewise", &[("PAGEWISE_PROF", "1")]),
    // Guard pages for one allocation in a thousand: what they cost.
    (
        "pagewise-guard",
        "pagewise",
        &[("PAGEWISE_GUARD_SAMPLE", "1000")],
    ),
];

/// A built-in peer that is a system library preloaded into the system worker.
struct Preloaded {
    /// Name in `--alloc` and label in tables and JSON.
    name: &'static str,
    /// File name of the library (its soname).
    soname: &'static str,
    /// Debian package that installs it.
    package: &'static str,
}

const PRELOADED: &[Preloaded] = &[Preloaded {
    name: "tcmalloc",
    soname: "libtcmalloc_minimal.so.4",
    package: "libtcmalloc-minimal4",
}];

/// What `--alloc` means when it is not given. A preloaded peer in it
/// (tcmalloc) that is not installed is left out with a note, so that the
/// suite runs on a machine without it; asked for by name, it is an error.
pub const DEFAULT_ALLOCS: &[&str] = &["pagewise", "system", "jemalloc", "mimalloc", "tcmalloc"];

/// The directories searched for a preloaded peer's library, before
/// ldconfig's cache: the multiarch directories, then the lib64 and lib ones.
fn system_lib_dirs() -> Vec<PathBuf> {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    vec![
        PathBuf::from(format!("/usr/lib/{triple}")),
        PathBuf::from("/usr/lib64"),
        PathBuf::from("/usr/lib"),
        PathBuf::from(format!("/lib/{triple}")),
    ]
}

/// The ELF machine number of this build's target, if known.
fn host_elf_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86_64" => Some(62),
        "aarch64" => Some(183),
        "riscv64" => Some(243),
        "powerpc64" => Some(21),
        "s390x" => Some(22),
        _ => None,
    }
}

/// Whether `path` is an ELF file this process could load: 64-bit (on a
/// 64-bit target) and of this machine, so that a 32-bit copy in a
/// multilib directory is passed over.
fn loadable_elf(path: &Path) -> bool {
    let mut head = [0u8; 20];
    let ok = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok();
    if !ok || &head[..4] != b"\x7fELF" {
        return false;
    }
    let want_class = if cfg!(target_pointer_width = "64") {
        2
    } else {
        1
    };
    let class_ok = head[4] == want_class;
    let machine = if head[5] == 2 {
        u16::from_be_bytes([head[18], head[19]])
    } else {
        u16::from_le_bytes([head[18], head[19]])
    };
    class_ok && host_elf_machine().is_none_or(|m| m == machine)
}

/// Paths that ldconfig's cache (`ldconfig -p`) gives for `soname`.
fn ldconfig_paths(soname: &str) -> Vec<PathBuf> {
    for exe in ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"] {
        let Ok(out) = Command::new(exe)
            .arg("-p")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        // Lines look like `\tlibfoo.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libfoo.so.4`.
        return String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(soname))
            .filter_map(|l| l.split_once(" => ").map(|(_, p)| PathBuf::from(p.trim())))
            .collect();
    }
    Vec::new()
}

/// Finds `soname`: in `dirs` if any are given (and only there), else in the
/// system's library directories, then in ldconfig's cache.
/// A system library by soname (the system's library directories and
/// ldconfig's cache).
pub(crate) fn find_system_library(soname: &str) -> Option<PathBuf> {
    find_library(soname, &[])
}

fn find_library(soname: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = if dirs.is_empty() {
        let mut c: Vec<PathBuf> = system_lib_dirs().iter().map(|d| d.join(soname)).collect();
        c.extend(ldconfig_paths(soname));
        c
    } else {
        dirs.iter().map(|d| d.join(soname)).collect()
    };
    candidates
        .into_iter()
        .find(|p| p.is_file() && loadable_elf(p))
}

impl AllocSpec {
    /// Parses one `--alloc` entry: a built-in name or a path to a `.so`
    /// (tcmalloc looked up in the system's library directories).
    pub fn parse(s: &str) -> Result<AllocSpec> {
        Self::parse_in(s, &[])
    }

    /// As [`AllocSpec::parse`], looking up the libraries of preloaded
    /// built-in peers in `lib_dirs` only, if it is not empty.
    pub fn parse_in(s: &str, lib_dirs: &[PathBuf]) -> Result<AllocSpec> {
        let name = match s {
            "glibc" => "system",
            other => other,
        };
        if BUILTIN.contains(&name) {
            return Ok(AllocSpec {
                label: name.to_string(),
                worker: name.to_string(),
                preload: None,
                exe: None,
                env: Vec::new(),
            });
        }
        if let Some((label, worker, env)) = VARIANTS.iter().find(|v| v.0 == name) {
            return Ok(AllocSpec {
                label: label.to_string(),
                worker: worker.to_string(),
                preload: None,
                exe: None,
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            });
        }
        if let Some((label, path)) = s.split_once('=') {
            return Self::worker_at(label, path);
        }
        if let Some(p) = PRELOADED.iter().find(|p| p.name == name) {
            let Some(path) = find_library(p.soname, lib_dirs) else {
                let looked: Vec<String> = if lib_dirs.is_empty() {
                    let mut v: Vec<String> = system_lib_dirs()
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect();
                    v.push("ldconfig's cache".into());
                    v
                } else {
                    lib_dirs.iter().map(|d| d.display().to_string()).collect()
                };
                bail!(
                    "allocator `{}`: {} not found (looked in {}); install it with \
                     `apt-get install {}`, or give the library's path to --alloc",
                    p.name,
                    p.soname,
                    looked.join(", "),
                    p.package
                );
            };
            let mut spec = Self::preload(&path.to_string_lossy())?;
            spec.label = p.name.to_string();
            return Ok(spec);
        }
        if !s.contains('/') && !s.contains(".so") {
            let mut known: Vec<&str> = BUILTIN.to_vec();
            known.extend(VARIANTS.iter().map(|v| v.0));
            known.extend(PRELOADED.iter().map(|p| p.name));
            bail!(
                "unknown allocator `{s}`: expected one of {} or a path to a malloc .so to preload",
                known.join(", ")
            );
        }
        Self::preload(s)
    }

    /// A `.so` given by path, run under the system worker with LD_PRELOAD
    /// and labelled with its file name.
    fn preload(s: &str) -> Result<AllocSpec> {
        let path = Path::new(s);
        let meta = std::fs::metadata(path)
            .with_context(|| format!("allocator `{s}`: cannot read the shared library"))?;
        if !meta.is_file() {
            bail!("allocator `{s}`: not a file");
        }
        let mut magic = [0u8; 4];
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .with_context(|| format!("allocator `{s}`: cannot read the shared library"))?;
        if &magic != b"\x7fELF" {
            bail!("allocator `{s}`: not an ELF shared library");
        }
        let canon = std::fs::canonicalize(path)
            .with_context(|| format!("allocator `{s}`: cannot resolve the path"))?;
        let label = canon
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| s.to_string());
        Ok(AllocSpec {
            label,
            worker: "system".to_string(),
            preload: Some(canon),
            exe: None,
            env: Vec::new(),
        })
    }

    /// A worker executable given by path (`LABEL=PATH`), e.g. the pagewise
    /// worker of another build; its worker name is its file name without
    /// the `pagewise-bench-worker-` prefix.
    fn worker_at(label: &str, path: &str) -> Result<AllocSpec> {
        let label = label.trim();
        if label.is_empty()
            || BUILTIN.contains(&label)
            || VARIANTS.iter().any(|v| v.0 == label)
            || PRELOADED.iter().any(|p| p.name == label)
        {
            bail!("allocator `{label}={path}`: give the build a label of its own");
        }
        let canon = std::fs::canonicalize(path)
            .with_context(|| format!("allocator `{label}`: no worker executable at `{path}`"))?;
        if !canon.is_file() || !loadable_elf(&canon) {
            bail!("allocator `{label}`: `{path}` is not an executable for this machine");
        }
        let file = canon
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let worker = file
            .strip_prefix("pagewise-bench-worker-")
            .unwrap_or(&file)
            .to_string();
        Ok(AllocSpec {
            label: label.to_string(),
            worker,
            preload: None,
            exe: Some(canon),
            env: Vec::new(),
        })
    }
}

/// One worker run as recorded in the JSON output.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Workload.
    pub workload: String,
    /// Allocator label.
    pub allocator: String,
    /// Repetition index (0-based).
    pub rep: usize,
    /// Wall time of the whole worker process, ms.
    pub process_ms: f64,
    /// The worker's result, if it succeeded.
    pub result: Option<WorkerResult>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

fn worker_name(w: &str) -> String {
    format!("pagewise-bench-worker-{w}")
}

/// The `cargo build` command that builds the workers into `dir`.
fn build_hint(dir: &Path) -> String {
    let profile = dir
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("release");
    match profile {
        "debug" => "cargo build -p pagewise-bench --bins".to_string(),
        "release" => "cargo build --release -p pagewise-bench --bins".to_string(),
        p => format!("cargo build --profile {p} -p pagewise-bench --bins"),
    }
}

/// Directory to look for workers in.
fn worker_dir(args: &BenchArgs) -> Result<PathBuf> {
    if let Some(d) = &args.worker_dir {
        return Ok(d.clone());
    }
    if let Some(d) = std::env::var_os("PAGEWISE_TEST_BENCH_WORKER_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("cannot locate the running executable")?;
    let mut dir = exe
        .parent()
        .context("the running executable has no directory")?
        .to_path_buf();
    // Test and bench executables live in target/<profile>/deps.
    if dir.file_name().is_some_and(|f| f == "deps") {
        dir.pop();
    }
    Ok(dir)
}

fn find_worker(dir: &Path, worker: &str) -> Result<PathBuf> {
    let p = dir.join(worker_name(worker));
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "worker binary `{}` not found in {}\n  build the workers with: {}",
            worker_name(worker),
            dir.display(),
            build_hint(dir)
        )
    }
}

/// Settings derived from the flags.
pub(crate) struct Plan {
    pub allocs: Vec<AllocSpec>,
    pub workloads: Vec<String>,
    pub scale: Scale,
    pub reps: usize,
    pub idle_ms: u64,
    /// How many repetitions (the first ones) wait the idle period.
    pub idle_runs: usize,
    /// Whether every workload waits it, or only the idle-focused ones
    /// (`--quick` keeps its 90 s that way).
    pub idle_all: bool,
    pub workers: Vec<PathBuf>,
    /// Where the worker binaries are (and `libpagewise.so`, for `redis`).
    pub dir: PathBuf,
}

impl Plan {
    /// Indices into `allocs` that run workload `w`: all of them, except for
    /// an allocator-independent workload, which runs once, under pagewise's
    /// worker if it is given (else the first allocator).
    pub fn allocs_for(&self, w: &str) -> Vec<usize> {
        if w == "redis" {
            return (0..self.allocs.len())
                .filter(|&i| crate::redis::runs_under(&self.allocs[i]))
                .collect();
        }
        if !allocator_independent(w) {
            return (0..self.allocs.len()).collect();
        }
        let i = self
            .allocs
            .iter()
            .position(|a| a.worker == "pagewise" && a.preload.is_none())
            .unwrap_or(0);
        vec![i]
    }

    /// The idle period repetition `rep` of workload `w` waits (0: none).
    pub fn idle_for(&self, w: &str, rep: usize) -> u64 {
        let waits = rep < self.idle_runs && (self.idle_all || idle_focused(w));
        if waits {
            self.idle_ms
        } else {
            0
        }
    }

    /// Whether any run of workload `w` waits the idle period.
    pub fn idles(&self, w: &str) -> bool {
        self.idle_ms > 0 && self.idle_for(w, 0) > 0
    }
}

/// The idle period (ms), how many runs wait it, and whether every
/// workload does: by default longer than every allocator's purge delay,
/// waited by the first run; `--quick` waits a shorter one, in the idle
/// workloads only.
fn idle_settings(args: &BenchArgs, allocs: &[AllocSpec]) -> (u64, usize, bool) {
    let idle_ms = match args.idle_ms {
        Some(ms) => ms,
        None if args.quick => crate::delays::QUICK_IDLE_MS,
        None => crate::delays::default_idle_ms(allocs),
    };
    (idle_ms, args.idle_runs.unwrap_or(1), !args.quick)
}

fn plan(args: &BenchArgs) -> Result<Plan> {
    let mut allocs: Vec<AllocSpec> = Vec::new();
    let mut given: Vec<&str> = args.alloc.iter().map(|a| a.trim()).collect();
    let default = given.is_empty();
    if default {
        given = DEFAULT_ALLOCS.to_vec();
    }
    for a in given {
        // Not installed: the default list goes on without it.
        if let Some(p) = PRELOADED.iter().find(|p| p.name == a) {
            if default && find_library(p.soname, &args.lib_dir).is_none() {
                eprintln!(
                    "note: {} left out: {} is not installed (apt-get install {})",
                    p.name, p.soname, p.package
                );
                continue;
            }
        }
        let spec = AllocSpec::parse_in(a, &args.lib_dir)?;
        if allocs.iter().any(|x| x.label == spec.label) {
            bail!("--alloc: `{}` given twice", spec.label);
        }
        allocs.push(spec);
    }
    let workloads: Vec<String> = if args.only.is_empty() {
        WORKLOADS.iter().map(|s| s.to_string()).collect()
    } else {
        for w in &args.only {
            if !WORKLOADS.contains(&w.as_str()) {
                bail!(
                    "--only: unknown workload `{w}` (known: {})",
                    WORKLOADS.join(", ")
                );
            }
        }
        WORKLOADS
            .iter()
            .filter(|w| args.only.iter().any(|o| o == *w))
            .map(|s| s.to_string())
            .collect()
    };
    let mut workloads = workloads;
    if workloads.iter().any(|w| w == "redis") && crate::redis::server().is_none() {
        if args.only.is_empty() {
            eprintln!("note: redis left out: redis-server is not installed (apt-get install redis-server)");
            workloads.retain(|w| w != "redis");
        } else {
            bail!("--only redis: redis-server is not installed (apt-get install redis-server)");
        }
    }
    let scale = match &args.scale {
        Some(s) => Scale::parse(s).with_context(|| format!("--scale: bad value `{s}`"))?,
        None if args.quick => Scale::Quick,
        None => Scale::Full,
    };
    let reps = args.runs.unwrap_or(if args.quick { 3 } else { 5 }).max(1);
    let dir = worker_dir(args)?;
    let workers = allocs
        .iter()
        .map(|a| match &a.exe {
            Some(exe) => Ok(exe.clone()),
            None => find_worker(&dir, &a.worker),
        })
        .collect::<Result<Vec<_>>>()?;
    let (idle_ms, idle_runs, idle_all) = idle_settings(args, &allocs);
    Ok(Plan {
        allocs,
        workloads,
        scale,
        reps,
        idle_ms,
        idle_runs,
        idle_all,
        workers,
        dir,
    })
}

/// Spawns one worker and waits for its JSON line.
fn run_worker(
    exe: &Path,
    spec: &AllocSpec,
    workload: &str,
    scale: Scale,
    idle_ms: u64,
    seed: u64,
) -> Result<WorkerResult, String> {
    let mut cmd = Command::new(exe);
    cmd.arg(workload)
        .arg(scale.name())
        .arg("--idle-ms")
        .arg(idle_ms.to_string())
        .arg("--sample-ms")
        .arg(if scale == Scale::Full { "10" } else { "5" })
        .arg("--seed")
        .arg(seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(so) = &spec.preload {
        cmd.env("LD_PRELOAD", so);
        cmd.env("PAGEWISE_TEST_BENCH_PRELOAD", so);
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    // A hung worker (a deadlocked allocator) must not hang the suite.
    let limit = Duration::from_secs(if scale == Scale::Full { 300 } else { 120 })
        + Duration::from_millis(idle_ms);
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {} s (killed)", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("wait: {e}")),
        }
    };
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let how = match status.signal() {
            Some(sig) => format!("killed by signal {sig} ({})", signal_name(sig)),
            None => format!("exited with {}", status.code().unwrap_or(-1)),
        };
        let tail: String = stderr.lines().rev().take(6).collect::<Vec<_>>().join(" | ");
        return Err(if tail.is_empty() {
            how
        } else {
            format!("{how}: {tail}")
        });
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("no result line on stdout (stderr: {})", stderr.trim()))?;
    serde_json::from_str(line).map_err(|e| format!("bad result line: {e}"))
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "signal",
    }
}

/// Runs the suite as `args` says; returns the process exit code (0: every
/// run succeeded, 1: some worker failed; errors in the flags or a missing
/// worker are `Err`).
pub fn run(args: &BenchArgs) -> Result<i32> {
    let plan = plan(args)?;
    // A preloaded library that the loader refuses fails here, clearly,
    // before any measurement.
    for (spec, exe) in plan.allocs.iter().zip(&plan.workers) {
        if spec.preload.is_some() {
            run_worker(exe, spec, "churn", Scale::Tiny, 0, 1).map_err(|e| {
                anyhow::anyhow!(
                    "allocator `{}` cannot be preloaded: {e}",
                    spec.preload.as_ref().expect("preload").display()
                )
            })?;
        }
    }
    let total: usize = plan
        .workloads
        .iter()
        .map(|w| plan.reps * plan.allocs_for(w).len())
        .sum();
    let mut progress = crate::progress::Progress::new(total, plan.workloads.len());
    let started = Instant::now();
    let mut records: Vec<RunRecord> = Vec::with_capacity(total);
    for w in &plan.workloads {
        progress.workload();
        let which = plan.allocs_for(w);
        for rep in 0..plan.reps {
            // Interleaved: every allocator once per repetition, rotating the
            // starting allocator so none always runs first.
            let n = which.len();
            for k in 0..n {
                let i = which[(k + rep) % n];
                let spec = &plan.allocs[i];
                let idle = plan.idle_for(w, rep);
                progress.run(w, &spec.label, rep, plan.reps, idle);
                let t = Instant::now();
                let seed = 0x5eed + rep as u64;
                let r = if w == "redis" {
                    crate::redis::run(spec, &plan.dir, plan.scale, idle, seed)
                } else {
                    run_worker(&plan.workers[i], spec, w, plan.scale, idle, seed)
                };
                let process_ms = t.elapsed().as_secs_f64() * 1e3;
                progress.ran(w, &spec.label, rep, r.as_ref().err().map(|e| e.as_str()));
                records.push(RunRecord {
                    workload: w.clone(),
                    allocator: spec.label.clone(),
                    rep,
                    process_ms,
                    result: r.as_ref().ok().cloned(),
                    error: r.err(),
                });
            }
        }
        progress.workload_done(w, plan.reps * which.len());
    }
    progress.finish();
    let wall = started.elapsed();
    let summary = crate::report::summarize(&plan, &records);
    let text = crate::render::render(&plan, &summary, wall, args.wide);
    println!("{text}");
    if let Some(path) = &args.json {
        crate::report::write_json(path, &plan, &records, &summary, wall)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        let files = crate::plot::write_all(dir, &plan, &records, &summary)
            .with_context(|| format!("writing charts into {}", dir.display()))?;
        eprintln!("wrote {} charts into {}", files, dir.display());
    }
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    Ok(if failed == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan `args` gives for pagewise, glibc and jemalloc, without
    /// looking for worker binaries.
    fn plan_with(args: &BenchArgs) -> Plan {
        let allocs: Vec<AllocSpec> = ["pagewise", "system", "jemalloc"]
            .iter()
            .map(|a| AllocSpec::parse(a).expect("built-in"))
            .collect();
        let (idle_ms, idle_runs, idle_all) = idle_settings(args, &allocs);
        Plan {
            allocs,
            workloads: Vec::new(),
            scale: Scale::Tiny,
            reps: 3,
            idle_ms,
            idle_runs,
            idle_all,
            workers: Vec::new(),
            dir: PathBuf::new(),
        }
    }

    #[test]
    fn redis_runs_under_the_allocators_that_can_be_put_under_it() {
        let mut p = plan_with(&BenchArgs::default());
        p.allocs.push(AllocSpec::parse("pagewise-mesh").unwrap());
        let labels: Vec<&str> = p
            .allocs_for("redis")
            .into_iter()
            .map(|i| p.allocs[i].label.as_str())
            .collect();
        // Not glibc: redis-server is linked with jemalloc, which comes first.
        assert_eq!(labels, ["pagewise", "jemalloc", "pagewise-mesh"]);
    }

    #[test]
    fn idle_period_outlasts_the_delays_and_is_waited_by_the_first_runs() {
        let p = plan_with(&BenchArgs::default());
        // jemalloc's 10 s decay is the longest of the three.
        assert_eq!(p.idle_ms, 10_000 + crate::delays::IDLE_MARGIN_MS);
        assert_eq!(p.idle_for("churn", 0), p.idle_ms);
        assert_eq!(p.idle_for("churn", 1), 0);
        assert!(p.idles("idle-handoff"));
        let p = plan_with(&BenchArgs {
            idle_runs: Some(2),
            idle_ms: Some(500),
            ..BenchArgs::default()
        });
        assert_eq!((p.idle_for("churn", 1), p.idle_for("churn", 2)), (500, 0));
    }

    #[test]
    fn quick_idles_only_the_idle_workloads() {
        let p = plan_with(&BenchArgs {
            quick: true,
            ..BenchArgs::default()
        });
        assert_eq!(p.idle_ms, crate::delays::QUICK_IDLE_MS);
        assert_eq!(p.idle_for("idle-one-thread", 0), p.idle_ms);
        assert_eq!(p.idle_for("churn", 0), 0);
        assert!(!p.idles("churn"));
        let p = plan_with(&BenchArgs {
            idle_ms: Some(0),
            ..BenchArgs::default()
        });
        assert!(!p.idles("idle-one-thread"));
    }

    #[test]
    fn pagewise_mesh_is_the_pagewise_worker_with_meshing_on() {
        let spec = AllocSpec::parse("pagewise-mesh").unwrap();
        assert_eq!(
            (spec.label.as_str(), spec.worker.as_str()),
            ("pagewise-mesh", "pagewise")
        );
        assert_eq!(
            spec.env,
            vec![("PAGEWISE_MESH".to_string(), "1".to_string())]
        );
        assert!(AllocSpec::parse("pagewise").unwrap().env.is_empty());
        assert!(
            AllocSpec::parse("pagewise-mesh=/bin/true").is_err(),
            "a label of its own"
        );
    }

    #[test]
    fn idle_flags_parse() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let c = Cli::try_parse_from(["x", "--idle-ms", "15000", "--idle-runs", "3"]).unwrap();
        assert_eq!((c.bench.idle_ms, c.bench.idle_runs), (Some(15000), Some(3)));
        assert!(Cli::try_parse_from(["x", "--idle-runs", "-1"]).is_err());
    }
}
