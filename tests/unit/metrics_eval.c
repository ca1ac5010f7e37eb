/* Evaluation metrics (src/session/metrics_eval.c): AUC-ROC against hand
 * values and an O(n^2) pair count with ties, Dice and mIoU against hand
 * counts, the accumulator fed with logits, and the errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "frontend/config.h"
#include "session/metrics_eval.h"

/* Pairs (positive, negative) ordered correctly, ties counting one half. */
static double auc_pairs(const double *s, const int64_t *y, int64_t n) {
    double win = 0;
    int64_t pairs = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++)
            if (y[i] == 1 && y[j] == 0) {
                win += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
                pairs++;
            }
    return pairs ? win / (double)pairs : NAN;
}

static void auc(void) {
    double a = 0;
    const double s1[4] = {0.1, 0.4, 0.35, 0.8};
    const int64_t y1[4] = {0, 0, 1, 1};
    CHECK_OK(ts_metric_auc(s1, y1, 4, &a));
    CHECK_NEAR(a, 0.75, 1e-15);
    const double s2[4] = {1, 2, 2, 3};
    const int64_t y2[4] = {0, 1, 0, 1};
    CHECK_OK(ts_metric_auc(s2, y2, 4, &a));
    CHECK_NEAR(a, 0.875, 1e-15); /* one tie between a positive and a negative */
    const double s3[3] = {5, 5, 5};
    const int64_t y3[3] = {1, 0, 1};
    CHECK_OK(ts_metric_auc(s3, y3, 3, &a));
    CHECK_NEAR(a, 0.5, 1e-15);
    const int64_t y4[3] = {1, 1, 1};
    CHECK_OK(ts_metric_auc(s3, y4, 3, &a));
    CHECK(isnan(a), "one class only: NaN, got %g", a);
    /* Random scores on a coarse grid (many ties) against the pair count. */
    enum { N = 500 };
    double *s = malloc(N * sizeof *s);
    int64_t *y = malloc(N * sizeof *y);
    uint64_t st = 12345;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (int64_t)((st >> 40) & 1);
        s[i] = (double)((st >> 20) % 17) + 0.5 * (double)y[i] * (double)((st >> 50) & 1);
    }
    CHECK_OK(ts_metric_auc(s, y, N, &a));
    CHECK_NEAR(a, auc_pairs(s, y, N), 1e-12);
    s[7] = NAN;
    CHECK(ts_metric_auc(s, y, N, &a) != TS_OK && strstr(ts_last_error(), "example 7"),
          "NaN score named: %s", ts_last_error());
    s[7] = 0;
    y[9] = 2;
    CHECK(ts_metric_auc(s, y, N, &a) != TS_OK && strstr(ts_last_error(), "example 9"),
          "bad label named: %s", ts_last_error());
    free(s);
    free(y);
}

static void overlap(void) {
    /* class 0: tp 3 fp 1 fn 0; class 1: tp 1 fp 0 fn 1; class 2 absent. */
    const int64_t tp[3] = {3, 1, 0}, fp[3] = {1, 0, 0}, fn[3] = {0, 1, 0};
    double dice, miou;
    ts_metric_overlap(tp, fp, fn, 3, &dice, &miou);
    CHECK_NEAR(dice, (6.0 / 7.0 + 2.0 / 3.0) / 2, 1e-15);
    CHECK_NEAR(miou, (3.0 / 4.0 + 1.0 / 2.0) / 2, 1e-15);
    const int64_t z[3] = {0, 0, 0};
    ts_metric_overlap(z, z, z, 3, &dice, &miou);
    CHECK(isnan(dice) && isnan(miou), "nothing to measure: NaN");
}

static void accumulator(void) {
    ts_metric_acc a;
    CHECK_OK(ts_metric_acc_init(&a, TS_METRIC_AUC | TS_METRIC_DICE | TS_METRIC_MIOU, 2));
    /* logits (l0, l1), label: predictions 1, 0, 1, 0 against 1, 0, 0, 1. */
    const float lg[4][2] = {{0, 2}, {1, -1}, {0, 0.5f}, {3, 0}};
    const int64_t lab[4] = {1, 0, 0, 1};
    for (int round = 0; round < 2; round++) {
        ts_metric_acc_reset(&a);
        for (int i = 0; i < 4; i++) CHECK_OK(ts_metric_acc_add(&a, lg[i], lab[i]));
        double auc, dice, miou;
        CHECK_OK(ts_metric_acc_result(&a, &auc, &dice, &miou));
        /* scores 2, -2, 0.5, -3: positives 2 and -3 against -2 and 0.5. */
        CHECK_NEAR(auc, 0.5, 1e-15);
        /* class 0: tp 1 fp 1 fn 1; class 1: the same. */
        CHECK_NEAR(dice, 0.5, 1e-15);
        CHECK_NEAR(miou, 1.0 / 3.0, 1e-15);
    }
    CHECK(ts_metric_acc_add(&a, lg[0], 2) != TS_OK, "label outside the classes");
    ts_metric_acc_free(&a);
    CHECK(ts_metric_acc_init(&a, TS_METRIC_AUC, 3) != TS_OK && strstr(ts_last_error(), "binary"),
          "auc with 3 classes: %s", ts_last_error());
    ts_metric_acc_free(&a);
    /* Only dice asked: miou and auc stay NaN. */
    CHECK_OK(ts_metric_acc_init(&a, TS_METRIC_DICE, 3));
    CHECK_OK(ts_metric_acc_add(&a, (const float[]){0, 0, 1}, 2));
    double auc, dice, miou;
    CHECK_OK(ts_metric_acc_result(&a, &auc, &dice, &miou));
    CHECK(dice == 1 && isnan(miou) && isnan(auc), "dice only: %g %g %g", dice, miou, auc);
    ts_metric_acc_free(&a);
}

int main(void) {
    auc();
    overlap();
    accumulator();
    return check_summary("metrics_eval");
}
