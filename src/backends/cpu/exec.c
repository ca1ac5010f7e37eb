/* The CPU executor: runs a plan's instructions in order. Each kernel gets
 * its tensors, scratch and the step context; nothing is allocated. With
 * ts_compile_options.profile it also times every instruction. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "obs/trace.h"
#include "backends/cpu/cpu.h"

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
 * out. Separate loops rather than a test per instruction: without profiling
 * or a trace the step never reads the clock. */
static ts_status run_range(ts_plan *p, int lo, int hi, int skip_update) {
    if (p->trace) {
        /* A timeline (--trace): one span per instruction. */
        for (int i = lo; i < hi; i++) {
            if (skip_update && (ts_op_get(p->ins[i].op)->flags & TS_OPF_UPDATE)) continue;
            const ts_instr *in = &p->ins[i];
            int h = ts_trace_begin_args(p->trace, ts_op_get(in->op)->name, TS_TRACE_COMPUTE,
                                        (ts_trace_args){-1, -1, in->label});
            ts_status s = run_one(p, i);
            ts_trace_end(p->trace, h);
            if (s != TS_OK) return s;
        }
        return TS_OK;
    }
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
