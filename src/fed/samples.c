/* samples.c — a client's FedAvg weight: the number of examples it trains
 * on, counted the way its local runs split the data (src/session/feed.c:
 * all examples less the validation share, n_val = round(n·val_fraction)).
 * CSV counts its rows; IDX and .npy pairs are mapped (not copied) and
 * their example count read, so a Fashion-MNIST shard weighs its images. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "data/data.h"
#include "tessel/fed.h"
#include "tessel/tessel.h"

/* Training rows of a CSV data set: its lines after skip_rows and the header,
 * less the validation fraction. */
static ts_status csv_samples(const ts_config *c, int64_t *out) {
    FILE *f = fopen(c->data.path, "r");
    if (!f)
        return ts_fail(TS_ERR_IO, "fed join: cannot read %s: %s", c->data.path, strerror(errno));
    int64_t lines = 0;
    int ch, last = '\n';
    while ((ch = fgetc(f)) != EOF) {
        if (ch == '\n') lines++;
        last = ch;
    }
    if (last != '\n') lines++;
    fclose(f);
    int64_t rows = lines - c->data.skip_rows - (c->data.header ? 1 : 0);
    *out = (int64_t)((double)rows * (1.0 - c->data.val_fraction));
    if (*out < 1) return ts_fail(TS_ERR_INVALID, "fed join: %s has no training rows", c->data.path);
    return TS_OK;
}

/* Examples of an IDX or .npy pair less the validation split's. */
static ts_status pair_samples(const ts_config *c, int64_t *out) {
    const int idx = c->data.source == TS_CFG_IDX;
    const char *x = idx ? c->data.train_images : c->data.x;
    ts_dataset *d = NULL;
    ts_status s = idx ? ts_data_map_idx_pair(c->data.train_images, c->data.train_labels, &d)
                      : ts_data_map_npy_pair(c->data.x, c->data.y, &d);
    if (s != TS_OK) {
        ts_error_prefix("fed join: counting the examples of %s", x);
        return s;
    }
    const int64_t n = d->n, n_val = (int64_t)(c->data.val_fraction * (double)n + 0.5);
    ts_dataset_free(d);
    *out = n - n_val;
    if (*out < 1)
        return ts_fail(TS_ERR_INVALID,
                       "fed join: %s has %lld examples, none left for training after "
                       "data.val_fraction %g",
                       x, (long long)n, c->data.val_fraction);
    return TS_OK;
}

ts_status ts_fed_samples(const ts_config *c, int64_t *out) {
    switch (c->data.source) {
    case TS_CFG_CSV: return csv_samples(c, out);
    case TS_CFG_IDX:
    case TS_CFG_NPY: return pair_samples(c, out);
    default: {
        static const char *const words[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
        const int k = c->data.source;
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "fed join: a client's FedAvg weight is its number of training examples, "
                       "counted for data.source csv, idx and npy only (data.source is %s)",
                       k >= 0 && k < 6 ? words[k] : "unknown");
    }
    }
}
