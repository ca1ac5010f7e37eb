/* What keeps alerts from hanging or flooding a run (issue 16), without a
 * training run:
 *
 * - the cooldown: a rule fires every step, its snapshot/pause/webhook is
 *   taken once per `cooldown` steps and the firings between are events
 *   marked held; log and skip_step rules are never held;
 * - skip_metrics: on a step the loss scaler skipped, gradient rules neither
 *   fire nor lose their streak, while a non-finite loss still fires;
 * - the adaptive baseline: after a lasting change of level a ratio rule
 *   stops firing within a bounded number of steps (the old baseline, which
 *   left anomalous steps out, fired on every step for ever), and one spike
 *   barely moves it;
 * - the snapshot budget: the cap, and retention of the newest step-N-anomaly
 *   folders (a link under such a name is refused and nothing is removed);
 * - a pause with a timeout ends by itself, and removes PAUSED. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "monitor_fill.h"
#include "obs/alert.h"
#include "obs/alert_run.h"
#include "obs/anomaly.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void monitor_init(ts_monitor *m, int window, int warmup) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < TS_MON_COUNT; i++) CHECK_OK(ts_baseline_init(&m->base[i], window, warmup));
}

static void monitor_free(ts_monitor *m) {
    for (int i = 0; i < TS_MON_COUNT; i++) ts_baseline_free(&m->base[i]);
}

static void test_cooldown(void) {
    ts_monitor m;
    monitor_init(&m, 10, 0);
    ts_alerts *a = NULL;
    CHECK_OK(ts_alerts_new("name=snap metric=grad_norm above=1 action=snapshot, "
                           "name=hook metric=grad_norm above=1 action=webhook, "
                           "name=skip metric=grad_norm above=1 action=skip_step, "
                           "name=log metric=grad_norm above=1 action=log",
                           0, "http://127.0.0.1:9/x", &a));
    if (!a) return;
    a->cooldown = 5;
    int snaps = 0, held = 0, skips = 0, logs = 0;
    int64_t acted[4] = {0};
    for (int64_t step = 1; step <= 12; step++) {
        tm_set_values(&m, 0.5, 2.0, 1.0);
        a->step = step;
        ts_alert_outcome o;
        ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
        CHECK(o.n == 4, "step %lld: all 4 rules fire (%d)", (long long)step, o.n);
        for (int i = 0; i < o.n; i++) {
            const ts_alert_event *e = &o.ev[i];
            if (e->rule->action == TS_AA_SNAPSHOT && !e->held) {
                if (snaps < 4) acted[snaps] = step;
                snaps++;
            }
            held += e->held;
            CHECK(!e->held || e->rule->action == TS_AA_SNAPSHOT || e->rule->action == TS_AA_WEBHOOK,
                  "rule %s held", e->rule->name);
        }
        skips += (int)((o.actions >> TS_AA_SKIP) & 1);
        logs += (int)((o.actions >> TS_AA_LOG) & 1);
        const int snap_now = (int)((o.actions >> TS_AA_SNAPSHOT) & 1);
        CHECK(snap_now == (step == 1 || step == 6 || step == 11), "step %lld: snapshot bit %d",
              (long long)step, snap_now);
        CHECK((int)((o.actions >> TS_AA_WEBHOOK) & 1) == snap_now,
              "step %lld: webhook like snapshot", (long long)step);
    }
    CHECK(snaps == 3 && acted[0] == 1 && acted[1] == 6 && acted[2] == 11,
          "snapshots taken %d times (steps %lld %lld %lld), wanted 1, 6, 11", snaps,
          (long long)acted[0], (long long)acted[1], (long long)acted[2]);
    CHECK(held == 2 * 9, "held events %d, wanted 18 (9 steps x 2 rules)", held);
    CHECK(skips == 12 && logs == 12, "skip_step and log act every step: %d %d", skips, logs);
    /* The JSON of a held event says so. */
    tm_set_values(&m, 0.5, 2.0, 1.0);
    a->step = 13;
    ts_alert_outcome o;
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    char *json = o.n ? ts_alert_json(&o.ev[0], 13, 0, "") : NULL;
    CHECK(json && strstr(json, "\"held\":true"), "held in the JSON: %s", json ? json : "(none)");
    free(json);
    ts_alerts_free(a);
    monitor_free(&m);
}

static void test_skip_metrics(void) {
    ts_monitor m;
    monitor_init(&m, 10, 0);
    ts_alerts *a = NULL;
    CHECK_OK(ts_alerts_new("", 1, "", &a)); /* the defaults */
    if (!a) return;
    CHECK(a->n == 4 && a->rules[0].cond == TS_AC_RATIO && a->rules[0].action == TS_AA_PAUSE,
          "default grad_norm_explosion is a ratio to the baseline that pauses");
    ts_alerts_free(a);
    CHECK_OK(ts_alerts_new("name=norm metric=grad_norm above=10 for_steps=2 action=log, "
                           "name=loss metric=loss non_finite=true action=skip_step",
                           0, "", &a));
    if (!a) return;
    ts_alert_outcome o;
    /* step 1: a real norm of 20 starts a streak */
    tm_set_values(&m, 0.5, 20, 1);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 0 && a->rules[0].streak == 1, "streak 1");
    /* step 2: the loss scaler overflowed: an infinite norm is not judged */
    tm_set_values(&m, 0.5, INFINITY, NAN);
    a->skip_metrics = ~(1u << TS_MON_LOSS);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 0 && a->rules[0].streak == 1, "overflow step: no event (%d), streak kept (%d)",
          o.n, a->rules[0].streak);
    /* ... but a non-finite loss on such a step still is */
    tm_set_values(&m, NAN, INFINITY, NAN);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && o.ev[0].rule == &a->rules[1], "a NaN loss fires on an overflow step");
    /* step 3: judged again, the streak goes on */
    a->skip_metrics = 0;
    tm_set_values(&m, 0.5, 20, 1);
    ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
    CHECK(o.n == 1 && o.ev[0].rule == &a->rules[0], "for_steps=2 across the overflow step");
    ts_alerts_free(a);
    monitor_free(&m);
}

/* A ratio rule over a metric that jumps from 1 to 30 and stays there. */
static void test_adaptive_baseline(void) {
    ts_monitor m;
    monitor_init(&m, 50, 20);
    ts_alerts *a = NULL;
    CHECK_OK(
        ts_alerts_new("name=v metric=grad_variance ratio_to_baseline=8 action=log", 0, "", &a));
    if (!a) return;
    int fires = 0;
    int64_t last = 0;
    for (int64_t step = 1; step <= 600; step++) {
        const double v = step <= 100 ? 1.0 + 0.1 * (double)(step % 3) : 30.0;
        tm_set_values(&m, 0.5, 1, v);
        ts_alert_outcome o;
        ts_alerts_eval(a, &m, TS_ALERT_BEFORE_UPDATE, &o);
        if (o.n) fires++, last = step;
        ts_monitor_commit(&m, 1);
    }
    printf("level shift x27 at step 101: %d firings, the last at step %lld\n", fires,
           (long long)last);
    CHECK(fires >= 1 && fires <= 40 && last <= 140,
          "after a lasting change of level the rule fired %d times, the last at step %lld", fires,
          (long long)last);
    CHECK(ts_baseline_mean(&m.base[TS_MON_GRAD_VARIANCE]) > 25, "the baseline learnt the level");
    /* One spike of 1e6 over a baseline of 30 moves the mean by < 10 %. */
    tm_set_values(&m, 0.5, 1, 1e6);
    ts_monitor_commit(&m, 1);
    const double mu = ts_baseline_mean(&m.base[TS_MON_GRAD_VARIANCE]);
    CHECK(mu < 33, "one spike moved the baseline to %g", mu);
    /* A step left out (commit 0) changes nothing. */
    tm_set_values(&m, 0.5, 1, 1e6);
    ts_monitor_commit(&m, 0);
    CHECK(ts_baseline_mean(&m.base[TS_MON_GRAD_VARIANCE]) == mu, "commit 0 pushed");
    ts_alerts_free(a);
    monitor_free(&m);
}

static char root[64];
static const char *at(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static void make_snapshot(const char *name) {
    mkdir(at(name), 0755);
    char path[300];
    snprintf(path, sizeof path, "%s/manifest.json", at(name));
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{}\n", f);
        fclose(f);
    }
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static void test_budget(void) {
    ts_anomaly_budget b = {3, 2, 0, 0};
    int admitted = 0;
    for (int i = 0; i < 10; i++) admitted += ts_anomaly_admit(&b);
    CHECK(admitted == 3 && b.refused == 7, "cap 3: admitted %d, refused %lld", admitted,
          (long long)b.refused);
    ts_anomaly_budget open = {0, 0, 0, 0};
    for (int i = 0; i < 100; i++) admitted += ts_anomaly_admit(&open);
    CHECK(admitted == 103, "max 0: no cap");

    snprintf(root, sizeof root, "/tmp/tessel-anomaly-XXXXXX");
    if (!mkdtemp(root)) {
        CHECK(0, "mkdtemp");
        return;
    }
    static const char *const snaps[] = {"step-00000010-anomaly", "step-00000200-anomaly",
                                        "step-00000030-anomaly", "step-00004000-anomaly",
                                        "step-00000005-anomaly"};
    for (int i = 0; i < 5; i++) make_snapshot(snaps[i]);
    make_snapshot("step-00000001");       /* a regular checkpoint */
    make_snapshot("step-x-anomaly");      /* not a step name */
    make_snapshot("step-00000002-other"); /* another tag */
    int removed = -1;
    CHECK_OK(ts_anomaly_retain(root, 0, &removed));
    CHECK(removed == 0 && exists(at(snaps[4])), "keep 0 keeps all");
    CHECK_OK(ts_anomaly_retain(root, 2, &removed));
    CHECK(removed == 3, "removed %d, wanted 3", removed);
    CHECK(exists(at("step-00004000-anomaly")) && exists(at("step-00000200-anomaly")),
          "the newest two stay");
    CHECK(!exists(at("step-00000030-anomaly")) && !exists(at("step-00000010-anomaly")) &&
              !exists(at("step-00000005-anomaly")),
          "the older three are gone");
    CHECK(exists(at("step-00000001")) && exists(at("step-x-anomaly")) &&
              exists(at("step-00000002-other")),
          "other folders are left alone");
    /* A link planted under an anomaly name: refused, nothing removed. */
    mkdir(at("outside"), 0755);
    make_snapshot("outside/precious");
    CHECK(symlink(at("outside/precious"), at("step-00000001-anomaly")) == 0, "symlink");
    CHECK(ts_anomaly_retain(root, 1, &removed) != TS_OK &&
              strstr(ts_last_error(), "step-00000001-anomaly"),
          "a link is refused naming it: %s", ts_last_error());
    CHECK(removed == 0 && exists(at("step-00000200-anomaly")) &&
              exists(at("outside/precious/manifest.json")),
          "nothing removed after the refusal");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (check_failed == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

static void test_pause_timeout(void) {
    char dir[] = "/tmp/tessel-pause-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    ts_pause_end end = TS_PAUSE_RESUMED;
    const double t0 = now();
    CHECK_OK(ts_alert_pause_for(dir, 3, "r", 0.3, NULL, NULL, &end));
    const double took = now() - t0;
    CHECK(end == TS_PAUSE_TIMED_OUT, "the pause ended with %d, not a timeout", (int)end);
    CHECK(took >= 0.3 && took < 3, "a 0.3 s pause took %.2f s", took);
    char paused[64];
    snprintf(paused, sizeof paused, "%s/PAUSED", dir);
    CHECK(access(paused, F_OK) != 0, "PAUSED removed after the timeout");
    rmdir(dir);
}

int main(void) {
    test_cooldown();
    test_skip_metrics();
    test_adaptive_baseline();
    test_budget();
    test_pause_timeout();
    return check_summary("unit/alerts_limits");
}
