/* Matrix multiplication with optional transposes and broadcast batch axes,
 * and nn.Linear as matmul + bias. The reference kernel is a plain loop; the
 * CPU backend replaces it with oneDNN for f32/bf16 (src/backends/cpu).
 * Attributes a.matmul (core/attrs.h); low set (by the precision pass) marks
 * bf16/f16 operands with an f32 output. */
#include <string.h>
#include "core/half.h"
#include "kern.h"

/* Logical [M, K] x [K, N] sizes of a node. */
static void mm_sizes(const ts_type *a, const ts_type *b, int ta, int tb, int64_t *M, int64_t *K,
                     int64_t *K2, int64_t *N) {
    *M = a->dims[a->rank - (ta ? 1 : 2)];
    *K = a->dims[a->rank - (ta ? 2 : 1)];
    *K2 = b->dims[b->rank - (tb ? 1 : 2)];
    *N = b->dims[b->rank - (tb ? 2 : 1)];
}

static int is_low(ts_dtype dt) {
    return dt == TS_BF16 || dt == TS_F16;
}

static ts_status infer_matmul(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0), *b = ts_in_type(g, n, 1);
    if (n->a.matmul.low && !is_low(a->dtype))
        return ts_fail(TS_ERR_SHAPE, "f32 output (low) needs bf16 or f16 operands, got %s",
                       ts_dtype_name(a->dtype));
    if (a->dtype != b->dtype)
        return ts_fail(TS_ERR_SHAPE, "dtypes differ (%s vs %s)", ts_dtype_name(a->dtype),
                       ts_dtype_name(b->dtype));
    if (!ts_dtype_is_float(a->dtype))
        return ts_fail(TS_ERR_SHAPE, "needs a float dtype, got %s", ts_dtype_name(a->dtype));
    if (a->rank < 2 || b->rank < 2)
        return ts_fail(TS_ERR_SHAPE, "both operands need rank >= 2 (got %d and %d)", a->rank,
                       b->rank);
    int64_t M, K, K2, N;
    mm_sizes(a, b, (int)n->a.matmul.trans_a, (int)n->a.matmul.trans_b, &M, &K, &K2, &N);
    if (K != K2)
        return ts_fail(TS_ERR_SHAPE, "inner dimensions differ: %lld vs %lld%s", (long long)K,
                       (long long)K2,
                       n->a.matmul.trans_a || n->a.matmul.trans_b ? " (after transposes)" : "");
    ts_type ba = *a, bb = *b;
    ba.rank -= 2;
    bb.rank -= 2;
    ts_status s = ts_broadcast_shapes(&ba, &bb, out);
    if (s != TS_OK) return ts_fail(s, "batch axes: %s", ts_last_error());
    out->dims[out->rank++] = M;
    out->dims[out->rank++] = N;
    out->dtype = n->a.matmul.low ? TS_F32 : a->dtype;
    *n_out = 1;
    return TS_OK;
}

static ts_val flatten_rows(ts_graph *g, ts_val v) {
    int64_t d[2] = {-1, ts_dim(g, v, -1)};
    return ts_reshape(g, v, 2, d);
}

static ts_status grad_matmul(ts_graph *g, const ts_node *n, const ts_val *dyv, ts_val *din) {
    ts_val A = ts_mkval(n->in[0]), B = ts_mkval(n->in[1]), dC = dyv[0];
    int ta = (int)n->a.matmul.trans_a, tb = (int)n->a.matmul.trans_b;
    int a_rank = ts_in_type(g, n, 0)->rank, b_rank = ts_in_type(g, n, 1)->rank;
    if (n->a.matmul.low)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "matmul: a mixed-precision matmul (f32 output) has no gradient: "
                       "the precision pass creates it after autodiff");
    /* dA' = dC B'^T and dB' = A'^T dC, transposed back where the operand
     * was read transposed. */
    if (ta == 0 && tb == 0)
        din[0] = ts_matmul(g, dC, B, 0, 1);
    else if (ta == 0 && tb == 1)
        din[0] = ts_matmul(g, dC, B, 0, 0);
    else if (ta == 1 && tb == 0)
        din[0] = ts_matmul(g, B, dC, 0, 1);
    else
        din[0] = ts_matmul(g, B, dC, 1, 1);
    din[0] = ts_sum_to(g, din[0], A);

    if (b_rank == 2 && a_rank > 2 && ta == 0) {
        /* b shared by every batch (nn.Linear): one GEMM over all rows
         * instead of per-batch products summed afterwards. */
        ts_val fa = flatten_rows(g, A), fd = flatten_rows(g, dC);
        din[1] = tb ? ts_matmul(g, fd, fa, 1, 0) : ts_matmul(g, fa, fd, 1, 0);
    } else {
        if (ta == 0 && tb == 0)
            din[1] = ts_matmul(g, A, dC, 1, 0);
        else if (ta == 0 && tb == 1)
            din[1] = ts_matmul(g, dC, A, 1, 0);
        else if (ta == 1 && tb == 0)
            din[1] = ts_matmul(g, A, dC, 0, 0);
        else
            din[1] = ts_matmul(g, dC, A, 1, 1);
        din[1] = ts_sum_to(g, din[1], B);
    }
    return ts_graph_status(g);
}

/* ---- reference kernel --------------------------------------------------- */

/* Batch offsets (in elements) of an operand for output batch index bi. */
static int64_t batch_offset(const ts_tensor *x, const ts_tensor *o, int64_t bi) {
    int ob = o->rank - 2, xb = x->rank - 2, lead = ob - xb;
    int64_t mat = x->dims[x->rank - 1] * x->dims[x->rank - 2], off = 0, st = mat;
    int64_t idx[TS_MAX_RANK];
    for (int i = ob - 1; i >= 0; i--) {
        idx[i] = bi % o->dims[i];
        bi /= o->dims[i];
    }
    for (int i = xb - 1; i >= 0; i--) {
        int64_t d = x->dims[i];
        if (d != 1) off += idx[i + lead] * st;
        st *= d;
    }
    return off;
}

#define DEF_MM(T, SFX)                                                                             \
    TS_CLONES static void mm_row_##SFX(T *c, const T *a, const T *b, int64_t i, int64_t N,         \
                                       int64_t K, int64_t M, int ta, int tb) {                     \
        /* c[i, :] = sum_k a[i, k] * b[k, :] for one row i. */                                     \
        for (int64_t j = 0; j < N; j++) c[j] = 0;                                                  \
        if (!tb) {                                                                                 \
            for (int64_t k = 0; k < K; k++) {                                                      \
                T aik = ta ? a[k * M + i] : a[i * K + k];                                          \
                const T *brow = b + k * N;                                                         \
                for (int64_t j = 0; j < N; j++) c[j] += aik * brow[j];                             \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t j = 0; j < N; j++) {                                                      \
                const T *brow = b + j * K;                                                         \
                T acc = 0;                                                                         \
                if (ta)                                                                            \
                    for (int64_t k = 0; k < K; k++) acc += a[k * M + i] * brow[k];                 \
                else                                                                               \
                    for (int64_t k = 0; k < K; k++) acc += a[i * K + k] * brow[k];                 \
                c[j] = acc;                                                                        \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void mm_##SFX(const ts_kargs *k, int64_t batch, int64_t M, int64_t N, int64_t K) {      \
        const ts_tensor *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];                           \
        int ta = (int)k->a->matmul.trans_a, tb = (int)k->a->matmul.trans_b;                        \
        _Pragma(                                                                                   \
            "omp parallel for schedule(static) if (batch * M * N * K >= 65536)") for (int64_t t =  \
                                                                                          0;       \
                                                                                      t <          \
                                                                                      batch * M;   \
                                                                                      t++) {       \
            int64_t bi = t / M, i = t % M;                                                         \
            const T *a = (const T *)A->data + batch_offset(A, C, bi);                              \
            const T *b = (const T *)B->data + batch_offset(B, C, bi);                              \
            T *c = (T *)C->data + bi * M * N + i * N;                                              \
            mm_row_##SFX(c, a, b, i, N, K, M, ta, tb);                                             \
        }                                                                                          \
    }

DEF_MM(float, f32)
DEF_MM(double, f64)

/* bf16/f16 operands, f32 output: the operands are widened (exactly) into
 * scratch and multiplied in f32, which is what a bf16 x bf16 -> f32 GEMM
 * with f32 accumulation computes. */
static size_t scratch_matmul(const ts_graph *g, const ts_node *n) {
    if (!n->a.matmul.low) return 0;
    size_t na = (size_t)ts_type_numel(ts_in_type(g, n, 0)),
           nb = (size_t)ts_type_numel(ts_in_type(g, n, 1));
    return ((na * 4 + 63) / 64 + (nb * 4 + 63) / 64) * 64;
}

static void widen(float *dst, const ts_tensor *t) {
    int64_t n = ts_tensor_numel(t);
    if (t->dtype == TS_BF16)
        ts_bf16_to_f32_n(dst, t->data, n);
    else
        ts_f16_to_f32_n(dst, t->data, n);
}

static ts_status k_matmul_low(const ts_kargs *k, int64_t batch, int64_t M, int64_t N, int64_t K) {
    const ts_tensor *A = &k->in[0], *B = &k->in[1];
    if (!is_low(A->dtype) || B->dtype != A->dtype || k->out[0].dtype != TS_F32)
        return ts_kernel_bad_dtype(k, "matmul (mixed precision)", A->dtype);
    size_t na = (size_t)ts_tensor_numel(A);
    float *fa = k->scratch, *fb = fa + (na * 4 + 63) / 64 * 16;
    ts_tensor w[2] = {*A, *B};
    w[0].dtype = w[1].dtype = TS_F32;
    w[0].data = fa;
    w[1].data = fb;
    widen(fa, A);
    widen(fb, B);
    ts_kargs k2 = *k;
    k2.in = w;
    mm_f32(&k2, batch, M, N, K);
    return TS_OK;
}

static ts_status k_matmul(const ts_kargs *k) {
    const ts_tensor *A = &k->in[0], *C = &k->out[0];
    int ta = (int)k->a->matmul.trans_a;
    int64_t M = C->dims[C->rank - 2], N = C->dims[C->rank - 1];
    int64_t K = A->dims[A->rank - (ta ? 2 : 1)];
    int64_t batch = 1;
    for (int i = 0; i < C->rank - 2; i++) batch *= C->dims[i];
    if (k->a->matmul.low) return k_matmul_low(k, batch, M, N, K);
    switch (C->dtype) {
    case TS_F32: mm_f32(k, batch, M, N, K); return TS_OK;
    case TS_F64: mm_f64(k, batch, M, N, K); return TS_OK;
    default: return ts_kernel_bad_dtype(k, "matmul", C->dtype);
    }
}

static double cost_matmul(const ts_graph *g, const ts_node *n) {
    const ts_type *a = ts_in_type(g, n, 0), *c = &g->values[n->out[0]].t;
    int64_t K = a->dims[a->rank - (n->a.matmul.trans_a ? 2 : 1)];
    return 2.0 * (double)ts_type_numel(c) * (double)K;
}

const ts_op_def ts_def_matmul = {.name = "matmul",
                                 .min_in = 2,
                                 .max_in = 2,
                                 .infer = infer_matmul,
                                 .grad = grad_matmul,
                                 .kernel = k_matmul,
                                 .scratch = scratch_matmul,
                                 .cost = cost_matmul};

ts_val ts_matmul(ts_graph *g, ts_val a, ts_val b, int trans_a, int trans_b) {
    ts_val in[2] = {a, b};
    ts_attrs at = ts_attrs_zero();
    at.matmul.trans_a = trans_a != 0;
    at.matmul.trans_b = trans_b != 0;
    return ts_node_add(g, TS_OP_MATMUL, 2, in, &at, NULL);
}

ts_val ts_linear(ts_graph *g, ts_val x, ts_val w, ts_val b) {
    if (!g || g->status != TS_OK || !ts_val_ok(x) || !ts_val_ok(w)) return TS_NONE;
    if (ts_rank(g, w) != 2)
        return ts_graph_fail(g, TS_ERR_SHAPE, "linear: weight must be [out, in], got rank %d",
                             ts_rank(g, w));
    int xr = ts_rank(g, x);
    ts_val xx = x;
    if (xr == 1) {
        int64_t d[2] = {1, ts_dim(g, x, 0)};
        xx = ts_reshape(g, x, 2, d);
    }
    ts_val y = ts_matmul(g, xx, w, 0, 1);
    if (ts_val_ok(b)) y = ts_add(g, y, b);
    if (xr == 1) {
        int64_t d[1] = {ts_dim(g, w, 0)};
        y = ts_reshape(g, y, 1, d);
    }
    return y;
}
