//! The retention policy: how long freed memory is kept for reuse, how much,
//! and how it is given back. Readable from `PAGEWISE_*` environment variables.
//!
//! | variable | field | default | meaning |
//! |---|---|---|---|
//! | `PAGEWISE_DECAY_MS` | [`Config::decay_ms`] | 1000 | ms a freed span stays committed before it is purged |
//! | `PAGEWISE_RETAIN_MAX` | [`Config::retain_max_bytes`] | none | ceiling on the committed free bytes kept by the whole process (every thread heap together; an owned `Heap` alone); below it, retention follows demand ([`crate::budget`]) |
//! | `PAGEWISE_LIMIT` | [`Config::limit_bytes`] | none | hard limit on committed bytes and segment headers (every thread heap together; an owned `Heap` alone), reserved before they are committed, so never passed: an allocation that would pass it first purges everything retained it can reach, then fails (null, `ENOMEM` in C; the first refusal of the global allocator prints one line saying so) |
//! | `PAGEWISE_PURGE` | [`Config::purge`] | `dontneed` | `dontneed` (RSS drops at once) or `free` (MADV_FREE) |
//! | `PAGEWISE_BACKGROUND` | [`Config::background`] | `1` | a background thread purges expired memory of idle threads |
//! | `PAGEWISE_RESERVE` | [`Config::reservation_bytes`] | 1G | address space mapped at a time (at least 32 MiB) |
//! | `PAGEWISE_MESH` | [`Config::mesh`] | `0` | the global allocator meshes sparse pages (Linux; docs/design.md, "Meshing") |
//! | `PAGEWISE_THP` | [`Config::thp`] | `auto` | `auto`, `never` or `always`: where the heap asks for 2 MiB huge pages (docs/design.md, "Huge pages") |
//!
//! Sizes accept `64M`, `64MB`, `64MiB`, `1.5G` (binary units, [`parse`]);
//! `-1` means none for sizes and never for `PAGEWISE_DECAY_MS`; booleans
//! are `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`
//! ([`parse_bool`]); an empty value is no value. A malformed value, or one
//! that would make pagewise misbehave (`PAGEWISE_RESERVE` below one 32 MiB
//! segment, `PAGEWISE_LIMIT=0`), prints one line on stderr saying what is
//! accepted, and is ignored.
//!
//! The same settings can be given as one string, `key:value` entries
//! separated by commas, with the short names of [`Setting`] (`decay_ms`,
//! `retain_max`, `limit`, `purge`, `background`, `reserve`, `mesh`, `thp`): in the
//! `PAGEWISE_CONF` variable, and embedded in a program as the symbol
//! `const char *pagewise_conf` ([`pagewise_conf`]). Precedence, lowest first:
//! the defaults, the embedded string, `PAGEWISE_CONF`, the separate
//! `PAGEWISE_*` variables. [`crate::options`] reads and changes them at
//! run time, through the same parser.
//!
//! Every variable pagewise reads, these and the others (reports, the
//! profiler, guard pages, `pagewise run`'s sampler, testing aids such as
//! `PAGEWISE_OS_PAGE`), is in one table, [`Variable`], with its parser:
//! when the configuration is first read, a set variable whose value is
//! malformed, and a `PAGEWISE_*` variable the table does not know (a
//! misspelling: `PAGEWISE_DECAYMS`), each print one line naming it and
//! what is accepted, once per process. Names starting with
//! `PAGEWISE_TEST_` are left to test harnesses.

pub mod parse;
pub mod variables;
pub(crate) mod warn;

use crate::os::source::Purge;
use crate::os::thp::Thp;
pub use parse::{apply_conf, parse_bool, parse_size, parse_u64, ConfError, Setting};
pub use variables::{Group, Value, Variable, BOOL_ACCEPTED};

/// Defaults a program embeds, as a `key:value,...` string (jemalloc's
/// `malloc_conf` is the precedent): a C program that links libpagewise.so
/// defines `const char *pagewise_conf = "decay_ms:500,retain_max:32M";` and
/// the linker makes it override this null default. A program that is only
/// preloaded must export it (`-rdynamic`, or
/// `-Wl,--export-dynamic-symbol=pagewise_conf`). Read once, without
/// allocating, when the configuration is first read; below `PAGEWISE_CONF`
/// and the variables in precedence.
///
/// ```
/// // Null unless a program defines it.
/// // SAFETY: read once, nothing writes it.
/// assert!(unsafe { core::ptr::read_volatile(&raw const pagewise::config::pagewise_conf) }.is_null());
/// ```
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static mut pagewise_conf: *const core::ffi::c_char = core::ptr::null();

/// Retention policy of a heap.
///
/// ```
/// let c = pagewise::Config { decay_ms: 50, ..pagewise::Config::default() };
/// let heap = pagewise::Heap::with_config(c);
/// # drop(heap);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Milliseconds a retained span (an emptied slab page, a freed large
    /// object) stays committed before it is purged. Each free restarts the
    /// clock of the span it lands in. 0 purges at once (and turns every
    /// turnover into madvise calls: a slab allocator's thrash); `u64::MAX`
    /// (`-1` in the environment) never purges by age.
    pub decay_ms: u64,
    /// Ceiling on the committed free bytes retained by the heaps sharing a
    /// budget (every thread heap of the global allocator together; an owned
    /// [`Heap`](crate::Heap) alone); beyond it the oldest retained spans
    /// are purged at once, whatever their age. Below it retention follows
    /// demand: what the recent peak says will be needed again, plus a
    /// slack of a fifth of that peak (see [`crate::budget`]).
    /// `usize::MAX` (the default): no ceiling beyond demand.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let c = pagewise::Config { retain_max_bytes: 1 << 20, ..Default::default() };
    /// let heap = pagewise::Heap::with_config(c);
    /// let l = Layout::from_size_align(4 << 20, 8).unwrap();
    /// let p = heap.allocate(l).unwrap();
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(p.cast(), l) };
    /// assert!(heap.stats().retained_bytes <= 1 << 20);
    /// ```
    pub retain_max_bytes: usize,
    /// Hard limit on committed bytes (`PAGEWISE_LIMIT`), like tcmalloc's
    /// `SetMemoryLimit`: counted over the heaps sharing a budget (every
    /// thread heap of the global allocator together; an owned
    /// [`Heap`](crate::Heap) alone). An allocation that would take the
    /// count past it first purges everything retained it can reach (its own
    /// heap's retained spans and cached huge runs, then the other heaps'),
    /// and fails if that is not enough: null from `GlobalAlloc`, `Err` from
    /// `Heap::allocate`, null with `errno = ENOMEM` from the C library.
    /// The limit is exact: every byte is reserved against it (one
    /// compare-and-swap on a shared counter) before it is committed, on the
    /// slow paths that commit memory (slots carved on a slab page, slots on
    /// its purged OS pages carved again, a large span's uncommitted pages,
    /// a huge run, a segment's header), and given back when it is purged or
    /// unmapped; so committed bytes plus segment headers never pass it,
    /// however many threads allocate at once (`Stats::limit_peak_bytes`,
    /// `tests/limit.rs`). Memory already committed (a retained span, a
    /// cached huge run, free slots) is reused without a reservation. Not
    /// counted: the heap records (about 10 KiB per heap). `usize::MAX`
    /// (the default): no limit.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let c = pagewise::Config { limit_bytes: 16 << 20, ..Default::default() };
    /// let heap = pagewise::Heap::with_config(c);
    /// let l = Layout::from_size_align(10 << 20, 8).unwrap();
    /// let a = heap.allocate(l).unwrap();
    /// assert!(heap.allocate(l).is_err(), "20 MiB would pass the 16 MiB limit");
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(a.cast(), l) };
    /// // The freed 10 MiB are retained, and reused: nothing new is
    /// // committed, so the allocation succeeds.
    /// let b = heap.allocate(l).unwrap();
    /// # unsafe { heap.deallocate(b.cast(), l) };
    /// ```
    pub limit_bytes: usize,
    /// How memory is purged.
    pub purge: Purge,
    /// Whether a background thread purges expired memory (global allocator
    /// only). Without it, purging happens on the allocator's slow paths, so a
    /// process that goes quiet keeps what it had retained.
    pub background: bool,
    /// Address space mapped per reservation.
    pub reservation_bytes: usize,
    /// Whether the global allocator meshes (`PAGEWISE_MESH=1`; Linux):
    /// its memory then comes from memfd files mapped shared, and the
    /// background purger makes OS pages of one size class whose live slots
    /// sit at different offsets share one physical page (docs/design.md,
    /// "Meshing"). Read once, before the first allocation. Two hazards
    /// make it opt-in: a system call that writes into an object while its
    /// page is being copied (a few microseconds) fails with `EFAULT`, and
    /// a program that replaces the SIGSEGV handler removes the barrier
    /// that makes other writers wait. Each `fork()` copies the heap for the
    /// child while the parent waits. An owned [`Heap`](crate::Heap) meshes
    /// when its page source can share pages
    /// (`SharedPages`), through `Heap::mesh`, whatever this says.
    pub mesh: bool,
    /// Whether the heap asks the kernel for 2 MiB huge pages
    /// (`PAGEWISE_THP`; Linux): [`Thp::Auto`] (the default) on its dense
    /// parts when the kernel grants them on request, [`Thp::Never`] not
    /// at all, [`Thp::Always`] wherever a slab page starts a region.
    /// Read once, before the first allocation (docs/design.md, "Huge
    /// pages").
    pub thp: Thp,
}

impl Config {
    /// The defaults (see the module table).
    pub const DEFAULT: Config = Config {
        decay_ms: 1000,
        retain_max_bytes: usize::MAX,
        limit_bytes: usize::MAX,
        purge: Purge::DontNeed,
        background: true,
        reservation_bytes: 1 << 30,
        mesh: false,
        thp: Thp::Auto,
    };

    /// The defaults, overridden by the embedded [`pagewise_conf`]
    /// string, then `PAGEWISE_CONF`, then the separate `PAGEWISE_*`
    /// variables. Reads the environment with `getenv` (no allocation), so it
    /// is safe to call from inside the allocator. A bad entry or value is
    /// reported on one line of stderr and ignored.
    ///
    /// ```
    /// std::env::set_var("PAGEWISE_CONF", "decay_ms:500,retain_max:32M");
    /// std::env::set_var("PAGEWISE_DECAY_MS", "250");
    /// let c = pagewise::Config::from_env();
    /// assert_eq!((c.decay_ms, c.retain_max_bytes), (250, 32 << 20), "variables win");
    /// std::env::remove_var("PAGEWISE_DECAY_MS");
    /// std::env::remove_var("PAGEWISE_CONF");
    /// assert_eq!(pagewise::Config::from_env(), pagewise::Config::DEFAULT);
    /// ```
    pub fn from_env() -> Config {
        let mut c = Config::DEFAULT;
        // SAFETY: a program defines the symbol as a constant string or
        // leaves our null; nothing writes it at run time. Volatile: the
        // value is the linker's, not this crate's initialiser.
        let embedded = unsafe { core::ptr::read_volatile(&raw const pagewise_conf) };
        if !embedded.is_null() {
            // SAFETY: a NUL-terminated string (the symbol's contract).
            let text = unsafe { core::ffi::CStr::from_ptr(embedded) }.to_bytes();
            warn::apply_conf_once(&mut c, text, None);
        }
        if let Some(text) = Variable::Conf.raw() {
            warn::apply_conf_once(&mut c, text, Some(Variable::Conf));
        }
        for setting in Setting::ALL {
            let var = setting.variable();
            if let Some(value) = var.raw() {
                if let Err(accepted) = setting.apply(&mut c, value) {
                    warn::malformed(var, value, accepted);
                }
            }
        }
        warn::check_environment();
        c
    }
}

/// `getenv(name)` (NUL-terminated name) as bytes.
pub(crate) fn getenv(name: &[u8]) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; getenv returns NULL or a C string
    // that stays valid while the environment is not modified.
    let p = unsafe { libc::getenv(name.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null getenv result is a NUL-terminated string.
    Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}
