/* Preloaded in front of libpagewise_secure.so: refuses every anonymous
 * read-write no-reserve mapping of exactly 256 KiB, the size of one
 * segment's bitmap in the hardened library's record of blocks handed out
 * (so that the hardened free falls back to the free key in the slot). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/mman.h>

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static void *(*real)(void *, size_t, int, int, int, off_t);
    if (!real)
        real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
    if (len == 256 << 10 && (flags & MAP_ANONYMOUS) && (flags & MAP_NORESERVE)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return real(addr, len, prot, flags, fd, off);
}
