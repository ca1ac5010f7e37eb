/* Inverted dropout.
 *
 * The keep mask is never stored: element e of the node's tensor at step t
 * draws word e % 4 of Philox(key, counter (t, e / 4)), with the key derived
 * from the compile seed and the node's stream id. The mask is a pure
 * function of (seed, stream, step, e), so it does not depend on threads or
 * schedule, and the backward pass regenerates it by running another dropout
 * node with the same stream id on the incoming gradient. */
#include <math.h>
#include <string.h>
#include "kern.h"

/* Elements per parallel chunk; a multiple of 4 (and of DROP_TILE) so a
 * Philox draw never straddles two chunks. */
#define DROP_CHUNK 4096

static ts_status infer_dropout(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0);
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "input must be a float tensor, got %s",
                       ts_dtype_name(x->dtype));
    double p = n->a.dropout.p;
    if (!(p >= 0 && p < 1)) return ts_fail(TS_ERR_INVALID, "p = %g is not in [0, 1)", p);
    *out = *x;
    *n_out = 1;
    return TS_OK;
}

/* d(dropout(x))/dx = mask / (1 - p): the same op, same stream, on dy. */
static ts_status grad_dropout(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    din[0] = ts_node_add(g, TS_OP_DROPOUT, 1, dy, &n->a, NULL);
    return ts_graph_status(g);
}

/* The Philox key of a stream: the seed mixed with a hash of the stream id,
 * so nearby stream ids give unrelated keys. */
static uint64_t stream_key(uint64_t seed, int64_t stream) {
    return seed ^ ts_hash64(&stream, sizeof stream, 0x64726f706f7574ULL /* "dropout" */);
}

/* Random words of elements [s, s + n), s a multiple of 4. */
static void draw(uint32_t *r, int64_t s, int64_t n, uint64_t key, uint64_t step) {
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t w[4];
        ts_philox(key, step, (uint64_t)(s + i) / 4, w);
        for (int64_t j = 0; j < 4 && i + j < n; j++) r[i + j] = w[j];
    }
}

/* Elements drawn per tile: the words live on the stack between the (scalar)
 * Philox loop and the vectorised select. */
#define DROP_TILE 512

/* y[i] = keep ? x[i] * scale : 0. keep is ts_u01(r) >= p, i.e. the top 24
 * bits of the word are >= thr = ceil(p * 2^24) (exact: 2^24 is a power of
 * two), which vectorises as an integer compare. y may be x (in place):
 * each element is read before it is written. */
#define DEF_SELECT(name, T)                                                                        \
    TS_CLONES static void name(T *y, const T *x, const uint32_t *r, int64_t n, uint32_t thr,       \
                               T scale) {                                                          \
        for (int64_t i = 0; i < n; i++) y[i] = (r[i] >> 8) >= thr ? x[i] * scale : (T)0;           \
    }

DEF_SELECT(select_f32, float)
DEF_SELECT(select_f64, double)

static ts_status k_dropout(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *y = &k->out[0];
    ts_dtype dt = x->dtype;
    int64_t n = ts_tensor_numel(x);
    double p = k->a->dropout.p;
    if (dt != TS_F32 && dt != TS_F64) return ts_kernel_bad_dtype(k, "dropout", dt);
    if (!k->a->dropout.training || p == 0) {
        /* Inference plans (and p = 0): the identity. */
        if (y->data != x->data) memcpy(y->data, x->data, (size_t)n * ts_dtype_size(dt));
        return TS_OK;
    }
    if (!k->ctx)
        return ts_fail(TS_ERR_INTERNAL, "dropout '%s': no step context", k->label ? k->label : "?");
    uint64_t key = stream_key(k->ctx->seed, k->a->dropout.stream), step = (uint64_t)k->ctx->step;
    int64_t nch = (n + DROP_CHUNK - 1) / DROP_CHUNK;
    uint32_t thr = (uint32_t)ceil(p * 16777216.0);
    /* torch scales by a mask holding 1 / (1 - p) in the tensor's dtype. */
    float s32 = 1.0f / (float)(1.0 - p);
    double s64 = 1.0 / (1.0 - p);
    size_t es = ts_dtype_size(dt);
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        uint32_t r[DROP_TILE];
        int64_t end = (c + 1) * DROP_CHUNK < n ? (c + 1) * DROP_CHUNK : n;
        for (int64_t s = c * DROP_CHUNK; s < end; s += DROP_TILE) {
            int64_t len = end - s < DROP_TILE ? end - s : DROP_TILE;
            draw(r, s, len, key, step);
            void *yo = (char *)y->data + s * (int64_t)es;
            const void *xo = (const char *)x->data + s * (int64_t)es;
            if (dt == TS_F32)
                select_f32(yo, xo, r, len, thr, s32);
            else
                select_f64(yo, xo, r, len, thr, s64);
        }
    }
    return TS_OK;
}

static double cost_dropout(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(&g->values[n->out[0]].t);
}

/* Not TS_OPF_ELEMENTWISE: the mask depends on each element's absolute
 * index, so the op cannot be run on pieces of a fused elementwise chain. */
const ts_op_def ts_def_dropout = {.name = "dropout",
                                  .min_in = 1,
                                  .max_in = 1,
                                  .flags = TS_OPF_RANDOM | TS_OPF_INPLACE,
                                  .infer = infer_dropout,
                                  .grad = grad_dropout,
                                  .kernel = k_dropout,
                                  .cost = cost_dropout};

/* The node starts inactive (training 0); the train pass activates it in
 * training plans. */
ts_val ts_dropout(ts_graph *g, ts_val a, double p) {
    if (!g || g->status != TS_OK || !ts_val_ok(a)) return TS_NONE;
    if (!(p >= 0 && p < 1))
        return ts_graph_fail(g, TS_ERR_INVALID, "dropout: p = %g must be in [0, 1)", p);
    if (p == 0) return a;
    ts_attrs at = ts_attrs_zero();
    at.dropout.p = p;
    at.dropout.stream = g->next_stream++;
    at.dropout.training = 0;
    return ts_node_add(g, TS_OP_DROPOUT, 1, &a, &at, NULL);
}
