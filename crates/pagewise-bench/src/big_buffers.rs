//! The other side of idle programs: a program busy re-using large
//! buffers must keep the memory it is about to need again. Twenty buffers of 5-25 MiB stay
//! live; one at a time, at random, is replaced by a new buffer of a new
//! size, whose every page is written (the first touch is what costs a page
//! fault when the allocator gave the pages back in between). The figures
//! are the wall time, the peak RSS and the minor page faults.

use crate::util::{free_obj, minor_faults, new_obj, touch_pages, MmapVec, Obj, Rng};
use crate::workloads::{Part, Rec, Scale};
use std::time::Instant;

/// A new buffer of `lo..=hi` bytes with every page written.
fn fresh(rng: &mut Rng, lo: u64, hi: u64) -> Obj {
    let o = new_obj(rng.range(lo, hi) as usize, 1);
    touch_pages(o);
    o
}

/// Runs the churn; the live buffers are the survivors (the worker reads
/// RSS with them live, then frees them after the idle period).
pub(crate) fn run(scale: Scale, seed: u64, rec: &mut Rec) -> MmapVec<Obj> {
    let live: usize = scale.pick(4, 20, 20);
    let replacements: u64 = scale.pick(20, 400, 2_000);
    let (lo, hi): (u64, u64) =
        scale.pick((1 << 20, 2 << 20), (5 << 20, 25 << 20), (5 << 20, 25 << 20));
    let mut rng = Rng::new(seed ^ 0xb1_6b0f);
    let peak_ok = rec.reset_peak();
    let faults = minor_faults();
    let t = Instant::now();
    let mut bufs = MmapVec::with_capacity(live);
    for _ in 0..live {
        bufs.push(fresh(&mut rng, lo, hi));
    }
    for _ in 0..replacements {
        let i = rng.below(live as u64) as usize;
        // As `bufs[i] = vec![..]` does: the new buffer is made before the
        // old one is dropped, so 21 are live for a moment.
        let new = fresh(&mut rng, lo, hi);
        free_obj(bufs.as_slice()[i]);
        bufs.as_mut_slice()[i] = new;
    }
    let ns = t.elapsed().as_nanos() as u64;
    let faults = minor_faults() - faults;
    let ops = live as u64 + 2 * replacements;
    rec.ops += ops;
    let rss = rec.rss();
    let peak_rss = if peak_ok { rec.peak() } else { None };
    rec.parts.push(Part {
        name: format!("{replacements} replacements"),
        ops,
        ns,
        rss,
        live_bytes: Some(bufs.as_slice().iter().map(|o| o.size as u64).sum()),
        peak_rss,
        figures: vec![
            ("wall ms".into(), ns as f64 / 1e6),
            ("minor faults".into(), faults as f64),
        ],
        ..Part::default()
    });
    bufs
}
