/* The cross entropy's hand-vectorised exp loops (ops/ce_simd.c) against the scalar loops they
 * replace (loss.c with vmath.h's m_exp_neg_f32), bit for bit, on every 251st f32 bit pattern
 * as logits (both signs, subnormals, infinities, NaN) against a row maximum or lse above them,
 * as the callers have it (x - m <= 0, or NaN):
 * - ts_ce_sumexp_simd: the 16 interleaved f64 partial sums of a row's exps;
 * - ts_ce_scaled_exp_simd: a row's gradient before the target's -1, exp(x - lse) * sc;
 * with lengths that are not multiples of 16 (the callers finish the tail). On a CPU without
 * AVX-512 both do nothing, which is checked too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/ce_simd.h"
#include "ops/vexp_avx512.h"
#include "ops/vmath.h"

enum { N = 1 << 16, STEP = 251 };

static int differ(float a, float b) { /* NaN equals NaN, whatever its sign and payload */
    return memcmp(&a, &b, sizeof a) != 0 && !(a != a && b != b);
}
static int differ_d(double a, double b) {
    return memcmp(&a, &b, sizeof a) != 0 && !(a != a && b != b);
}

int main(void) {
    float *x = malloc(sizeof(float) * N), *d = malloc(sizeof(float) * N);
    long long bad_sum = 0, bad_exp = 0, bad_len = 0, n_all = 0;
#if TS_VEXP_AVX512
    const int simd = ts_vexp_avx512_ok();
#else
    const int simd = 0;
#endif
    /* row maxima / lse values the logits sit below (and a NaN one), and gradient scales */
    const float tops[] = {INFINITY, 88.0f, 3.5f, 0.0f, -1e-30f, NAN};
    const float scs[] = {1.0f, 1.0f / 2048, -3.25f};
    int k = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; k++) {
        int n = 0;
        for (; n < N && u <= 0xffffffffull; n++, u += STEP) {
            uint32_t b = (uint32_t)u;
            memcpy(&x[n], &b, sizeof b);
        }
        const float top = tops[k % 6], sc = scs[k % 3];
        for (int i = 0; i < n; i++) /* keep x - top <= 0 (or NaN): what the callers pass */
            if (x[i] > top) x[i] = top - fabsf(x[i] - top);
        const int64_t len = n - (k % 17); /* a tail the callers finish */
        double acc[16], ref[16];
        for (int j = 0; j < 16; j++) acc[j] = ref[j] = 0.5 * j;
        int64_t done = ts_ce_sumexp_simd(acc, x, top, len);
        bad_len += simd ? done != len / 16 * 16 : done != 0;
        for (int64_t i = 0; i + 16 <= done; i += 16)
            for (int j = 0; j < 16; j++) ref[j] += m_exp_neg_f32(x[i + j] - top);
        for (int j = 0; j < 16; j++) bad_sum += differ_d(acc[j], ref[j]);
        done = ts_ce_scaled_exp_simd(d, x, top, sc, len);
        bad_len += simd ? done != len / 16 * 16 : done != 0;
        for (int64_t i = 0; i < done; i++) bad_exp += differ(d[i], m_exp_neg_f32(x[i] - top) * sc);
        n_all += n;
    }
    printf("AVX-512 kernels: %s; %lld inputs\n", simd ? "yes" : "no (nothing to compare)", n_all);
    CHECK(n_all > 17000000, "%lld inputs", n_all);
    CHECK(bad_len == 0, "%lld calls did the wrong number of elements", bad_len);
    CHECK(bad_sum == 0, "sum of exps: %lld partial sums differ from the scalar loop's", bad_sum);
    CHECK(bad_exp == 0, "scaled exp: %lld of %lld values differ from the scalar loop's", bad_exp,
          n_all);
    free(x);
    free(d);
    return check_summary("ce_simd");
}
