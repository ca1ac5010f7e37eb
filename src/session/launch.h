/* launch.h — training on several processes: the shm launcher (fork N
 * workers, restart them, restart.h) and the MPI path behind
 * ts_session_run_dist, which the public tessel/session.h declares and
 * describes. See docs/distributed.md, "Training on several processes". */
#ifndef TS_SESSION_LAUNCH_H
#define TS_SESSION_LAUNCH_H

#include "session/session.h"
#include "tessel/dist.h"

#endif
