//! The calling thread's heap pointer: one word of thread-local storage that
//! every allocation and free reads first.
//!
//! On x86-64 Linux the word is read with the initial-exec TLS model (one
//! `mov` from the thread pointer, `%fs`), as jemalloc, tcmalloc and mimalloc
//! do. A Rust `thread_local!` in a shared library uses the general-dynamic
//! model instead, a call to `__tls_get_addr` on every access, which made
//! `libpagewise.so` under `LD_PRELOAD` twice as slow per allocate/free
//! pair as the same code linked into a Rust program. Stable Rust has no
//! attribute for the TLS model, so the word is declared in assembly.
//!
//! On aarch64 Linux the same word is read the same way: its offset from a
//! GOT entry (`adrp`/`ldr` with the `:gottprel:` relocations, which the
//! linker relaxes to an immediate in an executable), added to the thread
//! pointer (`mrs tpidr_el0`). A `thread_local!` there would cost a TLS
//! descriptor call per access in a shared library.
//!
//! Initial-exec TLS lives in the static TLS block the loader sets up at
//! startup: always so for an executable or a preloaded library; a library
//! loaded later with `dlopen` takes its 8 bytes from glibc's static TLS
//! reserve. Elsewhere (other targets, Miri) a `thread_local!` serves.
//!
//! A thread without a heap holds [`empty_heap`] there rather than null,
//! so the C library's fast paths test for no missing heap: that pointer's
//! caches are all empty and take no slot. On x86-64 Linux with glibc the
//! word starts so (its TLS image holds the address, which the loader
//! relocates before any thread's block is copied from it); elsewhere it
//! starts at null, which [`current_or_empty`] turns into `empty_heap`.

use crate::heap::{empty_heap, HeapCore};

/// Whether the word starts at [`empty_heap`] (else at null).
#[cfg(test)]
const STARTS_EMPTY: bool = cfg!(all(
    target_arch = "x86_64",
    target_os = "linux",
    target_env = "gnu",
    not(miri)
));

#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
mod imp {
    use crate::heap::HeapCore;

    // One 8-byte-aligned word in `.tdata` holding `empty_heap()` (the
    // address of the empty states less their offset in a heap), hidden so
    // that a shared library does not export it. With glibc, the loader
    // relocates a TLS image before it copies it into any thread's block.
    #[cfg(target_env = "gnu")]
    core::arch::global_asm!(
        ".pushsection .tdata,\"awT\",@progbits",
        ".p2align 3",
        ".globl pagewise_current_heap",
        ".hidden pagewise_current_heap",
        ".type pagewise_current_heap,@object",
        ".size pagewise_current_heap,8",
        "pagewise_current_heap:",
        ".quad {empty} - {offset}",
        ".popsection",
        empty = sym crate::heap::EMPTY_STATES,
        offset = const crate::heap::STATES_OFFSET,
    );

    // Elsewhere (musl) one zero-initialised word in `.tbss`.
    #[cfg(not(target_env = "gnu"))]
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl pagewise_current_heap",
        ".hidden pagewise_current_heap",
        ".type pagewise_current_heap,@object",
        ".size pagewise_current_heap,8",
        "pagewise_current_heap:",
        ".zero 8",
        ".popsection",
    );

    #[inline(always)]
    pub fn get() -> *mut HeapCore {
        let v: usize;
        // SAFETY: reads this thread's own TLS word through its initial-exec
        // offset (a GOT entry the linker or loader fills in); no other
        // memory is touched.
        unsafe {
            core::arch::asm!(
                "mov {v}, qword ptr [rip + pagewise_current_heap@GOTTPOFF]",
                "mov {v}, qword ptr fs:[{v}]",
                v = out(reg) v,
                options(nostack, preserves_flags, readonly, pure),
            )
        };
        v as *mut HeapCore
    }

    #[inline(always)]
    pub fn set(heap: *mut HeapCore) {
        // SAFETY: writes this thread's own TLS word, as `get` reads it.
        unsafe {
            core::arch::asm!(
                "mov {t}, qword ptr [rip + pagewise_current_heap@GOTTPOFF]",
                "mov qword ptr fs:[{t}], {h}",
                t = out(reg) _,
                h = in(reg) heap as usize,
                options(nostack, preserves_flags),
            )
        };
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "linux", not(miri)))]
mod imp {
    use crate::heap::HeapCore;

    // As on x86-64: one zero-initialised, 8-byte-aligned word in `.tbss`,
    // hidden so that a shared library does not export it.
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",%nobits",
        ".p2align 3",
        ".globl pagewise_current_heap",
        ".hidden pagewise_current_heap",
        ".type pagewise_current_heap,%object",
        ".size pagewise_current_heap,8",
        "pagewise_current_heap:",
        ".zero 8",
        ".popsection",
    );

    #[inline(always)]
    pub fn get() -> *mut HeapCore {
        let v: usize;
        // SAFETY: reads this thread's own TLS word at its initial-exec
        // offset (a GOT entry the linker or loader fills in) from the
        // thread pointer; no other memory is touched.
        unsafe {
            core::arch::asm!(
                "adrp {t}, :gottprel:pagewise_current_heap",
                "ldr {t}, [{t}, #:gottprel_lo12:pagewise_current_heap]",
                "mrs {v}, tpidr_el0",
                "ldr {v}, [{v}, {t}]",
                t = out(reg) _,
                v = out(reg) v,
                options(nostack, preserves_flags, readonly, pure),
            )
        };
        v as *mut HeapCore
    }

    #[inline(always)]
    pub fn set(heap: *mut HeapCore) {
        // SAFETY: writes this thread's own TLS word, as `get` reads it.
        unsafe {
            core::arch::asm!(
                "adrp {t}, :gottprel:pagewise_current_heap",
                "ldr {t}, [{t}, #:gottprel_lo12:pagewise_current_heap]",
                "mrs {u}, tpidr_el0",
                "str {h}, [{u}, {t}]",
                t = out(reg) _,
                u = out(reg) _,
                h = in(reg) heap as usize,
                options(nostack, preserves_flags),
            )
        };
    }
}

#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux",
    not(miri)
)))]
mod imp {
    use crate::heap::HeapCore;
    use core::cell::Cell;
    use core::ptr::null_mut;

    std::thread_local! {
        // No destructor and a const initialiser: std stores this in a plain
        // `#[thread_local]` slot, with no registration and no allocation,
        // and it stays readable while pthread key destructors run.
        static CURRENT: Cell<*mut HeapCore> = const { Cell::new(null_mut()) };
    }

    #[inline(always)]
    pub fn get() -> *mut HeapCore {
        CURRENT.try_with(|c| c.get()).unwrap_or(null_mut())
    }

    #[inline(always)]
    pub fn set(heap: *mut HeapCore) {
        let _ = CURRENT.try_with(|c| c.set(heap));
    }
}

/// The calling thread's heap, or null if it has none.
#[inline(always)]
pub fn current_heap() -> *mut HeapCore {
    let h = imp::get();
    if h == empty_heap() {
        return core::ptr::null_mut();
    }
    h
}

/// The calling thread's heap, or [`empty_heap`] if it has none: one load
/// where the word starts at `empty_heap` (there it is never null).
#[inline(always)]
pub fn current_or_empty() -> *mut HeapCore {
    let h = imp::get();
    #[cfg(not(all(
        target_arch = "x86_64",
        target_os = "linux",
        target_env = "gnu",
        not(miri)
    )))]
    if h.is_null() {
        return empty_heap();
    }
    h
}

/// Makes `heap` (or none, for null) the calling thread's heap.
#[inline(always)]
pub fn set_current_heap(heap: *mut HeapCore) {
    imp::set(if heap.is_null() { empty_heap() } else { heap })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_word() {
        let fake = 0x1000 as *mut HeapCore;
        let before = current_heap();
        set_current_heap(fake);
        assert_eq!(current_heap(), fake);
        std::thread::spawn(|| {
            assert!(current_heap().is_null(), "a new thread starts at null");
            assert_eq!(current_or_empty(), empty_heap());
            assert_eq!(imp::get() == empty_heap(), STARTS_EMPTY, "its word's start");
            set_current_heap(0x2000 as *mut HeapCore);
            assert_eq!(current_heap(), 0x2000 as *mut HeapCore);
        })
        .join()
        .unwrap();
        assert_eq!(current_heap(), fake, "untouched by the other thread");
        set_current_heap(core::ptr::null_mut());
        assert!(current_heap().is_null());
        assert_eq!(current_or_empty(), empty_heap(), "no heap: the empty one");
        set_current_heap(before);
    }
}
