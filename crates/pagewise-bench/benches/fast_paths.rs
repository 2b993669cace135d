//! Micro-benchmarks of the fast paths, pagewise against System (glibc),
//! mimalloc, jemalloc and tcmalloc, each called directly through its
//! `GlobalAlloc` impl (the bench binary's own global allocator is the system
//! one; tcmalloc is Debian's `libtcmalloc_minimal.so.4`, opened with
//! `dlopen(RTLD_LOCAL)` and called through its `tc_*` entry points, so the
//! process's `malloc` stays glibc's; left out with a note if not installed):
//! - `pair/<alloc>/<size>`: allocate-then-free of one size class;
//! - `cross_thread/<alloc>`: a batch allocated on one thread, freed on another;
//! - `realloc_growth/<alloc>`: a buffer grown by doubling from 16 B to 64 KiB.
//!
//! `cargo bench -p pagewise-bench --bench fast_paths`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_void, CStr, CString};
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type Alloc = (&'static str, &'static (dyn GlobalAlloc + Sync));

static PAGEWISE: pagewise::Pagewise = pagewise::Pagewise;
static SYSTEM: System = System;
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocators of every group: the four linked in, and tcmalloc if its
/// library can be opened.
fn allocs() -> Vec<Alloc> {
    let mut v: Vec<Alloc> = vec![
        ("pagewise", &PAGEWISE),
        ("system", &SYSTEM),
        ("mimalloc", &MIMALLOC),
        ("jemalloc", &JEMALLOC),
    ];
    if let Some(tc) = TcMalloc::get() {
        v.push(("tcmalloc", tc));
    }
    v
}

/// tcmalloc (gperftools) through the entry points of its shared library,
/// which exports them next to its `malloc`: loaded `RTLD_LOCAL`, the library
/// interposes nothing (the process's `malloc`, `free` and `operator new`
/// stay glibc's and libstdc++'s, already bound), and every block made here
/// by `tc_malloc`/`tc_memalign`/`tc_realloc` is freed by `tc_free_sized`
/// or `tc_free`, never by glibc.
struct TcMalloc {
    malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    memalign: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
    /// `tc_free_sized`, where exported (gperftools >= 2.6): the size hint
    /// spares the page-map lookup of the size class, as jemalloc's
    /// `sdallocx` (which tikv-jemallocator calls) does.
    free_sized: Option<unsafe extern "C" fn(*mut c_void, usize)>,
}

const TCMALLOC_SO: &str = "libtcmalloc_minimal.so.4";

/// `tc_malloc`'s alignment guarantee (its size classes above 8 B are
/// multiples of 16; an 8 B block is 8-aligned, which `fits_malloc` covers).
const TC_MIN_ALIGN: usize = 16;

static TCMALLOC: OnceLock<Option<TcMalloc>> = OnceLock::new();

impl TcMalloc {
    fn get() -> Option<&'static TcMalloc> {
        TCMALLOC
            .get_or_init(|| match Self::open() {
                Ok(tc) => Some(tc),
                Err(e) => {
                    eprintln!("note: tcmalloc left out of the benchmarks: {e}");
                    None
                }
            })
            .as_ref()
    }

    fn open() -> Result<TcMalloc, String> {
        let name = CString::new(TCMALLOC_SO).expect("no NUL");
        // SAFETY: a NUL-terminated name; the handle is never closed, so the
        // symbols below stay valid for the life of the process.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message or null.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, read before the next dl call.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!(
                "cannot open {TCMALLOC_SO} ({why}); apt-get install libtcmalloc-minimal4"
            ));
        }
        let sym = |s: &str| -> Option<*mut c_void> {
            let c = CString::new(s).expect("no NUL");
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let need = |s: &str| sym(s).ok_or_else(|| format!("{TCMALLOC_SO} does not export {s}"));
        // SAFETY: the signatures are those of gperftools/tcmalloc.h.
        unsafe {
            Ok(TcMalloc {
                malloc: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(usize) -> *mut c_void,
                >(need("tc_malloc")?),
                memalign: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(usize, usize) -> *mut c_void,
                >(need("tc_memalign")?),
                realloc: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
                >(need("tc_realloc")?),
                free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(need(
                    "tc_free",
                )?),
                free_sized: sym("tc_free_sized").map(|p| {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, usize)>(p)
                }),
            })
        }
    }

    /// Whether a block of `layout` comes from `tc_malloc` (else `tc_memalign`).
    fn fits_malloc(layout: Layout) -> bool {
        layout.align() <= TC_MIN_ALIGN && layout.align() <= layout.size()
    }
}

// SAFETY: `alloc` returns a block of at least `layout.size()` bytes aligned
// to `layout.align()` (tc_malloc for the alignments its size classes give,
// tc_memalign otherwise) or null; `dealloc` and `realloc` take blocks made
// here and free them with tcmalloc; tcmalloc is thread-safe.
unsafe impl GlobalAlloc for TcMalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C calls; a null return is passed on.
        unsafe {
            if Self::fits_malloc(layout) {
                (self.malloc)(layout.size()).cast()
            } else {
                (self.memalign)(layout.align(), layout.size()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` with `layout`. The size
        // hint is only given for tc_malloc blocks: tc_memalign rounds the
        // size up to the alignment, so its size class is not the hint's.
        unsafe {
            match self.free_sized {
                Some(free_sized) if Self::fits_malloc(layout) => {
                    free_sized(ptr.cast(), layout.size())
                }
                _ => (self.free)(ptr.cast()),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `new_layout` is valid (GlobalAlloc's contract on
        // `new_size`); tc_realloc keeps what tc_malloc guarantees, so it is
        // used when both the old and the new block are tc_malloc blocks.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            if Self::fits_malloc(layout) && Self::fits_malloc(new_layout) {
                return (self.realloc)(ptr.cast(), new_size).cast();
            }
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

const SIZES: [usize; 9] = [
    16,
    64,
    256,
    1024,
    4096,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    g.throughput(Throughput::Elements(1));
    for (name, a) in allocs() {
        for size in SIZES {
            let layout = Layout::from_size_align(size, 8).unwrap();
            g.bench_with_input(BenchmarkId::new(name, size), &layout, |b, &l| {
                b.iter(|| {
                    // SAFETY: non-zero layout; the block is freed with the
                    // same allocator and layout.
                    unsafe {
                        let p = a.alloc(l);
                        assert!(!p.is_null());
                        p.write(1);
                        a.dealloc(black_box(p), l);
                    }
                })
            });
        }
    }
    g.finish();
}

/// Allocation addresses handed to another thread.
struct Batch(Vec<usize>);

fn cross_thread(c: &mut Criterion) {
    const N: usize = 1024;
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("cross_thread");
    g.throughput(Throughput::Elements(N as u64));
    for (name, a) in allocs() {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let (to_free, rx) = std::sync::mpsc::sync_channel::<Batch>(4);
                let (done_tx, done) = std::sync::mpsc::channel::<Duration>();
                let freer = std::thread::spawn(move || {
                    let mut t = Duration::ZERO;
                    for batch in rx {
                        let s = Instant::now();
                        for p in batch.0 {
                            // SAFETY: allocated below by `a` with `layout`,
                            // freed once, here.
                            unsafe { a.dealloc(p as *mut u8, layout) };
                        }
                        t += s.elapsed();
                    }
                    done_tx.send(t).unwrap();
                });
                let mut alloc_time = Duration::ZERO;
                for _ in 0..iters {
                    let mut v = Vec::with_capacity(N);
                    let s = Instant::now();
                    for _ in 0..N {
                        // SAFETY: non-zero layout.
                        let p = unsafe { a.alloc(layout) };
                        assert!(!p.is_null());
                        v.push(p as usize);
                    }
                    alloc_time += s.elapsed();
                    to_free.send(Batch(v)).unwrap();
                }
                drop(to_free);
                let free_time = done.recv().unwrap();
                freer.join().unwrap();
                // Time of allocating on one thread plus freeing on the other.
                alloc_time + free_time
            })
        });
    }
    g.finish();
}

fn realloc_growth(c: &mut Criterion) {
    let mut g = c.benchmark_group("realloc_growth");
    for (name, a) in allocs() {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut size = 16usize;
                let mut l = Layout::from_size_align(size, 8).unwrap();
                // SAFETY: non-zero layout; each realloc passes the current
                // layout; the last block is freed with its layout.
                unsafe {
                    let mut p = a.alloc(l);
                    while size < (64 << 10) {
                        let new = size * 2;
                        p = a.realloc(p, l, new);
                        assert!(!p.is_null());
                        p.add(new - 1).write(1);
                        size = new;
                        l = Layout::from_size_align(size, 8).unwrap();
                    }
                    a.dealloc(black_box(p), l);
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = pairs, cross_thread, realloc_growth
}
criterion_main!(benches);
