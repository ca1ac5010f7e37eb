/* The loss-scale pass: loss scaling as nodes of the step graph.
 *
 * Before autodiff (ts_pass_loss_scale_loss): a persistent f32 scalar
 * "loss_scaler.scale" (initialised to the initial scale) and
 * "loss_scaler.growth_tracker" (0), and the loss multiplied by the scale;
 * autodiff differentiates that product, so every gradient comes out
 * scaled. The scale is read at run time: the host changes it between
 * steps without recompiling. Both values are optimizer-like state, so a
 * checkpoint saves them and a resume restores them bit for bit.
 *
 * After autodiff (ts_pass_loss_scale_unscale): one unscale_grads node over
 * every gradient (unscale in place and found_inf, named "found_inf").
 * After the train pass (ts_pass_loss_scale_order): every other reader of a
 * gradient (clip coefficient, optimizer update, monitors) runs after it.
 * The update gate then skips the update when found_inf is set, and the
 * host updates the scale (src/plan/scaler.c). */
#include <stdlib.h>
#include "passes.h"

ts_status ts_pass_loss_scale_loss(ts_graph *g, const ts_precision_options *o, int32_t loss,
                                  int32_t *scaled, int32_t *scale) {
    const ts_type *lt = &g->values[loss].t;
    if (lt->dtype != TS_F32)
        return ts_fail(TS_ERR_UNSUPPORTED, "loss scaling needs an f32 loss, got %s",
                       ts_dtype_name(lt->dtype));
    ts_type st = {TS_F32, 0, {0}};
    int32_t s = ts_value_new(g, &st, TS_VK_STATE, "loss_scaler.scale");
    int32_t t = ts_value_new(g, &st, TS_VK_STATE, "loss_scaler.growth_tracker");
    if (s < 0 || t < 0) return ts_graph_status(g);
    double init = o->init_scale > 0 ? o->init_scale : 65536.0;
    g->values[s].init = ts_init_constant(init);
    g->values[t].init = ts_init_zeros();
    ts_val sl = ts_node_add(g, TS_OP_MUL, 2, (ts_val[]){ts_mkval(loss), ts_mkval(s)}, NULL, NULL);
    ts_status rc = ts_graph_status(g);
    if (rc != TS_OK) return rc;
    *scaled = sl.id;
    *scale = s;
    return TS_OK;
}

ts_status ts_pass_loss_scale_unscale(ts_graph *g, int32_t scale, const int32_t *grads, int n,
                                     int32_t *node) {
    *node = -1;
    int ng = 0;
    for (int i = 0; i < n; i++) ng += grads[i] >= 0;
    if (!ng) return TS_OK;
    ts_val *in = ts_alloc(sizeof(ts_val) * (size_t)(ng + 1), "loss scale");
    if (!in) return TS_ERR_NOMEM;
    int k = 0;
    in[k++] = ts_mkval(scale);
    for (int i = 0; i < n; i++)
        if (grads[i] >= 0) in[k++] = ts_mkval(grads[i]);
    ts_val f = ts_node_add(g, TS_OP_UNSCALE_GRADS, k, in, NULL, NULL);
    free(in);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    *node = g->n_nodes - 1;
    g->values[f.id].is_output = 1;
    return ts_set_name(g, f, "found_inf");
}

ts_status ts_pass_loss_scale_order(ts_graph *g, int32_t node) {
    if (node < 0) return TS_OK;
    char *is_grad = ts_zalloc((size_t)g->n_values + 1, "loss scale");
    if (!is_grad) return TS_ERR_NOMEM;
    const ts_node *u = &g->nodes[node];
    for (int j = 1; j < u->n_in; j++) is_grad[u->in[j]] = 1;
    ts_status s = TS_OK;
    for (int i = node + 1; i < g->n_nodes && s == TS_OK; i++) {
        const ts_node *r = &g->nodes[i];
        for (int j = 0; j < r->n_in; j++)
            if (is_grad[r->in[j]]) {
                s = ts_node_add_ctrl(g, i, node);
                break;
            }
    }
    free(is_grad);
    return s;
}
