/* group.h — a communicator over some ranks of another (internal to the
 * library): the D replicas of one pipeline stage, whose plan all-gathers
 * its ZeRO-1 shards among them (session/stages_run.c).
 *
 *     int ranks[2] = {1, 3};                 // parent ranks, in group rank order
 *     ts_comm *g;
 *     if (ts_comm_group(parent, 2, ranks, &g) != TS_OK) ...   // collective over ranks[]
 *     ts_allgather(g, ...);                  // rank 0 of g is parent rank 1
 *     ts_comm_close(g);                      // before the parent
 *
 * The group sends through the parent's point-to-point messages (shm or
 * MPI alike), so every collective algorithm built on them works; it has no
 * native collectives and no shared buffers, and uses the default algorithm
 * table (no probe). Its messages and the parent's between the same two
 * ranks must come in the same order on both sides, as the parent's own
 * always must; a non-blocking collective on the group runs on its own
 * communication thread, so the caller must not use the parent from another
 * thread meanwhile (finish the parent's messages first). */
#ifndef TS_DIST_GROUP_H
#define TS_DIST_GROUP_H

#include "tessel/dist.h"

/* ranks[0..n): distinct parent ranks, the parent's own among them; every
 * one of them calls this with the same list. */
ts_status ts_comm_group(ts_comm *parent, int n, const int *ranks, ts_comm **out);

#endif
