/* The arena of a plan: allocating it, writing the first values of the
 * parameters, optimizer state and constants (from the graph, while
 * ts_compile has it), and binding the program's instructions to it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "plan/lower.h"

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

/* Values are drawn in pieces of INIT_PIECE elements (a multiple of 4: a
 * Philox counter gives four) on every thread: each is a pure function of
 * (key, index), so the bits do not depend on the pieces or the threads, and
 * no buffer of n doubles is allocated (W3's 23 M parameters and 46 M
 * moments once cost 550 MB of page faults here). */
#define INIT_PIECE 1024

typedef struct {
    ts_init_kind kind;
    double lo, hi; /* uniform [lo, hi); normal: mean lo, std hi; constant: lo */
} init_rule;

/* Elements [first, first + m) of the value, as doubles. */
static void init_piece(const init_rule *r, uint64_t key, int64_t first, int64_t m, double *out) {
    if (r->kind == TS_INIT_NORMAL)
        ts_rand_normal_f64_at(out, first, m, key, r->lo, r->hi);
    else if (r->kind == TS_INIT_UNIFORM)
        ts_rand_uniform_f64_at(out, first, m, key, r->lo, r->hi);
    else
        for (int64_t i = 0; i < m; i++) out[i] = r->lo;
}

/* Writes v's initial value at dst; dst_zeroed: dst already holds zeros (the
 * arena is zeroed first), so a zero initialisation writes nothing. */
static ts_status init_value(const ts_value *v, void *dst, uint64_t seed, int dst_zeroed) {
    int64_t n = ts_type_numel(&v->t);
    size_t bytes = ts_type_bytes(&v->t);
    if (v->data) { /* TS_INIT_BUFFER */
        memcpy(dst, v->data, bytes);
        return TS_OK;
    }
    if (v->init.kind == TS_INIT_ZEROS) { /* any dtype: all bits 0 (a weight's bf16 copy) */
        if (!dst_zeroed) memset(dst, 0, bytes);
        return TS_OK;
    }
    if (v->t.dtype != TS_F32 && v->t.dtype != TS_F64)
        return ts_fail(TS_ERR_UNSUPPORTED, "init of '%s': dtype %s not supported yet", v->name,
                       ts_dtype_name(v->t.dtype));
    uint64_t key = ts_hash_str(v->name ? v->name : "") ^ (seed * 0x9E3779B97F4A7C15ull);
    double fi, fo, a = v->init.a, b = v->init.b;
    fans(&v->t, &fi, &fo);
    /* Every kind as a normal, a uniform or a constant. */
    init_rule r = {TS_INIT_CONSTANT, 0, 0};
    switch (v->init.kind) {
    case TS_INIT_ZEROS:
    case TS_INIT_BUFFER: break;
    case TS_INIT_ONES: r.lo = 1; break;
    case TS_INIT_CONSTANT: r.lo = a; break;
    case TS_INIT_NORMAL: r = (init_rule){TS_INIT_NORMAL, a, b}; break;
    case TS_INIT_UNIFORM: r = (init_rule){TS_INIT_UNIFORM, a, b}; break;
    case TS_INIT_KAIMING_UNIFORM: {
        double bound = sqrt(3.0) * sqrt(2.0 / (1.0 + a * a)) / sqrt(fi);
        r = (init_rule){TS_INIT_UNIFORM, -bound, bound};
        break;
    }
    case TS_INIT_KAIMING_NORMAL:
        r = (init_rule){TS_INIT_NORMAL, 0, sqrt(2.0 / (1.0 + a * a)) / sqrt(fi)};
        break;
    case TS_INIT_XAVIER_UNIFORM: {
        double bound = a * sqrt(6.0 / (fi + fo));
        r = (init_rule){TS_INIT_UNIFORM, -bound, bound};
        break;
    }
    case TS_INIT_XAVIER_NORMAL:
        r = (init_rule){TS_INIT_NORMAL, 0, a * sqrt(2.0 / (fi + fo))};
        break;
    }
    if (r.kind == TS_INIT_CONSTANT && r.lo == 0 && !signbit(r.lo)) {
        /* zeros (most of the optimizer state): all bits 0 */
        if (!dst_zeroed) memset(dst, 0, bytes);
        return TS_OK;
    }
    const int f64 = v->t.dtype == TS_F64;
    const int64_t pieces = (n + INIT_PIECE - 1) / INIT_PIECE;
#pragma omp parallel for schedule(static) if (n >= 4 * INIT_PIECE)
    for (int64_t k = 0; k < pieces; k++) {
        double tmp[INIT_PIECE];
        const int64_t first = k * INIT_PIECE, m = n - first < INIT_PIECE ? n - first : INIT_PIECE;
        init_piece(&r, key, first, m, tmp);
        if (f64)
            memcpy((double *)dst + first, tmp, sizeof(double) * (size_t)m);
        else
            for (int64_t i = 0; i < m; i++) ((float *)dst)[first + i] = (float)tmp[i];
    }
    return TS_OK;
}

/* ZeRO with shared parameters: every rank learns where each peer's arena
 * lies (a fused shard update reads their gradients there). Collective. */
static ts_status exchange_arenas(ts_plan *p) {
    ts_comm *c = p->prog.opt.comm;
    ts_runtime *rt = &p->rt;
    const int n = ts_comm_size(c), me = ts_comm_rank(c);
    int64_t *base = ts_alloc(sizeof(int64_t) * (size_t)n, "plan arenas");
    rt->dist.peer_delta = ts_alloc(sizeof(ptrdiff_t) * (size_t)n, "plan arenas");
    if (!base || !rt->dist.peer_delta) {
        free(base);
        return TS_ERR_NOMEM;
    }
    base[me] = (int64_t)(intptr_t)rt->arena;
    ts_status s = ts_allgather(c, NULL, base, (size_t)n, TS_I64, TS_ALGO_NATIVE);
    for (int q = 0; q < n && s == TS_OK; q++)
        rt->dist.peer_delta[q] = (ptrdiff_t)(base[q] - base[me]);
    free(base);
    return s;
}

/* ZeRO-3: each rank's blocks of the parameters ("zero.bucket<b>.param")
 * start as the same elements of the parameters' first values, which every
 * rank computes whole (one parameter at a time) and cuts its pieces from. */
static ts_status init_zero3_blocks(ts_plan *p, const ts_graph *g) {
    const ts_program *prog = &p->prog;
    ts_status s = TS_OK;
    for (int v = 0; v < g->n_values && s == TS_OK; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_PARAM || !val->name) continue;
        unsigned char *full = NULL;
        for (int i = 0; i < prog->n_shards && s == TS_OK; i++) {
            const ts_shard_piece *pc = &prog->shards[i];
            if (pc->what[0] || strcmp(pc->param, val->name)) continue;
            const ts_named *st = ts_plan_find(p, pc->state);
            if (!st) {
                s = ts_fail(TS_ERR_INTERNAL, "plan: no state '%s'", pc->state);
                break;
            }
            if (!full) {
                if (!(full = ts_alloc(ts_type_bytes(&val->t) + 1, "ZeRO-3 init"))) {
                    s = TS_ERR_NOMEM;
                    break;
                }
                if ((s = init_value(val, full, prog->opt.seed, 0)) != TS_OK) break;
            }
            const size_t es = ts_dtype_size(val->t.dtype);
            memcpy(ts_plan_at(p, st->v.off) + (size_t)pc->state_off * es,
                   full + (size_t)pc->param_off * es, (size_t)pc->count * es);
        }
        free(full);
    }
    return s;
}

/* memset(p, 0, bytes) on every thread: most of its time is the kernel
 * faulting in fresh pages (W3's 700 MiB arena: about 0.3 CPU s here), and
 * the faults of separate pages proceed in parallel. */
static void zero_pages(void *p, size_t bytes) {
    const size_t piece = (size_t)2 << 20, pieces = (bytes + piece - 1) / piece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (size_t k = 0; k < pieces; k++)
        memset((unsigned char *)p + k * piece, 0, k + 1 < pieces ? piece : bytes - k * piece);
}

ts_status ts_arena_init(ts_plan *p, const ts_compiled_graph *cg) {
    const ts_graph *g = cg->graph;
    const ts_program *prog = &p->prog;
    ts_runtime *rt = &p->rt;
    ts_comm *comm = prog->opt.comm;
    const size_t po = prog->layout.param_off, pb = prog->layout.param_bytes;
    if (prog->zero_shared && po != 0)
        return ts_fail(TS_ERR_INTERNAL, "plan: shared parameters must open the arena");
    if (prog->zero_shared && pb > 0) {
        /* One copy of the parameters for every rank; rank 0 initialises
         * it, and the exchange below (which every rank enters only after
         * its initialisation) publishes it before any step reads it. */
        void *sp;
        ts_status s = ts_comm_alloc_shared(comm, pb, &sp);
        if (s != TS_OK) {
            ts_error_prefix("ZeRO's shared parameters (%zu bytes)", pb);
            return s;
        }
        rt->params = sp;
        rt->params_span = pb;
        rt->arena_skip = pb;
    }
    /* temporaries in another plan's block (plan_shared.c) are not allocated here */
    const size_t bytes =
        prog->layout.arena_bytes - rt->arena_skip - (rt->temps ? prog->layout.temp_bytes : 0);
    if (prog->n_buckets > 0) {
        /* On shm the gradients must lie in the shared segment for the
         * direct all-reduce to read peers' buckets in place. */
        rt->arena = ts_comm_alloc(comm, bytes);
        if (!rt->arena) {
            ts_error_prefix("plan arena of %zu bytes", bytes);
            return TS_ERR_NOMEM;
        }
        rt->arena_from_comm = 1;
    } else {
        rt->arena = ts_aligned_alloc(bytes, "plan arena");
        if (!rt->arena) return TS_ERR_NOMEM;
    }
    const int owner = !rt->params || (!rt->params_borrowed && ts_comm_rank(comm) == 0);
    zero_pages(rt->arena, bytes);
    if (owner && rt->params) zero_pages(rt->params, pb);
    for (int v = 0; v < g->n_values; v++) {
        const ts_value *val = &g->values[v];
        if (cg->mp.off[v] == SIZE_MAX) continue;
        /* A plan sharing another's state (plan_shared.c) keeps its values. */
        if (rt->params_borrowed && cg->mp.off[v] - po < rt->params_span) continue;
        unsigned char *dst = ts_plan_at(p, cg->mp.off[v]);
        if (!owner && cg->mp.off[v] - po < pb) continue; /* rank 0 initialises the shared ones */
        if (val->kind == TS_VK_CONST) memcpy(dst, val->data, ts_type_bytes(&val->t));
        /* ZeRO-3: a gathered parameter lives in the temporaries */
        if (val->kind == TS_VK_PARAM && cg->mp.off[v] >= prog->layout.temp_off) continue;
        if (val->kind == TS_VK_PARAM || val->kind == TS_VK_STATE) {
            ts_status s = init_value(val, dst, prog->opt.seed, 1);
            if (s != TS_OK) return s;
        }
    }
    ts_status s = init_zero3_blocks(p, g);
    if (s != TS_OK) return s;
    if (!rt->params_borrowed) ts_plan_refresh_copies(p, SIZE_MAX); /* a sharer's are the owner's */
    return prog->zero_shared ? exchange_arenas(p) : TS_OK;
}

static void bind_tensor(ts_tensor *t, const ts_operand *o, unsigned char *data) {
    t->dtype = o->dtype;
    t->rank = o->rank;
    memcpy(t->dims, o->dims, sizeof t->dims);
    t->data = data;
}

ts_status ts_bind(ts_plan *p) {
    const ts_program *prog = &p->prog;
    ts_runtime *rt = &p->rt;
    rt->ins = ts_zalloc(sizeof(ts_rt_instr) * (size_t)(prog->n_ins + 1), "plan runtime");
    if (!rt->ins) return TS_ERR_NOMEM;
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        ts_rt_instr *r = &rt->ins[i];
        r->in = ts_alloc(sizeof(ts_tensor) * (size_t)(in->n_in + 1), "plan instruction");
        if (!r->in) return TS_ERR_NOMEM;
        for (int j = 0; j < in->n_in; j++)
            bind_tensor(&r->in[j], &in->in[j], ts_plan_at(p, in->in[j].off));
        for (int j = 0; j < in->n_out; j++)
            bind_tensor(&r->out[j], &in->out[j], ts_plan_at(p, in->out[j].off));
        r->fn = in->kernel;
        r->k = (ts_kargs){.a = &in->a,
                          .n_in = in->n_in,
                          .n_out = in->n_out,
                          .in = r->in,
                          .out = r->out,
                          .scratch = in->scratch_bytes ? ts_plan_at(p, in->scratch_off) : NULL,
                          .scratch_bytes = in->scratch_bytes,
                          .ctx = &rt->ctx,
                          .label = in->label,
                          .backend = NULL};
    }
    return TS_OK;
}
