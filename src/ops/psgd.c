/* PowerSGD ops (Vogels et al. 2019), inserted by the distribute pass
 * (src/passes/compress.c) in place of a bucket's allreduce_start/wait when
 * ts_compile_options.compress.method is powersgd, never by users.
 *
 *   psgd_start (g1..gk, err, q) -> (token, buf, qbuf)
 *       per compressed gradient i (ts_psgd_matrix: a matrix view [n, m]
 *       with r < n, m and at least min_elems elements): M_i = c g_i + e_i
 *       (kept in err: the error feedback), P_i = M_i Q_i into buf; the
 *       other gradients are copied into buf as c g_i; starts the sum
 *       all-reduce of buf. c: the local clip (a.clip > 0), this rank's
 *       bucket norm brought down to a.clip / sqrt(ranks) (DGC), before
 *       the error feedback counts the gradient as sent;
 *   psgd_wait (token, buf, qbuf, g1..gk, err, q) -> token
 *       waits; the dense gradients become buf / ranks; per compressed
 *       gradient P = buf / ranks is orthonormalised, Q_i = M_i^T P into
 *       qbuf, which is all-reduced (blocking) and divided by the ranks;
 *       then g_i = P Q_i^T (the same bits on every rank), e_i = M_i - g_i,
 *       and Q_i is kept in q for the next step (warm start). With a.iters
 *       > 1 (dist.compress_power_iters) each further iteration computes
 *       P_i = M_i Q_i again, all-reduces the bucket's P factors (packed),
 *       orthonormalises them and all-reduces Q_i = M_i^T P_i before g_i:
 *       two more blocking all-reduces, a better rank-r fit of the mean.
 *
 * Loss scaling (a.scaled: the scale is both nodes' last input): M holds
 * unscaled values (psgd_start multiplies the gradients by 1 / scale) and
 * psgd_wait multiplies the gradients by the scale again (a power of two:
 * exact) for the graph's own unscale_grads after the waits. A rank whose
 * gradients are not finite leaves its error alone and sends NaN; every
 * rank then finds the summed buf not finite, makes the gradients NaN (so
 * found_inf is 1 everywhere and the step is skipped) and keeps M, this
 * step's gradient included, in its error, and q as it was.
 *
 * err is [elements of the compressed gradients], this rank's own
 * (checkpointed as row r of [ranks, elements], ts_plan_compress_row); q is
 * [elements of the Q_i], the same on every rank, starting from N(0, 1)
 * drawn from the compile seed. Products accumulate in double, in a fixed
 * order (src/ops/psgd_products.h).
 *
 * Momentum correction (a.momentum > 0, DGC's, dist.compress_momentum): psgd_start
 * takes one more state input after q, vel [elements of every gradient of the
 * bucket], this rank's velocity: v = momentum v + c g for every gradient,
 * and v takes the gradient's place above (added into M, or copied into buf
 * for the uncompressed ones). The SGD update then runs without momentum
 * (src/passes/compress.c), so what is applied is the exchanged velocity.
 * The local clip then runs from step 1, dense start included: the global
 * clip after the exchange would clip the velocity, not the gradient.
 *
 * Dense start (a.dense > 0, Vogels et al.'s start_powerSGD_iter): steps
 * 1..a.dense all-reduce every gradient dense through buf (sized for them
 * then), g = sum / ranks, as the uncompressed all-reduce; err is added in
 * and cleared (it is 0 then, unless a run resumed with another a.dense)
 * and q stays at its start, so compression begins with the warm start of
 * step 1. No local clip then: the graph's clip_coef clips those steps
 * (its until_step), so they are the uncompressed run's. */
#include <math.h>
#include <string.h>
#include "collective.h"
#include "dist/compress.h"
#include "kern.h"
#include "psgd_products.h"

static const char *lbl(const ts_kargs *k) {
    return k->label ? k->label : "?";
}

/* Sizes of a bucket: elements of the compressed gradients (err), of their
 * Q factors (q), of buf (P factors and the dense gradients). */
typedef struct psgd_sizes {
    int64_t err, q, buf;
} psgd_sizes;

static void add_sizes(psgd_sizes *z, const ts_compress_attrs *a, int rank, const int64_t *dims) {
    int64_t n, m;
    if (ts_psgd_matrix(rank, dims, a->min_elems, a->max_elems, (int)a->rank, &n, &m)) {
        z->err += n * m;
        z->q += m * a->rank;
        z->buf += n * a->rank;
    } else {
        z->buf += ts_shape_numel(rank, dims);
    }
}

static ts_status sizes_graph(const ts_graph *g, const ts_node *n, int k, psgd_sizes *z) {
    memset(z, 0, sizeof *z);
    for (int i = 0; i < k; i++) {
        const ts_type *t = ts_in_type(g, n, i);
        if (t->dtype != TS_F32)
            return ts_fail(TS_ERR_SHAPE, "powersgd: gradient %d is %s; compression takes f32", i,
                           ts_dtype_name(t->dtype));
        add_sizes(z, &n->a.compress, t->rank, t->dims);
    }
    return TS_OK;
}

static int64_t at_least_1(int64_t x) {
    return x > 0 ? x : 1;
}

/* Inputs of psgd_start after the gradients: err, q[, vel][, scale]. */
static int start_extra(const ts_compress_attrs *a) {
    return 2 + (a->momentum > 0) + (a->scaled ? 1 : 0);
}

static ts_status infer_start(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_compress_attrs *a = &n->a.compress;
    const int k = n->n_in - start_extra(a);
    psgd_sizes z;
    if (k < 1) return ts_fail(TS_ERR_SHAPE, "psgd_start: no gradients");
    ts_status s = sizes_graph(g, n, k, &z);
    if (s != TS_OK) return s;
    if (a->rank < 1 || a->ranks < 2 || ts_type_numel(ts_in_type(g, n, k)) != at_least_1(z.err) ||
        ts_type_numel(ts_in_type(g, n, k + 1)) != at_least_1(z.q))
        return ts_fail(TS_ERR_SHAPE, "psgd_start: rank %lld, %lld ranks, err %lld, q %lld",
                       (long long)a->rank, (long long)a->ranks,
                       (long long)ts_type_numel(ts_in_type(g, n, k)),
                       (long long)ts_type_numel(ts_in_type(g, n, k + 1)));
    int64_t all = 0; /* elements of every gradient: the velocity's */
    for (int i = 0; i < k && a->momentum > 0; i++) all += ts_type_numel(ts_in_type(g, n, i));
    if (a->momentum > 0 && ts_type_numel(ts_in_type(g, n, k + 2)) != all)
        return ts_fail(TS_ERR_SHAPE, "psgd_start: velocity %lld, the gradients %lld",
                       (long long)ts_type_numel(ts_in_type(g, n, k + 2)), (long long)all);
    memset(out, 0, 3 * sizeof *out);
    out[0].dtype = TS_I64;
    out[1].dtype = out[2].dtype = TS_F32;
    out[1].rank = out[2].rank = 1;
    int64_t dense = 0; /* a dense step's buf: every gradient */
    for (int i = 0; i < k && a->dense > 0; i++) dense += ts_type_numel(ts_in_type(g, n, i));
    out[1].dims[0] = at_least_1(z.buf > dense ? z.buf : dense);
    out[2].dims[0] = at_least_1(z.q);
    *n_out = 3;
    return TS_OK;
}

static ts_status infer_wait(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    if (n->n_in < 6 + (n->a.compress.scaled ? 1 : 0) || ts_in_type(g, n, 0)->dtype != TS_I64)
        return ts_fail(TS_ERR_SHAPE, "psgd_wait: (token, buf, qbuf, g..., err, q[, scale])");
    memset(out, 0, sizeof *out);
    out->dtype = TS_I64;
    *n_out = 1;
    return TS_OK;
}

static ts_status rt_of(const ts_kargs *k, const char *op, ts_dist_rt **rt, int *b) {
    *rt = k->backend;
    *b = (int)k->a->compress.ticket;
    if (!*rt || !(*rt)->comm || *b < 0 || *b >= (*rt)->n_buckets || !k->ctx)
        return ts_fail(TS_ERR_INTERNAL, "%s '%s': bucket %d has no comm in this plan", op, lbl(k),
                       *b);
    return TS_OK;
}

/* Whether every value of the first ng inputs is finite. */
static int all_finite(const ts_kargs *k, int ng) {
    for (int i = 0; i < ng; i++) {
        const float *g = k->in[i].data;
        for (int64_t j = 0, n = ts_tensor_numel(&k->in[i]); j < n; j++)
            if (!isfinite(g[j])) return 0;
    }
    return 1;
}

/* psgd_start's scratch: the gradients' pointers and lengths for the local clip, then the
 * transposed rows of ts_psgd_mq (64-byte aligned). */
static size_t clip_scratch(int n_in) {
    return ((sizeof(float *) + sizeof(int64_t)) * (size_t)n_in + 63) & ~(size_t)63;
}
/* The most columns of the compressed gradients among inputs [from, to) of n. */
static int64_t widest_matrix(const ts_graph *g, const ts_node *n, int from, int to) {
    const ts_compress_attrs *a = &n->a.compress;
    int64_t widest = 0;
    for (int i = from; i < to; i++) {
        const ts_type *t = ts_in_type(g, n, i);
        int64_t rows, cols;
        if (ts_psgd_matrix(t->rank, t->dims, a->min_elems, a->max_elems, (int)a->rank, &rows,
                           &cols) &&
            cols > widest)
            widest = cols;
    }
    return widest;
}
static size_t scratch_start(const ts_graph *g, const ts_node *n) {
    const int ng = n->n_in - start_extra(&n->a.compress);
    return clip_scratch(n->n_in) + ts_psgd_mq_scratch_bytes(widest_matrix(g, n, 0, ng));
}

/* psgd_wait's scratch: ts_psgd_mq's for the further power iterations (a.iters > 1). */
static size_t scratch_wait(const ts_graph *g, const ts_node *n) {
    const ts_compress_attrs *a = &n->a.compress;
    if (a->iters <= 1) return 0;
    return ts_psgd_mq_scratch_bytes(widest_matrix(g, n, 3, n->n_in - 2 - (a->scaled ? 1 : 0)));
}

/* This rank's local clip factor over the bucket's gradients (DGC, as topk:
 * see src/passes/compress.c for why not the global clip). */
static float local_clip(const ts_kargs *k, int ng, float inv) {
    const float **seg = k->scratch;
    int64_t *len = (int64_t *)(seg + k->n_in);
    for (int i = 0; i < ng; i++) {
        seg[i] = k->in[i].data;
        len[i] = ts_tensor_numel(&k->in[i]);
    }
    return ts_compress_clip_scale(seg, len, ng, inv, k->a->compress.clip,
                                  (int)k->a->compress.ranks);
}

static ts_status k_start(const ts_kargs *k) {
    ts_dist_rt *rt;
    int b;
    ts_status s = rt_of(k, "psgd_start", &rt, &b);
    if (s != TS_OK) return s;
    const ts_compress_attrs *a = &k->a->compress;
    const int ng = k->n_in - start_extra(a), r = (int)a->rank;
    const int mc = a->momentum > 0;
    const float inv =
        a->scaled ? (float)(1.0 / (double)*(const float *)k->in[k->n_in - 1].data) : 1.0f;
    const int skip = a->scaled && !all_finite(k, ng); /* an overflow: the state stays */
    const int dense = k->ctx->step <= a->dense;
    /* local clipping in compressed steps; a dense step without momentum
     * correction is clipped by the graph's clip_coef, as in the
     * uncompressed run */
    const float c = skip || (dense && !mc) ? 1.0f : local_clip(k, ng, inv);
    float *err = k->in[ng].data;
    const float *q = k->in[ng + 1].data;
    float *vel = mc ? k->in[ng + 2].data : NULL;
    float *buf = k->out[1].data;
    int64_t oe = 0, oq = 0, ob = 0, ov = 0;
    for (int i = 0; i < ng; i++) {
        const ts_tensor *t = &k->in[i];
        const int64_t e = ts_tensor_numel(t);
        int64_t n, m;
        const int compressed =
            ts_psgd_matrix(t->rank, t->dims, a->min_elems, a->max_elems, r, &n, &m);
        /* what this rank contributes: c g (unscaled), or its velocity */
        const float *g = t->data;
        if (mc && !skip) {
            float *v = vel + ov;
            const float mom = (float)a->momentum;
            for (int64_t j = 0; j < e; j++) v[j] = mom * v[j] + ts_psgd_unscale_clip(g[j], inv, c);
            g = v;
        }
        const float gi = mc ? 1.0f : inv, ci = mc ? 1.0f : c; /* the velocity is both already */
        ov += e;
        if (dense) { /* the dense start: every gradient as it is */
            for (int64_t j = 0; j < e; j++) {
                const float gj = ts_psgd_unscale_clip(g[j], gi, ci);
                buf[ob + j] = skip ? NAN : compressed ? err[oe + j] + gj : gj;
            }
            oe += compressed ? e : 0;
            ob += e;
        } else if (compressed) {
            float *M = err + oe;
            if (skip)
                for (int64_t j = 0; j < n * r; j++) buf[ob + j] = NAN;
            else /* M += c g (the error feedback), then P = M Q */
                ts_psgd_mq(M, g, gi, ci, q + oq, buf + ob,
                           (float *)((char *)k->scratch + clip_scratch(k->n_in)), n, m, r);
            oe += n * m;
            oq += m * r;
            ob += n * r;
        } else {
            if (skip)
                for (int64_t j = 0; j < e; j++) buf[ob + j] = NAN;
            else if (gi == 1.0f && ci == 1.0f)
                memcpy(buf + ob, g, sizeof(float) * (size_t)e);
            else
                for (int64_t j = 0; j < e; j++) buf[ob + j] = ts_psgd_unscale_clip(g[j], gi, ci);
            ob += e;
        }
    }
    ts_coll_ticket t = {0};
    if ((s = ts_allreduce_start(rt->comm, buf, (size_t)ob, TS_F32, TS_RED_SUM,
                                (ts_coll_algo)a->algo, &t)) != TS_OK)
        return s;
    rt->tickets[b] = t;
    if (rt->cstats.step != k->ctx->step) {
        memset(&rt->cstats, 0, sizeof rt->cstats);
        rt->cstats.step = k->ctx->step;
    }
    double dense_bytes = 0;
    for (int i = 0; i < ng; i++) dense_bytes += 4.0 * (double)ts_tensor_numel(&k->in[i]);
    rt->cstats.dense_bytes += dense_bytes;
    rt->cstats.sent_bytes += 4.0 * (double)(ob + oq); /* the P all-reduce, then the Q one */
    rt->cstats.recv_bytes += 4.0 * (double)(ob + oq); /* (oq is 0 in a dense step) */
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

static int buf_finite(const float *buf, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (!isfinite(buf[j])) return 0;
    return 1;
}

/* P = the summed P factor (from) / ranks into P, orthonormalised; then Q = M^T P into qsum, this
 * rank's part of the Q all-reduce. */
static void p_then_q(float *P, const float *from, float nr, const float *M, float *qsum, int64_t n,
                     int64_t m, int r) {
    for (int64_t j = 0; j < n * r; j++) P[j] = from[j] / nr;
    ts_psgd_orthonormalise(P, n, r);
    ts_psgd_mtp(M, P, qsum, n, m, r);
}

/* One more power iteration on the ranks' mean M (dist.compress_power_iters), every compressed
 * gradient of the bucket: Q = qsum / ranks (kept in q), P = M Q into the packed P factors at
 * buf's start, all-reduced as one message, then p_then_q; *sent: the elements exchanged. */
static ts_status power_iteration(const ts_kargs *k, ts_dist_rt *rt, const ts_tensor *G, int ng,
                                 float *err, float *q, float *buf, float *qbuf, int64_t *sent) {
    const ts_compress_attrs *a = &k->a->compress;
    const int r = (int)a->rank;
    const float nr = (float)a->ranks;
    int64_t oe = 0, oq = 0, op = 0, n, m;
    for (int i = 0; i < ng; i++) {
        if (!ts_psgd_matrix(G[i].rank, G[i].dims, a->min_elems, a->max_elems, r, &n, &m)) continue;
        float *Q = q + oq;
        for (int64_t j = 0; j < m * r; j++) Q[j] = qbuf[oq + j] / nr;
        /* M is err (g NULL: nothing added); ts_psgd_mq leaves it as it is */
        ts_psgd_mq(err + oe, NULL, 1.0f, 1.0f, Q, buf + op, k->scratch, n, m, r);
        oe += n * m;
        oq += m * r;
        op += n * r;
    }
    ts_status s =
        ts_allreduce(rt->comm, buf, (size_t)op, TS_F32, TS_RED_SUM, (ts_coll_algo)a->algo);
    if (s != TS_OK) return s;
    oe = oq = op = 0;
    for (int i = 0; i < ng; i++) {
        if (!ts_psgd_matrix(G[i].rank, G[i].dims, a->min_elems, a->max_elems, r, &n, &m)) continue;
        p_then_q(buf + op, buf + op, nr, err + oe, qbuf + oq, n, m, r);
        oe += n * m;
        oq += m * r;
        op += n * r;
    }
    *sent = op + oq;
    return ts_allreduce(rt->comm, qbuf, (size_t)oq, TS_F32, TS_RED_SUM, (ts_coll_algo)a->algo);
}

static ts_status k_wait(const ts_kargs *k) {
    ts_dist_rt *rt;
    int b;
    ts_status s = rt_of(k, "psgd_wait", &rt, &b);
    if (s != TS_OK) return s;
    if ((s = ts_coll_wait(rt->comm, rt->tickets[b])) != TS_OK) return s;
    const ts_compress_attrs *a = &k->a->compress;
    const int ng = k->n_in - 5 - (a->scaled ? 1 : 0), r = (int)a->rank;
    const float nr = (float)a->ranks;
    const float scale = a->scaled ? *(const float *)k->in[k->n_in - 1].data : 1.0f;
    const ts_tensor *G = k->in + 3;
    float *err = k->in[3 + ng].data;
    float *q = k->in[4 + ng].data, *buf = k->in[1].data, *qbuf = k->in[2].data;
    int64_t oe = 0, oq = 0, ob = 0;
    if (a->scaled && !buf_finite(buf, ts_tensor_numel(&k->in[1]))) {
        /* some rank overflowed: the step is skipped; err keeps M, q stays */
        for (int i = 0; i < ng; i++) {
            float *g = G[i].data;
            for (int64_t j = 0, e = ts_tensor_numel(&G[i]); j < e; j++) g[j] = NAN;
        }
        *(int64_t *)k->out[0].data = b;
        return TS_OK;
    }
    if (k->ctx->step <= a->dense) { /* a dense step: the mean, err cleared (see the top) */
        for (int i = 0; i < ng; i++) {
            float *g = G[i].data;
            const int64_t e = ts_tensor_numel(&G[i]);
            int64_t n, m;
            for (int64_t j = 0; j < e; j++) g[j] = buf[ob + j] / nr * scale;
            if (ts_psgd_matrix(G[i].rank, G[i].dims, a->min_elems, a->max_elems, r, &n, &m)) {
                memset(err + oe, 0, sizeof(float) * (size_t)e);
                oe += e;
            }
            ob += e;
        }
        *(int64_t *)k->out[0].data = b;
        return TS_OK;
    }
    /* P = the mean of the ranks' M Q, orthonormalised, packed at buf's start as it goes (the
     * dense gradients it passes are consumed: a forward copy, op <= ob), so that further power
     * iterations all-reduce every P of the bucket as one message; then Q = M^T P */
    int64_t op = 0;
    for (int i = 0; i < ng; i++) {
        int64_t n, m;
        if (ts_psgd_matrix(G[i].rank, G[i].dims, a->min_elems, a->max_elems, r, &n, &m)) {
            p_then_q(buf + op, buf + ob, nr, err + oe, qbuf + oq, n, m, r);
            oe += n * m;
            oq += m * r;
            op += n * r;
            ob += n * r;
        } else {
            float *g = G[i].data;
            const int64_t e = ts_tensor_numel(&G[i]);
            for (int64_t j = 0; j < e; j++) g[j] = buf[ob + j] / nr * scale;
            ob += e;
        }
    }
    if (oq > 0 && (s = ts_allreduce(rt->comm, qbuf, (size_t)oq, TS_F32, TS_RED_SUM,
                                    (ts_coll_algo)a->algo)) != TS_OK)
        return s;
    for (int it = 1; oq > 0 && it < a->iters; it++) {
        int64_t sent = 0;
        if ((s = power_iteration(k, rt, G, ng, err, q, buf, qbuf, &sent)) != TS_OK) return s;
        rt->cstats.sent_bytes += 4.0 * (double)sent;
        rt->cstats.recv_bytes += 4.0 * (double)sent;
    }
    double res = 0;
    oe = oq = op = 0;
    for (int i = 0; i < ng; i++) {
        int64_t n, m;
        if (!ts_psgd_matrix(G[i].rank, G[i].dims, a->min_elems, a->max_elems, r, &n, &m)) continue;
        float *Q = q + oq, *M = err + oe, *g = G[i].data, *qt = qbuf + oq;
        for (int64_t j = 0; j < m * r; j++) Q[j] = qbuf[oq + j] / nr; /* the warm start */
        for (int64_t y = 0; y < m; y++) /* qbuf's part, now free: Q transposed */
            for (int j = 0; j < r; j++) qt[j * m + y] = Q[y * r + j];
        res += ts_psgd_approx(buf + op, qt, g, M, n, m, r);
        if (scale != 1.0f) /* back to the scaled gradients the graph's unscale_grads expects */
            for (int64_t j = 0; j < n * m; j++) g[j] = g[j] * scale;
        oe += n * m;
        oq += m * r;
        op += n * r;
    }
    rt->cstats.residual_sq += res;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

const ts_op_def ts_def_psgd_start = {.name = "psgd_start",
                                     .min_in = 3,
                                     .max_in = -1,
                                     .flags = TS_OPF_SIDE_EFFECT,
                                     .infer = infer_start,
                                     .kernel = k_start,
                                     .scratch = scratch_start};

const ts_op_def ts_def_psgd_wait = {.name = "psgd_wait",
                                    .min_in = 6,
                                    .max_in = -1,
                                    .flags = TS_OPF_SIDE_EFFECT,
                                    .infer = infer_wait,
                                    .kernel = k_wait,
                                    .scratch = scratch_wait};
