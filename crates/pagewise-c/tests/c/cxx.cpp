/*
 * C++ operator new and delete in every form, under LD_PRELOAD.
 *
 *   cxx pagewise   every form resolves to libpagewise.so and serves pagewise
 *                  memory; failure semantics (new handler, bad_alloc, nothrow);
 *                  run with PAGEWISE_LIMIT=64M
 *   cxx glibc      the standard-semantics checks alone, against libstdc++
 *
 * Prints "cxx: all ok" and exits 0 on success; on a failed check prints
 * the line and exits 1.
 */
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>
#include <string>
#include <vector>

static int failures;
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "cxx.cpp:%d: check failed: %s\n", __LINE__, #cond); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static bool aligned(void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* Too big for any allocator: fails without touching memory. */
static volatile size_t impossible = (size_t)PTRDIFF_MAX + 1;

static const char *const names[] = {
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t", "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

/* Every operator resolves to libpagewise.so, not libstdc++. */
static void resolved_to_pagewise(void) {
    for (const char *name : names) {
        void *sym = dlsym(RTLD_DEFAULT, name);
        Dl_info info;
        bool ok = sym && dladdr(sym, &info) && info.dli_fname &&
                  strstr(info.dli_fname, "libpagewise") != nullptr;
        if (!ok) fprintf(stderr, "cxx: %s does not resolve to libpagewise.so\n", name);
        CHECK(ok);
    }
}

static long live_allocations(void) {
    auto json = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "pagewise_stats_json");
    if (!json) return -1;
    static char buf[1 << 16];
    json(buf, sizeof buf);
    const char *key = "\"live_allocations\":";
    const char *p = strstr(buf, key);
    return p ? atol(p + strlen(key)) : -1;
}

/* Each form, called explicitly, with the block checked and written. */
static void every_form(bool pagewise) {
    const size_t n = 100;
    void *blocks[12];
    int k = 0;
    blocks[k++] = ::operator new(n);
    blocks[k++] = ::operator new[](n);
    blocks[k++] = ::operator new(n, std::nothrow);
    blocks[k++] = ::operator new[](n, std::nothrow);
    blocks[k++] = ::operator new(n, std::align_val_t(64));
    blocks[k++] = ::operator new[](n, std::align_val_t(4096));
    blocks[k++] = ::operator new(n, std::align_val_t(1 << 21), std::nothrow);
    blocks[k++] = ::operator new[](n, std::align_val_t(256), std::nothrow);
    blocks[k++] = ::operator new(0);
    blocks[k++] = ::operator new[](0);
    blocks[k++] = ::operator new(3 << 20);                          /* large */
    blocks[k++] = ::operator new(40u << 20, std::align_val_t(1 << 22)); /* huge */
    const size_t aligns[] = {16, 16, 16, 16, 64, 4096, 1 << 21, 256, 16, 16, 16, 1 << 22};
    const size_t least[] = {n, n, n, n, n, n, n, n, 0, 0, 3u << 20, 40u << 20};
    long before = pagewise ? live_allocations() : 0;
    for (int i = 0; i < k; i++) {
        CHECK(blocks[i] != nullptr && aligned(blocks[i], aligns[i]));
        /* A pagewise block: malloc_usable_size of pagewise's library knows it
         * (a foreign pointer would abort the process). */
        if (pagewise) CHECK(malloc_usable_size(blocks[i]) >= least[i]);
        if (i < 8) memset(blocks[i], 0x5a, n);
    }
    if (pagewise) CHECK(before >= k);
    ::operator delete(blocks[0]);
    ::operator delete[](blocks[1], n);
    ::operator delete(blocks[2], std::nothrow);
    ::operator delete[](blocks[3], std::nothrow);
    ::operator delete(blocks[4], n, std::align_val_t(64));
    ::operator delete[](blocks[5], std::align_val_t(4096));
    ::operator delete(blocks[6], std::align_val_t(1 << 21), std::nothrow);
    ::operator delete[](blocks[7], std::align_val_t(256), std::nothrow);
    ::operator delete(blocks[8], (size_t)0);
    ::operator delete[](blocks[9], (size_t)0);
    ::operator delete(blocks[10], (size_t)(3 << 20));
    ::operator delete(blocks[11], 40u << 20, std::align_val_t(1 << 22));
    /* The rest of the forms: unsized aligned delete, sized aligned array. */
    void *a = ::operator new(48, std::align_val_t(128));
    ::operator delete(a, std::align_val_t(128));
    void *b = ::operator new[](48, std::align_val_t(128));
    ::operator delete[](b, 48, std::align_val_t(128));
    void *c = ::operator new(48);
    ::operator delete(c, (size_t)48);
    void *d = ::operator new(48, std::align_val_t(32), std::nothrow);
    ::operator delete(d, std::align_val_t(32), std::nothrow);
    void *e = ::operator new[](48, std::align_val_t(32), std::nothrow);
    ::operator delete[](e, std::align_val_t(32), std::nothrow);
    /* Null is ignored by every delete. */
    ::operator delete(nullptr);
    ::operator delete[](nullptr);
    ::operator delete(nullptr, std::align_val_t(64));
    if (pagewise) CHECK(live_allocations() <= before - k + 4);
}

/* Ordinary C++: containers, strings, polymorphic objects, over-aligned types. */
struct alignas(64) Wide { char x[64]; };
struct Base { virtual ~Base() {} virtual int f() { return 1; } };
struct Derived : Base { std::string s = std::string(1000, 'd'); int f() override { return 2; } };

static void ordinary(void) {
    std::vector<std::string> v;
    for (int i = 0; i < 10000; i++) v.push_back(std::string((size_t)(i % 300), 'x'));
    size_t total = 0;
    for (auto &s : v) total += s.size();
    CHECK(total > 0);
    Base *b = new Derived;
    CHECK(b->f() == 2);
    delete b;
    Wide *w = new Wide[10];
    CHECK(aligned(w, 64));
    delete[] w;
    Wide *one = new Wide;
    CHECK(aligned(one, 64));
    delete one;
}

/* ----- failure: the new handler, then std::bad_alloc ----------------------- */

static int handler_calls;
static void counting_handler() {
    /* Gives up on the third call: the loop then throws bad_alloc. */
    if (++handler_calls == 3) std::set_new_handler(nullptr);
}
static void throwing_handler() {
    handler_calls++;
    throw std::bad_alloc();
}
static void *reserve;
static void releasing_handler() {
    handler_calls++;
    ::operator delete(reserve);
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

static void failures_throw(bool pagewise) {
    /* No handler: bad_alloc. */
    bool caught = false;
    try {
        void *p = ::operator new(impossible);
        ::operator delete(p);
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    CHECK(caught);
    caught = false;
    try {
        void *p = ::operator new[](impossible, std::align_val_t(64));
        ::operator delete[](p, std::align_val_t(64));
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    CHECK(caught);

    /* The handler is called until it uninstalls itself. */
    handler_calls = 0;
    caught = false;
    std::set_new_handler(counting_handler);
    try {
        void *p = ::operator new(impossible);
        ::operator delete(p);
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    CHECK(caught && handler_calls == 3);
    CHECK(std::get_new_handler() == nullptr);

    /* A handler that throws: the exception reaches the caller. */
    handler_calls = 0;
    caught = false;
    std::set_new_handler(throwing_handler);
    try {
        void *p = ::operator new[](impossible);
        ::operator delete[](p);
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    CHECK(caught && handler_calls == 1);

    /* nothrow: null, and the handler is not called (pagewise's choice; the
     * handler installed above would throw). */
    handler_calls = 0;
    if (pagewise) {
        CHECK(::operator new(impossible, std::nothrow) == nullptr);
        CHECK(::operator new[](impossible, std::nothrow) == nullptr);
        CHECK(::operator new(impossible, std::align_val_t(64), std::nothrow) == nullptr);
        CHECK(::operator new[](impossible, std::align_val_t(64), std::nothrow) == nullptr);
        CHECK(handler_calls == 0);
        /* An alignment that is not a power of two: null, or bad_alloc at once. */
        CHECK(::operator new(64, std::align_val_t(48), std::nothrow) == nullptr);
        CHECK(::operator new[](64, std::align_val_t(3), std::nothrow) == nullptr);
        caught = false;
        try {
            void *p = ::operator new(64, std::align_val_t(48));
            ::operator delete(p, std::align_val_t(48));
        } catch (const std::bad_alloc &) {
            caught = true;
        }
        CHECK(caught && handler_calls == 0);
    }
    std::set_new_handler(nullptr);

    /* Under PAGEWISE_LIMIT=64M: a 40 MiB reserve leaves no room for 40 MiB
     * more; the handler frees the reserve and the retry succeeds. */
    if (pagewise) {
        reserve = ::operator new(40u << 20);
        memset(reserve, 1, 40u << 20);
        handler_calls = 0;
        std::set_new_handler(releasing_handler);
        void *p = nullptr;
        try {
            p = ::operator new(40u << 20);
        } catch (const std::bad_alloc &) {
        }
        CHECK(p != nullptr && handler_calls == 1 && reserve == nullptr);
        ::operator delete(p);
        std::set_new_handler(nullptr);
    }
}

int main(int argc, char **argv) {
    bool pagewise = argc > 1 && !strcmp(argv[1], "pagewise");
    if (pagewise) resolved_to_pagewise();
    every_form(pagewise);
    ordinary();
    failures_throw(pagewise);
    if (failures) {
        fprintf(stderr, "cxx: %d checks failed\n", failures);
        return 1;
    }
    printf("cxx: all ok\n");
    return 0;
}
