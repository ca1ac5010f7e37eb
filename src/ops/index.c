/* Indexing ops: gather (NumPy take along an axis) and its gradient
 * scatter_add; scatter_add_to, the fusion pass's base + scatter_add in one
 * pass over the base; builders ts_gather and ts_embedding. */
#include <string.h>
#include "kern.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- shared helpers ----------------------------------------------------- */

static int is_index_dtype(ts_dtype dt) {
    return dt == TS_I32 || dt == TS_I64;
}

static inline int64_t index_at(const void *idx, ts_dtype dt, int64_t j) {
    return dt == TS_I32 ? (int64_t)((const int32_t *)idx)[j] : ((const int64_t *)idx)[j];
}

/* Every index must lie in [0, extent). Checked before anything is written,
 * so a failing step leaves no half-written output; the first bad position
 * is reported. */
static ts_status check_indices(const ts_kargs *k, const char *op, const ts_tensor *idx,
                               int64_t extent) {
    int64_t n = ts_tensor_numel(idx), bad = -1;
    if (idx->dtype == TS_I32) {
        const int32_t *p = idx->data;
        for (int64_t j = 0; j < n; j++)
            if (p[j] < 0 || p[j] >= extent) {
                bad = j;
                break;
            }
    } else {
        const int64_t *p = idx->data;
        for (int64_t j = 0; j < n; j++)
            if (p[j] < 0 || p[j] >= extent) {
                bad = j;
                break;
            }
    }
    if (bad < 0) return TS_OK;
    return ts_fail(TS_ERR_INVALID, "%s '%s': index %lld (at position %lld) out of range [0, %lld)",
                   op, k->label ? k->label : "?", (long long)index_at(idx->data, idx->dtype, bad),
                   (long long)bad, (long long)extent);
}

static int64_t prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

/* ---- inference --------------------------------------------------------- */

/* (data, idx) -> data.shape[:axis] + idx.shape + data.shape[axis+1:] */
static ts_status infer_gather(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *d = ts_in_type(g, n, 0), *ix = ts_in_type(g, n, 1);
    int64_t axis = n->a.index.axis;
    if (!is_index_dtype(ix->dtype))
        return ts_fail(TS_ERR_SHAPE, "indices must be i32 or i64, got %s",
                       ts_dtype_name(ix->dtype));
    if (d->rank < 1) return ts_fail(TS_ERR_SHAPE, "cannot gather from a rank-0 tensor");
    if (axis < 0 || axis >= d->rank)
        return ts_fail(TS_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axis,
                       d->rank);
    int rank = d->rank - 1 + ix->rank;
    if (rank > TS_MAX_RANK)
        return ts_fail(TS_ERR_SHAPE, "result rank %d exceeds %d", rank, TS_MAX_RANK);
    out->dtype = d->dtype;
    out->rank = rank;
    int r = 0;
    for (int i = 0; i < axis; i++) out->dims[r++] = d->dims[i];
    for (int i = 0; i < ix->rank; i++) out->dims[r++] = ix->dims[i];
    for (int i = (int)axis + 1; i < d->rank; i++) out->dims[r++] = d->dims[i];
    *n_out = 1;
    return TS_OK;
}

/* (dy, idx) -> dy.shape[:axis] + [extent] + dy.shape[axis+idx.rank:] */
static ts_status infer_scatter_add(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *dy = ts_in_type(g, n, 0), *ix = ts_in_type(g, n, 1);
    int64_t axis = n->a.index.axis, extent = n->a.index.extent;
    if (!is_index_dtype(ix->dtype))
        return ts_fail(TS_ERR_SHAPE, "indices must be i32 or i64, got %s",
                       ts_dtype_name(ix->dtype));
    if (!ts_dtype_is_float(dy->dtype))
        return ts_fail(TS_ERR_SHAPE, "gradient must be a float type, got %s",
                       ts_dtype_name(dy->dtype));
    if (extent <= 0)
        return ts_fail(TS_ERR_INVALID, "data extent %lld must be > 0", (long long)extent);
    int rank = dy->rank - ix->rank + 1;
    if (axis < 0 || axis >= rank)
        return ts_fail(TS_ERR_INVALID, "axis %lld out of range for result rank %d", (long long)axis,
                       rank);
    for (int i = 0; i < ix->rank; i++)
        if (dy->dims[axis + i] != ix->dims[i])
            return ts_fail(TS_ERR_SHAPE, "gradient axis %lld is %lld but index axis %d is %lld",
                           (long long)axis + i, (long long)dy->dims[axis + i], i,
                           (long long)ix->dims[i]);
    out->dtype = dy->dtype;
    out->rank = rank;
    for (int i = 0; i < axis; i++) out->dims[i] = dy->dims[i];
    out->dims[axis] = extent;
    for (int i = (int)axis + 1; i < rank; i++) out->dims[i] = dy->dims[i - 1 + ix->rank];
    *n_out = 1;
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

static ts_status grad_gather(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_attrs a = ts_attrs_zero();
    a.index.axis = n->a.index.axis;
    a.index.extent = ts_in_type(g, n, 0)->dims[n->a.index.axis];
    ts_val in[2] = {dy[0], ts_mkval(n->in[1])};
    din[0] = ts_node_add(g, TS_OP_SCATTER_ADD, 2, in, &a, NULL);
    return ts_graph_status(g);
}

/* scatter_add is linear in dy; its adjoint is the gather it came from. */
static ts_status grad_scatter_add(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_attrs a = ts_attrs_zero();
    a.index.axis = n->a.index.axis;
    ts_val in[2] = {dy[0], ts_mkval(n->in[1])};
    din[0] = ts_node_add(g, TS_OP_GATHER, 2, in, &a, NULL);
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

/* Copy `n` elements of size es whose source rows are picked by idx:
 * dst[j] = src[idx[j]] for single elements (gather along the last axis). */
#define DEF_PICK(name, T)                                                                          \
    static void name(void *dst_, const void *src_, const void *idx, ts_dtype idt, int64_t n) {     \
        T *dst = dst_;                                                                             \
        const T *src = src_;                                                                       \
        if (idt == TS_I32) {                                                                       \
            const int32_t *ix = idx;                                                               \
            for (int64_t j = 0; j < n; j++) dst[j] = src[ix[j]];                                   \
        } else {                                                                                   \
            const int64_t *ix = idx;                                                               \
            for (int64_t j = 0; j < n; j++) dst[j] = src[ix[j]];                                   \
        }                                                                                          \
    }
DEF_PICK(pick8, uint8_t)
DEF_PICK(pick16, uint16_t)
DEF_PICK(pick32, uint32_t)
DEF_PICK(pick64, uint64_t)

/* Works on bytes, so every dtype is supported. */
static ts_status k_gather(const ts_kargs *k) {
    const ts_tensor *d = &k->in[0], *ix = &k->in[1], *o = &k->out[0];
    int axis = (int)k->a->index.axis;
    int64_t extent = d->dims[axis];
    ts_status s = check_indices(k, "gather", ix, extent);
    if (s != TS_OK) return s;
    size_t es = ts_dtype_size(d->dtype);
    int64_t outer = prod(d->dims, 0, axis), inner = prod(d->dims, axis + 1, d->rank);
    int64_t nidx = ts_tensor_numel(ix), total = outer * nidx * inner;
    size_t row = (size_t)inner * es;
    const char *src = d->data;
    char *dst = o->data;
    if (inner == 1 && (es == 1 || es == 2 || es == 4 || es == 8)) {
        /* Single elements: a typed loop per outer slab beats memcpy calls. */
        void (*pick)(void *, const void *, const void *, ts_dtype, int64_t) = es == 1   ? pick8
                                                                              : es == 2 ? pick16
                                                                              : es == 4 ? pick32
                                                                                        : pick64;
#pragma omp parallel for schedule(static) if (total >= TS_PAR_MIN)
        for (int64_t b = 0; b < outer; b++)
            pick(dst + (size_t)(b * nidx) * es, src + (size_t)(b * extent) * es, ix->data,
                 ix->dtype, nidx);
        return TS_OK;
    }
    int64_t items = outer * nidx;
#pragma omp parallel for schedule(static) if (total >= TS_PAR_MIN)
    for (int64_t t = 0; t < items; t++) {
        int64_t b = t / nidx, j = t % nidx;
        int64_t r = index_at(ix->data, ix->dtype, j);
        memcpy(dst + (size_t)t * row, src + (size_t)(b * extent + r) * row, row);
    }
    return TS_OK;
}

/* out[b, idx[j], c0:c1] += dy[b, j, c0:c1] for every j in order. Each call
 * owns its destination columns, so the work splits over (b, column block)
 * without races, and every output element sums its contributions in index
 * order whatever the split: results do not depend on the thread count. */
#define DEF_SCATTER(name, T)                                                                       \
    TS_CLONES static void name(T *out, const T *dy, const void *idx, ts_dtype idt, int64_t nidx,   \
                               int64_t inner, int64_t c0, int64_t c1) {                            \
        for (int64_t j = 0; j < nidx; j++) {                                                       \
            int64_t r =                                                                            \
                idt == TS_I32 ? (int64_t)((const int32_t *)idx)[j] : ((const int64_t *)idx)[j];    \
            T *o = out + r * inner;                                                                \
            const T *x = dy + j * inner;                                                           \
            for (int64_t c = c0; c < c1; c++) o[c] += x[c];                                        \
        }                                                                                          \
    }
DEF_SCATTER(scatter_f32, float)
DEF_SCATTER(scatter_f64, double)

static ts_status k_scatter_add(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *ix = &k->in[1], *o = &k->out[0];
    if (o->dtype != TS_F32 && o->dtype != TS_F64)
        return ts_kernel_bad_dtype(k, "scatter_add", o->dtype);
    int axis = (int)k->a->index.axis;
    int64_t extent = o->dims[axis];
    ts_status s = check_indices(k, "scatter_add", ix, extent);
    if (s != TS_OK) return s;
    size_t es = ts_dtype_size(o->dtype);
    int64_t outer = prod(o->dims, 0, axis), inner = prod(o->dims, axis + 1, o->rank);
    int64_t nidx = ts_tensor_numel(ix), nout = ts_tensor_numel(o);

    /* Zero the output in fixed chunks (all-bits-zero is 0.0). */
    {
        char *p = o->data;
        size_t bytes = (size_t)nout * es, chunk = (size_t)1 << 16;
        int64_t nch = (int64_t)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (nout >= TS_PAR_MIN)
        for (int64_t c = 0; c < nch; c++) {
            size_t off = (size_t)c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
            memset(p + off, 0, len);
        }
    }

    /* Column blocks: enough of them to keep every thread busy, each at
     * least 16 elements so threads do not share cache lines. The block
     * size only changes who computes an element, never its summation order. */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int64_t want = (threads + outer - 1) / outer, bs = (inner + want - 1) / want;
    if (bs < 16) bs = 16;
    bs = (bs + 15) / 16 * 16;
    int64_t nblk = (inner + bs - 1) / bs, items = outer * nblk;
    int64_t work = outer * nidx * inner;
#pragma omp parallel for schedule(static) if (work >= TS_PAR_MIN)
    for (int64_t t = 0; t < items; t++) {
        int64_t b = t / nblk, c0 = (t % nblk) * bs, c1 = c0 + bs < inner ? c0 + bs : inner;
        if (o->dtype == TS_F32)
            scatter_f32((float *)o->data + b * extent * inner,
                        (const float *)dy->data + b * nidx * inner, ix->data, ix->dtype, nidx,
                        inner, c0, c1);
        else
            scatter_f64((double *)o->data + b * extent * inner,
                        (const double *)dy->data + b * nidx * inner, ix->data, ix->dtype, nidx,
                        inner, c0, c1);
    }
    return TS_OK;
}

static double cost_scatter_add(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(ts_in_type(g, n, 0));
}

/* ---- scatter_add_to ------------------------------------------------------ */

/* scatter_add_to(base, dy, idx) = base + scatter_add(dy, idx), made by the
 * fusion pass where a scatter_add's only reader adds it to a tensor of its
 * shape (a tied embedding's gradient: the LM head's weight gradient plus
 * the token embedding's). The output may take the base's memory
 * (TS_OPF_INPLACE), so the vocabulary-sized scatter_add result is never
 * materialised. Same bits as the two ops: each touched row's sum S is
 * accumulated from +0 in index order, as scatter_add does, into a scratch
 * row, then added once (base + S); an untouched row is base + 0.0f (what
 * adding scatter_add's zero row gives, -0.0 becoming +0.0). Axis 0 only
 * (outer 1), which is the embedding's. */

/* Scratch: first[extent] (the first position of each row, -1 if none),
 * slot[nidx] (the first position with the same row), then the sums S,
 * nidx rows of inner elements. */
static size_t scatter_to_scratch(const ts_graph *g, const ts_node *n) {
    const ts_type *b = ts_in_type(g, n, 0), *ix = ts_in_type(g, n, 2);
    const int64_t extent = b->rank ? b->dims[0] : 1, nidx = ts_type_numel(ix);
    const int64_t inner = extent ? ts_type_numel(b) / extent : 0;
    return TS_ALIGN_UP(sizeof(int32_t) * (size_t)(extent + nidx), 64) +
           (size_t)(nidx * inner) * ts_dtype_size(b->dtype);
}

static ts_status infer_scatter_to(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *b = ts_in_type(g, n, 0);
    ts_node sc = *n; /* the scatter_add it replaces: (dy, idx) */
    int32_t in2[2] = {n->in[1], n->in[2]};
    sc.in = in2;
    sc.n_in = 2;
    ts_status s = infer_scatter_add(g, &sc, out, n_out);
    if (s != TS_OK) return s;
    if (n->a.index.axis != 0) return ts_fail(TS_ERR_INVALID, "axis must be 0");
    if (!ts_type_equal(out, b)) {
        char x[128], y[128];
        return ts_fail(TS_ERR_SHAPE, "base %s does not match the scatter's %s",
                       ts_type_str(x, sizeof x, b), ts_type_str(y, sizeof y, out));
    }
    if (ts_type_numel(ts_in_type(g, n, 2)) > INT32_MAX || b->dims[0] > INT32_MAX)
        return ts_fail(TS_ERR_SHAPE, "more than 2^31 rows or indices");
    return TS_OK;
}

#define DEF_SCATTER_TO(name, T)                                                                    \
    TS_CLONES static void name(T *out, const T *base, const T *dy, T *sum, const int32_t *first,   \
                               const int32_t *slot, const void *idx, ts_dtype idt, int64_t extent, \
                               int64_t nidx, int64_t inner, int64_t c0, int64_t c1, int pass) {    \
        if (pass == 0) { /* rows [c0, c1) that no index touches */                                 \
            for (int64_t r = c0; r < c1; r++)                                                      \
                if (first[r] < 0)                                                                  \
                    for (int64_t c = 0; c < inner; c++)                                            \
                        out[r * inner + c] = base[r * inner + c] + (T)0;                           \
            return;                                                                                \
        }                                                                                          \
        (void)extent;                                                                              \
        for (int64_t j = 0; j < nidx; j++)                                                         \
            if (slot[j] == j)                                                                      \
                for (int64_t c = c0; c < c1; c++) sum[j * inner + c] = 0;                          \
        for (int64_t j = 0; j < nidx; j++) {                                                       \
            T *o = sum + (int64_t)slot[j] * inner;                                                 \
            const T *x = dy + j * inner;                                                           \
            for (int64_t c = c0; c < c1; c++) o[c] += x[c];                                        \
        }                                                                                          \
        for (int64_t j = 0; j < nidx; j++) {                                                       \
            if (slot[j] != j) continue;                                                            \
            const int64_t r = index_at(idx, idt, j);                                               \
            for (int64_t c = c0; c < c1; c++)                                                      \
                out[r * inner + c] = base[r * inner + c] + sum[j * inner + c];                     \
        }                                                                                          \
    }
DEF_SCATTER_TO(scatter_to_f32, float)
DEF_SCATTER_TO(scatter_to_f64, double)

static ts_status k_scatter_to(const ts_kargs *k) {
    const ts_tensor *b = &k->in[0], *dy = &k->in[1], *ix = &k->in[2], *o = &k->out[0];
    if (o->dtype != TS_F32 && o->dtype != TS_F64)
        return ts_kernel_bad_dtype(k, "scatter_add_to", o->dtype);
    const int64_t extent = o->dims[0], nidx = ts_tensor_numel(ix);
    const int64_t inner = extent ? ts_tensor_numel(o) / extent : 0;
    ts_status s = check_indices(k, "scatter_add_to", ix, extent);
    if (s != TS_OK) return s;
    int32_t *first = k->scratch, *slot = first + extent;
    void *sum = (char *)k->scratch + TS_ALIGN_UP(sizeof(int32_t) * (size_t)(extent + nidx), 64);
    for (int64_t r = 0; r < extent; r++) first[r] = -1;
    for (int64_t j = 0; j < nidx; j++) {
        const int64_t r = index_at(ix->data, ix->dtype, j);
        if (first[r] < 0) first[r] = (int32_t)j;
        slot[j] = first[r];
    }
    /* Pass 0 over row blocks, pass 1 over column blocks: every element is
     * written by one task, and each sum runs in index order. */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int64_t bs = (inner + threads - 1) / threads;
    if (bs < 16) bs = 16;
    bs = (bs + 15) / 16 * 16;
    const int64_t nblk = (inner + bs - 1) / bs, rb = 256, nrb = (extent + rb - 1) / rb;
    const int64_t work = extent * inner + nidx * inner;
    for (int pass = 0; pass < 2; pass++) {
        const int64_t items = pass ? nblk : nrb;
#pragma omp parallel for schedule(static) if (work >= TS_PAR_MIN)
        for (int64_t t = 0; t < items; t++) {
            const int64_t lo = t * (pass ? bs : rb), span = pass ? inner : extent;
            const int64_t hi = lo + (pass ? bs : rb) < span ? lo + (pass ? bs : rb) : span;
            if (o->dtype == TS_F32)
                scatter_to_f32(o->data, b->data, dy->data, sum, first, slot, ix->data, ix->dtype,
                               extent, nidx, inner, lo, hi, pass);
            else
                scatter_to_f64(o->data, b->data, dy->data, sum, first, slot, ix->data, ix->dtype,
                               extent, nidx, inner, lo, hi, pass);
        }
    }
    return TS_OK;
}

static double cost_scatter_to(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(ts_in_type(g, n, 0)) + (double)ts_type_numel(ts_in_type(g, n, 1));
}

/* ---- definitions ------------------------------------------------------- */

const ts_op_def ts_def_gather = {.name = "gather",
                                 .min_in = 2,
                                 .max_in = 2,
                                 .infer = infer_gather,
                                 .grad = grad_gather,
                                 .kernel = k_gather};

const ts_op_def ts_def_scatter_add = {.name = "scatter_add",
                                      .min_in = 2,
                                      .max_in = 2,
                                      .infer = infer_scatter_add,
                                      .grad = grad_scatter_add,
                                      .kernel = k_scatter_add,
                                      .cost = cost_scatter_add};

const ts_op_def ts_def_scatter_add_to = {.name = "scatter_add_to",
                                         .min_in = 3,
                                         .max_in = 3,
                                         .flags = TS_OPF_INPLACE,
                                         .infer = infer_scatter_to,
                                         .kernel = k_scatter_to,
                                         .scratch = scatter_to_scratch,
                                         .cost = cost_scatter_to};

/* ---- builders ---------------------------------------------------------- */

/* 1 if the builder may proceed; 0 (quietly) after an earlier error. */
static int usable(const ts_graph *g, ts_val v) {
    return g && g->status == TS_OK && ts_val_ok(v) && v.id < g->n_values;
}

ts_val ts_gather(ts_graph *g, ts_val data, ts_val indices, int axis) {
    if (!usable(g, data) || !usable(g, indices)) {
        ts_val in[2] = {data, indices};
        return g ? ts_node_add(g, TS_OP_GATHER, 2, in, NULL, NULL) : TS_NONE;
    }
    int ax = ts_axis(axis, ts_v(g, data)->t.rank);
    ts_attrs a = ts_attrs_zero();
    /* An out-of-range axis is passed through so inference reports it with
     * the operand shapes. */
    a.index.axis = ax < 0 ? axis : ax;
    ts_val in[2] = {data, indices};
    return ts_node_add(g, TS_OP_GATHER, 2, in, &a, NULL);
}

ts_val ts_embedding(ts_graph *g, ts_val table, ts_val indices) {
    if (usable(g, table) && usable(g, indices) && ts_v(g, table)->t.rank != 2) {
        char tb[128], ib[128];
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "embedding(table=%s, indices=%s): table must be [V, D]",
                             ts_type_str(tb, sizeof tb, &ts_v(g, table)->t),
                             ts_type_str(ib, sizeof ib, &ts_v(g, indices)->t));
    }
    return ts_gather(g, table, indices, 0);
}
