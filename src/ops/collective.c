/* Data-parallel collective ops, inserted by the distribute pass
 * (src/passes/distribute.c), never by users.
 *
 *   allreduce_start (g1..gk) -> token    starts the sum all-reduce of one
 *                                         gradient bucket on the step
 *                                         context's comm and returns at once
 *   allreduce_wait  (token, g1..gk) -> token
 *                                         waits for that all-reduce, then
 *                                         divides each gradient by the rank
 *                                         count (the mean over ranks)
 *
 * Both write the gradients in place (side effects), so nothing may read a
 * bucket's gradients between its start and its wait: the pass places the
 * wait before the first such reader. The memory planner lays each bucket
 * out as one contiguous range (64-byte padding between tensors stays zero),
 * so a bucket is one collective; a bucket that is not contiguous falls back
 * to one collective per tensor. The tokens only order start before wait and
 * name the bucket in plan dumps. The comm and the buckets' tickets come
 * from the instruction's backend state (collective.h). */
#include <math.h>
#include <string.h>
#include "collective.h"
#include "kern.h"

static const char *lbl(const ts_kargs *k) {
    return k->label ? k->label : "?";
}

static ts_status check_grads(const ts_graph *g, const ts_node *n, int first) {
    ts_dtype dt = ts_in_type(g, n, first)->dtype;
    if (dt != TS_F32 && dt != TS_F64)
        return ts_fail(TS_ERR_SHAPE, "gradients must be f32 or f64, got %s", ts_dtype_name(dt));
    for (int i = first + 1; i < n->n_in; i++)
        if (ts_in_type(g, n, i)->dtype != dt)
            return ts_fail(TS_ERR_SHAPE, "gradient %d is %s, the first is %s", i - first,
                           ts_dtype_name(ts_in_type(g, n, i)->dtype), ts_dtype_name(dt));
    return TS_OK;
}

static ts_status infer_start(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = check_grads(g, n, 0);
    if (s != TS_OK) return s;
    memset(out, 0, sizeof *out);
    out->dtype = TS_I64;
    out->rank = 0;
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_wait(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *t = ts_in_type(g, n, 0);
    if (t->dtype != TS_I64 || ts_type_numel(t) != 1)
        return ts_fail(TS_ERR_SHAPE, "input 0 must be the i64 token of allreduce_start");
    ts_status s = check_grads(g, n, 1);
    if (s != TS_OK) return s;
    memset(out, 0, sizeof *out);
    out->dtype = TS_I64;
    out->rank = 0;
    *n_out = 1;
    return TS_OK;
}

static ts_status rt_bucket(const ts_kargs *k, const char *op, const ts_dist_rt **rt, int *b) {
    *rt = k->backend;
    *b = (int)k->a->bucket.ticket;
    if (!*rt || !(*rt)->comm || *b < 0 || *b >= (*rt)->n_buckets)
        return ts_fail(TS_ERR_INTERNAL, "%s '%s': bucket %d has no comm in this plan", op, lbl(k),
                       *b);
    return TS_OK;
}

/* [lo, hi) of tensors t[0..n) when they follow one another with at most
 * the planner's alignment padding between them; 0 otherwise. */
static int span(const ts_tensor *t, int n, char **lo_out, char **hi_out) {
    const size_t es = ts_dtype_size(t[0].dtype);
    char *lo = t[0].data, *hi = lo + (size_t)ts_tensor_numel(&t[0]) * es;
    for (int j = 1; j < n; j++) {
        char *p = t[j].data;
        if (p < hi || p - hi >= TS_ALIGN || (size_t)(p - hi) % es) return 0;
        hi = p + (size_t)ts_tensor_numel(&t[j]) * es;
    }
    *lo_out = lo;
    *hi_out = hi;
    return 1;
}

static ts_status k_start(const ts_kargs *k) {
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "allreduce_start", &rt, &b);
    if (s != TS_OK) return s;
    ts_comm *c = rt->comm;
    const ts_dtype dt = k->in[0].dtype;
    const size_t es = ts_dtype_size(dt);
    const ts_coll_algo algo = (ts_coll_algo)k->a->bucket.algo;
    char *lo, *hi;
    const int contiguous = span(k->in, k->n_in, &lo, &hi);
    ts_coll_ticket t = {0};
    if (contiguous) {
        s = ts_allreduce_start(c, lo, (size_t)(hi - lo) / es, dt, TS_RED_SUM, algo, &t);
    } else {
        for (int j = 0; j < k->n_in && s == TS_OK; j++)
            s = ts_allreduce_start(c, k->in[j].data, (size_t)ts_tensor_numel(&k->in[j]), dt,
                                   TS_RED_SUM, algo, &t);
    }
    if (s != TS_OK) return s;
    rt->tickets[b] = t;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

static void div_f32(float *x, int64_t n, float d) {
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / d;
}

static void div_f64(double *x, int64_t n, double d) {
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / d;
}

static ts_status k_wait(const ts_kargs *k) {
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "allreduce_wait", &rt, &b);
    if (s != TS_OK) return s;
    ts_comm *c = rt->comm;
    if ((s = ts_coll_wait(c, rt->tickets[b])) != TS_OK) return s;
    const int nr = ts_comm_size(c);
    /* The sum over ranks becomes their mean: each rank's loss is the mean
     * over its share of the batch, so the mean of the ranks' gradients is
     * the gradient of the mean over the whole batch. x / n, not x * (1/n):
     * exact for a power of two either way, and the same bits on every rank. */
    for (int j = 1; j < k->n_in && nr > 1; j++) {
        const ts_tensor *g = &k->in[j];
        if (g->dtype == TS_F32)
            div_f32(g->data, ts_tensor_numel(g), (float)nr);
        else
            div_f64(g->data, ts_tensor_numel(g), (double)nr);
    }
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

static double cost_wait(const ts_graph *g, const ts_node *n) {
    double e = 0;
    for (int i = 1; i < n->n_in; i++) e += (double)ts_type_numel(ts_in_type(g, n, i));
    return e;
}

const ts_op_def ts_def_allreduce_start = {.name = "allreduce_start",
                                          .min_in = 1,
                                          .max_in = -1,
                                          .flags = TS_OPF_SIDE_EFFECT,
                                          .infer = infer_start,
                                          .kernel = k_start};

const ts_op_def ts_def_allreduce_wait = {.name = "allreduce_wait",
                                         .min_in = 2,
                                         .max_in = -1,
                                         .flags = TS_OPF_SIDE_EFFECT,
                                         .infer = infer_wait,
                                         .kernel = k_wait,
                                         .cost = cost_wait};

/* ---- ZeRO: reduce-scatter of a bucket, all-gather of its parameters ----- */

/* reduce_scatter_start (g1..gk) -> (token, shard [shard_elems]): starts the
 * sum reduce-scatter of the bucket's elems elements; the rank's block
 * (ts_comm_block) lands in shard. a.bucket: ticket slot, algo, zero the
 * ZeRO stage (2: the bucket is a temporary that memplan releases after the
 * wait; the wait returns once every peer has read this rank's bucket). */
static ts_status infer_rs_start(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = check_grads(g, n, 0);
    if (s != TS_OK) return s;
    const ts_bucket_attrs *a = &n->a.bucket;
    if (a->shard_elems < 1 || a->elems < a->shard_elems)
        return ts_fail(TS_ERR_INVALID, "shard of %lld of %lld elements", (long long)a->shard_elems,
                       (long long)a->elems);
    memset(out, 0, 2 * sizeof *out);
    out[0].dtype = TS_I64;
    out[1].dtype = ts_in_type(g, n, 0)->dtype;
    out[1].rank = 1;
    out[1].dims[0] = a->shard_elems;
    *n_out = 2;
    return TS_OK;
}

static ts_status k_rs_start(const ts_kargs *k) {
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "reduce_scatter_start", &rt, &b);
    if (s != TS_OK) return s;
    char *lo, *hi;
    const size_t es = ts_dtype_size(k->in[0].dtype);
    if (!span(k->in, k->n_in, &lo, &hi) || (size_t)(hi - lo) / es != (size_t)k->a->bucket.elems)
        return ts_fail(TS_ERR_INTERNAL,
                       "reduce_scatter_start '%s': the bucket's gradients are not one range of "
                       "%lld elements",
                       lbl(k), (long long)k->a->bucket.elems);
    /* The padding between tensors is part of the range: under ZeRO-2 the
     * bucket is a temporary whose padding holds whatever was there before,
     * so zero it (the shards' padding must stay zero, as the parameters'). */
    for (int j = 0; j + 1 < k->n_in; j++) {
        char *end = (char *)k->in[j].data + (size_t)ts_tensor_numel(&k->in[j]) * es;
        if ((char *)k->in[j + 1].data > end)
            memset(end, 0, (size_t)((char *)k->in[j + 1].data - end));
    }
    ts_coll_ticket t = {0};
    s = ts_reduce_scatter_start(rt->comm, lo, k->out[1].data, (size_t)k->a->bucket.elems,
                                k->in[0].dtype, TS_RED_SUM, (ts_coll_algo)k->a->bucket.algo, &t);
    if (s != TS_OK) return s;
    rt->tickets[b] = t;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

/* reduce_scatter_wait (token, shard) -> token: waits, then shard /= ranks,
 * unless keep_sum is set: then the shard keeps the sum, and the shard_update
 * and zero_clip_coef reading it divide as they go (one pass over the shard
 * fewer). */
static ts_status infer_rs_wait(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    return infer_wait(g, n, out, n_out);
}

static ts_status k_rs_wait(const ts_kargs *k) {
    if (!k->a->bucket.keep_sum) return k_wait(k);
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "reduce_scatter_wait", &rt, &b);
    if (s == TS_OK) s = ts_coll_wait(rt->comm, rt->tickets[b]);
    if (s == TS_OK) *(int64_t *)k->out[0].data = b;
    return s;
}

/* all_gather_start (p1..pk) -> token: every rank's block of the bucket's
 * elems parameter elements (updated by its shard_update) to every rank, in
 * place. a.bucket: ticket slot, algo. ZeRO-3 (a.bucket.zero == 3):
 * (block, p1..pk) -> token, the rank's block comes from `block` (its
 * persistent shard of the parameters) and every rank's lands in p1..pk. */
static ts_status infer_ag_start(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    return infer_start(g, n, out, n_out);
}

static ts_status k_ag_start(const ts_kargs *k) {
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "all_gather_start", &rt, &b);
    if (s != TS_OK) return s;
    char *lo, *hi;
    const size_t es = ts_dtype_size(k->in[0].dtype);
    const int z3 = k->a->bucket.zero == 3, first = z3 ? 1 : 0;
    if (k->n_in <= first || !span(k->in + first, k->n_in - first, &lo, &hi) ||
        (size_t)(hi - lo) / es != (size_t)k->a->bucket.elems)
        return ts_fail(TS_ERR_INTERNAL,
                       "all_gather_start '%s': the bucket's parameters are not one range of %lld "
                       "elements",
                       lbl(k), (long long)k->a->bucket.elems);
    ts_coll_ticket t = {0};
    s = ts_allgather_start(rt->comm, z3 ? k->in[0].data : NULL, lo, (size_t)k->a->bucket.elems,
                           k->in[0].dtype, (ts_coll_algo)k->a->bucket.algo, &t);
    if (s != TS_OK) return s;
    rt->tickets[b] = t;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

/* all_gather_wait (token, p1..pk) -> token. */
static ts_status k_ag_wait(const ts_kargs *k) {
    const ts_dist_rt *rt;
    int b;
    ts_status s = rt_bucket(k, "all_gather_wait", &rt, &b);
    if (s != TS_OK) return s;
    if ((s = ts_coll_wait(rt->comm, rt->tickets[b])) != TS_OK) return s;
    *(int64_t *)k->out[0].data = b;
    return TS_OK;
}

/* zero_clip_coef (shard1..shardB) -> coef: clipping by the global norm of
 * the averaged gradient when each rank holds only its shards (sums over
 * the ranks when ranks > 1: each element is divided by ranks first, as
 * reduce_scatter_wait would have): each rank
 * sums the squares of its shards (double, fixed blocks, fixed order), one
 * all-reduce adds the ranks' sums (algo), and the coefficient follows
 * clip_coef: min(1, max_norm / (norm + 1e-6)) in the gradients' dtype.
 * clip_coef rounds each tensor's norm to that dtype before adding them; the
 * sharded sum cannot, so the coefficient may differ from it in the last bit. */
static ts_status infer_zclip(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = check_grads(g, n, 0);
    if (s != TS_OK) return s;
    memset(out, 0, sizeof *out);
    out->dtype = ts_in_type(g, n, 0)->dtype;
    *n_out = 1;
    return TS_OK;
}

/* The mean of a sum over `ranks` in the sum's dtype T: x / ranks, the
 * bits reduce_scatter_wait stores (x * (1 / ranks) when that is exact). */
#define MEAN_OF(T, x, ranks, pow2) ((pow2) ? (x) * ((T)1 / (T)(ranks)) : (x) / (T)(ranks))

static double sumsq(const ts_tensor *t, int64_t ranks) {
    const int64_t n = ts_tensor_numel(t);
    const int pow2 = (ranks & (ranks - 1)) == 0;
    double acc[8] = {0};
    if (t->dtype == TS_F32) {
        const float *x = t->data;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                const double m = (double)MEAN_OF(float, x[i + j], ranks, pow2);
                acc[j] += m * m;
            }
        for (; i < n; i++) {
            const double m = (double)MEAN_OF(float, x[i], ranks, pow2);
            acc[0] += m * m;
        }
    } else {
        const double *x = t->data;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                const double m = MEAN_OF(double, x[i + j], ranks, pow2);
                acc[j] += m * m;
            }
        for (; i < n; i++) {
            const double m = MEAN_OF(double, x[i], ranks, pow2);
            acc[0] += m * m;
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static ts_status k_zclip(const ts_kargs *k) {
    const ts_dist_rt *rt = k->backend;
    if (!rt || !rt->comm)
        return ts_fail(TS_ERR_INTERNAL, "zero_clip_coef '%s': no comm in this plan", lbl(k));
    double ss = 0;
    const int64_t ranks = k->a->bucket.ranks > 1 ? k->a->bucket.ranks : 1;
    for (int j = 0; j < k->n_in; j++) ss += sumsq(&k->in[j], ranks);
    ts_status s =
        ts_allreduce(rt->comm, &ss, 1, TS_F64, TS_RED_SUM, (ts_coll_algo)k->a->bucket.algo);
    if (s != TS_OK) return s;
    if (k->out[0].dtype == TS_F32) {
        float total = (float)sqrt(ss), inv = 1.0f / (total + 1e-6f),
              c = inv * (float)k->a->bucket.max_norm;
        *(float *)k->out[0].data = c > 1.0f ? 1.0f : c;
    } else {
        double total = sqrt(ss), inv = 1.0 / (total + 1e-6), c = inv * k->a->bucket.max_norm;
        *(double *)k->out[0].data = c > 1.0 ? 1.0 : c;
    }
    return TS_OK;
}

const ts_op_def ts_def_reduce_scatter_start = {.name = "reduce_scatter_start",
                                               .min_in = 1,
                                               .max_in = -1,
                                               .flags = TS_OPF_SIDE_EFFECT,
                                               .infer = infer_rs_start,
                                               .kernel = k_rs_start};

const ts_op_def ts_def_reduce_scatter_wait = {.name = "reduce_scatter_wait",
                                              .min_in = 2,
                                              .max_in = 2,
                                              .flags = TS_OPF_SIDE_EFFECT,
                                              .infer = infer_rs_wait,
                                              .kernel = k_rs_wait,
                                              .cost = cost_wait};

const ts_op_def ts_def_all_gather_start = {.name = "all_gather_start",
                                           .min_in = 1,
                                           .max_in = -1,
                                           .flags = TS_OPF_SIDE_EFFECT,
                                           .infer = infer_ag_start,
                                           .kernel = k_ag_start};

const ts_op_def ts_def_all_gather_wait = {.name = "all_gather_wait",
                                          .min_in = 2,
                                          .max_in = -1,
                                          .flags = TS_OPF_SIDE_EFFECT,
                                          .infer = infer_wait,
                                          .kernel = k_ag_wait};

const ts_op_def ts_def_zero_clip_coef = {.name = "zero_clip_coef",
                                         .min_in = 1,
                                         .max_in = -1,
                                         .flags = TS_OPF_SIDE_EFFECT | TS_OPF_UPDATE,
                                         .infer = infer_zclip,
                                         .kernel = k_zclip};

/* zero_sync () -> token: every rank of the comm reaches this point before
 * any goes on (shared parameters: see distribute.c). A blocking barrier;
 * on a comm with a communication thread it queues behind the collectives
 * started before it. */
static ts_status infer_zsync(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    (void)g;
    (void)n;
    memset(out, 0, sizeof *out);
    out->dtype = TS_I64;
    *n_out = 1;
    return TS_OK;
}

static ts_status k_zsync(const ts_kargs *k) {
    const ts_dist_rt *rt = k->backend;
    if (!rt || !rt->comm)
        return ts_fail(TS_ERR_INTERNAL, "zero_sync '%s': no comm in this plan", lbl(k));
    *(int64_t *)k->out[0].data = 0;
    return ts_barrier(rt->comm);
}

const ts_op_def ts_def_zero_sync = {.name = "zero_sync",
                                    .min_in = 0,
                                    .max_in = 0,
                                    .flags = TS_OPF_SIDE_EFFECT,
                                    .infer = infer_zsync,
                                    .kernel = k_zsync};

/* zero_found_inf (found_1..found_B) -> found_inf: loss scaling under ZeRO.
 * Each rank unscales its own gradients bucket by bucket before they are
 * reduced (unscale_grads, one per bucket), so each knows only whether its
 * own were finite; the update is skipped on every rank when any rank's
 * were not. The largest input flag, then the largest over the ranks (one
 * all-reduce of a float, a.bucket.algo). */
static ts_status infer_zfound(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    for (int i = 0; i < n->n_in; i++) {
        const ts_type *t = ts_in_type(g, n, i);
        if (t->dtype != TS_F32 || ts_type_numel(t) != 1)
            return ts_fail(TS_ERR_SHAPE, "input %d must be one f32 flag (unscale_grads)", i);
    }
    memset(out, 0, sizeof *out);
    out->dtype = TS_F32;
    *n_out = 1;
    return TS_OK;
}

static ts_status k_zfound(const ts_kargs *k) {
    const ts_dist_rt *rt = k->backend;
    if (!rt || !rt->comm)
        return ts_fail(TS_ERR_INTERNAL, "zero_found_inf '%s': no comm in this plan", lbl(k));
    float f = 0;
    for (int i = 0; i < k->n_in; i++) {
        const float v = *(const float *)k->in[i].data;
        if (v > f) f = v;
    }
    ts_status s =
        ts_allreduce(rt->comm, &f, 1, TS_F32, TS_RED_MAX, (ts_coll_algo)k->a->bucket.algo);
    if (s != TS_OK) return s;
    *(float *)k->out[0].data = f;
    return TS_OK;
}

const ts_op_def ts_def_zero_found_inf = {.name = "zero_found_inf",
                                         .min_in = 1,
                                         .max_in = -1,
                                         .flags = TS_OPF_SIDE_EFFECT,
                                         .infer = infer_zfound,
                                         .kernel = k_zfound};
