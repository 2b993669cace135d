//! Property test: random allocate / free / reallocate sequences with random
//! sizes and alignments, checked against a simple model: no two live blocks
//! overlap, contents survive (including across reallocation), alignment and
//! usable size hold, and the counters match the model.

use pagewise::{Config, FakePages, Heap};
use proptest::prelude::*;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, align_log: u8 },
    Free { pick: usize },
    Realloc { pick: usize, size: usize },
    Trim,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 1usize..=256,
        4 => 257usize..=16 << 10,
        2 => (16usize << 10)..=(300 << 10),
        1 => (300usize << 10)..=(3 << 20),
        1 => (16usize << 20)..=(40 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0u8..=13).prop_map(|(size, align_log)| Op::Alloc { size, align_log }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), size()).prop_map(|(pick, size)| Op::Realloc { pick, size }),
        1 => Just(Op::Trim),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    layout: Layout,
    seed: u8,
}

/// The byte expected at offset `i` of a block with this seed.
fn pattern(seed: u8, i: usize) -> u8 {
    seed ^ (i as u8).wrapping_mul(31)
}

/// Offsets that are written and checked: first, middle, last.
fn probes(n: usize) -> [usize; 3] {
    [0, n / 2, n - 1]
}

fn fill(l: &Live) {
    for i in probes(l.layout.size()) {
        // SAFETY: the block is live with at least `layout.size()` bytes.
        unsafe { l.ptr.as_ptr().add(i).write(pattern(l.seed, i)) };
    }
}

/// Checks the probes of the first `n` bytes (a prefix after reallocation).
fn check(l: &Live, n: usize) {
    for i in probes(l.layout.size()) {
        if i < n {
            // SAFETY: as in `fill`.
            assert_eq!(
                unsafe { l.ptr.as_ptr().add(i).read() },
                pattern(l.seed, i),
                "offset {i}"
            );
        }
    }
}

fn run(ops: Vec<Op>, heap: &Heap<&'static FakePages>) {
    let mut live: Vec<Live> = Vec::new();
    let mut seed = 0u8;
    for op in ops {
        match op {
            Op::Alloc { size, align_log } => {
                let layout = Layout::from_size_align(size, 1 << align_log).unwrap();
                let p = heap.allocate(layout).unwrap();
                assert_eq!(p.cast::<u8>().as_ptr() as usize % layout.align(), 0);
                assert!(p.len() >= size);
                seed = seed.wrapping_add(1);
                let l = Live {
                    ptr: p.cast(),
                    layout,
                    seed,
                };
                fill(&l);
                live.push(l);
            }
            Op::Free { pick } if !live.is_empty() => {
                let l = live.swap_remove(pick % live.len());
                check(&l, l.layout.size());
                // SAFETY: live block with its layout.
                unsafe { heap.deallocate(l.ptr, l.layout) };
            }
            Op::Realloc { pick, size } if !live.is_empty() => {
                let i = pick % live.len();
                let old = &live[i];
                check(old, old.layout.size());
                // SAFETY: live block with its layout.
                let p = unsafe { heap.reallocate(old.ptr, old.layout, size) }.unwrap();
                assert!(p.len() >= size);
                let layout = Layout::from_size_align(size, old.layout.align()).unwrap();
                assert_eq!(p.cast::<u8>().as_ptr() as usize % layout.align(), 0);
                let moved = Live {
                    ptr: p.cast(),
                    layout,
                    seed: old.seed,
                };
                // The probes of the old block that fit in the new size survive.
                let kept = Live {
                    layout: old.layout,
                    ..moved
                };
                check(&kept, size.min(old.layout.size()));
                seed = seed.wrapping_add(1);
                let l = Live { seed, ..moved };
                fill(&l);
                live[i] = l;
            }
            Op::Trim => heap.trim(),
            _ => {}
        }
        // No overlap between live blocks (by usable size).
        let mut spans = BTreeMap::new();
        for l in &live {
            // SAFETY: live block.
            let usable = unsafe { heap.usable_size(l.ptr) };
            assert!(usable >= l.layout.size());
            spans.insert(l.ptr.as_ptr() as usize, usable);
        }
        let mut end = 0;
        for (&start, &len) in &spans {
            assert!(start >= end, "overlap at {start:#x}");
            end = start + len;
        }
        let s = heap.stats();
        assert_eq!(s.live_allocations, live.len() as u64);
    }
    for l in live.drain(..) {
        check(&l, l.layout.size());
        // SAFETY: live block with its layout.
        unsafe { heap.deallocate(l.ptr, l.layout) };
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.committed_bytes, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_sequences_match_the_model(ops in proptest::collection::vec(op(), 1..300)) {
        let src: &'static FakePages = Box::leak(Box::new(FakePages::new()));
        let heap = Heap::with_source(src, Config::default());
        run(ops, &heap);
        drop(heap);
        prop_assert_eq!(src.syscalls().mapped_bytes, 0);
    }
}

use pagewise::PageSource;
