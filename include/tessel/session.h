/* tessel/session.h — a training run: the configured data, model and plan, the
 * step loop with evaluation, progress, and the run directory.
 *
 *     ts_config c;                                 // loaded and finished (tessel/config.h)
 *     static volatile sig_atomic_t stop;           // a SIGINT handler sets it
 *     ts_session_options o = ts_session_options_default();
 *     o.out_dir = "runs/first";                    // overrides output.dir
 *     o.stop = &stop;
 *     o.progress = isatty(1) ? TS_PROGRESS_TTY : TS_PROGRESS_LINES;
 *     ts_session_result r;
 *     if (ts_session_run(&c, &o, &r) != TS_OK) puts(ts_last_error());
 *     // or ts_session_run_dist(&c, &o, &r): on dist.procs processes (below)
 *
 * Everything that can be wrong with the config, the data or the run
 * directory is found before the run directory is created, so a bad run
 * leaves no trace and never touches an existing run: a directory that
 * exists and is not empty is refused. The run directory then holds
 * config.yaml (resolved), lineage.json, normalisation.json (CSV
 * normalisation), metrics.jsonl (a line per step and per evaluation) and
 * summary.json, which is written however the run ends, and audit.log;
 * tb/ holds TensorBoard events unless observe.tensorboard is off. With
 * observe.metrics_port a Prometheus /metrics endpoint is served from before
 * the first step until training ends; after each step the session
 * publishes loss, learning rate, throughput, step time, memory and the
 * global gradient norm (docs/observability.md).
 * With ckpt.every > 0 a checkpoint is saved every N steps (and at the last
 * step, or the step Ctrl-C stopped at) by a background saver; the run waits
 * for the last save before it returns. docs/config.md describes the files,
 * docs/checkpoints.md checkpoints and resuming ("Training with
 * checkpoints"). A resumed run verifies the checkpoint before anything is
 * loaded or written, and a refused one leaves every directory untouched.
 */
#ifndef TESSEL_SESSION_H
#define TESSEL_SESSION_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include "tessel/compile.h"
#include "tessel/config.h"
#include "tessel/models.h"
#include "tessel/progress.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ts_comm; /* tessel/dist.h */

typedef struct ts_session_options {
    const char *out_dir;         /* run directory; NULL: output.dir of the config */
    volatile sig_atomic_t *stop; /* non-zero: stop after the current step (may be NULL) */
    FILE *log;                   /* progress and messages (NULL: stdout) */
    ts_progress_mode progress;   /* how progress is shown (default: log lines) */
    /* Resume: NULL for a new run; "latest" continues the run directory's
     * newest checkpoint in that directory (which must exist); any other
     * value is a checkpoint directory (step-N, or a run directory meaning
     * its LATEST) whose training continues in a new run directory. */
    const char *resume;
    /* Data parallelism: this process is one rank of comm (NULL: the only
     * one). Every rank runs ts_session_run with the same config; each
     * trains on its model.batch / size rows of every batch. Only the
     * options decide what a rank writes: ts_session_run_dist (below)
     * gives ranks other than 0 no run directory, checkpoints or endpoint. */
    struct ts_comm *comm;
    /* A Chrome trace of the training steps (every instruction a "compute"
     * span, every collective a "comm" span, one process per rank) written
     * to this file when training ends; NULL: none. */
    const char *trace;
    /* Ranks other than 0 of a ZeRO run with checkpoints: rank 0's run
     * directory, where they save their blocks of the optimizer state
     * (ts_session_run_dist sets it; NULL otherwise). */
    const char *shard_dir;
    /* Called after every completed training step with the plan (its
     * parameters already updated) and the learning rate the step used; a
     * failure ends the run with it. NULL: none. Federated clients use it
     * for FedProx's proximal step (src/fed/run.c). */
    ts_status (*after_step)(void *user, ts_plan *plan, int64_t step, double lr);
    void *after_step_user;
} ts_session_options;

ts_session_options ts_session_options_default(void);

/* Evaluation of one split; loss, accuracy and mse are NaN when not computed. */
typedef struct ts_eval_result {
    int64_t examples;
    double loss, accuracy, mse;
    double auc, dice, miou; /* NaN unless asked for in train.metrics */
} ts_eval_result;

typedef struct ts_session_result {
    int64_t steps;         /* steps run */
    int64_t planned_steps; /* train.steps after epochs were resolved */
    double first_loss, final_loss;
    double seconds;     /* wall time of the step loop, evaluations included */
    double median_rate; /* per second, of `unit`, over the steps after the first */
    const char *unit;   /* "samples/s" or "tokens/s" */
    int has_val, has_test;
    ts_eval_result val, test;  /* the last evaluation of each split */
    int interrupted;           /* stopped by the stop flag */
    int failed_in_step;        /* the error came from a training step, not from setup */
    char run_dir[512];         /* "" when the run wrote no directory */
    int64_t resumed_step;      /* the checkpoint's step when resumed, else 0 */
    int64_t checkpoints;       /* checkpoints this run saved */
    int stopped_by_alert;      /* an alert rule with action stop ended the run */
    char alert_rule[64];       /* ... that rule */
    int64_t anomaly_snapshots; /* step-N-anomaly checkpoints written by alerts */
    int64_t pauses;            /* alert pauses resumed */
    /* Seconds from the start of the process to the start of its first step
     * (its batch asked for), and that step's own seconds; NaN if no step ran. */
    double start_to_first_step, first_step;
} ts_session_result;

/* Run the finished config `c` (it is not modified; epochs and the data's
 * shapes are resolved on a copy). On failure *r still says how far the run
 * got, and a run directory that was created holds a summary.json with
 * status "failed". An interrupted run returns TS_OK with r->interrupted. */
ts_status ts_session_run(const ts_config *c, const ts_session_options *o, ts_session_result *r);

/* Training on several processes (data parallelism): ts_session_run_dist
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
ts_status ts_session_run_dist(const ts_config *c, const ts_session_options *o,
                              ts_session_result *r);

/* The graph, training step and compile options of the finished config `c`
 * (what `tessel compile` compiles): ts_config_build's, except that a model
 * built on its data (gcn: the graph's edges) has the data read and `c`
 * fitted to it first. On success the caller owns *g (ts_graph_free). */
ts_status ts_session_build_model(ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                                 ts_compile_options *opt);

#ifdef __cplusplus
}
#endif
#endif
