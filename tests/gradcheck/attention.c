/* Causal attention: gradients by finite differences, the forward against
 * PyTorch, and shape errors. */
#include <string.h>
#include "gradcheck.h"

static ts_val build(ts_graph *g, const ts_val *in, void *user) {
    (void)user;
    return ts_causal_attention(g, in[0], in[1], in[2]);
}

static void check_grads(void) {
    gc_input in[3] = {GC_F(2, 2, 5, 3), GC_F(2, 2, 5, 3), GC_F(2, 2, 5, 3)};
    gc_check("causal_attention B=2 H=2 T=5 hd=3", 3, in, build, NULL);
    /* Larger scores make the softmax peaked (a harder case for the masked
     * rows' gradients). */
    for (int i = 0; i < 2; i++) in[i].lo = -3, in[i].hi = 3;
    gc_check("causal_attention wide scores", 3, in, build, NULL);
    gc_input one[3] = {GC_F(1, 1, 1, 4), GC_F(1, 1, 1, 4), GC_F(1, 1, 1, 4)};
    gc_check("causal_attention T=1", 3, one, build, NULL);
}

/* softmax(q k^T / sqrt(3) masked) v for B=1, H=2, T=4, hd=3 computed by
 * torch 1.13 in float64 (LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp):
 *
 *   import torch, math
 *   B, H, T, hd = 1, 2, 4, 3; n = B * H * T * hd
 *   mk = lambda a, m, o, d: torch.tensor([((i * a) % m - o) / d for i in range(n)],
 *                                        dtype=torch.float64).reshape(B, H, T, hd)
 *   q, k, v = mk(7, 11, 5, 4), mk(5, 13, 6, 5), mk(3, 7, 3, 2)
 *   s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
 *   s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float('-inf'))
 *   print((torch.softmax(s, -1) @ v).flatten().tolist())
 */
static const double REF[24] = {-1.5,
                               0,
                               1.5,
                               -0.95680665920961427,
                               0.54319334079038539,
                               0.14201664802403624,
                               0.037513059383121161,
                               -0.88335074584416162,
                               0.077081156769479825,
                               0.60081291229935341,
                               -0.77619803060768955,
                               0.43921641949752899,
                               -1,
                               0.5,
                               -1.5,
                               -0.47116451884641031,
                               1.0288354811535896,
                               -0.97116451884641042,
                               -0.03846865003460942,
                               0.36153721241482406,
                               -0.53846865003460942,
                               -0.46379724447789644,
                               0.33649845031559455,
                               -0.15544703518417441};

static void check_forward(ts_dtype dt, double tol) {
    int64_t d[4] = {1, 2, 4, 3};
    double qkv[3][24];
    const int mul[3] = {7, 5, 3}, mod[3] = {11, 13, 7}, off[3] = {5, 6, 3}, div[3] = {4, 5, 2};
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 24; i++) qkv[j][i] = (double)((i * mul[j]) % mod[j] - off[j]) / div[j];
    ts_graph *g = ts_graph_new();
    const char *names[3] = {"q", "k", "v"};
    ts_val in[3];
    for (int j = 0; j < 3; j++) in[j] = ts_input(g, names[j], dt, 4, d);
    ts_val y = ts_causal_attention(g, in[0], in[1], in[2]);
    CHECK_OK(ts_mark_output(g, y, "y"));
    CHECK(ts_rank(g, y) == 4 && ts_dim(g, y, 2) == 4 && ts_dim(g, y, 3) == 3,
          "attention output shape");
    ts_plan *plan = NULL;
    CHECK_OK(ts_compile(g, NULL, NULL, &plan));
    if (plan) {
        for (int j = 0; j < 3; j++) {
            float f[24];
            for (int i = 0; i < 24; i++) f[i] = (float)qkv[j][i];
            if (dt == TS_F32)
                CHECK_OK(ts_plan_set_input(plan, names[j], f, sizeof f));
            else
                CHECK_OK(ts_plan_set_input(plan, names[j], qkv[j], sizeof qkv[j]));
        }
        CHECK_OK(ts_plan_step(plan));
        double out[24];
        float outf[24];
        if (dt == TS_F32) {
            CHECK_OK(ts_plan_read(plan, "y", outf, sizeof outf));
            for (int i = 0; i < 24; i++) out[i] = outf[i];
        } else {
            CHECK_OK(ts_plan_read(plan, "y", out, sizeof out));
        }
        for (int i = 0; i < 24; i++) CHECK_NEAR(out[i], REF[i], tol);
        ts_plan_free(plan);
    }
    ts_graph_free(g);
}

static void check_errors(void) {
    struct {
        int rank;
        int64_t k[4];
        ts_dtype dt;
    } bad[3] = {{4, {1, 2, 4, 2}, TS_F32}, {3, {2, 4, 3}, TS_F32}, {4, {1, 2, 4, 3}, TS_F64}};
    for (int i = 0; i < 3; i++) {
        int64_t d[4] = {1, 2, 4, 3};
        ts_graph *g = ts_graph_new();
        ts_val q = ts_input(g, "q", TS_F32, 4, d), v = ts_input(g, "v", TS_F32, 4, d);
        ts_val k = ts_input(g, "k", bad[i].dt, bad[i].rank, bad[i].k);
        CHECK(!ts_val_ok(ts_causal_attention(g, q, k, v)), "bad operand %d accepted", i);
        CHECK(ts_graph_status(g) == TS_ERR_SHAPE &&
                  strstr(ts_graph_error(g), "causal_attention") != NULL,
              "case %d: message '%s'", i, ts_graph_error(g));
        ts_graph_free(g);
    }
}

int main(void) {
    check_grads();
    check_forward(TS_F64, 1e-12);
    check_forward(TS_F32, 2e-6);
    check_errors();
    return check_summary("attention");
}
