/* reduce_stream.c — a reduction that writes its result with non-temporal
 * stores, for outputs larger than the last-level cache.
 *
 * A reduce-scatter writes its output without reading it first. An ordinary
 * store to a line that is not cached reads the line from memory before
 * overwriting it (read-for-ownership); with 2 ranks that is a third more
 * memory traffic per rank (read two halves, write one, read the one it
 * writes). Past the LLC the output cannot stay cached anyway, so it goes
 * straight to memory with streaming stores. An in-place all-reduce past
 * the LLC likewise streams its result into every rank's buffer: the lines
 * it writes would only be written back later, evicting what the next
 * elements need. The arithmetic is the same left fold, element by element,
 * as ts_red_fold_store: the same bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dist/comm.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* One LLC instance, from sysfs (this CPU's cache of the highest level);
 * sysconf's figure can be the sum over the host's instances (a VM here
 * reported 320 MiB for its 32 MiB L3). 32 MiB when neither is known. */
static size_t llc_bytes(void) {
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            double v = strtod(buf, &end);
            if (*end == 'K') v *= 1024;
            if (*end == 'M') v *= 1048576;
            if (v > (double)best) best = (size_t)v;
        }
        fclose(f);
    }
    if (best) return best;
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? (size_t)l3 : (size_t)32 << 20;
}

size_t ts_red_stream_threshold(void) {
    static size_t cached;
    if (cached) return cached;
    /* TESSEL_RED_STREAM_BYTES: another threshold (tests take both paths). */
    const char *e = getenv("TESSEL_RED_STREAM_BYTES");
    long long v = e && *e ? atoll(e) : 0;
    cached = v > 0 ? (size_t)v : llc_bytes();
    return cached;
}

#if defined(__x86_64__)
/* One kernel per vector width and dtype. acc = ((s0 + s1) + s2) + ...,
 * element by element (plain adds: nothing to contract into an FMA), then
 * streamed to every destination. The lines before the first 64-byte
 * boundary of d[0] and the tail are done in scalar code with ordinary
 * stores; every destination shares d[0]'s offset within a line (the
 * caller checks), so the vector stores are aligned in all of them. A
 * destination may be a source (in-place all-reduce): each vector is read
 * from every source before it is written anywhere. */
#define FOLD_NT(NAME, TGT, T, V, W, LOAD, ADD, STREAM)                                             \
    __attribute__((target(TGT))) static void NAME(T *const *d, int nd, const T *const *s, int ns,  \
                                                  size_t n) {                                      \
        size_t i = 0;                                                                              \
        for (; i < n && ((uintptr_t)(d[0] + i) & 63); i++) {                                       \
            T acc = s[0][i] + s[1][i];                                                             \
            for (int k = 2; k < ns; k++) acc += s[k][i];                                           \
            for (int j = 0; j < nd; j++) d[j][i] = acc;                                            \
        }                                                                                          \
        for (; i + W <= n; i += W) {                                                               \
            V acc = ADD(LOAD(s[0] + i), LOAD(s[1] + i));                                           \
            for (int k = 2; k < ns; k++) acc = ADD(acc, LOAD(s[k] + i));                           \
            for (int j = 0; j < nd; j++) STREAM(d[j] + i, acc);                                    \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            T acc = s[0][i] + s[1][i];                                                             \
            for (int k = 2; k < ns; k++) acc += s[k][i];                                           \
            for (int j = 0; j < nd; j++) d[j][i] = acc;                                            \
        }                                                                                          \
        /* Streaming stores are not ordered with ordinary ones: fence them                         \
         * before the barrier that tells the peers the result is there. */                         \
        _mm_sfence();                                                                              \
    }
FOLD_NT(fold_f32_nt512, "avx512f", float, __m512, 16, _mm512_loadu_ps, _mm512_add_ps,
        _mm512_stream_ps)
FOLD_NT(fold_f64_nt512, "avx512f", double, __m512d, 8, _mm512_loadu_pd, _mm512_add_pd,
        _mm512_stream_pd)
FOLD_NT(fold_f32_nt256, "avx2", float, __m256, 8, _mm256_loadu_ps, _mm256_add_ps, _mm256_stream_ps)
FOLD_NT(fold_f64_nt256, "avx2", double, __m256d, 4, _mm256_loadu_pd, _mm256_add_pd,
        _mm256_stream_pd)
#endif

int ts_red_fold_stream_all(void *const *dsts, int ndst, const void *const *srcs, int nsrc, size_t n,
                           ts_dtype dt, ts_reduce_op op) {
#if defined(__x86_64__)
    if (op != TS_RED_SUM || nsrc < 2 || nsrc > 256 || ndst < 1 || ndst > 256 ||
        (dt != TS_F32 && dt != TS_F64))
        return 0;
    for (int j = 1; j < ndst; j++)
        if (((uintptr_t)dsts[j] & 63) != ((uintptr_t)dsts[0] & 63)) return 0;
    int wide = __builtin_cpu_supports("avx512f");
    if (!wide && !__builtin_cpu_supports("avx2")) return 0;
    if (dt == TS_F32) {
        float *const *d = (float *const *)dsts;
        const float *const *s = (const float *const *)srcs;
        if (wide)
            fold_f32_nt512(d, ndst, s, nsrc, n);
        else
            fold_f32_nt256(d, ndst, s, nsrc, n);
    } else {
        double *const *d = (double *const *)dsts;
        const double *const *s = (const double *const *)srcs;
        if (wide)
            fold_f64_nt512(d, ndst, s, nsrc, n);
        else
            fold_f64_nt256(d, ndst, s, nsrc, n);
    }
    return 1;
#else
    (void)dsts, (void)ndst, (void)srcs, (void)nsrc, (void)n, (void)dt, (void)op;
    return 0;
#endif
}

int ts_red_fold_stream(void *dst, const void *const *srcs, int nsrc, size_t n, ts_dtype dt,
                       ts_reduce_op op) {
    void *d[1] = {dst};
    return ts_red_fold_stream_all(d, 1, srcs, nsrc, n, dt, op);
}
