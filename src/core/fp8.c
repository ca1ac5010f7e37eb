/* fp8.c — OCP FP8 (E4M3, E5M2) conversions; the reference encoder.
 *
 * ts_fp8_from_f64 is written for clarity: split |x| into an exponent and
 * an integer number of quanta, round that with rint (ties to even in the
 * default rounding mode), and assemble the code. The f32 batch path uses
 * the branch-free encoders of fp8.h instead; the unit test holds the two
 * to the same bits.
 */
#include <math.h>
#include "core.h"
#include "fp8.h"

typedef struct fmt_info {
    int mbits, bias;
    uint8_t max_code; /* largest finite positive code */
    double max;
} fmt_info;

static const fmt_info E4M3 = {3, 7, 0x7E, 448.0};
static const fmt_info E5M2 = {2, 15, 0x7B, 57344.0};

static const fmt_info *info(ts_dtype fmt) {
    return fmt == TS_F8E4M3 ? &E4M3 : fmt == TS_F8E5M2 ? &E5M2 : NULL;
}

int ts_fp8_is_format(ts_dtype fmt) {
    return info(fmt) != NULL;
}
double ts_fp8_max(ts_dtype fmt) {
    return info(fmt) ? info(fmt)->max : 0.0;
}
double ts_fp8_min_normal(ts_dtype fmt) {
    return info(fmt) ? ldexp(1.0, 1 - info(fmt)->bias) : 0.0;
}
double ts_fp8_min_subnormal(ts_dtype fmt) {
    const fmt_info *f = info(fmt);
    return f ? ldexp(1.0, 1 - f->bias - f->mbits) : 0.0;
}

float ts_fp8_to_f32(uint8_t c, ts_dtype fmt) {
    return fmt == TS_F8E4M3 ? ts_fp8_dec_e4m3(c) : fmt == TS_F8E5M2 ? ts_fp8_dec_e5m2(c) : NAN;
}

uint8_t ts_fp8_from_f64(double x, ts_dtype fmt, int saturate) {
    const fmt_info *f = info(fmt);
    if (!f || isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs(x);
    const int one = 1 << f->mbits; /* the implicit leading 1 in quanta */
    long code;
    if (a < ldexp(1.0, 1 - f->bias)) {
        /* subnormal range: quantum 2^(1 - bias - mbits); n == one is the
         * smallest normal, whose code is also `one` */
        code = (long)rint(a / ldexp(1.0, 1 - f->bias - f->mbits));
    } else if (isinf(a)) {
        code = 0x7fffffffL;
    } else {
        int e;
        frexp(a, &e); /* a = fr 2^e, 0.5 <= fr < 1: unbiased exponent e - 1 */
        int E = e - 1;
        long n = (long)rint(a / ldexp(1.0, E - f->mbits)); /* one <= n <= 2 one */
        if (n == 2 * one) {
            n = one;
            E++;
        }
        code = ((long)(E + f->bias) << f->mbits) | (n - one);
    }
    if (code > f->max_code) {
        if (saturate) return sign | f->max_code;
        return fmt == TS_F8E5M2 ? (uint8_t)(sign | 0x7C) : 0x7F;
    }
    return (uint8_t)(sign | code);
}

uint8_t ts_fp8_from_f32(float x, ts_dtype fmt, int saturate) {
    return ts_fp8_from_f64((double)x, fmt, saturate);
}

void ts_fp8_encode_f32(uint8_t *out, const float *x, int64_t n, ts_dtype fmt, int saturate) {
    if (fmt == TS_F8E4M3) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = ts_fp8_enc_e4m3(x[i], saturate);
    } else if (fmt == TS_F8E5M2) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = ts_fp8_enc_e5m2(x[i], saturate);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = 0x7F;
    }
}
