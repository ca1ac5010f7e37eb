/* distribute: data parallelism in the step graph. Runs on a scheduled
 * training graph when the plan has a comm of more than one rank.
 *
 * Gradients are sorted by the position in the schedule where each becomes
 * final (roughly reverse layer order) and grouped into buckets: the first
 * one small (first_bucket_bytes) so communication starts early, the rest
 * up to bucket_bytes, a new bucket at every change of dtype. Per bucket the
 * pass adds an allreduce_start node, placed in the order right after the
 * bucket's last gradient is written, and an allreduce_wait node, placed
 * right before the first later node that reads one of its gradients (the
 * clip coefficient or the optimizer update; the end of the step if none).
 * Everything scheduled between the two (the rest of the backward pass)
 * overlaps the all-reduce. Readers get a control dependency on the wait.
 *
 * The memory planner then lays out the gradients bucket by bucket (the
 * inputs of the start nodes in node order), so each bucket is one
 * contiguous range and one collective. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "tessel/dist.h"

typedef struct grad_ref {
    int32_t v; /* gradient value */
    int ready; /* position in the order where it is final */
    size_t bytes;
    int32_t param; /* the value it is the gradient of */
} grad_ref;

static int cmp_ready(const void *a, const void *b) {
    const grad_ref *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

/* By parameter, the last declared first (roughly the order the backward
 * finishes them): the same order in every plan of one model, whatever
 * its shape does to the schedule (ts_dist_spec.param_order). */
static int cmp_param(const void *a, const void *b) {
    const grad_ref *x = a, *y = b;
    if (x->param != y->param) return x->param > y->param ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

static int is_alias(const ts_graph *g, int node) {
    return (ts_op_get(g->nodes[node].op)->flags & TS_OPF_ALIAS) != 0;
}

/* ---- ZeRO-1 -------------------------------------------------------------
 *
 * Instead of all-reducing a bucket, reduce-scatter it: rank r receives the
 * average of its block (ts_comm_block of the bucket's flat range) in a
 * shard buffer, runs the optimizer on that block of the flat parameter
 * range only (shard_update, with optimizer state as long as the shard),
 * then all-gathers the bucket's parameters in place. The fused update node
 * and its full-size state are removed (and the clip coefficient, which
 * becomes zero_clip_coef over the shards). memplan lays out the parameters
 * in the gradients' bucket order, so a bucket's parameter range mirrors its
 * gradient range element for element. Order per step:
 *   ... backward ... reduce_scatter_start(b) right after bucket b's last gradient
 *   [at the update] reduce_scatter_wait(all) zero_clip_coef
 *                   shard_update(b) all_gather_start(b) for each bucket
 *   [end of step]   all_gather_wait(all)
 *
 * ZeRO-2 (d->zero == 2) shards the gradients too: the same nodes, but
 * reduce_scatter_wait(b) comes right before the node that writes bucket
 * b + 1's first gradient (the last bucket's at the update), so the
 * backward between the two buckets (the data gradients) overlaps the
 * reduce-scatter and no two buckets need memory at once; and
 * reduce_scatter_start carries a.bucket.zero = 2,
 * which tells memplan to plan each bucket as one liveness interval in the
 * temporaries (from its first gradient's write to its wait) instead of the
 * persistent gradient region. Once the wait returned, every peer has
 * finished reading the bucket (the reduce-scatter ends with every rank
 * done: see ts_reduce_scatter_start), so later nodes may reuse its memory.
 * Monitors reading a bucket's gradients run right before its start, so
 * they do not keep the bucket alive. Until the update each rank keeps only
 * its shards.
 *
 * The shards keep the sum over the ranks (reduce_scatter_wait keep_sum): the
 * shard update and zero_clip_coef divide as they read them, which saves a
 * pass over every shard.
 *
 * Loss scaling: the graph's one unscale_grads (after the all-reduce
 * without ZeRO) would need the averaged gradients whole. Instead each
 * bucket gets its own, right before its reduce-scatter start: every rank
 * unscales its own gradients (a power-of-two scale, so the sum comes out
 * the same) and flags non-finite ones, and zero_found_inf at the update
 * takes the largest flag over buckets and ranks as "found_inf", which the
 * update gate reads.
 *
 * Shared parameters (d->shared_params: the ranks share memory, the shm
 * transport): the plan keeps one copy of the parameters for all ranks
 * (ts_comm_alloc_shared), and each rank's shard_update writes its block
 * of it in place, so there is nothing to all-gather. Two barriers
 * (zero_sync) order it: "zero.params_read" before the first update (every
 * rank is done reading the parameters this step) and
 * "zero.params_updated" at the end (every block is written before any
 * rank's next step reads it). ZeRO-1 without clipping goes further: no
 * reduce-scatter at all; the gradient buckets stay in the segment until
 * the update, and each shard_update (a.shard.fused_ranks) averages its block over
 * every rank's copy of the bucket itself, reading the peers' arenas in
 * place (the second barrier also keeps them until every rank has read
 * them). Order per step:
 *   ... backward ...
 *   [at the update] zero_sync shard_update(b) for each bucket
 *   [end of step]   zero_sync
 *
 * ZeRO-3 (d->zero == 3): ZeRO-2's graph, but shard_update reads and
 * writes the rank's block of the bucket's parameters (a state value
 * "zero.bucket<b>.param", n_params 1 at offset 0) instead of the shared or
 * all-gathered parameters, and zero3.c gathers each bucket's parameters
 * from the blocks before their forward and their backward readers.
 *
 * Summed gradients (d->summed_grads, ZeRO-1/2 under dist.reproducible):
 * no reduce-scatter and no per-bucket unscale; the update gate (session/
 * repro.c) writes the batch's gradients, summed in the fixed tree, whole
 * into every rank's gradient region, and the graph's own unscale_grads and
 * clip_coef stay where they were, reading them: the same norm as without
 * ZeRO. Each shard_update (fused_ranks 1, divisor 1) reads its block of
 * the bucket's gradients in place; the parameters are shared or
 * all-gathered as above. ZeRO-2 is ZeRO-1 here: the gradients stay whole. */

/* Elements a bucket spans in memplan's layout (64-byte padding between
 * tensors). */
static int64_t bucket_span(const ts_graph *g, const grad_ref *gr, int lo, int hi) {
    size_t off = 0, es = ts_dtype_size(g->values[gr[lo].v].t.dtype);
    for (int i = lo; i < hi; i++)
        off = i + 1 < hi ? TS_ALIGN_UP(off + gr[i].bytes, TS_ALIGN) : off + gr[i].bytes;
    return (int64_t)(off / es);
}

static int32_t new_shard_state(ts_graph *g, const ts_type *t, int b, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "zero.bucket%d.%s", b, what);
    int32_t id = ts_value_new(g, t, TS_VK_STATE, name);
    if (id >= 0) g->values[id].init = ts_init_zeros();
    return id;
}

/* A zero_sync node (a barrier of the ranks) named `name`; *node its id. */
static ts_status add_sync(ts_graph *g, const char *name, int32_t *node) {
    ts_attrs a = ts_attrs_zero();
    ts_val t = ts_node_add(g, TS_OP_ZERO_SYNC, 0, NULL, &a, NULL);
    ts_status s = ts_graph_status(g);
    if (s == TS_OK) s = ts_set_name(g, t, name);
    if (s == TS_OK) *node = g->values[t.id].node;
    return s;
}

static ts_status zero_rewrite(ts_graph *g, int32_t **order_io, int *n_order_io,
                              const ts_dist_spec *d, const grad_ref *gr, const int *first, int nb,
                              const int *start_at, const int32_t *root, int *n_slots) {
    const int n_order = *n_order_io;
    const int32_t *order = *order_io;
    int u = -1, upos = -1, us = -1; /* us: the loss scaler's unscale_grads */
    for (int k = 0; k < n_order; k++) {
        int op = g->nodes[order[k]].op;
        if (op == TS_OP_SGD_UPDATE || op == TS_OP_ADAM_UPDATE) u = order[k], upos = k;
        if (op == TS_OP_UNSCALE_GRADS) us = order[k];
    }
    if (u < 0)
        return ts_fail(TS_ERR_INVALID, "distribute: ZeRO shards the optimizer; this plan has none");
    const ts_node un = g->nodes[u]; /* copy: nodes move as nodes are added */
    const int adam = un.op == TS_OP_ADAM_UPDATE;
    const int has_coef = (adam ? un.a.adam.has_coef : un.a.sgd.has_coef) != 0;
    const int gs = adam ? 4 : 2 + (un.a.sgd.has_buf != 0), ns = gs - 2;
    const int ngroups = (un.n_in - has_coef) / gs;
    int clip = -1;
    if (has_coef) {
        clip = g->values[un.in[un.n_in - 1]].node;
        if (clip < 0 || g->nodes[clip].op != TS_OP_CLIP_COEF)
            return ts_fail(TS_ERR_INTERNAL, "distribute: the update's coefficient is no clip_coef");
    }
    /* Shared parameters (ranks on one host, shm): one copy of the
     * parameters that each rank updates its block of in place, between two
     * barriers, instead of all-gathering; without clipping ZeRO-1 also
     * skips the reduce-scatter: the update reads every rank's gradients of
     * its block in the segment and averages them itself (fused). */
    const int shared = d->shared_params,
              fused = shared && d->zero == 1 && !has_coef && !d->summed_grads;
    /* dist.reproducible: the gradients stay whole and unreduced; the update
     * gate replaces them with the ranks' sum in the fixed tree (every rank
     * the same floats), so the unscale, the clip coefficient and the
     * found_inf flag stay the unsharded graph's, and each shard update reads
     * its block of the gradients in place (a fused update of one copy). */
    const int summed = d->summed_grads, inplace = fused || summed;
    const int z3 = d->zero == 3; /* the parameters sharded too: zero3.c */
    int n_gathers = 0;           /* ZeRO-3: its gathers, each with a ticket slot */
    const int nv0 = g->n_values;
    int32_t *group_of = ts_alloc(sizeof(int32_t) * (size_t)(nv0 + 1), "zero");
    int32_t *shard = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *rs_start = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *rs_wait = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *upd = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int64_t *shard_off = ts_alloc(sizeof(int64_t) * (size_t)(nb + 1), "zero");
    int64_t *shard_len = ts_alloc(sizeof(int64_t) * (size_t)(nb + 1), "zero");
    int32_t *unscale = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *ag_start = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *ag_wait = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero");
    int32_t *pshard = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "zero"); /* ZeRO-3 */
    ts_val *args = ts_alloc(sizeof(ts_val) * (size_t)(un.n_in + nb + 8), "zero");
    int32_t *out = ts_alloc(sizeof(int32_t) * (size_t)(n_order + 7 * nb + 4), "zero");
    int32_t *bucket_of = ts_alloc(sizeof(int32_t) * (size_t)(nv0 + 1), "zero"); /* per root */
    int32_t *mon_bucket = ts_alloc(sizeof(int32_t) * (size_t)(n_order + 1), "zero");
    int *pos = ts_alloc(sizeof(int) * (size_t)(g->n_nodes + 1), "zero");
    int *first_write = ts_alloc(sizeof(int) * (size_t)(nb + 1), "zero");
    int32_t *nmap = NULL, *vmap = NULL;
    ts_status s = TS_OK;
    if (!group_of || !shard || !rs_start || !rs_wait || !upd || !shard_off || !shard_len ||
        !unscale || !ag_start || !ag_wait || !args || !out || !bucket_of || !mon_bucket || !pos ||
        !first_write || !pshard) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int v = 0; v < nv0; v++) group_of[v] = bucket_of[v] = -1;
    for (int i = 0; i < g->n_nodes; i++) pos[i] = n_order;
    for (int k = 0; k < n_order; k++) pos[order[k]] = k;
    /* ZeRO-2: where each bucket's memory is first written (the producer of
     * a gradient's storage, which a view of it may follow). */
    for (int b = 0; b < nb; b++) {
        first_write[b] = n_order;
        for (int i = first[b]; i < first[b + 1]; i++) {
            bucket_of[root[gr[i].v]] = b;
            int w = pos[g->values[root[gr[i].v]].node];
            if (w < first_write[b]) first_write[b] = w;
        }
    }
    /* ZeRO-2: per position in the order, the bucket whose gradients a
     * monitor there reads (the latest, if several; -1: not a monitor or
     * reading something else too). */
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        mon_bucket[k] = -1;
        if (!(ts_op_get(n->op)->flags & TS_OPF_MONITOR)) continue;
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b < 0) {
                mon_bucket[k] = -1;
                break;
            }
            if (b > mon_bucket[k]) mon_bucket[k] = b;
        }
    }
    for (int j = 0; j < ngroups; j++) group_of[root[un.in[j * gs + 1]]] = j;
    for (int i = 0; i < first[nb]; i++)
        if (group_of[root[gr[i].v]] < 0) {
            char lb[32];
            s = ts_fail(TS_ERR_UNSUPPORTED, "distribute: ZeRO: gradient '%s' has no update",
                        ts_value_label(g, gr[i].v, lb, sizeof lb));
            goto done;
        }
    for (int b = 0; b < nb && s == TS_OK; b++) {
        const int k = first[b + 1] - first[b];
        const int64_t span = bucket_span(g, gr, first[b], first[b + 1]);
        size_t off, len;
        ts_comm_block((size_t)span, d->size, d->rank, &off, &len);
        if (len == 0) {
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "distribute: ZeRO: bucket %d has %lld elements, fewer than the %d ranks", b,
                        (long long)span, d->size);
            break;
        }
        shard_off[b] = (int64_t)off;
        shard_len[b] = (int64_t)len;
        unscale[b] = -1;
        if (us >= 0 && !summed) {
            /* Loss scaling: each rank unscales its own gradients of the
             * bucket before they are reduced (see above). */
            args[0] = ts_mkval(g->nodes[us].in[0]);
            for (int i = 0; i < first[b + 1] - first[b]; i++)
                args[1 + i] = ts_mkval(gr[first[b] + i].v);
            ts_node_add(g, TS_OP_UNSCALE_GRADS, 1 + first[b + 1] - first[b], args, NULL, NULL);
            if ((s = ts_graph_status(g)) != TS_OK) break;
            unscale[b] = g->n_nodes - 1;
        }
        if (inplace) continue;
        char name[64];
        ts_attrs a = ts_attrs_zero();
        a.bucket.ticket = b;
        a.bucket.algo = d->algo;
        a.bucket.shard_elems = (int64_t)len;
        a.bucket.elems = span;
        a.bucket.zero = d->zero; /* 2, 3: memplan releases the bucket after its wait */
        a.bucket.keep_sum = 1;   /* the shard keeps the sum: its readers divide */
        for (int i = 0; i < k; i++) args[i] = ts_mkval(gr[first[b] + i].v);
        ts_val tok = ts_node_add(g, TS_OP_REDUCE_SCATTER_START, k, args, &a, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        rs_start[b] = g->values[tok.id].node;
        if (unscale[b] >= 0 && (s = ts_node_add_ctrl(g, rs_start[b], unscale[b])) != TS_OK) break;
        shard[b] = g->nodes[rs_start[b]].out[1];
        snprintf(name, sizeof name, "bucket%d.start", b);
        ts_set_name(g, tok, name);
        snprintf(name, sizeof name, "bucket%d.grad_shard", b);
        ts_set_name(g, ts_mkval(shard[b]), name);
        ts_val wargs[2] = {tok, ts_mkval(shard[b])};
        ts_val w = ts_node_add(g, TS_OP_REDUCE_SCATTER_WAIT, 2, wargs, &a, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        rs_wait[b] = g->values[w.id].node;
        snprintf(name, sizeof name, "bucket%d.wait", b);
        ts_set_name(g, w, name);
    }
    if (s != TS_OK) goto done;
    /* Loss scaling: whether any rank found a non-finite gradient, as the
     * update gate needs it ("found_inf", the name the loss scaler reads). */
    int32_t found = -1;
    if (us >= 0 && !summed) {
        for (int b = 0; b < nb; b++) args[b] = ts_mkval(g->nodes[unscale[b]].out[0]);
        ts_attrs a = ts_attrs_zero();
        a.bucket.algo = d->algo;
        ts_val f = ts_node_add(g, TS_OP_ZERO_FOUND_INF, nb, args, &a, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) goto done;
        found = g->values[f.id].node;
        const int32_t old = g->nodes[us].out[0];
        free(g->values[old].name); /* the name moves to the agreed flag */
        g->values[old].name = NULL;
        g->values[old].is_output = 0;
        g->values[f.id].is_output = 1;
        if ((s = ts_set_name(g, f, "found_inf")) != TS_OK) goto done;
        for (int b = 0; b < nb && s == TS_OK && !fused; b++)
            s = ts_node_add_ctrl(g, found, rs_wait[b]);
        if (s != TS_OK) goto done;
    }
    /* The clip coefficient over every rank's shards. */
    ts_val coef = TS_NONE;
    if (has_coef && summed) coef = ts_mkval(un.in[un.n_in - 1]); /* the unsharded clip_coef */
    if (has_coef && !summed) {
        for (int b = 0; b < nb; b++) args[b] = ts_mkval(shard[b]);
        ts_attrs a = ts_attrs_zero();
        a.bucket.max_norm = g->nodes[clip].a.clip.max_norm;
        a.bucket.algo = d->algo;
        a.bucket.ranks = d->size; /* the shards hold sums over the ranks */
        coef = ts_node_add(g, TS_OP_ZERO_CLIP_COEF, nb, args, &a, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) goto done;
        ts_set_name(g, coef, "clip_coef");
        for (int b = 0; b < nb && s == TS_OK; b++)
            s = ts_node_add_ctrl(g, g->values[coef.id].node, rs_wait[b]);
        if (s == TS_OK && found >= 0) s = ts_node_add_ctrl(g, g->values[coef.id].node, found);
    }
    /* Shared parameters: every rank has finished reading them (the
     * backward) before any rank updates its block. */
    int32_t sync_pre = -1, sync_post = -1;
    if (shared) {
        if ((s = add_sync(g, "zero.params_read", &sync_pre)) != TS_OK) goto done;
        for (int c = 0; c < un.n_ctrl && s == TS_OK; c++)
            s = ts_node_add_ctrl(g, sync_pre, un.ctrl[c]);
        for (int b = 0; b < nb && s == TS_OK && !inplace; b++)
            s = ts_node_add_ctrl(g, sync_pre, rs_wait[b]);
        if (s == TS_OK && found >= 0) s = ts_node_add_ctrl(g, sync_pre, found);
        if (s != TS_OK) goto done;
    }
    /* Per bucket: the shard's update and the all-gather of its parameters. */
    static const char *const state_names[2][2] = {{"momentum", ""}, {"exp_avg", "exp_avg_sq"}};
    for (int b = 0; b < nb && s == TS_OK; b++) {
        const int k = first[b + 1] - first[b];
        const int64_t off = shard_off[b];
        ts_type st;
        memset(&st, 0, sizeof st);
        st.dtype = g->values[gr[first[b]].v].t.dtype;
        st.rank = 1;
        st.dims[0] = shard_len[b];
        int na = 0;
        if (z3) {
            /* ZeRO-3: the update reads and writes the rank's persistent
             * block of the parameters, the only copy between steps. */
            if ((pshard[b] = new_shard_state(g, &st, b, "param")) < 0) {
                s = ts_graph_status(g);
                break;
            }
            args[na++] = ts_mkval(pshard[b]);
        }
        for (int i = 0; i < k && !z3; i++)
            args[na++] = ts_mkval(un.in[group_of[root[gr[first[b] + i].v]] * gs]);
        if (inplace)
            for (int i = 0; i < k; i++) args[na++] = ts_mkval(gr[first[b] + i].v);
        else
            args[na++] = ts_mkval(shard[b]);
        for (int j = 0; j < ns; j++) {
            int32_t sv = new_shard_state(g, &st, b, state_names[adam][j]);
            if (sv < 0) {
                s = ts_graph_status(g);
                break;
            }
            args[na++] = ts_mkval(sv);
        }
        if (s != TS_OK) break;
        if (has_coef) args[na++] = coef;
        ts_attrs a = ts_attrs_zero();
        if (adam)
            a.shard.opt.adam = un.a.adam;
        else
            a.shard.opt.sgd = un.a.sgd;
        a.shard.offset = z3 ? 0 : off;
        a.shard.n_params = z3 ? 1 : k;
        a.shard.opt_op = un.op;
        /* fused: the sum over this many ranks' copies; summed: this rank's, the mean already */
        a.shard.fused_ranks = fused ? d->size : summed ? 1 : 0;
        a.shard.fused_elems = shard_len[b];
        a.shard.divisor = summed ? 1 : d->size; /* else the gradient read is the ranks' sum */
        ts_node_add(g, TS_OP_SHARD_UPDATE, na, args, &a, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        upd[b] = g->n_nodes - 1;
        s = inplace ? TS_OK : ts_node_add_ctrl(g, upd[b], rs_wait[b]);
        if (s == TS_OK && found >= 0) s = ts_node_add_ctrl(g, upd[b], found);
        if (s == TS_OK && shared) s = ts_node_add_ctrl(g, upd[b], sync_pre);
        /* after every reader of any parameter, as the fused update was */
        for (int c = 0; c < un.n_ctrl && s == TS_OK; c++)
            s = ts_node_add_ctrl(g, upd[b], un.ctrl[c]);
        if (s != TS_OK) break;
        if (shared || z3) continue;
        ts_attrs ga = ts_attrs_zero();
        ga.bucket.ticket = nb + b;
        ga.bucket.algo = d->algo;
        ga.bucket.elems = bucket_span(g, gr, first[b], first[b + 1]);
        ts_val tok = ts_node_add(g, TS_OP_ALL_GATHER_START, k, args, &ga, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        ag_start[b] = g->values[tok.id].node;
        if ((s = ts_node_add_ctrl(g, ag_start[b], upd[b])) != TS_OK) break;
        char name[64];
        snprintf(name, sizeof name, "bucket%d.gather", b);
        ts_set_name(g, tok, name);
        memmove(args + 1, args, sizeof(ts_val) * (size_t)k);
        args[0] = tok;
        ts_val w = ts_node_add(g, TS_OP_ALL_GATHER_WAIT, k + 1, args, &ga, NULL);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        ag_wait[b] = g->values[w.id].node;
        snprintf(name, sizeof name, "bucket%d.gathered", b);
        ts_set_name(g, w, name);
    }
    if (s != TS_OK) goto done;
    /* ... and every rank's block is updated (and, fused, every peer has
     * read this rank's gradients) before the next step reads them. */
    if (shared) {
        if ((s = add_sync(g, "zero.params_updated", &sync_post)) != TS_OK) goto done;
        for (int b = 0; b < nb && s == TS_OK; b++) s = ts_node_add_ctrl(g, sync_post, upd[b]);
        if (s != TS_OK) goto done;
    }

    /* The order: starts after their buckets' last gradients, everything
     * else where the fused update was, the all-gather waits (or the last
     * barrier) at the end. */
    int m = 0;
    const int z2 = d->zero >= 2 && !summed; /* summed: the tree needs every gradient whole */
    for (int k = 0; k < n_order; k++) {
        for (int b = 0; z2 && b + 1 < nb; b++) /* before the next bucket's first gradient */
            if (first_write[b + 1] == k && k > start_at[b]) out[m++] = rs_wait[b];
        if (!summed && (order[k] == clip || order[k] == us)) continue;
        if (z2 && mon_bucket[k] >= 0) continue; /* moved before its bucket's start */
        if (k == upos) {
            for (int b = z2 ? nb - 1 : 0; b < nb && !inplace; b++) out[m++] = rs_wait[b];
            if (found >= 0) out[m++] = found;
            if (has_coef && !summed) out[m++] = g->values[coef.id].node;
            if (shared) out[m++] = sync_pre;
            for (int b = 0; b < nb; b++) {
                out[m++] = upd[b];
                if (!shared && !z3) out[m++] = ag_start[b];
            }
            continue;
        }
        out[m++] = order[k];
        for (int b = 0; b < nb; b++) {
            if (start_at[b] != k) continue;
            if (unscale[b] >= 0) out[m++] = unscale[b];
            if (inplace) continue;
            for (int j = 0; z2 && j < n_order; j++)
                if (mon_bucket[j] == b) out[m++] = order[j];
            out[m++] = rs_start[b];
            /* the next bucket's first gradient is written by this node already */
            if (z2 && b + 1 < nb && first_write[b + 1] <= k) out[m++] = rs_wait[b];
        }
    }
    if (shared)
        out[m++] = sync_post;
    else if (!z3)
        for (int b = 0; b < nb; b++) out[m++] = ag_wait[b];
    /* ZeRO-3: the all-gathers of each bucket's parameters from the blocks
     * before their forward and their backward uses (zero3.c). */
    if (z3) {
        ts_zero3_bucket *zb = ts_alloc(sizeof *zb * (size_t)(nb + 1), "zero");
        int32_t *zp = ts_alloc(sizeof(int32_t) * (size_t)(first[nb] + 1), "zero");
        if (!zb || !zp) s = TS_ERR_NOMEM;
        for (int b = 0; b < nb && s == TS_OK; b++) {
            zb[b].params = zp + first[b];
            zb[b].k = first[b + 1] - first[b];
            for (int i = 0; i < zb[b].k; i++)
                zp[first[b] + i] = un.in[group_of[root[gr[first[b] + i].v]] * gs];
            zb[b].shard = pshard[b];
            zb[b].elems = g->nodes[rs_start[b]].a.bucket.elems;
            zb[b].update = upd[b];
        }
        if (s == TS_OK) s = ts_zero3_gathers(g, &out, &m, d, zb, nb, &n_gathers);
        free(zb);
        free(zp);
        if (s != TS_OK) goto done;
    }

    /* Drop the fused update, the clip coefficient and the full-size state
     * (compaction removes values of dead nodes). */
    g->nodes[u].dead = 1;
    if (clip >= 0 && !summed) g->nodes[clip].dead = 1;
    if (us >= 0 && !summed) g->nodes[us].dead = 1;
    for (int j = 0; j < ngroups; j++)
        for (int q = 2; q < gs; q++) {
            ts_value *sv = &g->values[un.in[j * gs + q]];
            sv->kind = TS_VK_NODE;
            sv->node = u;
        }
    nmap = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "zero");
    vmap = ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "zero");
    if (!nmap || !vmap) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0, c = 0; i < g->n_nodes; i++) nmap[i] = g->nodes[i].dead ? -1 : c++;
    if ((s = ts_graph_compact(g, vmap)) != TS_OK) goto done;
    for (int k = 0; k < m; k++) out[k] = nmap[out[k]];
    if (d->loss) *d->loss = vmap[*d->loss];
    free(*order_io);
    *order_io = out;
    *n_order_io = m;
    out = NULL;
    *n_slots = z3 ? nb + n_gathers : 2 * nb;
done:
    free(group_of);
    free(bucket_of);
    free(mon_bucket);
    free(pos);
    free(first_write);
    free(shard);
    free(rs_start);
    free(rs_wait);
    free(upd);
    free(shard_off);
    free(shard_len);
    free(unscale);
    free(ag_start);
    free(ag_wait);
    free(pshard);
    free(args);
    free(out);
    free(nmap);
    free(vmap);
    return s;
}

ts_status ts_pass_distribute(ts_graph *g, int32_t **order_io, int *n_order_io,
                             const ts_dist_spec *d, int *n_buckets) {
    *n_buckets = 0;
    const int nn = g->n_nodes, nv = g->n_values, n_order = *n_order_io;
    const int32_t *order = *order_io;
    ts_status s = TS_OK;
    int *pos = ts_alloc(sizeof(int) * (size_t)(nn + 1), "distribute");
    int32_t *root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "distribute");
    int *bucket_of = ts_alloc(sizeof(int) * (size_t)(nv + 1), "distribute"); /* per root */
    grad_ref *gr = ts_alloc(sizeof(grad_ref) * (size_t)(nv + 1), "distribute");
    int *first = NULL, *start_at = NULL, *wait_at = NULL, *mon_at = NULL;
    int32_t *start_node = NULL, *wait_node = NULL, *out = NULL;
    if (!pos || !root || !bucket_of || !gr) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nn; i++) pos[i] = -1;
    for (int k = 0; k < n_order; k++) pos[order[k]] = k;
    ts_view_roots(g, root);
    for (int v = 0; v < nv; v++) bucket_of[v] = -1;
    /* One entry per gradient storage root. */
    int ng = 0;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->grad_of < 0 || val->kind != TS_VK_NODE || bucket_of[root[v]] == -2) continue;
        ts_dtype dt = val->t.dtype;
        if (dt != TS_F32 && dt != TS_F64) {
            char lb[32];
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "distribute: gradient '%s' is %s; data-parallel training averages f32 "
                        "and f64 gradients only",
                        ts_value_label(g, v, lb, sizeof lb), ts_dtype_name(dt));
            goto done;
        }
        bucket_of[root[v]] = -2; /* seen */
        gr[ng++] = (grad_ref){v, pos[val->node], ts_type_bytes(&val->t), val->grad_of};
    }
    if (ng == 0) goto done;
    ts_compress_prep cprep = {0, -1, 0}; /* compression (compress.c): checked before any change */
    if (d->compress.method && (s = ts_compress_prepare(g, d, &cprep)) != TS_OK) goto done;
    qsort(gr, (size_t)ng, sizeof *gr, d->param_order ? cmp_param : cmp_ready);

    /* Buckets: [first[b], first[b + 1]) of gr. */
    first = ts_alloc(sizeof(int) * (size_t)(ng + 1), "distribute");
    if (!first) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int nb = 0;
    size_t fill = 0;
    for (int i = 0; i < ng; i++) {
        size_t cap = nb <= 1 ? d->first_bucket_bytes : d->bucket_bytes;
        int dtype_change = i > 0 && g->values[gr[i].v].t.dtype != g->values[gr[i - 1].v].t.dtype;
        /* ZeRO-3 gathers a bucket's parameters whole, so a tensor that fills
         * a bucket alone gets its own: a tied embedding sharing one with the
         * first layer norm would be gathered again, all of it, for that
         * layer norm's backward at the end of the step. */
        const int alone = d->zero == 3 && fill > 0 && gr[i].bytes >= cap;
        if (i == 0 || dtype_change || fill >= cap || alone) {
            first[nb++] = i;
            fill = 0;
        }
        fill += gr[i].bytes;
        bucket_of[root[gr[i].v]] = nb - 1;
    }
    first[nb] = ng;

    /* Where each bucket starts (after its last gradient) and waits (before
     * the first later reader of any of its gradients; n_order: the end). */
    start_at = ts_alloc(sizeof(int) * (size_t)(nb + 1), "distribute");
    wait_at = ts_alloc(sizeof(int) * (size_t)(nb + 1), "distribute");
    start_node = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "distribute");
    wait_node = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "distribute");
    if (!start_at || !wait_at || !start_node || !wait_node) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int b = 0; b < nb; b++) {
        start_at[b] = gr[first[b + 1] - 1].ready;
        for (int i = first[b]; i < first[b + 1]; i++) /* param_order: not sorted by ready */
            if (gr[i].ready > start_at[b]) start_at[b] = gr[i].ready;
        wait_at[b] = n_order;
    }
    if (d->zero) {
        s = zero_rewrite(g, order_io, n_order_io, d, gr, first, nb, start_at, root, n_buckets);
        goto done;
    }
    /* A gradient monitor after its bucket's start would have to wait for
     * the all-reduce right there and lose the overlap: it runs just before
     * the start instead, reading this rank's gradients as without data
     * parallelism (mon_at[k]: the bucket it moves to, -1: stays). */
    mon_at = ts_alloc(sizeof(int) * (size_t)(n_order + 1), "distribute");
    if (!mon_at) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        mon_at[k] = -1;
        if (!(ts_op_get(n->op)->flags & TS_OPF_MONITOR)) continue;
        int mb = -1;
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b < 0 || (mb >= 0 && b != mb)) {
                mb = -1;
                break;
            }
            mb = b;
        }
        /* A monitor that must follow a later node stays: with loss
         * scaling it reads the gradients after the unscale, so it waits
         * for the all-reduce and sees the averaged, unscaled gradients
         * (before the start it would see this rank's scaled ones). */
        for (int c = 0; c < n->n_ctrl && mb >= 0; c++)
            if (pos[n->ctrl[c]] > start_at[mb]) mb = -1;
        /* Every input final by then: they are all of bucket mb. */
        if (mb >= 0 && k > start_at[mb]) mon_at[k] = mb;
    }
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (is_alias(g, order[k]) || mon_at[k] >= 0) continue; /* a view reads nothing */
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b >= 0 && k > start_at[b] && k < wait_at[b]) wait_at[b] = k;
        }
    }

    /* The nodes. */
    for (int b = 0; b < nb && s == TS_OK; b++) {
        int k = 0;
        ts_val *args =
            ts_alloc(sizeof(ts_val) * (size_t)(first[b + 1] - first[b] + 1), "distribute");
        if (!args) {
            s = TS_ERR_NOMEM;
            break;
        }
        for (int i = first[b]; i < first[b + 1]; i++) args[1 + k++] = ts_mkval(gr[i].v);
        if (d->compress.method) {
            s = ts_compress_bucket(g, d, &cprep, b, args + 1, k, &start_node[b], &wait_node[b]);
            free(args);
            continue;
        }
        ts_attrs a = ts_attrs_zero();
        a.bucket.ticket = b;
        a.bucket.algo = d->algo;
        char name[64];
        ts_val tok = ts_node_add(g, TS_OP_ALLREDUCE_START, k, args + 1, &a, NULL);
        if ((s = ts_graph_status(g)) == TS_OK) {
            snprintf(name, sizeof name, "bucket%d.start", b);
            s = ts_set_name(g, tok, name);
        }
        if (s == TS_OK) {
            start_node[b] = g->values[tok.id].node;
            args[0] = tok;
            ts_val w = ts_node_add(g, TS_OP_ALLREDUCE_WAIT, k + 1, args, &a, NULL);
            if ((s = ts_graph_status(g)) == TS_OK) {
                snprintf(name, sizeof name, "bucket%d.wait", b);
                s = ts_set_name(g, w, name);
                wait_node[b] = g->values[w.id].node;
            }
        }
        free(args);
    }
    if (s != TS_OK) goto done;
    /* Readers after the start depend on the wait (the graph says what the
     * order does). */
    for (int k = 0; k < n_order && s == TS_OK; k++) {
        int i = order[k];
        const ts_node *n = &g->nodes[i];
        if (is_alias(g, i) || mon_at[k] >= 0) continue;
        for (int j = 0; j < n->n_in && s == TS_OK; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b >= 0 && k > start_at[b]) s = ts_node_add_ctrl(g, i, wait_node[b]);
        }
    }
    /* ... and the start after the moved monitors. */
    for (int k = 0; k < n_order && s == TS_OK; k++)
        if (mon_at[k] >= 0) s = ts_node_add_ctrl(g, start_node[mon_at[k]], order[k]);
    if (s != TS_OK) goto done;

    /* The new order: waits before their position, starts after theirs
     * (preceded by the monitors moved there). */
    out = ts_alloc(sizeof(int32_t) * (size_t)(n_order + 2 * nb + 1), "distribute");
    if (!out) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int m = 0;
    for (int k = 0; k <= n_order; k++) {
        for (int b = 0; b < nb; b++)
            if (wait_at[b] == k) out[m++] = wait_node[b];
        if (k == n_order) break;
        if (mon_at[k] < 0) out[m++] = order[k];
        for (int b = 0; b < nb; b++) {
            if (start_at[b] != k) continue;
            for (int q = k + 1; q < n_order; q++)
                if (mon_at[q] == b) out[m++] = order[q];
            out[m++] = start_node[b];
        }
    }
    free(*order_io);
    *order_io = out;
    *n_order_io = m;
    out = NULL;
    *n_buckets = nb;
done:
    free(pos);
    free(root);
    free(bucket_of);
    free(gr);
    free(first);
    free(start_at);
    free(wait_at);
    free(mon_at);
    free(start_node);
    free(wait_node);
    free(out);
    return s;
}
