/* bench_shm_fold — the parts of a 2-rank shm reduce-scatter, each timed
 * alone and side by side with the whole collective (issue #26): what
 * bounds the 64 KiB reduce-scatter at about 65 % of the copy ceiling.
 *
 *     build/bench_shm_fold [BYTES] [--rewrite]     (default 65536)
 *
 * Two shm ranks, one per CPU, in the segment as `tessel bench collectives`
 * runs them. Each line is one variant, both ranks running it at once; the
 * variants alternate batch by batch (200 calls a batch, 60 batches each),
 * and the line shows the fastest batch's and the median batch's time per
 * call, in microseconds:
 *
 *   reduce_scatter   ts_reduce_scatter, shm direct (the collective)
 *   syncs            two ts_barrier calls (what the collective meets)
 *   fold+syncs       barrier, the fold, barrier (the collective rebuilt)
 *   fold             ts_red_fold_store over this rank's block of both
 *                    inputs into its output (the collective's work)
 *   loads            the same block's inputs only read (no output)
 *   memcpy_message   memcpy of BYTES between two page-aligned private
 *                    buffers: the copy ceiling's operation
 *   copy_block_rep   memcpy (rep movsb) of the block: writes lines
 *                    without reading them first
 *   copy_block_vec   the same copy with 64-byte vector stores: each
 *                    written line is read first (AVX-512 machines)
 *   (timer)          nothing
 *
 * A batch is timed as a whole. --rewrite: each rank rewrites the part of
 * its input its peer reads before every call of every variant (what a
 * training step does), so the peer's lines come from the other core's
 * cache; each call is then timed alone, and `(timer)` shows what the two
 * clock reads add to every line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "dist/comm.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { BATCH = 200, BATCHES = 60, NVAR = 9 };
static const char *const names[NVAR] = {"reduce_scatter", "syncs",          "fold+syncs",
                                        "fold",           "loads",          "memcpy_message",
                                        "copy_block_rep", "copy_block_vec", "(timer)"};

typedef struct job {
    size_t bytes;
    int rewrite;
    double *us; /* [rank][variant][batch], in a MAP_SHARED mapping */
} job;

typedef struct bufs {
    float *in[2]; /* both ranks' inputs, in the segment (read in place) */
    float *out;   /* this rank's output */
    unsigned char *x, *y;
    size_t block; /* floats in each rank's block */
} bufs;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float sink;

static void loads(const float *a, const float *b, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 32 <= n; i += 32) { /* one float of each 64-byte line */
        s0 += a[i];
        s1 += b[i];
        s2 += a[i + 16];
        s3 += b[i + 16];
    }
    sink += s0 + s1 + s2 + s3;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static int copy_vec(float *d, const float *s, size_t n) {
    if (!__builtin_cpu_supports("avx512f")) return 0;
    for (size_t i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
    return 1;
}
#else
static int copy_vec(float *d, const float *s, size_t n) {
    (void)d, (void)s, (void)n;
    return 0;
}
#endif

/* One call of variant v on this rank; 0 when the machine cannot run it. */
static int call(ts_comm *c, const job *j, const bufs *B, int v, ts_status *st) {
    int me = ts_comm_rank(c);
    size_t n = B->block, count = j->bytes / sizeof(float);
    const void *srcs[2] = {B->in[0] + me * n, B->in[1] + me * n};
    void *dst[1] = {B->out};
    switch (v) {
    case 0:
        *st = ts_reduce_scatter(c, B->in[me], B->out, count, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE);
        break;
    case 1:
    case 2:
        if ((*st = ts_barrier(c)) != TS_OK) return 1;
        if (v == 2)
            for (size_t e = 0; e < n; e += TS_RED_BLOCK) {
                size_t m = n - e < TS_RED_BLOCK ? n - e : TS_RED_BLOCK;
                const void *s[2] = {(const float *)srcs[0] + e, (const float *)srcs[1] + e};
                void *d[1] = {B->out + e};
                ts_red_fold_store(d, 1, s, 2, m, TS_F32, TS_RED_SUM);
            }
        *st = ts_barrier(c);
        break;
    case 3:
        for (size_t e = 0; e < n; e += TS_RED_BLOCK) {
            size_t m = n - e < TS_RED_BLOCK ? n - e : TS_RED_BLOCK;
            const void *s[2] = {(const float *)srcs[0] + e, (const float *)srcs[1] + e};
            dst[0] = B->out + e;
            ts_red_fold_store(dst, 1, s, 2, m, TS_F32, TS_RED_SUM);
        }
        break;
    case 4: loads(srcs[0], srcs[1], n); break;
    case 5: memcpy(B->y, B->x, j->bytes); break;
    case 6: memcpy(B->out, srcs[me], n * sizeof(float)); break;
    case 7: return copy_vec(B->out, srcs[me], n);
    default: break; /* nothing: what the clock reads add with --rewrite */
    }
    __asm__ volatile("" : : : "memory"); /* every copy happens */
    return 1;
}

static int worker(ts_comm *c, void *user) {
    job *j = user;
    int me = ts_comm_rank(c);
    size_t count = j->bytes / sizeof(float);
    bufs B = {.block = count / 2};
    float *mine = ts_comm_alloc(c, j->bytes);
    B.out = ts_comm_alloc(c, j->bytes / 2 + 64);
    /* Page-aligned, as the ceiling's large buffers are at one offset from
     * each other: two back-to-back malloc blocks sit 16 bytes apart modulo
     * 64, which made this copy a third slower. */
    void *x = NULL, *y = NULL;
    if (posix_memalign(&x, 4096, j->bytes) || posix_memalign(&y, 4096, j->bytes)) return 1;
    B.x = x, B.y = y;
    if (!mine || !B.out) return 1;
    for (size_t i = 0; i < count; i++) mine[i] = (float)(i % 7) * 1e-3f;
    memset(B.out, 0, j->bytes / 2), memset(B.x, 1, j->bytes), memset(B.y, 2, j->bytes);
    /* The segment sits at the same address in every rank. */
    uintptr_t at[2], p = (uintptr_t)mine;
    if (ts_allgather(c, &p, at, 2, TS_I64, TS_ALGO_AUTO) != TS_OK) return 1;
    B.in[0] = (float *)at[0], B.in[1] = (float *)at[1];
    float *theirs_part = mine + (1 - me) * B.block; /* the part of my input the peer reads */
    ts_status st = TS_OK;
    for (int b = 0; b < BATCHES; b++)
        for (int v = 0; v < NVAR; v++) {
            double t = 0, t0 = 0;
            if (ts_barrier(c) != TS_OK) return 1;
            for (int k = -2; k < BATCH; k++) { /* two warm-up calls */
                if (j->rewrite) {              /* then each call is timed alone */
                    for (size_t i = 0; i < B.block; i += 16) theirs_part[i] += 0.0f;
                    if (ts_barrier(c) != TS_OK) return 1;
                }
                if (j->rewrite || k == 0) t0 = now_s();
                if (!call(c, j, &B, v, &st)) break;
                if (st != TS_OK) return 1;
                if (j->rewrite && k >= 0) t += now_s() - t0;
            }
            if (!j->rewrite) t = now_s() - t0;
            j->us[((size_t)me * NVAR + (size_t)v) * BATCHES + (size_t)b] = t / BATCH * 1e6;
        }
    return 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    job j = {.bytes = 65536};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rewrite"))
            j.rewrite = 1;
        else
            j.bytes = strtoull(argv[i], NULL, 0);
    }
    if (j.bytes < 4096 || j.bytes % 128) {
        fprintf(stderr, "bench_shm_fold: BYTES must be a multiple of 128, at least 4096\n");
        return 2;
    }
    size_t n = 2 * NVAR * BATCHES;
    j.us =
        mmap(NULL, n * sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j.us == MAP_FAILED) return 1;
    ts_shm_options o = {.cpus_per_rank = 1};
    if (ts_shm_launch(2, &o, worker, &j, NULL) != TS_OK) {
        fprintf(stderr, "bench_shm_fold: %s\n", ts_last_error());
        return 1;
    }
    printf("bench_shm_fold: %zu bytes, 2 shm ranks%s; us per call, fastest / median batch "
           "(rank 0, rank 1)\n",
           j.bytes, j.rewrite ? ", inputs rewritten before every call" : "");
    for (int v = 0; v < NVAR; v++) {
        printf("%-16s", names[v]);
        for (int r = 0; r < 2; r++) {
            double *u = j.us + ((size_t)r * NVAR + (size_t)v) * BATCHES;
            qsort(u, BATCHES, sizeof *u, cmp);
            if (u[BATCHES - 1] <= 0)
                printf("  %15s", "-");
            else
                printf("  %6.3f / %6.3f", u[0], u[BATCHES / 2]);
        }
        printf("\n");
    }
    return 0;
}
