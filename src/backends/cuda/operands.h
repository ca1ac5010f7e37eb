/* operands.h — the operand geometry the CUDA backend's planning (dispatch.c) and enqueueing
 * (dispatch_run.c) both read: element counts, cast kinds, attention, batch-norm and pooling
 * shapes (internal to src/backends/cuda). */
#ifndef TS_CUDA_OPERANDS_H
#define TS_CUDA_OPERANDS_H

#include <string.h>
#include "backends/cuda/cuda.h"

static inline int64_t cu_numel(const ts_operand *o) {
    int64_t n = 1;
    for (int d = 0; d < o->rank; d++) n *= o->dims[d];
    return n;
}

static inline int64_t cu_prod(const int64_t *dims, int lo, int hi) {
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

static inline int cu_cast_kind(ts_dtype t) {
    return t == TS_F32 ? CU_F32 : t == TS_BF16 ? CU_BF16 : t == TS_F16 ? CU_F16 : -1;
}

/* Where q's heads and rows lie (kernels.h): split [B, H, T, hd] or packed [B, T, 3, H, hd]. */
static inline void cu_attn_geom_of(const ts_operand *q, cu_attn_geom *g) {
    const int64_t *d = q->dims;
    if (q->rank == 5) {
        const int64_t B = d[0], T = d[1], H = d[3], hd = d[4];
        *g = (cu_attn_geom){B, H, T, 3 * T * H * hd, hd, 3 * H * hd, T * H * hd, hd, H * hd};
    } else {
        const int64_t B = d[0], H = d[1], T = d[2], hd = d[3];
        *g = (cu_attn_geom){B, H, T, H * T * hd, T * hd, hd, H * T * hd, T * hd, hd};
    }
}

/* x as n batch items, c channels, s spatial elements (src/ops/batchnorm.c's layouts). */
static inline void cu_bn_shape(const ts_operand *x, int cl, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->dims[0];
    *c = x->dims[cl ? x->rank - 1 : 1];
    *s = cl ? cu_prod(x->dims, 1, x->rank - 1) : cu_prod(x->dims, 2, x->rank);
}

/* pool.c's geometry: x the pooled input, y the output. */
static inline void cu_pool_geo_of(cu_pool_geo *q, const ts_pool_attrs *a, const ts_operand *x,
                                  const ts_operand *y) {
    const int nd = (int)a->nd, cl = a->channels_last != 0, sp = cl ? 1 : 2;
    memset(q, 0, sizeof *q);
    q->mode = (int)a->mode;
    q->cl = cl;
    q->N = x->dims[0];
    q->C = x->dims[cl ? nd + 1 : 1];
    for (int j = 0; j < 3; j++) q->in[j] = q->out[j] = q->k[j] = q->s[j] = 1, q->p[j] = 0;
    for (int j = 0; j < nd; j++) {
        int t = 3 - nd + j;
        q->in[t] = x->dims[sp + j];
        q->out[t] = y->dims[sp + j];
        q->k[t] = a->kernel[j];
        q->s[t] = a->stride[j];
        q->p[t] = a->padding[j];
    }
}

#endif
