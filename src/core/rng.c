/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11). Counter-based: the i-th number of a stream is a pure function
 * of (key, i), which is what makes dropout masks and initial weights
 * independent of thread count and evaluation order. */
#include <math.h>
#include "core.h"

void ts_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
    uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void ts_rand_uniform_f64_at(double *out, int64_t first, int64_t n, uint64_t key, double lo,
                            double hi) {
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        ts_philox(key, 0, (uint64_t)(first + i) / 4, r);
        for (int j = 0; j < 4 && i + j < n; j++) out[i + j] = lo + (hi - lo) * ts_u01(r[j]);
    }
}

void ts_rand_normal_f64_at(double *out, int64_t first, int64_t n, uint64_t key, double mean,
                           double std) {
    /* Box-Muller on pairs; u1 is kept away from 0 so log() is finite. */
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        ts_philox(key, 1, (uint64_t)(first + i) / 4, r);
        for (int j = 0; j < 4; j += 2) {
            double u1 = (ts_u01(r[j]) + 0.5 / 16777216.0), u2 = ts_u01(r[j + 1]);
            double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
            if (i + j < n) out[i + j] = mean + std * rad * cos(th);
            if (i + j + 1 < n) out[i + j + 1] = mean + std * rad * sin(th);
        }
    }
}

void ts_rand_uniform_f64(double *out, int64_t n, uint64_t key, double lo, double hi) {
    ts_rand_uniform_f64_at(out, 0, n, key, lo, hi);
}

void ts_rand_normal_f64(double *out, int64_t n, uint64_t key, double mean, double std) {
    ts_rand_normal_f64_at(out, 0, n, key, mean, std);
}
