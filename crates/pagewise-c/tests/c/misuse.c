/* One kind of heap misuse per run, at one size, then a line saying the
 * program is still running: `misuse KIND SIZE`. Run under each allocator
 * (tests/secure.rs), the line shows which of them let the program go on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* The compiler must not see through the misuse and drop it. */
static void *volatile sink;

static void *free_it(void *p) {
    free(p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    const char *kind = argv[1];
    size_t n = strtoul(argv[2], 0, 10);
    char *p = malloc(n);
    sink = p;
    memset(p, 'a', n);
    if (!strcmp(kind, "overflow-1")) {
        p[n] = 0;
        free(p);
    } else if (!strcmp(kind, "overflow-32")) {
        memset(p + n, 'x', 32);
        free(p);
    } else if (!strcmp(kind, "overflow-memcpy")) {
        char src[64];
        memset(src, 'y', sizeof src);
        memcpy(p + n - 8, src, 24);
        free(p);
    } else if (!strcmp(kind, "memcpy-far") || !strcmp(kind, "memmove-far") ||
               !strcmp(kind, "memset-far")) {
        /* 70,000 bytes from the block's last 8: past the end of any slot,
         * span or run the block sits in. */
        static char src[70008];
        if (kind[3] == 'c')
            memcpy(p + n - 8, src, sizeof src);
        else if (kind[3] == 'm')
            memmove(p + n - 8, src, sizeof src);
        else
            memset(p + n - 8, 'z', sizeof src);
        printf("copied\n");
        fflush(stdout);
        free(p);
    } else if (!strcmp(kind, "memcpy-near") || !strcmp(kind, "memset-near")) {
        /* A short write across the end of a 16-byte slot (a block of up
         * to 15 bytes): 8 bytes from the slot's 13th byte on. */
        char src[8];
        memset(src, 'y', sizeof src);
        if (kind[3] == 'c')
            memcpy(p + 12, src, sizeof src);
        else
            memset(p + 12, 'z', sizeof src);
        printf("copied\n");
        fflush(stdout);
        free(p);
    } else if (!strcmp(kind, "zero-write")) {
        /* A zero-byte block written (its size is the argument's, 0). */
        p[0] = 'z';
        free(p);
    } else if (!strcmp(kind, "underflow-1")) {
        /* The byte before the block: the previous block's end, or the
         * allocator's own bytes. Of two new blocks, the one at the higher
         * address: the block before it is one of the three (an allocator
         * that hands out an OS page's slots from a random one on, wrapping
         * round, may put the first of them at the page's start, where what
         * lies before may be memory no slot was carved from yet). */
        char *q = malloc(n), *r = malloc(n);
        char *b = r > q ? r : q;
        sink = q;
        b[-1] = 0;
        free(b);
        free(b == r ? q : r);
        free(p);
    } else if (!strcmp(kind, "underflow-realloc")) {
        /* As underflow-1, then the block grown by realloc, which moves it
         * and frees it where it was. */
        char *q = malloc(n), *r = malloc(n);
        char *b = r > q ? r : q;
        sink = q;
        b[-1] = 0;
        char *moved = realloc(b, 2 * n + 100);
        sink = moved;
        free(b == r ? q : r);
        free(moved);
        free(p);
    } else if (!strcmp(kind, "double-free")) {
        free(p);
        free(p);
    } else if (!strcmp(kind, "double-free-later")) {
        char *q = malloc(n);
        sink = q;
        free(p);
        free(q);
        free(p);
    } else if (!strcmp(kind, "double-free-written")) {
        /* A write after free over the block's first 16 bytes (all of a
         * 16-byte slot), then the second free. */
        free(p);
        memset(p, 'x', 16);
        free(p);
    } else if (!strcmp(kind, "double-free-end-written")) {
        /* A write after free over the block's bytes past its first 16
         * and the 8 after them (its free key kept; the end of its slot,
         * where a free slot's tail word lies, overwritten: sizes 8 bytes
         * short of a slot), then the second free. */
        free(p);
        memset(p + 16, 'x', n + 8 - 16);
        free(p);
    } else if (!strcmp(kind, "double-free-rewritten-later") ||
               !strcmp(kind, "double-free-rewritten-thread")) {
        /* A write after free over the block's bytes (16 at least: all of
         * a 16-byte slot), then the second free: after 40 other frees
         * (past any quarantine; their blocks allocated before, so that
         * none of them is this one again), or by another thread. */
        char *v[40];
        for (int i = 0; i < 40; i++)
            sink = v[i] = malloc(n);
        free(p);
        for (int i = 0; i < 40; i++)
            free(v[i]);
        memset(p, 'x', n < 16 ? 16 : n);
        if (kind[22] == 't') {
            pthread_t t;
            pthread_create(&t, 0, free_it, p);
            pthread_join(t, 0);
        } else {
            free(p);
        }
    } else if (!strcmp(kind, "write-after-free")) {
        free(p);
        p[n / 2] = 'w';
        /* Enough frees for the block to leave a quarantine, and the
         * allocations that would hand it out again. */
        for (int i = 0; i < 40; i++) {
            void *x = malloc(n);
            sink = x;
            free(x);
        }
    } else if (!strcmp(kind, "read-after-free")) {
        free(p);
        char *q = malloc(n);
        sink = q;
        /* The last owner's bytes seen by the next owner. */
        if (q == p && n > 32 && q[n - 9] == 'a')
            printf("stale data\n");
    } else if (!strcmp(kind, "read-after-quarantine")) {
        /* The freed block handed out again, past any quarantine: is the
         * last owner's data there? */
        free(p);
        for (int i = 0; i < 100; i++) {
            char *q = malloc(n);
            sink = q;
            if (q == p) {
                printf("reused\n");
                if (n > 32 && q[n - 9] == 'a')
                    printf("stale data\n");
            }
            free(q);
        }
    } else if (!strcmp(kind, "invalid-free")) {
        free(p + 8);
    } else {
        return 2;
    }
    printf("still running\n");
    return 0;
}
