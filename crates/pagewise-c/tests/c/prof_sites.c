/* The heap profiler's accuracy from C, under LD_PRELOAD: three call sites
 * of known live bytes (about 60, 30 and 10 %) with different sizes and
 * lifetimes, one site that leaks, and short-lived allocations. Built with
 * -O2 and without frame pointers.
 *
 *   site_a_small   4,000-byte objects, all held until after the profile.
 *   site_b_medium  100 KiB objects: twice its bytes are allocated, every
 *                  other object freed as soon as the next is made.
 *   site_c_large   1 MiB buffers in a ring: three times its bytes are
 *                  allocated, each buffer freed when its slot comes round
 *                  again (it lives for a ring's worth of allocations).
 *   site_leaking   5,000-byte objects, never freed.
 *   site_churn     700-byte objects, each freed at once.
 *
 *   prof_sites IN_USE_PATH   writes the in-use profile there with
 *                            pagewise_prof_dump (looked up at run time),
 *                            frees the three sites and exits: the profile
 *                            written at exit (PAGEWISE_PROF_FILE) holds
 *                            the leak.
 *   prof_sites --hold        leaks, writes "ready" to stdout, and exits
 *                            when stdin ends.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A_BYTES (360u << 20)
#define B_BYTES (180u << 20)
#define C_BYTES (60u << 20)
#define LEAK_BYTES (30u << 20)

static void *volatile sink;

__attribute__((noinline)) static char **site_a_small(size_t *n) {
    *n = A_BYTES / 4000;
    char **v = malloc(*n * sizeof *v);
    for (size_t i = 0; i < *n; i++) memset(v[i] = malloc(4000), 1, 4000);
    return v;
}

__attribute__((noinline)) static char **site_b_medium(size_t *n) {
    *n = B_BYTES / (100 << 10);
    char **v = malloc(*n * sizeof *v);
    for (size_t i = 0; i < *n; i++) {
        char *brief = malloc(100 << 10);
        memset(sink = brief, 2, 100 << 10);
        memset(v[i] = malloc(100 << 10), 2, 100 << 10);
        free(brief);
    }
    return v;
}

__attribute__((noinline)) static char **site_c_large(size_t *n) {
    *n = C_BYTES / (1 << 20);
    char **v = calloc(*n, sizeof *v);
    for (size_t i = 0; i < 3 * *n; i++) {
        free(v[i % *n]);
        memset(v[i % *n] = malloc(1 << 20), 3, 1 << 20);
    }
    return v;
}

__attribute__((noinline)) static void site_leaking(void) {
    for (size_t i = 0; i < LEAK_BYTES / 5000; i++) memset(sink = malloc(5000), 4, 5000);
}

__attribute__((noinline)) static void site_churn(void) {
    for (int i = 0; i < 200000; i++) {
        sink = malloc(700);
        free(sink);
    }
}

static void free_all(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* Leaks, says so, and waits for the end of stdin. */
static int hold(void) {
    site_leaking();
    printf("ready\n");
    fflush(stdout);
    while (getchar() != EOF) {
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "--hold") == 0) return hold();
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "pagewise_prof_dump");
    if (!dump) {
        fprintf(stderr, "prof_sites: not running under libpagewise.so\n");
        return 2;
    }
    size_t na, nb, nc;
    site_churn();
    char **a = site_a_small(&na);
    char **b = site_b_medium(&nb);
    char **c = site_c_large(&nc);
    site_leaking();
    if (dump(argv[1]) != 0) {
        fprintf(stderr, "prof_sites: pagewise_prof_dump failed\n");
        return 1;
    }
    free_all(c, nc);
    free_all(b, nb);
    free_all(a, na);
    return 0;
}
