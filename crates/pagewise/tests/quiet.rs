//! A process that has gone quiet still gives memory back: the background
//! purger, not the program's own calls, moves the decay forward. Runs in a
//! child process so the global allocator reads `PAGEWISE_DECAY_MS` at start.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::process::Command;

const CHILD: &str = "PAGEWISE_QUIET_CHILD";

#[test]
fn child_entry() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let v = vec![7u8; 8 << 20];
    drop(v);
    // The free asked for the purger; this allocation starts it.
    let keep = std::hint::black_box(Box::new(1u64));
    assert!(pagewise::purger::running(), "the purger started");
    let before = pagewise::stats();
    assert!(before.retained_bytes >= 8 << 20, "{before:?}");
    // Quiet: no allocator call for well over the decay delay.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let after = pagewise::stats();
    assert_eq!(after.retained_bytes, 0, "{after:?}");
    assert!(after.syscalls.madvise > before.syscalls.madvise);
    assert!(after.purged_bytes >= 8 << 20);
    drop(keep);
    println!("quiet-ok");
}

#[test]
fn an_idle_process_purges_after_the_decay_delay() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_DECAY_MS", "100")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("quiet-ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn without_the_purger_an_idle_process_keeps_its_pages() {
    // The control: with PAGEWISE_BACKGROUND=0 the same child fails its check.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_DECAY_MS", "100")
        .env("PAGEWISE_BACKGROUND", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
}
