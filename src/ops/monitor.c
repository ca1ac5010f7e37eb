/* Gradient monitor: the statistics of one gradient, computed by a node
 * scheduled right after the gradient's producer (while it is in cache) and
 * before the update gate, into a 4-element f64 output:
 *   [0] sum of squares, [1] sum, [2] non-finite elements, [3] elements.
 * Sums run over every element in double (a NaN or Inf makes them
 * non-finite, and [2] counts the culprits), over fixed blocks of
 * TS_RED_BLOCK elements added in block order, so the result does not depend
 * on the thread count. Norms, variances and group totals are derived from
 * these four numbers on the host (src/obs/monitor.c). */
#include <math.h>
#include "kern.h"
#include "op.h"

static ts_status infer_grad_stats(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_dtype dt = ts_in_type(g, n, 0)->dtype;
    if (dt != TS_F32 && dt != TS_F64)
        return ts_fail(TS_ERR_SHAPE, "grad_stats reads f32 or f64 gradients, got %s",
                       ts_dtype_name(dt));
    out->dtype = TS_F64;
    out->rank = 1;
    out->dims[0] = TS_GRAD_STATS_N;
    *n_out = 1;
    return TS_OK;
}

static size_t scratch_grad_stats(const ts_graph *g, const ts_node *n) {
    return sizeof(double) * 3 * (size_t)ts_red_blocks(ts_type_numel(ts_in_type(g, n, 0)));
}

/* 32 fixed lanes (four vectors of eight doubles, so the additions of one
 * lane do not wait for each other's latency: the gradient is in cache, so
 * that latency, not memory, bounded the loop) added in a fixed order:
 * vectorises without -ffast-math and gives the same bits on every machine. */
#define LANES 32
#define DEF_BLOCK(name, T)                                                                         \
    TS_CLONES static void name(const T *restrict x, int64_t n, double *out3) {                     \
        double sq[LANES] = {0}, s[LANES] = {0};                                                    \
        int64_t bad = 0, i = 0;                                                                    \
        for (; i + LANES <= n; i += LANES)                                                         \
            for (int j = 0; j < LANES; j++) {                                                      \
                const double v = (double)x[i + j];                                                 \
                sq[j] += v * v;                                                                    \
                s[j] += v;                                                                         \
            }                                                                                      \
        for (int j = 0; i < n; i++, j++) {                                                         \
            const double v = (double)x[i];                                                         \
            sq[j] += v * v;                                                                        \
            s[j] += v;                                                                             \
        }                                                                                          \
        for (int w = LANES / 2; w >= 1; w /= 2) /* pairwise: lane j + lane j + w */                \
            for (int j = 0; j < w; j++) {                                                          \
                sq[j] += sq[j + w];                                                                \
                s[j] += s[j + w];                                                                  \
            }                                                                                      \
        out3[0] = sq[0];                                                                           \
        out3[1] = s[0];                                                                            \
        if (!isfinite(out3[0]))                                                                    \
            for (i = 0; i < n; i++) bad += !isfinite(x[i]);                                        \
        out3[2] = (double)bad;                                                                     \
    }

DEF_BLOCK(block_f32, float)
DEF_BLOCK(block_f64, double)

static ts_status k_grad_stats(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0];
    const int64_t n = ts_tensor_numel(x), nb = ts_red_blocks(n);
    if (x->dtype != TS_F32 && x->dtype != TS_F64)
        return ts_kernel_bad_dtype(k, "grad_stats", x->dtype);
    if (nb > 0 && (!k->scratch || k->scratch_bytes < sizeof(double) * 3 * (size_t)nb))
        return ts_fail(TS_ERR_INTERNAL, "grad_stats '%s': scratch too small (%zu bytes)",
                       k->label ? k->label : "", k->scratch_bytes);
    double *part = k->scratch;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * TS_RED_BLOCK, len = n - lo < TS_RED_BLOCK ? n - lo : TS_RED_BLOCK;
        if (x->dtype == TS_F32)
            block_f32((const float *)x->data + lo, len, part + 3 * b);
        else
            block_f64((const double *)x->data + lo, len, part + 3 * b);
    }
    double *o = k->out[0].data;
    o[0] = o[1] = o[2] = 0;
    for (int64_t b = 0; b < nb; b++) {
        o[0] += part[3 * b];
        o[1] += part[3 * b + 1];
        o[2] += part[3 * b + 2];
    }
    o[3] = (double)n;
    return TS_OK;
}

static double cost_grad_stats(const ts_graph *g, const ts_node *n) {
    return 3.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}

const ts_op_def ts_def_grad_stats = {.name = "grad_stats",
                                     .min_in = 1,
                                     .max_in = 1,
                                     .flags = TS_OPF_MONITOR,
                                     .infer = infer_grad_stats,
                                     .kernel = k_grad_stats,
                                     .scratch = scratch_grad_stats,
                                     .cost = cost_grad_stats};
