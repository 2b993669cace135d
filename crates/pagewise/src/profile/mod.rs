//! The sampled heap profiler: which code holds the memory.
//!
//! With `PAGEWISE_PROF=1` the global allocator samples allocations by
//! bytes (one sample per `PAGEWISE_PROF_SAMPLE` bytes on average, 512 KiB
//! by default; the gaps are exponential, [`gap`]), takes each sample's call
//! stack ([`unwind`]) and counts what the samples stand for per call site
//! ([`sites`]): live now, at the process's committed peak (when the bytes
//! its heaps hold from the OS were highest), and allocated in all.
//! [`for_each_site`] hands the sites to a Rust program as data; [`write()`]
//! writes them, with the process's module map, in a text form that
//! `pagewise` (the command) turns into pprof, collapsed stacks and a
//! flamegraph; `PAGEWISE_PROF_FILE=path` writes it at `exit()` (`%p` in the
//! path is the process id). Owned [`Heap`](crate::Heap)s are not sampled.
//!
//! A sampled allocation of a small size is served as a large object (a
//! span of its own, of which only the OS pages it needs are committed),
//! so that its free, on any thread, finds the sample on the span's
//! descriptor; the fast paths only count down (one subtraction and
//! comparison on a line they write anyway).
//!
//! ```
//! // Without PAGEWISE_PROF=1 nothing is sampled.
//! let mut sites = 0;
//! pagewise::profile::for_each_site(|_| sites += 1);
//! assert_eq!(sites, 0);
//! assert_eq!(pagewise::profile::sample_bytes(), 0);
//! ```

pub mod gap;
pub mod recent;
pub mod sites;
pub mod unwind;
mod write;

pub use sites::{Figures, COUNT_ONE};

pub use write::{dump, write};

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The default mean bytes between samples.
pub const DEFAULT_SAMPLE: usize = 512 << 10;

/// Mean bytes between samples; 0: off; `usize::MAX`: not read yet.
static SAMPLE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Mean bytes between samples of the global allocator (0: not sampling):
/// `PAGEWISE_PROF_SAMPLE` (default [`DEFAULT_SAMPLE`]) if `PAGEWISE_PROF=1`,
/// read once, when the first thread heap is made.
pub fn sample_bytes() -> usize {
    let s = SAMPLE.load(Relaxed);
    if s != usize::MAX {
        return s;
    }
    use crate::config::Variable;
    let on = Variable::Prof.number() == Some(1);
    let mean = Variable::ProfSample
        .number()
        .map_or(DEFAULT_SAMPLE, |v| v as usize);
    let s = if on { mean } else { 0 };
    SAMPLE.store(s, Relaxed);
    s
}

/// What one sampled object stands for, kept on its span's descriptor
/// until it is freed: its site and its weight (8 bytes: every descriptor
/// has one). The figures are derived from the weight and the object's size
/// at the allocation and again at the free, by the same arithmetic, so the
/// free takes off exactly what the allocation added.
///
/// A sampled object is resized in place exactly when it would have been
/// unsampled, so that a sample is kept or lost as the objects it stands
/// for are: a small one within its class's slot (keeping the figures of
/// its size at the allocation), a large one where its span can grow or
/// shrink (its figures then follow the new size).
/// Otherwise it moves, and its new place is sampled or not as any new
/// allocation is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Its site's index + 1 (0: not sampled).
    site: u32,
    /// Allocations it stands for (`1 / p`).
    weight: f32,
}

impl Sample {
    /// Not a sample.
    pub const NONE: Sample = Sample {
        site: 0,
        weight: 0.0,
    };

    /// Whether this is a sample.
    pub fn is_some(&self) -> bool {
        self.site != 0
    }

    /// Its site's index (None: not a sample).
    pub(crate) fn site(self) -> Option<u32> {
        self.site.checked_sub(1)
    }

    /// Takes the calling stack as the site of an allocation of `size`
    /// bytes that stands for `weight` allocations, and counts it. `NONE` if
    /// the sites cannot be mapped.
    ///
    /// Only this function's own frame is left out, which is why it is
    /// never inlined: how many of the allocator's frames lie above the
    /// program's depends on what the optimizer inlined or turned into tail
    /// calls, so leaving out a fixed number more would, in some builds, cut
    /// the program's innermost frames instead. Readers drop the allocator's
    /// frames by name (the `pagewise` command does).
    #[inline(never)]
    pub(crate) fn take(size: usize, weight: f64) -> Sample {
        let mut frames = [0usize; unwind::DEPTH];
        let n = unwind::capture(&mut frames, 1);
        let Some(site) = sites::SITES.intern(&frames[..n]) else {
            return Sample::NONE;
        };
        let s = Sample {
            site: site + 1,
            weight: weight as f32,
        };
        sites::SITES.allocated(site, s.figures(size));
        s
    }

    /// What a sampled object of `size` bytes stands for.
    fn figures(self, size: usize) -> Figures {
        let w = self.weight as f64;
        Figures {
            count: (w * COUNT_ONE as f64) as u64,
            bytes: (w * size as f64) as u64,
        }
    }

    /// The sampled object, of `size` bytes (as at its allocation), is freed.
    pub(crate) fn release(self, size: usize) {
        if self.is_some() {
            sites::SITES.freed(self.site - 1, self.figures(size));
        }
    }

    /// The sampled object of `old` bytes was resized in place to `new`:
    /// its site holds what the new size stands for (not a new allocation).
    pub(crate) fn resized(self, old: usize, new: usize) {
        if self.is_some() {
            sites::SITES.freed(self.site - 1, self.figures(old));
            sites::SITES.resized(self.site - 1, self.figures(new));
        }
    }
}

/// One call site of sampled allocations, as [`for_each_site`] shows it.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    /// Return addresses, innermost first (the allocator's own frames
    /// included: a reader leaves them out by name); empty for the site that
    /// counts the stacks a full table could not tell apart.
    pub frames: &'a [usize],
    /// Estimated live allocations (in [`COUNT_ONE`] units) and bytes now.
    pub live: Figures,
    /// The same at the process's committed peak: when the bytes its heaps
    /// hold from the OS were last at their highest (within a sixteenth),
    /// which need not be when the live bytes were.
    pub peak: Figures,
    /// Estimated allocations and bytes since the process began.
    pub allocated: Figures,
}

/// Calls `f` with every call site that had a sample. It may allocate (what
/// it allocates may be sampled too).
///
/// ```
/// pagewise::profile::for_each_site(|s| println!("{} bytes live at {:x?}", s.live.bytes, s.frames));
/// ```
pub fn for_each_site(f: impl FnMut(Site<'_>)) {
    sites::SITES.for_each(f)
}

/// Estimated live bytes of every sampled call site together (0 when not
/// sampling).
///
/// ```
/// assert_eq!(pagewise::profile::live_bytes(), 0, "not sampling without PAGEWISE_PROF=1");
/// ```
pub fn live_bytes() -> u64 {
    sites::SITES.live_total()
}
