/* collective.h — what the data-parallel ops (collective.c) need at run
 * time (internal). ts_compile points the backend state of every
 * allreduce_start / allreduce_wait instruction at the plan's one ts_dist_rt. */
#ifndef TS_OPS_COLLECTIVE_H
#define TS_OPS_COLLECTIVE_H

#include "tessel/dist.h"

typedef struct ts_dist_rt {
    ts_comm *comm;
    ts_coll_ticket *tickets; /* per bucket: its started all-reduce */
    int n_buckets;
} ts_dist_rt;

#endif
