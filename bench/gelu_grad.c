/* bench/gelu_grad.c — one W3 layer's GELU forward and backward kernels as a bf16 plan runs
 * them, without and with the gelu_grad pass (passes/gelu_grad.c; compile.no_gelu_grad):
 *
 *   old: gelu(h) -> bf16 (out_low)        then  sum(dA, h): dA gelu'(h), its bias-gradient
 *                                               column sum and bf16 copy (reduce.bwd side 0)
 *   new: gelu(h) -> bf16 and g = gelu'(h)  then  sum(dA, g): dA g, the same sum and copy (side 2)
 *        g f32 (session 18) and g bf16 (session 19: what a bf16 plan runs now)
 *
 * and with --fp32 as an fp32 plan runs them (the backward's recomputed gelu writing f32, the
 * backward a unary_bwd reading h or g; g f32 only), on [rows, 2048] f32 tensors (W3: 8 x 256
 * rows), the kernels alternated round by round so that all see the same load; prints per
 * kernel the minimum and the median ms, and the median over rounds of new / old (forward +
 * backward). Checks that side 0 and side 2 with an f32 g give the same bits (and bf16 copies),
 * and that the bf16 g is bf16(the f32 g). --cpu times with the thread's CPU clock instead of
 * the wall clock (1 thread: robust to other processes on a loaded machine).
 *
 *   build/bench_gelu_grad [--rounds N] [--rows R] [--threads T] [--erf] [--fp32] [--cpu]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "core/half.h"
#include "ops/op.h"

enum { COLS = 2048, MAX_ROUNDS = 999 };

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec t;
    clock_gettime(clock_id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void run(const ts_attrs *a, int op, ts_tensor *in, int n_in, ts_tensor *out, int n_out,
                void *scratch, size_t sb) {
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_kargs k = {a, n_in, n_out, in, out, scratch, sb, &ctx, "bench", NULL};
    if (ts_op_get(op)->kernel(&k) != TS_OK) {
        fprintf(stderr, "kernel: %s\n", ts_last_error());
        exit(1);
    }
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1, fp32 = 0;
    int64_t rows = 8 * 256, approx = TS_GELU_TANH;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--erf"))
            approx = TS_GELU_ERF;
        else if (!strcmp(argv[i], "--fp32"))
            fp32 = 1;
        else if (!strcmp(argv[i], "--cpu"))
            clock_id = CLOCK_THREAD_CPUTIME_ID;
        else {
            fprintf(stderr,
                    "usage: %s [--rounds N] [--rows R] [--threads T] [--erf] [--fp32] [--cpu]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || rows < 1 || threads < 1 ||
        (clock_id != CLOCK_MONOTONIC && threads != 1)) {
        fprintf(stderr, "rounds 1..%d, rows and threads >= 1, --cpu with 1 thread\n", MAX_ROUNDS);
        return 2;
    }
    omp_set_num_threads(threads);
    const int64_t n = rows * COLS;
    const size_t fb = sizeof(float) * (size_t)n, hb = sizeof(uint16_t) * (size_t)n;
    float *h = ts_aligned_alloc(fb, "bench"), *dA = ts_aligned_alloc(fb, "bench");
    float *g = ts_aligned_alloc(fb, "bench"), *yf = ts_aligned_alloc(fb, "bench");
    float *dh[2] = {ts_aligned_alloc(fb, "bench"), ts_aligned_alloc(fb, "bench")};
    uint16_t *y = ts_aligned_alloc(hb, "bench"), *g16 = ts_aligned_alloc(hb, "bench"),
             *low[3] = {ts_aligned_alloc(hb, "bench"), ts_aligned_alloc(hb, "bench"),
                        ts_aligned_alloc(hb, "bench")};
    float bias[3][COLS];
    for (int64_t i = 0; i < n; i++)
        h[i] = (float)(2.0 * sin(0.001 * (double)i)), dA[i] = (float)(1e-3 * cos(0.37 * i));
    /* the sum's scratch, sized by the op for this shape */
    ts_graph *gr = ts_graph_new();
    ts_val xv = ts_input(gr, "x", TS_F32, 2, (const int64_t[]){rows, COLS});
    ts_attrs sa = ts_attrs_zero();
    sa.reduce.axes = 1, sa.reduce.keepdim = 1, sa.reduce.scale = 1.0;
    ts_val sv = ts_node_add(gr, TS_OP_REDUCE_SUM, 1, &xv, &sa, NULL);
    size_t sb = ts_op_get(TS_OP_REDUCE_SUM)->scratch(gr, &gr->nodes[gr->values[sv.id].node]);
    void *scratch = ts_aligned_alloc(sb ? sb : 64, "bench");
    ts_graph_free(gr);

    ts_attrs fo = ts_attrs_zero(), fn, so[2];
    fo.unary.approx = (int32_t)approx, fo.unary.out_low = !fp32;
    fn = fo, fn.unary.out_grad = 1;
    sa.reduce.out_low = 1, sa.reduce.bwd.fwd_op = TS_OP_GELU, sa.reduce.bwd.fwd = fo.unary;
    sa.reduce.bwd.fwd.out_low = 0;
    so[0] = so[1] = sa;
    so[1].reduce.bwd.side = 2;
    ts_attrs ub[2]; /* fp32: unary_bwd reading h (side 0) or g (side 2) */
    ub[0] = ub[1] = ts_attrs_zero();
    ub[0].unary_bwd = ub[1].unary_bwd = sa.reduce.bwd;
    ub[1].unary_bwd.side = 2;
    ts_tensor tx = {TS_F32, 2, {rows, COLS}, h};
    ts_tensor ty =
        fp32 ? (ts_tensor){TS_F32, 2, {rows, COLS}, yf} : (ts_tensor){TS_BF16, 2, {rows, COLS}, y};
    ts_tensor tyg[2] = {ty, {TS_F32, 2, {rows, COLS}, g}};
    ts_tensor tyg16[2] = {ty, {TS_BF16, 2, {rows, COLS}, g16}};
    /* kernels 0..3 as named below; in a bf16 plan also 4 (forward, g bf16) and 5 (its sum) */
    const int nk = fp32 ? 4 : 6;
    static double t[6][MAX_ROUNDS], ratio[MAX_ROUNDS], ratio16[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        run(&fo, TS_OP_GELU, &tx, 1, &ty, 1, NULL, 0); /* old forward */
        double t1 = now();
        run(&fn, TS_OP_GELU, &tx, 1, tyg, 2, NULL, 0); /* new forward: y and g */
        double t2 = now();
        if (!fp32) run(&fn, TS_OP_GELU, &tx, 1, tyg16, 2, NULL, 0); /* y and a bf16 g */
        double t3 = now();
        for (int s = 0; s < (fp32 ? 2 : 3); s++) { /* old backward reads h, new reads g */
            ts_tensor in[2] = {{TS_F32, 2, {rows, COLS}, dA},
                               s == 2 ? (ts_tensor){TS_BF16, 2, {rows, COLS}, g16}
                                      : (ts_tensor){TS_F32, 2, {rows, COLS}, s ? g : h}};
            ts_tensor out[2] = {{TS_F32, 2, {1, COLS}, bias[s]},
                                {TS_BF16, 2, {rows, COLS}, low[s]}};
            ts_tensor od = {TS_F32, 2, {rows, COLS}, dh[s & 1]}; /* s < 2 in fp32 */
            double a = now();
            if (fp32)
                run(&ub[s & 1], TS_OP_UNARY_BWD, in, 2, &od, 1, NULL, 0);
            else
                run(&so[s ? 1 : 0], TS_OP_REDUCE_SUM, in, 2, out, 2, scratch, sb);
            t[s < 2 ? 2 + s : 5][r] = (now() - a) * 1e3;
        }
        t[0][r] = (t1 - t0) * 1e3, t[1][r] = (t2 - t1) * 1e3, t[4][r] = (t3 - t2) * 1e3;
        ratio[r] = (t[1][r] + t[3][r]) / (t[0][r] + t[2][r]);
        ratio16[r] = (t[4][r] + t[5][r]) / (t[0][r] + t[2][r]);
    }
    int same = fp32 ? !memcmp(dh[0], dh[1], fb)
                    : !memcmp(bias[0], bias[1], sizeof bias[0]) && !memcmp(low[0], low[1], hb);
    for (int64_t i = 0; !fp32 && i < n; i++) same &= g16[i] == ts_f32_to_bf16(g[i]);
    printf("gelu_grad: [%lld, %d] f32, %s GELU, %s plan, %d threads, %d rounds, %s clock; "
           "same bits: %s\n",
           (long long)rows, COLS, approx == TS_GELU_TANH ? "tanh" : "erf", fp32 ? "fp32" : "bf16",
           threads, rounds, clock_id == CLOCK_MONOTONIC ? "wall" : "cpu", same ? "yes" : "NO");
    static const char *name[2][6] = {
        {"old forward  gelu -> bf16          ", "new forward  gelu -> bf16 + g f32  ",
         "old backward sum(dA, h) side 0     ", "new backward sum(dA, g f32) side 2 ",
         "new forward  gelu -> bf16 + g bf16 ", "new backward sum(dA, g bf16) side 2"},
        {"old forward  gelu -> f32           ", "new forward  gelu -> f32 + g       ",
         "old backward unary_bwd(dA, h)      ", "new backward unary_bwd(dA, g)      "}};
    for (int k = 0; k < nk; k++) {
        double mn = t[k][0];
        for (int r = 1; r < rounds; r++) mn = t[k][r] < mn ? t[k][r] : mn;
        printf("  %s min %7.3f ms  median %7.3f ms\n", name[fp32][k], mn, ts_median(t[k], rounds));
    }
    printf("  new / old (forward + backward, g f32), median over rounds: %.3f\n",
           ts_median(ratio, rounds));
    if (!fp32)
        printf("  new / old (forward + backward, g bf16), median over rounds: %.3f\n",
               ts_median(ratio16, rounds));
    ts_aligned_free(h), ts_aligned_free(dA), ts_aligned_free(g), ts_aligned_free(y);
    ts_aligned_free(g16), ts_aligned_free(low[2]);
    ts_aligned_free(low[0]), ts_aligned_free(low[1]), ts_aligned_free(scratch);
    ts_aligned_free(yf), ts_aligned_free(dh[0]), ts_aligned_free(dh[1]);
    return same ? 0 : 1;
}
