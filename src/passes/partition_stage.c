/* partition_stage.c — the training graph of one pipeline stage: its range
 * of the forward graph, with the activation it receives as the parameter
 * "pipe.in" (so autodiff gives its gradient, "grad:pipe.in", which goes
 * back to the previous stage) and, unless it is the last stage, the loss
 * sum(pipe.out * pipe.grad): its gradient with respect to pipe.out is
 * exactly the received pipe.grad (a product with 1), so every gradient of
 * the stage is the one the whole graph computes. */
#include <stdlib.h>
#include <string.h>
#include "ops/op.h"
#include "passes/partition.h"
#include "passes/partition_graph.h"

static ts_val copy_leaf(const ts_graph *g, ts_graph *sg, int32_t v) {
    const ts_value *x = &g->values[v];
    const ts_type *t = &x->t;
    switch (x->kind) {
    case TS_VK_INPUT: return ts_input(sg, x->name, t->dtype, t->rank, t->dims);
    case TS_VK_PARAM: {
        ts_init init = x->init;
        if (init.kind == TS_INIT_BUFFER) init.data = x->data;
        return ts_param(sg, x->name, t->dtype, t->rank, t->dims, init);
    }
    case TS_VK_CONST: return ts_constant(sg, x->name, t->dtype, t->rank, t->dims, x->data);
    default:
        ts_graph_set_error(sg, ts_fail(TS_ERR_UNSUPPORTED,
                                       "pipeline: stage input '%s' is persistent state (BatchNorm "
                                       "statistics), which stages cannot hold yet",
                                       x->name ? x->name : "?"));
        return TS_NONE;
    }
}

ts_status ts_partition_stage_graph(const ts_graph *g, ts_val loss, const ts_partition *p, int s,
                                   ts_graph **out, ts_val *stage_loss) {
    int n_order, first, count;
    int32_t in_cut, out_cut;
    const int32_t *order = ts_partition_order(p, &n_order);
    ts_partition_stage_nodes(p, s, &first, &count, &in_cut, &out_cut);
    int32_t *map = malloc((size_t)g->n_values * sizeof *map);
    ts_graph *sg = ts_graph_new();
    if (!map || !sg) {
        free(map);
        ts_graph_free(sg);
        return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for stage %d's graph", s);
    }
    for (int v = 0; v < g->n_values; v++) map[v] = -1;
    if (in_cut >= 0) {
        const ts_type *t = &g->values[in_cut].t;
        map[in_cut] = ts_param(sg, "pipe.in", t->dtype, t->rank, t->dims, ts_init_zeros()).id;
    }
    for (int i = first; i < first + count && !sg->status; i++) {
        const ts_node *n = &g->nodes[order[i]];
        ts_val in[64];
        if (n->n_in > 64 || n->n_ctrl) {
            ts_graph_free(sg), free(map);
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "pipeline: node %d (%s) has %d inputs and %d "
                           "control edges, more than a stage copies",
                           order[i], ts_ir_op_name(n->op), n->n_in, n->n_ctrl);
        }
        for (int j = 0; j < n->n_in; j++) {
            const int32_t v = n->in[j];
            if (map[v] < 0) {
                if (g->values[v].kind == TS_VK_NODE) {
                    ts_graph_free(sg), free(map);
                    return ts_fail(TS_ERR_INTERNAL,
                                   "pipeline: stage %d reads value %d made by another stage", s, v);
                }
                map[v] = copy_leaf(g, sg, v).id;
            }
            in[j] = ts_mkval(map[v]);
        }
        ts_val outs[TS_MAX_OUT];
        ts_node_add(sg, n->op, n->n_in, in, &n->a, outs);
        for (int j = 0; j < n->n_out && !sg->status; j++) {
            map[n->out[j]] = outs[j].id;
            const ts_value *ov = &g->values[n->out[j]];
            if (ov->name) ts_set_name(sg, outs[j], ov->name);
        }
    }
    ts_val l = TS_NONE;
    if (!sg->status) {
        if (out_cut < 0) {
            l = ts_mkval(map[loss.id]);
        } else {
            /* sum(out * grad): d/d(out) = grad */
            const ts_val o = ts_mkval(map[out_cut]);
            const ts_type *t = &g->values[out_cut].t;
            ts_mark_output(sg, o, "pipe.out");
            const ts_val gin = ts_input(sg, "pipe.grad", t->dtype, t->rank, t->dims);
            l = ts_sum(sg, ts_mul(sg, o, gin), 0, NULL, 0);
        }
    }
    free(map);
    if (sg->status) {
        const ts_status st = ts_fail(sg->status, "pipeline: stage %d's graph: %s", s, sg->error);
        ts_graph_free(sg);
        return st;
    }
    *out = sg;
    *stage_loss = l;
    return TS_OK;
}

int ts_partition_param_stages(const ts_graph *g, const ts_partition *p, const char *name,
                              int *stages) {
    const ts_val v = ts_find(g, name);
    int n_order, n = 0;
    const int32_t *order = ts_partition_order(p, &n_order);
    for (int s = 0; s < ts_partition_stages(p); s++) {
        int first, count;
        int32_t a, b;
        ts_partition_stage_nodes(p, s, &first, &count, &a, &b);
        stages[s] = 0;
        for (int i = first; i < first + count && !stages[s] && v.id >= 0; i++) {
            const ts_node *nd = &g->nodes[order[i]];
            for (int j = 0; j < nd->n_in; j++) stages[s] |= nd->in[j] == v.id;
        }
        n += stages[s];
    }
    return n;
}
