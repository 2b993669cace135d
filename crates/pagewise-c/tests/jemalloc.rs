//! jemalloc's interface (`mallctl`, `malloc_stats_print`, the `*allocx`
//! family): the C test program `tests/c/jemalloc.c` under the library and
//! under jemalloc itself (the same checks of jemalloc's semantics pass
//! against both), and Debian's `redis-server`, built for jemalloc, showing
//! pagewise's figures.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn assert_all_ok(o: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stdout.contains("jemalloc: all ok"),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        o.status
    );
}

/// Debian's jemalloc (a dependency of `redis-server`), or None.
fn libjemalloc() -> Option<PathBuf> {
    let dir = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    let p = Path::new(&dir).join("libjemalloc.so.2");
    if p.is_file() {
        Some(p)
    } else {
        missing(&p.display().to_string(), "libjemalloc2");
        None
    }
}

#[test]
fn mallctl_stats_print_and_allocx_answer_as_jemalloc_does_with_pagewise_figures() {
    let Some(program) = jemalloc_program() else {
        return;
    };
    let o = preloaded({
        let mut c = command(program);
        c.arg("pagewise");
        c
    });
    assert_all_ok(&o, "jemalloc.c under libpagewise.so");
}

#[test]
fn the_same_checks_pass_against_jemalloc_itself() {
    let Some(program) = jemalloc_program() else {
        return;
    };
    let Some(so) = libjemalloc() else { return };
    let o = command(program)
        .arg("jemalloc")
        .env("LD_PRELOAD", so)
        .output()
        .unwrap();
    assert_all_ok(&o, "jemalloc.c under libjemalloc.so.2");
}

#[test]
fn malloc_stats_print_without_a_callback_writes_the_report_to_stderr() {
    let Some(program) = jemalloc_program() else {
        return;
    };
    let o = preloaded({
        let mut c = command(program);
        c.arg("stderr");
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr.starts_with("pagewise report (pid "), "{stderr}");
    assert!(
        stderr.contains("\n    free slots in used pages"),
        "{stderr}"
    );
}

/// A `redis-server` on a socket of its own, killed on drop.
struct Redis {
    child: Child,
    socket: PathBuf,
    cli: PathBuf,
}

impl Redis {
    fn start(server: &Path, cli: PathBuf, stats: &Path) -> Redis {
        let socket =
            std::env::temp_dir().join(format!("pagewise-c-redis-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let child = command(server)
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
            ])
            .arg(&socket)
            .env("LD_PRELOAD", lib_so())
            .env("PAGEWISE_STATS_FILE", stats)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let redis = Redis { child, socket, cli };
        let start = Instant::now();
        while redis.cli(&["PING"]).trim() != "PONG" {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    /// One command through `redis-cli`; its reply.
    fn cli(&self, args: &[&str]) -> String {
        let o = Command::new(&self.cli)
            .arg("-s")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A number of `INFO memory`.
    fn info(&self, key: &str) -> f64 {
        let text = self.cli(&["INFO", "memory"]);
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in INFO memory:\n{text}"))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn redis_info_memory_and_malloc_stats_show_pagewise_figures() {
    let Some(server) = debian_program("redis-server", "redis-server") else {
        return;
    };
    let Some(cli) = debian_program("redis-cli", "redis-tools") else {
        return;
    };
    let dir = scratch("redis");
    let mut redis = Redis::start(&server, cli, &dir.join("stats.%p.json"));
    let pid = redis.child.id();
    // 10,000 values of 1,000 bytes: 10 MB.
    let fill = "for i=1,10000 do redis.call('SET','key:'..i,string.rep('v',1000)) end return 1";
    assert_eq!(redis.cli(&["EVAL", fill, "0"]).trim(), "1");
    // Redis reads the allocator's figures in its timer (every 100 ms).
    let start = Instant::now();
    let (used, allocated) = loop {
        let (used, allocated) = (redis.info("used_memory"), redis.info("allocator_allocated"));
        if allocated >= used || start.elapsed() > Duration::from_secs(5) {
            break (used, allocated);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let active = redis.info("allocator_active");
    let resident = redis.info("allocator_resident");
    // jemalloc's empty heap would say 28672 here; pagewise holds the data.
    assert!(used > 10e6, "used_memory {used}");
    // Redis counts its own allocations (usable sizes); pagewise counts
    // those and the rest of the process (Lua, libc): a little more.
    assert!(
        allocated >= used && allocated <= used * 1.1 + 4e6,
        "allocator_allocated {allocated} against used_memory {used}"
    );
    assert!(
        allocated <= active && active <= resident,
        "{allocated} {active} {resident}"
    );
    assert!(
        active <= allocated * 1.25,
        "fragmentation: active {active}, allocated {allocated}"
    );
    let stats = redis.cli(&["MEMORY", "MALLOC-STATS"]);
    assert!(stats.starts_with("pagewise report (pid "), "{stats}");
    assert!(!stats.contains("jemalloc"), "{stats}");
    assert!(stats.contains("free slots in used pages"), "{stats}");
    // Redis's MEMORY PURGE is `arena.<narenas>.purge`.
    assert_eq!(redis.cli(&["MEMORY", "PURGE"]).trim(), "OK");
    let after = redis.info("allocator_allocated");
    // What pagewise itself says is live, from its report at exit.
    redis.cli(&["SHUTDOWN", "NOSAVE"]);
    let status = redis.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let v = stats_of(&dir, pid);
    let live = field(&v, &["live_bytes"]) as f64;
    assert!(
        (live - after).abs() <= after * 0.05,
        "allocator_allocated {after}, pagewise's live bytes at exit {live}"
    );
}
