/* The logged gradient norm of dist.reproducible (src/session/repro_norm.h), fed block by block
 * as the tree's last pass writes the gradient region, gives the bits of a plain per-tensor pass
 * (chunks of TS_REPRO_NORM_CHUNK counted from each tensor's start, eight lanes per chunk, the
 * chunks' lanes in order, lanes in order, tensors in name order) for any block sizes, tensors
 * of any length and offset, gaps between them, and tensors outside the region or overlapping
 * another; and so does the region split into slices cut by ts_repro_norm_cut, each fed by its
 * own norm into one shared array of chunk lanes, for any number of slices. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "session/repro_norm.h"

enum { REGION = 20000, NT = 7 };

static float region[REGION], outside[37];

/* The plain pass, the reference. */
static double reference(const ts_plan_fwd_state *t, int n) {
    double sum = 0;
    for (int k = 0; k < n; k++) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const float *g = t[k].data;
        for (size_t c = 0; c < t[k].n; c += TS_REPRO_NORM_CHUNK) {
            const size_t e = t[k].n - c < TS_REPRO_NORM_CHUNK ? t[k].n : c + TS_REPRO_NORM_CHUNK;
            double ch[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (size_t i = c; i < e; i++) ch[(i - c) % 8] += (double)g[i] * g[i];
            for (int l = 0; l < 8; l++) acc[l] += ch[l];
        }
        double part = 0;
        for (int l = 0; l < 8; l++) part += acc[l];
        sum += part;
    }
    return sqrt(sum);
}

/* The region fed in nslices slices by as many norms sharing one array of chunk lanes, the
 * slices of an even split cut by ts_repro_norm_cut (cut 0: as they are), each slice in blocks
 * of 1000 floats; the result as the first norm takes it. */
static double split(const ts_plan_fwd_state *t, int n, int nslices, int cut) {
    enum { MAXS = 8 };
    ts_repro_norm nm[MAXS];
    CHECK_OK(ts_repro_norm_init(&nm[0], t, n, region, REGION));
    double(*part)[8] = calloc(ts_repro_norm_chunks(&nm[0]), sizeof *part);
    for (int q = 0; q < nslices; q++) {
        if (q) CHECK_OK(ts_repro_norm_init(&nm[q], t, n, region, REGION));
        ts_repro_norm_share(&nm[q], part);
        ts_repro_norm_reset(&nm[q]);
    }
    for (int q = nslices - 1; q >= 0; q--) { /* any order: each writes its own chunks */
        size_t lo = (size_t)REGION * (size_t)q / (size_t)nslices,
               hi = (size_t)REGION * (size_t)(q + 1) / (size_t)nslices;
        if (cut) lo = ts_repro_norm_cut(&nm[q], lo), hi = ts_repro_norm_cut(&nm[q], hi);
        for (size_t off = lo; off < hi; off += 1000)
            ts_repro_norm_block(&nm[q], region + off, off, hi - off < 1000 ? hi - off : 1000);
    }
    const double v = ts_repro_norm_result(&nm[0]);
    for (int q = 0; q < nslices; q++) ts_repro_norm_free(&nm[q]);
    free(part);
    return v;
}

static uint64_t rnd = 88172645463325252ULL;
static uint64_t next(void) {
    rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
    return rnd;
}

/* Values from 2^-20 to 2^20 of both signs: the order of the additions shows in the bits. */
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = next();
        x[i] = (r & 1 ? -1.0f : 1.0f) * (1.0f + (float)(r >> 40) / 16777216.0f) *
               ldexpf(1.0f, (int)((r >> 8) % 41) - 20);
    }
}

static int same(double a, double b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

int main(void) {
    fill(region, REGION);
    fill(outside, 37);
    /* By name; offsets neither sorted nor multiples of 8, a gap, lengths of every residue. */
    const ts_plan_fwd_state t[NT] = {
        {"a", region + 5003, 4096}, {"b", region + 3, 17},   {"c", region + 20, 4977},
        {"d", outside, 37},         {"e", region + 9100, 7}, {"f", region + 9107, 10893},
        {"g", region + 9110, 5}, /* overlaps f: read on its own */
    };
    const double want = reference(t, NT);
    ts_repro_norm nm;
    CHECK_OK(ts_repro_norm_init(&nm, t, NT, region, REGION));
    const size_t blocks[] = {1, 3, 8, 64, 777, 2048, REGION};
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
        for (int round = 0; round < 2; round++) { /* a reset forgets the previous step */
            ts_repro_norm_reset(&nm);
            for (size_t off = 0; off < REGION; off += blocks[b]) {
                const size_t len = REGION - off < blocks[b] ? REGION - off : blocks[b];
                ts_repro_norm_block(&nm, region + off, off, len);
            }
            CHECK(same(ts_repro_norm_result(&nm), want),
                  "blocks of %zu floats (round %d): the bits of the plain pass", blocks[b], round);
        }
    }
    /* Blocks of random sizes. */
    for (int trial = 0; trial < 20; trial++) {
        ts_repro_norm_reset(&nm);
        for (size_t off = 0, len; off < REGION; off += len) {
            len = 1 + next() % 3000;
            if (len > REGION - off) len = REGION - off;
            ts_repro_norm_block(&nm, region + off, off, len);
        }
        CHECK(same(ts_repro_norm_result(&nm), want), "random blocks (trial %d)", trial);
    }
    CHECK(same(ts_repro_norm_now(&nm), want), "ts_repro_norm_now: the same bits");
    for (int ns = 1; ns <= 7; ns++)
        CHECK(same(split(t, NT, ns, 1), want), "%d slices cut at chunks: the same bits", ns);
    /* Slices cut inside a chunk lose part of it (the comparisons above can fail). */
    CHECK(!same(split(t, NT, 3, 0), want), "slices cut inside chunks differ");
    /* Cuts: inside a tensor to its next chunk's start, else where they are. */
    CHECK(ts_repro_norm_cut(&nm, 9107 + 5) == 9107 + TS_REPRO_NORM_CHUNK &&
              ts_repro_norm_cut(&nm, 9107 + TS_REPRO_NORM_CHUNK) == 9107 + TS_REPRO_NORM_CHUNK &&
              ts_repro_norm_cut(&nm, 5003 + 4095) == 5003 + 4096 && ts_repro_norm_cut(&nm, 1) == 1,
          "ts_repro_norm_cut");
    /* The pass's arithmetic is not a plain left fold: a different order shows in the bits
     * (so the comparisons above can fail). */
    double fold = 0;
    for (int k = 0; k < NT; k++)
        for (size_t i = 0; i < t[k].n; i++) fold += (double)t[k].data[i] * t[k].data[i];
    CHECK(!same(sqrt(fold), want), "a left fold over the elements differs in the bits");
    ts_repro_norm_free(&nm);
    return check_summary("repro_norm");
}
