//! A mesh pass holds a heap's page lists while it plans and copies a round
//! of pages; a thread of the program whose allocation needs them meanwhile
//! (a new slab page) must get them after that round, not after the whole
//! pass, which on a large sparse heap takes seconds. In a child process
//! with `PAGEWISE_MESH=1`: the main thread leaves one 64-byte survivor on
//! each of 12,288 OS pages (three rounds of candidates), another thread
//! meshes, and the main thread keeps allocating while it does. The pass
//! must have let the lists go for it (`mesh_pauses`), then gone on with
//! the class. The same for a `trim()` and a `fork()` made while the pass
//! runs, which need the locks the pass holds around the page lists (the
//! child's copy of the heap must not have a pass half done in it).
#![cfg(target_os = "linux")]

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::sync::atomic::{AtomicBool, Ordering::*};

const CHILD: &str = "PAGEWISE_TEST_MESH_PAUSE_CHILD";
/// OS pages with one survivor: three rounds of a pass's candidates.
const PAGES: usize = 3 * 4096;

/// One 64-byte object kept on each of `PAGES` OS pages, the rest freed.
fn survivors() -> Vec<Vec<u8>> {
    thin(every_object())
}

/// 64-byte objects filling `PAGES` OS pages, all live (no page sparse yet).
fn every_object() -> Vec<Vec<u8>> {
    let page = pagewise::layout::os_page();
    (0..PAGES * page / 64).map(|_| vec![7u8; 64]).collect()
}

/// The first of `all` on each OS page, the rest freed.
fn thin(all: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let page = pagewise::layout::os_page();
    let mut kept = Vec::new();
    let mut last = usize::MAX;
    for b in all {
        let p = b.as_ptr() as usize / page;
        if p != last {
            last = p;
            kept.push(b);
        }
    }
    kept
}

/// Kernel mappings of the process now (meshing adds some as it joins
/// pages), counted without allocating.
fn mappings() -> usize {
    // SAFETY: a path we own, a stack buffer, our own descriptor.
    unsafe {
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
        assert!(fd >= 0);
        let mut buf = [0u8; 4096];
        let mut lines = 0;
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            lines += buf[..n as usize].iter().filter(|&&b| b == b'\n').count();
        }
        libc::close(fd);
        lines
    }
}

/// Meshes on another thread while this one runs `meanwhile` (given
/// whether the pass is over); prints what happened.
fn mesh_while(meanwhile: fn(&AtomicBool) -> u64) {
    assert_eq!(pagewise::options::get("mesh"), Ok(1));
    let kept = survivors();
    static DONE: AtomicBool = AtomicBool::new(false);
    static STARTED: AtomicBool = AtomicBool::new(false);
    let mesher = std::thread::spawn(|| {
        STARTED.store(true, Release);
        let joined = pagewise::mesh();
        DONE.store(true, Release);
        joined
    });
    while !STARTED.load(Acquire) {
        std::hint::spin_loop();
    }
    let work = meanwhile(&DONE);
    let first = mesher.join().unwrap();
    let pauses = pagewise::stats().mesh_pauses;
    let second = pagewise::mesh();
    assert!(kept.iter().all(|b| b.iter().all(|&x| x == 7)));
    println!("pause-report {pauses} {first} {second} {work}");
}

/// One `trim()` once the pass has meshed some pages (it takes the visits'
/// lock the pass holds).
fn trim_once(done: &AtomicBool) -> u64 {
    let before = mappings();
    while mappings() < before + 64 {
        assert!(!done.load(Acquire), "the pass ended before it meshed");
        std::hint::spin_loop();
    }
    pagewise::trim();
    u64::from(done.load(Acquire))
}

/// The background purger's pass (`PAGEWISE_BACKGROUND=1`, a short decay)
/// with a fork made while it meshes. The mappings are counted before any
/// page goes sparse: the purger meshes as soon as pages are, and a pass
/// that ran whole while the objects were thinned would leave the fork
/// waiting for mappings that never come (seen once on a loaded machine).
fn purger_and_fork() {
    assert_eq!(pagewise::options::get("mesh"), Ok(1));
    let all = every_object();
    let before = mappings();
    let kept = thin(all);
    static NEVER: AtomicBool = AtomicBool::new(false);
    let after_fork = fork_once_from(before, &NEVER);
    let pauses = pagewise::stats().mesh_pauses;
    assert!(kept.iter().all(|b| b.iter().all(|&x| x == 7)));
    println!("pause-report {pauses} 0 0 {after_fork}");
}

/// Allocations of another class, each 64th taking a new slab page (the
/// page lists), until the pass is over.
fn allocate(done: &AtomicBool) -> u64 {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut allocations = 0u64;
    while !done.load(Acquire) {
        held.push(vec![1u8; 1000]);
        allocations += 1;
        if held.len() == 20_000 {
            held.clear();
        }
    }
    allocations
}

/// One fork once the pass has meshed some pages (the process's mappings
/// grew), its child leaving at once.
fn fork_once(done: &AtomicBool) -> u64 {
    fork_once_from(mappings(), done)
}

/// [`fork_once`] once the process has 64 mappings more than `before`.
fn fork_once_from(before: usize, done: &AtomicBool) -> u64 {
    while mappings() < before + 64 {
        assert!(!done.load(Acquire), "the pass ended before it meshed");
        std::hint::spin_loop();
    }
    // SAFETY: the child only leaves.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    u64::from(done.load(Acquire))
}

#[test]
fn child_entry() {
    match std::env::var(CHILD).as_deref() {
        Ok("allocate") => mesh_while(allocate),
        Ok("fork") => mesh_while(fork_once),
        Ok("trim") => mesh_while(trim_once),
        Ok("purger-fork") => purger_and_fork(),
        _ => {}
    }
}

/// Runs `scenario` in a child with meshing on: (pauses, OS pages the
/// first pass meshed, then the second, the scenario's own figure).
fn run(scenario: &str) -> (u64, u64, u64, u64, String) {
    let mut child = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("PAGEWISE_MESH", "1")
        .env(
            "PAGEWISE_BACKGROUND",
            if scenario == "purger-fork" { "1" } else { "0" },
        )
        .env("PAGEWISE_DECAY_MS", "100")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A pass and a waiting thread that wait for each other never end: a
    // bound, far above the seconds the scenario takes, turns that into a
    // failure.
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(300) {
            child.kill().unwrap();
            panic!("{scenario}: the child hung (a pass and a waiting thread deadlocked)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let f: Vec<u64> = text
        .lines()
        .find_map(|l| l.split_once("pause-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{text}"))
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    (f[0], f[1], f[2], f[3], text)
}

#[test]
fn a_mesh_pass_lets_an_allocating_thread_have_the_page_lists_between_rounds() {
    let (pauses, first, second, _, text) = run("allocate");
    // The thread waits again at the end of every round: three rounds, and
    // the start over after the first.
    assert!(
        pauses >= 2,
        "the pass let the page lists go for the allocating thread {pauses} times: {text}"
    );
    assert!(
        first > 4096,
        "the pass went on after letting the lists go ({first} OS pages, then {second})"
    );
}

#[test]
fn a_fork_during_a_mesh_pass_waits_for_one_round_not_the_pass() {
    let (pauses, first, second, after, text) = run("fork");
    assert!(
        pauses >= 1,
        "the pass never let its locks go for the fork: {text}"
    );
    // Let go, the locks went to the fork before the pass took them back.
    assert_eq!(after, 0, "the fork returned only once the pass was over");
    assert!(
        first > 4096,
        "the pass went on after the fork ({first} OS pages, then {second})"
    );
}

#[test]
fn a_trim_during_a_mesh_pass_waits_for_one_round_not_the_pass() {
    let (pauses, first, second, after, text) = run("trim");
    assert!(
        pauses >= 1,
        "the pass never let its locks go for the trim: {text}"
    );
    assert_eq!(after, 0, "the trim returned only once the pass was over");
    assert!(
        first > 4096,
        "the pass went on after the trim ({first} OS pages, then {second})"
    );
}

#[test]
fn a_fork_during_the_purger_s_mesh_pass_waits_for_one_round_not_the_pass() {
    let (pauses, _, _, _, text) = run("purger-fork");
    assert!(
        pauses >= 1,
        "the purger's pass never let its locks go for the fork: {text}"
    );
}
