/* restart.h — `tessel train --procs N --max-restarts K` (dist.max_restarts):
 * what the shm launcher (launch.c) does between a failed attempt and the
 * next one.
 *
 *     if ((s = ts_restart_check(c, n)) != TS_OK) return s;   // before attempt 1
 *     ... an attempt fails; codes[] are the workers' exit statuses ...
 *     int rank = ts_restart_failed_rank(codes, n);
 *     char how[64];
 *     ts_restart_describe(codes[rank], how, sizeof how);
 *     const char *resume;
 *     s = ts_restart_prepare(c, dir, o->resume, k, K, rank, how, log, &resume);
 *
 * The next attempt resumes from the run directory's LATEST checkpoint
 * (`--resume latest`), or, when the failed attempt saved none, starts over
 * as the first attempt did, after its run directory was moved aside to
 * RUN_DIR.attempt-K. See docs/distributed.md, "Restarting failed workers". */
#ifndef TS_SESSION_RESTART_H
#define TS_SESSION_RESTART_H

#include <stddef.h>
#include <stdio.h>
#include "frontend/config.h"

/* Refuses dist.max_restarts > 0 where a restart could not resume: one
 * process, no checkpoints (ckpt.every 0), or ZeRO (sharded state is not
 * checkpointed). */
ts_status ts_restart_check(const ts_config *c, int procs);

/* The rank to blame for a failed attempt: the lowest rank killed by a
 * signal (a crash; its peers then fail at their next collective), else
 * the lowest rank with a non-zero exit status; -1 when none failed.
 * codes[] as ts_shm_launch's exit_codes (128 + signal for a signal). */
int ts_restart_failed_rank(const int *codes, int n);

/* "killed by signal 9" or "exit status 1". */
void ts_restart_describe(int code, char *buf, size_t n);

/* Gets the next attempt ready and says so on `log`: "restart 1/3 from
 * step-00000040 after rank 1 killed by signal 9". *resume becomes "latest"
 * when run_dir holds a LATEST checkpoint, else orig_resume (run_dir, if it
 * exists, is renamed to RUN_DIR.attempt-ATTEMPT so the next attempt gets a
 * new one). A run directory with an audit.log gets a "restart" entry.
 * attempt counts from 1; rank -1: not known (tessel launch, when the job
 * launcher did not say), and `how` then says what is known. */
ts_status ts_restart_prepare(const ts_config *c, const char *run_dir, const char *orig_resume,
                             int attempt, int max, int rank, const char *how, FILE *log,
                             const char **resume);

#endif
