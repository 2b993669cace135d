//! The `override` feature: the binary's `malloc` is pagewise's, for C code
//! linked into it and for libc itself, whose calls bind at load time to the
//! executable's exported symbols.
//!
//! `cargo test -p pagewise --features override --test override_malloc`
//! (CI runs it; without the feature cargo refuses to build this target, so
//! it cannot be skipped silently).

use core::ffi::c_void;
use pagewise::raw::owns;

// C names the libc crate does not declare.
unsafe extern "C" {
    fn valloc(size: usize) -> *mut c_void;
    fn pvalloc(size: usize) -> *mut c_void;
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
}

/// Frees with the C name, as C code would.
fn c_free(p: *mut c_void) {
    // SAFETY: `p` came from the C family and is freed once.
    unsafe { libc::free(p) }
}

#[test]
fn libc_allocates_from_pagewise() {
    // strdup lives in libc.so.6: its malloc is bound at run time.
    // SAFETY: a NUL-terminated string.
    let s = unsafe { libc::strdup(c"a string copied by libc".as_ptr()) };
    assert!(
        owns(s.cast()),
        "libc's strdup did not use pagewise's malloc"
    );
    c_free(s.cast());
}

#[test]
fn libc_grows_its_buffers_with_pagewise_realloc() {
    // open_memstream grows its buffer with realloc inside libc; the caller
    // frees it with free.
    let (mut buf, mut len) = (core::ptr::null_mut(), 0usize);
    // SAFETY: valid out-pointers; the stream is closed before they are read.
    unsafe {
        let f = libc::open_memstream(&mut buf, &mut len);
        assert!(!f.is_null());
        for _ in 0..10_000 {
            libc::fputs(c"0123456789".as_ptr(), f);
        }
        libc::fclose(f);
    }
    assert_eq!(len, 100_000);
    assert!(owns(buf.cast()), "libc's realloc path did not use pagewise");
    c_free(buf.cast());
}

#[test]
fn every_c_name_is_pagewise() {
    let mut p = core::ptr::null_mut();
    // SAFETY: C calls with valid arguments; each block is freed once.
    let blocks = unsafe {
        assert_eq!(libc::posix_memalign(&mut p, 4096, 100), 0);
        let r = libc::realloc(libc::malloc(10), 100_000);
        [
            libc::malloc(100),
            libc::calloc(10, 10),
            r,
            p,
            libc::aligned_alloc(64, 100),
            libc::memalign(128, 100),
            valloc(100),
            pvalloc(100),
            __libc_malloc(100),
            __libc_calloc(1, 100),
        ]
    };
    for (i, &b) in blocks.iter().enumerate() {
        assert!(owns(b.cast()), "block {i} is not pagewise's");
        c_free(b);
    }
}

#[test]
fn rust_system_allocator_is_pagewise() {
    use std::alloc::{GlobalAlloc, Layout, System};
    let layout = Layout::from_size_align(1000, 8).unwrap();
    // SAFETY: a non-zero size; freed with the same layout.
    unsafe {
        let p = System.alloc(layout);
        assert!(
            owns(p),
            "std's System allocator did not reach pagewise's malloc"
        );
        System.dealloc(p, layout);
    }
}

#[test]
fn failures_keep_c_semantics() {
    // SAFETY: C calls; nothing is allocated.
    unsafe {
        *libc::__errno_location() = 0;
        // black_box: the compiler knows malloc and would elide a call
        // whose result is only tested for null.
        let p = libc::malloc(std::hint::black_box(usize::MAX));
        assert!(std::hint::black_box(p).is_null());
        assert_eq!(*libc::__errno_location(), libc::ENOMEM);
        let mut p = core::ptr::null_mut();
        assert_eq!(libc::posix_memalign(&mut p, 3, 10), libc::EINVAL);
    }
}

#[test]
fn blocks_cross_threads() {
    // C code on one thread allocates, another frees: the remote-free path.
    let blocks: Vec<usize> = std::thread::spawn(|| {
        (0..1000)
            // SAFETY: a NUL-terminated string.
            .map(|_| unsafe { libc::strdup(c"made on another thread".as_ptr()) } as usize)
            .collect()
    })
    .join()
    .unwrap();
    for b in blocks {
        assert!(owns(b as *const u8));
        c_free(b as *mut c_void);
    }
}
