/*
 * jemalloc's interface: mallctl, mallctlnametomib, mallctlbymib,
 * malloc_stats_print and the *allocx family, found with dlsym as a program
 * linked with libjemalloc finds them, so the same checks run under
 * LD_PRELOAD=libpagewise.so and under LD_PRELOAD=libjemalloc.so.2 (the
 * calling convention and semantics are jemalloc's own).
 *
 *   jemalloc pagewise   every check, and those of pagewise's own answers
 *   jemalloc jemalloc   the checks of jemalloc's semantics, against jemalloc
 *   jemalloc stderr     malloc_stats_print with no callback (to stderr)
 *
 * Prints "jemalloc: all ok" and exits 0 on success; on a failed check
 * prints the line and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "pagewise.h"

#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="

static int failures;
#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "jemalloc.c:%d: check failed: %s\n", __LINE__, #cond); \
            failures++;                                                            \
        }                                                                          \
    } while (0)

static int pagewise_mode;

/* The functions, as the preloaded library defines them (the declarations
 * are pagewise.h's, so this also checks that they match). */
static __typeof__(mallctl) *je_mallctl;
static __typeof__(mallctlnametomib) *je_nametomib;
static __typeof__(mallctlbymib) *je_bymib;
static __typeof__(malloc_stats_print) *je_stats_print;
static __typeof__(mallocx) *je_mallocx;
static __typeof__(rallocx) *je_rallocx;
static __typeof__(xallocx) *je_xallocx;
static __typeof__(sallocx) *je_sallocx;
static __typeof__(dallocx) *je_dallocx;
static __typeof__(sdallocx) *je_sdallocx;
static __typeof__(nallocx) *je_nallocx;

static void *need(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) {
        fprintf(stderr, "jemalloc.c: %s is not defined by the preloaded library\n", name);
        exit(1);
    }
    return f;
}

static void bind(void) {
    je_mallctl = need("mallctl");
    je_nametomib = need("mallctlnametomib");
    je_bymib = need("mallctlbymib");
    je_stats_print = need("malloc_stats_print");
    je_mallocx = need("mallocx");
    je_rallocx = need("rallocx");
    je_xallocx = need("xallocx");
    je_sallocx = need("sallocx");
    je_dallocx = need("dallocx");
    je_sdallocx = need("sdallocx");
    je_nallocx = need("nallocx");
}

static uint64_t refresh(void) {
    uint64_t e = 1;
    size_t sz = sizeof e;
    CHECK(je_mallctl("epoch", &e, &sz, &e, sizeof e) == 0);
    return e;
}

static size_t stat(const char *name) {
    size_t v = 0, sz = sizeof v;
    int r = je_mallctl(name, &v, &sz, NULL, 0);
    if (r != 0) fprintf(stderr, "jemalloc.c: mallctl(%s) = %d\n", name, r);
    CHECK(r == 0 && sz == sizeof v);
    return v;
}

static void chain_holds(void) {
    size_t allocated = stat("stats.allocated"), active = stat("stats.active");
    size_t resident = stat("stats.resident"), mapped = stat("stats.mapped");
    size_t metadata = stat("stats.metadata");
    (void)stat("stats.retained");
    CHECK(allocated > 0 && allocated <= active);
    CHECK(active <= resident && active <= mapped);
    CHECK(metadata > 0 && metadata < resident);
}

/* 8 MiB in 1024 blocks of 8 KiB: stats.allocated, active and resident move
 * by that much once epoch is written, and not before. */
static void stats_move_with_allocations(void) {
    enum { N = 1024, SIZE = 8192 };
    static char *blocks[N];
    refresh();
    size_t a0 = stat("stats.allocated"), act0 = stat("stats.active");
    size_t res0 = stat("stats.resident");
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(SIZE);
        memset(blocks[i], i, SIZE);
    }
    CHECK(stat("stats.allocated") == a0); /* the snapshot until epoch */
    uint64_t e1 = refresh();
    size_t a1 = stat("stats.allocated");
    CHECK(a1 >= a0 + N * SIZE && a1 <= a0 + N * SIZE + (1 << 20));
    CHECK(stat("stats.active") >= act0 + N * SIZE);
    CHECK(stat("stats.resident") >= res0 + N * SIZE);
    chain_holds();
    for (int i = 0; i < N; i++) free(blocks[i]);
    uint64_t e2 = refresh();
    CHECK(e2 > e1);
    size_t a2 = stat("stats.allocated");
    CHECK(a2 + N * SIZE - (64 << 10) <= a1);
    /* Reading epoch without writing it takes no snapshot. */
    uint64_t e = 0;
    size_t sz = sizeof e;
    CHECK(je_mallctl("epoch", &e, &sz, NULL, 0) == 0 && e == e2);
}

static void calling_convention(void) {
    size_t v = 0, sz = sizeof v;
    /* Unknown names, and names of nodes rather than values. */
    CHECK(je_mallctl("stats.nonsense", &v, &sz, NULL, 0) == ENOENT);
    CHECK(je_mallctl("nonsense", &v, &sz, NULL, 0) == ENOENT);
    CHECK(je_mallctl("stats.allocated.x", &v, &sz, NULL, 0) == ENOENT);
    CHECK(je_mallctl("arena.99999.purge", NULL, NULL, NULL, 0) == ENOENT);
    /* A size that is not the value's: EINVAL, and what fits copied. */
    uint32_t small = 0;
    sz = sizeof small;
    CHECK(je_mallctl("stats.allocated", &small, &sz, NULL, 0) == EINVAL);
    CHECK(sz == sizeof small);
    uint64_t e = 1;
    sz = sizeof e;
    CHECK(je_mallctl("epoch", &e, &sz, &e, 4) == EINVAL);
    /* Writing a read-only value. */
    sz = sizeof v;
    CHECK(je_mallctl("stats.allocated", &v, &sz, &v, sizeof v) == EPERM);
    CHECK(je_mallctl("version", NULL, NULL, &v, sizeof v) == EPERM);
    /* Only oldp, or only oldlenp: nothing is read. */
    CHECK(je_mallctl("stats.allocated", NULL, &sz, NULL, 0) == 0);
    CHECK(je_mallctl("stats.allocated", &v, NULL, NULL, 0) == 0);
    /* An action given something to read. */
    CHECK(je_mallctl("arena.0.purge", &v, &sz, NULL, 0) == EPERM);

    const char *version = NULL;
    sz = sizeof version;
    CHECK(je_mallctl("version", &version, &sz, NULL, 0) == 0);
    CHECK(version && version[0] >= '5' && version[0] <= '9' && version[1] == '.');
    if (pagewise_mode) CHECK(version && strstr(version, "pagewise"));

    unsigned narenas = 0;
    sz = sizeof narenas;
    CHECK(je_mallctl("arenas.narenas", &narenas, &sz, NULL, 0) == 0 && narenas >= 1);
    /* Redis's MEMORY PURGE: arena.<narenas>.purge is every arena. */
    char name[32];
    snprintf(name, sizeof name, "arena.%u.purge", narenas);
    CHECK(je_mallctl(name, NULL, NULL, NULL, 0) == 0);
    CHECK(je_mallctl("arena.4096.purge", NULL, NULL, NULL, 0) == 0);
    size_t page = 0;
    sz = sizeof page;
    CHECK(je_mallctl("arenas.page", &page, &sz, NULL, 0) == 0);
    CHECK(page >= 4096 && (page & (page - 1)) == 0);

    unsigned char bg = 2, opt_bg = 2;
    sz = 1;
    CHECK(je_mallctl("opt.background_thread", &opt_bg, &sz, NULL, 0) == 0 && opt_bg <= 1);
    CHECK(je_mallctl("background_thread", &bg, &sz, NULL, 0) == 0 && bg <= 1);
    /* Writing the value it has (as Redis does at start). */
    CHECK(je_mallctl("background_thread", NULL, NULL, &bg, 1) == 0);

    ssize_t decay = -2, opt_decay = -2;
    sz = sizeof decay;
    CHECK(je_mallctl("opt.dirty_decay_ms", &opt_decay, &sz, NULL, 0) == 0 && opt_decay >= -1);
    CHECK(je_mallctl("arenas.dirty_decay_ms", &decay, &sz, NULL, 0) == 0 && decay >= -1);
    ssize_t want = 4321, got = 0;
    CHECK(je_mallctl("arenas.dirty_decay_ms", NULL, NULL, &want, sizeof want) == 0);
    CHECK(je_mallctl("arenas.dirty_decay_ms", &got, &sz, NULL, 0) == 0 && got == want);
    if (pagewise_mode) {
        __typeof__(pagewise_option_get) *option_get = need("pagewise_option_get");
        CHECK(option_get("decay_ms") == 4321);
        ssize_t bad = -5;
        CHECK(je_mallctl("arenas.dirty_decay_ms", NULL, NULL, &bad, sizeof bad) == EFAULT);
        /* The purger thread is started once: it cannot be switched. */
        unsigned char other = !bg;
        CHECK(je_mallctl("background_thread", NULL, NULL, &other, 1) == EPERM);
    }
    CHECK(je_mallctl("arenas.dirty_decay_ms", NULL, NULL, &decay, sizeof decay) == 0);
}

static void mibs(void) {
    size_t mib[4], len = 4;
    CHECK(je_nametomib("stats.allocated", mib, &len) == 0 && len == 2);
    refresh();
    size_t by_name = stat("stats.allocated"), by_mib = 0, sz = sizeof by_mib;
    CHECK(je_bymib(mib, len, &by_mib, &sz, NULL, 0) == 0 && by_mib == by_name);
    len = 4;
    CHECK(je_nametomib("nonsense.name", mib, &len) == ENOENT);
    /* An index replaced in the MIB, as jemalloc's manual shows. */
    len = 4;
    CHECK(je_nametomib("arena.0.purge", mib, &len) == 0 && len == 3);
    mib[1] = 4096;
    CHECK(je_bymib(mib, len, NULL, NULL, NULL, 0) == 0);
    len = 4;
    CHECK(je_nametomib("epoch", mib, &len) == 0 && len == 1);
    uint64_t e = 1;
    sz = sizeof e;
    CHECK(je_bymib(mib, len, &e, &sz, &e, sizeof e) == 0 && e > 0);
}

static int all_zero(const unsigned char *p, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (p[i]) return 0;
    return 1;
}

static void allocx_family(void) {
    /* nallocx is the usable size mallocx gives. */
    size_t sizes[] = {1, 100, 5000, 300 << 10, 3 << 20, 40 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        for (int lg = 0; lg <= 16; lg += 4) {
            void *p = je_mallocx(sizes[i], MALLOCX_LG_ALIGN(lg));
            CHECK(p && ((uintptr_t)p & ((1u << lg) - 1)) == 0);
            CHECK(je_sallocx(p, 0) == je_nallocx(sizes[i], MALLOCX_LG_ALIGN(lg)));
            CHECK(je_sallocx(p, 0) >= sizes[i] && je_sallocx(p, 0) == malloc_usable_size(p));
            je_dallocx(p, 0);
        }
    }
    void *h = malloc(100);
    CHECK(je_nallocx(100, 0) == malloc_usable_size(h));
    free(h);
    CHECK(je_nallocx(SIZE_MAX - 4096, 0) == 0);
    if (pagewise_mode) CHECK(je_nallocx((size_t)1 << 62, 0) == 0); /* above isize::MAX / 2 */
    CHECK(je_nallocx(100, MALLOCX_ALIGN(4096)) >= 100);

    /* MALLOCX_ZERO on memory that held other bytes. */
    for (size_t n = 64; n <= (1 << 20); n *= 16) {
        unsigned char *dirty = malloc(n);
        memset(dirty, 0xa5, n);
        free(dirty);
        unsigned char *z = je_mallocx(n, MALLOCX_ZERO | MALLOCX_ALIGN(64));
        CHECK(z && ((uintptr_t)z & 63) == 0 && all_zero(z, 0, je_sallocx(z, 0)));
        je_sdallocx(z, n, MALLOCX_ZERO | MALLOCX_ALIGN(64));
    }
    errno = 0;
    CHECK(je_mallocx(SIZE_MAX - 4096, 0) == NULL);

    /* rallocx: contents kept, the tail zeroed with MALLOCX_ZERO, a new
     * alignment honoured, failure leaving the block. */
    unsigned char *p = je_mallocx(100, 0);
    memset(p, 0xab, 100);
    size_t old = je_sallocx(p, 0);
    memset(p, 0xcd, old);
    memset(p, 0xab, 100);
    unsigned char *dirty = malloc(5000); /* its slot comes back to rallocx */
    memset(dirty, 0xee, 5000);
    free(dirty);
    unsigned char *q = je_rallocx(p, 5000, MALLOCX_ZERO);
    CHECK(q && q[0] == 0xab && q[99] == 0xab && all_zero(q, old, je_sallocx(q, 0)));
    unsigned char *r = je_rallocx(q, 6000, MALLOCX_LG_ALIGN(12));
    CHECK(r && ((uintptr_t)r & 4095) == 0 && r[0] == 0xab && r[99] == 0xab);
    CHECK(je_rallocx(r, SIZE_MAX - 4096, 0) == NULL);
    CHECK(r[0] == 0xab);
    je_dallocx(r, 0);

    /* xallocx: in place only; the result is the usable size after. */
    unsigned char *s = je_mallocx(100, 0);
    size_t s_usable = je_sallocx(s, 0);
    CHECK(je_xallocx(s, 50, 0, 0) == s_usable);
    size_t grown = je_xallocx(s, 100000, 0, 0);
    CHECK(grown == je_sallocx(s, 0) && grown >= 100);
    je_dallocx(s, 0);
    unsigned char *l = je_mallocx(1 << 20, 0);
    memset(l, 0x5a, 1 << 20);
    size_t l_old = je_sallocx(l, 0);
    size_t after = je_xallocx(l, 2 << 20, 0, MALLOCX_ZERO);
    CHECK(after == je_sallocx(l, 0) && (after == l_old || after >= (2u << 20)));
    CHECK(l[0] == 0x5a && l[l_old - 1] == 0x5a && all_zero(l, l_old, after));
    if (pagewise_mode) CHECK(after >= (2u << 20)); /* room after a fresh block */
    size_t shrunk = je_xallocx(l, 300 << 10, 0, 0);
    CHECK(shrunk == je_sallocx(l, 0) && shrunk >= (300u << 10) && l[0] == 0x5a);
    if (pagewise_mode) CHECK(shrunk < after);
    je_dallocx(l, 0);
    /* A huge block (above 32 MiB) keeps its size. */
    void *big = je_mallocx(40 << 20, 0);
    size_t big_old = je_sallocx(big, 0);
    CHECK(je_xallocx(big, 48 << 20, 0, 0) == je_sallocx(big, 0));
    if (pagewise_mode) CHECK(je_sallocx(big, 0) == big_old);
    je_dallocx(big, 0);
}

/* malloc_stats_print's callback: collects the text (and allocates, which
 * it may). */
static char text[1 << 16];
static size_t text_len;
static int pieces;
static void collect(void *opaque, const char *s) {
    CHECK(opaque == (void *)text);
    size_t n = strlen(s);
    if (text_len + n < sizeof text) {
        memcpy(text + text_len, s, n);
        text_len += n;
        text[text_len] = 0;
    }
    pieces++;
    free(malloc(n + 1));
}

static uint64_t thread_stat(const char *name) {
    uint64_t v = 0;
    size_t sz = sizeof v;
    CHECK(je_mallctl(name, &v, &sz, NULL, 0) == 0 && sz == sizeof v);
    return v;
}

enum { TN = 1000, TSIZE = 1000 };
static char *handed[TN];

/* Frees what the main thread allocated: counted here, not there. */
static void *free_handed(void *arg) {
    (void)arg;
    free(malloc(8));
    uint64_t a0 = thread_stat("thread.allocated");
    uint64_t d0 = thread_stat("thread.deallocated");
    for (int i = 0; i < TN; i++) free(handed[i]);
    CHECK(thread_stat("thread.deallocated") - d0 >= TN * TSIZE);
    CHECK(thread_stat("thread.allocated") - a0 < (64 << 10));
    return NULL;
}

static void thread_counters(void) {
    uint64_t a0 = thread_stat("thread.allocated");
    uint64_t d0 = thread_stat("thread.deallocated");
    for (int i = 0; i < TN; i++) handed[i] = malloc(TSIZE);
    uint64_t a1 = thread_stat("thread.allocated");
    CHECK(a1 - a0 >= TN * TSIZE && a1 - a0 <= TN * (TSIZE + 1024));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_handed, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    uint64_t d1 = thread_stat("thread.deallocated");
    CHECK(d1 - d0 < (64 << 10));
    char *big = malloc(3 << 20);
    CHECK(thread_stat("thread.allocated") - a1 >= (3 << 20));
    free(big);
    CHECK(thread_stat("thread.deallocated") - d1 >= (3 << 20));
    CHECK(je_mallctl("thread.allocated", NULL, NULL, &a0, sizeof a0) == EPERM);
    if (pagewise_mode) {
        /* No counter to point at: the figures are derived when read. */
        uint64_t *p;
        size_t sz = sizeof p;
        CHECK(je_mallctl("thread.allocatedp", &p, &sz, NULL, 0) == ENOENT);
    }
}

static void stats_print(void) {
    text_len = 0;
    pieces = 0;
    je_stats_print(collect, text, NULL);
    CHECK(pieces > 0 && text_len > 100);
    if (pagewise_mode) {
        CHECK(strncmp(text, "pagewise report (pid ", 21) == 0);
        CHECK(strstr(text, "free slots in used pages") != NULL);
        CHECK(strstr(text, "jemalloc") == NULL);
    } else {
        CHECK(strstr(text, "Begin jemalloc statistics") != NULL);
    }
    text_len = 0;
    je_stats_print(collect, text, "J");
    CHECK(text_len > 2 && text[0] == '{');
    if (pagewise_mode) CHECK(strstr(text, "\"live_bytes\":") != NULL);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "pagewise";
    bind();
    if (strcmp(mode, "stderr") == 0) {
        je_stats_print(NULL, NULL, NULL);
        return 0;
    }
    pagewise_mode = strcmp(mode, "pagewise") == 0;
    calling_convention();
    stats_move_with_allocations();
    mibs();
    allocx_family();
    thread_counters();
    stats_print();
    if (failures) {
        printf("jemalloc: %d checks failed\n", failures);
        return 1;
    }
    printf("jemalloc: all ok\n");
    return 0;
}
