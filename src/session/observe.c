/* Observation (docs/observability.md): the Prometheus metrics and their
 * endpoint, TensorBoard events and histograms, the global gradient norm,
 * gradient monitors and alert rules with their actions, and the --trace
 * timeline. See session_internal.h. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"
#include "obs/trace.h"
#include "plan/plan.h"
#include "session/repro.h"
#include "session/pipe_train.h"
#include "session/session_internal.h"

/* The metrics registry and the /metrics endpoint, started before the run
 * directory is made (a taken port leaves no trace) and before the first
 * step; also the buffer the gradient norm and the histograms read into. */
ts_status ts_sess_observe_start(session *s) {
    const ts_config *c = &s->c;
    size_t most = sizeof(float);
    for (int i = 0; i < ts_plan_param_count(s->plan); i++) {
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(s->plan, ts_plan_param_name(s->plan, i), &dt, &rank, dims) ==
                TS_OK &&
            dt == TS_F32) {
            const size_t b = (size_t)numel_dims(rank, dims) * sizeof(float);
            if (b > most) most = b;
        }
    }
    if (!(s->gbuf = ts_alloc(most, "gradient read-back buffer"))) return TS_ERR_NOMEM;
    s->gbuf_bytes = most;
    if (c->observe.metrics_port <= 0) return TS_OK;
    ts_status st = ts_train_metrics_create(s->rank, &s->tm);
    if (st != TS_OK) return st;
    s->tm_made = 1;
    ts_plan_stats ps;
    if (ts_plan_get_stats(s->plan, &ps) == TS_OK)
        ts_metric_set(s->tm.arena_bytes, (double)ps.arena_bytes);
    const char *addr = c->observe.metrics_addr[0] ? c->observe.metrics_addr : "127.0.0.1";
    st = ts_http_serve_metrics(s->tm.reg, addr, c->observe.metrics_port, &s->http);
    if (st != TS_OK) {
        ts_error_prefix("observe.metrics_port");
        return st;
    }
    ts_progress_log(&s->pr, "metrics: http://%s%s%s:%d/metrics", strchr(addr, ':') ? "[" : "", addr,
                    strchr(addr, ':') ? "]" : "", ts_http_port(s->http));
    return TS_OK;
}

/* Every collective of a data-parallel run: its bytes and time in the
 * metrics, its span in the --trace timeline. Runs on the thread that ran
 * the collective (the communication thread for the gradient buckets). */
void ts_sess_comm_span(const ts_comm_span *sp, void *user) {
    session *s = user;
    if (s->trace) ts_trace_comm_span(sp, s->trace);
    if (s->tm_made)
        ts_train_metrics_collective(&s->tm, ts_coll_kind_name(sp->kind), (double)sp->bytes,
                                    sp->end - sp->start);
}

/* TensorBoard events under RUN_DIR/tb/, once the run directory exists. */
ts_status ts_sess_tensorboard_start(session *s) {
    if (!s->r->run_dir[0] || !s->c.observe.tensorboard) return TS_OK;
    char dir[640], suffix[64];
    snprintf(dir, sizeof dir, "%s/tb", s->r->run_dir);
    ts_tfevents_options o = ts_tfevents_options_default();
    if (s->ck) {
        /* A resumed run adds a file next to the earlier ones, which may
         * have been opened in this same second. */
        snprintf(suffix, sizeof suffix, ".resumed-step%lld.%ld", (long long)s->start_step,
                 (long)getpid());
        o.suffix = suffix;
    }
    ts_status st = ts_tfevents_open(dir, &o, &s->tb);
    if (st != TS_OK) ts_error_prefix("observe.tensorboard");
    return st;
}

/* Stop the endpoint and close the event file (idempotent). */
ts_status ts_sess_observe_end(session *s) {
    ts_http_stop(s->http);
    s->http = NULL;
    ts_status st = TS_OK;
    if (s->tb) {
        st = ts_tfevents_close(s->tb);
        s->tb = NULL;
        if (st != TS_OK) ts_error_prefix("closing the TensorBoard events");
    }
    return st;
}

/* Read float32 value `name` into s->gbuf; *n = 0 for a value that is not
 * float32 or not there (a parameter without a gradient). */
static ts_status read_f32(session *s, const char *name, int64_t *n) {
    ts_dtype dt;
    int rank;
    int64_t dims[TS_MAX_RANK];
    *n = 0;
    if (ts_plan_value_info(s->plan, name, &dt, &rank, dims) != TS_OK || dt != TS_F32) return TS_OK;
    const int64_t k = numel_dims(rank, dims);
    if ((size_t)k * sizeof(float) > s->gbuf_bytes) return TS_OK;
    ts_status st = ts_plan_read(s->plan, name, s->gbuf, (size_t)k * sizeof(float));
    if (st == TS_OK) *n = k;
    return st;
}

/* The global L2 norm of the gradients, computed in place in the plan's
 * gradient region (not yet a monitor node of the step graph), and with
 * `hist` the histograms of every parameter and its gradient. */
static ts_status gradient_pass(session *s, int64_t step, int hist, double *norm) {
    char name[600];
    int64_t n;
    /* dist.reproducible: the monitors saw the last micro-batch only. */
    ts_status st = s->rp ? ts_repro_grad_norm(s->rp, norm) : ts_plan_grad_norm(s->plan, norm);
    if (s->pipe) *norm = ts_sess_pipe_grad_norm(s), hist = 0; /* s->plan does not step */
    /* ZeRO-3: parameters and gradients are sharded after the step; no
     * histograms (docs/distributed.md) */
    if (s->nranks > 1 && s->c.dist.zero == 3) hist = 0;
    if (hist && s->rp) ts_repro_sync_grads(s->rp); /* the gradients, where the update read them */
    for (int i = 0; hist && i < ts_plan_param_count(s->plan) && st == TS_OK; i++) {
        const char *p = ts_plan_param_name(s->plan, i);
        if ((st = read_f32(s, p, &n)) != TS_OK) break;
        snprintf(name, sizeof name, "weights/%s", p);
        if (n && (st = ts_tfevents_histogram(s->tb, step, name, s->gbuf, n, NULL)) != TS_OK) break;
        snprintf(name, sizeof name, "grad:%s", p);
        if (s->nranks > 1 && s->c.dist.zero == 2) continue; /* ZeRO-2: gone after the step */
        if ((st = read_f32(s, name, &n)) != TS_OK) break;
        snprintf(name, sizeof name, "grads/%s", p);
        if (n) st = ts_tfevents_histogram(s->tb, step, name, s->gbuf, n, NULL);
    }
    return st;
}

/* Everything published after a step: the Prometheus metrics, the
 * TensorBoard scalars and (every observe.histogram_every steps, and at the
 * first step) the histograms. *grad_norm gets the global gradient norm. */
ts_status ts_sess_observe_step(session *s, int64_t step, double loss, double lr, double dt,
                               double rate, double *grad_norm) {
    const ts_config *c = &s->c;
    const int64_t every = c->observe.histogram_every;
    const int hist = s->tb && every > 0 && (step % every == 0 || step == s->start_step + 1);
    ts_status st = gradient_pass(s, step, hist, grad_norm);
    if (st != TS_OK) return st;
    if (s->tm_made) {
        ts_step_metrics m = ts_step_metrics_empty();
        m.step = step;
        m.loss = loss;
        m.seconds = dt;
        m.learning_rate = lr;
        m.samples_per_s = s->gpt ? rate / (double)c->model.ctx : rate;
        if (s->gpt) m.tokens_per_s = rate;
        if (s->loader) m.data_wait_total_s = ts_loader_wait_seconds(s->loader);
        m.grad_norm = *grad_norm;
        if (s->ar) m.grad_variance = s->ar->mon->value[TS_MON_GRAD_VARIANCE];
        double scale;
        if (ts_plan_loss_scale(s->plan, &scale, NULL, NULL)) m.loss_scale = scale;
        if ((st = ts_train_metrics_step(&s->tm, &m)) != TS_OK) return st;
        if (ts_plan_found_inf(s->plan) && /* the loss scaler skipped the update */
            (st = ts_train_metrics_skipped(&s->tm, "non_finite_gradients")) != TS_OK)
            return st;
    }
    if (s->tb) {
        static const char *const tags[] = {"train/loss", "train/lr", "train/throughput",
                                           "train/grad_norm"};
        const double v[] = {loss, lr, rate, *grad_norm};
        st = ts_tfevents_scalars(s->tb, step, 4, tags, v);
    }
    if (st == TS_OK && s->tb && s->ar) st = ts_alert_runner_scalars(s->ar, s->tb, step);
    return st;
}

/* ---- alerts (docs/observability.md) ------------------------------------- */

/* The monitors and rules, checked before the run directory exists. */
ts_status ts_sess_alerts_setup(session *s) {
    const ts_config *c = &s->c;
    if (c->debug.inject && ts_dtype_of(s->g, s->m.input) != TS_F32)
        return ts_fail(TS_ERR_INVALID, "debug.inject corrupts a float input x; this model's "
                                       "input is not float32");
    ts_alert_run_config ac = {c->alerts.rules, c->alerts.defaults, c->alerts.webhook_url,
                              c->alerts.baseline_window, c->alerts.baseline_warmup,
                              /* ZeRO-3: no rank holds the parameters whole between steps */
                              s->nranks > 1 && c->dist.zero == 3 ? 0 : c->alerts.update_ratio_every,
                              s->rank, s->nranks > 1 ? s->o->comm : NULL, c->alerts.cooldown};
    ts_status st = ts_alert_runner_new(s->plan, &ac, &s->ar);
    if (st == TS_OK)
        s->ar->snaps = (ts_anomaly_budget){c->alerts.snapshot_max, c->alerts.snapshot_keep, 0, 0};
    /* optim.fused_update: the first update runs inside the backward pass,
     * before most gradients (and their monitors) exist, so the rules are
     * evaluated after the step, as for a plan without an update gate;
     * skip_step cannot take an applied update back (docs/config.md). */
    if (st == TS_OK && c->optim.fused_update) ts_plan_set_update_gate(s->plan, NULL, NULL);
    return st;
}

/* An anomaly checkpoint RUN_DIR/step-N-anomaly/ (actions snapshot and
 * pause), within the budget of alerts.snapshot_max, then retention of the
 * newest alerts.snapshot_keep. */
static ts_status anomaly_snapshot(session *s, int64_t step) {
    ts_session_result *r = s->r;
    ts_alert_runner *ar = s->ar;
    const char *rule = ar->snapshot_rule ? ar->snapshot_rule->name
                       : ar->pause_rule  ? ar->pause_rule->name
                                         : "?";
    if (!r->run_dir[0]) {
        ts_progress_log(&s->pr, "alert: no run directory: no snapshot at step %lld",
                        (long long)step);
        return TS_OK;
    }
    if (!ts_anomaly_admit(&ar->snaps)) {
        ts_progress_log(&s->pr,
                        "alert: no snapshot at step %lld (rule '%s'): this run wrote "
                        "alerts.snapshot_max = %d already",
                        (long long)step, rule, ar->snaps.max);
        return TS_OK;
    }
    ts_status st = TS_OK;
    if (!s->sv && !s->asv) {
        ts_ckpt_options co = ts_ckpt_options_default();
        co.sign_key = ts_config_sign_key(&s->c);
        co.audit = s->audit;
        co.base_path = s->peft_base_path[0] ? s->peft_base_path : NULL;
        co.base_sha256 = s->peft_base_sha;
        if ((st = ts_ckpt_saver_new(r->run_dir, s->plan, &co, &s->asv)) != TS_OK) return st;
    }
    ts_ckpt_saver *sv = s->sv ? s->sv : s->asv;
    if ((st = ts_ckpt_saver_set_tag(sv, "anomaly")) != TS_OK) return st;
    ts_ckpt_meta meta = ts_sess_ckpt_meta(s, step);
    if ((st = ts_sess_lineage_settle(s, 1)) != TS_OK) return st; /* the manifest's hashes */
    st = ts_ckpt_saver_begin(sv, s->plan, &meta);
    if (st == TS_OK) st = ts_ckpt_saver_wait(sv);
    if (st != TS_OK) {
        ts_error_prefix("alert snapshot at step %lld", (long long)step);
        return st;
    }
    ts_progress_log(&s->pr, "alert: snapshot %s/step-%08lld-anomaly (rule '%s')", r->run_dir,
                    (long long)step, rule);
    r->anomaly_snapshots++;
    int removed = 0;
    if ((st = ts_anomaly_retain(r->run_dir, ar->snaps.keep, &removed)) != TS_OK) return st;
    if (removed)
        ts_progress_log(&s->pr,
                        "alert: removed %d older anomaly snapshot%s (alerts.snapshot_keep = %d)",
                        removed, removed == 1 ? "" : "s", ar->snaps.keep);
    return TS_OK;
}

/* A clean stop by an alert rule: checkpoint when the run saves them. */
static ts_status alert_stop(session *s, int64_t step, const char *rule) {
    ts_session_result *r = s->r;
    r->stopped_by_alert = 1;
    snprintf(r->alert_rule, sizeof r->alert_rule, "%s", rule);
    ts_progress_log(&s->pr, "stopped by alert rule '%s' after step %lld", r->alert_rule,
                    (long long)step);
    return s->sv && s->c.ckpt.every > 0 ? ts_sess_save_checkpoint(s, step) : TS_OK;
}

/* A pause that waits for tessel ctl resume at most alerts.pause_timeout
 * seconds; then alerts.pause_timeout_action: stop, or go on without
 * waiting at later pauses (nobody is there to answer them). */
static ts_status alert_pause(session *s, int64_t step) {
    ts_session_result *r = s->r;
    ts_alert_runner *ar = s->ar;
    const char *rule = ar->pause_rule ? ar->pause_rule->name : "?";
    if (!r->run_dir[0]) {
        ts_progress_log(&s->pr, "alert: no run directory to resume through: not pausing");
        return TS_OK;
    }
    if (ar->pause_unanswered) {
        ts_progress_log(&s->pr,
                        "alert: not pausing at step %lld (rule '%s'): an earlier pause of this "
                        "run timed out unanswered",
                        (long long)step, rule);
        return TS_OK;
    }
    ts_pause_end end;
    ts_status st = ts_alert_pause_for(r->run_dir, step, rule, s->c.alerts.pause_timeout, s->o->stop,
                                      &s->pr, &end);
    if (st != TS_OK) return st;
    r->pauses++;
    if (end != TS_PAUSE_TIMED_OUT) return TS_OK;
    if (s->c.alerts.pause_timeout_stop) {
        ts_progress_log(&s->pr, "alert: alerts.pause_timeout_action is stop");
        return alert_stop(s, step, rule);
    }
    ar->pause_unanswered = 1;
    ts_progress_log(&s->pr,
                    "alert: going on (alerts.pause_timeout_action: continue); later pauses of "
                    "this run will not wait");
    return TS_OK;
}

/* What the fired rules do to the run: an anomaly checkpoint (snapshot,
 * and before a pause), the pause itself, or a clean stop. */
ts_status ts_sess_alert_actions(session *s, int64_t step, unsigned act) {
    const int pause = (act >> TS_AA_PAUSE) & 1, stop = (act >> TS_AA_STOP) & 1;
    ts_status st = TS_OK;
    if (((act >> TS_AA_SNAPSHOT) & 1) || pause) st = anomaly_snapshot(s, step);
    if (st != TS_OK) return st;
    if (stop) return alert_stop(s, step, s->ar->stop_rule ? s->ar->stop_rule->name : "");
    return pause ? alert_pause(s, step) : TS_OK;
}

/* ---- --trace -------------------------------------------------------------- */

ts_status ts_session_trace_start(ts_plan *plan, const ts_session_options *o, int64_t steps,
                                 struct ts_trace **out) {
    ts_plan_stats st;
    ts_status s = ts_plan_get_stats(plan, &st);
    if (s != TS_OK) return s;
    /* A span per instruction and step, a few per collective; beyond 1 Mi
     * spans the rest are counted as dropped. */
    double want = ((double)st.n_instructions + 8.0) * (double)(steps + 1) + 1024.0;
    size_t cap = want > (double)(1 << 20) ? (size_t)1 << 20 : (size_t)want;
    const int rank = o->comm ? ts_comm_rank(o->comm) : 0;
    if ((s = ts_trace_create(rank, cap, out)) != TS_OK) {
        ts_error_prefix("--trace");
        return s;
    }
    ts_trace_name_thread(*out, "step");
    ts_plan_set_trace(plan, *out);
    /* comm spans reach the trace through the session's comm hook */
    return TS_OK;
}

ts_status ts_session_trace_finish(ts_plan *plan, const ts_session_options *o, struct ts_trace *t,
                                  struct ts_progress *pr) {
    ts_plan_set_trace(plan, NULL);
    if (o->comm) ts_comm_set_trace(o->comm, NULL, NULL);
    const int n = o->comm ? ts_comm_size(o->comm) : 1, rank = o->comm ? ts_comm_rank(o->comm) : 0;
    ts_status s = TS_OK;
    if (n == 1) {
        s = ts_trace_write(t, o->trace);
    } else {
        char mine[1024];
        if (ts_trace_rank_path(o->trace, rank, mine, sizeof mine) != 0)
            return ts_fail(TS_ERR_INVALID, "--trace %s: path too long", o->trace);
        s = ts_trace_write(t, mine);
        /* every rank's file is complete before rank 0 reads them */
        ts_status b = ts_barrier(o->comm);
        if (s == TS_OK) s = b;
        if (s == TS_OK && rank == 0) {
            char(*paths)[1024] = ts_alloc(sizeof *paths * (size_t)n, "--trace");
            const char **pp = ts_alloc(sizeof *pp * (size_t)n, "--trace");
            if (!paths || !pp) s = TS_ERR_NOMEM;
            for (int r = 0; r < n && s == TS_OK; r++) {
                ts_trace_rank_path(o->trace, r, paths[r], sizeof paths[r]);
                pp[r] = paths[r];
            }
            if (s == TS_OK) s = ts_trace_merge(pp, n, o->trace);
            for (int r = 0; s == TS_OK && r < n; r++) unlink(paths[r]);
            free(paths);
            free(pp);
        }
    }
    if (s != TS_OK) {
        ts_error_prefix("--trace %s", o->trace);
        return s;
    }
    if (rank == 0)
        ts_progress_log(pr, "trace: %s (%zu spans%s%zu dropped)", o->trace, ts_trace_count(t),
                        n > 1 ? " on rank 0, " : ", ", ts_trace_dropped(t));
    return TS_OK;
}

void ts_session_trace_close(ts_plan *plan, const ts_session_options *o, struct ts_trace *t) {
    if (!t) return;
    ts_plan_set_trace(plan, NULL);
    if (o->comm) ts_comm_set_trace(o->comm, NULL, NULL);
    ts_trace_free(t);
}
