//! The global allocator's settings read and changed at run time, by name:
//! [`get`] and [`set`] (the C library's `pagewise_option_get` and
//! `pagewise_option_set`, and `mallopt(M_TRIM_THRESHOLD)`).
//!
//! | name | `PAGEWISE_*` variable | at run time | value |
//! |---|---|---|---|
//! | `decay_ms` | `PAGEWISE_DECAY_MS` | yes | ms; `-1`: never purge by age |
//! | `retain_max` | `PAGEWISE_RETAIN_MAX` | yes | bytes; `-1`: no ceiling |
//! | `limit` | `PAGEWISE_LIMIT` | yes | bytes; `-1`: no limit |
//! | `reserve` | `PAGEWISE_RESERVE` | yes (the next reservations) | bytes, at least 32 MiB |
//! | `purge` | `PAGEWISE_PURGE` | no: fixed at start | `0` dontneed, `1` free |
//! | `background` | `PAGEWISE_BACKGROUND` | no: fixed at start | `0` or `1` |
//! | `mesh` | `PAGEWISE_MESH` | no: fixed at start | `0` or `1` |
//! | `thp` | `PAGEWISE_THP` | no: fixed at start | `0` auto, `1` never, `2` always |
//!
//! `purge` is fixed because pagewise trusts purged pages to read as zero
//! after `MADV_DONTNEED` (a `calloc` does not write them): pages purged
//! with `MADV_FREE` before a switch would break that. `background` is fixed
//! because the purger thread is started (or not) once, `mesh` because the
//! heap's memory is mapped one way or the other before the first
//! allocation, `thp` because the huge pages already asked for follow the
//! setting they were asked under.
//!
//! A change applies to every thread heap at once (each heap keeps its
//! settings in atomics) and to heaps made later. Values are parsed by the
//! same parser as the environment's and `PAGEWISE_CONF`'s
//! ([`crate::config::Setting::apply`]), booleans included.

use crate::config::{Config, Setting};
use crate::os::source::Purge;
use crate::os::thp::Thp;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};

/// A heap's settings, readable and changeable from any thread (one atomic
/// per field; a reader may see a change to one field before another).
#[derive(Debug)]
pub(crate) struct LiveConfig {
    decay_ms: AtomicU64,
    retain_max_bytes: AtomicUsize,
    limit_bytes: AtomicUsize,
    purge: AtomicU8,
    background: AtomicBool,
    reservation_bytes: AtomicUsize,
    mesh: AtomicBool,
    thp: AtomicU8,
}

impl LiveConfig {
    /// Settings holding `c`.
    pub(crate) const fn new(c: Config) -> LiveConfig {
        LiveConfig {
            decay_ms: AtomicU64::new(c.decay_ms),
            retain_max_bytes: AtomicUsize::new(c.retain_max_bytes),
            limit_bytes: AtomicUsize::new(c.limit_bytes),
            purge: AtomicU8::new(c.purge as u8),
            background: AtomicBool::new(c.background),
            reservation_bytes: AtomicUsize::new(c.reservation_bytes),
            mesh: AtomicBool::new(c.mesh),
            thp: AtomicU8::new(c.thp as u8),
        }
    }

    /// A snapshot.
    pub(crate) fn get(&self) -> Config {
        Config {
            decay_ms: self.decay_ms.load(SeqCst),
            retain_max_bytes: self.retain_max_bytes.load(SeqCst),
            limit_bytes: self.limit_bytes.load(SeqCst),
            purge: self.purge(),
            background: self.background.load(SeqCst),
            reservation_bytes: self.reservation_bytes.load(SeqCst),
            mesh: self.mesh.load(SeqCst),
            thp: self.thp(),
        }
    }

    /// Stores every field of `c`.
    pub(crate) fn store(&self, c: Config) {
        self.decay_ms.store(c.decay_ms, SeqCst);
        self.retain_max_bytes.store(c.retain_max_bytes, SeqCst);
        self.limit_bytes.store(c.limit_bytes, SeqCst);
        self.purge.store(c.purge as u8, SeqCst);
        self.background.store(c.background, SeqCst);
        self.reservation_bytes.store(c.reservation_bytes, SeqCst);
        self.mesh.store(c.mesh, SeqCst);
        self.thp.store(c.thp as u8, SeqCst);
    }

    /// `Config::thp`.
    #[inline]
    pub(crate) fn thp(&self) -> Thp {
        Thp::from_u8(self.thp.load(SeqCst))
    }

    /// `Config::decay_ms`.
    #[inline]
    pub(crate) fn decay_ms(&self) -> u64 {
        self.decay_ms.load(SeqCst)
    }

    /// `Config::retain_max_bytes`.
    #[inline]
    pub(crate) fn retain_max_bytes(&self) -> usize {
        self.retain_max_bytes.load(SeqCst)
    }

    /// `Config::reservation_bytes`.
    #[inline]
    pub(crate) fn reservation_bytes(&self) -> usize {
        self.reservation_bytes.load(SeqCst)
    }

    /// `Config::limit_bytes`.
    #[inline]
    pub(crate) fn limit_bytes(&self) -> usize {
        self.limit_bytes.load(SeqCst)
    }

    /// `Config::purge`.
    #[inline]
    pub(crate) fn purge(&self) -> Purge {
        if self.purge.load(SeqCst) == Purge::Free as u8 {
            Purge::Free
        } else {
            Purge::DontNeed
        }
    }
}

/// Why [`get`] or [`set`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionError {
    /// No option has this name.
    Unknown,
    /// The value is malformed or refused; the text says what is accepted.
    Value(&'static str),
    /// The option is fixed once the allocator started.
    FixedAtStart,
}

/// What [`set`] and [`get`] said, in a line: an unknown name lists the
/// known ones.
///
/// ```
/// let e = pagewise::options::set("colour", "blue").unwrap_err();
/// assert_eq!(
///     e.to_string(),
///     "unknown option (decay_ms, retain_max, limit, purge, background, reserve, mesh, thp)"
/// );
/// ```
impl core::fmt::Display for OptionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            OptionError::Unknown => {
                f.write_str("unknown option (")?;
                for (i, s) in Setting::ALL.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, s.name())?;
                }
                f.write_str(")")
            }
            OptionError::Value(accepted) => write!(f, "bad value: expected {accepted}"),
            OptionError::FixedAtStart => f.write_str("fixed at start-up"),
        }
    }
}

/// The current value of the global allocator's option `name` (see the
/// module table): a number, `-1` for none or never, `0`/`1` for `purge`
/// (dontneed, free) and `background`.
///
/// ```
/// assert_eq!(pagewise::options::get("decay_ms"), Ok(pagewise::thread::config().decay_ms as i64));
/// assert!(pagewise::options::get("colour").is_err());
/// ```
pub fn get(name: &str) -> Result<i64, OptionError> {
    let c = crate::global::thread::config();
    let size = |v: usize| if v == usize::MAX { -1 } else { v as i64 };
    Ok(
        match Setting::from_name(name.as_bytes()).ok_or(OptionError::Unknown)? {
            Setting::DecayMs => {
                if c.decay_ms == u64::MAX {
                    -1
                } else {
                    c.decay_ms as i64
                }
            }
            Setting::RetainMax => size(c.retain_max_bytes),
            Setting::Limit => size(c.limit_bytes),
            Setting::Reserve => c.reservation_bytes as i64,
            Setting::Purge => (c.purge == Purge::Free) as i64,
            Setting::Background => c.background as i64,
            Setting::Mesh => crate::global::heaps::meshing() as i64,
            Setting::Thp => c.thp as i64,
        },
    )
}

/// Serialises [`set`]s, so that heaps see them in one order.
static SETTING: crate::sync::lock::Locked<()> = crate::sync::lock::Locked::new(());

/// Sets the global allocator's option `name` to `value` (parsed as its
/// `PAGEWISE_*` variable is: `500`, `32M`, `1.5G`, `-1`), for every thread
/// heap at once. Does not allocate.
///
/// ```
/// let before = pagewise::options::get("retain_max").unwrap();
/// pagewise::options::set("retain_max", "32MiB").unwrap();
/// assert_eq!(pagewise::options::get("retain_max"), Ok(32 << 20));
/// assert_eq!(pagewise::thread::config().retain_max_bytes, 32 << 20);
/// assert!(pagewise::options::set("retain_max", "lots").is_err());
/// assert!(pagewise::options::set("purge", "free").is_err(), "fixed at start");
/// pagewise::options::set("retain_max", &before.to_string()).unwrap();
/// ```
pub fn set(name: &str, value: &str) -> Result<(), OptionError> {
    let setting = Setting::from_name(name.as_bytes()).ok_or(OptionError::Unknown)?;
    if matches!(
        setting,
        Setting::Purge | Setting::Background | Setting::Mesh | Setting::Thp
    ) {
        return Err(OptionError::FixedAtStart);
    }
    let _one_at_a_time = SETTING.lock();
    let mut c = crate::global::thread::config();
    setting
        .apply(&mut c, value.as_bytes())
        .map_err(OptionError::Value)?;
    crate::global::thread::set_config(c);
    Ok(())
}
