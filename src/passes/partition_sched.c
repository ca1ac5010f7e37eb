/* partition_sched.c — the order each stage runs its forwards and backwards
 * in (GPipe, 1F1B), and a simulation of it that predicts the step time and
 * the bubble (the share of stage time spent waiting). */
#include <math.h>
#include <stdlib.h>
#include "passes/partition.h"

void ts_pipe_order(ts_pipe_schedule k, int S, int M, int s, ts_pipe_op *out) {
    int n = 0;
    if (k == TS_PIPE_GPIPE) {
        for (int i = 0; i < M; i++) out[n++] = (ts_pipe_op){0, i};
        for (int i = 0; i < M; i++) out[n++] = (ts_pipe_op){1, i};
        return;
    }
    /* 1F1B (PipeDream-flush): warm up with the forwards that fill the
     * stages after this one, then one forward and one backward each */
    const int warm = S - s - 1 < M ? S - s - 1 : M;
    for (int i = 0; i < warm; i++) out[n++] = (ts_pipe_op){0, i};
    for (int i = 0; i + warm < M; i++) {
        out[n++] = (ts_pipe_op){0, i + warm};
        out[n++] = (ts_pipe_op){1, i};
    }
    for (int i = M - warm; i < M; i++) out[n++] = (ts_pipe_op){1, i};
}

ts_status ts_pipe_simulate(ts_pipe_schedule k, int S, int M, const double *fwd, const double *bwd,
                           const double *link, double *step_s, double *bubble) {
    if (S < 1 || S > TS_PIPE_MAX_STAGES || M < 1)
        return ts_fail(TS_ERR_INVALID, "pipeline schedule: %d stages, %d micro-batches", S, M);
    const size_t n = (size_t)S * M;
    ts_pipe_op *ord = malloc((size_t)S * 2 * M * sizeof *ord);
    double *fend = malloc(n * sizeof *fend), *bend = malloc(n * sizeof *bend);
    if (!ord || !fend || !bend) {
        free(ord), free(fend), free(bend);
        return ts_fail(TS_ERR_NOMEM, "pipeline schedule: out of memory");
    }
    for (size_t i = 0; i < n; i++) fend[i] = bend[i] = NAN;
    for (int s = 0; s < S; s++) ts_pipe_order(k, S, M, s, ord + (size_t)s * 2 * M);
    int pos[TS_PIPE_MAX_STAGES] = {0};
    double free_at[TS_PIPE_MAX_STAGES] = {0}, busy = 0, end = 0;
    /* Each round runs every stage's next operation whose input has
     * arrived; a schedule that can deadlock makes a round without
     * progress, which is reported. */
    for (int left = 2 * S * M; left > 0;) {
        int progressed = 0;
        for (int s = 0; s < S; s++) {
            if (pos[s] == 2 * M) continue;
            const ts_pipe_op op = ord[(size_t)s * 2 * M + pos[s]];
            double ready;
            if (!op.bwd) {
                ready = s ? fend[(size_t)(s - 1) * M + op.mb] + link[s - 1] : 0;
            } else {
                ready = s == S - 1 ? fend[(size_t)s * M + op.mb]
                                   : bend[(size_t)(s + 1) * M + op.mb] + link[s];
            }
            if (isnan(ready)) continue;
            const double t0 = ready > free_at[s] ? ready : free_at[s];
            const double d = op.bwd ? bwd[s] : fwd[s];
            free_at[s] = t0 + d;
            (op.bwd ? bend : fend)[(size_t)s * M + op.mb] = t0 + d;
            busy += d;
            if (t0 + d > end) end = t0 + d;
            pos[s]++, left--, progressed = 1;
        }
        if (!progressed) {
            free(ord), free(fend), free(bend);
            return ts_fail(TS_ERR_INTERNAL, "pipeline schedule: deadlock with %d operations left",
                           left);
        }
    }
    free(ord), free(fend), free(bend);
    *step_s = end;
    *bubble = end > 0 ? 1.0 - busy / (S * end) : 0;
    return TS_OK;
}
