//! [`crate::export_c_malloc`]: the C names of the family, defined in the
//! crate that invokes it.
//!
//! A macro rather than `#[no_mangle]` functions here, so that the symbols
//! exist only where they are asked for: in `libpagewise.so` (which invokes
//! it) and in a binary built with the `override` feature, never in every
//! crate that merely depends on `pagewise` (Cargo unifies features across a
//! workspace, so a feature the C library turned on would take over the
//! `malloc` of every sibling binary, benchmark baselines included).

/// Defines the C allocation family (`malloc`, `free`, `calloc`, `realloc`,
/// `reallocarray`, `posix_memalign`, `aligned_alloc`, `memalign`,
/// `valloc`, `pvalloc`, `malloc_usable_size`, `malloc_trim`, glibc's
/// `__libc_*` names and `cfree`, C23's `free_sized` and
/// `free_aligned_sized`, and `malloc_good_size`) as unmangled `extern "C"`
/// functions of the invoking crate, each forwarding to
/// [`crate::c_malloc`]. In an ELF executable or shared library they take
/// over the process's `malloc`: C code linked into it, and libc itself,
/// allocate from pagewise.
///
/// Invoke it once per program, at module level. Most users want the
/// `override` feature instead, which invokes it inside the crate:
///
/// ```toml
/// pagewise = { version = "0.1", features = ["override"] }
/// ```
///
/// ```ignore
/// // What the `override` feature and libpagewise.so do:
/// pagewise::export_c_malloc!();
/// ```
#[macro_export]
macro_rules! export_c_malloc {
    () => {
        $crate::export_c_malloc! {
            safe malloc(size: usize) -> *mut ::core::ffi::c_void;
            unsafe free(ptr: *mut ::core::ffi::c_void) -> ();
            safe calloc(n: usize, size: usize) -> *mut ::core::ffi::c_void;
            unsafe realloc(ptr: *mut ::core::ffi::c_void, size: usize) -> *mut ::core::ffi::c_void;
            unsafe reallocarray(ptr: *mut ::core::ffi::c_void, n: usize, size: usize)
                -> *mut ::core::ffi::c_void;
            unsafe posix_memalign(out: *mut *mut ::core::ffi::c_void, align: usize, size: usize)
                -> ::core::ffi::c_int;
            safe aligned_alloc(align: usize, size: usize) -> *mut ::core::ffi::c_void;
            safe memalign(align: usize, size: usize) -> *mut ::core::ffi::c_void;
            safe valloc(size: usize) -> *mut ::core::ffi::c_void;
            safe pvalloc(size: usize) -> *mut ::core::ffi::c_void;
            unsafe malloc_usable_size(ptr: *mut ::core::ffi::c_void) -> usize;
            safe malloc_trim(pad: usize) -> ::core::ffi::c_int;
            unsafe free_sized(ptr: *mut ::core::ffi::c_void, size: usize) -> ();
            unsafe free_aligned_sized(ptr: *mut ::core::ffi::c_void, align: usize, size: usize) -> ();
            safe malloc_good_size(size: usize) -> usize;
            safe __libc_malloc = malloc(size: usize) -> *mut ::core::ffi::c_void;
            unsafe __libc_free = free(ptr: *mut ::core::ffi::c_void) -> ();
            safe __libc_calloc = calloc(n: usize, size: usize) -> *mut ::core::ffi::c_void;
            unsafe __libc_realloc = realloc(ptr: *mut ::core::ffi::c_void, size: usize)
                -> *mut ::core::ffi::c_void;
            safe __libc_memalign = memalign(align: usize, size: usize) -> *mut ::core::ffi::c_void;
            safe __libc_valloc = valloc(size: usize) -> *mut ::core::ffi::c_void;
            safe __libc_pvalloc = pvalloc(size: usize) -> *mut ::core::ffi::c_void;
            unsafe cfree = free(ptr: *mut ::core::ffi::c_void) -> ();
        }
    };
    ($($kind:ident $name:ident $(= $target:ident)? ($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $( $crate::export_c_malloc!(@one $kind $name [$($target)? $name] ($($arg: $ty),*) -> $ret); )*
    };
    (@one safe $name:ident [$target:ident $($_rest:ident)?] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("C's `", stringify!($name), "`: [`pagewise::c_malloc::",
            stringify!($target), "`].")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::c_malloc::$target($($arg),*)
        }
    };
    (@one unsafe $name:ident [$target:ident $($_rest:ident)?] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("C's `", stringify!($name), "`: [`pagewise::c_malloc::",
            stringify!($target), "`].")]
        #[doc = ""]
        #[doc = "# Safety"]
        #[doc = concat!("As for [`pagewise::c_malloc::", stringify!($target), "`].")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller keeps the forwarded function's contract.
            unsafe { $crate::c_malloc::$target($($arg),*) }
        }
    };
}
