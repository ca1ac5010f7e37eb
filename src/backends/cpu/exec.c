/* The CPU executor: runs a program's instructions in order. Each kernel
 * gets the arguments bound for it at compile time (its tensors, scratch and
 * the step context); nothing is allocated. With ts_compile_options.profile
 * it also times every instruction. */
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

static inline ts_status run_one(const ts_program *prog, ts_runtime *rt, int i) {
    const ts_rt_instr *r = &rt->ins[i];
    ts_status s = r->fn(&r->k);
    if (s != TS_OK) {
        ts_error_prefix("step %lld, instruction %d (%s)", (long long)rt->ctx.step, i,
                        prog->ins[i].name);
        return s;
    }
    if (prog->opt.debug_nan) {
        for (int j = 0; j < r->k.n_out; j++) {
            int64_t e = first_nonfinite(&r->out[j]);
            if (e >= 0)
                return ts_fail(TS_ERR_NUMERIC,
                               "step %lld: '%s' (output %d of %s) holds a non-finite value "
                               "at element %lld: the first value in the step to do so",
                               (long long)rt->ctx.step, r->k.label, j, prog->ins[i].name,
                               (long long)e);
        }
    }
    return TS_OK;
}

/* Instructions [lo, hi); with skip_update the update-phase ones are left
 * out. Separate loops rather than a test per instruction: without profiling
 * or a trace the step never reads the clock. */
static ts_status run_range(const ts_program *prog, ts_runtime *rt, int lo, int hi,
                           int skip_update) {
    const ts_instr *ins = prog->ins;
    if (rt->trace) {
        /* A timeline (--trace): one span per instruction. */
        for (int i = lo; i < hi; i++) {
            if (skip_update && (ins[i].flags & TS_OPF_UPDATE)) continue;
            int h = ts_trace_begin_args(rt->trace, ins[i].name, TS_TRACE_COMPUTE,
                                        (ts_trace_args){-1, -1, ins[i].label});
            ts_status s = run_one(prog, rt, i);
            ts_trace_end(rt->trace, h);
            if (s != TS_OK) return s;
        }
        return TS_OK;
    }
    if (!prog->opt.profile) {
        for (int i = lo; i < hi; i++) {
            if (skip_update && (ins[i].flags & TS_OPF_UPDATE)) continue;
            ts_status s = run_one(prog, rt, i);
            if (s != TS_OK) return s;
        }
        return TS_OK;
    }
    for (int i = lo; i < hi; i++) {
        if (skip_update && (ins[i].flags & TS_OPF_UPDATE)) continue;
        double t0 = omp_get_wtime();
        ts_status s = run_one(prog, rt, i);
        rt->ins[i].prof_seconds += omp_get_wtime() - t0;
        rt->ins[i].prof_calls++;
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

ts_status ts_cpu_execute(const ts_program *prog, ts_runtime *rt, int *skipped) {
    *skipped = 0;
    if (prog->gate_ins < 0 || !rt->gate_fn) return run_range(prog, rt, 0, prog->n_ins, 0);
    ts_status s = run_range(prog, rt, 0, prog->gate_ins, 0);
    if (s != TS_OK) return s;
    ts_gate_decision d = TS_GATE_APPLY;
    if ((s = rt->gate_fn(rt->owner, rt->gate_user, &d)) != TS_OK) {
        ts_error_prefix("step %lld, update gate", (long long)rt->ctx.step);
        return s;
    }
    if (d != TS_GATE_APPLY && d != TS_GATE_SKIP)
        return ts_fail(TS_ERR_INVALID, "step %lld: the update gate returned %d (not a decision)",
                       (long long)rt->ctx.step, (int)d);
    *skipped = d == TS_GATE_SKIP;
    return run_range(prog, rt, prog->gate_ins, prog->n_ins, *skipped);
}

ts_status ts_cpu_execute_range(const ts_program *prog, ts_runtime *rt, int lo, int hi) {
    if (lo < 0 || hi > prog->n_ins || lo > hi)
        return ts_fail(TS_ERR_INVALID, "execute: instructions [%d, %d) of %d", lo, hi, prog->n_ins);
    return run_range(prog, rt, lo, hi, 0);
}
