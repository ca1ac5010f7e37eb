/* tessel/plan.h — running a compiled plan.
 *
 *     for (int step = 0; step < 100; step++) {
 *         ts_plan_set_input(plan, "x", x, sizeof x);
 *         ts_plan_set_input(plan, "y", y, sizeof y);
 *         if (ts_plan_step(plan) != TS_OK) { puts(ts_last_error()); break; }
 *         printf("step %d loss %.4f\n", step, ts_plan_loss(plan));
 *     }
 *     ts_plan_read(plan, "fc.weight", w, sizeof w);
 *     ts_plan_free(plan);
 *
 * A step performs no allocation: every tensor lives at a fixed offset of one
 * arena decided when the plan was compiled. Named values readable with
 * ts_plan_read(): parameters, inputs, marked outputs, "loss", and
 * "grad:NAME" for the gradient of parameter NAME.
 */
#ifndef TESSEL_PLAN_H
#define TESSEL_PLAN_H

#include <stdint.h>
#include <stdio.h>
#include "tessel/compile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copy one step's data into input `name`; bytes must equal its size. */
ts_status ts_plan_set_input(ts_plan *p, const char *name, const void *data, size_t bytes);
/* Run one step: forward, backward and update for a training plan, forward
 * only for an inference plan. */
ts_status ts_plan_step(ts_plan *p);
/* Loss of the last step (NaN before the first step or in inference plans). */
double ts_plan_loss(const ts_plan *p);
/* Number of steps run so far (restored with ts_plan_set_step when resuming;
 * it also sets ts_plan_updates_applied to the same count). */
int64_t ts_plan_step_count(const ts_plan *p);
void ts_plan_set_step(ts_plan *p, int64_t steps_done);
/* Learning rate the next step will use. */
double ts_plan_lr(const ts_plan *p);

/* Read a named value (see above); bytes must equal its size. */
ts_status ts_plan_read(const ts_plan *p, const char *name, void *dst, size_t bytes);
/* Overwrite a parameter (e.g. load weights). */
ts_status ts_plan_write_param(ts_plan *p, const char *name, const void *src, size_t bytes);

/* L2 norm of all gradients of the last step (before clipping), read in
 * place: no copy of the gradients is made. With monitors it is the sum of
 * the monitors' sums of squares (no pass over the gradients at all). */
ts_status ts_plan_grad_norm(const ts_plan *p, double *norm);

/* The update gate: one decision per training step on whether the parameter
 * update runs (alert action skip_step, a loss scaler's skip on non-finite
 * gradients; in data-parallel runs every rank must return the same).
 *
 *     static ts_status gate(ts_plan *p, void *user, ts_gate_decision *out) {
 *         double loss = ...; // gradients and monitor outputs are readable here
 *         *out = isfinite(loss) ? TS_GATE_APPLY : TS_GATE_SKIP;
 *         return TS_OK;
 *     }
 *     ts_plan_set_update_gate(plan, gate, NULL);
 *
 * The callback is called once per training step after every gradient (and
 * every monitor node) is computed and before the first update-phase node
 * (clip coefficient, optimizer update) runs; plans without an optimizer
 * update never call it. Returning TS_GATE_SKIP leaves parameters and
 * optimizer state untouched for this step (nodes after the gate that are
 * not part of the update still run); a status other than TS_OK fails the
 * step. fn NULL removes the gate (every update is applied). */
typedef enum ts_gate_decision { TS_GATE_APPLY = 0, TS_GATE_SKIP = 1 } ts_gate_decision;
typedef ts_status (*ts_update_gate_fn)(ts_plan *plan, void *user, ts_gate_decision *out);
void ts_plan_set_update_gate(ts_plan *plan, ts_update_gate_fn fn, void *user);
/* Number of updates actually applied so far (Adam's bias-correction step
 * count t; torch increments it only when optimizer.step() runs). 0 in
 * plans without an optimizer update. ts_plan_set_step() sets it to the
 * step count (every step applied); a checkpoint restores the saved count
 * afterwards with ts_plan_set_updates_applied(). */
int64_t ts_plan_updates_applied(const ts_plan *plan);
void ts_plan_set_updates_applied(ts_plan *plan, int64_t n);
/* 1 if the gate skipped the update of the last step, else 0. */
int ts_plan_last_step_skipped(const ts_plan *plan);

/* Gradient monitors, in a plan compiled with ts_compile_options.monitors:
 * one per float gradient, computed inside the step right after the
 * gradient (before the update gate), so they are current in the gate
 * callback and after ts_plan_step. Sums are in double over every element.
 *
 *     for (int i = 0; i < ts_plan_monitor_count(plan); i++) {
 *         ts_grad_monitor m;
 *         ts_plan_monitor(plan, i, &m);
 *         printf("%s: norm %g\n", m.param, sqrt(m.sumsq));
 *     }
 */
typedef struct ts_grad_monitor {
    const char *param; /* parameter name (owned by the plan) */
    double sumsq;      /* sum of squares of the gradient's elements */
    double sum;        /* sum of the elements */
    int64_t nonfinite; /* NaN or infinite elements */
    int64_t numel;     /* elements */
} ts_grad_monitor;
int ts_plan_monitor_count(const ts_plan *p);
ts_status ts_plan_monitor(const ts_plan *p, int i, ts_grad_monitor *out);
/* Loss scaling (ts_compile_options.precision.loss_scale): the scale the
 * next step multiplies the loss by, the growth tracker (consecutive
 * finite steps) and the steps whose gradients were non-finite so far
 * (their updates skipped). Returns 0 (outputs untouched) when the plan has
 * no loss scaling, else 1. Any pointer may be NULL. */
int ts_plan_loss_scale(const ts_plan *p, double *scale, int64_t *growth_tracker, int64_t *skipped);
/* 1 if the last step's gradients were non-finite (so the loss scaler
 * skipped its update and backed off), else 0. */
int ts_plan_found_inf(const ts_plan *p);

/* Describe a named value: dtype, rank and dims (dims may be NULL). */
ts_status ts_plan_value_info(const ts_plan *p, const char *name, ts_dtype *dt, int *rank,
                             int64_t *dims);

/* Parameters of the plan, in arena order. */
int ts_plan_param_count(const ts_plan *p);
const char *ts_plan_param_name(const ts_plan *p, int i);

/* Persistent values: everything a checkpoint must hold to resume a run
 * bit-exactly — the parameters, then the optimizer and normalisation state
 * (Adam moments, momentum buffers, running statistics), in arena order.
 * Gradients are not persistent: every step recomputes them. */
typedef struct ts_persistent {
    const char *name; /* owned by the plan */
    int is_state;     /* 0: parameter; 1: state (write it back with ts_plan_write_param) */
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t bytes;
    size_t snapshot_off; /* where the value lies in a ts_plan_snapshot() buffer */
} ts_persistent;

int ts_plan_persistent_count(const ts_plan *p);
ts_status ts_plan_persistent(const ts_plan *p, int i, ts_persistent *out);
/* Copy every persistent value into `dst` with two memcpy's (the parameter
 * and state regions of the arena are contiguous), so a checkpoint can be
 * written in the background while the next steps run. `bytes` must equal
 * ts_plan_snapshot_bytes(). */
size_t ts_plan_snapshot_bytes(const ts_plan *p);
ts_status ts_plan_snapshot(const ts_plan *p, void *dst, size_t bytes);
/* Where the two regions ts_plan_snapshot copies live in the plan itself:
 * snapshot offsets below *split are at *params + off, the others at
 * *state + (off - *split). For a caller that writes the values out while
 * no step runs (a synchronous checkpoint), instead of copying them. */
ts_status ts_plan_snapshot_regions(const ts_plan *p, const void **params, const void **state,
                                   size_t *split);

/* Sharded optimizer state (dist.zero): a "zero.bucket<b>.<what>" state
 * value holds this rank's block of bucket b's flat parameter range, which
 * cuts across parameters and includes the 64-byte padding between them.
 * One piece per (state value, parameter) overlap says which elements of
 * the parameter's logical state tensor "<param>.<what>" (the one a run
 * without ZeRO has, same dtype and shape as the parameter) lie where in the
 * state value; elements of a state value in no piece are padding. The
 * array is malloc'ed (free it); *n is 0 for a plan without ZeRO. */
typedef struct ts_shard_piece {
    const char *state; /* the plan's state value (owned by the plan) */
    const char *param; /* the parameter (owned by the plan) */
    const char *what;  /* "exp_avg", "exp_avg_sq" or "momentum" (points into state); "" for
                          ZeRO-3's block of the parameters ("zero.bucket<b>.param"): the
                          logical tensor is the parameter itself */
    int64_t state_off; /* first element in the state value */
    int64_t param_off; /* first element in the logical tensor */
    int64_t count;     /* elements */
} ts_shard_piece;

ts_status ts_plan_shard_layout(const ts_plan *p, ts_shard_piece **out, int *n);
/* The seed the plan was compiled with: parameter init and dropout masks
 * are functions of (seed, name or step), so a resumed run must match it. */
uint64_t ts_plan_seed(const ts_plan *p);

typedef struct ts_plan_stats {
    size_t arena_bytes;        /* the whole arena of this process */
    size_t shared_param_bytes; /* ZeRO with shared parameters: the parameters, one copy for
                                  every process of the host, outside arena_bytes (0 otherwise) */
    size_t param_bytes;        /* parameters region */
    size_t grad_bytes;         /* gradients region */
    size_t state_bytes;        /* optimizer state region */
    size_t io_bytes;           /* inputs, constants, outputs */
    size_t temp_bytes;         /* planned region for intermediate values */
    size_t naive_bytes;        /* sum of the sizes of every tensor of the step */
    size_t peak_live_bytes;    /* peak of live intermediate bytes in the chosen schedule */
    size_t naive_peak_bytes;   /* same for the build-order schedule */
    /* compile.max_memory_mb (docs/scheduling.md): activations recomputed in
     * the backward to fit, the FLOPs that adds per step (inside
     * flops_per_step), and the arena without them (0: no limit set) */
    int n_recomputed;
    double recompute_flops;
    size_t arena_no_recompute_bytes;
    const char *schedule; /* the order the schedule pass kept: "build order", "greedy" or
                             "search" (a static string) */
    int n_instructions;
    int n_inplace; /* outputs that share their input's memory */
    double flops_per_step;
    /* Bytes the instructions read and write per step, each distinct operand
     * once per instruction: a first-order count of memory traffic (what
     * fusion saves; caches not modelled) */
    size_t operand_bytes_per_step;
    /* ZeRO-2 (else 0): the gradient buckets live in the temporaries region,
     * each from its first gradient to its reduce-scatter, and grad_bytes is 0 */
    size_t zero_grad_bytes;  /* every bucket's full gradients together */
    size_t zero_grad_peak;   /* the most of them alive at once */
    size_t zero_shard_bytes; /* this rank's shards of the reduced gradients */
    size_t zero_param_bytes; /* ZeRO-3: every bucket's gathered parameters together (in the
                                temporaries; param_bytes holds only the unsharded ones and
                                state_bytes this rank's blocks, "zero.bucket<b>.param") */
    size_t zero_param_peak;  /* ZeRO-3: the most gathered parameter bytes alive at once */
} ts_plan_stats;

ts_status ts_plan_get_stats(const ts_plan *p, ts_plan_stats *st);

/* Gradient compression (ts_compile_options.compress): what this rank's
 * last step exchanged, summed over its buckets. dense_bytes: the
 * gradients' bytes an uncompressed all-reduce reduces; sent_bytes: this
 * rank's payloads (indices, values and scales counted; powersgd: the
 * factors and the dense small tensors); recv_bytes: the peers' payloads it
 * received; residual_sq: the squared norm of the error-feedback residual
 * after the step. All zero for a plan without compression. */
typedef struct ts_compress_stats {
    int64_t step; /* the step these figures are of (0: none yet) */
    double dense_bytes;
    double sent_bytes;
    double recv_bytes;
    double residual_sq;
    int64_t sent_values; /* values this rank sent (topk) */
} ts_compress_stats;
ts_status ts_plan_compress_stats(const ts_plan *p, ts_compress_stats *out);
/* Whether the persistent value `name` is this rank's row of gradient
 * compression's per-rank state (the error-feedback residuals
 * "compress.bucket<b>.residual", momentum-correction velocities
 * ".velocity" and PowerSGD errors ".error": [n] f32 values, each rank's
 * own, 1x the bucket's gradients). A checkpoint holds them as the logical
 * tensor [world, n] whose row *rank this process writes (every rank saves,
 * as with ZeRO's blocks), so a resume on as many ranks continues
 * bit-exactly. 0 for any other value, and without compression. */
int ts_plan_compress_row(const ts_plan *p, const char *name, int *rank, int *world);

/* Time spent per op kind over the steps run so far, in a plan compiled with
 * ts_compile_options.profile set:
 *
 *     ts_profile_entry top[8];
 *     int n = ts_plan_profile(plan, top, 8);       // slowest first
 *     for (int i = 0; i < n; i++) printf("%-12s %8.2f ms\n", top[i].op, 1e3 * top[i].seconds);
 */
typedef struct ts_profile_entry {
    const char *op;   /* op name ("matmul", "layer_norm", ...) */
    double seconds;   /* total over every step */
    int64_t calls;    /* instruction executions */
    int instructions; /* instructions of this op in the plan */
    double flops;     /* per step, from the op's cost model */
    int is_gemm;      /* a GEMM (or convolution) kernel */
} ts_profile_entry;

/* Fill up to `max` entries sorted by time (slowest first) and return how
 * many op kinds ran (which may exceed max); -1 with an error when the plan
 * was not compiled with profiling. out may be NULL to count. */
int ts_plan_profile(const ts_plan *p, ts_profile_entry *out, int max);
/* Forget the times gathered so far (e.g. after warm-up steps). */
void ts_plan_profile_reset(ts_plan *p);

/* What a plan on a device backend (compile.backend cuda, docs/cuda.md)
 * reports about its GPU and its last step. */
typedef struct ts_device_info {
    char name[96];            /* the GPU, e.g. "NVIDIA H200" */
    int graph;                /* 1: steps replay a captured CUDA graph */
    int64_t kernels_per_step; /* kernels (graph nodes) of one step; 0 before the first */
    double launch_us;         /* host time spent launching the last step's work */
    double util_pct;          /* NVML: utilisation, memory used, power (NAN: no NVML) */
    double mem_used_bytes;
    double power_w;
    double device_bytes; /* the plan's one device allocation */
} ts_device_info;
/* TS_ERR_UNSUPPORTED for a plan on the CPU. */
ts_status ts_plan_device_info(const ts_plan *p, ts_device_info *out);

typedef enum ts_dump_kind { TS_DUMP_IR, TS_DUMP_PLAN, TS_DUMP_MEMORY } ts_dump_kind;
/* Print the compiled graph, the instruction list or the memory plan. The
 * plan keeps no graph: TS_DUMP_IR and TS_DUMP_MEMORY print what ts_compile
 * rendered with ts_compile_options.keep_dumps set, and fail with
 * TS_ERR_INVALID saying so without it; TS_DUMP_PLAN always works. */
ts_status ts_plan_dump(const ts_plan *p, ts_dump_kind kind, FILE *out);

void ts_plan_free(ts_plan *p);

#ifdef __cplusplus
}
#endif
#endif
