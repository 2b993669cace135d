//! Meshing (`PAGEWISE_MESH=1`) must not change what a correct program sees,
//! nor hide what an incorrect one does: each test runs a scenario in a
//! child process with meshing on and checks what a program running on
//! glibc would see. A scenario that would hang is killed after a while and
//! reported as a hang.
#![cfg(target_os = "linux")]

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::io::Read;
use std::time::{Duration, Instant};

const CHILD: &str = "PAGEWISE_TEST_MESH_SAFETY_CHILD";

fn os_page() -> usize {
    pagewise::layout::os_page()
}

/// What a scenario's process did: its exit code or signal, and its output
/// (stdout then stderr); `None` for the status if it hung.
struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    out: String,
}

/// Runs `scenario` in a child with meshing on (`env` added), killing it
/// after `limit`.
fn run(scenario: &str, env: &[(&str, &str)], limit: Duration) -> Outcome {
    run_limited(scenario, env, limit, None)
}

/// [`run`] with the file size limit (`ulimit -f`) set to `fsize` bytes.
fn run_limited(
    scenario: &str,
    env: &[(&str, &str)],
    limit: Duration,
    fsize: Option<u64>,
) -> Outcome {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut cmd = reexec::this_binary();
    if let Some(bytes) = fsize {
        // SAFETY: only setrlimit between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                set_fsize(bytes);
                Ok(())
            })
        };
    }
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("PAGEWISE_MESH", "1")
        .env("PAGEWISE_DECAY_MS", "100")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = so.read_to_string(&mut s);
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        }),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = readers.0.join().unwrap() + &readers.1.join().unwrap();
    Outcome {
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        out,
    }
}

/// Runs in the child process only.
#[test]
fn child_entry() {
    let Ok(which) = std::env::var(CHILD) else {
        return;
    };
    assert_eq!(
        pagewise::options::get("mesh"),
        Ok(1),
        "PAGEWISE_MESH=1 not taken"
    );
    match which.as_str() {
        "raw-fork" => child_raw_fork(false),
        "raw-fork-libc" => child_raw_fork(true),
        "own-handler" => child_protected_store(true),
        "stray-write" => child_protected_store(false),
        "signal-store" => child_signal_store(),
        "fork-stores" => child_fork_stores(),
        "fsize" => child_fsize(false),
        "fsize-later" => child_fsize(true),
        "double-free-meshed" => child_double_free_meshed(),
        "syscall-into-copied" => child_syscall_into_copied(),
        other => panic!("unknown scenario {other}"),
    }
}

#[cfg(target_env = "gnu")]
extern "C" {
    /// glibc's fork without the atfork handlers (2.34 and later).
    fn _Fork() -> libc::pid_t;
}

/// A fork that runs no atfork handlers: glibc's `_Fork()`, or the system
/// call itself (`clone` with only SIGCHLD, which is `fork` on every
/// architecture).
fn unprepared_fork(libc_fork: bool) -> libc::pid_t {
    if libc_fork {
        #[cfg(target_env = "gnu")]
        // SAFETY: the child only stores and exits.
        return unsafe { _Fork() };
    }
    {
        // SAFETY: as above; no new stack, so the child returns here.
        unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) as libc::pid_t }
    }
}

/// The parent's object is never the child's: a child forked without the
/// fork handlers stores into an object allocated before the fork, and the
/// parent must not see it.
fn child_raw_fork(libc_fork: bool) {
    let mut object = vec![b'p'; 64].into_boxed_slice();
    // A program that has run a while: a pass has put pagewise's SIGSEGV
    // handler in front of the Rust runtime's (as the purger's do).
    pagewise::mesh();
    let at = object.as_mut_ptr();
    let pid = unprepared_fork(libc_fork);
    if pid == 0 {
        // SAFETY: the object is the child's copy (or, wrongly, the
        // parent's): a plain store, then straight out.
        unsafe {
            core::ptr::write_volatile(at, b'c');
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let how = if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit {}", libc::WEXITSTATUS(status))
    };
    println!("raw-fork-report {} {how}", object[0] as char);
}

fn report<'a>(o: &'a Outcome, tag: &str) -> &'a str {
    o.out
        .lines()
        .find_map(|l| l.split_once(tag).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no {tag} in:\n{}", o.out))
}

/// A child of `_Fork()` or of the raw system call does not share the heap:
/// its store never reaches the parent's object, and touching the heap it
/// did not inherit ends it with one line saying why (as SIGSEGV).
#[test]
fn a_child_forked_without_the_fork_handlers_never_shares_the_heap() {
    if reexec::emulated() {
        // qemu-user does not pass madvise to the kernel.
        eprintln!("emulated: MADV_DONTFORK is not the kernel's; skipped");
        return;
    }
    let scenarios: &[&str] = if cfg!(target_env = "gnu") {
        &["raw-fork", "raw-fork-libc"]
    } else {
        &["raw-fork"]
    };
    for &scenario in scenarios {
        let o = run(scenario, &[], Duration::from_secs(60));
        assert_eq!(o.code, Some(0), "{scenario}:\n{}", o.out);
        let r = report(&o, "raw-fork-report ");
        assert!(
            r.starts_with('p'),
            "{scenario}: the child's store reached the parent: {r}"
        );
        assert!(
            r.ends_with(&format!("signal {}", libc::SIGSEGV)),
            "{scenario}: the child did not fault on the heap: {r}"
        );
        assert!(
            o.out
                .contains("pagewise: a child forked without the fork handlers"),
            "{scenario}: no line saying why:\n{}",
            o.out
        );
    }
}

/// The page the program made read-only, for its own handler.
static PROTECTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Faults the program's own handler saw.
static OWN_FAULTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The program's own SIGSEGV handler: counts the fault and makes the page
/// it protected writable again.
extern "C" fn own_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    use std::sync::atomic::Ordering::Relaxed;
    let page = PROTECTED.load(Relaxed);
    // SAFETY: the kernel's siginfo; our own page made writable again.
    unsafe {
        let addr = (*info).si_addr() as usize;
        if addr.wrapping_sub(page) >= os_page() {
            libc::_exit(3);
        }
        OWN_FAULTS.fetch_add(1, Relaxed);
        libc::mprotect(
            page as *mut libc::c_void,
            os_page(),
            libc::PROT_READ | libc::PROT_WRITE,
        );
    }
}

/// A program that makes one of its heap buffers read-only and stores to
/// it: with its own SIGSEGV handler (installed before pagewise's first
/// pass, so pagewise's goes in front of it), the handler must run; with
/// none, the store must kill the process (not retry forever).
fn child_protected_store(own: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    if own {
        // SAFETY: a valid handler with the SA_SIGINFO signature.
        unsafe {
            let mut action: libc::sigaction = core::mem::zeroed();
            action.sa_sigaction = own_handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGSEGV, &action, core::ptr::null_mut()),
                0
            );
        }
    }
    // Sparse pages, meshed: pagewise's handler goes in front.
    let keep: Vec<Box<[u8]>> = {
        let all: Vec<Box<[u8]>> = (0..4096)
            .map(|_| vec![1u8; 64].into_boxed_slice())
            .collect();
        all.into_iter().step_by(64).collect()
    };
    pagewise::mesh();
    let layout = std::alloc::Layout::from_size_align(4 * os_page(), os_page()).unwrap();
    // SAFETY: a valid layout; the buffer is freed below.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buf.is_null());
    PROTECTED.store(buf as usize, Relaxed);
    // SAFETY: a page of our own buffer, made read-only, then stored to.
    unsafe {
        assert_eq!(libc::mprotect(buf.cast(), os_page(), libc::PROT_READ), 0);
        core::ptr::write_volatile(buf, 9);
        assert_eq!(*buf, 9);
        std::alloc::dealloc(buf, layout);
    }
    drop(keep);
    println!("protected-report {}", OWN_FAULTS.load(Relaxed));
}

/// A write-protection fault pagewise did not cause is not the barrier's:
/// the program's own handler runs, and without one the process dies of
/// the fault as it would on glibc (not retrying the store forever).
#[test]
fn a_fault_the_barrier_did_not_cause_reaches_the_program() {
    let o = run("own-handler", &[], Duration::from_secs(10));
    assert_eq!(
        o.code,
        Some(0),
        "with its own handler (hung: {}):\n{}",
        o.code.is_none() && o.signal.is_none(),
        o.out
    );
    assert_eq!(
        report(&o, "protected-report "),
        "1",
        "the program's handler ran once"
    );
    let o = run("stray-write", &[], Duration::from_secs(10));
    assert_eq!(
        (o.code, o.signal),
        (None, Some(libc::SIGSEGV)),
        "a stray write to a read-only heap page must crash, not spin:\n{}",
        o.out
    );
}

/// Objects a signal handler stores into (the survivors of sparse pages).
const TARGETS: usize = 2048;
static TARGET: [std::sync::atomic::AtomicPtr<u8>; TARGETS] =
    [const { std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()) }; TARGETS];
static HANDLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A program's signal handler that stores into heap objects.
extern "C" fn store_into_objects(_: libc::c_int) {
    use std::sync::atomic::Ordering::Relaxed;
    for t in &TARGET {
        let p = t.load(Relaxed);
        if !p.is_null() {
            // SAFETY: a live object of the program, never freed while
            // signals come.
            unsafe { core::ptr::write_volatile(p, 5) };
        }
    }
    HANDLED.fetch_add(1, Relaxed);
}

fn block_sigusr1(how: libc::c_int) {
    // SAFETY: a valid set; the calling thread's mask only.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(how, &set, core::ptr::null_mut());
    }
}

/// The purger meshes sparse pages while SIGUSR1 keeps coming, whose handler
/// stores into the objects being meshed; every thread of the program
/// blocks SIGUSR1, so a purger that does not block it runs the handler,
/// and a store into a page it is copying waits for its own copy.
fn child_signal_store() {
    use std::sync::atomic::Ordering::Relaxed;
    // SAFETY: a valid handler for a signal the program owns.
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            store_into_objects as *const () as libc::sighandler_t,
        )
    };
    // Memory retained and freed: the purger starts (with the signal open).
    drop((0..64).map(|_| vec![0u8; 1 << 16]).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(100));
    assert!(pagewise::purger::running(), "no purger");
    block_sigusr1(libc::SIG_BLOCK);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                // SAFETY: plain system calls.
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    // Rounds of sparse pages for the purger's passes. The purger meshes a
    // heap once it has taken no new slab page for a decay period (20 ms
    // here): each round allocates, frees all but one object in 64, then
    // goes quiet, the signals still coming, until a pass has meshed more
    // or 200 ms have passed (the parent checks that something was). A
    // meshed page's free slots are withheld, so the next round takes
    // fresh pages.
    let mut kept = Vec::new();
    for round in 0..TARGETS / 64 {
        let all: Vec<Box<[u8]>> = (0..4096)
            .map(|_| vec![1u8; 64].into_boxed_slice())
            .collect();
        for (i, mut b) in all.into_iter().enumerate() {
            if i % 64 == 0 {
                TARGET[round * 64 + i / 64].store(b.as_mut_ptr(), Relaxed);
                kept.push(b);
            }
        }
        let before = pagewise::stats().meshed_bytes;
        let quiet = std::time::Instant::now();
        while pagewise::stats().meshed_bytes == before
            && quiet.elapsed() < Duration::from_millis(200)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, Relaxed);
    sender.join().unwrap();
    // The signals left pending come in here.
    block_sigusr1(libc::SIG_UNBLOCK);
    for t in &TARGET {
        t.store(std::ptr::null_mut(), Relaxed);
    }
    let s = pagewise::stats();
    println!(
        "signal-report {} {}",
        HANDLED.load(Relaxed),
        s.meshed_bytes > 0
    );
    drop(kept);
}

/// The purger blocks the program's signals: a handler that stores into
/// heap objects never runs on it while it copies them (it would wait for
/// its own copy forever).
#[test]
fn the_purger_never_runs_a_handler_of_the_program() {
    let o = run(
        "signal-store",
        &[("PAGEWISE_DECAY_MS", "20")],
        Duration::from_secs(30),
    );
    assert_eq!(
        o.code,
        Some(0),
        "hung: {}\n{}",
        o.code.is_none() && o.signal.is_none(),
        o.out
    );
    let r = report(&o, "signal-report ");
    assert!(
        r.ends_with("true"),
        "nothing meshed: the test proves nothing: {r}"
    );
}

/// Odd while the main thread is in `fork()`.
static FORKING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the kernel can write a byte at `p` now (a `read()` from
/// /dev/zero into it: `EFAULT` while the page is read-only).
fn kernel_can_write(zero: i32, p: *mut u8) -> bool {
    // SAFETY: one byte of the caller's own buffer.
    unsafe { libc::read(zero, p.cast(), 1) == 1 }
}

/// A thread stores into one object, and has the kernel write into
/// another (`read()` from /dev/zero), while the process forks a meshed
/// heap ten times: the heap's own pages are never made read-only for the
/// copy (only group pages are copied; the child inherits the rest), so
/// neither the store nor the kernel's write ever meets a read-only page
/// (a `read()` into one would fail with `EFAULT`).
fn child_fork_stores() {
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};
    let mut p = vec![1u8; 64].into_boxed_slice();
    // Group pages to copy at each fork: one survivor per OS page, meshed.
    let mut filler: Vec<Option<Box<[u8]>>> = (0..32 << 10)
        .map(|i| Some(vec![i as u8; 256].into_boxed_slice()))
        .collect();
    let per_page = os_page() / 256;
    for (i, f) in filler.iter_mut().enumerate() {
        if i % per_page != 0 {
            *f = None;
        }
    }
    pagewise::mesh();
    let meshed = pagewise::stats().meshed_bytes;
    let layout = std::alloc::Layout::from_size_align(64 << 10, os_page()).unwrap();
    // SAFETY: a valid layout; freed at the end.
    let q = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    assert!(q != 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let during = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let at = p.as_mut_ptr() as usize;
    let w = {
        let (stop, held, during) = (stop.clone(), held.clone(), during.clone());
        std::thread::spawn(move || {
            // SAFETY: a C string literal.
            let zero = unsafe { libc::open(c"/dev/zero".as_ptr(), libc::O_RDONLY) };
            let mut v = 0u8;
            while !stop.load(Relaxed) {
                let g1 = FORKING.load(SeqCst);
                let before = kernel_can_write(zero, (q + (60 << 10)) as *mut u8);
                v = v.wrapping_add(1);
                // SAFETY: the thread's own object (it outlives the thread).
                unsafe { core::ptr::write_volatile(at as *mut u8, v) };
                let after = kernel_can_write(zero, (q + (60 << 10)) as *mut u8);
                let g2 = FORKING.load(SeqCst);
                if g1 % 2 == 1 || g2 % 2 == 1 {
                    during.fetch_add(1, Relaxed);
                }
                if !before || !after {
                    held.fetch_add(1, Relaxed);
                }
            }
            // SAFETY: our fd.
            unsafe { libc::close(zero) };
        })
    };
    let forks = 10;
    for _ in 0..forks {
        FORKING.fetch_add(1, SeqCst);
        // SAFETY: the child exits at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(0) };
        }
        FORKING.fetch_add(1, SeqCst);
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Relaxed);
    w.join().unwrap();
    println!(
        "fork-stores-report {} {} {forks} {meshed}",
        held.load(Relaxed),
        during.load(Relaxed)
    );
    p[0] = 0;
    drop(filler);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(q as *mut u8, layout) };
}

/// `fork()` never makes the heap's own pages read-only: another thread's
/// stores and the kernel's writes into them go on while the group pages
/// are copied for the child.
#[test]
fn a_fork_never_holds_stores_to_the_heaps_own_pages() {
    if reexec::emulated() {
        eprintln!("emulated: the forking threads of qemu-user are not the kernel's; skipped");
        return;
    }
    let o = run("fork-stores", &[], Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}", o.out);
    let r = report(&o, "fork-stores-report ");
    let f: Vec<u64> = r.split(' ').map(|x| x.parse().unwrap()).collect();
    assert!(f[3] > 0, "the heap meshed before the forks: {r}");
    assert_eq!(
        f[0], 0,
        "an own page was read-only ({} of the thread's rounds overlapped {} forks)",
        f[1], f[2]
    );
}

/// Sets the file size limit (soft and hard) to `bytes`.
fn set_fsize(bytes: u64) {
    let r = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &r) };
}

/// A program under a file size limit (`ulimit -f`): set before it started,
/// or (`later`) by the program after pagewise made its heap. It allocates,
/// frees most, meshes and allocates 1.5 GiB (a new mapping): nothing may
/// kill it (SIGXFSZ).
fn child_fsize(later: bool) {
    let all: Vec<Box<[u8]>> = (0..8192)
        .map(|_| vec![1u8; 64].into_boxed_slice())
        .collect();
    let keep: Vec<Box<[u8]>> = all.into_iter().step_by(64).collect();
    if later {
        set_fsize(1 << 20);
    }
    pagewise::mesh();
    let layout = std::alloc::Layout::from_size_align(3 << 29, os_page()).unwrap();
    // SAFETY: a valid layout, freed at once (never touched).
    unsafe {
        let p = std::alloc::alloc(layout);
        assert!(!p.is_null());
        *p = 1;
        std::alloc::dealloc(p, layout);
    }
    assert!(keep.iter().all(|k| k.iter().all(|&b| b == 1)));
    println!("fsize-report ok {}", pagewise::stats().meshed_bytes);
}

/// A file size limit never kills the program (SIGXFSZ from the memfd
/// heap's ftruncate or writes): the heap takes private memory instead,
/// with one line saying why.
#[test]
fn a_file_size_limit_never_kills_the_program() {
    for (scenario, fsize) in [("fsize", Some(1 << 20)), ("fsize-later", None)] {
        let o = run_limited(scenario, &[], Duration::from_secs(60), fsize);
        assert_eq!(
            o.code,
            Some(0),
            "{scenario}: killed by signal {:?}:\n{}",
            o.signal,
            o.out
        );
        assert_eq!(
            report(&o, "fsize-report "),
            "ok 0",
            "{scenario}: meshed under the limit"
        );
        assert_eq!(
            o.out.matches("pagewise: meshing stops").count(),
            1,
            "{scenario}: one line saying why:\n{}",
            o.out
        );
    }
}

/// A program frees, from another thread, a slot it had freed already, on
/// an OS page that meshed since: the slot is withheld (its bytes in the
/// group page are another object's). The free must be caught before it
/// writes anything there.
fn child_double_free_meshed() {
    const N: usize = 16384;
    let all: Vec<Box<[u8; 64]>> = (0..N).map(|_| Box::new([0u8; 64])).collect();
    // Keep one object per OS page at a varying slot, each filled with its
    // own marker; remember the others' addresses, then free them.
    let mut keep = Vec::new();
    let mut freed = Vec::new();
    let mut seen_pages = std::collections::HashSet::new();
    for (i, mut b) in all.into_iter().enumerate() {
        let page = &*b as *const _ as usize / os_page();
        if (i * 7) % 5 == 0 && seen_pages.insert(page) {
            b.fill((keep.len() % 200 + 20) as u8);
            keep.push(b);
        } else {
            freed.push(Box::into_raw(b) as usize);
            // SAFETY: just leaked from a box of this layout.
            unsafe { drop(Box::from_raw(*freed.last().unwrap() as *mut [u8; 64])) };
        }
    }
    let joined = pagewise::mesh();
    // A freed slot whose bytes now read as a survivor's: withheld, on a
    // page meshed with that survivor's.
    let marker = |x: usize| {
        // SAFETY: the address of a slot of a meshed page (mapped); a read.
        let b = unsafe { core::ptr::read_volatile(x as *const [u8; 64]) };
        (b[0] >= 20 && b.iter().all(|&v| v == b[0])).then_some(b[0])
    };
    let Some(&x) = freed.iter().find(|&&x| marker(x).is_some()) else {
        println!("double-free-report none {joined}");
        return;
    };
    let before = marker(x).unwrap();
    let victim = keep
        .iter()
        .map(|k| &**k as *const [u8; 64] as usize)
        .find(|&k| {
            // SAFETY: a live survivor.
            unsafe { (*(k as *const [u8; 64]))[0] == before && k % os_page() == x % os_page() }
        })
        .expect("the survivor the slot shows");
    eprintln!("freeing again a withheld slot that shows a survivor's bytes");
    // SAFETY: a double free, on purpose: it must abort before writing.
    std::thread::spawn(move || unsafe { drop(Box::from_raw(x as *mut [u8; 64])) })
        .join()
        .unwrap();
    // SAFETY: a live survivor.
    let after = unsafe { core::ptr::read_volatile(victim as *const [u8; 64]) };
    println!(
        "double-free-report missed {}",
        if after.iter().all(|&v| v == before) {
            "intact"
        } else {
            "overwritten"
        }
    );
}

/// A double free of a slot withheld on a meshed page is caught (the
/// process aborts with the double-free report) before it writes into the
/// group page, where the slot's bytes are another object's.
#[test]
fn a_double_free_on_a_meshed_page_is_caught_before_it_writes() {
    let o = run(
        "double-free-meshed",
        &[("PAGEWISE_BACKGROUND", "0")],
        Duration::from_secs(60),
    );
    assert!(
        !o.out.contains("double-free-report none"),
        "no freed slot showed a survivor: the test proves nothing:\n{}",
        o.out
    );
    assert!(
        !o.out.contains("double-free-report missed"),
        "the double free was not caught:\n{}",
        o.out
    );
    assert_eq!(o.signal, Some(libc::SIGABRT), "{}", o.out);
    assert!(o.out.contains("double free"), "{}", o.out);
}

/// Whether this process may write-protect shared memory through a
/// userfaultfd for the kernel's own accesses too (Linux 5.19 and later,
/// with `CAP_SYS_PTRACE` or `vm.unprivileged_userfaultfd = 1`).
fn kernel_offers_userfaultfd_write_protection() -> bool {
    // SAFETY: plain system calls on a descriptor of our own.
    unsafe {
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) as i32;
        if fd < 0 {
            return false;
        }
        // struct uffdio_api { api, features, ioctls }: API 0xAA, write
        // protection of page faults and of shared memory.
        let wanted = 1u64 | 1 << 12;
        let mut api = [0xaau64, wanted, 0];
        let ok = libc::ioctl(fd, 0xc018_aa3f_u64 as _, api.as_mut_ptr()) == 0
            && api[1] & wanted == wanted;
        libc::close(fd);
        ok
    }
}

/// Threads `read()` from /dev/zero into live objects (the kernel writes
/// into them) while rounds of sparse pages are meshed: a read into an
/// object whose page is being copied must wait like a store, not fail
/// with `EFAULT`.
fn child_syscall_into_copied() {
    use std::sync::atomic::Ordering::Relaxed;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let efaults = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let targets: std::sync::Arc<Vec<std::sync::atomic::AtomicUsize>> = std::sync::Arc::new(
        (0..8 * 256)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect(),
    );
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (stop, efaults, reads, targets) = (
                stop.clone(),
                efaults.clone(),
                reads.clone(),
                targets.clone(),
            );
            std::thread::spawn(move || {
                // SAFETY: a C string literal.
                let zero = unsafe { libc::open(c"/dev/zero".as_ptr(), libc::O_RDONLY) };
                let mut i = t;
                while !stop.load(Relaxed) {
                    i = (i + 7) % targets.len();
                    let p = targets[i].load(Relaxed);
                    if p == 0 {
                        continue;
                    }
                    // SAFETY: a live object of 64 bytes (never freed while
                    // the readers run).
                    let n = unsafe { libc::read(zero, p as *mut libc::c_void, 64) };
                    reads.fetch_add(1, Relaxed);
                    if n < 0 {
                        efaults.fetch_add(1, Relaxed);
                    }
                }
                // SAFETY: our fd.
                unsafe { libc::close(zero) };
            })
        })
        .collect();
    let mut kept = Vec::new();
    let mut joined = 0;
    for round in 0..8 {
        let all: Vec<Box<[u8]>> = (0..16384)
            .map(|_| vec![1u8; 64].into_boxed_slice())
            .collect();
        for (i, mut b) in all.into_iter().enumerate() {
            if i % 64 == 0 {
                targets[round * 256 + i / 64].store(b.as_mut_ptr() as usize, Relaxed);
                kept.push(b);
            }
        }
        joined += pagewise::mesh();
    }
    stop.store(true, Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    println!(
        "syscall-report {} {} {joined}",
        efaults.load(Relaxed),
        reads.load(Relaxed)
    );
    drop(kept);
}

/// A system call writing into an object while its page is copied waits
/// for the copy, as a store does, where the kernel lets the barrier
/// write-protect through a userfaultfd: no `read()` fails with `EFAULT`.
/// Where it does not (an older kernel, no privilege, qemu-user), the
/// barrier is `mprotect` and the hazard stays, as the README says.
#[test]
fn a_system_call_into_a_page_being_copied_waits_for_the_copy() {
    if reexec::emulated() || !kernel_offers_userfaultfd_write_protection() {
        eprintln!("no userfaultfd write protection here: the EFAULT hazard stays; skipped");
        return;
    }
    let o = run(
        "syscall-into-copied",
        &[("PAGEWISE_BACKGROUND", "0")],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(0), "{}", o.out);
    let r = report(&o, "syscall-report ");
    eprintln!("EFAULTs, reads, OS pages meshed: {r}");
    let f: Vec<u64> = r.split(' ').map(|x| x.parse().unwrap()).collect();
    assert!(f[2] > 0, "nothing meshed: the test proves nothing: {r}");
    assert!(f[1] > 0, "no read was made: {r}");
    assert_eq!(f[0], 0, "reads that failed with EFAULT, of {}", f[1]);
}
