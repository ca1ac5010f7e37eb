/* conv_wgrad.c — the per-tap backward-weights kernel (dnnl_conv_wgrad.h).
 *
 * For every shape (3D 3^3 pad 1 like W4, 2D, 1x1, "valid" and pad 2
 * convolutions, output channels leaving every register-tile remainder, input
 * channels 8 to 40, uneven spatial sizes, 1 to 3 images):
 *   - the AVX2 kernel gives the bits of the scalar fmaf kernel (same sums, same
 *     order), on 1, 2 and 3 threads;
 *   - both agree with a double-precision direct sum within 1e-5 of the sum of
 *     the terms' magnitudes.
 * Also the shapes the kernel refuses. Without AVX2 + FMA the scalar kernel is
 * still checked against the direct sum and across thread counts. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_conv_wgrad.h"
#include "check.h"
#include "conv_cases.h"
#include "core/core.h"

/* dw[o][c][tap] and the sum of |terms| per weight, in double. */
static void direct(const ts_wgrad_shape *s, const float *x, const float *dy, double *dw,
                   double *mag) {
    const int64_t T = s->k[0] * s->k[1] * s->k[2], C = s->C, O = s->O;
    memset(dw, 0, sizeof(double) * (size_t)(O * C * T));
    memset(mag, 0, sizeof(double) * (size_t)(O * C * T));
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t a = 0; a < s->out[0]; a++)
            for (int64_t b = 0; b < s->out[1]; b++)
                for (int64_t e = 0; e < s->out[2]; e++)
                    for (int64_t t = 0; t < T; t++) {
                        int64_t za = a + t / (s->k[1] * s->k[2]) - s->pad[0];
                        int64_t zb = b + t / s->k[2] % s->k[1] - s->pad[1];
                        int64_t ze = e + t % s->k[2] - s->pad[2];
                        if (za < 0 || zb < 0 || ze < 0 || za >= s->in[0] || zb >= s->in[1] ||
                            ze >= s->in[2])
                            continue;
                        const float *dr =
                            dy + (((n * s->out[0] + a) * s->out[1] + b) * s->out[2] + e) * O;
                        const float *xr =
                            x + (((n * s->in[0] + za) * s->in[1] + zb) * s->in[2] + ze) * C;
                        for (int64_t o = 0; o < O; o++)
                            for (int64_t c = 0; c < C; c++) {
                                double v = (double)dr[o] * xr[c];
                                dw[(o * C + c) * T + t] += v;
                                mag[(o * C + c) * T + t] += fabs(v);
                            }
                    }
}

typedef void (*wgrad_fn)(const ts_wgrad_shape *, const float *, const float *, float *, float *);

static float *run(wgrad_fn fn, const ts_wgrad_shape *s, const float *x, const float *dy,
                  int threads) {
    int64_t nw = s->O * s->C * s->k[0] * s->k[1] * s->k[2];
    float *dw = conv_rand_buf(nw, 99); /* overwritten: garbage first */
    float *scratch = ts_aligned_alloc(ts_conv_wgrad_scratch(s), "test scratch");
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    fn(s, x, dy, dw, scratch);
    omp_set_num_threads(saved);
    ts_aligned_free(scratch);
    return dw;
}

static ts_wgrad_shape shape3(int64_t N, int64_t C, int64_t O, int64_t d, int64_t h, int64_t w,
                             int64_t k, int64_t pad) {
    ts_wgrad_shape s = {.N = N, .C = C, .O = O, .in = {d, h, w}, .k = {k, k, k}};
    for (int j = 0; j < 3; j++) {
        s.pad[j] = pad;
        s.out[j] = s.in[j] + 2 * pad - k + 1;
    }
    return s;
}

static ts_wgrad_shape shape2(int64_t N, int64_t C, int64_t O, int64_t h, int64_t w, int64_t kh,
                             int64_t kw, int64_t ph, int64_t pw) {
    ts_wgrad_shape s = {
        .N = N, .C = C, .O = O, .in = {1, h, w}, .k = {1, kh, kw}, .pad = {0, ph, pw}};
    for (int j = 0; j < 3; j++) s.out[j] = s.in[j] + 2 * s.pad[j] - s.k[j] + 1;
    return s;
}

static void check_shape(const char *what, const ts_wgrad_shape *s, int avx2) {
    int64_t nx = s->N * s->in[0] * s->in[1] * s->in[2] * s->C;
    int64_t ny = s->N * s->out[0] * s->out[1] * s->out[2] * s->O;
    int64_t nw = s->O * s->C * s->k[0] * s->k[1] * s->k[2];
    float *x = conv_rand_buf(nx, 1), *dy = conv_rand_buf(ny, 2);
    double *ref = malloc(sizeof(double) * (size_t)nw), *mag = malloc(sizeof(double) * (size_t)nw);
    direct(s, x, dy, ref, mag);
    float *sc1 = run(ts_conv_wgrad_scalar, s, x, dy, 1);
    float *sc2 = run(ts_conv_wgrad_scalar, s, x, dy, 2);
    CHECK(!memcmp(sc1, sc2, sizeof(float) * (size_t)nw), "%s: scalar kernel 1 vs 2 threads", what);
    double worst = 0;
    int64_t at = 0;
    for (int64_t e = 0; e < nw; e++) {
        double err = fabs(sc1[e] - ref[e]) / (mag[e] > 0 ? mag[e] : 1);
        if (err > worst) worst = err, at = e;
    }
    CHECK(worst <= 1e-5, "%s: scalar dw[%lld] = %.9g, direct sum %.9g (relative error %.3g)", what,
          (long long)at, sc1[at], ref[at], worst);
    if (avx2) {
        CHECK(ts_conv_wgrad_usable(s), "%s: kernel refuses the shape", what);
        for (int th = 1; th <= 3; th++) {
            float *v = run(ts_conv_wgrad, s, x, dy, th);
            int64_t diff = -1;
            for (int64_t e = 0; e < nw && diff < 0; e++)
                if (memcmp(&v[e], &sc1[e], sizeof(float))) diff = e;
            CHECK(diff < 0, "%s: AVX2 kernel on %d threads: dw[%lld] = %.9g, scalar %.9g", what, th,
                  (long long)diff, diff < 0 ? 0.0 : v[diff], diff < 0 ? 0.0 : sc1[diff]);
            ts_aligned_free(v);
        }
    }
    ts_aligned_free(sc1);
    ts_aligned_free(sc2);
    ts_aligned_free(x);
    ts_aligned_free(dy);
    free(ref);
    free(mag);
}

static void refused(void) {
    ts_wgrad_shape ok = shape3(1, 16, 16, 4, 4, 4, 3, 1);
    ts_wgrad_shape s = ok;
    s.C = 12; /* not a multiple of 8 */
    CHECK(!ts_conv_wgrad_usable(&s), "C = 12 accepted");
    s = ok;
    s.C = 1;
    CHECK(!ts_conv_wgrad_usable(&s), "C = 1 accepted");
    s = ok;
    s.out[1] = 5; /* not in + 2 pad - k + 1 */
    CHECK(!ts_conv_wgrad_usable(&s), "inconsistent output size accepted");
    s = ok;
    s.pad[2] = 3; /* pad >= k: whole output columns outside the input */
    s.out[2] = s.in[2] + 2 * 3 - 3 + 1;
    CHECK(!ts_conv_wgrad_usable(&s), "pad 3 with k 3 accepted");
    s = ok;
    s.N = 0;
    CHECK(!ts_conv_wgrad_usable(&s), "N = 0 accepted");
}

int main(void) {
    int avx2 = 0;
#if defined(__x86_64__)
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    printf("conv_wgrad: AVX2 + FMA %s\n",
           avx2 ? "present: vector kernel checked" : "absent: scalar kernel only");
    struct {
        const char *what;
        ts_wgrad_shape s;
    } cases[] = {
        {"3d 16->16 8^3 k3 pad 1 (W4 level 1)", shape3(2, 16, 16, 8, 8, 8, 3, 1)},
        {"3d 32->32 6^3 k3 pad 1 (W4 level 2)", shape3(1, 32, 32, 6, 6, 6, 3, 1)},
        {"3d 16->64 5x4x7 k3 pad 1", shape3(3, 16, 64, 5, 4, 7, 3, 1)},
        {"3d 8->1 k3 pad 1", shape3(1, 8, 1, 4, 5, 3, 3, 1)},
        {"3d 24->7 k3 valid", shape3(2, 24, 7, 5, 6, 7, 3, 0)},
        {"3d 40->13 k3 pad 2", shape3(1, 40, 13, 4, 3, 5, 3, 2)},
        {"3d 16->5 k1", shape3(2, 16, 5, 3, 4, 5, 1, 0)},
        {"3d 8->11 k2 pad 1 (even kernel)", shape3(1, 8, 11, 3, 4, 2, 2, 1)},
        {"2d 16->32 9x11 k3 pad 1", shape2(2, 16, 32, 9, 11, 3, 3, 1, 1)},
        {"2d 32->9 6x5 k5x3 pad 2x0", shape2(1, 32, 9, 6, 5, 5, 3, 2, 0)},
        {"2d 8->3 1x1 pixel k3 pad 1", shape2(3, 8, 3, 1, 1, 3, 3, 1, 1)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_shape(cases[i].what, &cases[i].s, avx2);
    refused();
    return check_summary("unit/conv_wgrad");
}
