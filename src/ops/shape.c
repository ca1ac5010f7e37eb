/* Shape ops: reshape, permute/transpose, expand, concat, slice, split. */
#include <string.h>
#include "core/half.h"
#include "kern.h"

_Static_assert(TS_ATTR_RANK == TS_MAX_RANK, "ts_shape_attrs holds TS_MAX_RANK dims");

/* ---- reshape: a.shape (rank, dims). The output shares the input's
 * memory (TS_OPF_ALIAS); the kernel only copies when the planner could not
 * alias them. */

static ts_status infer_reshape(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    int rank = (int)n->a.shape.rank;
    if (rank < 0 || rank > TS_MAX_RANK)
        return ts_fail(TS_ERR_INVALID, "rank %d out of range [0, %d]", rank, TS_MAX_RANK);
    out->dtype = a->dtype;
    out->rank = rank;
    for (int i = 0; i < rank; i++) out->dims[i] = n->a.shape.dims[i];
    if (ts_type_numel(out) != ts_type_numel(a)) {
        char tb[128];
        return ts_fail(TS_ERR_SHAPE, "cannot reshape %lld elements into %s",
                       (long long)ts_type_numel(a), ts_type_str(tb, sizeof tb, out));
    }
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_reshape(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    const ts_type *a = ts_in_type(g, n, 0);
    ts_type t = *a;
    din[0] = ts_reshape(g, dy[0], t.rank, t.dims);
    return ts_graph_status(g);
}

static ts_status k_reshape(const ts_kargs *k) {
    if (k->out[0].data != k->in[0].data)
        memcpy(k->out[0].data, k->in[0].data,
               (size_t)ts_tensor_numel(&k->in[0]) * ts_dtype_size(k->in[0].dtype));
    return TS_OK;
}

const ts_op_def ts_def_reshape = {.name = "reshape",
                                  .min_in = 1,
                                  .max_in = 1,
                                  .flags = TS_OPF_ALIAS,
                                  .infer = infer_reshape,
                                  .grad = grad_reshape,
                                  .kernel = k_reshape};

ts_val ts_reshape(ts_graph *g, ts_val a, int rank, const int64_t *dims) {
    if (!g || g->status != TS_OK || !ts_val_ok(a)) return TS_NONE;
    if (rank < 0 || rank > TS_MAX_RANK || (rank && !dims))
        return ts_graph_fail(g, TS_ERR_INVALID, "reshape: rank %d out of range [0, %d]", rank,
                             TS_MAX_RANK);
    int64_t total = ts_numel(g, a), known = 1;
    int infer_at = -1;
    ts_attrs at = ts_attrs_zero();
    at.shape.rank = rank;
    for (int i = 0; i < rank; i++) {
        if (dims[i] == -1 && infer_at < 0) {
            infer_at = i;
        } else if (dims[i] <= 0) {
            return ts_graph_fail(g, TS_ERR_SHAPE, "reshape: dimension %d is %lld", i,
                                 (long long)dims[i]);
        } else {
            known *= dims[i];
        }
        at.shape.dims[i] = dims[i];
    }
    if (infer_at >= 0) {
        if (total % known != 0) {
            char tb[128];
            return ts_graph_fail(
                g, TS_ERR_SHAPE, "reshape: cannot infer -1 for %s (%lld elements, %lld known)",
                ts_type_str(tb, sizeof tb, &ts_v(g, a)->t), (long long)total, (long long)known);
        }
        at.shape.dims[infer_at] = total / known;
    }
    /* A reshape to the same shape is the value itself. */
    const ts_type *t = &ts_v(g, a)->t;
    if (t->rank == rank) {
        int same = 1;
        for (int i = 0; i < rank; i++) same &= t->dims[i] == at.shape.dims[i];
        if (same) return a;
    }
    return ts_node_add(g, TS_OP_RESHAPE, 1, &a, &at, NULL);
}

/* ---- helpers shared by the data-movement kernels below --------------------
 * They work on bytes (element size from the dtype), so every dtype is
 * supported. Results are pure copies: any thread split gives the same bytes. */

#define COPY_CHUNK ((size_t)1 << 18)

/* memcpy split into fixed chunks over threads when it is large. */
static void par_copy(void *dst, const void *src, size_t bytes) {
    int64_t nch = (int64_t)((bytes + COPY_CHUNK - 1) / COPY_CHUNK);
#pragma omp parallel for schedule(static) if (nch >= 4)
    for (int64_t c = 0; c < nch; c++) {
        size_t off = (size_t)c * COPY_CHUNK,
               len = bytes - off < COPY_CHUNK ? bytes - off : COPY_CHUNK;
        memcpy((char *)dst + off, (const char *)src + off, len);
    }
}

static int64_t prod_dims(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

/* Drop size-1 axes and merge neighbours whose element strides make them one
 * axis (s[k] == s[k+1] * d[k+1], which includes runs of broadcast 0 strides).
 * Rewrites d and s in place; returns the new rank. */
static int simplify_strides(int rank, int64_t *d, int64_t *s) {
    int r = 0;
    for (int i = 0; i < rank; i++) {
        if (d[i] == 1) continue;
        if (r > 0 && s[r - 1] == s[i] * d[i]) {
            d[r - 1] *= d[i];
            s[r - 1] = s[i];
        } else {
            d[r] = d[i];
            s[r] = s[i];
            r++;
        }
    }
    return r;
}

/* Input element offset of output position `pos` over axes [0, rank). */
static inline int64_t strided_offset(int64_t pos, int rank, const int64_t *d, const int64_t *s) {
    int64_t off = 0;
    for (int i = rank - 1; i >= 0; i--) {
        off += (pos % d[i]) * s[i];
        pos /= d[i];
    }
    return off;
}

/* out[a * os + c] = in[a + c * is] over a tile: the inner output axis reads
 * the input with stride `is`, the outer one with stride 1. */
#define DEF_TILE(name, T)                                                                          \
    static void name(void *out_, const void *in_, int64_t a0, int64_t a1, int64_t c0, int64_t c1,  \
                     int64_t os, int64_t is) {                                                     \
        T *out = out_;                                                                             \
        const T *in = in_;                                                                         \
        for (int64_t a = a0; a < a1; a++)                                                          \
            for (int64_t c = c0; c < c1; c++) out[a * os + c] = in[a + c * is];                    \
    }
DEF_TILE(tile8, uint8_t)
DEF_TILE(tile16, uint16_t)
DEF_TILE(tile32, uint32_t)
DEF_TILE(tile64, uint64_t)

/* The same tile from f32 to bf16 (permute.out_low), rounded as the cast op. */
static void tile_f32_bf16(void *out_, const void *in_, int64_t a0, int64_t a1, int64_t c0,
                          int64_t c1, int64_t os, int64_t is) {
    uint16_t *out = out_;
    const float *in = in_;
    for (int64_t a = a0; a < a1; a++)
        for (int64_t c = c0; c < c1; c++) out[a * os + c] = ts_f32_to_bf16(in[a + c * is]);
}

typedef void (*tile_fn)(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);

static tile_fn tile_for(size_t es) {
    return es == 1 ? tile8 : es == 2 ? tile16 : es == 4 ? tile32 : es == 8 ? tile64 : NULL;
}

#define TILE 32

/* out (dims d, contiguous) = in read with element strides s per output axis.
 * Covers every permutation: after simplification either the last output
 * axis is contiguous in the input (copy rows: the [B,T,H,hd] <-> [B,H,T,hd]
 * pattern), or some other output axis k is, and the copy is a batch of 2-D
 * transposes between axis k and the last axis done in cache-sized tiles.
 * es is the element size of in; low 1: in is f32 and out bf16, each element
 * rounded as the cast op rounds it (the bits of a copy plus a cast). */
static ts_status strided_copy(const ts_kargs *k, const char *op, int rank, const int64_t *dims,
                              const int64_t *strides, size_t es, int low, char *out,
                              const char *in) {
    const size_t oes = low ? sizeof(uint16_t) : es; /* out's element size */
    int64_t d[TS_MAX_RANK], s[TS_MAX_RANK], n = prod_dims(dims, 0, rank);
    for (int i = 0; i < rank; i++) d[i] = dims[i], s[i] = strides[i];
    int r = simplify_strides(rank, d, s);
    if (r == 0 || (r == 1 && s[0] == 1)) { /* one element, or one contiguous run */
        if (low)
            ts_f32_to_bf16_n((uint16_t *)out, (const float *)in, n);
        else
            par_copy(out, in, (size_t)n * es);
        return TS_OK;
    }
    int L = r - 1;
    if (s[L] == 1) {
        /* Rows of d[L] contiguous elements; one work item walks the
         * second-to-last axis so the offset division is paid once per item. */
        size_t row = (size_t)d[L] * es, orow = (size_t)d[L] * oes;
        /* r >= 2 here: a single unit-stride axis was a plain copy above. */
        int64_t inner_rows = d[L - 1], items = n / (d[L] * inner_rows);
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
        for (int64_t t = 0; t < items; t++) {
            int64_t ib = strided_offset(t, L - 1, d, s);
            char *o = out + (size_t)(t * inner_rows) * orow;
            for (int64_t j = 0; j < inner_rows; j++) {
                const char *src = in + (size_t)(ib + j * s[L - 1]) * es;
                if (low) /* through the vectorised rounding (one thread: nested) */
                    ts_f32_to_bf16_n((uint16_t *)(o + (size_t)j * orow), (const float *)src, d[L]);
                else
                    memcpy(o + (size_t)j * row, src, row);
            }
        }
        return TS_OK;
    }
    int ka = -1;
    for (int i = 0; i < L; i++)
        if (s[i] == 1) ka = i;
    tile_fn tile = low ? tile_f32_bf16 : tile_for(es);
    if (ka < 0 || !tile)
        return ts_fail(TS_ERR_INTERNAL, "%s '%s': no unit-stride axis (element size %zu)", op,
                       k->label ? k->label : "?", es);
    /* Output strides and the batch axes (all but ka and L). */
    int64_t os[TS_MAX_RANK], bd[TS_MAX_RANK], bi[TS_MAX_RANK], bo[TS_MAX_RANK];
    os[L] = 1;
    for (int i = L - 1; i >= 0; i--) os[i] = os[i + 1] * d[i + 1];
    int nb = 0;
    for (int i = 0; i < L; i++)
        if (i != ka) {
            bd[nb] = d[i];
            bi[nb] = s[i];
            bo[nb] = os[i];
            nb++;
        }
    int64_t batch = prod_dims(bd, 0, nb), ta = (d[ka] + TILE - 1) / TILE,
            tc = (d[L] + TILE - 1) / TILE, items = batch * ta * tc;
    int64_t A = d[ka], C = d[L], oka = os[ka], isl = s[L];
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t t = 0; t < items; t++) {
        int64_t b = t / (ta * tc), rem = t % (ta * tc), a0 = rem / tc * TILE, c0 = rem % tc * TILE;
        int64_t a1 = a0 + TILE < A ? a0 + TILE : A, c1 = c0 + TILE < C ? c0 + TILE : C;
        int64_t ib = strided_offset(b, nb, bd, bi), ob = strided_offset(b, nb, bd, bo);
        tile(out + (size_t)ob * oes, in + (size_t)ib * es, a0, a1, c0, c1, oka, isl);
    }
    return TS_OK;
}

static char *type_label(const ts_graph *g, ts_val v, char *buf, size_t n) {
    char lb[32], tb[128];
    snprintf(buf, n, "%s=%s", ts_value_label(g, v.id, lb, sizeof lb),
             ts_type_str(tb, sizeof tb, &ts_v(g, v)->t));
    return buf;
}

/* 1 if a builder may go on; 0 (quietly) after an earlier error. */
static int usable(const ts_graph *g, ts_val v) {
    return g && g->status == TS_OK && ts_val_ok(v) && v.id < g->n_values;
}

/* ---- permute: a.permute.perm, out.dims[i] = in.dims[perm[i]] --------- */

static ts_status infer_permute(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    int seen[TS_MAX_RANK] = {0};
    out->dtype = a->dtype;
    out->rank = a->rank;
    for (int i = 0; i < a->rank; i++) {
        int64_t p = n->a.permute.perm[i];
        if (p < 0 || p >= a->rank)
            return ts_fail(TS_ERR_INVALID, "perm[%d] = %lld out of range for rank %d", i,
                           (long long)p, a->rank);
        if (seen[p]++) return ts_fail(TS_ERR_INVALID, "perm repeats axis %lld", (long long)p);
        out->dims[i] = a->dims[p];
    }
    if (n->a.permute.out_low && (n->a.permute.out_low != 1 || a->dtype != TS_F32))
        return ts_fail(TS_ERR_INVALID, "out_low (a bf16 result) is 1 on a permute of f32 only");
    if (n->a.permute.out_low) out->dtype = TS_BF16;
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_permute(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    int rank = ts_in_type(g, n, 0)->rank, inv[TS_MAX_RANK];
    for (int i = 0; i < rank; i++) inv[n->a.permute.perm[i]] = i;
    din[0] = ts_permute(g, dy[0], inv);
    return ts_graph_status(g);
}

static ts_status k_permute(const ts_kargs *k) {
    const ts_tensor *a = &k->in[0], *o = &k->out[0];
    int64_t ist[TS_MAX_RANK], s[TS_MAX_RANK];
    ist[a->rank - 1 >= 0 ? a->rank - 1 : 0] = 1;
    for (int i = a->rank - 2; i >= 0; i--) ist[i] = ist[i + 1] * a->dims[i + 1];
    for (int i = 0; i < o->rank; i++) s[i] = ist[k->a->permute.perm[i]];
    const int low = k->a->permute.out_low != 0;
    if (low && (a->dtype != TS_F32 || o->dtype != TS_BF16))
        return ts_kernel_bad_dtype(k, "permute", o->dtype);
    return strided_copy(k, "permute", o->rank, o->dims, s, ts_dtype_size(a->dtype), low, o->data,
                        a->data);
}

const ts_op_def ts_def_permute = {.name = "permute",
                                  .min_in = 1,
                                  .max_in = 1,
                                  .infer = infer_permute,
                                  .grad = grad_permute,
                                  .kernel = k_permute};

ts_val ts_permute(ts_graph *g, ts_val a, const int *perm) {
    if (!usable(g, a)) return g ? ts_node_add(g, TS_OP_PERMUTE, 1, &a, NULL, NULL) : TS_NONE;
    int rank = ts_v(g, a)->t.rank, identity = 1;
    if (rank > 0 && !perm) {
        char ab[200];
        return ts_graph_fail(g, TS_ERR_INVALID, "permute(%s): perm is NULL",
                             type_label(g, a, ab, sizeof ab));
    }
    ts_attrs at = ts_attrs_zero();
    for (int i = 0; i < rank; i++) {
        int p = ts_axis(perm[i], rank);
        /* A bad entry is passed through so inference reports it with shapes. */
        at.permute.perm[i] = p < 0 ? perm[i] : p;
        identity &= at.permute.perm[i] == i;
    }
    if (identity) return a;
    return ts_node_add(g, TS_OP_PERMUTE, 1, &a, &at, NULL);
}

ts_val ts_transpose(ts_graph *g, ts_val a, int axis0, int axis1) {
    if (!usable(g, a)) return g ? ts_node_add(g, TS_OP_PERMUTE, 1, &a, NULL, NULL) : TS_NONE;
    int rank = ts_v(g, a)->t.rank, a0 = ts_axis(axis0, rank), a1 = ts_axis(axis1, rank);
    if (a0 < 0 || a1 < 0) {
        char ab[200];
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "transpose(%s): axes (%d, %d) out of range for rank %d",
                             type_label(g, a, ab, sizeof ab), axis0, axis1, rank);
    }
    int perm[TS_MAX_RANK];
    for (int i = 0; i < rank; i++) perm[i] = i;
    perm[a0] = a1;
    perm[a1] = a0;
    return ts_permute(g, a, perm);
}

/* ---- expand: a.shape (the target's rank and dims) ---------------------- */

static ts_status infer_expand(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    int64_t rank = n->a.shape.rank;
    if (rank < a->rank || rank > TS_MAX_RANK)
        return ts_fail(TS_ERR_INVALID, "target rank %lld out of range [%d, %d]", (long long)rank,
                       a->rank, TS_MAX_RANK);
    out->dtype = a->dtype;
    out->rank = (int)rank;
    for (int i = 0; i < rank; i++) {
        out->dims[i] = n->a.shape.dims[i];
        if (out->dims[i] <= 0)
            return ts_fail(TS_ERR_INVALID, "target dimension %d is %lld", i,
                           (long long)out->dims[i]);
    }
    int lead = (int)rank - a->rank;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != 1 && a->dims[i] != out->dims[lead + i]) {
            char tb[128];
            return ts_fail(TS_ERR_SHAPE, "cannot broadcast to %s: axis %d is %lld",
                           ts_type_str(tb, sizeof tb, out), i - a->rank, (long long)a->dims[i]);
        }
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_expand(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    din[0] = ts_sum_to(g, dy[0], ts_mkval(n->in[0]));
    return ts_graph_status(g);
}

#define DEF_FILL(name, T)                                                                          \
    static void name(void *o_, const void *x_, int64_t n) {                                        \
        T *o = o_, x = *(const T *)x_;                                                             \
        for (int64_t i = 0; i < n; i++) o[i] = x;                                                  \
    }
DEF_FILL(fill8, uint8_t)
DEF_FILL(fill16, uint16_t)
DEF_FILL(fill32, uint32_t)
DEF_FILL(fill64, uint64_t)

static ts_status k_expand(const ts_kargs *k) {
    const ts_tensor *a = &k->in[0], *o = &k->out[0];
    size_t es = ts_dtype_size(a->dtype);
    int64_t d[TS_MAX_RANK], s[TS_MAX_RANK], n = ts_tensor_numel(o);
    ts_bcast_strides(a, o, s);
    for (int i = 0; i < o->rank; i++) d[i] = o->dims[i];
    int r = simplify_strides(o->rank, d, s);
    char *out = o->data;
    const char *in = a->data;
    if (r == 0 || s[r - 1] == 1) {
        /* Rows of contiguous input elements, repeated where strides are 0. */
        int64_t len = r ? d[r - 1] : 1, rows = n / len;
        size_t row = (size_t)len * es;
        if (rows == 1) {
            par_copy(out, in, row);
            return TS_OK;
        }
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
        for (int64_t t = 0; t < rows; t++)
            memcpy(out + (size_t)t * row, in + (size_t)strided_offset(t, r - 1, d, s) * es, row);
        return TS_OK;
    }
    /* The last axis broadcasts: each row is one input element repeated. */
    void (*fill)(void *, const void *, int64_t) = es == 1   ? fill8
                                                  : es == 2 ? fill16
                                                  : es == 4 ? fill32
                                                  : es == 8 ? fill64
                                                            : NULL;
    if (!fill) return ts_kernel_bad_dtype(k, "expand", a->dtype);
    int64_t len = d[r - 1], rows = n / len;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t t = 0; t < rows; t++)
        fill(out + (size_t)(t * len) * es, in + (size_t)strided_offset(t, r - 1, d, s) * es, len);
    return TS_OK;
}

const ts_op_def ts_def_expand = {.name = "expand",
                                 .min_in = 1,
                                 .max_in = 1,
                                 .infer = infer_expand,
                                 .grad = grad_expand,
                                 .kernel = k_expand};

/* ---- concat: a.concat.axis ---------------------------------------------- */

static ts_status infer_concat(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    int64_t axis = n->a.concat.axis;
    if (a->rank < 1) return ts_fail(TS_ERR_SHAPE, "cannot concatenate rank-0 tensors");
    if (axis < 0 || axis >= a->rank)
        return ts_fail(TS_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axis,
                       a->rank);
    *out = *a;
    for (int j = 1; j < n->n_in; j++) {
        const ts_type *b = ts_in_type(g, n, j);
        if (b->dtype != a->dtype)
            return ts_fail(TS_ERR_SHAPE, "input %d has dtype %s, input 0 has %s", j,
                           ts_dtype_name(b->dtype), ts_dtype_name(a->dtype));
        if (b->rank != a->rank)
            return ts_fail(TS_ERR_SHAPE, "input %d has rank %d, input 0 has rank %d", j, b->rank,
                           a->rank);
        for (int i = 0; i < a->rank; i++)
            if (i != axis && b->dims[i] != a->dims[i])
                return ts_fail(TS_ERR_SHAPE,
                               "input %d differs from input 0 on axis %d (%lld vs %lld)", j, i,
                               (long long)b->dims[i], (long long)a->dims[i]);
        out->dims[axis] += b->dims[axis];
    }
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_concat(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    int64_t axis = n->a.concat.axis, off = 0;
    for (int j = 0; j < n->n_in; j++) {
        int64_t len = ts_in_type(g, n, j)->dims[axis];
        ts_attrs a = ts_attrs_zero();
        a.slice.axis = axis;
        a.slice.start = off;
        a.slice.end = off + len;
        din[j] = ts_node_add(g, TS_OP_SLICE, 1, dy, &a, NULL);
        off += len;
    }
    return ts_graph_status(g);
}

static ts_status k_concat(const ts_kargs *k) {
    const ts_tensor *o = &k->out[0];
    int axis = (int)k->a->concat.axis;
    size_t es = ts_dtype_size(o->dtype);
    int64_t outer = prod_dims(o->dims, 0, axis), inner = prod_dims(o->dims, axis + 1, o->rank);
    size_t orow = (size_t)(o->dims[axis] * inner) * es;
    char *out = o->data;
    if (outer == 1) {
        size_t off = 0;
        for (int j = 0; j < k->n_in; j++) {
            size_t len = (size_t)(k->in[j].dims[axis] * inner) * es;
            par_copy(out + off, k->in[j].data, len);
            off += len;
        }
        return TS_OK;
    }
    int nin = k->n_in;
#pragma omp parallel for schedule(static) if (ts_tensor_numel(o) >= TS_PAR_MIN)
    for (int64_t b = 0; b < outer; b++) {
        size_t off = 0;
        for (int j = 0; j < nin; j++) {
            size_t len = (size_t)(k->in[j].dims[axis] * inner) * es;
            memcpy(out + (size_t)b * orow + off, (const char *)k->in[j].data + (size_t)b * len,
                   len);
            off += len;
        }
    }
    return TS_OK;
}

const ts_op_def ts_def_concat = {.name = "concat",
                                 .min_in = 1,
                                 .max_in = -1,
                                 .infer = infer_concat,
                                 .grad = grad_concat,
                                 .kernel = k_concat};

ts_val ts_concat(ts_graph *g, int n, const ts_val *vals, int axis) {
    if (!g || g->status != TS_OK) return TS_NONE;
    if (n < 1 || !vals)
        return ts_graph_fail(g, TS_ERR_INVALID, "concat: needs at least one input (got %d)", n);
    for (int j = 0; j < n; j++)
        if (!usable(g, vals[j])) return ts_node_add(g, TS_OP_CONCAT, n, vals, NULL, NULL);
    int ax = ts_axis(axis, ts_v(g, vals[0])->t.rank);
    ts_attrs at = ts_attrs_zero();
    at.concat.axis = ax < 0 ? axis : ax;
    if (n == 1 && ax >= 0) return vals[0];
    return ts_node_add(g, TS_OP_CONCAT, n, vals, &at, NULL);
}

/* ---- slice: a.slice (axis, [start, end) normalised) ------------------- */

static ts_status check_slice(const ts_type *t, int64_t axis, int64_t start, int64_t end,
                             int64_t extent) {
    if (axis < 0 || axis >= t->rank)
        return ts_fail(TS_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axis,
                       t->rank);
    if (start < 0 || end > extent || start >= end)
        return ts_fail(TS_ERR_INVALID, "range [%lld, %lld) is empty or outside [0, %lld)",
                       (long long)start, (long long)end, (long long)extent);
    return TS_OK;
}

static ts_status infer_slice(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0);
    int64_t axis = n->a.slice.axis, start = n->a.slice.start, end = n->a.slice.end;
    if (a->rank < 1) return ts_fail(TS_ERR_SHAPE, "cannot slice a rank-0 tensor");
    ts_status s = check_slice(a, axis, start, end, axis >= 0 && axis < a->rank ? a->dims[axis] : 0);
    if (s != TS_OK) return s;
    *out = *a;
    out->dims[axis] = end - start;
    *n_out = 1;
    return TS_OK;
}

/* (dy) -> zeros of the source shape with dy at [start, end); a.slice.extent. */
static ts_status infer_slice_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *dy = ts_in_type(g, n, 0);
    int64_t axis = n->a.slice.axis, start = n->a.slice.start, end = n->a.slice.end,
            extent = n->a.slice.extent;
    if (dy->rank < 1) return ts_fail(TS_ERR_SHAPE, "gradient of a slice cannot be rank 0");
    ts_status s = check_slice(dy, axis, start, end, extent);
    if (s != TS_OK) return s;
    if (dy->dims[axis] != end - start)
        return ts_fail(TS_ERR_SHAPE, "gradient axis %lld is %lld, the slice [%lld, %lld) has %lld",
                       (long long)axis, (long long)dy->dims[axis], (long long)start, (long long)end,
                       (long long)(end - start));
    *out = *dy;
    out->dims[axis] = extent;
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_slice(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_attrs a = n->a;
    a.slice.extent = ts_in_type(g, n, 0)->dims[n->a.slice.axis];
    din[0] = ts_node_add(g, TS_OP_SLICE_BWD, 1, dy, &a, NULL);
    return ts_graph_status(g);
}

/* slice_bwd is linear; its adjoint is the slice itself. */
static ts_status grad_slice_bwd(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_attrs a = ts_attrs_zero();
    a.slice.axis = n->a.slice.axis;
    a.slice.start = n->a.slice.start;
    a.slice.end = n->a.slice.end;
    din[0] = ts_node_add(g, TS_OP_SLICE, 1, dy, &a, NULL);
    return ts_graph_status(g);
}

static ts_status k_slice(const ts_kargs *k) {
    const ts_tensor *a = &k->in[0], *o = &k->out[0];
    int axis = (int)k->a->slice.axis;
    size_t es = ts_dtype_size(a->dtype);
    int64_t outer = prod_dims(a->dims, 0, axis), inner = prod_dims(a->dims, axis + 1, a->rank);
    size_t irow = (size_t)(a->dims[axis] * inner) * es, orow = (size_t)(o->dims[axis] * inner) * es;
    size_t skip = (size_t)(k->a->slice.start * inner) * es;
    const char *in = (const char *)a->data + skip;
    char *out = o->data;
    if (outer == 1) {
        par_copy(out, in, orow);
        return TS_OK;
    }
#pragma omp parallel for schedule(static) if (ts_tensor_numel(o) >= TS_PAR_MIN)
    for (int64_t b = 0; b < outer; b++) memcpy(out + (size_t)b * orow, in + (size_t)b * irow, orow);
    return TS_OK;
}

static ts_status k_slice_bwd(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *o = &k->out[0];
    int axis = (int)k->a->slice.axis;
    size_t es = ts_dtype_size(o->dtype);
    int64_t outer = prod_dims(o->dims, 0, axis), inner = prod_dims(o->dims, axis + 1, o->rank);
    size_t orow = (size_t)(o->dims[axis] * inner) * es,
           irow = (size_t)(dy->dims[axis] * inner) * es;
    size_t head = (size_t)(k->a->slice.start * inner) * es, tail = orow - head - irow;
    const char *in = dy->data;
    char *out = o->data;
    if (outer == 1) {
        /* All-bits-zero is zero for every dtype. */
        memset(out, 0, head);
        par_copy(out + head, in, irow);
        memset(out + head + irow, 0, tail);
        return TS_OK;
    }
#pragma omp parallel for schedule(static) if (ts_tensor_numel(o) >= TS_PAR_MIN)
    for (int64_t b = 0; b < outer; b++) {
        char *r = out + (size_t)b * orow;
        memset(r, 0, head);
        memcpy(r + head, in + (size_t)b * irow, irow);
        memset(r + head + irow, 0, tail);
    }
    return TS_OK;
}

const ts_op_def ts_def_slice = {.name = "slice",
                                .min_in = 1,
                                .max_in = 1,
                                .infer = infer_slice,
                                .grad = grad_slice,
                                .kernel = k_slice};

const ts_op_def ts_def_slice_bwd = {.name = "slice_bwd",
                                    .min_in = 1,
                                    .max_in = 1,
                                    .infer = infer_slice_bwd,
                                    .grad = grad_slice_bwd,
                                    .kernel = k_slice_bwd};

ts_val ts_slice(ts_graph *g, ts_val a, int axis, int64_t start, int64_t end) {
    if (!usable(g, a)) return g ? ts_node_add(g, TS_OP_SLICE, 1, &a, NULL, NULL) : TS_NONE;
    const ts_type *t = &ts_v(g, a)->t;
    char ab[200];
    int ax = ts_axis(axis, t->rank);
    if (ax < 0)
        return ts_graph_fail(g, TS_ERR_INVALID, "slice(%s): axis %d out of range for rank %d",
                             type_label(g, a, ab, sizeof ab), axis, t->rank);
    int64_t extent = t->dims[ax], s = start < 0 ? start + extent : start,
            e = end < 0 ? end + extent : end;
    if (s < 0 || s > extent || e < 0 || e > extent)
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "slice(%s): [%lld, %lld) is out of range for axis %d of extent %lld",
                             type_label(g, a, ab, sizeof ab), (long long)start, (long long)end,
                             axis, (long long)extent);
    if (s >= e)
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "slice(%s): [%lld, %lld) is empty on axis %d of extent %lld",
                             type_label(g, a, ab, sizeof ab), (long long)start, (long long)end,
                             axis, (long long)extent);
    if (s == 0 && e == extent) return a;
    ts_attrs at = ts_attrs_zero();
    at.slice.axis = ax;
    at.slice.start = s;
    at.slice.end = e;
    return ts_node_add(g, TS_OP_SLICE, 1, &a, &at, NULL);
}

ts_status ts_split(ts_graph *g, ts_val a, int axis, int n, const int64_t *sizes, ts_val *outs) {
    if (!g) return ts_fail(TS_ERR_INVALID, "split: graph is NULL");
    for (int j = 0; outs && j < n; j++) outs[j] = TS_NONE;
    if (!usable(g, a)) {
        if (g->status == TS_OK) ts_node_add(g, TS_OP_SLICE, 1, &a, NULL, NULL);
        return g->status != TS_OK ? g->status : ts_fail(TS_ERR_INVALID, "split: invalid value");
    }
    const ts_type *t = &ts_v(g, a)->t;
    char ab[200];
    int ax = ts_axis(axis, t->rank);
    if (ax < 0) {
        ts_graph_fail(g, TS_ERR_INVALID, "split(%s): axis %d out of range for rank %d",
                      type_label(g, a, ab, sizeof ab), axis, t->rank);
        return g->status;
    }
    if (n < 1 || !sizes || !outs) {
        ts_graph_fail(g, TS_ERR_INVALID, "split(%s): needs n >= 1 sizes and outputs (n = %d)",
                      type_label(g, a, ab, sizeof ab), n);
        return g->status;
    }
    int64_t extent = t->dims[ax], total = 0;
    for (int j = 0; j < n; j++) {
        if (sizes[j] <= 0) {
            ts_graph_fail(g, TS_ERR_INVALID, "split(%s): size %d is %lld (must be > 0)",
                          type_label(g, a, ab, sizeof ab), j, (long long)sizes[j]);
            return g->status;
        }
        total += sizes[j];
    }
    if (total != extent) {
        ts_graph_fail(g, TS_ERR_SHAPE, "split(%s): sizes sum to %lld but axis %d has %lld",
                      type_label(g, a, ab, sizeof ab), (long long)total, axis, (long long)extent);
        return g->status;
    }
    int64_t off = 0;
    for (int j = 0; j < n; j++) {
        outs[j] = ts_slice(g, a, ax, off, off + sizes[j]);
        off += sizes[j];
    }
    return g->status;
}
