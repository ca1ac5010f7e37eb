/* A step allocates nothing: malloc and friends are counted while steps run
 * (after a warm-up step, which lets the OpenMP runtime start its threads).
 *
 * With reference kernels the count must be exactly zero. With oneDNN GEMMs,
 * oneDNN's primitive execute builds a small argument map on every call (a
 * few heap blocks of a few dozen bytes, freed before it returns); those are
 * bounded here: each block small, and the heap does not grow. */
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
static long n_allocs, live_bytes;
static size_t largest;

static void *count(void *p) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED)) {
        size_t n = malloc_usable_size(p);
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&live_bytes, (long)n, __ATOMIC_RELAXED);
        size_t cur = __atomic_load_n(&largest, __ATOMIC_RELAXED);
        while (n > cur && !__atomic_compare_exchange_n(&largest, &cur, n, 0, __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {
        }
    }
    return p;
}
void *malloc(size_t n) { return count(__libc_malloc(n)); }
void *calloc(size_t a, size_t b) { return count(__libc_calloc(a, b)); }
void *realloc(void *p, size_t n) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED))
        __atomic_sub_fetch(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    return count(__libc_realloc(p, n));
}
void free(void *p) {
    if (p && __atomic_load_n(&counting, __ATOMIC_RELAXED))
        __atomic_sub_fetch(&live_bytes, (long)malloc_usable_size(p), __ATOMIC_RELAXED);
    __libc_free(p);
}
int posix_memalign(void **p, size_t al, size_t n) {
    *p = count(__libc_memalign(al, n));
    return *p ? 0 : 12;
}
void *aligned_alloc(size_t al, size_t n) { return count(__libc_memalign(al, n)); }

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
        CHECK(n_allocs == 0, "%s: %ld allocations during 3 steps", label, n_allocs);
    } else {
        CHECK(live_bytes <= 0, "%s: the heap grew by %ld bytes during steps", label, live_bytes);
        CHECK(largest <= 4096, "%s: a %zu-byte allocation during a step", label, largest);
        printf("%s with oneDNN: %ld small allocations inside oneDNN in 3 steps (largest %zu "
               "bytes), no heap growth\n",
               label, n_allocs, largest);
    }
    n_allocs = live_bytes = 0;
    largest = 0;
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
    CHECK(n_allocs == 1, "the allocation counter saw %ld allocations, expected 1", n_allocs);
    return check_summary("noalloc");
}
#endif
