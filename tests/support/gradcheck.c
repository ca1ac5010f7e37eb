#include "gradcheck.h"
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int64_t numel(const gc_input *in) {
    int64_t n = 1;
    for (int i = 0; i < in->rank; i++) n *= in->dims[i];
    return n;
}

/* Build graph in dtype ft (f64 or f32); returns the scalar loss. */
static ts_graph *build_graph(int n_in, const gc_input *in, double **vals, gc_build_fn build,
                             void *user, ts_dtype ft, const double *R, int64_t *out_n,
                             ts_val *loss) {
    ts_graph *g = ts_graph_new();
    ts_val v[16];
    for (int i = 0; i < n_in; i++) {
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        int64_t n = numel(&in[i]);
        if (in[i].dtype == TS_F64) {
            void *buf = malloc((size_t)n * 8 + 8);
            for (int64_t e = 0; e < n; e++) {
                if (ft == TS_F64)
                    ((double *)buf)[e] = vals[i][e];
                else
                    ((float *)buf)[e] = (float)vals[i][e];
            }
            if (in[i].differentiable)
                v[i] = ts_param(g, name, ft, in[i].rank, in[i].dims, ts_init_buffer(buf));
            else
                v[i] = ts_constant(g, name, ft, in[i].rank, in[i].dims, buf);
            free(buf);
        } else {
            v[i] = ts_constant(g, name, in[i].dtype, in[i].rank, in[i].dims, in[i].data);
        }
    }
    ts_val y = build(g, v, user);
    if (ts_graph_status(g) != TS_OK) return g;
    /* An op that returns its input unchanged (identity permute, p = 0
     * dropout): give the output a node of its own so naming it "out" does
     * not rename the input. */
    for (int i = 0; i < n_in; i++)
        if (y.id == v[i].id) y = ts_affine_scalar(g, y, 1.0, 0.0);
    ts_mark_output(g, y, "out");
    int64_t n = ts_numel(g, y);
    *out_n = n;
    int rank = ts_rank(g, y);
    int64_t dims[TS_MAX_RANK];
    for (int i = 0; i < rank; i++) dims[i] = ts_dim(g, y, i);
    void *rb = malloc((size_t)n * 8 + 8);
    for (int64_t e = 0; e < n; e++) { /* R == NULL: a first build to learn the output size */
        double r = R ? R[e] : 1.0;
        if (ft == TS_F64)
            ((double *)rb)[e] = r;
        else
            ((float *)rb)[e] = (float)r;
    }
    ts_val r = ts_constant(g, "R", ft, rank, dims, rb);
    free(rb);
    *loss = ts_sum(g, ts_mul(g, y, r), 0, NULL, 0);
    return g;
}

int gc_check_opt(const char *label, int n_in, const gc_input *in, gc_build_fn build, void *user,
                 const gc_options *opt) {
    double tol = opt && opt->tol > 0 ? opt->tol : 1e-6;
    int max_elems = opt && opt->max_elems > 0 ? opt->max_elems : 200;
    int failures = 0;
    double *vals[16] = {0};
    for (int i = 0; i < n_in; i++) {
        int64_t n = numel(&in[i]);
        vals[i] = malloc((size_t)n * sizeof(double) + 8);
        double lo = in[i].lo, hi = in[i].hi;
        if (lo == 0 && hi == 0) lo = -1, hi = 1;
        for (int64_t e = 0; e < n; e++)
            vals[i][e] = in[i].data && in[i].dtype == TS_F64 ? ((const double *)in[i].data)[e]
                                                             : lo + (hi - lo) * rnd();
    }
    /* The output size is only known after building once. */
    double *R = NULL;
    int64_t out_n = 0;
    ts_val loss = TS_NONE;
    {
        ts_graph *g0 = build_graph(n_in, in, vals, build, user, TS_F64, NULL, &out_n, &loss);
        ts_status st = ts_graph_status(g0);
        if (st != TS_OK) {
            CHECK(0, "%s: building failed: %s", label, ts_graph_error(g0));
            ts_graph_free(g0);
            failures++;
            goto out;
        }
        ts_graph_free(g0);
    }
    R = malloc((size_t)out_n * sizeof(double) + 8);
    for (int64_t e = 0; e < out_n; e++) R[e] = 0.5 + rnd();
    ts_graph *g = build_graph(n_in, in, vals, build, user, TS_F64, R, &out_n, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_plan *plan = NULL;
    ts_status s = ts_compile(g, &spec, NULL, &plan);
    if (s != TS_OK) {
        CHECK(0, "%s: compile failed: %s", label, ts_last_error());
        ts_graph_free(g);
        failures++;
        goto out;
    }
    s = ts_plan_step(plan);
    CHECK(s == TS_OK, "%s: step failed: %s", label, ts_last_error());
    double *fwd64 = malloc((size_t)out_n * sizeof(double) + 8);
    ts_plan_read(plan, "out", fwd64, (size_t)out_n * sizeof(double));
    for (int i = 0; i < n_in && s == TS_OK; i++) {
        if (!in[i].differentiable || in[i].dtype != TS_F64) continue;
        char name[16], gname[24];
        snprintf(name, sizeof name, "in%d", i);
        snprintf(gname, sizeof gname, "grad:in%d", i);
        int64_t n = numel(&in[i]);
        double *grad = malloc((size_t)n * sizeof(double) + 8);
        double *x = malloc((size_t)n * sizeof(double) + 8);
        memcpy(x, vals[i], (size_t)n * sizeof(double));
        /* Re-read analytic gradients of the unperturbed point. */
        ts_plan_write_param(plan, name, x, (size_t)n * 8);
        ts_plan_step(plan);
        if (ts_plan_read(plan, gname, grad, (size_t)n * 8) != TS_OK) {
            CHECK(0, "%s: no gradient for input %d: %s", label, i, ts_last_error());
            failures++;
            free(grad);
            free(x);
            continue;
        }
        int64_t stride = n > max_elems ? n / max_elems : 1;
        int bad = 0;
        for (int64_t e = 0; e < n; e += stride) {
            double h = 1e-6, orig = x[e];
            x[e] = orig + h;
            ts_plan_write_param(plan, name, x, (size_t)n * 8);
            ts_plan_step(plan);
            double lp = ts_plan_loss(plan);
            x[e] = orig - h;
            ts_plan_write_param(plan, name, x, (size_t)n * 8);
            ts_plan_step(plan);
            double lm = ts_plan_loss(plan);
            x[e] = orig;
            double num = (lp - lm) / (2 * h);
            double err = fabs(grad[e] - num), lim = tol * fmax(1.0, fabs(num));
            if (!(err <= lim)) {
                if (bad < 5)
                    fprintf(stderr, "%s: input %d element %lld: analytic %.10g numeric %.10g\n",
                            label, i, (long long)e, grad[e], num);
                bad++;
            }
        }
        ts_plan_write_param(plan, name, x, (size_t)n * 8);
        CHECK(bad == 0, "%s: %d gradient elements of input %d differ", label, bad, i);
        failures += bad;
        free(grad);
        free(x);
    }
    ts_plan_free(plan);
    ts_graph_free(g);
    /* f32 forward agrees with f64. */
    if (!(opt && opt->no_f32)) {
        double ftol = opt && opt->f32_tol > 0 ? opt->f32_tol : 1e-4;
        ts_graph *g32 = build_graph(n_in, in, vals, build, user, TS_F32, R, &out_n, &loss);
        ts_plan *p32 = NULL;
        if (ts_graph_status(g32) == TS_OK && ts_compile(g32, NULL, NULL, &p32) == TS_OK &&
            ts_plan_step(p32) == TS_OK) {
            float *f = malloc((size_t)out_n * sizeof(float) + 8);
            ts_plan_read(p32, "out", f, (size_t)out_n * sizeof(float));
            int bad = 0;
            for (int64_t e = 0; e < out_n; e++) {
                double d = fabs((double)f[e] - fwd64[e]);
                if (!(d <= ftol * fmax(1.0, fabs(fwd64[e])))) {
                    if (bad < 5)
                        fprintf(stderr, "%s: f32 output %lld = %.8g, f64 %.10g\n", label,
                                (long long)e, f[e], fwd64[e]);
                    bad++;
                }
            }
            CHECK(bad == 0, "%s: %d f32 outputs differ from f64", label, bad);
            failures += bad;
            free(f);
        } else {
            CHECK(0, "%s: f32 version failed: %s", label,
                  ts_graph_status(g32) != TS_OK ? ts_graph_error(g32) : ts_last_error());
            failures++;
        }
        ts_plan_free(p32);
        ts_graph_free(g32);
    }
    free(fwd64);
out:
    free(R);
    for (int i = 0; i < n_in; i++) free(vals[i]);
    if (failures == 0) check_passed++;
    return failures;
}

int gc_check(const char *label, int n_in, const gc_input *in, gc_build_fn build, void *user) {
    return gc_check_opt(label, n_in, in, build, user, NULL);
}

ts_val gc_to_layout(ts_graph *g, ts_val v, int r, int last) {
    int perm[TS_MAX_RANK] = {0};
    for (int i = 1; i < r; i++)
        perm[i] = last ? (i == r - 1 ? 1 : i + 1) : (i == 1 ? r - 1 : i - 1);
    return ts_permute(g, v, perm);
}
