/* Batch normalisation over x [N, C, ...] (1d, 2d, 3d) with running
 * statistics kept as persistent graph state.
 *
 * One BATCH_NORM node per layer reads x, the affine weight and bias and the
 * two STATE values running_mean / running_var. Which statistics it uses is
 * decided when the plan is compiled (the train_mode pass sets
 * a.batch_norm.training): a training plan
 * normalises with the batch statistics (biased variance) and updates the
 * running statistics in place as PyTorch does (momentum, unbiased variance);
 * an inference plan normalises with the running statistics and writes
 * nothing. Because it writes state the op is TS_OPF_SIDE_EFFECT: simplify
 * never folds, merges or removes it, so it runs exactly once per step even
 * when its outputs are unused; its outputs flow like any other node's.
 *
 * mean and rstd (the statistics actually used) are extra outputs [C] for
 * the backward op. The backward op implements the training-mode gradient
 * (batch statistics depend on x); gradients only exist in training plans.
 *
 * With relu set the node is relu(batch_norm(x)) in one pass (ts_batch_norm_
 * relu); its backward recomputes the ReLU mask from x, mean, rstd, weight
 * and bias with the same arithmetic as the forward instead of reading y.
 *
 * With channels_last set (both ops) x is channels last, [N, ..., C]: the kernels
 * see it as rows of C channels and reduce over blocks of rows, with every
 * channel of a row in one vector.
 *
 * Reductions over N x spatial per channel are cut into fixed blocks (per
 * channel, batch item and block of BN_BLK elements, 16 KiB of f32, so a
 * block stays in L1). The forward takes each block's mean and sum of
 * squared deviations in two sweeps over the cached block (x is read from
 * memory once for the statistics) and merges the blocks with Chan et al.'s
 * pairwise update in block order; the backward's double partial sums are
 * added in block order too. Results do not depend on the thread count.
 *
 * With masked set (ts_batch_norm_masked; ts_batch_norm_mask_rows for the
 * padding of shape buckets, docs/shapes.md) both ops read a last input, a
 * row mask f32 [N]: 1 for a present batch item, 0 for an absent one, in
 * any order. Statistics, running statistics and gradient sums take the
 * present items only, over the blocks of a batch of just those items in
 * their order (present_items, cl_run), so a padded batch normalises bit
 * for bit as the unpadded one, and a present item's output does not depend
 * on how many items are absent, where, or what they hold. Every item is
 * normalised; absent items' dy is never read and they get dx = 0, so the
 * backward is that of the present items' outputs alone. With no item
 * present the running statistics normalise and stay as they were, and
 * every gradient is 0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kern.h"

#define BN_BLK  4096 /* elements per reduction block */
#define BN_ACC  8    /* interleaved partial sums inside a block */
#define BN_DACC 16   /* lanes of the backward's sums (in the element type) */

/* ---- shapes ------------------------------------------------------------- */

typedef struct bn_dims {
    int64_t n, c, s; /* batch, channels, spatial elements per (n, c) */
} bn_dims;

static bn_dims dims_of(int rank, const int64_t *d) {
    bn_dims r = {d[0], d[1], 1};
    for (int i = 2; i < rank; i++) r.s *= d[i];
    return r;
}

/* Channels last: rows of C; a reduction block is BN_BLK elements' worth of
 * whole rows. */
static int64_t cl_rows(int rank, const int64_t *d) {
    int64_t r = 1;
    for (int i = 0; i < rank - 1; i++) r *= d[i];
    return r;
}
static int64_t cl_blk_rows(int64_t c) {
    return c >= BN_BLK ? 1 : BN_BLK / c;
}
static int64_t cl_nblocks(int rank, const int64_t *d) {
    int64_t br = cl_blk_rows(d[rank - 1]);
    return (cl_rows(rank, d) + br - 1) / br;
}

static int64_t n_sblocks(int64_t s) {
    return (s + BN_BLK - 1) / BN_BLK;
}

/* Scratch: two doubles per reduction task (per channel, batch item and
 * block; channels last per block of rows and channel) plus four doubles
 * per channel, then with a row mask the list of present items (one
 * int64_t per batch item, present_items). */
static size_t scratch_doubles(int rank, const int64_t *dims, int cl) {
    if (cl) {
        int64_t c = dims[rank - 1];
        return (size_t)(cl_nblocks(rank, dims) * c * 2 + 4 * c);
    }
    bn_dims d = dims_of(rank, dims);
    int64_t tasks = d.c * d.n * n_sblocks(d.s);
    return (size_t)(tasks * 2 + 4 * d.c);
}
static size_t scratch_for(const ts_type *x, int cl, int masked) {
    return (scratch_doubles(x->rank, x->dims, cl) + (masked ? (size_t)x->dims[0] : 0)) *
           sizeof(double);
}

/* ---- inference --------------------------------------------------------- */

static ts_status check_x(const ts_type *x) {
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "x must be a float type, got %s", ts_dtype_name(x->dtype));
    if (x->rank < 2 || x->rank > 5)
        return ts_fail(TS_ERR_SHAPE,
                       "x must be [N, C], [N, C, L], [N, C, H, W] or "
                       "[N, C, D, H, W], got rank %d",
                       x->rank);
    return TS_OK;
}

/* The channel count of x: axis 1, or the last axis channels last. */
static int64_t chans(const ts_type *x, int cl) {
    return x->dims[cl ? x->rank - 1 : 1];
}

/* A per-channel vector: [C] of x's dtype. */
static ts_status check_vec(const ts_type *v, const ts_type *x, int cl, const char *what) {
    if (v->dtype != x->dtype || v->rank != 1 || v->dims[0] != chans(x, cl)) {
        char tb[128];
        return ts_fail(TS_ERR_SHAPE, "%s must be %s[%lld] (one per channel of x), got %s", what,
                       ts_dtype_name(x->dtype), (long long)chans(x, cl),
                       ts_type_str(tb, sizeof tb, v));
    }
    return TS_OK;
}

/* The row mask: f32 [N], N the batch items of x. */
static ts_status check_mask(const ts_type *m, const ts_type *x) {
    if (m->dtype != TS_F32 || m->rank != 1 || m->dims[0] != x->dims[0]) {
        char tb[128];
        return ts_fail(TS_ERR_SHAPE, "the row mask must be f32[%lld] (one per batch item), got %s",
                       (long long)x->dims[0], ts_type_str(tb, sizeof tb, m));
    }
    return TS_OK;
}

static ts_status infer_bn(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_batch_norm_attrs *at = &n->a.batch_norm;
    int64_t affine = at->affine, training = at->training, relu = at->relu, cl = at->channels_last;
    int64_t masked = at->masked;
    if ((affine != 0 && affine != 1) || (training != 0 && training != 1) ||
        (relu != 0 && relu != 1) || (cl != 0 && cl != 1) || (masked != 0 && masked != 1))
        return ts_fail(TS_ERR_INVALID,
                       "affine, training, relu, layout and masked flags must be 0 or 1");
    if (n->n_in != 3 + 2 * (int)affine + (int)masked)
        return ts_fail(TS_ERR_INVALID,
                       "%d inputs do not match affine=%d masked=%d (x%s, running_mean, "
                       "running_var%s)",
                       n->n_in, (int)affine, (int)masked, affine ? ", weight, bias" : "",
                       masked ? ", row mask" : "");
    const ts_type *x = ts_in_type(g, n, 0);
    ts_status s = check_x(x);
    if (s != TS_OK) return s;
    double m = at->momentum, eps = at->eps;
    if (!(m >= 0 && m <= 1)) return ts_fail(TS_ERR_INVALID, "momentum %g is not in [0, 1]", m);
    if (!(eps >= 0) || isinf(eps))
        return ts_fail(TS_ERR_INVALID, "eps must be finite and >= 0, got %g", eps);
    int k = 1;
    if (affine) {
        if ((s = check_vec(ts_in_type(g, n, k++), x, (int)cl, "weight")) != TS_OK) return s;
        if ((s = check_vec(ts_in_type(g, n, k++), x, (int)cl, "bias")) != TS_OK) return s;
    }
    if ((s = check_vec(ts_in_type(g, n, k++), x, (int)cl, "running_mean")) != TS_OK) return s;
    if ((s = check_vec(ts_in_type(g, n, k++), x, (int)cl, "running_var")) != TS_OK) return s;
    if (masked && (s = check_mask(ts_in_type(g, n, k), x)) != TS_OK) return s;
    out[0] = *x;
    out[1] = (ts_type){.dtype = x->dtype, .rank = 1, .dims = {chans(x, (int)cl)}};
    out[2] = out[1];
    *n_out = 3;
    return TS_OK;
}

static ts_status infer_bn_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    int64_t affine = n->a.batch_norm.affine, relu = n->a.batch_norm.relu;
    int64_t masked = n->a.batch_norm.masked;
    const int cl = n->a.batch_norm.channels_last != 0;
    if ((affine != 0 && affine != 1) || (relu != 0 && relu != 1) || (masked != 0 && masked != 1))
        return ts_fail(TS_ERR_INVALID, "affine, relu and masked flags must be 0 or 1");
    if (n->n_in != 4 + (int)affine + (int)(affine && relu) + (int)masked)
        return ts_fail(TS_ERR_INVALID, "%d inputs do not match affine=%d relu=%d masked=%d",
                       n->n_in, (int)affine, (int)relu, (int)masked);
    const ts_type *dy = ts_in_type(g, n, 0), *x = ts_in_type(g, n, 1);
    ts_status s = check_x(x);
    if (s != TS_OK) return s;
    if (!ts_type_equal(dy, x)) return ts_fail(TS_ERR_SHAPE, "dy and x must have the same type");
    if ((s = check_vec(ts_in_type(g, n, 2), x, cl, "mean")) != TS_OK) return s;
    if ((s = check_vec(ts_in_type(g, n, 3), x, cl, "rstd")) != TS_OK) return s;
    if (affine && (s = check_vec(ts_in_type(g, n, 4), x, cl, "weight")) != TS_OK) return s;
    if (affine && relu && (s = check_vec(ts_in_type(g, n, 5), x, cl, "bias")) != TS_OK) return s;
    if (masked && (s = check_mask(ts_in_type(g, n, n->n_in - 1), x)) != TS_OK) return s;
    out[0] = *x;
    *n_out = 1;
    if (affine) {
        out[1] = (ts_type){.dtype = x->dtype, .rank = 1, .dims = {chans(x, cl)}};
        out[2] = out[1];
        *n_out = 3;
    }
    return TS_OK;
}

/* ---- gradient ---------------------------------------------------------- */

static ts_status grad_bn(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    /* mean and rstd exist for the backward op; ts_batch_norm never hands
     * them out, so no gradient can reach them through the public API. */
    if (ts_val_ok(dy[1]) || ts_val_ok(dy[2])) {
        ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                      "batch_norm: gradients through the mean/rstd outputs are not supported");
        return ts_graph_status(g);
    }
    if (!ts_val_ok(dy[0])) return TS_OK;
    int affine = n->a.batch_norm.affine != 0, relu = n->a.batch_norm.relu != 0, n_in = 4;
    const int masked = n->a.batch_norm.masked != 0;
    ts_val in[7] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->out[1]), ts_mkval(n->out[2])};
    if (affine) in[n_in++] = ts_mkval(n->in[1]);
    /* The fused ReLU's mask is recomputed from x, which needs the bias. */
    if (affine && relu) in[n_in++] = ts_mkval(n->in[2]);
    if (masked) in[n_in++] = ts_mkval(n->in[n->n_in - 1]);
    ts_attrs at = ts_attrs_zero();
    at.batch_norm.affine = affine;
    at.batch_norm.relu = relu;
    at.batch_norm.masked = masked;
    at.batch_norm.channels_last = n->a.batch_norm.channels_last;
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(ts_node_add(g, TS_OP_BATCH_NORM_BWD, n_in, in, &at, outs)))
        return ts_graph_status(g);
    din[0] = outs[0];
    if (affine) {
        din[1] = outs[1];
        din[2] = outs[2];
    }
    /* running_mean / running_var are state and the row mask an input: not
     * differentiated. */
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

static inline double comb(const double *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* Number of elements of reduction block sb (the last block may be short). */
static inline int64_t blk_len(int64_t s, int64_t sb) {
    int64_t s0 = sb * BN_BLK;
    return s - s0 < BN_BLK ? s - s0 : BN_BLK;
}

/* y = x * alpha + beta with alpha = rstd * w, beta = b - mean * alpha (as
 * torch). One function for the forward and the fused ReLU's backward, so
 * both see the same alpha and beta and agree on which outputs were > 0. */
static inline void bn_coef(double rstd, const void *w, const void *b, int64_t c, int f64,
                           double mean, double *al, double *be) {
    double wc = w ? (f64 ? ((const double *)w)[c] : (double)((const float *)w)[c]) : 1.0;
    double bc = b ? (f64 ? ((const double *)b)[c] : (double)((const float *)b)[c]) : 0.0;
    *al = rstd * wc;
    *be = bc - mean * *al;
}

/* Chan et al.'s pairwise update: fold a block of nb values with mean bm and
 * sum of squared deviations bm2 into the running (cnt, mean, m2). Blocks
 * are folded in a fixed order, so the result does not depend on threads. */
static inline void chan_merge(double *cnt, double *mean, double *m2, double nb, double bm,
                              double bm2) {
    double tot = *cnt + nb, delta = bm - *mean;
    *mean += delta * (nb / tot);
    *m2 += bm2 + delta * delta * (*cnt * nb / tot);
    *cnt = tot;
}

/* From a channel's mean and sum of squared deviations over m values: o =
 * {mean, rstd, new running mean, new running var}. As PyTorch, the biased
 * variance normalises and the unbiased one goes to the running statistic. */
static inline void batch_stats(double mean, double m2, int64_t m, double mom, double eps, double rm,
                               double rv, double o[4]) {
    double v = m2 / (double)m;
    o[0] = mean;
    o[1] = 1.0 / sqrt(v + eps);
    o[2] = mom * mean + (1.0 - mom) * rm;
    o[3] = mom * (v * (double)m / (double)(m - 1)) + (1.0 - mom) * rv;
}

/* The batch items the statistics cover: all n (*items NULL), or with a
 * row mask (input `mi`, f32 [n], 1 present and 0 absent, in any order)
 * the present ones, in order, listed in the scratch after the reduction's
 * partials; *nr is their count. The reductions run over a batch of just
 * those items (the k-th present item where such a batch has item k), so a
 * prefix mask reduces exactly as the unmasked batch of its leading items,
 * and a present item's statistics do not depend on where the absent items
 * are or what they hold. The callers pass masked = 0 for an inference
 * plan's forward, which normalises every item with the running
 * statistics. */
static ts_status present_items(const ts_kargs *k, int masked, int mi, const ts_tensor *x, int cl,
                               const int64_t **items, int64_t *nr) {
    const int64_t n = x->dims[0];
    *items = NULL;
    *nr = n;
    if (!masked) return TS_OK;
    const size_t base = scratch_doubles(x->rank, x->dims, cl);
    if ((base + (size_t)n) * sizeof(double) > k->scratch_bytes)
        return ts_fail(TS_ERR_INTERNAL, "batch_norm '%s': scratch too small", k->label);
    int64_t *list = (int64_t *)((double *)k->scratch + base), np = 0;
    const float *m = k->in[mi].data;
    for (int64_t i = 0; i < n; i++) {
        if (m[i] != 0.0f && m[i] != 1.0f)
            return ts_fail(TS_ERR_INVALID,
                           "batch_norm '%s': the row mask must be 1 (present) or 0 (absent) for "
                           "each batch item; item %lld is %g",
                           k->label, (long long)i, (double)m[i]);
        if (m[i] == 1.0f) list[np++] = i;
    }
    *items = list;
    *nr = np;
    return TS_OK;
}

/* The batch item of the i-th present item. */
static inline int64_t item_at(const int64_t *items, int64_t i) {
    return items ? items[i] : i;
}

/* dx of the absent items (of `item_bytes` each) is 0: nothing flows back
 * from them, and their dy is never read. */
static void zero_absent(void *dx, size_t item_bytes, const int64_t *items, int64_t nr, int64_t n) {
    if (!items) return;
    for (int64_t i = 0, j = 0; i < n; i++) {
        if (j < nr && items[j] == i)
            j++;
        else
            memset((char *)dx + (size_t)i * item_bytes, 0, item_bytes);
    }
}

/* Channels last with s rows per batch item: reductions run over "virtual"
 * rows, row v % s of the (v / s)-th present item. The run of x's rows that
 * starts at virtual row v and stays inside one item, up to virtual row
 * v1: *r0 is its first row of x; returns its length. Without a list
 * (every item) virtual rows are x's rows, one run. */
static inline int64_t cl_run(const int64_t *items, int64_t s, int64_t v, int64_t v1, int64_t *r0) {
    if (!items) {
        *r0 = v;
        return v1 - v;
    }
    const int64_t off = v % s, left = s - off;
    *r0 = items[v / s] * s + off;
    return v1 - v < left ? v1 - v : left;
}

#define DEF_BN(T, SFX, F64)                                                                        \
    /* Mean and sum of squared deviations of one block held in L1: x is read                       \
     * from memory once (the second sweep hits the cache). */                                      \
    TS_CLONES static void bn_block_stats_##SFX(const T *x, int64_t len, double *mean_o,            \
                                               double *m2_o) {                                     \
        double acc[BN_ACC] = {0}, s = 0;                                                           \
        int64_t i = 0;                                                                             \
        for (; i + BN_ACC <= len; i += BN_ACC)                                                     \
            for (int j = 0; j < BN_ACC; j++) acc[j] += (double)x[i + j];                           \
        for (; i < len; i++) s += (double)x[i];                                                    \
        double mean = (s + comb(acc)) / (double)len;                                               \
        double q[BN_ACC] = {0}, r = 0;                                                             \
        for (i = 0; i + BN_ACC <= len; i += BN_ACC)                                                \
            for (int j = 0; j < BN_ACC; j++) {                                                     \
                double d = (double)x[i + j] - mean;                                                \
                q[j] += d * d;                                                                     \
            }                                                                                      \
        for (; i < len; i++) {                                                                     \
            double d = (double)x[i] - mean;                                                        \
            r += d * d;                                                                            \
        }                                                                                          \
        *mean_o = mean;                                                                            \
        *m2_o = r + comb(q);                                                                       \
    }                                                                                              \
    /* Sums of g and g * (x - mean) over [0, len), g = dy, or with the fused                       \
     * ReLU g = dy where x * a + b > 0 (the forward's output was positive).                        \
     * BN_DACC lanes in T (one AVX-512 register of floats) keep the loop                           \
     * vectorised; a block is at most BN_BLK long, so a lane adds at most                          \
     * BN_BLK / BN_DACC terms before the block's sum goes to double. */                            \
    TS_CLONES static void bn_dsum_##SFX(const T *dy, const T *x, int64_t len, T mean, int relu,    \
                                        T a, T b, double *o1, double *o2) {                        \
        T a1[BN_DACC] = {0}, a2[BN_DACC] = {0};                                                    \
        double s1 = 0, s2 = 0;                                                                     \
        int64_t i = 0;                                                                             \
        if (!relu) {                                                                               \
            for (; i + BN_DACC <= len; i += BN_DACC)                                               \
                for (int j = 0; j < BN_DACC; j++) {                                                \
                    a1[j] += dy[i + j];                                                            \
                    a2[j] += dy[i + j] * (x[i + j] - mean);                                        \
                }                                                                                  \
        } else {                                                                                   \
            for (; i + BN_DACC <= len; i += BN_DACC)                                               \
                for (int j = 0; j < BN_DACC; j++) {                                                \
                    const T d = dy[i + j], v = x[i + j] * a + b, gg = v > 0 ? d : (T)0;            \
                    a1[j] += gg;                                                                   \
                    a2[j] += gg * (x[i + j] - mean);                                               \
                }                                                                                  \
        }                                                                                          \
        for (; i < len; i++) {                                                                     \
            T v = x[i] * a + b, gg = relu && !(v > 0) ? (T)0 : dy[i];                              \
            s1 += (double)gg;                                                                      \
            s2 += (double)(gg * (x[i] - mean));                                                    \
        }                                                                                          \
        for (int j = 0; j < BN_DACC; j++) {                                                        \
            s1 += (double)a1[j];                                                                   \
            s2 += (double)a2[j];                                                                   \
        }                                                                                          \
        *o1 = s1;                                                                                  \
        *o2 = s2;                                                                                  \
    }                                                                                              \
    /* relu(x * a + b) keeps NaN, as torch.relu. */                                                \
    TS_CLONES static void bn_affine_##SFX(T *y, const T *x, int64_t len, T a, T b, int relu) {     \
        if (relu)                                                                                  \
            for (int64_t i = 0; i < len; i++) {                                                    \
                T v = x[i] * a + b;                                                                \
                y[i] = v < 0 ? (T)0 : v;                                                           \
            }                                                                                      \
        else                                                                                       \
            for (int64_t i = 0; i < len; i++) y[i] = x[i] * a + b;                                 \
    }                                                                                              \
    TS_CLONES static void bn_dx_##SFX(T *dx, const T *dy, const T *x, int64_t len, T mean, T k,    \
                                      T mdy, T scale, int relu, T a, T b) {                        \
        if (relu)                                                                                  \
            for (int64_t i = 0; i < len; i++) {                                                    \
                T v = x[i] * a + b, gg = v <= 0 ? (T)0 : dy[i];                                    \
                dx[i] = (gg - (x[i] - mean) * k - mdy) * scale;                                    \
            }                                                                                      \
        else                                                                                       \
            for (int64_t i = 0; i < len; i++) dx[i] = (dy[i] - (x[i] - mean) * k - mdy) * scale;   \
    }                                                                                              \
    static ts_status bn_fwd_##SFX(const ts_kargs *k) {                                             \
        const ts_tensor *xt = &k->in[0];                                                           \
        const ts_batch_norm_attrs *at = &k->a->batch_norm;                                         \
        int affine = at->affine != 0, training = at->training != 0, relu = at->relu != 0;          \
        double mom = at->momentum, eps = at->eps;                                                  \
        bn_dims d = dims_of(xt->rank, xt->dims);                                                   \
        const T *x = xt->data;                                                                     \
        const T *w = affine ? k->in[1].data : NULL, *b = affine ? k->in[2].data : NULL;            \
        T *rm = k->in[1 + 2 * affine].data, *rv = k->in[2 + 2 * affine].data;                      \
        T *y = k->out[0].data, *mean_o = k->out[1].data, *rstd_o = k->out[2].data;                 \
        const int64_t *items;                                                                      \
        int64_t nr;                                                                                \
        ts_status ms_ =                                                                            \
            present_items(k, at->masked && training, 3 + 2 * affine, xt, 0, &items, &nr);          \
        if (ms_ != TS_OK) return ms_;                                                              \
        int64_t m = nr * d.s;                                                                      \
        /* no present item: the running statistics normalise, unchanged */                         \
        if (training && nr > 0) {                                                                  \
            if (m < 2)                                                                             \
                return ts_fail(TS_ERR_SHAPE,                                                       \
                               "batch_norm '%s': training needs more than one value per "          \
                               "channel (x is [%lld, %lld, ...] with %lld spatial elements, "      \
                               "%lld items present)",                                              \
                               k->label, (long long)d.n, (long long)d.c, (long long)d.s,           \
                               (long long)nr);                                                     \
            int64_t nsb = n_sblocks(d.s), per_c = nr * nsb, tasks = d.c * per_c;                   \
            if ((size_t)(2 * tasks) * sizeof(double) > k->scratch_bytes)                           \
                return ts_fail(TS_ERR_INTERNAL, "batch_norm '%s': scratch too small", k->label);   \
            double *part = k->scratch;                                                             \
            _Pragma("omp parallel for schedule(static) if (d.n * d.c * d.s >= TS_PAR_MIN)") for (  \
                int64_t t = 0; t < tasks; t++) {                                                   \
                int64_t c = t / per_c, r = t % per_c, ni = item_at(items, r / nsb), sb = r % nsb;  \
                bn_block_stats_##SFX(x + (ni * d.c + c) * d.s + sb * BN_BLK, blk_len(d.s, sb),     \
                                     &part[2 * t], &part[2 * t + 1]);                              \
            }                                                                                      \
            for (int64_t c = 0; c < d.c; c++) {                                                    \
                /* Chan et al.'s pairwise update, blocks in a fixed order. */                      \
                double cnt = 0, mean = 0, m2 = 0;                                                  \
                for (int64_t q = 0; q < per_c; q++) {                                              \
                    const double *pb = &part[2 * (c * per_c + q)];                                 \
                    chan_merge(&cnt, &mean, &m2, (double)blk_len(d.s, q % nsb), pb[0], pb[1]);     \
                }                                                                                  \
                double o[4];                                                                       \
                batch_stats(mean, m2, m, mom, eps, (double)rm[c], (double)rv[c], o);               \
                mean_o[c] = (T)o[0], rstd_o[c] = (T)o[1], rm[c] = (T)o[2], rv[c] = (T)o[3];        \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t c = 0; c < d.c; c++) {                                                    \
                mean_o[c] = rm[c];                                                                 \
                rstd_o[c] = (T)(1.0 / sqrt((double)rv[c] + eps));                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("omp parallel for schedule(static) if (d.n * d.c * d.s >= TS_PAR_MIN)") for (      \
            int64_t t = 0; t < d.n * d.c; t++) {                                                   \
            int64_t c = t % d.c;                                                                   \
            double al, be;                                                                         \
            bn_coef((double)rstd_o[c], w, b, c, F64, (double)mean_o[c], &al, &be);                 \
            bn_affine_##SFX(y + t * d.s, x + t * d.s, d.s, (T)al, (T)be, relu);                    \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    static ts_status bn_bwd_##SFX(const ts_kargs *k) {                                             \
        const ts_tensor *xt = &k->in[1];                                                           \
        int affine = k->a->batch_norm.affine != 0, relu = k->a->batch_norm.relu != 0;              \
        bn_dims d = dims_of(xt->rank, xt->dims);                                                   \
        const T *dy = k->in[0].data, *x = xt->data, *mean = k->in[2].data;                         \
        const T *rstd = k->in[3].data, *w = affine ? k->in[4].data : NULL;                         \
        const T *bias = affine && relu ? k->in[5].data : NULL;                                     \
        T *dx = k->out[0].data;                                                                    \
        T *dw = affine ? k->out[1].data : NULL, *db = affine ? k->out[2].data : NULL;              \
        const int64_t *items;                                                                      \
        int64_t nr;                                                                                \
        ts_status ms_ =                                                                            \
            present_items(k, k->a->batch_norm.masked != 0, k->n_in - 1, xt, 0, &items, &nr);       \
        if (ms_ != TS_OK) return ms_;                                                              \
        int64_t nsb = n_sblocks(d.s), per_c = nr * nsb, tasks = d.c * per_c, m = nr * d.s;         \
        size_t need = (size_t)(2 * tasks + 4 * d.c) * sizeof(double);                              \
        if (need > k->scratch_bytes)                                                               \
            return ts_fail(TS_ERR_INTERNAL, "batch_norm_bwd '%s': scratch too small", k->label);   \
        double *p1 = k->scratch, *p2 = p1 + tasks, *sdy = p2 + tasks, *sdx = sdy + d.c;            \
        double *al = sdx + d.c, *be = al + d.c;                                                    \
        for (int64_t c = 0; c < d.c; c++)                                                          \
            bn_coef((double)rstd[c], w, bias, c, F64, (double)mean[c], &al[c], &be[c]);            \
        _Pragma("omp parallel for schedule(static) if (d.n * d.c * d.s >= TS_PAR_MIN)") for (      \
            int64_t t = 0; t < tasks; t++) {                                                       \
            int64_t c = t / per_c, r = t % per_c, ni = item_at(items, r / nsb), sb = r % nsb;      \
            int64_t off = (ni * d.c + c) * d.s + sb * BN_BLK;                                      \
            bn_dsum_##SFX(dy + off, x + off, blk_len(d.s, sb), mean[c], relu, (T)al[c], (T)be[c],  \
                          &p1[t], &p2[t]);                                                         \
        }                                                                                          \
        for (int64_t c = 0; c < d.c; c++) {                                                        \
            double s1 = 0, s2 = 0;                                                                 \
            for (int64_t q = 0; q < per_c; q++) {                                                  \
                s1 += p1[c * per_c + q];                                                           \
                s2 += p2[c * per_c + q];                                                           \
            }                                                                                      \
            sdy[c] = s1;                                                                           \
            sdx[c] = s2;                                                                           \
            if (dw) dw[c] = (T)(s2 * (double)rstd[c]);                                             \
            if (db) db[c] = (T)s1;                                                                 \
        }                                                                                          \
        /* dx = w rstd (g - mean(g) - (x - mean) rstd^2 mean(g (x - mean))). */                    \
        /* the absent items get no gradient */                                                     \
        zero_absent(dx, sizeof(T) * (size_t)(d.c * d.s), items, nr, d.n);                          \
        _Pragma("omp parallel for schedule(static) if (d.n * d.c * d.s >= TS_PAR_MIN)") for (      \
            int64_t t = 0; t < nr * d.c; t++) {                                                    \
            int64_t c = t % d.c, off = (item_at(items, t / d.c) * d.c + c) * d.s;                  \
            double r = (double)rstd[c];                                                            \
            T kk = (T)(sdx[c] * r * r / (double)m), mdy = (T)(sdy[c] / (double)m);                 \
            T scale = (T)(r * (w ? (double)w[c] : 1.0));                                           \
            bn_dx_##SFX(dx + off, dy + off, x + off, d.s, mean[c], kk, mdy, scale, relu, (T)al[c], \
                        (T)be[c]);                                                                 \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

DEF_BN(float, f32, 0)
DEF_BN(double, f64, 1)

/* Channels last. Scratch: per block of rows the C means and C sums of
 * squared deviations (forward) or the C sums of g and g (x - mean)
 * (backward), then 4 C doubles for per-channel values. Blocks are merged
 * in block order, so results do not depend on the thread count. */
#define DEF_BN_CL(T, SFX, F64)                                                                     \
    /* Per channel, the mean and sum of squared deviations of virtual rows                         \
     * [v0, v1) (cl_run: s rows per item), taken row by row in order. */                           \
    TS_CLONES static void bn_cl_stats_##SFX(const T *x, const int64_t *items, int64_t s,           \
                                            int64_t v0, int64_t v1, int64_t C, double *mean,       \
                                            double *m2) {                                          \
        for (int64_t c = 0; c < C; c++) mean[c] = 0, m2[c] = 0;                                    \
        for (int64_t v = v0, r0, len; v < v1; v += len) {                                          \
            len = cl_run(items, s, v, v1, &r0);                                                    \
            const T *xr = x + r0 * C;                                                              \
            for (int64_t r = 0; r < len; r++)                                                      \
                for (int64_t c = 0; c < C; c++) mean[c] += (double)xr[r * C + c];                  \
        }                                                                                          \
        for (int64_t c = 0; c < C; c++) mean[c] /= (double)(v1 - v0);                              \
        for (int64_t v = v0, r0, len; v < v1; v += len) {                                          \
            len = cl_run(items, s, v, v1, &r0);                                                    \
            const T *xr = x + r0 * C;                                                              \
            for (int64_t r = 0; r < len; r++)                                                      \
                for (int64_t c = 0; c < C; c++) {                                                  \
                    double d = (double)xr[r * C + c] - mean[c];                                    \
                    m2[c] += d * d;                                                                \
                }                                                                                  \
        }                                                                                          \
    }                                                                                              \
    /* Per channel, y = x * al + be (bn_coef), in T for the row loops. */                          \
    static void bn_cl_coefs_##SFX(T *al, T *be, const T *mean, const T *rstd, const T *w,          \
                                  const T *b, int64_t C) {                                         \
        for (int64_t c = 0; c < C; c++) {                                                          \
            double a_, b_;                                                                         \
            bn_coef((double)rstd[c], w, b, c, F64, (double)mean[c], &a_, &b_);                     \
            al[c] = (T)a_;                                                                         \
            be[c] = (T)b_;                                                                         \
        }                                                                                          \
    }                                                                                              \
    TS_CLONES static void bn_cl_affine_##SFX(T *y, const T *x, int64_t rows, int64_t C,            \
                                             const T *al, const T *be, int relu) {                 \
        for (int64_t r = 0; r < rows; r++) {                                                       \
            const T *xr = x + r * C;                                                               \
            T *yr = y + r * C;                                                                     \
            if (relu)                                                                              \
                for (int64_t c = 0; c < C; c++) {                                                  \
                    T v = xr[c] * al[c] + be[c];                                                   \
                    yr[c] = v < 0 ? (T)0 : v;                                                      \
                }                                                                                  \
            else                                                                                   \
                for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * al[c] + be[c];                     \
        }                                                                                          \
    }                                                                                              \
    /* Per channel, the sums of g and g (x - mean) over virtual rows [v0, v1). */                  \
    TS_CLONES static void bn_cl_dsum_##SFX(                                                        \
        const T *dy, const T *x, const int64_t *items, int64_t s, int64_t v0, int64_t v1,          \
        int64_t C, const T *mean, int relu, const T *al, const T *be, double *s1, double *s2) {    \
        for (int64_t c = 0; c < C; c++) s1[c] = 0, s2[c] = 0;                                      \
        for (int64_t v = v0, r0, len; v < v1; v += len) {                                          \
            len = cl_run(items, s, v, v1, &r0);                                                    \
            for (int64_t r = r0; r < r0 + len; r++) {                                              \
                const T *xr = x + r * C, *gr = dy + r * C;                                         \
                for (int64_t c = 0; c < C; c++) {                                                  \
                    T u = xr[c] * al[c] + be[c], gg = relu && !(u > 0) ? (T)0 : gr[c];             \
                    s1[c] += (double)gg;                                                           \
                    s2[c] += (double)(gg * (xr[c] - mean[c]));                                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    TS_CLONES static void bn_cl_dx_##SFX(T *dx, const T *dy, const T *x, int64_t rows, int64_t C,  \
                                         const T *mean, const T *kk, const T *mdy, const T *scale, \
                                         int relu, const T *al, const T *be) {                     \
        for (int64_t r = 0; r < rows; r++) {                                                       \
            const T *xr = x + r * C, *gr = dy + r * C;                                             \
            T *dr = dx + r * C;                                                                    \
            for (int64_t c = 0; c < C; c++) {                                                      \
                T v = xr[c] * al[c] + be[c], gg = relu && v <= 0 ? (T)0 : gr[c];                   \
                dr[c] = (gg - (xr[c] - mean[c]) * kk[c] - mdy[c]) * scale[c];                      \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static ts_status bn_fwd_cl_##SFX(const ts_kargs *k) {                                          \
        const ts_tensor *xt = &k->in[0];                                                           \
        const ts_batch_norm_attrs *at = &k->a->batch_norm;                                         \
        int affine = at->affine != 0, training = at->training != 0, relu = at->relu != 0;          \
        double mom = at->momentum, eps = at->eps;                                                  \
        const int64_t C = xt->dims[xt->rank - 1], R = cl_rows(xt->rank, xt->dims);                 \
        const int64_t br = cl_blk_rows(C), nb = cl_nblocks(xt->rank, xt->dims);                    \
        const T *x = xt->data;                                                                     \
        const T *w = affine ? k->in[1].data : NULL, *b = affine ? k->in[2].data : NULL;            \
        T *rm = k->in[1 + 2 * affine].data, *rv = k->in[2 + 2 * affine].data;                      \
        T *y = k->out[0].data, *mean_o = k->out[1].data, *rstd_o = k->out[2].data;                 \
        if ((size_t)(2 * nb * C + 4 * C) * sizeof(double) > k->scratch_bytes)                      \
            return ts_fail(TS_ERR_INTERNAL, "batch_norm '%s': scratch too small", k->label);       \
        double *part = k->scratch;                                                                 \
        T *al = (T *)(part + 2 * nb * C), *be = (T *)(part + 2 * nb * C + C);                      \
        const int64_t *items;                                                                      \
        int64_t nr;                                                                                \
        ts_status ms_ =                                                                            \
            present_items(k, at->masked && training, 3 + 2 * affine, xt, 1, &items, &nr);          \
        if (ms_ != TS_OK) return ms_;                                                              \
        /* the present items' rows (virtual rows, cl_run) and their blocks */                      \
        const int64_t S = R / xt->dims[0], Rr = S * nr, nbr = (Rr + br - 1) / br;                  \
        /* no present item: the running statistics normalise, unchanged */                         \
        if (training && nr > 0) {                                                                  \
            if (Rr < 2)                                                                            \
                return ts_fail(TS_ERR_SHAPE,                                                       \
                               "batch_norm '%s': training needs more than one value per "          \
                               "channel (x has %lld rows of %lld channels in %lld present "        \
                               "items)",                                                           \
                               k->label, (long long)Rr, (long long)C, (long long)nr);              \
            _Pragma(                                                                               \
                "omp parallel for schedule(static) if (R * C >= TS_PAR_MIN)") for (int64_t q = 0;  \
                                                                                   q < nbr; q++) { \
                int64_t v0 = q * br, v1 = Rr - v0 < br ? Rr : v0 + br;                             \
                bn_cl_stats_##SFX(x, items, S, v0, v1, C, part + 2 * q * C, part + 2 * q * C + C); \
            }                                                                                      \
            for (int64_t c = 0; c < C; c++) {                                                      \
                double cnt = 0, mean = 0, m2 = 0;                                                  \
                for (int64_t q = 0; q < nbr; q++)                                                  \
                    chan_merge(&cnt, &mean, &m2, (double)(Rr - q * br < br ? Rr - q * br : br),    \
                               part[2 * q * C + c], part[2 * q * C + C + c]);                      \
                double o[4];                                                                       \
                batch_stats(mean, m2, Rr, mom, eps, (double)rm[c], (double)rv[c], o);              \
                mean_o[c] = (T)o[0], rstd_o[c] = (T)o[1], rm[c] = (T)o[2], rv[c] = (T)o[3];        \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t c = 0; c < C; c++) {                                                      \
                mean_o[c] = rm[c];                                                                 \
                rstd_o[c] = (T)(1.0 / sqrt((double)rv[c] + eps));                                  \
            }                                                                                      \
        }                                                                                          \
        bn_cl_coefs_##SFX(al, be, mean_o, rstd_o, w, b, C);                                        \
        _Pragma("omp parallel for schedule(static) if (R * C >= TS_PAR_MIN)") for (int64_t q = 0;  \
                                                                                   q < nb; q++) {  \
            int64_t r0 = q * br, rows = R - r0 < br ? R - r0 : br;                                 \
            bn_cl_affine_##SFX(y + r0 * C, x + r0 * C, rows, C, al, be, relu);                     \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    static ts_status bn_bwd_cl_##SFX(const ts_kargs *k) {                                          \
        const ts_tensor *xt = &k->in[1];                                                           \
        int affine = k->a->batch_norm.affine != 0, relu = k->a->batch_norm.relu != 0;              \
        const int64_t C = xt->dims[xt->rank - 1], R = cl_rows(xt->rank, xt->dims);                 \
        const int64_t br = cl_blk_rows(C), nb = cl_nblocks(xt->rank, xt->dims);                    \
        const T *dy = k->in[0].data, *x = xt->data, *mean = k->in[2].data;                         \
        const T *rstd = k->in[3].data, *w = affine ? k->in[4].data : NULL;                         \
        const T *bias = affine && relu ? k->in[5].data : NULL;                                     \
        T *dx = k->out[0].data;                                                                    \
        T *dw = affine ? k->out[1].data : NULL, *db = affine ? k->out[2].data : NULL;              \
        if ((size_t)(2 * nb * C + 4 * C) * sizeof(double) > k->scratch_bytes)                      \
            return ts_fail(TS_ERR_INTERNAL, "batch_norm_bwd '%s': scratch too small", k->label);   \
        double *part = k->scratch, *tail = part + 2 * nb * C;                                      \
        T *al = (T *)tail, *be = (T *)(tail + C), *kk = (T *)(tail + 2 * C);                       \
        T *mdy = (T *)(tail + 3 * C), *scale = (T *)part; /* part is free once summed */           \
        const int64_t *items;                                                                      \
        int64_t nr;                                                                                \
        ts_status ms_ =                                                                            \
            present_items(k, k->a->batch_norm.masked != 0, k->n_in - 1, xt, 1, &items, &nr);       \
        if (ms_ != TS_OK) return ms_;                                                              \
        /* the present items' rows: the sums and dx; the absent get no gradient */                 \
        const int64_t S = R / xt->dims[0], Rr = S * nr, nbr = (Rr + br - 1) / br;                  \
        zero_absent(dx, sizeof(T) * (size_t)(S * C), items, nr, xt->dims[0]);                      \
        bn_cl_coefs_##SFX(al, be, mean, rstd, w, bias, C);                                         \
        _Pragma("omp parallel for schedule(static) if (R * C >= TS_PAR_MIN)") for (int64_t q = 0;  \
                                                                                   q < nbr; q++) { \
            int64_t v0 = q * br, v1 = Rr - v0 < br ? Rr : v0 + br;                                 \
            bn_cl_dsum_##SFX(dy, x, items, S, v0, v1, C, mean, relu, al, be, part + 2 * q * C,     \
                             part + 2 * q * C + C);                                                \
        }                                                                                          \
        for (int64_t c = 0; c < C; c++) {                                                          \
            double s1 = 0, s2 = 0;                                                                 \
            for (int64_t q = 0; q < nbr; q++) {                                                    \
                s1 += part[2 * q * C + c];                                                         \
                s2 += part[2 * q * C + C + c];                                                     \
            }                                                                                      \
            if (dw) dw[c] = (T)(s2 * (double)rstd[c]);                                             \
            if (db) db[c] = (T)s1;                                                                 \
            double r = (double)rstd[c];                                                            \
            kk[c] = Rr ? (T)(s2 * r * r / (double)Rr) : (T)0;                                      \
            mdy[c] = Rr ? (T)(s1 / (double)Rr) : (T)0;                                             \
        }                                                                                          \
        /* Block 0's sums (the first 2C doubles of part) are read above for                        \
         * every channel before scale overwrites them. */                                          \
        for (int64_t c = 0; c < C; c++)                                                            \
            scale[c] = (T)((double)rstd[c] * (w ? (double)w[c] : 1.0));                            \
        _Pragma("omp parallel for schedule(static) if (R * C >= TS_PAR_MIN)") for (int64_t q = 0;  \
                                                                                   q < nbr; q++) { \
            int64_t v0 = q * br, v1 = Rr - v0 < br ? Rr : v0 + br;                                 \
            for (int64_t v = v0, r0, len; v < v1; v += len) {                                      \
                len = cl_run(items, S, v, v1, &r0);                                                \
                bn_cl_dx_##SFX(dx + r0 * C, dy + r0 * C, x + r0 * C, len, C, mean, kk, mdy, scale, \
                               relu, al, be);                                                      \
            }                                                                                      \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

DEF_BN_CL(float, f32, 0)
DEF_BN_CL(double, f64, 1)

static ts_status k_bn(const ts_kargs *k) {
    const int cl = k->a->batch_norm.channels_last != 0;
    switch (k->in[0].dtype) {
    case TS_F32: return cl ? bn_fwd_cl_f32(k) : bn_fwd_f32(k);
    case TS_F64: return cl ? bn_fwd_cl_f64(k) : bn_fwd_f64(k);
    default: return ts_kernel_bad_dtype(k, "batch_norm", k->in[0].dtype);
    }
}

static ts_status k_bn_bwd(const ts_kargs *k) {
    const int cl = k->a->batch_norm.channels_last != 0;
    switch (k->in[1].dtype) {
    case TS_F32: return cl ? bn_bwd_cl_f32(k) : bn_bwd_f32(k);
    case TS_F64: return cl ? bn_bwd_cl_f64(k) : bn_bwd_f64(k);
    default: return ts_kernel_bad_dtype(k, "batch_norm_bwd", k->in[1].dtype);
    }
}

/* The forward needs partials only in training mode, but the mode is set
 * after the node is built, so the scratch is always planned. */
static size_t scratch_bn(const ts_graph *g, const ts_node *n) {
    return scratch_for(ts_in_type(g, n, 0), n->a.batch_norm.channels_last != 0,
                       n->a.batch_norm.masked != 0);
}
static size_t scratch_bn_bwd(const ts_graph *g, const ts_node *n) {
    return scratch_for(ts_in_type(g, n, 1), n->a.batch_norm.channels_last != 0,
                       n->a.batch_norm.masked != 0);
}

static double cost_bn(const ts_graph *g, const ts_node *n) {
    return 6.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
static double cost_bn_bwd(const ts_graph *g, const ts_node *n) {
    return 9.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}

const ts_op_def ts_def_batch_norm = {.name = "batch_norm",
                                     .min_in = 3,
                                     .max_in = 6,
                                     .flags = TS_OPF_SIDE_EFFECT,
                                     .infer = infer_bn,
                                     .grad = grad_bn,
                                     .kernel = k_bn,
                                     .scratch = scratch_bn,
                                     .cost = cost_bn};

const ts_op_def ts_def_batch_norm_bwd = {.name = "batch_norm_bwd",
                                         .min_in = 4,
                                         .max_in = 7,
                                         .infer = infer_bn_bwd,
                                         .kernel = k_bn_bwd,
                                         .scratch = scratch_bn_bwd,
                                         .cost = cost_bn_bwd};

/* ---- builder ----------------------------------------------------------- */

static int32_t new_stat(ts_graph *g, const char *prefix, const char *suffix, ts_dtype dt, int64_t c,
                        ts_init init) {
    char name[512];
    int len = snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    if (len < 0 || (size_t)len >= sizeof name) {
        ts_graph_fail(g, TS_ERR_INVALID, "batch_norm: name prefix '%.40s...' is too long", prefix);
        return -1;
    }
    if (ts_val_ok(ts_find(g, name))) {
        ts_graph_fail(g, TS_ERR_INVALID, "batch_norm: the name '%s' is already used", name);
        return -1;
    }
    ts_type t = {.dtype = dt, .rank = 1, .dims = {c}};
    int32_t id = ts_value_new(g, &t, TS_VK_STATE, name);
    if (id >= 0) g->values[id].init = init;
    return id;
}

static ts_val add_bn(ts_graph *g, ts_val x, ts_val weight, ts_val bias, const char *name_prefix,
                     double momentum, double eps, int relu, int cl, ts_val row_mask) {
    /* TS_NONE for weight/bias means "no affine": with a sticky error
     * pending we return before it could be mistaken for that. */
    if (!g || g->status != TS_OK || !ts_val_ok(x)) return TS_NONE;
    if (ts_val_ok(weight) != ts_val_ok(bias))
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "batch_norm: give both weight and bias or neither (affine=False)");
    if (!name_prefix || !*name_prefix)
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "batch_norm: a name prefix is required for the running statistics");
    if (x.id >= g->n_values)
        return ts_graph_fail(g, TS_ERR_INVALID, "batch_norm: x is not a value of this graph");
    const ts_type xt = ts_v(g, x)->t;
    if (check_x(&xt) != TS_OK) {
        char tb[128];
        return ts_graph_fail(g, TS_ERR_SHAPE, "batch_norm(%s=%s): %s",
                             ts_name(g, x) ? ts_name(g, x) : "x", ts_type_str(tb, sizeof tb, &xt),
                             ts_last_error());
    }
    if (ts_val_ok(row_mask) &&
        (row_mask.id >= g->n_values || check_mask(&ts_v(g, row_mask)->t, &xt) != TS_OK))
        return ts_graph_fail(g, TS_ERR_SHAPE, "batch_norm '%s': %s", name_prefix,
                             row_mask.id >= g->n_values
                                 ? "the row mask is not a value of this graph"
                                 : ts_last_error());
    int32_t rm =
        new_stat(g, name_prefix, "running_mean", xt.dtype, chans(&xt, cl), ts_init_zeros());
    if (rm < 0) return TS_NONE;
    int32_t rv = new_stat(g, name_prefix, "running_var", xt.dtype, chans(&xt, cl), ts_init_ones());
    if (rv < 0) return TS_NONE;
    ts_val in[6] = {x};
    int n = 1;
    ts_attrs at = ts_attrs_zero();
    at.batch_norm.affine = ts_val_ok(weight);
    at.batch_norm.training = 1; /* ts_compile sets the plan's mode */
    at.batch_norm.relu = relu;
    at.batch_norm.channels_last = cl;
    at.batch_norm.momentum = momentum;
    at.batch_norm.eps = eps;
    at.batch_norm.masked = ts_val_ok(row_mask);
    if (ts_val_ok(weight)) {
        in[n++] = weight;
        in[n++] = bias;
    }
    in[n++] = ts_mkval(rm);
    in[n++] = ts_mkval(rv);
    if (ts_val_ok(row_mask)) in[n++] = row_mask;
    return ts_node_add(g, TS_OP_BATCH_NORM, n, in, &at, NULL);
}

ts_val ts_batch_norm(ts_graph *g, ts_val x, ts_val weight, ts_val bias, const char *name_prefix,
                     double momentum, double eps) {
    return add_bn(g, x, weight, bias, name_prefix, momentum, eps, 0, 0, TS_NONE);
}

ts_val ts_batch_norm_relu(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                          const char *name_prefix, double momentum, double eps) {
    return add_bn(g, x, weight, bias, name_prefix, momentum, eps, 1, 0, TS_NONE);
}

ts_val ts_batch_norm_layout(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                            const char *name_prefix, double momentum, double eps, int relu,
                            ts_layout layout) {
    return add_bn(g, x, weight, bias, name_prefix, momentum, eps, relu != 0,
                  layout == TS_CHANNELS_LAST, TS_NONE);
}

ts_val ts_batch_norm_masked(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                            const char *name_prefix, double momentum, double eps, int relu,
                            ts_layout layout, ts_val row_mask) {
    if (g && g->status == TS_OK && !ts_val_ok(row_mask))
        return ts_graph_fail(g, TS_ERR_INVALID, "batch_norm '%s': no row mask given",
                             name_prefix ? name_prefix : "?");
    return add_bn(g, x, weight, bias, name_prefix, momentum, eps, relu != 0,
                  layout == TS_CHANNELS_LAST, row_mask);
}

ts_status ts_batch_norm_mask_rows(ts_graph *g, const char *mask_name, int *n_masked) {
    if (n_masked) *n_masked = 0;
    if (!g || !mask_name || !*mask_name)
        return ts_fail(TS_ERR_INVALID, "batch_norm_mask_rows: NULL graph or mask name");
    if (g->status != TS_OK) return g->status;
    ts_val mask = ts_find(g, mask_name);
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        if (n->op != TS_OP_BATCH_NORM || n->dead || n->a.batch_norm.masked) continue;
        const ts_type x = ts_v(g, ts_mkval(n->in[0]))->t;
        /* the mask is made at the first node that reads it (never dangling) */
        if (!ts_val_ok(mask)) mask = ts_input(g, mask_name, TS_F32, 1, x.dims);
        if (!ts_val_ok(mask)) return ts_graph_status(g);
        ts_status s = check_mask(&ts_v(g, mask)->t, &x);
        if (s != TS_OK) {
            const char *nm = ts_name(g, ts_mkval(n->out[0]));
            ts_error_prefix("batch_norm '%s', mask '%s'", nm ? nm : "?", mask_name);
            return s;
        }
        int32_t *in = realloc(n->in, sizeof(int32_t) * (size_t)(n->n_in + 1));
        if (!in) return ts_fail(TS_ERR_NOMEM, "batch_norm_mask_rows: out of memory");
        n->in = in;
        n->in[n->n_in++] = mask.id;
        n->a.batch_norm.masked = 1;
        if (n_masked) (*n_masked)++;
    }
    return TS_OK;
}
