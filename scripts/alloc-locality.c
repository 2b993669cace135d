/* How close together an allocator hands out a thread's consecutive blocks
 * of one size: preloaded in front of the allocator, it notes each
 * `malloc`, `calloc` and `realloc` of null of 8 B to 1 KiB, and for each
 * one the thread made of the same size (rounded up to 8 bytes) before it,
 * whether the two lie on one 4 KiB page, in one 64 KiB-aligned block of
 * address space, and within two blocks of each other. A program whose
 * consecutive allocations land near each other touches fewer pages and
 * lines while it uses them, which the TLB and the prefetchers reward
 * beyond what a count of cache misses shows. Printed at exit, to stderr.
 *
 *   cc -O2 -shared -fPIC -o /tmp/alloc-locality.so scripts/alloc-locality.c -ldl
 *   LD_PRELOAD="/tmp/alloc-locality.so $ALLOCATOR" ./program
 *
 * (`free` and the rest go straight to the allocator: this notes addresses
 * only.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void *(*real_calloc)(size_t, size_t);
static void *(*real_malloc)(size_t);
static void *(*real_realloc)(void *, size_t);

/* Per thread, the last block handed out per size in 8-byte steps. */
static __thread uintptr_t last[129];
static atomic_long pairs, same_page, same_64k, near;

static void note(void *p, size_t size) {
    if (!p || size < 8 || size > 1024) return;
    size_t k = (size + 7) / 8;
    uintptr_t x = (uintptr_t)p, l = last[k];
    last[k] = x;
    if (!l) return;
    atomic_fetch_add(&pairs, 1);
    if (x >> 12 == l >> 12) atomic_fetch_add(&same_page, 1);
    if (x >> 16 == l >> 16) atomic_fetch_add(&same_64k, 1);
    uintptr_t d = x > l ? x - l : l - x;
    if (d <= 2 * k * 8 + 32) atomic_fetch_add(&near, 1);
}

void *malloc(size_t size) {
    if (!real_malloc) real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    void *p = real_malloc(size);
    note(p, size);
    return p;
}

/* dlsym may call calloc before it knows it: a small static buffer then. */
static char early[4096];
static size_t early_used;

void *calloc(size_t n, size_t size) {
    if (!real_calloc) {
        static int looking;
        if (looking) {
            void *p = early + early_used;
            early_used += (n * size + 15) & ~(size_t)15;
            return early_used <= sizeof early ? p : NULL;
        }
        looking = 1;
        real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
        looking = 0;
    }
    void *p = real_calloc(n, size);
    note(p, n * size);
    return p;
}

void *realloc(void *old, size_t size) {
    if (!real_realloc) real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    void *p = real_realloc(old, size);
    if (!old) note(p, size);
    return p;
}

__attribute__((destructor)) static void report(void) {
    long n = pairs;
    if (n == 0) return;
    fprintf(stderr,
            "alloc-locality: %ld pairs of a thread's consecutive allocations of one size: "
            "on one 4 KiB page %.1f %%, in one 64 KiB block %.1f %%, within two blocks %.1f %%\n",
            n, 100.0 * same_page / n, 100.0 * same_64k / n, 100.0 * near / n);
}
