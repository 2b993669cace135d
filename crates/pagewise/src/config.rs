//! The retention policy: how long freed memory is kept for reuse, how much,
//! and how it is given back. Readable from `PAGEWISE_*` environment variables.
//!
//! | variable | field | default | meaning |
//! |---|---|---|---|
//! | `PAGEWISE_DECAY_MS` | [`Config::decay_ms`] | 1000 | ms a freed span stays committed before it is purged |
//! | `PAGEWISE_RETAIN_MAX` | [`Config::retain_max_bytes`] | none | ceiling on the committed free bytes kept by the whole process (every thread heap together; an owned `Heap` alone); below it, retention follows demand ([`crate::budget`]) |
//! | `PAGEWISE_LIMIT` | [`Config::limit_bytes`] | none | hard limit on committed bytes (every thread heap together; an owned `Heap` alone): an allocation that would pass it first purges everything retained it can reach, then fails (null, `ENOMEM` in C) |
//! | `PAGEWISE_PURGE` | [`Config::purge`] | `dontneed` | `dontneed` (RSS drops at once) or `free` (MADV_FREE) |
//! | `PAGEWISE_BACKGROUND` | [`Config::background`] | `1` | a background thread purges expired memory of idle threads |
//! | `PAGEWISE_RESERVE` | [`Config::reservation_bytes`] | 1G | address space mapped at a time |
//!
//! Sizes accept `K`, `M`, `G` suffixes. A malformed value prints one line on
//! stderr and the default is used.

use crate::os::source::Purge;

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
    /// turnover into madvise calls: the thrash of seed 000).
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
    /// The check is made when a span is taken (a slab page, a large or huge
    /// object), so the count may pass the limit by the slots of a slab page
    /// being filled. `usize::MAX` (the default): no limit.
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
    /// // The freed 10 MiB are retained; under the limit they are purged
    /// // to make room, and the allocation succeeds.
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
    };

    /// The defaults, overridden by `PAGEWISE_*` environment variables.
    /// Reads the environment with `getenv` (no allocation), so it is safe to
    /// call from inside the allocator.
    ///
    /// ```
    /// std::env::set_var("PAGEWISE_DECAY_MS", "250");
    /// assert_eq!(pagewise::Config::from_env().decay_ms, 250);
    /// std::env::remove_var("PAGEWISE_DECAY_MS");
    /// assert_eq!(pagewise::Config::from_env(), pagewise::Config::DEFAULT);
    /// ```
    pub fn from_env() -> Config {
        let mut c = Config::DEFAULT;
        if let Some(v) = env_parse(b"PAGEWISE_DECAY_MS\0", parse_u64) {
            c.decay_ms = v;
        }
        if let Some(v) = env_parse(b"PAGEWISE_RETAIN_MAX\0", parse_size) {
            c.retain_max_bytes = v as usize;
        }
        if let Some(v) = env_parse(b"PAGEWISE_LIMIT\0", parse_size) {
            c.limit_bytes = v as usize;
        }
        if let Some(v) = env_parse(b"PAGEWISE_PURGE\0", parse_purge) {
            c.purge = v;
        }
        if let Some(v) = env_parse(b"PAGEWISE_BACKGROUND\0", parse_bool) {
            c.background = v;
        }
        if let Some(v) = env_parse(b"PAGEWISE_RESERVE\0", parse_size) {
            c.reservation_bytes = (v as usize).max(crate::memory::layout::SEGMENT);
        }
        c
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

fn env_parse<T>(name: &[u8], parse: fn(&[u8]) -> Option<T>) -> Option<T> {
    // SAFETY: `name` is NUL-terminated; getenv returns NULL or a C string
    // that stays valid while the environment is not modified.
    let p = unsafe { libc::getenv(name.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null getenv result is a NUL-terminated string.
    let value = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
    let parsed = parse(value);
    if parsed.is_none() {
        let key = &name[..name.len() - 1];
        crate::fault::write_stderr(&[
            b"pagewise: ignoring malformed ",
            key,
            b"=",
            value,
            b" (using the default)\n",
        ]);
    }
    parsed
}

/// Parses a decimal integer.
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + (b - b'0') as u64)
    })
}

/// Parses a size with an optional K/M/G suffix.
///
/// ```
/// use pagewise::config::parse_size;
/// assert_eq!(parse_size(b"64M"), Some(64 << 20));
/// assert_eq!(parse_size(b"12"), Some(12));
/// assert_eq!(parse_size(b"x"), None);
/// ```
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let (digits, shift) = match s.last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    parse_u64(digits)?.checked_mul(1 << shift)
}

fn parse_purge(s: &[u8]) -> Option<Purge> {
    match s {
        b"dontneed" | b"DONTNEED" => Some(Purge::DontNeed),
        b"free" | b"FREE" => Some(Purge::Free),
        _ => None,
    }
}

fn parse_bool(s: &[u8]) -> Option<bool> {
    match s {
        b"1" | b"true" | b"on" | b"yes" => Some(true),
        b"0" | b"false" | b"off" | b"no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values() {
        assert_eq!(parse_u64(b"1500"), Some(1500));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_size(b"1G"), Some(1 << 30));
        assert_eq!(parse_purge(b"free"), Some(Purge::Free));
        assert_eq!(parse_bool(b"0"), Some(false));
        assert_eq!(parse_bool(b"maybe"), None);
    }
}
