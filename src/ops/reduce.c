/* Reductions over a set of axes: sum (and mean, a scaled sum), max, and
 * the max backward. Attributes a.reduce (core/attrs.h): the axes as a bit
 * mask, keepdim, the scale.
 *
 * Determinism: every output is accumulated in a fixed order that does not
 * depend on the thread count. Long reductions into few outputs are split
 * into fixed blocks of TS_RED_BLOCK elements whose partial sums (in double)
 * land in scratch memory and are then added in block order.
 *
 * A sum with reduce.out_low (the precision pass's, for a bias gradient that
 * a bf16 cast also reads) writes that cast as its second output in the same
 * pass over the input: the same sum bits, the same rounding as the cast. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "core/half.h"
#include "eltwise.h"
#include "kern.h"

static ts_status infer_reduce(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    uint64_t mask = (uint64_t)n->a.reduce.axes;
    if (mask >> a->rank)
        return ts_fail(TS_ERR_INVALID, "axis mask 0x%llx names axes beyond rank %d",
                       (unsigned long long)mask, a->rank);
    if (!ts_dtype_is_float(a->dtype))
        return ts_fail(TS_ERR_SHAPE, "reductions need a float dtype, got %s",
                       ts_dtype_name(a->dtype));
    out->dtype = a->dtype;
    out->rank = 0;
    for (int i = 0; i < a->rank; i++) {
        if (mask >> i & 1) {
            if (n->a.reduce.keepdim) out->dims[out->rank++] = 1;
        } else {
            out->dims[out->rank++] = a->dims[i];
        }
    }
    *n_out = 1;
    if (n->n_in == 2) { /* the sum of unary_bwd(input 0, input 1) */
        const int64_t m = n->a.reduce.axes;
        ts_attrs fa;
        ts_type s = *ts_in_type(g, n, 1); /* side 2 may read a bf16 derivative */
        if (n->a.reduce.bwd.side == 2 && s.dtype == TS_BF16) s.dtype = TS_F32;
        if (n->op != TS_OP_REDUCE_SUM || n->a.reduce.out_low != 1 || m <= 0 || (m & (m + 1)) != 0 ||
            !ts_type_equal(a, &s) ||
            !ts_unary_bwd_chunk_f32(&(ts_attrs){.unary_bwd = n->a.reduce.bwd}, &fa))
            return ts_fail(
                TS_ERR_INVALID,
                "a sum with a second input needs out_low 1, leading axes (mask "
                "0x%llx), two f32 inputs of one shape (the second bf16 with side 2) and a "
                "unary_bwd rule (bwd)",
                (unsigned long long)m);
    }
    if (n->a.reduce.out_low) {
        if (n->op != TS_OP_REDUCE_SUM || n->a.reduce.out_low != 1 || a->dtype != TS_F32)
            return ts_fail(TS_ERR_INVALID,
                           "out_low (a bf16 copy of the input) is 1 on a sum of f32 only");
        out[1] = *a;
        out[1].dtype = TS_BF16;
        *n_out = 2;
    }
    return TS_OK;
}

static ts_status infer_max_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_node fwd = *n;
    fwd.in = n->in + 1; /* x */
    ts_status s = infer_reduce(g, &fwd, out, n_out);
    if (s != TS_OK) return s;
    if (!ts_type_equal(out, ts_in_type(g, n, 0)) || !ts_type_equal(out, ts_in_type(g, n, 2)))
        return ts_fail(TS_ERR_SHAPE, "dy and y must have the reduced shape");
    *out = *ts_in_type(g, n, 1);
    return TS_OK;
}

/* dy has the reduced shape: reshape it to keepdim form and expand back. */
static ts_val keepdim_form(ts_graph *g, ts_val v, const ts_type *x, uint64_t mask) {
    int64_t dims[TS_MAX_RANK] = {0};
    for (int i = 0; i < x->rank; i++) dims[i] = (mask >> i & 1) ? 1 : x->dims[i];
    return ts_reshape(g, v, x->rank, dims);
}

static ts_status grad_sum(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_type x = *ts_in_type(g, n, 0);
    ts_val d = keepdim_form(g, dy[0], &x, (uint64_t)n->a.reduce.axes);
    if (n->a.reduce.scale != 1.0) d = ts_affine_scalar(g, d, n->a.reduce.scale, 0.0);
    ts_attrs at = ts_attrs_zero();
    at.shape.rank = x.rank;
    for (int i = 0; i < x.rank; i++) at.shape.dims[i] = x.dims[i];
    din[0] = ts_node_add(g, TS_OP_EXPAND, 1, &d, &at, NULL);
    return ts_graph_status(g);
}

static ts_status grad_max(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_val in[3] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->out[0])};
    din[0] = ts_node_add(g, TS_OP_REDUCE_MAX_BWD, 3, in, &n->a, NULL);
    return ts_graph_status(g);
}

/* The input viewed as [outer, red, inner] groups after merging adjacent
 * axes of the same kind. Only the patterns [K, R, K'] (any of them may be
 * 1) are handled by the fast paths; others use the generic walk. */
typedef struct red_shape {
    int nd;
    int64_t d[TS_MAX_RANK];
    int r[TS_MAX_RANK]; /* 1 if reduced */
} red_shape;

static void merge_axes(const ts_tensor *x, uint64_t mask, red_shape *s) {
    s->nd = 0;
    for (int i = 0; i < x->rank; i++) {
        int r = mask >> i & 1;
        if (x->dims[i] == 1) continue;
        if (s->nd && s->r[s->nd - 1] == r) {
            s->d[s->nd - 1] *= x->dims[i];
        } else {
            s->d[s->nd] = x->dims[i];
            s->r[s->nd++] = r;
        }
    }
}

/* Split into outer (kept), red (reduced), inner (kept) if the pattern fits. */
static int as_ori(const red_shape *s, int64_t *outer, int64_t *red, int64_t *inner) {
    *outer = *red = *inner = 1;
    int i = 0;
    if (i < s->nd && !s->r[i]) *outer = s->d[i++];
    if (i < s->nd && s->r[i]) *red = s->d[i++];
    if (i < s->nd && !s->r[i]) *inner = s->d[i++];
    return i == s->nd;
}

static size_t scratch_reduce(const ts_graph *g, const ts_node *n) {
    const ts_type *x = ts_in_type(g, n, 0);
    /* Partial sums for the [outer, red] case: outer * ceil(red / block)
     * doubles, which is at most blocks(numel) + outer, and outer <= outputs. */
    int64_t numel = ts_type_numel(x), outputs = ts_type_numel(&g->values[n->out[0]].t);
    return (size_t)(ts_red_blocks(numel) + outputs + 1) * sizeof(double) + 64;
}

#define DEF_SUM(T, SFX)                                                                            \
    TS_CLONES static double sum_contig_##SFX(const T *p, int64_t n) {                              \
        double acc[8] = {0};                                                                       \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= n; i += 8)                                                                 \
            for (int j = 0; j < 8; j++) acc[j] += (double)p[i + j];                                \
        double s = 0;                                                                              \
        for (; i < n; i++) s += (double)p[i];                                                      \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + \
               s;                                                                                  \
    }                                                                                              \
    /* o[j] = sc * sum_r p[r*stride + j] for j < inner, rows in order: vectorised over j. */       \
    TS_CLONES static void sum_cols_##SFX(T *o, const T *p, int64_t red, int64_t inner,             \
                                         int64_t stride, double sc) {                              \
        for (int64_t j0 = 0; j0 < inner; j0 += 256) {                                              \
            int64_t len = inner - j0 < 256 ? inner - j0 : 256;                                     \
            double acc[256];                                                                       \
            for (int64_t j = 0; j < len; j++) acc[j] = 0;                                          \
            for (int64_t r = 0; r < red; r++) {                                                    \
                const T *row = p + r * stride + j0;                                                \
                for (int64_t j = 0; j < len; j++) acc[j] += (double)row[j];                        \
            }                                                                                      \
            for (int64_t j = 0; j < len; j++) o[j0 + j] = (T)(acc[j] * sc);                        \
        }                                                                                          \
    }                                                                                              \
    static ts_status sum_##SFX(const ts_kargs *k) {                                                \
        const ts_tensor *x = &k->in[0];                                                            \
        const T *p = x->data;                                                                      \
        T *o = k->out[0].data;                                                                     \
        double sc = k->a->reduce.scale;                                                            \
        red_shape s;                                                                               \
        merge_axes(x, (uint64_t)k->a->reduce.axes, &s);                                            \
        int64_t outer, red, inner;                                                                 \
        if (as_ori(&s, &outer, &red, &inner)) {                                                    \
            if (inner == 1) {                                                                      \
                /* Each output sums a contiguous run: fixed blocks, partials in order. */          \
                int64_t nb = ts_red_blocks(red);                                                   \
                double *part = k->scratch;                                                         \
                _Pragma("omp parallel for schedule(static) if (outer * red >= TS_PAR_MIN)") for (  \
                    int64_t t = 0; t < outer * nb; t++) {                                          \
                    int64_t oi = t / nb, b = t % nb, st = b * TS_RED_BLOCK;                        \
                    int64_t len = red - st < TS_RED_BLOCK ? red - st : TS_RED_BLOCK;               \
                    part[t] = sum_contig_##SFX(p + oi * red + st, len);                            \
                }                                                                                  \
                for (int64_t oi = 0; oi < outer; oi++) {                                           \
                    double acc = 0;                                                                \
                    for (int64_t b = 0; b < nb; b++) acc += part[oi * nb + b];                     \
                    o[oi] = (T)(acc * sc);                                                         \
                }                                                                                  \
            } else {                                                                               \
                int64_t ncb = (inner + 255) / 256;                                                 \
                int64_t work = outer * red * inner;                                                \
                _Pragma(                                                                           \
                    "omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t =  \
                                                                                          0;       \
                                                                                      t <          \
                                                                                      outer * ncb; \
                                                                                      t++) {       \
                    int64_t oi = t / ncb, cb = t % ncb, j0 = cb * 256;                             \
                    int64_t len = inner - j0 < 256 ? inner - j0 : 256;                             \
                    /* this block's 256 columns only (the row stride stays inner) */               \
                    sum_cols_##SFX(o + oi * inner + j0, p + oi * red * inner + j0, red, len,       \
                                   inner, sc);                                                     \
                }                                                                                  \
            }                                                                                      \
            return TS_OK;                                                                          \
        }                                                                                          \
        /* Generic (e.g. axes {0, 2} of [N, C, S]): each output, in parallel, sums its             \
         * reduced positions with an odometer over the merged reduced axes, innermost              \
         * contiguous runs first: a fixed order whatever the thread count. */                      \
        int64_t no = ts_tensor_numel(&k->out[0]);                                                  \
        int64_t kd[TS_MAX_RANK], ks[TS_MAX_RANK], rd[TS_MAX_RANK], rs[TS_MAX_RANK];                \
        int nk = 0, nr = 0;                                                                        \
        int64_t stride = 1;                                                                        \
        for (int i = s.nd - 1; i >= 0; i--) {                                                      \
            if (s.r[i])                                                                            \
                rd[nr] = s.d[i], rs[nr++] = stride;                                                \
            else                                                                                   \
                kd[nk] = s.d[i], ks[nk++] = stride;                                                \
            stride *= s.d[i];                                                                      \
        }                                                                                          \
        int64_t nred = 1;                                                                          \
        for (int i = 0; i < nr; i++) nred *= rd[i];                                                \
        _Pragma(                                                                                   \
            "omp parallel for schedule(static) if (no * nred >= TS_PAR_MIN)") for (int64_t oi = 0; \
                                                                                   oi < no;        \
                                                                                   oi++) {         \
            int64_t base = 0, rem = oi;                                                            \
            for (int i = 0; i < nk; i++) {                                                         \
                base += (rem % kd[i]) * ks[i];                                                     \
                rem /= kd[i];                                                                      \
            }                                                                                      \
            int64_t idx[TS_MAX_RANK] = {0};                                                        \
            double acc = 0;                                                                        \
            for (int64_t r = 0; r < nred; r += rd[0]) {                                            \
                int64_t off = base;                                                                \
                for (int i = 1; i < nr; i++) off += idx[i] * rs[i];                                \
                const T *run = p + off;                                                            \
                for (int64_t j = 0; j < rd[0]; j++) acc += (double)run[j * rs[0]];                 \
                for (int i = 1; i < nr && ++idx[i] == rd[i]; i++) idx[i] = 0;                      \
            }                                                                                      \
            o[oi] = (T)(acc * sc);                                                                 \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

DEF_SUM(float, f32)
DEF_SUM(double, f64)

/* Columns per piece of sum_cols_low: its double sums stay in L1 beside the row piece. */
#define SUM_LOW_COLS 2048

/* Rows r < red, columns [0, len) of a row stride `stride`: the column sums in row order, as
 * sum_cols_f32 adds them (the same bits), and each row piece rounded to bf16 into low as
 * ts_f32_to_bf16 (the cast op) rounds it: the sum and the cast in one pass over p, a row
 * piece of up to SUM_LOW_COLS contiguous floats at a time (sum_cols_f32's pieces of 256
 * columns walk the rows with a jump after each kilobyte). With f, the pieces summed and
 * rounded are f(p, ps), computed into the stack by the unary_bwd kernel's own chunk
 * function (its bits); a bf16 ps (pg: a bf16 plan's GELU derivative, side 2) is widened
 * into the stack first, a row piece at a time. */
TS_CLONES static void sum_cols_low(float *o, uint16_t *low, const float *p, const float *ps,
                                   const uint16_t *pg, ts_unary_bwd_chunk_fn f, const ts_attrs *fa,
                                   int64_t red, int64_t len, int64_t stride, double sc) {
    double acc[SUM_LOW_COLS];
    float buf[SUM_LOW_COLS], gbuf[SUM_LOW_COLS];
    for (int64_t j = 0; j < len; j++) acc[j] = 0;
    for (int64_t r = 0; r < red; r++) {
        const float *row = p + r * stride;
        uint16_t *lrow = low + r * stride;
        /* With f (a GELU backward: W3's [2048, 2048] dA and g, 24 MiB from memory), the next
         * row piece requested while this one is computed: 1.53 -> 1.22 ms in bench_gelu_grad.
         * (Two rows ahead 1.38, four 1.31; the GELU forward, the cross entropy and the layer
         * norms measured no gain from the same, and the layer norm's backward lost 5 %.) */
        if (f && r + 1 < red) {
            for (int64_t j = 0; j < len; j += 16) __builtin_prefetch(row + stride + j, 0, 3);
            if (pg)
                for (int64_t j = 0; j < len; j += 32)
                    __builtin_prefetch(pg + (r + 1) * stride + j, 0, 3);
        }
        if (f) {
            const float *srow = ps ? ps + r * stride : gbuf;
            if (pg) ts_bf16_to_f32_n(gbuf, pg + r * stride, len); /* core/half.c: 64 bytes wide */
            f(buf, row, srow, len, fa);
            row = buf;
        }
        for (int64_t j = 0; j < len; j++) acc[j] += (double)row[j];
        /* apart from the sum (one loop of both vectorises with half-width vectors), and in
         * core/half.c, whose variants store bf16 64 bytes wide where this one's could not */
        ts_f32_to_bf16_n(lrow, row, len);
    }
    for (int64_t j = 0; j < len; j++) o[j] = (float)(acc[j] * sc);
}

/* sum with out_low: output 1 is the (summed) input rounded to bf16. The [outer, red, inner > 1]
 * pattern (a bias gradient: the leading axes reduced) rounds while it sums; any other pattern
 * sums, then rounds in a second pass. With a second input (leading axes only, inference
 * checks) the summed value is unary_bwd(input 0, input 1), always by columns. Each column's
 * rows are added in order whatever the pieces, so the pieces follow the thread count. */
static ts_status sum_low(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0];
    /* a bf16 second input: a bf16 plan's GELU derivative (side 2, the product d * s) */
    const int glow = k->n_in == 2 && k->in[1].dtype == TS_BF16;
    if (x->dtype != TS_F32 || k->n_out != 2 || k->out[0].dtype != TS_F32 ||
        k->out[1].dtype != TS_BF16 || (k->n_in == 2 && k->in[1].dtype != TS_F32 && !glow) ||
        (glow && (k->a->reduce.bwd.fwd_op != TS_OP_GELU || k->a->reduce.bwd.side != 2)))
        return ts_kernel_bad_dtype(k, "sum (out_low)", k->n_in == 2 ? k->in[1].dtype : x->dtype);
    const float *p = x->data, *ps = k->n_in == 2 && !glow ? k->in[1].data : NULL;
    const uint16_t *pg = glow ? k->in[1].data : NULL;
    float *o = k->out[0].data;
    uint16_t *low = k->out[1].data;
    ts_attrs fa = ts_attrs_zero();
    ts_unary_bwd_chunk_fn f =
        k->n_in == 2 ? ts_unary_bwd_chunk_f32(&(ts_attrs){.unary_bwd = k->a->reduce.bwd}, &fa)
                     : NULL;
    if (k->n_in == 2 && !f)
        return ts_fail(TS_ERR_INTERNAL, "sum '%s': no unary_bwd rule for forward op %lld",
                       k->label ? k->label : "?", (long long)k->a->reduce.bwd.fwd_op);
    red_shape s;
    merge_axes(x, (uint64_t)k->a->reduce.axes, &s);
    int64_t outer, red, inner;
    if (!as_ori(&s, &outer, &red, &inner) || (inner == 1 && !f)) {
        ts_status st = sum_f32(k);
        if (st == TS_OK) ts_f32_to_bf16_n(low, p, ts_tensor_numel(x));
        return st;
    }
    const double sc = k->a->reduce.scale;
    const int64_t work = outer * red * inner;
    const int64_t nt = work >= TS_PAR_MIN ? omp_get_max_threads() : 1;
    int64_t width = (inner + nt - 1) / nt;
    width = width > SUM_LOW_COLS ? SUM_LOW_COLS : (width + 15) / 16 * 16;
    const int64_t ncb = (inner + width - 1) / width;
#pragma omp parallel for schedule(static) if (work >= TS_PAR_MIN)
    for (int64_t t = 0; t < outer * ncb; t++) {
        int64_t oi = t / ncb, j0 = (t % ncb) * width;
        int64_t len = inner - j0 < width ? inner - j0 : width, base = oi * red * inner + j0;
        sum_cols_low(o + oi * inner + j0, low + base, p + base, ps ? ps + base : NULL,
                     pg ? pg + base : NULL, f, &fa, red, len, inner, sc);
    }
    return TS_OK;
}

static ts_status k_sum(const ts_kargs *k) {
    if (k->a->reduce.out_low) return sum_low(k);
    TS_FLOAT_DISPATCH(k, k->in[0].dtype, "sum", sum_f32, sum_f64);
}

/* Output index of every input element: strides of the output (0 on reduced axes). */
static void out_strides(const ts_tensor *x, uint64_t mask, int64_t *ostr) {
    int64_t st = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        int r = mask >> i & 1;
        ostr[i] = r ? 0 : st;
        if (!r) st *= x->dims[i];
    }
}

static inline int64_t out_index(int64_t e, const ts_tensor *x, const int64_t *ostr) {
    int64_t off = 0;
    for (int i = x->rank - 1; i >= 0; i--) {
        off += (e % x->dims[i]) * ostr[i];
        e /= x->dims[i];
    }
    return off;
}

#define DEF_MAX(T, SFX)                                                                            \
    static ts_status max_##SFX(const ts_kargs *k) {                                                \
        const ts_tensor *x = &k->in[0];                                                            \
        const T *p = x->data;                                                                      \
        T *o = k->out[0].data;                                                                     \
        red_shape s;                                                                               \
        merge_axes(x, (uint64_t)k->a->reduce.axes, &s);                                            \
        int64_t outer, red, inner, no = ts_tensor_numel(&k->out[0]), nx = ts_tensor_numel(x);      \
        if (as_ori(&s, &outer, &red, &inner)) {                                                    \
            _Pragma("omp parallel for schedule(static) if (nx >= TS_PAR_MIN)") for (int64_t oi =   \
                                                                                        0;         \
                                                                                    oi < outer;    \
                                                                                    oi++) {        \
                T *dst = o + oi * inner;                                                           \
                const T *src = p + oi * red * inner;                                               \
                for (int64_t j = 0; j < inner; j++) dst[j] = src[j];                               \
                for (int64_t r = 1; r < red; r++)                                                  \
                    for (int64_t j = 0; j < inner; j++) {                                          \
                        T v = src[r * inner + j];                                                  \
                        if (v > dst[j] || v != v) dst[j] = v;                                      \
                    }                                                                              \
            }                                                                                      \
            return TS_OK;                                                                          \
        }                                                                                          \
        int64_t ostr[TS_MAX_RANK];                                                                 \
        out_strides(x, (uint64_t)k->a->reduce.axes, ostr);                                         \
        for (int64_t i = 0; i < no; i++) o[i] = (T)-INFINITY;                                      \
        for (int64_t e = 0; e < nx; e++) {                                                         \
            int64_t oi = out_index(e, x, ostr);                                                    \
            if (p[e] > o[oi] || p[e] != p[e]) o[oi] = p[e];                                        \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* dx = dy * (x == y) / (number of ties): torch's amax backward. */                            \
    static ts_status max_bwd_##SFX(const ts_kargs *k) {                                            \
        const ts_tensor *x = &k->in[1];                                                            \
        const T *dy = k->in[0].data, *px = x->data, *y = k->in[2].data;                            \
        T *dx = k->out[0].data;                                                                    \
        int64_t no = ts_tensor_numel(&k->in[0]), nx = ts_tensor_numel(x);                          \
        double *cnt = k->scratch;                                                                  \
        int64_t ostr[TS_MAX_RANK];                                                                 \
        out_strides(x, (uint64_t)k->a->reduce.axes, ostr);                                         \
        for (int64_t i = 0; i < no; i++) cnt[i] = 0;                                               \
        for (int64_t e = 0; e < nx; e++) {                                                         \
            int64_t oi = out_index(e, x, ostr);                                                    \
            cnt[oi] += px[e] == y[oi];                                                             \
        }                                                                                          \
        for (int64_t e = 0; e < nx; e++) {                                                         \
            int64_t oi = out_index(e, x, ostr);                                                    \
            dx[e] = px[e] == y[oi] ? (T)(dy[oi] / cnt[oi]) : (T)0;                                 \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

DEF_MAX(float, f32)
DEF_MAX(double, f64)

static ts_status k_max(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[0].dtype, "max", max_f32, max_f64);
}

static ts_status k_max_bwd(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[1].dtype, "max_bwd", max_bwd_f32, max_bwd_f64);
}

static size_t scratch_max_bwd(const ts_graph *g, const ts_node *n) {
    return (size_t)ts_type_numel(ts_in_type(g, n, 0)) * sizeof(double) + 64;
}

static double cost_reduce(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(ts_in_type(g, n, 0));
}

const ts_op_def ts_def_reduce_sum = {.name = "sum",
                                     .min_in = 1,
                                     .max_in = 2, /* out_low with bwd (see infer_reduce) */
                                     .infer = infer_reduce,
                                     .grad = grad_sum,
                                     .kernel = k_sum,
                                     .scratch = scratch_reduce,
                                     .cost = cost_reduce};

const ts_op_def ts_def_reduce_max = {.name = "max",
                                     .min_in = 1,
                                     .max_in = 1,
                                     .infer = infer_reduce,
                                     .grad = grad_max,
                                     .kernel = k_max,
                                     .cost = cost_reduce};

const ts_op_def ts_def_reduce_max_bwd = {.name = "max_bwd",
                                         .min_in = 3,
                                         .max_in = 3,
                                         .infer = infer_max_bwd,
                                         .kernel = k_max_bwd,
                                         .scratch = scratch_max_bwd,
                                         .cost = cost_reduce};

/* ---- builders ---------------------------------------------------------- */

static ts_val reduce(ts_graph *g, int op, const char *what, ts_val a, int naxes, const int *axes,
                     int keepdim, int mean) {
    if (!g || g->status != TS_OK || !ts_val_ok(a)) return TS_NONE;
    int rank = ts_rank(g, a);
    uint64_t mask = 0;
    if (naxes == 0) {
        mask = rank ? ((1ull << rank) - 1) : 0;
    } else {
        if (!axes) return ts_graph_fail(g, TS_ERR_INVALID, "%s: axes is NULL", what);
        for (int i = 0; i < naxes; i++) {
            int ax = ts_axis(axes[i], rank);
            if (ax < 0)
                return ts_graph_fail(g, TS_ERR_INVALID, "%s: axis %d out of range for rank %d",
                                     what, axes[i], rank);
            if (mask >> ax & 1)
                return ts_graph_fail(g, TS_ERR_INVALID, "%s: axis %d given twice", what, axes[i]);
            mask |= 1ull << ax;
        }
    }
    int64_t count = 1;
    for (int i = 0; i < rank; i++)
        if (mask >> i & 1) count *= ts_dim(g, a, i);
    ts_attrs at = ts_attrs_zero();
    at.reduce.axes = (int64_t)mask;
    at.reduce.keepdim = keepdim != 0;
    at.reduce.scale = mean ? 1.0 / (double)count : 1.0;
    return ts_node_add(g, op, 1, &a, &at, NULL);
}

ts_val ts_sum(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim) {
    return reduce(g, TS_OP_REDUCE_SUM, "sum", a, naxes, axes, keepdim, 0);
}
ts_val ts_mean(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim) {
    return reduce(g, TS_OP_REDUCE_SUM, "mean", a, naxes, axes, keepdim, 1);
}
ts_val ts_max(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim) {
    return reduce(g, TS_OP_REDUCE_MAX, "max", a, naxes, axes, keepdim, 0);
}
