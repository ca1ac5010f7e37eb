/* schedule_search.h — the memory-minimising order search (internal;
 * schedule_search.c) that the schedule pass (schedule.c) runs beside its
 * greedy list scheduler.
 *
 *     ts_search_opts o = {.beam = 64, .budget = 0, .allow_inplace = 1};
 *     int32_t *order;   // g->n_nodes node ids, malloc'ed
 *     size_t peak;      // live temporary bytes at the worst step
 *     ts_status s = ts_schedule_search(g, &o, &order, &peak);
 *
 * Both functions count bytes the way memplan (memplan.c) lays out the
 * temporaries region: pinned values (outputs, gradients, persistent ones)
 * are not counted, views are free, scratch lives at its node only, an
 * in-place op (allow_inplace) reuses its dying input. The region memplan
 * makes can be larger than this peak (placement leaves holes), never
 * smaller. */
#ifndef TS_SCHEDULE_SEARCH_H
#define TS_SCHEDULE_SEARCH_H

#include "passes.h"

typedef struct ts_search_opts {
    int beam;          /* states kept per layer (>= the widest layer: exact) */
    long long budget;  /* bound on nodes x beam x 16 (0: none); the beam halves to fit */
    int allow_inplace; /* memplan may write an output over its dying input */
} ts_search_opts;

/* An order of every node of g with the lowest peak the search found. */
ts_status ts_schedule_search(const ts_graph *g, const ts_search_opts *o, int32_t **order,
                             size_t *peak);

/* The peak of live temporary bytes of `order` (n node ids); live_at (may
 * be NULL, n entries) gets the bytes live while each step runs. */
ts_status ts_schedule_sim(const ts_graph *g, const int32_t *order, int n, int allow_inplace,
                          size_t *peak, size_t *live_at);

#endif
