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
