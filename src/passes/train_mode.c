/* The train_mode pass: ops that behave differently in training and
 * inference (dropout, batch norm's batch statistics) get the plan's mode
 * in their training attribute. Runs after every pass that adds such ops
 * and before simplify, which may fold an inference-mode dropout away. */
#include "passes.h"

ts_status ts_pass_train_mode(ts_graph *g, int training) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TS_OP_DROPOUT)
            g->nodes[i].a.dropout.training = training;
        else if (g->nodes[i].op == TS_OP_BATCH_NORM)
            g->nodes[i].a.batch_norm.training = training;
    return TS_OK;
}
