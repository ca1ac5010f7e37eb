/* fusion_mask.h — sensor masks of the fusion model (model.source_mask,
 * train.source_dropout; docs/shapes.md "Sensor masks").
 *
 * Graph side (src/models/fusion.c builds with these; tests call them on
 * their own graphs):
 *
 *     ts_val valid = ts_input(g, "valid", TS_U8, 2, (int64_t[]){B, 3});
 *     ts_val cam = ts_fusion_gate(g, ts_slice(g, x, 1, 0, n), valid, 0);
 *     cam = ts_batch_norm_masked(g, conv(cam), w, b, "camera.1", 0.1, 1e-5, 1,
 *                                TS_CHANNELS_LAST, ts_fusion_rows(g, valid, 0));
 *     ...                                   // one branch per source: [B, D] each
 *     ts_val fused = ts_fusion_mean(g, 3, parts, valid);        // [B, D]
 *
 * Session side (the flags fed to the input `valid` of each step):
 *
 *     ts_fusion_valid(rows, seed, step, p, have, valid);   // u8 [rows, 3]
 */
#ifndef TS_MODELS_FUSION_MASK_H
#define TS_MODELS_FUSION_MASK_H

#include <stdint.h>
#include "tessel/tessel.h"

enum { TS_FUSION_SOURCES = 3 }; /* camera, sequence, tabular */

/* x [B, ...] of source k: rows whose flag valid[:, k] (u8 [B, S]) is 0 read
 * as zeros — a select, so a NaN there is never read — and get an exact
 * zero gradient. */
ts_val ts_fusion_gate(ts_graph *g, ts_val x, ts_val valid, int k);

/* Source k's flags as a row mask, f32 [B] (1 where valid[:, k] is 1): for
 * ts_batch_norm_masked, so a branch's BatchNorm takes its statistics over
 * the rows that have the source. */
ts_val ts_fusion_rows(ts_graph *g, ts_val valid, int k);

/* The masked mean of n branch representations parts[i] [B, D] (one per
 * source) under valid u8 [B, n]: [B, D], a row's mean over its valid
 * sources (0 for a row with none). An invalid source's representation is
 * not read and gets an exact zero gradient. */
ts_val ts_fusion_mean(ts_graph *g, int n, const ts_val *parts, ts_val valid);

/* The flags of a training batch's rows: each of the S sources of each row
 * is dropped (0) with probability p, drawn from a hash of (seed, step, row,
 * source) — the same bits for any thread or process count. `have` (u8
 * [rows, S], NULL: every source) says which sources the data holds: a
 * source it lacks is 0 whatever the draw. A row never loses every source
 * it has: when all would be dropped, one of them (drawn from the same
 * hash) is kept. p = 0 gives `have` (all ones without it). */
void ts_fusion_valid(int64_t rows, uint64_t seed, int64_t step, double p, const uint8_t *have,
                     uint8_t *valid);

#endif
