/* alert.h — alert rules over the gradient monitors (monitor.h), as the
 * config's `alerts.rules` gives them (docs/observability.md):
 *
 *     metric=grad_norm ratio_to_baseline=10 for_steps=1 action=pause
 *
 * Each rule watches one metric (loss, grad_norm, grad_variance,
 * update_ratio, nonfinite_grads) with one condition (above=X, below=X,
 * ratio_to_baseline=X, non_finite=true) that must hold for for_steps
 * consecutive steps (default 1) and then fires its action (log, snapshot,
 * skip_step, pause, stop, webhook) and starts counting again.
 *
 *     ts_alerts *al;
 *     ts_alerts_new(cfg_rules, 1, webhook_url, &al);   // 1: defaults when no rules
 *     al->cooldown = 100;                               // optional, see ts_alerts
 *     // in the update gate, after ts_monitor_read:
 *     al->step = step;
 *     al->skip_metrics = overflow ? ~(1u << TS_MON_LOSS) : 0;  // a loss-scaler skip
 *     ts_alert_outcome o;
 *     ts_alerts_eval(al, mon, TS_ALERT_BEFORE_UPDATE, &o);
 *     int skip = (o.actions >> TS_AA_SKIP) & 1;  // all-reduced (MAX) across ranks
 *     // after the step (update_ratio rules):
 *     ts_alerts_eval(al, mon, TS_ALERT_AFTER_UPDATE, &o2);
 *     ts_alerts_free(al);
 */
#ifndef TS_OBS_ALERT_H
#define TS_OBS_ALERT_H

#include "obs/monitor.h"

typedef enum ts_alert_cond { TS_AC_ABOVE, TS_AC_BELOW, TS_AC_RATIO, TS_AC_NONFINITE } ts_alert_cond;

typedef enum ts_alert_action {
    TS_AA_LOG,
    TS_AA_SNAPSHOT,
    TS_AA_SKIP,
    TS_AA_PAUSE,
    TS_AA_STOP,
    TS_AA_WEBHOOK,
    TS_AA_COUNT
} ts_alert_action;

/* When a rule is evaluated: update_ratio only exists after the update. */
enum { TS_ALERT_BEFORE_UPDATE = 0, TS_ALERT_AFTER_UPDATE = 1 };

typedef struct ts_alert_rule {
    char name[64];
    int metric; /* ts_mon_metric */
    int cond;   /* ts_alert_cond */
    double threshold;
    int for_steps;
    int action; /* ts_alert_action */
    char url[256];
    int streak;    /* consecutive steps the condition held */
    int64_t fired; /* times fired */
    int64_t acted; /* step its cooldown counts from (-1: none yet) */
} ts_alert_rule;

typedef struct ts_alert_event {
    const ts_alert_rule *rule;
    double value;    /* the metric's value this step */
    double baseline; /* the baseline mean (NaN before the warm-up ends) */
    double z;        /* (value - mean) / std against the baseline (NaN before) */
    int held;        /* fired within the rule's cooldown: reported, action not taken */
} ts_alert_event;

enum { TS_ALERT_MAX_EVENTS = 32 };
typedef struct ts_alert_outcome {
    int n;
    ts_alert_event ev[TS_ALERT_MAX_EVENTS];
    unsigned actions; /* bit 1 << ts_alert_action for every action to take */
} ts_alert_outcome;

/* Actions a cooldown holds back (they cost a checkpoint, a wait or a
 * message); log, skip_step and stop always act. */
#define TS_ALERT_COOLDOWN_ACTIONS                                                                  \
    ((1u << TS_AA_SNAPSHOT) | (1u << TS_AA_PAUSE) | (1u << TS_AA_WEBHOOK))

typedef struct ts_alerts {
    ts_alert_rule *rules;
    int n;
    char webhook_url[256];
    /* Set by the caller (0 after ts_alerts_new): */
    int64_t cooldown;      /* steps after a rule's snapshot/pause/webhook before it takes
                              one again; firings in between are events with held = 1 */
    int64_t step;          /* the step being evaluated (for the cooldown) */
    unsigned skip_metrics; /* bits 1 << ts_mon_metric: rules on these metrics are not
                              evaluated this step (streaks kept) */
} ts_alerts;

const char *ts_alert_action_name(int action);
const char *ts_alert_cond_name(int cond);
/* Parse one rule "key=value ..." (keys: name, metric, above, below,
 * ratio_to_baseline, non_finite, for_steps, action, url). */
ts_status ts_alert_rule_parse(const char *text, ts_alert_rule *out);
/* Rules from the comma-separated list `rules` (the config's alerts.rules);
 * with none and `defaults`, the default rules (ts_alert_default_rules). */
ts_status ts_alerts_new(const char *rules, int defaults, const char *webhook_url, ts_alerts **out);
void ts_alerts_free(ts_alerts *a);
/* The default rules as alerts.rules text. */
const char *ts_alert_default_rules(void);
/* "grad_norm above 150 for 1 step" */
const char *ts_alert_describe(const ts_alert_rule *r, char *buf, size_t n);
/* Evaluate the rules of one phase against this step's monitor values. */
void ts_alerts_eval(ts_alerts *a, const ts_monitor *m, int phase, ts_alert_outcome *out);
/* The JSON body of an alert (webhook, audit log); caller frees. */
char *ts_alert_json(const ts_alert_event *e, int64_t step, int rank, const char *run_dir);

#endif
