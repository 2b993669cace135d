//! A stack of the report's own: symbolizing and formatting a report takes
//! more stack than a signal handler may have. A fault in the pool is
//! handled on the thread's alternate signal stack where it has one, and
//! Rust's runtime gives each thread one of `SIGSTKSZ` bytes (8 KiB), of
//! which the CPU's signal frame takes up to 3.4 KiB on a machine with
//! AVX-512: a debug build's symbolizer overflowed the rest. So the report
//! is written on a stack of 256 KiB in this library's own zero-filled data
//! (it costs memory only once a report touches it), switched to by a few
//! instructions and switched back from before the handler goes on.
//!
//! Reports are one at a time (`report::enter`), so one stack serves them
//! all. The stacks of the fault are captured before the switch (the
//! unwinder walks from its caller's frame back through the signal frame,
//! which it could not do from the report's stack).

/// Bytes of the report's stack.
const SIZE: usize = 256 << 10;

#[repr(C, align(16))]
struct Stack([u8; SIZE]);

static mut STACK: Stack = Stack([0; SIZE]);

/// Runs `f` on the report's stack (where the target has the switch;
/// elsewhere on the current one).
///
/// # Safety
/// The caller holds the reporter's turn (no other thread runs on the
/// stack), and `f` does not unwind (a panic across the switch would find
/// no frames to unwind into).
pub(super) unsafe fn run(f: &mut dyn FnMut()) {
    let top = core::ptr::addr_of_mut!(STACK) as usize + SIZE;
    let mut f = f;
    let ctx = &mut f as *mut &mut dyn FnMut() as usize;
    // SAFETY: `top` is the 16-byte aligned end of a stack nobody else
    // uses (caller); `call` receives `ctx`, a live `&mut &mut dyn FnMut()`.
    unsafe { switch(top, ctx) };
}

/// The function run on the report's stack: calls the closure `ctx` names.
extern "C" fn call(ctx: usize) {
    // SAFETY: `run` passes a pointer to its `&mut dyn FnMut()`, live for
    // the whole switch.
    let f = unsafe { &mut *(ctx as *mut &mut dyn FnMut()) };
    f();
}

/// Calls `call(ctx)` with the stack pointer at `top`, then returns on the
/// caller's stack: the old stack pointer is kept on the new stack, below
/// the call's frame, and restored from there.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn switch(top: usize, ctx: usize) {
    // SAFETY: per `run`; the old rsp is pushed onto the new stack (16-byte
    // aligned at `top`, so 8 more bytes realign it for the call) and popped
    // back after; every register the C ABI lets `call` clobber is declared.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "push r12",
            "sub rsp, 8",
            "call {call}",
            "add rsp, 8",
            "pop rsp",
            top = in(reg) top,
            out("r12") _,
            call = sym call,
            in("rdi") ctx,
            clobber_abi("C"),
        );
    }
}

#[cfg(all(target_arch = "aarch64", not(miri)))]
unsafe fn switch(top: usize, ctx: usize) {
    // SAFETY: as for x86-64: the old sp is stored at the new stack's top
    // (16 bytes, keeping sp aligned), reloaded after the call; x30 (the
    // link register) is among the registers the C ABI clobbers.
    unsafe {
        core::arch::asm!(
            "mov x20, sp",
            "mov sp, {top}",
            "str x20, [sp, #-16]!",
            "bl {call}",
            "ldr x20, [sp]",
            "mov sp, x20",
            top = in(reg) top,
            out("x20") _,
            call = sym call,
            in("x0") ctx,
            clobber_abi("C"),
        );
    }
}

#[cfg(not(any(
    all(target_arch = "x86_64", not(miri)),
    all(target_arch = "aarch64", not(miri))
)))]
unsafe fn switch(_top: usize, ctx: usize) {
    call(ctx);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_closure_runs_on_the_reports_stack_and_comes_back() {
        let mut seen = 0usize;
        let mut n = 0;
        let here = &n as *const i32 as usize;
        // SAFETY: the test is the only reporter; the closure cannot panic.
        unsafe {
            super::run(&mut || {
                let local = 0u8;
                seen = &local as *const u8 as usize;
                n += 1;
            })
        };
        assert_eq!(n, 1);
        let stack = core::ptr::addr_of!(super::STACK) as usize;
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(
                (stack..stack + super::SIZE).contains(&seen),
                "{seen:#x} is not on the report's stack"
            );
        }
        assert!(here != 0);
    }
}
