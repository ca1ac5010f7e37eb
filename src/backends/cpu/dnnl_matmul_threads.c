/* dnnl_matmul_threads.c — probe whether a matmul's bits depend on the thread count (see the
 * header). */
#include "backends/cpu/dnnl_matmul_threads.h"

#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/half.h"

/* ---- verdict cache --------------------------------------------------------- */

typedef struct probe_key {
    ts_mm_desc d; /* label cleared */
    int nthr;
    char impl[64];
} probe_key;

#define PROBE_CACHE_MAX 1024
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static probe_key g_keys[PROBE_CACHE_MAX];
static int g_verdicts[PROBE_CACHE_MAX];
static int g_count;

static void make_key(probe_key *k, const ts_mm *m, int nthr) {
    memset(k, 0, sizeof *k); /* padding too: keys are compared with memcmp */
    const ts_mm_desc *d = ts_mm_get_desc(m);
    k->d.a_dt = d->a_dt;
    k->d.b_dt = d->b_dt;
    k->d.c_dt = d->c_dt;
    k->d.batch = d->batch;
    k->d.M = d->M;
    k->d.N = d->N;
    k->d.K = d->K;
    k->d.trans_a = d->trans_a;
    k->d.trans_b = d->trans_b;
    k->d.a_broadcast = d->a_broadcast;
    k->d.b_broadcast = d->b_broadcast;
    k->d.accumulate = d->accumulate;
    k->d.n_post = d->n_post;
    for (int p = 0; p < d->n_post && p < 4; p++) k->d.post[p] = d->post[p];
    k->nthr = nthr;
    snprintf(k->impl, sizeof k->impl, "%s", ts_mm_impl(m));
}

static int cache_find(const probe_key *k) {
    int v = -1;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count && v < 0; i++)
        if (memcmp(&g_keys[i], k, sizeof *k) == 0) v = g_verdicts[i];
    pthread_mutex_unlock(&g_lock);
    return v;
}

static void cache_put(const probe_key *k, int verdict) {
    pthread_mutex_lock(&g_lock);
    if (g_count < PROBE_CACHE_MAX) { /* a full cache only means probing again */
        g_keys[g_count] = *k;
        g_verdicts[g_count++] = verdict;
    }
    pthread_mutex_unlock(&g_lock);
}

/* ---- the probe ------------------------------------------------------------- */

/* Fill n elements of dtype dt with values in [-1, 1) from a fixed xorshift stream. */
static void fill(void *buf, ts_dtype dt, int64_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float v = (float)(x >> 40) * (1.0f / 8388608.0f) - 1.0f;
        if (dt == TS_F32)
            ((float *)buf)[i] = v;
        else if (dt == TS_BF16)
            ((uint16_t *)buf)[i] = ts_f32_to_bf16(v);
        else
            ((uint16_t *)buf)[i] = ts_f32_to_f16(v);
    }
}

/* Run m into c (reset from c0 first) under `threads` OpenMP threads, restoring the setting. */
static ts_status run_under(ts_mm *m, int threads, const void *a, const void *b, const void *c0,
                           void *c, size_t cbytes, const void *const *post, void *scratch) {
    memcpy(c, c0, cbytes);
    int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    ts_status s = ts_mm_run_post(m, a, b, c, post, scratch);
    omp_set_num_threads(prev);
    return s;
}

int ts_mm_probe_wanted(const ts_mm *m, int nthr) {
    const ts_mm_desc *d = ts_mm_get_desc(m);
    if (nthr <= 1 || omp_in_parallel()) return 0; /* one thread either way */
    const int64_t na = (d->a_broadcast ? 1 : d->batch) * d->M * d->K;
    const int64_t nb = (d->b_broadcast ? 1 : d->batch) * d->K * d->N;
    const int64_t nc = d->batch * d->M * d->N;
    if (na > TS_MM_PROBE_MAX_ELEMS || nb > TS_MM_PROBE_MAX_ELEMS || nc > TS_MM_PROBE_MAX_ELEMS)
        return 0;
    /* AMX kernels block K by the creating thread count at any size (see the header) */
    if (strstr(ts_mm_impl(m), "amx")) return 1;
    return d->M * d->N <= TS_MM_PROBE_MAX_MACS / d->K &&
           d->batch <= TS_MM_PROBE_MAX_MACS / (d->M * d->N * d->K);
}

int ts_mm_probe_cached(const ts_mm *m, int nthr) {
    probe_key key;
    make_key(&key, m, nthr);
    return cache_find(&key);
}

ts_status ts_mm_probe_threads(ts_mm *mt, ts_mm *m1, int nthr, int *sensitive) {
    *sensitive = 0;
    const ts_mm_desc *d = ts_mm_get_desc(mt);
    const int64_t na = (d->a_broadcast ? 1 : d->batch) * d->M * d->K;
    const int64_t nb = (d->b_broadcast ? 1 : d->batch) * d->K * d->N;
    const int64_t nc = d->batch * d->M * d->N;
    const size_t cbytes = (size_t)nc * ts_dtype_size(d->c_dt);
    size_t sbytes = ts_mm_scratch_bytes(mt);
    if (ts_mm_scratch_bytes(m1) > sbytes) sbytes = ts_mm_scratch_bytes(m1);
    void *a = ts_aligned_alloc((size_t)na * ts_dtype_size(d->a_dt), "matmul thread probe");
    void *b = ts_aligned_alloc((size_t)nb * ts_dtype_size(d->b_dt), "matmul thread probe");
    void *c0 = ts_aligned_alloc(cbytes, "matmul thread probe");
    void *c[3] = {ts_aligned_alloc(cbytes, "matmul thread probe"),
                  ts_aligned_alloc(cbytes, "matmul thread probe"),
                  ts_aligned_alloc(cbytes, "matmul thread probe")};
    void *scratch = sbytes ? ts_aligned_alloc(sbytes, "matmul thread probe") : NULL;
    float *post_buf[4] = {0};
    const void *post[4] = {0};
    ts_status s = TS_OK;
    if (!a || !b || !c0 || !c[0] || !c[1] || !c[2] || (sbytes && !scratch)) s = TS_ERR_NOMEM;
    for (int p = 0; s == TS_OK && p < d->n_post; p++) {
        /* a bias needs [N], an add C's shape: C's size serves both */
        post_buf[p] = ts_aligned_alloc((size_t)nc * sizeof(float), "matmul thread probe");
        if (!post_buf[p])
            s = TS_ERR_NOMEM;
        else
            fill(post_buf[p], TS_F32, nc, 5 + (uint64_t)p);
        post[p] = post_buf[p];
    }
    if (s == TS_OK) {
        fill(a, d->a_dt, na, 1);
        fill(b, d->b_dt, nb, 2);
        fill(c0, d->c_dt, nc, 3);
        /* the one-thread bits; the plan's primitive on its threads and on one (a run inside a
         * parallel region, or under a lower setting) */
        s = run_under(m1, 1, a, b, c0, c[0], cbytes, post, scratch);
        if (s == TS_OK) s = run_under(mt, nthr, a, b, c0, c[1], cbytes, post, scratch);
        if (s == TS_OK) s = run_under(mt, 1, a, b, c0, c[2], cbytes, post, scratch);
        if (s == TS_OK) {
            *sensitive = memcmp(c[0], c[1], cbytes) != 0 || memcmp(c[0], c[2], cbytes) != 0;
            probe_key key;
            make_key(&key, mt, nthr);
            cache_put(&key, *sensitive);
        }
    }
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(c0);
    for (int i = 0; i < 3; i++) ts_aligned_free(c[i]);
    ts_aligned_free(scratch);
    for (int p = 0; p < 4; p++) ts_aligned_free(post_buf[p]);
    if (s == TS_ERR_NOMEM) ts_error_prefix("matmul '%s': thread probe", d->label ? d->label : "?");
    return s;
}
