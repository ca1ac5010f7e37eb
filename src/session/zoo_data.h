/* zoo_data.h — the data side of the gru/lstm, unet3d and gcn models in a
 * training session (internal; used by src/session/session.c).
 *
 * The generic loaders (csv, npy) read the files; these functions check that
 * what they read is what the model takes, with errors naming the file and
 * the example (and voxel or node) at fault, and describe the data's shape
 * for ts_config_fit_data:
 *
 *     ts_config_data_shape shape = {0};
 *     if (ts_zoo_fit(c, all, c->data.x, c->data.y, &shape) != TS_OK) ...
 *
 * A graph (data.source graph) is one example: the whole graph, fed in every
 * step. Its train, val and test datasets hold that example with the labels
 * of the nodes outside the split set to TS_ZOO_IGNORE, which the model's
 * cross-entropy (ignore_index) and the session's evaluation skip:
 *
 *     ts_zoo_graph gr;
 *     ts_zoo_load_graph(c, &gr, &all, &train, &val, &test, &shape);
 *     ts_config_graph cg = ts_zoo_graph_of(&gr);   // for ts_config_build_graph
 *     ...
 *     ts_zoo_graph_free(&gr);
 */
#ifndef TS_SESSION_ZOO_DATA_H
#define TS_SESSION_ZOO_DATA_H

#include <stdint.h>
#include "data/data.h"
#include "frontend/config.h"
#include "session/metrics_eval.h"

/* The label of a node outside a split (the model's ignore_index). */
#define TS_ZOO_IGNORE (-100)

/* Whether model.name is one of gru, lstm, unet3d, gcn. */
int ts_zoo_model(const ts_config *c);
/* A gru/lstm with model.classes 1: one logit, BCE against 0/1 targets. */
int ts_zoo_binary(const ts_config *c);

/* Refuses data parallelism over `procs` > 1 processes for a gcn, whose
 * full-batch step has no batch to split. */
ts_status ts_zoo_check_procs(const ts_config *c, int procs);

/* Checks that `all` (read from x_file and y_file) fits a gru/lstm or
 * unet3d and fills *shape except batches_per_epoch. May reshape the
 * examples' description (a [n, T] sequence file is T steps of 1 feature, a
 * [n, S, S, S] volume file 1 channel) and turns integer 0/1 targets of a
 * binary gru/lstm into floats. */
ts_status ts_zoo_fit(const ts_config *c, ts_dataset *all, const char *x_file, const char *y_file,
                     ts_config_data_shape *shape);

typedef struct ts_zoo_graph {
    int64_t nodes;
    ts_edge_list edges;
    int64_t n_train, n_val, n_test; /* nodes per split */
} ts_zoo_graph;

/* data.source graph: reads data.edges, data.x, data.y (and data.node_split)
 * and splits the nodes (data.node_split, else data.val_fraction and
 * data.test_fraction with train.seed). data.source synthetic: W5's graph
 * (model.nodes, model.features, model.classes; mean degree 10) from the
 * seed, split by the fractions' defaults (10 % val). *all holds the lineage; *val is
 * empty (n 0) without validation nodes and *test NULL without test nodes.
 * Fills *shape (batches_per_epoch 1: the graph is one batch). */
ts_status ts_zoo_load_graph(const ts_config *c, ts_zoo_graph *g, ts_dataset **all,
                            ts_dataset **train, ts_dataset **val, ts_dataset **test,
                            ts_config_data_shape *shape);
ts_config_graph ts_zoo_graph_of(const ts_zoo_graph *g);
void ts_zoo_graph_free(ts_zoo_graph *g);

/* Synthetic batch `index` of a finished gru/lstm or unet3d config, a whole
 * model.batch: the W2 binary task, a regression (classes 0) or W4 volumes. */
ts_status ts_zoo_synth(const ts_config *c, int64_t index, void *x, void *y);

/* The held-out split of a synthetic gru/lstm or unet3d run: two batches
 * of examples drawn apart from the training batches (their indices start
 * at 2^20), so the evaluation reports accuracy, AUC or Dice on data the
 * model never trained on. */
ts_status ts_zoo_synth_val(const ts_config *c, ts_dataset **val);

/* unet3d logits [batch, classes, vol] rearranged in place to [batch, vol,
 * classes], one row of logits per voxel as the evaluation reads them. */
ts_status ts_zoo_channels_last(float *logits, int64_t batch, int64_t classes, int64_t vol);

/* The soft Dice term of the unet3d's loss over a whole evaluation split:
 * per class sums of p_c t_c, p_c and t_c over every voxel (p the softmax
 * of the logits, t the one-hot label), as the training loss takes them
 * over a batch. */
typedef struct ts_zoo_dice {
    int64_t classes;
    double *sums; /* [3 * classes]: intersection, probabilities, labels */
} ts_zoo_dice;
/* Start over (allocating on first use) for `classes` classes. */
ts_status ts_zoo_dice_reset(ts_zoo_dice *d, int64_t classes);
/* n voxels: rows of `classes` logits, channels last, and their labels. */
void ts_zoo_dice_add(ts_zoo_dice *d, const float *logits, const int64_t *labels, int64_t n);
/* 1 - mean_c (2 I_c + 1e-5) / (P_c + T_c + 1e-5), as src/models/unet3d.c. */
double ts_zoo_dice_loss(const ts_zoo_dice *d);
void ts_zoo_dice_free(ts_zoo_dice *d);

/* Evaluation of a binary classifier: n logits z against 0/1 targets y;
 * adds the BCE-with-logits terms to *loss, the correct signs to *correct,
 * and each target to acc (scores as the two logits {0, z}) when it has
 * metrics to compute. */
ts_status ts_zoo_binary_add(const float *z, const float *y, int64_t n, double *loss,
                            int64_t *correct, ts_metric_acc *acc);

#endif
