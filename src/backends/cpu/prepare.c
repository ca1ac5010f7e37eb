/* Preparing a program for the CPU: instructions that have an optimised
 * kernel get it here, once, with whatever state it needs (a oneDNN
 * primitive); every other instruction keeps its op's reference kernel. */
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/cpu.h"
#include "backends/cpu/dnnl_caps.h"
#include "backends/cpu/dnnl_conv.h"
#include "backends/cpu/dnnl_matmul.h"
#include "core/half.h"

static ts_status k_dnnl_matmul(const ts_kargs *k) {
    return ts_mm_run(k->backend, k->in[0].data, k->in[1].data, k->out[0].data, k->scratch);
}

/* matmul_epi: the post-op operands follow A and B. */
static ts_status k_dnnl_matmul_epi(const ts_kargs *k) {
    const void *post[TS_ATTR_EPI_MAX];
    for (int j = 2; j < k->n_in; j++) post[j - 2] = k->in[j].data;
    return ts_mm_run_post(k->backend, k->in[0].data, k->in[1].data, k->out[0].data, post,
                          k->scratch);
}

static void free_mm(void *m) {
    ts_mm_free(m);
}

/* The oneDNN post-ops of a matmul_epi instruction. */
static void epi_posts(const ts_instr *in, const ts_rt_instr *r, ts_mm_desc *d) {
    int next = 2;
    d->n_post = (int)in->a.matmul_epi.n_post;
    for (int p = 0; p < d->n_post; p++) {
        int full = ts_tensor_numel(&r->in[next++]) == ts_tensor_numel(&r->out[0]);
        d->post[p] = full ? TS_MM_POST_ADD : TS_MM_POST_BIAS;
    }
}

/* f16 operands where oneDNN has no f16 GEMM (no AVX512-FP16): widen them
 * into the instruction's arena scratch (the reference kernel's, sized for
 * both in f32) and run the f32 primitive. An f16 x f16 product is exact in
 * f32 (22 significant bits), so this is an f16 GEMM with f32
 * accumulation, at f32 speed. */
typedef struct widen_mm {
    ts_mm *mm;
    float *wa, *wb;
    int64_t na, nb;
} widen_mm;

static ts_status k_widen_matmul(const ts_kargs *k) {
    const widen_mm *w = k->backend;
    ts_f16_to_f32_n(w->wa, k->in[0].data, w->na);
    ts_f16_to_f32_n(w->wb, k->in[1].data, w->nb);
    if (k->n_in <= 2) return ts_mm_run(w->mm, w->wa, w->wb, k->out[0].data, k->scratch);
    const void *post[TS_ATTR_EPI_MAX]; /* a matmul_epi: its f32 post-op operands */
    for (int j = 2; j < k->n_in; j++) post[j - 2] = k->in[j].data;
    return ts_mm_run_post(w->mm, w->wa, w->wb, k->out[0].data, post, k->scratch);
}

static void free_widen(void *p) {
    widen_mm *w = p;
    if (w) ts_mm_free(w->mm);
    free(w);
}

static ts_status widen_instr(ts_rt_instr *r, ts_mm_desc *d) {
    widen_mm *w = ts_zalloc(sizeof *w, "f16 matmul");
    if (!w) return TS_ERR_NOMEM;
    d->a_dt = d->b_dt = TS_F32;
    ts_status s = ts_mm_create(d, &w->mm);
    if (s != TS_OK) {
        free(w);
        return s;
    }
    w->na = ts_tensor_numel(&r->in[0]);
    w->nb = ts_tensor_numel(&r->in[1]);
    w->wa = r->k.scratch; /* layout of matmul.c's scratch_matmul */
    w->wb = w->wa + ((size_t)w->na * 4 + 63) / 64 * 16;
    r->k.backend = w;
    r->backend_free = free_widen;
    r->fn = k_widen_matmul;
    return TS_OK;
}

/* Map a matmul instruction onto the [batch, M, K] x [batch, K, N] shapes the
 * oneDNN wrapper takes. Returns 0 when the broadcast pattern does not fit
 * (the reference kernel then stays). */
static int mm_desc_for(const ts_instr *in, const ts_rt_instr *r, ts_mm_desc *d) {
    const ts_tensor *A = &r->in[0], *B = &r->in[1], *C = &r->out[0];
    const int epi = in->op == TS_OP_MATMUL_EPI;
    /* mixed precision: low operands, f32 accumulation, an f32 output or (matmul_epi.out_low) a
     * bf16 one: oneDNN rounds the f32 result (accumulator + bias) to nearest even */
    const int out_low = epi && in->a.matmul_epi.out_low && C->dtype == TS_BF16;
    int low = (A->dtype == TS_BF16 || A->dtype == TS_F16) && B->dtype == A->dtype &&
              (C->dtype == TS_F32 || (out_low && A->dtype == TS_BF16));
    if (!low && (A->dtype != TS_F32 || B->dtype != TS_F32 || C->dtype != TS_F32)) return 0;
    memset(d, 0, sizeof *d);
    d->a_dt = d->b_dt = A->dtype;
    d->c_dt = C->dtype;
    d->trans_a = (int)(epi ? in->a.matmul_epi.trans_a : in->a.matmul.trans_a);
    d->trans_b = (int)(epi ? in->a.matmul_epi.trans_b : in->a.matmul.trans_b);
    d->M = C->dims[C->rank - 2];
    d->N = C->dims[C->rank - 1];
    d->K = A->dims[A->rank - (d->trans_a ? 2 : 1)];
    d->label = in->label;
    int64_t batch = 1;
    for (int i = 0; i < C->rank - 2; i++) batch *= C->dims[i];
    int64_t a_batch = 1, b_batch = 1;
    for (int i = 0; i < A->rank - 2; i++) a_batch *= A->dims[i];
    for (int i = 0; i < B->rank - 2; i++) b_batch *= B->dims[i];
    if (b_batch == 1 && !d->trans_a) {
        /* B shared by all batches (nn.Linear): one tall GEMM. */
        d->M *= batch;
        d->batch = 1;
        return 1;
    }
    d->batch = batch;
    if (a_batch == batch && b_batch == batch) {
        /* Same batch shape on both sides (no broadcasting inside). */
        int lead_a = C->rank - A->rank, lead_b = C->rank - B->rank;
        for (int i = 0; i < C->rank - 2; i++) {
            if (i >= lead_a && A->dims[i - lead_a] != C->dims[i]) return 0;
            if (i >= lead_b && B->dims[i - lead_b] != C->dims[i]) return 0;
        }
        return 1;
    }
    if (b_batch == 1) {
        d->b_broadcast = 1;
        return a_batch == batch;
    }
    if (a_batch == 1) {
        d->a_broadcast = 1;
        return b_batch == batch;
    }
    return 0;
}

ts_status ts_cpu_prepare(const ts_program *prog, ts_runtime *rt) {
    size_t scratch = 0;
    if (prog->opt.reference_kernels) return TS_OK;
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        ts_rt_instr *r = &rt->ins[i];
        ts_mm_desc d;
        if ((in->op != TS_OP_MATMUL && in->op != TS_OP_MATMUL_EPI) || !mm_desc_for(in, r, &d))
            continue;
        if (in->op == TS_OP_MATMUL_EPI) epi_posts(in, r, &d);
        ts_mm *mm;
        ts_status s = ts_mm_create(&d, &mm);
        if (s == TS_ERR_UNSUPPORTED && d.a_dt == TS_F16 && r->k.scratch) {
            if ((s = widen_instr(r, &d)) != TS_OK) return s;
            mm = ((widen_mm *)r->k.backend)->mm;
        } else {
            if (s == TS_ERR_UNSUPPORTED && d.a_dt != TS_F32 && !ts_cpu_supports_dtype_gemm(d.a_dt))
                return ts_fail(
                    s, "matmul '%s' in %s: %s (compute it in f32: precision.default: fp32)",
                    d.label ? d.label : "?", ts_dtype_name(d.a_dt), ts_cpu_dtype_gemm_why(d.a_dt));
            if (s != TS_OK) return s;
            r->k.backend = mm;
            r->backend_free = free_mm;
            r->fn = in->op == TS_OP_MATMUL_EPI ? k_dnnl_matmul_epi : k_dnnl_matmul;
        }
        size_t sb = ts_mm_scratch_bytes(mm);
        if (sb > scratch) scratch = sb;
    }
    if (scratch) {
        rt->backend_scratch = ts_aligned_alloc(scratch, "oneDNN scratchpad");
        if (!rt->backend_scratch) return TS_ERR_NOMEM;
        rt->backend_scratch_bytes = scratch;
        /* One buffer serves every oneDNN instruction in turn. */
        for (int i = 0; i < prog->n_ins; i++)
            if (rt->ins[i].fn == k_dnnl_matmul || rt->ins[i].fn == k_dnnl_matmul_epi ||
                rt->ins[i].fn == k_widen_matmul) {
                rt->ins[i].k.scratch = rt->backend_scratch;
                rt->ins[i].k.scratch_bytes = scratch;
            }
    }
    ts_status s;
    if ((s = ts_cpu_prepare_conv(prog, rt)) != TS_OK) return s;
    return TS_OK;
}
