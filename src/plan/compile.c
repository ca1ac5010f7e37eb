/* ts_compile: run the passes and build the plan (arena, instructions,
 * named values), then let the backend prepare its kernels. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "passes/pipeline.h"
#include "plan/scaler.h"

ts_train_spec ts_train_spec_default(ts_val loss) {
    ts_train_spec s;
    memset(&s, 0, sizeof s);
    s.loss = loss;
    s.opt = ts_sgd(0.01, 0, 0, 0, 0);
    return s;
}

ts_compile_options ts_compile_options_default(void) {
    ts_compile_options o;
    memset(&o, 0, sizeof o);
    return o;
}

double ts_lr_at(const ts_lr_schedule *s, double lr, int64_t step) {
    if (!s) return lr;
    if (s->warmup_steps > 0 && step <= s->warmup_steps)
        return lr * (double)step / (double)s->warmup_steps;
    if (s->kind == TS_LR_CONSTANT || s->total_steps <= s->warmup_steps) return lr;
    double t = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (t > 1) t = 1;
    if (s->kind == TS_LR_LINEAR) return s->min_lr + (lr - s->min_lr) * (1.0 - t);
    return s->min_lr + (lr - s->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * t));
}

/* ---- parameter initialisation ------------------------------------------ */

static void fans(const ts_type *t, double *fan_in, double *fan_out) {
    if (t->rank < 2) {
        *fan_in = *fan_out = t->rank ? (double)t->dims[0] : 1.0;
        return;
    }
    double rf = 1;
    for (int i = 2; i < t->rank; i++) rf *= (double)t->dims[i];
    *fan_in = (double)t->dims[1] * rf;
    *fan_out = (double)t->dims[0] * rf;
}

static ts_status init_value(const ts_value *v, void *dst, uint64_t seed) {
    int64_t n = ts_type_numel(&v->t);
    size_t bytes = ts_type_bytes(&v->t);
    if (v->data) { /* TS_INIT_BUFFER */
        memcpy(dst, v->data, bytes);
        return TS_OK;
    }
    if (v->t.dtype != TS_F32 && v->t.dtype != TS_F64)
        return ts_fail(TS_ERR_UNSUPPORTED, "init of '%s': dtype %s not supported yet", v->name,
                       ts_dtype_name(v->t.dtype));
    double *tmp = ts_alloc(sizeof(double) * (size_t)(n + 1), "parameter init");
    if (!tmp) return TS_ERR_NOMEM;
    uint64_t key = ts_hash_str(v->name ? v->name : "") ^ (seed * 0x9E3779B97F4A7C15ull);
    double fi, fo, a = v->init.a, b = v->init.b;
    fans(&v->t, &fi, &fo);
    switch (v->init.kind) {
    case TS_INIT_ZEROS: memset(tmp, 0, sizeof(double) * (size_t)n); break;
    case TS_INIT_ONES:
        for (int64_t i = 0; i < n; i++) tmp[i] = 1;
        break;
    case TS_INIT_CONSTANT:
        for (int64_t i = 0; i < n; i++) tmp[i] = a;
        break;
    case TS_INIT_NORMAL: ts_rand_normal_f64(tmp, n, key, a, b); break;
    case TS_INIT_UNIFORM: ts_rand_uniform_f64(tmp, n, key, a, b); break;
    case TS_INIT_KAIMING_UNIFORM: {
        double bound = sqrt(3.0) * sqrt(2.0 / (1.0 + a * a)) / sqrt(fi);
        ts_rand_uniform_f64(tmp, n, key, -bound, bound);
        break;
    }
    case TS_INIT_KAIMING_NORMAL:
        ts_rand_normal_f64(tmp, n, key, 0, sqrt(2.0 / (1.0 + a * a)) / sqrt(fi));
        break;
    case TS_INIT_XAVIER_UNIFORM: {
        double bound = a * sqrt(6.0 / (fi + fo));
        ts_rand_uniform_f64(tmp, n, key, -bound, bound);
        break;
    }
    case TS_INIT_XAVIER_NORMAL:
        ts_rand_normal_f64(tmp, n, key, 0, a * sqrt(2.0 / (fi + fo)));
        break;
    case TS_INIT_BUFFER: break;
    }
    if (v->t.dtype == TS_F64)
        memcpy(dst, tmp, bytes);
    else
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)tmp[i];
    free(tmp);
    return TS_OK;
}

/* ---- plan construction --------------------------------------------------- */

void ts_plan_free(ts_plan *p) {
    if (!p) return;
    if (p->backend) p->backend->release(p);
    for (int i = 0; i < p->n_ins; i++) {
        free(p->ins[i].in);
        free(p->ins[i].label);
    }
    free(p->ins);
    for (int i = 0; i < p->n_named; i++) free(p->named[i].name);
    free(p->named);
    /* A step that failed between a bucket's start and its wait leaves its
     * all-reduce on the comm's thread, writing into the arena: let it end
     * (it completes, or fails at the comm's timeout) before freeing. */
    ts_coll_ticket last = {0};
    for (int b = 0; b < p->n_buckets && p->dist.tickets; b++)
        if (p->dist.tickets[b].id > last.id) last = p->dist.tickets[b];
    if (last.id && !ts_coll_done(p->opt.comm, last)) ts_coll_wait(p->opt.comm, last);
    free(p->dist.tickets);
    free(p->dist.peer_delta);
    if (p->params) ts_comm_release_shared(p->opt.comm, p->params);
    if (p->arena_from_comm)
        ts_comm_free(p->opt.comm, p->arena);
    else
        ts_aligned_free(p->arena);
    ts_memplan_free(&p->mp);
    free(p->scaler);
    free(p->order);
    ts_graph_free(p->graph);
    free(p);
}

static void set_tensor(ts_tensor *t, const ts_type *ty, void *data) {
    t->dtype = ty->dtype;
    t->rank = ty->rank;
    memcpy(t->dims, ty->dims, sizeof t->dims);
    t->data = data;
}

static ts_status lower(ts_plan *p) {
    ts_graph *g = p->graph;
    p->ins = ts_zalloc(sizeof(ts_instr) * (size_t)(p->n_order + 1), "plan instructions");
    if (!p->ins) return TS_ERR_NOMEM;
    for (int k = 0; k < p->n_order; k++) {
        int i = p->order[k];
        const ts_node *n = &g->nodes[i];
        const ts_op_def *def = ts_op_get(n->op);
        if (p->mp.alias_skip[i]) continue;
        ts_instr *in = &p->ins[p->n_ins++];
        in->op = n->op;
        in->node = i;
        in->fn = def->kernel;
        in->a = n->a;
        in->n_in = n->n_in;
        in->n_out = n->n_out;
        in->flops = def->cost ? def->cost(g, n) : 0;
        p->flops += in->flops;
        in->in = ts_alloc(sizeof(ts_tensor) * (size_t)(n->n_in + 1), "plan instruction");
        if (!in->in) return TS_ERR_NOMEM;
        for (int j = 0; j < n->n_in; j++) {
            size_t off = p->mp.off[n->in[j]];
            set_tensor(&in->in[j], &g->values[n->in[j]].t, ts_plan_at(p, off));
            if (j < 16) in->in_off[j] = off;
        }
        for (int j = 0; j < n->n_out; j++) {
            size_t off = p->mp.off[n->out[j]];
            set_tensor(&in->out[j], &g->values[n->out[j]].t, ts_plan_at(p, off));
            in->out_off[j] = off;
        }
        in->scratch_off = p->mp.scratch_off[i];
        in->scratch_bytes = p->mp.scratch_bytes[i];
        in->scratch = in->scratch_bytes ? ts_plan_at(p, in->scratch_off) : NULL;
        /* The label names the value in messages: its own name, or for an
         * unnamed value "%id = op(inputs)" so a NaN report is still readable. */
        char lb[64], buf[600];
        size_t k2 = 0;
        if (n->n_out && g->values[n->out[0]].name) {
            snprintf(buf, sizeof buf, "%s", g->values[n->out[0]].name);
        } else {
            if (n->n_out) k2 = (size_t)snprintf(buf, sizeof buf, "%%%d = ", n->out[0]);
            k2 += (size_t)snprintf(buf + k2, sizeof buf - k2, "%s(", def->name);
            for (int j = 0; j < n->n_in && j < 3 && k2 < sizeof buf; j++)
                k2 += (size_t)snprintf(buf + k2, sizeof buf - k2, "%s%s", j ? ", " : "",
                                       ts_value_label(g, n->in[j], lb, sizeof lb));
            if (k2 < sizeof buf)
                snprintf(buf + k2, sizeof buf - k2, "%s)", n->n_in > 3 ? ", ..." : "");
        }
        if (!(in->label = ts_strdup(buf))) return TS_ERR_NOMEM;
    }
    return TS_OK;
}

static ts_status add_named(ts_plan *p, const char *name, int32_t v) {
    ts_named *nm = &p->named[p->n_named];
    if (!(nm->name = ts_strdup(name))) return TS_ERR_NOMEM;
    const ts_value *val = &p->graph->values[v];
    nm->t = val->t;
    nm->off = p->mp.off[v];
    nm->kind = val->kind;
    nm->is_grad = val->grad_of >= 0;
    nm->value = v;
    p->n_named++;
    return TS_OK;
}

static ts_status build_named(ts_plan *p) {
    ts_graph *g = p->graph;
    p->named = ts_zalloc(sizeof(ts_named) * (size_t)(g->n_values + 2), "plan names");
    if (!p->named) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    for (int v = 0; v < g->n_values && s == TS_OK; v++) {
        const ts_value *val = &g->values[v];
        int addressable = val->kind == TS_VK_PARAM || val->kind == TS_VK_STATE ||
                          val->kind == TS_VK_INPUT || val->is_output || val->grad_of >= 0;
        if (addressable && val->name) s = add_named(p, val->name, v);
    }
    if (s == TS_OK && p->loss >= 0 && !ts_plan_find(p, "loss")) s = add_named(p, "loss", p->loss);
    return s;
}

/* ZeRO with shared parameters: every rank learns where each peer's arena
 * lies (a fused shard update reads their gradients there). Collective. */
static ts_status exchange_arenas(ts_plan *p) {
    ts_comm *c = p->opt.comm;
    const int n = ts_comm_size(c), me = ts_comm_rank(c);
    int64_t *base = ts_alloc(sizeof(int64_t) * (size_t)n, "plan arenas");
    p->dist.peer_delta = ts_alloc(sizeof(ptrdiff_t) * (size_t)n, "plan arenas");
    if (!base || !p->dist.peer_delta) {
        free(base);
        return TS_ERR_NOMEM;
    }
    base[me] = (int64_t)(intptr_t)p->arena;
    ts_status s = ts_allgather(c, NULL, base, (size_t)n, TS_I64, TS_ALGO_NATIVE);
    for (int q = 0; q < n && s == TS_OK; q++)
        p->dist.peer_delta[q] = (ptrdiff_t)(base[q] - base[me]);
    free(base);
    return s;
}

static ts_status init_arena(ts_plan *p) {
    ts_graph *g = p->graph;
    const size_t po = p->mp.param_off, pb = p->mp.param_bytes;
    if (p->zero_shared && po != 0)
        return ts_fail(TS_ERR_INTERNAL, "plan: shared parameters must open the arena");
    if (p->zero_shared && pb > 0) {
        /* One copy of the parameters for every rank; rank 0 initialises
         * it, and the exchange below (which every rank enters only after
         * its initialisation) publishes it before any step reads it. */
        void *sp;
        ts_status s = ts_comm_alloc_shared(p->opt.comm, pb, &sp);
        if (s != TS_OK) {
            ts_error_prefix("ZeRO's shared parameters (%zu bytes)", pb);
            return s;
        }
        p->params = sp;
        p->arena_skip = pb;
    }
    const size_t bytes = p->mp.arena_bytes - p->arena_skip;
    if (p->n_buckets > 0) {
        /* On shm the gradients must lie in the shared segment for the
         * direct all-reduce to read peers' buckets in place. */
        p->arena = ts_comm_alloc(p->opt.comm, bytes);
        if (!p->arena) {
            ts_error_prefix("plan arena of %zu bytes", bytes);
            return TS_ERR_NOMEM;
        }
        p->arena_from_comm = 1;
    } else {
        p->arena = ts_aligned_alloc(bytes, "plan arena");
        if (!p->arena) return TS_ERR_NOMEM;
    }
    const int owner = !p->params || ts_comm_rank(p->opt.comm) == 0;
    memset(p->arena, 0, bytes);
    if (owner && p->params) memset(p->params, 0, pb);
    for (int v = 0; v < g->n_values; v++) {
        const ts_value *val = &g->values[v];
        if (p->mp.off[v] == SIZE_MAX) continue;
        unsigned char *dst = ts_plan_at(p, p->mp.off[v]);
        if (!owner && p->mp.off[v] - po < pb) continue; /* rank 0 initialises the shared ones */
        if (val->kind == TS_VK_CONST) memcpy(dst, val->data, ts_type_bytes(&val->t));
        if (val->kind == TS_VK_PARAM || val->kind == TS_VK_STATE) {
            ts_status s = init_value(val, dst, p->opt.seed);
            if (s != TS_OK) return s;
        }
    }
    return p->zero_shared ? exchange_arenas(p) : TS_OK;
}

/* The passes (src/passes/pipeline.c) over the plan's copy of the graph;
 * their results go into the plan. */
static ts_status compile_graph(ts_plan *p, const ts_train_spec *spec) {
    ts_graph *g = p->graph;
    ts_status s = TS_OK;
    int32_t *params = NULL, *grads = NULL;
    int np = 0;
    if (p->loss >= 0) {
        int n_all = 0;
        for (int v = 0; v < g->n_values; v++) n_all += g->values[v].kind == TS_VK_PARAM;
        params = ts_alloc(sizeof(int32_t) * (size_t)(n_all + 1), "compile");
        grads = ts_alloc(sizeof(int32_t) * (size_t)(n_all + 1), "compile");
        if (!params || !grads) {
            s = TS_ERR_NOMEM;
            goto done;
        }
        if (spec->trainable) {
            for (int i = 0; i < spec->n_trainable; i++) {
                int32_t v = spec->trainable[i].id;
                if (v < 0 || v >= g->n_values || g->values[v].kind != TS_VK_PARAM) {
                    s = ts_fail(TS_ERR_INVALID, "compile: trainable[%d] is not a parameter", i);
                    goto done;
                }
                params[np++] = v;
            }
        } else {
            for (int v = 0; v < g->n_values; v++)
                if (g->values[v].kind == TS_VK_PARAM) params[np++] = v;
        }
    }
    ts_pass_ctx c;
    ts_pass_ctx_init(&c, g, spec, &p->opt, params, grads, np, p->loss);
    s = ts_pipeline_run(&c);
    p->loss = c.loss;
    p->fuse = c.fuse;
    p->order = c.order, p->n_order = c.n_order;
    c.order = NULL;
    p->peak_live = c.peak_live, p->naive_peak = c.naive_peak;
    p->n_buckets = c.n_buckets;
    p->zero_shared = c.zero_shared;
    p->mp = c.mp;
    memset(&c.mp, 0, sizeof c.mp);
    ts_pass_ctx_free(&c);
done:
    free(params);
    free(grads);
    return s;
}

ts_status ts_compile(const ts_graph *src, const ts_train_spec *spec, const ts_compile_options *opt,
                     ts_plan **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_compile: out is NULL");
    *out = NULL;
    if (!src) return ts_fail(TS_ERR_INVALID, "ts_compile: graph is NULL");
    if (src->status != TS_OK)
        return ts_fail(src->status, "ts_compile: the graph has an error: %s", src->error);
    const ts_backend *be;
    ts_status bs = ts_backend_lookup(opt ? opt->backend : NULL, &be);
    if (bs != TS_OK) return bs;
    if (opt && opt->dump_to && ts_pass_find(opt->dump_after) < 0) {
        char names[512];
        return ts_fail(TS_ERR_INVALID, "compile: dump_after: no pass named '%s' (passes: %s)",
                       opt->dump_after ? opt->dump_after : "", ts_pass_names(names, sizeof names));
    }
    ts_plan *p = ts_zalloc(sizeof *p, "plan");
    if (!p) return TS_ERR_NOMEM;
    p->opt = opt ? *opt : ts_compile_options_default();
    p->loss = -1;
    p->last_loss = NAN;
    ts_status s = TS_OK;
    if (!(p->graph = ts_graph_clone(src))) {
        s = TS_ERR_NOMEM;
        goto fail;
    }
    if (spec && ts_val_ok(spec->loss)) {
        int32_t l = spec->loss.id;
        if (l >= p->graph->n_values) {
            s = ts_fail(TS_ERR_INVALID, "ts_compile: the loss is not a value of this graph");
            goto fail;
        }
        ts_value *lv = &p->graph->values[l];
        char tb[128], lb[32];
        if (ts_type_numel(&lv->t) != 1 || lv->t.rank != 0 || !ts_dtype_is_float(lv->t.dtype)) {
            s = ts_fail(TS_ERR_SHAPE, "ts_compile: the loss '%s' must be a float scalar, got %s",
                        ts_value_label(p->graph, l, lb, sizeof lb),
                        ts_type_str(tb, sizeof tb, &lv->t));
            goto fail;
        }
        if (!lv->name && (s = ts_set_name(p->graph, spec->loss, "loss")) != TS_OK) goto fail;
        p->graph->values[l].is_output = 1;
        p->loss = l;
        p->training = 1;
        p->spec = *spec;
        p->spec.trainable = NULL;
    }
    ts_scaler_config scfg = ts_scaler_config_from(&p->opt.precision);
    if (!p->training) scfg.mode = TS_LOSS_SCALE_NONE, p->opt.precision.loss_scale = TS_SCALE_NONE;
    if ((s = ts_scaler_config_check(&scfg)) != TS_OK) goto fail;
    if ((s = ts_precision_check(&p->opt.precision)) != TS_OK) goto fail;
    s = compile_graph(p, spec);
    p->opt.precision.keep_fp32 = NULL; /* the caller's string: read during compile only */
    p->opt.backend = NULL;             /* likewise */
    p->opt.dump_after = NULL, p->opt.dump_to = NULL, p->opt.peft.targets = NULL;
    if (s != TS_OK) goto fail;
    if ((s = init_arena(p)) != TS_OK) goto fail;
    if ((s = lower(p)) != TS_OK) goto fail;
    p->gate_ins = -1;
    for (int i = 0; i < p->n_ins && p->gate_ins < 0; i++)
        if (ts_op_get(p->ins[i].op)->flags & TS_OPF_UPDATE) p->gate_ins = i;
    if ((s = build_named(p)) != TS_OK) goto fail;
    if (p->loss >= 0) p->loss_off = p->mp.off[p->loss];
    if (scfg.mode != TS_LOSS_SCALE_NONE && (s = ts_plan_scaler_setup(p, &scfg)) != TS_OK) goto fail;
    /* oneDNN fixes a primitive's thread count when it is created: create
     * them under the count the plan will run with. */
    if (p->opt.threads > 0) omp_set_num_threads(p->opt.threads);
    p->backend = be; /* set first: ts_plan_free releases what a failed prepare made */
    if ((s = be->prepare(p)) != TS_OK) goto fail;
    p->ctx.seed = p->opt.seed;
    if (p->n_buckets > 0) {
        p->dist.tickets = ts_zalloc(sizeof(ts_coll_ticket) * (size_t)p->n_buckets, "plan tickets");
        if (!p->dist.tickets) {
            s = TS_ERR_NOMEM;
            goto fail;
        }
        p->dist.comm = p->opt.comm;
        p->dist.n_buckets = p->n_buckets;
        for (int i = 0; i < p->n_ins; i++)
            if (p->ins[i].op >= TS_OP_ALLREDUCE_START && p->ins[i].op <= TS_OP_ZERO_FOUND_INF)
                p->ins[i].backend = &p->dist;
    }
    *out = p;
    return TS_OK;
fail:
    ts_plan_free(p);
    return s;
}
