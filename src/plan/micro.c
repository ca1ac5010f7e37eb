/* Access to a plan's gradient region, forward-written state, step seed and
 * update gate for micro-batched steps. See micro.h. */
#include "plan/micro.h"
#include <stdlib.h>
#include "core/core.h"
#include "plan/plan.h"
#include "plan/scaler.h"

ts_status ts_plan_grad_region(ts_plan *p, float **g, size_t *n) {
    if (!p || !g || !n) return ts_fail(TS_ERR_INVALID, "grad_region: NULL argument");
    const ts_arena_layout *l = &p->prog.layout;
    if (l->zero_grad_bytes > 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "grad_region: under ZeRO-2 the gradients have no region of their own");
    if (!p->prog.has_loss || l->grad_bytes == 0)
        return ts_fail(TS_ERR_INVALID, "grad_region: the plan computes no gradients");
    for (int i = 0; i < p->prog.n_named; i++) {
        const ts_named *nm = &p->prog.named[i];
        if (nm->is_grad && nm->v.dtype != TS_F32)
            return ts_fail(TS_ERR_UNSUPPORTED, "grad_region: gradient '%s' is %s, not f32",
                           nm->name, ts_dtype_name(nm->v.dtype));
        if (nm->is_grad && (nm->v.off < l->grad_off ||
                            nm->v.off + ts_operand_bytes(&nm->v) > l->grad_off + l->grad_bytes))
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "grad_region: gradient '%s' lies outside the gradient region", nm->name);
    }
    if (l->grad_bytes % sizeof(float))
        return ts_fail(TS_ERR_INTERNAL, "grad_region: %zu bytes is not a number of floats",
                       l->grad_bytes);
    *g = (float *)ts_plan_at(p, l->grad_off);
    *n = l->grad_bytes / sizeof(float);
    return TS_OK;
}

static int overlaps(const ts_operand *o, size_t off, size_t bytes) {
    return o->off < off + bytes && off < o->off + ts_operand_bytes(o);
}

/* Moves the tensors of instructions [lo, hi) that lie in [from, from + n floats) to the same
 * offsets at `to`. */
static void bind_range(ts_plan *p, int lo, int hi, const float *from, size_t n, float *to) {
    const unsigned char *beg = (const unsigned char *)from, *end = beg + n * sizeof(float);
    unsigned char *dst = (unsigned char *)to;
    for (int i = lo; i < hi; i++) {
        ts_rt_instr *r = &p->rt.ins[i];
        for (int j = 0; j < r->k.n_in + r->k.n_out; j++) {
            ts_tensor *t = j < r->k.n_in ? &r->in[j] : &r->out[j - r->k.n_in];
            const unsigned char *d = t->data;
            if (d >= beg && d < end) t->data = dst + (d - beg);
        }
    }
}

ts_status ts_plan_bind_grads(ts_plan *p, const float *from, float *to) {
    float *own;
    size_t n;
    if (!p || !from || !to) return ts_fail(TS_ERR_INVALID, "bind_grads: NULL argument");
    ts_status s = ts_plan_grad_region(p, &own, &n);
    if (s != TS_OK) return s;
    if (p->prog.gate_ins < 0)
        return ts_fail(TS_ERR_INVALID, "bind_grads: the plan has no update gate to bind before");
    bind_range(p, 0, p->prog.gate_ins, from, n, to);
    return TS_OK;
}

/* Ops after the gate that only read the gradients they take (each writes parameters, optimizer
 * state or a coefficient, never a gradient). */
static int reads_grads_only(int op) {
    return op == TS_OP_SGD_UPDATE || op == TS_OP_ADAM_UPDATE || op == TS_OP_SHARD_UPDATE ||
           op == TS_OP_CLIP_COEF;
}

ts_status ts_plan_bind_update_grads(ts_plan *p, const float *from, float *to) {
    float *own;
    size_t n;
    if (!p || !from || !to) return ts_fail(TS_ERR_INVALID, "bind_update_grads: NULL argument");
    ts_status s = ts_plan_grad_region(p, &own, &n);
    if (s != TS_OK) return s;
    const ts_program *prog = &p->prog;
    if (prog->gate_ins < 0)
        return ts_fail(TS_ERR_INVALID, "bind_update_grads: the plan has no update gate");
    const size_t off = prog->layout.grad_off, bytes = n * sizeof(float);
    for (int i = prog->gate_ins; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        for (int j = 0; j < in->n_out; j++)
            if (overlaps(&in->out[j], off, bytes))
                return ts_fail(TS_ERR_UNSUPPORTED,
                               "bind_update_grads: instruction %d (%s, after the update gate) "
                               "writes into the gradient region",
                               i, in->label ? in->label : in->name);
        for (int j = 0;
             !reads_grads_only(in->op) && (in->flags & TS_OPF_SIDE_EFFECT) && j < in->n_in; j++)
            if (overlaps(&in->in[j], off, bytes))
                return ts_fail(TS_ERR_UNSUPPORTED,
                               "bind_update_grads: instruction %d (%s, after the update gate) "
                               "may update the gradient region in place",
                               i, in->label ? in->label : in->name);
    }
    bind_range(p, prog->gate_ins, prog->n_ins, from, n, to);
    return TS_OK;
}

static ts_status monitor_off(const ts_kargs *k) {
    (void)k;
    return TS_OK;
}

ts_status ts_plan_hold_monitors(ts_plan *p, int hold) {
    if (!p) return ts_fail(TS_ERR_INVALID, "hold_monitors: NULL plan");
    ts_runtime *rt = &p->rt;
    /* kept once allocated: held_fns[i] non-NULL while instruction i is held */
    if (hold && !rt->held_fns &&
        !(rt->held_fns =
              ts_zalloc(sizeof *rt->held_fns * (size_t)(p->prog.n_ins + 1), "held monitors")))
        return TS_ERR_NOMEM;
    for (int i = 0; rt->held_fns && i < p->prog.n_ins; i++) {
        if (!(p->prog.ins[i].flags & TS_OPF_MONITOR)) continue;
        if (hold && !rt->held_fns[i]) {
            rt->held_fns[i] = rt->ins[i].fn;
            rt->ins[i].fn = monitor_off;
        } else if (!hold && rt->held_fns[i]) {
            rt->ins[i].fn = rt->held_fns[i];
            rt->held_fns[i] = NULL;
        }
    }
    return TS_OK;
}

/* Does an instruction before the gate write the bytes [off, off + bytes)?
 * As an output, or as an input of an op with side effects, which updates
 * it in place (BatchNorm's running statistics). */
static int written_before_gate(const ts_program *prog, size_t off, size_t bytes) {
    const int end = prog->gate_ins >= 0 ? prog->gate_ins : prog->n_ins;
    for (int i = 0; i < end; i++) {
        const ts_instr *in = &prog->ins[i];
        for (int j = 0; j < in->n_out; j++)
            if (overlaps(&in->out[j], off, bytes)) return 1;
        for (int j = 0; (in->flags & TS_OPF_SIDE_EFFECT) && j < in->n_in; j++)
            if (overlaps(&in->in[j], off, bytes)) return 1;
    }
    return 0;
}

int ts_plan_fwd_states(ts_plan *p, ts_plan_fwd_state *out, int max) {
    int n = 0;
    for (int i = 0; p && i < p->prog.n_named; i++) {
        const ts_named *nm = &p->prog.named[i];
        if (nm->kind != TS_NAMED_STATE) continue;
        const size_t bytes = ts_operand_bytes(&nm->v);
        if (!written_before_gate(&p->prog, nm->v.off, bytes)) continue;
        /* the loss scaler's values change once per batch (ts_plan_scaler_hold), not per
         * micro-batch: not state to average */
        const ts_plan_scaler *sc = p->rt.scaler;
        if (sc && (nm->v.off == sc->scale_off || nm->v.off == sc->tracker_off ||
                   nm->v.off == sc->found_off))
            continue;
        if (nm->v.dtype != TS_F32) {
            ts_fail(TS_ERR_UNSUPPORTED, "state '%s' written by the forward pass is %s, not f32",
                    nm->name, ts_dtype_name(nm->v.dtype));
            return -1;
        }
        if (n < max)
            out[n] = (ts_plan_fwd_state){nm->name, (float *)ts_plan_at(p, nm->v.off),
                                         bytes / sizeof(float)};
        n++;
    }
    return n;
}

int ts_plan_grads(ts_plan *p, ts_plan_fwd_state *out, int max) {
    int n = 0;
    for (int i = 0; p && i < p->prog.n_named; i++) {
        const ts_named *nm = &p->prog.named[i];
        if (!nm->is_grad || nm->v.dtype != TS_F32) continue;
        if (n < max)
            out[n] = (ts_plan_fwd_state){nm->name, (float *)ts_plan_at(p, nm->v.off),
                                         ts_operand_bytes(&nm->v) / sizeof(float)};
        n++;
    }
    return n;
}

void ts_plan_set_seed(ts_plan *p, uint64_t seed) {
    if (p) p->rt.ctx.seed = seed;
}

void ts_plan_get_update_gate(const ts_plan *p, ts_update_gate_fn *fn, void **user) {
    if (p && p->rt.scaler) { /* ts_plan_set_update_gate replaces the scaler's next */
        *fn = p->rt.scaler->next_fn;
        *user = p->rt.scaler->next_user;
        return;
    }
    *fn = p ? p->rt.gate_fn : NULL;
    *user = p ? p->rt.gate_user : NULL;
}

int ts_plan_scaler_hold(ts_plan *p, int hold) {
    if (!p || !p->rt.scaler) return 0;
    p->rt.scaler->hold = hold != 0;
    return 1;
}

void ts_plan_set_found_inf(ts_plan *p, int found) {
    if (p && p->rt.scaler) *(float *)ts_plan_at(p, p->rt.scaler->found_off) = found ? 1.0f : 0.0f;
}
