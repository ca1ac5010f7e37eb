/* Gradient monitors and alert rules in a training run (alert_run.h). */
#include "obs/alert_run.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"
#include "core/fsat.h"
#include "obs/webhook.h"

static double read_loss(const ts_plan *p) {
    ts_dtype dt;
    if (ts_plan_value_info(p, "loss", &dt, NULL, NULL) != TS_OK) return NAN;
    if (dt == TS_F64) {
        double v;
        return ts_plan_read(p, "loss", &v, sizeof v) == TS_OK ? v : NAN;
    }
    float v;
    return ts_plan_read(p, "loss", &v, sizeof v) == TS_OK ? (double)v : NAN;
}

/* 1 when the plan's loss scaler found non-finite gradients this step: it
 * skips the update and backs off the scale, routinely. found_inf is the
 * unscale node's output, current in the gate and after the step. */
static int scaler_overflow(const ts_plan *p) {
    if (!ts_plan_loss_scale(p, NULL, NULL, NULL)) return 0;
    float found = 0;
    return ts_plan_read(p, "found_inf", &found, sizeof found) == TS_OK && found != 0.0f;
}

/* Monitors and the rules that can still stop the update: the gate. On a
 * step the loss scaler skips, the gradients are those of an overflowed
 * scaled loss: only rules on the loss judge it, and it stays out of the
 * baselines (ts_alert_runner_step). */
static ts_status before_update(ts_alert_runner *ar, ts_plan *p, int64_t step) {
    ts_status s = ts_monitor_read(ar->mon, p, read_loss(p));
    if (s == TS_OK) s = ts_monitor_before_update(ar->mon, p);
    if (s != TS_OK) return s;
    ar->overflow = scaler_overflow(p);
    ar->al->step = step;
    ar->al->skip_metrics = ar->overflow ? ~(1u << TS_MON_LOSS) : 0;
    ts_alerts_eval(ar->al, ar->mon, TS_ALERT_BEFORE_UPDATE, &ar->pre);
    return TS_OK;
}

static ts_status gate(ts_plan *p, void *user, ts_gate_decision *out) {
    ts_alert_runner *ar = user;
    /* the gate runs inside step N = the steps done so far + 1 */
    ts_status s = before_update(ar, p, ts_plan_step_count(p) + 1);
    if (s != TS_OK) return s;
    ar->gated = 1;
    /* In data-parallel runs every rank must take the same decision, or
     * the ranks' weights part: one rank's skip is every rank's skip. */
    int32_t skip = (int32_t)((ar->pre.actions >> TS_AA_SKIP) & 1);
    if (ar->cfg.comm && ts_comm_size(ar->cfg.comm) > 1 &&
        (s = ts_allreduce(ar->cfg.comm, &skip, 1, TS_I32, TS_RED_MAX, TS_ALGO_AUTO)) != TS_OK) {
        ts_error_prefix("agreeing on skip_step");
        return s;
    }
    ar->skipped = skip > 0;
    *out = ar->skipped ? TS_GATE_SKIP : TS_GATE_APPLY;
    return TS_OK;
}

ts_status ts_alert_runner_new(ts_plan *plan, const ts_alert_run_config *cfg,
                              ts_alert_runner **out) {
    *out = NULL;
    ts_alert_runner *ar = ts_zalloc(sizeof *ar, "alert runner");
    if (!ar) return TS_ERR_NOMEM;
    ar->plan = plan;
    ar->cfg = *cfg;
    ts_status s = ts_alerts_new(cfg->rules, cfg->defaults, cfg->webhook_url, &ar->al);
    if (s == TS_OK && cfg->cooldown < 0)
        s = ts_fail(TS_ERR_INVALID, "alerts.cooldown %lld must be >= 0", (long long)cfg->cooldown);
    if (s == TS_OK) ar->al->cooldown = cfg->cooldown;
    if (s == TS_OK)
        s = ts_monitor_new(plan, cfg->window, cfg->warmup, cfg->update_ratio_every, &ar->mon);
    if (s != TS_OK) {
        ts_alert_runner_free(ar);
        return s;
    }
    ts_plan_set_update_gate(plan, gate, ar);
    *out = ar;
    return TS_OK;
}

void ts_alert_runner_attach(ts_alert_runner *ar, ts_progress *pr, ts_train_metrics *tm,
                            ts_tfevents *tb, ts_audit *audit, const char *run_dir) {
    ar->pr = pr;
    ar->tm = tm;
    ar->tb = tb;
    ar->audit = audit;
    snprintf(ar->run_dir, sizeof ar->run_dir, "%s", run_dir ? run_dir : "");
}

void ts_alert_runner_free(ts_alert_runner *ar) {
    if (!ar) return;
    if (ar->plan) ts_plan_set_update_gate(ar->plan, NULL, NULL);
    ts_monitor_free(ar->mon);
    ts_alerts_free(ar->al);
    free(ar);
}

/* One fired rule to every sink. A webhook that fails is reported, not
 * fatal: the run goes on. */
static ts_status publish(ts_alert_runner *ar, const ts_alert_event *e, int64_t step) {
    const ts_alert_rule *r = e->rule;
    char desc[160], base[64] = "", held[96] = "";
    if (!isnan(e->baseline))
        snprintf(base, sizeof base, ", baseline %.6g, z %.3g", e->baseline, e->z);
    if (e->held)
        snprintf(held, sizeof held, " (held: cooldown until step %lld)",
                 (long long)(r->acted + ar->al->cooldown));
    if (ar->pr)
        ts_progress_log(ar->pr, "alert: step %lld: rule '%s' (%s): %s = %.6g%s -> %s%s",
                        (long long)step, r->name, ts_alert_describe(r, desc, sizeof desc),
                        ts_mon_metric_name(r->metric), e->value, base,
                        ts_alert_action_name(r->action), held);
    ts_status s = TS_OK;
    if (ar->tm) {
        s = ts_train_metrics_alert(ar->tm, r->name, ts_alert_action_name(r->action));
        char kind[96];
        snprintf(kind, sizeof kind, "%s_%s", ts_mon_metric_name(r->metric),
                 ts_alert_cond_name(r->cond));
        if (s == TS_OK) s = ts_train_metrics_anomaly(ar->tm, kind);
        if (s != TS_OK) return s;
    }
    if (ar->tb) {
        char tag[96];
        snprintf(tag, sizeof tag, "alerts/%s", r->name);
        const char *const tags[] = {tag};
        const double v = isfinite(e->value) ? e->value : (double)r->for_steps;
        if ((s = ts_tfevents_scalars(ar->tb, step, 1, tags, &v)) != TS_OK) return s;
    }
    char *json = ts_alert_json(e, step, ar->cfg.rank, ar->run_dir);
    if (!json) return ts_fail(TS_ERR_NOMEM, "out of memory for an alert");
    if (ar->audit) s = ts_audit_append(ar->audit, "alert", json);
    if (s == TS_OK && r->action == TS_AA_WEBHOOK && !e->held) {
        const char *url = r->url[0] ? r->url : ar->al->webhook_url;
        if (ts_webhook_post(url, json, 5.0) != TS_OK && ar->pr)
            ts_progress_log(ar->pr, "alert: warning: %s", ts_last_error());
        else if (ar->pr)
            ts_progress_log(ar->pr, "alert: rule '%s' posted to %s", r->name, url);
    }
    free(json);
    return s;
}

ts_status ts_alert_runner_step(ts_alert_runner *ar, int64_t step, unsigned *actions) {
    *actions = 0;
    ts_status s = TS_OK;
    /* A plan without an update phase never asks the gate. */
    if (!ar->gated && (s = before_update(ar, ar->plan, step)) != TS_OK) return s;
    if ((s = ts_monitor_after_update(ar->mon, ar->plan)) != TS_OK) return s;
    if (ar->skipped) ar->mon->value[TS_MON_UPDATE_RATIO] = 0; /* nothing was applied */
    ts_alert_outcome post;
    ar->al->step = step;
    ts_alerts_eval(ar->al, ar->mon, TS_ALERT_AFTER_UPDATE, &post);
    ar->stop_rule = ar->pause_rule = ar->snapshot_rule = NULL;
    const ts_alert_outcome *both[2] = {&ar->pre, &post};
    for (int k = 0; k < 2 && s == TS_OK; k++) {
        for (int i = 0; i < both[k]->n && s == TS_OK; i++) {
            const ts_alert_event *e = &both[k]->ev[i];
            if (e->rule->action == TS_AA_STOP && !ar->stop_rule) ar->stop_rule = e->rule;
            if (e->rule->action == TS_AA_PAUSE && !ar->pause_rule && !e->held)
                ar->pause_rule = e->rule;
            if (e->rule->action == TS_AA_SNAPSHOT && !ar->snapshot_rule && !e->held)
                ar->snapshot_rule = e->rule;
            s = publish(ar, e, step);
        }
        *actions |= both[k]->actions;
    }
    ar->fired_total += ar->pre.n + post.n;
    if (ar->skipped) {
        ar->skipped_total++;
        *actions |= 1u << TS_AA_SKIP;
        if (s == TS_OK && ar->tm) s = ts_train_metrics_skipped(ar->tm, "alert");
    }
    if (s == TS_OK && ar->tm) {
        for (int k = 0; k < ar->mon->n_groups && s == TS_OK; k++)
            s = ts_train_metrics_group(ar->tm, ar->mon->groups[k].name, ar->mon->groups[k].norm,
                                       ar->mon->groups[k].update_ratio);
    }
    /* Every step with real gradients joins the baselines, clipped (so an
     * anomaly barely moves them and a new level is learnt: monitor.h); a
     * step the loss scaler skipped has none. */
    if (ar->overflow) ar->overflow_total++;
    ts_monitor_commit(ar->mon, !ar->overflow);
    ar->gated = ar->skipped = ar->overflow = 0;
    memset(&ar->pre, 0, sizeof ar->pre);
    return s;
}

ts_status ts_alert_runner_scalars(const ts_alert_runner *ar, ts_tfevents *tb, int64_t step) {
    const char *tags[] = {"train/grad_variance", "train/update_ratio"};
    const double v[] = {ar->mon->value[TS_MON_GRAD_VARIANCE], ar->mon->value[TS_MON_UPDATE_RATIO]};
    return ts_tfevents_scalars(tb, step, isnan(v[1]) ? 1 : 2, tags, v);
}

void ts_alert_inject(int kind, int64_t first, int count, double scale, int64_t step, void *x,
                     size_t bytes) {
    if (!kind || step < first || step >= first + count || bytes < sizeof(float)) return;
    float *f = x;
    if (kind == 1) {
        f[0] = NAN;
        return;
    }
    for (size_t i = 0; i < bytes / sizeof(float); i++) f[i] = (float)(f[i] * scale);
}

/* ---- pause ------------------------------------------------------------------ */

/* SIGUSR1 ends a pause too (kill -USR1 PID), for schedulers and scripts
 * that signal rather than run tessel ctl. */
static volatile sig_atomic_t usr1_seen;
static void on_usr1(int sig) {
    (void)sig;
    usr1_seen = 1;
}

ts_status ts_alert_pause_for(const char *run_dir, int64_t step, const char *rule, double timeout_s,
                             volatile sig_atomic_t *stop, ts_progress *pr, ts_pause_end *end) {
    *end = TS_PAUSE_STOPPED;
    /* PAUSED and RESUME are reached without following links (core/fsat.h). */
    ts_dir run;
    ts_status ds = ts_dir_open(&run, run_dir, 0);
    if (ds != TS_OK) return ds;
    char text[448];
    snprintf(text, sizeof text,
             "{\"pid\":%ld,\"step\":%lld,\"rule\":\"%.300s\",\"timeout_s\":%.17g}\n",
             (long)getpid(), (long long)step, rule, timeout_s > 0 ? timeout_s : 0.0);
    /* The handler is in place before PAUSED names this pid: a signal sent
     * as soon as the file appears must end the pause, not the process. */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    usr1_seen = 0;
    const int have_usr1 = sigaction(SIGUSR1, &sa, &old_sa) == 0;
    /* a stale request must not end this pause at once */
    ds = ts_dir_unlink(&run, "RESUME");
    if (ds == TS_OK) ds = ts_dir_replace(&run, "PAUSED", text, strlen(text), 0644, 0);
    if (ds != TS_OK) {
        if (have_usr1) sigaction(SIGUSR1, &old_sa, NULL);
        ts_dir_close(&run);
        ts_error_prefix("pause");
        return ds;
    }
    char limit[64] = "";
    if (timeout_s > 0) snprintf(limit, sizeof limit, ", at most %g s", timeout_s);
    if (pr)
        ts_progress_log(pr,
                        "paused after step %lld by alert rule '%s': waiting for `tessel ctl "
                        "resume %s` (pid %ld%s)",
                        (long long)step, rule, run_dir, (long)getpid(), limit);
    const double t0 = ts_now();
    const struct timespec tick = {0, 100 * 1000 * 1000};
    int by_signal = 0;
    while (!(stop && *stop)) {
        struct stat rs;
        if (fstatat(run.fd, "RESUME", &rs, AT_SYMLINK_NOFOLLOW) == 0 || (by_signal = usr1_seen)) {
            *end = TS_PAUSE_RESUMED;
            break;
        }
        if (timeout_s > 0 && ts_now() - t0 >= timeout_s) {
            *end = TS_PAUSE_TIMED_OUT;
            break;
        }
        nanosleep(&tick, NULL);
    }
    if (have_usr1) sigaction(SIGUSR1, &old_sa, NULL);
    /* unlinkat removes a name, never what a link points to */
    (void)unlinkat(run.fd, "RESUME", 0);
    (void)unlinkat(run.fd, "PAUSED", 0);
    ts_dir_close(&run);
    if (pr)
        ts_progress_log(pr, "%s after %.1f s paused at step %lld",
                        *end == TS_PAUSE_STOPPED     ? "stop requested while"
                        : *end == TS_PAUSE_TIMED_OUT ? "nobody resumed the run: timed out"
                        : by_signal                  ? "resumed by SIGUSR1"
                                                     : "resumed by tessel ctl",
                        ts_now() - t0, (long long)step);
    return TS_OK;
}

ts_status ts_alert_pause(const char *run_dir, int64_t step, const char *rule,
                         volatile sig_atomic_t *stop, ts_progress *pr, int *resumed) {
    ts_pause_end end = TS_PAUSE_STOPPED;
    ts_status s = ts_alert_pause_for(run_dir, step, rule, 0, stop, pr, &end);
    *resumed = end == TS_PAUSE_RESUMED;
    return s;
}
