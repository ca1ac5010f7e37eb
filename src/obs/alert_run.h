/* alert_run.h — gradient monitors and alert rules wired into a training
 * run (docs/observability.md). The session owns one runner; the runner
 * installs itself as the plan's update gate, evaluates the rules, and
 * publishes every alert to the log/progress line, the metrics, the
 * TensorBoard events, the audit log and (action webhook) an HTTP receiver.
 * The actions that change the run (snapshot, pause, stop) are returned to
 * the session, which alone can checkpoint and leave its loop:
 *
 *     ts_alert_runner *ar;
 *     ts_alert_runner_new(plan, &cfg, &ar);            // sets the update gate
 *     ts_alert_runner_attach(ar, &pr, tm, tb, audit, run_dir);
 *     for (...) {
 *         ts_plan_step(plan);
 *         unsigned act;
 *         ts_alert_runner_step(ar, step, &act);        // after every step
 *         if (act & (1u << TS_AA_STOP)) break;
 *     }
 *     ts_alert_runner_free(ar);
 */
#ifndef TS_OBS_ALERT_RUN_H
#define TS_OBS_ALERT_RUN_H

#include <signal.h>
#include "obs/alert.h"
#include "obs/anomaly.h"
#include "obs/metrics.h"
#include "obs/progress.h"
#include "obs/tfevents.h"
#include "tessel/ckpt.h"
#include "tessel/dist.h"

typedef struct ts_alert_run_config {
    const char *rules; /* alerts.rules ("" for none) */
    int defaults;      /* use the default rules when there are none */
    const char *webhook_url;
    int window, warmup;     /* baseline */
    int update_ratio_every; /* measure ||update|| / ||param|| every N steps (0: never) */
    int rank;
    ts_comm *comm;    /* data parallel (NULL: one process): the ranks agree on skip_step */
    int64_t cooldown; /* alerts.cooldown: steps between a rule's snapshots, pauses, webhooks */
} ts_alert_run_config;

typedef struct ts_alert_runner {
    ts_plan *plan;
    ts_monitor *mon;
    ts_alerts *al;
    ts_alert_run_config cfg;
    ts_alert_outcome pre; /* rules evaluated in the gate */
    int gated;            /* the gate ran this step */
    int skipped;          /* ... and skipped the update */
    int overflow;         /* the loss scaler skips this step (non-finite gradients) */
    int64_t skipped_total, fired_total, overflow_total;
    const ts_alert_rule *stop_rule, *pause_rule, *snapshot_rule;
    /* kept for the session, which acts on snapshot and pause: */
    ts_anomaly_budget snaps; /* anomaly snapshots: cap and retention (anomaly.h) */
    int pause_unanswered;    /* a pause timed out and the run went on: no more waits */
    /* where alerts go (each may be NULL) */
    ts_progress *pr;
    ts_train_metrics *tm;
    ts_tfevents *tb;
    ts_audit *audit;
    char run_dir[512];
} ts_alert_runner;

ts_status ts_alert_runner_new(ts_plan *plan, const ts_alert_run_config *cfg, ts_alert_runner **out);
void ts_alert_runner_attach(ts_alert_runner *ar, ts_progress *pr, ts_train_metrics *tm,
                            ts_tfevents *tb, ts_audit *audit, const char *run_dir);
/* After each step: evaluate, publish, and report the actions that fired
 * (bits 1 << ts_alert_action); ar->stop_rule etc. name the rule. */
ts_status ts_alert_runner_step(ts_alert_runner *ar, int64_t step, unsigned *actions);
void ts_alert_runner_free(ts_alert_runner *ar);

/* TensorBoard scalars of the last step: train/grad_variance and (when
 * measured) train/update_ratio. */
ts_status ts_alert_runner_scalars(const ts_alert_runner *ar, ts_tfevents *tb, int64_t step);

/* debug.inject: corrupt a float32 batch x (bytes long) when `step` is in
 * [first, first + count): kind 1 puts a NaN in x[0], kind 2 multiplies
 * every element by `scale`. */
void ts_alert_inject(int kind, int64_t first, int count, double scale, int64_t step, void *x,
                     size_t bytes);

/* How a pause ended. */
typedef enum ts_pause_end {
    TS_PAUSE_STOPPED,   /* *stop became non-zero (Ctrl-C, SIGTERM) */
    TS_PAUSE_RESUMED,   /* tessel ctl resume, or SIGUSR1 */
    TS_PAUSE_TIMED_OUT, /* nobody answered within timeout_s */
} ts_pause_end;

/* Pause: write RUN_DIR/PAUSED (pid, step, rule, timeout_s) and wait until
 * `tessel ctl resume RUN_DIR` creates RUN_DIR/RESUME (polled every 100 ms),
 * SIGUSR1 arrives, *stop becomes non-zero, or timeout_s seconds pass
 * (timeout_s <= 0: no limit); *end says which. */
ts_status ts_alert_pause_for(const char *run_dir, int64_t step, const char *rule, double timeout_s,
                             volatile sig_atomic_t *stop, ts_progress *pr, ts_pause_end *end);
/* The same without a time limit; *resumed is 1 when resumed, 0 when
 * stopped. */
ts_status ts_alert_pause(const char *run_dir, int64_t step, const char *rule,
                         volatile sig_atomic_t *stop, ts_progress *pr, int *resumed);

#endif
