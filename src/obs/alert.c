/* Alert rules (alert.h): parsing, defaults and evaluation. What an action
 * does to the run (snapshot, pause, stop, skip) is the session's business;
 * this file only decides which rules fire. */
#include "obs/alert.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

static const char *const action_names[TS_AA_COUNT] = {"log",   "snapshot", "skip_step",
                                                      "pause", "stop",     "webhook"};
static const char *const cond_names[] = {"above", "below", "ratio_to_baseline", "non_finite"};

/* Defaults must never stop a healthy run, so they judge each run against
 * its own recent past (the baseline, after its warm-up) rather than fixed
 * numbers: a fresh model's gradient norm can be anything (W1 at batch 16
 * starts near 30 and peaks at 227 by step 6, then falls below 1). A norm
 * 10x its baseline pauses; a variance 20x its baseline is worth a look (at
 * 8x, 7 000 steps of a healthy breast_cancer run fired 24 times on batch
 * noise; at 20x none, while tiny_gpt's loss spike at step 2 651, 0.004 ->
 * 1.9, is caught by both). A non-finite loss is skipped until it happens
 * three times in a row. */
static const char default_rules[] =
    "name=grad_norm_explosion metric=grad_norm ratio_to_baseline=10 action=pause, "
    "name=grad_variance_spike metric=grad_variance ratio_to_baseline=20 action=snapshot, "
    "name=nonfinite_loss metric=loss non_finite=true action=skip_step, "
    "name=nonfinite_loss_stop metric=loss non_finite=true for_steps=3 action=stop";

const char *ts_alert_default_rules(void) {
    return default_rules;
}

const char *ts_alert_action_name(int action) {
    return action >= 0 && action < TS_AA_COUNT ? action_names[action] : "?";
}

const char *ts_alert_cond_name(int cond) {
    return cond >= 0 && cond < 4 ? cond_names[cond] : "?";
}

static int find_name(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static ts_status bad_rule(const char *text, const char *why) {
    return ts_fail(TS_ERR_INVALID, "alerts.rules: '%s': %s", text, why);
}

static int parse_num(const char *s, double *v) {
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *s && !*end && !errno && isfinite(*v);
}

ts_status ts_alert_rule_parse(const char *text, ts_alert_rule *r) {
    memset(r, 0, sizeof *r);
    r->metric = r->cond = r->action = -1;
    r->for_steps = 1;
    char buf[1024], msg[320];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
        return bad_rule(text, "rule too long");
    for (char *save = NULL, *tok = strtok_r(buf, " \t", &save); tok;
         tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || !eq[1]) {
            snprintf(msg, sizeof msg, "'%.200s' is not key=value", tok);
            return bad_rule(text, msg);
        }
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        int c = find_name(cond_names, 4, k);
        double x;
        if (!strcmp(k, "name")) {
            snprintf(r->name, sizeof r->name, "%s", v);
        } else if (!strcmp(k, "metric")) {
            if ((r->metric = ts_mon_metric_find(v)) < 0) {
                snprintf(msg, sizeof msg,
                         "unknown metric '%.100s' (loss, grad_norm, grad_variance, update_ratio, "
                         "nonfinite_grads)",
                         v);
                return bad_rule(text, msg);
            }
        } else if (c >= 0) {
            if (r->cond >= 0) return bad_rule(text, "more than one condition");
            r->cond = c;
            if (c == TS_AC_NONFINITE) {
                if (strcmp(v, "true")) return bad_rule(text, "non_finite takes the value true");
            } else if (!parse_num(v, &r->threshold)) {
                snprintf(msg, sizeof msg, "%s needs a number, got '%.100s'", k, v);
                return bad_rule(text, msg);
            }
        } else if (!strcmp(k, "for_steps")) {
            if (!parse_num(v, &x) || x < 1 || x > 1e9 || x != floor(x))
                return bad_rule(text, "for_steps must be an integer in [1, 1e9]");
            r->for_steps = (int)x;
        } else if (!strcmp(k, "action")) {
            if ((r->action = find_name(action_names, TS_AA_COUNT, v)) < 0) {
                snprintf(msg, sizeof msg,
                         "unknown action '%.100s' (log, snapshot, skip_step, pause, stop, "
                         "webhook)",
                         v);
                return bad_rule(text, msg);
            }
        } else if (!strcmp(k, "url")) {
            if (snprintf(r->url, sizeof r->url, "%s", v) >= (int)sizeof r->url)
                return bad_rule(text, "url too long");
        } else {
            snprintf(msg, sizeof msg,
                     "unknown key '%.100s' (name, metric, above, below, ratio_to_baseline, "
                     "non_finite, for_steps, action, url)",
                     k);
            return bad_rule(text, msg);
        }
    }
    if (r->metric < 0) return bad_rule(text, "needs metric=...");
    if (r->cond < 0)
        return bad_rule(text, "needs one of above=, below=, ratio_to_baseline=, "
                              "non_finite=true");
    if (r->action < 0) return bad_rule(text, "needs action=...");
    if (r->cond == TS_AC_RATIO && !(r->threshold > 0))
        return bad_rule(text, "ratio_to_baseline must be > 0");
    if (r->metric == TS_MON_UPDATE_RATIO && r->action == TS_AA_SKIP)
        return bad_rule(text, "update_ratio is measured after the update: it cannot skip it");
    if (!r->name[0]) { /* e.g. loss_non_finite_3_stop */
        char n[24] = "";
        if (r->for_steps > 1) snprintf(n, sizeof n, "_%d", r->for_steps);
        snprintf(r->name, sizeof r->name, "%s_%s%s_%s", ts_mon_metric_name(r->metric),
                 ts_alert_cond_name(r->cond), n, ts_alert_action_name(r->action));
    }
    return TS_OK;
}

void ts_alerts_free(ts_alerts *a) {
    if (!a) return;
    free(a->rules);
    free(a);
}

ts_status ts_alerts_new(const char *rules, int defaults, const char *webhook_url, ts_alerts **out) {
    *out = NULL;
    const char *text = rules && *rules ? rules : defaults ? default_rules : "";
    ts_alerts *a = ts_zalloc(sizeof *a, "alerts");
    if (!a) return TS_ERR_NOMEM;
    int cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    if (!(a->rules = ts_zalloc(sizeof *a->rules * (size_t)cap, "alert rules"))) {
        ts_alerts_free(a);
        return TS_ERR_NOMEM;
    }
    snprintf(a->webhook_url, sizeof a->webhook_url, "%s", webhook_url ? webhook_url : "");
    ts_status s = TS_OK;
    for (const char *p = text; *p && s == TS_OK;) {
        size_t len = strcspn(p, ",");
        char one[1024];
        while (len && isspace((unsigned char)*p)) p++, len--;
        snprintf(one, sizeof one, "%.*s", (int)len, p);
        for (size_t k = strlen(one); k && isspace((unsigned char)one[k - 1]); k--) one[k - 1] = 0;
        p += len;
        if (*p == ',') p++;
        if (!one[0]) continue;
        ts_alert_rule *r = &a->rules[a->n];
        if ((s = ts_alert_rule_parse(one, r)) != TS_OK) break;
        r->acted = -1;
        if (r->action == TS_AA_WEBHOOK && !r->url[0] && !a->webhook_url[0])
            s = bad_rule(one, "action webhook needs url=... or alerts.webhook_url");
        for (int i = 0; i < a->n && s == TS_OK; i++)
            if (!strcmp(a->rules[i].name, r->name))
                s = bad_rule(one, "two rules have this name (set name=...)");
        a->n++;
    }
    if (s != TS_OK) {
        ts_alerts_free(a);
        return s;
    }
    *out = a;
    return TS_OK;
}

const char *ts_alert_describe(const ts_alert_rule *r, char *buf, size_t n) {
    char thr[48] = "";
    if (r->cond != TS_AC_NONFINITE) snprintf(thr, sizeof thr, " %g", r->threshold);
    snprintf(buf, n, "%s %s%s for %d step%s", ts_mon_metric_name(r->metric),
             ts_alert_cond_name(r->cond), thr, r->for_steps, r->for_steps == 1 ? "" : "s");
    return buf;
}

static int holds(const ts_alert_rule *r, const ts_monitor *m, double v, double *base) {
    *base = ts_baseline_ready(&m->base[r->metric]) ? ts_baseline_mean(&m->base[r->metric]) : NAN;
    switch (r->cond) {
    case TS_AC_ABOVE: return v > r->threshold;
    case TS_AC_BELOW: return v < r->threshold;
    case TS_AC_RATIO: return !isnan(*base) && *base > 0 && v > r->threshold * *base;
    case TS_AC_NONFINITE:
        if (r->metric == TS_MON_NONFINITE) return v > 0;
        return !isfinite(v) && !(r->metric == TS_MON_UPDATE_RATIO && isnan(v));
    }
    return 0;
}

void ts_alerts_eval(ts_alerts *a, const ts_monitor *m, int phase, ts_alert_outcome *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; a && i < a->n; i++) {
        ts_alert_rule *r = &a->rules[i];
        const int rp =
            r->metric == TS_MON_UPDATE_RATIO ? TS_ALERT_AFTER_UPDATE : TS_ALERT_BEFORE_UPDATE;
        if (rp != phase) continue;
        /* An update ratio of a step without one (skipped, or not measured)
         * neither holds nor breaks a streak. */
        const double v = m->value[r->metric];
        if (r->metric == TS_MON_UPDATE_RATIO && isnan(v)) continue;
        /* Metrics the caller says mean nothing this step (a step the loss
         * scaler skipped) neither hold nor break a streak either. */
        if ((a->skip_metrics >> r->metric) & 1) continue;
        double base;
        if (!holds(r, m, v, &base)) {
            r->streak = 0;
            continue;
        }
        if (++r->streak < r->for_steps) continue;
        r->streak = 0;
        r->fired++;
        int held = 0;
        if ((TS_ALERT_COOLDOWN_ACTIONS >> r->action) & 1) {
            held = a->cooldown > 0 && r->acted >= 0 && a->step - r->acted < a->cooldown;
            if (!held) r->acted = a->step;
        }
        if (!held) out->actions |= 1u << r->action;
        if (out->n < TS_ALERT_MAX_EVENTS)
            out->ev[out->n++] =
                (ts_alert_event){r, v, base, ts_baseline_z(&m->base[r->metric], v), held};
    }
}

static json_t *jnum(double v) {
    return isfinite(v) ? json_real(v) : json_string(isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
}

char *ts_alert_json(const ts_alert_event *e, int64_t step, int rank, const char *run_dir) {
    const ts_alert_rule *r = e->rule;
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:o, s:o, s:i, s:s, s:I, s:i, s:s}", "rule", r->name, "metric",
        ts_mon_metric_name(r->metric), "condition", ts_alert_cond_name(r->cond), "threshold",
        r->cond == TS_AC_NONFINITE ? json_null() : jnum(r->threshold), "value", jnum(e->value),
        "for_steps", r->for_steps, "action", ts_alert_action_name(r->action), "step",
        (json_int_t)step, "rank", rank, "run_dir", run_dir ? run_dir : "");
    if (o && !isnan(e->baseline)) json_object_set_new(o, "baseline", jnum(e->baseline));
    if (o && !isnan(e->z)) json_object_set_new(o, "z", jnum(e->z));
    if (o && e->held) json_object_set_new(o, "held", json_true());
    char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return txt;
}
