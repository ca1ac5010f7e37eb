/* ONNX GRU and LSTM (one direction, layout 0: X [T, B, I]) unrolled over
 * the static T onto tessel's cells, as torch.onnx exports nn.GRU / nn.LSTM
 * (one node per layer). ONNX orders the gates z, r, h (GRU) and i, o, f, c
 * (LSTM); ts_gru_cell / ts_lstm_cell take torch's r, z, n and i, f, g, o,
 * so the weight rows are reordered by graph slices (differentiable: a
 * torch export computes W itself from the state dict's weights by slices
 * and concats, and the gradient flows back through both). The input
 * projection of all steps is one matmul; only the hidden one runs per step.
 * Outputs: Y [T, 1, B, H], Y_h [1, B, H] (and Y_c for the LSTM). */
#include <stdio.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"

typedef const Onnx__NodeProto node;

/* Rows of w [G*H, ...] (or a [G*H] bias) reordered: block k of the result
 * is block order[k] of w. */
static ts_val reorder(ts_graph *g, ts_val w, int64_t H, int G, const int *order) {
    ts_val parts[4];
    for (int k = 0; k < G; k++) parts[k] = ts_slice(g, w, 0, order[k] * H, (order[k] + 1) * H);
    return ts_concat(g, G, parts, 0);
}

/* Drops the leading num_directions axis (1) of W, R, B or an initial state. */
static ts_val first(ts_graph *g, ts_val v) {
    const int r = ts_rank(g, v);
    int64_t d[TS_MAX_RANK];
    for (int k = 1; k < r; k++) d[k - 1] = ts_dim(g, v, k);
    return ts_reshape(g, v, r - 1, d);
}

static int string_attr_is(node *n, const char *name, const char *want) {
    const Onnx__AttributeProto *a = onnx_attr(n, name);
    return !a || !a->has_s || (a->s.len == strlen(want) && !memcmp(a->s.data, want, a->s.len));
}

ts_status onnx_op_rnn(onnx_ctx *x, node *n) {
    ts_status s;
    const int lstm = n->op_type[0] == 'L';
    const int G = lstm ? 4 : 3;
    if ((s = onnx_only_attrs(x, n,
                             lstm ? "direction hidden_size layout input_forget"
                                  : "direction hidden_size layout linear_before_reset")) ||
        (s = onnx_need_inputs(x, n, 3, lstm ? 8 : 6)))
        return s;
    if (!string_attr_is(n, "direction", "forward"))
        return onnx_refuse(x, n, "only direction 'forward' is supported");
    if (onnx_attr_i(n, "layout", 0) != 0)
        return onnx_refuse(x, n, "only layout 0 (X as [seq, batch, input]) is supported");
    if (!lstm && onnx_attr_i(n, "linear_before_reset", 0) != 1)
        return onnx_refuse(x, n, "linear_before_reset must be 1 (torch's GRU)");
    if (lstm && onnx_attr_i(n, "input_forget", 0))
        return onnx_refuse(x, n, "input_forget 1 is not supported");
    if (lstm && n->n_input > 7 && n->input[7][0])
        return onnx_refuse(x, n, "peephole weights (P) are not supported");
    ts_graph *g = x->g;
    ts_val X = onnx_in(x, n, 0), W = onnx_in(x, n, 1), R = onnx_in(x, n, 2);
    if (ts_rank(g, X) != 3 || ts_rank(g, W) != 3 || ts_rank(g, R) != 3 || ts_dim(g, W, 0) != 1)
        return onnx_refuse(x, n, "X, W and R must be rank 3 with one direction");
    const int64_t T = ts_dim(g, X, 0), B = ts_dim(g, X, 1), I = ts_dim(g, X, 2);
    const int64_t H = ts_dim(g, R, 2);
    if (onnx_attr_i(n, "hidden_size", H) != H || ts_dim(g, W, 1) != G * H || ts_dim(g, W, 2) != I)
        return onnx_refuse(x, n, "W / R do not match hidden_size %lld and input %lld", (long long)H,
                           (long long)I);
    if (n->n_input > 4 && n->input[4][0]) {
        const onnx_const *sl = onnx_const_of(x, n->input[4]);
        int all = sl && sl->i;
        for (int64_t k = 0; all && k < sl->n; k++) all = sl->i[k] == T;
        if (!all)
            return onnx_refuse(x, n, "sequence_lens must be a constant, all %lld", (long long)T);
    }
    static const int gru_order[3] = {1, 0, 2}, lstm_order[4] = {0, 2, 3, 1};
    const int *order = lstm ? lstm_order : gru_order;
    ts_val Wt = reorder(g, first(g, W), H, G, order), Rt = reorder(g, first(g, R), H, G, order);
    ts_val bi = TS_NONE, bh = TS_NONE;
    if (n->n_input > 3 && n->input[3][0]) {
        ts_val b = first(g, onnx_in(x, n, 3));
        bi = reorder(g, ts_slice(g, b, 0, 0, G * H), H, G, order);
        bh = reorder(g, ts_slice(g, b, 0, G * H, 2 * G * H), H, G, order);
    }
    int64_t d2[2] = {T * B, I}, d3[3] = {T, B, G * H}, dbh[2] = {B, H};
    ts_val gi = ts_reshape(g, ts_linear(g, ts_reshape(g, X, 2, d2), Wt, bi), 3, d3);
    ts_val h = n->n_input > 5 && n->input[5][0] ? ts_reshape(g, onnx_in(x, n, 5), 2, dbh) : TS_NONE;
    ts_val c = lstm && n->n_input > 6 && n->input[6][0] ? ts_reshape(g, onnx_in(x, n, 6), 2, dbh)
                                                        : TS_NONE;
    if (!ts_val_ok(h) || (lstm && !ts_val_ok(c))) {
        onnx_const *z = onnx_const_new(TS_F32, 2, dbh);
        if (!z) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
        ts_val zeros = ts_constant(g, NULL, TS_F32, 2, dbh, z->f);
        onnx_const_free(z);
        if (!ts_val_ok(h)) h = zeros;
        if (lstm && !ts_val_ok(c)) c = zeros;
    }
    ts_val ys[1024];
    if (T < 1 || T > 1024)
        return onnx_refuse(x, n, "sequence length %lld (1 to 1024)", (long long)T);
    int64_t dstep[2] = {B, G * H}, dy[4] = {1, 1, B, H};
    for (int64_t t = 0; t < T; t++) {
        ts_val git = ts_reshape(g, ts_slice(g, gi, 0, t, t + 1), 2, dstep);
        ts_val gh = ts_linear(g, h, Rt, bh);
        h = lstm ? ts_lstm_cell(g, git, gh, c, &c) : ts_gru_cell(g, git, gh, h);
        ys[t] = ts_reshape(g, h, 4, dy);
    }
    int64_t dn[3] = {1, B, H};
    ts_val outs[3] = {T == 1 ? ys[0] : ts_concat(g, (int)T, ys, 0), ts_reshape(g, h, 3, dn),
                      lstm ? ts_reshape(g, c, 3, dn) : TS_NONE};
    if (ts_graph_status(g) != TS_OK) return ts_graph_status(g);
    for (size_t k = 0; k < n->n_output && k < (size_t)(lstm ? 3 : 2); k++)
        if (n->output[k][0] && (s = onnx_define(x, n->output[k], outs[k], NULL)) != TS_OK) return s;
    return TS_OK;
}
