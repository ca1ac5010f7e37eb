/* reduce_stream.c — a reduction that writes its result with non-temporal
 * stores, for outputs larger than the last-level cache.
 *
 * A reduce-scatter writes its output without reading it first. An ordinary
 * store to a line that is not cached reads the line from memory before
 * overwriting it (read-for-ownership); with 2 ranks that is a third more
 * memory traffic per rank (read two halves, write one, read the one it
 * writes). Past the LLC the output cannot stay cached anyway, so it goes
 * straight to memory with streaming stores. The arithmetic is the same
 * left fold, element by element, as ts_red_fold_store: the same bits. */
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
__attribute__((target("avx512f"))) static void fold_f32_nt(float *d, const float *const *s, int ns,
                                                           size_t n) {
    size_t i = 0;
    for (; i < n && ((uintptr_t)(d + i) & 63); i++) { /* up to a 64-byte line */
        float acc = s[0][i] + s[1][i];
        for (int k = 2; k < ns; k++) acc += s[k][i];
        d[i] = acc;
    }
    for (; i + 16 <= n; i += 16) {
        __m512 acc = _mm512_add_ps(_mm512_loadu_ps(s[0] + i), _mm512_loadu_ps(s[1] + i));
        for (int k = 2; k < ns; k++) acc = _mm512_add_ps(acc, _mm512_loadu_ps(s[k] + i));
        _mm512_stream_ps(d + i, acc);
    }
    for (; i < n; i++) {
        float acc = s[0][i] + s[1][i];
        for (int k = 2; k < ns; k++) acc += s[k][i];
        d[i] = acc;
    }
    /* Streaming stores are not ordered with ordinary ones: fence them
     * before the barrier that tells the peers the result is there. */
    _mm_sfence();
}

__attribute__((target("avx512f"))) static void fold_f64_nt(double *d, const double *const *s,
                                                           int ns, size_t n) {
    size_t i = 0;
    for (; i < n && ((uintptr_t)(d + i) & 63); i++) {
        double acc = s[0][i] + s[1][i];
        for (int k = 2; k < ns; k++) acc += s[k][i];
        d[i] = acc;
    }
    for (; i + 8 <= n; i += 8) {
        __m512d acc = _mm512_add_pd(_mm512_loadu_pd(s[0] + i), _mm512_loadu_pd(s[1] + i));
        for (int k = 2; k < ns; k++) acc = _mm512_add_pd(acc, _mm512_loadu_pd(s[k] + i));
        _mm512_stream_pd(d + i, acc);
    }
    for (; i < n; i++) {
        double acc = s[0][i] + s[1][i];
        for (int k = 2; k < ns; k++) acc += s[k][i];
        d[i] = acc;
    }
    _mm_sfence();
}
#endif

/* AVX-512 machines only. On an AVX2-only AMD EPYC VM, AVX2 versions of
 * these kernels (streaming 32-byte vectors) made 64-256 MiB reduce-scatters
 * 1.5x slower and in-place all-reduces (streaming into both ranks' buffers)
 * 2.2x slower than ordinary stores, medians of three alternated runs (issue
 * #26 notes in docs/distributed.md), so there the ordinary fold runs. */
int ts_red_fold_stream(void *dst, const void *const *srcs, int nsrc, size_t n, ts_dtype dt,
                       ts_reduce_op op) {
#if defined(__x86_64__)
    if (op != TS_RED_SUM || nsrc < 2 || nsrc > 64 || (dt != TS_F32 && dt != TS_F64) ||
        !__builtin_cpu_supports("avx512f"))
        return 0;
    if (dt == TS_F32)
        fold_f32_nt(dst, (const float *const *)srcs, nsrc, n);
    else
        fold_f64_nt(dst, (const double *const *)srcs, nsrc, n);
    return 1;
#else
    (void)dst, (void)srcs, (void)nsrc, (void)n, (void)dt, (void)op;
    return 0;
#endif
}
