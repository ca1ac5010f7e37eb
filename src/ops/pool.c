/* Pooling over 1, 2 or 3 spatial dims (PyTorch layout x [N, C, (D,) (H,) W]):
 * max, average (count_include_pad either way) and adaptive average, as one
 * op with a mode, and its backward op.
 *
 * Attributes: a.pool (core/attrs.h). Channels last, the windows and the
 * tie rule are the same, and the kernels run over channel vectors.
 *
 * Windows follow torch (floor mode): max and average windows start at
 * o*stride - padding and are clipped to the input; the average divides by
 * the clipped window size, or with count_include_pad by the window clipped
 * to the padded input. Adaptive windows span [floor(o*in/out),
 * ceil((o+1)*in/out)) and divide by their size. Max pooling picks the
 * first maximum of the window in row-major order, and a NaN wins (torch's
 * argmax rule); its gradient goes to that element only.
 *
 * pool (x) -> y; pool_bwd (dy[, x]) -> dx takes x in max mode only (to find
 * the maximum again, so no index tensor is kept between the passes). The
 * kernels parallelise over output rows (forward) and (n, c) planes
 * (backward): each task owns its outputs, so results do not depend on the
 * thread count.
 *
 * No oneDNN path: on W4's first pooling (x [4,16,32,32,32], kernel 2, one
 * thread) these kernels take ~5.7 ms forward and ~6.8 ms backward, oneDNN's
 * plain-layout max pooling ~3.9 ms forward, and its max backward needs an
 * index workspace carried from the forward instruction. */
#include <math.h>
#include <string.h>
#include "kern.h"

enum { POOL_MAX = 0, POOL_AVG = 1, POOL_AVG_PAD = 2, POOL_ADAPTIVE_AVG = 3 };

/* Largest spatial size, kernel and stride (2^21 - 1: the bound of the
 * 21-bit fields pool_bwd's input sizes were once packed in). */
#define FIELD_MAX ((INT64_C(1) << 21) - 1)

static const char *mode_name(int64_t m) {
    switch (m) {
    case POOL_MAX: return "max";
    case POOL_AVG: return "avg";
    case POOL_AVG_PAD: return "avg (count_include_pad)";
    default: return "adaptive avg";
    }
}

/* Geometry right-aligned in 3 spatial slots (unused leading slots: 1). */
typedef struct pgeo {
    int nd, mode, cl;
    int64_t N, C;
    int64_t in[3], out[3], k[3], s[3], p[3];
} pgeo;

static void geo_make(pgeo *q, const ts_attrs *a, const int64_t *xd, const int64_t *yd) {
    q->nd = (int)a->pool.nd;
    q->mode = (int)a->pool.mode;
    q->cl = a->pool.channels_last != 0;
    const int sp = q->cl ? 1 : 2;
    q->N = xd[0];
    q->C = xd[q->cl ? q->nd + 1 : 1];
    for (int j = 0; j < 3; j++) q->in[j] = q->out[j] = q->k[j] = q->s[j] = 1, q->p[j] = 0;
    for (int j = 0; j < q->nd; j++) {
        int t = 3 - q->nd + j;
        q->in[t] = xd[sp + j];
        q->out[t] = yd[sp + j];
        q->k[t] = a->pool.kernel[j];
        q->s[t] = a->pool.stride[j];
        q->p[t] = a->pool.padding[j];
    }
}

/* Window of output o along slot t: elements [*lo, *hi) of the input, and
 * (average modes) the count torch divides by along this dim. */
static void window(const pgeo *q, int t, int64_t o, int64_t *lo, int64_t *hi, int64_t *cnt) {
    int64_t in = q->in[t];
    if (q->mode == POOL_ADAPTIVE_AVG) {
        int64_t out = q->out[t];
        *lo = o * in / out;
        *hi = ((o + 1) * in + out - 1) / out;
        *cnt = *hi - *lo;
        return;
    }
    int64_t a = o * q->s[t] - q->p[t], b = a + q->k[t];
    int64_t bp = b < in + q->p[t] ? b : in + q->p[t]; /* clipped to the padded input */
    *lo = a > 0 ? a : 0;
    *hi = b < in ? b : in;
    *cnt = q->mode == POOL_AVG_PAD ? bp - a : *hi - *lo;
}

/* ---- inference --------------------------------------------------------- */

static ts_status check_pool(const ts_node *n, const ts_type *x) {
    const ts_pool_attrs *c = &n->a.pool;
    if (c->nd < 1 || c->nd > 3)
        return ts_fail(TS_ERR_INVALID, "spatial rank must be 1, 2 or 3, got %lld",
                       (long long)c->nd);
    int nd = (int)c->nd;
    if (c->mode < POOL_MAX || c->mode > POOL_ADAPTIVE_AVG)
        return ts_fail(TS_ERR_INVALID, "unknown pooling mode %lld", (long long)c->mode);
    if (c->channels_last != 0 && c->channels_last != 1)
        return ts_fail(TS_ERR_INVALID, "layout flag must be 0 or 1, got %lld",
                       (long long)c->channels_last);
    const int sp = c->channels_last ? 1 : 2;
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "x must be a float type, got %s", ts_dtype_name(x->dtype));
    if (x->rank != nd + 2)
        return ts_fail(
            TS_ERR_SHAPE,
            "x must have rank %d (%s with %d spatial dims) for %d-d pooling, got rank %d", nd + 2,
            c->channels_last ? "[N, spatial..., C]" : "[N, C, spatial...]", nd, nd, x->rank);
    for (int j = 0; j < x->rank; j++)
        if (x->dims[j] < 1 || (j >= sp && j < sp + nd && x->dims[j] > FIELD_MAX))
            return ts_fail(TS_ERR_SHAPE, "x axis %d has size %lld", j, (long long)x->dims[j]);
    for (int j = 0; j < nd; j++) {
        int64_t k = c->kernel[j], s = c->stride[j], p = c->padding[j];
        if (c->mode == POOL_ADAPTIVE_AVG) {
            if (k < 1 || k > FIELD_MAX)
                return ts_fail(TS_ERR_INVALID,
                               "output size of spatial dim %d must be >= 1, got %lld", j,
                               (long long)k);
            continue;
        }
        if (k < 1 || s < 1 || p < 0 || k > FIELD_MAX || s > FIELD_MAX)
            return ts_fail(TS_ERR_INVALID,
                           "spatial dim %d: kernel %lld, stride %lld, padding %lld (need kernel "
                           ">= 1, stride >= 1, padding >= 0)",
                           j, (long long)k, (long long)s, (long long)p);
        if (2 * p > k)
            return ts_fail(TS_ERR_INVALID,
                           "spatial dim %d: padding %lld is more than half the kernel %lld", j,
                           (long long)p, (long long)k);
        if (x->dims[sp + j] + 2 * p < k)
            return ts_fail(TS_ERR_SHAPE,
                           "spatial dim %d: kernel %lld is larger than the padded input %lld + "
                           "2*%lld",
                           j, (long long)k, (long long)x->dims[sp + j], (long long)p);
    }
    return TS_OK;
}

static void pool_out_dims(const ts_node *n, const ts_type *x, ts_type *y) {
    int nd = (int)n->a.pool.nd, sp = n->a.pool.channels_last ? 1 : 2;
    *y = *x;
    for (int j = 0; j < nd; j++) {
        int64_t k = n->a.pool.kernel[j], s = n->a.pool.stride[j], p = n->a.pool.padding[j];
        y->dims[sp + j] =
            n->a.pool.mode == POOL_ADAPTIVE_AVG ? k : (x->dims[sp + j] + 2 * p - k) / s + 1;
    }
}

static ts_status infer_pool(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0);
    ts_status s = check_pool(n, x);
    if (s != TS_OK) return s;
    pool_out_dims(n, x, out);
    *n_out = 1;
    return TS_OK;
}

/* (dy[, x]) -> dx; dx's spatial sizes from in_size[]. */
static ts_status infer_pool_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *dy = ts_in_type(g, n, 0);
    int nd = (int)n->a.pool.nd;
    if (nd < 1 || nd > 3 || dy->rank != nd + 2)
        return ts_fail(TS_ERR_SHAPE, "dy must have rank spatial rank + 2 (spatial rank %d)", nd);
    int want_in = n->a.pool.mode == POOL_MAX ? 2 : 1;
    if (n->n_in != want_in)
        return ts_fail(TS_ERR_INVALID, "%s pooling backward takes %d inputs, got %d",
                       mode_name(n->a.pool.mode), want_in, n->n_in);
    ts_type x = *dy;
    const int sp = n->a.pool.channels_last ? 1 : 2;
    for (int j = 0; j < nd; j++) x.dims[sp + j] = n->a.pool.in_size[j];
    if (want_in == 2 && !ts_type_equal(&x, ts_in_type(g, n, 1)))
        return ts_fail(TS_ERR_SHAPE, "x does not have the input shape recorded in the attributes");
    ts_status s = check_pool(n, &x);
    if (s != TS_OK) return s;
    ts_type y;
    pool_out_dims(n, &x, &y);
    if (!ts_type_equal(&y, dy)) return ts_fail(TS_ERR_SHAPE, "dy does not have the pooled shape");
    *out = x;
    *n_out = 1;
    return TS_OK;
}

/* ---- gradient ---------------------------------------------------------- */

static ts_status grad_pool(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return TS_OK;
    ts_val x = ts_mkval(n->in[0]);
    ts_attrs at = n->a;
    int nd = (int)at.pool.nd;
    const int sp = at.pool.channels_last ? 1 : 2;
    for (int j = 0; j < 3; j++) at.pool.in_size[j] = j < nd ? ts_dim(g, x, sp + j) : 0;
    ts_val in[2] = {dy[0], x};
    din[0] = ts_node_add(g, TS_OP_POOL_BWD, at.pool.mode == POOL_MAX ? 2 : 1, in, &at, NULL);
    return ts_graph_status(g);
}

/* ---- reference kernels -------------------------------------------------- */

/* The range [lo, hi) of outputs o in [o0, o1) with 0 <= o*s + off < in. */
static void tap_range(int64_t off, int64_t s, int64_t in, int64_t o0, int64_t o1, int64_t *lo,
                      int64_t *hi) {
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = in - 1 - off < 0 ? 0 : (in - 1 - off) / s + 1;
    *lo = l > o0 ? l : o0;
    *hi = h < o1 ? h : o1;
}

/* Outputs of a row handled together by the backward kernels (stack arrays). */
#define CHUNK 64

/* Max and average windows have one shape along W, so a row of outputs is
 * built tap by tap: for each (d, h) of the window and each kw, one pass
 * over the outputs, which vectorises and has no data-dependent branch.
 * Taps come in row-major window order, so the maximum (and its index) is
 * the first one as with a per-window scan. Adaptive windows vary in size
 * and are scanned one by one. */
#define DEF_POOL(T, SFX)                                                                           \
    /* Adaptive windows: y[n, c, od, oh, :] one output at a time. */                               \
    static void adaptive_row_##SFX(T *yr, const T *xp, const pgeo *q, const int64_t *lo,           \
                                   const int64_t *hi, const int64_t *cnt) {                        \
        int64_t l[3] = {lo[0], lo[1], 0}, h[3] = {hi[0], hi[1], 0}, c2;                            \
        for (int64_t ow = 0; ow < q->out[2]; ow++) {                                               \
            window(q, 2, ow, &l[2], &h[2], &c2);                                                   \
            T s = 0;                                                                               \
            for (int64_t d = l[0]; d < h[0]; d++)                                                  \
                for (int64_t hh = l[1]; hh < h[1]; hh++) {                                         \
                    const T *xr = xp + (d * q->in[1] + hh) * q->in[2];                             \
                    for (int64_t w = l[2]; w < h[2]; w++) s += xr[w];                              \
                }                                                                                  \
            yr[ow] = s / (T)(cnt[0] * cnt[1] * c2);                                                \
        }                                                                                          \
    }                                                                                              \
    /* y[n, c, od, oh, :] for task t over (n, c, od, oh). */                                       \
    TS_CLONES static void pool_row_##SFX(T *y, const T *x, const pgeo *q, int64_t t) {             \
        int64_t oh = t % q->out[1], od = t / q->out[1] % q->out[0];                                \
        const T *xp = x + t / (q->out[1] * q->out[0]) * q->in[0] * q->in[1] * q->in[2];            \
        T *yr = y + t * q->out[2];                                                                 \
        int64_t lo[3], hi[3], cnt[3], OW = q->out[2], s = q->s[2];                                 \
        window(q, 0, od, &lo[0], &hi[0], &cnt[0]);                                                 \
        window(q, 1, oh, &lo[1], &hi[1], &cnt[1]);                                                 \
        if (q->mode == POOL_ADAPTIVE_AVG) {                                                        \
            adaptive_row_##SFX(yr, xp, q, lo, hi, cnt);                                            \
            return;                                                                                \
        }                                                                                          \
        int is_max = q->mode == POOL_MAX;                                                          \
        for (int64_t o = 0; o < OW; o++) yr[o] = is_max ? (T)-INFINITY : (T)0;                     \
        for (int64_t d = lo[0]; d < hi[0]; d++)                                                    \
            for (int64_t h = lo[1]; h < hi[1]; h++) {                                              \
                const T *xr = xp + (d * q->in[1] + h) * q->in[2];                                  \
                for (int64_t kw = 0; kw < q->k[2]; kw++) {                                         \
                    int64_t off = kw - q->p[2], a, b;                                              \
                    tap_range(off, s, q->in[2], 0, OW, &a, &b);                                    \
                    if (is_max)                                                                    \
                        for (int64_t o = a; o < b; o++) {                                          \
                            T v = xr[o * s + off];                                                 \
                            yr[o] = v > yr[o] || v != v ? v : yr[o];                               \
                        }                                                                          \
                    else                                                                           \
                        for (int64_t o = a; o < b; o++) yr[o] += xr[o * s + off];                  \
                }                                                                                  \
            }                                                                                      \
        if (is_max) return;                                                                        \
        for (int64_t o = 0; o < OW; o++) {                                                         \
            int64_t l2, h2, c2;                                                                    \
            window(q, 2, o, &l2, &h2, &c2);                                                        \
            yr[o] /= (T)(cnt[0] * cnt[1] * c2);                                                    \
        }                                                                                          \
    }                                                                                              \
    static void pool_fwd_##SFX(T *y, const T *x, const pgeo *q) {                                  \
        int64_t rows = q->N * q->C * q->out[0] * q->out[1];                                        \
        _Pragma("omp parallel for schedule(static) if (rows * q->out[2] >= TS_PAR_MIN / 4)") for ( \
            int64_t t = 0; t < rows; t++) pool_row_##SFX(y, x, q, t);                              \
    }                                                                                              \
    /* dx of outputs [o0, o0 + len) of row (od, oh) of one plane. */                               \
    TS_CLONES static void bwd_chunk_##SFX(T *dp, const T *gr, const T *xp, const pgeo *q,          \
                                          const int64_t *lo, const int64_t *hi,                    \
                                          const int64_t *cnt, int64_t o0, int64_t len) {           \
        int64_t s = q->s[2], o1 = o0 + len;                                                        \
        T v1[CHUNK];                                                                               \
        int64_t idx[CHUNK];                                                                        \
        if (q->mode == POOL_MAX) {                                                                 \
            /* Running maximum and its index, initially the window's first element. */             \
            int64_t first = (lo[0] * q->in[1] + lo[1]) * q->in[2];                                 \
            for (int64_t j = 0; j < len; j++) {                                                    \
                int64_t w0 = (o0 + j) * s - q->p[2];                                               \
                v1[j] = (T)-INFINITY;                                                              \
                idx[j] = first + (w0 > 0 ? w0 : 0);                                                \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t j = 0; j < len; j++) {                                                    \
                int64_t l2, h2, c2;                                                                \
                window(q, 2, o0 + j, &l2, &h2, &c2);                                               \
                v1[j] = gr[o0 + j] / (T)(cnt[0] * cnt[1] * c2);                                    \
            }                                                                                      \
        }                                                                                          \
        for (int64_t d = lo[0]; d < hi[0]; d++)                                                    \
            for (int64_t h = lo[1]; h < hi[1]; h++) {                                              \
                int64_t base = (d * q->in[1] + h) * q->in[2];                                      \
                for (int64_t kw = 0; kw < q->k[2]; kw++) {                                         \
                    int64_t off = kw - q->p[2], a, b;                                              \
                    tap_range(off, s, q->in[2], o0, o1, &a, &b);                                   \
                    if (q->mode == POOL_MAX) {                                                     \
                        const T *xr = xp + base;                                                   \
                        for (int64_t o = a; o < b; o++) {                                          \
                            T v = xr[o * s + off];                                                 \
                            int up = v > v1[o - o0] || v != v;                                     \
                            v1[o - o0] = up ? v : v1[o - o0];                                      \
                            idx[o - o0] = up ? base + o * s + off : idx[o - o0];                   \
                        }                                                                          \
                    } else {                                                                       \
                        T *dr = dp + base;                                                         \
                        for (int64_t o = a; o < b; o++) dr[o * s + off] += v1[o - o0];             \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        if (q->mode == POOL_MAX)                                                                   \
            for (int64_t j = 0; j < len; j++) dp[idx[j]] += gr[o0 + j];                            \
    }                                                                                              \
    /* dx of plane pl (one (n, c)): zero it, then add every output's share. */                     \
    static void pool_bwd_plane_##SFX(T *dx, const T *dy, const T *x, const pgeo *q, int64_t pl) {  \
        int64_t isz = q->in[0] * q->in[1] * q->in[2], osz = q->out[0] * q->out[1] * q->out[2];     \
        T *dp = dx + pl * isz;                                                                     \
        const T *gp = dy + pl * osz, *xp = x ? x + pl * isz : NULL;                                \
        memset(dp, 0, (size_t)isz * sizeof(T));                                                    \
        int64_t lo[3], hi[3], cnt[3];                                                              \
        for (int64_t od = 0; od < q->out[0]; od++) {                                               \
            window(q, 0, od, &lo[0], &hi[0], &cnt[0]);                                             \
            for (int64_t oh = 0; oh < q->out[1]; oh++) {                                           \
                window(q, 1, oh, &lo[1], &hi[1], &cnt[1]);                                         \
                const T *gr = gp + (od * q->out[1] + oh) * q->out[2];                              \
                if (q->mode != POOL_ADAPTIVE_AVG) {                                                \
                    for (int64_t o0 = 0; o0 < q->out[2]; o0 += CHUNK)                              \
                        bwd_chunk_##SFX(dp, gr, xp, q, lo, hi, cnt, o0,                            \
                                        q->out[2] - o0 < CHUNK ? q->out[2] - o0 : CHUNK);          \
                    continue;                                                                      \
                }                                                                                  \
                for (int64_t ow = 0; ow < q->out[2]; ow++) {                                       \
                    window(q, 2, ow, &lo[2], &hi[2], &cnt[2]);                                     \
                    T share = gr[ow] / (T)(cnt[0] * cnt[1] * cnt[2]);                              \
                    for (int64_t d = lo[0]; d < hi[0]; d++)                                        \
                        for (int64_t h = lo[1]; h < hi[1]; h++) {                                  \
                            T *dr = dp + (d * q->in[1] + h) * q->in[2];                            \
                            for (int64_t w = lo[2]; w < hi[2]; w++) dr[w] += share;                \
                        }                                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void pool_bwd_##SFX(T *dx, const T *dy, const T *x, const pgeo *q) {                    \
        int64_t planes = q->N * q->C, isz = q->in[0] * q->in[1] * q->in[2];                        \
        _Pragma("omp parallel for schedule(static) if (planes * isz >= TS_PAR_MIN / 4)") for (     \
            int64_t pl = 0; pl < planes; pl++) pool_bwd_plane_##SFX(dx, dy, x, q, pl);             \
    }

DEF_POOL(float, f32)
DEF_POOL(double, f64)

/* Channels last: each window position holds a contiguous vector of C
 * channels, so the kernels walk a window position by position (row-major,
 * the same order and tie rule as above) and update all channels at once.
 * The forward owns output rows (n, od, oh); the backward owns (n, channel
 * block) pairs, whose dx elements no other task touches. */
#define CL_CBLK 16 /* channels per backward task */

static inline int64_t pos_cl(const int64_t *sz, int64_t n, int64_t d, int64_t h, int64_t w) {
    return ((n * sz[0] + d) * sz[1] + h) * sz[2] + w;
}

#define DEF_POOL_CL(T, SFX)                                                                        \
    TS_CLONES static void pool_cl_row_##SFX(T *y, const T *x, const pgeo *q, int64_t t) {          \
        int64_t oh = t % q->out[1], od = t / q->out[1] % q->out[0],                                \
                n = t / (q->out[1] * q->out[0]);                                                   \
        int64_t lo[3], hi[3], cnt[3], C = q->C;                                                    \
        window(q, 0, od, &lo[0], &hi[0], &cnt[0]);                                                 \
        window(q, 1, oh, &lo[1], &hi[1], &cnt[1]);                                                 \
        const int is_max = q->mode == POOL_MAX;                                                    \
        for (int64_t ow = 0; ow < q->out[2]; ow++) {                                               \
            window(q, 2, ow, &lo[2], &hi[2], &cnt[2]);                                             \
            T *yv = y + pos_cl(q->out, n, od, oh, ow) * C;                                         \
            for (int64_t c = 0; c < C; c++) yv[c] = is_max ? (T)-INFINITY : (T)0;                  \
            for (int64_t d = lo[0]; d < hi[0]; d++)                                                \
                for (int64_t h = lo[1]; h < hi[1]; h++)                                            \
                    for (int64_t w = lo[2]; w < hi[2]; w++) {                                      \
                        const T *xv = x + pos_cl(q->in, n, d, h, w) * C;                           \
                        if (is_max)                                                                \
                            for (int64_t c = 0; c < C; c++) {                                      \
                                T v = xv[c];                                                       \
                                yv[c] = v > yv[c] || v != v ? v : yv[c];                           \
                            }                                                                      \
                        else                                                                       \
                            for (int64_t c = 0; c < C; c++) yv[c] += xv[c];                        \
                    }                                                                              \
            if (!is_max) {                                                                         \
                T div = (T)(cnt[0] * cnt[1] * cnt[2]);                                             \
                for (int64_t c = 0; c < C; c++) yv[c] /= div;                                      \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void pool_fwd_cl_##SFX(T *y, const T *x, const pgeo *q) {                               \
        int64_t rows = q->N * q->out[0] * q->out[1], work = rows * q->out[2] * q->C * 4;           \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < rows; t++)   \
            pool_cl_row_##SFX(y, x, q, t);                                                         \
    }                                                                                              \
    /* dx[n, ..., c0:c1] for task t over (n, channel block). */                                    \
    TS_CLONES static void pool_bwd_cl_task_##SFX(T *dx, const T *dy, const T *x, const pgeo *q,    \
                                                 int64_t t) {                                      \
        int64_t nb = (q->C + CL_CBLK - 1) / CL_CBLK, n = t / nb, c0 = t % nb * CL_CBLK;            \
        int64_t nc = q->C - c0 < CL_CBLK ? q->C - c0 : CL_CBLK, C = q->C;                          \
        int64_t isz = q->in[0] * q->in[1] * q->in[2];                                              \
        for (int64_t e = 0; e < isz; e++)                                                          \
            memset(dx + (n * isz + e) * C + c0, 0, (size_t)nc * sizeof(T));                        \
        int64_t lo[3], hi[3], cnt[3];                                                              \
        for (int64_t od = 0; od < q->out[0]; od++) {                                               \
            window(q, 0, od, &lo[0], &hi[0], &cnt[0]);                                             \
            for (int64_t oh = 0; oh < q->out[1]; oh++) {                                           \
                window(q, 1, oh, &lo[1], &hi[1], &cnt[1]);                                         \
                for (int64_t ow = 0; ow < q->out[2]; ow++) {                                       \
                    window(q, 2, ow, &lo[2], &hi[2], &cnt[2]);                                     \
                    const T *gv = dy + pos_cl(q->out, n, od, oh, ow) * C + c0;                     \
                    if (q->mode != POOL_MAX) {                                                     \
                        T div = (T)(cnt[0] * cnt[1] * cnt[2]);                                     \
                        for (int64_t d = lo[0]; d < hi[0]; d++)                                    \
                            for (int64_t h = lo[1]; h < hi[1]; h++)                                \
                                for (int64_t w = lo[2]; w < hi[2]; w++) {                          \
                                    T *dv = dx + pos_cl(q->in, n, d, h, w) * C + c0;               \
                                    for (int64_t c = 0; c < nc; c++) dv[c] += gv[c] / div;         \
                                }                                                                  \
                        continue;                                                                  \
                    }                                                                              \
                    T best[CL_CBLK];                                                               \
                    int64_t at[CL_CBLK];                                                           \
                    int64_t first = pos_cl(q->in, n, lo[0], lo[1], lo[2]);                         \
                    for (int64_t c = 0; c < nc; c++) best[c] = (T)-INFINITY, at[c] = first;        \
                    for (int64_t d = lo[0]; d < hi[0]; d++)                                        \
                        for (int64_t h = lo[1]; h < hi[1]; h++)                                    \
                            for (int64_t w = lo[2]; w < hi[2]; w++) {                              \
                                int64_t p = pos_cl(q->in, n, d, h, w);                             \
                                const T *xv = x + p * C + c0;                                      \
                                for (int64_t c = 0; c < nc; c++) {                                 \
                                    T v = xv[c];                                                   \
                                    int up = v > best[c] || v != v;                                \
                                    best[c] = up ? v : best[c];                                    \
                                    at[c] = up ? p : at[c];                                        \
                                }                                                                  \
                            }                                                                      \
                    for (int64_t c = 0; c < nc; c++) dx[at[c] * C + c0 + c] += gv[c];              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void pool_bwd_cl_##SFX(T *dx, const T *dy, const T *x, const pgeo *q) {                 \
        int64_t tasks = q->N * ((q->C + CL_CBLK - 1) / CL_CBLK);                                   \
        int64_t work = tasks * q->in[0] * q->in[1] * q->in[2] * CL_CBLK * 4;                       \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < tasks; t++)  \
            pool_bwd_cl_task_##SFX(dx, dy, x, q, t);                                               \
    }

DEF_POOL_CL(float, f32)
DEF_POOL_CL(double, f64)

static ts_status k_pool(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *y = &k->out[0];
    pgeo q;
    geo_make(&q, k->a, x->dims, y->dims);
    switch (y->dtype) {
    case TS_F32: (q.cl ? pool_fwd_cl_f32 : pool_fwd_f32)(y->data, x->data, &q); return TS_OK;
    case TS_F64: (q.cl ? pool_fwd_cl_f64 : pool_fwd_f64)(y->data, x->data, &q); return TS_OK;
    default: return ts_kernel_bad_dtype(k, "pool", y->dtype);
    }
}

static ts_status k_pool_bwd(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *dx = &k->out[0];
    const void *x = k->n_in > 1 ? k->in[1].data : NULL;
    pgeo q;
    geo_make(&q, k->a, dx->dims, dy->dims);
    switch (dx->dtype) {
    case TS_F32: (q.cl ? pool_bwd_cl_f32 : pool_bwd_f32)(dx->data, dy->data, x, &q); return TS_OK;
    case TS_F64: (q.cl ? pool_bwd_cl_f64 : pool_bwd_f64)(dx->data, dy->data, x, &q); return TS_OK;
    default: return ts_kernel_bad_dtype(k, "pool_bwd", dx->dtype);
    }
}

/* One operation per element of each window. */
static double window_volume(const ts_node *n, const ts_type *x, const ts_type *y) {
    double v = 1;
    const int sp = n->a.pool.channels_last ? 1 : 2;
    for (int j = 0; j < n->a.pool.nd; j++)
        v *= n->a.pool.mode == POOL_ADAPTIVE_AVG
                 ? (double)(x->dims[sp + j] + y->dims[sp + j] - 1) / (double)y->dims[sp + j]
                 : (double)n->a.pool.kernel[j];
    return v;
}

static double cost_pool(const ts_graph *g, const ts_node *n) {
    const ts_type *x = ts_in_type(g, n, 0), *y = &g->values[n->out[0]].t;
    return (double)ts_type_numel(y) * window_volume(n, x, y);
}
static double cost_pool_bwd(const ts_graph *g, const ts_node *n) {
    const ts_type *dy = ts_in_type(g, n, 0), *dx = &g->values[n->out[0]].t;
    return (double)ts_type_numel(dy) * window_volume(n, dx, dy);
}

const ts_op_def ts_def_pool = {.name = "pool",
                               .min_in = 1,
                               .max_in = 1,
                               .infer = infer_pool,
                               .grad = grad_pool,
                               .kernel = k_pool,
                               .cost = cost_pool};

const ts_op_def ts_def_pool_bwd = {.name = "pool_bwd",
                                   .min_in = 1,
                                   .max_in = 2,
                                   .infer = infer_pool_bwd,
                                   .kernel = k_pool_bwd,
                                   .cost = cost_pool_bwd};

/* ---- builders ----------------------------------------------------------- */

static ts_val pool_node(ts_graph *g, const char *fn, ts_val x, int nd, int mode,
                        const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                        ts_layout layout) {
    if (!g || g->status != TS_OK || !ts_val_ok(x)) return TS_NONE;
    if (nd < 1 || nd > 3)
        return ts_graph_fail(g, TS_ERR_INVALID, "%s: spatial rank must be 1, 2 or 3, got %d", fn,
                             nd);
    if (!kernel) return ts_graph_fail(g, TS_ERR_INVALID, "%s: kernel sizes are required", fn);
    ts_attrs at = ts_attrs_zero();
    at.pool.nd = nd;
    at.pool.mode = mode;
    at.pool.channels_last = layout == TS_CHANNELS_LAST;
    for (int j = 0; j < nd; j++) {
        at.pool.kernel[j] = kernel[j];
        if (mode == POOL_ADAPTIVE_AVG) continue;
        at.pool.stride[j] = stride ? stride[j] : kernel[j]; /* torch: stride defaults to kernel */
        at.pool.padding[j] = padding ? padding[j] : 0;
    }
    return ts_node_add(g, TS_OP_POOL, 1, &x, &at, NULL);
}

ts_val ts_max_pool(ts_graph *g, ts_val x, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *padding) {
    return pool_node(g, "max_pool", x, nd, POOL_MAX, kernel, stride, padding, TS_CHANNELS_FIRST);
}

ts_val ts_max_pool_layout(ts_graph *g, ts_val x, int nd, const int64_t *kernel,
                          const int64_t *stride, const int64_t *padding, ts_layout layout) {
    return pool_node(g, "max_pool", x, nd, POOL_MAX, kernel, stride, padding, layout);
}

ts_val ts_avg_pool(ts_graph *g, ts_val x, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *padding, int count_include_pad) {
    return ts_avg_pool_layout(g, x, nd, kernel, stride, padding, count_include_pad,
                              TS_CHANNELS_FIRST);
}

ts_val ts_avg_pool_layout(ts_graph *g, ts_val x, int nd, const int64_t *kernel,
                          const int64_t *stride, const int64_t *padding, int count_include_pad,
                          ts_layout layout) {
    return pool_node(g, "avg_pool", x, nd, count_include_pad ? POOL_AVG_PAD : POOL_AVG, kernel,
                     stride, padding, layout);
}

ts_val ts_adaptive_avg_pool(ts_graph *g, ts_val x, int nd, const int64_t *output_size) {
    return pool_node(g, "adaptive_avg_pool", x, nd, POOL_ADAPTIVE_AVG, output_size, NULL, NULL,
                     TS_CHANNELS_FIRST);
}
