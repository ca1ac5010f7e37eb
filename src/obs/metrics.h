/* metrics.h — a registry of Prometheus metrics and its text rendering.
 *
 * A registry holds metric families (counters, gauges, histograms with fixed
 * buckets), each with an optional list of label names. A family has one
 * series per combination of label values; the registry's constant labels
 * (tessel sets `rank`) are added to every series.
 *
 *     ts_metrics *m;
 *     ts_metric *loss, *coll;
 *     ts_series *ar;
 *     ts_metrics_create(&m);
 *     ts_metrics_const_label(m, "rank", "0");
 *     ts_metrics_gauge(m, "tessel_loss", "Training loss.", 0, NULL, &loss);
 *     ts_metrics_counter(m, "tessel_collective_bytes_total", "Bytes sent.", 1,
 *                        (const char *[]){"op"}, &coll);
 *     ts_metric_series(coll, (const char *[]){"allreduce"}, &ar);  // once
 *     ...
 *     ts_metric_set(loss, 2.31);          // every step: lock-free, no allocation
 *     ts_series_inc(ar, 4096);
 *     char *text; size_t n;
 *     ts_metrics_render(m, &text, &n);    // text format 0.0.4; free(text)
 *
 * Thread safety: registering families and creating series take the
 * registry's mutex, so they may run while another thread renders. Updates
 * through a family or series handle are atomic and lock-free, so the
 * training thread never waits for a scrape. Handles stay valid until
 * ts_metrics_free, which must not run concurrently with anything else.
 *
 * Rendering follows the Prometheus text exposition format 0.0.4: families
 * in registration order, each as one contiguous block of HELP, TYPE and its
 * samples; histograms as cumulative `_bucket{le=...}` lines ending with
 * `le="+Inf"`, then `_sum` and `_count` (equal to the +Inf bucket). */
#ifndef TS_OBS_METRICS_H
#define TS_OBS_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/status.h"

/* Label names per family, constant labels included. */
#define TS_METRIC_MAX_LABELS 8
/* Bucket bounds per histogram (the implicit +Inf bucket not counted). */
#define TS_METRIC_MAX_BUCKETS 64

typedef enum ts_metric_type {
    TS_METRIC_COUNTER,
    TS_METRIC_GAUGE,
    TS_METRIC_HISTOGRAM
} ts_metric_type;

typedef struct ts_metrics ts_metrics; /* the registry */
typedef struct ts_metric ts_metric;   /* one family */
typedef struct ts_series ts_series;   /* one family's series for one set of label values */

ts_status ts_metrics_create(ts_metrics **out);
/* Frees the registry, its families and series (NULL is ignored). */
void ts_metrics_free(ts_metrics *m);

/* A label added to every series of the registry, before the family's own
 * labels (e.g. rank="3"). Setting an existing name replaces its value. */
ts_status ts_metrics_const_label(ts_metrics *m, const char *name, const char *value);

/* Register a family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*, label
 * names [a-zA-Z_][a-zA-Z0-9_]* without a leading "__"; names already used
 * (including a histogram's _bucket/_sum/_count) are refused. `help` may be
 * NULL. A family without labels has its single series from the start. */
ts_status ts_metrics_counter(ts_metrics *m, const char *name, const char *help, int n_labels,
                             const char *const *labels, ts_metric **out);
ts_status ts_metrics_gauge(ts_metrics *m, const char *name, const char *help, int n_labels,
                           const char *const *labels, ts_metric **out);
/* `bounds`: n_bounds finite upper bounds in increasing order (a trailing
 * +Inf is accepted and dropped: the +Inf bucket is always there). */
ts_status ts_metrics_histogram(ts_metrics *m, const char *name, const char *help, int n_labels,
                               const char *const *labels, int n_bounds, const double *bounds,
                               ts_metric **out);

/* n bounds start, start*factor, start*factor^2, ... (start > 0, factor > 1). */
ts_status ts_metrics_exp_buckets(double start, double factor, int n, double *out);

/* The series of `f` for the given label values (one per label name, in the
 * family's order), created on first use. Values may hold any UTF-8 text. */
ts_status ts_metric_series(ts_metric *f, const char *const *values, ts_series **out);

/* Counter: add delta >= 0. Gauge: add any finite or infinite delta. */
ts_status ts_series_inc(ts_series *s, double delta);
/* Gauge only. */
ts_status ts_series_set(ts_series *s, double value);
/* Histogram only: count `value` in the first bucket whose bound is >= it. */
ts_status ts_series_observe(ts_series *s, double value);
/* Counter or gauge: the current value. Histogram: the sum of observations. */
double ts_series_value(const ts_series *s);
/* Histogram: the number of observations (0 for other types). */
uint64_t ts_series_count(const ts_series *s);

/* Leave the family's series out of the rendering until each is first
 * updated (for values a run may never have, where 0 would mislead). */
void ts_metric_lazy(ts_metric *f);

/* The same operations on the single series of a family without labels; a
 * family with labels gives TS_ERR_INVALID. */
ts_status ts_metric_inc(ts_metric *f, double delta);
ts_status ts_metric_set(ts_metric *f, double value);
ts_status ts_metric_observe(ts_metric *f, double value);

/* Render every family in the text format 0.0.4 into a NUL-terminated
 * string the caller frees with free(); *len (may be NULL) is its length. */
ts_status ts_metrics_render(ts_metrics *m, char **text, size_t *len);

/* ---- tessel's standard training metrics ----------------------------------
 *
 * One registry with the `rank` constant label and every family an operator
 * watches. The session fills a ts_step_metrics after each step and calls
 * ts_train_metrics_step; the other families are updated where the event
 * happens (a collective, a checkpoint, an alert). */
typedef struct ts_train_metrics {
    ts_metrics *reg;
    ts_metric *build_info;         /* gauge {version} = 1 */
    ts_metric *step;               /* gauge: last completed step */
    ts_metric *steps;              /* counter: steps run by this process */
    ts_metric *loss;               /* gauge */
    ts_metric *learning_rate;      /* gauge */
    ts_metric *samples_per_second; /* gauge */
    ts_metric *tokens_per_second;  /* gauge */
    ts_metric *step_seconds;       /* histogram of step wall time */
    ts_metric *grad_norm;          /* gauge: global gradient L2 norm */
    ts_metric *group_grad_norm;    /* gauge {group} */
    ts_metric *grad_variance;      /* gauge */
    ts_metric *update_ratio;       /* gauge {group}: |update| / |param| */
    ts_metric *loss_scale;         /* gauge */
    ts_metric *skipped_steps;      /* counter {reason} */
    ts_metric *collective_bytes;   /* counter {op} */
    ts_metric *collective_seconds; /* counter {op} */
    ts_metric *collectives;        /* counter {op}: calls */
    ts_metric *checkpoint_seconds; /* histogram of checkpoint write time */
    ts_metric *arena_bytes;        /* gauge: plan arena size */
    ts_metric *resident_bytes;     /* gauge: process resident set size */
    ts_metric *anomalies;          /* counter {kind} */
    ts_metric *alerts;             /* counter {rule, action} */
    /* Input pipeline (docs/data.md): seconds steps waited for their batch. */
    ts_metric *data_wait_seconds; /* counter */
    double data_wait_seen;        /* the loader's total at the last step */
} ts_train_metrics;

/* Creates tm->reg with rank="<rank>" (no rank label when rank < 0) and
 * registers every family above. On failure nothing is left allocated. */
ts_status ts_train_metrics_create(int rank, ts_train_metrics *tm);
void ts_train_metrics_free(ts_train_metrics *tm);

/* One step's values. Fields other than step and loss are optional: NaN
 * leaves the metric as it was (loss is always published, NaN included, so
 * a diverging run shows up as NaN on the dashboard). */
typedef struct ts_step_metrics {
    int64_t step;
    double loss;
    double seconds; /* wall time of the step */
    double learning_rate, samples_per_s, tokens_per_s;
    double grad_norm, grad_variance, loss_scale;
    /* Seconds the loader has waited for batches since it was made
     * (ts_loader_wait_seconds); the counter grows by the difference. */
    double data_wait_total_s;
} ts_step_metrics;

/* A ts_step_metrics with step 0, loss NaN and every optional field NaN. */
ts_step_metrics ts_step_metrics_empty(void);

/* Publish one step: step, steps, loss, the optional gauges, one
 * step_seconds observation, and resident memory from /proc/self/statm. */
ts_status ts_train_metrics_step(ts_train_metrics *tm, const ts_step_metrics *s);

/* Shorthand for the labelled families (the series is created on first use,
 * then found under the registry mutex). */
ts_status ts_train_metrics_collective(ts_train_metrics *tm, const char *op, double bytes,
                                      double seconds);
ts_status ts_train_metrics_anomaly(ts_train_metrics *tm, const char *kind);
ts_status ts_train_metrics_alert(ts_train_metrics *tm, const char *rule, const char *action);
ts_status ts_train_metrics_skipped(ts_train_metrics *tm, const char *reason);
ts_status ts_train_metrics_group(ts_train_metrics *tm, const char *group, double grad_norm,
                                 double update_ratio);

/* Resident set size of this process in bytes (from /proc/self/statm). */
ts_status ts_metrics_resident_bytes(uint64_t *bytes);

#endif
