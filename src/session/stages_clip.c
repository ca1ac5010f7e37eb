/* stages_clip.c — train.clip_grad_norm across pipeline stages: the global
 * norm of every stage's gradients, with the bits one process's clip_coef
 * gives (src/ops/optim.c).
 *
 * One process sums, in the model's parameter order, the square of each
 * gradient's norm rounded to float, each norm from fixed blocks summed in
 * double. A stage computes the same per-parameter norms for the parameters
 * it holds and puts their squares at their places in a vector of all the
 * model's parameters (zeros elsewhere); one all-reduce adds the vectors
 * (each place has one non-zero term, so the sum is exact in any order)
 * and every rank adds the places in order, as clip_coef does. The stage's
 * plan is compiled without clipping; its gradients are multiplied by the
 * coefficient before the update, which is what the update kernel does with
 * it (g * coef, then the update with g). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "ir/ir.h"
#include "ops/op.h"
#include "session/stages_internal.h"

ts_status ts_stage_clip_setup(ts_stage *st, const ts_graph *whole, double max_norm) {
    st->max_norm = max_norm;
    if (!(max_norm > 0)) return TS_OK;
    int n_all = 0;
    for (int v = 0; v < whole->n_values; v++) n_all += whole->values[v].kind == TS_VK_PARAM;
    const int np = ts_plan_param_count(st->plan);
    st->n_all = n_all;
    st->clip_v = calloc((size_t)n_all + 1, sizeof *st->clip_v);
    st->clip_idx = malloc(sizeof *st->clip_idx * (size_t)(np + 1));
    if (!st->clip_v || !st->clip_idx) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    for (int p = 0; p < np; p++) {
        const char *name = ts_plan_param_name(st->plan, p);
        st->clip_idx[p] = -1;
        /* the later holder of a shared parameter leaves it to the earlier */
        int skip = !strncmp(name, "pipe.", 5);
        for (int i = 0; i < st->n_shared; i++)
            if (!st->shared[i].owner && !strcmp(st->shared[i].name, name)) skip = 1;
        for (int v = 0, k = 0; !skip && v < whole->n_values; v++) {
            if (whole->values[v].kind != TS_VK_PARAM) continue;
            if (!strcmp(whole->values[v].name, name)) {
                st->clip_idx[p] = k;
                break;
            }
            k++;
        }
    }
    return TS_OK;
}

ts_status ts_stage_clip(ts_stage *st) {
    if (!(st->max_norm > 0)) return TS_OK;
    const int np = ts_plan_param_count(st->plan);
    memset(st->clip_v, 0, sizeof *st->clip_v * (size_t)st->n_all);
    char gname[160];
    for (int p = 0; p < np && st->d == 0; p++) { /* the replicas hold the same */
        if (st->clip_idx[p] < 0) continue;
        snprintf(gname, sizeof gname, "grad:%s", ts_plan_param_name(st->plan, p));
        size_t bytes = 0;
        const float *g = (const float *)ts_plan_value_at(st->plan, gname, &bytes);
        if (!g) continue;
        const float norm = (float)sqrt(ts_clip_sumsq_f32(g, (int64_t)(bytes / sizeof(float))));
        st->clip_v[st->clip_idx[p]] = (double)norm * (double)norm;
    }
    ts_status s =
        ts_allreduce(st->comm, st->clip_v, (size_t)st->n_all, TS_F64, TS_RED_SUM, TS_ALGO_AUTO);
    if (s != TS_OK) {
        ts_error_prefix("pipeline stage %d (rank %d): the global gradient norm", st->s,
                        ts_stage_rank_of(st, st->s));
        return s;
    }
    double tot = 0;
    for (int i = 0; i < st->n_all; i++) tot += st->clip_v[i];
    const float total = (float)sqrt(tot);
    const float inv = 1.0f / (total + 1e-6f);
    float coef = inv * (float)st->max_norm;
    if (coef > 1.0f) coef = 1.0f; /* NaN stays NaN */
    st->clip_coef = coef;
    for (int p = 0; p < np; p++) {
        snprintf(gname, sizeof gname, "grad:%s", ts_plan_param_name(st->plan, p));
        size_t bytes = 0;
        float *g = (float *)ts_plan_value_at(st->plan, gname, &bytes);
        for (size_t j = 0; g && j < bytes / sizeof(float); j++) g[j] = g[j] * coef;
    }
    return TS_OK;
}

/* The squares of this stage's gradients summed (parameter order, in
 * double): pipe.in's (the gradient sent back) and the later holder's copy
 * of a shared parameter left out, so the stages' sums add up to the
 * model's. */
double ts_stage_grad_sq_now(ts_stage *st) {
    /* eight partial sums in a fixed order, so the loop is not one chain of
     * dependent adds (it ran 5x the update's time with one); deterministic */
    double sq[8] = {0};
    for (int p = 0; p < ts_plan_param_count(st->plan); p++) {
        const char *name = ts_plan_param_name(st->plan, p);
        if (!strncmp(name, "pipe.", 5)) continue;
        int skip = 0;
        for (int i = 0; i < st->n_shared; i++)
            if (!st->shared[i].owner && !strcmp(st->shared[i].name, name)) skip = 1;
        char gname[160];
        snprintf(gname, sizeof gname, "grad:%s", name);
        size_t bytes = 0;
        const float *g = (const float *)ts_plan_value_at(st->plan, gname, &bytes);
        if (skip || !g) continue;
        const size_t n = bytes / sizeof(float);
        size_t j = 0;
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++) sq[k] += (double)g[j + k] * (double)g[j + k];
        for (; j < n; j++) sq[j % 8] += (double)g[j] * (double)g[j];
    }
    return ((sq[0] + sq[1]) + (sq[2] + sq[3])) + ((sq[4] + sq[5]) + (sq[6] + sq[7]));
}
