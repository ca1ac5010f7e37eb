/* Sensor masks of the fusion model (src/models/fusion_mask.c, model.source_mask,
 * train.source_dropout; docs/shapes.md "Sensor masks"):
 * - the gate and the masked mean give a dropped source's input and branch
 *   output an exact zero gradient, and a gradcheck of gate -> tanh -> mean;
 * - the whole model with a mask: NaN in a dropped source's inputs leaves
 *   the loss and every gradient finite; a source dropped in every row keeps
 *   its branch's weights bit for bit under SGD while the others move; the
 *   camera's BatchNorm statistics are those of the rows with a camera;
 * - the dropout flags: a pure function of (seed, step, row, source), about
 *   p of them dropped, never every source of a row;
 * - the keys: source_mask off builds the model without the input valid,
 *   and bad values are refused naming the key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "gradcheck.h"
#include "models/fusion_mask.h"
#include "models/model.h"
#include "tessel/config.h"

enum { B = 4, D = 3, S = TS_FUSION_SOURCES };

static ts_compile_options options(void) {
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    o.threads = 1;
    return o;
}

static ts_status load(ts_config *c, const char *yaml, char *err, size_t n) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, yaml, strlen(yaml), "t.yaml");
    if (s == TS_OK) s = ts_config_finish(c);
    snprintf(err, n, "%s", s == TS_OK ? "" : ts_last_error());
    return s;
}

/* Row b has source k when (b + k) % 3 != 0: every row lacks one source. */
static void flags(uint8_t *v) {
    for (int b = 0; b < B; b++)
        for (int k = 0; k < S; k++) v[b * S + k] = (b + k) % 3 != 0;
}

/* The gradients of three branch inputs through the gates, a nonlinearity
 * and the masked mean: exactly 0 where the row lacks the source, not 0
 * elsewhere; the inputs of missing sources hold NaN. */
static void test_zero_gradients(void) {
    ts_graph *g = ts_graph_new();
    int64_t pd[2] = {B, D}, vd[2] = {B, S};
    ts_val valid = ts_input(g, "valid", TS_U8, 2, vd), parts[S];
    for (int k = 0; k < S; k++) {
        char name[16];
        snprintf(name, sizeof name, "in%d", k);
        ts_val in = ts_input(g, name, TS_F32, 2, pd);
        snprintf(name, sizeof name, "w%d", k);
        ts_val w = ts_param(g, name, TS_F32, 2, pd, ts_init_uniform(0.5, 1.5));
        /* the branch's output is a parameter times its (gated) input */
        parts[k] = ts_tanh(g, ts_mul(g, ts_fusion_gate(g, in, valid, k), w));
    }
    ts_val f = ts_fusion_mean(g, S, parts, valid);
    ts_val loss = ts_sum(g, ts_mul(g, f, f), 0, NULL, 0);
    ts_set_name(g, loss, "loss");
    CHECK_OK(ts_graph_status(g));
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = options();
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (p) {
        uint8_t v[B * S];
        flags(v);
        CHECK_OK(ts_plan_set_input(p, "valid", v, sizeof v));
        for (int k = 0; k < S; k++) {
            float x[B * D];
            for (int i = 0; i < B * D; i++)
                x[i] = v[(i / D) * S + k] ? 0.1f * (float)(i + 1 + k) : NAN;
            char name[16];
            snprintf(name, sizeof name, "in%d", k);
            CHECK_OK(ts_plan_set_input(p, name, x, sizeof x));
        }
        CHECK_OK(ts_plan_step(p));
        CHECK(isfinite(ts_plan_loss(p)), "loss %g with NaN in dropped inputs", ts_plan_loss(p));
        int zero = 1, moved = 1;
        for (int k = 0; k < S; k++) {
            float grad[B * D];
            char name[24];
            snprintf(name, sizeof name, "grad:w%d", k);
            CHECK_OK(ts_plan_read(p, name, grad, sizeof grad));
            for (int i = 0; i < B * D; i++) {
                if (v[(i / D) * S + k])
                    moved &= grad[i] != 0.0f && isfinite(grad[i]);
                else
                    zero &= grad[i] == 0.0f;
            }
        }
        CHECK(zero, "a dropped source's branch gets an exact zero gradient");
        CHECK(moved, "a present source's branch gets a finite, nonzero gradient");
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

/* Gradients with respect to a dropped source's input and its branch output
 * are exactly 0: both as parameters of a graph gate -> mean. */
static void test_input_and_output_gradients(void) {
    ts_graph *g = ts_graph_new();
    int64_t pd[2] = {B, D}, vd[2] = {B, S};
    ts_val valid = ts_input(g, "valid", TS_U8, 2, vd), parts[S];
    for (int k = 0; k < S; k++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", k); /* the source's input */
        ts_val x = ts_param(g, name, TS_F32, 2, pd, ts_init_uniform(-1, 1));
        snprintf(name, sizeof name, "o%d", k); /* an offset on the branch output */
        ts_val off = ts_param(g, name, TS_F32, 2, pd, ts_init_uniform(-1, 1));
        parts[k] = ts_add(g, ts_tanh(g, ts_fusion_gate(g, x, valid, k)), off);
    }
    ts_val f = ts_fusion_mean(g, S, parts, valid);
    ts_val loss = ts_sum(g, ts_mul(g, f, f), 0, NULL, 0);
    ts_set_name(g, loss, "loss");
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = options();
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (p) {
        uint8_t v[B * S];
        flags(v);
        CHECK_OK(ts_plan_set_input(p, "valid", v, sizeof v));
        CHECK_OK(ts_plan_step(p));
        int zero = 1, some = 0;
        for (int k = 0; k < S; k++)
            for (int which = 0; which < 2; which++) {
                float grad[B * D];
                char name[24];
                snprintf(name, sizeof name, "grad:%c%d", which ? 'o' : 'x', k);
                CHECK_OK(ts_plan_read(p, name, grad, sizeof grad));
                for (int i = 0; i < B * D; i++) {
                    if (!v[(i / D) * S + k])
                        zero &= grad[i] == 0.0f;
                    else
                        some += grad[i] != 0.0f;
                }
            }
        CHECK(zero, "a dropped source's input and branch output get exact zero gradients");
        CHECK(some > B * D, "only %d nonzero gradients of present sources", some);
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

static ts_val gc_fusion(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val parts[S];
    for (int k = 0; k < S; k++) parts[k] = ts_tanh(g, ts_fusion_gate(g, in[k], in[S], k));
    return ts_fusion_mean(g, S, parts, in[S]);
}

static void test_gradcheck(void) {
    uint8_t v[B * S];
    flags(v);
    v[0] = v[1] = v[2] = 0; /* a row with no source: zeros, zero gradients */
    gc_input in[S + 1] = {GC_F(B, D), GC_F(B, D), GC_F(B, D), {TS_U8, 2, {B, S}, 0, 0, 0, v}};
    CHECK(gc_check("masked fusion: gates, tanh, masked mean", S + 1, in, gc_fusion, NULL) == 0,
          "gradcheck of the masked fusion");
}

/* ---- the model ------------------------------------------------------------- */

static const char *SMALL = "model: {name: fusion, batch: 4, channels: 2, height: 8, width: 8, "
                           "c1: 4, c2: 8, ctx: 5, features: 3, hidden: 8, in_dim: 150, "
                           "source_mask: true}\n";
enum { IN = 150, CAM = 2 * 8 * 8 };

static ts_plan *model_plan(const char *yaml, ts_graph **gp) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, yaml, err, sizeof err);
    CHECK(s == TS_OK, "config: %s", err);
    if (s != TS_OK) return NULL;
    ts_graph *g = ts_graph_new();
    ts_model m;
    ts_plan *p = NULL;
    s = ts_model_of(&c)->build(&c, NULL, g, &m);
    if (s == TS_OK) {
        ts_train_spec spec = ts_train_spec_default(m.loss);
        spec.opt = ts_sgd(0.05, 0, 0, 0, 0);
        ts_compile_options o = options();
        s = ts_compile(g, &spec, &o, &p);
    }
    CHECK(s == TS_OK, "fusion with source_mask: %s", ts_last_error());
    *gp = g;
    return p;
}

static int is_camera(const char *name) {
    return !strncmp(name, "camera.", 7);
}

/* Camera missing in rows `dropped` (a bit per row), its inputs there NaN:
 * one SGD step. Returns 1 when the loss and all gradients are finite;
 * *kept gets whether every camera parameter kept its bits, *moved whether
 * every other parameter changed. */
static int model_step(unsigned dropped, int *kept, int *moved) {
    ts_graph *g = NULL;
    ts_plan *p = model_plan(SMALL, &g);
    int finite = 0;
    *kept = *moved = 1;
    if (p) {
        float x[B * IN], y[B];
        uint8_t v[B * S];
        unsigned seed = 7;
        for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
        for (int b = 0; b < B; b++) {
            y[b] = x[b * IN + 3] + x[b * IN + CAM + 1] - x[b * IN + IN - 1];
            v[b * S] = !(dropped >> b & 1), v[b * S + 1] = 1, v[b * S + 2] = 1;
            if (dropped >> b & 1)
                for (int i = 0; i < CAM; i++) x[b * IN + i] = NAN;
        }
        const int n = ts_plan_param_count(p);
        float *before[64] = {0};
        size_t bytes[64] = {0};
        for (int i = 0; i < n && i < 64; i++) {
            int rank;
            int64_t dims[8];
            ts_plan_value_info(p, ts_plan_param_name(p, i), NULL, &rank, dims);
            bytes[i] = sizeof(float);
            for (int d = 0; d < rank; d++) bytes[i] *= (size_t)dims[d];
            before[i] = malloc(bytes[i]);
            ts_plan_read(p, ts_plan_param_name(p, i), before[i], bytes[i]);
        }
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
        CHECK_OK(ts_plan_set_input(p, "valid", v, sizeof v));
        CHECK_OK(ts_plan_step(p));
        finite = isfinite(ts_plan_loss(p));
        for (int i = 0; i < n && i < 64; i++) {
            const char *name = ts_plan_param_name(p, i);
            float *after = malloc(bytes[i]), *grad = malloc(bytes[i]);
            char gname[96];
            snprintf(gname, sizeof gname, "grad:%s", name);
            ts_plan_read(p, name, after, bytes[i]);
            CHECK_OK(ts_plan_read(p, gname, grad, bytes[i]));
            for (size_t e = 0; e < bytes[i] / sizeof(float); e++) finite &= isfinite(grad[e]);
            const int same = !memcmp(after, before[i], bytes[i]);
            if (is_camera(name))
                *kept &= same;
            else
                *moved &= !same;
            free(after), free(grad), free(before[i]);
        }
    }
    ts_plan_free(p);
    ts_graph_free(g);
    return finite;
}

static void test_model(void) {
    int kept, moved;
    /* the camera missing in every row: its weights keep their bits */
    CHECK(model_step(0xf, &kept, &moved), "camera NaN in every row: loss or a gradient not finite");
    CHECK(kept, "a source dropped in every row: its branch's weights moved under SGD");
    CHECK(moved, "the present sources' weights did not all move");
    /* missing in rows 1 and 2 only: still finite, and the camera learns */
    CHECK(model_step(0x6, &kept, &moved), "camera NaN in rows 1, 2: loss or a gradient not finite");
    CHECK(!kept, "a camera present in rows 0 and 3 did not learn");
}

/* The camera's BatchNorms take their statistics over the rows that have a
 * camera: four rows with every source, in batches of 6 and 8 rows whose
 * other rows lack the camera (2 and 4 of them, in other places, their
 * camera values garbage, NaN or zeros), give those four rows the same
 * predictions and the BatchNorms the same running statistics, bit for
 * bit. (Before, the missing cameras' zeros joined the statistics.) */
enum { PRESENT = 4 };

static void camera_batch(int rows, const int *place, float *x, float *y, uint8_t *v) {
    unsigned seed = 11;
    float real[PRESENT][IN];
    for (int p = 0; p < PRESENT; p++)
        for (int i = 0; i < IN; i++) real[p][i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int b = 0; b < rows; b++) {
        v[b * S] = 0, v[b * S + 1] = 1, v[b * S + 2] = 1;
        for (int i = 0; i < IN; i++) /* the other sources of a camera-less row */
            x[b * IN + i] = i < CAM ? (b % 3 == 0   ? NAN
                                       : b % 3 == 1 ? 1e3f * (float)b
                                                    : 0.0f)
                                    : 0.25f * (float)((b * 7 + i) % 5) - 0.5f;
        y[b] = 0.1f * (float)b;
    }
    for (int p = 0; p < PRESENT; p++) {
        memcpy(x + place[p] * IN, real[p], sizeof real[p]);
        v[place[p] * S] = 1;
        y[place[p]] = real[p][3] + real[p][CAM + 1];
    }
}

static void test_camera_statistics(void) {
    static const int rows[2] = {6, 8}, place[2][PRESENT] = {{0, 2, 3, 5}, {1, 2, 5, 6}};
    static const char *stats[4] = {"camera.1.running_mean", "camera.1.running_var",
                                   "camera.5.running_mean", "camera.5.running_var"};
    float pred[2][PRESENT], st[2][4][8];
    for (int k = 0; k < 2; k++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml,
                 "model: {name: fusion, batch: %d, channels: 2, height: 8, width: 8, c1: 4, c2: 8, "
                 "ctx: 5, features: 3, hidden: 8, in_dim: 150, source_mask: true}\n",
                 rows[k]);
        ts_graph *g = NULL;
        ts_plan *p = model_plan(yaml, &g);
        float x[8 * IN], y[8], out[8];
        uint8_t v[8 * S];
        camera_batch(rows[k], place[k], x, y, v);
        if (p) {
            CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)(rows[k] * IN)));
            CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)rows[k]));
            CHECK_OK(ts_plan_set_input(p, "valid", v, (size_t)(rows[k] * S)));
            CHECK_OK(ts_plan_step(p));
            CHECK(isfinite(ts_plan_loss(p)), "loss %g", ts_plan_loss(p));
            CHECK_OK(ts_plan_read(p, "pred", out, sizeof(float) * (size_t)rows[k]));
            for (int i = 0; i < PRESENT; i++) pred[k][i] = out[place[k][i]];
            for (int i = 0; i < 4; i++)
                CHECK_OK(ts_plan_read(p, stats[i], st[k][i], sizeof(float) * (i < 2 ? 4 : 8)));
        }
        ts_plan_free(p);
        ts_graph_free(g);
    }
    int same_stats = 1;
    for (int i = 0; i < 4; i++)
        same_stats &= !memcmp(st[0][i], st[1][i], sizeof(float) * (i < 2 ? 4 : 8));
    printf("camera BatchNorm over the rows with a camera: 2 vs 4 rows without: predictions %s "
           "(%.9g vs %.9g), running statistics %s\n",
           memcmp(pred[0], pred[1], sizeof pred[0]) ? "differ" : "bit-identical",
           (double)pred[0][0], (double)pred[1][0], same_stats ? "bit-identical" : "differ");
    CHECK(!memcmp(pred[0], pred[1], sizeof pred[0]),
          "the rows with a camera depend on how many rows lack one");
    CHECK(same_stats, "the camera BatchNorms' running statistics depend on the rows without one");
}

/* ---- the dropout flags ------------------------------------------------------ */

static void test_flags(void) {
    enum { ROWS = 10000 };
    uint8_t *a = malloc(ROWS * S), *b = malloc(ROWS * S), *c = malloc(ROWS * S);
    ts_fusion_valid(ROWS, 1, 5, 0.5, NULL, a);
    ts_fusion_valid(ROWS, 1, 5, 0.5, NULL, b);
    ts_fusion_valid(ROWS, 1, 6, 0.5, NULL, c);
    CHECK(!memcmp(a, b, ROWS * S), "the same seed, step and rows gave other flags");
    CHECK(memcmp(a, c, ROWS * S), "another step gave the same flags");
    int none = 0, zeros = 0;
    for (int r = 0; r < ROWS; r++) {
        none += !a[r * S] && !a[r * S + 1] && !a[r * S + 2];
        for (int k = 0; k < S; k++) zeros += !a[r * S + k];
    }
    /* each dropped with p 1/2, and one of three kept where all three would
     * go (1/8 of rows): 1.5 - 1/8 dropped per row, 0.458 of the flags; the
     * bounds are 8 standard deviations of 30000 draws either side */
    const double share = (double)zeros / (ROWS * S);
    CHECK(none == 0, "%d rows lost every source", none);
    CHECK(share > 0.435 && share < 0.481, "%.4f of the flags dropped at p 0.5", share);
    ts_fusion_valid(ROWS, 1, 5, 0, NULL, a);
    int ones = 1;
    for (int i = 0; i < ROWS * S; i++) ones &= a[i] == 1;
    CHECK(ones, "p 0 dropped a source");
    /* flags from the data (data.valid): all present gives the flags drawn
     * without them, bit for bit; a source the data lacks is never set, a
     * row keeps one of the sources it has, and a row with none stays empty */
    uint8_t *have = malloc(ROWS * S);
    memset(have, 1, ROWS * S);
    ts_fusion_valid(ROWS, 1, 5, 0.5, NULL, a);
    ts_fusion_valid(ROWS, 1, 5, 0.5, have, b);
    CHECK(!memcmp(a, b, ROWS * S), "every source present in the data changed the drawn flags");
    for (int r = 0; r < ROWS; r++) have[r * S] = 0, have[r * S + 2] = r % 2;
    have[S] = have[S + 1] = have[S + 2] = 0; /* row 1: no source at all */
    ts_fusion_valid(ROWS, 1, 5, 0.5, have, b);
    int lacked = 0, empty = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int k = 0; k < S; k++) lacked += b[r * S + k] && !have[r * S + k];
        empty += r != 1 && !b[r * S] && !b[r * S + 1] && !b[r * S + 2];
    }
    CHECK(lacked == 0, "%d flags set for sources the data lacks", lacked);
    CHECK(empty == 0, "%d rows with a source in the data lost every source", empty);
    CHECK(!b[S] && !b[S + 1] && !b[S + 2], "a row without a source in the data got one");
    ts_fusion_valid(ROWS, 1, 5, 0, have, b);
    CHECK(!memcmp(have, b, ROWS * S), "p 0 did not give the data's flags");
    free(have);
    free(a), free(b), free(c);
}

/* ---- the keys ---------------------------------------------------------------- */

static void bad(const char *what, const char *yaml, const char *want) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, yaml, err, sizeof err);
    CHECK(s == TS_ERR_INVALID && strstr(err, want), "%s: '%s' should contain '%s'", what, err,
          want);
}

static void test_keys(void) {
    ts_config c;
    char err[1024];
    CHECK_OK(load(&c, "model: {name: fusion}\n", err, sizeof err));
    CHECK(!c.model.source_mask && c.train.source_dropout == 0, "defaults: mask %d, dropout %g",
          c.model.source_mask, c.train.source_dropout);
    /* off: the graph has no input valid */
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_model_of(&c)->build(&c, NULL, g, &m));
    ts_plan *p = NULL;
    ts_compile_options o = options();
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    CHECK(p && ts_plan_value_info(p, "valid", NULL, NULL, NULL) != TS_OK,
          "source_mask off: the model has an input valid");
    ts_plan_free(p);
    ts_graph_free(g);
    bad("dropout without a mask", "model: {name: fusion}\ntrain: {source_dropout: 0.2}\n",
        "train.source_dropout 0.2 needs model.source_mask: true");
    bad("dropout 1", "model: {name: fusion, source_mask: true}\ntrain: {source_dropout: 1}\n",
        "train.source_dropout");
    bad("dropout < 0", "model: {name: fusion, source_mask: true}\ntrain: {source_dropout: -0.1}\n",
        "train.source_dropout");
    bad("mask on another model", "model: {name: mlp, source_mask: true}\n",
        "model.source_mask is not a key of mlp models");
}

int main(void) {
    test_zero_gradients();
    test_input_and_output_gradients();
    test_gradcheck();
    test_model();
    test_camera_statistics();
    test_flags();
    test_keys();
    return check_summary("fusion_mask");
}
