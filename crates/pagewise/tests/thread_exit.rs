//! Heaps of exited threads are adopted by new threads (its own test binary,
//! so no other test's threads make heaps meanwhile).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::thread;

fn stamp(v: &mut [u8], tag: u8) {
    for (i, b) in v.iter_mut().enumerate() {
        *b = tag ^ i as u8;
    }
}

fn verify(v: &[u8], tag: u8) {
    for (i, b) in v.iter().enumerate() {
        assert_eq!(*b, tag ^ i as u8);
    }
}

#[test]
fn objects_outlive_the_threads_that_made_them() {
    let mut kept = Vec::new();
    for t in 0..32u8 {
        let batch = thread::spawn(move || {
            (0..500)
                .map(|i| {
                    let mut v = vec![0u8; 1 + (i * 13) % 5000];
                    stamp(&mut v, t);
                    v
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        kept.push((batch, t));
    }
    // Threads are gone; their heaps were abandoned and adopted by later ones.
    let s = pagewise::stats();
    assert!(
        s.heaps <= 4,
        "exited threads' heaps are reused: {} heaps",
        s.heaps
    );
    // Free from this thread (remote frees into abandoned or adopted heaps).
    for (batch, t) in kept {
        for v in batch {
            verify(&v, t);
        }
    }
    // New threads adopt heaps and reclaim the remotely freed memory.
    for _ in 0..8 {
        thread::spawn(|| {
            let v: Vec<Box<[u8; 64]>> = (0..1000).map(|_| Box::new([1u8; 64])).collect();
            assert_eq!(v.len(), 1000);
        })
        .join()
        .unwrap();
    }
}
