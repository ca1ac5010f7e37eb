/* Convolutional models trained in bf16 (the precision pass lowers every
 * conv, conv_bwd_data, conv_bwd_weight and conv_transpose, and the
 * classifier's matmuls) against the same models in f32, from the same
 * initial weights and data:
 *
 * - the small CNN of the model zoo (`cnn`, cnn_small-sized: 1 x 8 x 8
 *   images, widths 4 and 8, 3 classes) and the 3-D U-Net (`unet3d`, 8^3
 *   volumes, channels 2-4-8) train a few steps on synthetic data;
 * - every conv-family node of the bf16 plan reads bf16 operands and writes
 *   f32;
 * - the first step's loss is within 1 % of f32's: bf16 keeps 8 significant
 *   bits, so each operand is off by at most 2^-9 (0.2 %) relative, and a
 *   loss of a forward pass through a few convs and norms moves by a few
 *   tenths of a percent at most (measured: 0.01-0.1 %);
 * - training converges like f32: the loss falls below 75 % of its start in
 *   both, and the mean of the last 5 steps is within 10 % of f32's. Steps
 *   of Adam on gradients that differ by bf16 rounding drift apart a little
 *   more each step (measured: 2 % on the CNN, whose loss is down to
 *   0.0015 by then, so a small absolute gap is a large relative one; 0.01 %
 *   on the U-Net), while a broken cast, layout or kernel does not train at
 *   all (a 75 % drop: the U-Net's Dice term falls slowly over 30 steps,
 *   measured 68 %);
 * - two bf16 runs give bit-identical weights;
 * - fp16 (dynamic loss scaling, reference conv kernels) meets the same
 *   bounds (measured: 0.005 % and 1.2 % on the CNN). */
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "plan/plan.h"

#define STEPS 30

typedef struct model_case {
    const char *name;
    int is_unet;
    ts_cnn_config cnn;
    ts_unet3d_config unet;
    int64_t xn, yn; /* elements of one batch's x and y */
} model_case;

static uint64_t rng;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Batch k (of 4, cycled): CNN images of 3 classes (a bright top-left or
 * top-right quadrant, or a bright bottom half) under noise; U-Net volumes
 * with a bright ball (label 1) at a varying centre under noise. */
static void make_batch(const model_case *m, int k, float *x, int64_t *y) {
    rng = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
    if (!m->is_unet) {
        const ts_cnn_config *c = &m->cnn;
        int64_t H = c->height, W = c->width;
        for (int64_t b = 0; b < c->batch; b++) {
            int cls = (int)((b + k) % 3);
            y[b] = cls;
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < W; j++) {
                    int on = cls == 0   ? i < H / 2 && j < W / 2
                             : cls == 1 ? i < H / 2 && j >= W / 2
                                        : i >= H / 2;
                    x[(b * H + i) * W + j] = (float)(on * 0.8 + urand() * 0.6 - 0.3);
                }
        }
        return;
    }
    const ts_unet3d_config *c = &m->unet;
    int64_t S = c->size, V = S * S * S;
    for (int64_t b = 0; b < c->batch; b++) {
        double cz = 2 + urand() * (S - 4), cy = 2 + urand() * (S - 4), cx = 2 + urand() * (S - 4);
        double r = 1.5 + urand();
        for (int64_t v = 0; v < V; v++) {
            double dz = (double)(v / (S * S)) - cz, dy = (double)(v / S % S) - cy,
                   dx = (double)(v % S) - cx;
            int in = dz * dz + dy * dy + dx * dx <= r * r;
            y[b * V + v] = in;
            x[b * V + v] = (float)(in * 1.0 + urand() * 0.8 - 0.4);
        }
    }
}

typedef struct result {
    double loss[STEPS];
    int convs, low;
    void *weights;
    size_t wbytes;
} result;

static void train(const model_case *m, ts_dtype compute, result *r) {
    memset(r, 0, sizeof *r);
    ts_graph *g = ts_graph_new();
    ts_model md;
    if (m->is_unet)
        CHECK_OK(ts_build_unet3d(g, &m->unet, &md));
    else
        CHECK_OK(ts_build_cnn(g, &m->cnn, &md));
    ts_train_spec spec = ts_train_spec_default(md.loss);
    spec.opt = ts_adam(1e-2, 0.9, 0.999, 1e-8, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    o.threads = 2;
    o.precision.compute = compute;
    ts_plan *p = NULL;
    ts_compiled_graph kept; /* the final graph, to count its mixed-precision convs */
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, &kept));
    float *x = malloc(sizeof(float) * (size_t)m->xn);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)m->yn);
    for (int step = 0; p && step < STEPS; step++) {
        make_batch(m, step % 4, x, y);
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)m->xn));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(int64_t) * (size_t)m->yn));
        CHECK_OK(ts_plan_step(p));
        r->loss[step] = ts_plan_loss(p);
    }
    if (p) {
        const ts_graph *pg = kept.graph;
        for (int i = 0; i < pg->n_nodes; i++) {
            const ts_node *n = &pg->nodes[i];
            if (n->dead || n->op < TS_OP_CONV || n->op > TS_OP_CONV_TRANSPOSE) continue;
            r->convs++;
            r->low += n->a.conv.low == 1 && pg->values[n->in[0]].t.dtype == compute &&
                      pg->values[n->in[1]].t.dtype == compute &&
                      pg->values[n->out[0]].t.dtype == TS_F32;
        }
        /* every persistent value (weights, Adam moments, running statistics) */
        for (int i = 0; i < ts_plan_persistent_count(p); i++) {
            ts_persistent pv;
            CHECK_OK(ts_plan_persistent(p, i, &pv));
            r->weights = realloc(r->weights, r->wbytes + pv.bytes);
            CHECK_OK(ts_plan_read(p, pv.name, (char *)r->weights + r->wbytes, pv.bytes));
            r->wbytes += pv.bytes;
        }
        ts_plan_free(p);
    }
    free(x);
    free(y);
    ts_compiled_graph_free(&kept);
    ts_graph_free(g);
}

static double tail_mean(const result *r) {
    double s = 0;
    for (int i = STEPS - 5; i < STEPS; i++) s += r->loss[i];
    return s / 5;
}

static void compare(const model_case *m) {
    result f, b = {0}, b2 = {0};
    train(m, TS_F32, &f);
    /* The CNN's classifier is a matmul, which oneDNN cannot run in bf16 without AVX-512; the
     * U-Net has none (its convolutions take the reference kernel where oneDNN has no bf16 one). */
    const double tf = tail_mean(&f);
    CHECK(f.convs > 0 && f.low == 0, "%s f32: %d conv nodes, %d low", m->name, f.convs, f.low);
    if (!m->is_unet && !ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("%s, bf16 skipped: %s\n", m->name, ts_cpu_dtype_gemm_why(TS_BF16));
    } else {
        train(m, TS_BF16, &b);
        train(m, TS_BF16, &b2);
        CHECK(b.convs == f.convs && b.low == b.convs,
              "%s bf16: %d of %d conv nodes read bf16 and write f32", m->name, b.low, b.convs);
        double d0 = fabs(b.loss[0] - f.loss[0]) / f.loss[0];
        CHECK(d0 <= 0.01, "%s: first loss bf16 %.6f vs f32 %.6f (%.3g relative, want <= 1 %%)",
              m->name, b.loss[0], f.loss[0], d0);
        double tb = tail_mean(&b), dt = fabs(tb - tf) / tf;
        CHECK(tf < 0.75 * f.loss[0] && tb < 0.75 * b.loss[0],
              "%s: the loss falls (f32 %.4f -> %.4f, bf16 %.4f -> %.4f)", m->name, f.loss[0], tf,
              b.loss[0], tb);
        CHECK(dt <= 0.10, "%s: mean of the last 5 losses bf16 %.5f vs f32 %.5f (%.3g relative)",
              m->name, tb, tf, dt);
        CHECK(b.wbytes > 0 && b.wbytes == b2.wbytes && !memcmp(b.weights, b2.weights, b.wbytes),
              "%s: two bf16 runs end with different weights", m->name);
        printf("%s, %d steps: f32 loss %.5f -> %.5f (last 5), bf16 %.5f -> %.5f; first step %.2g, "
               "last 5 %.2g relative apart; %d conv nodes in bf16\n",
               m->name, STEPS, f.loss[0], tf, b.loss[0], tb, d0, dt, b.low);
    }
    /* fp16 (GradScaler-style dynamic loss scaling; the convolutions run
     * the reference kernel on this CPU): 11 significant bits, so at least
     * as close to f32 as bf16 */
    result h;
    train(m, TS_F16, &h);
    double h0 = fabs(h.loss[0] - f.loss[0]) / f.loss[0], th = tail_mean(&h);
    CHECK(h.low == h.convs && h.convs == f.convs, "%s fp16: %d of %d conv nodes in fp16", m->name,
          h.low, h.convs);
    CHECK(h0 <= 0.01 && fabs(th - tf) / tf <= 0.10,
          "%s fp16: first loss %.6f vs %.6f, last 5 %.5f vs %.5f", m->name, h.loss[0], f.loss[0],
          th, tf);
    printf("%s fp16: loss %.5f -> %.5f (last 5); first step %.2g, last 5 %.2g relative apart\n",
           m->name, h.loss[0], th, h0, fabs(th - tf) / tf);
    free(f.weights);
    free(b.weights);
    free(b2.weights);
    free(h.weights);
}

int main(void) {
    model_case cnn = {.name = "cnn 8x8 4-8 channels", .cnn = {16, 1, 8, 8, 4, 8, 3, 0}};
    cnn.xn = 16 * 64;
    cnn.yn = 16;
    compare(&cnn);
    model_case unet = {
        .name = "unet3d 8^3 2-4-8 channels", .is_unet = 1, .unet = {2, 1, 8, 2, 4, 8, 2}};
    unet.xn = unet.yn = 2 * 512;
    compare(&unet);
    return check_summary("precision_cnn");
}
