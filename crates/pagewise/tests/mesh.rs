//! Meshing on an owned heap over `SharedPages`: when one
//! object of each OS page survives, no page-granular release helps, and
//! `Heap::mesh` must reach at least three times the utilization the heap
//! has without it, measured by the kernel (the blocks of the heap's memfd
//! files), with every survivor's bytes intact; meshed pages must leave
//! their groups as their objects go, and what they free must be reusable.
#![cfg(target_os = "linux")]

use pagewise::{Heap, PageSource, SharedPages};
use std::alloc::Layout;
use std::ptr::NonNull;

fn os_page() -> usize {
    pagewise::layout::os_page()
}

/// A small xorshift, so the survivors' offsets are random but repeatable.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Survivor {
    p: NonNull<u8>,
    layout: Layout,
    tag: u8,
}

impl Survivor {
    fn write(&self) {
        // SAFETY: a live block of `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(self.p.as_ptr(), self.tag, self.layout.size()) };
    }
    fn intact(&self) -> bool {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.p.as_ptr(), self.layout.size()) }
            .iter()
            .all(|&b| b == self.tag)
    }
}

/// Every size of 16-256 B (one per size class there): `pages` OS pages of
/// objects each, of which one per OS page, at a random slot, survives.
fn one_survivor_per_os_page<S: PageSource>(
    heap: &Heap<S>,
    pages: usize,
    seed: u64,
) -> Vec<Survivor> {
    let mut rng = Rng(seed);
    let mut kept = Vec::new();
    for size in (16..=128).step_by(16).chain([160, 192, 224, 256]) {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let blocks: Vec<NonNull<u8>> = (0..pages * os_page() / size)
            .map(|_| heap.allocate(layout).unwrap().cast())
            .collect();
        // Group by the OS page each block starts in, keep one at random.
        let mut by_page: std::collections::BTreeMap<usize, Vec<NonNull<u8>>> = Default::default();
        for p in blocks {
            by_page
                .entry(p.as_ptr() as usize / os_page())
                .or_default()
                .push(p);
        }
        for (_, ps) in by_page {
            let keep = rng.below(ps.len());
            for (i, p) in ps.into_iter().enumerate() {
                if i == keep {
                    let s = Survivor {
                        p,
                        layout,
                        tag: (kept.len() % 251 + 1) as u8,
                    };
                    s.write();
                    kept.push(s);
                } else {
                    // SAFETY: allocated above with `layout`, freed once.
                    unsafe { heap.deallocate(p, layout) };
                }
            }
        }
    }
    kept
}

fn live_bytes(kept: &[Survivor]) -> u64 {
    kept.iter().map(|s| s.layout.size() as u64).sum()
}

fn all_intact(kept: &[Survivor]) -> bool {
    kept.iter().all(Survivor::intact)
}

/// OS pages per size class: 1 MiB of them, at least 16.
fn pages() -> usize {
    ((1 << 20) / os_page()).max(16)
}

fn heap() -> Heap<SharedPages> {
    Heap::with_source(SharedPages::new(), Default::default())
}

#[test]
fn one_survivor_per_os_page_meshes_to_three_times_the_utilization() {
    let heap = heap();
    let kept = one_survivor_per_os_page(&heap, pages(), 0x5eed);
    heap.trim();
    assert!(all_intact(&kept));
    let live = live_bytes(&kept);
    let before = heap.source().held_bytes();
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let after = heap.source().held_bytes();
    assert!(all_intact(&kept), "a survivor lost its bytes");
    let s = heap.stats();
    let (u0, u1) = (live as f64 / before as f64, live as f64 / after as f64);
    eprintln!(
        "live {live} B; memory {before} -> {after} B; utilization {u0:.3} -> {u1:.3} ({:.1}x); \
         {joined} OS pages joined in {} kernel mappings; stats: meshed {} B, saved {} B",
        u1 / u0,
        s.mesh_mappings,
        s.meshed_bytes,
        s.mesh_saved_bytes
    );
    assert!(u1 >= 3.0 * u0, "utilization {u0:.3} -> {u1:.3}");
    // With the mapping budget unused, the densest packing: two kernel
    // mappings per meshed OS page at most.
    assert!(s.mesh_mappings as usize <= 2 * joined, "{s:?}");
    assert_eq!(s.meshed_bytes, (joined * os_page()) as u64);
    // The stats' committed bytes follow the kernel's count (within the
    // pages read but never written, such as header pages).
    let saved_by_kernel = before - after;
    assert!(
        s.mesh_saved_bytes.abs_diff(saved_by_kernel) <= saved_by_kernel / 20,
        "stats say {} B saved, the kernel {saved_by_kernel} B",
        s.mesh_saved_bytes
    );
}

#[test]
fn meshed_pages_leave_their_groups_as_their_objects_go() {
    let heap = heap();
    let mut kept = one_survivor_per_os_page(&heap, pages() / 4, 7);
    // SAFETY: this thread is the heap's only user.
    assert!(unsafe { heap.mesh() } > 0);
    let meshed = heap.stats().meshed_bytes;
    assert!(meshed > 0);
    // Free every other survivor: their pages leave at the next pass; the
    // others keep their bytes.
    let mut i = 0;
    kept.retain(|s| {
        i += 1;
        if i % 2 == 0 {
            // SAFETY: a live block, freed once.
            unsafe { heap.deallocate(s.p, s.layout) };
        }
        i % 2 == 1
    });
    // SAFETY: as above.
    unsafe { heap.mesh() };
    assert!(all_intact(&kept));
    let half = heap.stats().meshed_bytes;
    assert!(half < meshed, "{half} of {meshed} B still meshed");
    for s in kept.drain(..) {
        // SAFETY: a live block, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!((s.meshed_bytes, s.mesh_saved_bytes), (0, 0));
    assert_eq!(s.committed_bytes, 0, "{s:?}");
    assert_eq!(s.live_bytes, 0);
}

#[test]
fn slots_freed_on_meshed_pages_are_reused_without_touching_other_members() {
    let heap = heap();
    let mut kept = one_survivor_per_os_page(&heap, pages() / 4, 99);
    // SAFETY: this thread is the heap's only user.
    assert!(unsafe { heap.mesh() } > 0);
    // Churn: free a survivor, allocate the same size, write it; the others
    // must never see a byte of it.
    for round in 0..kept.len() {
        let s = kept.swap_remove(round % kept.len());
        // SAFETY: a live block, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
        let p = heap.allocate(s.layout).unwrap().cast();
        let fresh = Survivor {
            p,
            layout: s.layout,
            tag: s.tag.wrapping_add(1).max(1),
        };
        fresh.write();
        kept.push(fresh);
        if round % 64 == 0 {
            assert!(all_intact(&kept), "round {round}");
        }
    }
    // And more objects than were freed, which need fresh slots.
    let layout = Layout::from_size_align(48, 8).unwrap();
    for i in 0..4 * os_page() / 48 {
        let s = Survivor {
            p: heap.allocate(layout).unwrap().cast(),
            layout,
            tag: (i % 200 + 3) as u8,
        };
        s.write();
        kept.push(s);
    }
    assert!(all_intact(&kept));
    // SAFETY: as above.
    unsafe { heap.mesh() };
    assert!(all_intact(&kept));
    for s in kept {
        // SAFETY: a live block, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
    heap.trim();
    assert_eq!(heap.stats().committed_bytes, 0);
}

#[test]
fn slots_larger_than_half_an_os_page_mesh_where_their_live_bytes_leave_room() {
    // Values as a key-value server keeps them (4 KiB + a header, in
    // 5,120-byte slots), four in five freed at random: each OS page holds
    // parts of one or two slots, and one that holds the end of a live slot
    // meshes with one whose live slot lies elsewhere on the same grid.
    let heap = heap();
    let layout = Layout::from_size_align(4102, 8).unwrap();
    let mut rng = Rng(0x5eed);
    let blocks: Vec<NonNull<u8>> = (0..4000)
        .map(|_| heap.allocate(layout).unwrap().cast())
        .collect();
    let mut kept = Vec::new();
    for (i, p) in blocks.into_iter().enumerate() {
        if rng.below(5) == 0 {
            let s = Survivor {
                p,
                layout,
                tag: (i % 251 + 1) as u8,
            };
            s.write();
            kept.push(s);
        } else {
            // SAFETY: allocated above with `layout`, freed once.
            unsafe { heap.deallocate(p, layout) };
        }
    }
    heap.trim();
    let before = heap.source().held_bytes();
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let after = heap.source().held_bytes();
    assert!(all_intact(&kept), "a survivor lost its bytes");
    eprintln!(
        "live {} B in {} values; memory {before} -> {after} B; {joined} OS pages joined",
        live_bytes(&kept),
        kept.len()
    );
    // At 4 KiB a page holds parts of at most two slots, so only the small
    // end of one live slot and the large start of another mesh (a free
    // slot next to a live one is hollow when its other OS page is, and
    // leaves room all the same); larger pages hold several slots and mesh
    // as small slots do.
    assert!(
        after as f64 <= 0.85 * before as f64,
        "memory {before} -> {after} B"
    );
    // Freed, the values' pages leave their groups and everything goes.
    for s in kept {
        // SAFETY: live, allocated with `layout`, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
    heap.trim();
    assert_eq!(heap.stats().meshed_bytes, 0);
    assert_eq!(heap.stats().committed_bytes, 0);
}

/// Greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[test]
fn one_value_per_run_of_os_pages_meshes_though_every_value_straddles_two() {
    // 5,120-byte values: at 4 KiB pages a run of five OS pages holds
    // exactly four slots, and one value per run pins two of its OS pages
    // (all the others are hollow). Each survivor sits at another slot of
    // its run than the one before, so four runs' survivors fit one run of
    // physical pages: every OS page holding the end of one survivor can
    // share a page with one holding another run's survivor's start.
    let heap = heap();
    let layout = Layout::from_size_align(5120, 8).unwrap();
    let class = pagewise::size_class::class_of(5120);
    assert_eq!(pagewise::size_class::SLOT_SIZE[class], 5120);
    let per_run = 5120 / gcd(5120, os_page()) * os_page() / 5120;
    // Every value is written, as a program writes what it allocates (so
    // each OS page of them is resident, at any OS page size).
    let mut blocks: Vec<NonNull<u8>> = (0..4000)
        .map(|_| {
            let p = heap.allocate(layout).unwrap().cast::<u8>();
            // SAFETY: a fresh block of `layout.size()` bytes.
            unsafe { std::ptr::write_bytes(p.as_ptr(), 0xa5, layout.size()) };
            p
        })
        .collect();
    blocks.sort();
    // A slab page's slots are 5,120 bytes apart; a larger gap starts
    // another page. Runs count from the page's start.
    let mut kept = Vec::new();
    let mut runs = 0;
    let mut start = 0;
    while start < blocks.len() {
        let mut end = start + 1;
        while end < blocks.len()
            && blocks[end].as_ptr() as usize - blocks[end - 1].as_ptr() as usize == 5120
        {
            end += 1;
        }
        for run in (start..end).step_by(per_run) {
            let last = (run + per_run).min(end) - 1;
            let keep = run + runs % (last + 1 - run);
            runs += 1;
            for (i, &p) in blocks.iter().enumerate().take(last + 1).skip(run) {
                if i == keep {
                    let s = Survivor {
                        p,
                        layout,
                        tag: (kept.len() % 251 + 1) as u8,
                    };
                    s.write();
                    kept.push(s);
                } else {
                    // SAFETY: allocated above with `layout`, freed once.
                    unsafe { heap.deallocate(p, layout) };
                }
            }
        }
        start = end;
    }
    heap.trim();
    let source = heap.source();
    let (before, file_before) = (source.held_bytes(), source.file_bytes());
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let (after, file_after) = (source.held_bytes(), source.file_bytes());
    assert!(all_intact(&kept), "a survivor lost its bytes");
    let s = heap.stats();
    eprintln!(
        "{} values, one per run of {per_run} slots; memory {before} -> {after} B \
         (files {file_before} -> {file_after} B); {joined} OS pages joined in {} kernel \
         mappings; stats: meshed {} B, saved {} B",
        kept.len(),
        s.mesh_mappings,
        s.meshed_bytes,
        s.mesh_saved_bytes
    );
    // At 4 KiB, eight OS pages of four runs mesh into five at best.
    assert!(
        after as f64 <= 0.7 * before as f64,
        "memory {before} -> {after} B"
    );
    // The group pages are the files' blocks; the own pages they replaced
    // are gone, and the stats count what the kernel does: exactly at 4 KiB;
    // on larger OS pages a few more bytes, since the last OS page of a
    // 64 KiB slab page holds its unused 4 KiB tail (twelve slots fill
    // 61,440 B), which is never written.
    assert_eq!(file_before, 0);
    assert!(file_after > 0);
    assert_eq!(s.meshed_bytes, (joined * os_page()) as u64);
    // One group page per group: every member's own page but one saved.
    assert_eq!(file_after, s.meshed_bytes - s.mesh_saved_bytes);
    // The mapping budget unused: the densest packing, two kernel mappings
    // per meshed OS page at most.
    assert!(s.mesh_mappings as usize <= 2 * joined, "{s:?}");
    let saved_by_kernel = before - after;
    assert!(
        s.mesh_saved_bytes >= saved_by_kernel
            && s.mesh_saved_bytes - saved_by_kernel <= saved_by_kernel / 10,
        "stats say {} B saved, the kernel {saved_by_kernel} B",
        s.mesh_saved_bytes
    );
    if os_page() == 4096 {
        assert_eq!(s.mesh_saved_bytes, saved_by_kernel);
    }
    // Freed, the values' pages leave their groups and everything goes.
    for s in kept {
        // SAFETY: live, allocated with `layout`, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
    heap.trim();
    assert_eq!(heap.stats().meshed_bytes, 0);
    assert_eq!(heap.stats().committed_bytes, 0);
    assert_eq!(heap.source().file_bytes(), 0);
}

#[test]
fn a_tight_mapping_budget_meshes_whole_slab_pages_in_few_mappings() {
    // Room for a fifth of the 2 per OS page the densest packing costs.
    let source = Tweaked {
        pages: SharedPages::new(),
        joins_fail_late: false,
        mapping_cap: Some(12 * pages() * 2 / 5),
    };
    let heap = Heap::with_source(source, Default::default());
    let kept = one_survivor_per_os_page(&heap, pages(), 0x5eed);
    heap.trim();
    let live = live_bytes(&kept);
    let before = heap.source().pages.held_bytes();
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let after = heap.source().pages.held_bytes();
    assert!(all_intact(&kept), "a survivor lost its bytes");
    let s = heap.stats();
    let (u0, u1) = (live as f64 / before as f64, live as f64 / after as f64);
    eprintln!(
        "live {live} B; memory {before} -> {after} B; utilization {u0:.3} -> {u1:.3} ({:.1}x); \
         {joined} OS pages joined in {} kernel mappings",
        u1 / u0,
        s.mesh_mappings,
    );
    // Slab pages mesh whole onto a leader's consecutive group pages, which
    // the kernel maps as one: two mappings per slab page at most, against
    // two per OS page for OS pages meshed one by one.
    let slab_pages = 12 * pages() * os_page() / (64 << 10);
    assert!(
        s.mesh_mappings as usize <= 2 * slab_pages,
        "{joined} OS pages of {slab_pages} slab pages joined in {} kernel mappings",
        s.mesh_mappings
    );
    assert!(u1 >= 2.0 * u0, "utilization {u0:.3} -> {u1:.3}");
}

#[test]
fn a_heap_whose_source_cannot_share_pages_does_not_mesh() {
    let heap = Heap::with_source(pagewise::FakePages::new(), Default::default());
    let l = Layout::from_size_align(64, 8).unwrap();
    let ps: Vec<_> = (0..1024).map(|_| heap.allocate(l).unwrap()).collect();
    for p in ps.iter().skip(1) {
        // SAFETY: allocated above with `l`, freed once.
        unsafe { heap.deallocate(p.cast(), l) };
    }
    // SAFETY: this thread is the heap's only user.
    assert_eq!(unsafe { heap.mesh() }, 0);
    assert_eq!(heap.stats().meshed_bytes, 0);
    // SAFETY: as above.
    unsafe { heap.deallocate(ps[0].cast(), l) };
}

/// `SharedPages` with faults to test: joins that fail after copying (as
/// when the kernel refuses the remap at its mapping limit: the copy leaves
/// the member's bytes in the founder's free slots), or a mapping budget of
/// `mapping_cap` kernel mappings.
struct Tweaked {
    pages: SharedPages,
    joins_fail_late: bool,
    mapping_cap: Option<usize>,
}

// SAFETY: forwards to `SharedPages`, which upholds the contract.
unsafe impl pagewise::PageSource for Tweaked {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.pages.map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded.
        unsafe { self.pages.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: pagewise::Purge) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.pages.now_ms()
    }
    fn syscalls(&self) -> pagewise::SyscallCounts {
        self.pages.syscalls()
    }
    fn sharing(&self) -> Option<&dyn pagewise::source::SharePages> {
        Some(self)
    }
}

// SAFETY: forwards, except that a `join` that fails late scribbles where
// the copy would have written and then reports failure, which the contract
// allows (the group's bytes at those ranges belong to no other member).
unsafe impl pagewise::source::SharePages for Tweaked {
    unsafe fn share(&self, founder: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.sharing().unwrap().share(founder) }
    }
    unsafe fn join(&self, founder: usize, member: usize, ranges: &[(usize, usize)]) -> bool {
        if !self.joins_fail_late {
            // SAFETY: forwarded.
            return unsafe { self.pages.sharing().unwrap().join(founder, member, ranges) };
        }
        for &(off, len) in ranges {
            // SAFETY: the founder shows the group page; these bytes hold no
            // member's object (the caller's contract).
            unsafe { std::ptr::write_bytes((founder + off) as *mut u8, 0xab, len) };
        }
        false
    }
    unsafe fn leave(&self, member: usize, how: pagewise::source::Leave) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.sharing().unwrap().leave(member, how) }
    }
    fn group_of(&self, addr: usize) -> Option<usize> {
        self.pages.sharing().unwrap().group_of(addr)
    }
    fn members(&self, founder: usize) -> usize {
        self.pages.sharing().unwrap().members(founder)
    }
    fn foundings(&self, founder: usize) -> usize {
        self.pages.sharing().unwrap().foundings(founder)
    }
    fn shared(&self) -> (usize, usize) {
        self.pages.sharing().unwrap().shared()
    }
    fn seams(&self) -> usize {
        self.pages.sharing().unwrap().seams()
    }
    fn guards_lost(&self) -> u64 {
        self.pages.guards_lost()
    }
    fn registrations_refused(&self) -> u64 {
        self.pages.registrations_refused()
    }
    fn seam_budget(&self) -> (usize, usize) {
        let (used, cap) = self.pages.sharing().unwrap().seam_budget();
        self.mapping_cap
            .map_or((used, cap), |cap| (self.seams(), cap))
    }
}

#[test]
fn a_group_that_comes_to_nothing_gives_its_pages_back_intact() {
    let source = Tweaked {
        pages: SharedPages::new(),
        joins_fail_late: true,
        mapping_cap: None,
    };
    let heap = Heap::with_source(source, Default::default());
    let layout = Layout::from_size_align(64, 8).unwrap();
    let per_page = os_page() / 64;
    let blocks: Vec<NonNull<u8>> = (0..64 * per_page)
        .map(|_| heap.allocate(layout).unwrap().cast())
        .collect();
    let mut kept = Vec::new();
    for (i, p) in blocks.into_iter().enumerate() {
        if i % per_page == (i / per_page) % per_page {
            let s = Survivor {
                p,
                layout,
                tag: (i % 250 + 1) as u8,
            };
            s.write();
            kept.push(s);
        } else {
            // SAFETY: allocated above, freed once.
            unsafe { heap.deallocate(p, layout) };
        }
    }
    // SAFETY: this thread is the heap's only user.
    assert_eq!(unsafe { heap.mesh() }, 0, "every join fails");
    assert!(all_intact(&kept));
    assert_eq!(heap.stats().meshed_bytes, 0);
    // Every slot is usable again, each holding the page key.
    for i in 0..60 * per_page {
        let s = Survivor {
            p: heap.allocate(layout).unwrap().cast(),
            layout,
            tag: (i % 200 + 5) as u8,
        };
        s.write();
        kept.push(s);
    }
    assert!(all_intact(&kept));
    for s in kept {
        // SAFETY: live, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
}

/// Before a pass withholds slots of a page, frees of the page's slots stop
/// going into thread caches and every thread passes a barrier (the page
/// source's `serialize_threads`, one per size class that meshes), so a
/// cached double free under way takes the checked path, or is seen by
/// the pass (its slot announced) or by the page's check
/// (`memory/cache_handshake.rs`).
#[test]
fn a_pass_serializes_threads_before_it_withholds_slots() {
    let heap = heap();
    let kept = one_survivor_per_os_page(&heap, pages() / 4, 11);
    heap.trim();
    let before = heap.source().syscalls().barriers;
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let barriers = heap.source().syscalls().barriers - before;
    assert!(joined > 0);
    assert!(
        (1..=12).contains(&barriers),
        "{barriers} barriers for 12 size classes meshed"
    );
    assert!(all_intact(&kept));
}

/// `SharedPages`, remembering where its mappings are (to count the
/// kernel's mappings there).
#[derive(Default)]
struct Recorded {
    pages: SharedPages,
    maps: std::sync::Mutex<Vec<(usize, usize)>>,
}

// SAFETY: forwards to `SharedPages`, which upholds the contract.
unsafe impl pagewise::PageSource for Recorded {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let p = self.pages.map(size, align)?;
        self.maps.lock().unwrap().push((p.as_ptr() as usize, size));
        Some(p)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        let at = (ptr.as_ptr() as usize, size);
        self.maps.lock().unwrap().retain(|&m| m != at);
        // SAFETY: forwarded.
        unsafe { self.pages.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: pagewise::Purge) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.pages.now_ms()
    }
    fn syscalls(&self) -> pagewise::SyscallCounts {
        self.pages.syscalls()
    }
    fn sharing(&self) -> Option<&dyn pagewise::source::SharePages> {
        self.pages.sharing()
    }
    fn thp(&self) -> pagewise::thp::ThpMode {
        self.pages.thp()
    }
    unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.advise_huge(ptr, size, huge) }
    }
}

impl Recorded {
    /// Whether the kernel's mappings inside the source's are as many as
    /// it counts (one per mapping and one per seam); if not, the first 40
    /// of the kernel's mappings there with their `VmFlags`.
    /// Read up to 5 times until it holds: a read of /proc/self/smaps while
    /// other threads (other tests) split or merge their mappings may show
    /// a mapping twice or miss one; a count that is wrong is wrong every
    /// time.
    fn seams_are_the_kernels(&self) -> Result<(), String> {
        // Under user-mode emulation (the aarch64 suite runs under
        // qemu-aarch64, named by PAGEWISE_TEST_RUNNER) `madvise` is not
        // passed to the kernel and /proc/self/smaps is the emulator's: the
        // kernel's merge rules cannot be checked there.
        if std::env::var("PAGEWISE_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty()) {
            eprintln!("the seams against the kernel's mappings: emulated, not checked");
            return Ok(());
        }
        let mut r = self.seams_are_the_kernels_once();
        for _ in 0..4 {
            if r.is_ok() {
                break;
            }
            std::thread::yield_now();
            r = self.seams_are_the_kernels_once();
        }
        r
    }

    fn seams_are_the_kernels_once(&self) -> Result<(), String> {
        let maps = self.maps.lock().unwrap().clone();
        let ours = |a: usize, b: usize| maps.iter().any(|&(p, n)| a < p + n && b > p);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let (mut lines, mut text, mut inside) = (0, String::new(), false);
        for l in smaps.lines() {
            let range = l
                .split_once(' ')
                .and_then(|(r, _)| r.split_once('-'))
                .and_then(|(a, b)| {
                    Some((
                        usize::from_str_radix(a, 16).ok()?,
                        usize::from_str_radix(b, 16).ok()?,
                    ))
                });
            if let Some((a, b)) = range {
                inside = ours(a, b) && {
                    lines += 1;
                    lines <= 40
                };
                if inside {
                    text += &format!("\n  {a:#x}-{b:#x} ");
                }
            } else if inside && l.starts_with("VmFlags:") {
                text += l;
            }
        }
        let counted = maps.len() + self.pages.sharing().unwrap().seams();
        if lines == counted {
            Ok(())
        } else {
            Err(format!("{lines} kernel mappings, {counted} counted:{text}"))
        }
    }
}

/// A meshing heap whose regions are advised huge (`Thp::Always`: each
/// region a slab page starts in): a pass takes the advice back from the
/// region of each OS page it meshes (counted as a split), as a purge does,
/// and meshes it; regions with nothing to mesh stay advised; the seams
/// stay the kernel's mappings throughout, as pages join and leave around
/// the advised regions. Holds with or without huge pages granted (the
/// advice is made either way under `always`).
#[test]
fn a_pass_takes_back_the_advice_of_regions_it_meshes_in_and_the_seams_stay_exact() {
    let heap = Heap::with_source(
        Recorded::default(),
        pagewise::Config {
            thp: pagewise::Thp::Always,
            ..Default::default()
        },
    );
    // 4 MiB of 1 KiB blocks, all kept: their regions have nothing to mesh.
    let dense_layout = Layout::from_size_align(1024, 8).unwrap();
    let dense: Vec<Survivor> = (0..4096)
        .map(|i| {
            let s = Survivor {
                p: heap.allocate(dense_layout).unwrap().cast(),
                layout: dense_layout,
                tag: (i % 200 + 3) as u8,
            };
            s.write();
            s
        })
        .collect();
    let mut kept = one_survivor_per_os_page(&heap, pages(), 0x5eed);
    heap.trim();
    let before = heap.stats();
    assert!(
        before.thp_bytes >= 4 << 20,
        "control: regions advised: {before:?}"
    );
    heap.source().seams_are_the_kernels().unwrap();
    // SAFETY: this thread is the heap's only user.
    let joined = unsafe { heap.mesh() };
    let after = heap.stats();
    assert!(
        all_intact(&kept) && all_intact(&dense),
        "a survivor lost its bytes"
    );
    assert!(joined > 0, "{after:?}");
    assert!(
        after.thp_splits > before.thp_splits,
        "advice taken back: {after:?}"
    );
    assert!(
        after.thp_bytes >= 2 << 20,
        "the dense regions stay advised: {after:?}"
    );
    assert!(after.thp_bytes < before.thp_bytes, "{after:?}");
    heap.source().seams_are_the_kernels().unwrap();
    // Half the survivors go: their meshed pages leave their groups.
    let mut i = 0;
    kept.retain(|s| {
        i += 1;
        if i % 2 == 0 {
            // SAFETY: live, freed once.
            unsafe { heap.deallocate(s.p, s.layout) };
        }
        i % 2 == 1
    });
    // SAFETY: as above.
    unsafe { heap.mesh() };
    heap.source().seams_are_the_kernels().unwrap();
    for s in kept.drain(..).chain(dense) {
        assert!(s.intact());
        // SAFETY: live, freed once.
        unsafe { heap.deallocate(s.p, s.layout) };
    }
    // SAFETY: as above.
    unsafe { heap.mesh() };
    heap.trim();
    let end = heap.stats();
    assert_eq!((end.meshed_bytes, end.thp_bytes), (0, 0), "{end:?}");
    heap.source().seams_are_the_kernels().unwrap();
}
