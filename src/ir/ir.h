/* ir.h — the graph IR seen by ops and passes (internal).
 *
 * A graph is two arrays: values (typed tensors, SSA: each is written once)
 * and nodes (an op applied to input values, producing output values). Nodes
 * are kept in a valid topological order: a node only reads values created
 * before it. Passes append nodes and mark others dead; ts_graph_compact()
 * removes the dead ones.
 *
 * Ops are created through ts_node_add(), which runs the op's shape/dtype
 * inference and records a message naming the op and operand shapes on
 * failure (sticky graph error, see tessel/graph.h).
 */
#ifndef TS_IR_H
#define TS_IR_H

#include <stdio.h>
#include "core/attrs.h"
#include "core/core.h"
#include "core/kernel.h" /* TS_MAX_OUT */
#include "tessel/graph.h"

typedef enum ts_value_kind {
    TS_VK_NODE = 0, /* produced by a node */
    TS_VK_INPUT,    /* fed each step */
    TS_VK_PARAM,    /* trainable parameter (persistent) */
    TS_VK_CONST,    /* constant data owned by the graph */
    TS_VK_STATE     /* persistent non-trainable state (optimizer moments, ...) */
} ts_value_kind;

typedef struct ts_type {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
} ts_type;

typedef struct ts_value {
    ts_type t;
    ts_value_kind kind;
    int32_t node;     /* producing node (TS_VK_NODE), else -1 */
    int out_index;    /* which output of that node */
    char *name;       /* may be NULL until named */
    ts_init init;     /* PARAM and STATE */
    void *data;       /* CONST: owned copy; PARAM with TS_INIT_BUFFER: owned copy */
    int is_output;    /* marked with ts_mark_output (or the loss) */
    int32_t grad_of;  /* this value is the final gradient of that param, else -1 */
    int32_t state_of; /* STATE belonging to that param, else -1 */
} ts_value;

typedef struct ts_node {
    int op; /* ts_op_id */
    int n_in, n_out;
    int32_t *in; /* n_in value ids (owned) */
    int32_t out[TS_MAX_OUT];
    ts_attrs a;
    int n_ctrl;
    int32_t *ctrl; /* control dependencies: nodes that must run before (owned) */
    int dead;
    /* 1: autodiff's recomputed copy of a forward node (passes/autodiff.c),
     * which CSE (passes/simplify.c) must not merge back into the original. */
    int recompute;
} ts_node;

struct ts_graph {
    ts_value *values;
    int n_values, cap_values;
    ts_node *nodes;
    int n_nodes, cap_nodes;
    ts_status status;
    char error[1024];
    int64_t next_stream; /* per-node random stream ids (dropout) */
};

static inline ts_value *ts_v(const ts_graph *g, ts_val v) {
    return &g->values[v.id];
}
static inline ts_val ts_mkval(int32_t id) {
    return (ts_val){id};
}
static inline size_t ts_type_bytes(const ts_type *t) {
    return (size_t)ts_shape_numel(t->rank, t->dims) * ts_dtype_size(t->dtype);
}
static inline int64_t ts_type_numel(const ts_type *t) {
    return ts_shape_numel(t->rank, t->dims);
}
int ts_type_equal(const ts_type *a, const ts_type *b);
char *ts_type_str(char *buf, size_t n, const ts_type *t);

/* What the IR needs to know about ops, supplied by the ops layer (src/ops
 * installs them in ts_graph_new, before the first graph exists), so that the
 * IR depends on src/core only:
 *   name:  the op's name, NULL if op is not a known op id;
 *   arity: its input count bounds (max_in -1: unbounded), 0 if unknown;
 *   infer: output types of node n (see ts_op_def.infer in ops/op.h);
 *   print_attrs: n's attributes for ts_graph_print (" name=value ...",
 *          nothing when all are zero). */
typedef struct ts_op_hooks {
    const char *(*name)(int op);
    int (*arity)(int op, int *min_in, int *max_in);
    ts_status (*infer)(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out);
    void (*print_attrs)(const ts_node *n, FILE *out);
} ts_op_hooks;
void ts_ir_set_op_hooks(const ts_op_hooks *h);
/* Name of op for messages and dumps ("?" if unknown). */
const char *ts_ir_op_name(int op);
/* An empty graph (ts_graph_new, the public constructor, is in the ops layer:
 * it installs the op hooks first). */
ts_graph *ts_ir_graph_new(void);

/* Record the graph's first error (sticky) from the current ts_last_error(). */
void ts_graph_set_error(ts_graph *g, ts_status s);

/* Append a value (no producer yet). Returns its id or -1 with error set. */
int32_t ts_value_new(ts_graph *g, const ts_type *t, ts_value_kind kind, const char *name);

/* Returned by ts_node_add for a node without outputs (an optimizer update). */
#define TS_NO_OUTPUT (-2)

/* Add a node: runs the op's inference, creates its outputs, returns the
 * first output (all outputs in outs[] if non-NULL). Inputs equal to TS_NONE
 * make it return TS_NONE quietly (the earlier error stands). */
ts_val ts_node_add(ts_graph *g, int op, int n_in, const ts_val *in, const ts_attrs *attrs,
                   ts_val *outs);
/* Make value v (from ts_value_new, no producer yet) the next output of node `node`: for passes
 * that give an op one more result (a bf16 copy, a derivative, the lse). TS_ERR_INTERNAL when
 * the node already has TS_MAX_OUT outputs. */
ts_status ts_node_append_output(ts_graph *g, int32_t node, int32_t v);

/* How many times live nodes read value v as an input (a node reading it twice counts twice);
 * *last (when there is a read) is the last such node's index. */
int ts_value_reads(const ts_graph *g, int32_t v, int *last);
/* Add a control dependency: node `after` must run after node `before`. */
ts_status ts_node_add_ctrl(ts_graph *g, int32_t after, int32_t before);

/* Deep copy. */
ts_graph *ts_graph_clone(const ts_graph *g);
/* Drop dead nodes and values nothing refers to; keeps order. value ids
 * change: remap[old] = new or -1 (remap may be NULL). */
ts_status ts_graph_compact(ts_graph *g, int32_t *remap);
/* Put the nodes in the order perm[0..n) (old node ids, n == g->n_nodes,
 * each once) and renumber every reference to a node (control edges,
 * producers of values). Passes that insert nodes and then need them in
 * place call this once instead of moving nodes one by one. */
ts_status ts_graph_permute_nodes(ts_graph *g, const int32_t *perm, int n);
/* Check invariants (topological order, types re-inferred, ids in range). */
ts_status ts_graph_verify(const ts_graph *g);
/* Text form of the graph, one node per line. */
void ts_graph_print(const ts_graph *g, const int32_t *order, FILE *out);
/* Name of a value for messages: its name or "%<id>". */
const char *ts_value_label(const ts_graph *g, int32_t id, char *buf, size_t n);
/* Normalise a possibly negative axis for rank r; -1 if out of range. */
int ts_axis(int axis, int rank);

#endif
