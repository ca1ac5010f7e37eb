/* GRU and LSTM cells (PyTorch gate order and bias semantics) and the
 * multi-layer sequence builders ts_gru / ts_lstm.
 *
 * A cell op takes the input projection gi = x W_ih^T + b_ih and the hidden
 * projection gh = h W_hh^T + b_hh (both GEMMs stay matmul nodes, so they
 * run on oneDNN) and does the gate arithmetic:
 *   GRU  (r, z, n): r = s(gi_r + gh_r), z = s(gi_z + gh_z),
 *                   n = tanh(gi_n + r * gh_n), h' = (h - n) * z + n
 *   LSTM (i, f, g, o): i, f, o = s(gi + gh), g = tanh(gi_g + gh_g),
 *                   c' = f * c + i * g, h' = o * tanh(c')
 * written in torch's operation order, so f32 results follow torch closely.
 *
 * Sequences: the input projection of all T steps is ONE matmul per layer,
 * gi_all = x [B*T, F] @ W_ih^T viewed as [B, T, G]. A cell reads step t of
 * gi_all directly (attribute t), so no per-step slice exists: slicing T
 * pieces out of gi_all would make the backward pass sum T zero-padded
 * full-size gradients (quadratic in T). Instead gi_all is threaded through
 * the cells of a layer: each cell returns it as output 0 (TS_OPF_INPLACE,
 * so the planner gives the output the input's memory and nothing is
 * copied; a plan compiled with no_inplace copies it at every step), and
 * the next step reads that output. The backward runs the other way: each
 * backward op receives the accumulated d(gi_all) of the later steps, adds
 * its own step's rows in place, and passes it on; the whole gradient of
 * gi_all costs one pass over it. The cells keep the
 * activated gates as an extra output so the backward never reads gi_all
 * (which lets the forward chain stay in place).
 *
 * Attributes, a.rnn (core/attrs.h):
 *   gru_cell       (gi [B,T,3H], gh [B,3H], h [B,H]) -> (gi, h', gates [B,3H] = r,z,n)
 *                  t (the step)
 *   gru_cell_bwd   ([dgi_acc [B,T,3H],] h, gates, gh[, dh']) -> (dgi_acc, dgh, dh)
 *                  t, has_acc (dgi_acc), has_dh (dh'), steps (T)
 *   lstm_cell      (gi [B,T,4H], gh [B,4H], c [B,H]) -> (gi, h', c', gates [B,4H] = i,f,g,o)
 *                  t
 *   lstm_cell_bwd  ([dgi_acc,] c, gates, c'[, dh'][, dc']) -> (dgi_acc, dgates, dc)
 *                  t, has_acc, has_dh, has_dc (dc'), steps
 * Without dgi_acc the backward op's input 0 is h (or c), whose size never
 * matches output 0, so the planner cannot place the output over it.
 *
 * Kernels are elementwise over (batch row, unit): rows run in parallel,
 * each output element is computed by one thread, so any thread count gives
 * the same bits. f32 sigmoid/tanh use the vectorisable exp of vmath.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kern.h"
#include "vmath.h"

/* ---- activations: the vectorisable sigmoid/tanh of vmath.h ----------- */

#define sig_f32  m_sigmoid_f32
#define sig_f64  m_sigmoid_f64
#define tanh_f32 m_tanh_f32
#define tanh_f64 m_tanh_f64

/* ---- inference --------------------------------------------------------- */

typedef struct cell_dims {
    int64_t b, t, g, h; /* batch, steps, gate width, hidden */
} cell_dims;

static ts_status check_type(const ts_type *t, ts_dtype dt, int rank, const int64_t *dims,
                            const char *what) {
    int ok = t->dtype == dt && t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
    if (!ok) {
        char want[128], got[128];
        return ts_fail(TS_ERR_SHAPE, "%s must be %s, got %s", what,
                       ts_shape_str(want, sizeof want, dt, rank, dims),
                       ts_type_str(got, sizeof got, t));
    }
    return TS_OK;
}

/* gi [B, T, ngates * H] and the step attribute. */
static ts_status check_gi(const ts_type *gi, int ngates, int64_t t, cell_dims *d) {
    if (!ts_dtype_is_float(gi->dtype))
        return ts_fail(TS_ERR_SHAPE, "gi must be a float tensor, got %s", ts_dtype_name(gi->dtype));
    if (gi->rank != 3 || gi->dims[2] % ngates != 0) {
        char tb[128];
        return ts_fail(TS_ERR_SHAPE, "gi must be [B, T, %d*H], got %s", ngates,
                       ts_type_str(tb, sizeof tb, gi));
    }
    *d = (cell_dims){gi->dims[0], gi->dims[1], gi->dims[2], gi->dims[2] / ngates};
    if (t < 0 || t >= d->t)
        return ts_fail(TS_ERR_INVALID, "step %lld is outside [0, %lld)", (long long)t,
                       (long long)d->t);
    return TS_OK;
}

static ts_status infer_gru(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *gi = ts_in_type(g, n, 0);
    cell_dims d = {0, 0, 0, 0};
    ts_status s = check_gi(gi, 3, n->a.rnn.t, &d);
    if (s != TS_OK) return s;
    if ((s = check_type(ts_in_type(g, n, 1), gi->dtype, 2, (int64_t[]){d.b, d.g}, "gh")) != TS_OK)
        return s;
    if ((s = check_type(ts_in_type(g, n, 2), gi->dtype, 2, (int64_t[]){d.b, d.h}, "h")) != TS_OK)
        return s;
    out[0] = *gi;
    out[1] = (ts_type){.dtype = gi->dtype, .rank = 2, .dims = {d.b, d.h}};
    out[2] = (ts_type){.dtype = gi->dtype, .rank = 2, .dims = {d.b, d.g}};
    *n_out = 3;
    return TS_OK;
}

static ts_status infer_lstm(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *gi = ts_in_type(g, n, 0);
    cell_dims d = {0, 0, 0, 0};
    ts_status s = check_gi(gi, 4, n->a.rnn.t, &d);
    if (s != TS_OK) return s;
    if ((s = check_type(ts_in_type(g, n, 1), gi->dtype, 2, (int64_t[]){d.b, d.g}, "gh")) != TS_OK)
        return s;
    if ((s = check_type(ts_in_type(g, n, 2), gi->dtype, 2, (int64_t[]){d.b, d.h}, "c")) != TS_OK)
        return s;
    out[0] = *gi;
    out[1] = (ts_type){.dtype = gi->dtype, .rank = 2, .dims = {d.b, d.h}};
    out[2] = out[1];
    out[3] = (ts_type){.dtype = gi->dtype, .rank = 2, .dims = {d.b, d.g}};
    *n_out = 4;
    return TS_OK;
}

static int flag_ok(int64_t f) {
    return f == 0 || f == 1;
}

/* Shared by both backward ops: nflags optional trailing inputs after the
 * fixed ones, the accumulated gradient first when present. The state input
 * (h or c, after dgi_acc) fixes B, H and the dtype; T is a.rnn.steps. The
 * optional flags are has_dh, then (nflags 2, lstm) has_dc. */
static ts_status infer_bwd_common(const ts_graph *g, const ts_node *n, int ngates, int n_fixed,
                                  int n_opt_flags, cell_dims *d, int *k0) {
    const ts_rnn_attrs *a = &n->a.rnn;
    const int64_t flag[2] = {a->has_dh, a->has_dc};
    int has_acc = (int)a->has_acc, want = n_fixed + has_acc;
    if (!flag_ok(a->has_acc)) return ts_fail(TS_ERR_INVALID, "has_acc must be 0 or 1");
    for (int f = 0; f < n_opt_flags; f++) {
        if (!flag_ok(flag[f])) return ts_fail(TS_ERR_INVALID, "input flags must be 0 or 1");
        want += (int)flag[f];
    }
    if (n->n_in != want)
        return ts_fail(TS_ERR_INVALID, "%d inputs do not match the flags (%d expected)", n->n_in,
                       want);
    const ts_type *st = ts_in_type(g, n, has_acc);
    if (!ts_dtype_is_float(st->dtype) || st->rank != 2)
        return ts_fail(TS_ERR_SHAPE, "the state input must be a float [B, H] tensor");
    int64_t T = a->steps;
    *d = (cell_dims){st->dims[0], T, ngates * st->dims[1], st->dims[1]};
    if (T < 1 || a->t < 0 || a->t >= T)
        return ts_fail(TS_ERR_INVALID, "step %lld is outside [0, %lld)", (long long)a->t,
                       (long long)T);
    if (has_acc) {
        ts_status s =
            check_type(ts_in_type(g, n, 0), st->dtype, 3, (int64_t[]){d->b, d->t, d->g}, "dgi_acc");
        if (s != TS_OK) return s;
    }
    *k0 = has_acc;
    return TS_OK;
}

static ts_status infer_gru_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    cell_dims d = {0, 0, 0, 0};
    int k = 0;
    ts_status s = infer_bwd_common(g, n, 3, 3, 1, &d, &k);
    if (s != TS_OK) return s;
    ts_dtype dt = ts_in_type(g, n, k)->dtype;
    const int64_t bg[2] = {d.b, d.g}, bh[2] = {d.b, d.h};
    if ((s = check_type(ts_in_type(g, n, k + 1), dt, 2, bg, "gates")) != TS_OK) return s;
    if ((s = check_type(ts_in_type(g, n, k + 2), dt, 2, bg, "gh")) != TS_OK) return s;
    if (n->a.rnn.has_dh && (s = check_type(ts_in_type(g, n, k + 3), dt, 2, bh, "dh'")) != TS_OK)
        return s;
    out[0] = (ts_type){.dtype = dt, .rank = 3, .dims = {d.b, d.t, d.g}};
    out[1] = (ts_type){.dtype = dt, .rank = 2, .dims = {d.b, d.g}};
    out[2] = (ts_type){.dtype = dt, .rank = 2, .dims = {d.b, d.h}};
    *n_out = 3;
    return TS_OK;
}

static ts_status infer_lstm_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    cell_dims d = {0, 0, 0, 0};
    int k = 0;
    ts_status s = infer_bwd_common(g, n, 4, 3, 2, &d, &k);
    if (s != TS_OK) return s;
    ts_dtype dt = ts_in_type(g, n, k)->dtype;
    const int64_t bg[2] = {d.b, d.g}, bh[2] = {d.b, d.h};
    if ((s = check_type(ts_in_type(g, n, k + 1), dt, 2, bg, "gates")) != TS_OK) return s;
    if ((s = check_type(ts_in_type(g, n, k + 2), dt, 2, bh, "c'")) != TS_OK) return s;
    int j = k + 3;
    if (n->a.rnn.has_dh && (s = check_type(ts_in_type(g, n, j++), dt, 2, bh, "dh'")) != TS_OK)
        return s;
    if (n->a.rnn.has_dc && (s = check_type(ts_in_type(g, n, j++), dt, 2, bh, "dc'")) != TS_OK)
        return s;
    out[0] = (ts_type){.dtype = dt, .rank = 3, .dims = {d.b, d.t, d.g}};
    out[1] = (ts_type){.dtype = dt, .rank = 2, .dims = {d.b, d.g}};
    out[2] = (ts_type){.dtype = dt, .rank = 2, .dims = {d.b, d.h}};
    *n_out = 3;
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

static ts_status no_gate_grad(ts_graph *g, const char *op, ts_val dgates) {
    if (!ts_val_ok(dgates)) return TS_OK;
    ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                  "%s: gradients through the saved gates output are not supported", op);
    return ts_graph_status(g);
}

static ts_status grad_gru(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (no_gate_grad(g, "gru_cell", dy[2]) != TS_OK) return ts_graph_status(g);
    int has_acc = ts_val_ok(dy[0]), has_dh = ts_val_ok(dy[1]);
    if (!has_acc && !has_dh) return TS_OK;
    ts_val in[5];
    int k = 0;
    if (has_acc) in[k++] = dy[0];
    in[k++] = ts_mkval(n->in[2]);  /* h */
    in[k++] = ts_mkval(n->out[2]); /* gates */
    in[k++] = ts_mkval(n->in[1]);  /* gh */
    if (has_dh) in[k++] = dy[1];
    ts_attrs a = ts_attrs_zero();
    a.rnn.t = n->a.rnn.t;
    a.rnn.has_acc = has_acc;
    a.rnn.has_dh = has_dh;
    a.rnn.steps = ts_in_type(g, n, 0)->dims[1];
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(ts_node_add(g, TS_OP_GRU_CELL_BWD, k, in, &a, outs))) return ts_graph_status(g);
    din[0] = outs[0];
    din[1] = outs[1];
    din[2] = outs[2];
    return ts_graph_status(g);
}

static ts_status grad_lstm(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (no_gate_grad(g, "lstm_cell", dy[3]) != TS_OK) return ts_graph_status(g);
    int has_acc = ts_val_ok(dy[0]), has_dh = ts_val_ok(dy[1]), has_dc = ts_val_ok(dy[2]);
    if (!has_acc && !has_dh && !has_dc) return TS_OK;
    ts_val in[6];
    int k = 0;
    if (has_acc) in[k++] = dy[0];
    in[k++] = ts_mkval(n->in[2]);  /* c */
    in[k++] = ts_mkval(n->out[3]); /* gates */
    in[k++] = ts_mkval(n->out[2]); /* c' */
    if (has_dh) in[k++] = dy[1];
    if (has_dc) in[k++] = dy[2];
    ts_attrs a = ts_attrs_zero();
    a.rnn.t = n->a.rnn.t;
    a.rnn.has_acc = has_acc;
    a.rnn.has_dh = has_dh;
    a.rnn.has_dc = has_dc;
    a.rnn.steps = ts_in_type(g, n, 0)->dims[1];
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(ts_node_add(g, TS_OP_LSTM_CELL_BWD, k, in, &a, outs))) return ts_graph_status(g);
    /* gi and gh enter the gates as a sum: both get the same gradient. */
    din[0] = outs[0];
    din[1] = outs[1];
    din[2] = outs[2];
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

/* Copy (or zero, src == NULL) n bytes in fixed chunks over threads. */
#define RNN_CHUNK ((size_t)1 << 18)
static void par_fill(void *dst, const void *src, size_t n) {
    int64_t chunks = (int64_t)((n + RNN_CHUNK - 1) / RNN_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        size_t off = (size_t)c * RNN_CHUNK, len = n - off < RNN_CHUNK ? n - off : RNN_CHUNK;
        if (src)
            memcpy((char *)dst + off, (const char *)src + off, len);
        else
            memset((char *)dst + off, 0, len);
    }
}

/* Output 0 of every cell op is its input 0 passed on (or the accumulated
 * gradient, or zeros): nothing to do when the planner placed it in place. */
static void pass_on(const ts_kargs *k, int has_src) {
    const ts_tensor *o = &k->out[0];
    size_t bytes = (size_t)ts_tensor_numel(o) * ts_dtype_size(o->dtype);
    if (!has_src)
        par_fill(o->data, NULL, bytes);
    else if (o->data != k->in[0].data)
        par_fill(o->data, k->in[0].data, bytes);
}

#define DEF_RNN(T, SFX)                                                                            \
    TS_CLONES static void gru_row_##SFX(T *hn, T *gates, const T *gi, const T *gh, const T *h,     \
                                        int64_t H) {                                               \
        _Pragma("omp simd") for (int64_t j = 0; j < H; j++) {                                      \
            T r = sig_##SFX(gh[j] + gi[j]);                                                        \
            T z = sig_##SFX(gh[H + j] + gi[H + j]);                                                \
            T nn = tanh_##SFX(gi[2 * H + j] + gh[2 * H + j] * r);                                  \
            hn[j] = (h[j] - nn) * z + nn;                                                          \
            gates[j] = r;                                                                          \
            gates[H + j] = z;                                                                      \
            gates[2 * H + j] = nn;                                                                 \
        }                                                                                          \
    }                                                                                              \
    static ts_status gru_##SFX(const ts_kargs *k) {                                                \
        const ts_tensor *git = &k->in[0];                                                          \
        int64_t B = git->dims[0], Tn = git->dims[1], G = git->dims[2], H = G / 3, t = k->a->rnn.t; \
        pass_on(k, 1);                                                                             \
        const T *gi = git->data, *gh = k->in[1].data, *h = k->in[2].data;                          \
        T *hn = k->out[1].data, *gates = k->out[2].data;                                           \
        _Pragma("omp parallel for schedule(static) if (B * G >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < B; b++)     \
            gru_row_##SFX(hn + b * H, gates + b * G, gi + (b * Tn + t) * G, gh + b * G, h + b * H, \
                          H);                                                                      \
        return TS_OK;                                                                              \
    }                                                                                              \
    TS_CLONES static void gru_bwd_row_##SFX(T *acc, T *dgh, T *dhp, const T *h, const T *gates,    \
                                            const T *gh, const T *dh, int64_t H) {                 \
        _Pragma("omp simd") for (int64_t j = 0; j < H; j++) {                                      \
            T r = gates[j], z = gates[H + j], nn = gates[2 * H + j];                               \
            T d = dh ? dh[j] : (T)0;                                                               \
            T dn = d * ((T)1 - z), dz = d * (h[j] - nn);                                           \
            T dnp = dn * ((T)1 - nn * nn);                                                         \
            T drp = dnp * gh[2 * H + j] * r * ((T)1 - r);                                          \
            T dzp = dz * z * ((T)1 - z);                                                           \
            acc[j] += drp;                                                                         \
            acc[H + j] += dzp;                                                                     \
            acc[2 * H + j] += dnp;                                                                 \
            dgh[j] = drp;                                                                          \
            dgh[H + j] = dzp;                                                                      \
            dgh[2 * H + j] = dnp * r;                                                              \
            dhp[j] = d * z;                                                                        \
        }                                                                                          \
    }                                                                                              \
    static ts_status gru_bwd_##SFX(const ts_kargs *k) {                                            \
        int has_acc = (int)k->a->rnn.has_acc, has_dh = (int)k->a->rnn.has_dh, kk = has_acc;        \
        const ts_tensor *ot = &k->out[0];                                                          \
        int64_t B = ot->dims[0], Tn = ot->dims[1], G = ot->dims[2], H = G / 3, t = k->a->rnn.t;    \
        pass_on(k, has_acc);                                                                       \
        const T *h = k->in[kk].data, *gates = k->in[kk + 1].data, *gh = k->in[kk + 2].data;        \
        const T *dh = has_dh ? k->in[kk + 3].data : NULL;                                          \
        T *acc = ot->data, *dgh = k->out[1].data, *dhp = k->out[2].data;                           \
        _Pragma("omp parallel for schedule(static) if (B * G >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < B; b++)     \
            gru_bwd_row_##SFX(acc + (b * Tn + t) * G, dgh + b * G, dhp + b * H, h + b * H,         \
                              gates + b * G, gh + b * G, dh ? dh + b * H : NULL, H);               \
        return TS_OK;                                                                              \
    }                                                                                              \
    TS_CLONES static void lstm_row_##SFX(T *hn, T *cn, T *gates, const T *gi, const T *gh,         \
                                         const T *c, int64_t H) {                                  \
        _Pragma("omp simd") for (int64_t j = 0; j < H; j++) {                                      \
            T ig = sig_##SFX(gh[j] + gi[j]);                                                       \
            T fg = sig_##SFX(gh[H + j] + gi[H + j]);                                               \
            T gg = tanh_##SFX(gh[2 * H + j] + gi[2 * H + j]);                                      \
            T og = sig_##SFX(gh[3 * H + j] + gi[3 * H + j]);                                       \
            T cy = fg * c[j] + ig * gg;                                                            \
            cn[j] = cy;                                                                            \
            hn[j] = og * tanh_##SFX(cy);                                                           \
            gates[j] = ig;                                                                         \
            gates[H + j] = fg;                                                                     \
            gates[2 * H + j] = gg;                                                                 \
            gates[3 * H + j] = og;                                                                 \
        }                                                                                          \
    }                                                                                              \
    static ts_status lstm_##SFX(const ts_kargs *k) {                                               \
        const ts_tensor *git = &k->in[0];                                                          \
        int64_t B = git->dims[0], Tn = git->dims[1], G = git->dims[2], H = G / 4, t = k->a->rnn.t; \
        pass_on(k, 1);                                                                             \
        const T *gi = git->data, *gh = k->in[1].data, *c = k->in[2].data;                          \
        T *hn = k->out[1].data, *cn = k->out[2].data, *gates = k->out[3].data;                     \
        _Pragma("omp parallel for schedule(static) if (B * G >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < B; b++)     \
            lstm_row_##SFX(hn + b * H, cn + b * H, gates + b * G, gi + (b * Tn + t) * G,           \
                           gh + b * G, c + b * H, H);                                              \
        return TS_OK;                                                                              \
    }                                                                                              \
    TS_CLONES static void lstm_bwd_row_##SFX(T *acc, T *dg, T *dcp, const T *c, const T *gates,    \
                                             const T *cn, const T *dh, const T *dc, int64_t H) {   \
        _Pragma("omp simd") for (int64_t j = 0; j < H; j++) {                                      \
            T ig = gates[j], fg = gates[H + j], gg = gates[2 * H + j], og = gates[3 * H + j];      \
            T tc = tanh_##SFX(cn[j]);                                                              \
            T dhv = dh ? dh[j] : (T)0, dcv = dc ? dc[j] : (T)0;                                    \
            T dct = dcv + dhv * og * ((T)1 - tc * tc);                                             \
            T dip = dct * gg * ig * ((T)1 - ig);                                                   \
            T dfp = dct * c[j] * fg * ((T)1 - fg);                                                 \
            T dgp = dct * ig * ((T)1 - gg * gg);                                                   \
            T dop = dhv * tc * og * ((T)1 - og);                                                   \
            acc[j] += dip;                                                                         \
            acc[H + j] += dfp;                                                                     \
            acc[2 * H + j] += dgp;                                                                 \
            acc[3 * H + j] += dop;                                                                 \
            dg[j] = dip;                                                                           \
            dg[H + j] = dfp;                                                                       \
            dg[2 * H + j] = dgp;                                                                   \
            dg[3 * H + j] = dop;                                                                   \
            dcp[j] = dct * fg;                                                                     \
        }                                                                                          \
    }                                                                                              \
    static ts_status lstm_bwd_##SFX(const ts_kargs *k) {                                           \
        int has_acc = (int)k->a->rnn.has_acc, has_dh = (int)k->a->rnn.has_dh,                      \
            has_dc = (int)k->a->rnn.has_dc;                                                        \
        int kk = has_acc;                                                                          \
        const ts_tensor *ot = &k->out[0];                                                          \
        int64_t B = ot->dims[0], Tn = ot->dims[1], G = ot->dims[2], H = G / 4, t = k->a->rnn.t;    \
        pass_on(k, has_acc);                                                                       \
        const T *c = k->in[kk].data, *gates = k->in[kk + 1].data, *cn = k->in[kk + 2].data;        \
        const T *dh = has_dh ? k->in[kk + 3].data : NULL;                                          \
        const T *dc = has_dc ? k->in[kk + 3 + has_dh].data : NULL;                                 \
        T *acc = ot->data, *dg = k->out[1].data, *dcp = k->out[2].data;                            \
        _Pragma("omp parallel for schedule(static) if (B * G >= TS_PAR_MIN)") for (int64_t b = 0;  \
                                                                                   b < B; b++)     \
            lstm_bwd_row_##SFX(acc + (b * Tn + t) * G, dg + b * G, dcp + b * H, c + b * H,         \
                               gates + b * G, cn + b * H, dh ? dh + b * H : NULL,                  \
                               dc ? dc + b * H : NULL, H);                                         \
        return TS_OK;                                                                              \
    }

DEF_RNN(float, f32)
DEF_RNN(double, f64)

#define DISPATCH(name, opname, idx)                                                                \
    static ts_status k_##name(const ts_kargs *k) {                                                 \
        switch (k->out[idx].dtype) {                                                               \
        case TS_F32: return name##_f32(k);                                                         \
        case TS_F64: return name##_f64(k);                                                         \
        default: return ts_kernel_bad_dtype(k, opname, k->out[idx].dtype);                         \
        }                                                                                          \
    }
DISPATCH(gru, "gru_cell", 1)
DISPATCH(gru_bwd, "gru_cell_bwd", 1)
DISPATCH(lstm, "lstm_cell", 1)
DISPATCH(lstm_bwd, "lstm_cell_bwd", 1)

/* Per step, per batch row and unit: a few dozen flops of gate arithmetic
 * (exp/tanh counted as ~10). */
static double cost_cell(const ts_graph *g, const ts_node *n) {
    return 40.0 * (double)ts_type_numel(&g->values[n->out[1]].t) *
           (n->op == TS_OP_LSTM_CELL || n->op == TS_OP_LSTM_CELL_BWD ? 1.5 : 1.0);
}

const ts_op_def ts_def_gru_cell = {.name = "gru_cell",
                                   .min_in = 3,
                                   .max_in = 3,
                                   .flags = TS_OPF_INPLACE,
                                   .infer = infer_gru,
                                   .grad = grad_gru,
                                   .kernel = k_gru,
                                   .cost = cost_cell};
const ts_op_def ts_def_gru_cell_bwd = {.name = "gru_cell_bwd",
                                       .min_in = 3,
                                       .max_in = 5,
                                       .flags = TS_OPF_INPLACE,
                                       .infer = infer_gru_bwd,
                                       .kernel = k_gru_bwd,
                                       .cost = cost_cell};
const ts_op_def ts_def_lstm_cell = {.name = "lstm_cell",
                                    .min_in = 3,
                                    .max_in = 3,
                                    .flags = TS_OPF_INPLACE,
                                    .infer = infer_lstm,
                                    .grad = grad_lstm,
                                    .kernel = k_lstm,
                                    .cost = cost_cell};
const ts_op_def ts_def_lstm_cell_bwd = {.name = "lstm_cell_bwd",
                                        .min_in = 3,
                                        .max_in = 6,
                                        .flags = TS_OPF_INPLACE,
                                        .infer = infer_lstm_bwd,
                                        .kernel = k_lstm_bwd,
                                        .cost = cost_cell};

/* ---- builders ---------------------------------------------------------- */

static int ok_all(const ts_graph *g, int n, const ts_val *v) {
    if (!g || g->status != TS_OK) return 0;
    for (int i = 0; i < n; i++)
        if (!ts_val_ok(v[i]) || v[i].id >= g->n_values) return 0;
    return 1;
}

/* One cell at step t of gi3 [B, T, G]; outs receives the node's outputs. */
static ts_val cell(ts_graph *g, int lstm, ts_val gi3, ts_val gh, ts_val state, int64_t t,
                   ts_val *outs) {
    ts_val in[3] = {gi3, gh, state};
    ts_attrs a = ts_attrs_zero();
    a.rnn.t = t;
    return ts_node_add(g, lstm ? TS_OP_LSTM_CELL : TS_OP_GRU_CELL, 3, in, &a, outs);
}

static ts_val as_steps(ts_graph *g, ts_val gi, const char *op) {
    if (ts_rank(g, gi) != 2) {
        char tb[128];
        return ts_graph_fail(g, TS_ERR_SHAPE, "%s: gi must be [B, G], got %s", op,
                             ts_type_str(tb, sizeof tb, &ts_v(g, gi)->t));
    }
    int64_t d[3] = {ts_dim(g, gi, 0), 1, ts_dim(g, gi, 1)};
    return ts_reshape(g, gi, 3, d);
}

ts_val ts_gru_cell(ts_graph *g, ts_val gi, ts_val gh, ts_val h) {
    ts_val v[3] = {gi, gh, h};
    if (!ok_all(g, 3, v)) return TS_NONE;
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(cell(g, 0, as_steps(g, gi, "gru_cell"), gh, h, 0, outs))) return TS_NONE;
    return outs[1];
}

ts_val ts_lstm_cell(ts_graph *g, ts_val gi, ts_val gh, ts_val c, ts_val *c_out) {
    if (c_out) *c_out = TS_NONE;
    ts_val v[3] = {gi, gh, c};
    if (!ok_all(g, 3, v)) return TS_NONE;
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(cell(g, 1, as_steps(g, gi, "lstm_cell"), gh, c, 0, outs))) return TS_NONE;
    if (c_out) *c_out = outs[2];
    return outs[1];
}

static ts_val zeros(ts_graph *g, ts_dtype dt, int64_t r, int64_t c) {
    size_t bytes = (size_t)(r * c) * ts_dtype_size(dt);
    void *z = ts_zalloc(bytes ? bytes : 1, "rnn zeros");
    if (!z) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    ts_val v = ts_constant(g, NULL, dt, 2, (int64_t[]){r, c}, z);
    free(z);
    return v;
}

/* Layer l's [B, H] slice of an initial state [layers, B, H] (zeros if none). */
static ts_val initial(ts_graph *g, ts_val s0, int l, ts_dtype dt, int64_t B, int64_t H) {
    if (!ts_val_ok(s0)) return zeros(g, dt, B, H);
    return ts_reshape(g, ts_slice(g, s0, 0, l, l + 1), 2, (int64_t[]){B, H});
}

static ts_val rnn_param(ts_graph *g, const char *prefix, const char *what, int l, ts_dtype dt,
                        int rank, int64_t d0, int64_t d1, double bound) {
    char name[512];
    int len = snprintf(name, sizeof name, "%s.%s_l%d", prefix, what, l);
    if (len < 0 || (size_t)len >= sizeof name)
        return ts_graph_fail(g, TS_ERR_INVALID, "rnn: name prefix '%.40s...' is too long", prefix);
    return ts_param(g, name, dt, rank, (int64_t[]){d0, d1}, ts_init_uniform(-bound, bound));
}

static ts_status check_state(ts_graph *g, const char *op, const char *what, ts_val s, ts_dtype dt,
                             int layers, int64_t B, int64_t H) {
    if (!ts_val_ok(s)) return TS_OK;
    if (s.id >= g->n_values) {
        ts_graph_fail(g, TS_ERR_INVALID, "%s: %s is not a value of this graph", op, what);
        return g->status;
    }
    const ts_type *t = &ts_v(g, s)->t;
    int ok = t->dtype == dt && t->rank == 3 && t->dims[0] == layers && t->dims[1] == B &&
             t->dims[2] == H;
    if (!ok) {
        char want[128], got[128];
        ts_graph_fail(g, TS_ERR_SHAPE, "%s: %s must be %s, got %s", op, what,
                      ts_shape_str(want, sizeof want, dt, 3, (int64_t[]){layers, B, H}),
                      ts_type_str(got, sizeof got, t));
    }
    return g->status;
}

/* The stack of `layers` recurrent layers over the static length T. */
static ts_val rnn_seq(ts_graph *g, int lstm, ts_val x, ts_val h0, ts_val c0, int layers,
                      int64_t hidden, const char *prefix, ts_val *h_n, ts_val *c_n) {
    const char *op = lstm ? "lstm" : "gru";
    if (h_n) *h_n = TS_NONE;
    if (c_n) *c_n = TS_NONE;
    /* TS_NONE for h0/c0 means zeros: with a sticky error pending return
     * before it could be mistaken for that. */
    if (!g || g->status != TS_OK || !ts_val_ok(x)) return TS_NONE;
    if (x.id >= g->n_values)
        return ts_graph_fail(g, TS_ERR_INVALID, "%s: x is not a value of this graph", op);
    const ts_type xt = ts_v(g, x)->t;
    if (!ts_dtype_is_float(xt.dtype) || xt.rank != 3) {
        char tb[128];
        return ts_graph_fail(g, TS_ERR_SHAPE, "%s: x must be a float [B, T, F] tensor, got %s", op,
                             ts_type_str(tb, sizeof tb, &xt));
    }
    if (layers < 1 || hidden < 1)
        return ts_graph_fail(g, TS_ERR_INVALID, "%s: layers (%d) and hidden (%lld) must be >= 1",
                             op, layers, (long long)hidden);
    if (!prefix || !*prefix)
        return ts_graph_fail(g, TS_ERR_INVALID, "%s: a name prefix for the parameters is required",
                             op);
    ts_dtype dt = xt.dtype;
    int64_t B = xt.dims[0], T = xt.dims[1], H = hidden, G = (lstm ? 4 : 3) * H;
    if (check_state(g, op, "h0", h0, dt, layers, B, H) != TS_OK ||
        (lstm && check_state(g, op, "c0", c0, dt, layers, B, H) != TS_OK))
        return TS_NONE;
    double bound = 1.0 / sqrt((double)H); /* torch: U(-1/sqrt(H), 1/sqrt(H)) for all */
    ts_val seq = x, hl[64], cl[64];
    ts_val *hlast = layers <= 64 ? hl : ts_alloc(sizeof(ts_val) * (size_t)layers, "rnn");
    ts_val *clast = layers <= 64 ? cl : ts_alloc(sizeof(ts_val) * (size_t)layers, "rnn");
    ts_val *steps = ts_alloc(sizeof(ts_val) * (size_t)T, "rnn");
    if (!hlast || !clast || !steps) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        goto out;
    }
    for (int l = 0; l < layers && g->status == TS_OK; l++) {
        int64_t F = ts_dim(g, seq, 2);
        ts_val w_ih = rnn_param(g, prefix, "weight_ih", l, dt, 2, G, F, bound);
        ts_val w_hh = rnn_param(g, prefix, "weight_hh", l, dt, 2, G, H, bound);
        ts_val b_ih = rnn_param(g, prefix, "bias_ih", l, dt, 1, G, 0, bound);
        ts_val b_hh = rnn_param(g, prefix, "bias_hh", l, dt, 1, G, 0, bound);
        /* All T input projections in one GEMM, viewed as [B, T, G]. */
        ts_val flat = ts_reshape(g, seq, 2, (int64_t[]){B * T, F});
        ts_val gi = ts_reshape(g, ts_linear(g, flat, w_ih, b_ih), 3, (int64_t[]){B, T, G});
        ts_val h = initial(g, h0, l, dt, B, H);
        ts_val c = lstm ? initial(g, c0, l, dt, B, H) : TS_NONE;
        for (int64_t t = 0; t < T && g->status == TS_OK; t++) {
            /* A zero initial state needs no GEMM: gh is just b_hh. */
            ts_val gh = t == 0 && !ts_val_ok(h0) ? ts_add(g, zeros(g, dt, B, G), b_hh)
                                                 : ts_linear(g, h, w_hh, b_hh);
            ts_val outs[TS_MAX_OUT];
            if (!ts_val_ok(cell(g, lstm, gi, gh, lstm ? c : h, t, outs))) break;
            gi = outs[0];
            h = outs[1];
            if (lstm) c = outs[2];
            steps[t] = ts_reshape(g, h, 3, (int64_t[]){B, 1, H});
        }
        hlast[l] = h;
        clast[l] = c;
        seq = ts_concat(g, (int)T, steps, 1);
    }
    if (g->status == TS_OK && h_n) {
        for (int l = 0; l < layers; l++)
            hlast[l] = ts_reshape(g, hlast[l], 3, (int64_t[]){1, B, H});
        *h_n = ts_concat(g, layers, hlast, 0);
    }
    if (g->status == TS_OK && lstm && c_n) {
        for (int l = 0; l < layers; l++)
            clast[l] = ts_reshape(g, clast[l], 3, (int64_t[]){1, B, H});
        *c_n = ts_concat(g, layers, clast, 0);
    }
out:
    if (hlast != hl) free(hlast);
    if (clast != cl) free(clast);
    free(steps);
    return g->status == TS_OK ? seq : TS_NONE;
}

ts_val ts_gru(ts_graph *g, ts_val x, ts_val h0, int layers, int64_t hidden, const char *name_prefix,
              ts_val *h_n_out) {
    return rnn_seq(g, 0, x, h0, TS_NONE, layers, hidden, name_prefix, h_n_out, NULL);
}

ts_val ts_lstm(ts_graph *g, ts_val x, ts_val h0, ts_val c0, int layers, int64_t hidden,
               const char *name_prefix, ts_val *h_n_out, ts_val *c_n_out) {
    return rnn_seq(g, 1, x, h0, c0, layers, hidden, name_prefix, h_n_out, c_n_out);
}
