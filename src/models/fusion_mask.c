/* Sensor masks of the fusion model: the gate on a source's input, the
 * masked mean over the branches, and the per-row dropout flags
 * (fusion_mask.h). */
#include "models/fusion_mask.h"

#include "tessel/util.h"

ts_val ts_fusion_gate(ts_graph *g, ts_val x, ts_val valid, int k) {
    /* the flag [B, 1] broadcast over the row: a select, not a product, since
     * NaN * 0 is NaN */
    ts_val flag = ts_slice(g, valid, 1, k, k + 1);
    return ts_where(g, flag, x, ts_scalar(g, 0.0, ts_dtype_of(g, x)));
}

ts_val ts_fusion_rows(ts_graph *g, ts_val valid, int k) {
    int64_t d[1] = {ts_dim(g, valid, 0)};
    return ts_cast(g, ts_reshape(g, ts_slice(g, valid, 1, k, k + 1), 1, d), TS_F32);
}

ts_val ts_fusion_mean(ts_graph *g, int n, const ts_val *parts, ts_val valid) {
    ts_val rows[TS_FUSION_SOURCES * 4];
    if (n < 1 || n > (int)(sizeof rows / sizeof rows[0])) {
        ts_graph_fail(g, TS_ERR_INVALID, "fusion mean: %d sources (1 to %d)", n,
                      (int)(sizeof rows / sizeof rows[0]));
        return TS_NONE;
    }
    /* [B, D] each -> [B, 1, D] -> [B, n, D] */
    for (int i = 0; i < n; i++) {
        if (ts_rank(g, parts[i]) != 2) {
            ts_graph_fail(g, TS_ERR_SHAPE, "fusion mean: source %d is not [batch, width]", i);
            return TS_NONE;
        }
        int64_t d[3] = {ts_dim(g, parts[i], 0), 1, ts_dim(g, parts[i], 1)};
        rows[i] = ts_reshape(g, parts[i], 3, d);
    }
    return ts_masked_mean(g, n == 1 ? rows[0] : ts_concat(g, n, rows, 1), valid);
}

/* A uniform draw in [0, 1) from the hash of (seed, step, row, source). */
static double draw(uint64_t seed, int64_t step, int64_t row, int source) {
    const uint64_t key[4] = {seed, (uint64_t)step, (uint64_t)row, (uint64_t)source};
    return (double)(ts_hash64(key, sizeof key, 0x5e750125) >> 11) * 0x1p-53;
}

void ts_fusion_valid(int64_t rows, uint64_t seed, int64_t step, double p, const uint8_t *have,
                     uint8_t *valid) {
    const int S = TS_FUSION_SOURCES;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *h = have ? have + r * S : NULL;
        uint8_t *v = valid + r * S;
        int kept = 0, present = 0;
        for (int k = 0; k < S; k++) {
            const int in = !h || h[k];
            present += in;
            kept += v[k] = in && !(p > 0 && draw(seed, step, r, k) < p);
        }
        /* keep the pick-th present source (with every source present, the
         * source drawn as before the data could say which are) */
        int pick = (int)(draw(seed, step, r, S) * present);
        for (int k = 0; !kept && k < S; k++)
            if ((!h || h[k]) && pick-- == 0) v[k] = 1, kept = 1;
    }
}
