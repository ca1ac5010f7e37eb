/* Example orders: the split's and the loader's permutations, each a pure
 * function of (seed, purpose, epoch) so any position of any epoch can be
 * recomputed from scratch (that is what makes ts_loader_seek exact).
 *
 * Fisher-Yates driven by Philox words shuffles in-memory data sets. Two
 * ways avoid touching every example before the first batch of a large
 * corpus (a 4 GB token file at ctx 256 holds 7.8 M windows):
 *
 * - The validation part of a split is the last n_val entries of that
 *   Fisher-Yates permutation, and drawing from the top fixes p[n-1] first:
 *   the first n_val swaps, tracked in a small hash table of the displaced
 *   entries, give exactly those entries. The training part is the
 *   complement, in order. Same split as the full permutation, bit for bit.
 *
 * - A keyed bijection (a Feistel network over the smallest even power of
 *   two >= n, walking cycles back into [0, n)) maps a position in an epoch
 *   to an example in O(1) and no memory; token windows are shuffled so. */
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

/* ---- Philox word streams --------------------------------------------------- */

/* The stream of 32-bit words ts_philox(key, hi, 0), ts_philox(key, hi, 1),
 * ..., four words per call, consumed in order. */
typedef struct word_stream {
    uint64_t key, hi, ctr;
    uint32_t w[4];
    int used;
} word_stream;

static uint64_t next64(word_stream *ws) {
    uint64_t r = 0;
    for (int k = 0; k < 2; k++) {
        if (ws->used == 4) {
            ts_philox(ws->key, ws->hi, ws->ctr++, ws->w);
            ws->used = 0;
        }
        r = (r << 32) | ws->w[ws->used++];
    }
    return r;
}

/* Uniform in [0, bound) without modulo bias: 64-bit draws below the largest
 * multiple of bound are kept (a rejection happens with probability
 * < bound / 2^64, so practically never, but the result stays exact). */
static uint64_t below(word_stream *ws, uint64_t bound) {
    const uint64_t reject_under = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t r = next64(ws);
        if (r >= reject_under) return r % bound;
    }
}

uint64_t ts_order_key(uint64_t seed, uint64_t purpose) {
    /* Bytes serialised little-endian so the key does not depend on the host. */
    uint8_t b[16];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(seed >> (8 * i));
    for (int i = 0; i < 8; i++) b[8 + i] = (uint8_t)(purpose >> (8 * i));
    return ts_hash64(b, sizeof b, 0);
}

void ts_order_permute(int64_t *p, int64_t n, uint64_t key, uint64_t hi) {
    word_stream ws = {.key = key, .hi = hi, .ctr = 0, .used = 4};
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(&ws, (uint64_t)i + 1);
        int64_t t = p[i];
        p[i] = p[j], p[j] = t;
    }
}

/* ---- the last entries of a Fisher-Yates permutation ---------------------- */

/* Open addressing from position to its current value; a position absent
 * from the table still holds itself. */
typedef struct moved {
    int64_t *pos, *val; /* pos -1: empty slot */
    size_t mask;
} moved;

static size_t slot(const moved *m, int64_t pos) {
    size_t h = (size_t)((uint64_t)pos * 0x9e3779b97f4a7c15ULL >> 17) & m->mask;
    while (m->pos[h] >= 0 && m->pos[h] != pos) h = (h + 1) & m->mask;
    return h;
}

static int64_t get(const moved *m, int64_t pos) {
    const size_t h = slot(m, pos);
    return m->pos[h] < 0 ? pos : m->val[h];
}

static void put(moved *m, int64_t pos, int64_t val) {
    const size_t h = slot(m, pos);
    m->pos[h] = pos, m->val[h] = val;
}

ts_status ts_order_permutation_tail(int64_t n, int64_t count, uint64_t key, uint64_t hi,
                                    int64_t *tail) {
    if (count < 0 || count > n)
        return ts_fail(TS_ERR_INVALID, "permutation tail: %lld of %lld entries", (long long)count,
                       (long long)n);
    /* Every swap writes at most two positions: 2 * count entries at most,
     * the table kept at most half full. */
    size_t cap = 16;
    while (cap < 4 * (size_t)count) cap *= 2;
    moved m = {ts_alloc(cap * sizeof *m.pos, "permutation table"),
               ts_alloc(cap * sizeof *m.val, "permutation table"), cap - 1};
    if (!m.pos || !m.val) {
        free(m.pos), free(m.val);
        return TS_ERR_NOMEM;
    }
    memset(m.pos, 0xff, cap * sizeof *m.pos);
    word_stream ws = {.key = key, .hi = hi, .ctr = 0, .used = 4};
    /* The same draws as ts_order_permute, stopped once p[n - count] is
     * fixed; p[0] is fixed by the swaps above it (no draw for i = 0). */
    for (int64_t i = n - 1; i >= n - count; i--) {
        const int64_t j = i > 0 ? (int64_t)below(&ws, (uint64_t)i + 1) : 0;
        const int64_t vi = get(&m, i), vj = get(&m, j);
        put(&m, j, vi);
        tail[i - (n - count)] = vj; /* p[i] is never touched again */
    }
    free(m.pos), free(m.val);
    return TS_OK;
}

/* ---- keyed bijection ------------------------------------------------------- */

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ts_order_bijection_init(ts_order_bijection *b, int64_t n, uint64_t key, uint64_t epoch) {
    int bits = 2;
    while (bits < 62 && ((int64_t)1 << bits) < n) bits++;
    bits += bits & 1; /* two equal halves */
    b->n = n;
    b->half = bits / 2;
    uint32_t w[4];
    for (int r = 0; r < TS_ORDER_ROUNDS; r += 2) {
        ts_philox(key, epoch, (uint64_t)r / 2, w);
        b->round_key[r] = (uint64_t)w[0] << 32 | w[1];
        b->round_key[r + 1] = (uint64_t)w[2] << 32 | w[3];
    }
}

int64_t ts_order_bijection_at(const ts_order_bijection *b, int64_t i) {
    const uint64_t mask = ((uint64_t)1 << b->half) - 1;
    uint64_t x = (uint64_t)i;
    /* A permutation of [0, 2^(2 half)); its cycle through i returns to i,
     * so walking it from i < n meets a value below n. */
    do {
        uint64_t l = x >> b->half, r = x & mask;
        for (int k = 0; k < TS_ORDER_ROUNDS; k++) {
            const uint64_t t = l ^ (mix64(r ^ b->round_key[k]) & mask);
            l = r, r = t;
        }
        x = l << b->half | r;
    } while (x >= (uint64_t)b->n);
    return (int64_t)x;
}
