/* collective.h — what the data-parallel ops (collective.c) need at run
 * time (internal). ts_compile points the backend state of every
 * allreduce_start / allreduce_wait instruction at the plan's one ts_dist_rt. */
#ifndef TS_OPS_COLLECTIVE_H
#define TS_OPS_COLLECTIVE_H

#include <stddef.h>
#include "tessel/dist.h"
#include "tessel/plan.h"

typedef struct ts_dist_rt {
    ts_comm *comm;
    ts_coll_ticket *tickets; /* per bucket: its started all-reduce */
    int n_buckets;
    /* ZeRO with shared parameters (ts_compile_options.zero_private_params
     * 0 on shm): where each rank's arena lies relative to this rank's, so
     * a fused shard update reads rank q's copy of a gradient at
     * (char *)g + peer_delta[q]; NULL otherwise. */
    ptrdiff_t *peer_delta;
    ts_compress_stats cstats; /* gradient compression: this step's bytes (ops/compress.c) */
} ts_dist_rt;

#endif
