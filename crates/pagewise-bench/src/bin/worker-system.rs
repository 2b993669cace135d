//! Worker with the system allocator (glibc malloc), also the host for any
//! allocator preloaded from a `.so`. glibc's malloc calls `mmap`/`munmap`
//! through internal aliases and grows the heap with `brk`, so its memory
//! syscalls cannot be counted in-process: they are reported as n/a.

#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

fn main() {
    pagewise_bench::worker::worker_main(
        "system",
        pagewise_bench::worker::SyscallSource::None(
            "glibc malloc calls mmap/brk internally, not countable in-process",
        ),
    )
}
