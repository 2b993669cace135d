//! Randomness for the free-slot keys ([`crate::memory::block`]): one word
//! per process, drawn without allocating.

/// A word that differs between processes and runs: 8 of the kernel's
/// random bytes, mixed with a stack address (ASLR) in case the OS gave none.
pub fn random_word() -> usize {
    let word = kernel_random();
    word ^ (&word as *const usize as usize).rotate_left(29)
}

/// Linux (glibc and musl): the 16 random bytes the kernel places on the
/// initial stack for every process (`AT_RANDOM`); no system call.
#[cfg(target_os = "linux")]
fn kernel_random() -> usize {
    // SAFETY: getauxval has no preconditions; AT_RANDOM, when present, is
    // the address of 16 random bytes the kernel placed on the initial stack,
    // which live as long as the process.
    let at = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u8;
    if at.is_null() {
        return 0;
    }
    // SAFETY: as above: 16 readable bytes, of which we take 8 from the
    // middle (glibc uses the first ones for its stack guard).
    unsafe { (at.add(8) as *const usize).read_unaligned() }
}

/// macOS: `getentropy` (a system call, no allocation, never blocks after boot).
#[cfg(target_vendor = "apple")]
fn kernel_random() -> usize {
    let mut word = 0usize;
    // SAFETY: `word` is a valid, writable buffer of the size passed (at most
    // 256 bytes, as getentropy requires). On failure it stays 0.
    unsafe { libc::getentropy((&mut word as *mut usize).cast(), size_of::<usize>()) };
    word
}

/// Elsewhere: no kernel randomness; the stack address alone.
#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn kernel_random() -> usize {
    0
}
