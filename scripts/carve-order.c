/* What the order in which an OS page's slots are written costs, with the
 * same writes: every slot of every 4 KiB page of a 512 MiB buffer (huge
 * pages asked for, faulted in first) written whole, pages in address
 * order, the slots of each page in one of four orders; the four in turn,
 * 15 rounds, and the time of each over address order's in its round
 * (median and quartiles). Order 1 is a meshing heap's carve: from a slot
 * drawn from the address, in address order, wrapping round once.
 *
 *   cc -O2 scripts/carve-order.c -o /tmp/carve-order
 *   /tmp/carve-order 256     # slot size in bytes, dividing 4096
 *
 * Orders: 0 address order; 1 s..n-1 then 0..s-1; 2 s..n-1 then s-1 down
 * to 0; 3 s down to 0, then n-1 down to s+1.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ROUNDS 15

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t order(int mode, size_t i, size_t s, size_t n) {
    switch (mode) {
    case 0: return i;
    case 1: return s + i < n ? s + i : s + i - n;
    case 2: return i < n - s ? s + i : s - 1 - (i - (n - s));
    default: return i <= s ? s - i : n - 1 - (i - s - 1);
    }
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
    size_t size = 512ul << 20;
    size_t slot = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    if (slot < 16 || 4096 % slot) {
        fprintf(stderr, "slot size: 16 to 4096, dividing 4096\n");
        return 2;
    }
    char *b = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 1;
    madvise(b, size, MADV_HUGEPAGE);
    memset(b, 1, size);
    size_t n = 4096 / slot;
    double t[4][ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        for (int m = 0; m < 4; m++) {
            double t0 = now();
            for (size_t p = 0; p < size; p += 4096) {
                size_t s = ((p * 0x9e3779b97f4a7c15ull) >> 40) % n;
                if (s == 0) s = 1;
                for (size_t i = 0; i < n; i++)
                    memset(b + p + order(m, i, s, n) * slot, r + m, slot);
            }
            t[m][r] = now() - t0;
        }
    for (int m = 1; m < 4; m++) {
        double v[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) v[r] = t[m][r] / t[0][r];
        qsort(v, ROUNDS, sizeof v[0], cmp);
        printf("slot %zu, order %d: time over address order's, median %.3f (quartiles %.3f-%.3f)\n",
               slot, m, v[ROUNDS / 2], v[ROUNDS / 4], v[3 * ROUNDS / 4]);
    }
    return 0;
}
