//! Reservations: large mappings of address space, carved into segments.
//!
//! A reservation is mapped once (1 GiB by default, aligned to the segment
//! size) and handed out as runs of 32 MiB segments, lowest address first.
//! Segments go back into their reservation when released; the reservation is
//! only unmapped by `trim()` (when it is entirely unused) or when its owner
//! is dropped. This is what makes "munmap only on trim or drop" true and keeps
//! page turnover free of mmap/munmap pairs.

use crate::memory::layout::{os_page, SEGMENT};
use crate::memory::registry;
use crate::os::source::PageSource;

/// Reservations an owner holds without mapping a table for them.
const INLINE: usize = 64;
/// Segments a shared reservation can be split into (one bit each).
const MAX_SEGMENTS: usize = 64;

#[derive(Clone, Copy)]
struct Reservation {
    base: usize,
    nsegs: usize,
    /// One bit per segment in use; a dedicated reservation (more than
    /// MAX_SEGMENTS segments, one huge object) uses bit 0 for "in use".
    used: u64,
}

impl Reservation {
    const EMPTY: Reservation = Reservation {
        base: 0,
        nsegs: 0,
        used: 0,
    };
    fn dedicated(&self) -> bool {
        self.nsegs > MAX_SEGMENTS
    }
    fn bytes(&self) -> usize {
        self.nsegs * SEGMENT
    }
    /// Lowest run of `n` free segments whose start is a multiple of `align_segs`
    /// (measured from address 0, so the run's address is aligned).
    fn find_run(&self, n: usize, align_segs: usize) -> Option<usize> {
        if self.dedicated() || n > self.nsegs {
            return None;
        }
        let first = self.base / SEGMENT;
        let mut i = 0;
        while i + n <= self.nsegs {
            if (first + i) % align_segs != 0 {
                i += 1;
                continue;
            }
            let mask = run_mask(i, n);
            if self.used & mask == 0 {
                return Some(i);
            }
            i += 1;
        }
        None
    }
}

fn run_mask(start: usize, n: usize) -> u64 {
    let ones = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    ones << start
}

/// The list of reservations: the first [`INLINE`] entries in place (a
/// program that needs no more maps nothing for them), the rest in a table
/// mapped from the page source and doubled when full, so the number of
/// reservations is bounded by what the kernel maps, nothing else. Never
/// from the global allocator, which may be pagewise itself.
struct Table {
    inline: [Reservation; INLINE],
    spill: *mut Reservation,
    spill_cap: usize,
    len: usize,
}

impl Table {
    const fn new() -> Table {
        Table {
            inline: [Reservation::EMPTY; INLINE],
            spill: core::ptr::null_mut(),
            spill_cap: 0,
            len: 0,
        }
    }

    fn entries(&mut self) -> impl Iterator<Item = &mut Reservation> {
        let spilled = self.len.saturating_sub(INLINE);
        let spill: &mut [Reservation] = if spilled == 0 {
            &mut []
        } else {
            // SAFETY: the spill table holds `spill_cap >= spilled`
            // initialised entries, owned by this table.
            unsafe { core::slice::from_raw_parts_mut(self.spill, spilled) }
        };
        self.inline[..self.len.min(INLINE)]
            .iter_mut()
            .chain(spill.iter_mut())
    }

    /// An unused entry (one freed by `unmap_unused`, or a new one at the
    /// end, growing the spill table if needed). None if the source cannot
    /// map a bigger table.
    fn free_entry(&mut self, source: &dyn PageSource) -> Option<&mut Reservation> {
        let reuse = self.entries().position(|r| r.base == 0);
        let i = match reuse {
            Some(i) => i,
            None => {
                if self.len >= INLINE + self.spill_cap {
                    self.grow(source)?;
                }
                self.len += 1;
                self.len - 1
            }
        };
        self.entries().nth(i)
    }

    fn grow(&mut self, source: &dyn PageSource) -> Option<()> {
        let entry = core::mem::size_of::<Reservation>();
        let cap = (self.spill_cap * 2).max(os_page() / entry);
        let bytes = crate::memory::layout::align_up(cap * entry, os_page());
        let new = source.map(bytes, os_page())?.as_ptr() as *mut Reservation;
        // SAFETY: `new` is fresh, zeroed memory for `bytes / entry >= cap`
        // entries (an all-zero entry is `EMPTY`); the old table holds
        // `spill_cap` entries and is unmapped after the copy.
        unsafe {
            core::ptr::copy_nonoverlapping(self.spill, new, self.spill_cap);
            self.unmap_spill(source);
        }
        self.spill = new;
        self.spill_cap = bytes / entry;
        Some(())
    }

    /// Unmaps the spill table.
    ///
    /// # Safety
    /// Its entries are not used afterwards (copied, or the owner is going).
    unsafe fn unmap_spill(&mut self, source: &dyn PageSource) {
        if let Some(p) = core::ptr::NonNull::new(self.spill) {
            let bytes = crate::memory::layout::align_up(
                self.spill_cap * core::mem::size_of::<Reservation>(),
                os_page(),
            );
            // SAFETY: mapped by `grow` from this source with this size.
            unsafe { source.unmap(p.cast(), bytes) };
        }
        self.spill = core::ptr::null_mut();
        self.spill_cap = 0;
    }
}

/// The reservations of one owner (the global allocator, or one `Heap`).
pub struct Reservations {
    table: Table,
    /// Bytes of address space mapped by these reservations.
    pub reserved_bytes: usize,
    /// Segments currently handed out.
    pub segments_in_use: usize,
    /// Reservations of an owned `Heap` (registered as such).
    owned: bool,
}

impl Reservations {
    /// No reservations yet (the global allocator's).
    pub const fn new() -> Self {
        Reservations {
            table: Table::new(),
            reserved_bytes: 0,
            segments_in_use: 0,
            owned: false,
        }
    }

    /// No reservations yet, for an owned `Heap`.
    pub const fn owned() -> Self {
        Reservations {
            owned: true,
            ..Reservations::new()
        }
    }

    /// Hands out `n` contiguous segments whose base is aligned to `align`
    /// (a power of two, at least SEGMENT), mapping a new reservation of
    /// `preferred` bytes (or a dedicated one for big runs) when none has room.
    /// The run is registered in the global segment registry. With
    /// `refuse_huge`, a new reservation is advised never to be huge pages
    /// (`MADV_NOHUGEPAGE`) before any of it is used: under the kernel's
    /// `always` setting, the heap asks for them only where its pages are
    /// dense (`memory/huge_pages.rs`).
    pub fn take(
        &mut self,
        source: &dyn PageSource,
        n: usize,
        align: usize,
        preferred: usize,
        refuse_huge: bool,
    ) -> Option<usize> {
        let align_segs = (align / SEGMENT).max(1);
        let base = match self.take_existing(n, align_segs) {
            Some(b) => b,
            None => self.take_new(source, n, align, preferred, refuse_huge)?,
        };
        self.segments_in_use += n;
        registry::register(base, n, self.owned);
        Some(base)
    }

    fn take_existing(&mut self, n: usize, align_segs: usize) -> Option<usize> {
        for r in self.table.entries() {
            if r.base == 0 {
                continue;
            }
            if let Some(i) = r.find_run(n, align_segs) {
                r.used |= run_mask(i, n);
                return Some(r.base + i * SEGMENT);
            }
        }
        None
    }

    fn take_new(
        &mut self,
        source: &dyn PageSource,
        n: usize,
        align: usize,
        preferred: usize,
        refuse_huge: bool,
    ) -> Option<usize> {
        let shared_segs = (preferred / SEGMENT).clamp(1, MAX_SEGMENTS);
        let nsegs = if n <= shared_segs && align <= SEGMENT {
            shared_segs
        } else {
            n
        };
        let align = align.max(SEGMENT);
        let (base, nsegs) = match map_reservation(source, nsegs * SEGMENT, align) {
            Some(b) => (b, nsegs),
            // Short of address space or commit charge: try just what is needed.
            None if nsegs != n => (map_reservation(source, n * SEGMENT, align)?, n),
            None => return None,
        };
        let Some(r) = self.table.free_entry(source) else {
            // SAFETY: just mapped, unused.
            unsafe { unmap(source, base, nsegs * SEGMENT) };
            return None;
        };
        *r = Reservation {
            base,
            nsegs,
            used: 0,
        };
        if r.dedicated() {
            r.used = 1;
        } else {
            r.used |= run_mask(0, n);
        }
        self.reserved_bytes += nsegs * SEGMENT;
        if refuse_huge {
            // SAFETY: the reservation just mapped; the advice changes no
            // contents. Refused, the kernel's default stays (as today).
            unsafe {
                source.advise_huge(
                    core::ptr::NonNull::new_unchecked(base as *mut u8),
                    nsegs * SEGMENT,
                    false,
                )
            };
        }
        Some(base)
    }

    /// Returns `n` segments at `base` to their reservation (address space kept).
    pub fn give_back(&mut self, base: usize, n: usize) {
        registry::unregister(base, n);
        self.segments_in_use -= n;
        for r in self.table.entries() {
            if r.base != 0 && base >= r.base && base < r.base + r.bytes() {
                if r.dedicated() {
                    r.used = 0;
                } else {
                    r.used &= !run_mask((base - r.base) / SEGMENT, n);
                }
                return;
            }
        }
        debug_assert!(false, "segment run not in any reservation");
    }

    /// Unmaps every reservation with no segment in use. Returns bytes unmapped.
    pub fn unmap_unused(&mut self, source: &dyn PageSource) -> usize {
        let mut freed = 0;
        for r in self.table.entries() {
            if r.base != 0 && r.used == 0 {
                // SAFETY: no segment of this reservation is handed out, so
                // nothing in it is in use; it was mapped by `source`.
                unsafe { unmap(source, r.base, r.bytes()) };
                freed += r.bytes();
                *r = Reservation::EMPTY;
            }
        }
        self.reserved_bytes -= freed;
        freed
    }

    /// Unmaps every reservation, in use or not (the owner is going away).
    ///
    /// # Safety
    /// Nothing inside any reservation is used afterwards.
    pub unsafe fn unmap_all(&mut self, source: &dyn PageSource) {
        for r in self.table.entries() {
            if r.base != 0 {
                registry::unregister(r.base, r.nsegs);
                // SAFETY: the caller guarantees no further use; `source` mapped it.
                unsafe { unmap(source, r.base, r.bytes()) };
                *r = Reservation::EMPTY;
            }
        }
        // SAFETY: the entries are gone with the reservations.
        unsafe { self.table.unmap_spill(source) };
        self.table.len = 0;
        self.reserved_bytes = 0;
        self.segments_in_use = 0;
    }
}

// SAFETY: the spill table is memory this value owns (mapped for it, never
// shared); moving the value moves that ownership.
unsafe impl Send for Reservations {}

impl Default for Reservations {
    fn default() -> Self {
        Self::new()
    }
}

fn map_reservation(source: &dyn PageSource, bytes: usize, align: usize) -> Option<usize> {
    let p = source.map(bytes, align)?.as_ptr() as usize;
    if !registry::addressable(p, bytes / SEGMENT) {
        // SAFETY: just mapped, unused.
        unsafe { unmap(source, p, bytes) };
        return None;
    }
    Some(p)
}

/// # Safety
/// `base..base+bytes` is a whole mapping from `source`, no longer used.
unsafe fn unmap(source: &dyn PageSource, base: usize, bytes: usize) {
    if let Some(p) = core::ptr::NonNull::new(base as *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { source.unmap(p, bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::source::FakePages;

    #[test]
    fn carves_reservation_lowest_first_and_reuses() {
        let src = FakePages::new();
        let mut r = Reservations::new();
        let a = r.take(&src, 1, SEGMENT, 4 * SEGMENT, false).unwrap();
        let b = r.take(&src, 2, SEGMENT, 4 * SEGMENT, false).unwrap();
        assert_eq!(b, a + SEGMENT);
        assert_eq!(src.syscalls().mmap, 1);
        r.give_back(a, 1);
        let c = r.take(&src, 1, SEGMENT, 4 * SEGMENT, false).unwrap();
        assert_eq!(c, a, "lowest free segment reused");
        assert_eq!(src.syscalls().mmap, 1);
        // A run larger than the reservation gets a dedicated one.
        let d = r.take(&src, 5, SEGMENT, 4 * SEGMENT, false).unwrap();
        assert_eq!(src.syscalls().mmap, 2);
        r.give_back(d, 5);
        assert_eq!(r.unmap_unused(&src), 5 * SEGMENT);
        assert_eq!(src.syscalls().munmap, 1);
        r.give_back(b, 2);
        r.give_back(c, 1);
        assert_eq!(r.unmap_unused(&src), 4 * SEGMENT);
        assert_eq!(src.syscalls().mapped_bytes, 0);
    }
}
