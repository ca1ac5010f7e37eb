/* Losses with a scalar (mean) output: binary cross-entropy with logits,
 * cross-entropy over class indices (optionally with class weights), and the
 * composite MSE loss.
 *
 * Weighted cross-entropy follows torch: row i counts w[y_i] times and the
 * mean divides by the sum of the weights of the rows not ignored,
 * sum_i w[y_i] l_i / sum_i w[y_i]. The weights get no gradient.
 *
 * Determinism: the mean is a sum over fixed blocks (TS_RED_BLOCK elements
 * for BCE, CE_ROWS rows for CE) whose double partials land in scratch and
 * are added in block order, so the loss does not depend on the thread
 * count. */
#include <math.h>
#include <string.h>
#include "core/half.h"
#include "kern.h"
#include "ops/ce_simd.h"
#include "vmath.h"

#define LN      TS_LANES /* interleaved partial sums of a row reduction */
#define CE_ROWS 64       /* rows per block of the cross-entropy sum */

/* ---- inference --------------------------------------------------------- */

static ts_status need_float(const ts_type *t, const char *what) {
    if (!ts_dtype_is_float(t->dtype))
        return ts_fail(TS_ERR_SHAPE, "%s must be a float type, got %s", what,
                       ts_dtype_name(t->dtype));
    return TS_OK;
}

static ts_status need_scalar(const ts_type *t, ts_dtype dt, const char *what) {
    if (t->rank != 0 || t->dtype != dt)
        return ts_fail(TS_ERR_SHAPE, "%s must be a %s scalar", what, ts_dtype_name(dt));
    return TS_OK;
}

static ts_status infer_bce(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0), *y = ts_in_type(g, n, 1);
    ts_status s = need_float(x, "logits");
    if (s != TS_OK) return s;
    if (!ts_type_equal(x, y))
        return ts_fail(TS_ERR_SHAPE, "logits and target must have the same dtype and shape");
    *out = (ts_type){.dtype = x->dtype, .rank = 0};
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_bce_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = infer_bce(g, &(ts_node){.in = n->in + 1, .n_in = 2}, out, n_out);
    if (s != TS_OK) return s;
    const ts_type *x = ts_in_type(g, n, 1);
    if ((s = need_scalar(ts_in_type(g, n, 0), x->dtype, "dl")) != TS_OK) return s;
    *out = *x;
    return TS_OK;
}

static ts_status check_ce(const ts_type *lg, const ts_type *tg) {
    ts_status s = need_float(lg, "logits");
    if (s != TS_OK) return s;
    if (lg->rank != 2) return ts_fail(TS_ERR_SHAPE, "logits must be [N, C]");
    if (tg->dtype != TS_I32 && tg->dtype != TS_I64)
        return ts_fail(TS_ERR_SHAPE, "target must be i32 or i64, got %s", ts_dtype_name(tg->dtype));
    if (tg->rank != 1 || tg->dims[0] != lg->dims[0])
        return ts_fail(TS_ERR_SHAPE, "target must be [%lld] (one class index per row)",
                       (long long)lg->dims[0]);
    return TS_OK;
}

/* The optional class weights: [C] of the logits' dtype. */
static ts_status check_weight(const ts_type *lg, const ts_type *w) {
    if (w->dtype != lg->dtype || w->rank != 1 || w->dims[0] != lg->dims[1])
        return ts_fail(TS_ERR_SHAPE, "weight must be %s[%lld] (one per class)",
                       ts_dtype_name(lg->dtype), (long long)lg->dims[1]);
    return TS_OK;
}

static ts_status infer_ce(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *lg = ts_in_type(g, n, 0);
    ts_status s = check_ce(lg, ts_in_type(g, n, 1));
    if (s != TS_OK) return s;
    if (n->n_in == 3 && (s = check_weight(lg, ts_in_type(g, n, 2))) != TS_OK) return s;
    out[0] = (ts_type){.dtype = lg->dtype, .rank = 0};
    out[1] = (ts_type){.dtype = lg->dtype, .rank = 1, .dims = {lg->dims[0]}};
    *n_out = 2;
    return TS_OK;
}

static ts_status infer_ce_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *lg = ts_in_type(g, n, 1);
    ts_status s = check_ce(lg, ts_in_type(g, n, 2));
    if (s != TS_OK) return s;
    if ((s = need_scalar(ts_in_type(g, n, 0), lg->dtype, "dl")) != TS_OK) return s;
    ts_type lse = {.dtype = lg->dtype, .rank = 1, .dims = {lg->dims[0]}};
    if (!ts_type_equal(ts_in_type(g, n, 3), &lse))
        return ts_fail(TS_ERR_SHAPE, "lse must be %s[%lld]", ts_dtype_name(lg->dtype),
                       (long long)lg->dims[0]);
    if (n->n_in == 5 && (s = check_weight(lg, ts_in_type(g, n, 4))) != TS_OK) return s;
    if (n->a.cross_entropy.out_low && (n->a.cross_entropy.out_low != 1 || lg->dtype != TS_F32))
        return ts_fail(TS_ERR_INVALID, "out_low (a bf16 gradient) is 1 on f32 logits only");
    *out = *lg;
    if (n->a.cross_entropy.out_low) out->dtype = TS_BF16;
    const int64_t r0 = n->a.cross_entropy.row_start, nr = n->a.cross_entropy.row_count;
    if (nr > 0 || r0 != 0) {
        if (r0 < 0 || nr < 1 || r0 > lg->dims[0] - nr)
            return ts_fail(TS_ERR_INVALID, "rows [%lld, +%lld) outside the %lld rows",
                           (long long)r0, (long long)nr, (long long)lg->dims[0]);
        out->dims[0] = nr;
    }
    *n_out = 1;
    return TS_OK;
}

/* (dl, logits, target[, weight]) -> (dlogits, loss, lse): f32 logits, every row. */
static ts_status infer_ce_fused(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *lg = ts_in_type(g, n, 1);
    ts_status s = check_ce(lg, ts_in_type(g, n, 2));
    if (s != TS_OK) return s;
    if (lg->dtype != TS_F32)
        return ts_fail(TS_ERR_SHAPE, "cross_entropy_fused: logits must be f32, got %s",
                       ts_dtype_name(lg->dtype));
    if ((s = need_scalar(ts_in_type(g, n, 0), lg->dtype, "dl")) != TS_OK) return s;
    if (n->n_in == 4 && (s = check_weight(lg, ts_in_type(g, n, 3))) != TS_OK) return s;
    const ts_cross_entropy_attrs *a = &n->a.cross_entropy;
    if (a->row_start != 0 || a->row_count != 0)
        return ts_fail(TS_ERR_INVALID, "cross_entropy_fused computes every row (no row_start, "
                                       "row_count)");
    if (a->out_low != 0 && a->out_low != 1)
        return ts_fail(TS_ERR_INVALID, "out_low (a bf16 gradient) is 0 or 1");
    out[0] = *lg;
    if (a->out_low) out[0].dtype = TS_BF16;
    out[1] = (ts_type){.dtype = TS_F32, .rank = 0};
    out[2] = (ts_type){.dtype = TS_F32, .rank = 1, .dims = {lg->dims[0]}};
    *n_out = 3;
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

static ts_status grad_bce(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return TS_OK;
    ts_val x = ts_mkval(n->in[0]), y = ts_mkval(n->in[1]);
    ts_val in[3] = {dy[0], x, y};
    din[0] = ts_node_add(g, TS_OP_BCE_LOGITS_BWD, 3, in, NULL, NULL);
    /* d/dy (max(x,0) - x*y + log1p(exp(-|x|))) = -x, over the mean; torch
     * differentiates the target too. Dead-code elimination drops it when
     * the target needs no gradient. */
    double inv_n = 1.0 / (double)ts_type_numel(ts_in_type(g, n, 0));
    din[1] = ts_mul(g, ts_affine_scalar(g, x, -inv_n, 0.0), dy[0]);
    return ts_graph_status(g);
}

static ts_status grad_ce(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (ts_val_ok(dy[1])) {
        /* lse is an internal output for the backward op (never handed out). */
        ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                      "cross_entropy: gradients through the lse output are not supported");
        return ts_graph_status(g);
    }
    if (!ts_val_ok(dy[0])) return TS_OK;
    ts_val in[5] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->in[1]), ts_mkval(n->out[1])};
    if (n->n_in == 3) in[4] = ts_mkval(n->in[2]);
    din[0] = ts_node_add(g, TS_OP_CROSS_ENTROPY_BWD, n->n_in == 3 ? 5 : 4, in, &n->a, NULL);
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

static inline int64_t target_at(const void *t, int is64, int64_t i) {
    return is64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

/* Per-block partial of the cross-entropy sum; bad is the first row of the
 * block with an out-of-range target (-1 if none). */
typedef struct ce_part {
    double sum, wsum; /* weighted losses, weights (row count without weights) */
    int64_t bad, pad;
} ce_part;

static ts_status bad_target(const ts_kargs *k, const char *op, int64_t row, int64_t t, int64_t c) {
    return ts_fail(TS_ERR_INVALID,
                   "%s '%s': target[%lld] = %lld is out of range [0, %lld) and is not "
                   "ignore_index %lld",
                   op, k->label ? k->label : "?", (long long)row, (long long)t, (long long)c,
                   (long long)k->a->cross_entropy.ignore_index);
}

/* The f32 cross entropy's exp loops start with ce_simd.c's hand-vectorised prefix (the same
 * bits; 0 elements without AVX-512), the f64 ones (gradient checks) do not. */
static inline int64_t sumexp_simd_f32(double *acc, const float *x, float m, int64_t c) {
    return ts_ce_sumexp_simd(acc, x, m, c);
}
static inline int64_t sumexp_simd_f64(double *acc, const double *x, double m, int64_t c) {
    (void)acc, (void)x, (void)m, (void)c;
    return 0;
}
static inline int64_t scaled_exp_simd_f32(float *d, const float *x, float lse, float sc,
                                          int64_t n) {
    return ts_ce_scaled_exp_simd(d, x, lse, sc, n);
}
static inline int64_t scaled_exp_simd_f64(double *d, const double *x, double lse, double sc,
                                          int64_t n) {
    (void)d, (void)x, (void)lse, (void)sc, (void)n;
    return 0;
}

#define DEF_LOSS(T, SFX, EXP, LOG1P, ABS, LOG, ROWWISE)                                            \
    /* Sum over [0, n) of max(x,0) - x*y + log1p(exp(-|x|)) (torch's stable form). */              \
    TS_CLONES static double bce_block_##SFX(const T *x, const T *y, int64_t n) {                   \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= n; i += LN)                                                               \
            for (int j = 0; j < LN; j++) {                                                         \
                T v = x[i + j];                                                                    \
                acc[j] += (double)((v > 0 ? v : 0) - v * y[i + j] + LOG1P(EXP(-ABS(v))));          \
            }                                                                                      \
        for (; i < n; i++) {                                                                       \
            T v = x[i];                                                                            \
            s += (double)((v > 0 ? v : 0) - v * y[i] + LOG1P(EXP(-ABS(v))));                       \
        }                                                                                          \
        return s + ts_lanes_sum(acc);                                                              \
    }                                                                                              \
    static ts_status bce_##SFX(const ts_kargs *k) {                                                \
        const T *x = k->in[0].data, *y = k->in[1].data;                                            \
        int64_t n = ts_tensor_numel(&k->in[0]), nb = ts_red_blocks(n);                             \
        double *part = k->scratch;                                                                 \
        if ((size_t)nb * sizeof(double) > k->scratch_bytes)                                        \
            return ts_fail(TS_ERR_INTERNAL, "bce_logits '%s': scratch too small", k->label);       \
        _Pragma("omp parallel for schedule(static) if (n >= TS_PAR_MIN)") for (int64_t b = 0;      \
                                                                               b < nb; b++) {      \
            int64_t s = b * TS_RED_BLOCK, len = n - s < TS_RED_BLOCK ? n - s : TS_RED_BLOCK;       \
            part[b] = bce_block_##SFX(x + s, y + s, len);                                          \
        }                                                                                          \
        double sum = 0;                                                                            \
        for (int64_t b = 0; b < nb; b++) sum += part[b];                                           \
        *(T *)k->out[0].data = (T)(n ? sum / (double)n : NAN); /* empty mean: NaN, as torch */     \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* dx = (sigmoid(x) - y) * dl / N, sigmoid without overflow for either sign. */                \
    TS_CLONES static void bce_bwd_chunk_##SFX(T *dx, const T *x, const T *y, int64_t n, T sc) {    \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T v = x[i], e = EXP(-ABS(v));                                                          \
            T sg = v >= 0 ? 1 / (1 + e) : e / (1 + e);                                             \
            dx[i] = (sg - y[i]) * sc;                                                              \
        }                                                                                          \
    }                                                                                              \
    static ts_status bce_bwd_##SFX(const ts_kargs *k) {                                            \
        const T *x = k->in[1].data, *y = k->in[2].data;                                            \
        T *dx = k->out[0].data;                                                                    \
        int64_t n = ts_tensor_numel(&k->in[1]), nb = ts_red_blocks(n);                             \
        T sc = (T)((double)*(const T *)k->in[0].data / (double)n);                                 \
        _Pragma("omp parallel for schedule(static) if (n >= TS_PAR_MIN)") for (int64_t b = 0;      \
                                                                               b < nb; b++) {      \
            int64_t s = b * TS_RED_BLOCK, len = n - s < TS_RED_BLOCK ? n - s : TS_RED_BLOCK;       \
            bce_bwd_chunk_##SFX(dx + s, x + s, y + s, len, sc);                                    \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* log(sum(exp(x))) of one row, max subtracted; a row of -inf gives -inf. Always inlined:      \
     * called on its own it is compiled once, for the baseline target, not in each clone of        \
     * ce_block (W3's [2048, 8192] logits: most of the cross entropy's time). */                   \
    static inline __attribute__((always_inline)) double lse_row_##SFX(const T *x, int64_t c) {     \
        if (c < LN) { /* a few classes: the same sums without the lanes (all 0) */                 \
            T m = (T)-INFINITY;                                                                    \
            for (int64_t i = 0; i < c; i++) m = x[i] > m ? x[i] : m;                               \
            if (m == (T)-INFINITY) m = 0;                                                          \
            double s = 0;                                                                          \
            for (int64_t i = 0; i < c; i++) s += EXP(x[i] - m);                                    \
            return (double)m + log(s);                                                             \
        }                                                                                          \
        T m = ts_row_max_##SFX(x, c);                                                              \
        if (m == (T)-INFINITY) m = 0;                                                              \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = sumexp_simd_##SFX(acc, x, m, c);                                               \
        for (; i + LN <= c; i += LN)                                                               \
            for (int j = 0; j < LN; j++) acc[j] += EXP(x[i + j] - m);                              \
        for (; i < c; i++) s += EXP(x[i] - m);                                                     \
        return (double)m + log(s + ts_lanes_sum(acc));                                             \
    }                                                                                              \
    /* lse of rows [r0, r1) (at most CE_ROWS) of a few classes each, class by                      \
     * class so that every pass runs across the rows in vector lanes (a                            \
     * segmentation's per-voxel CE has millions of rows of 2-16 classes). */                       \
    TS_CLONES static void lse_rows_##SFX(const T *x, T *lse, int64_t r0, int64_t r1, int64_t c) {  \
        T m[CE_ROWS], s[CE_ROWS];                                                                  \
        const int64_t nr = r1 - r0;                                                                \
        const T *xb = x + r0 * c;                                                                  \
        for (int64_t r = 0; r < nr; r++) m[r] = (T)-INFINITY, s[r] = 0;                            \
        for (int64_t i = 0; i < c; i++)                                                            \
            for (int64_t r = 0; r < nr; r++) m[r] = xb[r * c + i] > m[r] ? xb[r * c + i] : m[r];   \
        for (int64_t r = 0; r < nr; r++) m[r] = m[r] == (T)-INFINITY ? (T)0 : m[r];                \
        for (int64_t i = 0; i < c; i++)                                                            \
            for (int64_t r = 0; r < nr; r++) s[r] += EXP(xb[r * c + i] - m[r]);                    \
        for (int64_t r = 0; r < nr; r++) lse[r0 + r] = m[r] + LOG(s[r]);                           \
    }                                                                                              \
    /* One block of rows in one call: lse_row is inlined into each clone, so a                     \
     * row of a few classes (a segmentation's per-voxel CE) costs no call. */                      \
    TS_CLONES static ce_part ce_block_##SFX(const T *x, const void *tg, int is64, const T *wt,     \
                                            T *lse, int64_t r0, int64_t r1, int64_t c,             \
                                            int64_t ign) {                                         \
        ce_part p = {0, 0, -1, 0};                                                                 \
        const int rowwise = ROWWISE && c < LN;                                                     \
        if (rowwise) lse_rows_##SFX(x, lse, r0, r1, c);                                            \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const T *row = x + r * c;                                                              \
            double l = rowwise ? (double)lse[r] : lse_row_##SFX(row, c);                           \
            if (!rowwise) lse[r] = (T)l;                                                           \
            int64_t t = target_at(tg, is64, r);                                                    \
            if (t == ign) continue;                                                                \
            if (t < 0 || t >= c) {                                                                 \
                if (p.bad < 0) p.bad = r;                                                          \
                continue;                                                                          \
            }                                                                                      \
            double wv = wt ? (double)wt[t] : 1.0;                                                  \
            p.sum += wv * (l - (double)row[t]);                                                    \
            p.wsum += wv;                                                                          \
        }                                                                                          \
        return p;                                                                                  \
    }                                                                                              \
    /* The mean loss into *loss from the nb blocks' partials, added in block order; an error       \
     * names the first row with a bad target. */                                                   \
    static ts_status ce_mean_##SFX(const ts_kargs *k, const ce_part *part, int64_t nb,             \
                                   const void *tg, int is64, int64_t n, int64_t c, int64_t ign,    \
                                   T *loss) {                                                      \
        double sum = 0, wsum = 0;                                                                  \
        int64_t any = 0;                                                                           \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            if (part[b].bad >= 0)                                                                  \
                return bad_target(k, "cross_entropy", part[b].bad,                                 \
                                  target_at(tg, is64, part[b].bad), c);                            \
            sum += part[b].sum;                                                                    \
            wsum += part[b].wsum;                                                                  \
        }                                                                                          \
        for (int64_t r = 0; r < n && !any; r++) any = target_at(tg, is64, r) != ign;               \
        /* Every row ignored: 0/0 = NaN, as torch 1.13 (so are zero weights). */                   \
        *loss = (T)(any ? sum / wsum : NAN);                                                       \
        return TS_OK;                                                                              \
    }                                                                                              \
    static ts_status ce_##SFX(const ts_kargs *k) {                                                 \
        const T *x = k->in[0].data;                                                                \
        const void *tg = k->in[1].data;                                                            \
        const T *wt = k->n_in == 3 ? k->in[2].data : NULL;                                         \
        int is64 = k->in[1].dtype == TS_I64;                                                       \
        T *lse = k->out[1].data;                                                                   \
        int64_t n = k->in[0].dims[0], c = k->in[0].dims[1],                                        \
                ign = k->a->cross_entropy.ignore_index;                                            \
        int64_t nb = (n + CE_ROWS - 1) / CE_ROWS;                                                  \
        ce_part *part = k->scratch;                                                                \
        if ((size_t)nb * sizeof(ce_part) > k->scratch_bytes)                                       \
            return ts_fail(TS_ERR_INTERNAL, "cross_entropy '%s': scratch too small", k->label);    \
        _Pragma("omp parallel for schedule(static) if (n * c >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < nb; b++) {  \
            int64_t r1 = (b + 1) * CE_ROWS < n ? (b + 1) * CE_ROWS : n;                            \
            part[b] = ce_block_##SFX(x, tg, is64, wt, lse, b * CE_ROWS, r1, c, ign);               \
        }                                                                                          \
        return ce_mean_##SFX(k, part, nb, tg, is64, n, c, ign, k->out[0].data);                    \
    }                                                                                              \
    /* d may be x itself (in place): x[t] is read before the row is written. */                    \
    TS_CLONES static void ce_bwd_row_##SFX(T *d, const T *x, T lse, int64_t c, int64_t t, T sc) {  \
        const T xt = x[t];                                                                         \
        _Pragma("omp simd") for (int64_t i = scaled_exp_simd_##SFX(d, x, lse, sc, c); i < c; i++)  \
            d[i] = EXP(x[i] - lse) * sc;                                                           \
        d[t] = (EXP(xt - lse) - 1) * sc;                                                           \
    }                                                                                              \
    /* Rows [r0, r1) of a few classes, class by class across the rows (see                         \
     * lse_rows); the same values as ce_bwd_row. dx may be x: the targets'                         \
     * logits are read before any row is written. */                                               \
    TS_CLONES static void ce_bwd_rows_##SFX(T *dx, const T *x, const T *lse, const void *tg,       \
                                            int is64, const T *wt, double sc, int64_t r0,          \
                                            int64_t r1, int64_t c, int64_t ign, int64_t o0) {      \
        T scr[CE_ROWS], xt[CE_ROWS];                                                               \
        int64_t tr[CE_ROWS];                                                                       \
        const int64_t nr = r1 - r0;                                                                \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            int64_t t = target_at(tg, is64, r0 + r);                                               \
            tr[r] = t;                                                                             \
            scr[r] = t == ign ? (T)0 : (T)(wt ? sc * (double)wt[t] : sc);                          \
            xt[r] = t == ign ? (T)0 : x[(r0 + r) * c + t];                                         \
        }                                                                                          \
        T *db = dx + (r0 - o0) * c; /* dx holds rows o0.. */                                       \
        const T *xb = x + r0 * c;                                                                  \
        for (int64_t i = 0; i < c; i++)                                                            \
            for (int64_t r = 0; r < nr; r++)                                                       \
                db[r * c + i] = EXP(xb[r * c + i] - lse[r0 + r]) * scr[r];                         \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            if (tr[r] == ign)                                                                      \
                memset(db + r * c, 0, (size_t)c * sizeof(T));                                      \
            else                                                                                   \
                db[r * c + tr[r]] = (EXP(xt[r] - lse[r0 + r]) - 1) * scr[r];                       \
        }                                                                                          \
    }                                                                                              \
    /* dl / the summed weights of the rows not ignored (0 when all are): the                       \
     * gradient's scale, the whole batch's also for a chunk (chunk_ce.c). dl, logits and           \
     * targets are inputs 0, 1 and 2, the class weights (if any) input wi; op names the op in      \
     * the message on a bad target. */                                                             \
    static ts_status ce_scale_##SFX(const ts_kargs *k, const char *op, int wi, double *sc) {       \
        const T *wt = k->n_in > wi ? k->in[wi].data : NULL;                                        \
        const void *tg = k->in[2].data;                                                            \
        int is64 = k->in[2].dtype == TS_I64;                                                       \
        int64_t n = k->in[1].dims[0], c = k->in[1].dims[1],                                        \
                ign = k->a->cross_entropy.ignore_index;                                            \
        double wsum = 0;                                                                           \
        for (int64_t r = 0; r < n; r++) {                                                          \
            int64_t t = target_at(tg, is64, r);                                                    \
            if (t == ign) continue;                                                                \
            if (t < 0 || t >= c) return bad_target(k, op, r, t, c);                                \
            wsum += wt ? (double)wt[t] : 1.0;                                                      \
        }                                                                                          \
        /* With every row ignored all rows are zero and sc is never used. */                       \
        double dl = (double)*(const T *)k->in[0].data;                                             \
        *sc = wsum != 0 ? dl / wsum : 0;                                                           \
        return TS_OK;                                                                              \
    }                                                                                              \
    static ts_status ce_bwd_##SFX(const ts_kargs *k) {                                             \
        const T *x = k->in[1].data, *lse = k->in[3].data;                                          \
        const void *tg = k->in[2].data;                                                            \
        const T *wt = k->n_in == 5 ? k->in[4].data : NULL;                                         \
        int is64 = k->in[2].dtype == TS_I64;                                                       \
        T *dx = k->out[0].data;                                                                    \
        int64_t c = k->in[1].dims[1], ign = k->a->cross_entropy.ignore_index;                      \
        /* a chunk: rows [o0, o1) into dx (chunk_ce.c) */                                          \
        const int64_t o0 = k->a->cross_entropy.row_start,                                          \
                      o1 = k->a->cross_entropy.row_count > 0 ? o0 + k->a->cross_entropy.row_count  \
                                                             : k->in[1].dims[0];                   \
        double sc;                                                                                 \
        ts_status st = ce_scale_##SFX(k, "cross_entropy_bwd", 4, &sc);                             \
        if (st != TS_OK) return st;                                                                \
        const int64_t m = o1 - o0;                                                                 \
        if (ROWWISE && c < LN) {                                                                   \
            const int64_t nb = (m + CE_ROWS - 1) / CE_ROWS;                                        \
            _Pragma(                                                                               \
                "omp parallel for schedule(static) if (m * c >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < nb; b++) {  \
                int64_t r0 = o0 + b * CE_ROWS, r1 = r0 + CE_ROWS < o1 ? r0 + CE_ROWS : o1;         \
                ce_bwd_rows_##SFX(dx, x, lse, tg, is64, wt, sc, r0, r1, c, ign, o0);               \
            }                                                                                      \
            return TS_OK;                                                                          \
        }                                                                                          \
        _Pragma("omp parallel for schedule(static) if (m * c >= TS_PAR_MIN)") for (int64_t r = o0; \
                                                                                   r < o1; r++) {  \
            int64_t t = target_at(tg, is64, r);                                                    \
            if (t == ign)                                                                          \
                memset(dx + (r - o0) * c, 0, (size_t)c * sizeof(T));                               \
            else                                                                                   \
                ce_bwd_row_##SFX(dx + (r - o0) * c, x + r * c, lse[r], c, t,                       \
                                 (T)(wt ? sc * (double)wt[t] : sc));                               \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

/* Every exp of these losses takes an argument <= 0 (-|x|, x - max, x - lse with lse >= max) or
 * NaN, where m_exp_neg_f32 gives m_exp_f32's bits for less work (W3's fused cross entropy,
 * [2048, 8192] logits: 15.1 -> 12.7 ms in bench/ce_fused.c; the same checkpoints). */
DEF_LOSS(float, f32, m_exp_neg_f32, log1pf, fabsf, m_log_f32, 1)
DEF_LOSS(double, f64, exp, log1p, fabs, log, 0)

/* cross_entropy_bwd writing bf16 (cross_entropy.out_low, f32 logits): each
 * row computed as ce_bwd_row_f32 computes it, in pieces of CE_LOW on the
 * stack, then rounded to nearest even: the bits of the f32 kernel plus a
 * cast, with half the bytes written and no second pass. Any class count
 * (the rows of few classes take this path too: the same values). */
#define CE_LOW 1024
TS_CLONES static void ce_bwd_row_low(uint16_t *d, const float *x, float lse, int64_t c, int64_t t,
                                     float sc) {
    float buf[CE_LOW];
    for (int64_t c0 = 0; c0 < c; c0 += CE_LOW) {
        const int64_t len = c - c0 < CE_LOW ? c - c0 : CE_LOW;
        _Pragma("omp simd") for (int64_t i = ts_ce_scaled_exp_simd(buf, x + c0, lse, sc, len);
                                 i < len; i++) buf[i] = m_exp_neg_f32(x[c0 + i] - lse) * sc;
        if (t >= c0 && t < c0 + len) buf[t - c0] = (m_exp_neg_f32(x[t] - lse) - 1) * sc;
        ts_f32_to_bf16_n(d + c0, buf, len);
    }
}

static ts_status ce_bwd_low(const ts_kargs *k) {
    if (k->in[1].dtype != TS_F32 || k->out[0].dtype != TS_BF16)
        return ts_kernel_bad_dtype(k, "cross_entropy_bwd", k->out[0].dtype);
    const float *x = k->in[1].data, *lse = k->in[3].data;
    const void *tg = k->in[2].data;
    const float *wt = k->n_in == 5 ? k->in[4].data : NULL;
    int is64 = k->in[2].dtype == TS_I64;
    uint16_t *dx = k->out[0].data;
    int64_t c = k->in[1].dims[1], ign = k->a->cross_entropy.ignore_index;
    const int64_t o0 = k->a->cross_entropy.row_start,
                  o1 = k->a->cross_entropy.row_count > 0 ? o0 + k->a->cross_entropy.row_count
                                                         : k->in[1].dims[0],
                  m = o1 - o0;
    double sc;
    ts_status st = ce_scale_f32(k, "cross_entropy_bwd", 4, &sc);
    if (st != TS_OK) return st;
#pragma omp parallel for schedule(static) if (m * c >= TS_PAR_MIN)
    for (int64_t r = o0; r < o1; r++) {
        int64_t t = target_at(tg, is64, r);
        if (t == ign)
            memset(dx + (r - o0) * c, 0, (size_t)c * sizeof *dx);
        else
            ce_bwd_row_low(dx + (r - o0) * c, x + r * c, lse[r], c, t,
                           (float)(wt ? sc * (double)wt[t] : sc));
    }
    return TS_OK;
}

/* ---- cross_entropy_fused --------------------------------------------------
 * The forward and the backward in one pass over f32 logits (made by the
 * fuse_ce pass where the gradient's seed dl is known before the forward):
 * (dl, logits, target[, weight]) -> (dlogits, loss, lse). Each row's lse and
 * loss term are computed as ce_block_f32 computes them and its gradient as
 * ce_bwd_f32 (or, with out_low, ce_bwd_low) computes it, by the same
 * functions, so loss, lse and gradient have the bits of the two ops; but the
 * gradient reads the row while it is still in L1 (W3: 8192 classes, 32 KB),
 * so the logits come from memory once instead of twice. */

/* Row r's gradient into dx (f32) or d16 (bf16), the other NULL; t == ign: zeros. The bf16 row
 * goes in row order, as ce_bwd_low writes it. (Sessions 17-19 wrote it by pieces from the row's
 * end, so that the pieces would evict the parts of the row already done from L1; on session 20's
 * host that made every piece start a new short store stream, and the conversion's stores cost
 * 3.6x as much as in row order: the fused op in W3's step took 15.2 ms that way, 12.8 ms in row
 * order.) Each element is computed alone: the same bits in any order. */
static inline __attribute__((always_inline)) void ce_fused_row_out(float *dx, uint16_t *d16,
                                                                   const float *x, float lse,
                                                                   int64_t r, int64_t c, int64_t t,
                                                                   int64_t ign, float sc) {
    if (t == ign) {
        if (dx) memset(dx + r * c, 0, (size_t)c * sizeof *dx);
        if (d16) memset(d16 + r * c, 0, (size_t)c * sizeof *d16);
    } else if (dx) {
        ce_bwd_row_f32(dx + r * c, x + r * c, lse, c, t, sc);
    } else {
        ce_bwd_row_low(d16 + r * c, x + r * c, lse, c, t, sc);
    }
}

/* Rows [r0, r1) (at most CE_ROWS): the block's loss partial, lse[r0..r1) and the gradient
 * rows. The targets were checked (ce_scale_f32). dx may be x (in place, TS_OPF_INPLACE_IN1):
 * every logit of a row is read before its gradient is written. */
TS_CLONES static ce_part ce_fused_block(float *dx, uint16_t *d16, const float *x, const void *tg,
                                        int is64, const float *wt, float *lse, double sc,
                                        int64_t r0, int64_t r1, int64_t c, int64_t ign) {
    if (c < LN) { /* a few classes: each op's class-by-class form over the block */
        ce_part p = ce_block_f32(x, tg, is64, wt, lse, r0, r1, c, ign);
        if (dx) {
            ce_bwd_rows_f32(dx, x, lse, tg, is64, wt, sc, r0, r1, c, ign, 0);
            return p;
        }
        for (int64_t r = r0; r < r1; r++) {
            const int64_t t = target_at(tg, is64, r);
            ce_fused_row_out(dx, d16, x, lse[r], r, c, t, ign,
                             t == ign ? 0.0f : (float)(wt ? sc * (double)wt[t] : sc));
        }
        return p;
    }
    ce_part p = {0, 0, -1, 0};
    for (int64_t r = r0; r < r1; r++) {
        const float *row = x + r * c;
        const double l = lse_row_f32(row, c);
        lse[r] = (float)l;
        const int64_t t = target_at(tg, is64, r);
        if (t == ign) {
            ce_fused_row_out(dx, d16, x, lse[r], r, c, t, ign, 0.0f);
            continue;
        }
        const double wv = wt ? (double)wt[t] : 1.0;
        p.sum += wv * (l - (double)row[t]);
        p.wsum += wv;
        ce_fused_row_out(dx, d16, x, lse[r], r, c, t, ign, (float)(wt ? sc * wv : sc));
    }
    return p;
}

static ts_status k_ce_fused(const ts_kargs *k) {
    if (k->in[1].dtype != TS_F32)
        return ts_kernel_bad_dtype(k, "cross_entropy_fused", k->in[1].dtype);
    const float *x = k->in[1].data, *wt = k->n_in == 4 ? k->in[3].data : NULL;
    const void *tg = k->in[2].data;
    const int is64 = k->in[2].dtype == TS_I64;
    const int low = k->out[0].dtype == TS_BF16;
    float *dx = low ? NULL : k->out[0].data, *lse = k->out[2].data;
    uint16_t *d16 = low ? k->out[0].data : NULL;
    const int64_t n = k->in[1].dims[0], c = k->in[1].dims[1],
                  ign = k->a->cross_entropy.ignore_index, nb = (n + CE_ROWS - 1) / CE_ROWS;
    ce_part *part = k->scratch;
    if ((size_t)nb * sizeof(ce_part) > k->scratch_bytes)
        return ts_fail(TS_ERR_INTERNAL, "cross_entropy_fused '%s': scratch too small", k->label);
    double sc;
    ts_status st = ce_scale_f32(k, "cross_entropy", 3, &sc);
    if (st != TS_OK) return st;
#pragma omp parallel for schedule(static) if (n * c >= TS_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t r1 = (b + 1) * CE_ROWS < n ? (b + 1) * CE_ROWS : n;
        part[b] = ce_fused_block(dx, d16, x, tg, is64, wt, lse, sc, b * CE_ROWS, r1, c, ign);
    }
    return ce_mean_f32(k, part, nb, tg, is64, n, c, ign, k->out[1].data);
}

static ts_status k_bce(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[0].dtype, "bce_logits", bce_f32, bce_f64);
}
static ts_status k_bce_bwd(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[1].dtype, "bce_logits_bwd", bce_bwd_f32, bce_bwd_f64);
}
static ts_status k_ce(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[0].dtype, "cross_entropy", ce_f32, ce_f64);
}
static ts_status k_ce_bwd(const ts_kargs *k) {
    if (k->a->cross_entropy.out_low) return ce_bwd_low(k);
    TS_FLOAT_DISPATCH(k, k->in[1].dtype, "cross_entropy_bwd", ce_bwd_f32, ce_bwd_f64);
}

static size_t scratch_bce(const ts_graph *g, const ts_node *n) {
    return (size_t)ts_red_blocks(ts_type_numel(ts_in_type(g, n, 0))) * sizeof(double);
}
static size_t scratch_ce(const ts_graph *g, const ts_node *n) {
    int64_t rows = ts_in_type(g, n, 0)->dims[0];
    return (size_t)((rows + CE_ROWS - 1) / CE_ROWS) * sizeof(ce_part);
}

static size_t scratch_ce_fused(const ts_graph *g, const ts_node *n) {
    int64_t rows = ts_in_type(g, n, 1)->dims[0];
    return (size_t)((rows + CE_ROWS - 1) / CE_ROWS) * sizeof(ce_part);
}

static double cost_bce(const ts_graph *g, const ts_node *n) {
    return 6.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
static double cost_bce_bwd(const ts_graph *g, const ts_node *n) {
    return 5.0 * (double)ts_type_numel(ts_in_type(g, n, 1));
}
static double cost_ce(const ts_graph *g, const ts_node *n) {
    return 4.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
static double cost_ce_bwd(const ts_graph *g, const ts_node *n) {
    return 3.0 * (double)ts_type_numel(ts_in_type(g, n, 1));
}

const ts_op_def ts_def_bce_logits = {.name = "bce_logits",
                                     .min_in = 2,
                                     .max_in = 2,
                                     .infer = infer_bce,
                                     .grad = grad_bce,
                                     .kernel = k_bce,
                                     .scratch = scratch_bce,
                                     .cost = cost_bce};

const ts_op_def ts_def_bce_logits_bwd = {.name = "bce_logits_bwd",
                                         .min_in = 3,
                                         .max_in = 3,
                                         .infer = infer_bce_bwd,
                                         .kernel = k_bce_bwd,
                                         .cost = cost_bce_bwd};

const ts_op_def ts_def_cross_entropy = {.name = "cross_entropy",
                                        .min_in = 2,
                                        .max_in = 3,
                                        .infer = infer_ce,
                                        .grad = grad_ce,
                                        .kernel = k_ce,
                                        .scratch = scratch_ce,
                                        .cost = cost_ce};

/* dlogits may take the logits' memory when they die here (W3: 64 MiB). */
const ts_op_def ts_def_cross_entropy_bwd = {.name = "cross_entropy_bwd",
                                            .min_in = 4,
                                            .max_in = 5,
                                            .flags = TS_OPF_INPLACE_IN1,
                                            .infer = infer_ce_bwd,
                                            .kernel = k_ce_bwd,
                                            .cost = cost_ce_bwd};

static double cost_ce_fused(const ts_graph *g, const ts_node *n) {
    return cost_ce(g, n) + cost_ce_bwd(g, n);
}

/* dlogits (output 0) may take the logits' memory when they die here, as
 * cross_entropy_bwd's; made by the fuse_ce pass only (no gradient). */
const ts_op_def ts_def_cross_entropy_fused = {.name = "cross_entropy_fused",
                                              .min_in = 3,
                                              .max_in = 4,
                                              .flags = TS_OPF_INPLACE_IN1,
                                              .infer = infer_ce_fused,
                                              .kernel = k_ce_fused,
                                              .scratch = scratch_ce_fused,
                                              .cost = cost_ce_fused};

/* ---- builders ---------------------------------------------------------- */

ts_val ts_bce_with_logits(ts_graph *g, ts_val logits, ts_val target) {
    ts_val in[2] = {logits, target};
    return ts_node_add(g, TS_OP_BCE_LOGITS, 2, in, NULL, NULL);
}

/* mean((pred - target)^2). Shapes must match: torch broadcasts here with
 * only a warning, which usually hides a bug ([N, 1] against [N]). */
ts_val ts_mse_loss(ts_graph *g, ts_val pred, ts_val target) {
    if (!g || g->status != TS_OK || !ts_val_ok(pred) || !ts_val_ok(target)) return TS_NONE;
    const ts_type *p = &ts_v(g, pred)->t, *t = &ts_v(g, target)->t;
    if (!ts_type_equal(p, t)) {
        char pb[128], tb[128];
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "mse_loss(pred=%s, target=%s): pred and target must have the same "
                             "dtype and shape",
                             ts_type_str(pb, sizeof pb, p), ts_type_str(tb, sizeof tb, t));
    }
    ts_val d = ts_sub(g, pred, target);
    return ts_mean(g, ts_mul(g, d, d), 0, NULL, 0);
}

static ts_val add_ce(ts_graph *g, ts_val logits, ts_val target, ts_val weight,
                     int64_t ignore_index) {
    if (!g || g->status != TS_OK || !ts_val_ok(logits) || !ts_val_ok(target)) return TS_NONE;
    ts_type lt = ts_v(g, logits)->t, tt = ts_v(g, target)->t;
    int ok = lt.rank >= 1 && tt.rank == lt.rank - 1;
    for (int i = 0; ok && i < tt.rank; i++) ok = tt.dims[i] == lt.dims[i];
    if (!ok) {
        char lb[128], tb[128];
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "cross_entropy(logits=%s, target=%s): target must have the shape of "
                             "logits without the last (class) axis",
                             ts_type_str(lb, sizeof lb, &lt), ts_type_str(tb, sizeof tb, &tt));
    }
    if (lt.rank != 2) {
        /* [..., C] and [...] -> [N, C] and [N]: reshapes alias, so this is free. */
        int64_t c = lt.dims[lt.rank - 1], n = ts_type_numel(&tt);
        logits = ts_reshape(g, logits, 2, (int64_t[]){n, c});
        target = ts_reshape(g, target, 1, (int64_t[]){n});
    }
    ts_attrs at = ts_attrs_zero();
    at.cross_entropy.ignore_index = ignore_index;
    ts_val in[3] = {logits, target, weight};
    return ts_node_add(g, TS_OP_CROSS_ENTROPY, ts_val_ok(weight) ? 3 : 2, in, &at, NULL);
}

ts_val ts_cross_entropy(ts_graph *g, ts_val logits, ts_val target, int64_t ignore_index) {
    return add_ce(g, logits, target, TS_NONE, ignore_index);
}

ts_val ts_cross_entropy_weighted(ts_graph *g, ts_val logits, ts_val target, ts_val weight,
                                 int64_t ignore_index) {
    if (g && g->status == TS_OK && !ts_val_ok(weight))
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "cross_entropy_weighted: no weight (use ts_cross_entropy)");
    return add_ce(g, logits, target, weight, ignore_index);
}
