/* layer_norm_bwd's two schedules (ops/norm.c): with at least as many blocks of 128 rows as
 * threads, each block computes its rows' dx and then its dw/db partials in one task; with
 * fewer, dx runs row-parallel and the partials in (block, column) tasks. Both give the same
 * bits, so dx, dw and db of a layer norm agree bit for bit on 1, 2, 3 and 5 threads for shapes
 * that take either schedule (rows not a multiple of the block, columns not a multiple of the
 * 256-column task, one block, w or b alone), with NaN and infinity in x; and dx, dw, db
 * agree with a double-precision reference to 1e-4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "tessel/tessel.h"

typedef struct cfg {
    int64_t rows, d;
    int has_w, has_b, nan;
} cfg;

typedef struct result {
    float *g[3]; /* grad:x, grad:w, grad:b (NULL where absent) */
} result;

static float *fill(size_t n, unsigned seed, float lo, float hi) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)rand_r(&seed) / (float)RAND_MAX;
    return v;
}

static const char *gname[3] = {"grad:x", "grad:w", "grad:b"};

/* loss = sum(layer_norm(x[, w][, b]) * C); one backward pass on `threads` threads. */
static result run(const cfg *c, const float *x, const float *w, const float *b, const float *cd,
                  int threads) {
    result r = {0};
    ts_graph *g = ts_graph_new();
    const int64_t xd[2] = {c->rows, c->d}, vd[1] = {c->d};
    ts_val xv = ts_param(g, "x", TS_F32, 2, xd, ts_init_zeros());
    ts_val wv = c->has_w ? ts_param(g, "w", TS_F32, 1, vd, ts_init_zeros()) : TS_NONE;
    ts_val bv = c->has_b ? ts_param(g, "b", TS_F32, 1, vd, ts_init_zeros()) : TS_NONE;
    ts_val y = ts_layer_norm(g, xv, wv, bv, 1e-5);
    ts_val loss = ts_sum(g, ts_mul(g, y, ts_constant(g, "C", TS_F32, 2, xd, cd)), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &o, &p);
    ts_graph_free(g);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return r;
    const size_t nx = sizeof(float) * (size_t)(c->rows * c->d), nv = sizeof(float) * (size_t)c->d;
    CHECK_OK(ts_plan_write_param(p, "x", x, nx));
    if (c->has_w) CHECK_OK(ts_plan_write_param(p, "w", w, nv));
    if (c->has_b) CHECK_OK(ts_plan_write_param(p, "b", b, nv));
    CHECK_OK(ts_plan_step(p));
    for (int i = 0; i < 3; i++) {
        if ((i == 1 && !c->has_w) || (i == 2 && !c->has_b)) continue;
        r.g[i] = malloc(i ? nv : nx);
        CHECK_OK(ts_plan_read(p, gname[i], r.g[i], i ? nv : nx));
    }
    ts_plan_free(p);
    return r;
}

/* Max relative error (against max(1, |ref|)) of the f32 gradients against a double reference
 * of the same formulas: g = dy w, xh = (x - mean) rstd, dx = rstd (g - mean(g) - xh mean(g xh)),
 * dw = sum dy xh, db = sum dy. Rows holding NaN or inf are skipped. */
static double ref_err(const cfg *c, const float *x, const float *w, const float *cd,
                      const result *r) {
    const int64_t n = c->rows, d = c->d;
    double err = 0, *dw = calloc((size_t)d, sizeof *dw), *db = calloc((size_t)d, sizeof *db);
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * d, *dy = cd + i * d;
        double m = 0, v = 0, mg = 0, mgx = 0;
        int finite = 1;
        for (int64_t j = 0; j < d; j++) finite &= isfinite(xr[j]), m += xr[j];
        if (!finite) return free(dw), free(db), err;
        m /= (double)d;
        for (int64_t j = 0; j < d; j++) v += (xr[j] - m) * (xr[j] - m);
        const double rs = 1 / sqrt(v / (double)d + 1e-5);
        for (int64_t j = 0; j < d; j++) {
            const double gv = dy[j] * (c->has_w ? w[j] : 1.0), xh = (xr[j] - m) * rs;
            mg += gv, mgx += gv * xh;
            dw[j] += dy[j] * xh, db[j] += dy[j];
        }
        mg /= (double)d, mgx /= (double)d;
        for (int64_t j = 0; j < d; j++) {
            const double gv = dy[j] * (c->has_w ? w[j] : 1.0), xh = (xr[j] - m) * rs;
            const double want = rs * (gv - mg - xh * mgx);
            err = fmax(err, fabs(r->g[0][i * d + j] - want) / fmax(1, fabs(want)));
        }
    }
    for (int64_t j = 0; j < d; j++) {
        if (c->has_w) err = fmax(err, fabs(r->g[1][j] - dw[j]) / fmax(1, fabs(dw[j])));
        if (c->has_b) err = fmax(err, fabs(r->g[2][j] - db[j]) / fmax(1, fabs(db[j])));
    }
    free(dw), free(db);
    return err;
}

static void check_cfg(const cfg *c) {
    const size_t nx = (size_t)(c->rows * c->d), nv = (size_t)c->d;
    float *x = fill(nx, 21, -2, 2), *cd = fill(nx, 22, -1, 1);
    float *w = fill(nv, 23, 0.5f, 1.5f), *b = fill(nv, 24, -0.5f, 0.5f);
    if (c->nan) {
        x[3] = NAN;
        x[c->d * (c->rows / 2) + 5] = INFINITY;
        x[c->d * (c->rows - 1)] = -INFINITY;
    }
    char label[96];
    snprintf(label, sizeof label, "[%lld, %lld]%s%s%s", (long long)c->rows, (long long)c->d,
             c->has_w ? " +w" : "", c->has_b ? " +b" : "", c->nan ? " with NaN/inf" : "");
    result one = run(c, x, w, b, cd, 1);
    if (!c->nan && one.g[0]) {
        const double e = ref_err(c, x, w, cd, &one);
        CHECK(e < 1e-4, "%s: 1 thread: max relative error %.3g against the reference", label, e);
    }
    static const int threads[] = {2, 3, 5};
    for (int t = 0; t < 3; t++) {
        result r = run(c, x, w, b, cd, threads[t]);
        for (int i = 0; i < 3; i++)
            if (one.g[i] || r.g[i])
                CHECK(one.g[i] && r.g[i] && !memcmp(one.g[i], r.g[i], (i ? nv : nx) * 4),
                      "%s: %s on %d threads differs from 1 thread", label, gname[i], threads[t]);
        for (int i = 0; i < 3; i++) free(r.g[i]);
    }
    for (int i = 0; i < 3; i++) free(one.g[i]);
    free(x), free(cd), free(w), free(b);
}

int main(void) {
    static const cfg cases[] = {
        {300, 700, 1, 1, 0},  /* 3 blocks (the last short), 3 column tasks (the last short) */
        {300, 700, 1, 1, 1},  /* the same with NaN and infinities */
        {640, 512, 1, 1, 0},  /* 5 whole blocks: one schedule on 1-5 threads, W3's width */
        {128, 64, 1, 1, 0},   /* one block */
        {260, 300, 1, 0, 0},  /* w alone */
        {260, 300, 0, 1, 0},  /* b alone */
        {1000, 33, 1, 1, 0}}; /* 8 blocks, a narrow row */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_cfg(&cases[i]);
    return check_summary("unit/layer_norm_blocks");
}
