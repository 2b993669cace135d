/* What a first touch of a 4 KiB page costs in private anonymous memory
 * and in a memfd mapped shared (the heap of PAGEWISE_MESH=1), and whether
 * populating the file in bigger steps first makes it cheaper. Touches
 * 512 MiB, one store per page, and prints the time per page.
 *
 *   cc -O2 scripts/fault-cost.c -o /tmp/fault-cost
 *   /tmp/fault-cost anon          # private anonymous, huge pages refused
 *   /tmp/fault-cost huge          # private anonymous, MADV_HUGEPAGE (the time is
 *                                 # still per 4 KiB page: one fault makes 512 resident)
 *   /tmp/fault-cost shared        # memfd, MAP_SHARED
 *   /tmp/fault-cost populate 512  # memfd, MADV_POPULATE_WRITE 512 pages at a time, then touched
 *   /tmp/fault-cost fallocate 512 # memfd, fallocate 512 pages at a time, then touched
 *   /tmp/fault-cost uffd          # memfd, registered for write-protection through a
 *                                 # userfaultfd first, as meshing's barrier registers it
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const size_t size = (size_t)512 << 20, page = 4096;
    const char *mode = argc > 1 ? argv[1] : "shared";
    size_t step = (argc > 2 ? strtoul(argv[2], 0, 10) : 1) * page;
    int fd = -1;
    char *p;
    if (strcmp(mode, "anon") == 0 || strcmp(mode, "huge") == 0) {
        const size_t huge = (size_t)2 << 20;
        p = mmap(0, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            p = (char *)(((unsigned long)p + huge - 1) & ~(huge - 1));
            madvise(p, size, strcmp(mode, "huge") == 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        }
    } else {
        fd = memfd_create("fault-cost", 0);
        if (fd < 0 || ftruncate(fd, size) != 0)
            return perror("memfd"), 1;
        p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    }
    if (p == MAP_FAILED || step == 0)
        return perror("mmap"), 1;
    if (strcmp(mode, "uffd") == 0) {
        int u = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
        struct uffdio_api api = {.api = UFFD_API,
                                 .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
        struct uffdio_register r = {.range = {(unsigned long)p, size}, .mode = UFFDIO_REGISTER_MODE_WP};
        if (u < 0 || ioctl(u, UFFDIO_API, &api) != 0 || ioctl(u, UFFDIO_REGISTER, &r) != 0)
            return perror("userfaultfd (needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)"), 1;
    }
    double t = now();
    for (size_t o = 0; o < size; o += step) {
        if (strcmp(mode, "populate") == 0 && madvise(p + o, step, MADV_POPULATE_WRITE) != 0)
            return perror("madvise"), 1;
        if (strcmp(mode, "fallocate") == 0 && fallocate(fd, 0, o, step) != 0)
            return perror("fallocate"), 1;
    }
    for (size_t o = 0; o < size; o += page)
        p[o] = 1;
    double e = now() - t;
    printf("%s %zu: %.0f ns a page\n", mode, step / page, e * 1e9 / (size / page));
    return 0;
}
