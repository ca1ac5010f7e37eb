/* registry.c — the table of op definitions, indexed by ts_op_id, generated
 * from ops.def. Adding an op: a ts_op_def in its family file and one line
 * in ops.def. */
#include <pthread.h>
#include <string.h>
#include "op.h"

#define X(NAME, name) extern const ts_op_def ts_def_##name;
#include "ops/ops.def"
#undef X

static const ts_op_def *const table[TS_OP_COUNT] = {
#define X(NAME, name) [TS_OP_##NAME] = &ts_def_##name,
#include "ops/ops.def"
#undef X
};

const ts_op_def *ts_op_get(int op) {
    return (op >= 0 && op < TS_OP_COUNT) ? table[op] : NULL;
}

int ts_op_find(const char *name) {
    for (int i = 0; i < TS_OP_COUNT; i++)
        if (table[i] && strcmp(table[i]->name, name) == 0) return i;
    return -1;
}

/* ---- the IR's view of the ops (ir.h: ts_op_hooks) --------------------- */

static const char *hook_name(int op) {
    const ts_op_def *def = ts_op_get(op);
    return def ? def->name : NULL;
}

static int hook_arity(int op, int *min_in, int *max_in) {
    const ts_op_def *def = ts_op_get(op);
    if (!def) return 0;
    *min_in = def->min_in;
    *max_in = def->max_in;
    return 1;
}

static ts_status hook_infer(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_op_def *def = ts_op_get(n->op);
    if (!def) return ts_fail(TS_ERR_INTERNAL, "unknown op id %d", n->op);
    return def->infer(g, n, out, n_out);
}

static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

static void install_hooks(void) {
    static const ts_op_hooks hooks = {hook_name, hook_arity, hook_infer, ts_attrs_print};
    ts_ir_set_op_hooks(&hooks);
}

/* The public constructor lives here, not in src/ir, so that every graph is
 * made after the IR knows the ops (clones copy a graph made here). */
ts_graph *ts_graph_new(void) {
    pthread_once(&hooks_once, install_hooks);
    return ts_ir_graph_new();
}
