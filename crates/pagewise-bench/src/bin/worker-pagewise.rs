//! Worker with pagewise as the global allocator. Syscalls come from
//! pagewise's own counters; the interposed libc wrappers cross-check them.

#[global_allocator]
static GLOBAL: pagewise::Pagewise = pagewise::Pagewise;

pagewise_bench::interpose_mmap!();

fn main() {
    pagewise_bench::worker::worker_main("pagewise", pagewise_bench::worker::SyscallSource::Pagewise)
}
