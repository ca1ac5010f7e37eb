/* The logged gradient norm of dist.reproducible (src/session/repro_norm.h), fed block by block
 * as the tree's last pass writes the gradient region, gives the bits of the plain per-tensor
 * pass it replaced (eight lanes per tensor counted from its start, lanes in order, tensors in
 * name order) for any block sizes, tensors of any length and offset, gaps between them, and
 * tensors outside the region or overlapping another. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"
#include "session/repro_norm.h"

enum { REGION = 20000, NT = 7 };

static float region[REGION], outside[37];

/* The pass of session 11's ts_repro_grad_norm, the reference. */
static double reference(const ts_plan_fwd_state *t, int n) {
    double sum = 0;
    for (int k = 0; k < n; k++) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const float *g = t[k].data;
        size_t i = 0;
        for (; i + 8 <= t[k].n; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)g[i + l] * g[i + l];
        for (int l = 0; i < t[k].n; i++, l++) acc[l] += (double)g[i] * g[i];
        double part = 0;
        for (int l = 0; l < 8; l++) part += acc[l];
        sum += part;
    }
    return sqrt(sum);
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
                  "blocks of %zu floats (round %d): the bits of the per-tensor pass", blocks[b],
                  round);
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
    /* The old pass's arithmetic is not a plain left fold: a different order shows in the bits
     * (so the comparisons above can fail). */
    double fold = 0;
    for (int k = 0; k < NT; k++)
        for (size_t i = 0; i < t[k].n; i++) fold += (double)t[k].data[i] * t[k].data[i];
    CHECK(!same(sqrt(fold), want), "a left fold over the elements differs in the bits");
    ts_repro_norm_free(&nm);
    return check_summary("repro_norm");
}
