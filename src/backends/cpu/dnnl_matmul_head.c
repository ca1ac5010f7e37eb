/* dnnl_matmul_head.c — the plan for an LM head's large bf16 GEMMs (see the header). */
#include "backends/cpu/dnnl_matmul_head.h"
#include "backends/cpu/dnnl_matmul_pack.h"

#include <stdint.h>

static int g_enabled = 1;

void ts_mm_head_enable(int on) {
    g_enabled = on != 0;
}

/* The post-ops a product can run after it: an optional bias first, then at least one add. */
static int adds_after_bias(const ts_mm_desc *d) {
    int adds = 0;
    for (int q = 0; q < d->n_post; q++) {
        if (d->post[q] == TS_MM_POST_ADD)
            adds++;
        else if (q != 0 || d->post[q] != TS_MM_POST_BIAS)
            return 0;
    }
    return adds;
}

ts_mm_head_plan ts_mm_head_plan_for(const ts_mm_desc *d, int nthr) {
    ts_mm_head_plan p = {.pack_b = 0, .row_blocks = 1, .post_after = 0};
    /* a bias is the primitive's own (oneDNN adds it in the kernel): it does not stop a packed B,
     * nor a bf16 C, which oneDNN rounds once from the accumulator plus the bias */
    const int bias_only = d && d->n_post == 1 && d->post[0] == TS_MM_POST_BIAS;
    if (!g_enabled || !d || nthr != 1 || d->batch != 1 || d->a_dt != TS_BF16 ||
        d->b_dt != TS_BF16 || (d->c_dt != TS_F32 && !(d->c_dt == TS_BF16 && bias_only)) ||
        d->accumulate)
        return p;
    /* a full-size add (a residual, a tied embedding's gradient), with or without a bias first */
    if (adds_after_bias(d) && !(d->trans_a && d->trans_b) &&
        d->M * d->N >= TS_MM_POST_AFTER_MIN_ELEMS) {
        p.post_after = 1;
        return p;
    }
    if (d->trans_a || (d->n_post && !bias_only)) return p;
    /* logits = X W^T, the forward products and the input gradients dX = dY W: a B reused by
     * many rows */
    const int64_t min_b = d->trans_b ? TS_MM_PACK_FWD_MIN_ELEMS : TS_MM_PACK_DX_MIN_ELEMS;
    if (d->K * d->N >= min_b && d->M >= TS_MM_HEAD_MIN_ROWS) {
        p.pack_b = 1;
        if (d->M % TS_MM_HEAD_ROW_BLOCK == 0) p.row_blocks = d->M / TS_MM_HEAD_ROW_BLOCK;
    }
    return p;
}

void ts_mm_head_add_posts(const ts_mm_desc *d, float *c, const void *const *post) {
    const int64_t n = d->M * d->N;
    /* the adds, skipping a leading bias (the product applied it) */
    const int first = d->n_post > 0 && d->post[0] == TS_MM_POST_BIAS;
    const int np = d->n_post - first;
    post += first;
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

dnnl_status_t ts_mm_packed_b_create(ts_mm_packed_b *p, const_dnnl_primitive_desc_t pd,
                                    const dnnl_memory_desc_t *md_b, int trans_b, dnnl_engine_t eng,
                                    dnnl_memory_t *packed, const char **call) {
    const dnnl_memory_desc_t *md_w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    /* a transposed B into the layout tessel's packer writes (dnnl_matmul_pack.h): no reorder */
    if (trans_b && md_b->ndims == 2 &&
        ts_mm_pack_layout_ok(md_w, md_b->dims[0], md_b->dims[1], &p->Kp, &p->Np)) {
        p->own = 1, p->K = md_b->dims[0], p->N = md_b->dims[1];
        *call = "dnnl_memory_create(packed B)";
        dnnl_status_t st = dnnl_memory_create(packed, md_w, eng, DNNL_MEMORY_NONE);
        if (st == dnnl_success)
            p->packed_bytes = (dnnl_memory_desc_get_size(md_w) + 63) & ~(size_t)63;
        return st;
    }
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    *call = "dnnl_primitive_attr_create";
    dnnl_status_t st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success) { /* the reorder allocates nothing either: its scratch is ours */
        *call = "dnnl_primitive_attr_set_scratchpad_mode";
        st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    }
    if (st == dnnl_success) {
        *call = "dnnl_reorder_primitive_desc_create";
        st = dnnl_reorder_primitive_desc_create(&rpd, md_b, eng, md_w, eng, attr);
    }
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_success) {
        const dnnl_memory_desc_t *md_rs =
            dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0);
        p->rs_bytes = md_rs ? dnnl_memory_desc_get_size(md_rs) : 0;
        *call = "dnnl_memory_create(reorder scratchpad)";
        if (p->rs_bytes) st = dnnl_memory_create(&p->rs, md_rs, eng, DNNL_MEMORY_NONE);
    }
    if (st == dnnl_success) {
        *call = "dnnl_primitive_create(reorder)";
        st = dnnl_primitive_create(&p->reorder, rpd);
    }
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (st == dnnl_success) {
        *call = "dnnl_memory_create(B)";
        st = dnnl_memory_create(&p->plain, md_b, eng, DNNL_MEMORY_NONE);
    }
    if (st == dnnl_success) {
        *call = "dnnl_memory_create(packed B)";
        st = dnnl_memory_create(packed, md_w, eng, DNNL_MEMORY_NONE);
    }
    if (st == dnnl_success) p->packed_bytes = (dnnl_memory_desc_get_size(md_w) + 63) & ~(size_t)63;
    return st;
}

dnnl_status_t ts_mm_packed_b_run(ts_mm_packed_b *p, dnnl_memory_t packed, const void *b, char *dst,
                                 dnnl_stream_t stream) {
    if (p->own) {
        ts_mm_pack_bt((uint16_t *)dst, b, p->K, p->N, p->Kp, p->Np);
        return dnnl_memory_set_data_handle(packed, dst);
    }
    /* oneDNN only reads B; its C API has no const handle setter */
    dnnl_status_t st = dnnl_memory_set_data_handle(p->plain, (void *)(uintptr_t)b);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(packed, dst);
    if (st == dnnl_success && p->rs) st = dnnl_memory_set_data_handle(p->rs, dst + p->packed_bytes);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, p->plain}, {DNNL_ARG_TO, packed}};
    int n = 2;
    if (p->rs) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->rs};
    if (st == dnnl_success) st = dnnl_primitive_execute(p->reorder, stream, n, args);
    return st;
}

void ts_mm_packed_b_free(ts_mm_packed_b *p) {
    if (p->reorder) dnnl_primitive_destroy(p->reorder);
    if (p->plain) dnnl_memory_destroy(p->plain);
    if (p->rs) dnnl_memory_destroy(p->rs);
    p->reorder = NULL, p->plain = p->rs = NULL;
    p->own = 0;
}
