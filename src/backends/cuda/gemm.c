/* GEMMs of the CUDA backend through cuBLASLt: matmul (f32, or bf16/f16
 * operands with f32 accumulation and output: the precision pass's `low`)
 * and matmul_epi (the fusion pass's matmul + adds), planned once at
 * prepare (descriptors, layouts and the heuristic's algorithm) and run with
 * one cublasLtMatmul each step.
 *
 * Row-major to cuBLAS's column-major: the row-major C[M, N] = op(A) op(B)
 * is the column-major C^T[N, M] = op(B)^T op(A)^T, so cuBLAS's A is our b
 * and its B our a, with the transposes carried over. Batch axes: an operand
 * either has the output's batch (stride one matrix) or none (stride 0);
 * an operand without batch axes on the right-hand side (nn.Linear's weight)
 * folds the batch into M, one large GEMM. Post-op adds: a bias row becomes
 * the epilogue's bias (CUBLASLT_EPILOGUE_BIAS), one operand of the output's
 * shape becomes C with beta = 1, any further ones run as elementwise adds
 * after the GEMM. f32 GEMMs compute in f32 (CUBLAS_COMPUTE_32F, no TF32),
 * so results stay within f32 rounding of the CPU's. */
#include <stdlib.h>
#include <string.h>
#include "backends/cuda/cuda.h"

static int64_t prod(const int64_t *dims, int lo, int hi) {
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

static ts_status lt_err(cublasStatus_t s, const ts_program *prog, int i, const char *what) {
    return cu_fail(TS_ERR_INTERNAL, "instruction %d (%s, '%s'): cuBLASLt %s failed (status %d)", i,
                   prog->ins[i].name, prog->ins[i].label ? prog->ins[i].label : "", what, (int)s);
}

static ts_status unsupported(const ts_program *prog, int i, const char *why) {
    return cu_fail(TS_ERR_UNSUPPORTED, "instruction %d (%s, '%s'): %s", i, prog->ins[i].name,
                   prog->ins[i].label ? prog->ins[i].label : "", why);
}

void cu_gemm_free(cu_gemm *g) {
    if (!g) return;
    if (g->la) cublasLtMatrixLayoutDestroy(g->la);
    if (g->lb) cublasLtMatrixLayoutDestroy(g->lb);
    if (g->lc) cublasLtMatrixLayoutDestroy(g->lc);
    if (g->desc) cublasLtMatmulDescDestroy(g->desc);
    free(g);
}

/* A column-major layout rows x cols (leading dimension rows) with a batch. */
static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType t, int64_t rows, int64_t cols,
                             int batch, int64_t bstride) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, rows);
    if (s != CUBLAS_STATUS_SUCCESS || batch <= 1) return s;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &bstride, sizeof bstride);
    return s;
}

ts_status cu_gemm_plan(cu_state *st, const ts_program *prog, int i, cu_gemm **out) {
    const ts_instr *in = &prog->ins[i];
    const ts_operand *A = &in->in[0], *B = &in->in[1], *C = &in->out[0];
    const int epi = in->op == TS_OP_MATMUL_EPI;
    const int ta = (int)(epi ? in->a.matmul_epi.trans_a : in->a.matmul.trans_a);
    const int tb = (int)(epi ? in->a.matmul_epi.trans_b : in->a.matmul.trans_b);
    cudaDataType ab_t;
    if (A->dtype == TS_F32 && B->dtype == TS_F32)
        ab_t = CUDA_R_32F;
    else if (A->dtype == TS_BF16 && B->dtype == TS_BF16)
        ab_t = CUDA_R_16BF;
    else if (A->dtype == TS_F16 && B->dtype == TS_F16)
        ab_t = CUDA_R_16F;
    else
        return unsupported(prog, i, "operands must be f32, bf16 or f16 (both alike)");
    if (C->dtype != TS_F32) return unsupported(prog, i, "needs an f32 output");
    int64_t M = C->dims[C->rank - 2], N = C->dims[C->rank - 1];
    int64_t K = A->dims[A->rank - (ta ? 2 : 1)];
    int64_t batch = prod(C->dims, 0, C->rank - 2);
    int64_t ba = prod(A->dims, 0, A->rank - 2), bb = prod(B->dims, 0, B->rank - 2);
    if ((ba != batch && ba != 1) || (bb != batch && bb != 1))
        return unsupported(prog, i, "batch axes broadcast partly (only all or none)");
    /* nn.Linear: b without batch, a not transposed: fold the batch into M */
    if (batch > 1 && bb == 1 && ba == batch && !ta) M *= batch, batch = 1, ba = 1;
    if (batch > INT32_MAX) return unsupported(prog, i, "batch too large");
    cu_gemm *g = calloc(1, sizeof *g);
    if (!g) return cu_fail(TS_ERR_NOMEM, "instruction %d: GEMM plan", i);
    cublasStatus_t s;
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    ts_status r = TS_OK;
    if ((s = cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        (s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                            sizeof opa)) ||
        (s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                            sizeof opb))) {
        r = lt_err(s, prog, i, "descriptor");
        goto fail;
    }
    /* cuBLAS A = our b: stored [K, N] row-major (N x K col-major) or, with
     * tb, [N, K] (K x N col-major). cuBLAS B = our a likewise. */
    if ((s = layout(&g->la, ab_t, tb ? K : N, tb ? N : K, (int)batch, bb == 1 ? 0 : K * N)) ||
        (s = layout(&g->lb, ab_t, ta ? M : K, ta ? K : M, (int)batch, ba == 1 ? 0 : M * K)) ||
        (s = layout(&g->lc, CUDA_R_32F, N, M, (int)batch, M * N))) {
        r = lt_err(s, prog, i, "layout");
        goto fail;
    }
    if (epi) {
        int n_post = (int)in->a.matmul_epi.n_post, have_bias = 0;
        for (int p = 0; p < n_post; p++) {
            const ts_operand *x = &in->in[2 + p];
            if (in->a.matmul_epi.post[p] != TS_EPI_ADD || x->dtype != TS_F32) {
                r = unsupported(prog, i, "a post-op other than an f32 add");
                goto fail;
            }
            int64_t nx = prod(x->dims, 0, x->rank);
            if (nx == N && !have_bias) {
                cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
                void *bias = cu_at(st, x->off);
                if ((s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e,
                                                        sizeof e)) ||
                    (s = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof bias))) {
                    r = lt_err(s, prog, i, "bias epilogue");
                    goto fail;
                }
                have_bias = 1;
            } else if (nx == M * N * batch && !g->use_c) {
                g->use_c = 1;
                g->c_off = x->off;
            } else if (g->n_extra < 2 && (nx == N || nx == M * N * batch)) {
                /* out += x, after the GEMM: out is input 0 (in place) */
                cu_ew_prog *e = &g->extra[g->n_extra++];
                memset(e, 0, sizeof *e);
                e->rank = C->rank;
                e->n = prod(C->dims, 0, C->rank);
                for (int d = 0; d < C->rank; d++) e->dims[d] = C->dims[d];
                e->out = cu_at(st, C->off);
                e->n_ext = 2;
                e->in[0].p = e->out, e->in[0].full = 1;
                e->in[1].p = cu_at(st, x->off), e->in[1].full = nx == e->n;
                if (!e->in[1].full) e->in[1].stride[C->rank - 1] = 1; /* a bias row */
                e->n_instr = 1;
                e->ins[0].op = TS_OP_ADD, e->ins[0].src[0] = 0, e->ins[0].src[1] = 1;
            } else {
                r = unsupported(prog, i, "more post-op adds than this backend handles");
                goto fail;
            }
        }
    }
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) ||
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &st->work_bytes, sizeof st->work_bytes)) ||
        (s = cublasLtMatmulAlgoGetHeuristic(st->lt, g->desc, g->la, g->lb, g->lc, g->lc, pref, 1,
                                            &h, &found))) {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        r = lt_err(s, prog, i, "algorithm heuristic");
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1) {
        r = unsupported(prog, i, "cuBLASLt has no algorithm for this GEMM");
        goto fail;
    }
    g->algo = h.algo;
    *out = g;
    return TS_OK;
fail:
    cu_gemm_free(g);
    return r;
}

ts_status cu_gemm_run(cu_state *st, const ts_program *prog, int i, const cu_gemm *g) {
    const ts_instr *in = &prog->ins[i];
    const float one = 1.0f, zero = 0.0f;
    void *c = cu_at(st, in->out[0].off);
    const void *cin = g->use_c ? cu_at(st, g->c_off) : c;
    cublasStatus_t s =
        cublasLtMatmul(st->lt, g->desc, &one, cu_at(st, in->in[1].off), g->la,
                       cu_at(st, in->in[0].off), g->lb, g->use_c ? &one : &zero, cin, g->lc, c,
                       g->lc, &g->algo, st->dev + st->work_off, st->work_bytes, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_err(s, prog, i, "matmul");
    for (int e = 0; e < g->n_extra; e++) {
        int rc = cu_eltwise(&g->extra[e], (cu_stream)st->stream);
        if (rc) return cu_err((cudaError_t)rc, "matmul_epi's add", in->label);
    }
    return TS_OK;
}
