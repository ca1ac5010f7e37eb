/* plan.h — the compiled plan (internal): a flat list of instructions whose
 * tensors point into one arena, and the table of named values. Built by
 * ts_compile (compile.c); executed by the backend it names, through the
 * interface of src/backends/backend.h. */
#ifndef TS_PLAN_H
#define TS_PLAN_H

#include "backends/backend.h"
#include "ops/collective.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "tessel/plan.h"

typedef struct ts_instr {
    int op;
    int node; /* node id in the plan's graph (for dumps) */
    ts_kernel_fn fn;
    ts_attrs a;
    int n_in, n_out;
    ts_tensor *in; /* n_in (owned) */
    ts_tensor out[TS_MAX_OUT];
    size_t in_off[16], out_off[TS_MAX_OUT]; /* arena offsets (first 16 inputs, for dumps) */
    size_t scratch_off, scratch_bytes;
    void *scratch; /* the kernel's scratch memory (arena or backend buffer) */
    char *label;   /* name of the first output (owned) */
    double flops;
    void *backend; /* backend state (e.g. a oneDNN primitive) */
    void (*backend_free)(void *);
    double prof_seconds; /* with opt.profile: time spent in this instruction so far */
    int64_t prof_calls;
} ts_instr;

typedef enum ts_region { TS_RG_PARAM, TS_RG_GRAD, TS_RG_STATE, TS_RG_IO, TS_RG_TEMP } ts_region;

/* A value the user can address by name. */
typedef struct ts_named {
    char *name;
    ts_type t;
    size_t off;
    ts_value_kind kind;
    int is_grad;
    int32_t value; /* id in the plan's graph */
} ts_named;

struct ts_plan {
    ts_graph *graph; /* the final graph (after every pass), for dumps */
    int32_t *order;
    int n_order;
    ts_memplan mp;
    ts_instr *ins;
    int n_ins;
    unsigned char *arena; /* address offsets with ts_plan_at */
    ts_named *named;
    int n_named;
    int32_t loss; /* value id of the loss, -1 for inference plans */
    size_t loss_off;
    int training;
    ts_train_spec spec; /* trainable pointer cleared */
    ts_compile_options opt;
    ts_step_ctx ctx;
    int64_t steps_done;
    double last_loss;
    size_t peak_live, naive_peak;
    ts_fuse_stats fuse; /* what the fusion pass did */
    double flops;
    /* The update gate: gate_ins is the first update-phase instruction
     * (TS_OPF_UPDATE) in the schedule, -1 without one; the executor asks
     * gate_fn there whether the update-phase instructions run. */
    int gate_ins;
    ts_update_gate_fn gate_fn;
    void *gate_user;
    int64_t updates_applied;
    int last_skipped;
    struct ts_plan_scaler *scaler; /* loss scaling (plan/scaler.h), NULL without */
    void *backend_scratch;         /* shared scratch for backend kernels (oneDNN) */
    size_t backend_scratch_bytes;
    /* Data parallelism (distribute pass): gradient buckets and the state
     * their ops share; with buckets the arena comes from ts_comm_alloc. */
    int n_buckets;
    ts_dist_rt dist; /* tickets owned */
    int arena_from_comm;
    /* ZeRO with shared parameters: the parameter region lives here, one
     * copy for every rank (ts_comm_alloc_shared), instead of at
     * arena + mp.param_off; NULL otherwise. Address values with ts_plan_at. */
    unsigned char *params;
    int zero_shared;           /* the distribute pass planned shared parameters */
    size_t arena_skip;         /* with params: the arena starts after memplan's parameter region
                                  (offset 0), which this process does not allocate */
    struct ts_trace *trace;    /* non-NULL: a compute span per instruction (not owned) */
    const ts_backend *backend; /* what runs the instructions (ts_compile_options.backend) */
};

/* Record a "compute" span per instruction of every step into t (a
 * Chrome trace, src/obs/trace.h; NULL: stop). Span names are op names,
 * labels point into the plan: write the trace before freeing the plan. */
void ts_plan_set_trace(ts_plan *p, struct ts_trace *t);

/* Where the value at arena offset `off` (memplan's) lives. */
static inline unsigned char *ts_plan_at(const ts_plan *p, size_t off) {
    if (p->params && off - p->mp.param_off < p->mp.param_bytes)
        return p->params + (off - p->mp.param_off);
    return p->arena + (off - p->arena_skip);
}

/* Look up a named value. */
const ts_named *ts_plan_find(const ts_plan *p, const char *name);

#endif
