//! Mesh groups take new members in later passes: an OS page that goes
//! sparse after a pass joins a group an earlier pass made, when none of
//! the positions the group's members may use meets its live slots; and a
//! group never takes one over a position a member may still use (an
//! object in use on a full page, or a free slot the member hands out
//! again), which would overwrite that member's bytes.
#![cfg(target_os = "linux")]

use pagewise::{Heap, SharedPages};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;

fn os_page() -> usize {
    pagewise::layout::os_page()
}

const SIZE: usize = 64;

fn layout() -> Layout {
    Layout::from_size_align(SIZE, 8).unwrap()
}

fn heap() -> Heap<SharedPages> {
    Heap::with_source(SharedPages::new(), Default::default())
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Live objects, each filled with a tag of its own.
#[derive(Default)]
struct Live(Vec<(NonNull<u8>, u8)>);

impl Live {
    fn keep(&mut self, p: NonNull<u8>) {
        let tag = (self.0.len() % 251 + 1) as u8;
        // SAFETY: a live block of SIZE bytes.
        unsafe { std::ptr::write_bytes(p.as_ptr(), tag, SIZE) };
        self.0.push((p, tag));
    }
    /// Every live object's every byte is its tag.
    fn assert_intact(&self, when: &str) {
        for (i, &(p, tag)) in self.0.iter().enumerate() {
            // SAFETY: a live block of SIZE bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), SIZE) };
            assert!(
                bytes.iter().all(|&b| b == tag),
                "{when}: object {i} at {p:?} lost its bytes (tag {tag}): {bytes:?}"
            );
        }
    }
}

/// `n` objects of SIZE bytes by the OS page they lie on (in address order).
fn by_os_page(heap: &Heap<SharedPages>, n: usize) -> BTreeMap<usize, Vec<NonNull<u8>>> {
    let mut pages: BTreeMap<usize, Vec<NonNull<u8>>> = BTreeMap::new();
    for _ in 0..n {
        let p: NonNull<u8> = heap.allocate(layout()).unwrap().cast();
        pages
            .entry(p.as_ptr() as usize / os_page())
            .or_default()
            .push(p);
    }
    for ps in pages.values_mut() {
        ps.sort();
    }
    pages
}

fn free(heap: &Heap<SharedPages>, p: NonNull<u8>) {
    // SAFETY: allocated with `layout()`, freed once.
    unsafe { heap.deallocate(p, layout()) };
}

/// (meshed OS pages, groups, bytes saved) by the heap's stats.
fn mesh_counts(heap: &Heap<SharedPages>) -> (u64, u64, u64) {
    let s = heap.stats();
    let page = os_page() as u64;
    (
        s.meshed_bytes / page,
        (s.meshed_bytes - s.mesh_saved_bytes) / page,
        s.mesh_saved_bytes,
    )
}

#[test]
fn a_page_that_goes_sparse_later_joins_a_group_made_before() {
    let heap = heap();
    let mut rng = Rng(0x5eed);
    let mut live = Live::default();
    // 4 MiB of objects; one per OS page survives at random, except on
    // LATER OS pages, spread over the heap, which stay full for now. The
    // survivors lie at the positions of an OS page but its last LATER,
    // where the later pages' survivors will be: every later page fits
    // every group (which positions a group can take is the business of
    // the tests below).
    const LATER: usize = 8;
    let pages = by_os_page(&heap, (4 << 20) / SIZE);
    let full_pages: Vec<usize> = pages
        .iter()
        .filter(|(_, ps)| ps.len() == os_page() / SIZE)
        .map(|(&k, _)| k)
        .collect();
    let later: Vec<usize> = (1..=LATER)
        .map(|i| full_pages[i * full_pages.len() / (LATER + 2)])
        .collect();
    for (k, ps) in &pages {
        if later.contains(k) {
            continue;
        }
        let keep = rng.below(ps.len().saturating_sub(LATER).max(1));
        for (i, &p) in ps.iter().enumerate() {
            if i == keep {
                live.keep(p);
            } else {
                free(&heap, p);
            }
        }
    }
    for k in &later {
        for &p in &pages[k] {
            live.keep(p);
        }
    }
    // Mesh until a pass finds nothing more to do.
    // SAFETY: this thread is the heap's only user.
    let first = unsafe { heap.mesh() };
    assert!(first > 0);
    for _ in 0..8 {
        // SAFETY: as above.
        if unsafe { heap.mesh() } == 0 {
            break;
        }
    }
    live.assert_intact("after the first passes");
    let (meshed, groups, saved) = mesh_counts(&heap);
    let memory = heap.source().held_bytes();
    assert!(
        groups > 0 && meshed > groups,
        "{meshed} pages in {groups} groups"
    );
    // The later pages go sparse: one object of each survives.
    let mut later_live = Live::default();
    live.0.retain(|&(p, tag)| {
        if !later.contains(&(p.as_ptr() as usize / os_page())) {
            return true;
        }
        later_live.0.push((p, tag));
        false
    });
    for (i, k) in later.iter().enumerate() {
        let ps = &pages[k];
        let keep = ps[ps.len() - 1 - i];
        for &p in ps {
            if p != keep {
                free(&heap, p);
            }
        }
        live.0
            .extend(later_live.0.iter().filter(|&&(p, _)| p == keep));
    }
    // SAFETY: as above.
    let joined = unsafe { heap.mesh() };
    live.assert_intact("after the later pass");
    let (meshed2, groups2, saved2) = mesh_counts(&heap);
    let memory2 = heap.source().held_bytes();
    let page = os_page() as u64;
    eprintln!(
        "meshed {meshed} -> {meshed2} OS pages, groups {groups} -> {groups2}, \
         saved {saved} -> {saved2} B, memory {memory} -> {memory2} B, joined {joined}"
    );
    assert_eq!(joined, LATER, "every later page joined a group");
    assert_eq!(meshed2, meshed + LATER as u64);
    assert_eq!(groups2, groups, "they joined groups made before");
    assert_eq!(saved2, saved + LATER as u64 * page);
    assert!(
        memory - memory2 >= LATER as u64 * page,
        "the kernel holds {memory} -> {memory2} B"
    );
    for &(p, _) in &live.0 {
        free(&heap, p);
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!((s.meshed_bytes, s.committed_bytes, s.live_bytes), (0, 0, 0));
}

/// Slab pages that hold OS pages `a` and `b` differ (a slab page of
/// SIZE-byte slots spans well under 2 MiB).
fn far_apart(a: usize, b: usize) -> bool {
    a.abs_diff(b) * os_page() >= 2 << 20
}

/// Three OS pages, far apart, of a heap of 8 MiB of objects all live: A
/// and B (to mesh) and D (to go sparse later).
struct Three {
    pages: BTreeMap<usize, Vec<NonNull<u8>>>,
    a: usize,
    b: usize,
    d: usize,
}

fn three(heap: &Heap<SharedPages>) -> Three {
    let pages = by_os_page(heap, (8 << 20) / SIZE);
    let full: Vec<usize> = pages
        .iter()
        .filter(|(_, ps)| ps.len() == os_page() / SIZE)
        .map(|(&k, _)| k)
        .collect();
    let (a, b, d) = (full[1], full[full.len() / 2], full[full.len() - 2]);
    assert!(far_apart(a, b) && far_apart(b, d));
    Three { pages, a, b, d }
}

/// Frees every live object of OS page `k` but those at `keep`.
fn thin(heap: &Heap<SharedPages>, t: &Three, live: &mut Live, k: usize, keep: &[usize]) {
    let ps = &t.pages[&k];
    let go: std::collections::HashSet<NonNull<u8>> = (0..ps.len())
        .filter(|i| !keep.contains(i))
        .map(|i| ps[i])
        .collect();
    live.0.retain(|&(p, _)| {
        if go.contains(&p) {
            free(heap, p);
        }
        !go.contains(&p)
    });
}

fn keep_all(t: &Three) -> Live {
    let mut live = Live::default();
    for ps in t.pages.values() {
        for &p in ps {
            live.keep(p);
        }
    }
    live
}

#[test]
fn a_group_takes_no_member_over_the_objects_of_a_member_on_the_full_list() {
    let heap = heap();
    let t = three(&heap);
    let mut live = keep_all(&t);
    // A keeps its objects at positions 5 and 7, B at 9: they mesh into
    // one group.
    thin(&heap, &t, &mut live, t.a, &[5, 7]);
    thin(&heap, &t, &mut live, t.b, &[9]);
    // SAFETY: this thread is the heap's only user.
    assert_eq!(unsafe { heap.mesh() }, 2, "A and B mesh");
    assert_eq!(mesh_counts(&heap).1, 1);
    // A frees its object at 7 (a slot A may use again), and the heap
    // allocates until A's slab page has been taken again and used up: it
    // goes to the full list, with its objects on the group page live.
    let a7 = t.pages[&t.a][7];
    thin(&heap, &t, &mut live, t.a, &[5]);
    heap.trim();
    let mut reused = false;
    for _ in 0..4 * os_page() / SIZE + 4096 {
        let p: NonNull<u8> = heap.allocate(layout()).unwrap().cast();
        reused |= p == a7;
        live.keep(p);
    }
    assert!(reused, "A's slab page was taken again");
    // D goes sparse, its object at A's position.
    thin(&heap, &t, &mut live, t.d, &[5]);
    live.assert_intact("before the pass");
    // SAFETY: as above.
    unsafe { heap.mesh() };
    live.assert_intact("after the pass");
    assert_eq!(mesh_counts(&heap).0, 2, "D joined no group");
    for &(p, _) in &live.0 {
        free(&heap, p);
    }
}

#[test]
fn a_group_takes_no_member_over_a_members_free_slot() {
    let heap = heap();
    let t = three(&heap);
    let mut live = keep_all(&t);
    // A keeps objects at positions 5 and 6, B at 9: they mesh.
    thin(&heap, &t, &mut live, t.a, &[5, 6]);
    thin(&heap, &t, &mut live, t.b, &[9]);
    // SAFETY: this thread is the heap's only user.
    assert_eq!(unsafe { heap.mesh() }, 2, "A and B mesh");
    // A frees its object at 5: a free slot of A's, in the group page.
    thin(&heap, &t, &mut live, t.a, &[6]);
    // D goes sparse, its object at position 5.
    thin(&heap, &t, &mut live, t.d, &[5]);
    // SAFETY: as above.
    unsafe { heap.mesh() };
    live.assert_intact("after the pass");
    // A's free slot is handed out again: writing it must not touch D's.
    for _ in 0..4 * os_page() / SIZE + 4096 {
        let p: NonNull<u8> = heap.allocate(layout()).unwrap().cast();
        live.keep(p);
    }
    live.assert_intact("after A's free slot was used again");
    assert_eq!(mesh_counts(&heap).0, 2, "D joined no group");
    for &(p, _) in &live.0 {
        free(&heap, p);
    }
}
