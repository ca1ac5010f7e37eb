/* ts_compile: run the passes, lower the final graph into the plan's
 * program (lower.c), allocate and bind its arena (arena.c), then let the
 * backend prepare its kernels. The graph is freed before ts_compile
 * returns: the plan runs on the program alone. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "passes/pipeline.h"
#include "tessel/dist.h"
#include "plan/lower.h"
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

/* ---- plan construction --------------------------------------------------- */

void ts_plan_free(ts_plan *p) {
    if (!p) return;
    ts_program *prog = &p->prog;
    ts_runtime *rt = &p->rt;
    if (p->backend) p->backend->release(prog, rt);
    for (int i = 0; rt->ins && i < prog->n_ins; i++) free(rt->ins[i].in);
    free(rt->ins);
    /* A step that failed between a bucket's start and its wait leaves its
     * all-reduce on the comm's thread, writing into the arena: let it end
     * (it completes, or fails at the comm's timeout) before freeing. */
    ts_coll_ticket last = {0};
    for (int b = 0; b < prog->n_buckets && rt->dist.tickets; b++)
        if (rt->dist.tickets[b].id > last.id) last = rt->dist.tickets[b];
    if (last.id && !ts_coll_done(prog->opt.comm, last)) ts_coll_wait(prog->opt.comm, last);
    free(rt->dist.tickets);
    free(rt->dist.peer_delta);
    if (rt->params && !rt->params_borrowed) ts_comm_release_shared(prog->opt.comm, rt->params);
    if (rt->arena_from_comm)
        ts_comm_free(prog->opt.comm, rt->arena);
    else
        ts_aligned_free(rt->arena);
    free(rt->scaler);
    free(rt->held_fns);
    ts_program_free(prog);
    free(p);
}

void ts_compiled_graph_free(ts_compiled_graph *k) {
    if (!k) return;
    ts_graph_free(k->graph);
    free(k->order);
    ts_memplan_free(&k->mp);
    memset(k, 0, sizeof *k);
}

/* The passes (src/passes/pipeline.c) over cg's copy of the graph for the
 * backend be; their results go into cg (schedule, memory plan) and the
 * program. *loss: the loss value id (-1 for inference), renumbered as the
 * passes renumber. */
static ts_status compile_graph(ts_program *prog, const ts_backend *be, ts_compiled_graph *cg,
                               const ts_train_spec *spec, int32_t *loss) {
    ts_graph *g = cg->graph;
    ts_status s = TS_OK;
    int32_t *params = NULL, *grads = NULL;
    int np = 0;
    if (*loss >= 0) {
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
    ts_pass_ctx_init(&c, g, spec, &prog->opt, params, grads, np, *loss);
    /* the reference kernels sum every row alone */
    c.row_chunks_exact =
        prog->opt.reference_kernels || !be->row_chunks_exact || be->row_chunks_exact();
    c.fused_norm_ok = be->supports_op(TS_OP_ACT_LAYER_NORM) &&
                      be->supports_op(TS_OP_LAYER_NORM_ACT_BWD) &&
                      be->supports_op(TS_OP_LAYER_NORM_BWD_ACC);
    c.fused_ce_ok = be->supports_op(TS_OP_CROSS_ENTROPY_FUSED);
    c.low_kernels_ok = be->memory == TS_MEM_HOST;
    c.packed_attention_hd = be->packed_attention_hd
                                ? be->packed_attention_hd(prog->opt.precision.compute)
                                : (be->memory == TS_MEM_HOST ? 0 : -1);
    s = ts_pipeline_run(&c);
    *loss = c.loss;
    cg->order = c.order, cg->n_order = c.n_order;
    c.order = NULL;
    prog->layout.peak_live = c.peak_live, prog->layout.naive_peak = c.naive_peak;
    prog->layout.n_recomputed = c.recompute.n, prog->layout.recompute_flops = c.recompute.flops;
    prog->layout.arena_no_recompute = prog->opt.max_memory_mb > 0 ? c.recompute.arena_before : 0;
    prog->layout.schedule = c.sched_method;
    prog->n_buckets = c.n_buckets;
    prog->zero_shared = c.zero_shared;
    cg->mp = c.mp;
    memset(&c.mp, 0, sizeof c.mp);
    ts_pass_ctx_free(&c);
done:
    free(params);
    free(grads);
    return s;
}

/* The loss of spec, checked (a float scalar of g) and named "loss" when it
 * has no name; *loss its value id, -1 without one (inference). */
static ts_status take_loss(ts_graph *g, const ts_train_spec *spec, int32_t *loss) {
    *loss = -1;
    if (!spec || !ts_val_ok(spec->loss)) return TS_OK;
    int32_t l = spec->loss.id;
    if (l >= g->n_values)
        return ts_fail(TS_ERR_INVALID, "ts_compile: the loss is not a value of this graph");
    ts_value *lv = &g->values[l];
    char tb[128], lb[32];
    if (ts_type_numel(&lv->t) != 1 || lv->t.rank != 0 || !ts_dtype_is_float(lv->t.dtype))
        return ts_fail(TS_ERR_SHAPE, "ts_compile: the loss '%s' must be a float scalar, got %s",
                       ts_value_label(g, l, lb, sizeof lb), ts_type_str(tb, sizeof tb, &lv->t));
    ts_status s;
    if (!lv->name && (s = ts_set_name(g, spec->loss, "loss")) != TS_OK) return s;
    g->values[l].is_output = 1;
    *loss = l;
    return TS_OK;
}

/* The data-parallel runtime: every collective instruction's state is the
 * runtime's one ts_dist_rt. */
static ts_status setup_dist(ts_plan *p) {
    ts_runtime *rt = &p->rt;
    if (p->prog.n_buckets <= 0) return TS_OK;
    rt->dist.tickets =
        ts_zalloc(sizeof(ts_coll_ticket) * (size_t)p->prog.n_buckets, "plan tickets");
    if (!rt->dist.tickets) return TS_ERR_NOMEM;
    rt->dist.comm = p->prog.opt.comm;
    rt->dist.n_buckets = p->prog.n_buckets;
    for (int i = 0; i < p->prog.n_ins; i++)
        if ((p->prog.ins[i].op >= TS_OP_ALLREDUCE_START &&
             p->prog.ins[i].op <= TS_OP_ZERO_FOUND_INF) ||
            (p->prog.ins[i].op >= TS_OP_COMPRESS_START && p->prog.ins[i].op <= TS_OP_PSGD_WAIT))
            rt->ins[i].k.backend = &rt->dist;
    return TS_OK;
}

/* dist.max_mem_mb: the plan's memory per process (its whole arena,
 * counting shared parameters, which the process maps too) against the
 * limit, before anything is allocated. */
static ts_status check_mem_limit(const ts_program *prog) {
    const double lim = prog->opt.max_mem_mb, mib = 1048576.0;
    const ts_arena_layout *l = &prog->layout;
    const double need = (double)l->arena_bytes / mib;
    if (lim <= 0 || need <= lim) return TS_OK;
    const int ranks = prog->opt.comm ? ts_comm_size(prog->opt.comm) : 1;
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "compile: the plan needs %.1f MiB per process (parameters %.1f, gradients "
                   "%.1f, optimizer state %.1f, inputs and outputs %.1f, temporaries %.1f; "
                   "%d process%s, dist.zero %d), more than dist.max_mem_mb = %g MiB; shard the "
                   "parameters over more processes with dist.zero: 3 (tessel train --procs N), "
                   "or split the model into pipeline stages",
                   need, (double)l->param_bytes / mib, (double)l->grad_bytes / mib,
                   (double)l->state_bytes / mib, (double)l->io_bytes / mib,
                   (double)l->temp_bytes / mib, ranks, ranks == 1 ? "" : "es", prog->opt.zero, lim);
}

/* ts_compile_keep, ts_compile_shared: share non-NULL makes a plan on
 * share's parameters, gradients and state (plan_shared.c). */
static ts_status compile_plan(const ts_graph *src, const ts_train_spec *spec,
                              const ts_compile_options *opt, const ts_plan *share, ts_plan **out,
                              ts_compiled_graph *keep) {
    if (keep) memset(keep, 0, sizeof *keep);
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
    ts_program *prog = &p->prog;
    ts_runtime *rt = &p->rt;
    ts_compiled_graph cg = {0};
    prog->opt = opt ? *opt : ts_compile_options_default();
    prog->gate_ins = -1;
    rt->last_loss = NAN;
    rt->owner = p;
    int32_t loss = -1;
    ts_status s = TS_OK;
    if (!(cg.graph = ts_graph_clone(src))) {
        s = TS_ERR_NOMEM;
        goto fail;
    }
    if ((s = take_loss(cg.graph, spec, &loss)) != TS_OK) goto fail;
    if (loss >= 0) {
        prog->spec = *spec;
        prog->spec.trainable = NULL;
    }
    ts_scaler_config scfg = ts_scaler_config_from(&prog->opt.precision);
    if (loss < 0) scfg.mode = TS_LOSS_SCALE_NONE, prog->opt.precision.loss_scale = TS_SCALE_NONE;
    if ((s = ts_scaler_config_check(&scfg)) != TS_OK) goto fail;
    if ((s = ts_precision_check(&prog->opt.precision)) != TS_OK) goto fail;
    s = compile_graph(prog, be, &cg, spec, &loss);
    prog->opt.precision.keep_fp32 = NULL; /* the caller's string: read during compile only */
    prog->opt.backend = NULL;             /* likewise */
    prog->opt.dump_after = NULL, prog->opt.dump_to = NULL, prog->opt.peft.targets = NULL;
    prog->opt.peft.adapter_after = NULL;
    if (s != TS_OK) goto fail;
    if ((s = ts_lower(prog, &cg, loss)) != TS_OK) goto fail;
    if ((s = check_mem_limit(prog)) != TS_OK) goto fail;
    if ((s = ts_render_dumps(prog, &cg)) != TS_OK) goto fail;
    if (share && (s = ts_plan_borrow_state(p, share, scfg.mode != TS_LOSS_SCALE_NONE)) != TS_OK)
        goto fail;
    if ((s = ts_arena_init(p, &cg)) != TS_OK) goto fail;
    if ((s = ts_bind(p)) != TS_OK) goto fail;
    if (scfg.mode != TS_LOSS_SCALE_NONE && (s = ts_plan_scaler_setup(p, &scfg)) != TS_OK) goto fail;
    /* oneDNN fixes a primitive's thread count when it is created: create
     * them under the count the plan will run with. */
    if (prog->opt.threads > 0) omp_set_num_threads(prog->opt.threads);
    p->backend = be; /* set first: ts_plan_free releases what a failed prepare made */
    if ((s = be->prepare(prog, rt)) != TS_OK) goto fail;
    rt->ctx.seed = prog->opt.seed;
    if ((s = setup_dist(p)) != TS_OK) goto fail;
    if (keep)
        *keep = cg;
    else
        ts_compiled_graph_free(&cg);
    *out = p;
    return TS_OK;
fail:
    ts_plan_free(p);
    if (keep)
        *keep = cg;
    else
        ts_compiled_graph_free(&cg);
    return s;
}

ts_status ts_compile_keep(const ts_graph *src, const ts_train_spec *spec,
                          const ts_compile_options *opt, ts_plan **out, ts_compiled_graph *keep) {
    return compile_plan(src, spec, opt, NULL, out, keep);
}

ts_status ts_compile_shared(const ts_graph *g, const ts_train_spec *spec,
                            const ts_compile_options *opt, const ts_plan *share, ts_plan **out) {
    if (!share) return ts_fail(TS_ERR_INVALID, "ts_compile_shared: no plan to share");
    return compile_plan(g, spec, opt, share, out, NULL);
}

ts_status ts_compile(const ts_graph *src, const ts_train_spec *spec, const ts_compile_options *opt,
                     ts_plan **out) {
    return ts_compile_keep(src, spec, opt, out, NULL);
}
