//! Idle programs: memory is freed, the program goes quiet, and the
//! figure is what RSS is after the idle period (the worker waits it after
//! the workload returns). Every object is freed before the workload
//! returns, so the live bytes are zero and whatever RSS stays is memory the
//! allocator holds; the bookkeeping arrays are unmapped before returning
//! so they are not in it.
//!
//! The scenarios differ in which thread frees and whether the thread that
//! allocated is still there: an allocator that purges only from its own
//! calls, or only for the calling thread, keeps the memory in some of them.

use crate::util::{free_obj, new_obj, MmapVec, Obj, Rng};
use crate::workloads::{part_since, Rec, Scale};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Block size of scenarios (a) and (b): 6,000 B, a small-object size in
/// every allocator here (below each one's large threshold), so the frees
/// land in thread caches and size-class pages, not in the large path that
/// purges on its own.
const BLOCK: usize = 6000;

fn blocks(scale: Scale) -> usize {
    // 8,192 x 6,000 B = 49 MB, the figure.
    scale.pick(256, 8192, 8192)
}

/// Allocates `n` blocks, writes all of them, frees them all; returns the
/// allocator operations made.
fn alloc_write_free(n: usize) -> u64 {
    let mut held: MmapVec<Obj> = MmapVec::with_capacity(n);
    for _ in 0..n {
        held.push(new_obj(BLOCK, BLOCK));
    }
    for &o in held.as_slice() {
        free_obj(o);
    }
    2 * n as u64
}

/// (a) The calling thread allocates, writes and frees, then (in the
/// worker) sleeps: the thread that freed is alive but quiet.
pub(crate) fn one_thread(scale: Scale, rec: &mut Rec) -> MmapVec<Obj> {
    let t = Instant::now();
    let ops = alloc_write_free(blocks(scale));
    rec.ops += ops;
    part_since(rec, "alloc, write, free", ops, t);
    MmapVec::with_capacity(1)
}

/// (b) Eight threads each do what (a) does, then exit: what they freed
/// belongs to threads that are gone.
pub(crate) fn threads_exit(scale: Scale, rec: &mut Rec) -> MmapVec<Obj> {
    let nthreads = scale.pick(2, 8, 8);
    let n = blocks(scale);
    let t = Instant::now();
    let handles: Vec<_> = (0..nthreads)
        .map(|_| std::thread::spawn(move || alloc_write_free(n)))
        .collect();
    let ops: u64 = handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .sum();
    rec.ops += ops;
    part_since(rec, &format!("{nthreads} threads, then exit"), ops, t);
    MmapVec::with_capacity(1)
}

/// Size of the objects of scenario (c).
const HANDOFF_OBJ: usize = 1024;

/// The producer of (c): allocates and writes `n` objects.
fn produce(n: usize) -> MmapVec<Obj> {
    let mut objs = MmapVec::with_capacity(n);
    for _ in 0..n {
        objs.push(new_obj(HANDOFF_OBJ, HANDOFF_OBJ));
    }
    objs
}

/// (c) A producer thread allocates 200 MiB of 1 KiB objects and hands
/// them to the main thread, which frees them all. With `blocked` false the
/// producer has exited before the frees (its heap is abandoned); with
/// `blocked` true it stays alive, blocked, until the idle RSS has been
/// read (its heap has an owner that never calls the allocator).
pub(crate) fn handoff(scale: Scale, blocked: bool, rec: &mut Rec) -> MmapVec<Obj> {
    let n = scale.pick(1 << 20, 200 << 20, 200 << 20) / HANDOFF_OBJ;
    let t = Instant::now();
    let objs = if blocked {
        handoff_blocked(n, rec)
    } else {
        std::thread::spawn(move || produce(n))
            .join()
            .expect("producer panicked")
    };
    part_since(rec, "produce (other thread)", n as u64, t);
    let t = Instant::now();
    for &o in objs.as_slice() {
        free_obj(o);
    }
    drop(objs);
    rec.ops += 2 * n as u64;
    part_since(rec, "free (main thread)", n as u64, t);
    MmapVec::with_capacity(1)
}

/// The producer of (c'): hands its objects over and blocks until the
/// recorder ends it. Everything the hand-over needs is allocated by the
/// main thread before the producer starts (a channel would allocate its
/// first block in the producer, after the objects: a live block at the top
/// of the producer's heap, which would keep glibc from trimming it, a
/// harness artefact rather than the scenario).
fn handoff_blocked(n: usize, rec: &mut Rec) -> MmapVec<Obj> {
    let slot: Arc<Mutex<Option<MmapVec<Obj>>>> = Arc::new(Mutex::new(None));
    let handed = Arc::new(Barrier::new(2));
    let end = Arc::new(Barrier::new(2));
    let h = {
        let (slot, handed, end) = (Arc::clone(&slot), Arc::clone(&handed), Arc::clone(&end));
        std::thread::spawn(move || {
            *slot.lock().expect("slot") = Some(produce(n));
            handed.wait();
            // Blocked until the worker has read RSS after idle.
            end.wait();
        })
    };
    handed.wait();
    let objs = slot.lock().expect("slot").take().expect("objects");
    rec.linger(move || {
        end.wait();
        h.join().expect("producer panicked");
    });
    objs
}

/// Sizes of `idle-thread-rounds`: log-uniform 16 B-16 KiB, mostly small
/// objects with a tail into the sizes that take whole pages.
fn round_size(rng: &mut Rng) -> usize {
    (16.0 * 1024f64.powf(rng.unit())) as usize
}

/// One thread of a round: frees what the same-numbered thread of the
/// previous round left (a cross-thread free into a dead thread's memory),
/// allocates and writes `n` objects, frees every other one, and leaves the
/// rest to the next round. Returns (what it leaves, operations).
fn round_thread(inherited: Option<MmapVec<Obj>>, n: usize, seed: u64) -> (MmapVec<Obj>, u64) {
    let mut ops = 0;
    if let Some(old) = inherited {
        for &o in old.as_slice() {
            free_obj(o);
        }
        ops += old.len() as u64;
    }
    let mut rng = Rng::new(seed);
    let mut left = MmapVec::with_capacity(n.div_ceil(2));
    for i in 0..n {
        let size = round_size(&mut rng);
        let o = new_obj(size, size);
        if i % 2 == 0 {
            left.push(o);
        } else {
            free_obj(o);
            ops += 1;
        }
    }
    (left, ops + n as u64)
}

/// (d) Rounds of threads that allocate, free and exit, the way a server
/// with a thread per task or a stress test with thread churn runs; after
/// the last round the main thread frees what is left and goes quiet.
pub(crate) fn thread_rounds(scale: Scale, seed: u64, rec: &mut Rec) -> MmapVec<Obj> {
    let rounds: u64 = scale.pick(2, 16, 16);
    let nthreads: u64 = scale.pick(2, 8, 8);
    let per_thread = scale.pick(100, 2_000, 5_000);
    let t = Instant::now();
    let mut ops = 0;
    let mut inherited: Vec<Option<MmapVec<Obj>>> = (0..nthreads).map(|_| None).collect();
    for round in 0..rounds {
        let handles: Vec<_> = inherited
            .iter_mut()
            .enumerate()
            .map(|(i, slot)| {
                let old = slot.take();
                let s = seed ^ (round * nthreads + i as u64 + 1).wrapping_mul(0x9e37_79b9);
                std::thread::spawn(move || round_thread(old, per_thread, s))
            })
            .collect();
        for (slot, h) in inherited.iter_mut().zip(handles) {
            let (left, n) = h.join().expect("round thread panicked");
            *slot = Some(left);
            ops += n;
        }
    }
    for left in inherited.into_iter().flatten() {
        for &o in left.as_slice() {
            free_obj(o);
        }
        ops += left.len() as u64;
    }
    rec.ops += ops;
    part_since(
        rec,
        &format!("{rounds} rounds x {nthreads} threads"),
        ops,
        t,
    );
    MmapVec::with_capacity(1)
}
