//! Sampled guard pages through the Rust global allocator: each case runs in
//! a child (this test binary re-executed) with `PAGEWISE_GUARD_SAMPLE`, and
//! the parent checks how it ended and what it reported, Rust function names
//! included. Guarded blocks must also behave as any other: alignment,
//! `realloc`, `usable_size`, many threads, and blocks that outlive the
//! pool's slots (served from the heap as usual).

#[cfg(pagewise_secure_package)]
extern crate pagewise_secure as pagewise;

mod reexec;

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

const CASE: &str = "PAGEWISE_TEST_GUARD_CASE";

struct Run {
    stderr: String,
    signal: Option<i32>,
    success: bool,
}

fn run_case(case: &str, rate: &str) -> Run {
    run_with_slots(case, rate, "4096")
}

fn run_with_slots(case: &str, rate: &str, slots: &str) -> Run {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env("PAGEWISE_GUARD_SAMPLE", rate)
        // The test harness keeps blocks of its own live: room for them.
        .env("PAGEWISE_GUARD_SLOTS", slots)
        .output()
        .unwrap();
    Run {
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        signal: out.status.signal(),
        success: out.status.success(),
    }
}

/// The lines of the stack headed `  <what>`.
fn stack<'a>(r: &'a Run, what: &str) -> Vec<&'a str> {
    let mut lines = r
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with(&format!("  {what}")));
    assert!(lines.next().is_some(), "no `{what}` stack:\n{}", r.stderr);
    lines.take_while(|l| l.starts_with("    #")).collect()
}

#[inline(never)]
fn make(size: usize) -> *mut u8 {
    // SAFETY: a non-zero size.
    black_box(unsafe { A.alloc(Layout::from_size_align(size, 8).unwrap()) })
}

#[inline(never)]
fn write_past_end(p: *mut u8, size: usize) {
    // SAFETY: deliberately not: one byte past the block.
    unsafe { black_box(p).add(size).write_volatile(1) };
}

#[inline(never)]
fn release(p: *mut u8, size: usize) {
    // SAFETY: a block of this layout (or, in the double-free case, not).
    unsafe { A.dealloc(black_box(p), Layout::from_size_align(size, 8).unwrap()) };
    black_box(());
}

#[inline(never)]
fn read_after_free(p: *mut u8) -> u8 {
    // SAFETY: deliberately not: the block is freed.
    unsafe { black_box(p).add(3).read_volatile() }
}

/// A guarded block against its slot's end, not its start (a block sits
/// against one side of its slot, at random).
fn right_aligned(size: usize) -> *mut u8 {
    let page = pagewise::layout::os_page();
    (0..64)
        .map(|_| make(size))
        .find(|&p| p as usize % page != 0)
        .expect("a block against its slot's end")
}

/// The size of the guarded block that holds a request of `n` bytes: the
/// request in the default build; in the hardened build a slot's size, with
/// the byte of its canary at least (`secure/canary.rs`), so that a write
/// just past the request is the canary's to find at the free and one past
/// the block still faults at the access.
fn guarded(n: usize) -> usize {
    if cfg!(feature = "secure") {
        (n + 1).next_multiple_of(16)
    } else {
        n
    }
}

/// Runs one case in the child; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    match case.as_str() {
        "overflow" => write_past_end(right_aligned(32), guarded(32)),
        "use-after-free" => {
            let p = right_aligned(32);
            release(p, 32);
            black_box(read_after_free(p));
        }
        "double-free" => {
            let p = make(48);
            release(p, 48);
            release(p, 48);
        }
        "behaves" => behaves(),
        "unguarded-double-free" => free_twice_through_the_global_allocator(),
        "fork" => {
            // A block freed before the fork is still guarded in the child,
            // and the child's own blocks are guarded too.
            let p = right_aligned(32);
            release(p, 32);
            // SAFETY: the child only allocates, reads and exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let q = right_aligned(32);
                release(q, 32);
                black_box(read_after_free(p));
                // SAFETY: plain exit of the child (not reached).
                unsafe { libc::_exit(0) };
            }
            let mut status = 0;
            // SAFETY: our child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(libc::WIFSIGNALED(status), "status {status}");
            assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
            eprintln!("fork: ok");
        }
        _ => panic!("unknown case {case}"),
    }
}

/// Guarded or not, blocks keep their contents, alignment and sizes, on many
/// threads at once, through more blocks than the pool has slots.
fn behaves() {
    let slots: usize = std::env::var("PAGEWISE_GUARD_SLOTS")
        .unwrap()
        .parse()
        .unwrap();
    // Every allocation guarded, with room for them.
    let every = pagewise::guard::sample_rate() == 1 && slots >= 1024;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut live: Vec<(Vec<u8>, u8)> = Vec::new();
                for i in 0..1500usize {
                    let n = 1 + (i * 37 + t * 11) % 700;
                    let b = (i % 251) as u8;
                    live.push((vec![b; n], b));
                    if i % 3 == 0 {
                        let (v, b) = live.swap_remove((i * 7) % live.len());
                        assert!(v.iter().all(|&x| x == b));
                    }
                    if i % 5 == 0 && !live.is_empty() {
                        let k = (i * 13) % live.len();
                        let (v, b) = &mut live[k];
                        if v.len() < 1 << 16 {
                            v.resize(v.len() * 2 + 1, *b);
                        }
                    }
                }
                for (v, b) in live {
                    assert!(v.iter().all(|&x| x == b));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = pagewise::guard::stats();
    assert_eq!(s.slots, slots);
    assert!(s.allocations >= if every { 1500 } else { 8 }, "{s:?}");
    assert!(s.live <= s.slots, "{s:?}");
    // SAFETY: live blocks only; each layout as allocated.
    unsafe {
        for align in [8, 16, 64, 256, 4096] {
            let l = Layout::from_size_align(40, align).unwrap();
            let p = A.alloc(l);
            assert_eq!(p as usize % align, 0, "align {align}");
            p.write_bytes(9, 40);
            let q = A.realloc(p, l, 5000);
            assert!((0..40).all(|i| q.add(i).read() == 9));
            A.dealloc(q, Layout::from_size_align(5000, align).unwrap());
        }
        if every {
            let p = right_aligned(24);
            assert_eq!(pagewise::usable_size(p), 24, "a guarded block's own size");
            assert!(pagewise::raw::owns(p));
            release(p, 24);
            assert!(pagewise::guard::stats().allocations > s.allocations);
        }
    }
    eprintln!("behaves: ok {:?}", pagewise::guard::stats());
}

fn headline(r: &Run) -> &str {
    r.stderr
        .lines()
        .find(|l| l.starts_with("pagewise: "))
        .unwrap_or_else(|| panic!("no report:\n{}", r.stderr))
}

#[test]
fn an_overflow_in_rust_names_the_rust_functions() {
    if reexec::emulated() {
        return; // qemu-user's signal frames do not unwind.
    }
    let r = run_case("overflow", "1");
    assert_eq!(r.signal, Some(libc::SIGSEGV), "{}", r.stderr);
    assert!(
        headline(&r).starts_with(&format!(
            "pagewise: heap-buffer-overflow: write 0 bytes past the end of the {}-byte block",
            guarded(32)
        )),
        "{}",
        r.stderr
    );
    assert!(
        stack(&r, "access")[0].contains(" guard::write_past_end+"),
        "{}",
        r.stderr
    );
    assert!(
        stack(&r, "allocated by")
            .iter()
            .any(|l| l.contains(" guard::make+")),
        "{}",
        r.stderr
    );
    // The allocator's own frames are left out of the top of the stack.
    assert!(
        !stack(&r, "allocated by")[0].contains("pagewise::"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_use_after_free_in_rust_names_the_free() {
    if reexec::emulated() {
        return;
    }
    let r = run_case("use-after-free", "1");
    assert_eq!(r.signal, Some(libc::SIGSEGV), "{}", r.stderr);
    assert!(
        headline(&r).starts_with("pagewise: heap-use-after-free: read 3 bytes into"),
        "{}",
        r.stderr
    );
    assert!(
        stack(&r, "access")[0].contains(" guard::read_after_free+"),
        "{}",
        r.stderr
    );
    assert!(
        stack(&r, "freed by")
            .iter()
            .any(|l| l.contains(" guard::release+")),
        "{}",
        r.stderr
    );
}

#[test]
fn a_forked_child_keeps_the_guards() {
    if reexec::emulated() {
        return; // qemu-user: see the stress tests' forks
    }
    let r = run_case("fork", "1");
    assert!(r.success, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "pagewise: heap-use-after-free: read 3 bytes into the {}-byte block",
            guarded(32)
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("fork: ok"), "{}", r.stderr);
}

#[test]
fn a_double_free_in_rust_aborts() {
    let r = run_case("double-free", "1");
    assert_eq!(r.signal, Some(libc::SIGABRT), "{}", r.stderr);
    assert!(
        headline(&r).starts_with(&format!(
            "pagewise: double-free: free of the {}-byte block",
            guarded(48)
        )),
        "{}",
        r.stderr
    );
}

/// A 1 MiB block freed twice through `std::alloc` (the global
/// allocator's path that `Box` and `Vec` take), caught at the second free.
#[inline(never)]
fn free_twice_through_the_global_allocator() {
    let l = Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: deliberately not: the block is freed twice.
    unsafe {
        let p = std::alloc::alloc(l);
        std::alloc::dealloc(p, l);
        std::alloc::dealloc(black_box(p), l);
    }
}

/// A misuse outside the guard pool is reported with the stack it was found
/// at too, and the global allocator's entry points (`__rust_dealloc` and
/// the shim it calls) are left out with the allocator's own frames.
#[test]
fn a_misuse_through_the_global_allocator_names_the_rust_function() {
    let r = run_case("unguarded-double-free", "0");
    assert_eq!(r.signal, Some(libc::SIGABRT), "{}", r.stderr);
    assert!(
        headline(&r).starts_with("pagewise: double free"),
        "{}",
        r.stderr
    );
    let found = stack(&r, "found at");
    let first = found.first().copied().unwrap_or_default();
    assert!(
        ["pagewise", "__rust_", "__rg_"]
            .iter()
            .all(|f| !first.contains(f)),
        "the first frame is the program's:\n{}",
        r.stderr
    );
    assert!(
        found
            .iter()
            .any(|l| l.contains("free_twice_through_the_global_allocator")),
        "{}",
        r.stderr
    );
}

#[test]
fn guarded_blocks_behave_as_any_other() {
    let r = run_case("behaves", "1");
    assert!(r.success, "{}", r.stderr);
    assert!(r.stderr.contains("behaves: ok"), "{}", r.stderr);
    // At one in a hundred as well.
    let r = run_case("behaves", "100");
    assert!(r.success, "{}", r.stderr);
    // And with a pool of 8 slots, full nearly all the time: the blocks
    // drawn then are served from the heap.
    let r = run_with_slots("behaves", "1", "8");
    assert!(r.success, "{}", r.stderr);
}

#[test]
fn nothing_is_guarded_by_default() {
    assert_eq!(pagewise::guard::sample_rate(), 0);
    let p = make(32);
    release(p, 32);
    assert_eq!(
        pagewise::guard::stats(),
        pagewise::guard::GuardStats::default()
    );
}
