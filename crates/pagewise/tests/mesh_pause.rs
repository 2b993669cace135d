//! A mesh pass holds a heap's page lists while it plans and copies a round
//! of pages; a thread of the program whose allocation needs them meanwhile
//! (a new slab page) must get them after that round, not after the whole
//! pass, which on a large sparse heap takes seconds. In a child process
//! with `PAGEWISE_MESH=1`: the main thread leaves one 64-byte survivor on
//! each of 12,288 OS pages (three rounds of candidates), another thread
//! meshes, and the main thread keeps allocating while it does. The pass
//! must have let the lists go for it (`mesh_pauses`), leaving the rest of
//! the class to the next pass, which meshes it.
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
    let page = pagewise::layout::os_page();
    let all: Vec<Vec<u8>> = (0..PAGES * page / 64).map(|_| vec![7u8; 64]).collect();
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

fn child() {
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
    // Allocations of another class, each 64th taking a new slab page
    // (the page lists), until the pass is over.
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut allocations = 0u64;
    while !DONE.load(Acquire) {
        held.push(vec![1u8; 1000]);
        allocations += 1;
        if held.len() == 20_000 {
            held.clear();
        }
    }
    let first = mesher.join().unwrap();
    drop(held);
    let pauses = pagewise::stats().mesh_pauses;
    let second = pagewise::mesh();
    assert!(kept.iter().all(|b| b.iter().all(|&x| x == 7)));
    println!("pause-report {pauses} {first} {second} {allocations}");
}

#[test]
fn child_entry() {
    if std::env::var(CHILD).is_ok() {
        child();
    }
}

#[test]
fn a_mesh_pass_lets_a_waiting_thread_have_the_page_lists_between_rounds() {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_MESH", "1")
        .env("PAGEWISE_BACKGROUND", "0")
        .output()
        .unwrap();
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
    let (pauses, first, second) = (f[0], f[1], f[2]);
    assert!(
        pauses >= 1,
        "the pass never let the page lists go for the allocating thread: {text}"
    );
    assert!(
        second > 0,
        "the next pass meshes what the paused one left ({first} then {second})"
    );
}
