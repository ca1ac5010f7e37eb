/* Gradient checks, PyTorch reference values, argmax and NaN rules,
 * determinism and errors for max, average and adaptive average pooling, in
 * both layouts (channels last through permutes in and out). */
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"

enum { MAXP, AVG, AVG_PAD, ADAPTIVE };

typedef struct pl {
    const char *label;
    int kind, nd;
    int64_t x[5];
    int64_t k[3], s[3], p[3]; /* adaptive: k = output size */
    int default_stride;       /* pass stride NULL (= kernel) */
} pl;

/* The layout the checks build the op in. */
static ts_layout layout = TS_CHANNELS_FIRST;

static ts_val build_pool(ts_graph *g, const ts_val *in, void *u) {
    const pl *c = u;
    const int64_t *s = c->default_stride ? NULL : c->s;
    if (layout == TS_CHANNELS_LAST) {
        ts_val x = gc_to_layout(g, in[0], c->nd + 2, 1), y;
        switch (c->kind) {
        case MAXP: y = ts_max_pool_layout(g, x, c->nd, c->k, s, c->p, layout); break;
        case AVG: y = ts_avg_pool_layout(g, x, c->nd, c->k, s, c->p, 0, layout); break;
        case AVG_PAD: y = ts_avg_pool_layout(g, x, c->nd, c->k, s, c->p, 1, layout); break;
        default: /* adaptive pooling is built channels first only */
            return ts_graph_fail(g, TS_ERR_INVALID, "test: no channels-last adaptive pooling");
        }
        return gc_to_layout(g, y, c->nd + 2, 0);
    }
    switch (c->kind) {
    case MAXP: return ts_max_pool(g, in[0], c->nd, c->k, s, c->p);
    case AVG: return ts_avg_pool(g, in[0], c->nd, c->k, s, c->p, 0);
    case AVG_PAD: return ts_avg_pool(g, in[0], c->nd, c->k, s, c->p, 1);
    default: return ts_adaptive_avg_pool(g, in[0], c->nd, c->k);
    }
}

static const pl configs[] = {
    {"max_pool1d k3 s2 p1", MAXP, 1, {2, 3, 9}, {3}, {2}, {1}, 0},
    {"max_pool1d k2 default stride", MAXP, 1, {1, 2, 7}, {2}, {0}, {0}, 1},
    {"max_pool2d k2", MAXP, 2, {2, 2, 6, 6}, {2, 2}, {0}, {0}, 1},
    {"max_pool2d k(3,2) s(2,1) p(1,1), overlapping",
     MAXP,
     2,
     {1, 3, 7, 5},
     {3, 2},
     {2, 1},
     {1, 1},
     0},
    {"max_pool2d size-1 dims", MAXP, 2, {1, 1, 1, 5}, {1, 2}, {1, 2}, {0, 1}, 0},
    {"max_pool3d k2 (W4)", MAXP, 3, {2, 2, 4, 4, 4}, {2, 2, 2}, {0}, {0}, 1},
    {"max_pool3d k3 s2 p1 odd", MAXP, 3, {1, 2, 5, 3, 4}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, 0},
    {"avg_pool1d k3 s2 p1", AVG, 1, {2, 3, 8}, {3}, {2}, {1}, 0},
    {"avg_pool1d k3 s2 p1 count_include_pad", AVG_PAD, 1, {2, 3, 8}, {3}, {2}, {1}, 0},
    {"avg_pool2d k(3,2) s(2,2) p(1,1)", AVG, 2, {1, 2, 7, 6}, {3, 2}, {2, 2}, {1, 1}, 0},
    {"avg_pool2d k(3,2) s(2,2) p(1,1) count_include_pad",
     AVG_PAD,
     2,
     {1, 2, 7, 6},
     {3, 2},
     {2, 2},
     {1, 1},
     0},
    {"avg_pool3d k2", AVG, 3, {1, 2, 4, 4, 6}, {2, 2, 2}, {0}, {0}, 1},
    {"avg_pool3d k3 s1 p1 count_include_pad",
     AVG_PAD,
     3,
     {1, 1, 3, 4, 3},
     {3, 3, 3},
     {1, 1, 1},
     {1, 1, 1},
     0},
    {"adaptive_avg_pool1d 7 -> 3", ADAPTIVE, 1, {2, 2, 7}, {3}, {0}, {0}, 0},
    {"adaptive_avg_pool1d 3 -> 5 (upsampling)", ADAPTIVE, 1, {1, 2, 3}, {5}, {0}, {0}, 0},
    {"adaptive_avg_pool2d 5x7 -> 3x4", ADAPTIVE, 2, {1, 2, 5, 7}, {3, 4}, {0}, {0}, 0},
    {"adaptive_avg_pool2d global", ADAPTIVE, 2, {2, 3, 4, 5}, {1, 1}, {0}, {0}, 0},
    {"adaptive_avg_pool3d 4x5x3 -> 2x3x2", ADAPTIVE, 3, {1, 2, 4, 5, 3}, {2, 3, 2}, {0}, {0}, 0},
};

static void gradchecks(void) {
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const pl *c = &configs[i];
        if (layout == TS_CHANNELS_LAST && c->kind == ADAPTIVE) continue;
        gc_input in = {TS_F64, c->nd + 2, {0}, 1, -2, 2, NULL};
        memcpy(in.dims, c->x, sizeof c->x);
        char label[160];
        snprintf(label, sizeof label, "%s%s", c->label,
                 layout == TS_CHANNELS_LAST ? " (channels last)" : "");
        gc_check(label, 1, &in, build_pool, (void *)c);
    }
}

/* ---- forward values from PyTorch ---------------------------------------- */

/* Generated with PyTorch 1.13 (f64; element i of x is sin(0.37*i)):
 *   t = lambda shape: torch.tensor([math.sin(0.37*i)
 *                     for i in range(math.prod(shape))]).reshape(shape)
 *   F.max_pool2d(t([1,2,5,7]), (3,2), (2,2), (1,1))
 *   F.avg_pool2d(t([1,2,5,7]), (3,2), (2,2), (1,1), count_include_pad=True)
 *   F.avg_pool2d(t([1,2,5,7]), (3,2), (2,2), (1,1), count_include_pad=False)
 *   F.adaptive_avg_pool2d(t([1,2,5,7]), (3,4))
 *   F.max_pool3d(t([1,1,4,4,4]), 2)
 *   F.adaptive_avg_pool1d(t([1,2,7]), 3)
 *   F.avg_pool1d(t([1,2,7]), 3, 2, 1, count_include_pad=True)
 *   F.avg_pool1d(t([1,2,7]), 3, 2, 1, count_include_pad=False)
 * printed with '%.17g'. */
static const double want_maxpool2d[24] = {
    0.52404434168727609, 0.67428791162814505, 0.99588084453764003,
    0.96127520297529989, 0.99647561474060053, 0.95937483389286415,
    0.51822820592097674, 0.89870809581162692, 0.99647561474060053,
    0.95937483389286415, 0.51822820592097674, 0.013628963678619457,
    0.37428850114575674, 0.90167577006639099, 0.9970241087570002,
    0.78825206737531628, 0.95544052635526755, 0.78404035852762322,
    0.68924326123066315, 0.9975263011148543,  0.95544052635526755,
    0.78404035852762322, 0.16045200598059384, 0.38689204351362089}; /* [1, 2, 3, 4] */
static const double want_avgpool2d_pad[24] = {
    0.08734072361454602,   0.17153415799073948,  0.093512767855562784,
    -0.033421680188515414, 0.10464537949994034,  0.12010169848140294,
    -0.043935013522624321, -0.1849909507090377,  0.031957450912855567,
    -0.034615419151630633, -0.14359970849386178, -0.17747232037927183,
    0.090243854768215614,  0.14065915176338809,  0.029831372816666979,
    -0.096600089985690599, 0.077260734597484379, 0.037752615891763118,
    -0.12541797116954814,  -0.2229870727084943,  -0.0021648144496585844,
    -0.097620288690374313, -0.17281078657535956, -0.15761037630009012}; /* [1, 2, 3, 4] */
static const double want_avgpool2d_nopad[24] = {
    0.26202217084363805,   0.25730123698610924,  0.14026915178334418,
    -0.050132520282773124, 0.20929075899988067,  0.12010169848140294,
    -0.043935013522624321, -0.1849909507090377,  0.095872352738566702,
    -0.05192312872744595,  -0.21539956274079267, -0.26620848056890772,
    0.27073156430464684,   0.21098872764508214,  0.044747059225000468,
    -0.1449001349785359,   0.15452146919496876,  0.037752615891763118,
    -0.12541797116954814,  -0.2229870727084943,  -0.0064944433489757536,
    -0.14643043303556147,  -0.25921617986303935, -0.23641556445013517}; /* [1, 2, 3, 4] */
static const double want_adaptive2d[24] = {
    0.26656401038661776,   0.23251124878599852,  0.09320347992256002,
    -0.050132520282773124, 0.18310058691841283,  0.079535210663963449,
    -0.082380080090904945, -0.1849909507090377,  0.046544402215702579,
    -0.096503254622215484, -0.23407630038385493, -0.26620848056890772,
    0.25627198102506055,   0.17203689242929673,  -0.0044298099136694802,
    -0.1449001349785359,   0.11740984954738574,  -0.0045767615129204131,
    -0.15430980616364001,  -0.2229870727084943,  -0.055497028664913989,
    -0.17986331481432413,  -0.25944535984970168, -0.23641556445013517}; /* [1, 2, 3, 4] */
static const double want_maxpool3d[8] = {
    0.99647561474060053,  0.95937483389286415, 0.51822820592097674,
    -0.19398436125389723, 0.90167577006639099, 0.9975263011148543,
    0.95544052635526755,  0.50652400627285687}; /* [1, 1, 2, 2, 2] */
static const double want_adaptive1d[6] = {
    0.34530111453103568, 0.85528914728194427,  0.91790717324967552,
    0.17244864867953527, -0.50593252887573803, -0.9196791795060989}; /* [1, 2, 3] */
static const double want_avgpool1d_pad[8] = {
    0.120538477321654,   0.64386734309105165, 0.95095157773099581,
    0.58594689173712888, 0.23488020319383632, -0.17884484551905455,
    -0.7645446178858758, -0.65279025211415975}; /* [1, 2, 4] */
static const double want_avgpool1d_nopad[8] = {
    0.18080771598248099, 0.64386734309105165, 0.95095157773099581,
    0.87892033760569332, 0.35232030479075449, -0.17884484551905455,
    -0.7645446178858758, -0.97918537817123963}; /* [1, 2, 4] */

/* Forward of c on the sin input in dtype dt, compared with want. */
static void torch_case(const pl *c, const double *want, int64_t n, ts_dtype dt) {
    ts_graph *g = ts_graph_new();
    int64_t m = 1;
    for (int i = 0; i < c->nd + 2; i++) m *= c->x[i];
    double *v = malloc((size_t)m * sizeof(double));
    float *f = malloc((size_t)m * sizeof(float));
    for (int64_t e = 0; e < m; e++) v[e] = sin(0.37 * (double)e), f[e] = (float)v[e];
    ts_val x = ts_constant(g, "x", dt, c->nd + 2, c->x, dt == TS_F64 ? (void *)v : (void *)f);
    free(v);
    free(f);
    ts_val y = build_pool(g, &x, (void *)c);
    CHECK(ts_numel(g, y) == n, "%s: %lld outputs, torch has %lld", c->label,
          (long long)ts_numel(g, y), (long long)n);
    ts_plan *p = NULL;
    CHECK_OK(ts_mark_output(g, y, "out"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p && ts_numel(g, y) == n) {
        double got[64] = {0};
        float gf[64] = {0};
        CHECK_OK(ts_plan_step(p));
        if (dt == TS_F64) {
            CHECK_OK(ts_plan_read(p, "out", got, (size_t)n * sizeof(double)));
        } else {
            CHECK_OK(ts_plan_read(p, "out", gf, (size_t)n * sizeof(float)));
            for (int64_t e = 0; e < n; e++) got[e] = gf[e];
        }
        double tol = dt == TS_F64 ? 1e-14 : 1e-6;
        int bad = 0;
        for (int64_t e = 0; e < n; e++)
            if (!(fabs(got[e] - want[e]) <= tol * (1 + fabs(want[e])))) {
                if (bad++ < 3)
                    fprintf(stderr, "%s %s: element %lld = %.12g, torch %.12g\n", c->label,
                            ts_dtype_name(dt), (long long)e, got[e], want[e]);
            }
        CHECK(bad == 0, "%s (%s): %d values differ from torch", c->label, ts_dtype_name(dt), bad);
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

static void torch_values(void) {
    /* clang-format off */
    static const struct {
        pl c;
        const double *want;
        int64_t n;
    } cases[] = {
        {{"torch max_pool2d",
          MAXP, 2, {1, 2, 5, 7}, {3, 2}, {2, 2}, {1, 1}, 0}, want_maxpool2d, 24},
        {{"torch avg_pool2d count_include_pad",
          AVG_PAD, 2, {1, 2, 5, 7}, {3, 2}, {2, 2}, {1, 1}, 0},
         want_avgpool2d_pad, 24},
        {{"torch avg_pool2d", AVG, 2, {1, 2, 5, 7}, {3, 2}, {2, 2}, {1, 1}, 0},
         want_avgpool2d_nopad, 24},
        {{"torch adaptive_avg_pool2d", ADAPTIVE, 2, {1, 2, 5, 7}, {3, 4}, {0}, {0}, 0},
         want_adaptive2d, 24},
        {{"torch max_pool3d", MAXP, 3, {1, 1, 4, 4, 4}, {2, 2, 2}, {0}, {0}, 1}, want_maxpool3d, 8},
        {{"torch adaptive_avg_pool1d", ADAPTIVE, 1, {1, 2, 7}, {3}, {0}, {0}, 0}, want_adaptive1d,
         6},
        {{"torch avg_pool1d count_include_pad", AVG_PAD, 1, {1, 2, 7}, {3}, {2}, {1}, 0},
         want_avgpool1d_pad, 8},
        {{"torch avg_pool1d", AVG, 1, {1, 2, 7}, {3}, {2}, {1}, 0}, want_avgpool1d_nopad, 8},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        torch_case(&cases[i].c, cases[i].want, cases[i].n, TS_F64);
        torch_case(&cases[i].c, cases[i].want, cases[i].n, TS_F32);
    }
}

/* ---- max pooling: ties and NaN ---------------------------------------------- */

/* y and dx of sum(max_pool(x) * 1) for x [1, 1, 2, 4], kernel 2. */
static void max_case(const double *x, double *y, double *dx) {
    ts_graph *g = ts_graph_new();
    int64_t d[4] = {1, 1, 2, 4};
    ts_val vx = ts_param(g, "x", TS_F64, 4, d, ts_init_buffer(x));
    ts_val vy = ts_max_pool(g, vx, 2, (int64_t[]){2, 2}, NULL, NULL);
    CHECK_OK(ts_mark_output(g, vy, "y"));
    ts_train_spec spec = ts_train_spec_default(ts_sum(g, vy, 0, NULL, 0));
    spec.opt.kind = TS_OPT_NONE;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (p) {
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, "y", y, 2 * sizeof(double)));
        CHECK_OK(ts_plan_read(p, "grad:x", dx, 8 * sizeof(double)));
        ts_plan_free(p);
    }
    ts_graph_free(g);
}

static void max_rules(void) {
    /* torch: x = [[[[1, 1, 5, 2], [1, 1, 5, 5]]]], F.max_pool2d(x, 2).sum().backward()
     * gives y = [1, 5] and x.grad = [[1, 0, 1, 0], [0, 0, 0, 0]]: ties go to
     * the first maximum in row-major order. */
    double x[8] = {1, 1, 5, 2, 1, 1, 5, 5}, y[2] = {0}, dx[8] = {0};
    max_case(x, y, dx);
    const double want_dx[8] = {1, 0, 1, 0, 0, 0, 0, 0};
    CHECK(y[0] == 1 && y[1] == 5, "max_pool ties: y = %g %g", y[0], y[1]);
    CHECK(!memcmp(dx, want_dx, sizeof dx), "max_pool ties: dx = %g %g %g %g %g %g %g %g", dx[0],
          dx[1], dx[2], dx[3], dx[4], dx[5], dx[6], dx[7]);
    /* A NaN in a window is its maximum (torch propagates it). */
    double xn[8] = {1, NAN, 5, 2, 3, 1, 5, 7};
    max_case(xn, y, dx);
    CHECK(isnan(y[0]) && y[1] == 7, "max_pool NaN: y = %g %g", y[0], y[1]);
    CHECK(dx[1] == 1 && dx[0] == 0 && dx[7] == 1, "max_pool NaN: gradient to the NaN");
}

/* ---- determinism ----------------------------------------------------------- */

/* Gradients through every pooling mode at 1 and 2 threads: same bits. */
static void determinism(void) {
    enum { N = 2, C = 8, S = 20 };
    static float x[N * C * S * S * S], grads[2][N * C * S * S * S];
    for (int i = 0; i < N * C * S * S * S; i++)
        x[i] = (float)sin(i * 0.013) + 0.1f * (float)cos(i * 0.7);
    for (int t = 0; t < 2; t++) {
        ts_graph *g = ts_graph_new();
        int64_t d[5] = {N, C, S, S, S};
        ts_val vx = ts_param(g, "x", TS_F32, 5, d, ts_init_buffer(x));
        pl pa = {"", MAXP, 3, {0}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, 0};
        pl pb = {"", AVG_PAD, 3, {0}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, 0};
        pl pc = {"", AVG, 3, {0}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, 0};
        ts_val a = build_pool(g, &vx, &pa), b = build_pool(g, &vx, &pb);
        ts_val c = build_pool(g, &vx, &pc);
        ts_val e = ts_adaptive_avg_pool(g, vx, 3, (int64_t[]){7, 6, 9});
        ts_val loss = ts_add(g,
                             ts_add(g, ts_sum(g, ts_mul(g, a, b), 0, NULL, 0),
                                    ts_sum(g, ts_mul(g, c, c), 0, NULL, 0)),
                             ts_sum(g, ts_mul(g, e, e), 0, NULL, 0));
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_compile_options o = ts_compile_options_default();
        o.threads = t + 1;
        ts_plan *pl = NULL;
        CHECK_OK(ts_compile(g, &spec, &o, &pl));
        if (pl) {
            CHECK_OK(ts_plan_step(pl));
            CHECK_OK(ts_plan_read(pl, "grad:x", grads[t], sizeof grads[t]));
            ts_plan_free(pl);
        }
        ts_graph_free(g);
    }
    CHECK(!memcmp(grads[0], grads[1], sizeof grads[0]),
          "pooling gradients differ between 1 and 2 threads");
}

/* Max and average pooling channels last against channels first (through
 * permutes) on a 3-d shape with overlapping, padded windows and ties: the
 * same maxima are picked, so the max output agrees bit for bit; the
 * average's backward adds overlapping windows' shares in another order, so
 * the gradient agrees to rounding. */
static void layouts_agree(void) {
    enum { N = 2, C = 20, S = 9 }; /* C > 16: two channel blocks in the backward */
    static float x[N * C * S * S * S], res[2][2][N * C * S * S * S];
    for (int i = 0; i < N * C * S * S * S; i++) x[i] = (float)((i * 7919) % 13) * 0.25f;
    int64_t d[5] = {N, C, S, S, S};
    for (int l = 0; l < 2; l++) {
        layout = l ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST;
        ts_graph *g = ts_graph_new();
        ts_val vx = ts_param(g, "x", TS_F32, 5, d, ts_init_buffer(x));
        pl mc = {"", MAXP, 3, {0}, {3, 2, 3}, {2, 1, 2}, {1, 1, 0}, 0};
        pl ac = {"", AVG_PAD, 3, {0}, {3, 2, 3}, {2, 1, 2}, {1, 1, 0}, 0};
        ts_val a = build_pool(g, &vx, &mc), b = build_pool(g, &vx, &ac);
        CHECK_OK(ts_mark_output(g, a, "a"));
        ts_val loss = ts_sum(g, ts_mul(g, ts_mul(g, a, a), b), 0, NULL, 0);
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_plan *pln = NULL;
        CHECK_OK(ts_compile(g, &spec, NULL, &pln));
        if (pln) {
            CHECK_OK(ts_plan_step(pln));
            int64_t na = ts_numel(g, a);
            CHECK_OK(ts_plan_read(pln, "a", res[l][0], (size_t)na * sizeof(float)));
            CHECK_OK(ts_plan_read(pln, "grad:x", res[l][1], sizeof res[l][1]));
            CHECK(!memcmp(res[0][0], res[l][0], (size_t)na * sizeof(float)),
                  "max pool output: channels last differs from channels first");
            ts_plan_free(pln);
        }
        ts_graph_free(g);
    }
    layout = TS_CHANNELS_FIRST;
    double mx = 0, worst = 0;
    for (int i = 0; i < N * C * S * S * S; i++) {
        mx = fmax(mx, fabs(res[0][1][i]));
        worst = fmax(worst, fabs((double)res[0][1][i] - res[1][1][i]));
    }
    CHECK(mx > 0 && worst <= 1e-6 * mx,
          "pooling gradient: channels last differs from channels first by %.3g (max %.3g)", worst,
          mx);
}

/* ---- errors ----------------------------------------------------------------- */

static void errors(void) {
    /* clang-format off */
    static const struct {
        const char *what, *needle;
        pl c;
        int xr;
    } cases[] = {
        {"kernel larger than the padded input", "kernel 5 is larger than the padded input 2 + 2*1",
         {"", MAXP, 2, {1, 1, 2, 5}, {5, 2}, {1, 1}, {1, 0}, 0}, 4},
        {"padding more than half the kernel", "padding 2 is more than half the kernel 3",
         {"", AVG, 1, {1, 1, 8}, {3}, {1}, {2}, 0}, 3},
        {"x of the wrong rank", "x must have rank 5",
         {"", MAXP, 3, {1, 4, 4, 4}, {2, 2, 2}, {0}, {0}, 1}, 4},
        {"spatial rank 0", "spatial rank must be 1, 2 or 3", {"", AVG, 0, {1, 4}, {2}, {0}, {0}, 1},
         2},
        {"stride 0", "stride 0", {"", MAXP, 1, {1, 1, 8}, {2}, {0}, {0}, 0}, 3},
        {"adaptive output size 0", "output size of spatial dim 1 must be >= 1",
         {"", ADAPTIVE, 2, {1, 1, 4, 4}, {2, 0}, {0}, {0}, 0}, 4},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, cases[i].xr, cases[i].c.x);
        ts_val y = build_pool(g, &x, (void *)&cases[i].c);
        const char *e = ts_graph_error(g);
        CHECK(!ts_val_ok(y), "%s must fail", cases[i].what);
        CHECK(strstr(e, "pool") && strstr(e, cases[i].needle), "%s: message '%s'", cases[i].what,
              e);
        ts_graph_free(g);
    }
}

int main(void) {
    gradchecks();
    torch_values();
    max_rules();
    determinism();
    layout = TS_CHANNELS_LAST;
    gradchecks();
    determinism();
    layout = TS_CHANNELS_FIRST;
    layouts_agree();
    errors();
    return check_summary("gradcheck_pool");
}
