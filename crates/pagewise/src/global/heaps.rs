//! Every thread heap of the global allocator: made, owned, abandoned,
//! adopted, visited.
//!
//! Heaps live in memory mapped for them (never from the global allocator)
//! and are never unmapped, so a pointer to a heap stays valid forever. All
//! of them are on one push-only list; those whose thread exited are also on
//! the abandoned list, waiting for a new thread to adopt them whole.
//!
//! Who may touch a heap's owner-only state is one word, `HeapCore::owner`,
//! and every change of it is a method here:
//! - a thread id: the heap's thread owns it (set before the heap is
//!   published, or by [`adopt`]);
//! - [`ABANDONED`] (0): no owner; its thread exited ([`abandon`]);
//! - [`VISITING`]: the purger, `trim()` or `stats()` of another thread
//!   works on an abandoned heap as its owner for a moment ([`visit_all`]).
//!
//! A heap whose thread is alive is visited too, with its page lists only
//! (`HeapCore::lock_local`, the lock its owner takes on every slow path):
//! every page but the current ones, which with the thread caches stay the
//! owner's ([`crate::heap::Access::Visitor`]).
//!
//! Visiting never takes a heap off the abandoned list, so a thread starting
//! meanwhile adopts it (waiting out the visit) instead of making a new heap:
//! the number of heaps stays bounded by the number of threads alive at
//! once, plus the few a lease or a visit holds for an instant.

use crate::global::thread::config;
use crate::heap::hollow::Hollow;
use crate::heap::{Access, HeapCore, Local};
use crate::memory::reservation::Reservations;
use crate::os::source::{PageSource, SystemPages};
use crate::sync::lock::{Flag, Guard, Locked};
use crate::sync::word::Word;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// The page source of the global allocator.
pub static SYSTEM: SystemPages = SystemPages::new();
/// Its page source when it meshes (`PAGEWISE_MESH=1`): memfd files mapped
/// shared, kept from a forked child, and copied for it by the fork
/// handlers when they run.
#[cfg(target_os = "linux")]
pub static SHARED: crate::os::shared::SharedPages = crate::os::shared::SharedPages::new();
/// Whether the global allocator meshes: 0 until its first heap is made,
/// then 1 (no) or 2 (yes), for the life of the process.
static MESH_MODE: AtomicU8 = AtomicU8::new(0);

/// Whether the global allocator meshes (`PAGEWISE_MESH=1` on Linux, read
/// when its first heap is made).
pub fn meshing() -> bool {
    match MESH_MODE.load(Acquire) {
        0 => decide_meshing(),
        mode => mode == 2,
    }
}

#[cold]
fn decide_meshing() -> bool {
    #[cfg(target_os = "linux")]
    let want =
        config().mesh && crate::os::barrier::install(crate::memory::registry::in_shared_segment);
    #[cfg(not(target_os = "linux"))]
    let want = false;
    let mode = if want { 2 } else { 1 };
    match MESH_MODE.compare_exchange(0, mode, AcqRel, Acquire) {
        Ok(_) => want,
        Err(decided) => decided == 2,
    }
}

/// The page source of the global allocator's heaps.
pub fn source() -> &'static dyn PageSource {
    #[cfg(target_os = "linux")]
    if meshing() {
        return &SHARED;
    }
    &SYSTEM
}
/// Its reservations.
pub static RESERVATIONS: Locked<Reservations> = Locked::new(Reservations::new());
/// Every thread heap ever made (push-only list; heaps are reused, never freed).
static HEAPS: AtomicPtr<HeapCore> = AtomicPtr::new(null_mut());
/// Heaps whose thread exited, waiting for a new thread: a queue, the one
/// that exited first at the head, each linked to the next through
/// `next_abandoned`.
pub(crate) static ABANDONED_LIST: Locked<usize> = Locked::new(0);
/// The last heap of [`ABANDONED_LIST`] (read and written only with the
/// list's lock held, and only while the list is not empty: a push onto an
/// empty list sets it again).
static ABANDONED_TAIL: AtomicUsize = AtomicUsize::new(0);
/// How many heaps are on [`ABANDONED_LIST`] (a hint, read without its
/// lock: a thread about to open a new page looks for leftovers only while
/// some heap's thread has exited).
static EXITED: AtomicUsize = AtomicUsize::new(0);
/// How many exited heaps one look for leftovers claims at most, and how
/// many of the list it reads to find them (under the list's lock).
const LEFTOVER_TRIES: usize = 4;
const LEFTOVER_WALK: usize = 16;
/// Held for a whole pass of [`visit_all`] (and by the fork
/// handlers, so that no visit is half done in a child).
pub(crate) static VISITS: Locked<()> = Locked::new(());

/// What a mesh pass inside [`visit_all`] holds besides the heap's page
/// lists: [`VISITS`], let go between chunks of its rounds for a thread that waits
/// for it (a fork's handlers, a `trim()`).
pub(crate) struct VisitsHeld;

impl crate::heap::mesh::Outer for VisitsHeld {
    fn wanted(&self) -> bool {
        VISITS.waiting()
    }
    fn let_go(&self) {
        // SAFETY: `visit_all`'s guard holds it on this thread, and
        // `take_again` takes it back before the visit returns.
        unsafe { crate::sync::lock::release(&VISITS) };
    }
    fn take_again(&self) {
        crate::sync::lock::hold(&VISITS);
    }
}
/// Bump allocator for heap structures.
pub(crate) static META: Locked<Meta> = Locked::new(Meta { next: 0, end: 0 });

/// `HeapCore::owner` of a heap nobody owns: its thread exited.
pub const ABANDONED: usize = 0;
/// `HeapCore::owner` of an abandoned heap that another thread's `trim()`
/// or `stats()` is working on.
pub const VISITING: usize = usize::MAX;

pub(crate) struct Meta {
    next: usize,
    end: usize,
}

const META_CHUNK: usize = 1 << 20;

/// The calling thread's id, as stored in `HeapCore::owner` (never 0 or
/// [`VISITING`]: pthread ids are addresses).
pub fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// A heap for the calling thread: an abandoned one adopted whole, else a
/// new one. Null only when out of memory. The caller owns it.
pub fn take_heap() -> *mut HeapCore {
    let adopted = adopt_abandoned(
        &ABANDONED_LIST,
        // SAFETY: abandoned heaps are live (never freed) and linked
        // through `next_abandoned`, read under the list's lock.
        |h: *mut HeapCore| unsafe { (*h).next_abandoned.load(Relaxed) },
        // SAFETY: heaps are never freed.
        |h| unsafe { &(*h).owner },
        thread_id(),
    );
    if adopted.is_some() {
        EXITED.fetch_sub(1, Relaxed);
    }
    let h = adopted.unwrap_or_else(|| create().unwrap_or(null_mut()));
    if !h.is_null() {
        // SAFETY: heaps are never freed; the calling thread owns it now.
        unsafe { (*h).start_thread_bytes() };
    }
    h
}

/// Takes the heap at the head of `list` (the head's address, 0 for none;
/// `next` reads a heap's link, under the list's lock) and
/// makes it `me`'s: its `owner` word goes from [`ABANDONED`] to `me`,
/// waiting out a visit in progress. Generic over the lock's flag and the
/// owner word, so the loom model at the end of this file runs it.
pub(crate) fn adopt_abandoned<'h, T: 'h, F: Flag, W: Word + 'h>(
    list: &Locked<usize, F>,
    next: impl FnOnce(*mut T) -> *mut T,
    owner: impl FnOnce(*mut T) -> &'h W,
    me: usize,
) -> Option<*mut T> {
    let h = {
        let mut head = list.lock();
        let h = *head as *mut T;
        if h.is_null() {
            return None;
        }
        *head = next(h) as usize;
        h
    };
    claim_for_owner(owner(h), me);
    Some(h)
}

/// The owner's hand-over of a heap it gives up, after its last act on the
/// heap's owner-only state: the owner word goes to [`ABANDONED`] (Release:
/// those last writes are visible to whoever claims the heap next, an
/// adopter or a visitor, both with Acquire), then the heap goes on `list`
/// (`push(head, h)` links it in, under the list's lock), where a thread
/// starting later finds it. Generic as [`adopt_abandoned`].
pub(crate) fn hand_on<T, F: Flag, W: Word>(
    owner: &W,
    list: &Locked<usize, F>,
    h: *mut T,
    push: impl FnOnce(&mut usize, *mut T),
) {
    owner.store(ABANDONED, Release);
    crate::sync::perturb::point();
    let mut head = list.lock();
    push(&mut head, h);
}

/// Takes an `owner` word from [`ABANDONED`] to `me`, waiting while a
/// visitor holds it (for the length of one trim or stats pass).
pub(crate) fn claim_for_owner<W: Word>(owner: &W, me: usize) {
    let mut spins = 0u32;
    crate::sync::perturb::point();
    while owner.cas_weak(ABANDONED, me, Acquire, Relaxed).is_err() {
        spins += 1;
        if spins < 64 || cfg!(loom) {
            crate::sync::word::spin_hint();
        } else {
            crate::sync::lock::yield_now();
        }
    }
}

/// Takes an `owner` word from [`ABANDONED`] to [`VISITING`]; false if the
/// heap has an owner or another visitor.
pub(crate) fn claim_for_visit<W: Word>(owner: &W) -> bool {
    crate::sync::perturb::point();
    owner.cas(ABANDONED, VISITING, Acquire, Relaxed).is_ok()
}

/// In a forked child: every heap claimed for a visit is abandoned again.
/// Only a look for leftovers can have been in the middle of one (the other
/// visits hold [`VISITS`], which the fork handlers held), and what it
/// changes it changes with the heap's page lists held, which the handlers
/// held too: the claim is all that is left of it, and the thread that
/// made it is not in the child.
pub(crate) fn end_visits_after_fork() {
    for_each_heap(|h| {
        if h.owner.load(Relaxed) == VISITING {
            end_visit(&h.owner);
        }
    });
}

/// Ends a visit: the heap is abandoned again, for the next adopter.
pub(crate) fn end_visit<W: Word>(owner: &W) {
    owner.store(ABANDONED, Release);
}

/// Gives up a heap the calling thread owns (its thread is exiting, or a
/// lease ends): its empty pages go back to the span pool, and the heap goes
/// on the abandoned list for the next thread.
///
/// # Safety
/// The calling thread owns `h` and does not use it afterwards.
pub unsafe fn abandon(h: *mut HeapCore) {
    // SAFETY: per the caller; the heap's owner-only state is done with
    // after `abandon`, and `h` is never freed.
    unsafe {
        (*h).abandon();
        (*h).offer_leftovers();
        hand_on(&(*h).owner, &ABANDONED_LIST, h, |head, h| {
            // At the tail: the heap whose thread exited first is adopted
            // first. `h` is not on the list (its owner just let it go); the
            // list lock serialises the links and the tail.
            (*h).next_abandoned.store(null_mut(), Relaxed);
            if *head == 0 {
                *head = h as usize;
            } else {
                // SAFETY: the list is not empty, so the tail is its last
                // heap (heaps are never freed).
                let tail = ABANDONED_TAIL.load(Relaxed) as *mut HeapCore;
                (*tail).next_abandoned.store(h, Relaxed);
            }
            ABANDONED_TAIL.store(h as usize, Relaxed);
        });
    }
    EXITED.fetch_add(1, Relaxed);
}

/// Up to `max` free slots of `class` that a heap whose thread exited left
/// on one of its pages, as a chain of cached slots for `me`'s empty thread
/// cache, with their count (`heap/leftovers.rs`). Looks at the heaps that
/// exited first (the next to be adopted) first, claims at most a few, and waits for
/// nothing: a heap being adopted, visited or looked at by another thread
/// is passed by. A fork in the middle of a look leaves the heap claimed in
/// the child, which [`end_visits_after_fork`] undoes.
pub(crate) fn take_leftovers(
    me: *const HeapCore,
    class: usize,
    max: u32,
) -> Option<(*mut crate::memory::block::Block, u32)> {
    if EXITED.load(Relaxed) == 0 {
        return None;
    }
    let mut candidates = [null_mut::<HeapCore>(); LEFTOVER_TRIES];
    {
        let head = ABANDONED_LIST.try_lock()?;
        let mut h = *head as *mut HeapCore;
        let (mut n, mut walked) = (0, 0);
        while !h.is_null() && n < LEFTOVER_TRIES && walked < LEFTOVER_WALK {
            walked += 1;
            // SAFETY: heaps are never freed; the list's links are read
            // under its lock.
            let heap = unsafe { &*h };
            if !core::ptr::eq(h, me) && heap.may_have_leftovers(class) {
                candidates[n] = h;
                n += 1;
            }
            h = heap.next_abandoned.load(Relaxed);
        }
    }
    for h in candidates.into_iter().take_while(|h| !h.is_null()) {
        // SAFETY: heaps are never freed.
        let heap = unsafe { &*h };
        // Adopted since, or claimed by another: passed by.
        if !claim_for_visit(&heap.owner) {
            continue;
        }
        let got = heap.try_lock_local().and_then(|mut l| {
            // SAFETY: claimed as the exited heap's owner, with its page
            // lists.
            unsafe { heap.give_leftovers(&mut l, class, max) }
        });
        end_visit(&heap.owner);
        if got.is_some() {
            return got;
        }
    }
    None
}

fn create() -> Option<*mut HeapCore> {
    // Made and published under META, which the fork handlers hold: the list
    // of heaps cannot grow between `prepare`, which locks every heap's span
    // pool, and `parent`/`child`, which release them.
    let mut meta = META.lock();
    let at = meta.alloc(core::mem::size_of::<HeapCore>())? as *mut HeapCore;
    // SAFETY: fresh, aligned, zeroed metadata memory; SYSTEM and
    // RESERVATIONS are statics. The owner is set before the heap is
    // published, so no visitor ever takes it for abandoned.
    unsafe {
        HeapCore::init_at(
            at,
            source() as *const dyn PageSource,
            &RESERVATIONS,
            &crate::memory::budget::GLOBAL,
            config(),
            true,
        );
        (*at).owner.store(thread_id(), Relaxed);
    }
    publish(at, &mut meta);
    // A setting changed while the heap was made reached the heaps
    // published then, not this one: take the current settings again.
    // SAFETY: published heaps are never freed.
    unsafe { (*at).config.store(config()) };
    crate::memory::budget::GLOBAL.set_purge_others(purge_all_for_limit);
    Some(at)
}

/// An allocation would pass `PAGEWISE_LIMIT`: give back what every other
/// heap can, as the purger does (its emptied pages, then everything it
/// retains, expired or not). Called on the allocating thread's slow path,
/// with its own page lists held and no span lock: so nothing here waits
/// (a visit pass in progress, a heap on a slow path or a busy span pool
/// is skipped) and nothing allocates.
pub fn purge_all_for_limit() {
    crate::heap::transfer::send_home_older_than(u64::MAX, false);
    let me = crate::global::thread::current_or_null();
    let Some(_pass) = VISITS.try_lock() else {
        for_each_heap(|h| {
            h.purge_expired(Some(crate::memory::spans::Why::Limit));
        });
        return;
    };
    for_each_heap(|h| {
        if core::ptr::eq(h, me) {
            return;
        }
        if claim_for_visit(&h.owner) {
            if let Some(mut l) = h.try_lock_local() {
                // SAFETY: claimed as the abandoned heap's owner, with its
                // page lists.
                unsafe { h.release_empty_pages(&mut l, Access::Owner, Hollow::Now) };
            }
            end_visit(&h.owner);
        } else if let Some(mut l) = h.try_lock_local() {
            // SAFETY: the page lists of a heap whose thread lives.
            unsafe { h.release_empty_pages(&mut l, Access::Visitor, Hollow::Now) };
        }
        h.purge_expired(Some(crate::memory::spans::Why::Limit));
    });
}

/// Heap `me` committed `bytes` of fresh memory: retention in other heaps
/// cannot serve it (a heap takes spans from its own pool only), so as much
/// of theirs goes back, oldest first, and the process's committed memory
/// follows its demand instead of growing by every other heap's pool.
/// Heaps whose thread exited go first (their pool waits for a thread that
/// may never come); then live ones, whose oldest retained spans are the
/// ones they have gone longest without reusing: under thread churn a heap
/// adopted by a thread that needs less than its last one, or a thread
/// that freed much and went on to other work, would otherwise hold its
/// pool while its neighbours fault in as much again. Never waits (busy
/// pools are skipped); does not allocate.
pub fn reclaim_elsewhere(me: *const HeapCore, bytes: usize) {
    let mut left = bytes;
    for exited in [true, false] {
        for_each_heap(|h| {
            let others = !core::ptr::eq(h, me);
            if left > 0 && others && (h.owner.load(Relaxed) == ABANDONED) == exited {
                left = left.saturating_sub(h.purge_for_another(left));
            }
        });
    }
}

/// The first `Some` that `f` returns for a thread heap other than `me`:
/// heaps whose thread exited first (what they hold waits for a thread that
/// may never come), then, if `live`, live ones. `f` may only touch what
/// any thread may (as for [`for_each_heap`]) and must not wait for a lock.
pub fn find_elsewhere<T>(
    me: *const HeapCore,
    live: bool,
    mut f: impl FnMut(&HeapCore) -> Option<T>,
) -> Option<T> {
    let mut found = None;
    for exited in [true, false] {
        if !exited && !live {
            break;
        }
        for_each_heap(|h| {
            if found.is_none()
                && !core::ptr::eq(h, me)
                && (h.owner.load(Relaxed) == ABANDONED) == exited
            {
                found = f(h);
            }
        });
    }
    found
}

/// Pushes a new heap onto the list of all heaps. Only with META held (the
/// `&mut Meta` is the proof), so that a fork sees one list throughout.
fn publish(heap: *mut HeapCore, _meta: &mut Meta) {
    let mut head = HEAPS.load(Relaxed);
    loop {
        // SAFETY: `heap` is not yet published.
        unsafe { (*heap).next_heap.store(head, Relaxed) };
        match HEAPS.compare_exchange_weak(head, heap, Release, Relaxed) {
            Ok(_) => return,
            Err(seen) => head = seen,
        }
    }
}

impl Meta {
    /// `size` bytes of zeroed memory for heap structures, never freed.
    fn alloc(&mut self, size: usize) -> Option<usize> {
        let size = crate::memory::layout::align_up(size, 64);
        if self.next + size > self.end {
            let chunk = size.max(META_CHUNK);
            let p = SYSTEM
                .map(chunk, crate::memory::layout::os_page())?
                .as_ptr() as usize;
            self.next = p;
            self.end = p + chunk;
        }
        let p = self.next;
        self.next += size;
        Some(p)
    }
}

/// Runs `f` on a heap the calling thread owns only for the call (a thread
/// whose own heap was already abandoned at exit): adopted or made, then
/// abandoned again at once. Null-free: None only when out of memory.
pub fn with_leased_heap<R>(f: impl FnOnce(&HeapCore) -> R) -> Option<R> {
    let h = take_heap();
    if h.is_null() {
        return None;
    }
    // SAFETY: the calling thread owns `h` until it abandons it below.
    let r = f(unsafe { &*h });
    // SAFETY: as above; not used after.
    unsafe { abandon(h) };
    Some(r)
}

/// Calls `f` on every thread heap (live or abandoned). `f` may only touch
/// what any thread may: atomics, and state under the locks it takes.
pub fn for_each_heap(mut f: impl FnMut(&HeapCore)) {
    let mut h = HEAPS.load(Acquire);
    while !h.is_null() {
        // SAFETY: heaps are never freed; the list is push-only.
        let heap = unsafe { &*h };
        f(heap);
        h = heap.next_heap.load(Acquire);
    }
}

/// How [`visit_all`] treats a heap whose thread is alive and on one of its
/// slow paths (holding its page lists).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Wait for it (`trim()`, `stats()`: a slow path is short).
    Wait,
    /// Skip it until the next pass (the purger).
    Skip,
}

/// Runs `f` on every heap but `skip`, with its page lists, one at a time:
/// an abandoned heap claimed as its owner (`Access::Owner`), a heap whose
/// thread is alive as a visitor (`Access::Visitor`: its current pages and
/// caches stay its thread's). The protocol is in docs/design.md, "Visiting
/// a live heap".
pub fn visit_all(
    skip: *const HeapCore,
    busy: Busy,
    mut f: impl FnMut(&HeapCore, &mut Guard<'_, Local>, Access),
) {
    let _pass = VISITS.lock();
    for_each_heap(|h| {
        if !core::ptr::eq(h, skip) {
            visit_one(&h.owner, h.local_lock(), busy, |l, who| f(h, l, who));
        }
    });
}

/// The visit of one heap, whose owner word is `owner` and page lists
/// `lists`: an abandoned heap claimed as its owner (`Access::Owner`), a
/// heap whose thread is alive with its page lists only (`Access::Visitor`),
/// waited for or skipped as `busy` says. Generic over the owner word and
/// the lock's flag, so the loom model of `heap/current.rs` runs it.
pub(crate) fn visit_one<L, F: Flag, W: Word>(
    owner: &W,
    lists: &Locked<L, F>,
    busy: Busy,
    f: impl FnOnce(&mut Guard<'_, L, F>, Access),
) {
    if claim_for_visit(owner) {
        f(&mut lists.lock(), Access::Owner);
        end_visit(owner);
        return;
    }
    // Alive, or being adopted: either way its thread owns the current
    // pages and caches, and a visitor's rights are a subset of an owner's
    // whatever happens to the owner word meanwhile.
    let held = match busy {
        Busy::Wait => Some(lists.lock()),
        Busy::Skip => lists.try_lock(),
    };
    if let Some(mut l) = held {
        f(&mut l, Access::Visitor);
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The claim protocol under every interleaving loom finds: an adopter
    //! and visitors never hold a heap at once, and the adopter always gets
    //! it; and a thread's exit handing its heap on (`hand_on`, as
    //! `abandon` does) to a thread starting meanwhile (`adopt_abandoned`,
    //! as `take_heap` does) past a visitor, on the allocator's functions
    //! and list lock. The heap's owner-only state and its list link are
    //! loom cells, so loom reports any overlap, or a write of the exiting
    //! owner not visible to the next holder, as a data race.
    use super::*;
    use crate::sync::lock::ModelFlag;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    struct Heap {
        owner: AtomicUsize,
        state: UnsafeCell<usize>,
    }

    #[test]
    fn adopters_and_visitors_exclude_each_other() {
        loom::model(|| {
            let h = Arc::new(Heap {
                owner: AtomicUsize::new(ABANDONED),
                state: UnsafeCell::new(0),
            });
            let visitors: Vec<_> = (0..2)
                .map(|_| {
                    let h = h.clone();
                    loom::thread::spawn(move || {
                        if claim_for_visit(&h.owner) {
                            // SAFETY: the claim gives exclusive access.
                            h.state.with_mut(|s| unsafe { *s += 10 });
                            end_visit(&h.owner);
                        }
                    })
                })
                .collect();
            claim_for_owner(&h.owner, 7);
            // SAFETY: as above.
            h.state.with_mut(|s| unsafe { *s += 1 });
            for v in visitors {
                v.join().unwrap();
            }
            assert_eq!(h.owner.load(Relaxed), 7, "the adopter owns it");
            let s = h.state.with(|s| unsafe { *s });
            assert_eq!(s % 10, 1, "the adopter ran once: {s}");
        });
    }

    /// A heap of the list: its owner word, its link on the abandoned list
    /// and its owner-only state.
    struct Listed {
        owner: AtomicUsize,
        next: UnsafeCell<*mut Listed>,
        state: UnsafeCell<usize>,
    }

    struct World {
        list: Locked<usize, ModelFlag>,
        heap: Listed,
    }

    // SAFETY: the raw link is the heap's identity, followed only through
    // loom's cells under the list's lock.
    unsafe impl Send for World {}
    // SAFETY: as above.
    unsafe impl Sync for World {}

    impl World {
        fn heap_ptr(&self) -> *mut Listed {
            &self.heap as *const Listed as *mut Listed
        }

        /// The heap's thread writes its state one last time and exits.
        fn exit(&self) {
            // SAFETY: loom checks the access; the thread owns the heap.
            self.heap.state.with_mut(|s| unsafe { *s += 1 });
            hand_on(&self.heap.owner, &self.list, self.heap_ptr(), |head, h| {
                // SAFETY: loom checks the access (`h` is `self.heap`).
                unsafe { (*h).next.with_mut(|n| *n = *head as *mut Listed) };
                *head = h as usize;
            });
        }

        /// A thread starts: adopts the abandoned heap if it is listed.
        fn start(&self, me: usize) -> bool {
            let got = adopt_abandoned(
                &self.list,
                // SAFETY: loom checks the access (`h` is `self.heap`).
                |h: *mut Listed| unsafe { (*h).next.with(|n| *n) },
                // SAFETY: `h` is `self.heap`.
                |h| unsafe { &(*h).owner },
                me,
            );
            if let Some(h) = got {
                assert_eq!(h, self.heap_ptr());
                // SAFETY: loom checks the access; adopted.
                self.heap.state.with_mut(|s| unsafe { *s += 100 });
            }
            got.is_some()
        }

        /// A visit of an abandoned heap (the purger, `trim()`).
        fn visit(&self) -> bool {
            let claimed = claim_for_visit(&self.heap.owner);
            if claimed {
                // SAFETY: loom checks the access; claimed.
                self.heap.state.with_mut(|s| unsafe { *s += 10 });
                end_visit(&self.heap.owner);
            }
            claimed
        }
    }

    /// A heap's thread exits while a thread starts and a visitor passes:
    /// the heap goes to the starting thread if it was listed by then, the
    /// visitor sees it only between the two, and each sees every write of
    /// the one before. (The weakened orderings the models catch are listed
    /// in docs/testing.md.)
    #[test]
    fn an_exiting_thread_hands_its_heap_to_a_starting_one_past_a_visitor() {
        loom::model(|| {
            let w = Arc::new(World {
                list: Locked::new_model(0),
                heap: Listed {
                    owner: AtomicUsize::new(5),
                    next: UnsafeCell::new(null_mut()),
                    state: UnsafeCell::new(0),
                },
            });
            let exiting = {
                let w = w.clone();
                loom::thread::spawn(move || w.exit())
            };
            let visitor = {
                let w = w.clone();
                loom::thread::spawn(move || w.visit())
            };
            let adopted = w.start(7);
            exiting.join().unwrap();
            let visited = visitor.join().unwrap();
            let owner = w.heap.owner.load(Relaxed);
            // SAFETY: loom checks the access; every thread is joined.
            let state = w.heap.state.with(|s| unsafe { *s });
            let listed = *w.list.lock() != 0;
            if adopted {
                assert_eq!((owner, listed), (7, false), "the starting thread's");
            } else {
                assert_eq!((owner, listed), (ABANDONED, true), "left listed");
            }
            let want = 1 + 100 * adopted as usize + 10 * visited as usize;
            assert_eq!(state, want);
        });
    }
}
