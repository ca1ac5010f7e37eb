/* Gradient checks, forward values and error cases for the unary ops: neg,
 * exp, log, sqrt, rsqrt, abs, relu, sigmoid, tanh, pow_scalar, leaky_relu,
 * affine_scalar, gelu (erf and tanh), cast, and unary_bwd. */
#include <stdint.h>
#include <string.h>
#include "gradcheck.h"
#include "ops/op.h"

#define N_X 9
#define N_P 6
/* General inputs (both signs, zero, a tail) and positive ones (log, sqrt,
 * rsqrt, non-integer pow). */
static const double X[N_X] = {-6.0, -3.5, -1.2, -0.3, 0.0, 0.4, 1.1, 2.7, 9.0};
static const double P[N_P] = {1e-3, 0.25, 1.0, 2.0, 7.5, 1e4};

/* ---- helpers ----------------------------------------------------------- */

/* The builder failed with TS_NONE and the message mentions want1 (and want2). */
static void expect_error(ts_graph *g, ts_val v, const char *what, const char *want1,
                         const char *want2) {
    const char *msg = ts_graph_error(g);
    CHECK(!ts_val_ok(v) && ts_graph_status(g) != TS_OK, "%s: expected a builder error", what);
    CHECK(strstr(msg, want1) != NULL, "%s: message '%s' lacks '%s'", what, msg, want1);
    if (want2) CHECK(strstr(msg, want2) != NULL, "%s: message '%s' lacks '%s'", what, msg, want2);
}

/* |got - want| <= rtol |want| + atol, with infinities compared exactly. */
static void expect_near(const char *what, int i, double got, double want, double rtol,
                        double atol) {
    int ok = isinf(want) ? got == want : fabs(got - want) <= rtol * fabs(want) + atol;
    CHECK(ok, "%s[%d] = %.17g, expected %.17g (rtol %g, atol %g)", what, i, got, want, rtol, atol);
}
static void expect_close(const char *what, int i, double got, double want, double rtol) {
    expect_near(what, i, got, want, rtol, 1e-300);
}

typedef ts_val (*un_fn)(ts_graph *g, ts_val a);

/* Run y = f(x) for x of dtype dt (values from src, doubles) in an inference
 * plan and return y as doubles. */
static int run_unary(un_fn f, ts_dtype dt, int n, const double *src, double *dst) {
    ts_graph *g = ts_graph_new();
    int64_t dims[1] = {n};
    float xf[16], yf[16];
    double yd[16];
    ts_plan *p = NULL;
    int ok = 0;
    for (int i = 0; i < n; i++) xf[i] = (float)src[i];
    ts_val x = ts_input(g, "x", dt, 1, dims);
    ts_val y = f(g, x);
    size_t es = dt == TS_F32 ? 4 : 8;
    if (ts_mark_output(g, y, "y") != TS_OK) goto done;
    if (ts_compile(g, NULL, NULL, &p) != TS_OK) goto done;
    if (ts_plan_set_input(p, "x", dt == TS_F32 ? (const void *)xf : (const void *)src,
                          (size_t)n * es) != TS_OK)
        goto done;
    if (ts_plan_step(p) != TS_OK) goto done;
    if (ts_plan_read(p, "y", dt == TS_F32 ? (void *)yf : (void *)yd, (size_t)n * es) != TS_OK)
        goto done;
    for (int i = 0; i < n; i++) dst[i] = dt == TS_F32 ? yf[i] : yd[i];
    ok = 1;
done:
    CHECK(ok, "forward run failed: %s", ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    return ok;
}

/* d/dx sum(f(x)) at x = src via a gradients-only training plan. */
static int run_grad(un_fn f, ts_dtype dt, int n, const double *src, double *dst) {
    ts_graph *g = ts_graph_new();
    int64_t dims[1] = {n};
    float xf[16], gf[16];
    double gd[16];
    ts_plan *p = NULL;
    int ok = 0;
    for (int i = 0; i < n; i++) xf[i] = (float)src[i];
    ts_val x = ts_param(g, "x", dt, 1, dims,
                        ts_init_buffer(dt == TS_F32 ? (const void *)xf : (const void *)src));
    ts_val loss = ts_sum(g, f(g, x), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    size_t es = dt == TS_F32 ? 4 : 8;
    if (ts_compile(g, &spec, NULL, &p) != TS_OK) goto done;
    if (ts_plan_step(p) != TS_OK) goto done;
    if (ts_plan_read(p, "grad:x", dt == TS_F32 ? (void *)gf : (void *)gd, (size_t)n * es) != TS_OK)
        goto done;
    for (int i = 0; i < n; i++) dst[i] = dt == TS_F32 ? gf[i] : gd[i];
    ok = 1;
done:
    CHECK(ok, "gradient run failed: %s", ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    return ok;
}

/* ---- builders ---------------------------------------------------------- */

static ts_val f_exp(ts_graph *g, ts_val a) {
    return ts_exp(g, a);
}
static ts_val f_log(ts_graph *g, ts_val a) {
    return ts_log(g, a);
}
static ts_val f_sqrt(ts_graph *g, ts_val a) {
    return ts_sqrt(g, a);
}
static ts_val f_rsqrt(ts_graph *g, ts_val a) {
    return ts_rsqrt(g, a);
}
static ts_val f_abs(ts_graph *g, ts_val a) {
    return ts_abs(g, a);
}
static ts_val f_relu(ts_graph *g, ts_val a) {
    return ts_relu(g, a);
}
static ts_val f_sigmoid(ts_graph *g, ts_val a) {
    return ts_sigmoid(g, a);
}
static ts_val f_tanh(ts_graph *g, ts_val a) {
    return ts_tanh(g, a);
}
static ts_val f_leaky(ts_graph *g, ts_val a) {
    return ts_leaky_relu(g, a, 0.1);
}
static ts_val f_affine(ts_graph *g, ts_val a) {
    return ts_affine_scalar(g, a, 2.5, -1.0);
}
static ts_val f_gelu_erf(ts_graph *g, ts_val a) {
    return ts_gelu(g, a, TS_GELU_ERF);
}
static ts_val f_gelu_tanh(ts_graph *g, ts_val a) {
    return ts_gelu(g, a, TS_GELU_TANH);
}
/* The GELU of -(-x) seen as [1, n]: a computed value, whose gradient flows through a reshape
 * (which no elementwise group takes in), so the GELU backward stays a unary_bwd that the
 * gelu_grad pass rewrites. */
static ts_val gelu_node(ts_graph *g, ts_val a, ts_gelu_approx approx) {
    ts_val v = ts_reshape(g, ts_neg(g, ts_neg(g, a)), 2, (const int64_t[]){1, ts_numel(g, a)});
    return ts_gelu(g, v, approx);
}
static ts_val f_gelu_erf_node(ts_graph *g, ts_val a) {
    return gelu_node(g, a, TS_GELU_ERF);
}
static ts_val f_gelu_tanh_node(ts_graph *g, ts_val a) {
    return gelu_node(g, a, TS_GELU_TANH);
}
static ts_val f_pow17(ts_graph *g, ts_val a) {
    return ts_pow_scalar(g, a, 1.7);
}
static ts_val f_pow_m13(ts_graph *g, ts_val a) {
    return ts_pow_scalar(g, a, -1.3);
}
static ts_val f_pow2(ts_graph *g, ts_val a) {
    return ts_pow_scalar(g, a, 2.0);
}
static ts_val f_pow05(ts_graph *g, ts_val a) {
    return ts_pow_scalar(g, a, 0.5);
}

typedef struct un_arg {
    int op; /* 0 neg, 1 exp, ... (see b_unary) */
    double a, b;
} un_arg;

enum { NEG, EXP, LOG, SQRT, RSQRT, ABS, RELU, SIGMOID, TANH, POW, LEAKY, AFFINE, GELU_E, GELU_T };

static ts_val apply(ts_graph *g, ts_val x, const un_arg *u) {
    switch (u->op) {
    case NEG: return ts_neg(g, x);
    case EXP: return ts_exp(g, x);
    case LOG: return ts_log(g, x);
    case SQRT: return ts_sqrt(g, x);
    case RSQRT: return ts_rsqrt(g, x);
    case ABS: return ts_abs(g, x);
    case RELU: return ts_relu(g, x);
    case SIGMOID: return ts_sigmoid(g, x);
    case TANH: return ts_tanh(g, x);
    case POW: return ts_pow_scalar(g, x, u->a);
    case LEAKY: return ts_leaky_relu(g, x, u->a);
    case AFFINE: return ts_affine_scalar(g, x, u->a, u->b);
    case GELU_E: return ts_gelu(g, x, TS_GELU_ERF);
    default: return ts_gelu(g, x, TS_GELU_TANH);
    }
}

static ts_val b_unary(ts_graph *g, const ts_val *in, void *u) {
    return apply(g, in[0], u);
}

/* op(x) * w: the upstream gradient is not all ones, and broadcasting w
 * over x's shape makes the backward op run on a broadcast product. */
static ts_val b_unary_mul(ts_graph *g, const ts_val *in, void *u) {
    return ts_mul(g, apply(g, in[0], u), in[1]);
}

/* Two unary ops in a row: the second one's backward feeds the first's. */
static ts_val b_chain(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_tanh(g, ts_gelu(g, ts_affine_scalar(g, ts_exp(g, in[0]), 0.5, -0.25), TS_GELU_TANH));
}

/* sigmoid(x) used twice (the output is saved for backward and also read
 * by another consumer). */
static ts_val b_shared(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val s = ts_sigmoid(g, in[0]);
    return ts_mul(g, s, ts_sqrt(g, ts_affine_scalar(g, s, 1.0, 1.0)));
}

/* x -> f64 -> pow 3 -> back to x's dtype: in the f64 check both casts are
 * the value itself; the f32 forward check runs f32 -> f64 -> f32. (A real
 * f64 -> f32 -> f64 round trip would swallow the finite-difference step;
 * the float cast's gradient is checked exactly in cast_checks.) */
static ts_val b_cast_round(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val y = ts_pow_scalar(g, ts_cast(g, in[0], TS_F64), 3.0);
    return ts_cast(g, y, ts_dtype_of(g, in[0]));
}

/* ---- gradient checks -------------------------------------------------- */

/* Inputs clear of the kink at 0 for relu, abs, leaky_relu (|x| >= 0.1). */
static const double KINK[12] = {-1.3, 0.7,  -0.1, 0.25, 2.2,  -0.45,
                                0.1,  -2.9, 0.55, -0.8, 0.15, 1.05};

static gc_input ranged(gc_input in, double lo, double hi) {
    in.lo = lo;
    in.hi = hi;
    return in;
}
static gc_input fixed(gc_input in, const double *data) {
    in.data = data;
    return in;
}

static void grad_checks(void) {
    struct {
        const char *label;
        un_arg u;
        double lo, hi;
        const double *data;
    } cases[] = {
        {"neg", {NEG, 0, 0}, -2, 2, NULL},
        {"exp", {EXP, 0, 0}, -3, 3, NULL},
        {"log", {LOG, 0, 0}, 0.2, 4, NULL},
        {"sqrt", {SQRT, 0, 0}, 0.2, 4, NULL},
        {"rsqrt", {RSQRT, 0, 0}, 0.2, 4, NULL},
        {"abs", {ABS, 0, 0}, 0, 0, KINK},
        {"relu", {RELU, 0, 0}, 0, 0, KINK},
        {"sigmoid", {SIGMOID, 0, 0}, -5, 5, NULL},
        {"sigmoid tails", {SIGMOID, 0, 0}, -30, 30, NULL},
        {"tanh", {TANH, 0, 0}, -3, 3, NULL},
        {"pow 2", {POW, 2, 0}, -2, 2, NULL},
        {"pow 3", {POW, 3, 0}, -2, 2, NULL},
        {"pow 1", {POW, 1, 0}, -2, 2, NULL},
        {"pow 0", {POW, 0, 0}, 0.5, 2, NULL},
        {"pow 0.5", {POW, 0.5, 0}, 0.3, 3, NULL},
        {"pow -0.5", {POW, -0.5, 0}, 0.3, 3, NULL},
        {"pow -1", {POW, -1, 0}, 0.3, 3, NULL},
        {"pow -2", {POW, -2, 0}, 0.3, 3, NULL},
        {"pow 1.7", {POW, 1.7, 0}, 0.3, 3, NULL},
        {"pow -1.3", {POW, -1.3, 0}, 0.3, 3, NULL},
        {"leaky_relu 0.1", {LEAKY, 0.1, 0}, 0, 0, KINK},
        {"leaky_relu -0.3", {LEAKY, -0.3, 0}, 0, 0, KINK},
        {"affine 2.5x-1", {AFFINE, 2.5, -1}, -2, 2, NULL},
        {"affine x+3", {AFFINE, 1, 3}, -2, 2, NULL},
        {"gelu erf", {GELU_E, 0, 0}, -4, 4, NULL},
        {"gelu erf tails", {GELU_E, 0, 0}, -9, 9, NULL},
        {"gelu tanh", {GELU_T, 0, 0}, -4, 4, NULL},
        {"gelu tanh tails", {GELU_T, 0, 0}, -9, 9, NULL},
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    char label[96];
    for (int c = 0; c < nc; c++) {
        gc_input in[2];
        if (cases[c].data) {
            in[0] = fixed(GC_F(3, 4), cases[c].data);
        } else {
            in[0] = ranged(GC_F(3, 4), cases[c].lo, cases[c].hi);
        }
        gc_check(cases[c].label, 1, in, b_unary, &cases[c].u);
        /* a non-uniform upstream gradient, broadcast [3,4] * [4] */
        in[1] = GC_F(4);
        snprintf(label, sizeof label, "%s * w[4]", cases[c].label);
        gc_check(label, 2, in, b_unary_mul, &cases[c].u);
    }
    /* rank 0 and size-1 dims */
    {
        un_arg u = {GELU_E, 0, 0};
        gc_input in[1] = {ranged(GC_SCALAR, -2, 2)};
        gc_check("gelu erf rank 0", 1, in, b_unary, &u);
    }
    {
        un_arg u = {RSQRT, 0, 0};
        gc_input in[1] = {ranged(GC_SCALAR, 0.5, 2)};
        gc_check("rsqrt rank 0", 1, in, b_unary, &u);
    }
    {
        un_arg u = {TANH, 0, 0};
        gc_input in[2] = {GC_F(1, 1, 3), GC_F(2, 1, 1)};
        gc_check("tanh [1,1,3] * [2,1,1]", 2, in, b_unary_mul, &u);
    }
    {
        un_arg u = {LOG, 0, 0};
        gc_input in[2] = {ranged(GC_F(1), 0.5, 2), GC_F(4, 3)};
        gc_check("log [1] * [4,3]", 2, in, b_unary_mul, &u);
    }
    /* more than one chunk of the parallel kernels (4096 elements). The
     * loss sums 9000 terms, so its f64 rounding (~1e-12) over 2h = 2e-6
     * limits the central difference to ~1e-6: compare at 1e-5. */
    {
        gc_options o = {.tol = 1e-5};
        un_arg ug = {GELU_T, 0, 0}, us = {SIGMOID, 0, 0};
        gc_input in[1] = {ranged(GC_F(3, 3000), -4, 4)};
        gc_check_opt("gelu tanh [3,3000]", 1, in, b_unary, &ug, &o);
        gc_check_opt("sigmoid [3,3000]", 1, in, b_unary, &us, &o);
    }
    {
        gc_input in[1] = {ranged(GC_F(2, 5), -1, 1)};
        gc_check("exp -> affine -> gelu -> tanh chain", 1, in, b_chain, NULL);
        gc_check("sigmoid output shared", 1, in, b_shared, NULL);
        gc_check("cast round trip", 1, in, b_cast_round, NULL);
    }
}

/* ---- forward and gradient values against PyTorch ---------------------- */

/* Reference values printed by torch 1.13 in float64, e.g.
 *   X = torch.tensor([-6.0, -3.5, -1.2, -0.3, 0.0, 0.4, 1.1, 2.7, 9.0], dtype=torch.float64)
 *   F.gelu(X); F.gelu(X, approximate='tanh'); X.sigmoid(); ...
 *   v = X.clone().requires_grad_(); F.gelu(v).sum().backward(); v.grad
 * (P = [1e-3, 0.25, 1, 2, 7.5, 1e4] for log, sqrt, rsqrt and pow 1.7).
 * f32 results are compared with the f64 reference at 2e-6 relative: our f32
 * kernels are accurate to a few ulp even where torch's own f32 GELU is not
 * (torch's f32 erf GELU returns 0 at x = -6, true value -5.9e-9). In f64
 * torch's GELU tails cancel in 1 + erf / 1 + tanh (ours do not), so f64
 * compares at 1e-12 relative + 1e-15; the tails are checked separately against
 * 40-digit mpmath values. Gradients computed from a saved output (sigmoid,
 * tanh: 1 - y^2 near |y| = 1) carry an absolute error of a few ulp(1), as
 * torch's do, hence atol 2e-7 (f32) and 1e-15 (f64) for gradients. */
typedef struct ref_case {
    const char *name;
    un_fn f;
    int positive; /* inputs P instead of X */
    double y[N_X];
    double dy[N_X];
} ref_case;

static const ref_case REFS[] = {
    {"exp",
     f_exp,
     0,
     {0.0024787521766663585, 0.030197383422318501, 0.30119421191220214, 0.74081822068171788, 1,
      1.4918246976412703, 3.0041660239464334, 14.879731724872837, 8103.0839275753842},
     {0.0024787521766663585, 0.030197383422318501, 0.30119421191220214, 0.74081822068171788, 1,
      1.4918246976412703, 3.0041660239464334, 14.879731724872837, 8103.0839275753842}},
    {"sigmoid",
     f_sigmoid,
     0,
     {0.0024726231566347743, 0.029312230751356319, 0.23147521650098238, 0.42555748318834102, 0.5,
      0.59868766011245211, 0.75026010559511769, 0.9370266439430035, 0.99987660542401369},
     {0.002466509291360048, 0.02845302387973556, 0.17789444064680571, 0.24445831169074586, 0.25,
      0.24026074574152914, 0.18736987954752055, 0.059007712483915238, 0.00012337934976493025}},
    {"tanh",
     f_tanh,
     0,
     {-0.99998771165079559, -0.99817789761119868, -0.83365460701215521, -0.2913126124515909, 0,
      0.3799489622552249, 0.8004990217606297, 0.9910074536781176, 0.999999969540041},
     {2.4576547405302974e-05, 0.0036408847204873578, 0.30501999620740905, 0.91513696182662918, 1,
      0.85563878608117772, 0.3592013161602749, 0.0179042267544136, 6.0919917071249165e-08}},
    {"gelu erf",
     f_gelu_erf,
     0,
     {-5.9195258694799691e-09, -0.00081420177662439031, -0.13808360426604993, -0.11462657334331421,
      0, 0.26216869664412967, 0.95076733295897908, 2.6906391707317905, 9},
     {-3.546870945402639e-08, -0.0028217603536246205, -0.11795359575814726, 0.26767223317289013,
      0.5, 0.80272979773165354, 1.103971333789423, 1.0246695501959004, 1}},
    {"gelu tanh",
     f_gelu_tanh,
     0,
     {-8.43964897967453e-11, -0.00061619765537374027, -0.13829723086213513, -0.11462907645724074, 0,
      0.26216116942735618, 0.95058104617451089, 2.6911124053605326, 9},
     {-7.7099760128363292e-10, -0.0024226437601167334, -0.11772613473311264, 0.26770454836119817,
      0.5, 0.80265883442056141, 1.1036594625691472, 1.0246678654351904, 1}},
    {"leaky_relu 0.1",
     f_leaky,
     0,
     {-0.6, -0.35, -0.12, -0.03, 0, 0.4, 1.1, 2.7, 9},
     {0.1, 0.1, 0.1, 0.1, 0.1, 1, 1, 1, 1}}, /* slope at 0, as torch */
    {"affine 2.5x-1",
     f_affine,
     0,
     {-16, -9.75, -4, -1.75, -1, 0, 1.75, 5.75, 21.5},
     {2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5}},
    {"relu", f_relu, 0, {0, 0, 0, 0, 0, 0.4, 1.1, 2.7, 9}, {0, 0, 0, 0, 0, 1, 1, 1, 1}},
    {"abs", f_abs, 0, {6, 3.5, 1.2, 0.3, 0, 0.4, 1.1, 2.7, 9}, {-1, -1, -1, -1, 0, 1, 1, 1, 1}},
    {"pow 2",
     f_pow2,
     0,
     {36, 12.25, 1.44, 0.09, 0, 0.16, 1.21, 7.29, 81},
     {-12, -7, -2.4, -0.6, 0, 0.8, 2.2, 5.4, 18}},
    {"log",
     f_log,
     1,
     {-6.9077552789821368, -1.3862943611198906, 0, 0.69314718055994529, 2.0149030205422647,
      9.2103403719761836},
     {1000, 4, 1, 0.5, 0.13333333333333333, 0.0001}},
    {"sqrt",
     f_sqrt,
     1,
     {0.031622776601683791, 0.5, 1, 1.4142135623730951, 2.7386127875258306, 100},
     {15.811388300841898, 1, 0.5, 0.35355339059327373, 0.18257418583505536, 0.005}},
    {"rsqrt",
     f_rsqrt,
     1,
     {31.622776601683796, 2, 1, 0.70710678118654746, 0.36514837167011072, 0.01},
     {-15811.388300841902, -4, -0.5, -0.17677669529663684, -0.024343224778007377,
      -5.0000000000000008e-07}},
    {"pow 1.7",
     f_pow17,
     1,
     {7.9432823472428184e-06, 0.094732285406899888, 1, 3.2490095854249419, 30.732942808190316,
      6309573.4448019303},
     {0.013503579990312788, 0.64417954076691919, 1.7, 2.7616581476112003, 6.9661337031898052,
      1072.6274856163282}},
    {"pow -1.3",
     f_pow_m13,
     1,
     {7943.2823472428172, 6.0628662660415928, 1, 0.40612619817811774, 0.072848457026821495,
      6.3095734448019296e-06},
     {0}}, /* gradient covered by gc_check */
};

static void value_checks(void) {
    int nr = (int)(sizeof REFS / sizeof REFS[0]);
    char what[96];
    for (int r = 0; r < nr; r++) {
        const ref_case *c = &REFS[r];
        int n = c->positive ? N_P : N_X;
        const double *src = c->positive ? P : X;
        double got[N_X];
        for (int d = 0; d < 2; d++) {
            ts_dtype dt = d ? TS_F64 : TS_F32;
            double rtol = d ? 1e-12 : 2e-6, atol = d ? 1e-15 : 2e-7;
            snprintf(what, sizeof what, "%s %s", c->name, ts_dtype_name(dt));
            if (run_unary(c->f, dt, n, src, got))
                for (int i = 0; i < n; i++)
                    expect_near(what, i, got[i], c->y[i], rtol, d ? 1e-15 : 1e-300);
            if (c->dy[0] == 0 && c->dy[1] == 0 && c->dy[n - 1] == 0) continue;
            snprintf(what, sizeof what, "grad %s %s", c->name, ts_dtype_name(dt));
            if (run_grad(c->f, dt, n, src, got))
                for (int i = 0; i < n; i++) expect_near(what, i, got[i], c->dy[i], rtol, atol);
        }
    }
    /* GELU tails against mpmath (40 digits), e.g.
     *   x = mpf(-6); 0.5*x*(1 + erf(x/sqrt(2)))
     *   u = sqrt(2/pi)*(x + mpf('0.044715')*x**3); 0.5*x*(1 + tanh(u)) */
    {
        static const double tx[2] = {-6.0, -3.5};
        static const double want[4][2] = {
            {-5.9195258702261888442e-9, -0.00081420177662433762722},  /* erf */
            {-8.4396467007622970837e-11, -0.00061619765537366330893}, /* tanh */
            {-3.5468709453902014781e-8, -0.0028217603536246351933},   /* d erf */
            {-7.7099739309536955117e-10, -0.0024226437601164310328}}; /* d tanh */
        double got[2];
        for (int d = 0; d < 2; d++) {
            ts_dtype dt = d ? TS_F64 : TS_F32;
            double rtol = d ? 1e-14 : 2e-6;
            if (run_unary(f_gelu_erf, dt, 2, tx, got))
                for (int i = 0; i < 2; i++)
                    expect_close("gelu erf tail", i, got[i], want[0][i], rtol);
            if (run_unary(f_gelu_tanh, dt, 2, tx, got))
                for (int i = 0; i < 2; i++)
                    expect_close("gelu tanh tail", i, got[i], want[1][i], rtol);
            if (run_grad(f_gelu_erf, dt, 2, tx, got))
                for (int i = 0; i < 2; i++)
                    expect_close("gelu erf grad tail", i, got[i], want[2][i], rtol);
            if (run_grad(f_gelu_tanh, dt, 2, tx, got))
                for (int i = 0; i < 2; i++)
                    expect_close("gelu tanh grad tail", i, got[i], want[3][i], rtol);
        }
    }
    /* The f32 gradients above through a gelu of a computed value (-(-x), exact), which the
     * gelu_grad pass rewrites (the gelu writes gelu'(x), the backward multiplies by it;
     * passes/gelu_grad.c): the same bits as the gelu of the parameter, which it leaves alone. */
    {
        static const double tx[10] = {-6.0, -3.5, -1e30, -200, -90, -20, 20, 90, 200, 1e30};
        double got[10], ref[10];
        static const un_fn plain[2] = {f_gelu_erf, f_gelu_tanh};
        static const un_fn node[2] = {f_gelu_erf_node, f_gelu_tanh_node};
        for (int k = 0; k < 2; k++)
            if (run_grad(plain[k], TS_F32, 10, tx, ref) && run_grad(node[k], TS_F32, 10, tx, got))
                for (int i = 0; i < 10; i++)
                    CHECK(memcmp(&got[i], &ref[i], sizeof got[i]) == 0,
                          "gelu %s f32 grad of a computed value at %g: %.9g, of the parameter %.9g",
                          k ? "tanh" : "erf", tx[i], got[i], ref[i]);
    }
    /* torch: x.pow(0.5) has gradient inf at 0 (0.5 * 0^-0.5) */
    {
        double x[3] = {0.0, 0.25, 4.0}, g[3];
        if (run_grad(f_pow05, TS_F64, 3, x, g)) {
            CHECK(isinf(g[0]) && g[0] > 0, "pow 0.5 gradient at 0 = %g, expected inf", g[0]);
            expect_close("pow 0.5 grad", 1, g[1], 1.0, 1e-15);
            expect_close("pow 0.5 grad", 2, g[2], 0.25, 1e-15);
        }
    }
    /* extremes: no NaN from overflow, saturation to exact limits */
    {
        double x[8] = {-1e30, -200, -90, -20, 20, 90, 200, 1e30}, y[8];
        if (run_unary(f_sigmoid, TS_F32, 8, x, y)) {
            CHECK(y[0] == 0 && y[7] == 1 && y[3] > 0 && y[3] < 3e-9, "sigmoid f32 extremes");
            for (int i = 0; i < 8; i++) CHECK(!isnan(y[i]), "sigmoid f32 NaN at %g", x[i]);
        }
        if (run_unary(f_tanh, TS_F32, 8, x, y)) {
            CHECK(y[0] == -1 && y[7] == 1 && y[2] == -1, "tanh f32 extremes");
        }
        if (run_unary(f_gelu_tanh, TS_F32, 8, x, y)) {
            CHECK(y[0] == 0 && y[7] == 1e30f && y[6] == 200 && y[1] == 0, "gelu tanh f32 extremes");
        }
        if (run_unary(f_gelu_erf, TS_F32, 8, x, y)) {
            CHECK(y[0] == 0 && y[7] == 1e30f && y[6] == 200 && y[1] == 0, "gelu erf f32 extremes");
        }
        if (run_grad(f_gelu_tanh, TS_F32, 8, x, y)) {
            for (int i = 0; i < 8; i++)
                CHECK(y[i] == (x[i] > 0 ? 1.0 : 0.0) || fabs(x[i]) < 100,
                      "gelu tanh f32 grad at %g = %g", x[i], y[i]);
            for (int i = 0; i < 8; i++) CHECK(!isnan(y[i]), "gelu tanh grad NaN at %g", x[i]);
        }
        if (run_grad(f_gelu_erf, TS_F64, 8, x, y))
            for (int i = 0; i < 8; i++) CHECK(!isnan(y[i]), "gelu erf f64 grad NaN at %g", x[i]);
        double e[4] = {-110, -100, 88, 89}, ey[4];
        if (run_unary(f_exp, TS_F32, 4, e, ey)) {
            CHECK(ey[0] == 0 && ey[1] > 0 && ey[1] < 1e-43, "exp f32 subnormal range: %g %g", ey[0],
                  ey[1]);
            expect_close("exp f32 near overflow", 2, ey[2], 1.6516362549940018e38, 2e-6);
            CHECK(isinf(ey[3]), "exp(89) f32 = %g, expected inf", ey[3]);
        }
        double l[4] = {0, -1, 1e-40, INFINITY}, ly[4];
        if (run_unary(f_log, TS_F32, 4, l, ly)) {
            CHECK(isinf(ly[0]) && ly[0] < 0, "log(0) = %g", ly[0]);
            CHECK(isnan(ly[1]), "log(-1) = %g", ly[1]);
            expect_close("log f32 subnormal", 2, ly[2], log((double)1e-40f), 2e-6);
            CHECK(isinf(ly[3]) && ly[3] > 0, "log(inf) = %g", ly[3]);
        }
    }
}

/* unary_bwd from x must equal unary_bwd from y for the ops that accept
 * both (a memory pass may choose either). */
static void bwd_side_checks(void) {
    static const int ops[] = {TS_OP_EXP,     TS_OP_SQRT, TS_OP_RSQRT,
                              TS_OP_SIGMOID, TS_OP_TANH, TS_OP_RELU};
    static const un_fn fwd[] = {f_exp, f_sqrt, f_rsqrt, f_sigmoid, f_tanh, f_relu};
    double x[N_P] = {0.3, 1.7, 0.05, 2.2, 0.9, 3.1};
    double d[N_P] = {1.5, -0.5, 2.0, 0.25, -1.0, 0.75};
    for (int k = 0; k < 6; k++) {
        for (int dtk = 0; dtk < 2; dtk++) {
            ts_dtype dt = dtk ? TS_F64 : TS_F32;
            ts_graph *g = ts_graph_new();
            int64_t dims[1] = {N_P};
            ts_val xv = ts_input(g, "x", dt, 1, dims), dv = ts_input(g, "d", dt, 1, dims);
            ts_val y = fwd[k](g, xv);
            ts_attrs a = ts_attrs_zero();
            a.unary_bwd.fwd_op = ops[k];
            ts_val in0[2] = {dv, xv}, in1[2] = {dv, y};
            a.unary_bwd.side = 0;
            ts_val gx = ts_node_add(g, TS_OP_UNARY_BWD, 2, in0, &a, NULL);
            a.unary_bwd.side = 1;
            ts_val gy = ts_node_add(g, TS_OP_UNARY_BWD, 2, in1, &a, NULL);
            ts_plan *p = NULL;
            double rx[N_P], ry[N_P];
            float fx[N_P], fd[N_P], ox[N_P], oy[N_P];
            for (int i = 0; i < N_P; i++) fx[i] = (float)x[i], fd[i] = (float)d[i];
            size_t bytes = N_P * (dtk ? 8 : 4);
            int ok = ts_mark_output(g, gx, "gx") == TS_OK && ts_mark_output(g, gy, "gy") == TS_OK &&
                     ts_compile(g, NULL, NULL, &p) == TS_OK &&
                     ts_plan_set_input(p, "x", dtk ? (void *)x : (void *)fx, bytes) == TS_OK &&
                     ts_plan_set_input(p, "d", dtk ? (void *)d : (void *)fd, bytes) == TS_OK &&
                     ts_plan_step(p) == TS_OK &&
                     ts_plan_read(p, "gx", dtk ? (void *)rx : (void *)ox, bytes) == TS_OK &&
                     ts_plan_read(p, "gy", dtk ? (void *)ry : (void *)oy, bytes) == TS_OK;
            CHECK(ok, "unary_bwd x/y plan for op %d: %s", ops[k], ts_last_error());
            if (ok) {
                char what[64];
                snprintf(what, sizeof what, "unary_bwd x vs y, op %d %s", ops[k],
                         ts_dtype_name(dt));
                for (int i = 0; i < N_P; i++) {
                    double vx = dtk ? rx[i] : ox[i], vy = dtk ? ry[i] : oy[i];
                    expect_close(what, i, vx, vy, dtk ? 1e-14 : 2e-6);
                }
            }
            ts_plan_free(p);
            ts_graph_free(g);
        }
    }
}

/* ---- cast -------------------------------------------------------------- */

static int run_cast(ts_dtype from, ts_dtype to, int n, const void *src, void *dst) {
    ts_graph *g = ts_graph_new();
    int64_t dims[1] = {n};
    ts_plan *p = NULL;
    ts_val x = ts_input(g, "x", from, 1, dims);
    ts_val y = ts_cast(g, x, to);
    int ok = ts_mark_output(g, y, "y") == TS_OK && ts_compile(g, NULL, NULL, &p) == TS_OK &&
             ts_plan_set_input(p, "x", src, (size_t)n * ts_dtype_size(from)) == TS_OK &&
             ts_plan_step(p) == TS_OK &&
             ts_plan_read(p, "y", dst, (size_t)n * ts_dtype_size(to)) == TS_OK;
    CHECK(ok, "cast %s -> %s failed: %s", ts_dtype_name(from), ts_dtype_name(to), ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    return ok;
}

static void cast_checks(void) {
    /* torch: c.to(torch.int32 / torch.uint8 / torch.int64). In range it
     * truncates toward zero; out of range (1e10 -> i32) and NaN torch
     * returns x86's INT_MIN, we saturate and give 0. */
    float c[7] = {-1.7f, 2.9f, 300.5f, -0.0f, 1e10f, NAN, -300.2f};
    int32_t i32[7];
    uint8_t u8[7];
    int64_t i64[7];
    if (run_cast(TS_F32, TS_I32, 7, c, i32)) {
        int32_t want[7] = {-1, 2, 300, 0, INT32_MAX, 0, -300};
        for (int i = 0; i < 7; i++) CHECK(i32[i] == want[i], "f32->i32[%d] = %d", i, i32[i]);
    }
    if (run_cast(TS_F32, TS_U8, 7, c, u8)) {
        uint8_t want[7] = {255, 2, 44, 0, 0, 0, 212}; /* torch: [255, 2, 44, 0, 0, 0, 212] */
        for (int i = 0; i < 7; i++) CHECK(u8[i] == want[i], "f32->u8[%d] = %d", i, u8[i]);
    }
    if (run_cast(TS_F32, TS_I64, 7, c, i64)) {
        int64_t want[7] = {-1, 2, 300, 0, 10000000000LL, 0, -300};
        for (int i = 0; i < 7; i++)
            CHECK(i64[i] == want[i], "f32->i64[%d] = %lld", i, (long long)i64[i]);
    }
    /* torch: i.to(torch.int32) = [1, -1, 255, 256, -129], .to(uint8) = [1, 255, 255, 0, 127] */
    int64_t iv[5] = {4294967297LL, -1, 255, 256, -129};
    if (run_cast(TS_I64, TS_I32, 5, iv, i32)) {
        int32_t want[5] = {1, -1, 255, 256, -129};
        for (int i = 0; i < 5; i++) CHECK(i32[i] == want[i], "i64->i32[%d] = %d", i, i32[i]);
    }
    if (run_cast(TS_I64, TS_U8, 5, iv, u8)) {
        uint8_t want[5] = {1, 255, 255, 0, 127};
        for (int i = 0; i < 5; i++) CHECK(u8[i] == want[i], "i64->u8[%d] = %d", i, u8[i]);
    }
    float f[5];
    double dd[5];
    if (run_cast(TS_I64, TS_F32, 5, iv, f)) {
        float want[5] = {4294967296.0f, -1, 255, 256, -129};
        for (int i = 0; i < 5; i++) CHECK(f[i] == want[i], "i64->f32[%d] = %g", i, f[i]);
    }
    uint8_t ub[4] = {0, 1, 200, 255};
    if (run_cast(TS_U8, TS_F64, 4, ub, dd))
        for (int i = 0; i < 4; i++) CHECK(dd[i] == ub[i], "u8->f64[%d] = %g", i, dd[i]);
    int32_t iw[3] = {-7, 0, 2147483647};
    if (run_cast(TS_I32, TS_F64, 3, iw, dd))
        for (int i = 0; i < 3; i++) CHECK(dd[i] == iw[i], "i32->f64[%d] = %g", i, dd[i]);
    double dv[4] = {0.1, -2.5e300, 1e-50, 3.999999999}, back[4];
    float fv[4];
    if (run_cast(TS_F64, TS_F32, 4, dv, fv))
        for (int i = 0; i < 4; i++) CHECK(fv[i] == (float)dv[i], "f64->f32[%d] = %g", i, fv[i]);
    if (run_cast(TS_F64, TS_I32, 4, dv, i32)) {
        int32_t want[4] = {0, INT32_MIN, 0, 3};
        for (int i = 0; i < 4; i++) CHECK(i32[i] == want[i], "f64->i32[%d] = %d", i, i32[i]);
    }
    if (run_cast(TS_F32, TS_F64, 4, fv, back))
        for (int i = 0; i < 4; i++) CHECK(back[i] == (double)fv[i], "f32->f64[%d]", i);
    /* f16 / bf16 bit patterns from torch: h.to(torch.float16).view(torch.int16) */
    float h[11] = {1.00390625f,    1.01171875f,    65504.0f, 65519.0f,     65520.0f, 5.9604645e-08f,
                   2.9802322e-08f, 4.4703484e-08f, 1e-8f,    -3.14159265f, INFINITY};
    uint16_t hb[11];
    if (run_cast(TS_F32, TS_F16, 11, h, hb)) {
        int16_t want[11] = {15364, 15372, 31743, 31743, 31744, 1, 0, 1, 0, -15800, 31744};
        for (int i = 0; i < 11; i++)
            CHECK((int16_t)hb[i] == want[i], "f32->f16[%d] = %d, expected %d", i, (int16_t)hb[i],
                  want[i]);
        float r[11];
        if (run_cast(TS_F16, TS_F32, 11, hb, r)) {
            float want_f[11] = {1.00390625f, 1.01171875f,     65504,   65504,
                                INFINITY,    5.96046448e-08f, 0,       5.96046448e-08f,
                                0,           -3.140625f,      INFINITY};
            for (int i = 0; i < 11; i++) CHECK(r[i] == want_f[i], "f16->f32[%d] = %g", i, r[i]);
        }
    }
    if (run_cast(TS_F32, TS_BF16, 11, h, hb)) {
        int16_t want[11] = {16256, 16258, 18304, 18304,  18304, 13184,
                            13056, 13120, 12844, -16311, 32640};
        for (int i = 0; i < 11; i++)
            CHECK((int16_t)hb[i] == want[i], "f32->bf16[%d] = %d, expected %d", i, (int16_t)hb[i],
                  want[i]);
    }
    /* the gradient of a float cast is the cast back: d/dx sum(cast(x, f64) * c) = c in f32 */
    {
        ts_graph *g = ts_graph_new();
        int64_t dims[1] = {3};
        float x0[3] = {0.5f, -1.0f, 2.0f}, gx[3] = {0};
        double cv[3] = {0.1, -3.0, 1e-3};
        ts_val x = ts_param(g, "x", TS_F32, 1, dims, ts_init_buffer(x0));
        ts_val k = ts_constant(g, "c", TS_F64, 1, dims, cv);
        ts_val loss = ts_sum(g, ts_mul(g, ts_cast(g, x, TS_F64), k), 0, NULL, 0);
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_plan *p = NULL;
        int ok = ts_compile(g, &spec, NULL, &p) == TS_OK && ts_plan_step(p) == TS_OK &&
                 ts_plan_read(p, "grad:x", gx, sizeof gx) == TS_OK;
        CHECK(ok, "cast gradient plan: %s", ts_last_error());
        for (int i = 0; ok && i < 3; i++)
            CHECK(gx[i] == (float)cv[i], "cast grad[%d] = %g, expected %g", i, gx[i], cv[i]);
        ts_plan_free(p);
        ts_graph_free(g);
    }
    /* a cast to the value's own dtype is the value itself */
    {
        ts_graph *g = ts_graph_new();
        int64_t dims[1] = {2};
        ts_val x = ts_input(g, "x", TS_F32, 1, dims);
        CHECK(ts_cast(g, x, TS_F32).id == x.id, "cast to own dtype adds a node");
        ts_graph_free(g);
    }
}

/* ---- errors ------------------------------------------------------------ */

static void error_checks(void) {
    int64_t dims[2] = {2, 3};
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_I64, 2, dims);
        expect_error(g, ts_exp(g, x), "exp of i64", "exp", "i64[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_U8, 2, dims);
        expect_error(g, ts_relu(g, x), "relu of u8", "relu", "floating-point");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_I32, 2, dims);
        expect_error(g, ts_gelu(g, x, TS_GELU_TANH), "gelu of i32", "gelu", "i32");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        expect_error(g, ts_gelu(g, x, (ts_gelu_approx)7), "gelu approx 7", "gelu", "approximation");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        expect_error(g, ts_pow_scalar(g, x, NAN), "pow NaN", "pow_scalar", "exponent");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        expect_error(g, ts_leaky_relu(g, x, INFINITY), "leaky inf", "leaky_relu", "slope");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F64, 2, dims);
        expect_error(g, ts_affine_scalar(g, x, 1.0, NAN), "affine NaN", "affine_scalar",
                     "f64[2,3]");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        expect_error(g, ts_cast(g, x, TS_F8E4M3), "cast to f8", "cast", "f8e4m3");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        expect_error(g, ts_cast(g, x, (ts_dtype)42), "cast to dtype 42", "cast", "42");
        ts_graph_free(g);
    }
    {
        /* unary_bwd: log's gradient needs x, not y; mismatched shapes */
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 2, dims);
        ts_attrs a = ts_attrs_zero();
        a.unary_bwd.fwd_op = TS_OP_LOG;
        a.unary_bwd.side = 1;
        ts_val in[2] = {x, x};
        expect_error(g, ts_node_add(g, TS_OP_UNARY_BWD, 2, in, &a, NULL), "unary_bwd log from y",
                     "unary_bwd", "log");
        ts_graph_free(g);
    }
    {
        ts_graph *g = ts_graph_new();
        int64_t d2[2] = {3, 2};
        ts_val x = ts_input(g, "x", TS_F32, 2, dims), y = ts_input(g, "y", TS_F32, 2, d2);
        ts_attrs a = ts_attrs_zero();
        a.unary_bwd.fwd_op = TS_OP_TANH;
        a.unary_bwd.side = 1;
        ts_val in[2] = {x, y};
        expect_error(g, ts_node_add(g, TS_OP_UNARY_BWD, 2, in, &a, NULL), "unary_bwd shapes",
                     "unary_bwd", "f32[3,2]");
        ts_graph_free(g);
    }
    {
        /* errors are sticky: a later builder call on TS_NONE stays quiet */
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_I64, 2, dims);
        ts_val y = ts_sigmoid(g, ts_log(g, x));
        expect_error(g, y, "sticky", "log", "i64");
        ts_graph_free(g);
    }
}

int main(void) {
    grad_checks();
    value_checks();
    bwd_side_checks();
    cast_checks();
    error_checks();
    return check_summary("gradcheck_unary");
}
