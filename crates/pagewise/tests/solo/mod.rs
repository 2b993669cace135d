//! Runs a test alone in a child process: this test binary re-executed with
//! `--exact NAME --test-threads=1`.
//!
//! libtest starts every test on a thread of its own, and that thread
//! allocates (its output-capture buffer) before the test body runs: a test
//! running beside the one that counts heaps or exact live bytes may adopt
//! an exited thread's heap at any moment, and frees into that heap then
//! count as live until its new owner collects them. Counting tests are
//! exact only with no other test in the process.

use std::process::Stdio;
use std::time::{Duration, Instant};

const CHILD: &str = "PAGEWISE_TEST_SOLO";

/// Waits until libtest's main thread sleeps, waiting for this test to end:
/// it allocates a few small blocks (its channel's waker) after starting the
/// test's thread, which would otherwise land in the test's counts. The
/// thread must be seen asleep throughout 20 ms: a moment's sleep on a
/// contended lock before those allocations does not count. Bounded: after
/// 10 s the test goes ahead (and an exact count may then fail, loudly).
fn settle() {
    let stat = format!("/proc/self/task/{}/stat", std::process::id());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut asleep_since: Option<Instant> = None;
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(&stat).unwrap();
        // "pid (comm) S ...": the state follows the last parenthesis.
        let state = text[text.rfind(')').unwrap() + 1..].trim_start().as_bytes()[0];
        if state != b'S' {
            asleep_since = None;
        } else if asleep_since.get_or_insert_with(Instant::now).elapsed() >= SETTLED {
            return;
        }
        std::thread::yield_now();
    }
}

/// How long libtest's main thread must be seen asleep (see [`settle`]).
const SETTLED: Duration = Duration::from_millis(20);

/// Runs `body` in a child process where `name` is the only test, and fails
/// if the child fails, hangs past `limit` (killed), or ran no test. In the
/// child itself, runs `body`.
pub fn alone(name: &str, limit: Duration, body: impl FnOnce()) {
    if let Ok(n) = std::env::var(CHILD) {
        assert_eq!(n, name, "--exact ran another test");
        settle();
        body();
        return;
    }
    let mut child = crate::reexec::this_binary()
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).unwrap();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    let Some(status) = status else {
        panic!("{name}: still running after {limit:?}, killed (a hang)\n{stdout}\n{stderr}");
    };
    assert!(
        status.success() && stdout.contains("1 passed"),
        "{name} in its own process: {status}\n{stdout}\n{stderr}"
    );
    // Show what the child printed (captured by libtest unless --nocapture).
    print!("{stdout}");
    eprint!("{stderr}");
}
