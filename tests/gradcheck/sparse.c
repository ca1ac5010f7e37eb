/* spmm (CSR x dense) gradient checks, results against a dense product,
 * thread-count determinism, and the GCN adjacency normalisation checked
 * against values worked out by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"
#include "ops/op.h"
#include "tessel/sparse.h"

/* A 4 x 5 matrix with an empty row, a repeated column in one row (CSR
 * allows it: the entries add) and an unused column:
 *   [ 1.5  0   -2    0   0 ]
 *   [ 0    0    0    0   0 ]
 *   [ 0.5  3    0    0   0 ]   plus a second entry (2, 1) = -1
 *   [ 0    0    0.25 0   0 ] */
static const int64_t ip4[5] = {0, 2, 2, 5, 6}, ix4[6] = {0, 2, 0, 1, 1, 2};
static const double v4[6] = {1.5, -2, 0.5, 3, -1, 0.25};

typedef struct csr_arg {
    const int64_t *ip, *ix;
    const double *v;
    int64_t rows, cols, nnz;
} csr_arg;

static ts_val csr_spmm(ts_graph *g, const csr_arg *a, ts_val dense) {
    ts_dtype dt = ts_dtype_of(g, dense);
    float vf[64];
    for (int64_t i = 0; i < a->nnz && i < 64; i++) vf[i] = (float)a->v[i];
    ts_val ip = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->rows + 1}, a->ip);
    ts_val ix = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->nnz}, a->ix);
    ts_val v = ts_constant(g, NULL, dt, 1, (int64_t[]){a->nnz},
                           dt == TS_F64 ? (const void *)a->v : (const void *)vf);
    return ts_spmm(g, ip, ix, v, dense, a->rows, a->cols);
}

static ts_val build_spmm(ts_graph *g, const ts_val *in, void *u) {
    return csr_spmm(g, u, in[0]);
}

/* A second product through the result: the gradient of the first spmm's
 * output comes from the transpose of the second. */
static ts_val build_chain(ts_graph *g, const ts_val *in, void *u) {
    const csr_arg *a = u;
    ts_val y = csr_spmm(g, a, in[0]); /* [4, F] */
    csr_arg sq = {(const int64_t[]){0, 1, 3, 3, 4},
                  (const int64_t[]){3, 0, 1, 2},
                  (const double[]){2, -1, 0.5, 1},
                  4,
                  4,
                  4};
    return csr_spmm(g, &sq, ts_tanh(g, y));
}

/* Two-layer GCN on the normalised adjacency of a small graph. */
static ts_val build_gcn(ts_graph *g, const ts_val *in, void *u) {
    const ts_csr *adj = u;
    ts_val h = ts_relu(g, ts_spmm_csr(g, adj, ts_matmul(g, in[0], in[1], 0, 0)));
    return ts_spmm_csr(g, adj, ts_matmul(g, h, in[2], 0, 0));
}

static void gradchecks(void) {
    csr_arg a = {ip4, ix4, v4, 4, 5, 6};
    const int64_t fs[] = {1, 3, 67};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        gc_input in[1] = {GC_F(5, fs[k])};
        char label[64];
        snprintf(label, sizeof label, "spmm 4x5 (empty row, repeated column) F=%lld",
                 (long long)fs[k]);
        gc_check(label, 1, in, build_spmm, &a);
    }
    csr_arg one = {(const int64_t[]){0, 1}, (const int64_t[]){0}, (const double[]){-0.5}, 1, 1, 1};
    gc_input in1[1] = {GC_F(1, 2)};
    gc_check("spmm 1x1", 1, in1, build_spmm, &one);
    gc_input in3[1] = {GC_F(5, 3)};
    gc_check("spmm chained through tanh", 1, in3, build_chain, &a);
    ts_csr adj;
    const int64_t src[5] = {0, 1, 2, 3, 4}, dst[5] = {1, 2, 3, 4, 0};
    CHECK_OK(ts_gcn_norm_adjacency(6, 5, src, dst, &adj)); /* a 5-cycle and node 5 alone */
    gc_input gin[3] = {GC_F(6, 4), GC_F(4, 3), GC_F(3, 2)};
    gc_check("gcn two layers", 3, gin, build_gcn, &adj);
    ts_csr_free(&adj);
}

/* ---- results against a dense product; threads ------------------------- */

static double *run_spmm(const csr_arg *a, const double *dense, int64_t F, ts_dtype dt,
                        int threads) {
    ts_graph *g = ts_graph_new();
    size_t es = ts_dtype_size(dt);
    void *db = malloc((size_t)(a->cols * F) * es);
    for (int64_t i = 0; i < a->cols * F; i++) {
        if (dt == TS_F64)
            ((double *)db)[i] = dense[i];
        else
            ((float *)db)[i] = (float)dense[i];
    }
    float *vf = malloc(sizeof(float) * (size_t)a->nnz);
    for (int64_t i = 0; i < a->nnz; i++) vf[i] = (float)a->v[i];
    ts_val ip = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->rows + 1}, a->ip);
    ts_val ix = ts_constant(g, NULL, TS_I64, 1, (int64_t[]){a->nnz}, a->ix);
    ts_val v = ts_constant(g, NULL, dt, 1, (int64_t[]){a->nnz},
                           dt == TS_F64 ? (const void *)a->v : (const void *)vf);
    ts_val d = ts_input(g, "d", dt, 2, (int64_t[]){a->cols, F});
    ts_val y = ts_spmm(g, ip, ix, v, d, a->rows, a->cols);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    ts_plan *p = NULL;
    double *res = calloc((size_t)(a->rows * F), sizeof(double));
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "d", db, (size_t)(a->cols * F) * es));
        CHECK_OK(ts_plan_step(p));
        void *out = malloc((size_t)(a->rows * F) * es);
        CHECK_OK(ts_plan_read(p, "y", out, (size_t)(a->rows * F) * es));
        for (int64_t i = 0; i < a->rows * F; i++)
            res[i] = dt == TS_F64 ? ((double *)out)[i] : ((float *)out)[i];
        free(out);
        ts_plan_free(p);
    }
    ts_graph_free(g);
    free(db);
    free(vf);
    return res;
}

static void against_dense(void) {
    /* A random 3000 x 2000 matrix with rows of 0..40 entries. */
    enum { R = 3000, C = 2000, F = 37 };
    int64_t *ip = malloc(sizeof(int64_t) * (R + 1)), *ix = malloc(sizeof(int64_t) * R * 40);
    double *v = malloc(sizeof(double) * R * 40), *dense = malloc(sizeof(double) * C * F);
    uint64_t s = 12345;
    ip[0] = 0;
    for (int r = 0; r < R; r++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int len = (int)((s >> 33) % 41);
        ip[r + 1] = ip[r] + len;
        for (int q = 0; q < len; q++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ix[ip[r] + q] = (int64_t)((s >> 33) % C);
            v[ip[r] + q] = (double)((s >> 20) % 1000) / 500.0 - 1.0;
        }
    }
    for (int i = 0; i < C * F; i++) dense[i] = sin(0.01 * i) + 0.1 * cos(3.0 * i);
    csr_arg a = {ip, ix, v, R, C, ip[R]};
    double *want = calloc((size_t)R * F, sizeof(double));
    for (int r = 0; r < R; r++)
        for (int64_t q = ip[r]; q < ip[r + 1]; q++)
            for (int f = 0; f < F; f++) want[r * F + f] += v[q] * dense[ix[q] * F + f];
    double *y64 = run_spmm(&a, dense, F, TS_F64, 0), *y32 = run_spmm(&a, dense, F, TS_F32, 0);
    int bad64 = 0, bad32 = 0;
    for (int i = 0; i < R * F; i++) {
        bad64 += !(y64[i] == want[i]); /* same order of additions: exact */
        bad32 += !(fabs(y32[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])));
    }
    CHECK(bad64 == 0, "spmm f64: %d of %d values differ from the dense product", bad64, R * F);
    CHECK(bad32 == 0, "spmm f32: %d of %d values differ from the dense product", bad32, R * F);
    for (int dt = 0; dt < 2; dt++) {
        double *t1 = run_spmm(&a, dense, F, dt ? TS_F32 : TS_F64, 1);
        double *t2 = run_spmm(&a, dense, F, dt ? TS_F32 : TS_F64, 2);
        CHECK(!memcmp(t1, t2, sizeof(double) * R * F), "spmm %s: 1 and 2 threads differ",
              dt ? "f32" : "f64");
        free(t1);
        free(t2);
    }
    free(y64), free(y32), free(want), free(ip), free(ix), free(v), free(dense);
}

/* The kernel keeps a row's sums in vector registers, 64 columns, then 8 (4
 * in f64), then one at a time: at widths that take each path, f32 and f64
 * must equal the scalar loop in CSR order bit for bit, on 1 and 2 threads. */
static void register_blocking(void) {
    enum { R = 700, C = 500, MAXLEN = 25 };
    int64_t *ip = malloc(sizeof(int64_t) * (R + 1)), *ix = malloc(sizeof(int64_t) * R * MAXLEN);
    double *v = malloc(sizeof(double) * R * MAXLEN);
    uint64_t s = 987;
    ip[0] = 0;
    for (int r = 0; r < R; r++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int len = (int)((s >> 33) % (MAXLEN + 1));
        ip[r + 1] = ip[r] + len;
        for (int q = 0; q < len; q++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ix[ip[r] + q] = (int64_t)((s >> 33) % C);
            /* values exact in f32, so both precisions multiply the same numbers */
            v[ip[r] + q] = (double)(float)((double)((s >> 20) % 2000) / 997.0 - 1.0);
        }
    }
    csr_arg a = {ip, ix, v, R, C, ip[R]};
    static const int64_t widths[] = {1, 4, 7, 8, 15, 16, 17, 64, 65, 72, 130};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        int64_t F = widths[w];
        double *dense = malloc(sizeof(double) * (size_t)(C * F));
        for (int64_t i = 0; i < C * F; i++) dense[i] = (double)(float)(sin(0.37 * (double)i) * 3);
        float *want32 = calloc((size_t)(R * F), sizeof(float));
        double *want64 = calloc((size_t)(R * F), sizeof(double));
        for (int r = 0; r < R; r++)
            for (int64_t q = ip[r]; q < ip[r + 1]; q++)
                for (int64_t f = 0; f < F; f++) {
                    want32[r * F + f] += (float)v[q] * (float)dense[ix[q] * F + f];
                    want64[r * F + f] += v[q] * dense[ix[q] * F + f];
                }
        for (int threads = 1; threads <= 2; threads++) {
            double *y32 = run_spmm(&a, dense, F, TS_F32, threads);
            double *y64 = run_spmm(&a, dense, F, TS_F64, threads);
            int bad32 = 0, bad64 = 0;
            for (int64_t i = 0; i < R * F; i++) {
                float g32 = (float)y32[i];
                bad32 += memcmp(&g32, &want32[i], sizeof g32) != 0;
                bad64 += memcmp(&y64[i], &want64[i], sizeof y64[i]) != 0;
            }
            CHECK(bad32 == 0,
                  "spmm f32 F=%lld, %d threads: %d of %lld values differ from the "
                  "scalar loop",
                  (long long)F, threads, bad32, (long long)(R * F));
            CHECK(bad64 == 0,
                  "spmm f64 F=%lld, %d threads: %d of %lld values differ from the "
                  "scalar loop",
                  (long long)F, threads, bad64, (long long)(R * F));
            free(y32), free(y64);
        }
        free(dense), free(want32), free(want64);
    }
    free(ip), free(ix), free(v);
}

/* ---- the GCN adjacency ---------------------------------------------- */

static void adjacency(void) {
    /* 0-1 (and again as 1-0), 1-2 twice, a self pair 2-2, node 3 alone.
     * Neighbours 0: {1}, 1: {0, 2}, 2: {1}, 3: {}; with the self loop
     * d = (2, 3, 2, 1) and A_hat[i][j] = 1 / sqrt(d_i d_j). */
    const int64_t src[6] = {0, 1, 1, 2, 2, 2}, dst[6] = {1, 0, 2, 2, 1, 1};
    ts_csr a;
    CHECK_OK(ts_gcn_norm_adjacency(4, 6, src, dst, &a));
    const int64_t want_ip[5] = {0, 2, 5, 7, 8}, want_ix[8] = {0, 1, 0, 1, 2, 1, 2, 3};
    const double s6 = 1 / sqrt(6.0);
    const double want_v[8] = {0.5, s6, s6, 1.0 / 3, s6, s6, 0.5, 1};
    CHECK(a.rows == 4 && a.cols == 4 && a.nnz == 8, "adjacency: %lld x %lld with %lld entries",
          (long long)a.rows, (long long)a.cols, (long long)a.nnz);
    if (a.nnz == 8) {
        CHECK(!memcmp(a.indptr, want_ip, sizeof want_ip), "adjacency indptr");
        CHECK(!memcmp(a.indices, want_ix, sizeof want_ix), "adjacency indices");
        for (int i = 0; i < 8; i++) CHECK_NEAR(a.values[i], want_v[i], 1e-16);
    }
    ts_csr_free(&a);
    CHECK(a.indptr == NULL && a.nnz == 0, "ts_csr_free zeroes the struct");
    /* No edges at all: the identity. */
    CHECK_OK(ts_gcn_norm_adjacency(3, 0, NULL, NULL, &a));
    CHECK(a.nnz == 3 && a.values[0] == 1 && a.values[2] == 1 && a.indices[1] == 1,
          "edgeless graph gives the identity");
    ts_csr_free(&a);
    /* An out-of-range id names the edge. */
    const int64_t bs[3] = {0, 1, 2}, bd[3] = {1, 2, 7};
    CHECK(ts_gcn_norm_adjacency(5, 3, bs, bd, &a) == TS_ERR_INVALID, "node id 7 of 5 fails");
    CHECK(strstr(ts_last_error(), "edge 2 (2 -> 7) has node id 7 outside [0, 5)") != NULL,
          "message: %s", ts_last_error());
    const int64_t ns[1] = {-1}, nd[1] = {0};
    CHECK(ts_gcn_norm_adjacency(5, 1, ns, nd, &a) == TS_ERR_INVALID, "node id -1 fails");
    CHECK(strstr(ts_last_error(), "edge 0 (-1 -> 0) has node id -1") != NULL, "message: %s",
          ts_last_error());
    CHECK(ts_gcn_norm_adjacency(0, 0, NULL, NULL, &a) == TS_ERR_INVALID, "zero nodes fail");
}

/* ---- errors ------------------------------------------------------------ */

static void expect_error(ts_graph *g, const char *needle) {
    CHECK(ts_graph_status(g) != TS_OK, "expected a build error containing '%s'", needle);
    CHECK(strstr(ts_graph_error(g), needle) != NULL, "error '%s' should mention '%s'",
          ts_graph_error(g), needle);
    ts_graph_free(g);
}

static void errors(void) {
    int64_t d5[2] = {5, 3}, d4[2] = {4, 3};
    /* indptr not a constant */
    ts_graph *g = ts_graph_new();
    ts_spmm(g, ts_input(g, "ip", TS_I64, 1, (int64_t[]){5}),
            ts_constant(g, NULL, TS_I64, 1, (int64_t[]){6}, ix4),
            ts_constant(g, NULL, TS_F32, 1, (int64_t[]){6}, (float[]){1, 2, 3, 4, 5, 6}),
            ts_input(g, "d", TS_F32, 2, d5), 4, 5);
    expect_error(g, "spmm: indptr must be a constant");
    /* a column index outside the matrix */
    g = ts_graph_new();
    ts_spmm(g, ts_constant(g, NULL, TS_I64, 1, (int64_t[]){5}, ip4),
            ts_constant(g, NULL, TS_I64, 1, (int64_t[]){6}, (int64_t[]){0, 2, 0, 1, 5, 2}),
            ts_constant(g, NULL, TS_F64, 1, (int64_t[]){6}, v4), ts_input(g, "d", TS_F64, 2, d5), 4,
            5);
    expect_error(g, "indices[4] = 5 is outside [0, 5)");
    /* indptr going backwards */
    g = ts_graph_new();
    ts_spmm(g, ts_constant(g, NULL, TS_I64, 1, (int64_t[]){5}, (int64_t[]){0, 3, 2, 5, 6}),
            ts_constant(g, NULL, TS_I64, 1, (int64_t[]){6}, ix4),
            ts_constant(g, NULL, TS_F64, 1, (int64_t[]){6}, v4), ts_input(g, "d", TS_F64, 2, d5), 4,
            5);
    expect_error(g, "indptr decreases at row 1");
    /* dense with the wrong number of rows */
    g = ts_graph_new();
    csr_arg a = {ip4, ix4, v4, 4, 5, 6};
    csr_spmm(g, &a, ts_input(g, "d", TS_F64, 2, d4));
    expect_error(g, "dense must be a float [5, F] tensor (cols of the sparse matrix first), got "
                    "f64[4,3]");
    /* values and dense of different dtypes */
    g = ts_graph_new();
    ts_spmm(g, ts_constant(g, NULL, TS_I64, 1, (int64_t[]){5}, ip4),
            ts_constant(g, NULL, TS_I64, 1, (int64_t[]){6}, ix4),
            ts_constant(g, NULL, TS_F64, 1, (int64_t[]){6}, v4), ts_input(g, "d", TS_F32, 2, d5), 4,
            5);
    expect_error(g, "values must be f32[6]");

    /* Built without ts_spmm (no transpose, no checks): a bad column is a
     * run-time error naming the row, and no gradient can be formed. */
    g = ts_graph_new();
    ts_val d = ts_param(g, "d", TS_F64, 2, d5, ts_init_ones());
    ts_val in[4] = {ts_constant(g, NULL, TS_I64, 1, (int64_t[]){5}, ip4),
                    ts_constant(g, NULL, TS_I64, 1, (int64_t[]){6}, (int64_t[]){0, 2, 0, 9, 1, 2}),
                    ts_constant(g, NULL, TS_F64, 1, (int64_t[]){6}, v4), d};
    ts_attrs at = ts_attrs_zero();
    at.spmm.rows = 4;
    at.spmm.cols = 5;
    ts_val y = ts_node_add(g, TS_OP_SPMM, 4, in, &at, NULL);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p) {
        CHECK(ts_plan_step(p) != TS_OK, "a bad column must fail the step");
        CHECK(strstr(ts_last_error(), "spmm 'y': row 2 of the sparse matrix is malformed") != NULL,
              "message: %s", ts_last_error());
        ts_plan_free(p);
    }
    ts_train_spec spec = ts_train_spec_default(ts_sum(g, y, 0, NULL, 0));
    CHECK(ts_compile(g, &spec, NULL, &p) != TS_OK, "no gradient without the transpose");
    CHECK(strstr(ts_last_error(), "build the op with ts_spmm") != NULL, "message: %s",
          ts_last_error());
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    against_dense();
    register_blocking();
    adjacency();
    errors();
    return check_summary("gradcheck_sparse");
}
