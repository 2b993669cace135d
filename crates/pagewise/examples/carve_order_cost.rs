//! What the carve order of a meshing heap costs in CPU time, measured in
//! one process so that the machine's load falls on both sides alike:
//!
//! `cargo run --release -p pagewise --example carve_order_cost -- 30`
//!
//! Two owned heaps on the same private memory (`SystemPages`), one of which
//! says it can share pages (its source answers `sharing()` with a
//! `SharedPages`'), so it carves each OS page's slots as a meshing heap
//! does: in address order from a slot drawn from the address, wrapping
//! round once. Nothing meshes (no pass runs). Each round runs the same
//! phases on both, in turn (which goes first alternates): 300,000
//! objects of 16-512 B, each written whole, 90 % freed at random, four
//! times, then the rest freed. Printed: the ratio of the thread's CPU time,
//! the sharing heap's over the other's, round by round (median, quartiles,
//! range), and the page faults of each side.
#[cfg(target_os = "linux")]
mod linux {
    use core::alloc::Layout;
    use core::ptr::NonNull;
    use pagewise::source::SharePages;
    use pagewise::{Config, Heap, PageSource, Purge, SharedPages, SyscallCounts, SystemPages};

    /// Private memory, and the carve of a heap that can share pages.
    struct CarvesAsMeshing(SystemPages, SharedPages);

    // SAFETY: every call that maps or changes memory goes to `SystemPages`; the
    // `SharedPages` only answers `sharing()`, and no pass is ever asked of it.
    unsafe impl PageSource for CarvesAsMeshing {
        fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
            self.0.map(size, align)
        }
        unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
            // SAFETY: forwarded.
            unsafe { self.0.unmap(ptr, size) }
        }
        unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
            // SAFETY: forwarded.
            unsafe { self.0.purge(ptr, size, how) }
        }
        fn now_ms(&self) -> u64 {
            self.0.now_ms()
        }
        fn syscalls(&self) -> SyscallCounts {
            self.0.syscalls()
        }
        fn sharing(&self) -> Option<&dyn SharePages> {
            self.1.sharing()
        }
        fn serialize_threads(&self) -> bool {
            self.0.serialize_threads()
        }
        fn thp(&self) -> pagewise::thp::ThpMode {
            self.0.thp()
        }
        unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
            // SAFETY: forwarded.
            unsafe { self.0.advise_huge(ptr, size, huge) }
        }
    }

    /// This thread's CPU time, ns.
    fn cpu_ns() -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }

    /// This thread's minor page faults.
    fn faults() -> i64 {
        // SAFETY: all-zero is a valid rusage.
        let mut u: libc::rusage = unsafe { core::mem::zeroed() };
        // SAFETY: a valid rusage to fill.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        u.ru_minflt as i64
    }

    /// The phases, the same sizes and choices every call.
    fn phases<S: PageSource + 'static>(h: &Heap<S>, objs: &mut Vec<(NonNull<u8>, Layout)>) {
        let mut x = 88_172_645_463_325_252u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut kept = Vec::with_capacity(4 * 300_000 / 8);
        for _ in 0..4 {
            for _ in 0..300_000 {
                let size = (2 + next() % 62) as usize * 8;
                let l = Layout::from_size_align(size, 8).unwrap();
                let p = h.allocate(l).unwrap().cast::<u8>();
                // SAFETY: `size` bytes just allocated.
                unsafe { core::ptr::write_bytes(p.as_ptr(), 0xa5, size) };
                objs.push((p, l));
            }
            for &(p, l) in objs.iter() {
                if next() % 10 == 0 {
                    kept.push((p, l));
                } else {
                    // SAFETY: allocated above with `l`, freed once.
                    unsafe { h.deallocate(p, l) };
                }
            }
            objs.clear();
        }
        for (p, l) in kept {
            // SAFETY: allocated above with `l`, freed once.
            unsafe { h.deallocate(p, l) };
        }
    }

    pub fn main() {
        let rounds: usize = std::env::args().nth(1).map_or(30, |s| s.parse().unwrap());
        let plain = Heap::with_source(SystemPages::new(), Config::default());
        let meshing = Heap::with_source(
            CarvesAsMeshing(SystemPages::new(), SharedPages::new()),
            Config::default(),
        );
        let mut objs = Vec::with_capacity(300_000);
        let (mut ratios, mut f_plain, mut f_meshing) = (vec![], 0, 0);
        // One round first, not counted: both heaps grow to their size.
        for r in 0..=rounds {
            let mut time = |meshing_side: bool| {
                let (t, f) = (cpu_ns(), faults());
                if meshing_side {
                    phases(&meshing, &mut objs);
                } else {
                    phases(&plain, &mut objs);
                }
                (cpu_ns() - t, faults() - f)
            };
            let (p, m) = if r % 2 == 0 {
                let p = time(false);
                (p, time(true))
            } else {
                let m = time(true);
                (time(false), m)
            };
            if r > 0 {
                ratios.push(m.0 as f64 / p.0 as f64);
                f_plain += p.1;
                f_meshing += m.1;
            }
        }
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q) as usize];
        println!(
            "{rounds} rounds: CPU time, meshing's carve over address order: median {:.3}, quartiles {:.3}-{:.3}, range {:.3}-{:.3}; page faults {f_meshing} against {f_plain}",
            at(0.5),
            at(0.25),
            at(0.75),
            at(0.0),
            at(1.0),
        );
    }
}

fn main() {
    #[cfg(target_os = "linux")]
    linux::main();
    #[cfg(not(target_os = "linux"))]
    println!("Linux only: meshing is.");
}
