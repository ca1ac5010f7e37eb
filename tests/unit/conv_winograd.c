/* conv_winograd.c — the Winograd F(2,3)^3 kernel (dnnl_conv_winograd.h)
 * against a direct convolution summed in double.
 *
 * For every shape (odd and even volumes, sizes 1 to 9, channel counts that
 * are and are not multiples of 16, batch 1 and 2), forward (flip 0) and
 * backward data (flip 1, the transposed and flipped weights):
 *   - within 1e-5 of the largest sum of the terms' magnitudes of the direct
 *     convolution (Winograd rounds differently: ~1e-6 measured);
 *   - the same bits on 1, 2 and 3 threads;
 *   - an output filled with garbage first is overwritten everywhere.
 * Also the sizes ts_wino_init refuses. Without AVX-512F (or with
 * TESSEL_CONV_WINOGRAD=0) the kernel is not run and the test says so. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_conv_winograd.h"
#include "check.h"
#include "conv_cases.h"
#include "core/core.h"

/* y = conv(x, w) with stride 1 and padding 1 in double, and the largest sum
 * of |terms| of one output. The weight of (o, c, tap) is w[o][c][tap]
 * (flip 0) or w[c][o][26 - tap] (flip 1). */
static double direct(const ts_wino *s, const float *x, const float *w, double *y) {
    const int64_t C = s->C, O = s->O;
    double worst_mag = 0;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t z = 0; z < s->D; z++)
            for (int64_t h = 0; h < s->H; h++)
                for (int64_t v = 0; v < s->W; v++)
                    for (int64_t o = 0; o < O; o++) {
                        double acc = 0, mag = 0;
                        for (int tap = 0; tap < 27; tap++) {
                            int64_t zz = z + tap / 9 - 1, hh = h + tap / 3 % 3 - 1,
                                    vv = v + tap % 3 - 1;
                            if (zz < 0 || hh < 0 || vv < 0 || zz >= s->D || hh >= s->H ||
                                vv >= s->W)
                                continue;
                            const float *xr = x + (((n * s->D + zz) * s->H + hh) * s->W + vv) * C;
                            for (int64_t c = 0; c < C; c++) {
                                float wv = s->flip ? w[(c * O + o) * 27 + 26 - tap]
                                                   : w[(o * C + c) * 27 + tap];
                                double t = (double)xr[c] * wv;
                                acc += t;
                                mag += fabs(t);
                            }
                        }
                        y[(((n * s->D + z) * s->H + h) * s->W + v) * O + o] = acc;
                        if (mag > worst_mag) worst_mag = mag;
                    }
    return worst_mag;
}

static float *run(const ts_wino *s, const float *x, const float *w, int threads) {
    const int64_t ny = s->N * s->D * s->H * s->W * s->O;
    float *y = conv_rand_buf(ny, 77); /* overwritten: garbage first */
    void *scratch = ts_aligned_alloc(ts_wino_scratch(s, threads), "test scratch");
    if (!y || !scratch) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    omp_set_num_threads(threads);
    ts_wino_conv(s, x, w, y, scratch);
    ts_aligned_free(scratch);
    return y;
}

typedef struct shape {
    int64_t N, D, H, W, C, O;
} shape;

static const shape shapes[] = {
    {1, 8, 8, 8, 16, 16}, /* W4's channels, small volume */
    {2, 5, 7, 3, 3, 5},   /* odd sizes, channels below 16 */
    {1, 9, 4, 6, 17, 20}, /* channel tails on both sides */
    {2, 3, 3, 3, 32, 48}, /* 48 = 32 + 16 output columns */
    {1, 4, 6, 5, 64, 64}, /* W4's bottleneck channels */
    {2, 1, 1, 1, 7, 70},  /* one voxel: every tap but the centre is padding */
    {1, 2, 9, 1, 33, 9},  /* a 1-wide axis */
};

static void check_shape(const shape *sh, int flip) {
    ts_wino s = {
        .N = sh->N, .D = sh->D, .H = sh->H, .W = sh->W, .C = sh->C, .O = sh->O, .flip = flip};
    char what[128];
    snprintf(what, sizeof what, "N%lld %lldx%lldx%lld C%lld -> O%lld %s", (long long)sh->N,
             (long long)sh->D, (long long)sh->H, (long long)sh->W, (long long)sh->C,
             (long long)sh->O, flip ? "backward data" : "forward");
    CHECK(ts_wino_init(&s), "%s: refused", what);
    CHECK(s.T % 12 == 0 && s.nblk * s.T >= s.ntiles, "%s: %lld blocks of %lld for %lld tiles", what,
          (long long)s.nblk, (long long)s.T, (long long)s.ntiles);
    const int64_t nx = s.N * s.D * s.H * s.W * s.C, ny = s.N * s.D * s.H * s.W * s.O;
    float *x = conv_rand_buf(nx, 1 + (uint64_t)sh->C), *w = conv_rand_buf(s.O * s.C * 27, 2);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    if (!x || !w || !ref) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    double mag = direct(&s, x, w, ref);
    float *y1 = run(&s, x, w, 1);
    double worst = 0;
    for (int64_t i = 0; i < ny; i++) worst = fmax(worst, fabs((double)y1[i] - ref[i]));
    CHECK(worst <= 1e-5 * mag, "%s: differs from the direct sum by %.3g (largest |terms| %.3g)",
          what, worst, mag);
    for (int th = 2; th <= 3; th++) {
        float *yt = run(&s, x, w, th);
        CHECK(!memcmp(y1, yt, sizeof(float) * (size_t)ny), "%s: %d threads give other bits", what,
              th);
        ts_aligned_free(yt);
    }
    ts_aligned_free(y1);
    ts_aligned_free(x);
    ts_aligned_free(w);
    free(ref);
}

int main(void) {
    ts_wino bad = {.N = 1, .D = 4, .H = 4, .W = 0, .C = 16, .O = 16};
    CHECK(!ts_wino_init(&bad), "W = 0 accepted");
    bad.W = 4, bad.C = 0;
    CHECK(!ts_wino_init(&bad), "C = 0 accepted");
    if (!ts_wino_enabled()) {
        printf("unit_conv_winograd: kernel off on this CPU (no AVX-512F or "
               "TESSEL_CONV_WINOGRAD=0); only the shape checks ran\n");
        return check_summary("unit/conv_winograd");
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int flip = 0; flip < 2; flip++) check_shape(&shapes[i], flip);
    return check_summary("unit/conv_winograd");
}
