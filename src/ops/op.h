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

/* The op ids, in the order of ops.def (which documents each op's operands). */
typedef enum ts_op_id {
#define X(NAME, name) TS_OP_##NAME,
#include "ops/ops.def"
#undef X
    TS_OP_COUNT
} ts_op_id;

enum { TS_GRAD_STATS_N = 4 };

/* A tensor as a kernel sees it: contiguous, row-major. */
typedef struct ts_tensor {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    void *data;
} ts_tensor;

static inline int64_t ts_tensor_numel(const ts_tensor *t) {
    return ts_shape_numel(t->rank, t->dims);
}

/* What the runtime tells a kernel about the step being run. */
typedef struct ts_step_ctx {
    int64_t step;  /* 1-based index of this step */
    uint64_t seed; /* compile seed */
    double lr;     /* learning rate for this step (schedule applied) */
    /* 1-based count of applied updates including this one (the optimizer's
     * t: a step the update gate skips does not count). 0: not counted
     * separately, the optimizer kernels use `step`. */
    int64_t opt_step;
} ts_step_ctx;

typedef struct ts_kargs {
    const ts_attrs *a;
    int n_in, n_out;
    const ts_tensor *in;
    const ts_tensor *out;
    void *scratch; /* scratch_bytes from the op's scratch(); 64-byte aligned */
    size_t scratch_bytes;
    const ts_step_ctx *ctx;
    const char *label; /* name of the first output, for messages */
    void *backend;     /* backend state for this instruction (optimised kernels) */
} ts_kargs;

typedef ts_status (*ts_kernel_fn)(const ts_kargs *k);

enum {
    TS_OPF_ELEMENTWISE = 1 << 0, /* output[i] depends on inputs at i (after broadcast) */
    TS_OPF_SIDE_EFFECT = 1 << 1, /* writes its inputs in place (optimizer): never removed */
    TS_OPF_ALIAS = 1 << 2,       /* output 0 is input 0's memory reinterpreted (reshape) */
    TS_OPF_INPLACE = 1 << 3,     /* output 0 may share input 0's memory when sizes match */
    TS_OPF_RANDOM = 1 << 4,      /* draws random numbers: never merged or folded */
    TS_OPF_UPDATE = 1 << 5,      /* update phase (clip coefficient, optimizer): the update
                                    gate (ts_plan_set_update_gate) may skip it */
    TS_OPF_MONITOR = 1 << 6,     /* reads a gradient into a small monitor output: scheduled
                                    as soon as it is ready, always before the update phase */
    TS_OPF_INPLACE_IN1 = 1 << 7  /* output 0 may share input 1's memory when sizes match */
};

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
/* Kernel error for a dtype it does not handle. */
ts_status ts_kernel_bad_dtype(const ts_kargs *k, const char *op, ts_dtype dt);

#endif
