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
        !(nm->cbase = ts_alloc(k * sizeof *nm->cbase, "gradient norm")) ||
        !(nm->fed = ts_alloc(k * sizeof *nm->fed, "gradient norm")))
        return TS_ERR_NOMEM;
    for (int i = 0; i < n; i++) nm->fed[i] = -1;
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
        nm->in[nm->nin] = pl[j].i, nm->off[nm->nin] = pl[j].off, nm->cbase[nm->nin] = nm->nchunks;
        nm->fed[pl[j].i] = nm->nin++;
        nm->nchunks += (t[pl[j].i].n + TS_REPRO_NORM_CHUNK - 1) / TS_REPRO_NORM_CHUNK;
        end = pl[j].off + t[pl[j].i].n;
    }
    free(pl);
    if (!(nm->own = ts_zalloc((nm->nchunks ? nm->nchunks : 1) * sizeof *nm->own, "gradient norm")))
        return TS_ERR_NOMEM;
    nm->part = nm->own;
    return TS_OK;
}

/* Feeds x[a, b) (region offsets) of fed tensor j, which starts at s and ends at e: each piece
 * of a chunk goes into the open chunk's lanes, and a chunk's lanes are stored once it is
 * complete. */
static void feed(ts_repro_norm *nm, int j, const float *x, size_t a, size_t b) {
    const size_t s = nm->off[j], e = s + nm->t[nm->in[j]].n;
    while (a < b) {
        const size_t c = (a - s) / TS_REPRO_NORM_CHUNK;
        const size_t ce =
            s + (c + 1) * TS_REPRO_NORM_CHUNK < e ? s + (c + 1) * TS_REPRO_NORM_CHUNK : e;
        const size_t pe = b < ce ? b : ce;
        lanes(nm->open, x, s, a, pe);
        if (pe == ce) {
            memcpy(nm->part[nm->cbase[j] + c], nm->open, sizeof nm->open);
            memset(nm->open, 0, sizeof nm->open);
        }
        a = pe;
    }
}

void ts_repro_norm_block(ts_repro_norm *nm, const float *block, size_t off, size_t len) {
    const float *x = block - off; /* indexed from the region's start */
    const size_t end = off + len;
    while (nm->cur < nm->nin && nm->off[nm->cur] + nm->t[nm->in[nm->cur]].n <= off) nm->cur++;
    for (int j = nm->cur; j < nm->nin && nm->off[j] < end; j++) {
        const size_t s = nm->off[j], e = s + nm->t[nm->in[j]].n;
        feed(nm, j, x, s > off ? s : off, e < end ? e : end);
    }
}

void ts_repro_norm_reset(ts_repro_norm *nm) {
    memset(nm->open, 0, sizeof nm->open);
    nm->cur = 0;
}

/* acc = the lanes of n floats at x, chunk by chunk (those of a tensor the blocks do not feed). */
static void tensor_lanes(double acc[8], const float *x, size_t n) {
    for (size_t c = 0; c < n; c += TS_REPRO_NORM_CHUNK) {
        double ch[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        lanes(ch, x, 0, c, n - c < TS_REPRO_NORM_CHUNK ? n : c + TS_REPRO_NORM_CHUNK);
        for (int l = 0; l < 8; l++) acc[l] += ch[l];
    }
}

double ts_repro_norm_result(ts_repro_norm *nm) {
    double sum = 0;
    for (int i = 0; i < nm->n; i++) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const size_t nch = (nm->t[i].n + TS_REPRO_NORM_CHUNK - 1) / TS_REPRO_NORM_CHUNK;
        if (nm->fed[i] < 0) tensor_lanes(acc, nm->t[i].data, nm->t[i].n);
        for (size_t c = 0; nm->fed[i] >= 0 && c < nch; c++)
            for (int l = 0; l < 8; l++) acc[l] += nm->part[nm->cbase[nm->fed[i]] + c][l];
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

size_t ts_repro_norm_chunks(const ts_repro_norm *nm) {
    return nm->nchunks;
}

void ts_repro_norm_share(ts_repro_norm *nm, double (*part)[8]) {
    nm->part = part ? part : nm->own;
}

size_t ts_repro_norm_cut(const ts_repro_norm *nm, size_t x) {
    for (int j = 0; j < nm->nin; j++) {
        const size_t s = nm->off[j], e = s + nm->t[nm->in[j]].n;
        if (x <= s || x >= e) continue;
        const size_t c =
            s + (x - s + TS_REPRO_NORM_CHUNK - 1) / TS_REPRO_NORM_CHUNK * TS_REPRO_NORM_CHUNK;
        return c < e ? c : e;
    }
    return x;
}

void ts_repro_norm_free(ts_repro_norm *nm) {
    if (!nm) return;
    free(nm->in);
    free(nm->off);
    free(nm->cbase);
    free(nm->own);
    free(nm->fed);
    memset(nm, 0, sizeof *nm);
}
