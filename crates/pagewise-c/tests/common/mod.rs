//! Shared helpers: find the built library, compile the C test program,
//! locate Debian's programs (and say so when one is missing: [`missing`]).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The profile directory of this build (`$CARGO_TARGET_DIR/<profile>`):
/// test binaries live in its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary is in <target>/<profile>/deps")
        .to_path_buf()
}

/// `cargo build -p pagewise-c` for this test binary's profile and target
/// directory, once per test process: cargo test does not build a
/// cdylib/staticlib-only library, and a stale one would be tested otherwise.
/// (cargo releases its build lock while tests run, so this does not block.)
pub fn build_library() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| build_package("pagewise-c"));
}

/// [`build_library`] for the hardened library (`libpagewise_secure.so`).
pub fn build_secure_library() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| build_package("pagewise-c-secure"));
}

/// The current `libpagewise_secure.so`, built.
pub fn secure_lib_so() -> PathBuf {
    build_secure_library();
    let p = profile_dir().join("libpagewise_secure.so");
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

fn build_package(package: &str) {
    {
        let dir = profile_dir();
        let profile = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", package, "--target-dir"])
            .arg(dir.parent().unwrap());
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
            "cargo build -p {package} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The current `libpagewise.so`.
pub fn lib_so() -> PathBuf {
    find_artifact("libpagewise.so")
}

/// The current `libpagewise.a`.
pub fn lib_a() -> PathBuf {
    find_artifact("libpagewise.a")
}

fn find_artifact(name: &str) -> PathBuf {
    build_library();
    let p = profile_dir().join(name);
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// An empty scratch directory for one test's outputs (names are unique per
/// test; the previous run's directory is replaced).
pub fn scratch(name: &str) -> PathBuf {
    let d = profile_dir().join("pagewise-c-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn c_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/edge.c")
}

/// `cc` on the PATH, or None (see [`missing`]).
pub fn c_compiler() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("cc"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        missing("cc (a C compiler)", "gcc libc6-dev");
    }
    found
}

fn cc(out: &Path, extra: &[&str]) {
    cc_source(&c_source(), out, extra)
}

/// Compiles `src` (a C file) to `out` as the test programs are: warnings
/// are errors, `include/pagewise.h` on the include path.
fn cc_source(src: &Path, out: &Path, extra: &[&str]) {
    let include = repo_root().join("include");
    let mut cmd = Command::new("cc");
    cmd.args([
        "-O0",
        "-fno-builtin",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pthread",
    ])
    .arg("-I")
    .arg(&include)
    .arg(src)
    .arg("-o")
    .arg(out)
    .args(extra);
    let o = cmd.output().expect("running cc (install a C compiler)");
    assert!(
        o.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The C test program (`tests/c/edge.c`), linked against glibc only; None
/// without a C compiler (see [`missing`]).
pub fn edge() -> Option<&'static Path> {
    c_compiler()?;
    static EDGE: OnceLock<PathBuf> = OnceLock::new();
    Some(EDGE.get_or_init(|| {
        let out = scratch("cc").join("edge");
        cc(&out, &["-ldl"]);
        out
    }))
}

/// The C test program defining `pagewise_conf` (embedded defaults) and
/// exporting it (`-rdynamic`); None without a C compiler.
pub fn edge_embedded() -> Option<&'static Path> {
    c_compiler()?;
    static EDGE: OnceLock<PathBuf> = OnceLock::new();
    Some(EDGE.get_or_init(|| {
        let out = scratch("cc-embedded").join("edge-embedded");
        cc(
            &out,
            &[
                "-ldl",
                "-rdynamic",
                "-DEMBED_CONF=\"decay_ms:700,limit:1G,retain_max:16M\"",
            ],
        );
        out
    }))
}

/// The C test program of jemalloc's interface (`tests/c/jemalloc.c`),
/// linked against glibc only (it finds the functions with `dlsym`); None
/// without a C compiler.
pub fn jemalloc_program() -> Option<&'static Path> {
    c_compiler()?;
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    Some(PROGRAM.get_or_init(|| {
        let out = scratch("cc-jemalloc").join("jemalloc");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/jemalloc.c");
        cc_source(&src, &out, &["-ldl"]);
        out
    }))
}

/// The C test program with libpagewise.a linked in; None without a C
/// compiler.
pub fn edge_linked() -> Option<&'static Path> {
    c_compiler()?;
    static EDGE: OnceLock<PathBuf> = OnceLock::new();
    Some(EDGE.get_or_init(|| {
        let out = scratch("cc-static").join("edge-linked");
        let a = lib_a();
        cc(
            &out,
            &[
                "-rdynamic",
                "-Wl,--whole-archive",
                a.to_str().unwrap(),
                "-Wl,--no-whole-archive",
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
            ],
        );
        out
    }))
}

/// `tests/c/bigtls.c` as a shared library (a big thread-local array); None
/// without a C compiler.
pub fn bigtls_so() -> Option<&'static Path> {
    c_compiler()?;
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    Some(LIB.get_or_init(|| {
        let out = scratch("cc-bigtls").join("libbigtls.so");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/bigtls.c");
        let o = Command::new("cc")
            .args(["-shared", "-fPIC", "-O0", "-o"])
            .arg(&out)
            .arg(src)
            .output()
            .expect("running cc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    }))
}

/// `c++` on the PATH, or None (see [`missing`]).
pub fn cxx_compiler() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("c++"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        missing("c++ (a C++ compiler)", "g++");
    }
    found
}

/// The C++ test program (`tests/c/cxx.cpp`, C++17), linked against glibc
/// and libstdc++ only; None without a C++ compiler (see [`missing`]).
pub fn cxx_program() -> Option<&'static Path> {
    cxx_compiler()?;
    static CXX: OnceLock<PathBuf> = OnceLock::new();
    Some(CXX.get_or_init(|| {
        let out = scratch("cxx").join("cxx");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cxx.cpp");
        let o = Command::new("c++")
            .args(["-std=c++17", "-O0", "-g", "-Wall", "-Wextra", "-Werror"])
            .arg(src)
            .arg("-o")
            .arg(&out)
            .arg("-ldl")
            .output()
            .expect("running c++");
        assert!(
            o.status.success(),
            "c++ failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    }))
}

/// Waits for `child` at most `limit`; kills it and returns None if it is
/// still running then (a deadlock: the test must fail, not hang). If the
/// child leads its own process group (`CommandExt::process_group(0)`),
/// the whole group is killed, so forked workers holding its pipes die too.
/// Its piped stdout and stderr are read meanwhile, so a child that writes
/// more than a pipe holds does not block on it.
pub fn wait_or_kill(mut child: std::process::Child, limit: std::time::Duration) -> Option<Output> {
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            let pid = child.id() as libc::pid_t;
            // SAFETY: plain system calls on a child we have not reaped yet.
            unsafe {
                if libc::getpgid(pid) == pid {
                    libc::kill(-pid, libc::SIGKILL);
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    status.map(|status| Output {
        status,
        stdout,
        stderr,
    })
}

/// A command with a clean pagewise environment (no inherited knobs).
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PAGEWISE_") || k == "LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c
}

/// Runs `cmd` with the library preloaded.
pub fn preloaded(mut cmd: Command) -> Output {
    cmd.env("LD_PRELOAD", lib_so());
    cmd.output().expect("spawn")
}

#[path = "missing.rs"]
mod missing;
pub use missing::missing;

/// Debian's program at `/usr/bin/<name>`, or None when it is not installed
/// (see [`missing`]: a panic in CI, a visible skip elsewhere).
pub fn debian_program(name: &str, package: &str) -> Option<PathBuf> {
    let p = Path::new("/usr/bin").join(name);
    if p.exists() {
        Some(p)
    } else {
        missing(&p.display().to_string(), package);
        None
    }
}

/// The test programs' input files.
pub fn program_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

/// Reads the JSON report a process wrote to `dir/stats.<pid>.json`.
pub fn stats_of(dir: &Path, pid: u32) -> serde_json::Value {
    let path = dir.join(format!("stats.{pid}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// Field of a JSON report as u64.
pub fn field(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = v;
    for k in path {
        v = &v[*k];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("missing field {path:?}"))
}

/// Allocations pagewise served in the process the report is from.
pub fn total_allocs(v: &serde_json::Value) -> u64 {
    v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["total_allocs"].as_u64().unwrap())
        .sum()
}

/// Checks the report against the kernel's own figures: pagewise's accounted
/// bytes plus the memory outside pagewise (measured in smaps) must be within
/// `pct` percent of VmRSS; and pagewise's accounting within `pct` percent
/// (plus 1 MiB of slack for tiny heaps) of its mappings' resident bytes.
pub fn assert_attribution(v: &serde_json::Value, pct: f64) {
    let accounted = field(v, &["committed_bytes"]) + field(v, &["metadata_bytes"]);
    let other = field(v, &["os", "other_anon_rss"]) + field(v, &["os", "file_rss"]);
    let rss = field(v, &["os", "vm_rss"]);
    let pw_rss = field(v, &["os", "pagewise_rss"]);
    let total = accounted + other;
    let err = (total as f64 - rss as f64).abs() / rss as f64 * 100.0;
    assert!(
        err <= pct,
        "attributed {total} vs RSS {rss}: {err:.1}% off (accounted {accounted}, pagewise resident {pw_rss}, other {other})"
    );
    let slack = pw_rss as f64 * pct / 100.0 + (1 << 20) as f64;
    assert!(
        (accounted as f64 - pw_rss as f64).abs() <= slack,
        "pagewise accounted {accounted} vs its resident {pw_rss}"
    );
}
