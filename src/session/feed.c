/* Feeding data: loading data.source into datasets (CSV, IDX, .npy, token
 * and graph files), checking labels, splitting and standardising, fitting
 * the config to the data, the synthetic batches, and the batch of each
 * step. See session_internal.h. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "data/data_internal.h"
#include "data/synthetic.h"
#include "models/fusion_mask.h"
#include "session/session_internal.h"

static ts_status load_csv(session *s) {
    const ts_config *c = &s->c;
    char names[sizeof c->data.features];
    const char *list[256];
    int n = 0;
    snprintf(names, sizeof names, "%s", c->data.features);
    for (char *p = names; *p;) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        if (n == (int)(sizeof list / sizeof list[0]))
            return ts_fail(TS_ERR_INVALID, "data.features: more than %d columns",
                           (int)(sizeof list / sizeof list[0]));
        char *end = p + strcspn(p, ",");
        char *next = *end ? end + 1 : end;
        while (end > p && end[-1] == ' ') end--;
        *end = 0;
        list[n++] = p;
        p = next;
    }
    /* A table (window 1) is standardised after the split, with statistics of
     * the training split only (ts_sess_load_data); windows keep the loader's. */
    ts_csv_options co = {.path = c->data.path,
                         .features = n ? list : NULL,
                         .n_features = n,
                         .label = c->data.label,
                         .window = c->data.window,
                         .horizon = c->data.horizon,
                         .normalise = c->data.normalise && c->data.window > 1,
                         .skip_rows = c->data.skip_rows,
                         .no_header = !c->data.header,
                         /* binary gru/lstm: 0/1 numbers, checked by ts_zoo_fit */
                         .classes = ts_zoo_binary(c) ? 0 : c->model.classes};
    return ts_data_load_csv_windows(&co, &s->all);
}

/* Class ids must be in [0, classes): the first bad one, named by file and
 * example, is the error. Returns the largest label in *max. */
static ts_status check_labels(const ts_dataset *d, const char *file, int64_t classes,
                              int64_t *max) {
    const int64_t *y = d->y;
    for (int64_t i = 0; i < d->n; i++) {
        if (y[i] < 0 && classes <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: example %lld has label %lld, out of range: class ids are >= 0",
                           file, (long long)i, (long long)y[i]);
        if (y[i] < 0 || (classes > 0 && y[i] >= classes))
            return ts_fail(TS_ERR_INVALID,
                           "%s: example %lld has label %lld, out of range: labels must be in "
                           "[0, %lld)%s",
                           file, (long long)i, (long long)y[i],
                           (long long)(classes > 0 ? classes : 0),
                           classes > 0 ? " (model.classes)" : "");
        if (classes <= 0 && y[i] >= TS_DATA_MAX_CLASSES) {
            char where[48];
            snprintf(where, sizeof where, "example %lld", (long long)i);
            return ts_data_check_class_count(file, where, y[i]);
        }
        if (y[i] > *max) *max = y[i];
    }
    return TS_OK;
}

ts_status ts_sess_load_data(session *s) {
    ts_config *c = &s->c;
    ts_status st = TS_OK;
    const char *label_file = NULL, *test_label_file = NULL;
    /* A synthetic graph (gcn) is data like a graph file's (zoo_data.h). */
    const int graph = c->data.source == TS_CFG_GRAPH || ts_model_of(c)->input == TS_MODEL_IN_GRAPH;
    switch ((ts_cfg_source)(graph ? TS_CFG_GRAPH : c->data.source)) {
    case TS_CFG_SYNTHETIC: return TS_OK;
    case TS_CFG_IDX:
        /* Training images are mapped (converted per batch); the test set is
         * read whole, as evaluation reads it in memory. */
        st = ts_data_map_idx_pair(c->data.train_images, c->data.train_labels, &s->all);
        if (st == TS_OK && c->data.test_images[0])
            st = ts_data_load_idx_pair(c->data.test_images, c->data.test_labels, &s->test);
        label_file = c->data.train_labels, test_label_file = c->data.test_labels;
        break;
    case TS_CFG_NPY:
        st = ts_data_map_npy_pair(c->data.x, c->data.y, &s->all);
        /* which sources each example has (model.source_mask) */
        if (st == TS_OK && c->data.valid[0])
            st = ts_dataset_attach_valid(s->all, c->data.valid, TS_FUSION_SOURCES);
        label_file = c->data.y;
        break;
    case TS_CFG_CSV: st = load_csv(s); break;
    case TS_CFG_TOKENS:
        /* Documents are read whole (rows of varying length); plain windows
         * are mapped, not read whole: a corpus larger than memory trains. */
        st = c->data.eot_id >= 0 || c->data.doc_offsets[0]
                 ? ts_data_load_token_docs_at(
                       c->data.path, c->data.bits, c->model.ctx, c->model.vocab, c->data.eot_id,
                       c->data.doc_offsets[0] ? c->data.doc_offsets : NULL, &s->all)
                 : ts_data_map_tokens_async(c->data.path, c->data.bits, c->model.ctx,
                                            c->model.vocab, &s->all);
        break;
    case TS_CFG_GRAPH: {
        /* The whole graph is the one example of each split (zoo_data.h). */
        ts_config_data_shape gs = {0, 0, 0, 0, 0, 0};
        st = ts_zoo_load_graph(c, &s->graph, &s->all, &s->train, &s->val, &s->test, &gs);
        if (st == TS_OK) st = ts_config_fit_data(c, &gs);
        if (st != TS_OK) return st;
        return ts_loader_new(s->train, 1, 0, c->train.seed, &s->loader);
    }
    }
    if (st != TS_OK) return st;

    ts_config_data_shape shape = {0, 0, 0, 0, 0, 0};
    shape.in_dim = numel_dims(s->all->x_rank, s->all->x_dims);
    if (ts_zoo_model(c)) {
        st = ts_zoo_fit(c, s->all, c->data.source == TS_CFG_CSV ? c->data.path : c->data.x,
                        label_file ? label_file : c->data.path, &shape);
        if (st != TS_OK) return st;
    } else if (!s->gpt) {
        const int64_t per = numel_dims(s->all->y_rank, s->all->y_dims);
        if (s->all->y_dtype == TS_I64) {
            if (per != 1)
                return ts_fail(TS_ERR_SHAPE,
                               "%s: integer targets are class ids, one per example, but each "
                               "example has %lld",
                               label_file, (long long)per);
            const int64_t want = c->model.classes;
            int64_t max = -1;
            st = check_labels(s->all, label_file, want, &max);
            if (st == TS_OK && s->test) st = check_labels(s->test, test_label_file, want, &max);
            if (st != TS_OK) return st;
            shape.classes = max + 1;
        } else {
            shape.out_dim = per;
        }
    }
    if (s->test &&
        (s->test->x_rank != s->all->x_rank ||
         memcmp(s->test->x_dims, s->all->x_dims, sizeof(int64_t) * (size_t)s->all->x_rank)))
        return ts_fail(TS_ERR_SHAPE, "%s: test images are not the shape of the training images",
                       c->data.test_images);

    st = ts_dataset_split(s->all, c->data.val_fraction, c->train.seed, &s->train, &s->val);
    if (st != TS_OK) return st;
    if (c->data.source == TS_CFG_CSV && c->data.normalise && c->data.window == 1) {
        ts_dataset *others[1] = {s->val};
        if ((st = ts_dataset_standardise(s->train, others, 1)) != TS_OK) return st;
    }
    if (s->train->n < c->model.batch)
        return ts_fail(TS_ERR_INVALID,
                       "the training split has %lld examples, fewer than model.batch %lld "
                       "(%lld examples, data.val_fraction %g)",
                       (long long)s->train->n, (long long)c->model.batch, (long long)s->all->n,
                       c->data.val_fraction);
    /* data.drop_last false: the short last batch is an epoch's too */
    shape.batches_per_epoch = c->data.drop_last
                                  ? s->train->n / c->model.batch
                                  : (s->train->n + c->model.batch - 1) / c->model.batch;
    st = ts_config_fit_data(c, &shape);
    if (st != TS_OK) {
        /* Name the data file whose examples do not fit (images of the wrong size). */
        const char *xf = c->data.source == TS_CFG_IDX   ? c->data.train_images
                         : c->data.source == TS_CFG_NPY ? c->data.x
                                                        : c->data.path;
        if (xf[0]) ts_error_prefix("%s", xf);
        return st;
    }
    st = ts_loader_new(s->train, c->model.batch, c->data.shuffle, c->train.seed, &s->loader);
    if (st == TS_OK && !c->data.drop_last) ts_loader_keep_last(s->loader);
    if (st == TS_OK && c->shape.sort_window > 0 && c->data.source == TS_CFG_TOKENS)
        st = ts_loader_sort_window(s->loader, c->shape.sort_window);
    /* The next two batches are assembled on a thread while the step runs
     * (same batches, same order: src/data/prefetch.c). */
    return st == TS_OK ? ts_loader_prefetch(s->loader, 2) : st;
}

/* The benchmark models (flat and token inputs: mlp, gpt) cycle over N_SYNTH fixed batches, as the
 * reference benchmark does; the sequence and volume models draw a fresh
 * batch every step instead (ts_sess_next_batch), so their evaluation measures
 * generalisation, not memory of a few batches. */
ts_status ts_sess_make_synthetic(session *s) {
    const ts_config *c = &s->c;
    if (ts_zoo_model(c)) return TS_OK;
    int n = c->train.steps < N_SYNTH ? (int)c->train.steps : N_SYNTH;
    for (; s->n_synth < n; s->n_synth++) {
        int k = s->n_synth;
        if (!(s->sx[k] = ts_alloc(s->xb * (size_t)s->nslices, "synthetic batch")) ||
            !(s->sy[k] = ts_alloc(s->yb * (size_t)s->nslices, "synthetic batch"))) {
            s->n_synth++;
            return TS_ERR_NOMEM;
        }
        ts_status st;
        if (ts_zoo_model(c)) {
            st = ts_zoo_synth(c, k, s->sx[k], s->sy[k]);
        } else if (ts_model_of(c)->input == TS_MODEL_IN_FLAT) {
            const int64_t w = c->model.window;
            int64_t window = w > 0 ? w : c->model.in_dim, features = w > 0 ? c->model.features : 1;
            st = ts_synth_regression(c->train.seed, k, c->model.batch, window, features,
                                     c->model.out_dim, s->sx[k], s->sy[k]);
        } else if (ts_model_of(c)->input == TS_MODEL_IN_TOKENS) {
            st = ts_synth_tokens(c->train.seed, k, c->model.batch, c->model.ctx, c->model.vocab,
                                 s->sx[k], s->sy[k]);
        } else {
            st = ts_fail(TS_ERR_INVALID, "a %s has no synthetic data: set data.source",
                         ts_config_model_word(c->model.name));
        }
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

ts_status ts_sess_next_batch(session *s, int64_t step) {
    ts_status st = TS_OK;
    s->rows = s->c.model.batch;
    if (s->loader) {
        st = ts_loader_next_rows(s->loader, s->bx, s->by, &s->rows);
    } else if (s->n_synth == 0) {
        /* Batch `step - 1` of the seed's stream: a resumed run draws the
         * same batches; the validation batches come from indices 2^20 on. */
        st = ts_zoo_synth(&s->c, step - 1, s->bx, s->by);
    } else {
        int k = (int)((step - 1) % s->n_synth);
        memcpy(s->bx, s->sx[k], s->xb * (size_t)s->nslices);
        memcpy(s->by, s->sy[k], s->yb * (size_t)s->nslices);
    }
    const ts_config *c = &s->c;
    if (st == TS_OK && c->debug.inject)
        ts_alert_inject(c->debug.inject, c->debug.inject_step, c->debug.inject_count,
                        c->debug.inject_scale, step, s->bx, s->xb * (size_t)s->nslices);
    return st;
}
