/* op.h — how an op is defined (internal).
 *
 * Every op is one ts_op_def in a file of its family (src/ops/<family>.c)
 * and one line X(NAME, name) in ops.def, which generates its id TS_OP_NAME
 * and its entry in the registry (registry.c). A definition gives:
 *   - infer:  output dtypes and shapes from the input types and attributes;
 *             on a mismatch return ts_fail(TS_ERR_SHAPE, "...") with the
 *             reason; ts_node_add() prefixes the op name and operand shapes.
 *   - grad:   emits the backward nodes through the builder (ts_node_add or
 *             the public ts_* builders). dout[i] is the gradient flowing
 *             into output i (TS_NONE if none); set din[j] for each input j
 *             that gets a gradient (leave TS_NONE otherwise). NULL: the op
 *             is not differentiable (autodiff reports it by name).
 *   - kernel: the reference CPU kernel. Tensors are contiguous row-major;
 *             float ops support f32 and f64 (gradient checks run in f64).
 *   - scratch: bytes of temporary memory the kernel needs (planned in the
 *             arena, so a step allocates nothing). NULL means none.
 *   - cost:   floating-point operations of one execution (for reports).
 */
#ifndef TS_OP_H
#define TS_OP_H

#include "ir/ir.h"
#include "core/kernel.h" /* ts_tensor, ts_kargs, ts_kernel_fn, TS_OPF_* */
#include "ops/op_ids.h"  /* ts_op_id */

enum { TS_GRAD_STATS_N = 4 };

typedef struct ts_op_def {
    const char *name;
    int min_in, max_in; /* input count bounds (max_in -1: unbounded) */
    unsigned flags;
    ts_status (*infer)(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out);
    ts_status (*grad)(ts_graph *g, const ts_node *n, const ts_val *dout, ts_val *din);
    ts_kernel_fn kernel;
    size_t (*scratch)(const ts_graph *g, const ts_node *n);
    double (*cost)(const ts_graph *g, const ts_node *n);
} ts_op_def;

const ts_op_def *ts_op_get(int op);
/* Op id by name, -1 if unknown. */
int ts_op_find(const char *name);

/* Node n's attributes as text (" name=value ..." by the fields of its
 * family, zeros left out): attrs_print.c. */
void ts_attrs_print(const ts_node *n, FILE *out);

/* Helpers for definitions. */
static inline const ts_type *ts_in_type(const ts_graph *g, const ts_node *n, int i) {
    return &g->values[n->in[i]].t;
}
/* Broadcast shapes a and b NumPy-style into out; error message on mismatch. */
ts_status ts_broadcast_shapes(const ts_type *a, const ts_type *b, ts_type *out);
/* The gradient dy of a broadcast result, summed down to the shape of value
 * `like` (returns dy itself when shapes already match). Takes a value, not
 * a type pointer: pointers into g->values move as nodes are added. */
ts_val ts_sum_to(ts_graph *g, ts_val dy, ts_val like);
/* The sum of squares clip_coef forms for one f32 gradient of n elements
 * (fixed blocks in double, added in order): for clipping done outside the
 * kernel with the same bits (pipeline stages, session/stages_run.c). */
double ts_clip_sumsq_f32(const float *x, int64_t n);
/* Where an sgd_update / adam_update node's inputs lie (ops/optim.c): ng parameter groups
 * of gs inputs (p, g[, state...]), the clip coefficient if has_coef, then from input
 * first_copy the bf16 / f16 copies of the first n_low groups' parameters, which the update
 * rewrites (passes/weight_copies.c). Returns 0 for another op or inputs that do not fit. */
typedef struct ts_update_layout {
    int gs, ng, has_coef, n_low, first_copy;
} ts_update_layout;
int ts_update_layout_of(int op, const ts_attrs *a, int n_in, ts_update_layout *out);
/* Kernel error for a dtype it does not handle. */
ts_status ts_kernel_bad_dtype(const ts_kargs *k, const char *op, ts_dtype dt);

#endif
