/* A step allocates nothing: malloc and friends are counted while steps run
 * (after a warm-up step, which lets the OpenMP runtime start its threads).
 *
 * With reference kernels the count must be exactly zero. With oneDNN GEMMs,
 * oneDNN's primitive execute builds a small argument map on every call (a
 * few heap blocks of a few dozen bytes, freed before it returns); those are
 * bounded here: each block small, and the heap does not grow.
 *
 * Blocks that libdnnl itself asks for (its return address lies in libdnnl's
 * file, found with dladdr) are counted apart and exempt from the size bound:
 * on a CPU without AVX-512, oneDNN 2.6's gemm:jit driver mallocs its packing
 * buffers (about 16 KiB) on every call and frees them before returning. That
 * is oneDNN's policy, not tessel's; an allocation made anywhere else during a
 * step still fails the test, and the heap must not grow either way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#if defined(__SANITIZE_ADDRESS__)
int main(void) {
    /* ASan owns malloc; interposing it here would break the sanitizer. The
     * plain build of this test is the one that proves the property. */
    printf("noalloc: skipped under AddressSanitizer\n");
    return 0;
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int counting;
static long n_allocs, live_bytes, n_dnnl;
static size_t largest, largest_dnnl;

static void raise_max(size_t *m, size_t n) {
    size_t cur = __atomic_load_n(m, __ATOMIC_RELAXED);
    while (n > cur &&
           !__atomic_compare_exchange_n(m, &cur, n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* Whether code at `ra` belongs to libdnnl (dladdr allocates nothing). */
static int in_libdnnl(void *ra) {
    Dl_info info;
    return ra && dladdr(ra, &info) && info.dli_fname && strstr(info.dli_fname, "libdnnl");
}

/* `ra`: the return address of the malloc call, i.e. the code that asked. */
static void *count(void *p, void *ra) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED)) {
        size_t n = malloc_usable_size(p);
        __atomic_add_fetch(&live_bytes, (long)n, __ATOMIC_RELAXED);
        if (in_libdnnl(ra)) {
            __atomic_add_fetch(&n_dnnl, 1, __ATOMIC_RELAXED);
            raise_max(&largest_dnnl, n);
        } else {
            __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
            raise_max(&largest, n);
        }
    }
    return p;
}
#define CALLER __builtin_return_address(0)
void *malloc(size_t n) {
    return count(__libc_malloc(n), CALLER);
}
void *calloc(size_t a, size_t b) {
    return count(__libc_calloc(a, b), CALLER);
}
void *realloc(void *p, size_t n) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED))
        __atomic_sub_fetch(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    return count(__libc_realloc(p, n), CALLER);
}
void free(void *p) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED))
        __atomic_sub_fetch(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    __libc_free(p);
}
int posix_memalign(void **p, size_t al, size_t n) {
    *p = count(__libc_memalign(al, n), CALLER);
    return *p ? 0 : 12;
}
void *aligned_alloc(size_t al, size_t n) {
    return count(__libc_memalign(al, n), CALLER);
}

static void run(const char *label, ts_graph *g, ts_val loss, int is_gpt, int reference) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = 1.0;
    ts_compile_options opt = ts_compile_options_default();
    opt.reference_kernels = reference;
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    if (!p) return;
    static int64_t tok[2 * 16];
    static float x[16 * 64], y[16];
    for (int i = 0; i < 32; i++) tok[i] = i % 64;
    for (int step = 0; step < 4; step++) {
        if (step == 1) __atomic_store_n(&counting, 1, __ATOMIC_RELAXED);
        if (is_gpt) {
            ts_plan_set_input(p, "tokens", tok, sizeof tok);
            ts_plan_set_input(p, "targets", tok, sizeof tok);
        } else {
            ts_plan_set_input(p, "x", x, sizeof x);
            ts_plan_set_input(p, "y", y, sizeof y);
        }
        CHECK_OK(ts_plan_step(p));
        (void)ts_plan_loss(p);
    }
    __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
    if (reference) {
        CHECK(n_allocs + n_dnnl == 0, "%s: %ld allocations during 3 steps", label,
              n_allocs + n_dnnl);
    } else {
        CHECK(live_bytes <= 0, "%s: the heap grew by %ld bytes during steps", label, live_bytes);
        CHECK(largest <= 4096, "%s: a %zu-byte allocation during a step", label, largest);
        printf("%s with oneDNN: %ld small allocations outside libdnnl in 3 steps (largest %zu "
               "bytes), %ld made by libdnnl itself (largest %zu bytes), no heap growth\n",
               label, n_allocs, largest, n_dnnl, largest_dnnl);
    }
    n_allocs = live_bytes = n_dnnl = 0;
    largest = largest_dnnl = 0;
    ts_plan_free(p);
}

int main(void) {
    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    run("mlp", g, m.loss, 0, 1);
    run("mlp", g, m.loss, 0, 0);
    ts_graph_free(g);
    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.1};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    run("gpt", g, m.loss, 1, 1);
    run("gpt", g, m.loss, 1, 0);
    ts_graph_free(g);
    /* The counter itself works: an allocation while counting is seen. */
    __atomic_store_n(&counting, 1, __ATOMIC_RELAXED);
    void *q = malloc(16);
    __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
    free(q);
    CHECK(n_allocs == 1 && n_dnnl == 0,
          "the allocation counter saw %ld allocations (%ld in libdnnl), expected 1 outside",
          n_allocs, n_dnnl);
    return check_summary("noalloc");
}
#endif
