/* The top-k start's fused pass (ts_topk_accumulate_select,
 * src/dist/topk_fused.c) against the loop and selection it replaced: the
 * same residual and velocity bits, the same indices (ties to the lower
 * index), on buckets of several tensors whose magnitudes differ by
 * tensor (the candidates crowd into some chunks), with and without
 * momentum correction, loss-scale and clipping factors, for the final k
 * and the warm-up's larger ones (the full select), and with ties; the sum
 * of squares close to a plain double sum and the same bits on 1 and 2
 * threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "dist/compress.h"

enum { NSEG = 3 };

/* The accumulation before the fused pass (src/ops/compress.c until
 * session 14), then ts_topk_select. */
static void reference(const ts_topk_accum *a, int64_t k, uint32_t *hist, uint32_t *idx) {
    int64_t o = 0;
    for (int s = 0; s < a->n_seg; s++) {
        const float *g = a->g[s];
        for (int64_t i = 0; i < a->len[s]; i++) {
            float gi = a->inv == 1.0f ? g[i] : g[i] * a->inv;
            if (a->clip_scale != 1.0f) gi = gi * a->clip_scale;
            if (a->vel) gi = a->vel[o + i] = a->momentum * a->vel[o + i] + gi;
            a->res[o + i] += gi;
        }
        o += a->len[s];
    }
    ts_topk_select(a->res, a->elems, k, hist, idx);
}

static void fill(float *x, int64_t n, float scale, int ties, unsigned *seed) {
    for (int64_t i = 0; i < n; i++) {
        float r = (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
        if (ties) r = (float)(rand_r(seed) % 9 - 4) * 0.125f;
        x[i] = r * scale;
    }
}

static void check_case(int64_t elems, int momentum, int ties, float inv, float c, double ratio) {
    const int64_t len[NSEG] = {elems / 5, elems / 2, elems - elems / 5 - elems / 2};
    const float scales[NSEG] = {0.01f, 1.0f, 30.0f};
    unsigned seed = 7u + (unsigned)elems + 3u * (unsigned)momentum + 11u * (unsigned)ties;
    float *g[NSEG];
    float *res0 = malloc(sizeof(float) * (size_t)elems),
          *vel0 = malloc(sizeof(float) * (size_t)elems);
    float *res[2], *vel[2];
    for (int s = 0; s < NSEG; s++) {
        g[s] = malloc(sizeof(float) * (size_t)len[s]);
        fill(g[s], len[s], scales[s], ties, &seed);
    }
    fill(res0, elems, 2.0f, ties, &seed);
    fill(vel0, elems, 1.0f, ties, &seed);
    const int64_t kf = ts_topk_k(elems, ratio);
    const size_t scratch_bytes = ts_topk_fused_scratch(elems, kf);
    void *scratch = malloc(scratch_bytes);
    static uint32_t hist[2 * TS_TOPK_HIST];
    uint32_t *want = malloc(sizeof(uint32_t) * (size_t)elems),
             *got = malloc(sizeof(uint32_t) * (size_t)elems);
    const int64_t ks[] = {kf, ts_topk_k(elems, 0.25), kf + 1};
    for (int ki = 0; ki < 3; ki++) {
        const int64_t k = ks[ki];
        double sums[2];
        for (int v = 0; v < 2; v++) { /* 0: the reference, 1: the fused pass */
            res[v] = malloc(sizeof(float) * (size_t)elems);
            vel[v] = malloc(sizeof(float) * (size_t)elems);
            memcpy(res[v], res0, sizeof(float) * (size_t)elems);
            memcpy(vel[v], vel0, sizeof(float) * (size_t)elems);
            ts_topk_accum a = {.g = (const float *const *)g,
                               .len = len,
                               .n_seg = NSEG,
                               .res = res[v],
                               .vel = momentum ? vel[v] : NULL,
                               .elems = elems,
                               .inv = inv,
                               .clip_scale = c,
                               .momentum = 0.9f,
                               .k_final = kf};
            if (v == 0) {
                reference(&a, k, hist, want);
                continue;
            }
            for (int th = 0; th < 2; th++) { /* 1 and 2 threads: the same bits */
                omp_set_num_threads(th + 1);
                if (th) {
                    memcpy(res[v], res0, sizeof(float) * (size_t)elems);
                    memcpy(vel[v], vel0, sizeof(float) * (size_t)elems);
                }
                int64_t searched = 0;
                const double s = ts_topk_accumulate_select(&a, k, scratch, got, &searched);
                /* the final k of a large bucket: one pass and the candidates, unless
                 * ties at the threshold outnumber what the scratch holds */
                if (k <= kf + 1 && elems > (1 << 18) && !ties)
                    CHECK(searched >= k && searched <= ts_topk_fused_cap(elems, kf),
                          "%lld elements, k %lld: selected among %lld candidates", (long long)elems,
                          (long long)k, (long long)searched);
                if (th) CHECK(!memcmp(&s, &sums[0], sizeof s), "sum of squares on 1 and 2 threads");
                sums[th] = s;
            }
        }
        double plain = 0;
        for (int64_t i = 0; i < elems; i++) plain += (double)res[0][i] * (double)res[0][i];
        CHECK(!memcmp(res[0], res[1], sizeof(float) * (size_t)elems) &&
                  (!momentum || !memcmp(vel[0], vel[1], sizeof(float) * (size_t)elems)),
              "%lld elements, momentum %d, ties %d, k %lld: residual and velocity bits",
              (long long)elems, momentum, ties, (long long)k);
        CHECK(!memcmp(want, got, sizeof(uint32_t) * (size_t)k),
              "%lld elements, momentum %d, ties %d, k %lld: the indices of ts_topk_select",
              (long long)elems, momentum, ties, (long long)k);
        CHECK(fabs(sums[0] - plain) <= 1e-12 * plain, "sum of squares %.17g vs %.17g", sums[0],
              plain);
        for (int v = 0; v < 2; v++) {
            free(res[v]);
            free(vel[v]);
        }
    }
    free(want);
    free(got);
    free(scratch);
    free(res0);
    free(vel0);
    for (int s = 0; s < NSEG; s++) free(g[s]);
}

int main(void) {
    check_case(1000, 0, 0, 1.0f, 1.0f, 0.01);     /* small: no sample, the full select */
    check_case(1 << 20, 0, 0, 1.0f, 1.0f, 0.001); /* sampled */
    check_case(1 << 20, 1, 0, 0.5f, 0.75f, 0.001);
    check_case((1 << 20) + 13, 1, 1, 1.0f, 1.0f, 0.001); /* ties across the threshold */
    check_case(3 << 20, 0, 0, 1.0f, 0.5f, 0.0001);
    return check_summary("compress_fused");
}
