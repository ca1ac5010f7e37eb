/* dnnl_matmul_head.c — the plan for an LM head's large bf16 GEMMs (see the header). */
#include "backends/cpu/dnnl_matmul_head.h"

static int g_enabled = 1;

void ts_mm_head_enable(int on) {
    g_enabled = on != 0;
}

ts_mm_head_plan ts_mm_head_plan_for(const ts_mm_desc *d, int nthr) {
    ts_mm_head_plan p = {.pack_b = 0, .row_blocks = 1, .post_after = 0};
    if (!g_enabled || !d || nthr != 1 || d->batch != 1 || d->a_dt != TS_BF16 ||
        d->b_dt != TS_BF16 || d->c_dt != TS_F32 || d->accumulate)
        return p;
    if (d->trans_a) {
        /* dW = dY^T X with a full-size add (a tied embedding's gradient) */
        int adds = d->n_post > 0;
        for (int q = 0; q < d->n_post; q++) adds &= d->post[q] == TS_MM_POST_ADD;
        p.post_after = adds && !d->trans_b && d->M * d->N >= TS_MM_HEAD_MIN_ELEMS;
        return p;
    }
    /* logits = X W^T and dX = dlogits W: a large B, reused by many rows */
    if (d->n_post == 0 && d->K * d->N >= TS_MM_HEAD_MIN_ELEMS && d->M >= TS_MM_HEAD_MIN_ROWS) {
        p.pack_b = 1;
        if (d->M % TS_MM_HEAD_ROW_BLOCK == 0) p.row_blocks = d->M / TS_MM_HEAD_ROW_BLOCK;
    }
    return p;
}

void ts_mm_head_add_posts(const ts_mm_desc *d, float *c, const void *const *post) {
    const int64_t n = d->M * d->N;
    const int np = d->n_post;
    /* Element-wise, each in the post-ops' order: the bits do not depend on the threads. */
    if (np == 1) { /* the usual case, vectorised */
        const float *p0 = post[0];
#pragma omp parallel for simd schedule(static) if (n >= 65536)
        for (int64_t e = 0; e < n; e++) c[e] += p0[e];
        return;
    }
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t e = 0; e < n; e++) {
        float v = c[e];
        for (int q = 0; q < np; q++) v += ((const float *)post[q])[e];
        c[e] = v;
    }
}
