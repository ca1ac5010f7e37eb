/* dnnl_matmul_rows.c — a row split (dnnl_matmul_rows.h) computes every block exactly as the same
 * rows computed alone, on any thread count.
 *
 * For each shape (f32 and bf16, A plain or transposed, any B layout, accumulate, bias and add
 * post-ops, a bf16 C, M not a multiple of the blocks): the split on T threads, on one thread and
 * inside a parallel region must give the same bits, and rows [i0, i1) of its result must equal,
 * bit for bit, a one-thread product of just those rows of A (that checks the pointer offsets,
 * the gathered columns of a transposed A, the post-op offsets and the scratch slices on any
 * ISA; whether a split equals the whole one-thread product depends on oneDNN's kernels and is
 * the thread probe's business, tests/unit/dnnl_matmul.c). Also: shapes it cannot split.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_matmul.h"
#include "backends/cpu/dnnl_matmul_rows.h"
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

/* Values in [-1, 1) from a Philox stream, stored as dt. */
static void *make_operand(int64_t n, ts_dtype dt, uint64_t seed) {
    void *p = ts_aligned_alloc((size_t)n * ts_dtype_size(dt), "test operand");
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 0x5017, (uint64_t)i, w);
        float v = (float)(w[0] >> 8) * (1.0f / 8388608.0f) - 1.0f;
        if (dt == TS_F32)
            ((float *)p)[i] = v;
        else
            ((uint16_t *)p)[i] = ts_f32_to_bf16(v);
    }
    return p;
}

/* The split run under `threads` OpenMP threads (0: inside a parallel region of 2). */
static ts_status run_rows(ts_mm_rows *r, int threads, const void *a, const void *b, void *c,
                          const void *const *post, void *scratch) {
    ts_status s = TS_OK;
    if (threads == 0) {
#pragma omp parallel num_threads(2)
        {
#pragma omp single
            s = ts_mm_rows_run(r, a, b, c, post, scratch);
        }
        return s;
    }
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    s = ts_mm_rows_run(r, a, b, c, post, scratch);
    omp_set_num_threads(prev);
    return s;
}

/* Rows [i0, i1) of the product alone, on one thread, into c (the same rows of C's layout). */
static int rows_alone(const ts_mm_desc *d, int64_t i0, int64_t i1, const void *a, const void *b,
                      void *c, const void *const *post) {
    const size_t asz = ts_dtype_size(d->a_dt), csz = ts_dtype_size(d->c_dt);
    const int64_t w = i1 - i0;
    ts_mm_desc sub = *d;
    sub.M = w;
    char *ab = ts_aligned_alloc((size_t)(w * d->K) * asz, "rows alone");
    if (!ab) return 0;
    for (int64_t i = 0; i < w; i++) /* A's rows [i0, i1), as [w, K] or (trans_a) [K, w] */
        for (int64_t k = 0; k < d->K; k++) {
            const int64_t src = d->trans_a ? k * d->M + i0 + i : (i0 + i) * d->K + k;
            const int64_t dst = d->trans_a ? k * w + i : i * d->K + k;
            memcpy(ab + dst * asz, (const char *)a + src * asz, asz);
        }
    const void *pt[4] = {0};
    for (int q = 0; q < d->n_post; q++)
        pt[q] = d->post[q] == TS_MM_POST_ADD ? (const float *)post[q] + i0 * d->N : post[q];
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    ts_mm *m = NULL;
    ts_status s = ts_mm_create(&sub, &m);
    void *scratch = NULL;
    if (s == TS_OK && ts_mm_scratch_bytes(m) &&
        !(scratch = ts_aligned_alloc(ts_mm_scratch_bytes(m), "rows alone")))
        s = TS_ERR_NOMEM;
    if (s == TS_OK)
        s = ts_mm_run_post(m, ab, b, (char *)c + (size_t)(i0 * d->N) * csz, d->n_post ? pt : NULL,
                           scratch);
    if (s != TS_OK) fprintf(stderr, "rows alone: %s\n", ts_last_error());
    omp_set_num_threads(prev);
    ts_mm_free(m);
    ts_aligned_free(scratch);
    ts_aligned_free(ab);
    return s == TS_OK;
}

static void test_shape(int64_t M, int64_t K, int64_t N, int nthr, int ta, int tb, ts_dtype in,
                       ts_dtype out, int accumulate, int npost) {
    int ok = 1;
    char name[160];
    snprintf(name, sizeof name, "%s->%s %lldx%lldx%lld T=%d ta=%d tb=%d acc=%d post=%d",
             ts_dtype_name(in), ts_dtype_name(out), (long long)M, (long long)K, (long long)N, nthr,
             ta, tb, accumulate, npost);
    ts_mm_desc d = {.a_dt = in,
                    .b_dt = in,
                    .c_dt = out,
                    .batch = 1,
                    .M = M,
                    .N = N,
                    .K = K,
                    .trans_a = ta,
                    .trans_b = tb,
                    .accumulate = accumulate,
                    .n_post = npost,
                    .post = {TS_MM_POST_BIAS, TS_MM_POST_ADD},
                    .label = "rows"};
    const int64_t nc = M * N;
    const size_t cbytes = (size_t)nc * ts_dtype_size(out);
    void *a = make_operand(M * K, in, 21), *b = make_operand(K * N, in, 22);
    void *c0 = make_operand(nc, out, 23);
    void *bias = make_operand(N, TS_F32, 24), *add = make_operand(nc, TS_F32, 25);
    const void *post[2] = {bias, add};
    void *c[4] = {0};
    for (int i = 0; i < 4; i++) c[i] = ts_aligned_alloc(cbytes, "c");
    void *scratch = NULL;
    ts_mm_rows *r = NULL;
    CHECK(a && b && c0 && bias && add && c[0] && c[1] && c[2] && c[3], "%s: out of memory", name);
    if (!ok) goto done;
    CHECK(ts_mm_rows_wanted(&d, nthr), "%s: not splittable", name);
    CHECK(ts_mm_rows_create(&d, nthr, name, &r) == TS_OK, "%s: create: %s", name, ts_last_error());
    if (!ok) goto done;
    CHECK(strstr(ts_mm_rows_impl(r), "+rows") != NULL, "%s: impl %s", name, ts_mm_rows_impl(r));
    size_t sb = ts_mm_rows_scratch_bytes(r);
    /* an odd address: the split aligns its slices itself */
    if (sb && !(scratch = ts_aligned_alloc(sb + 1, "scratch"))) {
        CHECK(0, "%s: out of memory for scratch", name);
        goto done;
    }
    void *sp = scratch ? (char *)scratch + 1 : NULL;
    const int runs[3] = {nthr, 1, 0};
    for (int i = 0; i < 3; i++) {
        memcpy(c[i], c0, cbytes);
        CHECK(run_rows(r, runs[i], a, b, c[i], post, sp) == TS_OK, "%s: run (%d threads): %s", name,
              runs[i], ts_last_error());
    }
    memcpy(c[3], c0, cbytes);
    for (int t = 0; ok && t < nthr; t++)
        CHECK(rows_alone(&d, M * t / nthr, M * (t + 1) / nthr, a, b, c[3], post),
              "%s: block %d alone", name, t);
    if (!ok) goto done;
    CHECK(memcmp(c[0], c[1], cbytes) == 0, "%s: %d threads and 1 differ", name, nthr);
    CHECK(memcmp(c[0], c[2], cbytes) == 0, "%s: inside a parallel region differs", name);
    int64_t ndiff = 0;
    for (int64_t i = 0; i < nc; i++)
        ndiff += memcmp((char *)c[0] + i * ts_dtype_size(out),
                        (char *)c[3] + i * ts_dtype_size(out), ts_dtype_size(out)) != 0;
    CHECK(ndiff == 0, "%s: %lld of %lld elements differ from the blocks computed alone", name,
          (long long)ndiff, (long long)nc);
    printf("  %-58s %s\n", name, ts_mm_rows_impl(r));
done:
    ts_mm_rows_free(r);
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(c0);
    ts_aligned_free(bias);
    ts_aligned_free(add);
    for (int i = 0; i < 4; i++) ts_aligned_free(c[i]);
    ts_aligned_free(scratch);
    ok ? g_pass++ : g_fail++;
}

/* What a split does not cover is refused by ts_mm_rows_wanted, and by create with a message. */
static void test_refused(void) {
    int ok = 1;
    ts_mm_desc d = {.a_dt = TS_F32,
                    .b_dt = TS_F32,
                    .c_dt = TS_F32,
                    .batch = 3,
                    .M = 8,
                    .N = 4,
                    .K = 4,
                    .label = "refused"};
    CHECK(!ts_mm_rows_wanted(&d, 2), "batch 3 accepted");
    ts_mm_rows *r = NULL;
    CHECK(ts_mm_rows_create(&d, 2, "refused", &r) != TS_OK && !r, "batch 3 created");
    CHECK(strstr(ts_last_error(), "refused") != NULL, "message does not name the op: %s",
          ts_last_error());
    d.batch = 1;
    CHECK(ts_mm_rows_wanted(&d, 8), "8 rows in 8 blocks refused");
    CHECK(!ts_mm_rows_wanted(&d, 9), "8 rows in 9 blocks accepted");
    CHECK(!ts_mm_rows_wanted(&d, 1), "one block accepted");
    CHECK(!ts_mm_rows_wanted(&d, TS_MM_ROWS_MAX_BLOCKS + 1), "too many blocks accepted");
    ok ? g_pass++ : g_fail++;
}

int main(void) {
    /* M x K . K x N; the first is gpt's dX (thread-sensitive on AMX), the third the GRU's dW_ih. */
    test_shape(2048, 1536, 512, 2, 0, 0, TS_BF16, TS_F32, 0, 0);
    test_shape(300, 256, 96, 2, 0, 1, TS_F32, TS_F32, 0, 0);
    test_shape(768, 2048, 32, 2, 1, 0, TS_BF16, TS_F32, 1, 0);
    test_shape(97, 700, 40, 3, 1, 1, TS_BF16, TS_BF16, 0, 0);
    test_shape(130, 512, 64, 4, 0, 1, TS_BF16, TS_BF16, 1, 0);
    test_shape(61, 300, 33, 2, 1, 0, TS_F32, TS_F32, 0, 2);
    test_shape(64, 1024, 48, 8, 0, 0, TS_BF16, TS_F32, 0, 1);
    test_shape(5, 64, 16, 5, 0, 1, TS_F32, TS_F32, 1, 0);
    test_refused();
    printf("dnnl_matmul_rows: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
