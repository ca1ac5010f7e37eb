/* Mixed-precision convolutions (conv, conv_bwd_data, conv_bwd_weight,
 * conv_transpose with bf16/f16 operands and f32 accumulation and output,
 * conv.low = 1) under the precision pass.
 *
 * Each case trains nothing: it compiles sum(y * R) for y = conv(x, w[, b])
 * (or the transposed conv) with x, w, b as parameters, so one step runs the
 * forward op and both backward ops, and reads y and the gradients of x, w
 * and b.
 *
 * - reference kernels: the bf16/f16 plan (the pass casts x, w and dy) gives
 *   bit for bit what the f32 plan gives on x and w rounded to bf16/f16,
 *   for 1-d/2-d/3-d, groups, stride, dilation, padding, output_padding,
 *   both layouts (R is drawn representable, so dy needs no rounding and the
 *   f32 bias gradient matches too);
 * - the pass: every conv-family node is flagged and reads cast operands,
 *   three casts per case (x, w and dy, each shared by two ops), keep_fp32
 *   by op name;
 * - oneDNN: bf16 primitives against the bf16 reference kernel within the
 *   bound of two f32 summation orders of the same exact products; 1 vs 2
 *   threads and two runs bit-identical; f16 (no oneDNN f16 convolution on
 *   an AVX-512 BF16 CPU) falls back to the reference kernel;
 * - inference refuses the flag on f32 operands and bf16/f16 operands
 *   without it. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "conv_cases.h"
#include "core/half.h"
#include "plan/plan.h"

typedef conv_case cv;

/* Sizes where oneDNN has blocked kernels. */
static const cv big[] = {
    {"conv2d 16->32 14x14 pad 1",
     0,
     2,
     1,
     {3, 16, 14, 14},
     {32, 16, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     {0},
     1},
    {"conv2d groups 2 stride 2",
     0,
     2,
     1,
     {2, 16, 9, 11},
     {16, 8, 3, 3},
     {2, 2},
     {1, 1},
     {1, 1},
     {0},
     2},
    {"conv1d dilation 2 stride 2", 0, 1, 1, {3, 16, 50}, {16, 16, 5}, {2}, {2}, {2}, {0}, 1},
    {"conv3d 16->16 8^3 pad 1 (W4-like)",
     0,
     3,
     0,
     {2, 16, 8, 8, 8},
     {16, 16, 3, 3, 3},
     {1, 1, 1},
     {1, 1, 1},
     {1, 1, 1},
     {0},
     1},
    {"conv_transpose3d 32->16 2^3 stride 2 (W4)",
     1,
     3,
     1,
     {2, 32, 4, 4, 4},
     {32, 16, 2, 2, 2},
     {2, 2, 2},
     {0, 0, 0},
     {1, 1, 1},
     {0, 0, 0},
     1},
};
/* clang-format on */

static int64_t prod(const int64_t *d, int r) {
    int64_t n = 1;
    for (int i = 0; i < r; i++) n *= d[i];
    return n;
}

static uint64_t lcg;
static float frand(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 40) / 16777216.0 * 2 - 1);
}

/* v rounded to dt (f32 unchanged). */
static float round_to(float v, ts_dtype dt) {
    if (dt == TS_BF16) return ts_bf16_to_f32(ts_f32_to_bf16(v));
    if (dt == TS_F16) return ts_f16_to_f32(ts_f32_to_f16(v));
    return v;
}

enum { K_REF, K_DNNL1, K_DNNL2 };
enum { R_Y, R_DX, R_DW, R_DB };
static const char *what[4] = {"y", "dx", "dw", "db"};

typedef struct run {
    float *res[4];
    int64_t cnt[4];
    int convs, low, casts, on_dnnl;
} run;

static void run_free(run *r) {
    for (int i = 0; i < 4; i++) free(r->res[i]);
    memset(r, 0, sizeof *r);
}

/* One step of sum(y * R) for case c in layout cl, compiled with precision
 * `compute`. x and w are drawn from the same stream for every plan and
 * rounded to `rnd` first (f32: not at all); R is rounded to `rrnd`, b never.
 * `absval` takes absolute values of x, w and R (for error bounds). */
static void run_case(const cv *c, int cl, ts_dtype compute, ts_dtype rnd, ts_dtype rrnd, int kind,
                     int absval, const char *keep, run *r) {
    memset(r, 0, sizeof *r);
    ts_graph *g = ts_graph_new();
    const int rank = c->nd + 2;
    int64_t xd[5];
    memcpy(xd, c->x, sizeof xd);
    if (cl) { /* [N, spatial..., C] */
        for (int j = 0; j < c->nd; j++) xd[1 + j] = c->x[2 + j];
        xd[rank - 1] = c->x[1];
    }
    const int64_t ob = c->transpose ? c->w[1] * c->groups : c->w[0];
    const int64_t *dims[3] = {xd, c->w, &ob};
    const int ranks[3] = {rank, rank, 1};
    const char *names[3] = {"x", "w", "b"};
    ts_val in[3] = {TS_NONE, TS_NONE, TS_NONE};
    lcg = 777;
    for (int i = 0; i < 2 + c->bias; i++) {
        int64_t m = prod(dims[i], ranks[i]);
        float *v = malloc((size_t)m * sizeof(float));
        for (int64_t e = 0; e < m; e++) {
            float f = frand();
            if (absval) f = fabsf(f);
            v[e] = i < 2 ? round_to(f, rnd) : f;
        }
        in[i] = ts_param(g, names[i], TS_F32, ranks[i], dims[i], ts_init_buffer(v));
        free(v);
    }
    ts_layout lay = cl ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST;
    ts_val y = c->transpose ? ts_conv_transpose_layout(g, in[0], in[1], in[2], c->nd, c->s, c->p,
                                                       c->op, c->groups, lay)
                            : ts_conv_layout(g, in[0], in[1], in[2], c->nd, c->s, c->p, c->d,
                                             c->groups, lay);
    int64_t yn = ts_numel(g, y), yd[5];
    for (int i = 0; i < rank; i++) yd[i] = ts_dim(g, y, i);
    float *rv = malloc((size_t)yn * sizeof(float));
    for (int64_t e = 0; e < yn; e++) rv[e] = round_to(absval ? fabsf(frand()) : frand(), rrnd);
    /* R is fed (a constant would make dy and its cast constants, folded away) */
    ts_val loss = ts_sum(g, ts_mul(g, y, ts_input(g, "R", TS_F32, rank, yd)), 0, NULL, 0);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.reference_kernels = kind == K_REF;
    o.threads = kind == K_DNNL1 ? 1 : 2;
    o.precision.compute = compute;
    o.precision.keep_fp32 = keep;
    o.precision.loss_scale = TS_SCALE_NONE; /* dy = R exactly, in every precision */
    ts_plan *p = NULL;
    ts_compiled_graph kept; /* the final graph, to count its casts and mixed-precision convs */
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, &kept));
    const char *reads[4] = {"y", "grad:x", "grad:w", "grad:b"};
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "R", rv, (size_t)yn * sizeof(float)));
        CHECK_OK(ts_plan_step(p));
        for (int i = 0; i < 3 + c->bias; i++) {
            r->cnt[i] = i == 0 ? yn : prod(dims[i - 1], ranks[i - 1]);
            r->res[i] = malloc((size_t)r->cnt[i] * sizeof(float));
            CHECK_OK(ts_plan_read(p, reads[i], r->res[i], (size_t)r->cnt[i] * sizeof(float)));
        }
        const ts_graph *pg = kept.graph;
        for (int i = 0; i < pg->n_nodes; i++) {
            const ts_node *n = &pg->nodes[i];
            if (n->dead) continue;
            if (n->op == TS_OP_CAST) r->casts++;
            if (n->op < TS_OP_CONV || n->op > TS_OP_CONV_TRANSPOSE) continue;
            r->convs++;
            r->low += n->a.conv.low == 1 && pg->values[n->in[0]].t.dtype == compute &&
                      pg->values[n->in[1]].t.dtype == compute &&
                      pg->values[n->out[0]].t.dtype == TS_F32;
        }
        for (int i = 0; i < p->prog.n_ins; i++)
            if (p->prog.ins[i].op >= TS_OP_CONV && p->prog.ins[i].op <= TS_OP_CONV_TRANSPOSE)
                r->on_dnnl += p->rt.ins[i].k.backend != NULL;
        ts_plan_free(p);
    }
    ts_compiled_graph_free(&kept);
    ts_graph_free(g);
    free(rv);
}

static int same_bits(const run *a, const run *b, int t) {
    return a->res[t] && b->res[t] && a->cnt[t] == b->cnt[t] &&
           !memcmp(a->res[t], b->res[t], (size_t)a->cnt[t] * sizeof(float));
}

/* The bf16/f16 reference kernels against the f32 ones on rounded operands. */
static void reference_bits(void) {
    const ts_dtype dts[2] = {TS_BF16, TS_F16};
    for (int i = 0; i < n_conv_cases; i++)
        for (int cl = 0; cl < 2; cl++)
            for (int k = 0; k < 2; k++) {
                const cv *c = &conv_cases[i];
                const ts_dtype dt = dts[k];
                run lo, ref;
                run_case(c, cl, dt, TS_F32, dt, K_REF, 0, NULL, &lo);
                run_case(c, cl, TS_F32, dt, dt, K_REF, 0, NULL, &ref);
                const char *ln = cl ? " (channels last)" : "", *dn = ts_dtype_name(dt);
                CHECK(lo.convs == 3 && lo.low == 3,
                      "%s%s %s: %d of %d conv nodes read %s and write f32 (want 3 of 3)", c->label,
                      ln, dn, lo.low, lo.convs, dn);
                CHECK(lo.casts == 3, "%s%s %s: %d casts (want 3: x, w, dy, each shared)", c->label,
                      ln, dn, lo.casts);
                CHECK(ref.casts == 0 && ref.low == 0, "%s: the f32 plan casts nothing", c->label);
                for (int t = 0; t < 3 + c->bias; t++)
                    CHECK(same_bits(&lo, &ref, t),
                          "%s%s %s: %s differs from f32 on operands rounded to %s", c->label, ln,
                          dn, what[t], dn);
                /* and the rounding matters: unrounded f32 operands give other bits */
                if (i == 0 && cl == 0) {
                    run f32;
                    run_case(c, cl, TS_F32, TS_F32, dt, K_REF, 0, NULL, &f32);
                    CHECK(!same_bits(&lo, &f32, R_Y), "%s %s: y equals the unrounded f32 y",
                          c->label, dn);
                    run_free(&f32);
                }
                run_free(&lo);
                run_free(&ref);
            }
}

static int count_casts_kept(const cv *c, const char *keep, int *low) {
    run r;
    run_case(c, 0, TS_BF16, TS_F32, TS_BF16, K_REF, 0, keep, &r);
    int casts = r.casts;
    *low = r.low;
    run_free(&r);
    return casts;
}

static void keep_fp32(void) {
    const cv *c = conv_case_named("conv2d pad 1");
    int low;
    /* forward conv f32: x and w are cast only for the backward ops that read them */
    int casts = count_casts_kept(c, "conv", &low);
    CHECK(low == 2 && casts == 3, "keep_fp32 conv: %d low convs (want 2), %d casts (want 3)", low,
          casts);
    casts = count_casts_kept(c, "conv_bwd_weight", &low);
    CHECK(low == 2 && casts == 3, "keep_fp32 conv_bwd_weight: %d low (want 2), %d casts (want 3)",
          low, casts);
    casts = count_casts_kept(c, "conv, conv_bwd_data, conv_bwd_weight", &low);
    CHECK(low == 0 && casts == 0, "keep_fp32 all convs: %d low, %d casts (want none)", low, casts);
    casts = count_casts_kept(conv_case_named("conv_transpose1d stride 2 output_padding 1"),
                             "conv_transpose", &low);
    CHECK(low == 2 && casts == 3, "keep_fp32 conv_transpose: %d low (want 2), %d casts (want 3)",
          low, casts);
}

/* An upper bound on the number of terms summed into each element of result
 * t (+1 for a bias as the initial value): the length of the sums whose
 * order oneDNN may change. yn: the number of elements of y. */
static double terms(const cv *c, int t, int64_t yn) {
    int64_t kv = prod(c->w + 2, c->nd), cg = c->x[1] / c->groups;
    int64_t og = (c->transpose ? c->w[1] * c->groups : c->w[0]) / c->groups;
    int64_t yv = 1; /* spatial size of the forward conv's output (transpose: of x) */
    if (c->transpose)
        yv = prod(c->x + 2, c->nd);
    else
        for (int j = 0; j < c->nd; j++) {
            int64_t span = c->x[2 + j] + 2 * c->p[j] - c->d[j] * (c->w[2 + j] - 1) - 1;
            yv *= span / c->s[j] + 1;
        }
    if (t == R_DW) return (double)(c->x[0] * yv);
    if (t == R_DB) return (double)yn;
    /* y: C/groups input channels times the taps (conv and transposed conv
     * alike); dx: O/groups output channels times the taps */
    return (double)((t == R_Y ? cg : og) * kv) + 1;
}

static void dnnl_bf16(void) {
    const int have_bf16 = __builtin_cpu_supports("avx512bf16");
    int on = 0, all = 0;
    double worst_all = 0;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        for (int cl = 0; cl < 2; cl++) {
            const cv *c = &big[i];
            const char *ln = cl ? " (channels last)" : "";
            run ref, d1, d2, d2b, ab;
            run_case(c, cl, TS_BF16, TS_F32, TS_BF16, K_REF, 0, NULL, &ref);
            run_case(c, cl, TS_BF16, TS_F32, TS_BF16, K_DNNL1, 0, NULL, &d1);
            run_case(c, cl, TS_BF16, TS_F32, TS_BF16, K_DNNL2, 0, NULL, &d2);
            run_case(c, cl, TS_BF16, TS_F32, TS_BF16, K_DNNL2, 0, NULL, &d2b);
            /* sum |x||w| per output: the same conv on absolute values */
            run_case(c, cl, TS_BF16, TS_F32, TS_BF16, K_REF, 1, NULL, &ab);
            CHECK(d2.low == 3, "%s%s: %d of 3 conv nodes in bf16", c->label, ln, d2.low);
            if (have_bf16)
                CHECK(d1.on_dnnl == 3 && d2.on_dnnl == 3,
                      "%s%s: %d and %d of 3 bf16 convs run on oneDNN (1 and 2 threads)", c->label,
                      ln, d1.on_dnnl, d2.on_dnnl);
            for (int t = 0; t < 3 + c->bias; t++) {
                if (!ref.res[t] || !d2.res[t] || !ab.res[t]) continue;
                /* Both sum the same exact products (bf16 x bf16 fits f32) in f32,
                 * in different orders: each is within gamma_K * sum|p| of the
                 * exact sum, K = terms, gamma_K ~ K * 2^-24. */
                double gk = terms(c, t, ref.cnt[R_Y]) * 0x1p-24, worst = 0;
                int64_t bad = -1;
                for (int64_t e = 0; e < ref.cnt[t]; e++) {
                    double diff = fabs((double)d2.res[t][e] - ref.res[t][e]);
                    double bound = 2 * gk * ((double)ab.res[t][e] + 1e-30);
                    if (diff > bound && bad < 0) bad = e;
                    worst = fmax(worst, diff / (bound > 0 ? bound : 1));
                }
                worst_all = fmax(worst_all, worst);
                CHECK(bad < 0,
                      "%s%s: oneDNN bf16 %s differs from the reference beyond 2*K*2^-24*sum|p| "
                      "at %lld (worst %.3g of the bound)",
                      c->label, ln, what[t], (long long)bad, worst);
                CHECK(same_bits(&d1, &d2, t),
                      "%s%s: oneDNN bf16 %s differs between 1 and 2 threads", c->label, ln,
                      what[t]);
                CHECK(same_bits(&d2, &d2b, t), "%s%s: oneDNN bf16 %s differs between two runs",
                      c->label, ln, what[t]);
            }
            on += d1.on_dnnl + d2.on_dnnl;
            all += 6;
            run_free(&ref);
            run_free(&d1);
            run_free(&d2);
            run_free(&d2b);
            run_free(&ab);
        }
    printf("bf16 convs: %d of %d instructions on oneDNN (CPU avx512_bf16: %s); largest "
           "difference from the reference: %.3g of the bound\n",
           on, all, have_bf16 ? "yes" : "no", worst_all);
}

/* f16: oneDNN where it has a primitive, else the reference kernel. */
static void dnnl_f16(void) {
    for (int cl = 0; cl < 2; cl++) {
        const cv *c = &big[0];
        run ref, d;
        run_case(c, cl, TS_F16, TS_F32, TS_F16, K_REF, 0, NULL, &ref);
        run_case(c, cl, TS_F16, TS_F32, TS_F16, K_DNNL2, 0, NULL, &d);
        CHECK(d.low == 3, "%s f16: %d of 3 conv nodes in f16", c->label, d.low);
        for (int t = 0; t < 4; t++) {
            if (d.on_dnnl) {
                double mx = 0, worst = 0;
                for (int64_t e = 0; ref.res[t] && d.res[t] && e < ref.cnt[t]; e++) {
                    mx = fmax(mx, fabs(ref.res[t][e]));
                    worst = fmax(worst, fabs((double)d.res[t][e] - ref.res[t][e]));
                }
                CHECK(worst <= 1e-5 * mx, "%s f16 on oneDNN: %s off by %.3g (max %.3g)", c->label,
                      what[t], worst, mx);
            } else {
                CHECK(same_bits(&ref, &d, t), "%s f16 (reference fallback): %s differs", c->label,
                      what[t]);
            }
        }
        printf("f16 conv%s: %d of 3 instructions on oneDNN\n", cl ? " (channels last)" : "",
               d.on_dnnl);
        run_free(&ref);
        run_free(&d);
    }
}

/* Inference: the flag needs bf16/f16 operands, bf16/f16 operands need it. */
static void errors(void) {
    const int64_t xd[4] = {1, 2, 5, 5}, wd[4] = {3, 2, 3, 3}, bd[1] = {3};
    struct {
        const char *label;
        ts_dtype x, w, b;
        int flag, op;
        const char *want;
    } cases[] = {
        {"bf16 without the flag", TS_BF16, TS_BF16, TS_F32, 0, TS_OP_CONV,
         "need the mixed-precision flag"},
        {"f16 without the flag (bwd data)", TS_F16, TS_F16, TS_F32, 0, TS_OP_CONV_BWD_DATA,
         "need the mixed-precision flag"},
        {"flag on f32", TS_F32, TS_F32, TS_F32, 1, TS_OP_CONV, "needs bf16 or f16 operands"},
        {"flag on f32 (bwd weight)", TS_F32, TS_F32, TS_F32, 1, TS_OP_CONV_BWD_WEIGHT,
         "needs bf16 or f16 operands"},
        {"flag on f64 (transpose)", TS_F64, TS_F64, TS_F64, 1, TS_OP_CONV_TRANSPOSE,
         "needs bf16 or f16 operands"},
        {"bf16 x with f16 w", TS_BF16, TS_F16, TS_F32, 1, TS_OP_CONV, "weight dtype f16 differs"},
        {"bf16 bias", TS_BF16, TS_BF16, TS_BF16, 1, TS_OP_CONV, "bias must be f32[3]"},
        {"flag 2", TS_BF16, TS_BF16, TS_F32, 2, TS_OP_CONV, "must be 0 or 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_graph *g = ts_graph_new();
        ts_attrs a = ts_attrs_zero();
        a.conv.nd = 2;
        a.conv.groups = 1;
        for (int j = 0; j < 2; j++) a.conv.stride[j] = a.conv.dilation[j] = 1;
        a.conv.low = cases[i].flag;
        int op = cases[i].op, nb = op == TS_OP_CONV || op == TS_OP_CONV_TRANSPOSE;
        /* conv: (x, w); conv_bwd_data: (dy, w); conv_bwd_weight: (dy, x) with
         * the kernel size in extra[]; conv_transpose: (x [1, 3, 3, 3], w [3, 3, 3, 3]) */
        const int64_t dyd[4] = {1, 3, 3, 3}, td[4] = {3, 3, 3, 3};
        const int64_t *d0 = op == TS_OP_CONV ? xd : dyd;
        const int64_t *d1 = op == TS_OP_CONV_BWD_WEIGHT ? xd : op == TS_OP_CONV_TRANSPOSE ? td : wd;
        if (op == TS_OP_CONV_BWD_WEIGHT) a.conv.extra[0] = a.conv.extra[1] = 3;
        ts_val in[3] = {ts_input(g, "a", cases[i].x, 4, d0), ts_input(g, "b", cases[i].w, 4, d1),
                        ts_input(g, "bias", cases[i].b, 1, bd)};
        ts_val y = ts_node_add(g, op, nb ? 3 : 2, in, &a, NULL);
        CHECK(!ts_val_ok(y) && ts_graph_status(g) != TS_OK && strstr(g->error, cases[i].want),
              "%s: want an error with '%s', got: %s", cases[i].label, cases[i].want,
              ts_val_ok(y) ? "(accepted)" : g->error);
        ts_graph_free(g);
    }
    /* the flag accepted on bf16 operands (and the f32 output inferred) */
    ts_graph *g = ts_graph_new();
    ts_attrs a = ts_attrs_zero();
    a.conv.nd = 2;
    a.conv.groups = 1;
    for (int j = 0; j < 2; j++) a.conv.stride[j] = a.conv.dilation[j] = 1;
    a.conv.low = 1;
    ts_val in[3] = {ts_input(g, "x", TS_BF16, 4, xd), ts_input(g, "w", TS_BF16, 4, wd),
                    ts_input(g, "b", TS_F32, 1, bd)};
    ts_val y = ts_node_add(g, TS_OP_CONV, 3, in, &a, NULL);
    CHECK(ts_val_ok(y) && ts_v(g, y)->t.dtype == TS_F32, "bf16 conv with the flag gives f32: %s",
          g->error);
    ts_graph_free(g);
}

int main(void) {
    reference_bits();
    keep_fp32();
    dnnl_bf16();
    dnnl_f16();
    errors();
    return check_summary("precision_conv");
}
