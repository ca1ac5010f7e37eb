/* test_dnnl_matmul.c — the oneDNN matmul wrapper against the reference kernels.
 *
 * Checks, on random shapes (odd sizes 1, 3, 17, K across oneDNN's 512/1024
 * K-blocking), every trans_a/trans_b combination, batch, A/B broadcast and
 * accumulate, for f32 and bf16 inputs (f32 and bf16 outputs):
 *   - the result is within a rigorous f32 rounding bound of the f64 reference;
 *   - it is bit-identical between primitives created with 1 and with 2 OpenMP
 *     threads, when the 2-thread primitive runs under omp_set_num_threads(1),
 *     when it runs inside an OpenMP parallel region, and run to run;
 * then thread-count determinism on the full-size workload shapes (MLP, GPT,
 * attention, forward and backward), and the error paths.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "backends/cpu/dnnl_matmul.h"
#include "core/core.h"

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

static void record(int ok) {
    ok ? g_pass++ : g_fail++;
}

/* ---- data helpers ------------------------------------------------------- */

static uint16_t f32_to_bf16(float f) { /* round to nearest even; inputs are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One random word from a Philox stream: (seed, counter). */
static uint32_t rnd(uint64_t seed, uint64_t ctr) {
    uint32_t w[4];
    ts_philox(seed, 0x7e57, ctr, w);
    return w[0];
}

static int64_t pick_dim(uint64_t seed, uint64_t ctr, int64_t hi) {
    static const int64_t odd[] = {1, 3, 17};
    uint32_t r = rnd(seed, ctr);
    if (r % 3 == 0) return odd[(r / 3) % 3];
    return 1 + (int64_t)((r / 3) % (uint32_t)hi);
}

/* A test operand: values (rounded to bf16 when dt is bf16) as f32 and f64,
 * and the buffer handed to ts_mm_run in dtype dt. */
typedef struct operand {
    int64_t n;
    float *f;
    double *d, *abs;
    void *raw;
} operand;

static void operand_free(operand *o) {
    free(o->f);
    free(o->d);
    free(o->abs);
    ts_aligned_free(o->raw);
    memset(o, 0, sizeof *o);
}

static int operand_make(operand *o, int64_t n, ts_dtype dt, uint64_t key) {
    memset(o, 0, sizeof *o);
    o->n = n;
    o->f = malloc((size_t)n * sizeof(float));
    o->d = malloc((size_t)n * sizeof(double));
    o->abs = malloc((size_t)n * sizeof(double));
    o->raw = ts_aligned_alloc((size_t)n * ts_dtype_size(dt), "test operand");
    if (!o->f || !o->d || !o->abs || !o->raw) {
        operand_free(o);
        return 0;
    }
    ts_rand_uniform_f64(o->d, n, key, -1.0, 1.0);
    for (int64_t i = 0; i < n; i++) {
        float f = (float)o->d[i];
        if (dt == TS_BF16) {
            uint16_t h = f32_to_bf16(f);
            ((uint16_t *)o->raw)[i] = h;
            f = bf16_to_f32(h);
        } else {
            ((float *)o->raw)[i] = f;
        }
        o->f[i] = f;
        o->d[i] = f;
        o->abs[i] = fabs(f);
    }
    return 1;
}

static float c_get(const void *c, ts_dtype dt, int64_t i) {
    return dt == TS_BF16 ? bf16_to_f32(((const uint16_t *)c)[i]) : ((const float *)c)[i];
}

/* ---- one random case ----------------------------------------------------- */

typedef struct mm_case {
    ts_mm_desc d;
    char label[64];
} mm_case;

static mm_case random_case(uint64_t seed, int idx) {
    mm_case c;
    memset(&c, 0, sizeof c);
    uint64_t k = (uint64_t)idx * 16;
    uint32_t r = rnd(seed, k);
    int dtc = (int)(r % 4); /* 0,1: f32; 2: bf16->f32; 3: bf16->bf16 */
    c.d.a_dt = c.d.b_dt = dtc >= 2 ? TS_BF16 : TS_F32;
    c.d.c_dt = dtc == 3 ? TS_BF16 : TS_F32;
    static const int64_t batches[] = {1, 1, 2, 3, 5};
    c.d.batch = batches[rnd(seed, k + 1) % 5];
    c.d.M = pick_dim(seed, k + 2, 96);
    c.d.N = pick_dim(seed, k + 3, 96);
    /* K sometimes crosses oneDNN's 512 and 1024 K-block boundaries */
    c.d.K = (rnd(seed, k + 4) % 5 == 0) ? 500 + (int64_t)(rnd(seed, k + 5) % 1200)
                                        : pick_dim(seed, k + 5, 160);
    r = rnd(seed, k + 6);
    c.d.trans_a = (int)(r & 1);
    c.d.trans_b = (int)((r >> 1) & 1);
    c.d.accumulate = (int)((r >> 2) & 1);
    if (c.d.batch > 1) {
        c.d.a_broadcast = ((r >> 3) & 3) == 0;
        c.d.b_broadcast = !c.d.a_broadcast && ((r >> 5) & 3) == 0;
    }
    snprintf(c.label, sizeof c.label, "case%d", idx);
    c.d.label = c.label;
    return c;
}

static void case_str(char *buf, size_t n, const ts_mm_desc *d) {
    snprintf(buf, n, "%s %s,%s->%s b=%lld M=%lld N=%lld K=%lld ta=%d tb=%d ab=%d bb=%d acc=%d",
             d->label, ts_dtype_name(d->a_dt), ts_dtype_name(d->b_dt), ts_dtype_name(d->c_dt),
             (long long)d->batch, (long long)d->M, (long long)d->N, (long long)d->K, d->trans_a,
             d->trans_b, d->a_broadcast, d->b_broadcast, d->accumulate);
}

/* Create under `nthr` OpenMP threads. */
static ts_mm *create_with(const ts_mm_desc *d, int nthr) {
    omp_set_num_threads(nthr);
    ts_mm *m = NULL;
    if (ts_mm_create(d, &m) != TS_OK) {
        fprintf(stderr, "create failed: %s\n", ts_last_error());
        return NULL;
    }
    return m;
}

/* Reset C to c0, run, leave the result in c. */
static int run_into(ts_mm *m, const operand *a, const operand *b, const void *c0, void *c,
                    size_t cbytes, void *scratch) {
    memcpy(c, c0, cbytes);
    if (ts_mm_run(m, a->raw, b->raw, c, scratch) != TS_OK) {
        fprintf(stderr, "run failed: %s\n", ts_last_error());
        return 0;
    }
    return 1;
}

typedef struct impl_count {
    char name[64];
    int n;
} impl_count;
static impl_count g_impls[16];

static void note_impl(const char *name) {
    for (int i = 0; i < 16; i++) {
        if (g_impls[i].n && strcmp(g_impls[i].name, name) == 0) {
            g_impls[i].n++;
            return;
        }
        if (!g_impls[i].n) {
            snprintf(g_impls[i].name, sizeof g_impls[i].name, "%s", name);
            g_impls[i].n = 1;
            return;
        }
    }
}

/* Cases whose operands oneDNN cannot multiply on this CPU (bf16 without AVX-512) are skipped,
 * counted and explained once. */
static int g_skipped;
static int skip_dtype(ts_dtype dt) {
    if (dt == TS_F32 || ts_cpu_supports_dtype_gemm(dt)) return 0;
    if (!g_skipped++)
        printf("%s cases skipped: %s\n", ts_dtype_name(dt), ts_cpu_dtype_gemm_why(dt));
    return 1;
}

static void test_case(const ts_mm_desc *d, uint64_t key) {
    if (skip_dtype(d->a_dt)) return;
    int ok = 1;
    char desc[256];
    case_str(desc, sizeof desc, d);
    const int64_t na = (d->a_broadcast ? 1 : d->batch) * d->M * d->K;
    const int64_t nb = (d->b_broadcast ? 1 : d->batch) * d->K * d->N;
    const int64_t nc = d->batch * d->M * d->N;
    const size_t cbytes = (size_t)nc * ts_dtype_size(d->c_dt);
    operand a, b, c0;
    int have_a = operand_make(&a, na, d->a_dt, key * 4 + 1);
    int have_b = operand_make(&b, nb, d->b_dt, key * 4 + 2);
    int have_c = operand_make(&c0, nc, d->c_dt, key * 4 + 3);
    double *ref = malloc((size_t)nc * sizeof(double));
    double *mag = malloc((size_t)nc * sizeof(double));
    float *ref32 = malloc((size_t)nc * sizeof(float));
    void *out[5] = {0};
    for (int i = 0; i < 5; i++) out[i] = ts_aligned_alloc(cbytes, "test result");
    ts_mm *m1 = NULL, *m2 = NULL;
    void *scratch = NULL;
    if (!have_a || !have_b || !have_c || !ref || !mag || !ref32 || !out[0] || !out[1] || !out[2] ||
        !out[3] || !out[4]) {
        CHECK(0, "%s: out of memory in the test", desc);
        goto done;
    }

    /* References: values, and sum |a||b| (+ |c0|) for the error bound. */
    ts_mm_desc dref = *d;
    memcpy(ref, c0.d, (size_t)nc * sizeof(double));
    memcpy(mag, c0.abs, (size_t)nc * sizeof(double));
    for (int64_t i = 0; i < nc; i++) ref32[i] = c0.f[i];
    CHECK(ts_mm_ref_f64(&dref, a.d, b.d, ref) == TS_OK, "%s: ref f64: %s", desc, ts_last_error());
    CHECK(ts_mm_ref_f64(&dref, a.abs, b.abs, mag) == TS_OK, "%s: ref: %s", desc, ts_last_error());
    CHECK(ts_mm_ref_f32(&dref, a.f, b.f, ref32) == TS_OK, "%s: ref f32: %s", desc, ts_last_error());
    if (!ok) goto done;

    m1 = create_with(d, 1);
    m2 = create_with(d, 2);
    CHECK(m1 && m2, "%s: create failed", desc);
    if (!ok) goto done;
    CHECK(ts_mm_threads(m1) == 1 && ts_mm_threads(m2) == 2, "%s: thread counts %d %d", desc,
          ts_mm_threads(m1), ts_mm_threads(m2));
    note_impl(ts_mm_impl(m2));
    size_t sb = ts_mm_scratch_bytes(m1) > ts_mm_scratch_bytes(m2) ? ts_mm_scratch_bytes(m1)
                                                                  : ts_mm_scratch_bytes(m2);
    if (sb) {
        scratch = ts_aligned_alloc(sb, "test scratch");
        CHECK(scratch, "%s: out of memory for scratch", desc);
        if (!ok) goto done;
    }

    omp_set_num_threads(1);
    CHECK(run_into(m1, &a, &b, c0.raw, out[0], cbytes, scratch), "%s: run m1", desc);
    omp_set_num_threads(2);
    CHECK(run_into(m2, &a, &b, c0.raw, out[1], cbytes, scratch), "%s: run m2", desc);
    CHECK(run_into(m2, &a, &b, c0.raw, out[4], cbytes, scratch), "%s: rerun m2", desc);
    omp_set_num_threads(1); /* a 2-thread primitive run under a 1-thread setting */
    CHECK(run_into(m2, &a, &b, c0.raw, out[2], cbytes, scratch), "%s: run m2@1", desc);
    omp_set_num_threads(2);
    int in_par_ok = 1;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        in_par_ok = run_into(m2, &a, &b, c0.raw, out[3], cbytes, scratch);
    }
    CHECK(in_par_ok, "%s: run m2 inside a parallel region", desc);
    if (!ok) goto done;

    /* Accuracy: |c - ref| <= gamma_(K+2) * (sum|a||b| + |c0|), gamma_n = n u / (1 - n u),
     * plus half an ulp of bf16 for a bf16 output. */
    const double u = ldexp(1.0, -24);
    const double gam = (double)(d->K + 2) * u / (1.0 - (double)(d->K + 2) * u);
    double worst = 0.0, worst32 = 0.0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < nc; i++) {
        double bound = gam * mag[i] + 1e-30;
        if (d->c_dt == TS_BF16) bound += ldexp(fabs(ref[i]), -8) + gam * mag[i] / 256.0;
        double e = fabs((double)c_get(out[1], d->c_dt, i) - ref[i]) / bound;
        if (e > worst) {
            worst = e;
            worst_i = i;
        }
        if (ref32[i] != (float)ref[i]) worst32 += 1.0;
    }
    CHECK(worst <= 1.0, "%s: error %.3g x bound at %lld (got %.9g, want %.9g)", desc, worst,
          (long long)worst_i, (double)c_get(out[1], d->c_dt, worst_i), ref[worst_i]);
    /* ts_mm_ref_f32 is the f64 reference (same double sums, same order) rounded once */
    CHECK(worst32 == 0.0, "%s: ts_mm_ref_f32 differs from (float)ts_mm_ref_f64 in %.0f elements",
          desc, worst32);

    /* Determinism across thread counts, run settings and runs. */
    CHECK(memcmp(out[0], out[1], cbytes) == 0,
          "%s: 1-thread and 2-thread primitives differ (%s / %s)", desc, ts_mm_impl(m1),
          ts_mm_impl(m2));
    CHECK(memcmp(out[1], out[2], cbytes) == 0, "%s: differs when run under 1 OpenMP thread", desc);
    CHECK(memcmp(out[1], out[3], cbytes) == 0, "%s: differs inside a parallel region", desc);
    CHECK(memcmp(out[1], out[4], cbytes) == 0, "%s: differs run to run", desc);

done:
    ts_mm_free(m1);
    ts_mm_free(m2);
    ts_aligned_free(scratch);
    for (int i = 0; i < 5; i++) ts_aligned_free(out[i]);
    free(ref);
    free(mag);
    free(ref32);
    if (have_a) operand_free(&a);
    if (have_b) operand_free(&b);
    if (have_c) operand_free(&c0);
    record(ok);
}

/* ---- full-size workload shapes: 1-thread vs 2-thread bit identity ----------- */

static void test_workload_determinism(const char *name, ts_dtype in, int64_t batch, int64_t M,
                                      int64_t N, int64_t K, int ta, int tb, int accumulate,
                                      int nthr) {
    if (skip_dtype(in)) return;
    int ok = 1;
    ts_mm_desc d = {.a_dt = in,
                    .b_dt = in,
                    .c_dt = TS_F32,
                    .batch = batch,
                    .M = M,
                    .N = N,
                    .K = K,
                    .trans_a = ta,
                    .trans_b = tb,
                    .accumulate = accumulate,
                    .label = name};
    const int64_t na = batch * M * K, nb = batch * K * N, nc = batch * M * N;
    operand a, b;
    int have_a = operand_make(&a, na, in, 101);
    int have_b = operand_make(&b, nb, in, 102);
    float *c0 = ts_aligned_alloc((size_t)nc * 4, "c0");
    float *c1 = ts_aligned_alloc((size_t)nc * 4, "c1");
    float *c2 = ts_aligned_alloc((size_t)nc * 4, "c2");
    ts_mm *m1 = NULL, *m2 = NULL;
    void *scratch = NULL;
    if (!have_a || !have_b || !c0 || !c1 || !c2) {
        CHECK(0, "%s: out of memory in the test", name);
        goto done;
    }
    for (int64_t i = 0; i < nc; i++) c0[i] = (float)((i % 7) - 3) * 0.25f;
    m1 = create_with(&d, 1);
    m2 = create_with(&d, nthr);
    CHECK(m1 && m2, "%s: create failed", name);
    if (!ok) goto done;
    note_impl(ts_mm_impl(m2));
    if (strchr(ts_mm_impl(m2), '+')) /* which products the determinism machinery serves */
        printf("%s (%s, %d threads): %s\n", name, ts_dtype_name(in), nthr, ts_mm_impl(m2));
    size_t sb = ts_mm_scratch_bytes(m1) > ts_mm_scratch_bytes(m2) ? ts_mm_scratch_bytes(m1)
                                                                  : ts_mm_scratch_bytes(m2);
    if (sb && !(scratch = ts_aligned_alloc(sb, "scratch"))) {
        CHECK(0, "%s: out of memory for scratch", name);
        goto done;
    }
    omp_set_num_threads(1);
    CHECK(run_into(m1, &a, &b, c0, c1, (size_t)nc * 4, scratch), "%s: run 1", name);
    omp_set_num_threads(nthr);
    CHECK(run_into(m2, &a, &b, c0, c2, (size_t)nc * 4, scratch), "%s: run %d", name, nthr);
    omp_set_num_threads(2);
    if (!ok) goto done;
    int64_t ndiff = 0;
    for (int64_t i = 0; i < nc; i++) ndiff += memcmp(&c1[i], &c2[i], 4) != 0;
    CHECK(ndiff == 0, "%s (%s, %s): %lld of %lld elements differ between 1 and %d threads", name,
          ts_dtype_name(in), ts_mm_impl(m2), (long long)ndiff, (long long)nc, nthr);
done:
    ts_mm_free(m1);
    ts_mm_free(m2);
    ts_aligned_free(scratch);
    ts_aligned_free(c0);
    ts_aligned_free(c1);
    ts_aligned_free(c2);
    if (have_a) operand_free(&a);
    if (have_b) operand_free(&b);
    record(ok);
}

/* ---- buffers at odd addresses give the same bits as aligned ones ----------- */

static void test_unaligned(ts_dtype in, int trans_b, int accumulate) {
    if (skip_dtype(in)) return;
    int ok = 1;
    ts_mm_desc d = {.a_dt = in,
                    .b_dt = in,
                    .c_dt = TS_F32,
                    .batch = 2,
                    .M = 37,
                    .N = 45,
                    .K = 700,
                    .trans_b = trans_b,
                    .accumulate = accumulate,
                    .label = "unaligned"};
    const size_t es = ts_dtype_size(in);
    const size_t na = 2 * 37 * 700, nb = 2 * 700 * 45, nc = 2 * 37 * 45;
    operand a, b;
    int have_a = operand_make(&a, (int64_t)na, in, 201);
    int have_b = operand_make(&b, (int64_t)nb, in, 202);
    char *a2 = ts_aligned_alloc(na * es + es, "a2"), *b2 = ts_aligned_alloc(nb * es + es, "b2");
    char *c2 = ts_aligned_alloc(nc * 4 + 4, "c2");
    float *c1 = ts_aligned_alloc(nc * 4, "c1");
    ts_mm *m = NULL;
    void *scratch = NULL;
    if (!have_a || !have_b || !a2 || !b2 || !c2 || !c1 || !(m = create_with(&d, 2))) {
        CHECK(0, "unaligned: setup failed");
        goto done;
    }
    if (ts_mm_scratch_bytes(m) && !(scratch = malloc(ts_mm_scratch_bytes(m) + 1))) {
        CHECK(0, "unaligned: out of memory");
        goto done;
    }
    memcpy(a2 + es, a.raw, na * es);
    memcpy(b2 + es, b.raw, nb * es);
    for (size_t i = 0; i < nc; i++) c1[i] = (float)i * 0.5f;
    memcpy(c2 + 4, c1, nc * 4);
    /* scratch at an odd address too */
    CHECK(ts_mm_run(m, a.raw, b.raw, c1, scratch) == TS_OK, "unaligned: %s", ts_last_error());
    CHECK(ts_mm_run(m, a2 + es, b2 + es, c2 + 4, scratch ? (char *)scratch + 1 : NULL) == TS_OK,
          "unaligned: %s", ts_last_error());
    CHECK(memcmp(c1, c2 + 4, nc * 4) == 0, "unaligned %s tb=%d acc=%d: results differ",
          ts_dtype_name(in), trans_b, accumulate);
done:
    ts_mm_free(m);
    free(scratch);
    ts_aligned_free(a2);
    ts_aligned_free(b2);
    ts_aligned_free(c2);
    ts_aligned_free(c1);
    if (have_a) operand_free(&a);
    if (have_b) operand_free(&b);
    record(ok);
}

/* ---- error paths ----------------------------------------------------------- */

static void test_errors(void) {
    int ok = 1;
    ts_mm *m = NULL;
    ts_mm_desc d = {.a_dt = TS_F32,
                    .b_dt = TS_F32,
                    .c_dt = TS_F32,
                    .batch = 1,
                    .M = 0,
                    .N = 4,
                    .K = 4,
                    .label = "bad_fc"};
    CHECK(ts_mm_create(&d, &m) == TS_ERR_SHAPE && !m, "M=0 accepted");
    CHECK(strstr(ts_last_error(), "bad_fc") && strstr(ts_last_error(), "f32[0,4]"),
          "message lacks label/shape: %s", ts_last_error());
    d.M = 4;
    d.a_dt = d.b_dt = d.c_dt = TS_F64;
    CHECK(ts_mm_create(&d, &m) == TS_ERR_UNSUPPORTED && !m, "f64 accepted");
    d.a_dt = d.b_dt = TS_BF16;
    d.c_dt = TS_F32;
    d.batch = INT64_C(1) << 40;
    CHECK(ts_mm_create(&d, &m) == TS_ERR_SHAPE && !m, "huge batch accepted");
    d.batch = 2;
    d.a_broadcast = d.b_broadcast = 1;
    CHECK(ts_mm_create(&d, &m) == TS_ERR_UNSUPPORTED && !m, "double broadcast accepted");
    d.a_broadcast = d.b_broadcast = 0;
    d.batch = 1;
    CHECK(ts_mm_create(&d, NULL) == TS_ERR_INVALID, "NULL out accepted");
    CHECK(ts_mm_create(NULL, &m) == TS_ERR_INVALID, "NULL desc accepted");
    if (skip_dtype(TS_BF16)) {
    } else if (ts_mm_create(&d, &m) == TS_OK) {
        float c[16];
        uint16_t ab[16] = {0};
        CHECK(ts_mm_run(m, NULL, ab, c, NULL) == TS_ERR_INVALID, "NULL A accepted");
        if (ts_mm_scratch_bytes(m) > 0)
            CHECK(ts_mm_run(m, ab, ab, c, NULL) == TS_ERR_INVALID, "missing scratch accepted");
        ts_mm_free(m);
    } else {
        CHECK(0, "bf16 4x4x4 create failed: %s", ts_last_error());
    }
    ts_mm_free(NULL);
    CHECK(ts_mm_ref_f32(&d, NULL, NULL, NULL) == TS_ERR_INVALID, "ref accepted NULL");
    record(ok);
}

int main(void) {
    const uint64_t seed = 20240607;
    const int ncases = 160;
    for (int i = 0; i < ncases; i++) {
        mm_case c = random_case(seed, i);
        c.d.label = c.label; /* the struct was copied */
        test_case(&c.d, seed + (uint64_t)i);
    }

    /* Fixed corner cases: all-ones dims, and K exactly at oneDNN's K-block edges. */
    static const int64_t corner[][4] = {{1, 1, 1, 1},     {3, 1, 1, 1},   {1, 1, 17, 1},
                                        {1, 17, 1, 3},    {2, 3, 3, 512}, {1, 5, 7, 513},
                                        {1, 3, 17, 1024}, {1, 2, 3, 1025}};
    for (size_t i = 0; i < sizeof corner / sizeof *corner; i++) {
        for (int v = 0; v < 8; v++) {
            char label[32];
            snprintf(label, sizeof label, "corner%zu.%d", i, v);
            ts_mm_desc d = {.a_dt = v >= 6 ? TS_BF16 : TS_F32,
                            .b_dt = v >= 6 ? TS_BF16 : TS_F32,
                            .c_dt = TS_F32,
                            .batch = corner[i][0],
                            .M = corner[i][1],
                            .N = corner[i][2],
                            .K = corner[i][3],
                            .trans_a = v & 1,
                            .trans_b = (v >> 1) & 1,
                            .accumulate = v == 5 || v == 7,
                            .b_broadcast = corner[i][0] > 1 && v == 4,
                            .label = label};
            test_case(&d, 7000 + i * 8 + (uint64_t)v);
        }
    }

    /* Workload shapes (weights stored [out, in]: forward uses B^T). */
    static const struct {
        const char *name;
        int64_t batch, M, N, K;
        int ta, tb;
    } wl[] = {
        {"mlp1.fwd", 1, 256, 1024, 2048, 0, 1},
        {"mlp1.fwd.noT", 1, 256, 1024, 2048, 0, 0},
        {"mlp1.dX", 1, 256, 2048, 1024, 0, 0},
        {"mlp1.dW", 1, 1024, 2048, 256, 1, 0},
        {"mlp2.fwd", 1, 256, 1024, 1024, 0, 1},
        {"mlp2.dW", 1, 1024, 1024, 256, 1, 0},
        {"gpt.qkv", 1, 2048, 1536, 512, 0, 1},
        {"gpt.qkv.dX", 1, 2048, 512, 1536, 0, 0},
        {"gpt.qkv.dW", 1, 1536, 512, 2048, 1, 0},
        {"gpt.ffn", 1, 2048, 8192, 512, 0, 0},
        {"gpt.lm", 1, 2048, 8192, 512, 0, 1},
        {"gpt.lm.dX", 1, 2048, 512, 8192, 0, 0},
        {"gpt.lm.dW", 1, 8192, 512, 2048, 1, 0},
        {"attn.qk", 64, 256, 256, 64, 0, 1},
        {"attn.pv", 64, 256, 64, 256, 0, 0},
        {"attn.dV", 64, 256, 64, 256, 1, 0},
        /* the GRU's first-layer dW_ih (W2: 3H = 768, 32 features, B*T = 8192 rows): oneDNN
         * splits this K between 2 threads; run in K blocks (dnnl_matmul_ksplit.h) */
        {"gru.dWih", 1, 768, 32, 8192, 1, 0},
        {"gru.dWih.tail", 1, 96, 40, 2048 + 700, 1, 0},
    };
    for (size_t i = 0; i < sizeof wl / sizeof *wl; i++)
        for (int bf = 0; bf < 2; bf++)
            test_workload_determinism(wl[i].name, bf ? TS_BF16 : TS_F32, wl[i].batch, wl[i].M,
                                      wl[i].N, wl[i].K, wl[i].ta, wl[i].tb, (int)(i % 3 == 2), 2);
    /* More threads than blocks of N: weight gradients that oneDNN may split in K (the first
     * splits on 4 threads), run in K blocks, must give the one-thread bits. */
    for (int bf = 0; bf < 2; bf++) {
        test_workload_determinism("dW.4thr", bf ? TS_BF16 : TS_F32, 1, 96, 128, 4096, 1, 0, bf, 4);
        test_workload_determinism("dW.8thr", bf ? TS_BF16 : TS_F32, 1, 384, 448, 2560, 1, 0, !bf,
                                  8);
    }
    /* Thread-sensitive on AMX at any thread count (its K blocking follows the creating count):
     * gpt's dX and the GRU's dW_ih (A transposed) on 3 and 4 threads, uneven row blocks. */
    for (int bf = 0; bf < 2; bf++) {
        test_workload_determinism("gpt.qkv.dX.4thr", bf ? TS_BF16 : TS_F32, 1, 2048, 512, 1536, 0,
                                  0, 0, 4);
        test_workload_determinism("gru.dWih.3thr", bf ? TS_BF16 : TS_F32, 1, 768, 32, 8192, 1, 0, 1,
                                  3);
    }

    for (int v = 0; v < 4; v++) test_unaligned(v & 1 ? TS_BF16 : TS_F32, v >> 1, v >> 1);
    test_errors();

    printf("implementations used:");
    for (int i = 0; i < 16 && g_impls[i].n; i++) printf(" %s x%d", g_impls[i].name, g_impls[i].n);
    printf("\n");
    printf("dnnl_matmul: %d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skipped);
    return g_fail != 0;
}
