/* dnnl_matmul_head.c — an LM head's GEMMs (dnnl_matmul_head.h) give the plain primitive's bits.
 *
 * On W3's head shapes (bf16, 2048 tokens, vocabulary 8192, d 512: the logits with a packed B in
 * row blocks, dX the same, dW with its add post-op applied after), on its layers' input gradients
 * (a packed B) and residual products (bias and add, the add applied after) and on a packed
 * product whose M is not a multiple of the row block: ts_mm_create's product, created and run on 1
 * and on 2 threads, must equal bit for bit the plain oneDNN primitive (ts_mm_head_enable(0)) on one
 * thread, and sampled elements must match a double-precision reference. Where the plan applies
 * (brgemm bf16 without AMX, created for one thread) the implementation must name it ("+packb",
 * "+postadd"), so the test fails on a build without the plan; created for 2 threads, and for the
 * attention projection's small B, it must stay plain. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_matmul.h"
#include "backends/cpu/dnnl_matmul_head.h"
#include "core/core.h"
#include "core/half.h"

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            ok = 0;                                                                                \
        }                                                                                          \
    } while (0)

/* Values in [-1, 1) from a Philox stream: bf16 (bf16 != 0) or f32. */
static void *make_operand(int64_t n, int bf16, uint64_t seed) {
    void *p = ts_aligned_alloc((size_t)n * (bf16 ? 2 : 4), "test operand");
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 0x4ead, (uint64_t)i, w);
        float v = (float)(w[0] >> 8) * (1.0f / 8388608.0f) - 1.0f;
        if (bf16)
            ((uint16_t *)p)[i] = ts_f32_to_bf16(v);
        else
            ((float *)p)[i] = v;
    }
    return p;
}

/* Create `d` under `threads` threads (head plan on or off) and run it on as many into c. */
static int run(const ts_mm_desc *d, int threads, int plan, const void *a, const void *b, float *c,
               const void *const *post, char *impl, size_t n) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    ts_mm_head_enable(plan);
    ts_mm *m = NULL;
    ts_status s = ts_mm_create(d, &m);
    ts_mm_head_enable(1);
    void *scratch = NULL;
    if (s == TS_OK && ts_mm_scratch_bytes(m)) {
        scratch = ts_aligned_alloc(ts_mm_scratch_bytes(m), "test scratch");
        if (!scratch) s = TS_ERR_NOMEM;
    }
    if (s == TS_OK) s = ts_mm_run_post(m, a, b, c, post, scratch);
    if (s == TS_OK) snprintf(impl, n, "%s", ts_mm_impl(m));
    if (s != TS_OK) fprintf(stderr, "  %s\n", ts_last_error());
    ts_aligned_free(scratch);
    ts_mm_free(m);
    omp_set_num_threads(prev);
    return s == TS_OK;
}

static double bf(const uint16_t *p, int64_t i) {
    return (double)ts_bf16_to_f32(p[i]);
}

/* M x N = op(A) . B, K deep; trans_a / trans_b as ts_mm_desc; add: one full-size add post-op;
 * low: a bf16 C. `expect`: the implementation suffix where the plan applies, NULL where it must
 * not. */
static void test_shape_c(const char *name, int64_t M, int64_t N, int64_t K, int trans_a,
                         int trans_b, int bias, int add, int low, const char *expect) {
    int ok = 1;
    const int np = bias + add;
    ts_mm_desc d = {.a_dt = TS_BF16,
                    .b_dt = TS_BF16,
                    .c_dt = low ? TS_BF16 : TS_F32,
                    .batch = 1,
                    .M = M,
                    .N = N,
                    .K = K,
                    .trans_a = trans_a,
                    .trans_b = trans_b,
                    .n_post = np,
                    .post = {bias ? TS_MM_POST_BIAS : TS_MM_POST_ADD, TS_MM_POST_ADD},
                    .label = name};
    uint16_t *a = make_operand(M * K, 1, 1), *b = make_operand(K * N, 1, 2);
    float *p = add ? make_operand(M * N, 0, 3) : NULL, *bv = bias ? make_operand(N, 0, 4) : NULL;
    const void *post[2] = {bias ? (const void *)bv : p, p};
    float *c[3];
    const size_t cbytes = (size_t)(M * N) * 4;
    for (int i = 0; i < 3; i++) c[i] = ts_aligned_alloc(cbytes, "test C");
    char impl[3][64];
    CHECK(a && b && (p || !add) && (bv || !bias) && c[0] && c[1] && c[2], "%s: out of memory",
          name);
    if (!ok) goto done;
    CHECK(run(&d, 1, 0, a, b, c[0], np ? post : NULL, impl[0], 64), "%s: plain", name);
    CHECK(run(&d, 1, 1, a, b, c[1], np ? post : NULL, impl[1], 64), "%s: 1 thread", name);
    CHECK(run(&d, 2, 1, a, b, c[2], np ? post : NULL, impl[2], 64), "%s: 2 threads", name);
    if (!ok) goto done;
    /* the plan applies where oneDNN serves bf16 with brgemm, not AMX (dnnl_matmul_head.h) */
    const int applies = strcmp(impl[0], "brg:avx512_core_bf16") == 0;
    if (expect && applies)
        CHECK(strstr(impl[1], expect), "%s: impl %s, want %s", name, impl[1], expect);
    if (!expect || !applies)
        CHECK(strcmp(impl[1], impl[0]) == 0, "%s: impl %s, want the plain %s", name, impl[1],
              impl[0]);
    /* created for 2 threads: the plain primitive (the plan is for one thread) */
    CHECK(strcmp(impl[2], impl[0]) == 0, "%s: 2 threads: impl %s, want the plain %s", name, impl[2],
          impl[0]);
    for (int i = 1; i < 3; i++) {
        int64_t ndiff = 0;
        const size_t es = low ? 2 : 4;
        for (int64_t e = 0; e < M * N; e++)
            ndiff += memcmp((char *)c[0] + e * es, (char *)c[i] + e * es, es) != 0;
        CHECK(ndiff == 0, "%s: %lld of %lld elements differ from the plain primitive (%d threads)",
              name, (long long)ndiff, (long long)(M * N), i);
    }
    /* sampled elements against a double-precision reference: the products are correct */
    for (int s = 0; s < 64; s++) {
        const int64_t i = (s * 7919) % M, j = (s * 104729) % N;
        double ref = (p ? p[i * N + j] : 0.0) + (bv ? bv[j] : 0.0);
        for (int64_t k = 0; k < K; k++)
            ref += bf(a, trans_a ? k * M + i : i * K + k) * bf(b, trans_b ? j * K + k : k * N + j);
        const double got = low ? bf((const uint16_t *)c[1], i * N + j) : c[1][i * N + j];
        const double tol = low ? fabs(ref) / 128 + 1e-6 * K : 1e-4 * (1.0 + fabs(ref)) + 1e-6 * K;
        CHECK(fabs(got - ref) <= tol, "%s: C[%lld,%lld] = %g, reference %g", name, (long long)i,
              (long long)j, got, ref);
    }
    printf("  %-40s plain %s, new %s\n", name, impl[0], impl[1]);
done:
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(p);
    ts_aligned_free(bv);
    for (int i = 0; i < 3; i++) ts_aligned_free(c[i]);
    ok ? g_pass++ : g_fail++;
}

static void test_shape(const char *name, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                       int bias, int add, const char *expect) {
    test_shape_c(name, M, N, K, trans_a, trans_b, bias, add, 0, expect);
}

/* The plan's rules on descriptors (no oneDNN involved). */
static void test_plan(void) {
    int ok = 1;
    ts_mm_desc d = {.a_dt = TS_BF16,
                    .b_dt = TS_BF16,
                    .c_dt = TS_F32,
                    .batch = 1,
                    .M = 2048,
                    .N = 8192,
                    .K = 512,
                    .trans_b = 1};
    ts_mm_head_plan p = ts_mm_head_plan_for(&d, 1);
    CHECK(p.pack_b && p.row_blocks == 4 && !p.post_after, "logits: %d %lld %d", p.pack_b,
          (long long)p.row_blocks, p.post_after);
    CHECK(!ts_mm_head_plan_for(&d, 2).pack_b, "logits packed on 2 threads");
    d.M = 2000;
    p = ts_mm_head_plan_for(&d, 1);
    CHECK(p.pack_b && p.row_blocks == 1, "2000 rows: %d %lld", p.pack_b, (long long)p.row_blocks);
    d.M = 512;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "512 rows packed");
    d.M = 2048, d.N = 2048; /* a layer's forward product: a transposed B of 1 Mi elements */
    p = ts_mm_head_plan_for(&d, 1);
    CHECK(p.pack_b && p.row_blocks == 4, "a layer's fc: %d %lld", p.pack_b,
          (long long)p.row_blocks);
    d.N = 512;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "a 256 Ki transposed B packed");
    d.trans_b = 0, d.N = 512, d.K = 2048; /* a layer's dX: a plain B of 1 Mi elements */
    p = ts_mm_head_plan_for(&d, 1);
    CHECK(p.pack_b && p.row_blocks == 4, "a layer's dX: %d %lld", p.pack_b,
          (long long)p.row_blocks);
    d.K = 512;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "a 256 Ki B packed");
    d.trans_b = 1, d.N = 2048;
    d.N = 8192, d.a_dt = d.b_dt = TS_F32;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "f32 packed");
    d.a_dt = d.b_dt = TS_BF16, d.n_post = 1, d.post[0] = TS_MM_POST_BIAS;
    CHECK(ts_mm_head_plan_for(&d, 1).pack_b, "with its bias: not packed");
    d.c_dt = TS_BF16; /* a bf16 C with its bias (the qkv projection: passes/qkv_low.c) */
    CHECK(ts_mm_head_plan_for(&d, 1).pack_b, "a bf16 C with its bias: not packed");
    d.n_post = 0;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "a bf16 C without a bias packed");
    d.c_dt = TS_F32, d.n_post = 2, d.post[1] = TS_MM_POST_BIAS;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b, "with two biases packed");
    d.n_post = 1, d.M = 256;
    CHECK(!ts_mm_head_plan_for(&d, 1).pack_b && !ts_mm_head_plan_for(&d, 1).post_after,
          "256 rows with a bias planned");
    ts_mm_desc w = {.a_dt = TS_BF16,
                    .b_dt = TS_BF16,
                    .c_dt = TS_F32,
                    .batch = 1,
                    .M = 8192,
                    .N = 512,
                    .K = 2048,
                    .trans_a = 1,
                    .n_post = 1,
                    .post = {TS_MM_POST_ADD}};
    p = ts_mm_head_plan_for(&w, 1);
    CHECK(p.post_after && !p.pack_b && p.row_blocks == 1, "dW: %d %d %lld", p.post_after, p.pack_b,
          (long long)p.row_blocks);
    CHECK(!ts_mm_head_plan_for(&w, 2).post_after, "dW planned on 2 threads");
    w.post[0] = TS_MM_POST_BIAS;
    CHECK(!ts_mm_head_plan_for(&w, 1).post_after, "a bias alone applied after");
    w.n_post = 2, w.post[1] = TS_MM_POST_ADD;
    CHECK(ts_mm_head_plan_for(&w, 1).post_after, "a bias then an add: not after");
    w.post[0] = TS_MM_POST_ADD, w.post[1] = TS_MM_POST_BIAS;
    CHECK(!ts_mm_head_plan_for(&w, 1).post_after, "an add then a bias applied after");
    w.n_post = 1;
    w.post[0] = TS_MM_POST_ADD, w.accumulate = 1;
    CHECK(!ts_mm_head_plan_for(&w, 1).post_after, "accumulate applied after");
    w.accumulate = 0, w.M = 2048;
    CHECK(ts_mm_head_plan_for(&w, 1).post_after, "a 1 Mi-element C with an add not after");
    w.M = 1024;
    CHECK(!ts_mm_head_plan_for(&w, 1).post_after, "a 512 Ki-element C applied after");
    ts_mm_head_enable(0);
    w.M = 8192;
    CHECK(!ts_mm_head_plan_for(&w, 1).post_after, "disabled, still planned");
    ts_mm_head_enable(1);
    ok ? g_pass++ : g_fail++;
}

int main(void) {
    test_plan();
    test_shape("logits = x W^T (W3)", 2048, 8192, 512, 0, 1, 0, 0, "+packb+rows512");
    test_shape("dX = dlogits W (W3)", 2048, 512, 8192, 0, 0, 0, 0, "+packb+rows512");
    test_shape("dW = dlogits^T x + dE (W3)", 8192, 512, 2048, 1, 0, 0, 1, "+postadd");
    test_shape("1100 rows, packed whole", 1100, 4096, 1024, 0, 0, 0, 0, "+packb");
    test_shape("a layer's fc + bias (W3)", 2048, 2048, 512, 0, 1, 1, 0, "+packb+rows512");
    test_shape_c("a layer's qkv + bias -> bf16 (W3)", 2048, 1536, 512, 0, 1, 1, 0, 1,
                 "+packb+rows512");
    test_shape("a layer's projection + bias (plain)", 2048, 512, 512, 0, 1, 1, 0, NULL);
    test_shape("a layer's dX = dY W_fc (W3)", 2048, 512, 2048, 0, 0, 0, 0, "+packb+rows512");
    test_shape("a layer's dX = dY W_qkv (W3)", 2048, 512, 1536, 0, 0, 0, 0, "+packb+rows512");
    test_shape("fc2 + bias + residual (W3)", 2048, 512, 2048, 0, 1, 1, 1, "+packb+rows512+postadd");
    test_shape("proj + bias + residual (W3)", 2048, 512, 512, 0, 1, 1, 1, "+postadd");
    test_shape("proj + residual, no bias", 2048, 512, 512, 0, 1, 0, 1, "+postadd");
    printf("dnnl_matmul_head: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
