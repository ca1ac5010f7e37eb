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

#endif
