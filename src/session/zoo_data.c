/* The data of the gru/lstm, unet3d and gcn models in a training session:
 * checks with errors that name the file and the place, graph splits, and
 * synthetic batches (see zoo_data.h). */
#include "session/zoo_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "data/data_internal.h"
#include "data/synthetic.h"
#include "tessel/models.h"

/* The model's input kind (models/model.h). */
static ts_model_input input_of(const ts_config *c) {
    const ts_model_desc *d = ts_model_of(c);
    return d ? d->input : TS_MODEL_IN_FLAT;
}

int ts_zoo_model(const ts_config *c) {
    const ts_model_input in = input_of(c);
    return in == TS_MODEL_IN_SEQUENCES || in == TS_MODEL_IN_VOLUMES || in == TS_MODEL_IN_GRAPH;
}

int ts_zoo_binary(const ts_config *c) {
    const ts_model_desc *d = ts_model_of(c);
    return d && (d->flags & TS_MODEL_BINARY) && c->model.classes == 1;
}

ts_status ts_zoo_check_procs(const ts_config *c, int procs) {
    if (procs > 1 && input_of(c) == TS_MODEL_IN_GRAPH)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "a %s trains on the whole graph in every step (full batch): there is no "
                       "batch to split over %d processes; run it in one process (no --procs)",
                       ts_config_model_word(c->model.name), procs);
    return TS_OK;
}

/* model.classes when the config set it, else 0 (the data decides). */
static int64_t classes_set(const ts_config *c) {
    const int i = ts_config_key_find("model.classes");
    return i >= 0 && c->set[i] ? c->model.classes : 0;
}

/* ---- sequences (gru, lstm) ------------------------------------------------------------ */

static ts_status fit_sequences(const ts_config *c, ts_dataset *d, const char *x_file,
                               const char *y_file, ts_config_data_shape *shape) {
    if (d->x_rank == 1) { /* [n, T]: T steps of one feature */
        d->x_rank = 2;
        d->x_dims[1] = 1;
    }
    if (d->x_rank != 2)
        return ts_fail(TS_ERR_SHAPE,
                       "%s: a %s reads sequences [window, features] per example, but each "
                       "example has rank %d",
                       x_file, ts_config_model_word(c->model.name), d->x_rank);
    shape->rows = d->x_dims[0];
    shape->cols = d->x_dims[1];
    const int64_t per = ts_shape_numel(d->y_rank, d->y_dims);
    if (d->y_dtype == TS_I64) {
        if (per != 1)
            return ts_fail(TS_ERR_SHAPE,
                           "%s: integer targets are class ids, one per sequence, but each example "
                           "has %lld",
                           y_file, (long long)per);
        const int64_t want = c->model.classes == 1 ? 2 : classes_set(c);
        int64_t *y = d->y, mx = -1;
        for (int64_t i = 0; i < d->n; i++) {
            if (y[i] < 0 || (want > 0 && y[i] >= want))
                return ts_fail(TS_ERR_INVALID,
                               "%s: example %lld has label %lld, outside [0, %lld) (model.classes "
                               "%lld%s)",
                               y_file, (long long)i, (long long)y[i], (long long)(want ? want : 0),
                               (long long)c->model.classes,
                               c->model.classes == 1 ? ": binary, labels 0 or 1" : "");
            if (!want && y[i] >= TS_DATA_MAX_CLASSES) {
                char where[48];
                snprintf(where, sizeof where, "example %lld", (long long)i);
                return ts_data_check_class_count(y_file, where, y[i]);
            }
            if (y[i] > mx) mx = y[i];
        }
        if (c->model.classes != 1) {
            shape->classes = mx + 1;
            return TS_OK;
        }
        /* Binary: the model's target is a float 0/1 per sequence. */
        float *f = ts_alloc((size_t)(d->n ? d->n : 1) * sizeof *f, "binary targets");
        if (!f) return TS_ERR_NOMEM;
        for (int64_t i = 0; i < d->n; i++) f[i] = (float)y[i];
        free(d->y);
        d->y = f;
        d->y_dtype = TS_F32;
        d->y_rank = 1;
        d->y_dims[0] = 1;
        shape->out_dim = 1;
        return TS_OK;
    }
    if (c->model.classes == 1) {
        const float *y = d->y;
        if (per != 1)
            return ts_fail(TS_ERR_SHAPE,
                           "%s: model.classes 1 (binary) needs one 0/1 target per sequence, but "
                           "each example has %lld",
                           y_file, (long long)per);
        for (int64_t i = 0; i < d->n; i++)
            if (y[i] != 0.0f && y[i] != 1.0f)
                return ts_fail(TS_ERR_INVALID,
                               "%s: example %lld has target %g; model.classes 1 (binary) needs 0 "
                               "or 1",
                               y_file, (long long)i, (double)y[i]);
    }
    shape->out_dim = per;
    return TS_OK;
}

/* ---- volumes (unet3d) ---------------------------------------------------------------- */

static ts_status fit_volumes(const ts_config *c, ts_dataset *d, const char *x_file,
                             const char *y_file, ts_config_data_shape *shape) {
    if (d->x_rank == 3) { /* [n, S, S, S]: one channel */
        memmove(d->x_dims + 1, d->x_dims, 3 * sizeof *d->x_dims);
        d->x_dims[0] = 1;
        d->x_rank = 4;
    }
    const int64_t *xd = d->x_dims;
    if (d->x_rank != 4 || xd[1] != xd[2] || xd[1] != xd[3] || xd[1] % 4) {
        char dims[160] = "";
        size_t k = 0;
        for (int i = 0; i < d->x_rank && k < sizeof dims; i++)
            k += (size_t)snprintf(dims + k, sizeof dims - k, i ? ", %lld" : "%lld",
                                  (long long)xd[i]);
        return ts_fail(TS_ERR_SHAPE,
                       "%s: a unet3d reads cubic volumes [channels, size, size, size] (or [size, "
                       "size, size]) per example with size a multiple of 4, but the examples are "
                       "[%s]",
                       x_file, dims);
    }
    const int64_t S = xd[1], vol = S * S * S;
    shape->rows = xd[0];
    shape->cols = S;
    if (d->y_dtype != TS_I64 || d->y_rank != 3 || d->y_dims[0] != S || d->y_dims[1] != S ||
        d->y_dims[2] != S)
        return ts_fail(TS_ERR_SHAPE,
                       "%s: a unet3d needs integer class ids [n, %lld, %lld, %lld] (a label per "
                       "voxel of %s), got %s targets of rank %d",
                       y_file, (long long)S, (long long)S, (long long)S, x_file,
                       d->y_dtype == TS_I64 ? "integer" : "float", d->y_rank);
    const int64_t want = classes_set(c), *y = d->y;
    int64_t mx = -1;
    for (int64_t i = 0; i < d->n; i++)
        for (int64_t v = 0; v < vol; v++) {
            const int64_t l = y[i * vol + v];
            if (l < 0 || (want > 0 && l >= want))
                return ts_fail(TS_ERR_INVALID,
                               "%s: example %lld, voxel (%lld, %lld, %lld) has label %lld, "
                               "outside [0, %lld)%s",
                               y_file, (long long)i, (long long)(v / (S * S)),
                               (long long)(v / S % S), (long long)(v % S), (long long)l,
                               (long long)want, want > 0 ? " (model.classes)" : "");
            if (!want && l >= TS_DATA_MAX_CLASSES) {
                char where[128];
                snprintf(where, sizeof where, "example %lld, voxel (%lld, %lld, %lld)",
                         (long long)i, (long long)(v / (S * S)), (long long)(v / S % S),
                         (long long)(v % S));
                return ts_data_check_class_count(y_file, where, l);
            }
            if (l > mx) mx = l;
        }
    shape->classes = mx + 1;
    return TS_OK;
}

ts_status ts_zoo_fit(const ts_config *c, ts_dataset *all, const char *x_file, const char *y_file,
                     ts_config_data_shape *shape) {
    ts_status s = input_of(c) == TS_MODEL_IN_VOLUMES ? fit_volumes(c, all, x_file, y_file, shape)
                                                     : fit_sequences(c, all, x_file, y_file, shape);
    if (s == TS_OK) shape->in_dim = ts_shape_numel(all->x_rank, all->x_dims);
    return s;
}

/* ---- graphs ---------------------------------------------------------------- */

/* A one-example dataset of the graph: x [nodes, F], y [nodes] with the
 * labels of nodes outside `split` (by split id) ignored. */
static ts_status graph_part(const ts_graph_data *gd, const int8_t *part, int split,
                            ts_dataset **out) {
    ts_dataset *d = ts_zalloc(sizeof *d, "graph dataset");
    if (!d) return TS_ERR_NOMEM;
    d->n = 1;
    d->x_dtype = TS_F32, d->y_dtype = TS_I64;
    d->x_rank = 2, d->y_rank = 1;
    d->x_dims[0] = gd->nodes, d->x_dims[1] = gd->features;
    d->y_dims[0] = gd->nodes;
    const size_t xb = (size_t)(gd->nodes * gd->features) * sizeof(float);
    d->x = ts_alloc(xb ? xb : 1, "graph features");
    d->y = ts_alloc((size_t)gd->nodes * sizeof(int64_t), "graph labels");
    if (!d->x || !d->y) {
        ts_dataset_free(d);
        return TS_ERR_NOMEM;
    }
    memcpy(d->x, gd->x, xb);
    int64_t *y = d->y;
    for (int64_t i = 0; i < gd->nodes; i++)
        y[i] = split < 0 || part[i] == split ? gd->y[i] : TS_ZOO_IGNORE;
    *out = d;
    return TS_OK;
}

/* Split id per node (0 train, 1 val, 2 test, -1 none) from data.node_split. */
static ts_status split_from_file(const char *path, int64_t nodes, int8_t *part, ts_lineage *lin) {
    ts_array a = {0};
    ts_status s = ts_data_read_npy(path, TS_I64, &a);
    if (s != TS_OK) return s;
    if (a.rank != 1 || a.dims[0] != nodes)
        s = ts_fail(TS_ERR_SHAPE,
                    "%s: the node split must be [%lld] (one split id per node), got rank %d with "
                    "%lld entries",
                    path, (long long)nodes, a.rank, (long long)(a.rank ? a.dims[0] : 1));
    const int64_t *v = a.data;
    for (int64_t i = 0; s == TS_OK && i < nodes; i++) {
        if (v[i] < -1 || v[i] > 2)
            s = ts_fail(TS_ERR_INVALID,
                        "%s: node %lld has split id %lld; use 0 (train), 1 (val), 2 (test) or -1 "
                        "(unused)",
                        path, (long long)i, (long long)v[i]);
        else
            part[i] = (int8_t)v[i];
    }
    if (s == TS_OK) {
        *lin = a.lineage;
        memset(&a.lineage, 0, sizeof a.lineage);
    }
    ts_array_free(&a);
    return s;
}

/* Split by fraction: the last round(val * n) nodes of the seed's
 * permutation go to val, the round(test * n) before them to test. */
static ts_status split_by_fraction(const ts_config *c, int64_t nodes, int8_t *part) {
    int64_t *perm = ts_alloc((size_t)nodes * sizeof *perm, "node split");
    if (!perm) return TS_ERR_NOMEM;
    ts_status s = ts_data_split_permutation(nodes, c->train.seed, perm);
    const int64_t n_val = (int64_t)(c->data.val_fraction * (double)nodes + 0.5);
    const int64_t n_test = (int64_t)(c->data.test_fraction * (double)nodes + 0.5);
    for (int64_t k = 0; s == TS_OK && k < nodes; k++)
        part[perm[k]] = k >= nodes - n_val ? 1 : k >= nodes - n_val - n_test ? 2 : 0;
    free(perm);
    return s;
}

/* W5's graph from the seed: model.nodes nodes of model.features features
 * in model.classes classes, mean degree 10 (ts_gcn_random_edges). */
static ts_status synth_graph(const ts_config *c, ts_graph_data *gd) {
    memset(gd, 0, sizeof *gd);
    const int64_t N = c->model.nodes, F = c->model.features;
    gd->nodes = N, gd->features = F, gd->classes = c->model.classes;
    gd->x = ts_alloc((size_t)(N * F) * sizeof *gd->x, "synthetic graph");
    gd->y = ts_alloc((size_t)N * sizeof *gd->y, "synthetic graph");
    ts_status s = gd->x && gd->y ? TS_OK : TS_ERR_NOMEM;
    if (s == TS_OK) s = ts_synth_graph_nodes(c->train.seed, N, F, gd->classes, gd->x, gd->y);
    if (s == TS_OK) {
        gd->edges.n = ts_gcn_random_edges(N, 10, c->train.seed, &gd->edges.src, &gd->edges.dst);
        if (gd->edges.n < 0) s = ts_fail(TS_ERR_NOMEM, "synthetic graph: out of memory for edges");
    }
    if (s != TS_OK) ts_graph_data_free(gd);
    return s;
}

ts_config_graph ts_zoo_graph_of(const ts_zoo_graph *g) {
    ts_config_graph cg = {g->nodes, g->edges.n, g->edges.src, g->edges.dst};
    return cg;
}

void ts_zoo_graph_free(ts_zoo_graph *g) {
    if (!g) return;
    ts_edge_list_free(&g->edges);
    memset(g, 0, sizeof *g);
}

ts_status ts_zoo_load_graph(const ts_config *c, ts_zoo_graph *g, ts_dataset **all,
                            ts_dataset **train, ts_dataset **val, ts_dataset **test,
                            ts_config_data_shape *shape) {
    memset(g, 0, sizeof *g);
    *all = *train = *val = *test = NULL;
    ts_graph_data gd;
    ts_status s =
        c->data.source == TS_CFG_SYNTHETIC
            ? synth_graph(c, &gd)
            : ts_data_load_graph(c->data.edges, c->data.x, c->data.y, classes_set(c), &gd);
    if (s != TS_OK) return s;
    int8_t *part = ts_alloc((size_t)gd.nodes, "node split");
    ts_lineage split_lin = {0};
    if (!part)
        s = TS_ERR_NOMEM;
    else if (c->data.node_split[0])
        s = split_from_file(c->data.node_split, gd.nodes, part, &split_lin);
    else
        s = split_by_fraction(c, gd.nodes, part);
    for (int64_t i = 0; s == TS_OK && i < gd.nodes; i++) {
        g->n_train += part[i] == 0;
        g->n_val += part[i] == 1;
        g->n_test += part[i] == 2;
    }
    if (s == TS_OK && g->n_train == 0)
        s = ts_fail(TS_ERR_INVALID, "%s: no node is in the training split (%s)",
                    c->data.node_split[0] ? c->data.node_split : c->data.y,
                    c->data.node_split[0] ? "split id 0" : "data.val_fraction, data.test_fraction");
    if (s == TS_OK) s = graph_part(&gd, part, -1, all);
    if (s == TS_OK) s = graph_part(&gd, part, 0, train);
    if (s == TS_OK) s = graph_part(&gd, part, 1, val);
    if (s == TS_OK && g->n_test) s = graph_part(&gd, part, 2, test);
    if (s == TS_OK && !g->n_val) (*val)->n = 0;
    /* Lineage: the features, the labels, the edges and the split file. */
    if (s == TS_OK && gd.x_lineage.path) s = ts_dataset_add_lineage(*all, &gd.x_lineage);
    if (s == TS_OK && gd.y_lineage.path) s = ts_dataset_add_lineage(*all, &gd.y_lineage);
    if (s == TS_OK && gd.edges.lineage.path) s = ts_dataset_add_lineage(*all, &gd.edges.lineage);
    if (s == TS_OK && split_lin.path) s = ts_dataset_add_lineage(*all, &split_lin);
    if (s == TS_OK) {
        g->nodes = gd.nodes;
        g->edges = gd.edges;
        memset(&gd.edges, 0, sizeof gd.edges);
        shape->in_dim = gd.nodes * gd.features;
        shape->rows = gd.nodes;
        shape->cols = gd.features;
        shape->classes = gd.classes;
        shape->batches_per_epoch = 1;
    }
    free(part);
    ts_lineage_clear(&split_lin);
    ts_graph_data_free(&gd);
    if (s != TS_OK) {
        ts_dataset_free(*all), ts_dataset_free(*train), ts_dataset_free(*val);
        ts_dataset_free(*test);
        *all = *train = *val = *test = NULL;
        ts_zoo_graph_free(g);
    }
    return s;
}

/* ---- synthetic data and evaluation ----------------------------------------- */

ts_status ts_zoo_synth(const ts_config *c, int64_t index, void *x, void *y) {
    const uint64_t seed = c->train.seed;
    if (input_of(c) == TS_MODEL_IN_VOLUMES)
        return ts_synth_volumes(seed, index, c->model.batch, c->model.channels, c->model.size,
                                c->model.classes, x, y);
    if (input_of(c) != TS_MODEL_IN_SEQUENCES)
        return ts_fail(TS_ERR_INVALID, "synthetic batches: a %s's graph is one example",
                       ts_config_model_word(c->model.name));
    if (c->model.classes == 1)
        return ts_synth_binary_sequences(seed, index, c->model.batch, c->model.window,
                                         c->model.features, x, y);
    return ts_synth_regression(seed, index, c->model.batch, c->model.window, c->model.features,
                               c->model.out_dim, x, y);
}

ts_status ts_zoo_synth_val(const ts_config *c, ts_dataset **val) {
    enum { BATCHES = 2 };
    *val = NULL;
    ts_dataset *d = ts_zalloc(sizeof *d, "synthetic validation set");
    if (!d) return TS_ERR_NOMEM;
    const int64_t B = c->model.batch;
    d->n = BATCHES * B;
    d->x_dtype = TS_F32;
    if (input_of(c) == TS_MODEL_IN_VOLUMES) {
        const int64_t S = c->model.size;
        d->x_rank = 4, d->y_rank = 3, d->y_dtype = TS_I64;
        d->x_dims[0] = c->model.channels, d->x_dims[1] = d->x_dims[2] = d->x_dims[3] = S;
        d->y_dims[0] = d->y_dims[1] = d->y_dims[2] = S;
    } else {
        d->x_rank = 2, d->y_rank = 1, d->y_dtype = TS_F32;
        d->x_dims[0] = c->model.window, d->x_dims[1] = c->model.features;
        d->y_dims[0] = c->model.classes == 1 ? 1 : c->model.out_dim;
    }
    const size_t xb = ts_dataset_x_bytes(d) * (size_t)B, yb = ts_dataset_y_bytes(d) * (size_t)B;
    d->x = ts_alloc(BATCHES * xb, "synthetic validation x");
    d->y = ts_alloc(BATCHES * yb, "synthetic validation y");
    ts_status s = d->x && d->y ? TS_OK : TS_ERR_NOMEM;
    for (int k = 0; s == TS_OK && k < BATCHES; k++)
        s = ts_zoo_synth(c, ((int64_t)1 << 20) + k, (char *)d->x + (size_t)k * xb,
                         (char *)d->y + (size_t)k * yb);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *val = d;
    return TS_OK;
}

ts_status ts_zoo_channels_last(float *logits, int64_t batch, int64_t classes, int64_t vol) {
    const int64_t n = classes * vol;
    float *tmp = ts_alloc((size_t)(n ? n : 1) * sizeof *tmp, "logits");
    if (!tmp) return TS_ERR_NOMEM;
    for (int64_t b = 0; b < batch; b++) {
        float *p = logits + b * n;
        for (int64_t k = 0; k < classes; k++)
            for (int64_t v = 0; v < vol; v++) tmp[v * classes + k] = p[k * vol + v];
        memcpy(p, tmp, (size_t)n * sizeof *tmp);
    }
    free(tmp);
    return TS_OK;
}

ts_status ts_zoo_binary_add(const float *z, const float *y, int64_t n, double *loss,
                            int64_t *correct, ts_metric_acc *acc) {
    for (int64_t i = 0; i < n; i++) {
        const double zi = z[i], yi = y[i];
        /* torch's BCEWithLogits: max(z, 0) - z y + log(1 + exp(-|z|)) */
        *loss += (zi > 0 ? zi : 0) - zi * yi + log1p(exp(-fabs(zi)));
        *correct += (zi > 0) == (yi > 0.5);
        if (acc->flags) {
            const float two[2] = {0.0f, z[i]};
            ts_status s = ts_metric_acc_add(acc, two, yi > 0.5);
            if (s != TS_OK) return s;
        }
    }
    return TS_OK;
}

ts_status ts_zoo_dice_reset(ts_zoo_dice *d, int64_t classes) {
    if (d->classes != classes) {
        free(d->sums);
        d->sums = ts_alloc((size_t)(3 * classes) * sizeof *d->sums, "dice sums");
        if (!d->sums) {
            d->classes = 0;
            return TS_ERR_NOMEM;
        }
        d->classes = classes;
    }
    memset(d->sums, 0, (size_t)(3 * classes) * sizeof *d->sums);
    return TS_OK;
}

void ts_zoo_dice_add(ts_zoo_dice *d, const float *logits, const int64_t *labels, int64_t n) {
    const int64_t C = d->classes;
    double *inter = d->sums, *psum = d->sums + C, *tsum = d->sums + 2 * C;
    for (int64_t t = 0; t < n; t++) {
        const float *row = logits + t * C;
        double mx = row[0], z = 0;
        for (int64_t k = 1; k < C; k++)
            if (row[k] > mx) mx = row[k];
        for (int64_t k = 0; k < C; k++) z += exp((double)row[k] - mx);
        for (int64_t k = 0; k < C; k++) psum[k] += exp((double)row[k] - mx) / z;
        inter[labels[t]] += exp((double)row[labels[t]] - mx) / z;
        tsum[labels[t]] += 1;
    }
}

double ts_zoo_dice_loss(const ts_zoo_dice *d) {
    const int64_t C = d->classes;
    if (C <= 0) return NAN;
    double mean = 0;
    for (int64_t k = 0; k < C; k++)
        mean += (2 * d->sums[k] + 1e-5) / (d->sums[C + k] + d->sums[2 * C + k] + 1e-5);
    return 1 - mean / (double)C;
}

void ts_zoo_dice_free(ts_zoo_dice *d) {
    free(d->sums);
    memset(d, 0, sizeof *d);
}
