//! Bad input gets a clear abort, never silent corruption. Each case runs in
//! a child process (this test binary re-executed) and the parent checks the
//! exit and the message.

// Built by the `pagewise-secure` package too, whose library has its own name.
#[cfg(pagewise_secure_package)]
extern crate pagewise_secure as pagewise;

mod reexec;

use std::alloc::{GlobalAlloc, Layout};

const CASE: &str = "PAGEWISE_TEST_MISUSE_CASE";

fn run_case(case: &str) -> (bool, String) {
    run_case_with(case, &[])
}

/// [`run_case`] with more environment variables for the child.
fn run_case_with(case: &str, env: &[(&str, &str)]) -> (bool, String) {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A 1 MiB block, allocated here (a frame a report can name).
#[inline(never)]
fn sampled_make() -> *mut u8 {
    let big = Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: a valid layout.
    std::hint::black_box(unsafe { pagewise::Pagewise.alloc(big) })
}

/// Frees another block here.
#[inline(never)]
fn other_drop(p: *mut u8, l: Layout) {
    std::hint::black_box("other_drop");
    // SAFETY: `p` is a live block of `l`.
    unsafe { pagewise::Pagewise.dealloc(std::hint::black_box(p), l) }
}

/// A huge block, allocated here.
#[inline(never)]
fn sampled_make_huge(l: Layout) -> *mut u8 {
    // SAFETY: a valid layout.
    std::hint::black_box(unsafe { pagewise::Pagewise.alloc(l) })
}

/// Frees [`sampled_make`]'s block here. (Its marker keeps an optimized
/// build from merging it with [`other_drop`], whose machine code it would
/// otherwise share: the free does not read the size.)
#[inline(never)]
fn sampled_drop(p: *mut u8) {
    std::hint::black_box("sampled_drop");
    let big = Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: `p` is `sampled_make`'s live block.
    unsafe { pagewise::Pagewise.dealloc(std::hint::black_box(p), big) }
}

/// Runs one misuse in the child; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    let a = pagewise::Pagewise;
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: deliberately wrong calls, each expected to abort.
    unsafe {
        match case.as_str() {
            "foreign" => {
                let x = std::hint::black_box(Box::new(5u64));
                a.dealloc(Box::into_raw(x).cast(), Layout::new::<u64>());
            }
            "double" => {
                let p = a.alloc(l);
                a.dealloc(p, l);
                a.dealloc(p, l);
            }
            "interior" => {
                let p = a.alloc(l);
                a.dealloc(p.add(8), l);
            }
            "segment-end" => {
                // The first byte past a thread heap's segment: the fast
                // path's lookup takes the segment below for it (the one
                // holding the byte before), whose header's slice holds no
                // slot, so the free goes past the cache, which says what
                // the address is (no block of the next segment, whether
                // that segment is pagewise's or not).
                let p = a.alloc(l) as usize;
                let seg = pagewise::layout::SEGMENT;
                a.dealloc(((p & !(seg - 1)) + seg) as *mut u8, l);
            }
            "sampled-large-double" => {
                let p = sampled_make();
                sampled_drop(p);
                a.dealloc(p, Layout::from_size_align(1 << 20, 8).unwrap());
            }
            "sampled-large-double-later" => {
                // Four larger blocks freed between the two frees: in the
                // hardened build the first block's span, kept guarded after
                // its free, goes back to the heap meanwhile (a thread keeps
                // four); its report still names the first free.
                let bigger = Layout::from_size_align(3 << 19, 8).unwrap();
                let others: Vec<*mut u8> = (0..4).map(|_| a.alloc(bigger)).collect();
                let p = sampled_make();
                sampled_drop(p);
                for o in others {
                    other_drop(o, bigger);
                }
                a.dealloc(p, Layout::from_size_align(1 << 20, 8).unwrap());
            }
            "sampled-aligned-double" => {
                // Aligned past an OS page: in the hardened build, a block
                // further into its span than the usual one page.
                let big = Layout::from_size_align(1 << 20, 1 << 16).unwrap();
                let p = a.alloc(big);
                other_drop(p, big);
                a.dealloc(p, big);
            }
            "sampled-huge-double" => {
                let huge = Layout::from_size_align(40 << 20, 8).unwrap();
                let p = sampled_make_huge(huge);
                a.dealloc(p, huge);
                a.dealloc(p, huge);
            }
            "aligned-interior-page" => {
                // Aligned to 8 KiB, so in the hardened build (at a 4 KiB OS
                // page) two pages into its span: two pages further is where
                // a block aligned to 16 KiB would start.
                let big = Layout::from_size_align(1 << 20, 8192).unwrap();
                let p = a.alloc(big);
                a.dealloc(p.add(8192), l);
            }
            "large-interior-page" => {
                // An OS page into a 1 MiB block: in the hardened build, where
                // large blocks sit a page into their span, what an aligned
                // block's start would look like.
                let p = sampled_make();
                a.dealloc(p.add(4096), l);
            }
            "large-double" => {
                let big = Layout::from_size_align(1 << 20, 8).unwrap();
                let p = a.alloc(big);
                a.dealloc(p, big);
                a.dealloc(p, big);
            }
            "big-slot-double" => {
                // A size class whose thread cache holds one slot: the
                // second free finds it full of the first.
                let l = Layout::from_size_align(200_000, 8).unwrap();
                let p = a.alloc(l);
                a.dealloc(p, l);
                a.dealloc(p, l);
            }
            "big-slot-double-between" => {
                // The same with another free between: the first copy went
                // on to the transfer cache, the second stays cached, and
                // the program ends: the check at exit meets both.
                let l = Layout::from_size_align(200_000, 8).unwrap();
                let p = a.alloc(l);
                let q = a.alloc(l);
                a.dealloc(p, l);
                a.dealloc(q, l);
                a.dealloc(p, l);
            }
            "huge-double" => {
                let huge = Layout::from_size_align(64 << 20, 8).unwrap();
                let p = a.alloc(huge);
                a.dealloc(p, huge);
                a.dealloc(p, huge);
            }
            "wrong-heap" => {
                let h1 = pagewise::Heap::new();
                let h2 = pagewise::Heap::new();
                let p = h1.allocate(l).unwrap();
                h2.deallocate(p.cast(), l);
            }
            "owned-via-global" => {
                let h = pagewise::Heap::new();
                let p = h.allocate(l).unwrap();
                a.dealloc(p.cast::<u8>().as_ptr(), l);
            }
            "global-via-owned-realloc" => {
                // An owned heap asked to resize a block of the global
                // allocator (the program's mistake): abort at the call.
                let p = a.alloc(l);
                let h = pagewise::Heap::new();
                let q = h.reallocate(std::ptr::NonNull::new(p).unwrap(), l, 4000);
                println!("reallocate returned {:?}", q.map(|q| q.cast::<u8>()));
            }
            "stale-into-remade-page" => {
                // p is freed, its page empties, is released and purged; a
                // new page of the class is made on the same span with only
                // its first OS page carved; then a thread without a heap
                // frees p again.
                let keeper = a.alloc(Layout::from_size_align(32, 8).unwrap());
                let blocks: Vec<*mut u8> = (0..1024).map(|_| a.alloc(l)).collect();
                let p = blocks[500] as usize;
                for &b in &blocks {
                    a.dealloc(b, l);
                }
                pagewise::trim();
                let q = a.alloc(l) as usize;
                assert_eq!(q & !0xffff, p & !0xffff, "the page is remade on the span");
                std::thread::spawn(move || {
                    assert!(pagewise::thread::current_or_null().is_null());
                    a.dealloc(p as *mut u8, l);
                })
                .join()
                .ok();
                allocate_and_check(l, 2000, vec![keeper as usize, q]);
            }
            "double-heapless" => {
                // A thread with no heap of its own (its frees go straight to
                // the owning page) frees one block twice.
                let p = a.alloc(l) as usize;
                std::thread::spawn(move || {
                    assert!(pagewise::thread::current_or_null().is_null());
                    a.dealloc(p as *mut u8, l);
                    a.dealloc(p as *mut u8, l);
                })
                .join()
                .ok();
            }
            // The program goes on allocating after each of these double
            // frees: pagewise must abort before it hands a block out twice.
            "double-with-another-between" => {
                let p = a.alloc(l);
                let q = a.alloc(l);
                a.dealloc(p, l);
                a.dealloc(q, l);
                a.dealloc(p, l);
                allocate_and_check(l, 4000, Vec::new());
            }
            "double-after-the-cache-flushed" => {
                // The first free's slot leaves the thread cache for its page
                // before the second free.
                let p = a.alloc(l);
                let others: Vec<*mut u8> = (0..1000).map(|_| a.alloc(l)).collect();
                a.dealloc(p, l);
                for q in others {
                    a.dealloc(q, l);
                }
                a.dealloc(p, l);
                allocate_and_check(l, 4000, Vec::new());
            }
            "double-then-page-empties" => {
                // Both copies reach the page's free list, and the page
                // counts one slot too few in use: it looks empty while `x`
                // still lives in it.
                let blocks: Vec<*mut u8> = (0..3000).map(|_| a.alloc(l)).collect();
                let page = |p: *mut u8| p as usize & !0xffff;
                let (p, q, x) = (blocks[0], blocks[1], blocks[2]);
                std::ptr::write_bytes(x, 0x5a, 64);
                a.dealloc(p, l);
                a.dealloc(q, l);
                a.dealloc(p, l);
                for &b in &blocks[3..] {
                    if page(b) == page(p) {
                        a.dealloc(b, l);
                    }
                }
                pagewise::trim();
                if *x != 0x5a {
                    println!("a live block's page was given back");
                    std::process::exit(0);
                }
            }
            "double-both-copies-home" => {
                // The first copy goes home to its page before the second
                // free, which goes into the thread cache (no check there)
                // and home later: the page counts one slot too few in use
                // and looks empty while `x` still lives in it.
                let blocks: Vec<*mut u8> = (0..3000).map(|_| a.alloc(l)).collect();
                let page = |p: *mut u8| p as usize & !0xffff;
                let (p, x) = (blocks[0], blocks[2]);
                std::ptr::write_bytes(x, 0x5a, 64);
                let rest: Vec<*mut u8> = blocks[1..]
                    .iter()
                    .copied()
                    .filter(|&b| b != x && page(b) == page(p))
                    .collect();
                a.dealloc(p, l);
                for &b in &rest[..300] {
                    a.dealloc(b, l);
                }
                a.dealloc(p, l);
                for &b in &rest[300..] {
                    a.dealloc(b, l);
                }
                pagewise::trim();
                if *x != 0x5a {
                    println!("a live block's page was given back");
                }
                std::process::exit(0);
            }
            "double-after-its-os-page-was-purged" => {
                // The page keeps one live block; trim() purges the OS pages
                // of its free slots (they leave the free list); then one of
                // them is freed again: the page takes no cached frees while
                // it has hollow slots, so the free is checked at once.
                let (l, n, kept, p) = hollowed_page_and_a_freed_slot();
                a.dealloc(p, l);
                pagewise::trim();
                allocate_and_check(l, 4 * n, vec![kept]);
            }
            "double-after-its-os-page-was-purged-then-reused" => {
                // As above, but the program allocates on at once: the
                // second free must not put the hollow slot in the cache,
                // from which it would be handed out while the page carves
                // it again.
                let (l, n, kept, p) = hollowed_page_and_a_freed_slot();
                a.dealloc(p, l);
                allocate_and_check(l, 4 * n, vec![kept]);
            }
            "double-after-its-os-page-was-purged-on-another-thread"
            | "double-after-its-os-page-was-purged-by-a-thread-without-a-heap" => {
                // The second free comes from another thread, which then
                // allocates: the slot must reach neither its cache (if it
                // has a heap) nor, through its page's remote list, the
                // page's free list (if it has none).
                let warm = case.ends_with("another-thread");
                let (l, n, kept, p) = hollowed_page_and_a_freed_slot();
                let p = p as usize;
                let mut theirs = std::thread::spawn(move || {
                    let first = warm.then(|| a.alloc(l) as usize);
                    a.dealloc(p as *mut u8, l);
                    let mut v: Vec<usize> = (0..n).map(|_| a.alloc(l) as usize).collect();
                    v.extend(first);
                    v
                })
                .join()
                .unwrap_or_default();
                theirs.push(kept);
                allocate_and_check(l, 4 * n, theirs);
            }
            "double-on-another-thread" => {
                let p = a.alloc(l) as usize;
                a.dealloc(p as *mut u8, l);
                let theirs = std::thread::spawn(move || {
                    let _warm = std::hint::black_box(a.alloc(l));
                    a.dealloc(p as *mut u8, l);
                    (0..2000).map(|_| a.alloc(l) as usize).collect::<Vec<_>>()
                })
                .join()
                .unwrap_or_default();
                allocate_and_check(l, 2000, theirs);
            }
            "owned-large-via-global" => {
                let h = pagewise::Heap::new();
                let big = Layout::from_size_align(1 << 20, 8).unwrap();
                let p = h.allocate(big).unwrap();
                a.dealloc(p.cast::<u8>().as_ptr(), big);
            }
            "owned-huge-via-global" => {
                let h = pagewise::Heap::new();
                let huge = Layout::from_size_align(40 << 20, 8).unwrap();
                let p = h.allocate(huge).unwrap();
                a.dealloc(p.cast::<u8>().as_ptr(), huge);
            }
            _ => unreachable!(),
        }
    }
    // Reaching here means the misuse went undetected.
    std::process::exit(0);
}

/// A slab page whose OS pages but the first were hollowed by `trim()`:
/// its layout, slots, the address of the live block it keeps and that of
/// one freed slot on a hollow OS page. At a 64 KiB OS page a one-slice slab
/// page has one OS page, which its live block keeps: the smallest class
/// whose slab page spans two slices or more is taken then.
fn hollowed_page_and_a_freed_slot() -> (Layout, usize, usize, *mut u8) {
    use pagewise::size_class::{PAGE_SLICES, SLOT_SIZE};
    let (l, n, victim) = if pagewise::layout::os_page() < 64 << 10 {
        (Layout::from_size_align(64, 8).unwrap(), 1024, 900)
    } else {
        let c = (0..PAGE_SLICES.len())
            .find(|&c| PAGE_SLICES[c] >= 2)
            .unwrap();
        let slot = SLOT_SIZE[c] as usize;
        let n = PAGE_SLICES[c] as usize * (64 << 10) / slot;
        // 16 bytes short of the slot: the hardened build asks for a few
        // bytes more than the request (its tail word), which at the full
        // slot size would land in the next class, whose page this
        // arithmetic does not describe.
        (Layout::from_size_align(slot - 16, 8).unwrap(), n, n - 1)
    };
    let a = pagewise::Pagewise;
    // SAFETY: non-zero layouts; each block is freed once here.
    unsafe {
        let blocks: Vec<*mut u8> = (0..n).map(|_| a.alloc(l)).collect();
        for &b in &blocks[1..] {
            a.dealloc(b, l);
        }
        // The thread's last free into its cache (the victim's) stays
        // announced, and an announced slot's OS page is not hollowed (a
        // hollowing page cannot tell a finished free from one under way):
        // a free of another class moves the announcement off this page. At
        // a 64 KiB OS page the victim's is the one OS page to hollow.
        let other = Layout::from_size_align(8, 8).unwrap();
        a.dealloc(a.alloc(other), other);
        pagewise::trim();
        assert!(pagewise::stats().hollow_bytes > 0, "the page was hollowed");
        (l, n, blocks[0] as usize, blocks[victim])
    }
}

/// Allocates `n` blocks of `l` (keeping them) and exits 0, saying so, if
/// any address was handed out twice (among them and `held`).
fn allocate_and_check(l: Layout, n: usize, held: Vec<usize>) {
    let mut seen: std::collections::HashSet<usize> = held.into_iter().collect();
    for _ in 0..n {
        // SAFETY: a non-zero layout; the blocks are kept.
        let p = unsafe { pagewise::Pagewise.alloc(l) } as usize;
        if !seen.insert(p) {
            println!("handed out twice: {p:#x}");
            std::process::exit(0);
        }
    }
}

fn expect_abort(case: &str, message: &str) {
    let (ok, stderr) = run_case(case);
    assert!(!ok, "{case}: the child should abort");
    assert!(stderr.contains(message), "{case}: stderr was {stderr:?}");
}

/// A report names the code that made the bad call: after its line, the
/// stack it was found at, symbolized, the allocator's own frames left out
/// (so the first frame is the program's: the child's test function, or in
/// a release build the harness's function it was inlined into).
#[test]
#[cfg(target_os = "linux")]
fn a_report_shows_the_stack_it_was_found_at() {
    for (case, message) in [
        ("foreign", "did not allocate"),
        ("interior", "not the start of an allocation"),
        ("large-double", "double free"),
    ] {
        let (ok, stderr) = run_case(case);
        assert!(!ok, "{case}: the child should abort");
        let report: Vec<&str> = stderr
            .lines()
            .skip_while(|l| !l.starts_with("pagewise: "))
            .collect();
        assert!(
            report.first().is_some_and(|l| l.contains(message)),
            "{case}: {stderr}"
        );
        assert!(
            report
                .get(1)
                .is_some_and(|l| l.starts_with("  found at (thread ")),
            "{case}: {stderr}"
        );
        let first = report.get(2).copied().unwrap_or_default();
        assert!(
            first.starts_with("    #0 0x") && first.contains('+') && !first.contains("pagewise"),
            "{case}: the first frame is the program's, named: {stderr}"
        );
        let inlined = !cfg!(debug_assertions);
        assert!(
            report[2..]
                .iter()
                .any(|l| l.contains("child_entry") || inlined && l.contains("call_once")),
            "{case}: the child's function is on the stack: {stderr}"
        );
    }
}

/// Under the heap profiler, a report at an address in a block it sampled
/// says where that block was allocated and, if it was, freed (every
/// allocation is sampled at `PAGEWISE_PROF_SAMPLE=1`); without it, nothing
/// more is said.
#[test]
#[cfg(target_os = "linux")]
fn a_report_in_a_sampled_block_says_where_it_was_allocated_and_freed() {
    let prof = [("PAGEWISE_PROF", "1"), ("PAGEWISE_PROF_SAMPLE", "1")];
    let report = |case: &str, env: &[(&str, &str)]| {
        let (ok, stderr) = run_case_with(case, env);
        assert!(!ok, "{case}: the child should abort");
        let lines: Vec<String> = stderr
            .lines()
            .skip_while(|l| !l.starts_with("pagewise: "))
            .map(str::to_owned)
            .collect();
        (lines, stderr)
    };
    // The lines after the one that starts with `head`, up to the next
    // heading (a line with no frame).
    let part = |lines: &[String], head: &str| -> Option<Vec<String>> {
        let at = lines.iter().position(|l| l.starts_with(head))?;
        Some(
            lines[at + 1..]
                .iter()
                .take_while(|l| l.starts_with("    #"))
                .cloned()
                .collect(),
        )
    };

    let (lines, stderr) = report("sampled-large-double", &prof);
    assert!(lines[0].contains("double free"), "{stderr}");
    let block = lines
        .iter()
        .find(|l| l.contains("sampled by the heap profiler"))
        .unwrap_or_else(|| panic!("no sampled block: {stderr}"));
    // The block as pagewise gave it: 1 MiB, or in the hardened build the
    // bytes between its guard pages.
    assert!(
        block.contains(" is 0 bytes into a freed ") && block.contains("-byte block at 0x"),
        "{stderr}"
    );
    let allocated = part(&lines, "  allocated by thread ").expect(&stderr);
    assert!(
        allocated
            .first()
            .is_some_and(|f| f.contains("sampled_make")),
        "the allocation's first frame is the program's: {stderr}"
    );
    // One thread did it all: the one named first.
    let thread = lines[1]
        .strip_prefix("  found at (thread ")
        .and_then(|t| t.strip_suffix("):"))
        .expect(&stderr);
    for what in ["allocated", "freed"] {
        let head = format!("  {what} by thread {thread}:");
        assert!(lines.contains(&head), "{head}: {stderr}");
    }
    let freed = part(&lines, "  freed by thread ").expect(&stderr);
    assert!(
        freed.first().is_some_and(|f| f.contains("sampled_drop")),
        "the free's first frame is the program's: {stderr}"
    );

    // The first free is the one named, whatever was freed after it.
    let (lines, stderr) = report("sampled-large-double-later", &prof);
    assert!(lines[0].contains("double free"), "{stderr}");
    let freed = part(&lines, "  freed by thread ").expect(&stderr);
    assert!(
        freed.first().is_some_and(|f| f.contains("sampled_drop")),
        "{stderr}"
    );

    // A block aligned further into its span.
    let (lines, stderr) = report("sampled-aligned-double", &prof);
    assert!(lines[0].contains("double free"), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" is 0 bytes into a freed ")),
        "{stderr}"
    );
    let freed = part(&lines, "  freed by thread ").expect(&stderr);
    assert!(
        freed.first().is_some_and(|f| f.contains("other_drop")),
        "{stderr}"
    );

    // A huge block (a run of segments of its own), freed by the child's
    // function itself.
    let (lines, stderr) = report("sampled-huge-double", &prof);
    assert!(lines[0].contains("double free"), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" is 0 bytes into a freed ") && l.contains("sampled by")),
        "{stderr}"
    );
    let allocated = part(&lines, "  allocated by thread ").expect(&stderr);
    assert!(
        allocated
            .first()
            .is_some_and(|f| f.contains("sampled_make_huge")),
        "{stderr}"
    );
    assert!(part(&lines, "  freed by thread ").is_some(), "{stderr}");

    let (lines, stderr) = report("large-interior-page", &prof);
    assert!(lines[0].contains("not the start"), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" is 4096 bytes into a live ") && l.contains("-byte block at 0x")),
        "{stderr}"
    );
    let allocated = part(&lines, "  allocated by thread ").expect(&stderr);
    assert!(
        allocated.iter().any(|f| f.contains("sampled_make")),
        "{stderr}"
    );
    assert!(part(&lines, "  freed by").is_none(), "{stderr}");

    let (lines, stderr) = report("sampled-large-double", &[]);
    assert!(lines[0].contains("double free"), "{stderr}");
    assert!(
        !stderr.contains("sampled by the heap profiler") && !stderr.contains("allocated by"),
        "not sampled, nothing to say: {stderr}"
    );
}

#[test]
fn an_interior_page_of_a_large_block_is_no_double_free() {
    for case in ["large-interior-page", "aligned-interior-page"] {
        expect_abort(
            case,
            "pagewise: free of a pointer that is not the start of an allocation",
        );
    }
}

#[test]
fn foreign_pointer_aborts() {
    expect_abort(
        "foreign",
        "pagewise: free of a pointer pagewise did not allocate",
    );
}

#[test]
fn the_first_byte_past_a_segment_aborts() {
    expect_abort("segment-end", "pagewise: free of a pointer");
}

#[test]
fn immediate_double_free_aborts() {
    expect_abort("double", "pagewise: double free");
}

#[test]
fn interior_pointer_aborts() {
    expect_abort("interior", "not the start of an allocation");
}

#[test]
fn double_free_in_a_class_cached_one_slot_at_a_time_aborts_at_the_second_free() {
    // Once passed the slot on to the transfer cache and cached it again:
    // the process then ended normally with the slot in both.
    expect_abort("big-slot-double", "pagewise: double free");
}

#[test]
fn a_last_double_free_whose_first_copy_went_to_the_transfer_cache_aborts_at_exit() {
    expect_abort("big-slot-double-between", "pagewise: double free");
}

#[test]
fn large_double_free_aborts() {
    expect_abort("large-double", "pagewise: double free");
}

#[test]
fn huge_double_free_aborts() {
    expect_abort("huge-double", "pagewise: double free");
}

#[test]
fn freeing_into_the_wrong_heap_aborts() {
    expect_abort("wrong-heap", "belongs to another pagewise heap");
}

#[test]
fn freeing_an_owned_heaps_block_through_the_global_allocator_aborts() {
    expect_abort("owned-via-global", "belongs to another pagewise heap");
}

#[test]
fn freeing_an_owned_heaps_large_block_through_the_global_allocator_aborts() {
    expect_abort("owned-large-via-global", "belongs to another pagewise heap");
}

#[test]
fn freeing_an_owned_heaps_huge_block_through_the_global_allocator_aborts() {
    expect_abort("owned-huge-via-global", "belongs to another pagewise heap");
}

#[test]
fn a_double_free_by_a_thread_without_a_heap_aborts() {
    expect_abort("double-heapless", "pagewise: double free");
}

#[test]
fn a_double_free_with_another_free_between_aborts() {
    expect_abort("double-with-another-between", "pagewise: double free");
}

#[test]
fn a_double_free_after_the_slot_left_the_cache_aborts() {
    expect_abort("double-after-the-cache-flushed", "pagewise: double free");
}

#[test]
fn a_double_free_whose_page_then_empties_aborts() {
    expect_abort("double-then-page-empties", "pagewise: double free");
}

#[test]
fn a_double_free_whose_copies_both_go_home_aborts() {
    expect_abort("double-both-copies-home", "pagewise: double free");
}

#[test]
fn a_double_free_of_a_slot_whose_os_page_was_purged_aborts() {
    expect_abort(
        "double-after-its-os-page-was-purged",
        "pagewise: double free",
    );
}

#[test]
fn a_double_free_of_a_purged_slot_then_allocating_at_once_aborts() {
    expect_abort(
        "double-after-its-os-page-was-purged-then-reused",
        "pagewise: double free",
    );
}

#[test]
fn a_double_free_of_a_purged_slot_by_another_thread_aborts() {
    expect_abort(
        "double-after-its-os-page-was-purged-on-another-thread",
        "pagewise: double free",
    );
}

#[test]
fn a_double_free_of_a_purged_slot_by_a_thread_without_a_heap_aborts() {
    expect_abort(
        "double-after-its-os-page-was-purged-by-a-thread-without-a-heap",
        "pagewise: double free",
    );
}

#[test]
fn a_double_free_from_another_thread_aborts() {
    expect_abort("double-on-another-thread", "pagewise: double free");
}

#[test]
fn resizing_a_global_block_in_an_owned_heap_aborts() {
    expect_abort(
        "global-via-owned-realloc",
        "belongs to another pagewise heap",
    );
}

#[test]
fn a_stale_pointer_into_a_remade_page_aborts_on_the_uncached_path() {
    expect_abort("stale-into-remade-page", "pagewise: double free");
}
