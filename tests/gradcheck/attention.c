/* Attention: the fused op (ts_causal_attention, ts_attention) checked by
 * finite differences, the forward against PyTorch, the fused op against the
 * composite of matmul/where/softmax/matmul it replaces (forward and
 * gradients in f32, random inputs, block edge cases), bitwise determinism
 * between 1 and 2 threads, and shape errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"

static ts_val build(ts_graph *g, const ts_val *in, void *user) {
    (void)user;
    return ts_causal_attention(g, in[0], in[1], in[2]);
}

typedef struct attn_opts {
    int causal;
    double scale;
} attn_opts;

static ts_val build_attn(ts_graph *g, const ts_val *in, void *user) {
    const attn_opts *o = user;
    return ts_attention(g, in[0], in[1], in[2], o->causal, o->scale);
}

/* GPT-2's attention on a qkv [B, T, 3 * H * hd]: three slices, head permutes, the output
 * permuted back, which passes/attention_qkv.c folds into the packed form (one qkv input,
 * output [B, T, H, hd], gradient dqkv). user: H. */
static ts_val build_qkv(ts_graph *g, const ts_val *in, void *user) {
    int64_t H = *(const int64_t *)user, B = ts_dim(g, in[0], 0), T = ts_dim(g, in[0], 1);
    int64_t D = ts_dim(g, in[0], 2) / 3, sizes[3] = {D, D, D}, hdims[4] = {B, T, H, D / H};
    int perm[4] = {0, 2, 1, 3};
    ts_val parts[3], qkv[3];
    ts_split(g, in[0], 2, 3, sizes, parts);
    for (int i = 0; i < 3; i++) qkv[i] = ts_permute(g, ts_reshape(g, parts[i], 4, hdims), perm);
    ts_val y = ts_permute(g, ts_causal_attention(g, qkv[0], qkv[1], qkv[2]), perm);
    int64_t ydims[3] = {B, T, D};
    return ts_reshape(g, y, 3, ydims);
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
    /* Several blocks of 64 queries and keys with a partial last block, and
     * an odd head size: the online softmax rescaling across key blocks, dq
     * summed over key blocks, dk and dv over query blocks. */
    gc_input multi[3] = {GC_F(1, 1, 130, 3), GC_F(1, 1, 130, 3), GC_F(1, 1, 130, 3)};
    gc_options few = {.max_elems = 40}; /* per input, spread over the blocks */
    gc_check_opt("causal_attention T=130 (3 blocks) hd=3", 3, multi, build, NULL, &few);
    gc_input odd[3] = {GC_F(2, 1, 70, 5), GC_F(2, 1, 70, 5), GC_F(2, 1, 70, 5)};
    for (int i = 0; i < 2; i++) odd[i].lo = -2, odd[i].hi = 2;
    gc_check("causal_attention T=70 hd=5", 3, odd, build, NULL);
    /* hd = 35: the f64 kernels' register tiles (32 wide) and vector tail. */
    gc_input wide[3] = {GC_F(1, 1, 70, 35), GC_F(1, 1, 70, 35), GC_F(1, 1, 70, 35)};
    gc_check_opt("causal_attention T=70 hd=35", 3, wide, build, NULL, &few);
    /* Without the mask and with another scale (ts_attention). */
    attn_opts full = {0, 0.7};
    gc_check("attention non-causal scale 0.7", 3, in, build_attn, &full);
    gc_check("attention non-causal T=70 hd=5", 3, odd, build_attn, &full);
    attn_opts causal = {1, 1.3};
    gc_check_opt("attention causal scale 1.3 T=130", 3, multi, build_attn, &causal, &few);
    /* The packed form (passes/attention_qkv.c): H = 3 heads of 5 over a partial second
     * block, rows 45 apart in qkv and 15 in the output. */
    int64_t H = 3;
    gc_input packed[1] = {GC_F(2, 70, 45)};
    packed[0].lo = -2, packed[0].hi = 2;
    gc_check_opt("attention packed qkv B=2 T=70 H=3 hd=5", 1, packed, build_qkv, &H, &few);
    gc_input small[1] = {GC_F(1, 5, 12)};
    H = 2;
    gc_check("attention packed qkv B=1 T=5 H=2 hd=2", 1, small, build_qkv, &H);
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

/* ---- fused vs composite ------------------------------------------------ */

/* The composite the fused op replaced: softmax(where(mask, q k^T * scale,
 * -inf)) v with a constant lower-triangular mask when causal. */
static ts_val composite(ts_graph *g, ts_val q, ts_val k, ts_val v, int causal, double scale) {
    ts_dtype dt = ts_dtype_of(g, q);
    int64_t T = ts_dim(g, q, 2);
    ts_val s = ts_matmul(g, q, k, 0, 1);
    s = ts_affine_scalar(g, s, scale, 0.0);
    if (causal) {
        unsigned char *m = malloc((size_t)(T * T));
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) m[i * T + j] = j <= i;
        int64_t md[2] = {T, T};
        ts_val mask = ts_constant(g, NULL, TS_U8, 2, md, m);
        free(m);
        s = ts_where(g, mask, s, ts_scalar(g, -INFINITY, dt));
    }
    return ts_matmul(g, ts_softmax(g, s, -1), v, 0, 0);
}

/* Outputs of one run: o, then dq, dk, dv for loss = sum(o * r). */
typedef struct attn_run {
    float *t[4];
} attn_run;

static float *rand_f32(size_t n, unsigned *seed, double lo, double hi) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rand_r(seed) / RAND_MAX);
    return x;
}

/* Builds loss = sum(attention(q, k, v) * r) with q, k, v parameters holding
 * data[0..2] and r = data[3]; fills out (allocated) with o and the
 * gradients. Returns 0 on success. */
static int run_attn(int fused, const int64_t *d, int causal, double scale, int threads,
                    float *const *data, attn_run *out) {
    ts_graph *g = ts_graph_new();
    const char *names[3] = {"q", "k", "v"};
    ts_val in[3];
    for (int j = 0; j < 3; j++)
        in[j] = ts_param(g, names[j], TS_F32, 4, d, ts_init_buffer(data[j]));
    ts_val r = ts_constant(g, "r", TS_F32, 4, d, data[3]);
    ts_val o = fused ? ts_attention(g, in[0], in[1], in[2], causal, scale)
                     : composite(g, in[0], in[1], in[2], causal, scale);
    CHECK_OK(ts_mark_output(g, o, "o"));
    ts_val loss = ts_sum(g, ts_mul(g, o, r), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    ts_plan *plan = NULL;
    ts_status st = ts_graph_status(g);
    if (st == TS_OK) st = ts_compile(g, &spec, &opt, &plan);
    CHECK(st == TS_OK, "compile: %s", ts_last_error());
    ts_graph_free(g);
    if (st != TS_OK) return 1;
    size_t bytes = (size_t)(d[0] * d[1] * d[2] * d[3]) * sizeof(float);
    const char *reads[4] = {"o", "grad:q", "grad:k", "grad:v"};
    st = ts_plan_step(plan);
    for (int j = 0; j < 4; j++) {
        out->t[j] = malloc(bytes);
        if (st == TS_OK) st = ts_plan_read(plan, reads[j], out->t[j], bytes);
    }
    CHECK(st == TS_OK, "step/read: %s", ts_last_error());
    ts_plan_free(plan);
    return st != TS_OK;
}

static void free_run(attn_run *r) {
    for (int j = 0; j < 4; j++) free(r->t[j]);
}

/* max |a - b| / max |b| for o, dq, dk, dv of the fused op against the
 * composite, within tol; and the fused results bit-identical with 1 and 2
 * threads. */
static void compare(const int64_t *d, int causal, double scale, double tol, unsigned seed) {
    size_t n = (size_t)(d[0] * d[1] * d[2] * d[3]);
    float *data[4];
    for (int j = 0; j < 4; j++)
        data[j] = rand_f32(n, &seed, j < 2 ? -2.0 : -1.0, j < 2 ? 2.0 : 1.0);
    attn_run f2 = {{0}}, f1 = {{0}}, c = {{0}};
    if (!run_attn(1, d, causal, scale, 2, data, &f2) &&
        !run_attn(1, d, causal, scale, 1, data, &f1) &&
        !run_attn(0, d, causal, scale, 2, data, &c)) {
        const char *what[4] = {"o", "dq", "dk", "dv"};
        for (int j = 0; j < 4; j++) {
            double err = 0, mag = 0;
            for (size_t i = 0; i < n; i++) {
                double e = fabs((double)f2.t[j][i] - (double)c.t[j][i]);
                err = e > err ? e : err;
                mag = fabs((double)c.t[j][i]) > mag ? fabs((double)c.t[j][i]) : mag;
            }
            /* dq and dk are exactly 0 at T = 1 (softmax over one key): the fused
             * op leaves a rounding residue (~1e-8) there, so the scale has a floor. */
            CHECK(err <= tol * fmax(mag, 1e-2),
                  "[%lld,%lld,%lld,%lld] causal=%d %s: fused vs composite %.3g "
                  "relative (tol %g)",
                  (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], causal,
                  what[j], err / fmax(mag, 1e-2), tol);
            CHECK(memcmp(f1.t[j], f2.t[j], n * sizeof(float)) == 0,
                  "[%lld,%lld,%lld,%lld] causal=%d %s: 1 and 2 threads differ", (long long)d[0],
                  (long long)d[1], (long long)d[2], (long long)d[3], causal, what[j]);
        }
    }
    free_run(&f2), free_run(&f1), free_run(&c);
    for (int j = 0; j < 4; j++) free(data[j]);
}

static void check_vs_composite(void) {
    static const int64_t shapes[][4] = {
        {2, 3, 64, 16},  /* one full block */
        {1, 2, 100, 7},  /* T not a multiple of the block, odd hd */
        {3, 1, 1, 5},    /* T = 1 */
        {2, 2, 130, 33}, /* three blocks, the last of 2 rows, odd hd over a vector */
        {1, 2, 256, 64}, /* a W3 head */
        {1, 1, 200, 80}, /* hd above one 64-wide register tile */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double scale = 1.0 / sqrt((double)shapes[i][3]);
        compare(shapes[i], 1, scale, 1e-5, 11 + (unsigned)i);
        compare(shapes[i], 0, scale, 1e-5, 31 + (unsigned)i);
    }
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
    /* The fused op's own checks, through ts_attention: messages name the op,
     * the operand shapes and the reason. */
    struct {
        int qrank, causal;
        double scale;
        int64_t v[4];
        ts_status want;
        const char *says;
    } cases[4] = {
        {4, 2, 0.5, {1, 2, 4, 3}, TS_ERR_INVALID, "causal must be 0 or 1"},
        {4, 1, NAN, {1, 2, 4, 3}, TS_ERR_INVALID, "scale must be finite"},
        {3, 1, 0.5, {1, 2, 4, 3}, TS_ERR_SHAPE, "[B, H, T, hd]"},
        {4, 0, 0.5, {1, 2, 5, 3}, TS_ERR_SHAPE, "v must have q's dtype and shape"},
    };
    for (int i = 0; i < 4; i++) {
        int64_t d[4] = {1, 2, 4, 3};
        ts_graph *g = ts_graph_new();
        ts_val q = ts_input(g, "q", TS_F32, cases[i].qrank, d + 4 - cases[i].qrank);
        ts_val k = ts_input(g, "k", TS_F32, 4, d), v = ts_input(g, "v", TS_F32, 4, cases[i].v);
        CHECK(!ts_val_ok(ts_attention(g, q, k, v, cases[i].causal, cases[i].scale)),
              "attention case %d accepted", i);
        const char *msg = ts_graph_error(g);
        CHECK(ts_graph_status(g) == cases[i].want && strstr(msg, "attention(") == msg &&
                  strstr(msg, cases[i].says) != NULL,
              "attention case %d: message '%s'", i, msg);
        ts_graph_free(g);
    }
}

int main(void) {
    check_grads();
    check_forward(TS_F64, 1e-12);
    check_forward(TS_F32, 2e-6);
    check_vs_composite();
    check_errors();
    return check_summary("attention");
}
