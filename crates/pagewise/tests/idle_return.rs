//! Memory goes back when the program goes quiet, whoever freed it and
//! whichever thread owned it (the quiet-program scenarios, under the
//! global allocator). Each scenario runs in a child process with a 100 ms decay;
//! the child reports its resident set (`/proc/self/statm`) before the
//! scenario and after an idle period of ten decay delays, and the parent
//! asserts that what stays resident is within 2 MiB of where it started
//! (nothing is live at the end), and that `stats()` counted nothing live
//! right after the frees. The blocked-producer scenarios keep the thread
//! that owns the pages alive, parked in a channel, through the quiet (or
//! through a `trim()` from the main thread).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::hint::black_box;

const CHILD: &str = "PAGEWISE_TEST_IDLE_RETURN_CHILD";
const MIB: u64 = 1 << 20;
/// Resident bytes a quiet program may keep above its starting point: the
/// current pages and thread caches of the threads still alive.
const SLACK: u64 = 2 * MIB;

/// The peak resident set (`VmHWM` of /proc/self/status), in bytes.
fn peak_resident() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

fn resident() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split(' ').nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// 8,192 blocks of 6,000 bytes, written, then all freed by this thread.
fn blocks_written_then_freed() {
    let v: Vec<Vec<u8>> = (0..8192).map(|i| vec![i as u8 | 1; 6000]).collect();
    drop(black_box(v));
}

/// (a) one thread allocates, writes, frees everything, and goes quiet.
fn one_thread() {
    blocks_written_then_freed();
}

/// (b) eight threads each do the same and exit; the main thread is quiet.
fn threads_exit() {
    let t: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(blocks_written_then_freed))
        .collect();
    for t in t {
        t.join().unwrap();
    }
}

/// (c) a producer allocates 64 MiB of 1 KiB objects and exits; the main
/// thread frees them (into the exited thread's heap).
fn handoff() {
    let objects = std::thread::spawn(|| {
        (0..65536)
            .map(|i| vec![i as u8 | 1; 1024].into_boxed_slice())
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    drop(black_box(objects));
}

/// (e) sparse survivors: 32 MiB of 64-byte objects, of which one per
/// 64 KiB slab page stays live and the rest are freed. Every slab page
/// still holds a live object, so only its free OS pages can go back
/// (hollowing): 2 MiB of OS pages hold the survivors.
fn sparse_survivors() -> Vec<Box<[u8]>> {
    let all: Vec<Box<[u8]>> = (0..SPARSE_OBJECTS)
        .map(|i| vec![i as u8 | 1; 64].into_boxed_slice())
        .collect();
    let mut keep = Vec::with_capacity(SPARSE_OBJECTS / 1024);
    for (i, b) in all.into_iter().enumerate() {
        if i % 1024 == 0 {
            keep.push(b);
        }
    }
    keep
}

const SPARSE_OBJECTS: usize = 512 * 1024;

/// (f) clustered survivors, as a CPython program's phases leave them:
/// 400,000 objects of 16 to 512 bytes, of which runs of 256 consecutive
/// allocations survive, one run in ten. Returns the survivors and the OS
/// pages that hold a live byte (the page floor: no page-granular allocator
/// can keep fewer).
fn clustered_survivors() -> (Vec<Box<[u8]>>, u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut keep = Vec::with_capacity(40_960);
    let mut all = Vec::with_capacity(400_000);
    for i in 0..400_000usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = (x % 63 + 2) as usize * 8;
        let b = vec![i as u8 | 1; size].into_boxed_slice();
        if (i / 256) % 10 == 0 {
            keep.push(b);
        } else {
            all.push(b);
        }
    }
    drop(black_box(all));
    // The page pagewise uses (`PAGEWISE_OS_PAGE` in the 16 and 64 KiB runs).
    let page = pagewise::layout::os_page();
    let mut pages: Vec<usize> = keep
        .iter()
        .flat_map(|b| {
            let a = b.as_ptr() as usize;
            (a / page)..=((a + b.len() - 1) / page)
        })
        .collect();
    pages.sort_unstable();
    pages.dedup();
    (keep, pages.len() as u64 * page as u64)
}
/// The OS pages the sparse survivors keep resident (one each, of the page
/// pagewise uses: `PAGEWISE_OS_PAGE` in the suites at 16 and 64 KiB).
fn sparse_kept() -> u64 {
    (SPARSE_OBJECTS as u64 / 1024) * pagewise::layout::os_page() as u64
}

/// 64 MiB of 1 KiB objects made by a producer thread that then blocks
/// (no allocator call) until the returned function lets it go.
fn objects_of_a_blocked_producer() -> (Vec<Box<[u8]>>, impl FnOnce()) {
    let (objects_tx, objects_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let producer = std::thread::spawn(move || {
        let objects: Vec<_> = (0..65536)
            .map(|i| vec![i as u8 | 1; 1024].into_boxed_slice())
            .collect();
        objects_tx.send(objects).unwrap();
        let _ = go_rx.recv();
    });
    let objects = objects_rx.recv().unwrap();
    (objects, move || {
        drop(go_tx);
        producer.join().unwrap();
    })
}

/// Runs in the child only: the scenario named by `CHILD`, then the quiet.
#[test]
fn child_entry() {
    let Ok(which) = std::env::var(CHILD) else {
        return;
    };
    // Warm up what the harness itself needs, so the baseline holds it.
    let committed_before = pagewise::stats().committed_bytes;
    let before = resident();
    let mut release_producer: Option<Box<dyn FnOnce()>> = None;
    let mut trim = false;
    let mut survivors = Vec::new();
    match which.as_str() {
        "sparse-survivors" => survivors = sparse_survivors(),
        "clustered-survivors" => {
            // On a thread that then exits: a live thread's caches and
            // current pages are its own until its next slow path (at most
            // 128 KiB of slots per class; 1,481 slots here kept 2.4 MiB of
            // OS pages resident when the main thread did this and idled).
            let (keep, floor) = std::thread::spawn(clustered_survivors).join().unwrap();
            survivors = keep;
            println!("floor-report {floor}");
        }
        "one-thread" => one_thread(),
        "threads-exit" => threads_exit(),
        "handoff" => handoff(),
        "handoff-blocked" | "handoff-blocked-trim" => {
            let (objects, release) = objects_of_a_blocked_producer();
            drop(black_box(objects));
            release_producer = Some(Box::new(release));
            trim = which.ends_with("trim");
        }
        other => panic!("unknown scenario {other}"),
    }
    let freed = resident();
    let live = pagewise::stats().live_bytes;
    if trim {
        // No quiet: `trim()` gives it back before it returns.
        pagewise::trim();
    } else {
        // Quiet: no allocator call for ten decay delays.
        std::thread::sleep(std::time::Duration::from_millis(1000));
    }
    let after = resident();
    let committed_after = pagewise::stats().committed_bytes;
    let peak = peak_resident();
    println!(
        "idle-report {before} {freed} {after} {live} {committed_before} {committed_after} {peak}"
    );
    if let Some(release) = release_producer {
        release();
    }
    for s in &survivors {
        assert!(
            s.iter().all(|&b| b == s[0] && b & 1 == 1),
            "a survivor changed"
        );
    }
    drop(black_box(survivors));
}

/// What a child reported: resident bytes before the scenario, right after
/// the frees and after the idle period; the live bytes `stats()` reported
/// right after the frees; pagewise's committed bytes before and after.
struct Report {
    before: u64,
    freed: u64,
    /// The process's peak resident set (VmHWM).
    peak: u64,
    after: u64,
    live: u64,
    committed_before: u64,
    committed_after: u64,
}

/// Runs `scenario` in a child and returns its report.
fn run(scenario: &str) -> Report {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("PAGEWISE_DECAY_MS", "100")
        .env_remove("PAGEWISE_BACKGROUND")
        .env_remove("PAGEWISE_RETAIN_MAX")
        .env_remove("PAGEWISE_PURGE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("idle-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report from the child:\n{stdout}\n{stderr}"));
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    Report {
        before: f[0],
        freed: f[1],
        after: f[2],
        live: f[3],
        committed_before: f[4],
        committed_after: f[5],
        peak: f[6],
    }
}

fn assert_given_back(scenario: &str, freed_at_least: u64) {
    assert_given_back_but(scenario, freed_at_least, 0);
}

/// As `assert_given_back`, with `kept` resident bytes that must stay: the
/// OS pages holding what is still live.
fn assert_given_back_but(scenario: &str, freed_at_least: u64, kept: u64) {
    let r = run(scenario);
    let (before, freed, after, live) = (r.before, r.freed, r.after, r.live);
    let mib = |b: u64| b as f64 / MIB as f64;
    let report = format!(
        "{scenario}: resident {:.1} MiB before, {:.1} right after the frees, {:.1} after the quiet; \
         committed {:.1} MiB before, {:.1} after the quiet",
        mib(before),
        mib(freed),
        mib(after),
        mib(r.committed_before),
        mib(r.committed_after),
    );
    // The control: the scenario did make memory resident that the frees
    // alone did not give back, or the check below proves nothing. With
    // survivors, pages out of use already give back their free OS pages
    // while the frees go on (the decay is 100 ms): what the scenario made
    // resident is then its peak.
    let made = if kept > 0 { r.peak } else { freed };
    assert!(made >= before + freed_at_least, "control: {report}");
    // Nothing was live after the frees, whichever heap they went to.
    assert!(
        live <= SLACK,
        "{report}; stats() said {:.1} MiB live",
        mib(live)
    );
    // What pagewise itself holds went back.
    assert!(
        r.committed_after <= r.committed_before + kept + SLACK,
        "{report}"
    );
    if reexec::emulated() {
        // Under qemu-user, /proc/self/statm is the emulator's resident set:
        // it also holds qemu's translated code and the state of every guest
        // thread it ran, which the host's malloc keeps after the threads
        // exit (about 11 MiB after threads-exit, 2.3 after handoff, on
        // aarch64, with pagewise's committed bytes back at 0.1 MiB). So the
        // exact check gives way to the committed check above and a loose
        // one: three quarters of what the scenario made resident went back.
        // Straight to stderr, past libtest's capture, so the change shows.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "idle_return: exact resident-set check SKIPPED under emulation \
             (PAGEWISE_TEST_RUNNER is set; committed bytes checked instead): {report}"
        );
        assert!(
            after.saturating_sub(before) <= (freed - before) / 4,
            "{report}"
        );
        return;
    }
    assert!(after <= before + kept + SLACK, "{report}");
}

#[test]
fn one_thread_that_frees_everything_and_goes_quiet_gives_it_back() {
    assert_given_back("one-thread", 16 * MIB);
}

#[test]
fn threads_that_exit_give_back_what_they_freed() {
    assert_given_back("threads-exit", 16 * MIB);
}

#[test]
fn objects_of_an_exited_thread_freed_by_another_go_back() {
    assert_given_back("handoff", 32 * MIB);
}

#[test]
fn objects_of_a_blocked_thread_freed_by_another_go_back() {
    assert_given_back("handoff-blocked", 32 * MIB);
}

#[test]
fn trim_gives_back_what_was_freed_into_a_blocked_thread_heap() {
    assert_given_back("handoff-blocked-trim", 32 * MIB);
}

#[test]
fn free_os_pages_of_pages_that_still_hold_live_objects_go_back() {
    assert_given_back_but("sparse-survivors", 24 * MIB, sparse_kept());
}

/// Hollowing's bar: after the decay delay, a clustered-survivor
/// workload's resident memory is within 1/0.9 of its page floor (the OS
/// pages holding a live byte), so its utilization is at least 0.9 of the
/// floor's.
#[test]
fn clustered_survivors_come_within_a_tenth_of_the_page_floor() {
    let out = reexec::this_binary()
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, "clustered-survivors")
        .env("PAGEWISE_DECAY_MS", "100")
        .env_remove("PAGEWISE_BACKGROUND")
        .env_remove("PAGEWISE_RETAIN_MAX")
        .env_remove("PAGEWISE_PURGE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |tag: &str| -> Vec<u64> {
        let line = stdout
            .lines()
            .find_map(|l| l.split_once(tag).map(|(_, r)| r))
            .unwrap();
        line.split(' ').map(|x| x.parse().unwrap()).collect()
    };
    let floor = field("floor-report ")[0];
    let r = field("idle-report ");
    let (before, freed, after, peak) = (r[0], r[1], r[2], r[6]);
    let mib = |b: u64| b as f64 / MIB as f64;
    let report = format!(
        "resident {:.1} MiB before, {:.1} after the frees (peak {:.1}), {:.1} after the quiet; page floor {:.1} MiB",
        mib(before),
        mib(freed),
        mib(peak),
        mib(after),
        mib(floor)
    );
    // The control: the workload made well above the floor resident (its
    // peak: pages out of use give back their free OS pages while the frees
    // go on, with the 100 ms decay)
    // (twice it; at 64 KiB pages, where the floor counts whole 64 KiB pages
    // and one-slice slab pages cannot be hollowed, above the bound below).
    let control = if pagewise::layout::os_page() < 64 << 10 {
        floor * 2
    } else {
        floor * 10 / 9 + MIB
    };
    assert!(peak - before > control, "control: {report}");
    if reexec::emulated() {
        return; // qemu's own resident set hides the figure (see above)
    }
    // 1 MiB for the survivors' vector and the test's own bookkeeping.
    assert!(after - before <= floor * 10 / 9 + MIB, "{report}");
}
