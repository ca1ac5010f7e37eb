/* shapes.h — training on shape buckets (shape.*, docs/shapes.md): the
 * masked loss of a bucketed model and, for the session, the plan cache's
 * builder and the padding of each batch (shapes.c, shape_feed.c).
 *
 *     ts_build_mlp(g, &mc, &m);                        // a regression at batch 16
 *     ts_shape_mask_loss(g, &m, &spec);                // + input "mask" [16]
 *
 * Padded rows and positions change nothing: class-id targets of padding
 * are the ignore index -100, which cross-entropy leaves out of its sum
 * and of its count; float targets (MSE) get a mask input, 1 for a real
 * row and 0 for padding, and the loss divides by the real count. */
#ifndef TS_SESSION_SHAPES_H
#define TS_SESSION_SHAPES_H

#include "tessel/tessel.h"

/* The ignore index padded class-id targets carry. */
enum { TS_SHAPE_IGNORE = -100 };

/* For a model with float targets (MSE against y [B, ...]): adds input
 * "mask" f32 [B] and makes spec->loss (and m->loss, named "loss"; the old
 * one is renamed "unmasked_loss") sum_b mask_b * sum_k (out - y)^2 /
 * (sum(mask) * K). A model with class-id targets is left as it is. */
ts_status ts_shape_mask_loss(ts_graph *g, ts_model *m, ts_train_spec *spec);

/* Data parallel on buckets: adds input "loss_weight" f32 [1] and makes the
 * loss (named "loss"; the old one "rank_loss") rank_loss * loss_weight.
 * Each rank feeds N * n_r / n (its real count n_r of the step's n, N
 * ranks), so the ranks' averaged gradients are those of the mean over the
 * whole batch's real rows or tokens however unevenly they fell. */
ts_status ts_shape_weight_loss(ts_graph *g, ts_model *m, ts_train_spec *spec);

#endif
