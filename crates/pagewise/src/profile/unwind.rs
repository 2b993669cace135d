//! The call stack of a sampled allocation, taken with the system unwinder.
//!
//! `_Unwind_Backtrace` (libgcc's on glibc, LLVM's libunwind on musl and
//! macOS: the unwinder Rust's own panics use, linked into every Rust
//! program) walks the stack by the DWARF call-frame information that
//! every binary carries for unwinding (`.eh_frame`), so it works in
//! programs built without frame pointers: Debian's `python3` and
//! `redis-server`, Rust binaries with default flags. It allocates nothing
//! for binaries that have an `.eh_frame_hdr` (every binary linked by a
//! current toolchain: the lookup is a binary search in a table mapped with
//! the binary), and it is safe to call with any pagewise lock free; the
//! sampler calls it before it takes one, and a heap that is already
//! sampling samples nothing more (`HeapCore::alloc_sampled`), so an
//! allocation the unwinder made could not recurse.

use core::ffi::{c_int, c_void};

/// Most frames kept of a stack: the innermost.
pub const DEPTH: usize = 64;

#[repr(C)]
struct UnwindContext {
    _opaque: [u8; 0],
}

type TraceFn = extern "C" fn(*mut UnwindContext, *mut c_void) -> c_int;

extern "C" {
    fn _Unwind_Backtrace(trace: TraceFn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
}

/// Stop walking (`_URC_NORMAL_STOP`).
const STOP: c_int = 4;
/// Go on (`_URC_NO_REASON`).
const GO_ON: c_int = 0;

struct Walk<'a> {
    frames: &'a mut [usize; DEPTH],
    len: usize,
    skip: usize,
}

extern "C" fn step(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` that `capture` passed, alive for the
    // call; `ctx` is the unwinder's context for this frame.
    let (walk, ip) = unsafe { (&mut *(arg as *mut Walk<'_>), _Unwind_GetIP(ctx)) };
    if ip == 0 {
        return STOP;
    }
    if walk.skip > 0 {
        walk.skip -= 1;
        return GO_ON;
    }
    walk.frames[walk.len] = ip;
    walk.len += 1;
    if walk.len == DEPTH {
        STOP
    } else {
        GO_ON
    }
}

/// Writes the return addresses of the calling stack into `frames`,
/// innermost first, leaving out the `skip` innermost frames (this
/// function's own is always left out); returns how many it wrote.
///
/// ```
/// let mut frames = [0usize; pagewise::profile::unwind::DEPTH];
/// let n = pagewise::profile::unwind::capture(&mut frames, 0);
/// assert!(n >= 2, "this test and the harness that calls it");
/// ```
#[inline(never)]
pub fn capture(frames: &mut [usize; DEPTH], skip: usize) -> usize {
    let mut walk = Walk {
        frames,
        len: 0,
        skip: skip + 1,
    };
    // SAFETY: `step` only writes within `walk.frames` (bounded by DEPTH);
    // `walk` outlives the call.
    unsafe { _Unwind_Backtrace(step, &mut walk as *mut Walk<'_> as *mut c_void) };
    walk.len
}
