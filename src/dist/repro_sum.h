/* repro_sum.h — a sum of float vectors in a fixed binary tree over their
 * order of arrival (dist.reproducible, docs/reproducibility.md).
 *
 *     ts_tree_sum t;
 *     ts_tree_sum_init(&t, n);
 *     for (int i = 0; i < k; i++) ts_tree_sum_add(&t, leaf[i]);
 *     ts_tree_sum_result(&t, dst, (float)k);   // dst = tree sum / k
 *     ts_tree_sum_free(&t);
 *
 * The tree is the one a binary counter builds: leaf i joins the complete
 * subtrees of 1, 2, 4, ... leaves that end at it, so every subtree of 2^a
 * leaves starting at a multiple of 2^a is summed on its own, and the
 * subtrees left at the end (one per set bit of the count, largest first)
 * are added from the smallest up. Feeding it, instead of M leaves, the M/N
 * sums of each N consecutive leaves (N a power of two dividing M, each of
 * those N-leaf sums a balanced tree) gives the same bits: that is what lets
 * N processes, each summing its own leaves' groups, agree with one.
 * Addition of two floats is commutative in IEEE arithmetic, so which side
 * a pair's operands come from does not matter. */
#ifndef TS_DIST_REPRO_SUM_H
#define TS_DIST_REPRO_SUM_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/status.h"

enum { TS_TREE_MAX_DEPTH = 48 };

typedef struct ts_tree_sum {
    size_t n;                      /* floats per vector */
    int depth;                     /* subtrees on the stack */
    int level[TS_TREE_MAX_DEPTH];  /* log2 of each subtree's leaf count */
    float *buf[TS_TREE_MAX_DEPTH]; /* owned, allocated when first needed */
    int64_t leaves;                /* added since the last reset */
} ts_tree_sum;

ts_status ts_tree_sum_init(ts_tree_sum *t, size_t n);
/* Adds the next leaf (n floats, read only). */
ts_status ts_tree_sum_add(ts_tree_sum *t, const float *leaf);
/* Adds the sum of the next 2^level leaves, summed on their own as this tree
 * would (a balanced tree, e.g. another ts_tree_sum fed exactly 2^level
 * leaves): the result is the same as adding those leaves one by one. The
 * subtrees must come in the binary counter's order: never one larger than
 * the subtree before it that is still open (an aligned block of leaves). */
ts_status ts_tree_sum_add_node(ts_tree_sum *t, const float *sum, int level);
/* The vectors of n floats a tree fed `leaves` leaves (or as many equal
 * subtrees, by ts_tree_sum_add_node) allocates: the deepest its stack gets.
 * For memory estimates (pipeline stages). */
int ts_tree_sum_buffers(int leaves);
/* dst (n floats) = the tree's sum / div; then the sum starts again. */
ts_status ts_tree_sum_result(ts_tree_sum *t, float *dst, float div);
/* ts_tree_sum_add(t, leaf) then ts_tree_sum_result(t, dst, div), the same
 * floats, in one pass over the vectors (dst may be leaf). */
ts_status ts_tree_sum_finish(ts_tree_sum *t, const float *leaf, float *dst, float div);
void ts_tree_sum_free(ts_tree_sum *t);

#endif
