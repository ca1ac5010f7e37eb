/* FP8 conversions (src/core/fp8.c, fp8.h), exhaustively over the 256 codes
 * of E4M3 and E5M2: decoding against the format's defining formula,
 * round trips, ties at every midpoint between neighbouring codes, values
 * just either side of them, saturation and NaN; then the branch-free f32
 * encoder against the reference over a sweep of f32 bit patterns. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"
#include "core/fp8.h"

typedef struct fmt {
    ts_dtype dt;
    const char *name;
    int ebits, mbits, bias;
    int has_inf; /* E5M2: IEEE specials; E4M3: only S.1111.111 is NaN */
    double max;
} fmt;

static const fmt FMTS[2] = {{TS_F8E4M3, "e4m3", 4, 3, 7, 0, 448.0},
                            {TS_F8E5M2, "e5m2", 5, 2, 15, 1, 57344.0}};

/* The value of code c from the format's definition, with pow() rather
 * than bit tricks: (-1)^s 2^(e - bias) (1 + m / 2^M), subnormals
 * (-1)^s 2^(1 - bias) (m / 2^M). */
static double formula(const fmt *f, int c) {
    int s = c >> 7, e = (c >> f->mbits) & ((1 << f->ebits) - 1), m = c & ((1 << f->mbits) - 1);
    int emax = (1 << f->ebits) - 1;
    if (f->has_inf && e == emax) return m ? NAN : (s ? -INFINITY : INFINITY);
    if (!f->has_inf && e == emax && m == (1 << f->mbits) - 1) return NAN;
    double frac = (double)m / pow(2.0, f->mbits);
    double v = e ? pow(2.0, e - f->bias) * (1.0 + frac) : pow(2.0, 1 - f->bias) * frac;
    return s ? -v : v;
}

static int is_nan_code(const fmt *f, int c) {
    return isnan(formula(f, c));
}

/* The encoders under test, by index: reference f64, reference f32, fast. */
static uint8_t enc(int which, const fmt *f, float x, int sat) {
    if (which == 0) return ts_fp8_from_f64((double)x, f->dt, sat);
    if (which == 1) return ts_fp8_from_f32(x, f->dt, sat);
    return f->dt == TS_F8E4M3 ? ts_fp8_enc_e4m3(x, sat) : ts_fp8_enc_e5m2(x, sat);
}
static const char *ENC_NAME[3] = {"from_f64", "from_f32", "fast"};

static void test_decode(const fmt *f) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        double want = formula(f, c);
        float got = ts_fp8_to_f32((uint8_t)c, f->dt);
        int ok = isnan(want) ? isnan(got) : ((double)got == want && !signbit(got) == !(c & 0x80));
        if (!ok && bad++ < 5) CHECK(0, "%s decode 0x%02X = %.9g, want %.9g", f->name, c, got, want);
    }
    CHECK(bad == 0, "%s: %d codes decode wrongly", f->name, bad);
    CHECK(ts_fp8_to_f32(f->dt == TS_F8E4M3 ? 0x7E : 0x7B, f->dt) == f->max, "%s max", f->name);
    CHECK(ts_fp8_max(f->dt) == f->max, "%s ts_fp8_max", f->name);
    CHECK(ts_fp8_min_subnormal(f->dt) == formula(f, 1), "%s min subnormal", f->name);
    CHECK(ts_fp8_min_normal(f->dt) == formula(f, 1 << f->mbits), "%s min normal", f->name);
}

static void test_round_trip(const fmt *f) {
    for (int w = 0; w < 3; w++)
        for (int sat = 0; sat < 2; sat++) {
            int bad = 0;
            for (int c = 0; c < 256; c++) {
                if (is_nan_code(f, c)) continue;
                float v = ts_fp8_to_f32((uint8_t)c, f->dt);
                int want = c;
                if (isinf(v) && sat) want = (c & 0x80) | 0x7B; /* saturating: inf -> max */
                uint8_t got = enc(w, f, v, sat);
                if (got != want && bad++ < 5)
                    CHECK(0, "%s %s sat=%d: encode(decode(0x%02X)) = 0x%02X", f->name, ENC_NAME[w],
                          sat, c, got);
            }
            CHECK(bad == 0, "%s %s sat=%d: %d round trips fail", f->name, ENC_NAME[w], sat, bad);
        }
}

/* Between each pair of neighbouring finite codes lo < hi (positive and
 * negative): the midpoint goes to the even code, one f32 ulp below to lo,
 * one above to hi. Midpoints have at most M + 2 significant bits, so they
 * are exact in f32. */
static void test_midpoints(const fmt *f) {
    int maxc = f->dt == TS_F8E4M3 ? 0x7E : 0x7B, n = 0;
    for (int w = 0; w < 3; w++)
        for (int sat = 0; sat < 2; sat++)
            for (int neg = 0; neg < 2; neg++)
                for (int c = 0; c < maxc; c++) {
                    int lo = c | (neg << 7), hi = (c + 1) | (neg << 7), even = c % 2 ? hi : lo;
                    double vl = formula(f, lo), vh = formula(f, hi), mid = 0.5 * (vl + vh);
                    float m = (float)mid;
                    CHECK((double)m == mid, "%s midpoint %.17g not exact in f32", f->name, mid);
                    float below = nextafterf(m, (float)vl), above = nextafterf(m, (float)vh);
                    int g_mid = enc(w, f, m, sat), g_lo = enc(w, f, below, sat),
                        g_hi = enc(w, f, above, sat);
                    CHECK(g_mid == even, "%s %s: midpoint %.9g of 0x%02X/0x%02X -> 0x%02X", f->name,
                          ENC_NAME[w], mid, lo, hi, g_mid);
                    CHECK(g_lo == lo, "%s %s: %.9g (below midpoint) -> 0x%02X, want 0x%02X",
                          f->name, ENC_NAME[w], below, g_lo, lo);
                    CHECK(g_hi == hi, "%s %s: %.9g (above midpoint) -> 0x%02X, want 0x%02X",
                          f->name, ENC_NAME[w], above, g_hi, hi);
                    n++;
                }
    CHECK(n == 3 * 2 * 2 * maxc, "%s: %d midpoints", f->name, n);
}

/* Beyond max: the tie with the would-be next code (max + one ulp) goes to
 * even, which is max in E4M3 (0x7E vs 0x7F) and inf in E5M2 (0x7B vs 0x7C);
 * saturation clamps everything finite and infinite to +-max. */
static void test_saturation(const fmt *f) {
    int maxc = f->dt == TS_F8E4M3 ? 0x7E : 0x7B;
    double ulp = f->max - formula(f, maxc - 1), tie = f->max + ulp / 2;
    int ovf = f->has_inf ? 0x7C : 0x7F;
    const float big[] = {(float)tie,
                         nextafterf((float)tie, INFINITY),
                         (float)(f->max + ulp),
                         (float)(4 * f->max),
                         1e30f,
                         FLT_MAX,
                         INFINITY};
    for (int w = 0; w < 3; w++)
        for (int s = 0; s < 2; s++)
            for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
                float x = s ? -big[i] : big[i];
                int sgn = s ? 0x80 : 0;
                int got_sat = enc(w, f, x, 1), got = enc(w, f, x, 0);
                CHECK(got_sat == (sgn | maxc), "%s %s: saturating(%g) = 0x%02X", f->name,
                      ENC_NAME[w], x, got_sat);
                /* without saturation: the tie rounds to even, the rest overflow */
                int want = i == 0 ? (f->has_inf ? sgn | 0x7C : sgn | maxc)
                                  : (f->has_inf ? sgn | ovf : 0x7F);
                CHECK(got == want, "%s %s: non-saturating(%g) = 0x%02X, want 0x%02X", f->name,
                      ENC_NAME[w], x, got, want);
            }
    /* NaN of either sign, and any payload, is 0x7F */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 4; i++)
            for (int sat = 0; sat < 2; sat++) {
                float x = fp8_float(nans[i]);
                CHECK(enc(w, f, x, sat) == 0x7F, "%s %s: NaN 0x%08X -> 0x%02X", f->name,
                      ENC_NAME[w], nans[i], enc(w, f, x, sat));
            }
    CHECK(ts_fp8_from_f64(NAN, f->dt, 1) == 0x7F, "%s: f64 NaN", f->name);
    /* zero keeps its sign; below half the smallest subnormal flushes to it */
    CHECK(ts_fp8_from_f32(-0.0f, f->dt, 1) == 0x80, "%s: -0", f->name);
    float tiny = (float)(formula(f, 1) * 0.49);
    CHECK(ts_fp8_from_f32(-tiny, f->dt, 1) == 0x80, "%s: -tiny flushes to -0", f->name);
    CHECK(enc(2, f, 1e-40f, 1) == 0x00, "%s: f32 subnormal flushes to 0", f->name);
}

/* The fast encoder and the batch API agree with the reference bit for bit
 * over a sweep of f32 patterns: all of them with a coarse stride, the
 * FP8 range (|x| in [2^-20, 2^18]) with a fine one. */
static void test_fast_sweep(const fmt *f) {
    enum { B = 4096 };
    static float xs[B];
    static uint8_t batch[B];
    int64_t checked = 0, bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t lo = pass ? 0x35800000u : 0, hi = pass ? 0x48800000u : 0x100000000u;
        uint64_t step = pass ? 37 : 1021;
        for (int sat = 0; sat < 2; sat++)
            for (uint64_t b = lo; b < hi;) {
                int k = 0;
                for (; k < B && b < hi; k++, b += step)
                    xs[k] = fp8_float((uint32_t)b ^ (k & 1 ? 0x80000000u : 0));
                ts_fp8_encode_f32(batch, xs, k, f->dt, sat);
                for (int i = 0; i < k; i++) {
                    uint8_t want = ts_fp8_from_f32(xs[i], f->dt, sat);
                    uint8_t fast = enc(2, f, xs[i], sat);
                    if ((fast != want || batch[i] != want) && bad++ < 5)
                        CHECK(0,
                              "%s sat=%d: x=%.9g (0x%08X): reference 0x%02X, fast 0x%02X, "
                              "batch 0x%02X",
                              f->name, sat, xs[i], fp8_bits(xs[i]), want, fast, batch[i]);
                }
                checked += k;
            }
    }
    CHECK(bad == 0, "%s: %lld of %lld sweep values differ", f->name, (long long)bad,
          (long long)checked);
}

int main(void) {
    for (int i = 0; i < 2; i++) {
        test_decode(&FMTS[i]);
        test_round_trip(&FMTS[i]);
        test_midpoints(&FMTS[i]);
        test_saturation(&FMTS[i]);
        test_fast_sweep(&FMTS[i]);
    }
    /* spot values from the OCP specification */
    CHECK(ts_fp8_from_f32(448.0f, TS_F8E4M3, 1) == 0x7E, "e4m3 448");
    CHECK(ts_fp8_from_f32(57344.0f, TS_F8E5M2, 1) == 0x7B, "e5m2 57344");
    CHECK(ts_fp8_from_f32(1.0f, TS_F8E4M3, 1) == 0x38, "e4m3 1.0");
    CHECK(ts_fp8_from_f32(1.0f, TS_F8E5M2, 1) == 0x3C, "e5m2 1.0");
    CHECK(ts_fp8_to_f32(0x01, TS_F8E4M3) == 0.001953125f, "e4m3 2^-9");
    CHECK(ts_fp8_to_f32(0x7C, TS_F8E5M2) == INFINITY, "e5m2 inf");
    CHECK(!ts_fp8_is_format(TS_F32) && ts_fp8_from_f32(1.0f, TS_F32, 1) == 0x7F, "not fp8");
    return check_summary("fp8");
}
