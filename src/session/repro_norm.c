/* The logged gradient norm of dist.reproducible, fed as the gradients are written. See
 * repro_norm.h. */
#include "session/repro_norm.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

/* Element-wise in lanes, no reassociation: every target_clones variant gives the same bits (ISO C
 * mode: no FMA contraction). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define NORM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NORM_CLONES
#endif

/* acc[(i - start) mod 8] += x[i]^2 for i in [lo, hi), in order of i (x indexed from the region). */
NORM_CLONES static void lanes(double acc[8], const float *x, size_t start, size_t lo, size_t hi) {
    size_t i = lo;
    for (; i < hi && (i - start) % 8; i++) acc[(i - start) % 8] += (double)x[i] * x[i];
    double a[8];
    memcpy(a, acc, sizeof a);
    for (; i + 8 <= hi; i += 8)
        for (int l = 0; l < 8; l++) a[l] += (double)x[i + l] * x[i + l];
    memcpy(acc, a, sizeof a);
    for (; i < hi; i++) acc[(i - start) % 8] += (double)x[i] * x[i];
}

typedef struct placed {
    size_t off; /* in the region */
    int i;      /* index into t */
} placed;

static int by_offset(const void *a, const void *b) {
    const placed *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

ts_status ts_repro_norm_init(ts_repro_norm *nm, const ts_plan_fwd_state *t, int n,
                             const float *region, size_t nregion) {
    if (!nm || (n && !t)) return ts_fail(TS_ERR_INVALID, "repro_norm: NULL argument");
    memset(nm, 0, sizeof *nm);
    nm->t = t, nm->n = n, nm->region = region, nm->nregion = nregion;
    const size_t k = n ? (size_t)n : 1;
    if (!(nm->in = ts_alloc(k * sizeof *nm->in, "gradient norm")) ||
        !(nm->off = ts_alloc(k * sizeof *nm->off, "gradient norm")) ||
        !(nm->acc = ts_zalloc(k * sizeof *nm->acc, "gradient norm")) ||
        !(nm->fed = ts_zalloc(k, "gradient norm")))
        return TS_ERR_NOMEM;
    placed *pl = ts_alloc(k * sizeof *pl, "gradient norm");
    if (!pl) return TS_ERR_NOMEM;
    int np = 0;
    const uintptr_t lo = (uintptr_t)region, hi = lo + nregion * sizeof(float);
    for (int i = 0; i < n; i++) {
        const uintptr_t a = (uintptr_t)t[i].data, b = a + t[i].n * sizeof(float);
        if (region && a >= lo && b <= hi && (a - lo) % sizeof(float) == 0)
            pl[np].off = (size_t)(t[i].data - region), pl[np++].i = i;
    }
    qsort(pl, (size_t)np, sizeof *pl, by_offset);
    /* Blocks are matched to tensors by a cursor over offsets: a tensor overlapping the one
     * before it is read from its own memory instead (ts_repro_norm_result). */
    size_t end = 0;
    for (int j = 0; j < np; j++) {
        if (nm->nin && pl[j].off < end) continue;
        nm->in[nm->nin] = pl[j].i, nm->off[nm->nin++] = pl[j].off;
        nm->fed[pl[j].i] = 1;
        end = pl[j].off + t[pl[j].i].n;
    }
    free(pl);
    return TS_OK;
}

void ts_repro_norm_block(ts_repro_norm *nm, const float *block, size_t off, size_t len) {
    const float *x = block - off; /* indexed from the region's start */
    const size_t end = off + len;
    while (nm->cur < nm->nin && nm->off[nm->cur] + nm->t[nm->in[nm->cur]].n <= off) nm->cur++;
    for (int j = nm->cur; j < nm->nin && nm->off[j] < end; j++) {
        const size_t s = nm->off[j], e = s + nm->t[nm->in[j]].n;
        lanes(nm->acc[nm->in[j]], x, s, s > off ? s : off, e < end ? e : end);
    }
}

void ts_repro_norm_reset(ts_repro_norm *nm) {
    for (int i = 0; i < nm->n; i++) memset(nm->acc[i], 0, sizeof nm->acc[i]);
    nm->cur = 0;
}

double ts_repro_norm_result(ts_repro_norm *nm) {
    double sum = 0;
    for (int i = 0; i < nm->n; i++) {
        double outside[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const double *acc = nm->fed[i] ? nm->acc[i] : outside;
        if (!nm->fed[i]) lanes(outside, nm->t[i].data, 0, 0, nm->t[i].n);
        double part = 0;
        for (int l = 0; l < 8; l++) part += acc[l];
        sum += part;
    }
    return sqrt(sum);
}

double ts_repro_norm_now(ts_repro_norm *nm) {
    ts_repro_norm_reset(nm);
    if (nm->nregion) ts_repro_norm_block(nm, nm->region, 0, nm->nregion);
    return ts_repro_norm_result(nm);
}

void ts_repro_norm_free(ts_repro_norm *nm) {
    if (!nm) return;
    free(nm->in);
    free(nm->off);
    free(nm->acc);
    free(nm->fed);
    memset(nm, 0, sizeof *nm);
}
