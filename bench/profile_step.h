/* profile_step.h — for benchmark programs: one step of a plan, then the
 * seconds its profile gives two ops (0 for an op the plan lacks). A
 * benchmark stops at the first error (exit 1, the error on stderr).
 *
 *     ts_plan *p = bench_compile(g, &spec, &opt);   // frees g
 *     double upd, cast;
 *     bench_step_ops(p, "adam_update", &upd, "cast", &cast);
 */
#ifndef TESSEL_BENCH_PROFILE_STEP_H
#define TESSEL_BENCH_PROFILE_STEP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tessel/tessel.h"

/* The plan of g (then freed) for spec and opt. */
static inline ts_plan *bench_compile(ts_graph *g, const ts_train_spec *spec,
                                     const ts_compile_options *opt) {
    ts_plan *p = NULL;
    if (ts_compile(g, spec, opt, &p) != TS_OK) {
        fprintf(stderr, "compile: %s\n", ts_last_error());
        exit(1);
    }
    ts_graph_free(g);
    return p;
}

static inline void bench_step_ops(ts_plan *p, const char *a, double *sa, const char *b,
                                  double *sb) {
    ts_plan_profile_reset(p);
    if (ts_plan_step(p) != TS_OK) {
        fprintf(stderr, "step: %s\n", ts_last_error());
        exit(1);
    }
    ts_profile_entry e[64];
    const int n = ts_plan_profile(p, e, 64);
    *sa = *sb = 0;
    for (int i = 0; i < n && i < 64; i++) {
        if (strcmp(e[i].op, a) == 0) *sa = e[i].seconds;
        if (strcmp(e[i].op, b) == 0) *sb = e[i].seconds;
    }
}

#endif
