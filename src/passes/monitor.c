/* The monitor pass: one grad_stats node per gradient (src/ops/monitor.c),
 * whose output "monitor:NAME" the session reads after every step, and
 * control edges that put every monitor before the update phase, where the
 * update gate (ts_plan_set_update_gate) is asked. Built before the train
 * pass so node ids stay a topological order (the build-order schedule
 * remains valid); ordered once the update nodes exist. */
#include <stdio.h>
#include "passes.h"

ts_status ts_pass_monitor(ts_graph *g, const int32_t *params, const int32_t *grads, int n) {
    for (int i = 0; i < n; i++) {
        if (grads[i] < 0) continue;
        const ts_dtype dt = g->values[grads[i]].t.dtype;
        if (dt != TS_F32 && dt != TS_F64) continue;
        char name[512];
        snprintf(name, sizeof name, "monitor:%s",
                 g->values[params[i]].name ? g->values[params[i]].name : "?");
        ts_attrs a = ts_attrs_zero();
        ts_val gv = ts_mkval(grads[i]);
        ts_val m = ts_node_add(g, TS_OP_GRAD_STATS, 1, &gv, &a, NULL);
        ts_status s = ts_graph_status(g);
        if (s != TS_OK) return s;
        if ((s = ts_set_name(g, m, name)) != TS_OK) return s;
        g->values[m.id].is_output = 1;
    }
    return TS_OK;
}

ts_status ts_pass_monitor_order(ts_graph *g) {
    const int nn = g->n_nodes;
    for (int u = 0; u < nn; u++) {
        if (!(ts_op_get(g->nodes[u].op)->flags & TS_OPF_UPDATE)) continue;
        for (int m = 0; m < nn; m++) {
            if (!(ts_op_get(g->nodes[m].op)->flags & TS_OPF_MONITOR)) continue;
            ts_status s = ts_node_add_ctrl(g, u, m);
            if (s != TS_OK) return s;
        }
    }
    return TS_OK;
}
