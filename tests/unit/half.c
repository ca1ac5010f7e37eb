/* f32 <-> bf16 / f16 conversions (core/half.h) and the CAST op, exhaustively.
 *
 * Every one of the 65536 bit patterns of each half type is widened and
 * compared with a reference; narrowing is checked at every value that
 * matters for round-to-nearest-even: each representable half value, the
 * exact midpoint between neighbours (ties go to the even code) and the f32
 * values one ulp either side of it (they go to the nearer code), plus
 * overflow, underflow, NaN and a random sweep. References: GCC's _Float16
 * (libgcc's soft-float conversion, an implementation independent of ours)
 * for f16, and exact double arithmetic for bf16. The CAST op runs the same
 * values through a compiled plan and must give the same bits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/half.h"

static float bits_f(uint32_t u) {
    return ts_half_f32_from_bits(u);
}
static uint32_t f_bits(float f) {
    return ts_half_f32_bits(f);
}

static uint16_t ref_f32_to_f16(float x) {
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
static float ref_f16_to_f32(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, sizeof h);
    return (float)h;
}

/* Nearest bf16 to a finite f32 by exact comparison in double. */
static uint16_t ref_f32_to_bf16(float x) {
    uint32_t u = f_bits(x);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xffffu) == 0) return lo;
    double dx = x, dl = bits_f((uint32_t)lo << 16);
    double dh = (hi & 0x7fffu) == 0x7f80u ? (x < 0 ? -1 : 1) * ldexp(1.0, 128)
                                          : (double)bits_f((uint32_t)hi << 16);
    double el = fabs(dx - dl), eh = fabs(dh - dx);
    if (el < eh) return lo;
    if (eh < el) return hi;
    return (lo & 1) ? hi : lo;
}

static int is_nan16(uint16_t h) {
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}
static int is_nanbf(uint16_t h) {
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

static int n_bad;
static void expect16(const char *what, float x, uint16_t got, uint16_t want) {
    int ok = got == want || (is_nan16(got) && is_nan16(want) && (got >> 15) == (want >> 15));
    if (!ok && n_bad++ < 10) /* the count is checked once at the end */
        fprintf(stderr, "%s(%a = 0x%08x): got 0x%04x, want 0x%04x\n", what, (double)x, f_bits(x),
                got, want);
    (void)what;
}

static void check_f16(void) {
    int64_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float w = ts_f16_to_f32((uint16_t)h), r = ref_f16_to_f32((uint16_t)h);
        int ok = f_bits(w) == f_bits(r) || (w != w && r != r);
        CHECK(ok, "f16 0x%04x -> f32: got %a, want %a", h, (double)w, (double)r);
        if (is_nan16((uint16_t)h)) continue;
        /* round trip */
        expect16("f32_to_f16 exact", w, ts_f32_to_f16(w), (uint16_t)h);
        if ((h & 0x7fffu) >= 0x7c00u) continue;
        /* midpoint to the next code away from zero and its neighbours */
        float next = (h & 0x7fffu) == 0x7bffu ? (h & 0x8000u ? -65536.0f : 65536.0f)
                                              : ts_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)w + (double)next) / 2); /* exact in f32 */
        float below = bits_f(f_bits(mid) - 1), above = bits_f(f_bits(mid) + 1);
        const float probes[3] = {mid, below, above};
        for (int k = 0; k < 3; k++) {
            expect16("f32_to_f16", probes[k], ts_f32_to_f16(probes[k]), ref_f32_to_f16(probes[k]));
            n++;
        }
    }
    /* overflow, NaN, tiny values, and a random sweep of all exponents */
    const float special[] = {65504.0f,      65519.99f, 65520.0f,  1e10f,          INFINITY,
                             -INFINITY,     NAN,       -NAN,      1e-10f,         -1e-30f,
                             0.0f,          -0.0f,     bits_f(1), 2.98023224e-8f, 2.98023253e-8f,
                             5.96046448e-8f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        expect16("f32_to_f16 special", special[i], ts_f32_to_f16(special[i]),
                 ref_f32_to_f16(special[i]));
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1 << 20; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float x = bits_f((uint32_t)s);
        expect16("f32_to_f16 random", x, ts_f32_to_f16(x), ref_f32_to_f16(x));
    }
    CHECK(n == 3 * (65536 - 2 * 1024), "f16 rounding boundaries probed: %lld", (long long)n);
    CHECK(n_bad == 0, "f32 -> f16: %d conversions differ from the reference", n_bad);
}

static void check_bf16(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        float w = ts_bf16_to_f32((uint16_t)h);
        CHECK(f_bits(w) == h << 16, "bf16 0x%04x -> f32", h);
        if (is_nanbf((uint16_t)h)) {
            uint16_t q = ts_f32_to_bf16(w);
            CHECK(is_nanbf(q) && (q >> 15) == (h >> 15), "bf16 NaN 0x%04x stays NaN", h);
            continue;
        }
        CHECK(ts_f32_to_bf16(w) == h, "bf16 0x%04x round trip", h);
        if ((h & 0x7fffu) >= 0x7f80u) continue;
        uint32_t mid = (h << 16) | 0x8000u; /* exactly halfway to the next code */
        const uint32_t probes[3] = {mid, mid - 1, mid + 1};
        for (int k = 0; k < 3; k++) {
            float x = bits_f(probes[k]);
            uint16_t got = ts_f32_to_bf16(x), want = ref_f32_to_bf16(x);
            CHECK(got == want, "f32 %a -> bf16: got 0x%04x, want 0x%04x", (double)x, got, want);
        }
    }
    CHECK(ts_f32_to_bf16(3.4028235e38f) == 0x7f80u, "max f32 rounds to bf16 inf");
    CHECK(is_nanbf(ts_f32_to_bf16(bits_f(0x7f800001u))), "signalling NaN stays NaN in bf16");
}

/* The CAST op through a compiled plan, f32 -> f16/bf16 -> f32. */
static void check_cast_op(void) {
    enum { N = 3 * 65536 };
    float *x = malloc(sizeof(float) * N), *back = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++) {
        uint32_t k = (uint32_t)i / 3, off = (uint32_t)i % 3;
        x[i] = bits_f((k << 16) | (off == 0 ? 0x8000u : off == 1 ? 0x7fffu : 0x1000u));
        if (x[i] != x[i]) x[i] = 1.0f;
    }
    for (int t = 0; t < 2; t++) {
        ts_dtype lo = t ? TS_F16 : TS_BF16;
        ts_graph *g = ts_graph_new();
        int64_t d[1] = {N};
        ts_val in = ts_input(g, "x", TS_F32, 1, d);
        ts_val c = ts_cast(g, in, lo);
        ts_mark_output(g, c, "low");
        ts_mark_output(g, ts_cast(g, c, TS_F32), "back");
        ts_plan *p = NULL;
        CHECK_OK(ts_compile(g, NULL, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * N));
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "low", h, sizeof(uint16_t) * N));
            CHECK_OK(ts_plan_read(p, "back", back, sizeof(float) * N));
            int bad = 0;
            for (int i = 0; i < N; i++) {
                uint16_t w = t ? ts_f32_to_f16(x[i]) : ts_f32_to_bf16(x[i]);
                float wb = t ? ts_f16_to_f32(w) : ts_bf16_to_f32(w);
                bad += h[i] != w || (f_bits(back[i]) != f_bits(wb) && wb == wb);
            }
            CHECK(bad == 0, "cast f32 -> %s -> f32: %d of %d elements differ", ts_dtype_name(lo),
                  bad, N);
        }
        ts_plan_free(p);
        ts_graph_free(g);
    }
    free(x);
    free(back);
    free(h);
}

int main(void) {
    check_f16();
    check_bf16();
    check_cast_op();
    return check_summary("half");
}
