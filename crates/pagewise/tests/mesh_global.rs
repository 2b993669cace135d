//! Meshing in the global allocator (`PAGEWISE_MESH=1`),
//! where users live: in a child process with the variable set, one object
//! of each OS page survives in every size class of 16-256 B while other
//! threads keep storing to the survivors; `pagewise::mesh()` must reach at
//! least three times the utilization (live bytes over the proportional set
//! size the heap adds, `/proc/self/smaps_rollup`), no store may be lost,
//! and a forked child must get a copy of the heap that neither side's
//! stores reach across.
#![cfg(target_os = "linux")]

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const CHILD: &str = "PAGEWISE_TEST_MESH_GLOBAL_CHILD";

fn os_page() -> usize {
    pagewise::layout::os_page()
}

/// The process's proportional set size in bytes (a page mapped at two
/// addresses counts once, which the resident set does not do).
fn pss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split(' ').nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// One survivor per OS page, of every size of 16-256 B (one per size
/// class), at a pseudo-random slot: `pages` OS pages of each size.
fn survivors(pages: usize) -> Vec<Box<[u8]>> {
    let mut seed = 0x9e37_79b9_u64;
    let mut kept = Vec::new();
    for size in (16..=128).step_by(16).chain([160, 192, 224, 256]) {
        let all: Vec<Box<[u8]>> = (0..pages * os_page() / size)
            .map(|_| vec![1u8; size].into_boxed_slice())
            .collect();
        let mut by_page: std::collections::BTreeMap<usize, Vec<Box<[u8]>>> = Default::default();
        for b in all {
            by_page
                .entry(b.as_ptr() as usize / os_page())
                .or_default()
                .push(b);
        }
        for (_, mut bs) in by_page {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let keep = (seed % bs.len() as u64) as usize;
            kept.push(bs.swap_remove(keep));
        }
    }
    kept
}

/// Values of 4,102 B (redis's 4 KiB values, in 5,120-byte slots in both
/// builds), one kept per run of OS pages that holds a whole number of
/// slots (five 4 KiB OS pages, four slots), each at another slot of its
/// run than the one before: every value straddles two OS pages.
fn one_value_per_run(n: usize) -> Vec<Box<[u8]>> {
    const SIZE: usize = 4102;
    const SLOT: usize = 5120;
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let per_run = os_page() / gcd(SLOT, os_page());
    let mut all: Vec<Box<[u8]>> = (0..n).map(|_| vec![1u8; SIZE].into_boxed_slice()).collect();
    all.sort_by_key(|b| b.as_ptr() as usize);
    let mut kept = Vec::new();
    let (mut runs, mut start) = (0, 0);
    while start < all.len() {
        // A slab page's slots are `SLOT` apart; a larger gap starts another.
        let mut end = start + 1;
        while end < all.len() && all[end].as_ptr() as usize - all[end - 1].as_ptr() as usize == SLOT
        {
            end += 1;
        }
        for run in (start..end).step_by(per_run) {
            let last = (run + per_run).min(end) - 1;
            kept.push(run + runs % (last + 1 - run));
            runs += 1;
        }
        start = end;
    }
    assert!(kept.len() < n / 2, "the values are not in 5,120-byte slots");
    let mut keep = kept.into_iter().peekable();
    all.into_iter()
        .enumerate()
        .filter(|&(i, _)| keep.next_if_eq(&i).is_some())
        .map(|(_, b)| b)
        .collect()
}

/// A writer's objects, whether every check held, and its rounds.
type WriterResult = (Vec<Box<[u8]>>, bool, u64);

/// Threads that store `round` to every byte of their objects and check it
/// stayed, until `stop`; each returns its objects and whether every check
/// held.
fn writers(
    objects: Vec<Box<[u8]>>,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<WriterResult>> {
    let mut shares: Vec<Vec<Box<[u8]>>> = (0..n).map(|_| Vec::new()).collect();
    for (i, o) in objects.into_iter().enumerate() {
        shares[i % n].push(o);
    }
    shares
        .into_iter()
        .map(|mut mine| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut ok = true;
                let mut round = 0u64;
                while !stop.load(Relaxed) {
                    round += 1;
                    let v = (round % 250 + 2) as u8;
                    for o in mine.iter_mut() {
                        o.fill(v);
                        ok &= o.iter().all(|&b| b == v);
                    }
                }
                (mine, ok, round)
            })
        })
        .collect()
}

fn child_sparse() {
    let baseline = pss();
    let objects = survivors(((1 << 20) / os_page()).max(16));
    let live: u64 = objects.iter().map(|o| o.len() as u64).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let handles = writers(objects, 4, &stop);
    pagewise::trim();
    let (before, rss_before) = (pss(), rss());
    let committed_before = pagewise::stats().committed_bytes;
    let mut joined = 0;
    for _ in 0..3 {
        joined += pagewise::mesh();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (after, rss_after) = (pss(), rss());
    // What meshed, read before the writers let their objects go (their
    // pages leave their groups as they empty: at a 64 KiB OS page few
    // groups are left by then).
    let mid = pagewise::stats();
    let committed_after = mid.committed_bytes;
    stop.store(true, Relaxed);
    let mut rounds = 0;
    for h in handles {
        let (mine, ok, r) = h.join().unwrap();
        assert!(ok, "a store was lost");
        rounds += r;
        drop(mine);
    }
    let s = pagewise::stats();
    println!(
        "mesh-report {live} {} {} {joined} {} {} {rss_before} {rss_after} {rounds} {} \
         {committed_before} {committed_after}",
        before - baseline,
        after.saturating_sub(baseline),
        mid.meshed_bytes,
        mid.mesh_saved_bytes,
        s.mesh_waits
    );
}

fn child_values() {
    let baseline = pss();
    let objects = one_value_per_run(4000);
    let live: u64 = objects.iter().map(|o| o.len() as u64).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let handles = writers(objects, 2, &stop);
    pagewise::trim();
    let before = pss();
    let committed_before = pagewise::stats().committed_bytes;
    let mut joined = 0;
    for _ in 0..3 {
        joined += pagewise::mesh();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = pss();
    let mid = pagewise::stats();
    stop.store(true, Relaxed);
    let mut rounds = 0;
    for h in handles {
        let (mine, ok, r) = h.join().unwrap();
        assert!(ok, "a store was lost");
        rounds += r;
        drop(mine);
    }
    println!(
        "values-report {live} {} {} {joined} {} {} {rounds} {committed_before} {}",
        before - baseline,
        after.saturating_sub(baseline),
        mid.meshed_bytes,
        mid.mesh_saved_bytes,
        mid.committed_bytes
    );
}

fn child_fork() {
    let objects = survivors(((256 << 10) / os_page()).max(8));
    let mut objects: Vec<Box<[u8]>> = objects;
    for (i, o) in objects.iter_mut().enumerate() {
        o.fill((i % 200 + 3) as u8);
    }
    // The purger (every 100 ms here) may have meshed them already, or be
    // meshing them: a `mesh()` leaves a heap to a pass under way on it.
    let start = std::time::Instant::now();
    while pagewise::mesh() == 0 && pagewise::stats().meshed_bytes == 0 {
        assert!(start.elapsed().as_secs() < 30, "nothing meshed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // A thread keeps allocating and storing while the process forks.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut v: Vec<Box<[u8]>> = Vec::new();
            while !stop.load(Relaxed) {
                v.push(vec![7u8; 48].into_boxed_slice());
                if v.len() > 1000 {
                    v.clear();
                }
            }
        })
    };
    // SAFETY: the child only checks memory, allocates and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let intact = objects
            .iter()
            .enumerate()
            .all(|(i, o)| o.iter().all(|&b| b == (i % 200 + 3) as u8));
        for o in objects.iter_mut() {
            o.fill(0xee);
        }
        let churn: Vec<Box<[u8]>> = (0..10_000)
            .map(|i| vec![i as u8; 64].into_boxed_slice())
            .collect();
        let churned = churn.iter().enumerate().all(|(i, b)| b[63] == i as u8);
        drop(churn);
        pagewise::trim();
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(if intact && churned { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    stop.store(true, Relaxed);
    busy.join().unwrap();
    assert!(libc::WIFEXITED(status), "the child died: {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child saw a changed heap");
    for (i, o) in objects.iter().enumerate() {
        assert!(
            o.iter().all(|&b| b == (i % 200 + 3) as u8),
            "the child's stores reached the parent"
        );
    }
    println!("fork-report ok");
}

/// Threads allocate, check and free objects of 16-256 B, passing some to
/// each other to free, while the main thread meshes over and over: every
/// object's bytes must be its own from allocation to free.
fn child_churn() {
    const THREADS: usize = 6;
    let stop = Arc::new(AtomicBool::new(false));
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| std::sync::mpsc::channel::<Box<[u8]>>())
        .unzip();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let stop = stop.clone();
            let txs = txs.clone();
            std::thread::spawn(move || {
                let mut seed = 0x1234_5678_u64 + t as u64;
                let mut next = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                let check = |o: &[u8]| o.iter().all(|&b| b == o[0]);
                let mut mine: Vec<Box<[u8]>> = Vec::new();
                let mut bad = 0u64;
                let mut ops = 0u64;
                // Sparse pages first: many objects, most freed at random.
                for _ in 0..20_000 {
                    let size = 16 * (1 + next(16) as usize);
                    mine.push(vec![next(250) as u8 + 1; size].into_boxed_slice());
                }
                mine.retain(|_| next(10) == 0);
                while !stop.load(Relaxed) {
                    ops += 1;
                    while let Ok(o) = rx.try_recv() {
                        bad += u64::from(!check(&o));
                    }
                    match next(4) {
                        0 | 1 => {
                            let size = 16 * (1 + next(16) as usize);
                            mine.push(vec![next(250) as u8 + 1; size].into_boxed_slice());
                        }
                        2 if !mine.is_empty() => {
                            let o = mine.swap_remove(next(mine.len() as u64) as usize);
                            bad += u64::from(!check(&o));
                        }
                        _ if !mine.is_empty() => {
                            let o = mine.swap_remove(next(mine.len() as u64) as usize);
                            let _ = txs[next(THREADS as u64) as usize].send(o);
                        }
                        _ => {}
                    }
                    if mine.len() > 4000 {
                        mine.truncate(2000);
                    }
                    if ops % 512 == 0 {
                        bad += mine.iter().filter(|o| !check(o)).count() as u64;
                    }
                }
                bad += mine.iter().filter(|o| !check(o)).count() as u64;
                while let Ok(o) = rx.try_recv() {
                    bad += u64::from(!check(&o));
                }
                (bad, ops)
            })
        })
        .collect();
    drop(txs);
    // OS pages meshed by these passes, or seen meshed after one (the
    // purger meshes every 100 ms too).
    let mut joined = 0;
    let start = std::time::Instant::now();
    let mut passes = 0;
    while start.elapsed() < std::time::Duration::from_millis(1500) {
        joined += pagewise::mesh();
        passes += 1;
        if passes % 16 == 0 {
            joined += pagewise::stats().meshed_bytes as usize / os_page();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    stop.store(true, Relaxed);
    let (mut bad, mut ops) = (0, 0);
    for h in handles {
        let (b, o) = h.join().unwrap();
        bad += b;
        ops += o;
    }
    let s = pagewise::stats();
    println!("churn-report {bad} {ops} {joined} {}", s.mesh_waits);
}

/// Descriptors open in this process whose target names `what` (a link
/// under `/proc/self/fd`).
fn descriptors_of(what: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains(what)))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A program that closes every descriptor it did not open (a daemon,
/// `closefrom(3)`) and opens files of its own, which take the heap's
/// memory files' numbers: once its heap has meshed (`meshed_first`), then
/// meshing, freeing (groups shrink and end) and forking; or before any
/// pass looked at the heap, then freeing and forking. Its files must stay
/// as they were, and the heap's objects too, in the parent and in the
/// child (whose copy of the group pages cannot come from the file now).
fn child_closed(meshed_first: bool) {
    const VICTIM: usize = 8192;
    let mut objects = survivors(((1 << 20) / os_page()).max(16));
    for (i, o) in objects.iter_mut().enumerate() {
        o.fill((i % 200 + 3) as u8);
    }
    let big = vec![0x77u8; 48 << 20];
    let mut joined = 0;
    if meshed_first {
        joined = pagewise::mesh();
        assert!(joined > 0, "nothing meshed before the descriptors went");
    }
    let ours = descriptors_of("pagewise-mesh");
    assert!(!ours.is_empty(), "no memory file: nothing to close");
    // SAFETY: plain system call; this process opened nothing it still needs
    // above stderr (the test harness writes to 1 and 2).
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    assert_eq!(closed, 0, "close_range");
    let dir = std::env::temp_dir().join(format!("pagewise-closed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let highest = *ours.iter().max().unwrap();
    let mut files = Vec::new();
    use std::os::fd::AsRawFd;
    while files
        .last()
        .is_none_or(|f: &std::fs::File| f.as_raw_fd() < highest)
    {
        let path = dir.join(format!("victim-{}", files.len()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut &f, &[0x5a; VICTIM]).unwrap();
        files.push(f);
    }
    if meshed_first {
        joined += pagewise::mesh();
    }
    // Half of the objects go (their groups shrink or end), then more passes.
    let mut kept = Vec::new();
    for (i, o) in objects.into_iter().enumerate() {
        if i % 2 == 0 {
            kept.push(o);
        }
    }
    if meshed_first {
        joined += pagewise::mesh();
    }
    let intact = |v: &[Box<[u8]>]| {
        v.iter()
            .enumerate()
            .all(|(i, o)| o.iter().all(|&b| b == ((2 * i) % 200 + 3) as u8))
    };
    // SAFETY: the child checks memory, allocates and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let more: Vec<Box<[u8]>> = (0..1000)
            .map(|_| vec![9u8; 48].into_boxed_slice())
            .collect();
        let ok = intact(&kept)
            && more.iter().all(|o| o.iter().all(|&b| b == 9))
            && big.iter().all(|&b| b == 0x77);
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let mut untouched = 0;
    for f in &files {
        let mut buf = Vec::new();
        std::io::Seek::seek(&mut &*f, std::io::SeekFrom::Start(0)).unwrap();
        std::io::Read::read_to_end(&mut &*f, &mut buf).unwrap();
        untouched += usize::from(buf.len() == VICTIM && buf.iter().all(|&b| b == 0x5a));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "closed-report {} {} {} {} {}",
        files.len(),
        untouched,
        u8::from(intact(&kept)),
        u8::from(child_ok),
        joined
    );
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
        "sparse" => child_sparse(),
        "values" => child_values(),
        "fork" => child_fork(),
        "churn" => child_churn(),
        "closed" => child_closed(true),
        "closed-early" => child_closed(false),
        other => panic!("unknown scenario {other}"),
    }
}

/// Runs `scenario` in a child with meshing on; `background`: whether the
/// purger runs (and meshes every 100 ms) beside the explicit passes.
fn run(scenario: &str, background: bool) -> String {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("PAGEWISE_MESH", "1")
        .env("PAGEWISE_DECAY_MS", "100")
        .env("PAGEWISE_BACKGROUND", if background { "1" } else { "0" });
    // A few seconds natively, under a minute emulated on a loaded machine.
    let out = reexec::output_within(cmd, std::time::Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn one_survivor_per_os_page_meshes_with_writers_running() {
    let out = run("sparse", false);
    let line = out
        .lines()
        .find_map(|l| l.split_once("mesh-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{out}"));
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (live, before, after, joined, meshed, saved) = (f[0], f[1], f[2], f[3], f[4], f[5]);
    let (rss_before, rss_after, rounds, waits) = (f[6], f[7], f[8], f[9]);
    // Under user-mode emulation the process's PSS and RSS are the
    // emulator's (its translated code moves them by megabytes): pagewise's
    // own committed bytes stand in, as in tests/idle_return.rs.
    let emulated = reexec::emulated();
    let (before, after) = if emulated {
        eprintln!("emulated: utilization from pagewise's committed bytes, not PSS");
        (f[10], f[11])
    } else {
        (before, after)
    };
    let (u0, u1) = (
        live as f64 / before as f64,
        live as f64 / after.max(1) as f64,
    );
    eprintln!(
        "live {live} B; heap PSS {before} -> {after} B; utilization {u0:.3} -> {u1:.3} \
         ({:.1}x); {joined} OS pages joined, meshed {meshed} B, saved {saved} B; \
         RSS {rss_before} -> {rss_after} B; {rounds} writer rounds, {waits} stores waited",
        u1 / u0
    );
    assert!(joined > 0 && saved > 0);
    assert!(rounds > 0);
    assert!(u1 >= 3.0 * u0, "utilization {u0:.3} -> {u1:.3}");
    // What the README warns of: the resident set counts a shared page at
    // each address that has touched it (the writers touch every survivor).
    // Only where pagewise's OS page is the kernel's: with PAGEWISE_OS_PAGE
    // larger, a survivor touches one kernel page of its meshed page.
    // SAFETY: sysconf reads a constant.
    let kernel_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let real_pages = os_page() == kernel_page;
    assert!(
        emulated || !real_pages || rss_after * 10 >= rss_before * 9,
        "RSS fell from {rss_before} to {rss_after}: the README says it does not"
    );
}

#[test]
fn a_forked_child_gets_its_own_copy_of_a_meshed_heap() {
    let out = run("fork", true);
    assert!(out.contains("fork-report ok"), "{out}");
}

#[test]
fn objects_stay_intact_while_threads_churn_and_the_heap_meshes() {
    let out = run("churn", true);
    let line = out
        .lines()
        .find_map(|l| l.split_once("churn-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{out}"));
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (bad, ops, joined, waits) = (f[0], f[1], f[2], f[3]);
    eprintln!("{ops} operations, {joined} OS pages joined, {waits} stores waited");
    assert_eq!(bad, 0, "objects whose bytes changed under them");
    assert!(joined > 0, "nothing meshed: the test proves nothing");
}

#[test]
fn closing_the_heaps_descriptors_and_opening_files_in_their_place_harms_neither() {
    for scenario in ["closed", "closed-early"] {
        closed(scenario);
    }
}

fn closed(scenario: &str) {
    let out = run(scenario, false);
    let line = out
        .lines()
        .find_map(|l| l.split_once("closed-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{out}"));
    let f: Vec<usize> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (files, untouched, intact, child_ok, joined) = (f[0], f[1], f[2], f[3], f[4]);
    eprintln!(
        "{scenario}: {files} files opened in the heap's descriptors' place; {joined} OS pages joined"
    );
    assert_eq!(untouched, files, "pagewise wrote into the program's files");
    assert_eq!(intact, 1, "objects changed");
    assert_eq!(child_ok, 1, "the forked child's heap");
}

#[test]
fn values_straddling_os_pages_mesh_one_per_run_with_writers_running() {
    let out = run("values", false);
    let line = out
        .lines()
        .find_map(|l| l.split_once("values-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{out}"));
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let (live, before, after, joined, meshed, saved, rounds) =
        (f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    // As in `one_survivor_per_os_page_meshes_with_writers_running`.
    let (before, after) = if reexec::emulated() {
        eprintln!("emulated: memory from pagewise's committed bytes, not PSS");
        (f[7], f[8])
    } else {
        (before, after)
    };
    eprintln!(
        "live {live} B; heap PSS {before} -> {after} B; {joined} OS pages joined, \
         meshed {meshed} B, saved {saved} B; {rounds} writer rounds"
    );
    assert!(joined > 0 && saved > 0, "nothing meshed");
    assert!(rounds > 0);
    // At 4 KiB, eight OS pages of four runs mesh into five at best.
    assert!(
        after as f64 <= 0.75 * before as f64,
        "heap PSS {before} -> {after} B"
    );
}
