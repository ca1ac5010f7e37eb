/* Evaluation metrics of a classifier beyond accuracy: AUC-ROC (binary),
 * Dice score and mean IoU (per-class overlap of predicted and true
 * classes, e.g. the voxels of a segmentation). Used by the session's
 * evaluation (train.metrics: auc, dice, miou); usable on their own:
 *
 *     ts_metric_acc a;
 *     ts_metric_acc_init(&a, TS_METRIC_AUC | TS_METRIC_DICE, 2);
 *     for each target t: ts_metric_acc_add(&a, logits_of_t, 2, label_of_t);
 *     double auc, dice, miou;
 *     ts_metric_acc_result(&a, &auc, &dice, &miou);   // NaN where undefined
 *     ts_metric_acc_free(&a);
 */
#ifndef TS_METRICS_EVAL_H
#define TS_METRICS_EVAL_H

#include <stdint.h>
#include "tessel/status.h"

/* Exact AUC-ROC of scores against 0/1 labels: the Mann-Whitney statistic
 * with tied scores given their average rank (so a tie between a positive
 * and a negative counts one half). *auc is NaN when one class is absent. A
 * NaN score or a label other than 0/1 is an error naming the example. */
ts_status ts_metric_auc(const double *score, const int64_t *label, int64_t n, double *auc);

/* Dice and IoU per class from counts of true positives, false positives
 * and false negatives, averaged over the classes that occur in the labels
 * or the predictions (a class absent from both is skipped, as it has no
 * overlap to measure); NaN when no class occurs. */
void ts_metric_overlap(const int64_t *tp, const int64_t *fp, const int64_t *fn, int64_t classes,
                       double *dice, double *miou);

/* Accumulator over the targets of one evaluation. */
typedef struct ts_metric_acc {
    unsigned flags; /* TS_METRIC_* of src/frontend/config.h */
    int64_t classes;
    double *score; /* auc: logit[1] - logit[0] per target */
    int64_t *label;
    int64_t n, cap;
    int64_t *tp, *fp, *fn; /* dice, miou: [classes] each */
} ts_metric_acc;

/* flags with TS_METRIC_AUC need classes == 2. */
ts_status ts_metric_acc_init(ts_metric_acc *a, unsigned flags, int64_t classes);
void ts_metric_acc_reset(ts_metric_acc *a);
/* One target: its `classes` logits and its label (in [0, classes)). */
ts_status ts_metric_acc_add(ts_metric_acc *a, const float *logits, int64_t label);
/* Results of the metrics asked for; the others are NaN. */
ts_status ts_metric_acc_result(const ts_metric_acc *a, double *auc, double *dice, double *miou);
void ts_metric_acc_free(ts_metric_acc *a);

#endif
