/* Column sums (reduce over the leading axis, inner extent > 256: several
 * column blocks), run through the sum kernel on buffers of exact size with
 * guard elements after the output: right values, and nothing written past
 * the output (each block sums its own 256 columns only). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"

enum { R = 37, C = 700, GUARD = 2048 };

int main(void) {
    int64_t d[2] = {R, C};
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, d);
    int axes[1] = {0};
    ts_val s = ts_sum(g, x, 1, axes, 1);
    CHECK(ts_graph_status(g) == TS_OK, "build: %s", ts_graph_error(g));
    const ts_node *n = &g->nodes[g->values[s.id].node];
    const ts_op_def *def = ts_op_get(n->op);
    size_t sb = def->scratch ? def->scratch(g, n) : 0;
    float *xs = malloc(sizeof(float) * R * C), *out = malloc(sizeof(float) * (C + GUARD));
    void *scratch = sb ? ts_aligned_alloc(sb, "test") : NULL;
    unsigned seed = 3;
    for (int i = 0; i < R * C; i++) xs[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int threads = 1; threads <= 2; threads++) {
        for (int i = 0; i < C + GUARD; i++) out[i] = -7.0f;
        ts_tensor in = {TS_F32, 2, {R, C}, xs}, o = {TS_F32, 2, {1, C}, out};
        ts_step_ctx ctx = {1, 0, 0, 1};
        ts_kargs k = {&n->a, 1, 1, &in, &o, scratch, sb, &ctx, "colsum", NULL};
        omp_set_num_threads(threads);
        CHECK_OK(def->kernel(&k));
        int bad = 0, clobbered = 0;
        for (int j = 0; j < C; j++) {
            double ref = 0;
            for (int r = 0; r < R; r++) ref += (double)xs[r * C + j];
            bad += out[j] != (float)ref;
        }
        for (int i = C; i < C + GUARD; i++) clobbered += out[i] != -7.0f;
        CHECK(!bad, "%d of %d column sums wrong with %d threads", bad, C, threads);
        CHECK(!clobbered, "%d elements past the output written with %d threads", clobbered,
              threads);
    }
    free(xs);
    free(out);
    ts_aligned_free(scratch);
    ts_graph_free(g);
    return check_summary("reduce_cols");
}
