/* fp8_qat.c — FP8 quantisation-aware training and weight quantisation.
 *
 * A two-layer MLP regresses y = sin(3 x0) + x1 x2 with its hidden weights
 * fake-quantised to E4M3 (ts_fake_quant, straight-through gradient) with one
 * scale per output channel. The scales come from delayed scaling: after
 * each step the weights' per-channel amax goes into an amax history, and
 * the next step quantises with the scales derived from it (Transformer
 * Engine's recipe). At the end the trained weights are quantised for real
 * (ts_quantize) and the error is reported. docs/fp8.md explains the pieces.
 *
 *     build/example_fp8_qat
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "tessel/quant.h"
#include "tessel/tessel.h"

enum { BATCH = 64, IN = 8, HIDDEN = 32, STEPS = 200 };

static void make_batch(unsigned *seed, float *x, float *y) {
    for (int i = 0; i < BATCH; i++) {
        for (int j = 0; j < IN; j++) x[i * IN + j] = 2.0f * (float)rand_r(seed) / RAND_MAX - 1.0f;
        y[i] = sinf(3 * x[i * IN]) + x[i * IN + 1] * x[i * IN + 2];
    }
}

int main(void) {
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {BATCH, IN}, yd[2] = {BATCH, 1}, w1d[2] = {HIDDEN, IN}, b1d[1] = {HIDDEN},
            w2d[2] = {1, HIDDEN}, sd[1] = {HIDDEN};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd), y = ts_input(g, "y", TS_F32, 2, yd);
    /* per-channel scales along axis 0 of fc1.weight, fed every step */
    ts_val s1 = ts_input(g, "fc1.scale", TS_F32, 1, sd);
    ts_val w1 = ts_param(g, "fc1.weight", TS_F32, 2, w1d, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val b1 = ts_param(g, "fc1.bias", TS_F32, 1, b1d, ts_init_uniform(-0.3, 0.3));
    ts_val w2 = ts_param(g, "fc2.weight", TS_F32, 2, w2d, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val h = ts_tanh(g, ts_linear(g, x, ts_fake_quant(g, w1, s1, TS_F8E4M3, 0), b1));
    ts_val loss = ts_mse_loss(g, ts_linear(g, h, w2, TS_NONE), y);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.0);
    ts_plan *p = NULL;
    if (ts_compile(g, &spec, NULL, &p) != TS_OK) {
        fprintf(stderr, "compile: %s\n", ts_last_error());
        return 1;
    }
    ts_delayed_scaling ds;
    if (ts_delayed_scaling_init(&ds, TS_F8E4M3, HIDDEN, 16, TS_AMAX_MAX, 0) != TS_OK) return 1;
    float xb[BATCH * IN], yb[BATCH], w[HIDDEN * IN], sf[HIDDEN];
    double amax[HIDDEN], first = 0, last = 0;
    unsigned seed = 1;
    /* prime the history with the initial weights */
    ts_plan_read(p, "fc1.weight", w, sizeof w);
    ts_amax_channels(w, 2, w1d, 0, TS_CALIB_MAX, 0, amax);
    ts_delayed_scaling_update(&ds, amax);
    for (int step = 0; step < STEPS; step++) {
        for (int c = 0; c < HIDDEN; c++) sf[c] = (float)ds.scale[c];
        make_batch(&seed, xb, yb);
        ts_plan_set_input(p, "x", xb, sizeof xb);
        ts_plan_set_input(p, "y", yb, sizeof yb);
        ts_plan_set_input(p, "fc1.scale", sf, sizeof sf);
        if (ts_plan_step(p) != TS_OK) {
            fprintf(stderr, "step %d: %s\n", step, ts_last_error());
            return 1;
        }
        if (step == 0) first = ts_plan_loss(p);
        last = ts_plan_loss(p);
        ts_plan_read(p, "fc1.weight", w, sizeof w);
        ts_amax_channels(w, 2, w1d, 0, TS_CALIB_MAX, 0, amax);
        ts_delayed_scaling_update(&ds, amax);
    }
    printf("QAT loss %.4f -> %.4f over %d steps\n", first, last, STEPS);
    /* the trained weights as E4M3 codes with the final per-channel scales */
    ts_quant_error e;
    ts_quant_error_f32(w, 2, w1d, 0, TS_F8E4M3, ds.scale, &e);
    printf("fc1.weight as e4m3, per-channel delayed scales: SQNR %.1f dB, max |error| %.3g, "
           "%.2f%% saturated\n",
           e.sqnr_db, e.max_abs, 100 * e.frac_saturated);
    ts_delayed_scaling_free(&ds);
    ts_plan_free(p);
    ts_graph_free(g);
    int ok = last < 0.5 * first && e.sqnr_db > 25;
    if (!ok) fprintf(stderr, "fp8_qat: training or quantisation did not reach its target\n");
    return ok ? 0 : 1;
}
