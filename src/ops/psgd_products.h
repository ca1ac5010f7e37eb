/* psgd_products.h — PowerSGD's three products over a compressed gradient (internal to
 * src/ops/psgd.c; tests/unit/psgd_products.c checks them).
 *
 * M is a gradient viewed as a matrix [n, m] (row-major, f32), r its rank (1 to 64), P [n, r]
 * and Q [m, r] its factors; each step of psgd.c runs, per compressed gradient:
 *
 *     // M += unscale_clip(g) (the error feedback; g NULL: M as it is), then P = M Q;
 *     // at: ts_psgd_mq_scratch_bytes(m) bytes
 *     ts_psgd_mq(M, g, inv, c, Q, P, at, n, m, r);
 *     ts_psgd_mtp(M, P, Q, n, m, r);              // Q = M^T P
 *     // g = P Q^T and M -= g, qt: Q transposed [r][m]; res: the sum of the new M^2
 *     double res = ts_psgd_approx(P, qt, g, M, n, m, r);
 *
 * Every output is one sum in double over its terms in increasing index (l for P, i for Q, j
 * for g), each term a product of two floats widened to double (exact) added by itself: a
 * multiply, then an add, never fused (ISO C: no contraction). So the outputs are the bits of
 * the plain loops whatever the thread count or the TS_CLONES variant; the loops only choose
 * which outputs share a vector. Only res, a metric, is summed in lanes and rows (its last
 * bits may vary with the variant and the threads).
 */
#ifndef TS_PSGD_PRODUCTS_H
#define TS_PSGD_PRODUCTS_H

#include <stddef.h>
#include <stdint.h>

/* Scratch of ts_psgd_mq for matrices up to m columns (any thread count). */
size_t ts_psgd_mq_scratch_bytes(int64_t m);

/* A gradient value unscaled (inv: 1 / loss scale) and clipped (c), in that order; a factor of 1
 * is skipped (exact either way, and cheaper). */
static inline float ts_psgd_unscale_clip(float g, float inv, float c) {
    const float gu = inv == 1.0f ? g : g * inv;
    return c == 1.0f ? gu : gu * c;
}

void ts_psgd_mq(float *M, const float *g, float inv, float c, const float *Q, float *P, float *at,
                int64_t n, int64_t m, int r);
void ts_psgd_mtp(const float *M, const float *P, float *Q, int64_t n, int64_t m, int r);
double ts_psgd_approx(const float *P, const float *qt, float *g, float *M, int64_t n, int64_t m,
                      int r);

#endif
