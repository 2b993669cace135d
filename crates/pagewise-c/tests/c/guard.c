/* Bugs the guard pool reports, one per run (argv[1] names it), under
 * PAGEWISE_GUARD_SAMPLE=1 (every allocation of at most a page is guarded
 * while the pool has a slot). Built with -O2 and without frame pointers:
 * the reports' stacks come from the unwind tables, as in a release build.
 * Each bug sits in a function of its own, whose name the report must give. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile char sink;
static long page;

/* A guarded block of `n` bytes whose start is (left) or is not (right) at
 * its slot's start: a block sits against one side of its slot, at random. */
NOINLINE static char *make_block(size_t n, int left) {
    for (int i = 0; i < 64; i++) {
        char *p = malloc(n);
        if (((uintptr_t)p % page == 0) == left)
            return p;
        /* Left in place: its slot stays live, so the next comes from another. */
    }
    fprintf(stderr, "no block on that side\n");
    exit(2);
}

NOINLINE static void write_past_end(char *p, size_t n) { p[n] = 1; }
NOINLINE static void write_before_start(char *p) { p[-1] = 1; }
NOINLINE static void read_after_free(char *p) { sink = p[5]; }
NOINLINE static void write_after_free(char *p) { p[5] = 1; }
/* Not tail calls, so that these frames stay on the stack. */
NOINLINE static void release(char *p) { free(p); sink = 0; }
NOINLINE static void release_again(char *p) { free(p); sink = 1; }
NOINLINE static void write_slack(char *p, size_t n) { p[n] = 7; }

static char *shared;
static void *free_elsewhere(void *arg) {
    (void)arg;
    release(shared);
    return NULL;
}

static sigjmp_buf back;
static void own_handler(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)ctx;
    fprintf(stderr, "own handler: fault at %p\n", info->si_addr);
    if (getenv("GUARD_HANDLER_EXITS"))
        _exit(3);
    siglongjmp(back, 1);
}

static void install_own_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
}

int main(int argc, char **argv) {
    page = sysconf(_SC_PAGESIZE);
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "overflow")) {
        char *p = make_block(32, 0);
        write_past_end(p, 32);
    } else if (!strcmp(what, "underflow")) {
        char *p = make_block(32, 1);
        write_before_start(p);
    } else if (!strcmp(what, "uaf-read")) {
        char *p = make_block(24, 0);
        release(p);
        read_after_free(p);
    } else if (!strcmp(what, "uaf-write")) {
        char *p = make_block(24, 1);
        release(p);
        write_after_free(p);
    } else if (!strcmp(what, "double-free")) {
        char *p = make_block(24, 1);
        release(p);
        release_again(p);
    } else if (!strcmp(what, "invalid-free")) {
        char *p = make_block(24, 1);
        release(p + 8);
    } else if (!strcmp(what, "slack")) {
        char *p = make_block(24, 0);
        write_slack(p, 24);
        release(p);
    } else if (!strcmp(what, "threads")) {
        /* Allocated here, freed by another thread, then read here. */
        shared = make_block(48, 0);
        pthread_t t;
        pthread_create(&t, NULL, free_elsewhere, NULL);
        pthread_join(t, NULL);
        read_after_free(shared);
    } else if (!strcmp(what, "realloc")) {
        /* The old block is freed by the realloc that moves it. */
        char *volatile p = make_block(24, 0); /* kept past the realloc */
        char *q = realloc(p, 2000);
        if (q == p)
            return 4;
        read_after_free(p);
    } else if (!strcmp(what, "usable-size")) {
        char *p = make_block(24, 0);
        printf("%zu %zu\n", malloc_usable_size(p), (size_t)((uintptr_t)p % 16));
        memset(p, 1, malloc_usable_size(p));
        free(p);
    } else if (!strcmp(what, "own-handler")) {
        /* The program's handler, put in before pagewise's, still gets the
         * faults that are not in the pool: here, in a page of its own. */
        install_own_handler();
        char *mine = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *p = make_block(32, 0); /* our handler goes in front */
        if (sigsetjmp(back, 1) == 0) {
            sink = mine[0];
            return 5;
        }
        fprintf(stderr, "recovered\n");
        /* And a fault in the pool is reported, then passed on to it. */
        setenv("GUARD_HANDLER_EXITS", "1", 1);
        write_past_end(p, 32);
        return 6;
    } else {
        fprintf(stderr, "unknown case\n");
        return 2;
    }
    return 0;
}
