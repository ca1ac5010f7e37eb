/* Reductions written with non-temporal stores (src/dist/reduce_stream.c):
 * the same bits as the ordinary fold for f32 and f64 sums at every length,
 * alignment and source count; nothing written for what they do not cover;
 * a shm reduce-scatter past the streaming threshold (forced low with
 * TESSEL_RED_STREAM_BYTES) gives every rank the exact left fold, on 2-4
 * ranks; and so does the shm all-reduce (which never streams: measured
 * slower, see docs/distributed.md) on odd sizes, with its buffers in the
 * segment (read in place) and outside it (staged). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "dist/comm.h"
#include "tessel/dist.h"

static double val(int rank, size_t i) {
    /* mixed magnitudes, so the order of the additions shows in the bits */
    uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    double m = (double)(h % 100000) / 1000.0 - 50.0;
    int e = (int)((h >> 20) % 40) - 20;
    return m * (e >= 0 ? (double)(1ull << (e > 30 ? 30 : e)) : 1.0 / (double)(1ull << -e));
}

static void fold_ref(void *dst, const void *const *srcs, int ns, size_t n, ts_dtype dt) {
    size_t esz = ts_dtype_size(dt);
    for (size_t e = 0; e < n; e += TS_RED_BLOCK) {
        size_t m = n - e < TS_RED_BLOCK ? n - e : TS_RED_BLOCK;
        const void *s[8];
        for (int k = 0; k < ns; k++) s[k] = (const char *)srcs[k] + e * esz;
        void *d[1] = {(char *)dst + e * esz};
        ts_red_fold_store(d, 1, s, ns, m, dt, TS_RED_SUM);
    }
}

static void test_bits(void) {
    const size_t lens[] = {0, 1, 7, 15, 16, 17, 63, 100, 1000, 4099, 100003};
    int cases = 0, bad = 0, taken = 0;
    for (int dti = 0; dti < 2; dti++) {
        ts_dtype dt = dti ? TS_F64 : TS_F32;
        size_t esz = ts_dtype_size(dt);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t n = lens[li];
            for (int ns = 2; ns <= 4; ns++) {
                for (int off = 0; off < 16; off += 5) {
                    unsigned char *buf[4], *want = malloc((n + 32) * esz),
                                           *got = malloc((n + 32) * esz);
                    const void *srcs[4];
                    for (int k = 0; k < ns; k++) {
                        buf[k] = malloc((n + 32) * esz);
                        for (size_t i = 0; i < n + 32; i++) {
                            double v = val(k, i);
                            if (dt == TS_F32) {
                                float f = (float)v;
                                memcpy(buf[k] + i * esz, &f, 4);
                            } else {
                                memcpy(buf[k] + i * esz, &v, 8);
                            }
                        }
                        srcs[k] = buf[k] + (size_t)(k * 3 % 5) * esz; /* unaligned sources too */
                    }
                    memset(got, 0xAB, (n + 32) * esz);
                    fold_ref(want, srcs, ns, n, dt);
                    int done =
                        ts_red_fold_stream(got + (size_t)off * esz, srcs, ns, n, dt, TS_RED_SUM);
                    taken += done;
                    if (done)
                        bad += memcmp(want, got + (size_t)off * esz, n * esz) != 0 ||
                               (off > 0 && got[0] != 0xAB) ||
                               got[(size_t)off * esz + n * esz] != 0xAB;
                    cases++;
                    for (int k = 0; k < ns; k++) free(buf[k]);
                    free(want);
                    free(got);
                }
            }
        }
    }
    CHECK(bad == 0, "%d of %d streamed folds differ from the ordinary fold", bad, cases);
    if (__builtin_cpu_supports("avx512f"))
        CHECK(taken == cases, "AVX-512: every f32/f64 sum streams (%d of %d)", taken, cases);
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, d[4] = {9, 9, 9, 9};
    const void *s2[2] = {a, b};
    CHECK(!ts_red_fold_stream(d, s2, 2, 4, TS_F32, TS_RED_MAX) && d[0] == 9,
          "max is not streamed and nothing is written");
    CHECK(!ts_red_fold_stream(d, s2, 2, 2, TS_BF16, TS_RED_SUM) && d[0] == 9,
          "bf16 is not streamed and nothing is written");
}

typedef struct shared {
    _Atomic int fails, checks;
} shared;
static shared *SH;

static int work(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    const size_t count = 300007;
    for (int shm = 0; shm < 2; shm++) {
        for (int dti = 0; dti < 2; dti++) {
            ts_dtype dt = dti ? TS_F64 : TS_F32;
            size_t esz = ts_dtype_size(dt), off, len;
            ts_comm_block(count, n, r, &off, &len);
            unsigned char *s = shm ? ts_comm_alloc(c, count * esz) : malloc(count * esz);
            unsigned char *d = malloc(len * esz + 1);
            for (size_t i = 0; i < count; i++) {
                double v = val(r, i);
                float f = (float)v;
                memcpy(s + i * esz, dt == TS_F32 ? (void *)&f : (void *)&v, esz);
            }
            ts_status st = ts_reduce_scatter(c, s, d, count, dt, TS_RED_SUM, TS_ALGO_NATIVE);
            size_t wrong = 0;
            for (size_t i = 0; i < len && st == TS_OK; i++) {
                if (dt == TS_F32) {
                    float acc = (float)val(0, off + i) + (float)val(1, off + i), got;
                    for (int q = 2; q < n; q++) acc += (float)val(q, off + i);
                    memcpy(&got, d + i * 4, 4);
                    wrong += memcmp(&acc, &got, 4) != 0;
                } else {
                    double acc = val(0, off + i) + val(1, off + i), got;
                    for (int q = 2; q < n; q++) acc += val(q, off + i);
                    memcpy(&got, d + i * 8, 8);
                    wrong += memcmp(&acc, &got, 8) != 0;
                }
            }
            if (st != TS_OK || wrong) {
                atomic_fetch_add(&SH->fails, 1);
                fprintf(stderr, "FAIL rank %d of %d, %s, shm=%d: %s, %zu wrong\n", r, n,
                        dti ? "f64" : "f32", shm, ts_last_error(), wrong);
            } else {
                atomic_fetch_add(&SH->checks, 1);
            }
            if (shm)
                ts_comm_free(c, s);
            else
                free(s);
            free(d);
        }
    }
    /* All-reduce of odd sizes, in place from the segment (shm=1) and
     * staged (shm=0): every rank gets the left fold in rank order. */
    const size_t counts[] = {1031, 300007};
    for (int shm = 0; shm < 2; shm++) {
        for (int dti = 0; dti < 2; dti++) {
            for (int ci = 0; ci < 2; ci++) {
                ts_dtype dt = dti ? TS_F64 : TS_F32;
                size_t esz = ts_dtype_size(dt), cnt = counts[ci];
                unsigned char *b = shm ? ts_comm_alloc(c, cnt * esz) : malloc(cnt * esz);
                for (size_t i = 0; i < cnt; i++) {
                    double v = val(r, i);
                    float f = (float)v;
                    memcpy(b + i * esz, dt == TS_F32 ? (void *)&f : (void *)&v, esz);
                }
                ts_status st = ts_allreduce(c, b, cnt, dt, TS_RED_SUM, TS_ALGO_NATIVE);
                size_t wrong = 0;
                for (size_t i = 0; i < cnt && st == TS_OK; i++) {
                    if (dt == TS_F32) {
                        float acc = (float)val(0, i) + (float)val(1, i), got;
                        for (int q = 2; q < n; q++) acc += (float)val(q, i);
                        memcpy(&got, b + i * 4, 4);
                        wrong += memcmp(&acc, &got, 4) != 0;
                    } else {
                        double acc = val(0, i) + val(1, i), got;
                        for (int q = 2; q < n; q++) acc += val(q, i);
                        memcpy(&got, b + i * 8, 8);
                        wrong += memcmp(&acc, &got, 8) != 0;
                    }
                }
                if (st != TS_OK || wrong) {
                    atomic_fetch_add(&SH->fails, 1);
                    fprintf(stderr,
                            "FAIL all-reduce rank %d of %d, %s, %zu, shm=%d: %s, %zu wrong\n", r, n,
                            dti ? "f64" : "f32", cnt, shm, ts_last_error(), wrong);
                } else {
                    atomic_fetch_add(&SH->checks, 1);
                }
                if (shm)
                    ts_comm_free(c, b);
                else
                    free(b);
            }
        }
    }
    return 0;
}

int main(void) {
    test_bits();
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    setenv("TESSEL_RED_STREAM_BYTES", "4096", 1); /* every reduce-scatter here streams */
    for (int n = 2; n <= 4; n++) {
        CHECK(ts_shm_launch(n, NULL, work, NULL, NULL) == TS_OK, "%d ranks: %s", n,
              ts_last_error());
        CHECK(atomic_load(&SH->fails) == 0, "%d ranks: %d failed", n, atomic_load(&SH->fails));
        CHECK(atomic_load(&SH->checks) == 12 * n, "%d ranks: %d of %d checked", n,
              atomic_load(&SH->checks), 12 * n);
        atomic_store(&SH->fails, 0);
        atomic_store(&SH->checks, 0);
    }
    CHECK(ts_red_stream_threshold() == 4096, "the threshold follows TESSEL_RED_STREAM_BYTES");
    return check_summary("dist_stream");
}
