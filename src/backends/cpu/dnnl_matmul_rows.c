/* dnnl_matmul_rows.c — a GEMM as parallel one-thread products over row blocks (see the header). */
#include "backends/cpu/dnnl_matmul_rows.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

struct ts_mm_rows {
    ts_mm_desc d;
    int n;                                   /* blocks (the plan's thread count) */
    int64_t row0[TS_MM_ROWS_MAX_BLOCKS + 1]; /* block t: rows [row0[t], row0[t + 1]) */
    ts_mm *blk[TS_MM_ROWS_MAX_BLOCKS];
    size_t scratch_off[TS_MM_ROWS_MAX_BLOCKS + 1]; /* block t's slice of the scratch */
    size_t copy_off[TS_MM_ROWS_MAX_BLOCKS];        /* in it: its columns of a transposed A */
    char impl[64];
};

int ts_mm_rows_wanted(const ts_mm_desc *d, int nthr) {
    return d && nthr > 1 && nthr <= TS_MM_ROWS_MAX_BLOCKS && d->batch == 1 && d->M >= nthr;
}

ts_status ts_mm_rows_create(const ts_mm_desc *d, int nthr, const char *what, ts_mm_rows **out) {
    *out = NULL;
    if (!ts_mm_rows_wanted(d, nthr))
        return ts_fail(TS_ERR_INTERNAL, "%s: cannot split into %d row blocks", what, nthr);
    ts_mm_rows *r = ts_zalloc(sizeof *r, "matmul row blocks");
    if (!r) {
        ts_error_prefix("%s", what);
        return TS_ERR_NOMEM;
    }
    r->d = *d;
    r->n = nthr;
    /* The blocks are one-thread products: created under one thread (oneDNN fixes it then). */
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    ts_status s = TS_OK;
    for (int t = 0; t <= nthr; t++) r->row0[t] = d->M * t / nthr;
    for (int t = 0; t < nthr && s == TS_OK; t++) {
        ts_mm_desc sub = *d;
        sub.M = r->row0[t + 1] - r->row0[t];
        s = ts_mm_create(&sub, &r->blk[t]);
        if (s == TS_OK) s = ts_mm_own_stream(r->blk[t]);
        r->copy_off[t] = r->scratch_off[t] + TS_ALIGN_UP(ts_mm_scratch_bytes(r->blk[t]), TS_ALIGN);
        const size_t copy = d->trans_a ? (size_t)(d->K * sub.M) * ts_dtype_size(d->a_dt) : 0;
        r->scratch_off[t + 1] = r->copy_off[t] + TS_ALIGN_UP(copy, TS_ALIGN);
    }
    omp_set_num_threads(prev);
    if (s != TS_OK) {
        ts_error_prefix("%s (in %d row blocks)", what, nthr);
        ts_mm_rows_free(r);
        return s;
    }
    snprintf(r->impl, sizeof r->impl, "%.50s+rows", ts_mm_impl(r->blk[0]));
    *out = r;
    return TS_OK;
}

size_t ts_mm_rows_scratch_bytes(const ts_mm_rows *r) {
    /* 64 bytes to align the slices in a scratch of any alignment */
    return r && r->scratch_off[r->n] ? 64 + r->scratch_off[r->n] : 0;
}

const char *ts_mm_rows_impl(const ts_mm_rows *r) {
    return r ? r->impl : "";
}

ts_status ts_mm_rows_run(ts_mm_rows *r, const void *a, const void *b, void *c,
                         const void *const *post, void *scratch) {
    const ts_mm_desc *d = &r->d;
    const size_t asz = ts_dtype_size(d->a_dt), csz = ts_dtype_size(d->c_dt);
    char *base = scratch ? (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63) : NULL;
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt > r->n) nt = r->n;
    ts_status st[TS_MM_ROWS_MAX_BLOCKS];
    /* Each block is one oneDNN product on one thread: the loop's thread count, and which thread
     * runs which block, change no bit. */
#pragma omp parallel for schedule(static, 1) num_threads(nt) if (nt > 1)
    for (int t = 0; t < r->n; t++) {
        const int64_t i0 = r->row0[t];
        const void *pt[4] = {0};
        for (int q = 0; q < d->n_post; q++)
            pt[q] = d->post[q] == TS_MM_POST_ADD ? (const float *)post[q] + i0 * d->N : post[q];
        const char *at = (const char *)a + (size_t)(i0 * d->K) * asz;
        if (d->trans_a) { /* A stored [K, M]: gather columns [i0, i1) into [K, i1 - i0] */
            const int64_t w = r->row0[t + 1] - i0;
            char *dst = base + r->copy_off[t];
            for (int64_t k = 0; k < d->K; k++)
                memcpy(dst + (size_t)(k * w) * asz, (const char *)a + (size_t)(k * d->M + i0) * asz,
                       (size_t)w * asz);
            at = dst;
        }
        st[t] = ts_mm_run_post(
            r->blk[t], at, b, (char *)c + (size_t)(i0 * d->N) * csz, d->n_post ? pt : NULL,
            base && r->copy_off[t] > r->scratch_off[t] ? base + r->scratch_off[t] : NULL);
    }
    for (int t = 0; t < r->n; t++)
        if (st[t] != TS_OK)
            return ts_fail(st[t], "matmul '%s': row block %d of %d (rows %lld to %lld) failed",
                           d->label ? d->label : "?", t, r->n, (long long)r->row0[t],
                           (long long)r->row0[t + 1]);
    return TS_OK;
}

void ts_mm_rows_free(ts_mm_rows *r) {
    if (!r) return;
    for (int t = 0; t < r->n; t++) ts_mm_free(r->blk[t]);
    free(r);
}
