/* The matmul wrapper's post-ops (backends/cpu/dnnl_matmul.c): a leading bias runs as oneDNN's
 * own bias argument, any other add as a binary post-op, and either way C is the plain product
 * (with C's old value first under accumulate) plus the adds in the descriptor's order, each
 * rounded in f32: bit for bit against that sum computed here from the product without
 * post-ops, for f32 and bf16 operands, transposes, a batch with B broadcast, and the bias
 * first, second, twice and under accumulate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "backends/cpu/dnnl_matmul.h"
#include "check.h"
#include "core/core.h"
#include "core/half.h"

static void *operand(int64_t n, ts_dtype dt, uint64_t key) {
    double *d = malloc((size_t)n * sizeof *d);
    void *raw = ts_aligned_alloc((size_t)n * ts_dtype_size(dt), "operand");
    if (!d || !raw) {
        free(d);
        ts_aligned_free(raw);
        return NULL;
    }
    ts_rand_uniform_f64(d, n, key, -1.0, 1.0);
    for (int64_t i = 0; i < n; i++) {
        if (dt == TS_BF16)
            ((uint16_t *)raw)[i] = ts_f32_to_bf16((float)d[i]);
        else
            ((float *)raw)[i] = (float)d[i];
    }
    free(d);
    return raw;
}

/* C of `d` (posts as given) against the product without posts plus the adds, in order. */
static void check_posts(ts_mm_desc d, const char *name) {
    if (d.a_dt != TS_F32 && !ts_cpu_supports_dtype_gemm(d.a_dt)) return;
    const int64_t nc = d.batch * d.M * d.N;
    const int64_t na = (d.a_broadcast ? 1 : d.batch) * d.M * d.K;
    const int64_t nb = (d.b_broadcast ? 1 : d.batch) * d.K * d.N;
    void *a = operand(na, d.a_dt, 1), *b = operand(nb, d.b_dt, 2);
    float *c0 = operand(nc, TS_F32, 3), *want = operand(nc, TS_F32, 4);
    float *got = operand(nc, TS_F32, 5);
    const void *post[4] = {0};
    for (int p = 0; p < d.n_post; p++)
        post[p] = operand(d.post[p] == TS_MM_POST_BIAS ? d.N : nc, TS_F32, 10 + (uint64_t)p);
    ts_mm_desc plain = d;
    plain.n_post = 0;
    ts_mm *m = NULL, *mp = NULL;
    CHECK(a && b && c0 && want && got, "%s: out of memory", name);
    CHECK_OK(ts_mm_create(&d, &m));
    CHECK_OK(ts_mm_create(&plain, &mp));
    size_t sb = ts_mm_scratch_bytes(m) > ts_mm_scratch_bytes(mp) ? ts_mm_scratch_bytes(m)
                                                                 : ts_mm_scratch_bytes(mp);
    void *scratch = sb ? ts_aligned_alloc(sb, "scratch") : NULL;
    if (m && mp && want && got) {
        memcpy(want, c0, (size_t)nc * 4);
        memcpy(got, c0, (size_t)nc * 4);
        CHECK_OK(ts_mm_run(mp, a, b, want, scratch));
        CHECK_OK(ts_mm_run_post(m, a, b, got, post, scratch));
        for (int p = 0; p < d.n_post; p++)
            for (int64_t i = 0; i < nc; i++)
                want[i] += ((const float *)post[p])[d.post[p] == TS_MM_POST_BIAS ? i % d.N : i];
        int64_t bad = 0;
        for (int64_t i = 0; i < nc; i++) bad += memcmp(&want[i], &got[i], 4) != 0;
        CHECK(bad == 0, "%s (%s): %lld of %lld elements differ from the product plus the adds",
              name, ts_mm_impl(m), (long long)bad, (long long)nc);
    }
    ts_mm_free(m);
    ts_mm_free(mp);
    ts_aligned_free(scratch);
    ts_aligned_free(a), ts_aligned_free(b), ts_aligned_free(c0), ts_aligned_free(want);
    ts_aligned_free(got);
    for (int p = 0; p < d.n_post; p++) ts_aligned_free((void *)post[p]);
}

int main(void) {
    enum { B = TS_MM_POST_BIAS, A = TS_MM_POST_ADD };
    static const struct {
        int n, post[4], accumulate;
    } lists[] = {{1, {B}, 0},       {2, {B, A}, 0}, {2, {A, B}, 0},
                 {3, {B, A, B}, 0}, {1, {B}, 1},    {2, {B, A}, 1}};
    static const struct {
        int64_t batch, M, N, K;
        int ta, tb, b_broadcast;
    } shapes[] = {{1, 64, 96, 80, 0, 1, 0},    {1, 37, 51, 600, 0, 0, 0},
                  {1, 33, 47, 129, 1, 0, 0},   {3, 17, 40, 24, 0, 1, 1},
                  {2, 9, 23, 31, 0, 0, 0},     {1, 256, 512, 512, 0, 1, 0},
                  {1, 128, 1536, 512, 0, 1, 0}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (size_t l = 0; l < sizeof lists / sizeof *lists; l++) {
                const ts_dtype t = dt ? TS_BF16 : TS_F32;
                ts_mm_desc d = {.a_dt = t,
                                .b_dt = t,
                                .c_dt = TS_F32,
                                .batch = shapes[s].batch,
                                .M = shapes[s].M,
                                .N = shapes[s].N,
                                .K = shapes[s].K,
                                .trans_a = shapes[s].ta,
                                .trans_b = shapes[s].tb,
                                .b_broadcast = shapes[s].b_broadcast,
                                .accumulate = lists[l].accumulate,
                                .n_post = lists[l].n,
                                .label = "bias"};
                memcpy(d.post, lists[l].post, sizeof d.post);
                char name[128];
                snprintf(name, sizeof name, "%s %lldx%lldx%lldx%lld ta=%d tb=%d bb=%d list %zu",
                         ts_dtype_name(t), (long long)d.batch, (long long)d.M, (long long)d.N,
                         (long long)d.K, d.trans_a, d.trans_b, d.b_broadcast, l);
                check_posts(d, name);
            }
    return check_summary("unit/dnnl_matmul_bias");
}
