/* The unet3d model on synthetic volumes with deterministic shapes: a ball
 * of known centre and radius per volume, seen through unit noise. Trained
 * with Adam on 8 volumes, then evaluated in an inference plan (BatchNorm on
 * its running statistics) on 4 held-out volumes; the Dice score of the
 * predicted foreground (metrics_eval's overlap) must reach 0.85. This is
 * the "U-Net Dice on synthetic volumes" figure of docs/benchmarks.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "session/metrics_eval.h"
#include "tessel/tessel.h"

enum { S = 16, V = S * S * S, B = 2, TRAIN = 8, HELD = 4 };

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
    return (float)(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

/* Volume k: a ball of radius 3..5.5 at a centre in [5, 11)^3, x = mask + noise. */
static void volume(float *x, int64_t *y) {
    double cz = 5 + 6 * uniform(), cy = 5 + 6 * uniform(), cx = 5 + 6 * uniform();
    double r = 3 + 2.5 * uniform();
    for (int z = 0; z < S; z++)
        for (int j = 0; j < S; j++)
            for (int i = 0; i < S; i++) {
                int k = (z * S + j) * S + i;
                double d2 = (z - cz) * (z - cz) + (j - cy) * (j - cy) + (i - cx) * (i - cx);
                y[k] = d2 <= r * r;
                x[k] = (float)y[k] + normal();
            }
}

static void copy_params(ts_plan *from, ts_plan *to) {
    for (int i = 0; i < ts_plan_persistent_count(from); i++) {
        ts_persistent pv;
        CHECK_OK(ts_plan_persistent(from, i, &pv));
        if (ts_plan_value_info(to, pv.name, NULL, NULL, NULL) != TS_OK) continue;
        void *buf = malloc(pv.bytes);
        CHECK_OK(ts_plan_read(from, pv.name, buf, pv.bytes));
        CHECK_OK(ts_plan_write_param(to, pv.name, buf, pv.bytes));
        free(buf);
    }
}

int main(void) {
    static float x[TRAIN + HELD][V];
    static int64_t y[TRAIN + HELD][V];
    for (int k = 0; k < TRAIN + HELD; k++) volume(x[k], y[k]);
    ts_unet3d_config c = {B, 1, S, 4, 8, 16, 2};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_unet3d(g, &c, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adam(1e-2, 0.9, 0.999, 1e-8, 0);
    ts_plan *p = NULL, *ev = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    CHECK_OK(ts_compile(g, NULL, NULL, &ev));
    if (!p || !ev) return check_summary("unet_dice");
    double first = 0, last = 0;
    for (int step = 0; step < 80; step++) {
        int k = (step % (TRAIN / B)) * B;
        CHECK_OK(ts_plan_set_input(p, "x", x[k], sizeof(float) * B * V));
        CHECK_OK(ts_plan_set_input(p, "y", y[k], sizeof(int64_t) * B * V));
        CHECK_OK(ts_plan_step(p));
        last = ts_plan_loss(p);
        if (!step) first = last;
    }
    copy_params(p, ev);
    int64_t tp[2] = {0}, fp[2] = {0}, fn[2] = {0};
    static float logits[B * 2 * V];
    for (int k = TRAIN; k < TRAIN + HELD; k += B) {
        CHECK_OK(ts_plan_set_input(ev, "x", x[k], sizeof(float) * B * V));
        CHECK_OK(ts_plan_step(ev));
        CHECK_OK(ts_plan_read(ev, "logits", logits, sizeof logits));
        for (int b = 0; b < B; b++)
            for (int v = 0; v < V; v++) { /* logits [B, 2, S, S, S] */
                int pred = logits[(b * 2 + 1) * V + v] > logits[(b * 2) * V + v];
                int64_t t = y[k + b][v];
                if (pred == t)
                    tp[t]++;
                else
                    fp[pred]++, fn[t]++;
            }
    }
    double dice_fg = 2.0 * (double)tp[1] / (double)(2 * tp[1] + fp[1] + fn[1]), dice, miou;
    ts_metric_overlap(tp, fp, fn, 2, &dice, &miou);
    CHECK(last < 0.5 * first, "loss %.4f -> %.4f", first, last);
    CHECK(dice_fg >= 0.85, "held-out foreground Dice %.4f (>= 0.85 wanted)", dice_fg);
    printf("unet3d 16^3, 80 steps: loss %.4f -> %.4f; held-out Dice foreground %.4f, mean %.4f, "
           "mIoU %.4f\n",
           first, last, dice_fg, dice, miou);
    ts_plan_free(p);
    ts_plan_free(ev);
    ts_graph_free(g);
    return check_summary("unet_dice");
}
