/* launch.h — training on several processes (data parallelism).
 *
 *     ts_session_result r;
 *     ts_status s = ts_session_run_dist(&config, &opts, &r);
 *
 * runs the session on config.dist.procs worker processes of this host
 * (forked, one shared memory segment: the shm transport), or, when this
 * process was started by mpirun or srun, as this MPI rank; with one
 * process and no MPI it is ts_session_run. Rank 0 writes the run directory
 * (metrics, summary, checkpoints, TensorBoard, the /metrics endpoint) and
 * prints progress; the other ranks write nothing. *r is rank 0's result.
 * When a worker fails, the others report at their next collective and the
 * launcher stops them, then returns TS_ERR_IO with a summary naming each
 * failed rank and how it ended, and the first error a worker reported.
 * With config.dist.max_restarts K > 0 it then starts the workers again
 * from the run directory's latest checkpoint, up to K times (restart.h).
 * See docs/distributed.md, "Training on several processes". */
#ifndef TS_SESSION_LAUNCH_H
#define TS_SESSION_LAUNCH_H

#include "session/session.h"
#include "tessel/dist.h"

ts_status ts_session_run_dist(const ts_config *c, const ts_session_options *o,
                              ts_session_result *r);

/* After a step: every rank gets the mean of the ranks' losses and stop =
 * whether any rank was asked to stop (so all stop after the same step).
 * Collective. */
ts_status ts_session_agree(ts_comm *comm, double *loss, int *stop);

/* A number rank 0 draws at random and every rank returns (collective):
 * it tells this launch's checkpoint shards from those a killed earlier
 * launch left behind (ts_ckpt_options.group). */
ts_status ts_session_ckpt_group(ts_comm *comm, uint64_t *group);

/* --trace: a trace of this rank's steps (instructions and collectives),
 * started before the first step and written when training ends: with
 * several ranks each writes FILE.rankR.json, then (after a barrier) rank 0
 * merges them into FILE and removes them. */
struct ts_trace;
struct ts_progress;
ts_status ts_session_trace_start(ts_plan *plan, const ts_session_options *o, int64_t steps,
                                 struct ts_trace **out);
ts_status ts_session_trace_finish(ts_plan *plan, const ts_session_options *o, struct ts_trace *t,
                                  struct ts_progress *pr);
/* Detaches the trace from the plan and the comm and frees it (NULL: nothing). */
void ts_session_trace_close(ts_plan *plan, const ts_session_options *o, struct ts_trace *t);

#endif
