//! Worker with mimalloc (the `mimalloc` crate, default configuration) as the
//! global allocator; its libc mmap/munmap/madvise calls are interposed.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pagewise_bench::interpose_mmap!();

fn main() {
    pagewise_bench::worker::worker_main(
        "mimalloc",
        pagewise_bench::worker::SyscallSource::Interposed,
    )
}
