/* The large-buffer churn: 20 live buffers of 5-25 MiB; 2,000 times
 * one at random is freed and replaced by a new buffer of a random size,
 * which is written whole. Run under LD_PRELOAD of each allocator with
 * `/usr/bin/time -v` (max RSS, minor faults):
 *
 *   cc -O2 -o /tmp/buffer_churn crates/pagewise-c/bench/buffer_churn.c
 *   LD_PRELOAD=target/release/libpagewise.so /usr/bin/time -v /tmp/buffer_churn
 *
 * Deterministic (a fixed xorshift seed), so every allocator sees the same
 * sequence of sizes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    enum { N = 20 };
    const size_t lo = 5u << 20, hi = 25u << 20;
    char *buf[N];
    size_t size[N];
    for (int i = 0; i < N; i++) {
        size[i] = lo + next() % (hi - lo);
        buf[i] = malloc(size[i]);
        if (!buf[i]) return 1;
        memset(buf[i], i, size[i]);
    }
    uint64_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        int i = (int)(next() % N);
        free(buf[i]);
        size[i] = lo + next() % (hi - lo);
        buf[i] = malloc(size[i]);
        if (!buf[i]) return 1;
        memset(buf[i], r, size[i]);
        sum += (unsigned char)buf[i][size[i] / 2];
    }
    size_t live = 0;
    for (int i = 0; i < N; i++) {
        live += size[i];
        free(buf[i]);
    }
    printf("checksum %llu, live at end %zu MiB\n", (unsigned long long)sum, live >> 20);
    return 0;
}
