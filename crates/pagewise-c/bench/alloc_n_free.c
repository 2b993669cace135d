/* Allocate n objects of one small size, write each whole, then free the
 * first half in allocation order (first in, first out) and the second half
 * in reverse (last in, first out); over and over, for n = 25, 100, 400 and
 * 1,600, each with the same number of allocations in all. The sizes are
 * SIZE, 2*SIZE and 4*SIZE (SIZE 16 unless given), each run on the main
 * thread, then on a second thread, then on the main thread again. This is
 * the shape of the C library's own small-block benchmark: at the larger n
 * more slots are freed in a row than a thread cache holds.
 *
 *   cc -O2 -o /tmp/alloc_n_free crates/pagewise-c/bench/alloc_n_free.c -lpthread
 *   LD_PRELOAD=target/release/libpagewise.so /tmp/alloc_n_free [SIZE [ALLOCS [N]]]
 *
 * ALLOCS is the allocations per size, per n and per run (2,000,000 unless
 * given); N, if given, runs that n alone (for a profile). Prints a checksum
 * so the writes are not optimised away. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_N = 1600 };

static const int all_n[] = {25, 100, 400, MAX_N};
static long allocs = 2000000;
static int only_n;
static size_t size;
static unsigned long sum;

static void rounds(int n, int **arr) {
    long iters = allocs / n;
    size_t ints = size / sizeof(int);
    for (long j = 0; j < iters; j++) {
        for (int i = 0; i < n; i++) {
            arr[i] = malloc(size);
            for (size_t g = 0; g < ints; g++) arr[i][g] = (int)g + i;
        }
        sum += (unsigned long)arr[n / 2][0];
        for (int i = 0; i < n / 2; i++) free(arr[i]);
        for (int i = n - 1; i >= n / 2; i--) free(arr[i]);
    }
}

static void every_n(int **arr) {
    for (unsigned k = 0; k < sizeof all_n / sizeof all_n[0]; k++)
        if (!only_n || only_n == all_n[k]) rounds(all_n[k], arr);
}

static void *on_thread(void *arr) {
    every_n(arr);
    return arr;
}

int main(int argc, char **argv) {
    size_t base = argc > 1 ? strtoul(argv[1], NULL, 0) : 16;
    if (argc > 2) allocs = atol(argv[2]);
    if (argc > 3) only_n = atoi(argv[3]);
    if (base < sizeof(int) || allocs <= 0) return 2;
    int **arr = malloc(MAX_N * sizeof *arr);
    if (!arr) return 1;
    for (size = base; size <= 4 * base; size *= 2) {
        every_n(arr);
        pthread_t t;
        if (pthread_create(&t, NULL, on_thread, arr) || pthread_join(t, NULL)) return 1;
        every_n(arr);
    }
    free(arr);
    printf("%lu\n", sum);
    return 0;
}
