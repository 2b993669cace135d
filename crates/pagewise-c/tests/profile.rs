//! The heap profiler from C: a program built with -O2 and without frame
//! pointers, under `LD_PRELOAD=libpagewise.so` with `PAGEWISE_PROF=1` at
//! the default rate. Its in-use profile (written by `pagewise_prof_dump`)
//! gives each of three call sites (of different sizes and lifetimes) its
//! share of the live bytes within 10 % of the total and its own bytes
//! within half, and the profile written at exit (`PAGEWISE_PROF_FILE`)
//! names the leaking function; so does the one written on
//! `PAGEWISE_STATS_SIGNAL`. Frames are symbolized with binutils'
//! `addr2line` against the program (linked without PIE, so its addresses
//! are the file's).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const MIB: f64 = 1048576.0;

/// `tests/c/prof_sites.c`, built once for all the tests of this file.
fn program() -> Option<&'static Path> {
    c_compiler()?;
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    Some(PROGRAM.get_or_init(|| {
        let out = scratch("prof").join("prof_sites");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/prof_sites.c");
        let o = Command::new("cc")
            .args([
                "-O2",
                "-fomit-frame-pointer",
                "-g",
                "-no-pie",
                "-Wall",
                "-Werror",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .arg("-ldl")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    }))
}

/// Whether binutils' `addr2line` is there (see [`missing`]).
fn have_addr2line() -> bool {
    let there = Command::new("addr2line").arg("--version").output().is_ok();
    if !there {
        missing("addr2line", "binutils");
    }
    there
}

/// One `site` line: live and allocated bytes, and frames.
struct Site {
    live: u64,
    allocated: u64,
    frames: Vec<u64>,
}

fn sites(text: &str) -> Vec<Site> {
    assert!(text.starts_with("pagewise heap profile 1\n"), "{text:.300}");
    text.lines()
        .take_while(|l| *l != "maps")
        .filter(|l| l.starts_with("site "))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            Site {
                live: w[2].parse().unwrap(),
                allocated: w[6].parse().unwrap(),
                frames: w[7..]
                    .iter()
                    .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap())
                    .collect(),
            }
        })
        .collect()
}

/// Live bytes by the program's site function among each site's frames.
fn live_by_function(prog: &Path, text: &str) -> Vec<(String, f64)> {
    by_function(prog, text, |s| s.live)
}

/// The bytes `which` picks of each site, by the program's site function
/// among the site's frames.
fn by_function(prog: &Path, text: &str, which: fn(&Site) -> u64) -> Vec<(String, f64)> {
    let sites = sites(text);
    let mut by: Vec<(String, f64)> = Vec::new();
    for s in sites {
        let addrs: Vec<String> = s.frames.iter().map(|ip| format!("{:#x}", ip - 1)).collect();
        let o = Command::new("addr2line")
            .arg("-f")
            .arg("-e")
            .arg(prog)
            .args(&addrs)
            .output()
            .unwrap();
        let names = String::from_utf8_lossy(&o.stdout).to_string();
        let f = [
            "site_a_small",
            "site_b_medium",
            "site_c_large",
            "site_leaking",
            "site_churn",
        ]
        .into_iter()
        .find(|f| names.lines().any(|l| l == *f))
        .unwrap_or("other");
        let bytes = which(&s) as f64;
        match by.iter_mut().find(|(n, _)| n == f) {
            Some((_, b)) => *b += bytes,
            None => by.push((f.to_string(), bytes)),
        }
    }
    by
}

fn get(by: &[(String, f64)], f: &str) -> f64 {
    by.iter().find(|(n, _)| n == f).map_or(0.0, |(_, b)| *b)
}

#[test]
fn call_site_shares_from_c_without_frame_pointers_and_the_leak_at_exit() {
    let Some(prog) = program() else { return };
    if !have_addr2line() {
        return;
    }
    let dir = scratch("prof-out");
    let in_use = dir.join("in-use.prof");
    let at_exit = dir.join("exit.prof");
    let _ = std::fs::remove_file(&at_exit);
    let o = preloaded({
        let mut c = command(prog);
        c.arg(&in_use)
            .env("PAGEWISE_PROF", "1")
            .env_remove("PAGEWISE_PROF_SAMPLE")
            .env("PAGEWISE_PROF_FILE", &at_exit);
        c
    });
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&in_use).unwrap();
    let by = live_by_function(prog, &text);
    // Each site's true MiB, and how far its own estimate may be off: the
    // standard error of a site is about 3 % of its bytes for site_a_small,
    // 4 % for site_b_medium, 5 % for site_c_large and 13 % for the leak
    // (measured over 30 runs; the leak, the fewest samples, has about 60),
    // so each bound is over four of them.
    let truth = [
        ("site_a_small", 360.0, 0.25),
        ("site_b_medium", 180.0, 0.25),
        ("site_c_large", 60.0, 0.25),
        ("site_leaking", 30.0, 0.6),
    ];
    let total: f64 = truth.iter().map(|(_, t, _)| t * MIB).sum();
    for (f, t, bound) in truth {
        let est = get(&by, f);
        assert!(
            ((est - t * MIB) / total).abs() < 0.10,
            "{f}: estimated {:.1} MiB, true {t} MiB; all {by:?}",
            est / MIB
        );
        // Each site on its own too, so that a site whose samples are lost
        // or misweighted cannot hide in the total.
        assert!(
            (est / (t * MIB) - 1.0).abs() < bound,
            "{f}: estimated {:.1} MiB, true {t} MiB; all {by:?}",
            est / MIB
        );
    }
    // site_b_medium freed half of what it allocated, site_c_large two
    // thirds: their frees counted off what their samples stood for.
    let allocated = by_function(prog, &text, |s| s.allocated);
    for (f, t) in [("site_b_medium", 360.0), ("site_c_large", 180.0)] {
        let est = get(&allocated, f);
        assert!(
            (est / (t * MIB) - 1.0).abs() < 0.25,
            "{f}: allocated an estimated {:.1} MiB, truly {t} MiB; all {allocated:?}",
            est / MIB
        );
    }
    let exit = live_by_function(prog, &std::fs::read_to_string(&at_exit).unwrap());
    let top = exit.iter().max_by(|x, y| x.1.total_cmp(&y.1)).unwrap();
    assert_eq!(top.0, "site_leaking", "live at exit: {exit:?}");
    assert!(
        get(&exit, "site_a_small") < 8.0 * MIB,
        "freed before exit: {exit:?}"
    );
}

#[test]
fn the_profile_is_written_on_the_stats_signal() {
    // The program leaks and waits; the signal that asks for the report
    // writes the profile too (by the library's own thread, within 50 ms),
    // while the program still runs.
    let Some(prog) = program() else { return };
    if !have_addr2line() {
        return;
    }
    let dir = scratch("prof-signal");
    let mut child = command(prog)
        .arg("--hold")
        .env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_PROF", "1")
        .env("PAGEWISE_PROF_FILE", dir.join("held.%p.prof"))
        .env("PAGEWISE_STATS_SIGNAL", "SIGUSR2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n");
    let file = dir.join(format!("held.{}.prof", child.id()));
    assert!(!file.exists(), "a profile before the signal");
    // SAFETY: a signal to our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR2) };
    // The sites come before the maps: once "maps" is there, they are all.
    let start = std::time::Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.contains("\nmaps\n") {
            break text;
        }
        if start.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            panic!("no profile at {} 10 s after the signal", file.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(child.stdin.take());
    let o = wait_or_kill(child, std::time::Duration::from_secs(30)).expect("hung");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let by = live_by_function(prog, &text);
    let top = by.iter().max_by(|x, y| x.1.total_cmp(&y.1)).unwrap();
    assert_eq!(top.0, "site_leaking", "live when signalled: {by:?}");
}

/// The maps lines of a profile: (start, end, path) of each mapping.
fn maps(text: &str) -> Vec<(u64, u64, String)> {
    text.lines()
        .skip_while(|l| *l != "maps")
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (lo, hi) = w.next()?.split_once('-')?;
            let path = w.nth(4).unwrap_or("").to_owned();
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
                path,
            ))
        })
        .collect()
}

#[test]
fn debians_python3_without_frame_pointers_is_unwound_from_the_allocation_to_libc() {
    // Debian builds python3 with -O2 and without frame pointers: its stacks
    // come from the unwind tables alone. A sampled allocation's stack must
    // go through the interpreter (python3's code) down to libc's start.
    let Some(py) = debian_program("python3", "python3") else {
        return;
    };
    let dir = scratch("prof-python");
    let file = dir.join("py.prof");
    let o = preloaded({
        let mut c = command(&py);
        c.args([
            "-c",
            "x = [{'k%d' % i: [i] * 20} for i in range(200000)]; print(len(x))",
        ])
        .env("PAGEWISE_PROF", "1")
        .env("PAGEWISE_PROF_SAMPLE", "65536")
        .env("PAGEWISE_PROF_FILE", &file);
        c
    });
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&file).unwrap();
    let sites = sites(&text);
    let maps = maps(&text);
    let object = |ip: u64| {
        maps.iter()
            .find(|(lo, hi, _)| (*lo..*hi).contains(&ip))
            .map_or("", |(_, _, p)| p.as_str())
    };
    assert!(sites.len() >= 10, "{} sites", sites.len());
    let deep = sites
        .iter()
        .filter(|s| {
            let objects: Vec<&str> = s.frames.iter().map(|&ip| object(ip)).collect();
            objects.iter().any(|p| p.contains("python3"))
                && objects.iter().any(|p| p.contains("libc.so"))
                && s.frames.len() >= 8
        })
        .count();
    assert!(
        deep * 2 >= sites.len(),
        "{deep} of {} sites unwound through python3 to libc",
        sites.len()
    );
}
