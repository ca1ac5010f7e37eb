/* plan.h — a compiled plan (internal): the immutable program ts_compile
 * built (backends/program.h: instructions, arena layout, named values), the
 * runtime state that runs it (backends/runtime.h: the arena, the step, the
 * gate, what the backend made) and the backend it runs on, which the plan
 * only calls through the interface of src/backends/backend.h.
 *
 * The plan keeps no graph: what needs the graph (the lowering, the
 * parameters' first values, the ZeRO shard layout, the IR and memory
 * dumps) is done by ts_compile while it still has it. */
#ifndef TS_PLAN_H
#define TS_PLAN_H

#include "backends/backend.h"
#include "passes/passes.h"
#include "tessel/plan.h"

struct ts_plan {
    ts_program prog; /* what ts_compile built; not changed afterwards */
    ts_runtime rt;   /* what running it changes */
    const ts_backend *backend;
};

/* Record a "compute" span per instruction of every step into t (a
 * Chrome trace, src/obs/trace.h; NULL: stop). Span names are op names,
 * labels point into the plan: write the trace before freeing the plan. */
void ts_plan_set_trace(ts_plan *p, struct ts_trace *t);

/* Where the value at arena offset `off` (the program's layout) lives. */
static inline unsigned char *ts_plan_at(const ts_plan *p, size_t off) {
    return ts_rt_at(&p->rt, &p->prog.layout, off);
}

/* Look up a named value. */
const ts_named *ts_plan_find(const ts_plan *p, const char *name);

/* Rewrites the bf16 / f16 copies the optimizer keeps of the weights (passes/weight_copies.c)
 * from the f32 weights: the copy of the parameter at arena offset param_off, or every copy
 * for SIZE_MAX (which also clears rt.copies_stale). For whatever writes the weights outside
 * the update: the plan's first values (arena.c), ts_plan_write_param, and the step after
 * ts_plan_value_at handed out a parameter (rt.copies_stale). weight_copies.c. */
void ts_plan_refresh_copies(ts_plan *p, size_t param_off);

/* Plans of one model at several shapes (shape buckets, plan_shared.c).
 *
 *     ts_compile(g16, &spec, &opt, &p16);                 // owns the state
 *     ts_compile_shared(g8, &spec8, &opt, p16, &p8);      // the same parameters,
 *     ts_plan_step(p8);                                   // gradients, optimizer state
 *     ts_plan_swap_program(p16, p8);  // p16 now runs g8's program on its step counters
 *     ...
 *     ts_plan_free(p8), ts_plan_free(p16);                // the owner of the state last
 *
 * ts_compile_shared compiles g into a plan whose persistent regions
 * (parameters, gradients, optimizer and normalisation state) are share's,
 * one allocation for both: g must have the same persistent values in the
 * same layout (the same model built at another batch or sequence size);
 * only its inputs, constants and temporaries are its own. Not with data
 * parallelism or loss scaling. Whichever plan allocated the state must be
 * freed after every plan sharing it. */
ts_status ts_compile_shared(const ts_graph *g, const ts_train_spec *spec,
                            const ts_compile_options *opt, const ts_plan *share, ts_plan **out);
/* Exchanges the compiled programs of a and b (and their bindings to
 * memory), each keeping its run state: step counters, update gate, trace,
 * loss. Both must share one state (ts_compile_shared) and backend. */
ts_status ts_plan_swap_program(ts_plan *a, ts_plan *b);

/* What the passes left besides the program: the final graph, its schedule
 * (node ids) and memory plan (per-value offsets). ts_compile drops them
 * once the program is built; ts_compile_keep hands them to the caller as
 * well (tests that check the passes' work read them). */
typedef struct ts_compiled_graph {
    ts_graph *graph;
    int32_t *order;
    int n_order;
    ts_memplan mp;
} ts_compiled_graph;

/* ts_compile, also filling *keep (free it with ts_compiled_graph_free,
 * whether or not the compile succeeded). */
ts_status ts_compile_keep(const ts_graph *g, const ts_train_spec *spec,
                          const ts_compile_options *opt, ts_plan **out, ts_compiled_graph *keep);
void ts_compiled_graph_free(ts_compiled_graph *k);

#endif
