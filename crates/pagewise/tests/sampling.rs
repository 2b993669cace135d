//! The sampler's countdowns, which decide which allocations the heap
//! profiler samples and which the guard pool takes: at a mean gap of 256
//! KiB the live bytes of small and of large objects are estimated within a
//! quarter; about one allocation in `PAGEWISE_GUARD_SAMPLE` is guarded, a
//! block of exactly an OS page included; and which allocations are
//! sampled or guarded differs from one process to the next. Each case runs in a child (this
//! binary re-executed), since both settings are read once per process.

mod reexec;

use std::hint::black_box;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

const CASE: &str = "PAGEWISE_TEST_SAMPLING_CASE";

/// 64 MiB of 4,000-byte objects (about 256 samples at the mean below:
/// a standard error of 6 %).
const SMALL: usize = 16_777;
/// 60 MiB of 300 KiB objects (each sampled with probability 0.69: a
/// standard error of 5 %).
const LARGE: usize = 200;

#[test]
fn child_entry() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    match case.as_str() {
        "profile" => profile_rates(),
        "large-allocated" => large_allocated(),
        "guard" => guard_rate(),
        "guard-page" => guard_page(),
        _ => unreachable!(),
    }
    std::process::exit(0);
}

/// The live bytes the profile estimates for what `f` allocates and keeps,
/// and the indices of the allocations that were sampled (`f` calls
/// `mark` after each one).
fn estimate<T>(f: impl FnOnce(&mut dyn FnMut(usize)) -> T) -> (f64, Vec<usize>, T) {
    let live = pagewise::profile::live_bytes;
    let before = live();
    let mut last = before;
    let mut sampled = Vec::with_capacity(4096);
    let kept = f(&mut |i| {
        let now = live();
        if now != last && sampled.len() < sampled.capacity() {
            sampled.push(i);
        }
        last = now;
    });
    ((live() - before) as f64, sampled, kept)
}

fn profile_rates() {
    assert_eq!(pagewise::profile::sample_bytes(), 256 << 10);
    let (small, sampled, keep_small) = estimate(|mark| {
        let mut v = Vec::with_capacity(SMALL);
        for i in 0..SMALL {
            v.push(black_box(vec![1u8; 4000]));
            mark(i);
        }
        v
    });
    let (large, _, keep_large) = estimate(|mark| {
        let mut v = Vec::with_capacity(LARGE);
        for i in 0..LARGE {
            v.push(black_box(vec![2u8; 300 << 10]));
            mark(i);
        }
        v
    });
    let small_truth = (SMALL * (4000 + 24)) as f64;
    let large_truth = (LARGE * ((300 << 10) + 24)) as f64;
    println!(
        "small {:.3} large {:.3}",
        small / small_truth,
        large / large_truth
    );
    println!("sampled {sampled:?}");
    assert!(
        (small / small_truth - 1.0).abs() < 0.25,
        "small: {small} of {small_truth}"
    );
    assert!(
        (large / large_truth - 1.0).abs() < 0.25,
        "large: {large} of {large_truth}"
    );
    drop((keep_small, keep_large));
}

/// At a mean of 4 MiB, 4,000 allocations of 300 KiB, each freed at once:
/// the bytes allocated are estimated within a quarter (about 290 samples,
/// each of probability 0.07: a standard error of 6 %). The large objects'
/// countdown must carry what is left of a gap past each allocation it ends
/// beyond, or samples come too often or too seldom.
fn large_allocated() {
    assert_eq!(pagewise::profile::sample_bytes(), 4 << 20);
    let allocated = || {
        let mut total = 0;
        pagewise::profile::for_each_site(|s| total += s.allocated.bytes);
        total as f64
    };
    let before = allocated();
    for _ in 0..4000 {
        drop(black_box(Vec::<u8>::with_capacity(300 << 10)));
    }
    let est = allocated() - before;
    let truth = (4000 * (300 << 10)) as f64;
    println!("large allocated {:.3}", est / truth);
    assert!((est / truth - 1.0).abs() < 0.25, "{est} of {truth}");
}

fn guard_rate() {
    let rate = pagewise::guard::sample_rate();
    let guarded = || pagewise::guard::stats().allocations;
    // One in `rate` of 20,000 allocations of 64 bytes (freed at once, so
    // that the pool always has room): 400, within a quarter (a standard
    // error of 5 %).
    let before = guarded();
    let mut last = before;
    let mut which = Vec::with_capacity(64);
    for i in 0..20_000 {
        drop(black_box(Box::new([7u8; 64])));
        let now = guarded();
        if now != last && which.len() < which.capacity() {
            which.push(i);
        }
        last = now;
    }
    let n = guarded() - before;
    println!("guarded {n} of 20000 at one in {rate}");
    println!("which {which:?}");
    let want = 20_000.0 / rate as f64;
    assert!(
        (n as f64 / want - 1.0).abs() < 0.25,
        "{n} guarded, about {want} expected"
    );
}

/// At one in 1, a block of exactly an OS page is guarded (its class's slot
/// fits in a page), one a byte larger is not. Asked of the block itself:
/// the pool's counters are the process's, and a thread of the runtime
/// (the purger starting, the test harness) may allocate meanwhile.
fn guard_page() {
    assert_eq!(pagewise::guard::sample_rate(), 1);
    // pagewise's OS page (16 or 64 KiB under `PAGEWISE_OS_PAGE`).
    let page = pagewise::layout::os_page();
    let guarded = || pagewise::guard::stats().allocations;
    if pagewise::raw::good_size(page, 16) == page {
        let before = guarded();
        let p = black_box(vec![1u8; page]);
        assert!(guarded() > before, "a block of {page} bytes is not guarded");
        assert!(pagewise::guard::owns(p.as_ptr() as usize));
        drop(p);
    }
    let p = black_box(vec![1u8; page + 1]);
    assert!(
        !pagewise::guard::owns(p.as_ptr() as usize),
        "a block of {} bytes is guarded",
        page + 1
    );
    drop(p);
}

fn run(case: &str, env: &[(&str, &str)]) -> String {
    let mut c = reexec::this_binary();
    c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env_remove("PAGEWISE_PROF")
        .env_remove("PAGEWISE_PROF_SAMPLE")
        .env_remove("PAGEWISE_GUARD_SAMPLE")
        .env_remove("PAGEWISE_GUARD_SLOTS");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{case}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn small_and_large_objects_are_sampled_at_the_rate_asked_for_and_differently_each_run() {
    let env = [("PAGEWISE_PROF", "1"), ("PAGEWISE_PROF_SAMPLE", "256K")];
    let first = run("profile", &env);
    let second = run("profile", &env);
    let sampled = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("sampled "))
            .unwrap()
            .to_string()
    };
    println!("{first}{second}");
    // The gaps are drawn from a random seed: two processes doing the same
    // sample different allocations.
    assert_ne!(sampled(&first), sampled(&second));
}

#[test]
fn large_objects_allocated_and_freed_are_sampled_at_the_rate_asked_for() {
    let out = run(
        "large-allocated",
        &[("PAGEWISE_PROF", "1"), ("PAGEWISE_PROF_SAMPLE", "4M")],
    );
    println!("{out}");
}

#[test]
fn about_one_allocation_in_the_guard_rate_is_guarded_and_differently_each_run() {
    // The pool's default 64 slots: the blocks are freed at once (and
    // reading the pool's counts walks its slots).
    let env = [("PAGEWISE_GUARD_SAMPLE", "50")];
    let first = run("guard", &env);
    let second = run("guard", &env);
    println!("{first}{second}");
    let which = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("which "))
            .unwrap()
            .to_string()
    };
    assert_ne!(which(&first), which(&second));
}

#[test]
fn blocks_of_up_to_an_os_page_are_guarded() {
    run(
        "guard-page",
        &[
            ("PAGEWISE_GUARD_SAMPLE", "1"),
            ("PAGEWISE_GUARD_SLOTS", "4096"),
        ],
    );
}
