/* dnnl_matmul_ksplit.c — a long-K transposed-A GEMM in oneDNN's one-thread order (see the header).
 */
#include "backends/cpu/dnnl_matmul_ksplit.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/half.h"

struct ts_mm_ksplit {
    ts_mm_desc d;
    ts_mm *blocks; /* [nblocks] products of TS_MM_KSPLIT_BLOCK rows of K each, batched */
    ts_mm *tail;   /* the last K % TS_MM_KSPLIT_BLOCK rows, or NULL */
    int64_t nblocks, ktail;
    size_t partial_bytes; /* (nblocks + (tail != NULL)) * M * N floats, 64-byte rounded */
    size_t sub_scratch;   /* the larger scratch of the two products */
    char impl[64];
};

int ts_mm_ksplit_wanted(const ts_mm_desc *d, int nthr) {
    if (!d || d->batch != 1 || !d->trans_a || d->trans_b || d->K < TS_MM_KSPLIT_MIN) return 0;
    /* oneDNN splits K when the threads outnumber its blocks of N (at most 64 wide for f32 and
     * bf16 on AVX-512, fewer for a narrow N): 64 gives the fewest blocks, so this errs towards
     * splitting here, which costs a pass over the partials but never changes a bit. */
    int64_t nblk = (d->N + 63) / 64;
    return (int64_t)nthr > nblk;
}

ts_status ts_mm_ksplit_create(const ts_mm_desc *d, const char *what, ts_mm_ksplit **out) {
    *out = NULL;
    ts_mm_ksplit *k = ts_zalloc(sizeof *k, "matmul K blocks");
    if (!k) {
        ts_error_prefix("%s", what);
        return TS_ERR_NOMEM;
    }
    k->d = *d;
    k->nblocks = d->K / TS_MM_KSPLIT_BLOCK;
    k->ktail = d->K % TS_MM_KSPLIT_BLOCK;
    /* The partials are f32 and carry no post-op: the sum below applies them once. */
    ts_mm_desc sub = {.a_dt = d->a_dt,
                      .b_dt = d->b_dt,
                      .c_dt = TS_F32,
                      .batch = k->nblocks,
                      .M = d->M,
                      .N = d->N,
                      .K = TS_MM_KSPLIT_BLOCK,
                      .trans_a = 1,
                      .label = d->label};
    ts_status s = ts_mm_create(&sub, &k->blocks);
    if (s == TS_OK && k->ktail) {
        sub.batch = 1;
        sub.K = k->ktail;
        s = ts_mm_create(&sub, &k->tail);
    }
    if (s != TS_OK) {
        ts_error_prefix("%s (in blocks of K)", what);
        ts_mm_ksplit_free(k);
        return s;
    }
    const int64_t nparts = k->nblocks + (k->tail != NULL);
    k->partial_bytes = TS_ALIGN_UP((size_t)(nparts * d->M * d->N) * sizeof(float), TS_ALIGN);
    k->sub_scratch = ts_mm_scratch_bytes(k->blocks);
    if (k->tail && ts_mm_scratch_bytes(k->tail) > k->sub_scratch)
        k->sub_scratch = ts_mm_scratch_bytes(k->tail);
    snprintf(k->impl, sizeof k->impl, "%.50s+ksplit", ts_mm_impl(k->blocks));
    *out = k;
    return TS_OK;
}

size_t ts_mm_ksplit_scratch_bytes(const ts_mm_ksplit *k) {
    /* 64 bytes to align the partials in a scratch of any alignment */
    return k ? 64 + k->partial_bytes + k->sub_scratch : 0;
}

const char *ts_mm_ksplit_impl(const ts_mm_ksplit *k) {
    return k ? k->impl : "";
}

static float load_c(const void *c, ts_dtype dt, int64_t i) {
    if (dt == TS_BF16) return ts_bf16_to_f32(((const uint16_t *)c)[i]);
    if (dt == TS_F16) return ts_f16_to_f32(((const uint16_t *)c)[i]);
    return ((const float *)c)[i];
}

static void store_c(void *c, ts_dtype dt, int64_t i, float v) {
    if (dt == TS_BF16)
        ((uint16_t *)c)[i] = ts_f32_to_bf16(v);
    else if (dt == TS_F16)
        ((uint16_t *)c)[i] = ts_f32_to_f16(v);
    else
        ((float *)c)[i] = v;
}

ts_status ts_mm_ksplit_run(ts_mm_ksplit *k, const void *a, const void *b, void *c,
                           const void *const *post, void *scratch) {
    const ts_mm_desc *d = &k->d;
    float *part = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    char *sub_scratch = k->sub_scratch ? (char *)part + k->partial_bytes : NULL;
    const int64_t MN = d->M * d->N;
    ts_status s = ts_mm_run(k->blocks, a, b, part, sub_scratch);
    if (s == TS_OK && k->tail) {
        /* A is stored [K, M] and B [K, N]: the tail rows follow the full blocks */
        const int64_t kfull = k->nblocks * TS_MM_KSPLIT_BLOCK;
        const char *at = (const char *)a + (size_t)(kfull * d->M) * ts_dtype_size(d->a_dt);
        const char *bt = (const char *)b + (size_t)(kfull * d->N) * ts_dtype_size(d->b_dt);
        s = ts_mm_run(k->tail, at, bt, part + k->nblocks * MN, sub_scratch);
    }
    if (s != TS_OK) return s;
    const int64_t nparts = k->nblocks + (k->tail != NULL);
    const int64_t N = d->N;
    /* Blocks in order, then C's old value (the sum post-op), then the adds: oneDNN's order. */
#pragma omp parallel for schedule(static) if (MN * nparts >= 65536)
    for (int64_t e = 0; e < MN; e++) {
        float v = part[e];
        for (int64_t p = 1; p < nparts; p++) v += part[p * MN + e];
        if (d->accumulate) v += load_c(c, d->c_dt, e);
        for (int q = 0; q < d->n_post; q++) {
            const float *o = post[q];
            v += d->post[q] == TS_MM_POST_BIAS ? o[e % N] : o[e];
        }
        store_c(c, d->c_dt, e, v);
    }
    return TS_OK;
}

void ts_mm_ksplit_free(ts_mm_ksplit *k) {
    if (!k) return;
    ts_mm_free(k->blocks);
    ts_mm_free(k->tail);
    free(k);
}
