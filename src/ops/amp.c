/* Loss-scaling support: one fused pass over every gradient that unscales
 * it in place and records whether any was non-finite, with the semantics
 * of torch._amp_foreach_non_finite_check_and_unscale_:
 *
 *     inv = (f32)(1 / (double)scale)
 *     for each element g:  found_inf |= !isfinite(g);  g = inv == 1 ? g : g * inv
 *
 * Inputs (scale [f32 scalar], g1..gn [f32 or f64]); output found_inf (f32
 * scalar: 1 or 0). The gradients are written in place (a side effect):
 * the loss-scale pass orders every other reader of a gradient after it. */
#include <math.h>
#include "kern.h"

static ts_status infer_unscale(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *s = ts_in_type(g, n, 0);
    if (s->dtype != TS_F32 || ts_type_numel(s) != 1)
        return ts_fail(TS_ERR_SHAPE, "the scale must be one f32 value");
    for (int i = 1; i < n->n_in; i++) {
        ts_dtype dt = ts_in_type(g, n, i)->dtype;
        if (dt != TS_F32 && dt != TS_F64)
            return ts_fail(TS_ERR_SHAPE, "gradient %d is %s (f32 or f64 expected)", i,
                           ts_dtype_name(dt));
    }
    out->dtype = TS_F32;
    out->rank = 0;
    *n_out = 1;
    return TS_OK;
}

static ts_status k_unscale(const ts_kargs *k) {
    const float scale = *(const float *)k->in[0].data;
    const float inv = (float)(1.0 / (double)scale);
    int found = 0;
    for (int t = 1; t < k->n_in; t++) {
        const ts_tensor *x = &k->in[t];
        int64_t n = ts_tensor_numel(x);
        int f = 0;
        if (x->dtype == TS_F32) {
            float *d = x->data;
#pragma omp parallel for simd schedule(static) reduction(| : f) if (n >= TS_PAR_MIN)
            for (int64_t i = 0; i < n; i++) {
                f |= !isfinite(d[i]);
                d[i] = inv == 1.0f ? d[i] : d[i] * inv;
            }
        } else if (x->dtype == TS_F64) {
            double *d = x->data; /* torch multiplies by the f32 inverse as a double */
#pragma omp parallel for simd schedule(static) reduction(| : f) if (n >= TS_PAR_MIN)
            for (int64_t i = 0; i < n; i++) {
                f |= !isfinite(d[i]);
                d[i] = inv == 1.0f ? d[i] : d[i] * (double)inv;
            }
        } else {
            return ts_kernel_bad_dtype(k, "unscale_grads", x->dtype);
        }
        found |= f;
    }
    *(float *)k->out[0].data = found ? 1.0f : 0.0f;
    return TS_OK;
}

static double cost_unscale(const ts_graph *g, const ts_node *n) {
    double c = 0;
    for (int i = 1; i < n->n_in; i++) c += 2.0 * (double)ts_type_numel(ts_in_type(g, n, i));
    return c;
}

const ts_op_def ts_def_unscale_grads = {.name = "unscale_grads",
                                        .min_in = 2,
                                        .max_in = -1,
                                        .flags = TS_OPF_SIDE_EFFECT,
                                        .infer = infer_unscale,
                                        .kernel = k_unscale,
                                        .cost = cost_unscale};
