//! `fork()` of a process whose heap is shared pages: the child gets a copy
//! of its own, made while the parent's other threads go on.
//!
//! The heap's mappings are `MADV_DONTFORK` (a child never inherits them).
//! Its own pages are private memory, and the child of a prepared fork
//! inherits them copy-on-write: they are made `MADV_DOFORK` for the fork
//! (the parent's and the child's handlers make them `MADV_DONTFORK`
//! again). Its group pages, shared, are never inherited: before the fork,
//! with every allocator lock held, the forking thread makes a new file per
//! mapping and copies the group pages into it: they are made read-only
//! first, so that what is copied is the group pages of one instant, and
//! writable again once they are copied. Another thread that stores to a
//! group page not yet copied takes a write-protection fault, and the
//! barrier's handler copies that page's chunk (16 OS pages) itself (or
//! waits for the chunk being copied), makes the page writable and returns;
//! own pages are never made read-only. Each chunk of each file
//! has a state (untouched, being copied, copied), so a chunk is copied
//! once, by whoever comes first, and never after it may have changed.
//!
//! The child maps the copied group pages where the old ones were in its
//! fork handler, or at its first touch of one if that comes earlier (glibc
//! frees memory in the child before the handlers run): a fault on a page it
//! did not inherit, which the barrier hands to
//! [`map_in_child`]. The parent closes its copies of the new files.
//!
//! What it cannot do: a system call that writes into a group page not yet
//! copied fails with `EFAULT` (the kernel does not fault on its behalf),
//! while the copy lasts.

use super::{advice_call, close, getpid, memfd, page, Mapping, SharedPages};
use crate::os::barrier;
use crate::os::descriptor::Kept;
use crate::sync::lock;
use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The source the fork handlers copy (one per process: the global one).
static FORK_SOURCE: AtomicPtr<SharedPages> = AtomicPtr::new(null_mut());
/// Whether the child has mapped its copies (once).
static CHILD_MAPPED: AtomicBool = AtomicBool::new(false);

/// States of a file page while a fork is prepared.
const UNTOUCHED: u32 = 0;
const COPYING: u32 = 1;
/// Being copied, and a thread waits for it (the copier wakes it).
const WAITED: u32 = 2;
const COPIED: u32 = 3;

/// OS pages the forking thread copies and makes writable at a time.
const CHUNK: usize = 16;

impl SharedPages {
    /// Before `fork()`, with every allocator lock held: holds the table
    /// and gives every mapping a copy of its file for the child (see the
    /// module), other threads' stores waiting at most for one chunk.
    pub(crate) fn fork_prepare(&'static self) {
        lock::hold(&self.maps);
        FORK_SOURCE.store(self as *const SharedPages as *mut SharedPages, Release);
        CHILD_MAPPED.store(false, Relaxed);
        // SAFETY: held above, by this thread, until `fork_parent`/`fork_child`.
        let maps = unsafe { &mut *self.maps.held_data() };
        for m in maps.used().iter_mut().filter(|m| m.size != 0) {
            // A child's mappings start with an `anon_vma` of their own
            // each, or none where the parent had none: none is left unset.
            m.settle();
            prepare_copy(m);
        }
        let mask = crate::os::signals::block_async();
        // The handler in front: a fault in the child before its fork
        // handler ran maps its copy (`barrier::fork_begin`).
        crate::os::segv::ensure();
        barrier::raise();
        barrier::fork_begin(map_in_child, copy_on_fault);
        for m in maps.used().iter().filter(|m| m.child_fd >= 0) {
            // Own pages have nothing to copy: the child inherits them.
            for c in 0..m.chunks_per_half() {
                m.state(c).store(COPIED, Relaxed);
            }
            // SAFETY: our group pages, made writable again below. By
            // `mprotect`: a store's fault copies its page at once.
            group_runs(m, |at, len| unsafe {
                barrier::protect_by_mprotect(at, len)
            });
        }
        for m in maps.used().iter_mut().filter(|m| m.child_fd >= 0) {
            if !copy_for_child(m) {
                close(core::mem::replace(&mut m.child_fd, -1));
            }
            // SAFETY: as above (all of them, whatever the copy did).
            group_runs(m, |at, len| unsafe { barrier::unprotect(at, len) });
        }
        barrier::lower();
        for m in maps.used().iter().filter(|m| m.child_fd >= 0) {
            own_pages_advise(m, libc::MADV_DOFORK);
        }
        crate::os::signals::restore(mask);
    }

    /// In the parent after `fork()`: drops the child's files.
    pub(crate) fn fork_parent(&self) {
        // SAFETY: held since `fork_prepare` by this thread.
        for m in unsafe { (*self.maps.held_data()).used().iter_mut() } {
            if m.child_fd >= 0 {
                own_pages_advise(m, libc::MADV_DONTFORK);
            }
            end_copy(m);
        }
        barrier::fork_end();
        // SAFETY: taken with `hold` in `fork_prepare`.
        unsafe { lock::release(&self.maps) };
    }

    /// In the child after `fork()`: maps its copies, unless a fault did.
    pub(crate) fn fork_child(&self) {
        map_in_child();
        // No pass of the parent's goes on here: copies read the limit.
        self.pass_limit
            .store(0, core::sync::atomic::Ordering::Relaxed);
        crate::os::uffd::forget_in_child();
        barrier::home_is_here();
        barrier::fork_end();
        // SAFETY: in the child only this thread exists.
        unsafe { self.maps.reset_after_fork() };
    }
}

/// A new file for `m`'s copy and a state per page of it; on failure
/// (`child_fd` -1) the child gets no copy of `m`.
fn prepare_copy(m: &mut Mapping) {
    m.child_fd = -1;
    m.copy_state = null_mut();
    if !m.fd.is_some() {
        // Private memory: the child inherits it as any private mapping.
        return;
    }
    if !super::file_limit_allows(2 * m.size) {
        return;
    }
    // Out of the program's way, as the mapping's own (`os/descriptor.rs`).
    let Some(fd) = memfd().and_then(|fd| Kept::keep(fd).get()) else {
        return;
    };
    let states = crate::os::source::map_table(state_bytes(m));
    // SAFETY: our new file.
    if states.is_none() || unsafe { libc::ftruncate(fd, (2 * m.size) as libc::off_t) } != 0 {
        if let Some(t) = states {
            // SAFETY: just mapped, unused.
            unsafe { crate::os::source::unmap_table(t, state_bytes(m)) };
        }
        close(fd);
        return;
    }
    m.child_fd = fd;
    m.copy_state = states.map_or(null_mut(), |t| t.as_ptr().cast());
}

/// In the parent after the fork: closes the child's file, drops the states.
fn end_copy(m: &mut Mapping) {
    close(core::mem::replace(&mut m.child_fd, -1));
    if let Some(t) = core::ptr::NonNull::new(core::mem::replace(&mut m.copy_state, null_mut())) {
        // SAFETY: mapped by `prepare_copy`, no longer used (the fork is over).
        unsafe { crate::os::source::unmap_table(t.cast(), state_bytes(m)) };
    }
}

/// Bytes of the copy states of `m`: one per chunk of each half of its
/// file.
fn state_bytes(m: &Mapping) -> usize {
    2 * m.pages().div_ceil(CHUNK) * 4
}

impl Mapping {
    /// The copy state of chunk `c` of the file (pages `c * CHUNK..`).
    fn state(&self, c: usize) -> &AtomicU32 {
        // SAFETY: `copy_state` has a state per chunk of the file.
        unsafe { &*self.copy_state.add(c) }
    }

    /// Claims chunk `c` for this thread's copy.
    fn claim(&self, c: usize) -> bool {
        self.state(c)
            .compare_exchange(UNTOUCHED, COPYING, Acquire, Relaxed)
            .is_ok()
    }

    /// Marks chunk `c` (claimed) copied, waking any waiter.
    fn copied(&self, c: usize) {
        if self.state(c).swap(COPIED, AcqRel) == WAITED {
            futex(self.state(c), libc::FUTEX_WAKE, i32::MAX as u32);
        }
    }

    /// Waits until chunk `c` is copied by whoever claimed it.
    fn wait_copied(&self, c: usize) {
        loop {
            match self.state(c).load(Acquire) {
                COPIED | UNTOUCHED => return,
                COPYING => {
                    let _ = self
                        .state(c)
                        .compare_exchange(COPYING, WAITED, Relaxed, Relaxed);
                }
                _ => futex(self.state(c), libc::FUTEX_WAIT, WAITED),
            }
        }
    }

    /// Chunks of each half of the file (a chunk never straddles them).
    fn chunks_per_half(&self) -> usize {
        self.pages().div_ceil(CHUNK)
    }

    /// The chunk holding file page `f`.
    fn chunk_of(&self, f: usize) -> usize {
        let (half, at) = (f / self.pages(), f % self.pages());
        half * self.chunks_per_half() + at / CHUNK
    }

    /// File pages of chunk `c`.
    fn chunk(&self, c: usize) -> (usize, usize) {
        let (half, k) = (c / self.chunks_per_half(), c % self.chunks_per_half());
        let base = half * self.pages();
        (
            base + k * CHUNK,
            (base + (k + 1) * CHUNK).min(base + self.pages()),
        )
    }

    /// Copies file pages `first..end` to the child's file: from the
    /// mapping's file, or if the program took its descriptor away
    /// ([`Kept::get`]), from the pages that show them.
    fn copy_pages(&self, first: usize, end: usize) -> bool {
        let Some(fd) = self.fd.get() else {
            return (first..end).all(|f| self.copy_page_from_memory(f));
        };
        let len = ((end - first) * page()) as libc::off_t;
        copy_range(fd, self.child_fd, (first * page()) as libc::off_t, len)
    }

    /// Copies file page `f` to the child's file from an OS page of the
    /// mapping that shows it (a group page: `f` in the second half), if
    /// one does; the first half is never written.
    fn copy_page_from_memory(&self, f: usize) -> bool {
        let Some(g) = f.checked_sub(self.pages()) else {
            return true;
        };
        if self.group.is_null() {
            return true;
        }
        // The founder first: it shows its group page while it is a member.
        let shows = |i: usize| self.group_of(i) as usize == g + 1;
        let Some(i) = core::iter::once(g)
            .chain(0..self.pages())
            .find(|&i| shows(i))
        else {
            return true; // no member: the group page holds nothing
        };
        let at = self.base + i * page();
        // SAFETY: an OS page of our mapping showing the group page (read,
        // not written: it may be write-protected for the copy).
        let n = unsafe {
            libc::pwrite(
                self.child_fd,
                at as *const libc::c_void,
                page(),
                (f * page()) as libc::off_t,
            )
        };
        n == page() as isize
    }

    /// The first page of `at..to` (file pages of the second half) that may
    /// hold data (`to` if none): from the file, or with the file lost, the
    /// first group page with a member.
    fn data_from(&self, at: usize, to: usize) -> usize {
        match self.fd.get() {
            Some(fd) => seek(fd, at, libc::SEEK_DATA).map_or(to, |d| (d / page()).clamp(at, to)),
            None => (at..to).find(|&f| self.member_count(f) != 0).unwrap_or(to),
        }
    }

    /// The first page after `data` (which holds data) that holds none,
    /// as [`Mapping::data_from`] (`to` if none).
    fn hole_from(&self, data: usize, to: usize) -> usize {
        match self.fd.get() {
            Some(fd) => seek(fd, data, libc::SEEK_HOLE)
                .map_or(to, |h| h.div_ceil(page()).clamp(data + 1, to)),
            None => (data + 1..to)
                .find(|&f| self.member_count(f) == 0)
                .unwrap_or(to),
        }
    }

    /// Members of the group whose page is file page `f` (0 in the first
    /// half, or with no tables).
    fn member_count(&self, f: usize) -> u32 {
        match f.checked_sub(self.pages()) {
            // SAFETY: the tables hold a count per OS page of the mapping.
            Some(g) if !self.members.is_null() => unsafe { *self.members.add(g) },
            _ => 0,
        }
    }

    /// Makes sure the chunk holding file page `f` is in the child's file:
    /// copies it (nothing if it holds no data; whole, holes and all, if
    /// it holds some), or waits for the thread that does.
    fn ensure_copied(&self, f: usize) {
        let c = self.chunk_of(f);
        if !self.claim(c) {
            self.wait_copied(c);
            return;
        }
        let (a, b) = self.chunk(c);
        if self.data_from(a, b) < b {
            let _ = self.copy_pages(a, b);
        }
        self.copied(c);
    }
}

/// Copies `m`'s group pages for the child. False if a copy failed (the
/// child then gets none of `m`).
fn copy_for_child(m: &mut Mapping) -> bool {
    let pages = m.pages();
    copy_chunks(m, pages, 2 * pages, false)
}

/// Calls `f` on every run of `m`'s OS pages that show group pages, as an
/// address and a length.
fn group_runs(m: &Mapping, mut f: impl FnMut(usize, usize) -> bool) {
    let mut i = 0;
    while i < m.pages() {
        if m.group_of(i) == 0 {
            i += 1;
            continue;
        }
        let end = (i..m.pages())
            .find(|&j| m.group_of(j) == 0)
            .unwrap_or(m.pages());
        f(m.base + i * page(), (end - i) * page());
        i = end;
    }
}

/// `madvise(advice)` on every run of `m`'s OS pages that show their own
/// private memory (not a group page).
fn own_pages_advise(m: &Mapping, advice: i32) {
    let mut i = 0;
    while i < m.pages() {
        let end = (i..m.pages())
            .find(|&j| m.group_of(j) != 0)
            .unwrap_or(m.pages());
        if end > i {
            // SAFETY: own pages of our mapping; only whether a child
            // inherits them changes.
            unsafe {
                libc::madvise(
                    (m.base + i * page()) as *mut libc::c_void,
                    (end - i) * page(),
                    advice,
                )
            };
        }
        i = end + 1;
    }
}

/// Copies the chunks of file pages `from..to` (one half of the file) of `m`,
/// their runs of data found with one `SEEK_DATA` and one `SEEK_HOLE` per
/// run (`SEEK_HOLE` walks to the end of a run: asked per chunk, the copy
/// would be quadratic); `writable`: make the virtual pages of each chunk
/// writable once it is copied (the first half), chunks of holes together.
fn copy_chunks(m: &Mapping, from: usize, to: usize, writable: bool) -> bool {
    let mut ok = true;
    // The current run of data, [data, hole): the first whose end is past
    // the chunk looked at.
    let next_run = |at: usize| {
        let data = m.data_from(at, to);
        let hole = if data < to { m.hole_from(data, to) } else { to };
        (data, hole)
    };
    let (mut data, mut hole) = next_run(from);
    let mut idle_from = from;
    let mut c = m.chunk_of(from);
    while c < m.chunk_of(to - 1) + 1 {
        let (a, b) = m.chunk(c);
        if data >= b {
            // No data in this chunk: claimed as copied (a fault's copy
            // under way is waited for), made writable with its neighbours.
            if m.claim(c) {
                m.copied(c);
            } else {
                m.wait_copied(c);
            }
            c += 1;
            continue;
        }
        if writable {
            let_in(m, idle_from, a);
        }
        if m.claim(c) {
            while data < b {
                ok &= m.copy_pages(data.max(a), hole.min(b));
                if hole > b {
                    break;
                }
                (data, hole) = next_run(hole);
            }
            m.copied(c);
        } else {
            m.wait_copied(c);
            while hole <= b && data < to {
                (data, hole) = next_run(hole);
            }
        }
        if writable {
            let_in(m, a, b);
        }
        idle_from = b;
        c += 1;
    }
    if writable {
        let_in(m, idle_from, to);
    }
    ok
}

/// Makes the virtual pages `first..end` of `m` writable (their file pages,
/// and every group page, are copied).
fn let_in(m: &Mapping, first: usize, end: usize) {
    if end > first {
        // SAFETY: pages of our mapping, protected by `fork_prepare`.
        unsafe { barrier::unprotect(m.base + first * page(), (end - first) * page()) };
    }
}

/// The barrier's handler in the parent, for a store to `addr` (a page of
/// the heap, read-only while the fork is prepared): copies the page it
/// shows for the child (or waits for whoever does) and makes it writable.
/// False if `addr` is in no mapping being copied. Async-signal-safe.
pub(crate) fn copy_on_fault(addr: usize) -> bool {
    let source = FORK_SOURCE.load(Acquire);
    if source.is_null() {
        return false;
    }
    // SAFETY: the static global source; its table is held by the forking
    // thread, which changes nothing in it while the copy is under way.
    let maps = unsafe { &*(*source).maps.held_data() };
    let Some(m) = maps.maps[..maps.high]
        .iter()
        .find(|m| m.contains(addr) && m.child_fd >= 0 && !m.copy_state.is_null())
    else {
        return false;
    };
    let g = m.group_of(m.index(addr));
    if g != 0 {
        m.ensure_copied(m.pages() + g as usize - 1);
    }
    let at = addr & !(page() - 1);
    // SAFETY: a page of our mapping whose bytes the child has now.
    unsafe { barrier::unprotect(at, page()) }
}

/// In the child, once (its fork handler, or its first touch of the heap):
/// maps the copies the parent made where the old files were, aliases
/// included. Async-signal-safe: system calls only, on the table the only
/// thread there is holds. True if it mapped them now.
pub(crate) fn map_in_child() -> bool {
    if CHILD_MAPPED.swap(true, AcqRel) {
        return false;
    }
    let source = FORK_SOURCE.load(Acquire);
    if source.is_null() {
        return false;
    }
    // SAFETY: see above.
    let maps = unsafe { &mut *(*source).maps.held_data() };
    let mut missing = false;
    for m in maps
        .used()
        .iter_mut()
        .filter(|m| m.size != 0 && m.fd.is_some())
    {
        missing |= !map_copy(m);
    }
    if missing {
        crate::fault::write_stderr(&[
            b"pagewise: the heap could not be copied for this child (no memfd: memory, the open \
files limit or the file size limit); it may only exec or _exit\n",
        ]);
    }
    true
}

/// Maps `m`'s copied group pages where the old ones were (the child
/// inherited its own pages, not those).
fn map_copy(m: &mut Mapping) -> bool {
    let fd = core::mem::replace(&mut m.child_fd, -1);
    m.copy_state = null_mut();
    if fd < 0 {
        return false;
    }
    for i in 0..if m.group.is_null() { 0 } else { m.pages() } {
        let g = m.group_of(i);
        if g != 0 {
            let addr = m.base + i * page();
            let offset = m.size + (g as usize - 1) * page();
            // SAFETY: an OS page of the mapping (not inherited: nothing is
            // there), pointed at the copy of its group's page.
            unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    page(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    fd,
                    offset as libc::off_t,
                )
            };
            // With its region's huge-page flag, as in the parent (else the
            // kernel would not merge it with its neighbours as there).
            if let Some(advice) = advice_call(m.advice_of(i)) {
                // SAFETY: the page just mapped; the advice changes no contents.
                unsafe { libc::madvise(addr as *mut libc::c_void, page(), advice) };
            }
        }
    }
    // Each private mapping the child inherited has an `anon_vma` of its
    // own (the kernel's fork gives each one; neighbours of one lineage
    // were one mapping, so they stay one), and a new mapping never merges
    // with one of them (its `anon_vma` has the parent's as well).
    m.sealed = m.lineages.max(1);
    // The kernel registered none of the child's mappings with the parent's
    // userfaultfd (it has no fork events), nor can the child's pages be.
    m.uffd = false;
    // The child's own children inherit none of it either.
    // SAFETY: our mapping; only whether a child inherits it changes.
    unsafe { libc::madvise(m.base as *mut libc::c_void, m.size, libc::MADV_DONTFORK) };
    // The parent's file, unless the program put one of its own at the
    // number (then it is the program's to close).
    m.fd.close();
    m.fd = Kept::keep(fd);
    m.pid = getpid();
    true
}

/// `lseek(fd, page * page(), whence)` in bytes, or `None` (no data past it).
fn seek(fd: i32, page_index: usize, whence: i32) -> Option<usize> {
    // SAFETY: plain system call on our file.
    let at = unsafe { libc::lseek(fd, (page_index * page()) as libc::off_t, whence) };
    (at >= 0).then_some(at as usize)
}

/// Copies `len` bytes at `offset` of `from` to the same offset of `to`.
fn copy_range(from: i32, to: i32, offset: libc::off_t, len: libc::off_t) -> bool {
    let (mut src, mut dst) = (offset, offset);
    let end = offset + len;
    while src < end {
        // SAFETY: our files, offsets in range.
        let n =
            unsafe { libc::copy_file_range(from, &mut src, to, &mut dst, (end - src) as usize, 0) };
        if n <= 0 {
            return copy_range_by_hand(from, to, src, end - src);
        }
    }
    true
}

/// [`copy_range`] through a buffer on the stack (a kernel without
/// `copy_file_range` between these files); small, as it may run in the
/// signal handler, on the alternate stack.
fn copy_range_by_hand(from: i32, to: i32, mut at: libc::off_t, len: libc::off_t) -> bool {
    let mut buf = [0u8; 1024];
    let end = at + len;
    while at < end {
        let want = ((end - at) as usize).min(buf.len());
        // SAFETY: our files and buffer.
        let n = unsafe { libc::pread(from, buf.as_mut_ptr().cast(), want, at) };
        // SAFETY: as above.
        if n <= 0 || unsafe { libc::pwrite(to, buf.as_ptr().cast(), n as usize, at) } != n {
            return false;
        }
        at += n as libc::off_t;
    }
    true
}

/// A futex operation on a state word of this process.
fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: a futex on our own word; a wait returns when woken, on a
    // signal, or at once if the word no longer holds `val`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            core::ptr::null::<libc::timespec>(),
        )
    };
}
