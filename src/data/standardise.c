/* Standardisation of tabular features with statistics of the training
 * split only, applied after the split so that nothing about held-out
 * examples reaches the inputs (see data.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

static int64_t features_of(const ts_dataset *d) {
    return d->x_rank > 0 ? d->x_dims[d->x_rank - 1] : 1;
}

static ts_status set_stats(ts_dataset *d, const float *mean, const float *sd, int64_t nf) {
    free(d->norm_mean);
    free(d->norm_std);
    d->norm_mean = ts_alloc((size_t)nf * sizeof(float), "normalisation means");
    d->norm_std = ts_alloc((size_t)nf * sizeof(float), "normalisation deviations");
    if (!d->norm_mean || !d->norm_std) return TS_ERR_NOMEM;
    memcpy(d->norm_mean, mean, (size_t)nf * sizeof(float));
    memcpy(d->norm_std, sd, (size_t)nf * sizeof(float));
    d->n_norm = nf;
    return TS_OK;
}

/* x = (x - mean) / std in double, rounded once, as the CSV loader does. */
static void apply(ts_dataset *d, const float *mean, const float *sd, int64_t nf) {
    float *x = d->x;
    int64_t rows = (int64_t)(ts_dataset_x_bytes(d) / sizeof(float)) / nf * d->n;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t f = 0; f < nf; f++) {
            float *v = &x[r * nf + f];
            *v = (float)(((double)*v - mean[f]) / sd[f]);
        }
}

ts_status ts_dataset_standardise(ts_dataset *train, ts_dataset *const *others, int n) {
    if (!train || (n > 0 && !others)) return ts_fail(TS_ERR_INVALID, "standardise: NULL dataset");
    if (train->x_dtype != TS_F32 || train->n < 1)
        return ts_fail(TS_ERR_INVALID, "standardise: the training set needs f32 x and examples");
    const int64_t nf = features_of(train);
    const size_t xb = ts_dataset_x_bytes(train);
    for (int i = 0; i < n; i++)
        if (others[i] && (others[i]->x_dtype != TS_F32 || ts_dataset_x_bytes(others[i]) != xb ||
                          features_of(others[i]) != nf))
            return ts_fail(TS_ERR_SHAPE,
                           "standardise: dataset %d does not have the training x shape", i);
    float *mean = ts_alloc((size_t)nf * 2 * sizeof(float), "normalisation statistics");
    if (!mean) return TS_ERR_NOMEM;
    float *sd = mean + nf;
    const float *x = train->x;
    const int64_t rows = (int64_t)(xb / sizeof(float)) / nf * train->n;
    for (int64_t f = 0; f < nf; f++) {
        double sum = 0, sq = 0;
        for (int64_t r = 0; r < rows; r++) sum += x[r * nf + f];
        const double m = sum / (double)rows;
        for (int64_t r = 0; r < rows; r++) {
            double dv = x[r * nf + f] - m;
            sq += dv * dv;
        }
        const float s = (float)sqrt(sq / (double)rows);
        mean[f] = (float)m;
        sd[f] = s > 0 ? s : 1.0f;
    }
    ts_status st = TS_OK;
    for (int i = -1; i < n && st == TS_OK; i++) {
        ts_dataset *d = i < 0 ? train : others[i];
        if (!d) continue;
        apply(d, mean, sd, nf);
        st = set_stats(d, mean, sd, nf);
    }
    free(mean);
    return st;
}
