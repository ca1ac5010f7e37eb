/* runtime.h — the state one run of a compiled program changes (internal).
 *
 * A ts_program (program.h) never changes after compile; everything that
 * does lives here: the arena's memory, each instruction bound to it (its
 * tensors, scratch and kernel arguments, ready to call), the kernel and
 * state a backend chose per instruction, the step counters, the update
 * gate, the loss scaler, the distributed runtime and the trace.
 *
 * A backend runs instruction i of a program as
 *
 *     ts_rt_instr *r = &rt->ins[i];
 *     ts_status s = r->fn(&r->k);
 *
 * and may, in its prepare, replace r->fn, point r->k.backend at its own
 * state (freed with r->backend_free) and r->k.scratch at its shared
 * buffer (rt->backend_scratch). */
#ifndef TS_RUNTIME_H
#define TS_RUNTIME_H

#include "backends/program.h"
#include "ops/collective.h" /* ts_dist_rt */

struct ts_trace;
struct ts_plan_scaler;

/* One instruction bound to the arena. */
typedef struct ts_rt_instr {
    ts_kernel_fn fn; /* what runs it: the op's reference kernel or the backend's */
    ts_kargs k;      /* its arguments, built once: the tensors below, scratch,
                        the attributes and label of the program's instruction,
                        &ts_runtime.ctx, backend state */
    ts_tensor *in;   /* n_in tensors in the arena (owned); k.in points here */
    ts_tensor out[TS_MAX_OUT];
    void (*backend_free)(void *); /* frees k.backend when the backend made it */
    double prof_seconds;          /* with opt.profile: time spent in it so far */
    int64_t prof_calls;
} ts_rt_instr;

typedef struct ts_runtime {
    ts_rt_instr *ins; /* one per program instruction */
    /* The arena: address an offset with ts_rt_at. With ZeRO's shared
     * parameters the parameter region is `params`, one copy for every rank
     * (ts_comm_alloc_shared), and `arena` starts after it (arena_skip
     * bytes, which this process does not allocate). A plan compiled with
     * ts_compile_shared likewise finds parameters, gradients and state
     * (params_span bytes) at another plan's `params`. */
    unsigned char *arena;
    unsigned char *params;
    size_t params_span;  /* bytes of the arena's start that lie at `params` */
    int params_borrowed; /* `params` is another plan's (plan_shared.c): the parameters,
                            gradients and optimizer state of every bucket's plan */
    size_t arena_skip;
    /* Non-NULL: the temporaries region (the arena's last) lies at `temps`,
     * a block of temps_cap bytes of the plan that owns the shared state
     * (plan_shared.c), which only one of the plans uses at a time. */
    unsigned char *temps;
    size_t temps_cap;
    int arena_from_comm; /* the arena is a comm segment (ts_comm_alloc) */
    ts_step_ctx ctx;     /* what the kernels of the current step see */
    int64_t steps_done, updates_applied;
    double last_loss;
    int last_skipped;
    /* The update gate, asked at the program's gate_ins with `owner`, the
     * plan this runtime belongs to (ts_update_gate_fn takes the plan). */
    ts_update_gate_fn gate_fn;
    void *gate_user;
    struct ts_plan *owner;
    struct ts_plan_scaler *scaler; /* loss scaling (plan/scaler.h), NULL without */
    void *backend_scratch;         /* shared scratch of backend kernels (oneDNN) */
    size_t backend_scratch_bytes;
    ts_dist_rt dist;        /* data parallelism: buckets' tickets (owned) */
    struct ts_trace *trace; /* non-NULL: a compute span per instruction (not owned) */
    ts_kernel_fn *held_fns; /* [n_ins] the kernels of the monitors held (ts_plan_hold_monitors),
                               NULL where none is held (owned) */
    int copies_stale;       /* a parameter's memory was handed out (ts_plan_value_at): the next
                               step first rewrites the weights' low-precision copies */
} ts_runtime;

/* Where the value at arena offset `off` (the layout's) lives. */
static inline unsigned char *ts_rt_at(const ts_runtime *rt, const ts_arena_layout *l, size_t off) {
    if (rt->params && off - l->param_off < rt->params_span)
        return rt->params + (off - l->param_off);
    if (rt->temps && off - l->temp_off < l->temp_bytes) return rt->temps + (off - l->temp_off);
    return rt->arena + (off - rt->arena_skip);
}

#endif
