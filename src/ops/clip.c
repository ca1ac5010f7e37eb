/* clip_coef (g1..gn) -> coef: the gradient-clipping coefficient the
 * parameter updates (optim.c) multiply the gradients by, as
 * torch.nn.utils.clip_grad_norm_ computes it (details at CLIP_FINISH);
 * past attrs.clip.until_step (when set) max_norm is FLT_MAX. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "kern.h"

static const char *lbl(const ts_kargs *k) {
    return k->label ? k->label : "?";
}

static ts_status infer_clip(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_dtype dt = ts_in_type(g, n, 0)->dtype;
    if (!ts_dtype_is_float(dt))
        return ts_fail(TS_ERR_SHAPE, "gradients must be float tensors, got %s", ts_dtype_name(dt));
    for (int i = 1; i < n->n_in; i++)
        if (ts_in_type(g, n, i)->dtype != dt)
            return ts_fail(TS_ERR_SHAPE, "gradient %d is %s, the first is %s", i,
                           ts_dtype_name(ts_in_type(g, n, i)->dtype), ts_dtype_name(dt));
    if (!(n->a.clip.max_norm > 0))
        return ts_fail(TS_ERR_INVALID, "max_norm must be > 0, got %g", n->a.clip.max_norm);
    out->dtype = dt;
    out->rank = 0;
    *n_out = 1;
    return TS_OK;
}

/* Scratch: the first block index of each gradient (n_in + 1 int64), then
 * one double partial sum of squares per TS_RED_BLOCK block of every
 * gradient. */
static size_t clip_part_off(int n_in) {
    return TS_ALIGN_UP(sizeof(int64_t) * (size_t)(n_in + 1), TS_ALIGN);
}

static size_t scratch_clip(const ts_graph *g, const ts_node *n) {
    int64_t blocks = 0;
    for (int i = 0; i < n->n_in; i++) blocks += ts_red_blocks(ts_type_numel(ts_in_type(g, n, i)));
    return TS_ALIGN_UP(clip_part_off(n->n_in) + sizeof(double) * (size_t)blocks, TS_ALIGN);
}

/* Sum of squares of one block in double. Eight fixed lanes, added in a
 * fixed order at the end, let the loop vectorise without -ffast-math while
 * keeping the result independent of the machine and the thread count. */
#define DEF_SUMSQ(name, T)                                                                         \
    TS_CLONES static double name(const T *restrict x, int64_t n) {                                 \
        double acc[8] = {0};                                                                       \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= n; i += 8)                                                                 \
            for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j];             \
        for (; i < n; i++) acc[0] += (double)x[i] * (double)x[i];                                  \
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));  \
    }

DEF_SUMSQ(sumsq_f32, float)
DEF_SUMSQ(sumsq_f64, double)

double ts_clip_sumsq_f32(const float *x, int64_t n) {
    double ss = 0;
    for (int64_t s = 0; s < n; s += TS_RED_BLOCK)
        ss += sumsq_f32(x + s, n - s < TS_RED_BLOCK ? n - s : TS_RED_BLOCK);
    return ss;
}

/* torch.nn.utils.clip_grad_norm_ (norm_type 2):
 *   total = norm(stack([norm(g_i) for g_i]))      (each norm in the grads' dtype)
 *   coef = clamp(max_norm / (total + 1e-6), max=1)
 * where torch evaluates max_norm / tensor as reciprocal(tensor) * max_norm.
 * Sums of squares are accumulated in double over fixed blocks, then rounded
 * where torch rounds. torch accumulates in float in an order set by its
 * vectorised reduction, so the coefficient can differ from torch's by an ulp;
 * the double sums are the more accurate of the two and do not depend on the
 * machine or the thread count. */
#define CLIP_FINISH(T)                                                                             \
    do {                                                                                           \
        double tot = 0;                                                                            \
        for (int i = 0; i < k->n_in; i++) {                                                        \
            double ss = 0;                                                                         \
            for (int64_t b = first[i]; b < first[i + 1]; b++) ss += part[b];                       \
            T norm_i = (T)sqrt(ss);                                                                \
            tot += (double)norm_i * (double)norm_i;                                                \
        }                                                                                          \
        T total = (T)sqrt(tot);                                                                    \
        T inv = (T)1 / (total + (T)1e-6);                                                          \
        T coef = inv * (T)clip_max_norm(k);                                                        \
        *(T *)k->out[0].data = coef > (T)1 ? (T)1 : coef; /* NaN stays NaN, as torch.clamp */      \
    } while (0)

/* max_norm, or FLT_MAX past until_step: finite, so a gradient of norm inf
 * still gives 0 and NaN stays NaN. */
static double clip_max_norm(const ts_kargs *k) {
    const ts_clip_attrs *a = &k->a->clip;
    return a->until_step > 0 && k->ctx && k->ctx->step > a->until_step ? FLT_MAX : a->max_norm;
}

static ts_status k_clip(const ts_kargs *k) {
    ts_dtype dt = k->out[0].dtype;
    if (dt != TS_F32 && dt != TS_F64) return ts_kernel_bad_dtype(k, "clip_coef", dt);
    int64_t blocks = 0;
    for (int i = 0; i < k->n_in; i++) blocks += ts_red_blocks(ts_tensor_numel(&k->in[i]));
    size_t off = clip_part_off(k->n_in);
    if (!k->scratch || k->scratch_bytes < off + sizeof(double) * (size_t)blocks)
        return ts_fail(TS_ERR_INTERNAL, "clip_coef '%s': scratch too small (%zu bytes)", lbl(k),
                       k->scratch_bytes);
    int64_t *first = k->scratch;
    double *part = (double *)((char *)k->scratch + off);
    first[0] = 0;
    for (int i = 0; i < k->n_in; i++)
        first[i + 1] = first[i] + ts_red_blocks(ts_tensor_numel(&k->in[i]));
    size_t es = ts_dtype_size(dt);
    /* One parallel loop over every block of every gradient; each block's
     * partial lands in its own slot, so the order of the sums is fixed. */
#pragma omp parallel for schedule(static) if (blocks * TS_RED_BLOCK >= TS_PAR_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        int i = 0;
        while (first[i + 1] <= b) i++;
        int64_t n = ts_tensor_numel(&k->in[i]), s = (b - first[i]) * TS_RED_BLOCK;
        int64_t len = n - s < TS_RED_BLOCK ? n - s : TS_RED_BLOCK;
        const char *x = (const char *)k->in[i].data + s * (int64_t)es;
        part[b] =
            dt == TS_F32 ? sumsq_f32((const float *)x, len) : sumsq_f64((const double *)x, len);
    }
    if (dt == TS_F32)
        CLIP_FINISH(float);
    else
        CLIP_FINISH(double);
    return TS_OK;
}

static double cost_clip(const ts_graph *g, const ts_node *n) {
    double c = 0;
    for (int i = 0; i < n->n_in; i++) c += 2.0 * (double)ts_type_numel(ts_in_type(g, n, i));
    return c;
}

const ts_op_def ts_def_clip_coef = {.name = "clip_coef",
                                    .min_in = 1,
                                    .max_in = -1,
                                    .flags = TS_OPF_UPDATE,
                                    .infer = infer_clip,
                                    .kernel = k_clip,
                                    .scratch = scratch_clip,
                                    .cost = cost_clip};
