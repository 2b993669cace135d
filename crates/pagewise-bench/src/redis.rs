//! A real program: `redis-server` under each allocator (a long-lived
//! key-value server), when it is installed (`apt-get install
//! redis-server`).
//!
//! The server is filled through six SET passes, each of new keys, with
//! values of 1 KiB, 32 B, 4 KiB, 256 B, 64 B and 2 KiB; then 80 % of the
//! keys, chosen at random, are deleted; then it idles. What is measured is
//! what redis reports (`INFO memory`: `used_memory`, `used_memory_rss` and
//! their quotient `mem_fragmentation_ratio`) and the memory the server
//! costs the machine (`util::memory_of`: its proportional set size with
//! memfd files counted by their blocks), which counts a page meshing maps
//! at several addresses once, touched or not, where RSS counts it at each
//! address touched since the remap, and not at all before.
//!
//! Debian's `redis-server` is linked with jemalloc: `jemalloc` runs it as
//! it is, the others preload their library (`libpagewise.so` from the
//! workers' directory, `pagewise-mesh` with `PAGEWISE_MESH=1`, mimalloc's
//! and tcmalloc's system libraries). glibc's malloc cannot be put under it
//! (jemalloc's symbols come first), so `system` does not run this workload.
//!
//! The result is a [`WorkerResult`], so the report shows it like the other
//! workloads: `live_bytes` is redis's `used_memory` after the deletes less
//! what it used at start, the RSS figures are the server's, and the
//! fragmentation ratios are extra figures.

use crate::runner::AllocSpec;
use crate::worker::WorkerResult;
use crate::workloads::{Part, Scale};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Value sizes of the six passes.
const PASSES: [usize; 6] = [1024, 32, 4096, 256, 64, 2048];
/// Commands sent before their replies are read.
const PIPELINE: usize = 1000;

/// Where `redis-server` is, if it is installed.
pub fn server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

/// Whether allocator `spec` can be put under redis (see the module).
pub fn runs_under(spec: &AllocSpec) -> bool {
    spec.preload.is_some() || matches!(spec.worker.as_str(), "pagewise" | "jemalloc" | "mimalloc")
}

/// The library to preload for `spec` (None: redis's own jemalloc).
fn library(spec: &AllocSpec, workers: &Path) -> Result<Option<PathBuf>, String> {
    if let Some(so) = &spec.preload {
        return Ok(Some(so.clone()));
    }
    match spec.worker.as_str() {
        "jemalloc" => Ok(None),
        "pagewise" if spec.exe.is_none() => {
            let so = workers.join("libpagewise.so");
            if so.is_file() {
                Ok(Some(so))
            } else {
                Err(format!(
                    "{} not found: build it with `cargo build --release -p pagewise-c`",
                    so.display()
                ))
            }
        }
        "mimalloc" => crate::runner::find_system_library("libmimalloc.so.2")
            .map(Some)
            .ok_or_else(|| "libmimalloc.so.2 not found (apt-get install libmimalloc2.0)".into()),
        other => Err(format!(
            "allocator `{other}` cannot be put under redis-server"
        )),
    }
}

/// Keys per pass at each scale.
fn keys_per_pass(scale: Scale) -> usize {
    scale.pick(2_000, 20_000, 50_000)
}

/// A running server on a private socket, killed on drop.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Server {
    fn start(spec: &AllocSpec, workers: &Path) -> Result<Server, String> {
        let exe = server().ok_or("redis-server is not installed (apt-get install redis-server)")?;
        let socket = std::env::temp_dir().join(format!(
            "pagewise-bench-redis-{}-{}.sock",
            std::process::id(),
            spec.label
        ));
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(exe);
        cmd.args([
            "--port",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocket",
        ])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        if let Some(so) = library(spec, workers)? {
            cmd.env("LD_PRELOAD", so);
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let mut server = Server { child, socket };
        server.wait_until_listening()?;
        Ok(server)
    }

    /// Waits until a client can connect. The socket file appears at
    /// `bind`, before the server calls `listen`: a connect in between is
    /// refused, so the file alone does not say the server is ready.
    fn wait_until_listening(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "redis-server exited ({status}) before listening: {}",
                    self.stderr_tail()
                ));
            }
            if UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not listen on its socket within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines the (exited) server wrote to stderr.
    fn stderr_tail(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn connect(&self) -> Result<Client, String> {
        let s = UnixStream::connect(&self.socket).map_err(|e| format!("connect: {e}"))?;
        Ok(Client {
            out: s.try_clone().map_err(|e| e.to_string())?,
            inp: BufReader::new(s),
        })
    }
}

/// A client speaking RESP, pipelining commands.
struct Client {
    out: UnixStream,
    inp: BufReader<UnixStream>,
}

impl Client {
    /// Appends one command to `buf`.
    fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
    }

    /// Sends `buf` (holding `n` commands) and reads their `n` replies,
    /// failing on an error reply.
    fn send(&mut self, buf: &mut Vec<u8>, n: usize) -> Result<(), String> {
        self.out.write_all(buf).map_err(|e| format!("send: {e}"))?;
        buf.clear();
        for _ in 0..n {
            self.reply()?;
        }
        Ok(())
    }

    /// Reads one reply (simple, integer, error or bulk string).
    fn reply(&mut self) -> Result<Vec<u8>, String> {
        let mut line = Vec::new();
        self.inp
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("read: {e}"))?;
        match line.first() {
            Some(b'+') | Some(b':') => Ok(line),
            Some(b'$') => {
                let n: i64 = std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or("bad bulk length")?;
                if n < 0 {
                    return Ok(Vec::new());
                }
                let mut body = vec![0; n as usize + 2];
                self.inp
                    .read_exact(&mut body)
                    .map_err(|e| format!("read: {e}"))?;
                body.truncate(n as usize);
                Ok(body)
            }
            _ => Err(format!("redis: {}", String::from_utf8_lossy(&line).trim())),
        }
    }

    /// `INFO memory` as (field, value) pairs.
    fn info_memory(&mut self) -> Result<Vec<(String, String)>, String> {
        let mut buf = Vec::new();
        Self::encode(&mut buf, &[b"INFO", b"memory"]);
        self.out.write_all(&buf).map_err(|e| format!("send: {e}"))?;
        let body = self.reply()?;
        Ok(String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }
}

fn field(info: &[(String, String)], key: &str) -> Result<f64, String> {
    info.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| format!("INFO memory has no `{key}`"))
}

/// A figure of `/proc/PID/<file>` (kB) in bytes.
fn proc_kb(pid: u32, file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

fn rss(pid: u32) -> u64 {
    proc_kb(pid, "status", "VmRSS:").unwrap_or(0)
}

/// Runs the workload under `spec`; `workers` is the directory of the
/// worker binaries (where `libpagewise.so` is built too).
pub fn run(
    spec: &AllocSpec,
    workers: &Path,
    scale: Scale,
    idle_ms: u64,
    seed: u64,
) -> Result<WorkerResult, String> {
    let server = Server::start(spec, workers)?;
    let mut c = server.connect()?;
    let pid = server.pid();
    let start_info = c.info_memory()?;
    let used_at_start = field(&start_info, "used_memory")?;
    let baseline_rss = rss(pid);
    let pss_baseline = crate::util::memory_of(Some(pid));
    let keys = keys_per_pass(scale);
    let t = Instant::now();
    let mut buf = Vec::with_capacity(PIPELINE * 128);
    let mut ops = 0u64;
    let mut parts = Vec::new();
    for (pass, &size) in PASSES.iter().enumerate() {
        let tp = Instant::now();
        let value = vec![b'a' + pass as u8; size];
        for chunk in (0..keys).collect::<Vec<_>>().chunks(PIPELINE) {
            for &i in chunk {
                let key = format!("p{pass}:{i}");
                Client::encode(&mut buf, &[b"SET", key.as_bytes(), &value]);
            }
            c.send(&mut buf, chunk.len())?;
            ops += chunk.len() as u64;
        }
        parts.push(Part {
            name: format!("SET {size} B"),
            ops: keys as u64,
            ns: tp.elapsed().as_nanos() as u64,
            rss: Some(rss(pid)),
            ..Part::default()
        });
    }
    let peak_rss = proc_kb(pid, "status", "VmHWM:").unwrap_or(0);
    // Delete 80 % of the keys, at random.
    let td = Instant::now();
    let mut rng = crate::util::Rng::new(seed);
    let mut deletes = Vec::new();
    for pass in 0..PASSES.len() {
        for i in 0..keys {
            if rng.below(5) != 0 {
                deletes.push(format!("p{pass}:{i}"));
            }
        }
    }
    for chunk in deletes.chunks(PIPELINE) {
        for key in chunk {
            Client::encode(&mut buf, &[b"DEL", key.as_bytes()]);
        }
        c.send(&mut buf, chunk.len())?;
        ops += chunk.len() as u64;
    }
    let elapsed_ns = t.elapsed().as_nanos() as u64;
    parts.push(Part {
        name: "DEL 80 %".into(),
        ops: deletes.len() as u64,
        ns: td.elapsed().as_nanos() as u64,
        rss: Some(rss(pid)),
        ..Part::default()
    });
    let rss_after_free = rss(pid);
    std::thread::sleep(Duration::from_millis(idle_ms));
    let info = c.info_memory()?;
    let rss_idle = rss(pid);
    let pss_idle = crate::util::memory_of(Some(pid));
    let used = field(&info, "used_memory")?;
    let mut extra = vec![("used_memory".to_string(), used)];
    if idle_ms > 0 {
        // Figures of the quiet server: runs that did not wait the idle
        // period do not report them (their medians would mix both).
        extra.push((
            "mem_fragmentation_ratio".to_string(),
            field(&info, "mem_fragmentation_ratio")?,
        ));
        if let Some(memory) = pss_idle {
            // The same quotient with the memory the server costs the
            // machine: RSS misses a meshed page nothing has touched since
            // its remap, and counts one that several touched addresses
            // show once per address.
            extra.push((
                "memory_fragmentation_ratio".to_string(),
                memory as f64 / used,
            ));
        }
    }
    Ok(WorkerResult {
        workload: "redis".into(),
        worker: spec.label.clone(),
        scale,
        ops,
        elapsed_ns,
        baseline_rss,
        peak_rss,
        rss_after_free,
        rss_idle,
        pss_baseline,
        pss_idle,
        idle_ms,
        live_bytes: (used - used_at_start).max(0.0) as u64,
        live_objects: (PASSES.len() * keys - deletes.len()) as u64,
        floor_pages: None,
        syscalls: None,
        syscalls_workload: None,
        syscall_source: "n/a: another process".into(),
        syscalls_interposed: None,
        minor_faults: 0,
        parts,
        extra,
        start_ms: 0.0,
        marks: Vec::new(),
        samples: Vec::new(),
    })
}
