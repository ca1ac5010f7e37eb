/* The CPU executor: runs a plan's instructions in order. Each kernel gets
 * its tensors, scratch and the step context; nothing is allocated. With
 * ts_compile_options.profile it also times every instruction. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"

/* Index of the first non-finite element of a float tensor, or -1. */
static int64_t first_nonfinite(const ts_tensor *t) {
    int64_t n = ts_tensor_numel(t);
    if (t->dtype == TS_F32) {
        const float *x = t->data;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i])) return i;
    } else if (t->dtype == TS_F64) {
        const double *x = t->data;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i])) return i;
    }
    return -1;
}

static inline ts_status run_one(ts_plan *p, int i) {
    ts_instr *in = &p->ins[i];
    ts_kargs k = {&in->a,      in->n_in,          in->n_out, in->in,    in->out,
                  in->scratch, in->scratch_bytes, &p->ctx,   in->label, in->backend};
    ts_status s = in->fn(&k);
    if (s != TS_OK) {
        ts_error_prefix("step %lld, instruction %d (%s)", (long long)p->ctx.step, i,
                        ts_op_get(in->op)->name);
        return s;
    }
    if (p->opt.debug_nan) {
        for (int j = 0; j < in->n_out; j++) {
            int64_t e = first_nonfinite(&in->out[j]);
            if (e >= 0)
                return ts_fail(TS_ERR_NUMERIC,
                               "step %lld: '%s' (output %d of %s) holds a non-finite value "
                               "at element %lld: the first value in the step to do so",
                               (long long)p->ctx.step, in->label, j, ts_op_get(in->op)->name,
                               (long long)e);
        }
    }
    return TS_OK;
}

/* Instructions [lo, hi); with skip_update the update-phase ones are left
 * out. Two loops rather than a test per instruction: without profiling the
 * step never reads the clock. */
static ts_status run_range(ts_plan *p, int lo, int hi, int skip_update) {
    if (!p->opt.profile) {
        for (int i = lo; i < hi; i++) {
            if (skip_update && (ts_op_get(p->ins[i].op)->flags & TS_OPF_UPDATE)) continue;
            ts_status s = run_one(p, i);
            if (s != TS_OK) return s;
        }
        return TS_OK;
    }
    for (int i = lo; i < hi; i++) {
        if (skip_update && (ts_op_get(p->ins[i].op)->flags & TS_OPF_UPDATE)) continue;
        double t0 = omp_get_wtime();
        ts_status s = run_one(p, i);
        p->ins[i].prof_seconds += omp_get_wtime() - t0;
        p->ins[i].prof_calls++;
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

ts_status ts_cpu_execute(ts_plan *p, int *skipped) {
    *skipped = 0;
    if (p->gate_ins < 0 || !p->gate_fn) return run_range(p, 0, p->n_ins, 0);
    ts_status s = run_range(p, 0, p->gate_ins, 0);
    if (s != TS_OK) return s;
    ts_gate_decision d = TS_GATE_APPLY;
    if ((s = p->gate_fn(p, p->gate_user, &d)) != TS_OK) {
        ts_error_prefix("step %lld, update gate", (long long)p->ctx.step);
        return s;
    }
    if (d != TS_GATE_APPLY && d != TS_GATE_SKIP)
        return ts_fail(TS_ERR_INVALID, "step %lld: the update gate returned %d (not a decision)",
                       (long long)p->ctx.step, (int)d);
    *skipped = d == TS_GATE_SKIP;
    return run_range(p, p->gate_ins, p->n_ins, *skipped);
}

/* ---- the profile, per op kind ------------------------------------------- */

static int by_time(const void *a, const void *b) {
    const ts_profile_entry *x = a, *y = b;
    if (x->seconds != y->seconds) return x->seconds < y->seconds ? 1 : -1;
    return (x->op > y->op) - (x->op < y->op); /* stable order for equal times */
}

int ts_plan_profile(const ts_plan *p, ts_profile_entry *out, int max) {
    if (!p) return ts_fail(TS_ERR_INVALID, "profile: plan is NULL"), -1;
    if (!p->opt.profile)
        return ts_fail(TS_ERR_INVALID, "profile: the plan was compiled without "
                                       "ts_compile_options.profile"),
               -1;
    ts_profile_entry all[TS_OP_COUNT] = {{0}};
    for (int i = 0; i < p->n_ins; i++) {
        const ts_instr *in = &p->ins[i];
        ts_profile_entry *e = &all[in->op];
        e->op = ts_op_get(in->op)->name;
        e->seconds += in->prof_seconds;
        e->calls += in->prof_calls;
        e->instructions++;
        e->flops += in->flops;
        /* By name, so conv ops count wherever their family defines them. */
        e->is_gemm = in->op == TS_OP_MATMUL || !strncmp(e->op, "conv", 4);
    }
    int n = 0;
    for (int op = 0; op < TS_OP_COUNT; op++)
        if (all[op].instructions) all[n++] = all[op];
    qsort(all, (size_t)n, sizeof all[0], by_time);
    for (int i = 0; out && i < n && i < max; i++) out[i] = all[i];
    return n;
}

void ts_plan_profile_reset(ts_plan *p) {
    for (int i = 0; p && i < p->n_ins; i++) p->ins[i].prof_seconds = 0, p->ins[i].prof_calls = 0;
}
