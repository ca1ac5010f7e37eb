/* Gradient checks, forward values and error cases for the shape ops:
 * permute/transpose, expand, concat, slice, split. */
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"
#include "ops/op.h"

/* ---- helpers ----------------------------------------------------------- */

/* Compile an inference plan that outputs `out`, feed inputs "a" (and "b"
 * if given), run one step and read the output. Returns 1 on success. */
static int run_forward(ts_graph *g, ts_val out, const void *a, size_t abytes, const void *b,
                       size_t bbytes, void *dst, size_t dbytes) {
    int ok = 0;
    ts_plan *p = NULL;
    if (ts_mark_output(g, out, "out") != TS_OK) goto done;
    if (ts_compile(g, NULL, NULL, &p) != TS_OK) goto done;
    if (a && ts_plan_set_input(p, "a", a, abytes) != TS_OK) goto done;
    if (b && ts_plan_set_input(p, "b", b, bbytes) != TS_OK) goto done;
    if (ts_plan_step(p) != TS_OK) goto done;
    if (ts_plan_read(p, "out", dst, dbytes) != TS_OK) goto done;
    ok = 1;
done:
    if (!ok) fprintf(stderr, "forward run failed: %s\n", ts_last_error());
    ts_plan_free(p);
    return ok;
}

/* The builder failed with TS_NONE and the message mentions every `want`. */
static void expect_error(ts_graph *g, ts_val v, const char *what, const char *want1,
                         const char *want2) {
    const char *msg = ts_graph_error(g);
    CHECK(!ts_val_ok(v) && ts_graph_status(g) != TS_OK, "%s: expected a builder error", what);
    CHECK(strstr(msg, want1) != NULL, "%s: message '%s' lacks '%s'", what, msg, want1);
    if (want2) CHECK(strstr(msg, want2) != NULL, "%s: message '%s' lacks '%s'", what, msg, want2);
}

static ts_val expand_to(ts_graph *g, ts_val a, int rank, const int64_t *dims) {
    ts_attrs at = ts_attrs_zero();
    at.shape.rank = rank;
    for (int i = 0; i < rank; i++) at.shape.dims[i] = dims[i];
    return ts_node_add(g, TS_OP_EXPAND, 1, &a, &at, NULL);
}

/* ---- builders for gc_check ------------------------------------------- */

typedef struct perm_arg {
    int perm[TS_MAX_RANK];
} perm_arg;

static ts_val b_permute(ts_graph *g, const ts_val *in, void *u) {
    return ts_permute(g, in[0], ((perm_arg *)u)->perm);
}

/* permute(x) * permute(x): the output is never the input itself (a
 * rank-0 or identity permute returns its operand). */
static ts_val b_permute_sq(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val y = ts_permute(g, in[0], NULL);
    return ts_mul(g, y, y);
}

typedef struct two_axes {
    int a0, a1;
} two_axes;

static ts_val b_transpose(ts_graph *g, const ts_val *in, void *u) {
    two_axes *t = u;
    return ts_transpose(g, in[0], t->a0, t->a1);
}

typedef struct expand_arg {
    int rank;
    int64_t dims[TS_MAX_RANK];
} expand_arg;

static ts_val b_expand(ts_graph *g, const ts_val *in, void *u) {
    expand_arg *e = u;
    return expand_to(g, in[0], e->rank, e->dims);
}

typedef struct concat_arg {
    int n, axis;
} concat_arg;

static ts_val b_concat(ts_graph *g, const ts_val *in, void *u) {
    concat_arg *c = u;
    return ts_concat(g, c->n, in, c->axis);
}

typedef struct slice_arg {
    int axis;
    int64_t start, end;
} slice_arg;

static ts_val b_slice(ts_graph *g, const ts_val *in, void *u) {
    slice_arg *s = u;
    return ts_slice(g, in[0], s->axis, s->start, s->end);
}

/* Split into 1, 2, 3 along axis 1 and concatenate in reverse order. */
static ts_val b_split_reverse(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    int64_t sizes[3] = {1, 2, 3};
    ts_val parts[3], rev[3];
    if (ts_split(g, in[0], 1, 3, sizes, parts) != TS_OK) return TS_NONE;
    for (int i = 0; i < 3; i++) rev[i] = parts[2 - i];
    return ts_concat(g, 3, rev, 1);
}

/* The attention pattern: every slice of one tensor gets a gradient. */
static ts_val b_qkv(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    int64_t sizes[3] = {4, 4, 4};
    ts_val p[3];
    if (ts_split(g, in[0], -1, 3, sizes, p) != TS_OK) return TS_NONE;
    return ts_add(g, ts_mul(g, p[0], p[1]), p[2]);
}

/* Slice then slice_bwd then slice: exercises the double-backward rules. */
static ts_val b_slice_chain(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_attrs at = ts_attrs_zero();
    at.slice.axis = 1;
    at.slice.start = 1;
    at.slice.end = 3;
    at.slice.extent = 5;
    ts_val s = ts_slice(g, in[0], 1, 1, 3);
    ts_val back = ts_node_add(g, TS_OP_SLICE_BWD, 1, &s, &at, NULL);
    return ts_mul(g, back, back);
}

/* Permute then expand then sum-like use, mixing ops. */
static ts_val b_mixed(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    int perm[3] = {2, 0, 1};
    ts_val p = ts_permute(g, in[0], perm); /* [4, 2, 1] */
    int64_t dims[4] = {3, 4, 2, 5};
    ts_val e = expand_to(g, p, 4, dims);
    return ts_mul(g, e, e);
}

/* ---- gradient checks -------------------------------------------------- */

static void grad_checks(void) {
    {
        perm_arg pa = {{0, 2, 1, 3}}; /* [B,T,H,hd] -> [B,H,T,hd] */
        gc_input in[1] = {GC_F(2, 3, 4, 5)};
        gc_check("permute gpt 0213", 1, in, b_permute, &pa);
    }
    {
        perm_arg pa = {{3, 1, 0, 2}};
        gc_input in[1] = {GC_F(2, 3, 4, 5)};
        gc_check("permute general 3102", 1, in, b_permute, &pa);
    }
    {
        perm_arg pa = {{0, 1, 3, 2}};
        gc_input in[1] = {GC_F(2, 3, 5, 4)};
        gc_check("permute batched transpose", 1, in, b_permute, &pa);
    }
    {
        perm_arg pa = {{2, 0, 1}};
        gc_input in[1] = {GC_F(2, 1, 3)};
        gc_check("permute size-1 dim", 1, in, b_permute, &pa);
    }
    {
        perm_arg pa = {{-1, 0, -2}};
        gc_input in[1] = {GC_F(3, 4, 2)};
        gc_check("permute negative entries", 1, in, b_permute, &pa);
    }
    {
        gc_input in[1] = {GC_SCALAR};
        gc_check("permute rank 0", 1, in, b_permute_sq, NULL);
    }
    {
        two_axes t = {0, 1};
        gc_input in[1] = {GC_F(5, 7)};
        gc_check("transpose 2d", 1, in, b_transpose, &t);
    }
    {
        two_axes t = {0, 1};
        gc_input in[2][1] = {{GC_F(34, 3)}, {GC_F(3, 35)}}; /* several, partial 32x32 tiles */
        gc_check("transpose 2d tiles [34,3]", 1, in[0], b_transpose, &t);
        gc_check("transpose 2d tiles [3,35]", 1, in[1], b_transpose, &t);
    }
    {
        two_axes t = {-1, -3};
        gc_input in[1] = {GC_F(2, 3, 4)};
        gc_check("transpose negative axes", 1, in, b_transpose, &t);
    }
    {
        expand_arg e = {3, {2, 3, 4}};
        gc_input in[1] = {GC_F(3, 1)};
        gc_check("expand [3,1] -> [2,3,4]", 1, in, b_expand, &e);
    }
    {
        expand_arg e = {2, {5, 4}};
        gc_input in[1] = {GC_F(4)};
        gc_check("expand [4] -> [5,4]", 1, in, b_expand, &e);
    }
    {
        expand_arg e = {2, {3, 2}};
        gc_input in[1] = {GC_SCALAR};
        gc_check("expand rank 0 -> [3,2]", 1, in, b_expand, &e);
    }
    {
        expand_arg e = {3, {2, 3, 4}};
        gc_input in[1] = {GC_F(2, 1, 4)};
        gc_check("expand middle axis", 1, in, b_expand, &e);
    }
    {
        gc_input in[1] = {GC_F(2, 1, 4)};
        gc_check("permute + expand", 1, in, b_mixed, NULL);
    }
    {
        concat_arg c = {3, 1};
        gc_input in[3] = {GC_F(2, 1, 3), GC_F(2, 4, 3), GC_F(2, 2, 3)};
        gc_check("concat axis 1", 3, in, b_concat, &c);
    }
    {
        concat_arg c = {2, 0};
        gc_input in[2] = {GC_F(1, 3), GC_F(2, 3)};
        gc_check("concat axis 0", 2, in, b_concat, &c);
    }
    {
        concat_arg c = {2, -1};
        gc_input in[2] = {GC_F(2, 3, 1), GC_F(2, 3, 2)};
        gc_check("concat axis -1", 2, in, b_concat, &c);
    }
    {
        slice_arg s = {1, 1, 4};
        gc_input in[1] = {GC_F(2, 5, 3)};
        gc_check("slice middle axis", 1, in, b_slice, &s);
    }
    {
        slice_arg s = {0, 2, 3};
        gc_input in[1] = {GC_F(4, 3)};
        gc_check("slice size-1 result axis 0", 1, in, b_slice, &s);
    }
    {
        slice_arg s = {-1, -3, -1};
        gc_input in[1] = {GC_F(2, 6)};
        gc_check("slice negative axis/start/end", 1, in, b_slice, &s);
    }
    {
        gc_input in[1] = {GC_F(2, 6, 2)};
        gc_check("split + concat reversed", 1, in, b_split_reverse, NULL);
    }
    {
        gc_input in[1] = {GC_F(2, 3, 12)};
        gc_check("split qkv", 1, in, b_qkv, NULL);
    }
    {
        gc_input in[1] = {GC_F(2, 5)};
        gc_check("slice_bwd double backward", 1, in, b_slice_chain, NULL);
    }
}

/* ---- forward values ---------------------------------------------------- */

static void forward_values(void) {
    {
        /* transpose of a known 2x3 */
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {2, 3};
        float a[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0}, want[6] = {1, 4, 2, 5, 3, 6};
        ts_val x = ts_input(g, "a", TS_F32, 2, d);
        ts_val y = ts_transpose(g, x, 0, 1);
        CHECK(ts_dim(g, y, 0) == 3 && ts_dim(g, y, 1) == 2, "transpose shape");
        if (run_forward(g, y, a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "transpose values");
        ts_graph_free(g);
    }
    {
        /* [B,T,H,hd] -> [B,H,T,hd] and a general perm vs a naive loop, in
         * f32 and i64 (byte kernels cover every dtype). */
        enum { B = 3, T = 17, H = 4, D = 9 };
        int64_t d[4] = {B, T, H, D};
        static float a[B * T * H * D], o1[B * T * H * D];
        static int64_t ai[B * T * H * D], oi[B * T * H * D];
        for (int i = 0; i < B * T * H * D; i++) a[i] = (float)i * 0.5f, ai[i] = i * 7 - 3;
        int perms[2][4] = {{0, 2, 1, 3}, {3, 0, 2, 1}};
        for (int pi = 0; pi < 2; pi++) {
            for (int dt = 0; dt < 2; dt++) {
                ts_graph *g = ts_graph_new();
                ts_val x = ts_input(g, "a", dt ? TS_I64 : TS_F32, 4, d);
                ts_val y = ts_permute(g, x, perms[pi]);
                int ok = dt ? run_forward(g, y, ai, sizeof ai, NULL, 0, oi, sizeof oi)
                            : run_forward(g, y, a, sizeof a, NULL, 0, o1, sizeof o1);
                int64_t od[4], is[4] = {T * H * D, H * D, D, 1}, bad = 0;
                for (int i = 0; i < 4; i++) od[i] = d[perms[pi][i]];
                for (int64_t i0 = 0; ok && i0 < od[0]; i0++)
                    for (int64_t i1 = 0; i1 < od[1]; i1++)
                        for (int64_t i2 = 0; i2 < od[2]; i2++)
                            for (int64_t i3 = 0; i3 < od[3]; i3++) {
                                int64_t o = ((i0 * od[1] + i1) * od[2] + i2) * od[3] + i3;
                                int64_t s = i0 * is[perms[pi][0]] + i1 * is[perms[pi][1]] +
                                            i2 * is[perms[pi][2]] + i3 * is[perms[pi][3]];
                                bad += dt ? oi[o] != ai[s] : o1[o] != a[s];
                            }
                CHECK(ok && bad == 0, "permute perm %d dtype %d: %lld wrong", pi, dt,
                      (long long)bad);
                ts_graph_free(g);
            }
        }
    }
    {
        /* a large 2-D transpose (parallel, tiled) against a naive loop */
        enum { M = 301, N = 517 };
        int64_t d[2] = {M, N};
        double *a = malloc(sizeof(double) * M * N), *o = malloc(sizeof(double) * M * N);
        for (int i = 0; i < M * N; i++) a[i] = i * 0.25;
        ts_graph *g = ts_graph_new();
        ts_val y = ts_transpose(g, ts_input(g, "a", TS_F64, 2, d), 1, 0);
        int bad = 0,
            ok = run_forward(g, y, a, sizeof(double) * M * N, NULL, 0, o, sizeof(double) * M * N);
        for (int i = 0; ok && i < M; i++)
            for (int j = 0; j < N; j++) bad += o[j * M + i] != a[i * N + j];
        CHECK(ok && bad == 0, "large transpose: %d wrong", bad);
        ts_graph_free(g);
        free(a);
        free(o);
    }
    {
        /* expand [3,1] -> [2,3,2] */
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {3, 1}, t[3] = {2, 3, 2};
        float a[3] = {1, 2, 3}, out[12], want[12] = {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3};
        ts_val y = expand_to(g, ts_input(g, "a", TS_F32, 2, d), 3, t);
        if (run_forward(g, y, a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "expand values");
        ts_graph_free(g);
    }
    {
        /* expand [2] -> [3,2] in u8 */
        ts_graph *g = ts_graph_new();
        int64_t d[1] = {2}, t[2] = {3, 2};
        unsigned char a[2] = {7, 9}, out[6], want[6] = {7, 9, 7, 9, 7, 9};
        ts_val y = expand_to(g, ts_input(g, "a", TS_U8, 1, d), 2, t);
        if (run_forward(g, y, a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "expand u8 values");
        ts_graph_free(g);
    }
    {
        /* concat along axis 1 and slice back */
        ts_graph *g = ts_graph_new();
        int64_t da[2] = {2, 2}, db[2] = {2, 1};
        float a[4] = {1, 2, 3, 4}, b[2] = {9, 8}, out[6], want[6] = {1, 2, 9, 3, 4, 8};
        ts_val v[2] = {ts_input(g, "a", TS_F32, 2, da), ts_input(g, "b", TS_F32, 2, db)};
        ts_val y = ts_concat(g, 2, v, -1);
        CHECK(ts_dim(g, y, 1) == 3, "concat shape");
        if (run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "concat values");
        ts_graph_free(g);
    }
    {
        /* concat along axis 0 of i32 */
        ts_graph *g = ts_graph_new();
        int64_t da[2] = {1, 3}, db[2] = {2, 3};
        int32_t a[3] = {1, 2, 3}, b[6] = {4, 5, 6, 7, 8, 9}, out[9];
        int32_t want[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        ts_val v[2] = {ts_input(g, "a", TS_I32, 2, da), ts_input(g, "b", TS_I32, 2, db)};
        ts_val y = ts_concat(g, 2, v, 0);
        if (run_forward(g, y, a, sizeof a, b, sizeof b, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "concat i32 values");
        ts_graph_free(g);
    }
    {
        /* slice [:, -3:-1] of a 2x5 */
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {2, 5};
        double a[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, out[4], want[4] = {2, 3, 7, 8};
        ts_val y = ts_slice(g, ts_input(g, "a", TS_F64, 2, d), 1, -3, -1);
        if (run_forward(g, y, a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "slice values");
        ts_graph_free(g);
    }
    {
        /* slice_bwd places dy in zeros */
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {2, 2};
        float a[4] = {1, 2, 3, 4}, out[8], want[8] = {0, 1, 2, 0, 0, 3, 4, 0};
        ts_attrs at = ts_attrs_zero();
        at.slice.axis = 1;
        at.slice.start = 1;
        at.slice.end = 3;
        at.slice.extent = 4;
        ts_val x = ts_input(g, "a", TS_F32, 2, d);
        ts_val y = ts_node_add(g, TS_OP_SLICE_BWD, 1, &x, &at, NULL);
        if (run_forward(g, y, a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "slice_bwd values");
        ts_graph_free(g);
    }
    {
        /* split values and identities */
        ts_graph *g = ts_graph_new();
        int64_t d[1] = {6}, sizes[3] = {1, 3, 2};
        ts_val x = ts_input(g, "a", TS_F32, 1, d), parts[3];
        CHECK_OK(ts_split(g, x, 0, 3, sizes, parts));
        CHECK(ts_dim(g, parts[0], 0) == 1 && ts_dim(g, parts[1], 0) == 3 &&
                  ts_dim(g, parts[2], 0) == 2,
              "split shapes");
        float a[6] = {1, 2, 3, 4, 5, 6}, out[3], want[3] = {2, 3, 4};
        CHECK(ts_slice(g, x, 0, 0, 6).id == x.id, "full slice is the value itself");
        CHECK(ts_transpose(g, x, 0, -1).id == x.id, "identity transpose is the value itself");
        if (run_forward(g, parts[1], a, sizeof a, NULL, 0, out, sizeof out))
            CHECK(memcmp(out, want, sizeof want) == 0, "split values");
        ts_graph_free(g);
    }
}

/* ---- errors ---------------------------------------------------------- */

static void errors(void) {
    int64_t d23[2] = {2, 3}, d24[2] = {2, 4}, d3[1] = {3};
    {
        ts_graph *g = ts_graph_new();
        int perm[2] = {0, 0};
        ts_val y = ts_permute(g, ts_input(g, "x", TS_F32, 2, d23), perm);
        expect_error(g, y, "permute duplicate", "permute", "f32[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        int perm[2] = {0, 5};
        ts_val y = ts_permute(g, ts_input(g, "x", TS_F32, 2, d23), perm);
        expect_error(g, y, "permute out of range", "permute", "5");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = ts_transpose(g, ts_input(g, "x", TS_F32, 2, d23), 0, 2);
        expect_error(g, y, "transpose axis", "transpose", "f32[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val v[2] = {ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "y", TS_F64, 2, d23)};
        ts_val y = ts_concat(g, 2, v, 0);
        expect_error(g, y, "concat dtype", "concat", "f64[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val v[2] = {ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "y", TS_F32, 2, d24)};
        ts_val y = ts_concat(g, 2, v, 0);
        expect_error(g, y, "concat shape", "concat", "f32[2,4]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val v[2] = {ts_input(g, "x", TS_F32, 2, d23), ts_input(g, "y", TS_F32, 1, d3)};
        ts_val y = ts_concat(g, 2, v, 1);
        expect_error(g, y, "concat rank", "concat", "rank");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = ts_slice(g, ts_input(g, "x", TS_F32, 2, d23), 1, 1, 5);
        expect_error(g, y, "slice out of range", "slice", "f32[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = ts_slice(g, ts_input(g, "x", TS_F32, 2, d23), 1, 2, 2);
        expect_error(g, y, "slice empty", "slice", "empty");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = ts_slice(g, ts_input(g, "x", TS_F32, 2, d23), 0, -3, 1);
        expect_error(g, y, "slice negative start out of range", "slice", "-3");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = ts_slice(g, ts_input(g, "x", TS_F32, 2, d23), 2, 0, 1);
        expect_error(g, y, "slice axis", "slice", "axis 2");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        int64_t sizes[2] = {1, 1};
        ts_val outs[2];
        ts_status s = ts_split(g, ts_input(g, "x", TS_F32, 2, d23), 1, 2, sizes, outs);
        CHECK(s != TS_OK && !ts_val_ok(outs[0]) && !ts_val_ok(outs[1]), "split sum mismatch");
        expect_error(g, TS_NONE, "split sum mismatch", "split", "sum to 2");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        int64_t t[2] = {2, 4};
        ts_val y = expand_to(g, ts_input(g, "x", TS_F32, 2, d23), 2, t);
        expect_error(g, y, "expand incompatible", "expand", "f32[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val y = expand_to(g, ts_input(g, "x", TS_F32, 2, d23), 1, d3);
        expect_error(g, y, "expand lower rank", "expand", "rank");
        ts_graph_free(g);
    }
    {
        /* Errors are sticky: later builders return TS_NONE quietly. */
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, d23);
        ts_val bad = ts_slice(g, x, 0, 3, 4);
        ts_val later = ts_transpose(g, bad, 0, 1);
        CHECK(!ts_val_ok(later) && strstr(ts_graph_error(g), "slice"), "sticky error");
        ts_graph_free(g);
    }
}

int main(void) {
    grad_checks();
    forward_values();
    errors();
    return check_summary("gradcheck_shape");
}
