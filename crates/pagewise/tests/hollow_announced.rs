//! A page being hollowed keeps the OS page of a free slot that another
//! thread last announced it was freeing into its cache
//! (`memory/cache_handshake.rs`): that thread may be a second free of the
//! slot under way, which read the page as cacheable and stores its key
//! and link after the page's check; they must land on resident memory.
//! Here the announcement is an old one (the thread's last free, of a slot
//! that went home since): the page cannot tell the two apart, and keeps
//! the OS page all the same. The global allocator, through its
//! `GlobalAlloc` calls (this test binary's own allocator is the system's).

use pagewise::layout::os_page;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::mpsc;

const SLAB_PAGE: usize = 64 << 10;

#[test]
fn a_free_slot_another_thread_announced_keeps_its_os_page() {
    let os = os_page();
    if os >= SLAB_PAGE {
        return; // a slab page of one OS page is never hollowed
    }
    let a = pagewise::Pagewise;
    let l = Layout::from_size_align(64, 8).unwrap();
    let big = Layout::from_size_align(3000, 8).unwrap();
    let n = SLAB_PAGE / 64;
    // SAFETY: non-zero layouts; every block is freed once.
    unsafe {
        // The page's owner: one page of 64-byte slots, all free but the
        // first and the victim, then it exits (its heap waits, abandoned).
        let (survivor, victim) = std::thread::spawn(move || {
            let blocks: Vec<usize> = (0..n).map(|_| a.alloc(l) as usize).collect();
            let page = blocks[0] & !(SLAB_PAGE - 1);
            assert!(blocks.iter().all(|&p| p & !(SLAB_PAGE - 1) == page));
            for &p in &blocks[1..] {
                if p != blocks[900] {
                    a.dealloc(p as *mut u8, l);
                }
            }
            (blocks[0], blocks[900])
        })
        .join()
        .unwrap();
        assert_ne!(survivor % SLAB_PAGE / os, victim % SLAB_PAGE / os);
        // The announcer: frees the victim into its cache (announcing it),
        // and at its next slow path, after the trim below asks, sends it
        // home; alive, with that announcement, until the second trim.
        let (to_a, from_main) = mpsc::channel::<()>();
        let (to_main, from_a) = mpsc::channel::<()>();
        let announcer = std::thread::spawn(move || {
            a.dealloc(a.alloc(big), big);
            a.dealloc(victim as *mut u8, l);
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            // A slow path (the class's cache is empty): the flush the trim
            // asked for; no free, so the announcement stays the victim.
            let p = a.alloc(Layout::from_size_align(20000, 8).unwrap());
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            a.dealloc(p, Layout::from_size_align(20000, 8).unwrap());
        });
        from_a.recv().unwrap();
        // The page is hollowed around its two live slots (the victim is in
        // the announcer's cache).
        pagewise::trim();
        let first = pagewise::stats().hollow_bytes as usize;
        assert_eq!(first, (SLAB_PAGE / os - 2) * os, "all but two OS pages");
        to_a.send(()).unwrap();
        from_a.recv().unwrap();
        // The victim is home, free, and the announcer's last announcement:
        // its OS page stays.
        pagewise::trim();
        let second = pagewise::stats().hollow_bytes as usize;
        to_a.send(()).unwrap();
        announcer.join().unwrap();
        assert_eq!(second, first, "the announced free slot's OS page kept");
        a.dealloc(survivor as *mut u8, l);
    }
}
