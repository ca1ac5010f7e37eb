/* The public run-time API of a plan: feeding inputs, stepping, reading and
 * writing named values, statistics and dumps. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "plan/plan.h"
#include "plan/scaler.h"

const ts_named *ts_plan_find(const ts_plan *p, const char *name) {
    for (int i = 0; p && name && i < p->prog.n_named; i++)
        if (strcmp(p->prog.named[i].name, name) == 0) return &p->prog.named[i];
    return NULL;
}

/* A device backend's values reach the host arena only when asked
 * (backend.h, to_host): before the plan reads [off, off + bytes). The
 * plan is const to readers; its runtime mirror is not. */
static ts_status sync_host(const ts_plan *p, size_t off, size_t bytes) {
    if (!p->backend || !p->backend->to_host || !bytes) return TS_OK;
    return p->backend->to_host(&p->prog, (ts_runtime *)&p->rt, off, bytes);
}

static ts_status find_sized(const ts_plan *p, const char *what, const char *name, size_t bytes,
                            const ts_named **out) {
    if (!p) return ts_fail(TS_ERR_INVALID, "%s: plan is NULL", what);
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm) return ts_fail(TS_ERR_NOT_FOUND, "%s: no value named '%s'", what, name ? name : "");
    size_t need = ts_operand_bytes(&nm->v);
    if (bytes != need) {
        char tb[128];
        return ts_fail(TS_ERR_INVALID, "%s '%s': %zu bytes given, %s needs %zu", what, name, bytes,
                       ts_shape_str(tb, sizeof tb, nm->v.dtype, nm->v.rank, nm->v.dims), need);
    }
    *out = nm;
    return TS_OK;
}

ts_status ts_plan_set_input(ts_plan *p, const char *name, const void *data, size_t bytes) {
    const ts_named *nm = NULL;
    ts_status s = find_sized(p, "set_input", name, bytes, &nm);
    if (s != TS_OK) return s;
    if (nm->kind != TS_NAMED_INPUT)
        return ts_fail(TS_ERR_INVALID, "set_input: '%s' is not an input", name);
    if (!data) return ts_fail(TS_ERR_INVALID, "set_input '%s': data is NULL", name);
    memcpy(ts_plan_at(p, nm->v.off), data, bytes);
    return TS_OK;
}

ts_status ts_plan_step(ts_plan *p) {
    if (!p) return ts_fail(TS_ERR_INVALID, "step: plan is NULL");
    p->rt.ctx.step = p->rt.steps_done + 1;
    p->rt.ctx.opt_step = p->rt.updates_applied + 1;
    p->rt.ctx.lr = ts_lr_at(&p->prog.spec.schedule, p->prog.spec.opt.lr, p->rt.ctx.step);
    if (p->prog.opt.threads > 0) omp_set_num_threads(p->prog.opt.threads);
    if (p->rt.copies_stale) ts_plan_refresh_copies(p, SIZE_MAX);
    int skipped = 0;
    ts_status s = p->backend->execute(&p->prog, &p->rt, &skipped);
    if (s != TS_OK) return s;
    p->rt.last_skipped = skipped;
    if (p->rt.scaler) ts_plan_scaler_after_step(p);
    if (p->prog.gate_ins >= 0 && !skipped) p->rt.updates_applied++;
    if (p->prog.has_loss) {
        const unsigned char *l = ts_plan_at(p, p->prog.loss_off);
        p->rt.last_loss =
            p->prog.loss_dtype == TS_F64 ? *(const double *)l : (double)*(const float *)l;
    }
    p->rt.steps_done++;
    return TS_OK;
}

void ts_plan_set_trace(ts_plan *p, struct ts_trace *t) {
    if (p) p->rt.trace = t;
}

double ts_plan_loss(const ts_plan *p) {
    return p ? p->rt.last_loss : NAN;
}
int64_t ts_plan_step_count(const ts_plan *p) {
    return p ? p->rt.steps_done : 0;
}
void ts_plan_set_step(ts_plan *p, int64_t steps_done) {
    if (p && steps_done >= 0) {
        p->rt.steps_done = steps_done;
        p->rt.updates_applied = p->prog.gate_ins >= 0 ? steps_done : 0;
    }
}

void ts_plan_set_update_gate(ts_plan *p, ts_update_gate_fn fn, void *user) {
    if (!p) return;
    if (p->rt.scaler) { /* the loss scaler stays the gate and asks fn too */
        p->rt.scaler->next_fn = fn;
        p->rt.scaler->next_user = fn ? user : NULL;
        return;
    }
    p->rt.gate_fn = fn;
    p->rt.gate_user = fn ? user : NULL;
}
int64_t ts_plan_updates_applied(const ts_plan *p) {
    return p ? p->rt.updates_applied : 0;
}
void ts_plan_set_updates_applied(ts_plan *p, int64_t n) {
    if (p && n >= 0 && p->prog.gate_ins >= 0) p->rt.updates_applied = n;
}
int ts_plan_last_step_skipped(const ts_plan *p) {
    return p ? p->rt.last_skipped : 0;
}
double ts_plan_lr(const ts_plan *p) {
    return p ? ts_lr_at(&p->prog.spec.schedule, p->prog.spec.opt.lr, p->rt.steps_done + 1) : NAN;
}

/* ZeRO-3: a parameter gathered per bucket lives in the temporaries
 * (memplan); between steps only the ranks' blocks hold it. */
static int zero3_param(const ts_plan *p, const ts_named *nm) {
    return nm->kind == TS_NAMED_PARAM && p->prog.layout.zero_param_bytes > 0 &&
           nm->v.off >= p->prog.layout.temp_off;
}

ts_status ts_plan_read(const ts_plan *p, const char *name, void *dst, size_t bytes) {
    const ts_named *nm = NULL;
    ts_status s = find_sized(p, "read", name, bytes, &nm);
    if (s != TS_OK) return s;
    if (!dst) return ts_fail(TS_ERR_INVALID, "read '%s': dst is NULL", name);
    if (nm->is_grad && p->prog.layout.zero_grad_bytes > 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "read '%s': under ZeRO-2 (dist.zero 2) a gradient lives only until its "
                       "bucket's reduce-scatter; read the gradient monitors instead",
                       name);
    if (zero3_param(p, nm))
        return ts_fail(
            TS_ERR_UNSUPPORTED,
            "read '%s': under ZeRO-3 (dist.zero 3) a parameter lives as every rank's "
            "block of its bucket between steps; read the blocks ('zero.bucket<b>.param', "
            "placed by ts_plan_shard_layout) or save a checkpoint",
            name);
    if ((s = sync_host(p, nm->v.off, bytes)) != TS_OK) return s;
    memcpy(dst, ts_plan_at(p, nm->v.off), bytes);
    return TS_OK;
}

ts_status ts_plan_write_param(ts_plan *p, const char *name, const void *src, size_t bytes) {
    const ts_named *nm = NULL;
    ts_status s = find_sized(p, "write_param", name, bytes, &nm);
    if (s != TS_OK) return s;
    if (nm->kind != TS_NAMED_PARAM && nm->kind != TS_NAMED_STATE)
        return ts_fail(TS_ERR_INVALID, "write_param: '%s' is not a parameter or state", name);
    if (zero3_param(p, nm))
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "write_param '%s': under ZeRO-3 (dist.zero 3) write the rank's blocks "
                       "('zero.bucket<b>.param', ts_plan_shard_layout) or load a checkpoint",
                       name);
    if (!src) return ts_fail(TS_ERR_INVALID, "write_param '%s': src is NULL", name);
    unsigned char *dst = ts_plan_at(p, nm->v.off);
    /* Shared parameters (ZeRO on shm): every rank restores the same
     * values; once one rank wrote them the others find them in place and
     * leave the memory a peer may already read alone. */
    if (p->rt.params && nm->v.off - p->prog.layout.param_off < p->prog.layout.param_bytes &&
        memcmp(dst, src, bytes) == 0)
        return TS_OK;
    memcpy(dst, src, bytes);
    if (nm->kind == TS_NAMED_PARAM) ts_plan_refresh_copies(p, nm->v.off);
    if (p->backend && p->backend->to_device)
        return p->backend->to_device(&p->prog, &p->rt, nm->v.off, bytes);
    return TS_OK;
}

ts_status ts_plan_value_info(const ts_plan *p, const char *name, ts_dtype *dt, int *rank,
                             int64_t *dims) {
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm) return ts_fail(TS_ERR_NOT_FOUND, "value_info: no value named '%s'", name ? name : "");
    if (dt) *dt = nm->v.dtype;
    if (rank) *rank = nm->v.rank;
    if (dims) memcpy(dims, nm->v.dims, sizeof(int64_t) * (size_t)nm->v.rank);
    return TS_OK;
}

int ts_plan_param_count(const ts_plan *p) {
    int n = 0;
    for (int i = 0; p && i < p->prog.n_named; i++) n += p->prog.named[i].kind == TS_NAMED_PARAM;
    return n;
}

const char *ts_plan_param_name(const ts_plan *p, int idx) {
    for (int i = 0, k = 0; p && i < p->prog.n_named; i++)
        if (p->prog.named[i].kind == TS_NAMED_PARAM && k++ == idx) return p->prog.named[i].name;
    return NULL;
}

ts_status ts_plan_get_stats(const ts_plan *p, ts_plan_stats *st) {
    if (!p || !st) return ts_fail(TS_ERR_INVALID, "get_stats: NULL argument");
    memset(st, 0, sizeof *st);
    st->arena_bytes = p->prog.layout.arena_bytes - p->rt.arena_skip -
                      (p->rt.temps ? p->prog.layout.temp_bytes : 0);
    st->shared_param_bytes =
        p->rt.params && !p->rt.params_borrowed ? p->prog.layout.param_bytes : 0;
    st->param_bytes = p->prog.layout.param_bytes;
    st->grad_bytes = p->prog.layout.grad_bytes;
    st->state_bytes = p->prog.layout.state_bytes;
    st->io_bytes = p->prog.layout.io_bytes;
    st->temp_bytes = p->prog.layout.temp_bytes;
    st->naive_bytes = p->prog.layout.naive_bytes;
    st->peak_live_bytes = p->prog.layout.peak_live;
    st->naive_peak_bytes = p->prog.layout.naive_peak;
    st->n_recomputed = p->prog.layout.n_recomputed;
    st->recompute_flops = p->prog.layout.recompute_flops;
    st->arena_no_recompute_bytes = p->prog.layout.arena_no_recompute;
    st->schedule = p->prog.layout.schedule ? p->prog.layout.schedule : "build order";
    st->n_instructions = p->prog.n_ins;
    st->n_inplace = p->prog.layout.n_inplace;
    st->flops_per_step = p->prog.flops;
    st->operand_bytes_per_step = 0;
    for (int i = 0; i < p->prog.n_ins; i++) {
        const ts_instr *in = &p->prog.ins[i];
        for (int j = 0; j < in->n_out; j++)
            st->operand_bytes_per_step += ts_operand_bytes(&in->out[j]);
        for (int j = 0; j < in->n_in; j++) {
            int dup = 0; /* an operand read twice (mul(x, x)) is read once */
            for (int q = 0; q < j; q++) dup |= in->in[q].off == in->in[j].off;
            if (!dup) st->operand_bytes_per_step += ts_operand_bytes(&in->in[j]);
        }
    }
    st->zero_grad_bytes = p->prog.layout.zero_grad_bytes;
    st->zero_grad_peak = p->prog.layout.zero_grad_peak;
    st->zero_shard_bytes = p->prog.layout.zero_shard_bytes;
    st->zero_param_bytes = p->prog.layout.zero_param_bytes;
    st->zero_param_peak = p->prog.layout.zero_param_peak;
    return TS_OK;
}

/* The i-th persistent value: parameters first, then state, each in value
 * order (which memplan also uses for their offsets). */
static const ts_named *persistent_at(const ts_plan *p, int idx) {
    for (int pass = 0, k = 0; p && pass < 2; pass++) {
        ts_named_kind want = pass == 0 ? TS_NAMED_PARAM : TS_NAMED_STATE;
        for (int i = 0; i < p->prog.n_named; i++)
            if (p->prog.named[i].kind == want && !zero3_param(p, &p->prog.named[i]) && k++ == idx)
                return &p->prog.named[i];
    }
    return NULL;
}

/* ZeRO-3's gathered parameters are not persistent: their blocks
 * ("zero.bucket<b>.param", state) are. */
int ts_plan_persistent_count(const ts_plan *p) {
    int n = 0;
    for (int i = 0; p && i < p->prog.n_named; i++)
        n += (p->prog.named[i].kind == TS_NAMED_PARAM && !zero3_param(p, &p->prog.named[i])) ||
             p->prog.named[i].kind == TS_NAMED_STATE;
    return n;
}

ts_status ts_plan_persistent(const ts_plan *p, int i, ts_persistent *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "persistent: NULL argument");
    const ts_named *nm = persistent_at(p, i);
    if (!nm)
        return ts_fail(TS_ERR_INVALID, "persistent: index %d out of range [0, %d)", i,
                       ts_plan_persistent_count(p));
    memset(out, 0, sizeof *out);
    out->name = nm->name;
    out->is_state = nm->kind == TS_NAMED_STATE;
    out->dtype = nm->v.dtype;
    out->rank = nm->v.rank;
    memcpy(out->dims, nm->v.dims, sizeof(int64_t) * (size_t)nm->v.rank);
    out->bytes = ts_operand_bytes(&nm->v);
    out->snapshot_off = out->is_state
                            ? p->prog.layout.param_bytes + (nm->v.off - p->prog.layout.state_off)
                            : nm->v.off - p->prog.layout.param_off;
    return TS_OK;
}

size_t ts_plan_snapshot_bytes(const ts_plan *p) {
    return p ? p->prog.layout.param_bytes + p->prog.layout.state_bytes : 0;
}

/* Copy in 4 MiB blocks over the plan's threads: one thread alone does not
 * reach the memory bandwidth, and this copy is the whole stall an
 * asynchronous checkpoint adds to a step. */
static void copy_blocks(unsigned char *dst, const unsigned char *src, size_t n) {
    const size_t blk = (size_t)4 << 20;
    const int64_t nb = (int64_t)((n + blk - 1) / blk);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        size_t o = (size_t)b * blk, len = n - o < blk ? n - o : blk;
        memcpy(dst + o, src + o, len);
    }
}

ts_status ts_plan_device_info(const ts_plan *p, ts_device_info *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "device_info: NULL argument");
    if (!p->backend->device_info)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "device_info: the plan runs on the %s backend, not a GPU", p->backend->name);
    return p->backend->device_info(&p->prog, &p->rt, out);
}

ts_status ts_plan_snapshot(const ts_plan *p, void *dst, size_t bytes) {
    if (!p || !dst) return ts_fail(TS_ERR_INVALID, "snapshot: NULL argument");
    if (bytes != ts_plan_snapshot_bytes(p))
        return ts_fail(TS_ERR_INVALID, "snapshot: %zu bytes given, the persistent values need %zu",
                       bytes, ts_plan_snapshot_bytes(p));
    ts_status s = sync_host(p, p->prog.layout.param_off, p->prog.layout.param_bytes);
    if (s == TS_OK) s = sync_host(p, p->prog.layout.state_off, p->prog.layout.state_bytes);
    if (s != TS_OK) return s;
    if (p->prog.opt.threads > 0) omp_set_num_threads(p->prog.opt.threads);
    copy_blocks(dst, ts_plan_at(p, p->prog.layout.param_off), p->prog.layout.param_bytes);
    copy_blocks((unsigned char *)dst + p->prog.layout.param_bytes,
                ts_plan_at(p, p->prog.layout.state_off), p->prog.layout.state_bytes);
    return TS_OK;
}

ts_status ts_plan_snapshot_regions(const ts_plan *p, const void **params, const void **state,
                                   size_t *split) {
    if (!p || !params || !state || !split)
        return ts_fail(TS_ERR_INVALID, "snapshot regions: NULL argument");
    *params = ts_plan_at(p, p->prog.layout.param_off);
    *state = ts_plan_at(p, p->prog.layout.state_off);
    *split = p->prog.layout.param_bytes;
    return TS_OK;
}

uint64_t ts_plan_seed(const ts_plan *p) {
    return p ? p->prog.opt.seed : 0;
}

ts_status ts_plan_grad_norm(const ts_plan *p, double *norm) {
    if (!p || !norm) return ts_fail(TS_ERR_INVALID, "grad_norm: NULL argument");
    double sum = 0;
    const int nm = ts_plan_monitor_count(p);
    if (nm > 0) {
        for (int i = 0; i < nm; i++) {
            ts_grad_monitor m;
            ts_status s = ts_plan_monitor(p, i, &m);
            if (s != TS_OK) return s;
            sum += m.sumsq;
        }
        *norm = sqrt(sum);
        return TS_OK;
    }
    if (p->prog.spec.fused_update)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "grad_norm: with optim.fused_update each gradient is gone once its update "
                       "ran; compile with ts_compile_options.monitors to get their norm");
    if (p->prog.layout.zero_grad_bytes > 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "grad_norm: under ZeRO-2 (dist.zero 2) the gradients are gone after the "
                       "step; compile with ts_compile_options.monitors to get their norm");
    for (int i = 0; i < p->prog.n_named; i++) {
        const ts_named *nm = &p->prog.named[i];
        if (!nm->is_grad) continue;
        int64_t n = ts_shape_numel(nm->v.rank, nm->v.dims);
        ts_status s = sync_host(p, nm->v.off, ts_operand_bytes(&nm->v));
        if (s != TS_OK) return s;
        const void *x = ts_plan_at(p, nm->v.off);
        if (nm->v.dtype == TS_F32)
            for (int64_t j = 0; j < n; j++)
                sum += (double)((const float *)x)[j] * ((const float *)x)[j];
        else if (nm->v.dtype == TS_F64)
            for (int64_t j = 0; j < n; j++) sum += ((const double *)x)[j] * ((const double *)x)[j];
        else
            return ts_fail(TS_ERR_UNSUPPORTED, "grad_norm: gradient '%s' has dtype %s", nm->name,
                           ts_dtype_name(nm->v.dtype));
    }
    *norm = sqrt(sum);
    return TS_OK;
}
