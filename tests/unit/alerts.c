/* Alert rules and baselines without a training run: rule parsing (both
 * spellings, every error), the default rules, streaks and for_steps,
 * ratio_to_baseline only after the warm-up, the windowed mean/std/z-score,
 * and the JSON an alert is sent as. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "obs/alert.h"

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

/* A monitor filled by hand (no plan needed for evaluation). */
static void set_values(ts_monitor *m, double loss, double norm, double var) {
    for (int i = 0; i < TS_MON_COUNT; i++) m->value[i] = NAN;
    m->value[TS_MON_LOSS] = loss;
    m->value[TS_MON_GRAD_NORM] = norm;
    m->value[TS_MON_GRAD_VARIANCE] = var;
    m->value[TS_MON_NONFINITE] = 0;
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
        set_values(&m, 0.5, norms[k], 1.0);
        ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
        fired_n[k] = o.n;
        ts_monitor_commit(&m, 1);
    }
    /* Streaks: 11 at steps 1, 3-6: fires at 4 and 6 (every 2nd step in a row). */
    CHECK(
        fired_n[1] == 0 && fired_n[3] == 0 && fired_n[4] == 1 && fired_n[5] == 0 && fired_n[6] == 1,
        "for_steps=2: %d %d %d %d %d", fired_n[1], fired_n[3], fired_n[4], fired_n[5], fired_n[6]);
    /* Variance 9x its baseline of 1: the snapshot rule. */
    set_values(&m, 0.5, 1, 9.0);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && o.ev[0].rule->action == TS_AA_SNAPSHOT && o.ev[0].baseline == 1 &&
              o.actions == 1u << TS_AA_SNAPSHOT,
          "ratio_to_baseline: %d events", o.n);
    char *json = ts_alert_json(&o.ev[0], 8, 0, "runs/x");
    CHECK(json && !strcmp(json, "{\"action\":\"snapshot\",\"baseline\":1.0,\"condition\":"
                                "\"ratio_to_baseline\",\"for_steps\":1,\"metric\":"
                                "\"grad_variance\",\"rank\":0,\"rule\":\"v\",\"run_dir\":"
                                "\"runs/x\",\"step\":8,\"threshold\":8.0,\"value\":9.0}"),
          "json: %s", json ? json : "(null)");
    free(json);
    set_values(&m, NAN, 1, 1);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && (o.actions >> TS_AA_SKIP & 1) && ts_alert_agree(a, 1) == 1,
          "non-finite loss skips");
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

int main(void) {
    test_parse();
    test_baseline();
    test_eval();
    return check_summary("alerts");
}
