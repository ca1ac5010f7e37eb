/* Shape buckets (docs/shapes.md): the bucket keys and their errors, plans
 * sharing one copy of the state, the plan cache's hits, misses and
 * evictions, and padding that changes nothing (padded rows give the loss
 * and the update of the unpadded batch). */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "frontend/buckets.h"
#include "frontend/config.h"
#include "plan/plan.h"
#include "plan/plan_cache.h"
#include "session/shapes.h"

static void test_parse(void) {
    ts_buckets b;
    CHECK_OK(ts_buckets_parse("8, 16,32", "k", "w", &b));
    CHECK(b.kind == TS_BUCKETS_LIST && b.n == 3, "list of 3");
    CHECK(ts_buckets_pick(&b, 1, 64) == 8 && ts_buckets_pick(&b, 9, 64) == 16 &&
              ts_buckets_pick(&b, 32, 64) == 32 && ts_buckets_pick(&b, 33, 64) == 0,
          "list picks");
    CHECK(ts_buckets_largest(&b, 64) == 32, "largest of a list");
    CHECK_OK(ts_buckets_parse("multiple:8", "k", "w", &b));
    CHECK(ts_buckets_pick(&b, 13, 60) == 16 && ts_buckets_pick(&b, 57, 60) == 60 &&
              ts_buckets_pick(&b, 61, 60) == 0,
          "multiple:8 picks (the full size is a bucket)");
    int64_t all[16];
    CHECK(ts_buckets_all(&b, 20, all, 16) == 3 && all[0] == 8 && all[1] == 16 && all[2] == 20,
          "multiple:8 up to 20: 8 16 20");
    CHECK_OK(ts_buckets_parse(" pow2 ", "k", "w", &b));
    CHECK(ts_buckets_pick(&b, 5, 100) == 8 && ts_buckets_pick(&b, 65, 100) == 100, "pow2 picks");
    const char *bad[][2] = {{"", "empty"},
                            {"   ", "empty"},
                            {"8, 4", "not increasing: 4 follows 8"},
                            {"8, 8", "not increasing: 8 follows 8"},
                            {"0, 4", "out of range"},
                            {"8, x", "expected whole sizes"},
                            {"multiple:0", "multiple:N"},
                            {"multiple:", "multiple:N"},
                            {"pow2 3", "no argument"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_status s = ts_buckets_parse(bad[i][0], "shape.seq_buckets", "t.yaml:4:3", &b);
        CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), bad[i][1]) &&
                  strstr(ts_last_error(), "shape.seq_buckets") &&
                  strstr(ts_last_error(), "t.yaml:4:3"),
              "'%s': %s", bad[i][0], ts_last_error());
    }
}

static ts_status load(ts_config *c, const char *text) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, text, strlen(text), "t.yaml");
    return s == TS_OK ? ts_config_finish(c) : s;
}

static void test_config(void) {
    ts_config c;
    CHECK_OK(load(&c, "model:\n  preset: w1\n"));
    CHECK(c.shape.policy == 0 && c.data.drop_last == 0, "default: exact, short batch trained");
    CHECK_OK(load(&c, "model:\n  preset: w1\nshape:\n  policy: bucket\n  batch_buckets: [8, 16, "
                      "32]\n  cache_mb: 64\n"));
    CHECK(c.shape.policy == 1 && c.data.drop_last == 0 && c.shape.cache_mb == 64 &&
              !strcmp(c.shape.batch_buckets, "8, 16, 32"),
          "bucket: list, short batch kept (%s)", c.shape.batch_buckets);
    CHECK_OK(load(&c, "model:\n  preset: w1\nshape:\n  policy: bucket\ndata:\n  drop_last: "
                      "true\n"));
    CHECK(c.data.drop_last == 1, "data.drop_last set wins");
    ts_status s =
        load(&c, "model:\n  preset: w1\nshape:\n  policy: bucket\n  batch_buckets: [16, 8]\n");
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "t.yaml:5:") &&
              strstr(ts_last_error(), "shape.batch_buckets '16, 8'") &&
              strstr(ts_last_error(), "not increasing"),
          "decreasing list: %s", ts_last_error());
    ts_config_init(&c);
    s = ts_config_load_string(&c, "model:\n  preset: w1\n", 20, "t.yaml");
    if (s == TS_OK) s = ts_config_set(&c, "shape.seq_buckets=,");
    if (s == TS_OK) s = ts_config_finish(&c);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "shape.seq_buckets") &&
              strstr(ts_last_error(), "empty"),
          "empty list: %s", ts_last_error());
    s = load(&c, "model:\n  preset: w1\nshape:\n  policy: padded\n");
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "shape.policy"), "bad policy: %s",
          ts_last_error());
}

/* ---- padding that changes nothing --------------------------------------- */

enum { IN = 12, HID = 16, OUT = 3, CLASSES = 5, FULL = 8, REAL = 5 };

static ts_graph *mlp(int64_t batch, int classes, int masked, ts_model *m, ts_train_spec *spec) {
    ts_graph *g = ts_graph_new();
    ts_mlp_config c = {batch, 0, 1, IN, HID, 2, OUT, 1, classes};
    if (ts_build_mlp(g, &c, m) != TS_OK) CHECK(0, "build: %s", ts_last_error());
    *spec = ts_train_spec_default(m->loss);
    spec->opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    if (masked) CHECK_OK(ts_shape_mask_loss(g, m, spec));
    return g;
}

static ts_compile_options options(void) {
    ts_compile_options o = ts_compile_options_default();
    o.seed = 7;
    return o;
}

/* Batch `step`: `real` real rows, then padding up to `rows` (x 0, class
 * targets -100, mask 0). */
static void batch(int step, int real, int rows, int classes, float *x, void *y, float *mask) {
    unsigned seed = 11u + (unsigned)step;
    memset(x, 0, sizeof(float) * (size_t)rows * IN);
    for (int i = 0; i < real * IN; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int r = 0; r < rows; r++) {
        if (classes)
            ((int64_t *)y)[r] = r < real ? rand_r(&seed) % CLASSES : TS_SHAPE_IGNORE;
        else
            for (int k = 0; k < OUT; k++)
                ((float *)y)[r * OUT + k] = r < real ? (float)rand_r(&seed) / RAND_MAX : 0.0f;
        mask[r] = r < real ? 1.0f : 0.0f;
    }
}

static void feed_real(ts_plan *p, int step, int real, int rows, int classes, int masked) {
    float x[FULL * IN], mask[FULL];
    int64_t yc[FULL];
    float yf[FULL * OUT];
    void *y = classes ? (void *)yc : (void *)yf;
    batch(step, real, rows, classes, x, y, mask);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)rows * IN));
    CHECK_OK(ts_plan_set_input(p, "y", y, (size_t)rows * (classes ? sizeof(int64_t) : OUT * 4)));
    if (masked) CHECK_OK(ts_plan_set_input(p, "mask", mask, sizeof(float) * (size_t)rows));
}

/* REAL real rows */
static void feed(ts_plan *p, int step, int rows, int classes, int masked) {
    feed_real(p, step, REAL, rows, classes, masked);
}

/* Largest |a - b| over every parameter of two plans. */
static double param_diff(const ts_plan *a, const ts_plan *b) {
    double worst = 0;
    for (int i = 0; i < ts_plan_param_count(a); i++) {
        const char *name = ts_plan_param_name(a, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(a, name, NULL, &rank, dims);
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
        float *x = malloc(n * 4), *y = malloc(n * 4);
        CHECK_OK(ts_plan_read(a, name, x, n * 4));
        CHECK_OK(ts_plan_read(b, name, y, n * 4));
        for (size_t j = 0; j < n; j++)
            if (fabs((double)x[j] - y[j]) > worst) worst = fabs((double)x[j] - y[j]);
        free(x), free(y);
    }
    return worst;
}

/* Three steps of `real` rows: on a plan of exactly that many rows, and
 * padded to FULL rows on a plan of FULL rows. */
static void test_padding(int classes, int real) {
    const int masked = !classes;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o = options();
    ts_graph *ge = mlp(real, classes, masked, &m, &spec);
    ts_plan *exact = NULL, *full = NULL;
    CHECK_OK(ts_compile(ge, &spec, &o, &exact));
    ts_graph *gf = mlp(FULL, classes, masked, &m, &spec);
    CHECK_OK(ts_compile(gf, &spec, &o, &full));
    if (!exact || !full) goto done;
    double worst_loss = 0;
    for (int step = 0; step < 3; step++) {
        feed_real(exact, step, real, real, classes, masked);
        feed_real(full, step, real, FULL, classes, masked);
        CHECK_OK(ts_plan_step(exact));
        CHECK_OK(ts_plan_step(full));
        double d = fabs(ts_plan_loss(exact) - ts_plan_loss(full));
        if (d > worst_loss) worst_loss = d;
    }
    const double dp = param_diff(exact, full);
    printf("padding %s, %d of %d rows: loss differs by %.3g, parameters by %.3g after 3 steps\n",
           classes ? "cross-entropy" : "masked mse", real, FULL, worst_loss, dp);
    /* Padded rows add exact zeros to every sum; only the blocking of the
     * GEMMs may differ between `real` and 8 rows: fp32 rounding. */
    CHECK(worst_loss <= 1e-6 && dp <= 1e-6, "padded = unpadded (loss %g, parameters %g)",
          worst_loss, dp);
done:
    ts_plan_free(exact), ts_plan_free(full);
    ts_graph_free(ge), ts_graph_free(gf);
}

/* ---- one state, several programs ----------------------------------------- */

typedef struct builder {
    int classes;
    int64_t built[8];
    int n_built;
} builder;

static ts_status build(void *user, int64_t b, int64_t seq, const ts_plan *share, ts_plan **out) {
    (void)seq;
    builder *bd = user;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o = options();
    ts_graph *g = mlp(b, bd->classes, 0, &m, &spec);
    ts_status s = ts_compile_shared(g, &spec, &o, share, out);
    ts_graph_free(g);
    if (s == TS_OK && bd->n_built < 8) bd->built[bd->n_built++] = b;
    return s;
}

static void test_shared(void) {
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o = options();
    ts_graph *g8 = mlp(FULL, CLASSES, 0, &m, &spec);
    ts_graph *g5 = mlp(REAL, CLASSES, 0, &m, &spec);
    ts_plan *p8 = NULL, *p5 = NULL, *ref = NULL;
    CHECK_OK(ts_compile(g8, &spec, &o, &p8));
    CHECK_OK(ts_compile_shared(g5, &spec, &o, p8, &p5));
    CHECK_OK(ts_compile(g5, &spec, &o, &ref));
    if (!p8 || !p5 || !ref) goto done;
    ts_plan_stats s8, s5;
    ts_plan_get_stats(p8, &s8);
    ts_plan_get_stats(p5, &s5);
    CHECK(s5.arena_bytes == s8.arena_bytes - s8.param_bytes - s8.grad_bytes - s8.state_bytes ||
              s5.arena_bytes < s8.arena_bytes - s8.param_bytes,
          "the shared plan allocates no state (%zu vs %zu)", s5.arena_bytes, s8.arena_bytes);
    /* Its temporaries lie in the owner's block: it allocates inputs and outputs alone. */
    CHECK(p5->rt.temps && s5.arena_bytes == s5.io_bytes,
          "temporaries shared (%zu own bytes, inputs and outputs %zu)", s5.arena_bytes,
          s5.io_bytes);
    /* A step of the batch-5 plan updates the batch-8 plan's parameters: they are one. */
    feed(p5, 0, REAL, CLASSES, 0);
    feed(ref, 0, REAL, CLASSES, 0);
    CHECK_OK(ts_plan_step(p5));
    CHECK_OK(ts_plan_step(ref));
    CHECK(param_diff(p8, ref) == 0, "one state: the step on the shared plan is the owner's");
    /* A plan of another model cannot share it. */
    ts_graph *gx = ts_graph_new();
    ts_mlp_config cx = {FULL, 0, 1, IN, HID + 1, 2, OUT, 1, CLASSES};
    ts_model mx;
    CHECK_OK(ts_build_mlp(gx, &cx, &mx));
    ts_train_spec sx = ts_train_spec_default(mx.loss);
    sx.opt = spec.opt;
    ts_plan *px = NULL;
    ts_status st = ts_compile_shared(gx, &sx, &o, p8, &px);
    CHECK(st == TS_ERR_SHAPE && strstr(ts_last_error(), "persistent regions differ"),
          "another model: %s", ts_last_error());
    ts_plan_free(px);
    ts_graph_free(gx);
    /* Swapping programs keeps each plan's step counters. */
    CHECK_OK(ts_plan_swap_program(p8, p5));
    CHECK(ts_plan_step_count(p8) == 0 && ts_plan_step_count(p5) == 1, "counters stay");
    ts_dtype dt;
    int rank;
    int64_t dims[8];
    CHECK_OK(ts_plan_value_info(p8, "x", &dt, &rank, dims));
    CHECK(dims[0] == REAL, "p8 now runs the batch-5 program (%lld)", (long long)dims[0]);
    ts_plan_set_step(p8, 1); /* the handle's counters drive the schedule and Adam's t */
    feed(p8, 1, REAL, CLASSES, 0);
    feed(ref, 1, REAL, CLASSES, 0);
    CHECK_OK(ts_plan_step(p8));
    CHECK_OK(ts_plan_step(ref));
    CHECK(param_diff(p5, ref) == 0, "the swapped program steps the same state");
    CHECK_OK(ts_plan_swap_program(p8, p5));
done:
    ts_plan_free(p5), ts_plan_free(p8), ts_plan_free(ref);
    ts_graph_free(g8), ts_graph_free(g5);
}

static void test_cache(void) {
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o = options();
    ts_graph *g = mlp(FULL, CLASSES, 0, &m, &spec);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    builder bd = {CLASSES, {0}, 0};
    ts_plan_cache *c = NULL;
    if (p) CHECK_OK(ts_plan_cache_new(p, FULL, 0, 0, build, &bd, &c));
    if (!c) goto done;
    const int seq[] = {8, 5, 5, 3, 8, 5, 3, 3, 8};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        CHECK_OK(ts_plan_cache_select(c, seq[i], 0));
        feed(p, (int)i, seq[i] < REAL ? seq[i] : seq[i], CLASSES, 0);
        CHECK_OK(ts_plan_step(p));
        ts_plan_cache_note(c, seq[i] < REAL ? seq[i] : REAL, seq[i]);
    }
    ts_plan_cache_stats st;
    ts_plan_cache_get_stats(c, &st);
    CHECK(st.compiles == 2 && st.misses == 2 && st.hits == 7 && st.evictions == 0 &&
              st.cached == 3 && ts_plan_step_count(p) == 9,
          "compiles %lld misses %lld hits %lld cached %d steps %lld", (long long)st.compiles,
          (long long)st.misses, (long long)st.hits, st.cached, (long long)ts_plan_step_count(p));
    CHECK(st.real == 5 + 5 + 5 + 3 + 5 + 5 + 3 + 3 + 5 && st.padded == 3 * 3, "padding %g of %g",
          st.padded, st.real + st.padded);
    ts_plan_cache_free(c);
    /* A limit below two programs: the least recently used one goes. */
    bd.n_built = 0;
    CHECK_OK(ts_plan_cache_new(p, FULL, 0, 1, build, &bd, &c));
    if (!c) goto done;
    const int seq2[] = {5, 3, 5, 8, 3};
    for (size_t i = 0; i < sizeof seq2 / sizeof seq2[0]; i++)
        CHECK_OK(ts_plan_cache_select(c, seq2[i], 0));
    ts_plan_cache_get_stats(c, &st);
    CHECK(st.compiles == 4 && st.evictions >= 3 && st.cached <= 2,
          "evicting: compiles %lld evictions %lld cached %d", (long long)st.compiles,
          (long long)st.evictions, st.cached);
    ts_plan_cache_free(c);
    ts_dtype dt;
    int rank;
    int64_t dims[8];
    CHECK_OK(ts_plan_value_info(p, "x", &dt, &rank, dims));
    CHECK(dims[0] == FULL, "freeing the cache gives the plan its own program back");
done:
    ts_plan_free(p);
    ts_graph_free(g);
}

/* ---- a gru: rows are independent, padded ones ignored ------------------- */

enum { RS = 6, RF = 3, RH = 8 };

static ts_graph *gru(int64_t batch, ts_train_spec *spec) {
    ts_graph *g = ts_graph_new();
    ts_rnn_config c = {batch, RS, RF, RH, 2, CLASSES, 0};
    ts_model m;
    CHECK_OK(ts_build_gru(g, &c, &m));
    *spec = ts_train_spec_default(m.loss);
    spec->opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    return g;
}

static void gru_feed(ts_plan *p, int step, int real, int rows) {
    float x[FULL * RS * RF] = {0};
    int64_t y[FULL];
    unsigned seed = 3u + (unsigned)step;
    for (int i = 0; i < real * RS * RF; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int r = 0; r < rows; r++) y[r] = r < real ? rand_r(&seed) % CLASSES : TS_SHAPE_IGNORE;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)rows * RS * RF));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(int64_t) * (size_t)rows));
}

static void test_gru(int real) {
    ts_train_spec se, sf;
    ts_compile_options o = options();
    ts_graph *ge = gru(real, &se), *gf = gru(FULL, &sf);
    ts_plan *exact = NULL, *full = NULL;
    CHECK_OK(ts_compile(ge, &se, &o, &exact));
    CHECK_OK(ts_compile(gf, &sf, &o, &full));
    double worst = 0;
    for (int k = 0; exact && full && k < 3; k++) {
        gru_feed(exact, k, real, real);
        gru_feed(full, k, real, FULL);
        CHECK_OK(ts_plan_step(exact));
        CHECK_OK(ts_plan_step(full));
        if (fabs(ts_plan_loss(exact) - ts_plan_loss(full)) > worst)
            worst = fabs(ts_plan_loss(exact) - ts_plan_loss(full));
    }
    const double dp = exact && full ? param_diff(exact, full) : 1;
    printf("gru: padded %d of %d rows: losses differ by %.3g, parameters by %.3g\n", FULL - real,
           FULL, worst, dp);
    CHECK(worst <= 1e-6 && dp <= 1e-6, "gru padded = unpadded (loss %g, parameters %g)", worst, dp);
    ts_plan_free(exact), ts_plan_free(full);
    ts_graph_free(ge), ts_graph_free(gf);
}

/* ---- a cnn with BatchNorm: exact shapes on one state ---------------------- */

/* Padding would enter BatchNorm's batch statistics, so a BatchNorm model
 * trains a short batch on a plan of exactly its rows (shape.policy exact,
 * data.drop_last false): that plan shares the full plan's parameters,
 * optimizer state and running statistics, and trains them exactly as a
 * plan of its own would. */
static ts_graph *cnn(int64_t batch, ts_train_spec *spec) {
    ts_graph *g = ts_graph_new();
    ts_cnn_config c = {batch, 1, 8, 8, 4, 4, CLASSES, 0};
    ts_model m;
    CHECK_OK(ts_build_cnn(g, &c, &m));
    *spec = ts_train_spec_default(m.loss);
    spec->opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    return g;
}

static void cnn_feed(ts_plan *p, int step, int rows) {
    float x[REAL * 64];
    int64_t y[REAL];
    unsigned seed = 8u + (unsigned)step;
    for (int i = 0; i < rows * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX;
    for (int r = 0; r < rows; r++) y[r] = rand_r(&seed) % CLASSES;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)rows * 64));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(int64_t) * (size_t)rows));
}

static void test_cnn(void) {
    ts_train_spec s8, s5;
    ts_compile_options o = options();
    ts_graph *g8 = cnn(FULL, &s8), *g5 = cnn(REAL, &s5);
    ts_plan *owner = NULL, *shared = NULL, *alone = NULL;
    CHECK_OK(ts_compile(g8, &s8, &o, &owner));
    CHECK_OK(ts_compile(g5, &s5, &o, &alone));
    if (owner) CHECK_OK(ts_compile_shared(g5, &s5, &o, owner, &shared));
    for (int k = 0; shared && alone && k < 3; k++) {
        cnn_feed(shared, k, REAL);
        cnn_feed(alone, k, REAL);
        ts_plan_set_step(shared, k);
        CHECK_OK(ts_plan_step(shared));
        CHECK_OK(ts_plan_step(alone));
    }
    if (owner && alone) {
        CHECK(param_diff(owner, alone) == 0, "cnn: the shared exact plan trains the owner's state");
        float a[4], b[4];
        CHECK_OK(ts_plan_read(owner, "features.1.running_mean", a, sizeof a));
        CHECK_OK(ts_plan_read(alone, "features.1.running_mean", b, sizeof b));
        CHECK(!memcmp(a, b, sizeof a) && a[0] != 0, "running statistics are shared state");
    }
    ts_plan_free(shared), ts_plan_free(owner), ts_plan_free(alone);
    ts_graph_free(g8), ts_graph_free(g5);
}

/* ---- a cnn with BatchNorm, padded: statistics over the real rows ---------- */

/* REAL images padded to FULL rows (x 0, targets -100, mask 0) on a plan
 * whose BatchNorms read the row mask: the statistics take the same blocks
 * of the same rows in the same order as a batch of REAL rows. */
static void cnn_feed_padded(ts_plan *p, int step, int real, int rows, const float *mask) {
    float x[FULL * 64] = {0};
    int64_t y[FULL];
    unsigned seed = 8u + (unsigned)step;
    for (int i = 0; i < real * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX;
    for (int r = 0; r < rows; r++) y[r] = r < real ? rand_r(&seed) % CLASSES : TS_SHAPE_IGNORE;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)rows * 64));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(int64_t) * (size_t)rows));
    if (mask) CHECK_OK(ts_plan_set_input(p, "mask", mask, sizeof(float) * (size_t)rows));
}

static int stats_equal(const ts_plan *a, const ts_plan *b, const char *name) {
    float x[4], y[4];
    CHECK_OK(ts_plan_read(a, name, x, sizeof x));
    CHECK_OK(ts_plan_read(b, name, y, sizeof y));
    return !memcmp(x, y, sizeof x);
}

static void test_cnn_padded(int real) {
    ts_train_spec se, sp;
    ts_compile_options o = options();
    ts_graph *ge = cnn(real, &se), *gp = cnn(FULL, &sp);
    int n_bn = 0;
    CHECK_OK(ts_batch_norm_mask_rows(gp, "mask", &n_bn));
    CHECK(n_bn == 2, "both BatchNorms read the mask (%d)", n_bn);
    ts_graph *gn = ts_graph_new();
    CHECK_OK(ts_batch_norm_mask_rows(gn, "mask", &n_bn));
    CHECK(n_bn == 0 && !ts_val_ok(ts_find(gn, "mask")), "no BatchNorm, no mask input");
    ts_graph_free(gn);
    ts_plan *exact = NULL, *padded = NULL;
    CHECK_OK(ts_compile(ge, &se, &o, &exact));
    CHECK_OK(ts_compile(gp, &sp, &o, &padded));
    float mask[FULL];
    for (int r = 0; r < FULL; r++) mask[r] = r < real ? 1.0f : 0.0f;
    double worst = 0;
    for (int k = 0; exact && padded && k < 3; k++) {
        cnn_feed_padded(exact, k, real, real, NULL);
        cnn_feed_padded(padded, k, real, FULL, mask);
        CHECK_OK(ts_plan_step(exact));
        CHECK_OK(ts_plan_step(padded));
        const double d = fabs(ts_plan_loss(exact) - ts_plan_loss(padded));
        if (d > worst) worst = d;
    }
    if (exact && padded) {
        const double dp = param_diff(exact, padded);
        const int same = stats_equal(exact, padded, "features.1.running_mean") &&
                         stats_equal(exact, padded, "features.1.running_var") &&
                         stats_equal(exact, padded, "features.5.running_mean") &&
                         stats_equal(exact, padded, "features.5.running_var");
        printf("cnn with BatchNorm: padded %d of %d rows: losses differ by %.3g, parameters by "
               "%.3g, running statistics %s\n",
               FULL - real, FULL, worst, dp, same ? "bit-identical" : "differ");
        CHECK(worst == 0 && dp == 0 && same, "cnn padded = unpadded bit for bit");
        /* a mask of other values than 0 and 1 is refused by the step (one
         * with holes is a sensor mask: gradcheck/batchnorm_masked) */
        mask[0] = 0.5f;
        cnn_feed_padded(padded, 3, real, FULL, mask);
        CHECK(ts_plan_step(padded) != TS_OK && strstr(ts_last_error(), "row mask"),
              "a mask of 0.5 is refused: %s", ts_last_error());
    }
    ts_plan_free(exact), ts_plan_free(padded);
    ts_graph_free(ge), ts_graph_free(gp);
}

/* ---- sensor masks: the mean over valid sources --------------------------- */

/* x [3 rows, 3 sources, 2] = input * w (w a parameter [3, 2]); source 1 is
 * invalid in every row and its input is garbage (1000), source 2 is
 * invalid in rows 1 and 2, row 1 has no valid source. The mean takes the
 * valid sources only, row 1 gives 0, and after an SGD step w's row for
 * source 1 is unchanged bit for bit (an exact zero gradient). A second
 * step with NaN in source 1 (a failed sensor) gives a finite mean: the
 * NaN is never read into it. (Its weight's gradient would be NaN * 0:
 * inputs of an invalid source that feed a parameter's gradient must be
 * finite, or masked before the branch too.) */
static void test_masked_mean(void) {
    enum { MB = 3, MS = 3, MD = 2 };
    ts_graph *g = ts_graph_new();
    int64_t xd[3] = {MB, MS, MD}, vd[2] = {MB, MS}, wd[2] = {MS, MD};
    ts_val in = ts_input(g, "x", TS_F32, 3, xd), valid = ts_input(g, "valid", TS_U8, 2, vd);
    ts_val w = ts_param(g, "w", TS_F32, 2, wd, ts_init_uniform(0.5, 1.5));
    ts_val mean = ts_masked_mean(g, ts_mul(g, in, w), valid);
    ts_mark_output(g, mean, "mean");
    ts_val loss = ts_sum(g, ts_mul(g, mean, mean), 0, NULL, 0);
    ts_set_name(g, loss, "loss");
    CHECK_OK(ts_graph_status(g));
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = options();
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (p) {
        float x[MB * MS * MD], w0[MS * MD], w1[MS * MD], out[MB * MD];
        for (int i = 0; i < MB * MS * MD; i++) x[i] = 0.25f * (float)(i + 1);
        for (int b = 0; b < MB; b++)
            for (int d = 0; d < MD; d++) x[(b * MS + 1) * MD + d] = 1000.0f;
        const unsigned char v[MB * MS] = {1, 0, 1, 0, 0, 0, 1, 0, 0};
        CHECK_OK(ts_plan_read(p, "w", w0, sizeof w0));
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "valid", v, sizeof v));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, "mean", out, sizeof out));
        CHECK_OK(ts_plan_read(p, "w", w1, sizeof w1));
        int good = 1;
        for (int d = 0; d < MD; d++) {
            const float r0 = (x[0 * MD + d] * w0[0 * MD + d] + x[2 * MD + d] * w0[2 * MD + d]) / 2;
            const float r2 = x[(2 * MS + 0) * MD + d] * w0[d];
            good &= out[d] == r0 && out[MD + d] == 0.0f && out[2 * MD + d] == r2;
            good &= w1[MD + d] == w0[MD + d] && isfinite(w1[MD + d]);
            good &= w1[d] != w0[d] && w1[2 * MD + d] != w0[2 * MD + d];
        }
        for (int b = 0; b < MB; b++)
            for (int d = 0; d < MD; d++) x[(b * MS + 1) * MD + d] = NAN;
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_step(p));
        float out2[MB * MD];
        CHECK_OK(ts_plan_read(p, "mean", out2, sizeof out2));
        for (int i = 0; i < MB * MD; i++) good &= isfinite(out2[i]);
        printf("masked mean: valid sources only (%.4g %.4g | %g | %.4g), dropped source's weights "
               "%s\n",
               out[0], out[1], out[MD], out[2 * MD], w1[MD] == w0[MD] ? "unchanged" : "changed");
        CHECK(good, "masked mean over valid sources; a dropped source gets an exact zero gradient");
    }
    ts_plan_free(p);
    ts_graph_free(g);
    /* bad input: valid of the wrong shape */
    g = ts_graph_new();
    int64_t bad[2] = {MB, MS + 1};
    ts_val r = ts_masked_mean(g, ts_input(g, "x", TS_F32, 3, xd), ts_input(g, "v", TS_U8, 2, bad));
    CHECK(!ts_val_ok(r) && strstr(ts_last_error(), "valid must be u8"), "bad mask: %s",
          ts_last_error());
    ts_graph_free(g);
}

/* ---- a gpt on sequence buckets -------------------------------------------- */

enum { GB = 2, GT = 16, GL = 8, GV = 32, GD = 16 };

/* The gpt of the config at sequence bucket `seq` (0: model.ctx). */
static ts_graph *gpt(int64_t seq, ts_train_spec *spec, ts_compile_options *o) {
    ts_config c;
    ts_graph *g = NULL;
    ts_model m;
    CHECK_OK(load(&c, "model: {name: gpt, batch: 2, ctx: 16, vocab: 32, d_model: 16, n_layers: "
                      "2, n_heads: 2, dropout: 0}\ntrain: {optimizer: adamw, seed: 9}\n"));
    c.shape.build_seq = seq;
    CHECK_OK(ts_config_build_graph(&c, NULL, &g, &m, spec, o));
    return g;
}

/* Step `k`: GB documents of at most GL tokens, the rest padding. */
static void gpt_batch(int k, int64_t T, int64_t *x, int64_t *y) {
    unsigned seed = 5u + (unsigned)k;
    for (int r = 0; r < GB; r++) {
        const int len = r == 0 ? GL : 3 + k % 4; /* the longest fills the bucket */
        for (int t = 0; t < T; t++) {
            x[r * T + t] = t < len ? rand_r(&seed) % (GV - 1) : GV - 1;
            y[r * T + t] = t < len ? rand_r(&seed) % (GV - 1) : TS_SHAPE_IGNORE;
        }
    }
}

static void test_gpt(void) {
    ts_train_spec sf, sl;
    ts_compile_options of, ol;
    ts_graph *gf = gpt(0, &sf, &of), *gl = gpt(GL, &sl, &ol);
    ts_plan *padded = NULL, *owner = NULL, *bucket = NULL;
    if (!gf || !gl) goto done;
    CHECK_OK(ts_compile(gf, &sf, &of, &padded));
    CHECK_OK(ts_compile(gf, &sf, &of, &owner));
    if (!owner) goto done;
    CHECK_OK(ts_compile_shared(gl, &sl, &ol, owner, &bucket));
    if (!padded || !bucket) goto done;
    float *grad = malloc(sizeof(float) * GT * GD);
    int zero_rows = 1;
    for (int k = 0; k < 3; k++) {
        int64_t x[GB * GT], y[GB * GT], xs[GB * GL], ys[GB * GL];
        gpt_batch(k, GT, x, y);
        gpt_batch(k, GL, xs, ys);
        CHECK_OK(ts_plan_set_input(padded, "tokens", x, sizeof x));
        CHECK_OK(ts_plan_set_input(padded, "targets", y, sizeof y));
        CHECK_OK(ts_plan_set_input(bucket, "tokens", xs, sizeof xs));
        CHECK_OK(ts_plan_set_input(bucket, "targets", ys, sizeof ys));
        ts_plan_set_step(bucket, k);
        CHECK_OK(ts_plan_step(padded));
        CHECK_OK(ts_plan_step(bucket));
        CHECK(ts_plan_loss(padded) == ts_plan_loss(bucket), "step %d: loss %.9g vs %.9g", k,
              ts_plan_loss(padded), ts_plan_loss(bucket));
        /* Positions past every document only see themselves and later
         * padding: their position embeddings get no gradient at all. */
        CHECK_OK(ts_plan_read(padded, "grad:wpe.weight", grad, sizeof(float) * GT * GD));
        for (int i = GL * GD; i < GT * GD; i++) zero_rows &= grad[i] == 0.0f;
    }
    free(grad);
    CHECK(zero_rows, "the gradient of padded positions' embeddings is exactly 0");
    const double dp = param_diff(padded, owner);
    printf("gpt: sequence bucket %d of %d vs padding to %d: parameters differ by %.3g\n", GL, GT,
           GT, dp);
    /* The losses are bit-identical; GEMMs over 16 rather than 8 positions
     * block their sums differently, and AdamW's m / sqrt(v) magnifies that
     * rounding for near-zero gradients: 1e-5 after 3 steps of lr 1e-3. */
    CHECK(dp <= 1e-5, "gpt padded to ctx vs its sequence bucket: %g", dp);
done:
    ts_plan_free(bucket), ts_plan_free(owner), ts_plan_free(padded);
    ts_graph_free(gf), ts_graph_free(gl);
}

int main(void) {
    test_parse();
    test_config();
    /* padded vs unpadded for each batch shape of the 8-row bucket */
    for (int real = 1; real < FULL; real++) {
        test_padding(CLASSES, real);
        test_padding(0, real);
        test_gru(real);
        test_cnn_padded(real);
    }
    test_shared();
    test_cache();
    test_cnn();
    test_masked_mean();
    test_gpt();
    return check_summary("shapes");
}
