/*
 * Edge cases of every function libpagewise.so exports, threads with
 * cross-thread frees, and fork from a multi-threaded parent.
 *
 *   edge pagewise   all checks, and malloc must resolve to libpagewise
 *   edge glibc      the same checks of standard semantics against glibc
 *   edge linked     all checks, pagewise linked in statically (libpagewise.a)
 *   edge hello      prints "hello" (for the environment tests)
 *   edge options    prints the settings pagewise started with
 *   edge stack-cache LIB   frees under glibc's stack-cache lock (see below)
 *   edge tls-modules DIR N dlopens DIR/tls<i>.so, i < N, while a thread waits
 *   edge double-free | double-free-aba | double-free-consumer |
 *        double-free-hollow SIZE STRIDE |
 *        foreign-free | far-free | top-free | segment-end-free |
 *        interior-free | free-sized-wrong | double-free-large   misuse (must abort;
 *        free-sized-wrong only with a debug build of the library; far-free
 *        and top-free free an address just past the 47-bit range and one at
 *        the top of the address space, segment-end-free the first byte past
 *        a segment of pagewise's)
 *   edge idle one-thread | threads-exit | handoff | handoff-blocked |
 *        handoff-blocked-trim   the quiet-program scenarios (prints "edge:
 *        idle BEFORE FREED AFTER", resident bytes)
 *   edge limit   under PAGEWISE_LIMIT=96M: 48 MiB freed into a blocked
 *        thread's heap, then 1 MiB blocks until malloc fails (prints "edge:
 *        limit FIRST80 TOTAL_MIB ERRNO_IS_ENOMEM")
 *   edge report-on-signal | report-periodic   8 MiB live, SIGUSR2 sent to
 *        itself (the first only), 400 ms, then SIGKILL: the reports of
 *        PAGEWISE_STATS_SIGNAL / PAGEWISE_STATS_INTERVAL_MS
 *   edge calloc-after-realign   calloc after a huge run's reuse at another
 *        alignment (prints "edge: calloc zero" or the count of old bytes)
 *
 * Prints "edge: all ok" and exits 0 on success; on a failed check prints
 * the line and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pagewise.h"

/* The misuse and impossible sizes below are deliberate. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#pragma GCC diagnostic ignored "-Wuse-after-free"
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="

#ifdef EMBED_CONF
/* Defaults embedded in the program (exported with -rdynamic, read by a
 * preloaded libpagewise.so). */
const char *pagewise_conf = EMBED_CONF;
#endif

static int failures;
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "edge.c:%d: check failed: %s\n", __LINE__, #cond); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static int pagewise_mode;
static int linked_mode;
/* Keeps the compiler from folding or eliding allocator calls. */
static void *volatile sink;

static int aligned(void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* The page valloc and pvalloc align to: the system's, or under pagewise the
 * PAGEWISE_OS_PAGE testing override ("16K", "64K" or bytes) if set. */
static size_t os_page(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const char *o = getenv("PAGEWISE_OS_PAGE");
    if (pagewise_mode && o && *o) {
        char *end;
        size_t n = strtoul(o, &end, 10);
        if (*end == 'K' || *end == 'k') n <<= 10;
        if (n > page) page = n;
    }
    return page;
}

static void basics(void) {
    void *a = malloc(0), *b = malloc(0);
    CHECK(a && b && a != b);
    free(a);
    free(b);
    free(NULL);

    for (size_t n = 1; n < (8u << 20); n = n * 3 + 1) {
        unsigned char *p = malloc(n);
        CHECK(p && aligned(p, 16));
        CHECK(malloc_usable_size(p) >= n);
        memset(p, 0xab, n);
        CHECK(p[0] == 0xab && p[n - 1] == 0xab);
        free(p);
    }
    CHECK(malloc_usable_size(NULL) == 0);

    errno = 0;
    sink = malloc(SIZE_MAX);
    CHECK(sink == NULL && errno == ENOMEM);
    errno = 0;
    sink = malloc((size_t)PTRDIFF_MAX + 1);
    CHECK(sink == NULL && errno == ENOMEM);
}

static void calloc_cases(void) {
    /* Dirty a block, free it, and calloc the same size: it must read zero. */
    for (size_t n = 8; n <= (1u << 22); n *= 4) {
        unsigned char *d = malloc(n);
        memset(d, 0x5a, n);
        free(d);
        unsigned char *z = calloc(1, n);
        CHECK(z != NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += z[i] != 0;
        CHECK(bad == 0);
        free(z);
    }
    void *z = calloc(0, 16);
    CHECK(z != NULL);
    free(z);
    errno = 0;
    sink = calloc(SIZE_MAX / 2, 3); /* overflows */
    CHECK(sink == NULL && errno == ENOMEM);
    errno = 0;
    sink = calloc((size_t)1 << 32, (size_t)1 << 32);
    CHECK(sink == NULL && errno == ENOMEM);
}

static void realloc_cases(void) {
    unsigned char *p = realloc(NULL, 10); /* realloc(NULL, n) == malloc(n) */
    CHECK(p != NULL);
    for (int i = 0; i < 10; i++) p[i] = (unsigned char)i;
    /* Grow through small, large and huge sizes, shrink back: contents kept. */
    size_t sizes[] = {24, 1000, 70000, 5u << 20, 40u << 20, 300, 7};
    size_t prev = 10;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        unsigned char *q = realloc(p, sizes[k]);
        CHECK(q != NULL && aligned(q, 16));
        size_t keep = prev < sizes[k] ? prev : sizes[k];
        if (keep > 10) keep = 10;
        for (size_t i = 0; i < keep; i++) CHECK(q[i] == (unsigned char)i);
        if (sizes[k] > prev) memset(q + prev, 0xee, sizes[k] - prev);
        p = q;
        prev = sizes[k];
    }
    /* A failed realloc returns NULL, sets ENOMEM and leaves p intact. */
    errno = 0;
    void *r = realloc(p, SIZE_MAX);
    CHECK(r == NULL && errno == ENOMEM);
    for (int i = 0; i < 7; i++) CHECK(p[i] == (unsigned char)i);
    /* glibc: realloc(p, 0) frees p and returns NULL. */
    CHECK(realloc(p, 0) == NULL);

    unsigned char *a = reallocarray(NULL, 10, 10);
    CHECK(a != NULL);
    a[99] = 7;
    errno = 0;
    CHECK(reallocarray(a, SIZE_MAX / 2, 4) == NULL && errno == ENOMEM);
    CHECK(a[99] == 7);
    a = reallocarray(a, 100, 100);
    CHECK(a != NULL && a[99] == 7);
    free(a);
}

static void aligned_cases(void) {
    void *p = (void *)1;
    int saved;
    CHECK(posix_memalign(&p, 3, 10) == EINVAL);
    CHECK(posix_memalign(&p, 4, 10) == EINVAL); /* not a multiple of void* */
    CHECK(posix_memalign(&p, 0, 10) == EINVAL);
    CHECK(p == (void *)1);
    errno = 1234;
    saved = posix_memalign(&p, 64, SIZE_MAX - 100);
    CHECK(saved == ENOMEM && p == (void *)1);
    if (pagewise_mode) CHECK(errno == 1234); /* glibc sets it */
    size_t aligns[] = {8, 16, 32, 64, 256, 4096, 65536, 1u << 20, 1u << 24};
    for (size_t k = 0; k < sizeof aligns / sizeof *aligns; k++) {
        for (size_t n = 0; n < 200000; n = n * 7 + 5) {
            void *q = NULL;
            CHECK(posix_memalign(&q, aligns[k], n) == 0);
            CHECK(q != NULL && aligned(q, aligns[k]));
            memset(q, 1, n);
            free(q);
        }
    }

    void *q = aligned_alloc(256, 10);
    CHECK(q && aligned(q, 256));
    free(q);
    q = aligned_alloc(1u << 21, 3u << 20);
    CHECK(q && aligned(q, 1u << 21));
    free(q);
    if (pagewise_mode) { /* glibc before 2.38 rounds up instead */
        errno = 0;
        CHECK(aligned_alloc(24, 48) == NULL && errno == EINVAL);
    }

    q = memalign(24, 100); /* rounded up to 32 */
    CHECK(q && aligned(q, 32));
    free(q);
    q = memalign(4096, 1);
    CHECK(q && aligned(q, 4096));
    free(q);
    errno = 0;
    CHECK(memalign(SIZE_MAX / 2 + 2, 8) == NULL && errno == EINVAL);

    size_t page = os_page();
    q = valloc(10);
    CHECK(q && aligned(q, page));
    free(q);
    q = pvalloc(10);
    CHECK(q && aligned(q, page) && malloc_usable_size(q) >= page);
    free(q);
    q = pvalloc(0);
    CHECK(q && aligned(q, page));
    free(q);
    errno = 0;
    CHECK(pvalloc(SIZE_MAX - 10) == NULL && errno == ENOMEM);
    CHECK(malloc_trim(0) == 1);
}

/* ----- threads: each frees what its neighbour allocated ------------------ */

#define THREADS 4
#define ROUNDS 200
#define BATCH 256
static void *volatile mailbox[THREADS][BATCH];
static pthread_barrier_t barrier;

static void *worker(void *arg) {
    int me = (int)(intptr_t)arg;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < BATCH; i++) {
            size_t n = (size_t)((i * 37 + r * 11 + me) % 3000) + 1;
            if (i % 64 == 0) n = 100000 + (size_t)i * 100; /* large objects too */
            unsigned char *p = malloc(n);
            p[0] = (unsigned char)me;
            p[n - 1] = (unsigned char)me;
            mailbox[me][i] = p;
        }
        pthread_barrier_wait(&barrier);
        int from = (me + 1) % THREADS;
        for (int i = 0; i < BATCH; i++) {
            unsigned char *p = mailbox[from][i];
            if (p[0] != (unsigned char)from) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
            free(p);
        }
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

static void *short_lived(void *arg) {
    /* Exits with live blocks that the main thread frees later. */
    void **out = arg;
    for (int i = 0; i < 100; i++) free(malloc(64));
    *out = malloc(123);
    return NULL;
}

static void threads(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&barrier);
    /* Many short threads: heaps of exited threads are reused. */
    void *left[64];
    for (int i = 0; i < 64; i++) {
        pthread_t s;
        CHECK(pthread_create(&s, NULL, short_lived, &left[i]) == 0);
        pthread_join(s, NULL);
    }
    for (int i = 0; i < 64; i++) free(left[i]);
}

/* ----- fork from a multi-threaded parent ---------------------------------- */

static volatile int stop_churn;
static void *churn(void *arg) {
    (void)arg;
    unsigned k = 0;
    while (!stop_churn) {
        void *p[16];
        for (int i = 0; i < 16; i++) p[i] = malloc((k++ % 5000) + 1);
        for (int i = 0; i < 16; i++) free(p[i]);
        if (k % 4096 == 0) free(malloc(3u << 20));
    }
    return NULL;
}

static void *child_thread(void *arg) {
    free(malloc(1000));
    return arg;
}

static void forks(void) {
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int f = 0; f < 20; f++) {
        void *held = malloc(4000);
        pid_t pid = fork();
        if (pid == 0) {
            /* In the child: allocate, free the parent's block, make a thread. */
            for (int i = 0; i < 2000; i++) free(malloc((size_t)(i % 9000) + 1));
            free(held);
            void *big = malloc(50u << 20);
            memset(big, 1, 1u << 20);
            free(big);
            pthread_t c;
            if (pthread_create(&c, NULL, child_thread, NULL) != 0) _exit(3);
            pthread_join(c, NULL);
            _exit(0);
        }
        CHECK(pid > 0);
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        free(held);
    }
    stop_churn = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
}

/* ----- pagewise's own functions, and that malloc really is pagewise ------- */

static long json_field(const char *json, const char *key) {
    const char *p = strstr(json, key);
    return p ? atol(p + strlen(key)) : -1;
}

static void pagewise_own(void) {
    Dl_info info;
    CHECK(dladdr((void *)dlsym(RTLD_DEFAULT, "malloc"), &info) != 0);
    CHECK(info.dli_fname && strstr(info.dli_fname, "libc.so") == NULL);
    if (!linked_mode) CHECK(info.dli_fname && strstr(info.dli_fname, "libpagewise") != NULL);
    size_t (*json)(char *, size_t) = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "pagewise_stats_json");
    void (*print)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "pagewise_stats_print");
    void (*trim)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "pagewise_trim");
    CHECK(json && print && trim);
    if (!json || !print || !trim) return;

    char small[8];
    size_t need = json(NULL, 0);
    CHECK(need > 100);
    CHECK(json(small, sizeof small) == need && small[7] == 0 && strlen(small) == 7);
    /* Allocating the buffer changes the figures: leave some slack. */
    char *buf = malloc(need + 256);
    size_t got = json(buf, need + 256);
    CHECK(got < need + 256 && strlen(buf) == got && buf[got - 1] == '}');
    long before = json_field(buf, "\"live_allocations\":");
    void *blocks[1000];
    for (int i = 0; i < 1000; i++) blocks[i] = malloc(48);
    size_t need2 = json(NULL, 0);
    char *buf2 = malloc(need2 + 64);
    json(buf2, need2 + 64);
    long after = json_field(buf2, "\"live_allocations\":");
    CHECK(after >= before + 1000);
    for (int i = 0; i < 1000; i++) free(blocks[i]);
    free(buf);
    free(buf2);
    trim();

    int fds[2];
    CHECK(pipe(fds) == 0);
    print(fds[1]);
    close(fds[1]);
    char text[8192];
    ssize_t n = read(fds[0], text, sizeof text - 1);
    close(fds[0]);
    CHECK(n > 0);
    text[n > 0 ? n : 0] = 0;
    CHECK(strstr(text, "pagewise report") != NULL);
}

/* ----- the rest of glibc's family, C23's sized frees, malloc_good_size ---- */

/* `name` resolves to pagewise (the preloaded library, or the program that
 * linked libpagewise.a), not to glibc. */
static void *pagewise_symbol(const char *name) {
    void *sym = dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    int ok = sym && dladdr(sym, &info) && info.dli_fname &&
             strstr(info.dli_fname, "libc.so") == NULL &&
             (linked_mode || strstr(info.dli_fname, "libpagewise") != NULL);
    if (!ok) fprintf(stderr, "edge: %s does not resolve to pagewise\n", name);
    CHECK(ok);
    return ok ? sym : NULL;
}

static void glibc_family(void) {
    void *(*libc_malloc)(size_t) = (void *(*)(size_t))pagewise_symbol("__libc_malloc");
    void (*libc_free)(void *) = (void (*)(void *))pagewise_symbol("__libc_free");
    void *(*libc_calloc)(size_t, size_t) = (void *(*)(size_t, size_t))pagewise_symbol("__libc_calloc");
    void *(*libc_realloc)(void *, size_t) = (void *(*)(void *, size_t))pagewise_symbol("__libc_realloc");
    void *(*libc_memalign)(size_t, size_t) = (void *(*)(size_t, size_t))pagewise_symbol("__libc_memalign");
    void *(*libc_valloc)(size_t) = (void *(*)(size_t))pagewise_symbol("__libc_valloc");
    void *(*libc_pvalloc)(size_t) = (void *(*)(size_t))pagewise_symbol("__libc_pvalloc");
    void (*cfree_)(void *) = (void (*)(void *))pagewise_symbol("cfree");
    void (*free_sized_)(void *, size_t) = (void (*)(void *, size_t))pagewise_symbol("free_sized");
    void (*free_aligned_sized_)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))pagewise_symbol("free_aligned_sized");
    size_t (*good_size)(size_t) = (size_t(*)(size_t))pagewise_symbol("malloc_good_size");
    if (!libc_malloc || !libc_free || !libc_calloc || !libc_realloc || !libc_memalign ||
        !libc_valloc || !libc_pvalloc || !cfree_ || !free_sized_ || !free_aligned_sized_ || !good_size)
        return;
    size_t page = os_page();

    /* Each serves pagewise memory: malloc_usable_size (pagewise's, which
     * aborts on a foreign pointer) and free accept it. */
    unsigned char *p = libc_malloc(100);
    CHECK(p && aligned(p, 16) && malloc_usable_size(p) >= 100);
    memset(p, 7, 100);
    p = libc_realloc(p, 5000);
    CHECK(p && p[99] == 7 && malloc_usable_size(p) >= 5000);
    libc_free(p);
    p = libc_calloc(100, 100);
    size_t bad = 0;
    for (int i = 0; i < 10000; i++) bad += p[i] != 0;
    CHECK(p && bad == 0);
    free(p);
    p = libc_memalign(64, 10);
    CHECK(p && aligned(p, 64));
    free(p);
    p = libc_valloc(10);
    CHECK(p && aligned(p, page));
    cfree_(p);
    p = libc_pvalloc(10);
    CHECK(p && aligned(p, page) && malloc_usable_size(p) >= page);
    libc_free(p);
    errno = 0;
    CHECK(libc_malloc(SIZE_MAX) == NULL && errno == ENOMEM);
    libc_free(NULL);
    cfree_(NULL);

    /* C23: the size (and alignment) given back with the block. */
    p = malloc(100);
    free_sized_(p, 100);
    p = calloc(3, 1000);
    free_sized_(p, 3000);
    p = aligned_alloc(256, 1024);
    free_aligned_sized_(p, 256, 1024);
    free_sized_(NULL, 0);
    free_aligned_sized_(NULL, 64, 0);

    /* malloc_good_size is exactly the usable size malloc gives. */
    for (size_t n = 0; n < (80u << 20); n = n < 4096 ? n + 1 : n * 9 / 8) {
        void *q = malloc(n);
        size_t good = good_size(n);
        CHECK(good >= n && malloc_usable_size(q) == good);
        free(q);
    }
    CHECK(good_size(100) == 112);
}

/* ----- introspection with pagewise's figures, options at run time ------- */

static void introspection(void) {
    /* mallinfo2 moves with allocations: 100 blocks of 1000 bytes (class
     * 1024) and one huge block. */
    struct mallinfo2 a = mallinfo2();
    void *blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = malloc(1000);
    void *huge = malloc(40u << 20);
    struct mallinfo2 b = mallinfo2();
    CHECK(b.uordblks >= a.uordblks + 100 * 1000);
    CHECK(b.hblks == a.hblks + 1 && b.hblkhd >= a.hblkhd + (40u << 20));
    CHECK(b.arena >= b.uordblks && b.arena == b.uordblks + b.fordblks);
    CHECK(b.usmblks >= b.arena + b.hblkhd);
    for (int i = 0; i < 100; i++) free(blocks[i]);
    free(huge);
    struct mallinfo2 c = mallinfo2();
    CHECK(c.uordblks + 100 * 1000 <= b.uordblks && c.hblks == a.hblks);
    CHECK(c.keepcost > 0 && c.fordblks >= c.keepcost);
    malloc_trim(0);
    struct mallinfo2 d = mallinfo2();
    CHECK(d.keepcost < c.keepcost);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
    CHECK(m.uordblks > 0 && m.arena >= m.uordblks);

    /* malloc_info: options != 0 is EINVAL; the XML goes to stdout between
     * markers (the Rust test parses it). */
    CHECK(malloc_info(1, stdout) == EINVAL);
    void *keep = malloc(200);
    printf("edge: malloc_info begin\n");
    fflush(stdout);
    CHECK(malloc_info(0, stdout) == 0);
    fflush(stdout);
    printf("edge: malloc_info end\n");
    free(keep);

    /* mallopt: M_TRIM_THRESHOLD is the retention ceiling; M_ARENA_MAX and
     * unknown parameters change nothing and say so. */
    long long (*get)(const char *) = (long long (*)(const char *))pagewise_symbol("pagewise_option_get");
    int (*set)(const char *, const char *) = (int (*)(const char *, const char *))pagewise_symbol("pagewise_option_set");
    if (!get || !set) return;
    long long retain = get("retain_max");
    CHECK(mallopt(M_TRIM_THRESHOLD, 8 << 20) == 1);
    CHECK(get("retain_max") == 8 << 20);
    CHECK(mallopt(M_TRIM_THRESHOLD, -5) == 0);
    CHECK(mallopt(M_ARENA_MAX, 1) == 0);
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 0);
    CHECK(mallopt(12345, 1) == 0);
    /* Observable: with a 1 MiB ceiling, freeing 16 MiB keeps at most 1 MiB. */
    CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
    void *big[16];
    for (int i = 0; i < 16; i++) { big[i] = malloc(1u << 20); memset(big[i], 1, 1u << 20); }
    for (int i = 0; i < 16; i++) free(big[i]);
    CHECK(mallinfo2().keepcost <= (1u << 20) + (256u << 10));

    /* pagewise_option_get / set. */
    CHECK(get("decay_ms") == 1000);
    CHECK(set("decay_ms", "250") == 0 && get("decay_ms") == 250);
    CHECK(set("decay_ms", "-1") == 0 && get("decay_ms") == -1);
    CHECK(set("decay_ms", "soon") == EINVAL && get("decay_ms") == -1);
    CHECK(set("decay_ms", "1000") == 0);
    CHECK(set("retain_max", "1.5G") == 0 && get("retain_max") == 3ll << 29);
    CHECK(set("retain_max", "-1") == 0 && get("retain_max") == -1);
    CHECK(set("limit", "0") == EINVAL && get("limit") == -1);
    CHECK(set("reserve", "0") == EINVAL && get("reserve") == 1ll << 30);
    CHECK(set("reserve", "64MiB") == 0 && get("reserve") == 64ll << 20);
    CHECK(set("purge", "free") == EPERM && get("purge") == 0);
    CHECK(set("background", "0") == EPERM && get("background") == 1);
    errno = 0;
    CHECK(get("colour") == -1 && errno == EINVAL);
    CHECK(set("colour", "blue") == EINVAL);
    CHECK(set(NULL, "1") == EINVAL && set("decay_ms", NULL) == EINVAL);
    CHECK(set("retain_max", "-1") == 0);
    if (retain != -1) fprintf(stderr, "edge: retain_max was %lld\n", retain);
}

/* Prints the settings pagewise started with (for the PAGEWISE_CONF and
 * pagewise_conf tests). */
static int print_options(void) {
    long long (*get)(const char *) = (long long (*)(const char *))dlsym(RTLD_DEFAULT, "pagewise_option_get");
    if (!get) return 2;
    printf("edge: options decay_ms=%lld retain_max=%lld limit=%lld reserve=%lld purge=%lld background=%lld\n",
           get("decay_ms"), get("retain_max"), get("limit"), get("reserve"), get("purge"), get("background"));
    return 0;
}

/* ----- free() inside glibc's stack-cache lock ----------------------------
 * A thread touches the big TLS block of a dlopened library (malloc'd), exits
 * and is joined: its stack goes to glibc's cache. Four threads with larger
 * stacks then overflow the cache (40 MiB); evicting the first stack frees
 * its TLS block while glibc holds the stack-cache lock. That free is the
 * first to retain memory, the cue for pagewise's purger thread, and
 * pthread_create needs the same lock: starting the thread there deadlocks. */
static char *(*touch_tls)(void);
static void *tls_toucher(void *arg) { touch_tls(); return arg; }
static void *idle_thread(void *arg) { return arg; }

static int stack_cache(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    touch_tls = (char *(*)(void))dlsym(h, "pagewise_test_touch_tls");
    pthread_t t;
    pthread_create(&t, NULL, tls_toucher, NULL);
    pthread_join(t, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16u << 20);
    pthread_t ts[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&ts[i], &attr, idle_thread, NULL) == 0);
    for (int i = 0; i < 4; i++) pthread_join(ts[i], NULL);
    free(malloc(100)); /* the purger starts here, outside glibc's locks */
    if (failures) return 1;
    printf("edge: all ok\n");
    return 0;
}

/* ----- many dlopened TLS modules ----------------------------------------
 * A thread that allocated before gets its next malloc after N modules with
 * thread-local storage were dlopened: its dtv is stale and too short, and
 * glibc's __tls_get_addr (which pagewise's own thread-local heap pointer
 * goes through in a shared library) resizes it with malloc. */
static pthread_barrier_t tls_barrier;
static void *tls_waiter(void *arg) {
    free(malloc(100));
    pthread_barrier_wait(&tls_barrier);
    pthread_barrier_wait(&tls_barrier);
    for (int i = 0; i < 1000; i++) free(malloc((size_t)i * 8 + 1));
    return arg;
}

static int tls_modules(const char *dir, int n) {
    pthread_barrier_init(&tls_barrier, NULL, 2);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, tls_waiter, NULL) == 0);
    pthread_barrier_wait(&tls_barrier);
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tls%d.so", dir, i);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        char *(*touch)(void) = (char *(*)(void))dlsym(h, "pagewise_test_touch_tls");
        CHECK(touch && touch()[0] == 1);
    }
    pthread_barrier_wait(&tls_barrier);
    pthread_join(t, NULL);
    if (failures) return 1;
    printf("edge: all ok\n");
    return 0;
}

/* A double free of a slot whose OS page malloc_trim purged: objects of
 * SIZE bytes, the first of every STRIDE bytes kept and the rest freed, two
 * trims, one freed object freed again, then allocations on. Must abort;
 * prints "edge: handed out twice" and exits 0 if an address comes back
 * while it is still held. */
static int double_free_hollow(size_t size, size_t stride) {
    size_t per = stride / size, n = 8 * per;
    if (n < 8192) n = 8192;
    char **objs = malloc(n * sizeof *objs);
    for (size_t i = 0; i < n; i++) objs[i] = malloc(size);
    for (size_t i = 0; i < n; i++)
        if (i % per) free(objs[i]);
    malloc_trim(0);
    malloc_trim(0);
    char *victim = objs[4 * per + per / 2];
    free(victim);
    /* An open-addressing set of the addresses held (the survivors, then
     * every new block, all kept). */
    size_t cap = 1;
    while (cap < 4 * (n / per + 2 * n)) cap <<= 1;
    char **set = calloc(cap, sizeof *set);
    int seen = 0;
    for (size_t i = 0; i <= 2 * n; i++) {
        char *p = i < n / per ? objs[i * per] : malloc(size);
        size_t k = ((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15u & (cap - 1);
        while (set[k] && set[k] != p) k = (k + 1) & (cap - 1);
        if (set[k]) {
            printf("edge: handed out twice %p after %zu allocations\n", (void *)p, i);
            return 0;
        }
        set[k] = p;
        seen += p == victim;
    }
    printf("edge: no address twice (the freed-twice slot came back %d times)\n", seen);
    return 0;
}

/* double-free-large: a 1 MiB block made on a thread of its own and
   freed by a function of its own, then freed again by main (under the
   heap profiler, the report names both functions). */
__attribute__((noinline)) static void *make_large(void *unused) {
    (void)unused;
    char *p = malloc(1 << 20);
    if (p) p[0] = 1;
    return p;
}

__attribute__((noinline)) static void drop_large(char *p) {
    free(p);
    __asm__ volatile("" ::: "memory");
}

static void *free_twice(void *p) {
    /* A consumer thread: its first frees go straight to the owning page. */
    free(p);
    free(p);
    return NULL;
}

/* The reproducer: a huge block dirtied and freed, its run reused at
 * a 2 MiB alignment and freed, the decay run, then calloc of the first size. */
static int calloc_after_realign(void) {
    size_t big = 40u << 20;
    unsigned char *a = malloc(big);
    memset(a, 0xAA, big);
    __asm__ volatile("" : : "r"(a) : "memory");
    free(a);
    void *b = NULL;
    if (posix_memalign(&b, 2u << 20, 30u << 20)) return 2;
    free(b);
    sleep(2);
    unsigned char *c = calloc(1, big);
    size_t dirty = 0;
    for (size_t i = 0; i < big; i++) dirty += c[i] != 0;
    free(c);
    if (dirty) {
        printf("edge: calloc returned %zu old bytes\n", dirty);
        return 1;
    }
    printf("edge: calloc zero\n");
    return 0;
}

/* The quiet-program scenarios: resident bytes before, right after the
 * frees, and after an idle second (run with a short PAGEWISE_DECAY_MS). */
static long resident(void) {
    long size = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &size, &rss) != 2) return -1;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

static void *written_then_freed(void *arg) {
    (void)arg;
    static __thread char *blocks[8192];
    for (int i = 0; i < 8192; i++) {
        blocks[i] = malloc(6000);
        memset(blocks[i], i | 1, 6000);
    }
    for (int i = 0; i < 8192; i++) free(blocks[i]);
    return NULL;
}

#define HANDOFF_OBJECTS 65536
static void *produce(void *arg) {
    char **objs = arg;
    for (int i = 0; i < HANDOFF_OBJECTS; i++) {
        objs[i] = malloc(1024);
        memset(objs[i], i | 1, 1024);
    }
    return NULL;
}

/* A producer that stays alive, blocked in a semaphore (no allocator
 * call), while main frees what it made. */
static sem_t produced, go;
static void *produce_then_block(void *arg) {
    produce(arg);
    sem_post(&produced);
    sem_wait(&go);
    return NULL;
}

static int idle(const char *which) {
    static char *objs[HANDOFF_OBJECTS];
    pthread_t t[8];
    long before = resident();
    if (!strcmp(which, "one-thread")) {
        written_then_freed(NULL);
    } else if (!strcmp(which, "threads-exit")) {
        for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, written_then_freed, NULL);
        for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    } else if (!strcmp(which, "handoff")) {
        pthread_create(&t[0], NULL, produce, objs);
        pthread_join(t[0], NULL);
        for (int i = 0; i < HANDOFF_OBJECTS; i++) free(objs[i]);
    } else if (!strcmp(which, "handoff-blocked") || !strcmp(which, "handoff-blocked-trim")) {
        sem_init(&produced, 0, 0);
        sem_init(&go, 0, 0);
        pthread_create(&t[0], NULL, produce_then_block, objs);
        sem_wait(&produced);
        for (int i = 0; i < HANDOFF_OBJECTS; i++) free(objs[i]);
    } else {
        return 2;
    }
    long freed = resident();
    if (strstr(which, "-trim"))
        malloc_trim(0); /* gives it back before it returns: no quiet */
    else
        sleep(1);
    long after = resident();
    printf("edge: idle %ld %ld %ld\n", before, freed, after);
    if (strstr(which, "blocked")) {
        sem_post(&go);
        pthread_join(t[0], NULL);
    }
    return 0;
}

/* PAGEWISE_LIMIT: memory freed into another thread's heap while that
 * thread is blocked counts against the limit until it goes back; an
 * allocation that would pass the limit makes it go back first, and fails
 * with ENOMEM only when the limit is really reached. */
static int limit(void) {
    static char *objs[HANDOFF_OBJECTS];
    static char *blocks[256];
    pthread_t t;
    sem_init(&produced, 0, 0);
    sem_init(&go, 0, 0);
    pthread_create(&t, NULL, produce_then_block, objs); /* 64 MiB of 1 KiB */
    sem_wait(&produced);
    for (int i = 0; i < HANDOFF_OBJECTS; i++) free(objs[i]);
    int n = 0, first = 0;
    errno = 0;
    while (n < 256) {
        char *b = malloc(1 << 20);
        if (!b) break;
        memset(b, 1, 1 << 20);
        blocks[n++] = b;
        if (n == 80) first = 1;
    }
    int enomem = n < 256 && errno == ENOMEM;
    printf("edge: limit %d %d %d\n", first, n, enomem);
    for (int i = 0; i < n; i++) free(blocks[i]);
    char *again = malloc(1 << 20);
    printf("edge: limit after-free %d\n", again != NULL);
    free(again);
    sem_post(&go);
    pthread_join(t, NULL);
    return 0;
}

/* Reports while running: 8 MiB live, then the signal (if asked), a wait
 * of 400 ms, and an end that runs no exit handler (SIGKILL, as the OOM
 * killer sends): whatever report there is was written while running. */
static int report_then_killed(int signal_it) {
    char *keep = malloc(8 << 20);
    memset(keep, 1, 8 << 20);
    if (signal_it) kill(getpid(), SIGUSR2);
    usleep(400 * 1000);
    printf("edge: reported %p\n", (void *)keep);
    fflush(stdout);
    kill(getpid(), SIGKILL);
    return 1;
}

/* A program that takes its signals with sigwait: it blocks them on its
 * thread (and so on every thread it starts) and waits. A thread the
 * allocator started before main with the signal open would take it instead
 * (its default action, or a handler's, on the wrong thread). `sig` 0:
 * SIGTERM, waited for; else that signal (pagewise's report signal), only
 * sent. */
static int sigwait_mode(int sig) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig ? sig : SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    char *keep = malloc(8 << 20);
    memset(keep, 1, 8 << 20);
    usleep(100 * 1000); /* pagewise's threads have run by now */
    kill(getpid(), sig ? sig : SIGTERM);
    if (sig) {
        usleep(400 * 1000);
        printf("edge: sent %d %p\n", sig, (void *)keep);
        return 0;
    }
    struct timespec wait = {2, 0};
    int got = sigtimedwait(&set, NULL, &wait);
    printf("edge: sigwait %d %p\n", got, (void *)keep);
    return got == SIGTERM ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "pagewise";
    if (!strcmp(mode, "limit")) return limit();
    if (!strcmp(mode, "report-on-signal")) return report_then_killed(1);
    if (!strcmp(mode, "report-periodic")) return report_then_killed(0);
    if (!strcmp(mode, "sigwait")) return sigwait_mode(argc > 2 ? atoi(argv[2]) : 0);
    if (!strcmp(mode, "idle") && argc > 2) return idle(argv[2]);
    if (!strcmp(mode, "double-free")) {
        char *p = malloc(32);
        free(p);
        free(p);
        return 0;
    }
    if (!strcmp(mode, "double-free-aba")) {
        char *a = malloc(32), *b = malloc(32);
        free(a);
        free(b);
        free(a);
        return 0;
    }
    if (!strcmp(mode, "double-free-hollow") && argc > 3)
        return double_free_hollow(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
    if (!strcmp(mode, "double-free-consumer")) {
        pthread_t t;
        pthread_create(&t, NULL, free_twice, malloc(48));
        pthread_join(t, NULL);
        return 0;
    }
    if (!strcmp(mode, "double-free-large")) {
        pthread_t t;
        void *p = NULL;
        pthread_create(&t, NULL, make_large, NULL);
        pthread_join(t, &p);
        drop_large(p);
        free(p);
        return 0;
    }
    if (!strcmp(mode, "calloc-after-realign")) return calloc_after_realign();
    if (!strcmp(mode, "foreign-free")) {
        static char not_heap[64];
        free(not_heap + 16);
        return 0;
    }
    if (!strcmp(mode, "far-free")) {
        free((void *)(((uintptr_t)1 << 47) + 16));
        return 0;
    }
    if (!strcmp(mode, "segment-end-free")) {
        /* The first byte past a 32 MiB segment (layout.rs, SEGMENT) of
           pagewise's: free's lookup takes the segment below for it, whose
           header holds no slot, and the free past the cache says what the
           address is. */
        uintptr_t seg = (uintptr_t)1 << 25;
        free((void *)(((uintptr_t)malloc(16) & ~(seg - 1)) + seg));
        return 0;
    }
    if (!strcmp(mode, "top-free")) {
        free((void *)(uintptr_t)-16);
        return 0;
    }
    if (!strcmp(mode, "free-sized-wrong")) {
        void (*free_sized_)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
        if (free_sized_) free_sized_(malloc(100), 1000);
        return 0;
    }
    if (!strcmp(mode, "interior-free")) {
        char *p = malloc(100000);
        free(p + 8);
        return 0;
    }
    if (!strcmp(mode, "stack-cache") && argc > 2) return stack_cache(argv[2]);
    if (!strcmp(mode, "tls-modules") && argc > 3) return tls_modules(argv[2], atoi(argv[3]));
    if (!strcmp(mode, "options")) return print_options();
    if (!strcmp(mode, "hello")) {
        free(malloc(10));
        printf("hello\n");
        return 0;
    }
    linked_mode = !strcmp(mode, "linked");
    pagewise_mode = linked_mode || !strcmp(mode, "pagewise");
    basics();
    calloc_cases();
    realloc_cases();
    aligned_cases();
    threads();
    forks();
    if (pagewise_mode) pagewise_own();
    if (pagewise_mode) glibc_family();
    if (pagewise_mode) introspection();
    if (failures) {
        fprintf(stderr, "edge: %d checks failed\n", failures);
        return 1;
    }
    printf("edge: all ok\n");
    return 0;
}
