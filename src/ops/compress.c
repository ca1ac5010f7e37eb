/* Gradient compression ops, inserted by the distribute pass
 * (src/passes/compress.c) in place of a bucket's allreduce_start/wait when
 * ts_compile_options.compress.method is topk, never by users.
 *
 *   compress_start (residual[, velocity], g1..gk) -> (token, send, recv)
 *       adds the bucket's gradients (optionally clipped locally, and with
 *       DGC momentum correction accumulated in velocity first) to the
 *       error-feedback residual, selects the k largest magnitudes (ties: the
 *       lower index), encodes them into send (dist/compress.h's payload),
 *       leaves what was not sent in the residual (and zeroes the sent
 *       velocity: momentum factor masking) and starts the all-gather of
 *       every rank's payload into recv;
 *   compress_wait (token, send, recv, g1..gk) -> token
 *       waits, then overwrites the gradients with the sum of the ranks'
 *       decoded values, added in rank order 0, 1, ..., so every rank gets
 *       the same bits, divided by the rank count (the mean, as
 *       allreduce_wait).
 *
 * Loss scaling (a.scaled: the scale is both nodes' last input): the
 * residual holds unscaled values, so compress_start multiplies the
 * gradients by 1 / scale as it accumulates them and compress_wait
 * multiplies the mean by the scale again (a power of two: exact), for the
 * graph's own unscale_grads after the waits, whose found_inf the update
 * gate reads as without compression. A rank whose gradients of the bucket
 * are not finite leaves its residual and velocity as they were and sends
 * a marked payload (ts_topk_encode_skipped); every rank that sees a mark
 * makes the bucket's gradients NaN (so found_inf is 1 on every rank and
 * the step is skipped) and adds what it sent back into its residual
 * (exact: (acc - q) + q == acc), so a skipped step loses no gradient; only
 * the momentum factor masking of that step is not undone.
 *
 * The residual and velocity are state values [elements], this rank's
 * own (checkpointed as row r of [ranks, elements]), over the bucket's flat element range (g1's
 * elements, then g2's, ...; no padding). k follows the warm-up schedule of the step
 * (ts_topk_ratio_at), the same on every rank, so the payload size is too.
 *
 * Dense start (a.dense > 0): steps 1..a.dense send every value in f32
 * (ratio 1: the dense all-reduce's arithmetic, the residual left at 0)
 * and do not mask the velocity, which then is the dense run's momentum
 * averaged; the payloads are sized for them (kmax = elems). */
#include <math.h>
#include <string.h>
#include "collective.h"
#include "dist/compress.h"
#include "kern.h"

static const char *lbl(const ts_kargs *k) {
    return k->label ? k->label : "?";
}

static int n_state(const ts_compress_attrs *a) {
    return a->momentum > 0 ? 2 : 1;
}

static ts_status infer_start(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_compress_attrs *a = &n->a.compress;
    const int ns = n_state(a), end = n->n_in - (a->scaled ? 1 : 0);
    if (end <= ns) return ts_fail(TS_ERR_SHAPE, "compress_start: no gradients");
    if (a->scaled && ts_type_numel(ts_in_type(g, n, end)) != 1)
        return ts_fail(TS_ERR_SHAPE, "compress_start: the last input must be the loss scale");
    int64_t elems = 0;
    for (int i = 0; i < n->n_in; i++) {
        const ts_type *t = ts_in_type(g, n, i);
        if (t->dtype != TS_F32)
            return ts_fail(TS_ERR_SHAPE, "compress_start: input %d is %s; compression takes f32", i,
                           ts_dtype_name(t->dtype));
        if (i >= ns && i < end) elems += ts_type_numel(t);
    }
    for (int i = 0; i < ns; i++)
        if (ts_type_numel(ts_in_type(g, n, i)) != elems)
            return ts_fail(TS_ERR_SHAPE,
                           "compress_start: state %d has %lld elements, not the bucket's %lld", i,
                           (long long)ts_type_numel(ts_in_type(g, n, i)), (long long)elems);
    if (a->elems != elems || a->kmax < 1 || a->kmax > elems || a->ranks < 2)
        return ts_fail(TS_ERR_INVALID, "compress_start: elems %lld, kmax %lld, ranks %lld",
                       (long long)a->elems, (long long)a->kmax, (long long)a->ranks);
    /* the dense start (a->dense) sends every value in f32: kmax is elems then */
    const int vmax = a->dense > 0 ? TS_CVAL_F32 : (int)a->values;
    const int64_t words = (int64_t)(ts_topk_payload_bytes(a->kmax, vmax) / 4);
    memset(out, 0, 3 * sizeof *out);
    out[0].dtype = TS_I64;
    out[1].dtype = TS_I32;
    out[1].rank = 1;
    out[1].dims[0] = words;
    out[2].dtype = TS_I32;
    out[2].rank = 1;
    out[2].dims[0] = words * a->ranks;
    *n_out = 3;
    return TS_OK;
}

/* The k after the warm-up (sizes the fused pass's candidates). */
static int64_t k_final(const ts_compress_attrs *a) {
    return ts_topk_k(a->elems, a->ratio);
}

/* The segments' pointers and lengths (2 x the inputs), the fused pass's
 * scratch, then kmax indices. */
static size_t scratch_start(const ts_graph *g, const ts_node *n) {
    (void)g;
    const ts_compress_attrs *a = &n->a.compress;
    return 2 * sizeof(int64_t) * (size_t)n->n_in + ts_topk_fused_scratch(a->elems, k_final(a)) +
           sizeof(uint32_t) * (size_t)a->kmax;
}

static ts_status infer_wait(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    if (ts_in_type(g, n, 0)->dtype != TS_I64)
        return ts_fail(TS_ERR_SHAPE, "compress_wait: input 0 must be compress_start's token");
    for (int i = 3; i < n->n_in; i++)
        if (ts_in_type(g, n, i)->dtype != TS_F32)
            return ts_fail(TS_ERR_SHAPE, "compress_wait: gradient %d is not f32", i - 3);
    if (n->a.compress.scaled && (n->n_in < 6 || ts_type_numel(ts_in_type(g, n, n->n_in - 1)) != 1))
        return ts_fail(TS_ERR_SHAPE, "compress_wait: the last input must be the loss scale");
    memset(out, 0, sizeof *out);
    out->dtype = TS_I64;
    *n_out = 1;
    return TS_OK;
}

static ts_status rt_of(const ts_kargs *k, const char *op, ts_dist_rt **rt, int *b) {
    *rt = k->backend;
    *b = (int)k->a->compress.ticket;
    if (!*rt || !(*rt)->comm || *b < 0 || *b >= (*rt)->n_buckets)
        return ts_fail(TS_ERR_INTERNAL, "%s '%s': bucket %d has no comm in this plan", op, lbl(k),
                       *b);
    if (!k->ctx) return ts_fail(TS_ERR_INTERNAL, "%s '%s': no step context", op, lbl(k));
    return TS_OK;
}

/* The k of this step, the same on every rank. */
static int64_t k_now(const ts_compress_attrs *a, int64_t step) {
    if (step <= a->dense) return a->elems; /* the dense start */
    int64_t kk = ts_topk_k(a->elems, ts_topk_ratio_at(a->ratio, a->warmup, step));
    return kk < a->kmax ? kk : a->kmax;
}

/* The encoding of the step's values: f32 in the dense start. */
static int values_now(const ts_compress_attrs *a, int64_t step) {
    return step <= a->dense ? TS_CVAL_F32 : (int)a->values;
}

/* A new step starts the step's figures afresh. */
static void stats_step(ts_dist_rt *rt, int64_t step) {
    if (rt->cstats.step == step) return;
    memset(&rt->cstats, 0, sizeof rt->cstats);
    rt->cstats.step = step;
}

/* The loss scale's inverse (1 without loss scaling), as unscale_grads
 * computes it; *end: the gradients' inputs end there. */
static float inv_scale(const ts_kargs *k, int *end) {
    *end = k->n_in - (k->a->compress.scaled ? 1 : 0);
    if (!k->a->compress.scaled) return 1.0f;
    return (float)(1.0 / (double)*(const float *)k->in[*end].data);
}

/* Whether every gradient of inputs [from, end) is finite. */
static int all_finite(const ts_kargs *k, int from, int end) {
    for (int j = from; j < end; j++) {
        const float *g = k->in[j].data;
        for (int64_t i = 0, n = ts_tensor_numel(&k->in[j]); i < n; i++)
            if (!isfinite(g[i])) return 0;
    }
    return 1;
}

/* Accumulates the bucket into this rank's residual (and velocity), selects
 * and encodes the top k into send; returns the residual's sum of squares
 * after the step. */
static double accumulate_select(const ts_kargs *k, float *res, float *vel, float inv, int end,
                                int64_t kk, int vf, int mask) {
    const ts_compress_attrs *a = &k->a->compress;
    const int ns = n_state(a), nr = (int)a->ranks;
    const float **segs = k->scratch;
    int64_t *len = (int64_t *)(segs + k->n_in);
    char *fused = (char *)(len + k->n_in);
    uint32_t *idx = (uint32_t *)(fused + ts_topk_fused_scratch(a->elems, k_final(a)));
    for (int j = ns; j < end; j++) {
        segs[j - ns] = k->in[j].data;
        len[j - ns] = ts_tensor_numel(&k->in[j]);
    }
    /* Local clipping (DGC): this rank's bucket norm to clip / sqrt(ranks). */
    const float c = ts_compress_clip_scale(segs, len, end - ns, inv, a->clip, nr);
    const ts_topk_accum acc = {.g = segs,
                               .len = len,
                               .n_seg = end - ns,
                               .res = res,
                               .vel = vel,
                               .elems = a->elems,
                               .inv = inv,
                               .clip_scale = c,
                               .momentum = (float)a->momentum,
                               .k_final = k_final(a)};
    const double acc_sq = ts_topk_accumulate_select(&acc, kk, fused, idx, NULL);
    double before = 0;
    for (int64_t j = 0; j < kk; j++) before += (double)res[idx[j]] * (double)res[idx[j]];
    ts_topk_encode(res, idx, kk, vf, k->out[1].data);
    double after = 0;
    for (int64_t j = 0; j < kk; j++) {
        after += (double)res[idx[j]] * (double)res[idx[j]];
        if (vel && mask) vel[idx[j]] = 0; /* momentum factor masking */
    }
    /* the sums run in different orders: when every value was sent, the
     * residual is what encoding left, and never below 0 otherwise */
    return kk == a->elems ? after : fmax(0.0, acc_sq - before + after);
}

static ts_status k_start(const ts_kargs *k) {
    ts_dist_rt *rt;
    int b;
    ts_status s = rt_of(k, "compress_start", &rt, &b);
    if (s != TS_OK) return s;
    const ts_compress_attrs *a = &k->a->compress;
    const int ns = n_state(a), nr = (int)a->ranks;
    float *res = k->in[0].data, *vel = ns > 1 ? (float *)k->in[1].data : NULL;
    int end;
    const float inv = inv_scale(k, &end);
    const int64_t kk = k_now(a, k->ctx->step);
    const int vf = values_now(a, k->ctx->step);
    /* Loss scaling: an overflow on this rank leaves its state alone. */
    const int skip = a->scaled && !all_finite(k, ns, end);
    double res_sq = 0;
    if (skip)
        ts_topk_encode_skipped(kk, vf, k->out[1].data);
    else
        /* the dense start keeps the velocity: all sent, it is the dense
         * momentum, averaged (masking it would be SGD without momentum) */
        res_sq = accumulate_select(k, res, vel, inv, end, kk, vf, k->ctx->step > a->dense);
    const size_t pb = ts_topk_payload_bytes(kk, vf);
    /* The payloads land in recv at a stride of this step's payload (the
     * all-gather's count is the whole array, nr equal blocks). */
    ts_coll_ticket t = {0};
    s = ts_allgather_start(rt->comm, k->out[1].data, k->out[2].data, pb / 4 * (size_t)nr, TS_I32,
                           (ts_coll_algo)a->algo, &t);
    if (s != TS_OK) return s;
    rt->tickets[b] = t;
    stats_step(rt, k->ctx->step);
    rt->cstats.dense_bytes += 4.0 * (double)a->elems;
    rt->cstats.sent_bytes += (double)pb;
    rt->cstats.recv_bytes += (double)pb * (nr - 1);
    rt->cstats.residual_sq += res_sq;
    rt->cstats.sent_values += kk;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

/* A skipped step (some rank's gradients overflowed): the bucket's
 * gradients become NaN on every rank, and what this rank sent goes back
 * into its residual (the wait's input `end`). */
static void undo_skipped(const ts_kargs *k, int end, int64_t kk, int vf) {
    for (int j = 3; j < end; j++) {
        float *g = k->in[j].data;
        for (int64_t i = 0, n = ts_tensor_numel(&k->in[j]); i < n; i++) g[i] = NAN;
    }
    const void *mine = k->in[1].data;
    if (ts_topk_payload_skipped(mine)) return; /* this rank's state was left alone */
    float *res = k->in[end].data;
    for (int64_t j = 0; j < kk; j++) {
        uint32_t i;
        float q;
        ts_topk_decode_at(mine, vf, j, &i, &q);
        res[i] += q; /* exact: res[i] is acc - q */
    }
}

/* The flat element i of the wait's gradients (inputs 3 ...): a pointer. */
static float *grad_at(const ts_kargs *k, int64_t i, int *t, int64_t *lo) {
    while (i >= *lo + ts_tensor_numel(&k->in[3 + *t])) *lo += ts_tensor_numel(&k->in[3 + (*t)++]);
    return (float *)k->in[3 + *t].data + (i - *lo);
}

/* The sums become the mean, g / ranks (times the loss scale: the scaled
 * gradients the graph's unscale_grads expects), once per index some rank
 * sent: every other entry is 0, which stays 0, so the pass over the whole
 * bucket is not needed. An index goes to the first rank that sent it;
 * the later ones find it in an earlier rank's list (all ascend). scratch:
 * one position per rank. */
static void mean_at_sent(const ts_kargs *k, int64_t kk, int vf, size_t pb, float scale) {
    const ts_compress_attrs *a = &k->a->compress;
    const int nr = (int)a->ranks;
    const char *recv = k->in[2].data;
    int64_t *pos = k->scratch;
    for (int r = 0; r < nr; r++) {
        const void *p = recv + (size_t)r * pb;
        int t = 0;
        int64_t lo = 0;
        memset(pos, 0, sizeof(int64_t) * (size_t)r);
        for (int64_t j = 0; j < kk; j++) {
            uint32_t i, e;
            float q;
            ts_topk_decode_at(p, vf, j, &i, &q);
            int seen = 0;
            for (int r2 = 0; r2 < r && !seen; r2++) {
                const void *p2 = recv + (size_t)r2 * pb;
                for (; pos[r2] < kk; pos[r2]++) {
                    ts_topk_decode_at(p2, vf, pos[r2], &e, &q);
                    if (e >= i) break;
                }
                seen = pos[r2] < kk && e == i;
            }
            if (seen) continue;
            float *g = grad_at(k, i, &t, &lo);
            *g = a->scaled ? *g / (float)nr * scale : *g / (float)nr;
        }
    }
}

static size_t scratch_wait(const ts_graph *g, const ts_node *n) {
    (void)g;
    return sizeof(int64_t) * (size_t)n->a.compress.ranks;
}

static ts_status k_wait(const ts_kargs *k) {
    ts_dist_rt *rt;
    int b;
    ts_status s = rt_of(k, "compress_wait", &rt, &b);
    if (s != TS_OK) return s;
    if ((s = ts_coll_wait(rt->comm, rt->tickets[b])) != TS_OK) return s;
    const ts_compress_attrs *a = &k->a->compress;
    const int nr = (int)a->ranks, end = k->n_in - (a->scaled ? 2 : 0), ng = end - 3;
    const float scale = a->scaled ? *(const float *)k->in[k->n_in - 1].data : 1.0f;
    const int64_t kk = k_now(a, k->ctx->step);
    const int vf = values_now(a, k->ctx->step);
    const size_t pb = ts_topk_payload_bytes(kk, vf);
    const char *recv = k->in[2].data;
    for (int r = 0; r < nr; r++) {
        const void *p = recv + (size_t)r * pb;
        if (ts_topk_payload_k(p) != kk)
            return ts_fail(TS_ERR_INTERNAL,
                           "compress_wait '%s': rank %d sent %lld values, not %lld", lbl(k), r,
                           (long long)ts_topk_payload_k(p), (long long)kk);
        if (a->scaled && ts_topk_payload_skipped(p)) {
            undo_skipped(k, end, kk, vf);
            *(int64_t *)k->out[0].data = b;
            return TS_OK;
        }
    }
    for (int j = 0; j < ng; j++)
        memset(k->in[3 + j].data, 0, sizeof(float) * (size_t)ts_tensor_numel(&k->in[3 + j]));
    for (int r = 0; r < nr; r++) { /* rank order: the same sums on every rank */
        const void *p = recv + (size_t)r * pb;
        int t = 0;
        int64_t lo = 0, prev = -1;
        for (int64_t j = 0; j < kk; j++) {
            uint32_t i;
            float q;
            ts_topk_decode_at(p, vf, j, &i, &q);
            if ((int64_t)i >= a->elems || (int64_t)i <= prev)
                return ts_fail(TS_ERR_INTERNAL,
                               "compress_wait '%s': rank %d sent index %u of %lld after %lld "
                               "(indices ascend)",
                               lbl(k), r, i, (long long)a->elems, (long long)prev);
            prev = i;
            *grad_at(k, i, &t, &lo) += q; /* ascending indices: the tensors in order */
        }
    }
    mean_at_sent(k, kk, vf, pb, scale);
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

const ts_op_def ts_def_compress_start = {.name = "compress_start",
                                         .min_in = 2,
                                         .max_in = -1,
                                         .flags = TS_OPF_SIDE_EFFECT,
                                         .infer = infer_start,
                                         .kernel = k_start,
                                         .scratch = scratch_start};

const ts_op_def ts_def_compress_wait = {.name = "compress_wait",
                                        .min_in = 4,
                                        .max_in = -1,
                                        .flags = TS_OPF_SIDE_EFFECT,
                                        .infer = infer_wait,
                                        .kernel = k_wait,
                                        .scratch = scratch_wait};
