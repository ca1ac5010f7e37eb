/* core/fp8.h — branch-free FP8 encoders for vectorised loops (internal).
 *
 * ts_fp8_from_f64() in fp8.c is the reference: plain arithmetic, easy to
 * read. The inline encoders below work on the f32 bit pattern with integer
 * operations and selects only, so a loop of them vectorises under
 * `omp simd`; tests/unit/fp8.c checks them bit for bit against the
 * reference. Both need the default rounding mode (nearest even).
 */
#ifndef TS_CORE_FP8_H
#define TS_CORE_FP8_H

#include <stdint.h>
#include <string.h>
#include "tessel/quant.h"

static inline uint32_t fp8_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float fp8_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Normal results: round the f32 mantissa to M bits (add half an ulp minus
 * one, plus the kept lsb: ties to even) and rebias the exponent.
 * Subnormal results: adding 2^(q+23), q the subnormal quantum, makes the FPU
 * round |x| to a multiple of 2^q; the low bits of the sum are the code
 * (2^M, the smallest normal, comes out right too). Overflow: saturate
 * clamps |x| to max first; otherwise E4M3 gives NaN and E5M2 inf. */
#define TS_FP8_ENC(name, DROP, REBIAS, MIN_NORMAL_BITS, MAGIC, MAX_BITS, MAX_CODE, OVF)            \
    static inline uint8_t name(float x, int sat) {                                                 \
        uint32_t u = fp8_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;                   \
        uint32_t nan = a > 0x7f800000u;                                                            \
        a = (sat && a > (MAX_BITS)) ? (MAX_BITS) : a;                                              \
        uint32_t r = a + ((1u << ((DROP)-1)) - 1u) + ((a >> (DROP)) & 1u);                         \
        int32_t nrm = (int32_t)(r >> (DROP)) - (int32_t)(REBIAS);                                  \
        int32_t sub = (int32_t)(fp8_bits(fp8_float(a) + (MAGIC)) - fp8_bits(MAGIC));               \
        int32_t code = a < (MIN_NORMAL_BITS) ? sub : nrm;                                          \
        uint32_t res = code > (MAX_CODE) ? (OVF) : (sign | (uint32_t)code);                        \
        return (uint8_t)(nan ? 0x7fu : res);                                                       \
    }
/* E4M3: drop 20 bits, 127 - 7 = 120 exponents, min normal 2^-6, quantum
 * 2^-9 (magic 2^14), max 448 = 0x43E00000, max code 0x7E, overflow NaN. */
TS_FP8_ENC(ts_fp8_enc_e4m3, 20, 120u << 3, 0x3C800000u, 16384.0f, 0x43E00000u, 0x7E, 0x7fu)
/* E5M2: drop 21 bits, 127 - 15 = 112, min normal 2^-14, quantum 2^-16
 * (magic 2^7), max 57344 = 0x47600000, max code 0x7B, overflow +-inf. */
TS_FP8_ENC(ts_fp8_enc_e5m2, 21, 112u << 2, 0x38800000u, 128.0f, 0x47600000u, 0x7B, sign | 0x7cu)

/* Exact decoding by bits: E5M2 is the top byte of an f16; E4M3 normals
 * rebias the exponent, subnormals are m * 2^-9. */
static inline float ts_fp8_dec_e4m3(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    if ((c & 0x7fu) == 0x7fu) return fp8_float(0x7fc00000u);
    float v = e ? fp8_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    return fp8_float(fp8_bits(v) | sign);
}
static inline float ts_fp8_dec_e5m2(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 2) & 0x1fu, m = c & 3u;
    float v;
    if (e == 31)
        v = m ? fp8_float(0x7fc00000u) : fp8_float(0x7f800000u);
    else
        v = e ? fp8_float(((e + 112u) << 23) | (m << 21)) : (float)m * 1.52587890625e-05f;
    return fp8_float(fp8_bits(v) | sign);
}

#endif
