//! C++ `operator new` and `operator delete` in all their forms (plain,
//! array, nothrow, sized, aligned), under their Itanium mangled names, so
//! that a C++ program's allocations reach pagewise directly: sized deletes
//! without a detour through `free`, aligned `new` without a foreign path.
//!
//! Semantics, as the C++ standard asks:
//! - **Throwing `new`** (`_Znwm`, `_Znam` and the `align_val_t` forms)
//!   never returns null. When memory is short it calls the installed
//!   `std::new_handler` and tries again, for as long as a handler is
//!   installed; with none it throws `std::bad_alloc`. An alignment that is
//!   not a power of two throws `std::bad_alloc` at once (as libstdc++ does).
//! - **`nothrow` `new`** returns null on failure (or for a bad alignment),
//!   without calling the new handler: a handler may throw, and no exception
//!   may leave a `noexcept` function.
//! - **`delete`** of null does nothing; the sized forms free as `free`
//!   does (the size is checked against the block in debug builds only, as
//!   the Rust `dealloc` path does not check it either).
//!
//! How the failure path reaches the C++ runtime without allocating and
//! without unwinding through Rust: `std::get_new_handler` and
//! `std::__throw_bad_alloc` (libstdc++'s `_ZSt17__throw_bad_allocv`, or
//! libc++'s `_ZNSt3__117__throw_bad_allocEv`) are looked up with
//! `dlsym(RTLD_DEFAULT, ...)` on the failure path only (a hit is cached; the
//! lookup itself may allocate, which at that point can only fail, not
//! deadlock). Both may unwind (the handler may throw `bad_alloc`), and a
//! C++ exception must not cross a Rust frame (with `panic = "abort"` the
//! process would abort), so on x86-64 and aarch64 the throwing forms are
//! naked functions: a short assembly loop, with its own unwind information,
//! that calls [`cxx_try`] (Rust, never unwinds) and, on failure, the
//! function [`cxx_failure`] picks (the handler, or the thrower), and tries
//! again. No Rust frame is on the stack when the exception is thrown. On
//! other architectures the loop is in Rust: a handler that throws, or a
//! failure with no handler, aborts with one line instead.
//!
//! Without a C++ runtime in the process (a C program calling `_Znwm`
//! through `dlsym`), a failing throwing `new` with no handler has nothing
//! to throw and aborts with one line on stderr.

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pw::c_malloc::{aligned, MIN_ALIGN};

/// `std::new_handler`: `void (*)()`, which may throw.
type Handler = unsafe extern "C" fn();

/// One allocation attempt for `operator new`: null on failure or when
/// `align` is not a power of two. Never unwinds.
extern "C" fn cxx_try(size: usize, align: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        return core::ptr::null_mut();
    }
    // SAFETY: a power of two (checked above).
    unsafe { aligned(size, align.max(MIN_ALIGN)) }
}

/// A symbol of the process, looked up once found (0: not found yet).
struct Lazy {
    names: &'static [&'static core::ffi::CStr],
    addr: AtomicUsize,
}

impl Lazy {
    const fn new(names: &'static [&'static core::ffi::CStr]) -> Lazy {
        Lazy {
            names,
            addr: AtomicUsize::new(0),
        }
    }

    /// The first of `names` the process defines, or 0. Only a hit is
    /// cached: a C++ library may be `dlopen`ed later.
    fn get(&self) -> usize {
        let cached = self.addr.load(Relaxed);
        if cached != 0 {
            return cached;
        }
        for name in self.names {
            // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the
            // global scope. Called on the failure path only.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
            if p != 0 {
                self.addr.store(p, Relaxed);
                return p;
            }
        }
        0
    }
}

/// `std::get_new_handler()` (libstdc++ and libc++abi spell it alike).
static GET_NEW_HANDLER: Lazy = Lazy::new(&[c"_ZSt15get_new_handlerv"]);
/// A function that throws `std::bad_alloc`.
static THROW_BAD_ALLOC: Lazy = Lazy::new(&[
    c"_ZSt17__throw_bad_allocv",
    c"_ZNSt3__117__throw_bad_allocEv",
]);

/// The installed new handler, if any.
fn new_handler() -> Option<Handler> {
    let get = GET_NEW_HANDLER.get();
    if get == 0 {
        return None;
    }
    // SAFETY: `std::get_new_handler` is `new_handler () noexcept`.
    let get: unsafe extern "C" fn() -> usize = unsafe { core::mem::transmute(get) };
    // SAFETY: as above; it does not throw.
    let h = unsafe { get() };
    // SAFETY: a non-null `new_handler` is a `void ()` function.
    (h != 0).then(|| unsafe { core::mem::transmute::<usize, Handler>(h) })
}

#[cold]
fn no_bad_alloc(size: usize) -> ! {
    let mut digits = [0u8; 20];
    pw::fault::write_stderr(&[
        b"pagewise: out of memory in operator new (",
        crate::out::decimal(size, &mut digits),
        b" bytes), and no std::bad_alloc to throw\n",
    ]);
    std::process::abort()
}

/// What a throwing `new` calls after [`cxx_try`] failed: the new handler
/// (then it tries again), or a function that throws `std::bad_alloc` (no
/// handler, or an alignment that is not a power of two). Aborts with one
/// line if there is nothing to throw. Never unwinds itself.
#[cold]
extern "C" fn cxx_failure(size: usize, align: usize) -> Handler {
    if align.is_power_of_two() {
        if let Some(h) = new_handler() {
            return h;
        }
    }
    let thrower = THROW_BAD_ALLOC.get();
    if thrower == 0 {
        no_bad_alloc(size);
    }
    // SAFETY: `std::__throw_bad_alloc` is `[[noreturn]] void ()`.
    unsafe { core::mem::transmute::<usize, Handler>(thrower) }
}

// ----- the throwing forms: an assembly loop with no Rust frame --------------

/// `loop { p = cxx_try(size, align); if p { return p }; cxx_failure(size, align)() }`
/// with its own unwind information, so that an exception thrown by the
/// handler or the thrower unwinds through it to the caller of `new`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn new_loop(size: usize, align: usize) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbx",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset rbx, -16",
        "push r12",
        ".cfi_def_cfa_offset 24",
        ".cfi_offset r12, -24",
        "sub rsp, 8",
        ".cfi_def_cfa_offset 32",
        "mov rbx, rdi",
        "mov r12, rsi",
        "2:",
        "mov rdi, rbx",
        "mov rsi, r12",
        "call {try}",
        "test rax, rax",
        "jnz 3f",
        "mov rdi, rbx",
        "mov rsi, r12",
        "call {failure}",
        "call rax",
        "jmp 2b",
        "3:",
        "add rsp, 8",
        ".cfi_def_cfa_offset 24",
        "pop r12",
        ".cfi_def_cfa_offset 16",
        "pop rbx",
        ".cfi_def_cfa_offset 8",
        "ret",
        ".cfi_endproc",
        try = sym cxx_try,
        failure = sym cxx_failure,
    )
}

/// As the x86-64 version.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
unsafe extern "C" fn new_loop(size: usize, align: usize) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "stp x29, x30, [sp, #-32]!",
        ".cfi_def_cfa_offset 32",
        ".cfi_offset x29, -32",
        ".cfi_offset x30, -24",
        "mov x29, sp",
        "stp x19, x20, [sp, #16]",
        ".cfi_offset x19, -16",
        ".cfi_offset x20, -8",
        "mov x19, x0",
        "mov x20, x1",
        "2:",
        "mov x0, x19",
        "mov x1, x20",
        "bl {try}",
        "cbnz x0, 3f",
        "mov x0, x19",
        "mov x1, x20",
        "bl {failure}",
        "blr x0",
        "b 2b",
        "3:",
        "ldp x19, x20, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        ".cfi_restore x19",
        ".cfi_restore x20",
        "ret",
        ".cfi_endproc",
        try = sym cxx_try,
        failure = sym cxx_failure,
    )
}

/// Elsewhere the loop is Rust: a handler that throws aborts the process
/// (the exception cannot cross this frame), and so does a failure with no
/// handler, with one line.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe extern "C" fn new_loop(size: usize, align: usize) -> *mut c_void {
    loop {
        let p = cxx_try(size, align);
        if !p.is_null() {
            return p;
        }
        match align.is_power_of_two().then(new_handler).flatten() {
            // SAFETY: the installed `new_handler`.
            Some(h) => unsafe { h() },
            None => no_bad_alloc(size),
        }
    }
}

/// Defines throwing `new` forms of one argument (the size) as a jump to
/// [`new_loop`] with the default alignment.
macro_rules! throwing_new {
    ($($name:ident),*) => {$(
        /// `operator new(size_t)` / `operator new[](size_t)`: never null
        /// (the new handler, then `std::bad_alloc`).
        ///
        /// # Safety
        /// Called as C++ `operator new`.
        #[no_mangle]
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            core::arch::naked_asm!("mov esi, {align}", "jmp {new_loop}",
                align = const MIN_ALIGN, new_loop = sym new_loop)
        }

        /// `operator new(size_t)` / `operator new[](size_t)`: never null
        /// (the new handler, then `std::bad_alloc`).
        ///
        /// # Safety
        /// Called as C++ `operator new`.
        #[no_mangle]
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            core::arch::naked_asm!("mov x1, #{align}", "b {new_loop}",
                align = const MIN_ALIGN, new_loop = sym new_loop)
        }

        /// `operator new(size_t)` / `operator new[](size_t)`: never null
        /// (the new handler, else an abort).
        ///
        /// # Safety
        /// Called as C++ `operator new`.
        #[no_mangle]
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            // SAFETY: forwarded.
            unsafe { new_loop(size, MIN_ALIGN) }
        }
    )*};
}

/// Defines throwing aligned `new` forms (size, alignment) as a jump to
/// [`new_loop`].
macro_rules! throwing_aligned_new {
    ($($name:ident),*) => {$(
        /// `operator new(size_t, align_val_t)` and its array form: never
        /// null (the new handler, then `std::bad_alloc`; at once for an
        /// alignment that is not a power of two).
        ///
        /// # Safety
        /// Called as C++ `operator new`.
        #[no_mangle]
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(size: usize, align: usize) -> *mut c_void {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {new_loop}", new_loop = sym new_loop);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {new_loop}", new_loop = sym new_loop);
        }

        /// `operator new(size_t, align_val_t)` and its array form: never
        /// null (the new handler, else an abort).
        ///
        /// # Safety
        /// Called as C++ `operator new`.
        #[no_mangle]
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        pub unsafe extern "C" fn $name(size: usize, align: usize) -> *mut c_void {
            // SAFETY: forwarded.
            unsafe { new_loop(size, align) }
        }
    )*};
}

throwing_new!(_Znwm, _Znam);
throwing_aligned_new!(_ZnwmSt11align_val_t, _ZnamSt11align_val_t);

// ----- nothrow new ---------------------------------------------------------

/// `operator new(size_t, const nothrow_t&)`: null on failure.
#[no_mangle]
pub extern "C" fn _ZnwmRKSt9nothrow_t(size: usize, _nothrow: *const c_void) -> *mut c_void {
    cxx_try(size, MIN_ALIGN)
}

/// `operator new[](size_t, const nothrow_t&)`: null on failure.
#[no_mangle]
pub extern "C" fn _ZnamRKSt9nothrow_t(size: usize, _nothrow: *const c_void) -> *mut c_void {
    cxx_try(size, MIN_ALIGN)
}

/// `operator new(size_t, align_val_t, const nothrow_t&)`: null on failure
/// or for an alignment that is not a power of two.
#[no_mangle]
pub extern "C" fn _ZnwmSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _nothrow: *const c_void,
) -> *mut c_void {
    cxx_try(size, align)
}

/// `operator new[](size_t, align_val_t, const nothrow_t&)`: null on
/// failure or for an alignment that is not a power of two.
#[no_mangle]
pub extern "C" fn _ZnamSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _nothrow: *const c_void,
) -> *mut c_void {
    cxx_try(size, align)
}

// ----- delete --------------------------------------------------------------

/// Frees a block of `operator new` (null is ignored).
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[inline(always)]
unsafe fn delete(ptr: *mut c_void) {
    // SAFETY: forwarded (`raw::free` ignores null).
    unsafe { pw::raw::free(ptr.cast()) }
}

/// A sized delete: the size is checked against the block in debug builds
/// (a size larger than the block is misuse), then the block is freed.
///
/// # Safety
/// As [`delete`].
#[inline(always)]
unsafe fn delete_sized(ptr: *mut c_void, size: usize) {
    // SAFETY: forwarded.
    unsafe {
        pw::c_malloc::check_size(ptr, size, b"sized delete");
        delete(ptr)
    }
}

macro_rules! deletes {
    ($($name:ident($($arg:ident: $ty:ty),*) => $how:ident $(($size:ident))?;)*) => {$(
        /// C++ `operator delete` / `operator delete[]` (see the module
        /// documentation for which form this is): frees `ptr`; null is
        /// ignored.
        ///
        /// # Safety
        /// `ptr` is null or a live block of this allocator.
        #[no_mangle]
        pub unsafe extern "C" fn $name(ptr: *mut c_void $(, $arg: $ty)*) {
            $(let _ = $arg;)*
            // SAFETY: forwarded.
            unsafe { $how(ptr $(, $size)?) }
        }
    )*};
}

deletes! {
    _ZdlPv() => delete;
    _ZdaPv() => delete;
    _ZdlPvm(size: usize) => delete_sized(size);
    _ZdaPvm(size: usize) => delete_sized(size);
    _ZdlPvRKSt9nothrow_t(_n: *const c_void) => delete;
    _ZdaPvRKSt9nothrow_t(_n: *const c_void) => delete;
    _ZdlPvSt11align_val_t(_align: usize) => delete;
    _ZdaPvSt11align_val_t(_align: usize) => delete;
    _ZdlPvmSt11align_val_t(size: usize, _align: usize) => delete_sized(size);
    _ZdaPvmSt11align_val_t(size: usize, _align: usize) => delete_sized(size);
    _ZdlPvSt11align_val_tRKSt9nothrow_t(_align: usize, _n: *const c_void) => delete;
    _ZdaPvSt11align_val_tRKSt9nothrow_t(_align: usize, _n: *const c_void) => delete;
}
