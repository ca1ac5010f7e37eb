/* Synthetic batches: pure functions of (seed, batch index), so a run and
 * its rerun see identical data whatever the thread count or step order. */
#include "data/synthetic.h"

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
