/* Synthetic batches: deterministic per (seed, index), the W1 target
 * formula, token ranges and the one-step shift, bad arguments. */
#include <string.h>
#include "check.h"
#include "data/synthetic.h"

enum { B = 5, W = 10, F = 6, OUT = 2, CTX = 7, V = 13 };

static void test_regression(void) {
    static float x[B * W * F], y[B * OUT], x2[B * W * F], y2[B * OUT];
    CHECK_OK(ts_synth_regression(3, 1, B, W, F, OUT, x, y));
    CHECK_OK(ts_synth_regression(3, 1, B, W, F, OUT, x2, y2));
    CHECK(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y), "same seed and index, same batch");
    CHECK_OK(ts_synth_regression(3, 2, B, W, F, OUT, x2, y2));
    CHECK(memcmp(x, x2, sizeof x), "another index, another batch");
    CHECK_OK(ts_synth_regression(4, 1, B, W, F, OUT, x2, y2));
    CHECK(memcmp(x, x2, sizeof x), "another seed, another batch");

    /* x looks standard normal; y - mean(last 8 rows, first 4 features) is
     * the 0.1-scaled noise. */
    double s = 0, s2 = 0, ns2 = 0;
    for (int i = 0; i < B * W * F; i++) s += x[i], s2 += (double)x[i] * x[i];
    CHECK(fabs(s / (B * W * F)) < 0.2 && fabs(s2 / (B * W * F) - 1) < 0.25, "x ~ N(0, 1)");
    for (int b = 0; b < B; b++) {
        double m = 0;
        for (int t = W - 8; t < W; t++)
            for (int f = 0; f < 4; f++) m += x[(b * W + t) * F + f];
        m /= 32;
        for (int o = 0; o < OUT; o++) {
            double noise = y[b * OUT + o] - m;
            CHECK(fabs(noise) < 0.6, "y[%d,%d] = mean + small noise (%g)", b, o, noise);
            ns2 += noise * noise;
        }
    }
    CHECK(ns2 / (B * OUT) > 1e-4 && ns2 / (B * OUT) < 0.1, "noise scale %g", ns2 / (B * OUT));

    /* Windows shorter than 8 and fewer than 4 features use what there is. */
    float xs[2 * 3 * 2], ys[2];
    CHECK_OK(ts_synth_regression(0, 0, 2, 3, 2, 1, xs, ys));
    double m0 = (xs[0] + xs[1] + xs[2] + xs[3] + xs[4] + xs[5]) / 6.0;
    CHECK(fabs(ys[0] - m0) < 0.6, "short window");

    CHECK(ts_synth_regression(0, 0, 0, W, F, OUT, x, y) == TS_ERR_INVALID, "batch 0");
    CHECK(ts_synth_regression(0, -1, B, W, F, OUT, x, y) == TS_ERR_INVALID, "index < 0");
    CHECK(ts_synth_regression(0, 0, B, W, F, OUT, NULL, y) == TS_ERR_INVALID, "NULL x");
}

static void test_tokens(void) {
    int64_t t[B * CTX], g[B * CTX], t2[B * CTX], g2[B * CTX];
    CHECK_OK(ts_synth_tokens(7, 0, B, CTX, V, t, g));
    CHECK_OK(ts_synth_tokens(7, 0, B, CTX, V, t2, g2));
    CHECK(!memcmp(t, t2, sizeof t) && !memcmp(g, g2, sizeof g), "deterministic");
    CHECK_OK(ts_synth_tokens(7, 1, B, CTX, V, t2, g2));
    CHECK(memcmp(t, t2, sizeof t), "another index, other tokens");
    int used[V] = {0}, in_range = 1, shifted = 1;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < CTX; i++) {
            in_range &= t[b * CTX + i] >= 0 && t[b * CTX + i] < V && g[b * CTX + i] >= 0 &&
                        g[b * CTX + i] < V;
            if (t[b * CTX + i] >= 0 && t[b * CTX + i] < V) used[t[b * CTX + i]] = 1;
            if (i + 1 < CTX) shifted &= g[b * CTX + i] == t[b * CTX + i + 1];
        }
    int n_used = 0;
    for (int v = 0; v < V; v++) n_used += used[v];
    CHECK(in_range, "tokens in [0, vocab)");
    CHECK(shifted, "targets are the tokens shifted by one");
    CHECK(n_used >= V / 2, "tokens spread over the vocabulary (%d of %d used)", n_used, V);
    CHECK(ts_synth_tokens(0, 0, B, CTX, 0, t, g) == TS_ERR_INVALID, "vocab 0");
}

int main(void) {
    test_regression();
    test_tokens();
    return check_summary("unit/synthetic");
}
