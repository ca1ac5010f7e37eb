/* Gradient checks, forward values and error cases for gather, embedding and
 * scatter_add (the gather gradient). */
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"
#include "ops/op.h"

/* ---- helpers ----------------------------------------------------------- */

/* A fixed (non-differentiable) index input. */
static gc_input idx_input(ts_dtype dt, int rank, const int64_t *dims, const void *data) {
    gc_input in = {dt, rank, {0}, 0, 0, 0, data};
    for (int i = 0; i < rank; i++) in.dims[i] = dims[i];
    return in;
}

/* Compile an inference plan with output `out`, feed "a" and "b", run one
 * step. Returns the step status (compile failures count as failures) and
 * reads the output when the step succeeded. */
static ts_status run_forward(ts_graph *g, ts_val out, const void *a, size_t abytes, const void *b,
                             size_t bbytes, void *dst, size_t dbytes) {
    ts_plan *p = NULL;
    ts_status s = ts_mark_output(g, out, "out");
    if (s == TS_OK) s = ts_compile(g, NULL, NULL, &p);
    if (s == TS_OK && a) s = ts_plan_set_input(p, "a", a, abytes);
    if (s == TS_OK && b) s = ts_plan_set_input(p, "b", b, bbytes);
    if (s == TS_OK) s = ts_plan_step(p);
    if (s == TS_OK && dst) s = ts_plan_read(p, "out", dst, dbytes);
    ts_plan_free(p);
    return s;
}

static void expect_error(ts_graph *g, ts_val v, const char *what, const char *want1,
                         const char *want2) {
    const char *msg = ts_graph_error(g);
    CHECK(!ts_val_ok(v) && ts_graph_status(g) != TS_OK, "%s: expected a builder error", what);
    CHECK(strstr(msg, want1) != NULL, "%s: message '%s' lacks '%s'", what, msg, want1);
    if (want2) CHECK(strstr(msg, want2) != NULL, "%s: message '%s' lacks '%s'", what, msg, want2);
}

/* ---- builders for gc_check ------------------------------------------- */

static ts_val b_gather(ts_graph *g, const ts_val *in, void *u) {
    return ts_gather(g, in[0], in[1], *(int *)u);
}

static ts_val b_embedding(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_embedding(g, in[0], in[1]);
}

/* gather followed by its own gradient op: exercises the scatter_add rule. */
static ts_val b_gather_scatter(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val y = ts_gather(g, in[0], in[1], 1);
    ts_attrs at = ts_attrs_zero();
    at.index.axis = 1;
    at.index.extent = 4;
    ts_val sin[2] = {ts_mul(g, y, y), in[1]};
    return ts_node_add(g, TS_OP_SCATTER_ADD, 2, sin, &at, NULL);
}

/* ---- gradient checks -------------------------------------------------- */

static void grad_checks(void) {
    static const int64_t idx4[4] = {3, 0, 3, 1}; /* repeated 3: accumulation */
    static const int32_t idx4_32[4] = {2, 2, 0, 4};
    static const int64_t idx23[6] = {1, 4, 4, 0, 2, 1};
    static const int64_t idx1[1] = {0};
    static const int64_t idx0[1] = {2};
    int64_t d4[1] = {4}, d23[2] = {2, 3}, d1[1] = {1};
    {
        int axis = 0;
        gc_input in[2] = {GC_F(5, 3), idx_input(TS_I64, 1, d4, idx4)};
        gc_check("gather axis 0 i64 repeats", 2, in, b_gather, &axis);
    }
    {
        int axis = 0;
        gc_input in[2] = {GC_F(5, 3), idx_input(TS_I32, 1, d4, idx4_32)};
        gc_check("gather axis 0 i32 repeats", 2, in, b_gather, &axis);
    }
    {
        int axis = 1;
        gc_input in[2] = {GC_F(2, 5, 3), idx_input(TS_I64, 2, d23, idx23)};
        gc_check("gather middle axis 2-d indices", 2, in, b_gather, &axis);
    }
    {
        int axis = -1;
        gc_input in[2] = {GC_F(3, 5), idx_input(TS_I32, 1, d4, idx4_32)};
        gc_check("gather last axis (-1) i32", 2, in, b_gather, &axis);
    }
    {
        int axis = 2;
        gc_input in[2] = {GC_F(2, 3, 6), idx_input(TS_I64, 2, d23, idx23)};
        gc_check("gather last axis 2-d indices", 2, in, b_gather, &axis);
    }
    {
        int axis = -2;
        gc_input in[2] = {GC_F(1, 4, 1), idx_input(TS_I64, 1, d1, idx1)};
        gc_check("gather size-1 dims", 2, in, b_gather, &axis);
    }
    {
        int axis = 0;
        gc_input in[2] = {GC_F(4, 3), idx_input(TS_I64, 0, NULL, idx0)};
        gc_check("gather rank-0 index", 2, in, b_gather, &axis);
    }
    {
        int axis = 0;
        gc_input in[2] = {GC_F(5), idx_input(TS_I64, 1, d4, idx4)};
        gc_check("gather rank-1 data", 2, in, b_gather, &axis);
    }
    {
        gc_input in[2] = {GC_F(6, 4), idx_input(TS_I64, 2, d23, idx23)};
        gc_check("embedding", 2, in, b_embedding, NULL);
    }
    {
        gc_input in[2] = {GC_F(5, 3), idx_input(TS_I32, 1, d4, idx4_32)};
        gc_check("embedding i32", 2, in, b_embedding, NULL);
    }
    {
        static const int64_t ix[3] = {3, 1, 3};
        int64_t d3[1] = {3};
        gc_input in[2] = {GC_F(2, 4, 2), idx_input(TS_I64, 1, d3, ix)};
        gc_check("gather -> scatter_add (second order rule)", 2, in, b_gather_scatter, NULL);
    }
}

/* ---- forward values ---------------------------------------------------- */

static void forward_values(void) {
    {
        /* gather rows of a 3x2 table */
        ts_graph *g = ts_graph_new();
        int64_t dd[2] = {3, 2}, di[1] = {4};
        float a[6] = {1, 2, 3, 4, 5, 6}, out[8], want[8] = {5, 6, 1, 2, 5, 6, 3, 4};
        int64_t b[4] = {2, 0, 2, 1};
        ts_val y =
            ts_embedding(g, ts_input(g, "a", TS_F32, 2, dd), ts_input(g, "b", TS_I64, 1, di));
        CHECK(ts_rank(g, y) == 2 && ts_dim(g, y, 0) == 4 && ts_dim(g, y, 1) == 2,
              "embedding shape");
        CHECK_OK(run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out));
        CHECK(memcmp(out, want, sizeof want) == 0, "embedding values");
        ts_graph_free(g);
    }
    {
        /* gather along the last axis with i32 indices of shape [2,2] */
        ts_graph *g = ts_graph_new();
        int64_t dd[2] = {2, 3}, di[2] = {2, 2};
        double a[6] = {10, 11, 12, 20, 21, 22}, out[8];
        double want[8] = {12, 10, 11, 11, 22, 20, 21, 21};
        int32_t b[4] = {2, 0, 1, 1};
        ts_val y =
            ts_gather(g, ts_input(g, "a", TS_F64, 2, dd), ts_input(g, "b", TS_I32, 2, di), -1);
        CHECK(ts_rank(g, y) == 3, "gather last axis rank");
        CHECK_OK(run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out));
        CHECK(memcmp(out, want, sizeof want) == 0, "gather last axis values");
        ts_graph_free(g);
    }
    {
        /* gather of i64 data along the middle axis (byte kernel) */
        ts_graph *g = ts_graph_new();
        int64_t dd[3] = {2, 3, 2}, di[1] = {2};
        int64_t a[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, out[8];
        int64_t want[8] = {4, 5, 0, 1, 10, 11, 6, 7};
        int64_t b[2] = {2, 0};
        ts_val y =
            ts_gather(g, ts_input(g, "a", TS_I64, 3, dd), ts_input(g, "b", TS_I64, 1, di), 1);
        CHECK_OK(run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out));
        CHECK(memcmp(out, want, sizeof want) == 0, "gather i64 data values");
        ts_graph_free(g);
    }
    {
        /* scatter_add with duplicates: known numbers */
        ts_graph *g = ts_graph_new();
        int64_t dd[2] = {3, 2}, di[1] = {3};
        float a[6] = {1, 2, 3, 4, 5, 6}, out[8], want[8] = {0, 0, 6, 8, 0, 0, 3, 4};
        int32_t b[3] = {1, 3, 1};
        ts_attrs at = ts_attrs_zero();
        at.index.axis = 0;
        at.index.extent = 4;
        ts_val in[2] = {ts_input(g, "a", TS_F32, 2, dd), ts_input(g, "b", TS_I32, 1, di)};
        ts_val y = ts_node_add(g, TS_OP_SCATTER_ADD, 2, in, &at, NULL);
        CHECK_OK(run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out));
        CHECK(memcmp(out, want, sizeof want) == 0, "scatter_add values");
        ts_graph_free(g);
    }
    {
        /* The embedding backward at a realistic size: must equal a serial
         * loop bit for bit (same summation order for any thread count). */
        enum { V = 1000, D = 136, N = 2048 };
        float *dy = malloc(sizeof(float) * N * D), *out = malloc(sizeof(float) * V * D);
        float *ref = calloc((size_t)V * D, sizeof(float));
        int64_t *ix = malloc(sizeof(int64_t) * N);
        uint32_t r = 12345;
        for (int i = 0; i < N * D; i++) {
            r = r * 1664525u + 1013904223u;
            dy[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        }
        for (int j = 0; j < N; j++) {
            r = r * 1664525u + 1013904223u;
            ix[j] = (r >> 8) % 37; /* many repeats */
        }
        for (int j = 0; j < N; j++)
            for (int c = 0; c < D; c++) ref[ix[j] * D + c] += dy[j * D + c];
        ts_graph *g = ts_graph_new();
        int64_t dd[2] = {N, D}, di[1] = {N};
        ts_attrs at = ts_attrs_zero();
        at.index.axis = 0;
        at.index.extent = V;
        ts_val in[2] = {ts_input(g, "a", TS_F32, 2, dd), ts_input(g, "b", TS_I64, 1, di)};
        ts_val y = ts_node_add(g, TS_OP_SCATTER_ADD, 2, in, &at, NULL);
        CHECK_OK(run_forward(g, y, dy, sizeof(float) * N * D, ix, sizeof(int64_t) * N, out,
                             sizeof(float) * V * D));
        CHECK(memcmp(out, ref, sizeof(float) * V * D) == 0, "large scatter_add bit-exact");
        ts_graph_free(g);
        free(dy);
        free(out);
        free(ref);
        free(ix);
    }
}

/* ---- errors ---------------------------------------------------------- */

static void runtime_errors(void) {
    int64_t dd[2] = {5, 3}, di[1] = {3};
    float a[15] = {0};
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_embedding(g, ts_input(g, "a", TS_F32, 2, dd), ts_input(g, "b", TS_I64, 1, di));
        int64_t b[3] = {1, 7, 2};
        ts_status s = run_forward(g, y, a, sizeof a, b, sizeof b, NULL, 0);
        const char *msg = ts_last_error();
        CHECK(s == TS_ERR_INVALID, "index 7 of 5: status %s", ts_status_name(s));
        CHECK(strstr(msg, "7") && strstr(msg, "5") && strstr(msg, "gather"),
              "index 7 of 5: message '%s'", msg);
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_gather(g, ts_input(g, "a", TS_F32, 2, dd), ts_input(g, "b", TS_I32, 1, di), 0);
        int32_t b[3] = {0, -1, 2};
        ts_status s = run_forward(g, y, a, sizeof a, b, sizeof b, NULL, 0);
        const char *msg = ts_last_error();
        CHECK(s == TS_ERR_INVALID, "index -1: status %s", ts_status_name(s));
        CHECK(strstr(msg, "-1") && strstr(msg, "out"), "index -1: message '%s'", msg);
        ts_graph_free(g);
    }
}

static void builder_errors(void) {
    int64_t d23[2] = {2, 3}, d3[1] = {3}, d223[3] = {2, 2, 3};
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_gather(g, ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "i", TS_F32, 1, d3), 0);
        expect_error(g, y, "float indices", "gather", "i32 or i64");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_gather(g, ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "i", TS_I64, 1, d3), 2);
        expect_error(g, y, "gather axis", "gather", "f32[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_gather(g, ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "i", TS_I64, 1, d3), -3);
        expect_error(g, y, "gather negative axis", "gather", "-3");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y =
            ts_embedding(g, ts_input(g, "x", TS_F32, 3, d223), ts_input(g, "i", TS_I64, 1, d3));
        expect_error(g, y, "embedding rank", "embedding", "f32[2,2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        int64_t d9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        ts_val x = ts_input(g, "x", TS_F32, 8, d9);
        ts_val y = ts_gather(g, x, ts_input(g, "i", TS_I64, 2, d23), 0);
        expect_error(g, y, "gather rank overflow", "gather", "rank");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_attrs at = ts_attrs_zero();
        at.index.axis = 0;
        at.index.extent = 4;
        ts_val in[2] = {ts_input(g, "dy", TS_F32, 2, d23), ts_input(g, "i", TS_I64, 1, d3)};
        ts_val y = ts_node_add(g, TS_OP_SCATTER_ADD, 2, in, &at, NULL);
        expect_error(g, y, "scatter_add mismatch", "scatter_add", "f32[2,3]");
        ts_graph_free(g);
    }
}

int main(void) {
    grad_checks();
    forward_values();
    runtime_errors();
    builder_errors();
    return check_summary("gradcheck_index");
}
