/* Synthetic batches: pure functions of (seed, batch index), so a run and
 * its rerun see identical data whatever the thread count or step order. */
#include "data/synthetic.h"

#include <math.h>
#include <stdlib.h>
#include "core/core.h"

/* One Philox key per (seed, batch, stream): separate streams for inputs and
 * noise keep x identical when only the noise changes, and vice versa. */
static uint64_t stream_key(uint64_t seed, int64_t index, uint64_t stream) {
    uint64_t parts[3] = {seed, (uint64_t)index, stream};
    return ts_hash64(parts, sizeof parts, 0x73796e7468ULL /* "synth" */);
}

ts_status ts_synth_regression(uint64_t seed, int64_t index, int64_t batch, int64_t window,
                              int64_t features, int64_t out_dim, float *x, float *y) {
    if (!x || !y || batch <= 0 || window <= 0 || features <= 0 || out_dim <= 0 || index < 0)
        return ts_fail(TS_ERR_INVALID,
                       "synthetic regression: bad arguments (batch %lld, window %lld, features "
                       "%lld, out_dim %lld, index %lld)",
                       (long long)batch, (long long)window, (long long)features, (long long)out_dim,
                       (long long)index);
    const int64_t row = window * features, n = batch * row;
    double *buf = ts_alloc((size_t)(n + batch * out_dim) * sizeof *buf, "synthetic batch");
    if (!buf) return TS_ERR_NOMEM;
    double *noise = buf + n;
    ts_rand_normal_f64(buf, n, stream_key(seed, index, 1), 0.0, 1.0);
    ts_rand_normal_f64(noise, batch * out_dim, stream_key(seed, index, 2), 0.0, 1.0);
    /* The target reads the float values the model sees, as torch does. */
    for (int64_t i = 0; i < n; i++) x[i] = (float)buf[i];
    const int64_t rows = window < 8 ? window : 8, cols = features < 4 ? features : 4;
    for (int64_t b = 0; b < batch; b++) {
        double sum = 0;
        for (int64_t t = window - rows; t < window; t++)
            for (int64_t f = 0; f < cols; f++) sum += x[b * row + t * features + f];
        double mean = sum / (double)(rows * cols);
        for (int64_t o = 0; o < out_dim; o++)
            y[b * out_dim + o] = (float)(mean + 0.1 * noise[b * out_dim + o]);
    }
    free(buf);
    return TS_OK;
}

ts_status ts_synth_tokens(uint64_t seed, int64_t index, int64_t batch, int64_t ctx, int64_t vocab,
                          int64_t *tokens, int64_t *targets) {
    if (!tokens || !targets || batch <= 0 || ctx <= 0 || vocab <= 0 || index < 0)
        return ts_fail(TS_ERR_INVALID,
                       "synthetic tokens: bad arguments (batch %lld, ctx %lld, vocab %lld, index "
                       "%lld)",
                       (long long)batch, (long long)ctx, (long long)vocab, (long long)index);
    const uint64_t key = stream_key(seed, index, 3);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t <= ctx; t++) {
            /* Two 32-bit words per token; the modulo bias is below 2^-32. */
            uint64_t i = (uint64_t)(b * (ctx + 1) + t);
            uint32_t r[4];
            ts_philox(key, 0, i, r);
            int64_t tok = (int64_t)((((uint64_t)r[0] << 32) | r[1]) % (uint64_t)vocab);
            if (t < ctx) tokens[b * ctx + t] = tok;
            if (t > 0) targets[b * ctx + t - 1] = tok;
        }
    return TS_OK;
}

ts_status ts_synth_binary_sequences(uint64_t seed, int64_t index, int64_t batch, int64_t window,
                                    int64_t features, float *x, float *y) {
    if (!x || !y || batch <= 0 || window <= 0 || features <= 0 || index < 0)
        return ts_fail(TS_ERR_INVALID,
                       "synthetic sequences: bad arguments (batch %lld, window %lld, features "
                       "%lld, index %lld)",
                       (long long)batch, (long long)window, (long long)features, (long long)index);
    const int64_t n = batch * window * features;
    double *buf = ts_alloc((size_t)n * sizeof *buf, "synthetic batch");
    if (!buf) return TS_ERR_NOMEM;
    ts_rand_normal_f64(buf, n, stream_key(seed, index, 4), 0.0, 1.0);
    for (int64_t i = 0; i < n; i++) x[i] = (float)buf[i];
    free(buf);
    const int64_t last = window < 16 ? window : 16;
    for (int64_t b = 0; b < batch; b++) {
        float sum = 0; /* in float, over the values the model sees */
        for (int64_t t = window - last; t < window; t++) sum += x[(b * window + t) * features];
        y[b] = sum > 0 ? 1.0f : 0.0f;
    }
    return TS_OK;
}

ts_status ts_synth_volumes(uint64_t seed, int64_t index, int64_t batch, int64_t channels,
                           int64_t size, int64_t classes, float *x, int64_t *y) {
    if (!x || !y || batch <= 0 || channels <= 0 || size < 2 || classes < 2 || index < 0)
        return ts_fail(TS_ERR_INVALID,
                       "synthetic volumes: bad arguments (batch %lld, channels %lld, size %lld, "
                       "classes %lld, index %lld)",
                       (long long)batch, (long long)channels, (long long)size, (long long)classes,
                       (long long)index);
    const int64_t S = size, vol = S * S * S;
    double *noise = ts_alloc((size_t)vol * sizeof *noise, "synthetic batch");
    if (!noise) return TS_ERR_NOMEM;
    for (int64_t b = 0; b < batch; b++) {
        /* One key per volume, so a volume does not depend on the batch size. */
        const uint64_t key = stream_key(seed, index * batch + b, 5);
        uint32_t r[4];
        ts_philox(key, 0, 0, r);
        int64_t ctr[3];
        for (int k = 0; k < 3; k++)
            ctr[k] = S / 4 + (int64_t)(r[k] % (uint64_t)(S / 2 ? S / 2 : 1));
        const double u = (double)r[3] / 4294967296.0;
        const double rad = (4 + 6 * u) * (double)S / 32.0;
        ts_rand_normal_f64(noise, vol, stream_key(seed, index * batch + b, 6), 0.0, 1.0);
        for (int64_t z = 0; z < S; z++)
            for (int64_t yy = 0; yy < S; yy++)
                for (int64_t xx = 0; xx < S; xx++) {
                    const int64_t v = (z * S + yy) * S + xx;
                    const double d =
                        sqrt((double)((z - ctr[0]) * (z - ctr[0]) + (yy - ctr[1]) * (yy - ctr[1]) +
                                      (xx - ctr[2]) * (xx - ctr[2])));
                    /* shells k = 1 .. classes-1 of radius rad * (classes - k) / (classes - 1) */
                    int64_t label = 0;
                    for (int64_t k = 1; k < classes; k++)
                        if (d <= rad * (double)(classes - k) / (double)(classes - 1)) label = k;
                    y[b * vol + v] = label;
                    const float val =
                        (float)((double)label / (double)(classes - 1) + 0.5 * noise[v]);
                    for (int64_t ch = 0; ch < channels; ch++)
                        x[(b * channels + ch) * vol + v] = val;
                }
    }
    free(noise);
    return TS_OK;
}

ts_status ts_synth_graph_nodes(uint64_t seed, int64_t nodes, int64_t features, int64_t classes,
                               float *x, int64_t *y) {
    if (!x || !y || nodes <= 0 || features <= 0 || classes <= 0)
        return ts_fail(TS_ERR_INVALID,
                       "synthetic graph: bad arguments (nodes %lld, features %lld, classes %lld)",
                       (long long)nodes, (long long)features, (long long)classes);
    const int64_t n = nodes * features, nc = classes * features;
    double *buf = ts_alloc((size_t)(n + nc) * sizeof *buf, "synthetic graph");
    if (!buf) return TS_ERR_NOMEM;
    double *cent = buf + n;
    const uint64_t lk = stream_key(seed, 0, 7);
    for (int64_t i = 0; i < nodes; i++) {
        uint32_t r[4];
        ts_philox(lk, 0, (uint64_t)i, r);
        y[i] = (int64_t)((((uint64_t)r[0] << 32) | r[1]) % (uint64_t)classes);
    }
    ts_rand_normal_f64(cent, nc, stream_key(seed, 0, 8), 0.0, 1.0);
    ts_rand_normal_f64(buf, n, stream_key(seed, 0, 9), 0.0, 1.0);
    for (int64_t i = 0; i < nodes; i++)
        for (int64_t f = 0; f < features; f++)
            x[i * features + f] = (float)(buf[i * features + f] + 0.5 * cent[y[i] * features + f]);
    free(buf);
    return TS_OK;
}
