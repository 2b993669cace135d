//! The C test program (`tests/c/edge.c`): every exported function's edge
//! cases, threads with cross-thread frees, fork from a threaded parent, misuse,
//! and the environment knobs.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;

fn assert_all_ok(o: &std::process::Output, what: &str) {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stdout.contains("edge: all ok"),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        o.status
    );
}

#[test]
fn edge_cases_hold_under_glibc_too() {
    let Some(edge) = edge() else { return };
    // The same standard-semantics checks pass against glibc: they test C
    // semantics, not pagewise's own choices.
    let o = command(edge).arg("glibc").output().unwrap();
    assert_all_ok(&o, "edge glibc (no preload)");
}

#[test]
fn edge_cases_threads_and_fork_under_preload() {
    let Some(edge) = edge() else { return };
    let dir = scratch("edge");
    let child = command(edge)
        .arg("pagewise")
        .env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_STATS_FILE", dir.join("stats.%p.json"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_all_ok(&o, "edge pagewise (LD_PRELOAD)");
    let v = stats_of(&dir, pid);
    // 64 short-lived threads ran one after the other, beside at most 7
    // others: heaps of exited threads were reused (thread exit works in a
    // preloaded library), not one heap per thread.
    let heaps = field(&v, &["heaps"]);
    assert!(heaps <= 8, "heaps: {heaps}");
    // Everything the test allocated was freed (stdio keeps a few buffers).
    let live = field(&v, &["live_allocations"]);
    assert!(live < 32, "live allocations at exit: {live}");
}

#[test]
fn edge_cases_with_the_static_library() {
    let Some(edge_linked) = edge_linked() else {
        return;
    };
    let o = command(edge_linked).arg("linked").output().unwrap();
    assert_all_ok(&o, "edge linked (libpagewise.a)");
}

/// `valloc` and `pvalloc` align to the page pagewise uses, read
/// at run time, here the `PAGEWISE_OS_PAGE` testing override (the edge
/// program reads the same variable): 64 KiB alignment, `pvalloc` rounding
/// to 64 KiB, and everything else of the program at that page size.
#[test]
fn valloc_and_pvalloc_follow_the_os_page_override() {
    let Some(edge) = edge() else { return };
    for page in ["16K", "64K"] {
        let o = command(edge)
            .arg("pagewise")
            .env("LD_PRELOAD", lib_so())
            .env("PAGEWISE_OS_PAGE", page)
            .output()
            .unwrap();
        assert_all_ok(&o, &format!("edge pagewise at PAGEWISE_OS_PAGE={page}"));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("PAGEWISE_OS_PAGE"), "refused: {stderr}");
    }
}

#[test]
fn free_under_glibc_stack_cache_lock_does_not_deadlock() {
    let Some(edge) = edge() else { return };
    let Some(bigtls_so) = bigtls_so() else { return };
    // glibc frees a dead thread's TLS block while holding the lock that
    // pthread_create needs; the purger must not be started from that free.
    let child = command(edge)
        .arg("stack-cache")
        .arg(bigtls_so)
        .env("LD_PRELOAD", lib_so())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Generous: the program needs milliseconds; the limit only turns a
    // deadlock into a failure instead of a hung test.
    let o = wait_or_kill(child, std::time::Duration::from_secs(60))
        .expect("deadlock: free() started the purger inside glibc's stack-cache lock");
    assert_all_ok(&o, "edge stack-cache");
}

#[test]
fn many_dlopened_tls_modules_then_malloc_in_an_older_thread() {
    let Some(edge) = edge() else { return };
    let Some(bigtls_so) = bigtls_so() else { return };
    // 40 modules with TLS: more than the 14 spare dtv slots glibc gives a
    // thread, so the waiting thread's dtv must grow on its next TLS access,
    // which is pagewise's malloc. Copies of one library are distinct modules.
    let dir = scratch("tls-modules");
    for i in 0..40 {
        std::fs::copy(bigtls_so, dir.join(format!("tls{i}.so"))).unwrap();
    }
    let child = command(edge)
        .arg("tls-modules")
        .arg(&dir)
        .arg("40")
        .env("LD_PRELOAD", lib_so())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_or_kill(child, std::time::Duration::from_secs(60)).expect("hung");
    assert_all_ok(&o, "edge tls-modules");
}

/// The quiet-program scenarios through the C library: what the frees
/// leave resident goes back within ten decay delays of quiet (resident
/// bytes within 2 MiB of where the program started; nothing is live).
fn assert_idle_gives_back(scenario: &str, freed_at_least: i64) {
    let Some(edge) = edge() else { return };
    // `malloc_trim` gives back at once: a decay the run never reaches keeps
    // the control (the frees alone leave the memory resident) true on a
    // loaded machine, where freeing 64 MiB may take longer than 100 ms.
    let decay = if scenario.ends_with("-trim") {
        "600000"
    } else {
        "100"
    };
    let o = preloaded({
        let mut c = command(edge);
        c.args(["idle", scenario])
            .env("PAGEWISE_DECAY_MS", decay)
            .env_remove("PAGEWISE_BACKGROUND")
            .env_remove("PAGEWISE_RETAIN_MAX");
        c
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("edge: idle "))
        .unwrap_or_else(|| panic!("{stdout}{}", String::from_utf8_lossy(&o.stderr)));
    let f: Vec<i64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (before, freed, after) = (f[0], f[1], f[2]);
    let report = format!(
        "{scenario}: resident {before} before, {freed} after the frees, {after} after the quiet"
    );
    // The control: the frees alone left the memory resident.
    assert!(freed >= before + freed_at_least, "control: {report}");
    assert!(after <= before + (2 << 20), "{report}");
}

#[test]
fn idle_one_thread_that_freed_everything_gives_it_back() {
    assert_idle_gives_back("one-thread", 16 << 20);
}

#[test]
fn idle_after_threads_exit_their_freed_memory_goes_back() {
    assert_idle_gives_back("threads-exit", 16 << 20);
}

#[test]
fn idle_after_objects_of_an_exited_thread_are_freed_they_go_back() {
    assert_idle_gives_back("handoff", 32 << 20);
}

#[test]
fn idle_after_objects_of_a_blocked_thread_are_freed_they_go_back() {
    assert_idle_gives_back("handoff-blocked", 32 << 20);
}

#[test]
fn malloc_trim_gives_back_what_was_freed_into_a_blocked_thread_heap() {
    assert_idle_gives_back("handoff-blocked-trim", 32 << 20);
}

#[test]
fn calloc_after_a_huge_run_reused_at_another_alignment_is_zero() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("calloc-after-realign");
        c
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("edge: calloc zero"),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A slot freed, its OS page purged by `malloc_trim`, then freed again:
/// the next allocations must abort, not hand the address to two owners.
#[test]
fn a_double_free_of_a_slot_on_a_trimmed_os_page_aborts() {
    let Some(edge) = edge() else { return };
    // At a 64 KiB OS page a one-slice slab page has one OS page, which its
    // survivor keeps: a class whose slab page spans two slices is taken.
    let (size, stride) = if pw::layout::os_page() < 64 << 10 {
        (64, 64 << 10)
    } else {
        use pw::size_class::{PAGE_SLICES, SLOT_SIZE};
        let c = (0..PAGE_SLICES.len())
            .find(|&c| PAGE_SLICES[c] >= 2)
            .unwrap();
        (SLOT_SIZE[c] as usize, PAGE_SLICES[c] as usize * (64 << 10))
    };
    let o = preloaded({
        let mut c = command(edge);
        c.args(["double-free-hollow", &size.to_string(), &stride.to_string()]);
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGABRT),
        "{}{stderr}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(stderr.contains("pagewise: double free"), "{stderr}");
}

#[test]
fn misuse_aborts_with_one_clear_line_and_the_stack_it_was_found_at() {
    let Some(edge) = edge() else { return };
    // A size larger than the block is checked by debug builds of the
    // library only (the test binary and the library share the profile).
    let debug_only = cfg!(debug_assertions).then_some((
        "free-sized-wrong",
        "pagewise: free_sized of 1000 bytes, larger than the block",
    ));
    for (mode, message) in debug_only.into_iter().chain([
        ("double-free", "pagewise: double free"),
        ("double-free-aba", "pagewise: double free"),
        ("double-free-consumer", "pagewise: double free"),
        (
            "foreign-free",
            "pagewise: free of a pointer pagewise did not allocate",
        ),
        // Past the registry's map, which `free` tests with null in one
        // test: never read out of the map.
        (
            "far-free",
            "pagewise: free of a pointer pagewise did not allocate",
        ),
        (
            "top-free",
            "pagewise: free of a pointer pagewise did not allocate",
        ),
        // The first byte past a segment, which the lookup takes for the
        // byte before it: no block of either segment.
        ("segment-end-free", "pagewise: free of a pointer"),
        (
            "interior-free",
            "pagewise: free of a pointer that is not the start of an allocation",
        ),
    ]) {
        let o = preloaded({
            let mut c = command(edge);
            c.arg(mode);
            c
        });
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{mode}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(lines[0].contains(message), "{mode}: {stderr}");
        // Then the stack it was found at, the library's frames left out:
        // the program's own function where the bad call itself is caught
        // (a double free into a thread cache is caught later: here at the
        // process's exit).
        assert!(
            lines
                .get(1)
                .is_some_and(|l| l.starts_with("  found at (thread ")),
            "{mode}: {stderr}"
        );
        assert!(
            lines.len() > 2 && lines[2..].iter().all(|l| l.starts_with("    #")),
            "{mode}: {stderr}"
        );
        let caller = match mode {
            "double-free" | "double-free-aba" => "exit+",
            "double-free-consumer" => "free_twice+",
            _ => "main+",
        };
        assert!(
            if mode.starts_with("double-free") {
                lines[2..].iter().any(|l| l.contains(caller))
            } else {
                lines[2].contains(caller)
            },
            "{mode}: the first frame is the program's: {stderr}"
        );
    }
}

/// Under the heap profiler, a double free of a block it sampled says
/// where the block was allocated (another thread) and first freed, in both
/// libraries (every allocation is sampled at `PAGEWISE_PROF_SAMPLE=1`).
#[test]
fn a_double_free_of_a_sampled_block_names_where_it_was_allocated_and_freed() {
    let Some(edge) = edge() else { return };
    build_secure_library();
    for lib in [lib_so(), secure_lib_so()] {
        let o = command(edge)
            .arg("double-free-large")
            .env("LD_PRELOAD", &lib)
            .env("PAGEWISE_PROF", "1")
            .env("PAGEWISE_PROF_SAMPLE", "1")
            .output()
            .expect("spawn");
        let stderr = String::from_utf8_lossy(&o.stderr);
        let lib = lib.display();
        assert_eq!(o.status.signal(), Some(libc::SIGABRT), "{lib}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(
            lines[0].contains("pagewise: double free"),
            "{lib}: {stderr}"
        );
        let found = lines[1]
            .strip_prefix("  found at (thread ")
            .unwrap_or_else(|| panic!("{lib}: {stderr}"));
        let block = lines
            .iter()
            .position(|l| {
                l.contains(" is 0 bytes into a freed ")
                    && l.ends_with("sampled by the heap profiler")
            })
            .unwrap_or_else(|| panic!("{lib}: {stderr}"));
        let allocated = lines[block + 1]
            .strip_prefix("  allocated by thread ")
            .unwrap_or_else(|| panic!("{lib}: {stderr}"));
        assert_ne!(
            allocated.trim_end_matches(':'),
            found.trim_end_matches("):"),
            "{lib}: allocated on another thread: {stderr}"
        );
        assert!(lines[block + 2].contains("make_large+"), "{lib}: {stderr}");
        let freed = lines[block + 3..]
            .iter()
            .position(|l| l.starts_with("  freed by thread "))
            .unwrap_or_else(|| panic!("{lib}: {stderr}"));
        assert!(
            lines[block + 3 + freed + 1].contains("drop_large+"),
            "{lib}: {stderr}"
        );
    }
}

#[test]
fn malformed_environment_gets_one_line_and_the_default() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("hello")
            .env("PAGEWISE_DECAY_MS", "soon")
            .env("PAGEWISE_STATS", "maybe")
            .env("PAGEWISE_SAMPLE_MS", "-3");
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\n");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "pagewise: ignoring malformed PAGEWISE_DECAY_MS=soon (expected milliseconds, or -1 for never)",
            "pagewise: ignoring malformed PAGEWISE_STATS=maybe (expected 1, true, yes or on; 0, false, no or off)",
            "pagewise: ignoring malformed PAGEWISE_SAMPLE_MS=-3 (expected milliseconds, more than 0)",
        ],
        "{stderr}"
    );
}

#[test]
fn stats_at_exit_to_stderr_or_json_file() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("hello").env("PAGEWISE_STATS", "1");
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success());
    assert!(stderr.starts_with("pagewise report (pid "), "{stderr}");
    assert!(stderr.contains("free slots in used pages"), "{stderr}");

    let dir = scratch("stats-file");
    let mut child = command(edge)
        .arg("hello")
        .env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_STATS", "1") // the file wins
        .env("PAGEWISE_STATS_FILE", dir.join("stats.%p.json"))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(err, "", "nothing on stderr when writing the file");
    let v = stats_of(&dir, pid);
    assert_eq!(field(&v, &["pid"]), pid as u64);
    assert!(total_allocs(&v) > 0, "malloc resolved to pagewise");
    assert!(field(&v, &["os", "vm_rss"]) > 0);
    // What the kernel finds resident in pagewise's mappings is what pagewise
    // accounts for (committed pages may be untouched, so resident may be
    // less; more would be memory it does not know about, or another
    // mapping, such as this PIE executable's, taken for its own).
    let accounted = field(&v, &["committed_bytes"]) + field(&v, &["metadata_bytes"]);
    let resident = field(&v, &["os", "pagewise_rss"]);
    assert!(
        resident <= accounted + (64 << 10),
        "resident {resident} vs accounted {accounted}"
    );
}

#[test]
fn sampler_writes_lines_while_running() {
    let Some(edge) = edge() else { return };
    let dir = scratch("sampler");
    let o = preloaded({
        let mut c = command(edge);
        c.arg("hello")
            .env("PAGEWISE_SAMPLE_FILE", dir.join("samples.txt"))
            .env("PAGEWISE_SAMPLE_MS", "5");
        c
    });
    assert!(o.status.success());
    // Not our child's parent: that process does not sample.
    let o = preloaded({
        let mut c = command(edge);
        c.arg("hello")
            .env("PAGEWISE_SAMPLE_FILE", dir.join("other.txt"))
            .env("PAGEWISE_SAMPLE_PARENT", "1");
        c
    });
    assert!(o.status.success());
    assert!(!dir.join("other.txt").exists());
    let text = std::fs::read_to_string(dir.join("samples.txt")).unwrap();
    // At least the first sample (at load) and the last (at exit).
    assert!(text.lines().count() >= 2, "{text}");
    for line in text.lines() {
        let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(f.len(), 9, "{line}");
        assert!(f[1] > 0, "RSS sampled: {line}");
        // live >= live requested; file-backed RSS is part of RSS.
        assert!(f[2] >= f[4] && f[8] <= f[1], "{line}");
    }
}

/// `PAGEWISE_LIMIT` through the C library: 64 MiB freed into the heap of a
/// thread that is blocked still counts as committed until it goes back, and
/// a `malloc` that would pass the limit makes it go back first (the other
/// heaps' emptied pages, not only their retained spans); past the limit
/// `malloc` returns NULL with `errno = ENOMEM`, and works again once
/// memory is freed.
#[test]
fn limit_reclaims_other_threads_free_memory_then_fails_with_enomem() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("limit")
            .env("PAGEWISE_LIMIT", "96M")
            .env("PAGEWISE_BACKGROUND", "0")
            .env_remove("PAGEWISE_RETAIN_MAX");
        c
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    let report = format!("{stdout}{}", String::from_utf8_lossy(&o.stderr));
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("edge: limit "))
        .unwrap_or_else(|| panic!("{report}"));
    let f: Vec<i64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (first80, total, enomem) = (f[0], f[1], f[2]);
    assert_eq!(
        first80, 1,
        "80 MiB under a 96 MiB limit once 64 MiB was freed: {report}"
    );
    assert!(
        (80..=96).contains(&total),
        "{total} MiB under a 96 MiB limit: {report}"
    );
    assert_eq!(enomem, 1, "the failing malloc set ENOMEM: {report}");
    assert!(stdout.contains("edge: limit after-free 1"), "{report}");
}

fn options_line(o: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("edge: options "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_owned()
}

#[test]
fn pagewise_conf_string_below_the_separate_variables() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("options")
            .env(
                "PAGEWISE_CONF",
                "decay_ms:500, retain_max:32M,reserve:64MiB,limit:1.5G",
            )
            .env("PAGEWISE_DECAY_MS", "250");
        c
    });
    assert_eq!(
        options_line(&o),
        "decay_ms=250 retain_max=33554432 limit=1610612736 reserve=67108864 purge=0 background=1"
    );
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
}

#[test]
fn bad_settings_are_refused_with_what_is_accepted() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("options")
            .env(
                "PAGEWISE_CONF",
                "colour:blue,decay_ms:-1,retain_max:lots,oops",
            )
            .env("PAGEWISE_RESERVE", "0")
            .env("PAGEWISE_LIMIT", "0");
        c
    });
    assert_eq!(
        options_line(&o),
        "decay_ms=-1 retain_max=-1 limit=-1 reserve=1073741824 purge=0 background=1",
        "-1 is never; refused values leave the defaults"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "pagewise: ignoring unknown setting colour in PAGEWISE_CONF (known: decay_ms, retain_max, limit, purge, background, reserve, mesh, thp)",
            "pagewise: ignoring malformed retain_max:lots in PAGEWISE_CONF (expected a size such as 64M, 64MB, 64MiB or 1.5G, or -1 for none)",
            "pagewise: ignoring malformed oops in PAGEWISE_CONF (expected key:value entries separated by commas)",
            "pagewise: ignoring malformed PAGEWISE_LIMIT=0 (expected a size above 0 such as 512M, 512MiB or 1.5G, or -1 for none)",
            "pagewise: ignoring malformed PAGEWISE_RESERVE=0 (expected a size of at least 32M (a segment) such as 1G or 256MiB)",
        ],
        "{stderr}"
    );
}

#[test]
fn embedded_pagewise_conf_is_the_lowest_precedence() {
    let Some(edge) = edge_embedded() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("options");
        c
    });
    assert_eq!(
        options_line(&o),
        "decay_ms=700 retain_max=16777216 limit=1073741824 reserve=1073741824 purge=0 background=1"
    );
    let o = preloaded({
        let mut c = command(edge);
        c.arg("options")
            .env("PAGEWISE_CONF", "decay_ms:600")
            .env("PAGEWISE_RETAIN_MAX", "8M");
        c
    });
    assert_eq!(
        options_line(&o),
        "decay_ms=600 retain_max=8388608 limit=1073741824 reserve=1073741824 purge=0 background=1"
    );
}

#[test]
fn malloc_info_writes_well_formed_xml_shaped_like_glibcs() {
    let Some(edge) = edge() else { return };
    let Some(python) = debian_program("python3", "python3") else {
        return;
    };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("pagewise");
        c
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let xml = stdout
        .split_once("edge: malloc_info begin\n")
        .and_then(|(_, rest)| rest.split_once("edge: malloc_info end\n"))
        .map(|(xml, _)| xml)
        .unwrap_or_else(|| panic!("{stdout}"));
    // A real XML parser reads it: the root, glibc's elements, and a live
    // byte count that includes the block held while it was written.
    let check = r#"
import sys, xml.etree.ElementTree as ET
root = ET.fromstring(sys.stdin.read())
assert root.tag == "malloc" and root.get("version") == "1", root.tag
heap = root.find("heap")
assert heap is not None and heap.get("nr") == "0"
assert heap.find("sizes") is not None
types = {t.get("type") for t in root.findall("total")}
assert types == {"fast", "rest", "mmap"}, types
assert int(root.find("system[@type='current']").get("size")) > 0
assert int(root.find("pagewise").get("live")) >= 200
print("xml ok")
"#;
    let mut child = std::process::Command::new(python)
        .args(["-c", check])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), xml.as_bytes()).unwrap();
    let r = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("xml ok"),
        "{xml}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// Reports while running: the text report on stderr when
/// `PAGEWISE_STATS_SIGNAL` arrives, and the JSON file rewritten every
/// `PAGEWISE_STATS_INTERVAL_MS`, both left behind by a process that is then
/// killed with SIGKILL (no exit report).
/// pagewise's threads started at load (the sampler of `pagewise run`, the
/// live reporter) never take a signal the program blocks on its own
/// threads to wait for it (`sigwait`, `signalfd`); the report signal,
/// pagewise's own, still reaches the reporter when the program blocks it.
#[test]
fn a_signal_the_program_waits_for_never_lands_on_pagewises_threads() {
    let Some(edge) = edge() else { return };
    let dir = scratch("sigwait");
    let settings: [(&str, String); 3] = [
        (
            "PAGEWISE_SAMPLE_FILE",
            dir.join("samples").display().to_string(),
        ),
        ("PAGEWISE_STATS_INTERVAL_MS", "20".into()),
        ("PAGEWISE_STATS_SIGNAL", "SIGUSR2".into()),
    ];
    for (k, v) in &settings {
        let o = preloaded({
            let mut c = command(edge);
            c.arg("sigwait").env(k, v);
            c
        });
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && stdout.contains(&format!("edge: sigwait {}", libc::SIGTERM)),
            "{k}: {:?}\n{stdout}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = preloaded({
        let mut c = command(edge);
        c.args(["sigwait", &libc::SIGUSR2.to_string()])
            .env("PAGEWISE_STATS_SIGNAL", "SIGUSR2");
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {stderr}", o.status);
    assert_eq!(
        stderr.matches("pagewise report (pid").count(),
        1,
        "the report signal, blocked by the program, reached the reporter: {stderr}"
    );
}

#[test]
fn reports_while_running_survive_a_kill() {
    let Some(edge) = edge() else { return };
    let o = preloaded({
        let mut c = command(edge);
        c.arg("report-on-signal")
            .env("PAGEWISE_STATS_SIGNAL", "SIGUSR2");
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{stderr}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("edge: reported"),
        "the signal did not end the program"
    );
    assert_eq!(
        stderr.matches("pagewise report (pid").count(),
        1,
        "one report for one signal: {stderr}"
    );

    let dir = scratch("live-report");
    let child = command(edge)
        .arg("report-periodic")
        .env("LD_PRELOAD", lib_so())
        .env("PAGEWISE_STATS_INTERVAL_MS", "50")
        .env("PAGEWISE_STATS_FILE", dir.join("stats.%p.json"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGKILL));
    let v = stats_of(&dir, pid);
    assert!(
        field(&v, &["live_bytes"]) >= 8 << 20,
        "the periodic report saw the 8 MiB block"
    );
}
