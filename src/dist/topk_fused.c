/* topk_fused.c — the top-k start's pass over a bucket (compress.h,
 * ts_topk_accumulate_select): the error-feedback accumulation, the
 * residual's sum of squares and the collection of the entries above a
 * threshold estimated from a sample, in one pass, chunk by chunk; then the
 * exact selection among those candidates.
 *
 * Why: the radix select of ts_topk_select reads the whole residual three
 * times (two histograms, then the collection) after the accumulation has
 * read and written it once, so the start made four passes over every
 * gradient element, each at least as slow as the dense exchange's own work
 * on W3 (docs/distributed.md, "Gradient compression"). Here the
 * accumulation collects the candidates as it goes.
 *
 * Exactness: if at least k entries have a key >= t, the k-th largest key is
 * >= t, so every entry ts_topk_select would pick (the keys above the k-th
 * largest, and the lowest indices among those equal to it) is a candidate;
 * the candidates are collected in ascending index order, so selecting among
 * them with the same tie rule picks the same indices. When the sample
 * misleads (fewer than k candidates, or more than the scratch holds) the
 * full ts_topk_select runs on the updated residual: the same indices again,
 * only slower.
 *
 * Determinism: chunks of CHUNK elements are fixed by the bucket's size, not
 * the thread count; each chunk's sum of squares runs over 8 lanes in a fixed
 * order and the chunks' sums are added in chunk order, so the result is
 * the same with any number of threads and any of the clones below (ISO C
 * mode: no contraction to FMA). */
#include <math.h>
#include <string.h>
#include "dist/compress.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TOPK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TOPK_CLONES
#endif

enum {
    CHUNK = 16384, /* elements per chunk: the unit of threads and of the sums' order */
    LOCAL = 256,   /* candidates a chunk keeps on its own; more: it is scanned again */
    SAMPLE = 16384 /* residual entries the threshold is estimated from */
};

int64_t ts_topk_fused_cap(int64_t elems, int64_t k) {
    int64_t cap = 4 * k + 4096;
    return cap < elems ? cap : elems;
}

static int64_t n_chunks(int64_t elems) {
    return (elems + CHUNK - 1) / CHUNK;
}

size_t ts_topk_fused_scratch(int64_t elems, int64_t k) {
    const size_t nch = (size_t)n_chunks(elems), cap = (size_t)ts_topk_fused_cap(elems, k);
    return sizeof(uint32_t) * 2 * TS_TOPK_HIST + nch * (sizeof(double) + sizeof(uint32_t)) +
           nch * LOCAL * sizeof(uint32_t) + cap * (sizeof(uint32_t) + sizeof(float)) +
           SAMPLE * sizeof(float);
}

/* r += (g * inv) * c (through u = m u + that with momentum correction) over
 * n elements; lanes[l] += r^2 of the elements l, l + 8, ... The products by
 * inv and c are exact no-ops when they are 1, so the arithmetic is that of
 * the loop it replaces, bit for bit. */
TOPK_CLONES static void update(const float *g, float *r, float *u, int64_t n, float inv, float c,
                               float m, double *lanes) {
    int64_t i = 0;
    if (u)
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) {
                const float v = m * u[i + l] + (g[i + l] * inv) * c;
                u[i + l] = v;
                const float ri = r[i + l] + v;
                r[i + l] = ri;
                lanes[l] += (double)ri * (double)ri;
            }
    else
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) {
                const float ri = r[i + l] + (g[i + l] * inv) * c;
                r[i + l] = ri;
                lanes[l] += (double)ri * (double)ri;
            }
    for (; i < n; i++) {
        float v = (g[i] * inv) * c;
        if (u) v = u[i] = m * u[i] + v;
        r[i] += v;
        lanes[i & 7] += (double)r[i] * (double)r[i];
    }
}

/* The indices i in [lo, hi) with ts_topk_key(r[i]) >= t, ascending: the first
 * LOCAL into local; returns how many there are. Blocks of 16 are first
 * tested as a whole (vectorised; the candidates are few). */
TOPK_CLONES static uint32_t collect(const float *r, int64_t lo, int64_t hi, uint32_t t,
                                    uint32_t *local) {
    uint32_t cnt = 0;
    for (int64_t i = lo; i < hi; i += 16) {
        if (i + 16 <= hi) {
            int any = 0;
            for (int j = 0; j < 16; j++) any |= ts_topk_key(r[i + j]) >= t;
            if (!any) continue;
        }
        for (int64_t j = i; j < i + 16 && j < hi; j++)
            if (ts_topk_key(r[j]) >= t) {
                if (cnt < LOCAL) local[cnt] = (uint32_t)j;
                cnt++;
            }
    }
    return cnt;
}

/* The gradient segment holding flat index lo: *seg, and its first index *base. */
static void seg_of(const ts_topk_accum *a, int64_t lo, int *seg, int64_t *base) {
    int s = 0;
    int64_t b = 0;
    while (s < a->n_seg - 1 && lo >= b + a->len[s]) b += a->len[s++];
    *seg = s;
    *base = b;
}

/* Chunk ch: accumulate, its sum of squares, and its candidates (key >= t)
 * into local (the first LOCAL of them; the count may be larger). */
static void chunk_pass(const ts_topk_accum *a, int64_t ch, uint32_t t, double *sum, uint32_t *count,
                       uint32_t *local) {
    const int64_t lo = ch * CHUNK, hi = lo + CHUNK < a->elems ? lo + CHUNK : a->elems;
    double lanes[8] = {0};
    int s;
    int64_t base;
    seg_of(a, lo, &s, &base);
    for (int64_t i = lo; i < hi; s++) { /* the segments the chunk overlaps */
        const int64_t end = base + a->len[s] < hi ? base + a->len[s] : hi;
        update(a->g[s] + (i - base), a->res + i, a->vel ? a->vel + i : NULL, end - i, a->inv,
               a->clip_scale, a->momentum, lanes);
        base += a->len[s];
        i = end;
    }
    *count = collect(a->res, lo, hi, t, local);
    *sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* A key t that about 2k entries of the accumulated residual reach, from
 * SAMPLE entries, one in each stride (computed as the pass will compute
 * them, without writing); 0 with no sample (small buckets, large k): then
 * every entry is a candidate and the full selection runs. */
static uint32_t sample_threshold(const ts_topk_accum *a, int64_t k, int64_t cap, uint32_t *hist,
                                 float *samp, uint32_t *sel) {
    const int64_t n = a->elems, stride = n / SAMPLE;
    if (stride < 4) return 0;
    const int64_t j = (int64_t)ceil(2.0 * (double)k * SAMPLE / (double)n) + 8;
    /* the expected candidates, j * stride, with room for the sample's error */
    if (j >= SAMPLE / 2 || (double)j * (double)stride * 1.5 > (double)cap) return 0;
    int s = 0;
    int64_t base = 0;
    for (int64_t q = 0; q < SAMPLE; q++) {
        /* one entry of each stride, at a hashed offset: a fixed stride
         * would meet a matrix's columns always at the same few */
        uint64_t h = (uint64_t)q * 0x9e3779b97f4a7c15u;
        h ^= h >> 29;
        const int64_t i = q * stride + (int64_t)(h % (uint64_t)stride);
        while (i >= base + a->len[s]) base += a->len[s++];
        float v = (a->g[s][i - base] * a->inv) * a->clip_scale;
        if (a->vel) v = a->momentum * a->vel[i] + v;
        samp[q] = a->res[i] + v;
    }
    ts_topk_select(samp, SAMPLE, j, hist, sel);
    uint32_t t = UINT32_MAX;
    for (int64_t q = 0; q < j; q++)
        if (ts_topk_key(samp[sel[q]]) < t) t = ts_topk_key(samp[sel[q]]);
    return t;
}

double ts_topk_accumulate_select(const ts_topk_accum *a, int64_t k, void *scratch, uint32_t *idx,
                                 int64_t *searched) {
    const int64_t n = a->elems, nch = n_chunks(n), cap = ts_topk_fused_cap(n, a->k_final);
    uint32_t *hist = scratch;
    double *sums = (double *)(hist + 2 * TS_TOPK_HIST);
    uint32_t *counts = (uint32_t *)(sums + nch), *local = counts + nch;
    uint32_t *cand = local + (size_t)nch * LOCAL;
    float *vals = (float *)(cand + cap), *samp = vals + cap;
    if (k > n) k = n;
    /* no threshold (t above every key): nothing collected, the full select */
    uint32_t t = 2 * k <= cap ? sample_threshold(a, k, cap, hist, samp, cand) : 0;
    const int sampled = t > 0;
    if (!sampled) t = UINT32_MAX;
#pragma omp parallel for schedule(static) if (n >= 4 * CHUNK)
    for (int64_t ch = 0; ch < nch; ch++)
        chunk_pass(a, ch, t, &sums[ch], &counts[ch], local + (size_t)ch * LOCAL);
    double total = 0;
    int64_t nc = 0;
    for (int64_t ch = 0; ch < nch; ch++) {
        total += sums[ch];
        nc += counts[ch];
    }
    if (sampled && nc >= k && nc <= cap) {
        int64_t m = 0;
        for (int64_t ch = 0; ch < nch; ch++) {
            if (counts[ch] <= LOCAL) {
                memcpy(cand + m, local + (size_t)ch * LOCAL, sizeof(uint32_t) * counts[ch]);
                m += counts[ch];
                continue;
            }
            const int64_t lo = ch * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
            for (int64_t i = lo; i < hi; i++) /* more than LOCAL: scanned again */
                if (ts_topk_key(a->res[i]) >= t) cand[m++] = (uint32_t)i;
        }
        for (int64_t j = 0; j < nc; j++) vals[j] = a->res[cand[j]];
        ts_topk_select(vals, nc, k, hist, idx);
        for (int64_t j = 0; j < k; j++) idx[j] = cand[idx[j]];
    } else {
        ts_topk_select(a->res, n, k, hist, idx);
        nc = n;
    }
    if (searched) *searched = nc;
    return total;
}
