/* The masked loss of a model trained on shape buckets (shapes.h). */
#include "session/shapes.h"

#include <stdio.h>

ts_status ts_shape_mask_loss(ts_graph *g, ts_model *m, ts_train_spec *spec) {
    if (ts_dtype_of(g, m->target) != TS_F32) return TS_OK; /* class ids: ignore index */
    int64_t B = ts_dim(g, m->target, 0);
    int64_t n = ts_numel(g, m->output), K = n / B;
    if (ts_numel(g, m->target) != n)
        return ts_fail(TS_ERR_SHAPE, "masked loss: output and target sizes differ (%lld vs %lld)",
                       (long long)n, (long long)ts_numel(g, m->target));
    int64_t md[1] = {B}, fd[2] = {B, K};
    ts_val mask = ts_input(g, "mask", TS_F32, 1, md);
    ts_val d = ts_sub(g, ts_reshape(g, m->output, 2, fd), ts_reshape(g, m->target, 2, fd));
    int ax1[1] = {1}, ax0[1] = {0};
    ts_val rows = ts_sum(g, ts_mul(g, d, d), 1, ax1, 0); /* [B] */
    ts_val num = ts_sum(g, ts_mul(g, rows, mask), 1, ax0, 0);
    ts_val den = ts_affine_scalar(g, ts_sum(g, mask, 1, ax0, 0), (double)K, 0.0);
    ts_val loss = ts_div(g, num, den);
    ts_status s = ts_graph_status(g);
    if (s == TS_OK) s = ts_set_name(g, m->loss, "unmasked_loss");
    if (s == TS_OK) s = ts_set_name(g, loss, "loss");
    if (s != TS_OK) return s;
    m->loss = loss;
    spec->loss = loss;
    return TS_OK;
}

ts_status ts_shape_weight_loss(ts_graph *g, ts_model *m, ts_train_spec *spec) {
    int64_t d1[1] = {1};
    ts_val w = ts_input(g, "loss_weight", TS_F32, 1, d1);
    const int r = ts_rank(g, m->loss);
    int64_t ld[TS_MAX_RANK];
    for (int i = 0; i < r; i++) ld[i] = ts_dim(g, m->loss, i);
    ts_val loss = ts_mul(g, m->loss, ts_reshape(g, w, r, ld));
    ts_status s = ts_graph_status(g);
    if (s == TS_OK) s = ts_set_name(g, m->loss, "rank_loss");
    if (s == TS_OK) s = ts_set_name(g, loss, "loss");
    if (s != TS_OK) return s;
    m->loss = loss;
    spec->loss = loss;
    return TS_OK;
}
