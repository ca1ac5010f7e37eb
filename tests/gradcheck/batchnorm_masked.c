/* batch_norm with a row mask (ts_batch_norm_masked, src/ops/batchnorm.c):
 * statistics, running statistics and gradient sums over the present batch
 * items only, the mask in any order (docs/shapes.md, "Sensor masks").
 * - gradient checks against finite differences with mixed masks, channels
 *   first and last, plain and with the fused ReLU: the loss reads the
 *   present items' outputs, and an absent item's x gets exactly 0;
 * - a masked step equals, bit for bit, a plain step on a batch of just the
 *   present items (y, dx, dw, db, running statistics), however many absent
 *   items there are, where, and whatever they hold (their dy is not read);
 *   the same bits at 1 and 2 threads; NaN in absent items stays out;
 * - no item present: the running statistics normalise and stay unchanged,
 *   every gradient is 0;
 * - bad masks: a value other than 0 or 1 fails the step, a mask of another
 *   shape or none fails the build; ts_batch_norm_mask_rows keeps a node's
 *   own mask. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"

/* ---- gradient checks ---------------------------------------------------- */

typedef struct mk_arg {
    int affine, relu, cl;
} mk_arg;

/* y = batch_norm(x; mask) times the mask broadcast over an item, so the
 * loss sum(y * R) reads the present items' outputs only: their gradient
 * is the op's. in: x, mask f32 [N], then weight and bias when affine. */
static ts_val build_masked(ts_graph *g, const ts_val *in, void *u) {
    const mk_arg *a = u;
    const int r = ts_rank(g, in[0]);
    ts_val x = a->cl ? gc_to_layout(g, in[0], r, 1) : in[0];
    ts_val w = a->affine ? in[2] : TS_NONE, b = a->affine ? in[3] : TS_NONE;
    ts_val y = ts_batch_norm_masked(g, x, w, b, "bn", 0.1, 1e-5, a->relu,
                                    a->cl ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST, in[1]);
    if (a->cl) y = gc_to_layout(g, y, r, 0);
    int64_t md[TS_MAX_RANK] = {ts_dim(g, in[0], 0)};
    for (int i = 1; i < r; i++) md[i] = 1;
    return ts_mul(g, y, ts_cast(g, ts_reshape(g, in[1], r, md), TS_F64));
}

static void gradchecks(void) {
    static const float m5[5] = {1, 0, 1, 1, 0}, m4[4] = {0, 1, 0, 1}, m3[3] = {1, 1, 0},
                       mb[3] = {1, 0, 1};
    const struct {
        const char *label;
        gc_input x;
        const float *mask;
        int relu_ok; /* small enough for the ReLU's kink (see batchnorm.c's fused_relu) */
    } cases[] = {
        {"1d [5,3] mask 10110", GC_F(5, 3), m5, 1},
        {"2d [4,3,2,3] mask 0101", GC_F(4, 3, 2, 3), m4, 1},
        {"1d [3,2,5] prefix mask 110", GC_F(3, 2, 5), m3, 1},
        /* blocks of 4096 values, and channels last blocks across items (as
         * batchnorm.c's case, 8198 values per channel: more would leave the
         * finite differences of a loss of that many terms too coarse) */
        {"several blocks [3,2,4099] mask 101", GC_F(3, 2, 4099), mb, 0},
    };
    gc_options o = {.no_f32 = 1}; /* an f32 plan without a loss is eval mode */
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++)
        for (int k = 0; k < 8; k++) {
            mk_arg a = {k & 1, k >> 1 & 1, k >> 2};
            if (a.relu && !cases[s].relu_ok) continue;
            int64_t c = cases[s].x.dims[1], n = cases[s].x.dims[0];
            gc_input in[4] = {
                cases[s].x, {TS_F32, 1, {n}, 0, 0, 0, cases[s].mask}, GC_F(c), GC_F(c)};
            in[0].lo = -2, in[0].hi = 3;
            in[2].lo = 0.5, in[2].hi = 1.5;
            in[3].lo = -0.1, in[3].hi = 0.1;
            char label[128];
            snprintf(label, sizeof label, "masked batch_norm%s %s%s%s", a.relu ? "_relu" : "",
                     cases[s].label, a.cl ? " channels last" : "", a.affine ? " affine" : "");
            gc_check_opt(label, 2 + 2 * a.affine, in, build_masked, &a, &o);
        }
}

/* ---- a masked step against a plain step on the present items ----------- */

typedef struct step_out {
    double *y, *dx, dw[64], db[64], rm[64], rv[64];
} step_out;

static void to_dt(void *dst, const double *src, int64_t n, ts_dtype dt) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == TS_F64)
            ((double *)dst)[i] = src[i];
        else
            ((float *)dst)[i] = (float)src[i];
    }
}

static void read_as_double(ts_plan *p, const char *name, ts_dtype dt, double *out, int64_t n) {
    const size_t es = ts_dtype_size(dt);
    void *buf = malloc((size_t)n * es);
    CHECK_OK(ts_plan_read(p, name, buf, (size_t)n * es));
    for (int64_t i = 0; i < n; i++)
        out[i] = dt == TS_F64 ? ((double *)buf)[i] : (double)((float *)buf)[i];
    free(buf);
}

/* One training step (no optimizer) of batch_norm (relu: fused) on x
 * [dims] channels first (cl: computed channels last between permutes),
 * loss sum(y * R); mask NULL: a plain batch_norm. Two steps when `twice`
 * (the running statistics after both). */
static void step(ts_dtype dt, int rank, const int64_t *dims, const double *x, const double *r,
                 const float *mask, int relu, int cl, int threads, int twice, step_out *o) {
    int64_t n = 1, c = dims[1];
    for (int i = 0; i < rank; i++) n *= dims[i];
    const size_t es = ts_dtype_size(dt);
    unsigned char *xb = malloc((size_t)n * es), *rb = malloc((size_t)n * es), wb[512], bb[512];
    double wv[64], bv[64];
    for (int i = 0; i < c; i++) wv[i] = (i % 3 == 2 ? -1 : 1) * (1 + 0.1 * i), bv[i] = 0.05 * i;
    to_dt(xb, x, n, dt), to_dt(rb, r, n, dt), to_dt(wb, wv, c, dt), to_dt(bb, bv, c, dt);
    ts_graph *g = ts_graph_new();
    ts_val xv = ts_param(g, "x", dt, rank, dims, ts_init_buffer(xb));
    ts_val w = ts_param(g, "w", dt, 1, &c, ts_init_buffer(wb));
    ts_val b = ts_param(g, "b", dt, 1, &c, ts_init_buffer(bb));
    ts_val in = cl ? gc_to_layout(g, xv, rank, 1) : xv;
    const ts_layout lay = cl ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST;
    ts_val y = mask ? ts_batch_norm_masked(g, in, w, b, "bn", 0.1, 1e-5, relu, lay,
                                           ts_input(g, "mask", TS_F32, 1, dims))
                    : ts_batch_norm_layout(g, in, w, b, "bn", 0.1, 1e-5, relu, lay);
    if (cl) y = gc_to_layout(g, y, rank, 0);
    CHECK_OK(ts_mark_output(g, y, "y"));
    ts_train_spec spec = ts_train_spec_default(
        ts_sum(g, ts_mul(g, y, ts_constant(g, "r", dt, rank, dims, rb)), 0, NULL, 0));
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    if (p) {
        if (mask) CHECK_OK(ts_plan_set_input(p, "mask", mask, sizeof(float) * (size_t)dims[0]));
        for (int s = 0; s < 1 + twice; s++) CHECK_OK(ts_plan_step(p));
        read_as_double(p, "y", dt, o->y, n);
        read_as_double(p, "grad:x", dt, o->dx, n);
        read_as_double(p, "grad:w", dt, o->dw, c);
        read_as_double(p, "grad:b", dt, o->db, c);
        read_as_double(p, "bn.running_mean", dt, o->rm, c);
        read_as_double(p, "bn.running_var", dt, o->rv, c);
    }
    ts_plan_free(p);
    ts_graph_free(g);
    free(xb), free(rb);
}

static step_out alloc_out(int64_t n) {
    step_out o = {calloc((size_t)n, 8), calloc((size_t)n, 8), {0}, {0}, {0}, {0}};
    return o;
}
static void free_out(step_out *o) {
    free(o->y), free(o->dx);
}

/* The present items' values of a full step's per-item array equal a
 * compact step's, bit for bit. */
static int same_items(const double *full, const double *compact, const float *mask, int64_t n,
                      int64_t per) {
    for (int64_t i = 0, j = 0; i < n; i++)
        if (mask[i] == 1.0f) {
            if (memcmp(full + i * per, compact + j * per, sizeof(double) * (size_t)per)) return 0;
            j++;
        }
    return 1;
}

static int zero_absent(const double *dx, const float *mask, int64_t n, int64_t per) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; mask[i] == 0.0f && e < per; e++)
            if (dx[i * per + e] != 0.0) return 0;
    return 1;
}

static void against_compact(void) {
    const struct {
        int rank;
        int64_t dims[5];
        float mask[8];
    } cases[] = {
        {2, {7, 5}, {0, 1, 1, 0, 1, 0, 1}},
        {3, {6, 3, 5000}, {1, 0, 0, 1, 1, 0}},
        {4, {8, 4, 6, 6}, {0, 0, 1, 0, 1, 1, 0, 1}},
        {4, {5, 16, 12, 12}, {1, 1, 0, 1, 0}}, /* parallel, channels last blocks across items */
        {5, {4, 3, 2, 3, 4}, {1, 1, 1, 0}},    /* padding: the prefix mask of shape buckets */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rank = cases[k].rank;
        const int64_t N = cases[k].dims[0], C = cases[k].dims[1];
        const float *mask = cases[k].mask;
        int64_t per = 1, np = 0;
        for (int i = 1; i < rank; i++) per *= cases[k].dims[i];
        for (int64_t i = 0; i < N; i++) np += mask[i] == 1.0f;
        int64_t cd[5];
        memcpy(cd, cases[k].dims, sizeof cd);
        cd[0] = np;
        /* the full batch: absent items hold garbage (large values) and
         * their dy (R) is nonzero; the compact batch holds the present
         * items only */
        double *x = malloc(sizeof(double) * (size_t)(N * per));
        double *r = malloc(sizeof(double) * (size_t)(N * per));
        double *xc = malloc(sizeof(double) * (size_t)(np * per));
        double *rc = malloc(sizeof(double) * (size_t)(np * per));
        for (int64_t i = 0, j = 0; i < N; i++) {
            for (int64_t e = 0; e < per; e++) {
                const double t = (double)(i * per + e);
                x[i * per + e] = mask[i] == 1.0f ? 2 + sin(0.37 * t) * 2 + 0.3 * cos(1.7 * t)
                                                 : 1e4 * cos(0.11 * t) + 5e3;
                r[i * per + e] = cos(0.3 * t + (double)k);
            }
            if (mask[i] == 1.0f) {
                memcpy(xc + j * per, x + i * per, sizeof(double) * (size_t)per);
                memcpy(rc + j * per, r + i * per, sizeof(double) * (size_t)per);
                j++;
            }
        }
        for (int v = 0; v < 8; v++) {
            const ts_dtype dt = v & 1 ? TS_F32 : TS_F64;
            const int cl = v >> 1 & 1, relu = v >> 2 & 1;
            step_out full = alloc_out(N * per), compact = alloc_out(np * per),
                     two = alloc_out(N * per);
            step(dt, rank, cases[k].dims, x, r, mask, relu, cl, 1, 1, &full);
            step(dt, rank, cd, xc, rc, NULL, relu, cl, 1, 1, &compact);
            step(dt, rank, cases[k].dims, x, r, mask, relu, cl, 2, 1, &two);
            const char *what = dt == TS_F32 ? "f32" : "f64";
            CHECK(same_items(full.y, compact.y, mask, N, per) &&
                      same_items(full.dx, compact.dx, mask, N, per),
                  "case %zu %s%s%s: the present items' y or dx differ from a batch of them alone",
                  k, what, cl ? " channels last" : "", relu ? " relu" : "");
            CHECK(!memcmp(full.dw, compact.dw, sizeof(double) * (size_t)C) &&
                      !memcmp(full.db, compact.db, sizeof(double) * (size_t)C) &&
                      !memcmp(full.rm, compact.rm, sizeof(double) * (size_t)C) &&
                      !memcmp(full.rv, compact.rv, sizeof(double) * (size_t)C),
                  "case %zu %s%s%s: dw, db or the running statistics differ from a batch of the "
                  "present items alone",
                  k, what, cl ? " channels last" : "", relu ? " relu" : "");
            CHECK(zero_absent(full.dx, mask, N, per), "case %zu %s: an absent item's dx is not 0",
                  k, what);
            CHECK(!memcmp(full.y, two.y, sizeof(double) * (size_t)(N * per)) &&
                      !memcmp(full.dx, two.dx, sizeof(double) * (size_t)(N * per)) &&
                      !memcmp(full.rv, two.rv, sizeof(double) * (size_t)C),
                  "case %zu %s%s: 1 and 2 threads differ", k, what, cl ? " channels last" : "");
            free_out(&full), free_out(&compact), free_out(&two);
        }
        free(x), free(r), free(xc), free(rc);
    }
    printf("masked batch_norm: present items bit for bit a batch of them alone (5 shapes, f32/f64, "
           "channels first/last, plain/relu)\n");
}

/* NaN in the absent items (a failed sensor) stays out of the statistics:
 * the present items' outputs, the running statistics and every gradient
 * of the present items are finite. */
static void nan_absent(void) {
    const int64_t dims[4] = {4, 2, 3, 3}, per = 18, n = 72;
    const float mask[4] = {1, 0, 1, 0};
    double x[72], r[72];
    for (int i = 0; i < n; i++) {
        x[i] = mask[i / per] == 1.0f ? sin(0.5 * i) : NAN;
        r[i] = mask[i / per] == 1.0f ? cos(0.2 * i) : 0;
    }
    for (int cl = 0; cl < 2; cl++) {
        step_out o = alloc_out(n);
        step(TS_F32, 4, dims, x, r, mask, 1, cl, 1, 0, &o);
        int finite = 1;
        for (int i = 0; i < n; i++)
            if (mask[i / per] == 1.0f) finite &= isfinite(o.y[i]) && isfinite(o.dx[i]);
        for (int c = 0; c < 2; c++)
            finite &=
                isfinite(o.rm[c]) && isfinite(o.rv[c]) && isfinite(o.dw[c]) && isfinite(o.db[c]);
        CHECK(finite, "%s: NaN in absent items reached the statistics",
              cl ? "channels last" : "channels first");
        CHECK(zero_absent(o.dx, mask, 4, per), "NaN items: dx not exactly 0");
        free_out(&o);
    }
}

/* No item present: the running statistics (0 and 1 at first) normalise
 * every item and stay as they were; every gradient is 0. */
static void none_present(void) {
    const int64_t dims[3] = {3, 2, 4}, n = 24;
    const float mask[3] = {0, 0, 0};
    double x[24], r[24];
    for (int i = 0; i < n; i++) x[i] = sin(0.5 * i) * 3, r[i] = cos(0.2 * i);
    for (int cl = 0; cl < 2; cl++) {
        step_out o = alloc_out(n);
        step(TS_F64, 3, dims, x, r, mask, 0, cl, 1, 1, &o);
        int ok = 1;
        for (int c = 0; c < 2; c++) {
            const double w = (c % 3 == 2 ? -1 : 1) * (1 + 0.1 * c), b = 0.05 * c;
            ok &= o.rm[c] == 0 && o.rv[c] == 1 && o.dw[c] == 0 && o.db[c] == 0;
            for (int i = 0; i < 3; i++)
                for (int s = 0; s < 4; s++) {
                    const int e = (i * 2 + c) * 4 + s;
                    ok &= o.dx[e] == 0 && fabs(o.y[e] - (x[e] / sqrt(1 + 1e-5) * w + b)) < 1e-12;
                }
        }
        CHECK(ok,
              "%s: no item present: running statistics moved, a gradient is not 0 or y is "
              "not normalised with the running statistics",
              cl ? "channels last" : "channels first");
        free_out(&o);
    }
}

/* ---- bad masks ----------------------------------------------------------- */

static void errors(void) {
    const int64_t d[2] = {4, 3}, c3[1] = {3}, m3[1] = {3};
    /* a value other than 0 or 1 fails the step, naming the item */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_param(g, "x", TS_F32, 2, d, ts_init_uniform(-1, 1));
    ts_val y = ts_batch_norm_masked(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5, 0, TS_CHANNELS_FIRST,
                                    ts_input(g, "mask", TS_F32, 1, d));
    ts_train_spec spec = ts_train_spec_default(ts_sum(g, ts_mul(g, y, y), 0, NULL, 0));
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (p) {
        const float half[4] = {1, 0.5f, 1, 0};
        CHECK_OK(ts_plan_set_input(p, "mask", half, sizeof half));
        CHECK(ts_plan_step(p) != TS_OK && strstr(ts_last_error(), "item 1 is 0.5"),
              "a mask of 0.5: %s", ts_last_error());
        const float one[4] = {0, 0, 1, 0}; /* one value per channel: as torch, refused */
        CHECK_OK(ts_plan_set_input(p, "mask", one, sizeof one));
        CHECK(ts_plan_step(p) != TS_OK && strstr(ts_last_error(), "1 items present"),
              "one present value per channel: %s", ts_last_error());
        ts_plan_free(p);
    }
    ts_graph_free(g);
    /* a mask of another length or dtype, or none, fails the build */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    ts_batch_norm_masked(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5, 0, TS_CHANNELS_FIRST,
                         ts_input(g, "mask", TS_F32, 1, m3));
    CHECK(ts_graph_status(g) != TS_OK && strstr(ts_graph_error(g), "row mask must be f32[4]"),
          "a mask of 3 for 4 items: %s", ts_graph_error(g));
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    ts_batch_norm_masked(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5, 0, TS_CHANNELS_FIRST,
                         ts_input(g, "mask", TS_U8, 1, d));
    CHECK(ts_graph_status(g) != TS_OK && strstr(ts_graph_error(g), "row mask must be f32[4]"),
          "a u8 mask: %s", ts_graph_error(g));
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    ts_batch_norm_masked(g, x, TS_NONE, TS_NONE, "bn", 0.1, 1e-5, 0, TS_CHANNELS_FIRST, TS_NONE);
    CHECK(ts_graph_status(g) != TS_OK && strstr(ts_graph_error(g), "no row mask"), "no mask: %s",
          ts_graph_error(g));
    ts_graph_free(g);
    /* ts_batch_norm_mask_rows adds the padding mask to the unmasked node
     * only */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    ts_val w = ts_param(g, "w", TS_F32, 1, c3, ts_init_ones());
    ts_val b = ts_param(g, "b", TS_F32, 1, c3, ts_init_zeros());
    ts_batch_norm_masked(g, x, w, b, "own", 0.1, 1e-5, 0, TS_CHANNELS_FIRST,
                         ts_input(g, "sensor", TS_F32, 1, d));
    ts_batch_norm(g, x, w, b, "plain", 0.1, 1e-5);
    int n_masked = -1;
    CHECK_OK(ts_batch_norm_mask_rows(g, "mask", &n_masked));
    CHECK(n_masked == 1, "mask_rows masked %d nodes, expected the unmasked one", n_masked);
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    against_compact();
    nan_absent();
    none_present();
    errors();
    return check_summary("gradcheck_batchnorm_masked");
}
