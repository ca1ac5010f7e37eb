/* A sum of float vectors in a fixed binary tree. See repro_sum.h. */
#include "dist/repro_sum.h"
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

ts_status ts_tree_sum_init(ts_tree_sum *t, size_t n) {
    if (!t) return ts_fail(TS_ERR_INVALID, "tree_sum: NULL argument");
    memset(t, 0, sizeof *t);
    t->n = n;
    return TS_OK;
}

/* a = a + b, n floats. */
static void add_into(float *restrict a, const float *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = a[i] + b[i];
}

ts_status ts_tree_sum_add(ts_tree_sum *t, const float *leaf) {
    if (!t || !leaf) return ts_fail(TS_ERR_INVALID, "tree_sum_add: NULL argument");
    /* The new leaf closes the subtree on top when that one is a single
     * leaf: added straight into it, with no copy. */
    if (t->depth > 0 && t->level[t->depth - 1] == 0) {
        add_into(t->buf[t->depth - 1], leaf, t->n);
        t->level[t->depth - 1] = 1;
    } else {
        if (t->depth == TS_TREE_MAX_DEPTH)
            return ts_fail(TS_ERR_INVALID, "tree_sum_add: more than 2^%d leaves",
                           TS_TREE_MAX_DEPTH);
        float **b = &t->buf[t->depth];
        if (!*b && !(*b = ts_alloc(t->n ? t->n * sizeof(float) : 1, "tree sum")))
            return TS_ERR_NOMEM;
        memcpy(*b, leaf, t->n * sizeof(float));
        t->level[t->depth++] = 0;
    }
    /* Two subtrees of equal size on top make one of twice the size. */
    while (t->depth > 1 && t->level[t->depth - 1] == t->level[t->depth - 2]) {
        add_into(t->buf[t->depth - 2], t->buf[t->depth - 1], t->n);
        t->level[t->depth - 2]++;
        t->depth--;
    }
    t->leaves++;
    return TS_OK;
}

ts_status ts_tree_sum_add_node(ts_tree_sum *t, const float *sum, int level) {
    if (!t || !sum || level < 0 || level >= 62)
        return ts_fail(TS_ERR_INVALID, "tree_sum_add_node: bad argument");
    if (t->depth > 0 && t->level[t->depth - 1] < level)
        return ts_fail(TS_ERR_INVALID,
                       "tree_sum_add_node: a subtree of 2^%d leaves after one of 2^%d: the sum "
                       "would not be the binary counter's",
                       level, t->level[t->depth - 1]);
    if (t->depth == TS_TREE_MAX_DEPTH)
        return ts_fail(TS_ERR_INVALID, "tree_sum_add_node: more than %d subtrees",
                       TS_TREE_MAX_DEPTH);
    float **b = &t->buf[t->depth];
    if (!*b && !(*b = ts_alloc(t->n ? t->n * sizeof(float) : 1, "tree sum"))) return TS_ERR_NOMEM;
    memcpy(*b, sum, t->n * sizeof(float));
    t->level[t->depth++] = level;
    while (t->depth > 1 && t->level[t->depth - 1] == t->level[t->depth - 2]) {
        add_into(t->buf[t->depth - 2], t->buf[t->depth - 1], t->n);
        t->level[t->depth - 2]++;
        t->depth--;
    }
    t->leaves += (int64_t)1 << level;
    return TS_OK;
}

ts_status ts_tree_sum_result(ts_tree_sum *t, float *dst, float div) {
    if (!t || !dst) return ts_fail(TS_ERR_INVALID, "tree_sum_result: NULL argument");
    if (t->depth == 0) return ts_fail(TS_ERR_INVALID, "tree_sum_result: no leaves were added");
    /* The subtrees left (sizes of the count's set bits), smallest first. */
    for (int d = t->depth - 1; d > 0; d--) add_into(t->buf[d - 1], t->buf[d], t->n);
    const float *s = t->buf[0];
    if (div == 1.0f)
        memcpy(dst, s, t->n * sizeof(float));
    else
        for (size_t i = 0; i < t->n; i++) dst[i] = s[i] / div;
    t->depth = 0;
    t->leaves = 0;
    return TS_OK;
}

ts_status ts_tree_sum_finish(ts_tree_sum *t, const float *leaf, float *dst, float div) {
    if (!t || !leaf || !dst) return ts_fail(TS_ERR_INVALID, "tree_sum_finish: NULL argument");
    /* The new leaf's merges (it is the right operand of each) and the fold of
     * the subtrees left (smallest first, each the right operand of the one
     * below) are one right fold over the stack, from the top: s_0 + (s_1 +
     * (... + (s_top + leaf))). One pass instead of a merge pass per level, a
     * fold pass and a division pass; the usual depths as loops that
     * vectorise. */
    const size_t n = t->n;
    const int depth = t->depth;
    float *const *b = t->buf;
    const int scale = div != 1.0f;
    if (depth == 0) {
        for (size_t i = 0; i < n; i++) dst[i] = scale ? leaf[i] / div : leaf[i];
    } else if (depth == 1) {
        const float *b0 = b[0];
        for (size_t i = 0; i < n; i++) {
            const float v = b0[i] + leaf[i];
            dst[i] = scale ? v / div : v;
        }
    } else if (depth == 2) {
        const float *b0 = b[0], *b1 = b[1];
        for (size_t i = 0; i < n; i++) {
            const float v = b0[i] + (b1[i] + leaf[i]);
            dst[i] = scale ? v / div : v;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float v = leaf[i];
            for (int d = depth - 1; d >= 0; d--) v = b[d][i] + v;
            dst[i] = scale ? v / div : v;
        }
    }
    t->depth = 0;
    t->leaves = 0;
    return TS_OK;
}

void ts_tree_sum_free(ts_tree_sum *t) {
    if (!t) return;
    for (int i = 0; i < TS_TREE_MAX_DEPTH; i++) free(t->buf[i]);
    memset(t, 0, sizeof *t);
}

int ts_tree_sum_buffers(int leaves, int nodes) {
    int lv[TS_TREE_MAX_DEPTH + 1], d = 0, most = 0;
    for (int k = 0; k < leaves && d < TS_TREE_MAX_DEPTH; k++) {
        if (!nodes && d > 0 && lv[d - 1] == 0) {
            lv[d - 1] = 1; /* added in place (ts_tree_sum_add) */
        } else {
            lv[d++] = 0;
            if (d > most) most = d;
        }
        while (d > 1 && lv[d - 1] == lv[d - 2]) lv[d - 2]++, d--;
    }
    return most;
}
