/* partition_graph.h — what running the chosen stages needs from a
 * partition (internal; the public part is tessel/pipeline.h).
 *
 *     int n, first, count;
 *     int32_t in_cut, out_cut;
 *     const int32_t *order = ts_partition_order(part, &n);   // live forward nodes
 *     ts_partition_stage_nodes(part, s, &first, &count, &in_cut, &out_cut);
 *     // stage s runs order[first .. first+count), receives value in_cut
 *     // (-1 for the first stage) and sends out_cut (-1 for the last)
 */
#ifndef TS_PASSES_PARTITION_GRAPH_H
#define TS_PASSES_PARTITION_GRAPH_H

#include <stdint.h>
#include "tessel/pipeline.h"

const int32_t *ts_partition_order(const ts_partition *p, int *n);
void ts_partition_stage_nodes(const ts_partition *p, int s, int *first, int *count, int32_t *in_cut,
                              int32_t *out_cut);

/* Stage s's forward graph as a training graph (partition_stage.c): the
 * received activation is the parameter "pipe.in" (zeros; its gradient
 * "grad:pipe.in" goes back), and a stage before the last sends
 * "pipe.out" and takes its gradient as the input "pipe.grad". */
ts_status ts_partition_stage_graph(const ts_graph *g, ts_val loss, const ts_partition *p, int s,
                                   ts_graph **out, ts_val *stage_loss);
/* Which stages read the parameter `name` (stages[s] 1 or 0); returns how
 * many. */
int ts_partition_param_stages(const ts_graph *g, const ts_partition *p, const char *name,
                              int *stages);

#endif
