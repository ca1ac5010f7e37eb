/* lower.h — the steps of ts_compile after the passes (internal to
 * src/plan): each reads the final graph once, while ts_compile still has
 * it, and leaves in the plan what the plan needs without it.
 *
 *     ts_lower(&p->prog, cg, loss);      // instructions, layout, named values (lower.c)
 *     ts_render_dumps(&p->prog, cg);     // with opt.keep_dumps (dump.c)
 *     ts_arena_init(p, cg);              // memory, first values (arena.c)
 *     ts_bind(p);                        // runtime instructions on the arena (arena.c)
 */
#ifndef TS_PLAN_LOWER_H
#define TS_PLAN_LOWER_H

#include "plan/plan.h"

/* The program of the scheduled graph: its instructions (op, flags, kernel,
 * attributes, operand types and offsets, scratch, label), the update gate,
 * the arena layout, the named values (loss: the loss value id, -1 for
 * inference) and, under ZeRO, the shard layout. */
ts_status ts_lower(ts_program *prog, const ts_compiled_graph *cg, int32_t loss);
/* ZeRO: the pieces ts_plan_shard_layout reports, from the graph's
 * shard_update nodes (shard_layout.c). node_of[i]: instruction i's node;
 * named_of[v]: value v's index in prog->named, -1 if unnamed. */
ts_status ts_lower_shard_layout(ts_program *prog, const ts_graph *g, const int *node_of,
                                const int *named_of);
/* With prog->opt.keep_dumps: the IR and memory dumps as text (dump.c). */
ts_status ts_render_dumps(ts_program *prog, const ts_compiled_graph *cg);
/* Allocate the arena (and ZeRO's shared parameters) and write the
 * parameters', state's and constants' first values (arena.c). */
ts_status ts_arena_init(ts_plan *p, const ts_compiled_graph *cg);
/* The runtime's instructions: tensors in the arena, kernel arguments. */
ts_status ts_bind(ts_plan *p);
/* Before ts_arena_init: p's parameters, gradients and state are share's
 * (plan_shared.c); fails naming the first difference of their layouts. */
ts_status ts_plan_borrow_state(ts_plan *p, const ts_plan *share, int scales_loss);
/* Free what ts_lower and ts_render_dumps made. */
void ts_program_free(ts_program *prog);

#endif
