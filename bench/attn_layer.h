/* attn_layer.h — for benchmark programs: one W3-shaped attention layer in a
 * bf16 training plan, x [B, T, 512] -> linear (qkv, with bias) -> GPT-2's
 * slices and head permutes (8 heads of 64) -> causal attention -> MSE
 * against the input "y", compiled with every instruction profiled. The
 * caller sets the options under test (threads, the switch it compares); a
 * benchmark stops at the first error (exit 1, the error on stderr).
 *
 *     ts_compile_options o = ts_compile_options_default();
 *     o.threads = 1;
 *     o.no_qkv_low = 1;
 *     ts_plan *p = bench_attn_layer(8, 256, o);
 */
#ifndef TESSEL_BENCH_ATTN_LAYER_H
#define TESSEL_BENCH_ATTN_LAYER_H

#include <stdio.h>
#include <stdlib.h>
#include "profile_step.h"
#include "tessel/tessel.h"

enum { BENCH_ATTN_H = 8, BENCH_ATTN_HD = 64, BENCH_ATTN_D = BENCH_ATTN_H * BENCH_ATTN_HD };

static inline ts_plan *bench_attn_layer(int64_t B, int64_t T, ts_compile_options opt) {
    enum { H = BENCH_ATTN_H, HD = BENCH_ATTN_HD, D = BENCH_ATTN_D };
    ts_graph *g = ts_graph_new();
    const int64_t xd[3] = {B, T, D}, hdims[4] = {B, T, H, HD}, sizes[3] = {D, D, D};
    const int perm[4] = {0, 2, 1, 3};
    ts_val x = ts_param(g, "x", TS_F32, 3, xd, ts_init_normal(0, 1.0));
    ts_val w = ts_param(g, "w", TS_F32, 2, (const int64_t[]){3 * D, D}, ts_init_normal(0, 0.04));
    ts_val b = ts_param(g, "b", TS_F32, 1, (const int64_t[]){3 * D}, ts_init_normal(0, 0.1));
    ts_val y = ts_input(g, "y", TS_F32, 3, xd);
    ts_val parts[3], h[3];
    ts_split(g, ts_linear(g, x, w, b), 2, 3, sizes, parts);
    for (int i = 0; i < 3; i++) h[i] = ts_permute(g, ts_reshape(g, parts[i], 4, hdims), perm);
    ts_val o = ts_causal_attention(g, h[0], h[1], h[2]);
    o = ts_reshape(g, ts_permute(g, o, perm), 3, xd);
    ts_train_spec spec = ts_train_spec_default(ts_mse_loss(g, o, y));
    spec.opt = ts_sgd(0.0, 0, 0, 0, 0);
    opt.seed = 1;
    opt.profile = 1;
    opt.precision.compute = TS_BF16;
    opt.no_weight_copies = 1; /* x's bf16 copy is the optimizer's business, not what is timed */
    return bench_compile(g, &spec, &opt);
}

#endif
