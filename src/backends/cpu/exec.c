/* The CPU executor: runs a plan's instructions in order. Each kernel gets
 * its tensors, scratch and the step context; nothing is allocated. */
#include <math.h>
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

ts_status ts_cpu_execute(ts_plan *p) {
    for (int i = 0; i < p->n_ins; i++) {
        ts_instr *in = &p->ins[i];
        ts_kargs k = {&in->a,
                      in->n_in,
                      in->n_out,
                      in->in,
                      in->out,
                      in->scratch,
                      in->scratch_bytes,
                      &p->ctx,
                      in->label,
                      in->backend};
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
                                   (long long)p->ctx.step, in->label, j,
                                   ts_op_get(in->op)->name, (long long)e);
            }
        }
    }
    return TS_OK;
}
