//! The hardened build (the `secure` feature; the `pagewise-secure` package
//! runs this file): each kind of heap misuse, at a tiny, a page-sized, a
//! large and a huge block, is reported when it happens or at the free that
//! follows, and the program goes no further; freed blocks are wiped. Each case runs in a child
//! process (this binary re-executed); the child prints "still running" if
//! it gets past the misuse, and the parent checks that it never does.
#![cfg(feature = "secure")]

// Built by the `pagewise-secure` package too, whose library has its own name.
#[cfg(pagewise_secure_package)]
extern crate pagewise_secure as pagewise;

mod reexec;

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

const CASE: &str = "PAGEWISE_TEST_SECURE_CASE";

/// A small (one 16-byte slot), a page-sized, a slab-class, a large and a
/// huge request.
const SIZES: [usize; 5] = [8, 4000, 200_000, 1 << 20, 64 << 20];

/// Requests one to seven bytes short of their slot: a short tail each
/// (16, 256, 4,096 and 229,376-byte slots).
const SHORT_SIZES: [usize; 4] = [12, 250, 4093, 229_370];

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

/// Later frees of its class a freed block of `size` bytes waits for at
/// least before its thread hands it out again: 16 KiB of its slots, from
/// two to [`pagewise::raw::QUARANTINE`] (a slot is larger than its
/// request, so this is never fewer than its class waits for).
fn depth(size: usize) -> usize {
    ((16 << 10) / size.max(1)).clamp(2, pagewise::raw::QUARANTINE)
}

/// Frees as many new blocks of `l` as a freed block of its size waits for,
/// and nothing else, so that the slot freed just before may be handed out
/// again (after the older slots of its class's thread cache).
///
/// # Safety
/// None: the blocks are this function's.
unsafe fn later_frees(l: Layout) {
    // No vector: its own free would be one more free.
    let mut v = [core::ptr::null_mut(); 64];
    let v = &mut v[..depth(l.size())];
    // SAFETY: live blocks, each freed once.
    unsafe {
        for p in v.iter_mut() {
            *p = A.alloc(l);
        }
        for &p in v.iter() {
            A.dealloc(p, l);
        }
    }
}

/// Allocates blocks of `l` until `p` is handed out again (512 at most),
/// frees the others, and returns `p`, or null if it did not come back.
///
/// # Safety
/// None: the blocks are this function's, `p` too once returned.
unsafe fn until_back(p: *mut u8, l: Layout) -> *mut u8 {
    // SAFETY: forwarded.
    unsafe { until_back_by(p, l, |l| A.alloc(l)) }
}

/// [`until_back`] with the blocks allocated by `alloc`.
///
/// # Safety
/// As [`until_back`]; `alloc` allocates a live block of `l`.
unsafe fn until_back_by(p: *mut u8, l: Layout, alloc: impl Fn(Layout) -> *mut u8) -> *mut u8 {
    // No vector: a block of 4,000 bytes would be one of its class.
    let mut v = [core::ptr::null_mut(); 512];
    let mut n = 0;
    let mut found = core::ptr::null_mut();
    // SAFETY: live blocks, each freed once.
    unsafe {
        while n < v.len() {
            let q = alloc(l);
            if q == p {
                found = q;
                break;
            }
            v[n] = q;
            n += 1;
        }
        for &q in &v[..n] {
            A.dealloc(q, l);
        }
    }
    found
}

/// Runs one case in the child; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    let (kind, size) = case.split_once(':').unwrap();
    let size: usize = size.parse().unwrap();
    let l = layout(size);
    // SAFETY: deliberately wrong calls, each expected to abort.
    unsafe {
        let p = black_box(A.alloc(l));
        match kind {
            "overflow-1" => p.add(size).write(0),
            "overflow-32" => p.add(size).write_bytes(b'x', 32),
            "underflow-aligned" => {
                // Aligned past an OS page: the block starts one alignment
                // into its span, its guard right before it.
                let la = Layout::from_size_align(size, 1 << 16).unwrap();
                let q = black_box(A.alloc(la));
                assert_eq!(q as usize % (1 << 16), 0);
                q.sub(1).write(0);
            }
            "underflow-kept" => {
                // The span of a large block freed is kept for the thread's
                // next one of its size, guards and all.
                A.dealloc(p, l);
                let q = black_box(A.alloc(l));
                assert_eq!(q, p, "the kept span comes back");
                q.sub(1).write(0);
            }
            "overflow-far" => {
                // A byte at a time, 128 KiB on: past any span's slack.
                for i in 0..128 << 10 {
                    p.add(size + i).write_volatile(b'x');
                }
            }
            "double" => {
                A.dealloc(p, l);
                A.dealloc(p, l);
            }
            // The size asked of a block (what `malloc_usable_size` and
            // `realloc` look up) checks it as a free does: the child stops
            // at the call, not at a free after it.
            "usable-overflow-1" => {
                p.add(size).write(0);
                black_box(pagewise::usable_size(p));
                println!("still running");
                std::process::exit(0);
            }
            "usable-freed" => {
                A.dealloc(p, l);
                black_box(pagewise::usable_size(p));
                println!("still running");
                std::process::exit(0);
            }
            "usable-inside" => {
                black_box(pagewise::usable_size(p.add(8)));
                println!("still running");
                std::process::exit(0);
            }
            "realloc-overflow-1" => {
                p.add(size).write(0);
                black_box(A.realloc(p, l, size + 100));
                println!("still running");
                std::process::exit(0);
            }
            "realloc-beside-frees" => realloc_beside_frees(size),
            "zeroed-beside-frees" => zeroed_beside_frees(size),
            "taken-beside-frees" => taken_beside_frees(size),
            "fresh-slots" => fresh_slots(),
            "short-keeps-class" => short_keeps_class(),
            "double-other-thread" => {
                // The thread is running (its own allocations made) before
                // the first free, so that nothing takes the block between.
                let q = p as usize;
                let (go, wait) = std::sync::mpsc::channel::<()>();
                let t = std::thread::spawn(move || {
                    wait.recv().unwrap();
                    A.dealloc(q as *mut u8, l)
                });
                A.dealloc(p, l);
                go.send(()).unwrap();
                t.join().unwrap();
            }
            "first-word-after-free" | "second-word-after-free" => {
                // A write after free over the first or the second word of a
                // slot while it waits in the thread cache (its link, a raw
                // zero until the next free of its class links it, and its
                // key): reported at that free, or when the slot is handed
                // out again, at the slot.
                let keep = black_box(A.alloc(l));
                A.dealloc(p, l);
                println!("slot {:#018x}", p as usize);
                let word = usize::from(kind == "second-word-after-free");
                // A byte changed (the key's bytes are the secret's: a
                // fixed byte would be one of them once in 256 runs).
                let at = p.add(8 * word + 3);
                at.write_volatile(!at.read_volatile());
                later_frees(l);
                black_box(until_back(p, l));
                A.dealloc(keep, l);
            }
            "first-word-then-one-free" => {
                // The link word of the slot freed last, then one free of
                // its class (which links the slot to the block it frees).
                let x = black_box(A.alloc(l));
                A.dealloc(p, l);
                println!("slot {:#018x}", p as usize);
                p.add(3).write_volatile(!p.add(3).read_volatile());
                A.dealloc(x, l);
                println!("still running");
                std::process::exit(0);
            }
            "link-after-free" | "link-after-free-paged" | "text-after-free" => {
                // The page stays in use (and mapped) while the slot is
                // free: another block on it stays live.
                let keep = black_box(A.alloc(l));
                A.dealloc(p, l);
                if kind == "link-after-free-paged" {
                    // The slot goes home to its page's free list.
                    pagewise::trim();
                } else {
                    // Linked in the thread cache to the slots freed after.
                    later_frees(l);
                }
                println!("slot {:#018x}", p as usize);
                // A write after free over the slot's first word, the link
                // of the list that holds it: text, or an address the
                // program would want the allocator to hand out next.
                let target = black_box([0u64; 64]);
                if kind == "text-after-free" {
                    p.copy_from(b"AAAAAAAA".as_ptr(), 8);
                } else {
                    p.cast::<usize>().write(target.as_ptr() as usize);
                }
                let q = black_box(until_back(p, l));
                println!("handed out {q:?}, target {:?}", target.as_ptr());
                A.dealloc(keep, l);
            }
            "kept-under-limit" => {
                // Under a limit of 128 MiB (the parent's PAGEWISE_LIMIT): a
                // 64 MiB block freed, its span kept shut by the thread,
                // then a 96 MiB block, which fits only if the kept span
                // goes back to the heap first.
                p.write_bytes(1, size);
                A.dealloc(p, l);
                let big = layout(96 << 20);
                let q = black_box(A.alloc(big));
                assert!(!q.is_null(), "the kept span was not given back");
                q.write_bytes(2, 96 << 20);
                A.dealloc(q, big);
                println!("still running");
                std::process::exit(0);
            }
            "write-after-free-large" => {
                // A byte in the middle of a freed large or huge block (past
                // its first 4 KiB, which the free zeroes), at once: its
                // span is kept shut.
                A.dealloc(p, l);
                p.add(size / 2).write_volatile(b'w');
            }
            "write-after-free" | "write-after-free-paged" => {
                let keep = black_box(A.alloc(l));
                A.dealloc(p, l);
                if kind == "write-after-free-paged" {
                    pagewise::trim();
                }
                // One byte in the middle of the freed block, or of its
                // first 4 KiB (what the free zeroes).
                let at = p.add((size / 2).min(3000));
                println!("byte {:#018x}", at as usize);
                at.write(b'w');
                later_frees(l);
                let q = black_box(until_back(p, l));
                println!("handed out {q:?}");
                A.dealloc(keep, l);
            }
            "reuse" => {
                // Slots freed (zeroed and marked), their pages emptied and
                // reused by large blocks full of other bytes, then carved
                // into slots again: what the large blocks left is not a
                // write after free.
                let small = layout(1000);
                for round in 0..3 {
                    let v: Vec<*mut u8> = (0..3000).map(|_| A.alloc(small)).collect();
                    for &q in &v {
                        q.write_bytes(round, 1000);
                    }
                    for &q in &v {
                        A.dealloc(q, small);
                    }
                    let big = layout(300 << 10);
                    let w: Vec<*mut u8> = (0..16).map(|_| A.alloc(big)).collect();
                    for &q in &w {
                        q.write_bytes(0x77, 300 << 10);
                    }
                    for &q in &w {
                        A.dealloc(q, big);
                    }
                }
            }
            "underflow-1" | "underflow-1-free-neighbour" | "underflow-realloc" => {
                // The byte before a block, with the block before it live
                // (its tail word is there) or freed; then the block is
                // freed, or moved by a realloc (which frees it).
                let q = black_box(A.alloc(l));
                let r = black_box(A.alloc(l));
                let (first, second) = if (q as usize) < (r as usize) {
                    (q, r)
                } else {
                    (r, q)
                };
                if kind == "underflow-1-free-neighbour" {
                    A.dealloc(first, l);
                }
                println!(
                    "block {:#018x} neighbour {:#018x}",
                    second as usize, first as usize
                );
                second.sub(1).write(0);
                if kind == "underflow-realloc" {
                    let moved = black_box(A.realloc(second, l, size * 2 + 100));
                    println!("moved to {moved:?}");
                } else {
                    A.dealloc(second, l);
                }
            }
            "double-overwritten" => {
                // A write after free over the slot's first 16 bytes (all
                // of a 16-byte slot: its link and key), then a second free.
                A.dealloc(p, l);
                p.write_bytes(b'x', 16);
                A.dealloc(p, l);
            }
            "double-rewritten" | "double-rewritten-past" | "double-rewritten-thread" => {
                // A write after free over the block's bytes as the program
                // knew them (16 at least: all of a 16-byte slot), its free
                // key among them and, for a block with a short tail, the
                // free slot's tail word at its end; then a second free, with
                // the slot just freed into the thread cache, after the
                // frees it waits for, or by another thread (running before the
                // first free, so that nothing takes the block between).
                let q = p as usize;
                let (go, wait) = std::sync::mpsc::channel::<()>();
                let other = (kind == "double-rewritten-thread").then(|| {
                    std::thread::spawn(move || {
                        wait.recv().unwrap();
                        A.dealloc(q as *mut u8, l)
                    })
                });
                A.dealloc(p, l);
                if kind == "double-rewritten-past" {
                    later_frees(l);
                }
                p.write_bytes(b'x', size.max(16));
                match other {
                    Some(t) => {
                        go.send(()).unwrap();
                        t.join().unwrap();
                    }
                    None => A.dealloc(p, l),
                }
            }
            "carved-intact" | "carved-overwritten" | "carved-realloc" => {
                // A slot carved and never handed out, next to the block
                // (and two more of a size class no other case uses, the
                // first of their page: slots are handed out in address
                // order from a start drawn from the secret, wrapping
                // once in each OS page). Its bytes written over (its free
                // key among them), or not, then freed or reallocated.
                let (r, t) = (black_box(A.alloc(l)), black_box(A.alloc(l)));
                let mut v = [p as usize, r as usize, t as usize];
                v.sort();
                let d = SLOT_170;
                assert!(v[1] - v[0] >= d && v[2] - v[1] >= d, "{v:x?}");
                let slice = pagewise::layout::SLICE;
                let q = if v[2] + 2 * d <= (v[2] | (slice - 1)) + 1 {
                    v[2] + d
                } else {
                    assert!(v[0] - d >= v[0] & !(slice - 1), "{v:x?}");
                    v[0] - d
                } as *mut u8;
                println!("slot {:#018x}", q as usize);
                if kind != "carved-intact" {
                    q.write_bytes(b'x', d);
                }
                if kind == "carved-realloc" {
                    black_box(A.realloc(q, l, 2 * size));
                } else {
                    A.dealloc(q, l);
                }
            }
            "zero-read" | "zero-write" | "zero-double-free" => {
                let z = black_box(pagewise::raw::malloc(0, 16));
                match kind {
                    "zero-read" => println!("read {}", z.read_volatile()),
                    "zero-write" => z.write_volatile(1),
                    _ => {
                        pagewise::raw::free(z);
                        pagewise::raw::free(z);
                    }
                }
            }
            _ => unreachable!("{kind}"),
        }
        A.dealloc(p, l);
    }
    println!("still running");
    std::process::exit(0);
}

/// Blocks of `size` bytes (a request a few bytes short of its slot, so
/// that it ends in a short tail) side by side in fresh pages: this thread
/// resizes the first of each pair in place, back and forth between two
/// short tails, while another thread frees the second, whose free checks
/// the word before it, the first block's last word. That word must never
/// be seen half rewritten: each pair's free lands while its neighbour is
/// being resized.
///
/// # Safety
/// None: the blocks are this function's.
unsafe fn realloc_beside_frees(size: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering::*};
    let l = layout(size);
    let pairs = pairs_next_door(size, 8192);
    static TURN: AtomicUsize = AtomicUsize::new(0);
    static FREED: AtomicUsize = AtomicUsize::new(0);
    static RESIZES: AtomicUsize = AtomicUsize::new(0);
    let seconds: Vec<usize> = pairs.iter().map(|p| p.1).collect();
    let freer = std::thread::spawn(move || {
        for (k, &b) in seconds.iter().enumerate() {
            while TURN.load(Acquire) <= k {
                std::hint::spin_loop();
            }
            // The free lands while the block before is being resized.
            let seen = RESIZES.load(Acquire);
            while RESIZES.load(Acquire) < seen + 2 {
                std::hint::spin_loop();
            }
            // SAFETY: a live block of `l`, freed once.
            unsafe { A.dealloc(b as *mut u8, l) };
            FREED.store(k + 1, Release);
        }
    });
    let other = size - 3;
    for (k, &(a, _)) in pairs.iter().enumerate() {
        // Its bytes in the last word are the program's: not zero.
        (a as *mut u8).write_bytes(0xa5, size);
        TURN.store(k + 1, Release);
        let mut now = size;
        while FREED.load(Acquire) <= k {
            let next = if now == size { other } else { size };
            let q = A.realloc(a as *mut u8, layout(now), next);
            assert_eq!(q as usize, a, "resized in place");
            now = next;
            RESIZES.fetch_add(1, Release);
        }
        A.dealloc(a as *mut u8, layout(now));
    }
    freer.join().unwrap();
}

/// Slots of `size` bytes (a request a few bytes short of its slot) side
/// by side in fresh pages: this thread takes the first of each pair again
/// and again zeroed (an alignment past 16 takes the uncached path, where
/// the heap zeroes the block before this layer arms it), while another
/// thread frees the second, whose free checks the word before it: the
/// first slot's last word, which must never be seen half zeroed.
///
/// # Safety
/// None: the blocks are this function's.
unsafe fn zeroed_beside_frees(size: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering::*};
    let l = layout(size);
    let zl = Layout::from_size_align(size, 32).unwrap();
    let pairs = pairs_next_door(size, 4096);
    static TURN: AtomicUsize = AtomicUsize::new(0);
    static FREED: AtomicUsize = AtomicUsize::new(0);
    static TAKEN: AtomicUsize = AtomicUsize::new(0);
    let seconds: Vec<usize> = pairs.iter().map(|p| p.1).collect();
    let freer = std::thread::spawn(move || {
        for (k, &b) in seconds.iter().enumerate() {
            while TURN.load(Acquire) <= k {
                std::hint::spin_loop();
            }
            // The free lands while the block before is being taken.
            let seen = TAKEN.load(Acquire);
            while TAKEN.load(Acquire) < seen + 2 {
                std::hint::spin_loop();
            }
            // SAFETY: a live block of `l`, freed once.
            unsafe { A.dealloc(b as *mut u8, l) };
            FREED.store(k + 1, Release);
        }
    });
    // Pairs whose first take found the slot before the free (the cache's
    // upkeep may move the slot to its page meanwhile, and a loaded machine
    // lets the loop run long).
    let mut hits = 0;
    for (k, &(a, _)) in pairs.iter().enumerate() {
        // Into the thread cache, with the frees it waits for after it: the
        // allocations after the older cached slots take it.
        A.dealloc(a as *mut u8, l);
        later_frees(l);
        TURN.store(k + 1, Release);
        let mut first = true;
        while FREED.load(Acquire) <= k {
            let q = until_back_by(a as *mut u8, zl, |zl| {
                let q = A.alloc_zeroed(zl);
                assert!((0..size).all(|i| *q.add(i) == 0), "zeroed");
                q
            });
            let q = if q.is_null() { A.alloc_zeroed(zl) } else { q };
            assert!((0..size).all(|i| *q.add(i) == 0), "zeroed");
            hits += usize::from(first && q as usize == a);
            first = false;
            A.dealloc(q, zl);
            later_frees(l);
            TAKEN.fetch_add(1, Release);
        }
    }
    freer.join().unwrap();
    // That the window was reached, hundreds of times: not a rate (a
    // loaded machine lets the cache's upkeep move the slot more often;
    // 986 of 4,096 was seen on one).
    assert!(
        hits * 8 > pairs.len(),
        "{hits} of {} pairs took the slot before a free",
        pairs.len()
    );
}

/// 16-byte slots (a request of `size` bytes, 15 at most) side by side in
/// fresh pages: this thread takes the first of each pair from its cache
/// again and again, while another thread frees the second, whose free
/// checks the word before it. In a 16-byte slot that word is the slot's
/// key while it is free, and it goes from the cache key to zero and to a
/// tail word as the slot is taken: whatever moment the free reads it at,
/// it is one the allocator wrote.
///
/// # Safety
/// None: the blocks are this function's.
unsafe fn taken_beside_frees(size: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering::*};
    assert!(size < 16, "a 16-byte slot");
    let l = layout(size);
    let pairs = pairs_next_door(size, 8192);
    static TURN: AtomicUsize = AtomicUsize::new(0);
    static FREED: AtomicUsize = AtomicUsize::new(0);
    static TAKEN: AtomicUsize = AtomicUsize::new(0);
    let seconds: Vec<usize> = pairs.iter().map(|p| p.1).collect();
    let freer = std::thread::spawn(move || {
        for (k, &b) in seconds.iter().enumerate() {
            while TURN.load(Acquire) <= k {
                std::hint::spin_loop();
            }
            // The free lands while the block before is being taken.
            let seen = TAKEN.load(Acquire);
            while TAKEN.load(Acquire) < seen + 1 {
                std::hint::spin_loop();
            }
            // SAFETY: a live block of `l`, freed once.
            unsafe { A.dealloc(b as *mut u8, l) };
            FREED.store(k + 1, Release);
        }
    });
    // Pairs whose first take found the slot, as above.
    let mut hits = 0;
    for (k, &(a, _)) in pairs.iter().enumerate() {
        // Into the thread cache, with the frees it waits for after it.
        A.dealloc(a as *mut u8, l);
        later_frees(l);
        TURN.store(k + 1, Release);
        let mut first = true;
        while FREED.load(Acquire) <= k {
            let q = until_back(a as *mut u8, l);
            let q = if q.is_null() { A.alloc(l) } else { q };
            hits += usize::from(first && q as usize == a);
            first = false;
            A.dealloc(q, l);
            later_frees(l);
            TAKEN.fetch_add(1, Release);
        }
    }
    freer.join().unwrap();
    // That the window was reached, hundreds of times: not a rate (a
    // loaded machine lets the cache's upkeep move the slot more often;
    // 986 of 4,096 was seen on one).
    assert!(
        hits * 8 > pairs.len(),
        "{hits} of {} pairs took the slot before a free",
        pairs.len()
    );
}

/// `n` blocks of `size` bytes, of which the pairs next door to each other
/// (the first of a pair right before the second) are returned; the others
/// are freed.
///
/// # Safety
/// None: the blocks are the caller's.
unsafe fn pairs_next_door(size: usize, n: usize) -> Vec<(usize, usize)> {
    let l = layout(size);
    let mut v: Vec<usize> = (0..n).map(|_| A.alloc(l) as usize).collect();
    v.sort_unstable();
    // The small classes step by 16 bytes; a slot holds a byte spare.
    let slot = (size + 1).next_multiple_of(16);
    let mut pairs = Vec::new();
    let mut rest = Vec::new();
    for w in v.chunks(2) {
        match *w {
            [a, b] if b - a == slot => pairs.push((a, b)),
            _ => rest.extend_from_slice(w),
        }
    }
    assert!(pairs.len() > n / 4, "{} pairs next door", pairs.len());
    for p in rest {
        A.dealloc(p as *mut u8, l);
    }
    pairs
}

/// Fresh slots of a class come a slot apart from a start drawn from the
/// secret in each OS page, wrapping around once.
fn fresh_slots() {
    // A size no other test uses, so the slots come from fresh pages: 170
    // bytes and the tail word, in the 192-byte class (21 slots per 4 KiB
    // OS page, the unit slots are carved in, each in address order from a
    // start drawn from the secret). Ten OS pages' worth, whatever the OS
    // page (PAGEWISE_OS_PAGE).
    let l = layout(170);
    let n = 10 * (pagewise::layout::os_page() / 192);
    let mut v = vec![core::ptr::null_mut(); n];
    // SAFETY: live blocks, each freed once.
    unsafe {
        for p in v.iter_mut() {
            *p = A.alloc(l);
        }
        // Each OS page's slots come from its start on, then wrap around to
        // its first: a block below the one before.
        let wraps = v.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(wraps >= 4, "{wraps} wraps in {n} blocks over 10 OS pages");
        let next_door = v
            .windows(2)
            .filter(|w| (w[1] as usize).wrapping_sub(w[0] as usize) == 192)
            .count();
        assert!(
            next_door > n * 3 / 4,
            "locality kept: {next_door} of {} next door",
            n - 1
        );
        for p in v {
            A.dealloc(p, l);
        }
    }
}

/// A request a few bytes short of its class keeps the class.
fn short_keeps_class() {
    // 250 bytes leave 6 of a 256-byte slot spare: the canary and the
    // byte that says how many fit there, so the block is not moved up to
    // the 320-byte class (as an eight-byte tail word would move it).
    // Blocks of a fresh page come in address order, a slot apart.
    let l = layout(250);
    let n = 4 * (pagewise::layout::os_page() / 256);
    let mut v = vec![core::ptr::null_mut(); n];
    // SAFETY: live blocks, each freed once.
    unsafe {
        for p in v.iter_mut() {
            *p = A.alloc(l);
            p.write_bytes(0x5a, 250);
        }
        let gaps = |slot: usize| {
            v.windows(2)
                .filter(|w| (w[1] as usize).wrapping_sub(w[0] as usize) == slot)
                .count()
        };
        assert!(
            gaps(256) > n * 3 / 4,
            "{} of {} next door at 256 bytes, {} at 320",
            gaps(256),
            n - 1,
            gaps(320)
        );
        for p in v {
            A.dealloc(p, l);
        }
    }
}

fn run_case(case: &str) -> (bool, String, String) {
    let (status, stdout, stderr) = run_case_status(case);
    (status.success(), stdout, stderr)
}

fn run_case_status(case: &str) -> (std::process::ExitStatus, String, String) {
    run_case_env(case, &[])
}

fn run_case_env(case: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn expect_report(kind: &str, sizes: &[usize], message: &str) {
    for &size in sizes {
        let case = format!("{kind}:{size}");
        let (ok, stdout, stderr) = run_case(&case);
        assert!(
            !ok && !stdout.contains("still running"),
            "{case}: the child went on: {stdout}{stderr}"
        );
        assert!(
            stderr.contains(message),
            "{case}: no {message:?} in {stderr:?}"
        );
    }
}

#[test]
fn a_one_byte_overflow_is_reported_at_the_free() {
    expect_report("overflow-1", &SIZES, "pagewise: heap buffer overflow");
    expect_report("overflow-1", &SHORT_SIZES, "pagewise: heap buffer overflow");
}

#[test]
fn a_32_byte_overflow_is_reported_at_the_free() {
    expect_report("overflow-32", &SIZES, "pagewise: heap buffer overflow");
    expect_report(
        "overflow-32",
        &SHORT_SIZES,
        "pagewise: heap buffer overflow",
    );
}

#[test]
fn a_double_free_is_reported_at_the_second_free() {
    expect_report("double", &SIZES, "pagewise: double free");
    expect_report("double", &SHORT_SIZES, "pagewise: double free");
}

#[test]
fn the_usable_size_and_realloc_check_the_block_as_a_free_does() {
    // Slots are found through the slab table there, as the free finds
    // them; the checks are the free's.
    let sizes = [8, 40, 48, 250, 4000, 4093, 200_000, 1 << 20];
    expect_report(
        "usable-overflow-1",
        &sizes,
        "pagewise: heap buffer overflow",
    );
    expect_report(
        "realloc-overflow-1",
        &sizes,
        "pagewise: heap buffer overflow",
    );
    expect_report("usable-freed", &sizes, "pagewise: double free");
    expect_report(
        "usable-inside",
        &sizes,
        "pagewise: free of a pointer that is not the start of an allocation",
    );
}

#[test]
fn a_double_free_after_the_freed_block_was_overwritten_is_reported_as_one() {
    // At the second free the slot is still in the thread's quarantine.
    expect_report("double-overwritten", &SLAB_SIZES, "pagewise: double free");
}

#[test]
fn a_double_free_of_a_rewritten_block_is_named_a_double_free_wherever_it_waits() {
    // The freed block's bytes written over (its free key, and the free
    // slot's tail word of a block with a short tail): the slot is free by
    // the allocator's own record, not by what its bytes say, in the
    // thread's quarantine, past it, and freed again by another thread.
    let sizes = [8, 12, 250, 4000, 4093, 200_000, 229_370];
    for kind in [
        "double-rewritten",
        "double-rewritten-past",
        "double-rewritten-thread",
    ] {
        expect_report(kind, &sizes, "pagewise: double free");
    }
}

/// The slot of a 170-byte request (and its tail word).
const SLOT_170: usize = 192;

#[test]
fn a_slot_never_handed_out_is_named_free_at_its_free_even_written_over() {
    // The hardened layer's record of blocks handed out says so, with no
    // read of the slot: a write over its free key (and all its bytes)
    // does not make it a live block written past its end.
    for kind in ["carved-intact", "carved-overwritten", "carved-realloc"] {
        expect_report(kind, &[170], "pagewise: double free");
    }
}

#[test]
fn a_double_free_by_another_thread_is_reported_at_the_second_free() {
    expect_report(
        "double-other-thread",
        &[8, 4000, 200_000, 64 << 20],
        "pagewise: double free",
    );
    // The span of a large block between guard pages may go to small
    // blocks before the second free (the thread's start allocates): then
    // its address, one page into the span, is none of theirs.
    let case = format!("double-other-thread:{}", 1 << 20);
    let (ok, stdout, stderr) = run_case(&case);
    assert!(
        !ok && !stdout.contains("still running")
            && (stderr.contains("pagewise: double free")
                || stderr.contains("pagewise: free of a pointer that is not the start")),
        "{case}: {stdout}{stderr}"
    );
}

/// Slab sizes: their free slots are linked through their first word.
const SLAB_SIZES: [usize; 3] = [8, 4000, 200_000];

/// Runs a case that prints `slot ADDRESS` and expects the report of a
/// corrupted free list naming that slot.
fn expect_corrupted_slot(kind: &str, sizes: &[usize]) {
    for &size in sizes {
        let case = format!("{kind}:{size}");
        let (ok, stdout, stderr) = run_case(&case);
        assert!(
            !ok && !stdout.contains("still running"),
            "{case}: the child went on: {stdout}{stderr}"
        );
        let slot = stdout
            .lines()
            .find_map(|l| l.split("slot ").nth(1))
            .unwrap_or_else(|| panic!("{case}: {stdout}"));
        let report = format!("pagewise: corrupted free list (a free block's link was overwritten: a write after free): {slot}");
        assert!(
            stderr.contains(&report),
            "{case}: no {report:?} in {stderr:?}"
        );
    }
}

#[test]
fn a_link_overwritten_after_free_is_reported_at_its_slot_when_followed() {
    expect_corrupted_slot("text-after-free", &SLAB_SIZES);
    expect_corrupted_slot("link-after-free", &SLAB_SIZES);
    // Sizes whose OS page the live neighbour keeps (a slot alone on its OS
    // page is purged by `trim()`, and carved again with a fresh link).
    expect_corrupted_slot("link-after-free-paged", &[8, 1000]);
}

#[test]
fn a_write_after_free_is_reported_when_the_slot_is_handed_out_again() {
    for (kind, sizes) in [
        ("write-after-free", &[100, 4000, 200_000][..]),
        // Gone home to its page's free list (a neighbour keeps the OS page).
        ("write-after-free-paged", &[100, 1000][..]),
    ] {
        for &size in sizes {
            let case = format!("{kind}:{size}");
            let (ok, stdout, stderr) = run_case(&case);
            assert!(
                !ok && !stdout.contains("still running"),
                "{case}: the child went on: {stdout}{stderr}"
            );
            let byte = stdout
                .lines()
                .find_map(|l| l.split("byte ").nth(1))
                .unwrap_or_else(|| panic!("{case}: {stdout}"));
            let report = format!("pagewise: write after free (a freed block was written): {byte}");
            assert!(
                stderr.contains(&report),
                "{case}: no {report:?} in {stderr:?}"
            );
        }
    }
}

#[test]
fn a_write_over_a_freed_slots_first_words_is_reported_at_the_slot() {
    // A 16-byte slot's second word is its last: the word before the next
    // slot, which that slot's free checks (an underflow); not here. The
    // first word, the slot's link, is checked at the next free of its
    // class (a write after free); the second, its key, when the slot is
    // handed out again (the cache's list no longer holds what it put
    // there).
    for (kind, sizes, what) in [
        ("first-word-after-free", &[8, 100, 4000][..], WRITTEN),
        ("first-word-then-one-free", &[8, 100, 4000][..], WRITTEN),
        ("second-word-after-free", &[100, 4000][..], CORRUPTED),
    ] {
        for &size in sizes {
            let case = format!("{kind}:{size}");
            let (ok, stdout, stderr) = run_case(&case);
            assert!(
                !ok && !stdout.contains("still running"),
                "{case}: the child went on: {stdout}{stderr}"
            );
            let slot = stdout
                .lines()
                .find_map(|l| l.split("slot ").nth(1))
                .unwrap_or_else(|| panic!("{case}: {stdout}"));
            let report = format!("{what}: {slot}");
            assert!(
                stderr.contains(&report),
                "{case}: no {report:?} in {stderr:?}"
            );
        }
    }
}

/// The report of a write after free.
const WRITTEN: &str = "pagewise: write after free (a freed block was written)";

/// The report of a free list whose link or key a write after free changed.
const CORRUPTED: &str =
    "pagewise: corrupted free list (a free block's link was overwritten: a write after free)";

#[test]
fn memory_an_earlier_use_left_in_a_fresh_slot_is_not_a_write_after_free() {
    let (ok, stdout, stderr) = run_case("reuse:8");
    assert!(ok && stdout.contains("still running"), "{stdout}{stderr}");
}

#[test]
fn a_one_byte_underflow_is_reported_at_the_free() {
    // Slab sizes where the two blocks are neighbours (one after the other
    // in a fresh page).
    expect_report(
        "underflow-1",
        &[8, 100, 4000],
        "pagewise: heap buffer underflow",
    );
    expect_report(
        "underflow-1-free-neighbour",
        &[8, 100, 4000],
        "pagewise: heap buffer underflow",
    );
    // The block before ends in a short tail.
    expect_report(
        "underflow-1",
        &SHORT_SIZES[..3],
        "pagewise: heap buffer underflow",
    );
}

#[test]
fn a_block_resized_in_place_beside_a_free_is_never_taken_for_an_underflow() {
    // 60 bytes of a 64-byte slot, resized to 57 and back: short tails.
    let case = "realloc-beside-frees:60";
    let (ok, stdout, stderr) = run_case(case);
    assert!(
        ok && stdout.contains("still running"),
        "{case}: {stdout}{stderr}"
    );
}

#[test]
fn a_block_zeroed_beside_a_free_is_never_taken_for_an_underflow() {
    let case = "zeroed-beside-frees:60";
    let (ok, stdout, stderr) = run_case(case);
    assert!(
        ok && stdout.contains("still running"),
        "{case}: {stdout}{stderr}"
    );
}

#[test]
fn a_16_byte_slot_taken_beside_a_free_is_never_taken_for_an_underflow() {
    // 8 bytes and the tail word: 16-byte slots, whose last word is the
    // free slot's key.
    let case = "taken-beside-frees:8";
    let (ok, stdout, stderr) = run_case(case);
    assert!(
        ok && stdout.contains("still running"),
        "{case}: {stdout}{stderr}"
    );
}

#[test]
fn a_byte_written_before_a_block_that_realloc_moves_is_reported_at_the_realloc() {
    // The move frees the block as `free` does, checking the word before it.
    expect_report(
        "underflow-realloc",
        &[8, 100, 4000],
        "pagewise: heap buffer underflow",
    );
}

#[test]
fn large_and_huge_blocks_fault_at_an_underflow_or_a_far_overflow() {
    // Between guard pages: the write faults where it happens.
    use std::os::unix::process::ExitStatusExt;
    let cases = [300_000, 1 << 20, 64 << 20]
        .into_iter()
        .flat_map(|size| [("underflow-1", size), ("overflow-far", size)])
        .chain([("underflow-kept", 1 << 20), ("underflow-aligned", 1 << 20)]);
    for (kind, size) in cases {
        let case = format!("{kind}:{size}");
        let (status, stdout, stderr) = run_case_status(&case);
        assert!(
            status.signal() == Some(libc::SIGSEGV) && !stdout.contains("still running"),
            "{case}: {status:?} {stdout}{stderr}"
        );
    }
}

#[test]
fn a_write_after_free_of_a_large_or_huge_block_faults_at_the_write() {
    use std::os::unix::process::ExitStatusExt;
    for size in [300_000, 1 << 20, 64 << 20] {
        let case = format!("write-after-free-large:{size}");
        let (status, stdout, stderr) = run_case_status(&case);
        assert!(
            status.signal() == Some(libc::SIGSEGV) && !stdout.contains("still running"),
            "{case}: {status:?} {stdout}{stderr}"
        );
    }
}

#[test]
fn a_span_kept_shut_goes_back_to_the_heap_when_a_limit_refuses_a_block() {
    let case = format!("kept-under-limit:{}", 64 << 20);
    let (status, stdout, stderr) = run_case_env(&case, &[("PAGEWISE_LIMIT", "128M")]);
    assert!(
        status.success() && stdout.contains("still running"),
        "{case}: {status:?} {stdout}{stderr}"
    );
}

#[test]
fn large_blocks_aligned_past_a_page_are_guarded_and_used_as_any() {
    // SAFETY: live blocks, each freed once.
    unsafe {
        for (size, align) in [(300_000, 1 << 13), (1 << 20, 1 << 16), (40 << 20, 1 << 21)] {
            let l = Layout::from_size_align(size, align).unwrap();
            let p = A.alloc(l);
            assert_eq!(p as usize % align, 0, "{size} at {align}");
            assert_eq!(pagewise::usable_size(p), size);
            p.write_bytes(0x5a, size);
            // A copy that fits passes the checked memcpy's bound.
            pagewise::raw::check_write(p, size);
            let q = A.realloc(p, l, size / 2);
            assert_eq!(q, p, "shrunk in place");
            assert!((0..size / 2).step_by(4093).all(|i| *q.add(i) == 0x5a));
            A.dealloc(q, Layout::from_size_align(size / 2, align).unwrap());
        }
    }
}

#[test]
fn fresh_slots_start_at_a_slot_drawn_from_the_secret() {
    // In a child: a heap of its own, whose pages no other test's blocks
    // shuffled (a test thread may take over the heap of one that exited).
    let (ok, stdout, stderr) = run_case("fresh-slots:8");
    assert!(ok && stdout.contains("still running"), "{stdout}{stderr}");
}

#[test]
fn a_request_a_few_bytes_short_of_its_class_keeps_the_class() {
    // In a child, as above.
    let (ok, stdout, stderr) = run_case("short-keeps-class:8");
    assert!(ok && stdout.contains("still running"), "{stdout}{stderr}");
}

#[test]
fn a_zero_byte_block_faults_when_touched_and_is_freed_once() {
    for case in ["zero-read:0", "zero-write:0"] {
        let (ok, stdout, stderr) = run_case(case);
        assert!(
            !ok && !stdout.contains("still running") && !stdout.contains("read "),
            "{case}: {stdout}{stderr}"
        );
    }
    expect_report("zero-double-free", &[0], "pagewise: double free");
    // SAFETY: 16 is a power of two; blocks freed once.
    unsafe {
        let (a, b) = (pagewise::raw::malloc(0, 16), pagewise::raw::malloc(0, 16));
        assert!(!a.is_null() && a != b, "unique");
        assert_eq!(pagewise::raw::usable_size(a), 0);
        let c = pagewise::raw::realloc(a, 10, 16);
        c.write_bytes(7, 10);
        assert_eq!(pagewise::raw::usable_size(c), 10);
        pagewise::raw::free(c);
        pagewise::raw::free(b);
        let z = pagewise::raw::calloc(0, 16);
        assert!(!z.is_null());
        pagewise::raw::free(z);
    }
}

#[test]
fn a_freed_block_does_not_come_straight_back() {
    let l = layout(100);
    let mut got = [core::ptr::null_mut(); 64];
    let got = &mut got[..pagewise::raw::QUARANTINE];
    // SAFETY: live blocks, each freed once.
    unsafe {
        let p = A.alloc(l);
        A.dealloc(p, l);
        for b in got.iter_mut() {
            *b = A.alloc(l);
        }
        assert!(!got.contains(&p), "{p:?} came back within the quarantine");
        for &b in got.iter() {
            A.dealloc(b, l);
        }
    }
}

#[test]
fn a_block_realloc_moved_away_does_not_come_straight_back() {
    // The block a realloc moves away from is freed as `free` frees it:
    // into the quarantine. Through the global allocator, then through the
    // C library's entry points.
    let l = layout(100);
    let mut got = [core::ptr::null_mut(); 64];
    let got = &mut got[..pagewise::raw::QUARANTINE];
    // SAFETY: live blocks, each freed once; 16 is a power of two.
    unsafe {
        let p = A.alloc(l);
        let q = A.realloc(p, l, 5000);
        assert_ne!(q, p, "moved");
        for b in got.iter_mut() {
            *b = A.alloc(l);
        }
        assert!(!got.contains(&p), "{p:?} came back within the quarantine");
        for &b in got.iter() {
            A.dealloc(b, l);
        }
        A.dealloc(q, layout(5000));
        let p = pagewise::raw::malloc(100, 16);
        let q = pagewise::raw::realloc(p, 5000, 16);
        assert_ne!(q, p, "moved");
        for b in got.iter_mut() {
            *b = pagewise::raw::malloc(100, 16);
        }
        assert!(!got.contains(&p), "{p:?} came back within the quarantine");
        for &b in got.iter() {
            pagewise::raw::free(b);
        }
        pagewise::raw::free(q);
    }
}

#[test]
fn the_c_fast_path_hands_out_armed_slots_from_the_thread_cache() {
    // The checks ride on the thread cache's paths rather than leaving
    // them: a slot freed goes to the cache, which hands it out again once
    // as many frees of its class came after it as it waits for, and the
    // cache-only allocation hands it out then, armed for the new request.
    std::thread::spawn(|| {
        // SAFETY: 16 is a power of two; live blocks, each freed once.
        unsafe {
            // Frees as many new blocks as a slot of the class waits for,
            // and nothing else (no vector).
            let later = |size: usize| {
                let mut v = [core::ptr::null_mut(); 64];
                for b in v[..pagewise::raw::QUARANTINE].iter_mut() {
                    *b = pagewise::raw::malloc(size, 16);
                }
                for &b in &v[..pagewise::raw::QUARANTINE] {
                    pagewise::raw::free(b);
                }
            };
            // The cache-only allocation, until it hands out `p` (after the
            // slots cached before it: a batch other threads passed on may
            // have come in front), the others freed after.
            let until_p = |p: *mut u8, size: usize| {
                let mut v = [core::ptr::null_mut(); 256];
                let mut n = 0;
                let q = loop {
                    let q = pagewise::raw::malloc_cached(size, 16);
                    assert!(!q.is_null() && n < v.len(), "{p:?} did not come back");
                    if q == p {
                        break q;
                    }
                    v[n] = q;
                    n += 1;
                };
                for &b in &v[..n] {
                    pagewise::raw::free(b);
                }
                q
            };
            let p = pagewise::raw::malloc(100, 16);
            pagewise::raw::free(p);
            later(100);
            let q = until_p(p, 104);
            assert_eq!(q, p, "the slot freed, from the cache");
            assert_eq!(pagewise::raw::usable_size(q), 104, "armed for its request");
            q.write_bytes(1, 104);
            pagewise::raw::free(q);
            later(100);
            // 98 bytes: the 112-byte class too (a byte spare at least).
            let r = until_p(p, 98);
            assert_eq!(pagewise::raw::usable_size(r), 98, "armed for its request");
            assert!((0..98).all(|i| *r.add(i) == 0), "wiped by the free");
            pagewise::raw::free(r);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn a_freed_block_waits_for_frees_of_its_own_class() {
    // Frees of another class do not let a slot out: on a fresh thread
    // (whose cache holds nothing older), a block freed, then as many
    // blocks of another class as the most a slot waits for, and a block
    // of the first's size is another slot.
    std::thread::spawn(|| {
        let (small, other) = (layout(100), layout(1000));
        let n = pagewise::raw::QUARANTINE;
        // SAFETY: live blocks, each freed once.
        unsafe {
            let mut v = [core::ptr::null_mut(); 64];
            for b in v[..n].iter_mut() {
                *b = A.alloc(other);
            }
            let p = A.alloc(small);
            A.dealloc(p, small);
            for &b in &v[..n] {
                A.dealloc(b, other);
            }
            let q = A.alloc(small);
            assert_ne!(q, p, "handed out after frees of another class only");
            A.dealloc(q, small);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn the_usable_size_is_the_request_and_realloc_keeps_the_bytes() {
    // SAFETY: live blocks, each freed once.
    unsafe {
        for size in [1, 8, 100, 4000, 200_000, 1 << 20] {
            let p = A.alloc(layout(size));
            assert_eq!(pagewise::usable_size(p), size);
            p.write_bytes(0x5a, size);
            let q = A.realloc(p, layout(size), size * 2 + 3);
            assert_eq!(pagewise::usable_size(q), size * 2 + 3);
            assert!((0..size).all(|i| *q.add(i) == 0x5a), "{size}");
            // Shrunk: the bytes kept, the new end checked at the free.
            let r = A.realloc(q, layout(size * 2 + 3), size.div_ceil(2));
            assert_eq!(pagewise::usable_size(r), size.div_ceil(2));
            assert!((0..size.div_ceil(2)).all(|i| *r.add(i) == 0x5a));
            A.dealloc(r, layout(size.div_ceil(2)));
        }
    }
}

#[test]
fn a_freed_block_is_wiped_before_it_is_handed_out_again() {
    // SAFETY: live blocks, each freed once.
    unsafe {
        for size in [24, 64, 1000, 4000] {
            let l = layout(size);
            let p = A.alloc(l);
            p.write_bytes(0xaa, size);
            A.dealloc(p, l);
            later_frees(l);
            let q = until_back(p, l);
            assert_eq!(q, p, "{size}: the slot comes back from the cache");
            assert!(
                (0..size).all(|i| *q.add(i) == 0),
                "{size}: the last owner's bytes (or the free list's) are seen"
            );
            A.dealloc(q, l);
        }
    }
}

#[test]
fn a_block_shrunk_to_a_byte_is_freed_and_handed_out_again_unreported() {
    // Its request and canary end before the word where its free leaves
    // the mark: the free zeroes past the mark anyway, so handing the slot
    // out again finds nothing changed.
    // SAFETY: live blocks, each freed once.
    unsafe {
        for size in [24, 40, 100] {
            let p = A.alloc(layout(size));
            let q = A.realloc(p, layout(size), 1);
            assert_eq!(q, p, "{size}: shrunk in place");
            A.dealloc(q, layout(1));
            later_frees(layout(size));
            let r = until_back(p, layout(size));
            assert_eq!(r, p, "{size}: the slot comes back from the cache");
            A.dealloc(r, layout(size));
        }
    }
}

#[test]
fn zeroed_blocks_are_zero_and_checked_too() {
    // SAFETY: live blocks, each freed once.
    unsafe {
        // Sizes that end inside a word too: the canary's first word holds
        // the request's last bytes. Each block is used dirty first, so that
        // its memory is not known to be zero.
        for size in [8, 13, 4000, 4001, 1 << 20, (1 << 20) + 3] {
            let l = layout(size);
            let p = A.alloc(l);
            p.write_bytes(0xff, size);
            A.dealloc(p, l);
            let p = A.alloc_zeroed(l);
            assert!((0..size).all(|i| *p.add(i) == 0), "{size}");
            A.dealloc(p, l);
        }
    }
}

#[test]
fn a_program_that_reallocates_and_frees_at_random_is_never_stopped() {
    // Blocks moved by realloc and freed again in every order: each free,
    // the heap's or the program's, leaves a block the checks accept.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut held: Vec<Vec<u8>> = Vec::new();
    // Fewer steps unoptimized: each checks up to 4 KiB twice.
    let steps = if cfg!(debug_assertions) {
        50_000
    } else {
        200_000
    };
    for _ in 0..steps {
        let r = next();
        let i = (r >> 8) as usize % 512;
        match r % 4 {
            0 | 1 if held.len() < 512 => {
                let n = 1 + (r >> 20) as usize % 3000;
                held.push(vec![r as u8; n]);
            }
            2 if i < held.len() => {
                let v = &mut held[i];
                let fill = v.first().copied().unwrap_or(0);
                v.resize(1 + (r >> 24) as usize % 6000, fill);
                v.shrink_to_fit();
            }
            _ if i < held.len() => {
                let v = held.swap_remove(i);
                assert!(v.iter().all(|&b| b == v[0]), "contents kept");
            }
            _ => {}
        }
    }
}
