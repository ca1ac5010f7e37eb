/* partition.h — the pure parts of pipeline placement (internal): the cut
 * search over a sequence of units with known costs, and the GPipe / 1F1B
 * schedules with their simulation. No graph here, so both are unit-tested
 * on synthetic costs (tests/unit/partition.c); partition_graph.c turns a
 * forward graph into units.
 *
 *     ts_part_problem p = {units, n_units, param_bytes, n_params, devs, S, M, TS_PIPE_1F1B, 0};
 *     ts_part_result r;
 *     if (ts_part_search(&p, &r) != TS_OK) ...   // r.last[s]: stage s's last unit
 */
#ifndef TS_PASSES_PARTITION_H
#define TS_PASSES_PARTITION_H

#include "core/core.h"
#include "tessel/pipeline.h"

/* A piece of the forward graph between two candidate cuts. */
typedef struct ts_part_unit {
    double gemm_flops;  /* forward + backward FLOPs of matrix ops */
    double mem_traffic; /* forward + backward bytes of the other ops */
    double act_bytes;   /* activations kept for the backward, per micro-batch */
    double out_bytes;   /* the activation crossing to the next unit (0 for the last) */
    const int *params;  /* ids of the parameters it reads (into param_bytes) */
    int n_params;
} ts_part_unit;

typedef struct ts_part_problem {
    const ts_part_unit *units;
    int n_units;
    const double *param_bytes; /* persistent bytes of each parameter (+ grad + state) */
    int n_params;
    const ts_device_speed *devs; /* stage s on devs[s % n_devs] */
    int n_devs;
    int stages, microbatches;
    ts_pipe_schedule schedule;
    double max_mem_mb; /* for devices with mem_mb 0 (0: none) */
    /* each parameter's gradient bytes (NULL: not counted), for the buffers
     * a stage keeps beside its plan: the micro-batch tree's partial sums of
     * its gradients, and a parameter two stages hold has its gradient share
     * sent per micro-batch (the later holder keeps M send buffers, the
     * earlier one receive buffer) */
    const double *grad_bytes;
} ts_part_problem;

typedef struct ts_part_result {
    int last[TS_PIPE_MAX_STAGES]; /* last unit of stage s (last[S-1] = n_units-1) */
    double compute_s[TS_PIPE_MAX_STAGES], xfer_s[TS_PIPE_MAX_STAGES];
    double mem_bytes[TS_PIPE_MAX_STAGES], param_bytes[TS_PIPE_MAX_STAGES];
    int inflight[TS_PIPE_MAX_STAGES];
    double objective; /* max over stages of compute_s + xfer_s */
    int fits;         /* every stage within its memory limit */
} ts_part_result;

/* Micro-batches whose activations stage s keeps at once. */
int ts_part_inflight(ts_pipe_schedule k, int S, int M, int s);
/* Evaluates the split last[0..S) (each stage at least one unit). */
ts_status ts_part_eval(const ts_part_problem *p, const int *last, ts_part_result *out);
/* The split with the smallest objective that fits memory (dynamic
 * programming over (stage, last unit), exact for contiguous stages; ties
 * go to the earliest cut). Fails when none fits, giving the smallest
 * memory any split needs on its fullest stage. */
ts_status ts_part_search(const ts_part_problem *p, ts_part_result *out);
/* The even split: n_units / S units per stage, the first n_units % S
 * stages one more. */
void ts_part_even(int n_units, int S, int *last);

/* ---- schedules (partition_sched.c) ------------------------------------ */

typedef struct ts_pipe_op {
    int bwd; /* 0 forward, 1 backward */
    int mb;  /* micro-batch */
} ts_pipe_op;

/* Stage s's 2M operations in the order it runs them. GPipe: every forward,
 * then every backward; 1F1B: min(S-s-1, M) forwards, then alternating one
 * forward and one backward, then the remaining backwards. Backwards run in
 * micro-batch order in both, so gradients accumulate in a fixed order. */
void ts_pipe_order(ts_pipe_schedule k, int S, int M, int s, ts_pipe_op *out);

/* Simulates the schedule: stage s spends fwd[s] and bwd[s] per operation,
 * a message from stage s to s+1 (or back) takes link[s]. Gives the step
 * time and the bubble share 1 - sum(busy) / (S * step). */
ts_status ts_pipe_simulate(ts_pipe_schedule k, int S, int M, const double *fwd, const double *bwd,
                           const double *link, double *step_s, double *bubble);

#endif
