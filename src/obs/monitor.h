/* monitor.h — gradient monitors on the host side: per-group statistics from
 * the plan's monitor nodes (ts_plan_monitor), the update/parameter ratio,
 * and windowed baselines with z-scores. docs/observability.md defines
 * every number.
 *
 *     ts_monitor *m;
 *     ts_monitor_new(plan, 50, 20, 10, &m);       // window, warm-up, update ratio every 10 steps
 *     // in the update gate (gradients done, update not yet applied):
 *     ts_monitor_read(m, plan, loss);            // groups, norm, variance, non-finite
 *     ts_monitor_before_update(m, plan);         // copy the parameters
 *     // after ts_plan_step:
 *     ts_monitor_after_update(m, plan);          // update ratio (NaN on steps not measured)
 *     double z = ts_baseline_z(&m->base[TS_MON_GRAD_NORM], m->value[TS_MON_GRAD_NORM]);
 *     ts_monitor_commit(m, 1);                   // this step's values join the baselines
 *     ts_monitor_free(m);
 */
#ifndef TS_OBS_MONITOR_H
#define TS_OBS_MONITOR_H

#include <stdint.h>
#include "tessel/plan.h"

/* A windowed baseline: mean and standard deviation of the last `window`
 * values pushed, usable once `warmup` values have been pushed. Once it is
 * usable, a value enters clipped to mean +- (3 std + |mean|): one spike
 * moves the baseline little, while a lasting change of level is taken in
 * within a few dozen steps (each clipped value still moves the mean by
 * |mean| / window or more), so the baseline follows the run instead of
 * staying at its early level. */
typedef struct ts_baseline {
    int window, warmup;
    double *ring;
    int n, head;
    int64_t pushed;
} ts_baseline;

ts_status ts_baseline_init(ts_baseline *b, int window, int warmup);
void ts_baseline_free(ts_baseline *b);
/* Non-finite values are not pushed (they would poison the window); see
 * above for the clipping. */
void ts_baseline_push(ts_baseline *b, double v);
int ts_baseline_ready(const ts_baseline *b);
/* Mean and population standard deviation of the window (NaN if empty). */
double ts_baseline_mean(const ts_baseline *b);
double ts_baseline_std(const ts_baseline *b);
/* (v - mean) / std; NaN before the warm-up ends, 0 for a constant window
 * holding v, +-Inf for a constant window not holding v. */
double ts_baseline_z(const ts_baseline *b, double v);

/* The monitored metrics (alert rules name them). */
typedef enum ts_mon_metric {
    TS_MON_LOSS,
    TS_MON_GRAD_NORM,
    TS_MON_GRAD_VARIANCE,
    TS_MON_UPDATE_RATIO,
    TS_MON_NONFINITE, /* non-finite gradient elements */
    TS_MON_COUNT
} ts_mon_metric;

const char *ts_mon_metric_name(int metric);
/* -1 when unknown. */
int ts_mon_metric_find(const char *name);

typedef struct ts_monitor_group {
    char name[128];
    double sumsq, sum;
    int64_t nonfinite, numel;
    double norm, variance;
    double p_sumsq, d_sumsq; /* parameters before the update, and the update */
    double update_ratio;
} ts_monitor_group;

typedef struct ts_monitor {
    int n_groups;
    ts_monitor_group *groups;
    int n_mon;
    int *group_of; /* per plan monitor: its group */
    double value[TS_MON_COUNT];
    ts_baseline base[TS_MON_COUNT];
    int update_ratio_every; /* measure the update ratio on steps that are multiples (0: never) */
    float *before;          /* parameters before the update (f32 parameters only) */
    size_t before_n;
    float *now; /* one parameter after the update (the largest one's size) */
    int have_before;
} ts_monitor;

/* Groups: a parameter belongs to the group named by its name up to the
 * last '.' ("net.0.weight" -> "net.0"; a name without '.' is its own
 * group). The plan must have monitors (ts_compile_options.monitors). */
ts_status ts_monitor_new(const ts_plan *p, int window, int warmup, int update_ratio_every,
                         ts_monitor **out);
void ts_monitor_free(ts_monitor *m);
ts_status ts_monitor_read(ts_monitor *m, const ts_plan *p, double loss);
ts_status ts_monitor_before_update(ts_monitor *m, const ts_plan *p);
ts_status ts_monitor_after_update(ts_monitor *m, const ts_plan *p);
/* Push this step's finite values into the baselines (clipped, see
 * ts_baseline_push); push 0 leaves the step out (a step the loss scaler
 * skipped: its gradients overflowed and say nothing about the run). */
void ts_monitor_commit(ts_monitor *m, int push);

#endif
