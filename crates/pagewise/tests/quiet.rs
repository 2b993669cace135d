//! A process that has gone quiet still gives memory back: the background
//! purger, not the program's own calls, moves the decay forward. Runs in a
//! child process so the global allocator reads `PAGEWISE_DECAY_MS` and
//! `PAGEWISE_BACKGROUND` at start.
//!
//! The child only measures and reports; the parent asserts. The same child,
//! with the same idle period, runs twice: with the purger (the retained
//! pages must be purged) and without it (the control: the pages must still
//! be retained, or the first run proves nothing about the purger).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::hint::black_box;

const CHILD: &str = "PAGEWISE_TEST_QUIET_CHILD";
/// Bytes the child frees before going quiet.
const FREED: u64 = 8 << 20;
/// The decay delay: long enough that a loaded machine does not let it pass
/// between the child's free and its first look (which then finds the pages
/// purged already, and proves nothing).
const DECAY_MS: u64 = 400;

/// What the child saw, before and after its idle period.
#[derive(Debug)]
struct Report {
    running_before: bool,
    running_after: bool,
    retained_before: u64,
    retained_after: u64,
    madvise_before: u64,
    madvise_after: u64,
    purged_before: u64,
    purged_after: u64,
}

/// Runs in the child only (does nothing in a normal test run): frees 8 MiB,
/// stays away from the allocator for 6 decay delays, prints what it saw.
#[test]
fn child_entry() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    // black_box: the optimiser may not drop an allocation nobody reads.
    let v = black_box(vec![7u8; FREED as usize]);
    drop(v);
    // The free asked for the purger (if enabled); this allocation starts it
    // at the latest.
    let keep = black_box(Box::new(1u64));
    let before = pagewise::stats();
    let running_before = pagewise::purger::running();
    // Quiet: no allocator call for well over the decay delay.
    std::thread::sleep(std::time::Duration::from_millis(6 * DECAY_MS));
    let after = pagewise::stats();
    let running_after = pagewise::purger::running();
    drop(keep);
    println!(
        "quiet-report {} {} {} {} {} {} {} {}",
        running_before as u8,
        running_after as u8,
        before.retained_bytes,
        after.retained_bytes,
        before.syscalls.madvise,
        after.syscalls.madvise,
        before.purged_bytes,
        after.purged_bytes,
    );
}

/// Runs the child with `PAGEWISE_DECAY_MS` at [`DECAY_MS`], and `PAGEWISE_BACKGROUND=0`
/// if `background` is false.
fn run_child(background: bool) -> Report {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_DECAY_MS", DECAY_MS.to_string())
        .env_remove("PAGEWISE_RETAIN_MAX")
        .env_remove("PAGEWISE_PURGE");
    if background {
        cmd.env_remove("PAGEWISE_BACKGROUND");
    } else {
        cmd.env("PAGEWISE_BACKGROUND", "0");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("quiet-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report from the child:\n{stdout}\n{stderr}"));
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!(f.len(), 8, "{line}");
    Report {
        running_before: f[0] == 1,
        running_after: f[1] == 1,
        retained_before: f[2],
        retained_after: f[3],
        madvise_before: f[4],
        madvise_after: f[5],
        purged_before: f[6],
        purged_after: f[7],
    }
}

#[test]
fn an_idle_process_purges_after_the_decay_delay() {
    let r = run_child(true);
    assert!(
        r.running_before && r.running_after,
        "the purger runs: {r:?}"
    );
    assert!(
        r.retained_before >= FREED,
        "the freed pages were retained: {r:?}"
    );
    assert_eq!(r.retained_after, 0, "purged while idle: {r:?}");
    assert!(r.madvise_after > r.madvise_before, "{r:?}");
    assert!(r.purged_after - r.purged_before >= FREED, "{r:?}");
}

#[test]
fn without_the_purger_an_idle_process_keeps_its_pages() {
    // The control: the same child and idle period without the purger. The
    // pages must still be retained afterwards, or the test above would pass
    // whoever purged them.
    let r = run_child(false);
    assert!(
        !r.running_before && !r.running_after,
        "PAGEWISE_BACKGROUND=0 starts no purger: {r:?}"
    );
    assert!(
        r.retained_before >= FREED,
        "the freed pages were retained: {r:?}"
    );
    assert_eq!(
        r.retained_after, r.retained_before,
        "nothing purged while idle: {r:?}"
    );
    assert_eq!(r.madvise_after, r.madvise_before, "{r:?}");
    assert_eq!(r.purged_after, r.purged_before, "{r:?}");
}
