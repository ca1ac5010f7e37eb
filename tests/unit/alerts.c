/* Alert rules and baselines without a training run: rule parsing (both
 * spellings, every error), the default rules, streaks and for_steps,
 * ratio_to_baseline only after the warm-up, the windowed mean/std/z-score,
 * the JSON an alert is sent as, and a runner on a real plan: a NaN step is
 * skipped with the weights unchanged, and every alert reaches the metrics
 * (tessel_alerts_total, tessel_anomalies_total, tessel_skipped_steps_total). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "monitor_fill.h"
#include "obs/alert.h"
#include "obs/alert_run.h"

static void expect_bad(const char *rule, const char *needle) {
    ts_alert_rule r;
    ts_status s = ts_alert_rule_parse(rule, &r);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), needle), "'%s': %s: %s (wanted '%s')",
          rule, ts_status_name(s), ts_last_error(), needle);
}

static void test_parse(void) {
    ts_alert_rule r;
    CHECK_OK(ts_alert_rule_parse("metric=grad_norm above=150 for_steps=2 action=pause", &r));
    CHECK(r.metric == TS_MON_GRAD_NORM && r.cond == TS_AC_ABOVE && r.threshold == 150 &&
              r.for_steps == 2 && r.action == TS_AA_PAUSE &&
              !strcmp(r.name, "grad_norm_above_2_pause"),
          "parsed: %d %d %g %d %d %s", r.metric, r.cond, r.threshold, r.for_steps, r.action,
          r.name);
    CHECK_OK(ts_alert_rule_parse("name=x metric=update_ratio below=1e-6 action=webhook "
                                 "url=http://h/x",
                                 &r));
    CHECK(r.cond == TS_AC_BELOW && r.threshold == 1e-6 && !strcmp(r.url, "http://h/x"),
          "below/url");
    expect_bad("metric=grad_norm action=log", "needs one of above=");
    expect_bad("metric=gradnorm above=1 action=log", "unknown metric 'gradnorm'");
    expect_bad("metric=loss above=x action=log", "above needs a number");
    expect_bad("metric=loss above=1 below=0 action=log", "more than one condition");
    expect_bad("metric=loss non_finite=yes action=log", "non_finite takes the value true");
    expect_bad("metric=loss above=1 action=explode", "unknown action 'explode'");
    expect_bad("metric=loss above=1", "needs action=");
    expect_bad("above=1 action=log", "needs metric=");
    expect_bad("metric=loss above=1 action=log for_steps=0", "for_steps must be");
    expect_bad("metric=loss above=1 action=log colour=red", "unknown key 'colour'");
    expect_bad("metric=loss above", "is not key=value");
    expect_bad("metric=update_ratio above=1 action=skip_step", "cannot skip it");
    expect_bad("metric=loss ratio_to_baseline=0 action=log", "must be > 0");

    ts_alerts *a = NULL;
    CHECK_OK(ts_alerts_new("", 1, "", &a));
    CHECK(a && a->n == 4, "4 default rules");
    ts_alerts_free(a);
    CHECK_OK(ts_alerts_new("", 0, "", &a));
    CHECK(a && a->n == 0, "defaults off: no rules");
    ts_alerts_free(a);
    CHECK(ts_alerts_new("metric=loss above=1 action=webhook", 0, "", &a) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "needs url="),
          "webhook without a URL: %s", ts_last_error());
    CHECK(ts_alerts_new("metric=loss above=1 action=log, metric=loss above=2 action=log", 0, "",
                        &a) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "two rules have this name"),
          "duplicate names: %s", ts_last_error());
}

static void test_baseline(void) {
    ts_baseline b;
    CHECK_OK(ts_baseline_init(&b, 4, 3));
    ts_baseline_push(&b, 1);
    ts_baseline_push(&b, 3);
    CHECK(!ts_baseline_ready(&b) && isnan(ts_baseline_z(&b, 2)), "warm-up");
    ts_baseline_push(&b, NAN); /* not counted */
    ts_baseline_push(&b, 5);
    CHECK(ts_baseline_ready(&b), "ready after 3 finite values");
    CHECK_NEAR(ts_baseline_mean(&b), 3, 1e-15);
    CHECK_NEAR(ts_baseline_std(&b), sqrt(8.0 / 3.0), 1e-15);
    CHECK_NEAR(ts_baseline_z(&b, 7), 4 / sqrt(8.0 / 3.0), 1e-12);
    for (int i = 0; i < 4; i++) ts_baseline_push(&b, 10); /* the window forgets 1, 3, 5 */
    CHECK(ts_baseline_mean(&b) == 10 && ts_baseline_std(&b) == 0, "window of 4");
    CHECK(ts_baseline_z(&b, 10) == 0 && ts_baseline_z(&b, 11) == INFINITY, "constant window");
    ts_baseline_free(&b);
}

static void test_eval(void) {
    ts_monitor m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < TS_MON_COUNT; i++) CHECK_OK(ts_baseline_init(&m.base[i], 10, 3));
    ts_alerts *a = NULL;
    CHECK_OK(ts_alerts_new("name=n metric=grad_norm above=10 for_steps=2 action=log, "
                           "name=v metric=grad_variance ratio_to_baseline=8 action=snapshot, "
                           "name=s metric=loss non_finite=true action=skip_step",
                           0, "", &a));
    ts_alert_outcome o;
    const double norms[] = {1, 11, 1, 11, 11, 11, 11};
    int fired_n[7];
    for (int k = 0; k < 7; k++) {
        tm_set_values(&m, 0.5, norms[k], 1.0);
        ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
        fired_n[k] = o.n;
        ts_monitor_commit(&m, 1);
    }
    /* Streaks: 11 at steps 1, 3-6: fires at 4 and 6 (every 2nd step in a row). */
    CHECK(
        fired_n[1] == 0 && fired_n[3] == 0 && fired_n[4] == 1 && fired_n[5] == 0 && fired_n[6] == 1,
        "for_steps=2: %d %d %d %d %d", fired_n[1], fired_n[3], fired_n[4], fired_n[5], fired_n[6]);
    /* Variance 9x its baseline of 1: the snapshot rule. */
    tm_set_values(&m, 0.5, 1, 9.0);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && o.ev[0].rule->action == TS_AA_SNAPSHOT && o.ev[0].baseline == 1 &&
              o.actions == 1u << TS_AA_SNAPSHOT,
          "ratio_to_baseline: %d events", o.n);
    char *json = ts_alert_json(&o.ev[0], 8, 0, "runs/x");
    CHECK(json && !strcmp(json,
                          "{\"action\":\"snapshot\",\"baseline\":1.0,\"condition\":"
                          "\"ratio_to_baseline\",\"for_steps\":1,\"metric\":"
                          "\"grad_variance\",\"rank\":0,\"rule\":\"v\",\"run_dir\":"
                          "\"runs/x\",\"step\":8,\"threshold\":8.0,\"value\":9.0,\"z\":\"+Inf\"}"),
          "json: %s", json ? json : "(null)");
    free(json);
    tm_set_values(&m, NAN, 1, 1);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && (o.actions >> TS_AA_SKIP & 1), "non-finite loss skips");
    /* Update-ratio rules wait for the after-update phase. */
    ts_alerts_free(a);
    CHECK_OK(ts_alerts_new("metric=update_ratio above=0.1 action=log", 0, "", &a));
    m.value[TS_MON_UPDATE_RATIO] = 0.5;
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 0, "update_ratio before the update");
    ts_alerts_eval(a, &m, TS_ALERT_AFTER_UPDATE, &o);
    CHECK(o.n == 1, "update_ratio after the update");
    ts_alerts_free(a);
    for (int i = 0; i < TS_MON_COUNT; i++) ts_baseline_free(&m.base[i]);
}

/* A runner on a real plan: the gate skips a NaN step (weights unchanged),
 * and every alert reaches the metrics registry with its rank. */
static void test_runner(void) {
    ts_mlp_config mc = {8, 0, 0, 6, 8, 1, 1, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model mdl;
    CHECK_OK(ts_build_mlp(g, &mc, &mdl));
    ts_train_spec spec = ts_train_spec_default(mdl.loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0);
    ts_compile_options opt = ts_compile_options_default();
    opt.monitors = 1;
    opt.threads = 1;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    ts_alert_run_config ac = {"name=nan metric=loss non_finite=true action=skip_step, "
                              "name=big metric=nonfinite_grads above=0 action=log",
                              1,
                              "",
                              5,
                              2,
                              1,
                              0,
                              NULL,
                              0};
    ts_alert_runner *ar = NULL;
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(0, &tm));
    if (p) CHECK_OK(ts_alert_runner_new(p, &ac, &ar));
    if (!ar) return;
    ts_alert_runner_attach(ar, NULL, &tm, NULL, NULL, "");
    float x[8 * 6], y[8];
    for (int i = 0; i < 48; i++) x[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 8; i++) y[i] = 0.5f;
    size_t nb = ts_plan_snapshot_bytes(p);
    unsigned char *before = malloc(nb), *after = malloc(nb);
    for (int step = 1; step <= 3; step++) {
        x[0] = step == 2 ? NAN : 0.f;
        ts_plan_set_input(p, "x", x, sizeof x);
        ts_plan_set_input(p, "y", y, sizeof y);
        ts_plan_snapshot(p, before, nb);
        CHECK_OK(ts_plan_step(p));
        ts_plan_snapshot(p, after, nb);
        unsigned act = 0;
        CHECK_OK(ts_alert_runner_step(ar, step, &act));
        CHECK((step == 2) == ((act >> TS_AA_SKIP) & 1), "step %d: actions %x", step, act);
        CHECK((step == 2) == !memcmp(before, after, nb), "step %d: weights %s", step,
              step == 2 ? "changed by a skipped step" : "unchanged by an applied step");
    }
    CHECK(ar->skipped_total == 1 && ar->fired_total == 2 && ts_plan_updates_applied(p) == 2,
          "skipped %lld, fired %lld, updates %lld", (long long)ar->skipped_total,
          (long long)ar->fired_total, (long long)ts_plan_updates_applied(p));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ts_metrics_render(tm.reg, &text, &len));
    CHECK(text &&
              strstr(text, "tessel_alerts_total{rank=\"0\",rule=\"nan\",action=\"skip_step\"} 1") &&
              strstr(text, "tessel_alerts_total{rank=\"0\",rule=\"big\",action=\"log\"} 1") &&
              strstr(text, "tessel_skipped_steps_total{rank=\"0\",reason=\"alert\"} 1") &&
              strstr(text, "tessel_anomalies_total{rank=\"0\",kind=\"loss_non_finite\"} 1") &&
              strstr(text, "tessel_group_grad_norm{rank=\"0\",group=\"net.0\"}"),
          "metrics:\n%s", text ? text : "");
    free(text);
    free(before);
    free(after);
    ts_alert_runner_free(ar);
    ts_train_metrics_free(&tm);
    ts_plan_free(p);
    ts_graph_free(g);
}

/* A pause ends on SIGUSR1 as on tessel ctl resume: a child pauses, the
 * parent signals it once PAUSED exists, and the child reports a resume. */
static void test_pause_signal(void) {
    char dir[] = "/tmp/tessel-alerts-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: cannot make %s", dir);
        return;
    }
    char paused[64];
    snprintf(paused, sizeof paused, "%s/PAUSED", dir);
    pid_t pid = fork();
    if (pid == 0) {
        int resumed = 0;
        ts_status s = ts_alert_pause(dir, 7, "r", NULL, NULL, &resumed);
        _exit(s == TS_OK && resumed ? 0 : 1);
    }
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && access(paused, F_OK) != 0; i++) nanosleep(&tick, NULL);
    CHECK(access(paused, F_OK) == 0, "the child wrote %s", paused);
    kill(pid, SIGUSR1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "SIGUSR1 resumed the pause (status %d)",
          status);
    CHECK(access(paused, F_OK) != 0, "PAUSED removed after the resume");
    rmdir(dir);
}

int main(void) {
    test_pause_signal();
    test_runner();
    test_parse();
    test_baseline();
    test_eval();
    return check_summary("alerts");
}
