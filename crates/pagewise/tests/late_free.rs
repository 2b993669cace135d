//! A thread that never allocated, whose frees come in the last round of
//! pthread key destructors, must not adopt a heap there: glibc runs no
//! further round, so that heap would never be abandoned and its cached slots
//! and pages would stay out of reach for good. (Its own test binary: it
//! counts heaps.)

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use pagewise::size_class::class_of;
use pagewise::thread::{current_or_null, FREES_BEFORE_HEAP};
use std::alloc::{alloc, dealloc, Layout};

const L: Layout = match Layout::from_size_align(200, 8) {
    Ok(l) => l,
    Err(_) => panic!("layout"),
};

/// What the destructor frees, and how often it has run.
struct Job {
    round: usize,
    key: libc::pthread_key_t,
    blocks: Vec<usize>,
}

/// Re-arms itself for glibc's first three destructor rounds, then frees
/// every block in the fourth and last.
extern "C" fn last_round_frees(v: *mut libc::c_void) {
    // SAFETY: the key's value is the leaked `Job` below, used by this
    // thread only.
    let job = unsafe { &mut *(v as *mut Job) };
    job.round += 1;
    if job.round < 4 {
        // SAFETY: a valid key; the value stays valid (leaked).
        unsafe { libc::pthread_setspecific(job.key, v) };
        return;
    }
    for &p in &job.blocks {
        // SAFETY: allocated by the main thread with `L`, freed once, here.
        unsafe { dealloc(p as *mut u8, L) };
    }
}

#[test]
fn frees_in_the_last_destructor_round_adopt_no_heap() {
    // Objects of the class live before the test: the harness's own (with
    // four `--skip` filters, as CI's aarch64 step passes, the vector of the
    // command-line arguments is a live 224-byte slot of this class).
    let live_before = pagewise::stats().classes[class_of(200)].live_slots;
    let n = FREES_BEFORE_HEAP as usize + 36;
    // SAFETY: non-zero layout.
    let blocks: Vec<usize> = (0..n).map(|_| unsafe { alloc(L) } as usize).collect();
    let job = Box::into_raw(Box::new(Job {
        round: 0,
        key: 0,
        blocks,
    })) as usize;
    let before = pagewise::stats().heaps;
    std::thread::spawn(move || {
        assert!(current_or_null().is_null());
        let job = job as *mut Job;
        // SAFETY: a fresh key whose destructor takes the leaked `Job`.
        unsafe {
            let mut key = 0;
            assert_eq!(
                libc::pthread_key_create(&mut key, Some(last_round_frees)),
                0
            );
            (*job).key = key;
            libc::pthread_setspecific(key, job as *const libc::c_void);
        }
    })
    .join()
    .unwrap();
    // SAFETY: made above, no longer used by anyone.
    let job = unsafe { Box::from_raw(job as *mut Job) };
    assert_eq!(job.round, 4, "the blocks were freed in the last round");
    // A new thread that allocates adopts an abandoned heap if there is one:
    // no heap may be stuck with a dead owner. The probe's allocation must
    // happen: an optimiser that drops an unread `Box` would leave the thread
    // heapless, and the count below would then pass only if the bug is there
    // (the stuck heap counting for the probe's). black_box keeps it, and the
    // thread checks that it got a heap.
    let probe_had_heap = std::thread::spawn(|| {
        drop(std::hint::black_box(Box::new([0u8; 100])));
        !current_or_null().is_null()
    })
    .join()
    .unwrap();
    assert!(probe_had_heap, "the probe thread allocated through a heap");
    let s = pagewise::stats();
    assert_eq!(
        s.heaps,
        before + 1,
        "a heap was adopted and never abandoned"
    );
    assert_eq!(s.classes[class_of(200)].live_slots, live_before);
}
