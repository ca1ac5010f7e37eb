/* ts_plan_profile: the time per op kind, summed over the instructions from
 * what the plan's backend measured for each (backend.h, profile). */
#include <stdlib.h>
#include <string.h>
#include "plan/plan.h"

static int by_time(const void *a, const void *b) {
    const ts_profile_entry *x = a, *y = b;
    if (x->seconds != y->seconds) return x->seconds < y->seconds ? 1 : -1;
    return (x->op > y->op) - (x->op < y->op); /* stable order for equal times */
}

int ts_plan_profile(const ts_plan *p, ts_profile_entry *out, int max) {
    if (!p) return ts_fail(TS_ERR_INVALID, "profile: plan is NULL"), -1;
    if (!p->prog.opt.profile)
        return ts_fail(TS_ERR_INVALID, "profile: the plan was compiled without "
                                       "ts_compile_options.profile"),
               -1;
    ts_profile_entry all[TS_OP_COUNT] = {{0}};
    for (int i = 0; i < p->prog.n_ins; i++) {
        const ts_instr *in = &p->prog.ins[i];
        ts_profile_entry *e = &all[in->op];
        double sec = 0;
        int64_t calls = 0;
        p->backend->profile(&p->prog, &p->rt, i, &sec, &calls);
        e->op = in->name;
        e->seconds += sec;
        e->calls += calls;
        e->instructions++;
        e->flops += in->flops;
        /* By name, so conv ops count wherever their family defines them. */
        e->is_gemm =
            in->op == TS_OP_MATMUL || in->op == TS_OP_MATMUL_EPI || !strncmp(e->op, "conv", 4);
    }
    int n = 0;
    for (int op = 0; op < TS_OP_COUNT; op++)
        if (all[op].instructions) all[n++] = all[op];
    qsort(all, (size_t)n, sizeof all[0], by_time);
    for (int i = 0; out && i < n && i < max; i++) out[i] = all[i];
    return n;
}

void ts_plan_profile_reset(ts_plan *p) {
    if (p) p->backend->profile_reset(&p->prog, &p->rt);
}
