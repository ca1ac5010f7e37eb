/* Gradient compression in the distribute pass (ts_compile_options.compress,
 * docs/distributed.md "Gradient compression"). distribute.c groups the
 * gradients into buckets and places each bucket's start right after its
 * last gradient and its wait before the first reader, as for the dense
 * all-reduce; this file supplies the two nodes of a compressed bucket and
 * the checks and rewrites that come first:
 *
 *   topk:     compress_start (residual[, velocity], g...) -> (token, send, recv)
 *             compress_wait  (token, send, recv, g...)
 *   powersgd: psgd_start (g..., error, q[, velocity]) -> (token, p, qbuf)
 *             psgd_wait  (token, p, qbuf, g..., error, q)
 *
 * The residual ("compress.bucket<b>.residual") and the DGC velocity
 * ("compress.bucket<b>.velocity") are state values [elements of the
 * bucket] (zeros at the start, in the arena's persistent region), each
 * rank's own: 1x the gradients' memory. A checkpoint holds them as row r
 * of a logical [ranks, elements] tensor, each rank writing its row
 * (ts_plan_compress_row, src/ckpt/save.c). With momentum correction the SGD
 * update's momentum moves into compress_start or psgd_start: the update
 * itself runs without momentum (its buffer then holds the plain gradient). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dist/compress.h"
#include "passes.h"

ts_status ts_compress_prepare(ts_graph *g, const ts_dist_spec *d, ts_compress_prep *p) {
    const ts_compress_options *c = &d->compress;
    p->momentum = 0;
    p->scale = -1;
    p->clip = c->clip;
    if (c->method != TS_COMPRESS_TOPK && c->method != TS_COMPRESS_POWERSGD)
        return ts_fail(TS_ERR_UNSUPPORTED, "distribute: compression method %d is not supported",
                       c->method);
    if (c->method == TS_COMPRESS_POWERSGD &&
        (c->rank < 1 || c->rank > 64 || c->min_elems < 0 || c->max_elems < 0 ||
         c->power_iters < 0 || c->power_iters > 16))
        return ts_fail(TS_ERR_INVALID,
                       "distribute: PowerSGD rank %d (1 to 64), min_elems %lld, max_elems %lld "
                       "(0 or more), power iterations %d (0 to 16)",
                       c->rank, (long long)c->min_elems, (long long)c->max_elems, c->power_iters);
    if (c->dense_steps < 0)
        return ts_fail(TS_ERR_INVALID, "distribute: %lld dense steps (0 or more)",
                       (long long)c->dense_steps);
    if (d->zero)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "distribute: gradient compression with ZeRO-%d is not supported (ZeRO "
                       "reduce-scatters dense buckets)",
                       d->zero);
    if (d->size < 2)
        return ts_fail(TS_ERR_INVALID, "distribute: gradient compression needs 2 or more ranks");
    if (c->method == TS_COMPRESS_TOPK && !(c->ratio > 0 && c->ratio <= 1))
        return ts_fail(TS_ERR_INVALID, "distribute: compression ratio %g is not in (0, 1]",
                       c->ratio);
    if (c->values < TS_CVAL_E4M3 || c->values > TS_CVAL_F32 || c->clip < 0 || c->warmup_steps < 0)
        return ts_fail(TS_ERR_INVALID, "distribute: compression values %d, clip %g, warm-up %lld",
                       c->values, c->clip, (long long)c->warmup_steps);
    int sgd = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].dead) continue;
        /* Loss scaling: the compressed state holds unscaled values (see
         * src/ops/compress.c), so the start and wait nodes read the scale. */
        if (g->nodes[i].op == TS_OP_UNSCALE_GRADS) p->scale = g->nodes[i].in[0];
        if (g->nodes[i].op == TS_OP_SGD_UPDATE) sgd = i;
        /* Clipping by the global norm after the exchange would scale down
         * what error feedback counts as sent: topk's accumulated values a
         * rank sends once in many steps, PowerSGD's rank-r approximation of
         * the gradient plus its error. What the clip cuts off is then lost
         * (topk with momentum correction: a loss 300x the dense run's on
         * the tiny GPT; PowerSGD rank 4 on W3: +16 % after 2 000 steps).
         * DGC clips locally, before the accumulation, instead: so do both
         * methods, at train.clip_grad_norm unless dist.compress_clip is
         * set, and the global clip's coefficient becomes 1 (max_norm
         * FLT_MAX: finite, so a gradient of norm inf still gives 0). */
        if (g->nodes[i].op == TS_OP_CLIP_COEF) {
            ts_clip_attrs *ca = &g->nodes[i].a.clip;
            if (!(p->clip > 0)) p->clip = ca->max_norm;
            /* PowerSGD's dense start is the plain all-reduce, with the
             * uncompressed run's global clip (and bits); topk's, and any
             * with momentum correction (the velocity is exchanged, not
             * the gradient), clips locally from step 1. */
            if (c->method == TS_COMPRESS_POWERSGD && c->dense_steps > 0 && !c->momentum)
                ca->until_step = c->dense_steps;
            else
                ca->max_norm = FLT_MAX;
        }
    }
    if (!c->momentum) return TS_OK;
    ts_sgd_attrs *a = sgd >= 0 ? &g->nodes[sgd].a.sgd : NULL;
    if (!a || !(a->momentum > 0))
        return ts_fail(TS_ERR_INVALID,
                       "distribute: momentum correction needs an SGD update with momentum");
    if (a->nesterov)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "distribute: momentum correction with Nesterov momentum is not supported");
    p->momentum = a->momentum;
    a->momentum = 0; /* the momentum is accumulated per rank before compression instead */
    a->dampening = 0;
    return TS_OK;
}

/* [n] f32 zeros: this rank's own row (residual, velocity, PowerSGD's
 * error; checkpointed as row r of [ranks, n]) or PowerSGD's q (the same
 * on every rank). */
static int32_t new_state(ts_graph *g, int64_t n, int b, const char *what) {
    ts_type t;
    memset(&t, 0, sizeof t);
    t.dtype = TS_F32;
    t.rank = 1;
    t.dims[0] = n;
    char name[96];
    snprintf(name, sizeof name, "compress.bucket%d.%s", b, what);
    int32_t id = ts_value_new(g, &t, TS_VK_STATE, name);
    if (id >= 0) g->values[id].init = ts_init_zeros();
    return id;
}

/* Names a bucket's node output "bucket<b>.<what>" (in dumps and traces). */
static ts_status name_bucket(ts_graph *g, ts_val v, int b, const char *what) {
    char name[64];
    snprintf(name, sizeof name, "bucket%d.%s", b, what);
    return ts_set_name(g, v, name);
}

/* PowerSGD: psgd_start (g..., err, q) and psgd_wait (token, buf, qbuf, g..., err, q). */
static ts_status psgd_bucket(ts_graph *g, const ts_dist_spec *d, const ts_compress_prep *p, int b,
                             const ts_val *grads, int k, int32_t *start, int32_t *wait) {
    const int32_t scale = p->scale;
    const ts_compress_options *c = &d->compress;
    const int r = c->rank > 0 ? c->rank : 4;
    int64_t nerr = 0, nq = 0, nall = 0;
    for (int i = 0; i < k; i++) {
        const ts_type *t = &g->values[grads[i].id].t;
        int64_t n, m;
        nall += ts_type_numel(t);
        if (ts_psgd_matrix(t->rank, t->dims, c->min_elems, c->max_elems, r, &n, &m)) {
            nerr += n * m;
            nq += m * r;
        }
    }
    ts_attrs a = ts_attrs_zero();
    ts_compress_attrs *ca = &a.compress;
    ca->ticket = b;
    ca->algo = d->algo;
    ca->method = c->method;
    ca->ranks = d->size;
    ca->rank = r;
    ca->min_elems = c->min_elems;
    ca->max_elems = c->max_elems;
    ca->iters = c->power_iters > 1 ? c->power_iters : 1;
    ca->dense = c->dense_steps;
    ca->clip = p->clip;
    ca->momentum = p->momentum;
    ca->scaled = scale >= 0;
    const int mc = p->momentum > 0;
    ts_val *args = ts_alloc(sizeof(ts_val) * (size_t)(k + 6), "compress");
    if (!args) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    int32_t err = new_state(g, nerr > 0 ? nerr : 1, b, "error");
    int32_t q = new_state(g, nq > 0 ? nq : 1, b, "q");
    int32_t vel = mc ? new_state(g, nall, b, "velocity") : 0;
    if (err < 0 || q < 0 || vel < 0) {
        s = ts_graph_status(g);
        goto done;
    }
    g->values[q].init = ts_init_normal(0, 1); /* from the compile seed: the same on every rank */
    for (int i = 0; i < k; i++) args[i] = grads[i];
    args[k] = ts_mkval(err);
    args[k + 1] = ts_mkval(q);
    if (mc) args[k + 2] = ts_mkval(vel);
    if (scale >= 0) args[k + 2 + mc] = ts_mkval(scale);
    ts_val outs[3];
    ts_val tok = ts_node_add(g, TS_OP_PSGD_START, k + 2 + mc + (scale >= 0), args, &a, outs);
    if ((s = ts_graph_status(g)) != TS_OK) goto done;
    if ((s = name_bucket(g, tok, b, "start")) != TS_OK) goto done;
    if ((s = name_bucket(g, outs[1], b, "p")) != TS_OK) goto done;
    if ((s = name_bucket(g, outs[2], b, "qbuf")) != TS_OK) goto done;
    *start = g->values[tok.id].node;
    args[0] = tok;
    args[1] = outs[1];
    args[2] = outs[2];
    for (int i = 0; i < k; i++) args[3 + i] = grads[i];
    args[3 + k] = ts_mkval(err);
    args[4 + k] = ts_mkval(q);
    if (scale >= 0) args[5 + k] = ts_mkval(scale);
    ts_val w = ts_node_add(g, TS_OP_PSGD_WAIT, k + 5 + (scale >= 0), args, &a, NULL);
    if ((s = ts_graph_status(g)) != TS_OK) goto done;
    if ((s = name_bucket(g, w, b, "wait")) != TS_OK) goto done;
    *wait = g->values[w.id].node;
done:
    free(args);
    return s;
}

ts_status ts_compress_bucket(ts_graph *g, const ts_dist_spec *d, const ts_compress_prep *p, int b,
                             const ts_val *grads, int k, int32_t *start, int32_t *wait) {
    const ts_compress_options *c = &d->compress;
    const double momentum = p->momentum;
    const int32_t scale = p->scale;
    if (c->method == TS_COMPRESS_POWERSGD) return psgd_bucket(g, d, p, b, grads, k, start, wait);
    int64_t n = 0;
    for (int i = 0; i < k; i++) {
        const ts_type *t = &g->values[grads[i].id].t;
        if (t->dtype != TS_F32) {
            char lb[32];
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "distribute: gradient '%s' is %s; compression takes f32 gradients",
                           ts_value_label(g, grads[i].id, lb, sizeof lb), ts_dtype_name(t->dtype));
        }
        n += ts_type_numel(t);
    }
    if (n > (int64_t)UINT32_MAX)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "distribute: bucket %d has %lld elements; compressed buckets hold at most "
                       "2^32 (lower dist.bucket_mb)",
                       b, (long long)n);
    ts_attrs a = ts_attrs_zero();
    ts_compress_attrs *ca = &a.compress;
    ca->ticket = b;
    ca->algo = d->algo;
    ca->method = c->method;
    ca->values = c->values;
    ca->elems = n;
    ca->warmup = c->warmup_steps;
    ca->dense = c->dense_steps;
    ca->ranks = d->size;
    ca->ratio = c->ratio;
    ca->momentum = momentum;
    ca->clip = p->clip;
    ca->scaled = scale >= 0;
    /* The most values of any step: the warm-up starts highest. */
    ca->kmax = ts_topk_k(n, ts_topk_ratio_at(c->ratio, c->warmup_steps, 1));
    if (c->dense_steps > 0) ca->kmax = n; /* the dense start sends every value */
    const int ns = momentum > 0 ? 2 : 1;
    ts_val *args = ts_alloc(sizeof(ts_val) * (size_t)(k + 5), "compress");
    if (!args) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    int32_t res = new_state(g, n, b, "residual");
    int32_t vel = ns > 1 ? new_state(g, n, b, "velocity") : 0;
    if (res < 0 || vel < 0) {
        s = ts_graph_status(g);
        goto done;
    }
    args[0] = ts_mkval(res);
    if (ns > 1) args[1] = ts_mkval(vel);
    for (int i = 0; i < k; i++) args[ns + i] = grads[i];
    if (scale >= 0) args[ns + k] = ts_mkval(scale);
    ts_val outs[3];
    ts_val tok = ts_node_add(g, TS_OP_COMPRESS_START, ns + k + (scale >= 0), args, &a, outs);
    if ((s = ts_graph_status(g)) != TS_OK) goto done;
    if ((s = name_bucket(g, tok, b, "start")) != TS_OK) goto done;
    if ((s = name_bucket(g, outs[1], b, "send")) != TS_OK) goto done;
    if ((s = name_bucket(g, outs[2], b, "recv")) != TS_OK) goto done;
    *start = g->values[tok.id].node;
    args[0] = tok;
    args[1] = outs[1];
    args[2] = outs[2];
    for (int i = 0; i < k; i++) args[3 + i] = grads[i];
    if (scale >= 0) { /* a skipped step gives back what was sent: the wait writes the residual */
        args[3 + k] = ts_mkval(res);
        args[4 + k] = ts_mkval(scale);
    }
    ts_val w = ts_node_add(g, TS_OP_COMPRESS_WAIT, 3 + k + 2 * (scale >= 0), args, &a, NULL);
    if ((s = ts_graph_status(g)) != TS_OK) goto done;
    if ((s = name_bucket(g, w, b, "wait")) != TS_OK) goto done;
    *wait = g->values[w.id].node;
done:
    free(args);
    return s;
}
