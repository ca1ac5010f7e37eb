/* Sparse (CSR) matrix times dense matrix, and the GCN adjacency builder.
 *
 * spmm (indptr i64 [R+1], indices i64 [nnz], values [nnz], dense [C, F]
 *       [, indptr_t [C+1], indices_t [nnz], values_t [nnz]]) -> [R, F]
 *   a.spmm: rows R, cols C.
 * The matrix is static graph structure (constants), so ts_spmm builds its
 * transpose once, on the host, and passes it as three more inputs that the
 * kernel does not read: the gradient of the dense operand is then simply
 * spmm with the transpose (and the original as the transpose's transpose),
 * and the value ids stay valid through every pass that renumbers values.
 * Only the dense operand gets a gradient.
 *
 * The kernel computes each output row from its own entries in CSR order,
 * one row per thread at a time (rows balanced dynamically): the result does
 * not depend on the thread count or schedule. Index errors (possible only
 * when the op is built without ts_spmm) are reported naming the row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kern.h"
#include "tessel/sparse.h"

/* ---- inference --------------------------------------------------------- */

static ts_status check_vec(const ts_type *t, ts_dtype dt, int64_t len, const char *what) {
    if (t->dtype != dt || t->rank != 1 || (len >= 0 && t->dims[0] != len)) {
        char tb[128];
        if (len >= 0)
            return ts_fail(TS_ERR_SHAPE, "%s must be %s[%lld], got %s", what, ts_dtype_name(dt),
                           (long long)len, ts_type_str(tb, sizeof tb, t));
        return ts_fail(TS_ERR_SHAPE, "%s must be a rank-1 %s tensor, got %s", what,
                       ts_dtype_name(dt), ts_type_str(tb, sizeof tb, t));
    }
    return TS_OK;
}

/* One CSR triple starting at input k, for a rows x (anything) matrix. */
static ts_status check_csr(const ts_graph *g, const ts_node *n, int k, int64_t rows, ts_dtype vdt,
                           const char *sfx) {
    char w1[32], w2[32], w3[32];
    snprintf(w1, sizeof w1, "indptr%s", sfx);
    snprintf(w2, sizeof w2, "indices%s", sfx);
    snprintf(w3, sizeof w3, "values%s", sfx);
    ts_status s = check_vec(ts_in_type(g, n, k), TS_I64, rows + 1, w1);
    if (s != TS_OK) return s;
    if ((s = check_vec(ts_in_type(g, n, k + 1), TS_I64, -1, w2)) != TS_OK) return s;
    int64_t nnz = ts_in_type(g, n, k + 1)->dims[0];
    return check_vec(ts_in_type(g, n, k + 2), vdt, nnz, w3);
}

static ts_status infer_spmm(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    if (n->n_in != 4 && n->n_in != 7)
        return ts_fail(TS_ERR_INVALID, "takes 4 inputs (+3 for the transpose), got %d", n->n_in);
    int64_t R = n->a.spmm.rows, C = n->a.spmm.cols;
    if (R < 1 || C < 1)
        return ts_fail(TS_ERR_INVALID, "rows (%lld) and cols (%lld) must be >= 1", (long long)R,
                       (long long)C);
    const ts_type *d = ts_in_type(g, n, 3);
    if (!ts_dtype_is_float(d->dtype) || d->rank != 2 || d->dims[0] != C) {
        char tb[128];
        return ts_fail(TS_ERR_SHAPE,
                       "dense must be a float [%lld, F] tensor (cols of the sparse "
                       "matrix first), got %s",
                       (long long)C, ts_type_str(tb, sizeof tb, d));
    }
    ts_status s = check_csr(g, n, 0, R, d->dtype, "");
    if (s != TS_OK) return s;
    if (n->n_in == 7) {
        if ((s = check_csr(g, n, 4, C, d->dtype, " (transpose)")) != TS_OK) return s;
        if (ts_in_type(g, n, 5)->dims[0] != ts_in_type(g, n, 1)->dims[0])
            return ts_fail(TS_ERR_SHAPE, "the transpose has %lld entries, the matrix %lld",
                           (long long)ts_in_type(g, n, 5)->dims[0],
                           (long long)ts_in_type(g, n, 1)->dims[0]);
    }
    *out = (ts_type){.dtype = d->dtype, .rank = 2, .dims = {R, d->dims[1]}};
    *n_out = 1;
    return TS_OK;
}

/* ---- gradient ---------------------------------------------------------- */

static ts_status grad_spmm(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return TS_OK;
    if (n->n_in != 7) {
        ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                      "spmm: the dense operand's gradient needs the transposed matrix; build the "
                      "op with ts_spmm");
        return ts_graph_status(g);
    }
    ts_val in[7] = {ts_mkval(n->in[4]), ts_mkval(n->in[5]), ts_mkval(n->in[6]), dy[0],
                    ts_mkval(n->in[0]), ts_mkval(n->in[1]), ts_mkval(n->in[2])};
    ts_attrs a = ts_attrs_zero();
    a.spmm.rows = n->a.spmm.cols;
    a.spmm.cols = n->a.spmm.rows;
    din[3] = ts_node_add(g, TS_OP_SPMM, 7, in, &a, NULL);
    return ts_graph_status(g);
}

/* ---- kernel ------------------------------------------------------------ */

/* Rows differ in length: hand them out dynamically (each row is still
 * computed by one thread alone). */
#define SPMM_PARALLEL                                                                              \
    _Pragma(                                                                                       \
        "omp parallel for schedule(dynamic, 16) reduction(min : bad) if (nnz * F >= TS_PAR_MIN)")

/* One output row, o = sum over q of v[q] * d[ix[q], :], in CSR order.
 * The row is accumulated in registers, 32-byte vectors (AVX registers;
 * wider generic vectors are lowered through the stack on AVX2), up to 8 of
 * them at once (F = 64 floats: the whole row), instead of read and written
 * back for every entry: the gathered rows of d are the only memory
 * traffic. Each element still starts at 0 and adds v[q] * d in the order
 * of q, rounding the product and the sum separately (ISO C does not
 * contract them), so the bits are those of the scalar loop. */
#define SPMM_ACC8(OP)                                                                              \
    OP(0);                                                                                         \
    OP(1);                                                                                         \
    OP(2);                                                                                         \
    OP(3);                                                                                         \
    OP(4);                                                                                         \
    OP(5);                                                                                         \
    OP(6);                                                                                         \
    OP(7)
/* Entries ahead whose rows of d are fetched while this one is summed. */
#define SPMM_AHEAD   4
#define SPMM_ZERO(i) vec a##i = {0}
#define SPMM_FMA(i)                                                                                \
    memcpy(&x, row + (i)*L, sizeof x);                                                             \
    a##i = a##i + w * x
#define SPMM_STORE(i) memcpy(o + j + (i)*L, &a##i, sizeof a##i)
#define DEF_SPMM(T, SFX)                                                                           \
    TS_CLONES static void spmm_row_##SFX(T *o, const int64_t *ix, const T *v, int64_t n,           \
                                         const T *d, int64_t F) {                                  \
        typedef T vec __attribute__((vector_size(32)));                                            \
        enum { L = 32 / sizeof(T) };                                                               \
        int64_t j = 0;                                                                             \
        for (; j + 8 * L <= F; j += 8 * L) {                                                       \
            SPMM_ACC8(SPMM_ZERO);                                                                  \
            for (int64_t q = 0; q < n; q++) {                                                      \
                const T *row = d + ix[q] * F + j;                                                  \
                if (q + SPMM_AHEAD < n) {                                                          \
                    const char *p = (const char *)(d + ix[q + SPMM_AHEAD] * F + j);                \
                    for (int c = 0; c < 8 * L * (int)sizeof(T); c += 64)                           \
                        __builtin_prefetch(p + c);                                                 \
                }                                                                                  \
                vec x, w = v[q] - (vec){0}; /* a broadcast: x - 0 is x */                          \
                SPMM_ACC8(SPMM_FMA);                                                               \
            }                                                                                      \
            SPMM_ACC8(SPMM_STORE);                                                                 \
        }                                                                                          \
        for (; j + L <= F; j += L) {                                                               \
            vec a0 = {0}, x;                                                                       \
            for (int64_t q = 0; q < n; q++) {                                                      \
                memcpy(&x, d + ix[q] * F + j, sizeof x);                                           \
                a0 = a0 + v[q] * x;                                                                \
            }                                                                                      \
            memcpy(o + j, &a0, sizeof a0);                                                         \
        }                                                                                          \
        for (; j < F; j++) {                                                                       \
            T a = 0;                                                                               \
            for (int64_t q = 0; q < n; q++) a = a + v[q] * d[ix[q] * F + j];                       \
            o[j] = a;                                                                              \
        }                                                                                          \
    }                                                                                              \
    static ts_status spmm_##SFX(const ts_kargs *k, int64_t *bad_row) {                             \
        const int64_t *ip = k->in[0].data, *ix = k->in[1].data;                                    \
        const T *v = k->in[2].data, *d = k->in[3].data;                                            \
        T *o = k->out[0].data;                                                                     \
        int64_t R = k->out[0].dims[0], F = k->out[0].dims[1], C = k->in[3].dims[0];                \
        int64_t nnz = k->in[1].dims[0], bad = R;                                                   \
        SPMM_PARALLEL for (int64_t r = 0; r < R; r++) {                                            \
            int64_t s = ip[r], e = ip[r + 1], q = s;                                               \
            if (s >= 0 && e >= s && e <= nnz)                                                      \
                for (; q < e && ix[q] >= 0 && ix[q] < C; q++) {                                    \
                }                                                                                  \
            if (s < 0 || e < s || e > nnz || q < e) {                                              \
                if (r < bad) bad = r;                                                              \
                continue;                                                                          \
            }                                                                                      \
            spmm_row_##SFX(o + r * F, ix + s, v + s, e - s, d, F);                                 \
        }                                                                                          \
        *bad_row = bad < R ? bad : -1;                                                             \
        return TS_OK;                                                                              \
    }

DEF_SPMM(float, f32)
DEF_SPMM(double, f64)

static ts_status k_spmm(const ts_kargs *k) {
    int64_t bad = -1;
    switch (k->out[0].dtype) {
    case TS_F32: spmm_f32(k, &bad); break;
    case TS_F64: spmm_f64(k, &bad); break;
    default: return ts_kernel_bad_dtype(k, "spmm", k->out[0].dtype);
    }
    if (bad < 0) return TS_OK;
    const int64_t *ip = k->in[0].data;
    return ts_fail(TS_ERR_INVALID,
                   "spmm '%s': row %lld of the sparse matrix is malformed (entries [%lld, %lld) "
                   "of %lld, or a column outside [0, %lld))",
                   k->label, (long long)bad, (long long)ip[bad], (long long)ip[bad + 1],
                   (long long)k->in[1].dims[0], (long long)k->in[3].dims[0]);
}

static double cost_spmm(const ts_graph *g, const ts_node *n) {
    return 2.0 * (double)ts_in_type(g, n, 1)->dims[0] * (double)ts_in_type(g, n, 3)->dims[1];
}

const ts_op_def ts_def_spmm = {.name = "spmm",
                               .min_in = 4,
                               .max_in = 7,
                               .infer = infer_spmm,
                               .grad = grad_spmm,
                               .kernel = k_spmm,
                               .cost = cost_spmm};

/* ---- builders ---------------------------------------------------------- */

/* Checks a CSR structure; 0 and a graph error naming the problem if bad. */
static int valid_csr(ts_graph *g, const int64_t *ip, const int64_t *ix, int64_t rows, int64_t cols,
                     int64_t nnz) {
    if (ip[0] != 0 || ip[rows] != nnz) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "spmm: indptr must start at 0 and end at nnz = %lld (got %lld .. %lld)",
                      (long long)nnz, (long long)ip[0], (long long)ip[rows]);
        return 0;
    }
    for (int64_t r = 0; r < rows; r++)
        if (ip[r + 1] < ip[r]) {
            ts_graph_fail(g, TS_ERR_INVALID, "spmm: indptr decreases at row %lld (%lld > %lld)",
                          (long long)r, (long long)ip[r], (long long)ip[r + 1]);
            return 0;
        }
    for (int64_t q = 0; q < nnz; q++)
        if (ix[q] < 0 || ix[q] >= cols) {
            ts_graph_fail(g, TS_ERR_INVALID,
                          "spmm: indices[%lld] = %lld is outside [0, %lld) (the matrix has %lld "
                          "columns)",
                          (long long)q, (long long)ix[q], (long long)cols, (long long)cols);
            return 0;
        }
    return 1;
}

static int is_const(ts_graph *g, ts_val v, const char *what) {
    if (ts_v(g, v)->kind == TS_VK_CONST && ts_v(g, v)->data) return 1;
    ts_graph_fail(g, TS_ERR_INVALID,
                  "spmm: %s must be a constant (the sparse matrix is static graph structure)",
                  what);
    return 0;
}

ts_val ts_spmm(ts_graph *g, ts_val indptr, ts_val indices, ts_val values, ts_val dense,
               int64_t rows, int64_t cols) {
    ts_val all[4] = {indptr, indices, values, dense};
    if (!g || g->status != TS_OK) return TS_NONE;
    for (int i = 0; i < 4; i++)
        if (!ts_val_ok(all[i]) || all[i].id >= g->n_values)
            return ts_graph_fail(g, TS_ERR_INVALID, "spmm: argument %d is not a value", i + 1);
    if (rows < 1 || cols < 1)
        return ts_graph_fail(g, TS_ERR_INVALID, "spmm: rows (%lld) and cols (%lld) must be >= 1",
                             (long long)rows, (long long)cols);
    if (!is_const(g, indptr, "indptr") || !is_const(g, indices, "indices") ||
        !is_const(g, values, "values"))
        return TS_NONE;
    /* The builder reads the arrays, so their types are checked here first
     * (the op's inference repeats it for nodes built any other way). */
    const ts_type tp = ts_v(g, indptr)->t, ti = ts_v(g, indices)->t, tv = ts_v(g, values)->t;
    if (tp.dtype != TS_I64 || tp.rank != 1 || tp.dims[0] != rows + 1 || ti.dtype != TS_I64 ||
        ti.rank != 1 || tv.rank != 1 || tv.dims[0] != ti.dims[0]) {
        char a[128], b[128], c[128];
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "spmm: expected indptr i64[%lld], indices i64[nnz], values [nnz]; got "
                             "%s, %s, %s",
                             (long long)(rows + 1), ts_type_str(a, sizeof a, &tp),
                             ts_type_str(b, sizeof b, &ti), ts_type_str(c, sizeof c, &tv));
    }
    int64_t nnz = ti.dims[0];
    const int64_t *ip = ts_v(g, indptr)->data, *ix = ts_v(g, indices)->data;
    if (!valid_csr(g, ip, ix, rows, cols, nnz)) return TS_NONE;
    size_t es = ts_dtype_size(tv.dtype);
    int64_t *tip = ts_zalloc(sizeof(int64_t) * (size_t)(cols + 2), "spmm transpose");
    int64_t *tix = ts_alloc(sizeof(int64_t) * (size_t)nnz, "spmm transpose");
    char *tvv = ts_alloc(es * (size_t)nnz, "spmm transpose");
    ts_val out = TS_NONE;
    if (!tip || !tix || !tvv) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        goto done;
    }
    /* Counting sort by column; rows stay ascending within each column. */
    for (int64_t q = 0; q < nnz; q++) tip[ix[q] + 2]++;
    for (int64_t c = 0; c < cols; c++) tip[c + 2] += tip[c + 1];
    {
        const char *vv = ts_v(g, values)->data;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t q = ip[r]; q < ip[r + 1]; q++) {
                int64_t p = tip[ix[q] + 1]++;
                tix[p] = r;
                memcpy(tvv + (size_t)p * es, vv + (size_t)q * es, es);
            }
    }
    {
        ts_val t_ip = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){cols + 1}, tip);
        ts_val t_ix = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){nnz}, tix);
        ts_val t_v = ts_constant(g, NULL, tv.dtype, 1, (int64_t[]){nnz}, tvv);
        ts_val in[7] = {indptr, indices, values, dense, t_ip, t_ix, t_v};
        ts_attrs a = ts_attrs_zero();
        a.spmm.rows = rows;
        a.spmm.cols = cols;
        out = ts_node_add(g, TS_OP_SPMM, 7, in, &a, NULL);
    }
done:
    free(tip);
    free(tix);
    free(tvv);
    return out;
}

ts_val ts_spmm_csr(ts_graph *g, const ts_csr *a, ts_val dense) {
    if (!g || g->status != TS_OK || !ts_val_ok(dense)) return TS_NONE;
    if (!a || !a->indptr || !a->indices || !a->values || a->rows < 1 || a->cols < 1 || a->nnz < 1)
        return ts_graph_fail(g, TS_ERR_INVALID,
                             "spmm: the CSR matrix is empty or incomplete (rows, cols and nnz "
                             "must be >= 1)");
    if (dense.id >= g->n_values)
        return ts_graph_fail(g, TS_ERR_INVALID, "spmm: dense is not a value of this graph");
    ts_dtype dt = ts_dtype_of(g, dense);
    if (dt != TS_F32 && dt != TS_F64)
        return ts_graph_fail(g, TS_ERR_SHAPE, "spmm: dense must be f32 or f64, got %s",
                             ts_dtype_name(dt));
    void *vals = ts_alloc(ts_dtype_size(dt) * (size_t)a->nnz, "spmm values");
    if (!vals) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    for (int64_t q = 0; q < a->nnz; q++) {
        if (dt == TS_F32)
            ((float *)vals)[q] = (float)a->values[q];
        else
            ((double *)vals)[q] = a->values[q];
    }
    ts_val ip = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->rows + 1}, a->indptr);
    ts_val ix = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->nnz}, a->indices);
    ts_val v = ts_constant(g, NULL, dt, 1, (int64_t[]){a->nnz}, vals);
    free(vals);
    return ts_spmm(g, ip, ix, v, dense, a->rows, a->cols);
}

/* ---- host helpers ------------------------------------------------------ */

void ts_csr_free(ts_csr *m) {
    if (!m) return;
    free(m->indptr);
    free(m->indices);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

ts_status ts_gcn_norm_adjacency(int64_t n_nodes, int64_t n_edges, const int64_t *src,
                                const int64_t *dst, ts_csr *out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "gcn_norm_adjacency: out is NULL");
    memset(out, 0, sizeof *out);
    if (n_nodes < 1 || n_edges < 0)
        return ts_fail(TS_ERR_INVALID,
                       "gcn_norm_adjacency: needs n_nodes >= 1 and n_edges >= 0 (got %lld, %lld)",
                       (long long)n_nodes, (long long)n_edges);
    if (n_edges > 0 && (!src || !dst))
        return ts_fail(TS_ERR_INVALID, "gcn_norm_adjacency: src or dst is NULL");
    if (n_edges > (INT64_MAX - n_nodes) / 2)
        return ts_fail(TS_ERR_INVALID, "gcn_norm_adjacency: too many edges (%lld)",
                       (long long)n_edges);
    for (int64_t e = 0; e < n_edges; e++) {
        int64_t u = src[e], v = dst[e];
        if (u < 0 || u >= n_nodes || v < 0 || v >= n_nodes)
            return ts_fail(TS_ERR_INVALID,
                           "gcn_norm_adjacency: edge %lld (%lld -> %lld) has node id %lld outside "
                           "[0, %lld)",
                           (long long)e, (long long)u, (long long)v,
                           (long long)(u < 0 || u >= n_nodes ? u : v), (long long)n_nodes);
    }
    /* Both directions of every non-self edge, bucketed by row, plus room
     * for the self loop of each row. */
    int64_t *start = ts_zalloc(sizeof(int64_t) * (size_t)(n_nodes + 2), "gcn adjacency");
    int64_t *col = ts_alloc(sizeof(int64_t) * (size_t)(2 * n_edges + n_nodes), "gcn adjacency");
    int64_t *ip = ts_alloc(sizeof(int64_t) * (size_t)(n_nodes + 1), "gcn adjacency");
    if (!start || !col || !ip) goto nomem;
    for (int64_t e = 0; e < n_edges; e++)
        if (src[e] != dst[e]) start[src[e] + 2]++, start[dst[e] + 2]++;
    for (int64_t i = 0; i < n_nodes; i++) start[i + 2] += start[i + 1] + 1; /* + self loop */
    for (int64_t i = 0; i < n_nodes; i++) col[start[i + 1]++] = i;
    for (int64_t e = 0; e < n_edges; e++) {
        int64_t u = src[e], v = dst[e];
        if (u == v) continue;
        col[start[u + 1]++] = v;
        col[start[v + 1]++] = u;
    }
    /* start[i] .. start[i + 1] is row i now: sort, drop duplicates, compact. */
    int64_t nnz = 0;
    ip[0] = 0;
    for (int64_t i = 0; i < n_nodes; i++) {
        int64_t s = start[i], e = start[i + 1];
        qsort(col + s, (size_t)(e - s), sizeof(int64_t), cmp_i64);
        for (int64_t q = s; q < e; q++)
            if (q == s || col[q] != col[q - 1]) col[nnz++] = col[q];
        ip[i + 1] = nnz;
    }
    double *val = ts_alloc(sizeof(double) * (size_t)(nnz ? nnz : 1), "gcn adjacency");
    int64_t *idx = ts_alloc(sizeof(int64_t) * (size_t)(nnz ? nnz : 1), "gcn adjacency");
    if (!val || !idx) {
        free(val);
        free(idx);
        goto nomem;
    }
    for (int64_t i = 0; i < n_nodes; i++) {
        double di = (double)(ip[i + 1] - ip[i]);
        for (int64_t q = ip[i]; q < ip[i + 1]; q++) {
            int64_t j = col[q];
            idx[q] = j;
            val[q] = 1.0 / sqrt(di * (double)(ip[j + 1] - ip[j]));
        }
    }
    free(start);
    free(col);
    *out = (ts_csr){n_nodes, n_nodes, nnz, ip, idx, val};
    return TS_OK;
nomem:
    free(start);
    free(col);
    free(ip);
    return TS_ERR_NOMEM;
}
