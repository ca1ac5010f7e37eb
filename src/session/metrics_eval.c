/* AUC-ROC, Dice and mean IoU for evaluation (see metrics_eval.h). */
#include "session/metrics_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/config.h"

typedef struct scored {
    double s;
    int64_t y;
} scored;

static int by_score(const void *a, const void *b) {
    double x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return (x > y) - (x < y);
}

ts_status ts_metric_auc(const double *score, const int64_t *label, int64_t n, double *auc) {
    if (!auc || (n > 0 && (!score || !label))) return ts_fail(TS_ERR_INVALID, "auc: NULL argument");
    *auc = NAN;
    if (n <= 0) return TS_OK;
    scored *v = ts_alloc((size_t)n * sizeof *v, "auc");
    if (!v) return TS_ERR_NOMEM;
    int64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(score[i]) || (label[i] != 0 && label[i] != 1)) {
            free(v);
            return ts_fail(TS_ERR_INVALID, "auc: example %lld has %s", (long long)i,
                           isnan(score[i]) ? "a NaN score" : "a label other than 0 or 1");
        }
        v[i] = (scored){score[i], label[i]};
        pos += label[i];
    }
    const int64_t neg = n - pos;
    if (pos && neg) {
        qsort(v, (size_t)n, sizeof *v, by_score);
        /* Ranks are 1-based; a run of equal scores [i, j) shares the mean
         * rank (i + 1 + j) / 2. */
        double rank_sum = 0;
        for (int64_t i = 0; i < n;) {
            int64_t j = i + 1, p = v[i].y;
            while (j < n && v[j].s == v[i].s) p += v[j++].y;
            rank_sum += (double)p * 0.5 * (double)(i + 1 + j);
            i = j;
        }
        *auc = (rank_sum - 0.5 * (double)pos * (double)(pos + 1)) / ((double)pos * (double)neg);
    }
    free(v);
    return TS_OK;
}

void ts_metric_overlap(const int64_t *tp, const int64_t *fp, const int64_t *fn, int64_t classes,
                       double *dice, double *miou) {
    double sd = 0, si = 0;
    int64_t used = 0;
    for (int64_t c = 0; c < classes; c++) {
        const int64_t u = tp[c] + fp[c] + fn[c];
        if (!u) continue;
        sd += 2.0 * (double)tp[c] / (double)(u + tp[c]);
        si += (double)tp[c] / (double)u;
        used++;
    }
    if (dice) *dice = used ? sd / (double)used : NAN;
    if (miou) *miou = used ? si / (double)used : NAN;
}

ts_status ts_metric_acc_init(ts_metric_acc *a, unsigned flags, int64_t classes) {
    if (!a) return ts_fail(TS_ERR_INVALID, "metrics: NULL argument");
    memset(a, 0, sizeof *a);
    a->flags = flags;
    a->classes = classes;
    if ((flags & TS_METRIC_AUC) && classes != 2)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: auc needs a binary classifier (2 classes), this one has "
                       "%lld",
                       (long long)classes);
    if (flags & (TS_METRIC_DICE | TS_METRIC_MIOU)) {
        if (classes < 1)
            return ts_fail(TS_ERR_INVALID, "train.metrics: dice and miou need a classifier");
        a->tp = ts_zalloc((size_t)classes * 3 * sizeof(int64_t), "overlap counts");
        if (!a->tp) return TS_ERR_NOMEM;
        a->fp = a->tp + classes;
        a->fn = a->fp + classes;
    }
    return TS_OK;
}

void ts_metric_acc_reset(ts_metric_acc *a) {
    a->n = 0;
    if (a->tp) memset(a->tp, 0, (size_t)a->classes * 3 * sizeof(int64_t));
}

ts_status ts_metric_acc_add(ts_metric_acc *a, const float *logits, int64_t label) {
    if (label < 0 || label >= a->classes)
        return ts_fail(TS_ERR_INVALID, "metrics: label %lld is outside [0, %lld)", (long long)label,
                       (long long)a->classes);
    if (a->flags & TS_METRIC_AUC) {
        if (a->n == a->cap) {
            int64_t cap = a->cap ? 2 * a->cap : 1024;
            double *s = ts_realloc(a->score, (size_t)cap * sizeof *s, "auc scores");
            if (!s) return TS_ERR_NOMEM;
            a->score = s;
            int64_t *l = ts_realloc(a->label, (size_t)cap * sizeof *l, "auc labels");
            if (!l) return TS_ERR_NOMEM;
            a->label = l;
            a->cap = cap;
        }
        /* The logit difference orders examples as softmax's p(class 1). */
        a->score[a->n] = (double)logits[1] - (double)logits[0];
        a->label[a->n++] = label;
    }
    if (a->tp) {
        int64_t arg = 0;
        for (int64_t k = 1; k < a->classes; k++)
            if (logits[k] > logits[arg]) arg = k;
        if (arg == label) {
            a->tp[label]++;
        } else {
            a->fp[arg]++;
            a->fn[label]++;
        }
    }
    return TS_OK;
}

ts_status ts_metric_acc_result(const ts_metric_acc *a, double *auc, double *dice, double *miou) {
    *auc = *dice = *miou = NAN;
    if (a->tp) {
        ts_metric_overlap(a->tp, a->fp, a->fn, a->classes, dice, miou);
        if (!(a->flags & TS_METRIC_DICE)) *dice = NAN;
        if (!(a->flags & TS_METRIC_MIOU)) *miou = NAN;
    }
    if (a->flags & TS_METRIC_AUC) return ts_metric_auc(a->score, a->label, a->n, auc);
    return TS_OK;
}

void ts_metric_acc_free(ts_metric_acc *a) {
    if (!a) return;
    free(a->score);
    free(a->label);
    free(a->tp);
    memset(a, 0, sizeof *a);
}
