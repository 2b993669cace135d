/*
 * pagewise.h: the C interface of libpagewise.so / libpagewise.a.
 *
 * Use it as the process allocator without recompiling:
 *     LD_PRELOAD=/path/to/libpagewise.so ./program
 * or link it: cc prog.c -L/path/to -lpagewise   (then malloc/free are pagewise's).
 * Do not dlopen() it: memory that glibc's malloc handed out before would then
 * be freed by pagewise, which aborts on pointers it did not allocate.
 *
 * The standard functions below keep glibc's semantics:
 *  - every function returns NULL and sets errno = ENOMEM when memory is short
 *    or a size is impossible (above PTRDIFF_MAX, or n * size overflows);
 *  - malloc(0) returns a unique non-NULL pointer (freed as usual);
 *  - malloc results are aligned to 16 bytes (alignof(max_align_t));
 *  - realloc(NULL, n) == malloc(n); realloc(p, 0) frees p and returns NULL;
 *    a failed realloc returns NULL and leaves p valid and unchanged;
 *  - posix_memalign returns EINVAL when align is not a power of two multiple
 *    of sizeof(void *), ENOMEM when memory is short, and leaves errno alone;
 *  - aligned_alloc sets EINVAL for an alignment that is not a power of two;
 *    memalign rounds such an alignment up to the next power of two.
 *
 * C++: every form of operator new and operator delete (plain, array, nothrow,
 * sized, aligned) is exported under its Itanium name; throwing new calls the
 * std::new_handler and throws std::bad_alloc, nothrow new returns NULL
 * (docs/guide/c-library.md).
 *
 * Bad input: free(), realloc() or malloc_usable_size() of a pointer pagewise
 * did not allocate, of a pointer inside (not at the start of) a block, or a
 * detected double free aborts the process with one line on stderr naming the
 * problem and the address ("pagewise: double free ...: 0x..."). Continuing
 * after a corrupting free turns a clear bug into a mysterious one.
 *
 * Environment (read once, when the library loads; an empty value is no
 * value; booleans are 1, true, yes, on or 0, false, no, off; sizes accept
 * 64M, 64MB, 64MiB, 1.5G). A malformed value, an unknown PAGEWISE_CONF key
 * and a PAGEWISE_* variable that is not below (a misspelling) each print
 * one line on stderr naming it and what is accepted, once per process, and
 * the default is used. Names starting with PAGEWISE_TEST_ are not checked.
 *
 * Policy (also as PAGEWISE_CONF keys, and pagewise_option_get/set names):
 *   PAGEWISE_CONF=decay_ms:500,retain_max:32M   all settings in one string
 *                              (keys: decay_ms, retain_max, limit, purge,
 *                              background, reserve, mesh, thp)
 *   PAGEWISE_DECAY_MS=1000     ms a freed span stays committed before purging
 *                              (-1: never)
 *   PAGEWISE_RETAIN_MAX=64M    committed free bytes the whole process keeps
 *                              (all threads together; default: as demand
 *                              says, no fixed ceiling)
 *   PAGEWISE_LIMIT=512M        hard limit on committed bytes (all threads
 *                              together): an allocation past it returns NULL
 *                              with errno = ENOMEM; the first one refused
 *                              prints one line (the limit, what is committed)
 *   PAGEWISE_PURGE=dontneed    or "free" (MADV_FREE)
 *   PAGEWISE_BACKGROUND=1      a background thread purges idle memory
 *   PAGEWISE_RESERVE=1G        address space mapped at a time (at least 32M)
 *   PAGEWISE_MESH=0            1: mesh sparse pages (Linux; opt-in)
 *   PAGEWISE_THP=auto          2 MiB huge pages where the heap is dense (Linux);
 *                              "never" asks for none, "always" from the start
 * Reports:
 *   PAGEWISE_STATS=1           print pagewise_stats_print(2) at exit
 *   PAGEWISE_STATS_FILE=path   write the JSON report there at exit instead
 *                              ("%p" in the path is replaced by the pid)
 *   PAGEWISE_STATS_SIGNAL=SIGUSR2  also a report each time the signal comes
 *                              (SIGUSR1, SIGUSR2, SIGHUP, a real-time number)
 *   PAGEWISE_STATS_INTERVAL_MS=1000  also a report every N ms
 * Heap profile and guard pages:
 *   PAGEWISE_PROF=1            sample allocations by call site (heap profile)
 *   PAGEWISE_PROF_SAMPLE=512K  mean bytes between samples (0: off)
 *   PAGEWISE_PROF_FILE=path    write the heap profile there at exit and on
 *                              PAGEWISE_STATS_SIGNAL ("%p": the pid)
 *   PAGEWISE_GUARD_SAMPLE=0    about 1 allocation in N (of at most a page)
 *                              between guard pages (0: off)
 *   PAGEWISE_GUARD_SLOTS=64    guarded blocks alive at once (1 to 16384)
 * Used by `pagewise run`:
 *   PAGEWISE_SAMPLE_FILE=path  append "ms rss live committed" lines while the
 *   PAGEWISE_SAMPLE_MS=50      program runs (used by `pagewise run --plot`)
 *   PAGEWISE_SAMPLE_PARENT=pid only sample in a process whose parent is pid
 *   PAGEWISE_LIB=path          the library `pagewise run` preloads
 * Testing aids:
 *   PAGEWISE_OS_PAGE=16K       treat 16K or 64K as the OS page
 *   PAGEWISE_PERTURB=64        the perturbation build's rate (at least 8)
 */
#ifndef PAGEWISE_H
#define PAGEWISE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The glibc malloc family (also declared by <stdlib.h> and <malloc.h>). */
void *malloc(size_t size);
void free(void *ptr);
void *calloc(size_t n, size_t size);
void *realloc(void *ptr, size_t size);
void *reallocarray(void *ptr, size_t n, size_t size);
int posix_memalign(void **out, size_t align, size_t size);
void *aligned_alloc(size_t align, size_t size);
void *memalign(size_t align, size_t size);
void *valloc(size_t size);
void *pvalloc(size_t size);
size_t malloc_usable_size(void *ptr);
/* Gives back everything pagewise retains (pad is ignored); returns 1. */
int malloc_trim(size_t pad);
/* glibc's __libc_malloc, __libc_free, __libc_calloc, __libc_realloc,
 * __libc_memalign, __libc_valloc, __libc_pvalloc and cfree are exported too
 * (the functions above under glibc's other names). */
/* C23: free a block with the size it was allocated with (checked by debug
 * builds of the library: a larger size aborts). */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t align, size_t size);
/* The usable size malloc(size) would get: its size class;
 * malloc_usable_size(malloc(n)) == malloc_good_size(n) == nallocx(n, 0). */
size_t malloc_good_size(size_t size);

/* jemalloc's interface, so that a program built for jemalloc (linked with
 * libjemalloc, or calling these through dlsym) sees pagewise's figures
 * (docs/guide/observing-memory.md tables each name and figure). None of them allocates.
 *
 * mallctl: the names epoch, version, stats.allocated, stats.active,
 * stats.metadata, stats.resident, stats.mapped, stats.retained,
 * arenas.narenas (1), arenas.page, arenas.dirty_decay_ms (pagewise's
 * decay_ms, read and written), opt.dirty_decay_ms, opt.background_thread,
 * background_thread (pagewise's background: fixed at start, EPERM to change),
 * arena.<i>.purge (pagewise_trim), and thread.allocated and
 * thread.deallocated (uint64_t: bytes the calling thread allocated and
 * freed; not their p forms), with jemalloc's convention: a value is
 * read when oldp and oldlenp are both non-NULL (*oldlenp must be its size:
 * EINVAL otherwise, with what fits copied and *oldlenp set to it), written
 * when newp is non-NULL (newlen must be its size: EINVAL); EPERM to write a
 * read-only name; ENOENT for every other name. The stats.* figures are
 * those of the last write to epoch, as in jemalloc: write epoch first. */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
int mallctlnametomib(const char *name, size_t *mibp, size_t *miblenp);
int mallctlbymib(const size_t *mib, size_t miblen, void *oldp, size_t *oldlenp,
                 void *newp, size_t newlen);
/* pagewise's report (pagewise_stats_print's text; its JSON document when
 * opts contains 'J') handed to write_cb(cbopaque, text) in NUL-terminated
 * pieces of up to 1 KiB, or to stderr when write_cb is NULL. No pagewise
 * lock is held while write_cb runs (it may allocate). */
void malloc_stats_print(void (*write_cb)(void *, const char *), void *cbopaque,
                        const char *opts);
/* The allocation functions with flags: the alignment's base-2 logarithm in
 * the low 6 bits (0: malloc's 16), MALLOCX_ZERO for zeroed memory; the
 * thread-cache and arena bits are ignored. mallocx returns NULL with
 * errno = ENOMEM on failure; rallocx too, leaving ptr untouched (with
 * MALLOCX_ZERO the bytes past the old usable size are zero); xallocx
 * resizes in place only, to between size and size + extra bytes when it can
 * (blocks of 256 KiB to 32 MiB of the calling thread), and returns the usable
 * size after; nallocx is the usable size mallocx(size, flags) would give,
 * 0 for an impossible request; sallocx is malloc_usable_size. */
#ifndef MALLOCX_ZERO
#define MALLOCX_LG_ALIGN(la) ((int)(la))
#define MALLOCX_ALIGN(a) ((int)(__builtin_ffsll((long long)(a)) - 1))
#define MALLOCX_ZERO ((int)0x40)
#endif
void *mallocx(size_t size, int flags);
void *rallocx(void *ptr, size_t size, int flags);
size_t xallocx(void *ptr, size_t size, size_t extra, int flags);
size_t sallocx(const void *ptr, int flags);
void dallocx(void *ptr, int flags);
void sdallocx(void *ptr, size_t size, int flags);
size_t nallocx(size_t size, int flags);

/* Gives back to the OS all the free memory pagewise retains: empty pages,
 * retained spans, cached huge blocks, wholly free segments. */
void pagewise_trim(void);

/* Writes the heap profile (with PAGEWISE_PROF=1: the sampled call sites,
 * their live, peak and allocated bytes, and the module map) to path, in
 * the text form docs/guide/heap-profiler.md describes. 0 on success, -1 if the file
 * could not be written. Does not allocate. */
int pagewise_prof_dump(const char *path);

/* Writes a human-readable report of the allocator's state (live bytes,
 * where every committed byte is, syscall counts, RSS from /proc) to fd.
 * Does not allocate. */
void pagewise_stats_print(int fd);

/* Writes the allocator's state as one JSON object into buf (len bytes;
 * NUL-terminated whenever len > 0, truncated if it does not fit). Returns
 * the length of the whole document, like snprintf: if the result is >= len,
 * call again with a buffer of at least result + 1 bytes. buf may be NULL
 * when len is 0. Does not allocate. */
size_t pagewise_stats_json(char *buf, size_t len);

/* Options at run time: decay_ms, retain_max, limit, reserve (changeable),
 * purge, background, mesh, thp (fixed at start; thp reads 0 auto, 1 never,
 * 2 always). get returns -1 for none/never
 * (and -1 with errno = EINVAL for an unknown name); set parses value as the
 * PAGEWISE_* variable and returns 0, EINVAL (unknown, malformed, refused)
 * or EPERM (fixed at start); it prints nothing. */
long long pagewise_option_get(const char *name);
int pagewise_option_set(const char *name, const char *value);

/* Embedded defaults: a program may define
 *     const char *pagewise_conf = "decay_ms:500,retain_max:32M";
 * (exported: automatic when linked with -lpagewise, -rdynamic when only
 * preloaded). Precedence: defaults < pagewise_conf < PAGEWISE_CONF <
 * PAGEWISE_* variables. */

#ifdef __cplusplus
}
#endif

#endif /* PAGEWISE_H */
