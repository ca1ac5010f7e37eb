/* Plans of one model at several shapes sharing one copy of its state
 * (plan.h: ts_compile_shared, ts_plan_swap_program): the shape buckets'
 * plans of a run all read and update the same parameters, gradients and
 * optimizer state, so switching buckets copies nothing.
 *
 * Data parallel: every plan of the model has the same gradients at the
 * same offsets, so its distribute pass cuts them into the same all-reduce
 * buckets; the gradients lie in the state owner's arena (a comm segment
 * when the owner reduces), and whichever plan steps reduces them there.
 * The ranks must run the same plan at every step (the session derives the
 * bucket from the global batch, shape_feed.c). ZeRO (sharded state or
 * gradients, shared parameters) and gradient compression (per-plan error
 * feedback) keep state outside the shared regions: refused. */
#include <string.h>
#include "plan/lower.h"

/* The named values that live in the persistent regions. */
static int persistent(const ts_named *nm) {
    return nm->kind == TS_NAMED_PARAM || nm->kind == TS_NAMED_STATE || nm->is_grad;
}

static int count_persistent(const ts_program *prog) {
    int n = 0;
    for (int i = 0; i < prog->n_named; i++) n += persistent(&prog->named[i]);
    return n;
}

ts_status ts_plan_borrow_state(ts_plan *p, const ts_plan *share, int scales_loss) {
    const ts_program *a = &p->prog, *b = &share->prog;
    const ts_arena_layout *la = &a->layout, *lb = &b->layout;
    if (a->opt.zero || b->opt.zero || a->zero_shared || b->zero_shared ||
        (share->rt.params && !share->rt.params_borrowed))
        return ts_fail(TS_ERR_UNSUPPORTED, "a plan sharing another's state: not with ZeRO yet");
    if (a->opt.compress.method || b->opt.compress.method)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "a plan sharing another's state: not with gradient compression yet");
    if ((a->n_buckets > 0) != (b->n_buckets > 0) || a->opt.comm != b->opt.comm)
        return ts_fail(TS_ERR_INVALID,
                       "a plan sharing another's state: one reduces its gradients over the "
                       "ranks and the other does not (or over another comm)");
    if (scales_loss || share->rt.scaler)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "a plan sharing another's state: not with loss scaling yet");
    if (la->param_off != 0 || lb->param_off != 0)
        return ts_fail(TS_ERR_INTERNAL, "plan sharing: the parameters must open the arena");
    const size_t span = la->state_off + la->state_bytes;
    if (la->param_bytes != lb->param_bytes || la->grad_off != lb->grad_off ||
        la->grad_bytes != lb->grad_bytes || la->state_off != lb->state_off ||
        la->state_bytes != lb->state_bytes)
        return ts_fail(TS_ERR_SHAPE,
                       "plan sharing: the persistent regions differ (parameters %zu vs %zu, "
                       "gradients %zu vs %zu, state %zu vs %zu bytes): not the same model",
                       la->param_bytes, lb->param_bytes, la->grad_bytes, lb->grad_bytes,
                       la->state_bytes, lb->state_bytes);
    if (la->io_off < span || la->temp_off < span)
        return ts_fail(TS_ERR_INTERNAL, "plan sharing: inputs or temporaries inside the state");
    if (count_persistent(a) != count_persistent(b))
        return ts_fail(TS_ERR_SHAPE, "plan sharing: %d persistent values vs %d",
                       count_persistent(a), count_persistent(b));
    for (int i = 0; i < a->n_named; i++) {
        const ts_named *x = &a->named[i];
        if (!persistent(x)) continue;
        const ts_named *y = ts_plan_find(share, x->name);
        if (!y || y->v.off != x->v.off || y->v.dtype != x->v.dtype || y->v.rank != x->v.rank ||
            memcmp(y->v.dims, x->v.dims, sizeof(int64_t) * (size_t)x->v.rank))
            return ts_fail(TS_ERR_SHAPE,
                           "plan sharing: '%s' %s in the other plan (a value whose shape "
                           "depends on the batch or sequence size cannot be shared)",
                           x->name, y ? "lies elsewhere or has another shape" : "is missing");
    }
    p->rt.params = ts_plan_at(share, 0);
    p->rt.params_span = span;
    p->rt.params_borrowed = 1;
    p->rt.arena_skip = span;
    /* Temporaries die with the step, and one plan steps at a time: they
     * go into the state owner's block when they fit. `share` is the owner
     * or a plan whose temporaries already lie in the owner's block (never
     * one with a block of its own, which eviction could free). */
    const size_t cap = share->rt.params_borrowed ? share->rt.temps_cap : lb->temp_bytes;
    const unsigned char *base =
        share->rt.params_borrowed && !share->rt.temps ? NULL : ts_plan_at(share, lb->temp_off);
    if (base && la->temp_bytes && la->temp_bytes <= cap &&
        la->temp_off + la->temp_bytes == la->arena_bytes &&
        lb->temp_off + lb->temp_bytes == lb->arena_bytes) {
        p->rt.temps = (unsigned char *)base;
        p->rt.temps_cap = cap;
    }
    return TS_OK;
}

#define SWAP(T, x, y)                                                                              \
    do {                                                                                           \
        T tmp_ = (x);                                                                              \
        (x) = (y);                                                                                 \
        (y) = tmp_;                                                                                \
    } while (0)

/* Instructions' arguments point at their plan's step context, and the
 * collectives' at its data-parallel runtime (compile.c: setup_dist), which
 * moved with them: `other`'s address now names this plan's. */
static void rebind_ctx(ts_plan *p, const ts_plan *other) {
    for (int i = 0; i < p->prog.n_ins; i++) {
        p->rt.ins[i].k.ctx = &p->rt.ctx;
        if (p->rt.ins[i].k.backend == &other->rt.dist) p->rt.ins[i].k.backend = &p->rt.dist;
    }
}

ts_status ts_plan_swap_program(ts_plan *a, ts_plan *b) {
    if (!a || !b) return ts_fail(TS_ERR_INVALID, "swap_program: NULL plan");
    if (a == b) return TS_OK;
    if (a->backend != b->backend)
        return ts_fail(TS_ERR_INVALID, "swap_program: the plans run on different backends");
    if (ts_plan_at(a, 0) != ts_plan_at(b, 0))
        return ts_fail(TS_ERR_INVALID, "swap_program: the plans do not share their state");
    if (a->rt.scaler || b->rt.scaler)
        return ts_fail(TS_ERR_UNSUPPORTED, "swap_program: not with loss scaling");
    SWAP(ts_program, a->prog, b->prog);
    ts_runtime *x = &a->rt, *y = &b->rt;
    SWAP(ts_rt_instr *, x->ins, y->ins);
    SWAP(unsigned char *, x->arena, y->arena);
    SWAP(unsigned char *, x->params, y->params);
    SWAP(size_t, x->params_span, y->params_span);
    SWAP(int, x->params_borrowed, y->params_borrowed);
    SWAP(size_t, x->arena_skip, y->arena_skip);
    SWAP(unsigned char *, x->temps, y->temps);
    SWAP(size_t, x->temps_cap, y->temps_cap);
    SWAP(int, x->arena_from_comm, y->arena_from_comm);
    SWAP(void *, x->backend_scratch, y->backend_scratch);
    SWAP(size_t, x->backend_scratch_bytes, y->backend_scratch_bytes);
    SWAP(ts_dist_rt, x->dist, y->dist);
    rebind_ctx(a, b);
    rebind_ctx(b, a);
    return TS_OK;
}
