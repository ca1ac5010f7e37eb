/* psgd_products.c — PowerSGD's products, vectorised across outputs (see the header). W3 on 2
 * processes: PowerSGD's own time a step 205 -> ~30 ms against plain loops (docs/distributed.md). */
#include "psgd_products.h"

#include <omp.h>
#include <string.h>
#include "kern.h"

/* acc [r][MQ_ROWS] += at [w][MQ_ROWS] b [w, r]: per column l and factor column j one vector over
 * the rows, in increasing l. Inlined with the common ranks as constants, so that acc stays in
 * registers. */
enum { MQ_ROWS = 8, MQ_COLS = 512, MQ_SLOTS = 64 };
static inline __attribute__((always_inline)) void mq_acc(double (*acc)[MQ_ROWS], const float *at,
                                                         const float *b, int64_t w, const int r) {
    for (int64_t l = 0; l < w; l++) {
        const float *al = at + l * MQ_ROWS, *bl = b + l * r;
        for (int j = 0; j < r; j++) {
            const double bj = bl[j];
#pragma omp simd
            for (int k = 0; k < MQ_ROWS; k++) acc[j][k] += (double)al[k] * bj;
        }
    }
}

/* c [n, r] = a [n, m] b [m, r] for MQ_ROWS rows from i0 (fewer at the end): MQ_COLS columns at a
 * time copied column by column into at [MQ_COLS][MQ_ROWS] (scratch, in L1), then summed into
 * acc, every output over l = 0, 1, ... With g, a += unscale_clip(g) first, on the way (the
 * error feedback: one pass over a fewer). */
TS_CLONES static void mq_rows(float *a, const float *g, float inv, float cl, const float *b,
                              float *c, float *at, int64_t i0, int64_t rows, int64_t m, int r) {
    double acc[64][MQ_ROWS];
    for (int j = 0; j < r; j++)
        for (int k = 0; k < MQ_ROWS; k++) acc[j][k] = 0;
    for (int64_t l0 = 0; l0 < m; l0 += MQ_COLS) {
        const int64_t w = m - l0 < MQ_COLS ? m - l0 : MQ_COLS;
        for (int64_t k = 0; g && k < rows; k++) { /* row by row: the loops vectorise */
            float *ak = a + (i0 + k) * m + l0;
            const float *gk = g + (i0 + k) * m + l0;
            if (inv == 1.0f && cl == 1.0f)
#pragma omp simd
                for (int64_t l = 0; l < w; l++) ak[l] += gk[l];
            else
#pragma omp simd
                for (int64_t l = 0; l < w; l++) ak[l] += ts_psgd_unscale_clip(gk[l], inv, cl);
        }
        for (int64_t l = 0; l < w; l++)
            for (int64_t k = 0; k < MQ_ROWS; k++)
                at[l * MQ_ROWS + k] = k < rows ? a[(i0 + k) * m + l0 + l] : 0;
        const float *bl = b + l0 * r;
        if (r == 4)
            mq_acc(acc, at, bl, w, 4);
        else if (r == 2)
            mq_acc(acc, at, bl, w, 2);
        else if (r == 1)
            mq_acc(acc, at, bl, w, 1);
        else
            mq_acc(acc, at, bl, w, r);
    }
    for (int64_t k = 0; k < rows; k++)
        for (int j = 0; j < r; j++) c[(i0 + k) * r + j] = (float)acc[j][k];
}

/* at: MQ_ROWS x MQ_COLS floats (at most m columns) for each of MQ_SLOTS threads at most. */
size_t ts_psgd_mq_scratch_bytes(int64_t m) {
    return sizeof(float) * (size_t)(MQ_SLOTS * MQ_ROWS * (m < MQ_COLS ? m : MQ_COLS));
}

void ts_psgd_mq(float *a, const float *g, float inv, float cl, const float *b, float *c, float *at,
                int64_t n, int64_t m, int r) {
    const int64_t nblk = (n + MQ_ROWS - 1) / MQ_ROWS, cols = m < MQ_COLS ? m : MQ_COLS;
    const int nt = omp_get_max_threads() < MQ_SLOTS ? omp_get_max_threads() : MQ_SLOTS;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * m >= TS_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t i0 = blk * MQ_ROWS;
        mq_rows(a, g, inv, cl, b, c, at + (size_t)omp_get_thread_num() * MQ_ROWS * cols, i0,
                n - i0 < MQ_ROWS ? n - i0 : MQ_ROWS, m, r);
    }
}

/* acc [r][TN_COLS] += a[:, l0 .. l0 + w)^T b over every row of a, in row order: rows in chunks
 * that stay in L1, and per chunk and factor column j the block's sums held in registers (a
 * whole block) while the chunk's rows go by. */
enum { TN_COLS = 32, TN_ROWS = 64 };
TS_CLONES static void tn_block(const float *a, const float *b, double *acc, int64_t n, int64_t m,
                               int r, int64_t l0, int64_t w) {
    for (int64_t i0 = 0; i0 < n; i0 += TN_ROWS) {
        const int64_t i1 = i0 + TN_ROWS < n ? i0 + TN_ROWS : n;
        for (int j = 0; j < r; j++) {
            double *aj = acc + j * TN_COLS;
            if (w == TN_COLS) {
                double t[TN_COLS];
                for (int l = 0; l < TN_COLS; l++) t[l] = aj[l];
                for (int64_t i = i0; i < i1; i++) {
                    const float *ai = a + i * m + l0;
                    const double bij = b[i * r + j];
#pragma omp simd
                    for (int l = 0; l < TN_COLS; l++) t[l] += (double)ai[l] * bij;
                }
                for (int l = 0; l < TN_COLS; l++) aj[l] = t[l];
            } else {
                for (int64_t i = i0; i < i1; i++) {
                    const float *ai = a + i * m + l0;
                    const double bij = b[i * r + j];
                    for (int64_t l = 0; l < w; l++) aj[l] += (double)ai[l] * bij;
                }
            }
        }
    }
}

/* c [m, r] = a^T b, a [n, m], b [n, r]: blocks of TN_COLS columns of a in parallel, each
 * reading its columns of every row in order, so a is read row-wise and every sum runs over
 * i = 0, 1, ... */
void ts_psgd_mtp(const float *a, const float *b, float *c, int64_t n, int64_t m, int r) {
    const int64_t nblk = (m + TN_COLS - 1) / TN_COLS;
#pragma omp parallel for schedule(static) if (n * m >= TS_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        double acc[64 * TN_COLS];
        const int64_t l0 = blk * TN_COLS, w = l0 + TN_COLS < m ? TN_COLS : m - l0;
        memset(acc, 0, sizeof(double) * (size_t)(r * TN_COLS));
        tn_block(a, b, acc, n, m, r, l0, w);
        for (int64_t l = 0; l < w; l++)
            for (int j = 0; j < r; j++) c[(l0 + l) * r + j] = (float)acc[j * TN_COLS + l];
    }
}

/* One row x of g = P Q^T and M -= g: P's row p [r], Q transposed, qt [r][m]; returns the row's
 * sum of the new M^2 (in lanes: only that norm's last bits depend on the variant). Each v starts
 * at 0 and takes the r products in order, as a scalar loop would (0 + -0 is +0: the same zeros). */
TS_CLONES static double approx_row(const float *p, const float *qt, float *g, float *M, int64_t m,
                                   int r) {
    enum { YC = 256 };
    double rr = 0, v[YC];
    for (int64_t y0 = 0; y0 < m; y0 += YC) {
        const int64_t w = m - y0 < YC ? m - y0 : YC;
        for (int64_t y = 0; y < w; y++) v[y] = 0;
        for (int j = 0; j < r; j++) {
            const double pj = p[j];
            const float *qj = qt + j * m + y0;
#pragma omp simd
            for (int64_t y = 0; y < w; y++) v[y] += pj * (double)qj[y];
        }
        float *gy = g + y0, *My = M + y0;
#pragma omp simd reduction(+ : rr)
        for (int64_t y = 0; y < w; y++) {
            const float gv = (float)v[y], mv = My[y] - gv;
            gy[y] = gv;
            My[y] = mv;
            rr += (double)mv * (double)mv;
        }
    }
    return rr;
}

/* g = P Q^T, M -= g (what the factors missed); returns the sum of the new M^2. qt: Q
 * transposed [r][m]. */
double ts_psgd_approx(const float *P, const float *qt, float *g, float *M, int64_t n, int64_t m,
                      int r) {
    double res = 0;
#pragma omp parallel for schedule(static) reduction(+ : res) if (n * m >= TS_PAR_MIN)
    for (int64_t x = 0; x < n; x++)
        /* per row, then rows added in the reduction: only the norm's last bits may vary with
           threads, never g or M */
        res += approx_row(P + x * r, qt, g + x * m, M + x * m, m, r);
    return res;
}
