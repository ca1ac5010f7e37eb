/* tessel/launch.h — `tessel launch`: restarts for training started by a job
 * launcher (mpirun, srun), which `--max-restarts` of tessel train cannot
 * restart from inside (every rank is the launcher's process).
 *
 *     char *job[] = {"mpirun", "-np", "4", "tessel", "train", "w1.yaml",
 *                    "--set", "ckpt.every=100", "--out", "runs/w1", NULL};
 *     ts_launch_options o = ts_launch_options_default();
 *     o.max_restarts = 3;
 *     int code;
 *     if (ts_launch_job(job, &o, &code) != TS_OK) puts(ts_last_error());
 *
 * The command runs as it is; when it fails (a non-zero exit status other
 * than 130, a stop, and 2, a refused config), it runs again with
 * `--resume latest` from the run directory's newest checkpoint (the
 * command's `--out RUN_DIR`), or from the start in a new run directory
 * when it saved none (the failed one is moved to RUN_DIR.attempt-K), as
 * tessel train --procs N --max-restarts K does (docs/cluster.md). The
 * launcher's stderr passes through and names the rank and host that died
 * (Open MPI's "process rank R ... on node H exited on signal S", srun's
 * "H: task R: Killed"); the restart line repeats them. Each attempt sees
 * TESSEL_LAUNCH_ATTEMPT=K (0 for the first). */
#ifndef TESSEL_LAUNCH_H
#define TESSEL_LAUNCH_H

#include <signal.h>
#include <stdio.h>
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_launch_options {
    int max_restarts;            /* failed attempts run again at most this often (0: none) */
    FILE *log;                   /* restart lines (NULL: stdout) */
    volatile sig_atomic_t *stop; /* set by the caller's SIGINT/SIGTERM handler: no restart */
    int stop_signal;             /* ... the signal it got, passed on to the command */
} ts_launch_options;

ts_launch_options ts_launch_options_default(void);

/* Runs argv (argv[0] found on PATH) until it succeeds, stops, or fails
 * with no restarts left; *exit_code gets its last exit status (128 +
 * signal when killed). Returns TS_OK when it succeeded or stopped (130),
 * else an error naming the failure and, where the launcher said, the rank
 * and host. */
ts_status ts_launch_job(char *const argv[], const ts_launch_options *o, int *exit_code);

#ifdef __cplusplus
}
#endif

#endif
