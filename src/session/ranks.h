/* ranks.h — what the ranks of a data-parallel run agree on (internal to
 * src/session): the session calls these collectives, the launcher arms the
 * testing knob that kills a rank.
 *
 *     ts_session_agree(comm, &loss, &stop);     // after every step, every rank
 *     ts_session_kill_point();                  // instead, where the step agreed on stop
 *     ts_session_ckpt_group(comm, &group);      // once, before ZeRO checkpoints
 */
#ifndef TS_SESSION_RANKS_H
#define TS_SESSION_RANKS_H

#include <stdint.h>
#include "tessel/dist.h"

/* After a step: every rank gets the mean of the ranks' losses and stop =
 * whether any rank was asked to stop (so all stop after the same step).
 * Collective. */
ts_status ts_session_agree(ts_comm *comm, double *loss, int *stop);

/* Where a step's own meetings already carried the stop flag (dist.reproducible's split
 * finish, repro.h), the session calls this instead of ts_session_agree: the point of the step
 * where the testing knob below kills its rank. */
void ts_session_kill_point(void);

/* A number rank 0 draws at random and every rank returns (collective):
 * it tells this launch's checkpoint shards from those a killed earlier
 * launch left behind (ts_ckpt_options.group). */
ts_status ts_session_ckpt_group(ts_comm *comm, uint64_t *group);

/* The testing knob of docs/distributed.md ("Restarting failed workers"):
 * TESSEL_TEST_KILL_RANK=R TESSEL_TEST_KILL_STEP=S make rank R of the first
 * attempt (of the first TESSEL_TEST_KILL_ATTEMPTS attempts, default 1) kill
 * itself with SIGKILL in its S-th step, before that step's agreement (or its
 * ts_session_kill_point), as a crash would. The launcher calls this in each worker process. */
void ts_session_arm_test_kill(int rank, int attempt);

#endif
