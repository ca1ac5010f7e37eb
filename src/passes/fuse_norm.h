/* fuse_norm.h — the activation + layer norm part of the fusion pass
 * (internal; see fuse_norm.c). */
#ifndef TS_FUSE_NORM_H
#define TS_FUSE_NORM_H

#include "ops/eltwise.h"
#include "passes/passes.h"

/* Fuse every act -> layer_norm pair, every layer_norm_bwd -> unary_bwd
 * pair and then every layer_norm_bwd -> add pair it can (marking the
 * absorbed nodes dead and root_of[m] the node each went into); *pairs gets
 * how many. */
ts_status ts_fuse_norm(ts_graph *g, int32_t *root_of, int *pairs);

#endif
