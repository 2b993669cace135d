//! Worker with jemalloc (tikv-jemallocator, default configuration) as the
//! global allocator; its libc mmap/munmap/madvise calls are interposed.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pagewise_bench::interpose_mmap!();

fn main() {
    pagewise_bench::worker::worker_main(
        "jemalloc",
        pagewise_bench::worker::SyscallSource::Interposed,
    )
}
