/* Reading the gradient monitors of a plan compiled with
 * ts_compile_options.monitors: each is a named output "monitor:PARAM". */
#include <string.h>
#include "plan/plan.h"

static const char MON[] = "monitor:";

static const ts_named *monitor_at(const ts_plan *p, int idx) {
    for (int i = 0, k = 0; p && i < p->prog.n_named; i++)
        if (!strncmp(p->prog.named[i].name, MON, sizeof MON - 1) && k++ == idx)
            return &p->prog.named[i];
    return NULL;
}

int ts_plan_monitor_count(const ts_plan *p) {
    int n = 0;
    for (int i = 0; p && i < p->prog.n_named; i++)
        n += !strncmp(p->prog.named[i].name, MON, sizeof MON - 1);
    return n;
}

ts_status ts_plan_monitor(const ts_plan *p, int i, ts_grad_monitor *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "monitor: NULL argument");
    const ts_named *nm = monitor_at(p, i);
    if (!nm)
        return ts_fail(TS_ERR_INVALID, "monitor: index %d out of range [0, %d)", i,
                       ts_plan_monitor_count(p));
    const double *v = (const double *)ts_plan_at(p, nm->v.off);
    out->param = nm->name + sizeof MON - 1;
    out->sumsq = v[0];
    out->sum = v[1];
    out->nonfinite = (int64_t)v[2];
    out->numel = (int64_t)v[3];
    return TS_OK;
}
