/* Unattended runs (stdin /dev/null, no terminal) under the default alert
 * rules must finish (issue 16). Every run here has a deadline; one that
 * pauses for good is killed and reported instead of hanging the suite.
 *
 * - `tessel train examples/w1.yaml --set model.batch=16 --set
 *   train.steps=20`, which paused for ever after step 5 on
 *   grad_norm_explosion (a fresh model's norm passed the old fixed 150);
 * - fp16 for 300 steps with a loss scale that overflows again and again
 *   (init_scale 1e12, growth_interval 10): the steps the scaler skips (their
 *   gradient norm is NaN or infinite) feed no rule, so neither the default
 *   rules nor rules that pause on non-finite gradients act;
 * - a pause nobody answers ends after alerts.pause_timeout: the run goes
 *   on, and later pauses do not wait (pause_timeout_action continue), or
 *   it stops with exit status 3 (stop);
 * - a lasting change of the gradient scale (x30 input for 400 steps) stops
 *   firing a ratio rule after a bounded number of steps: the baseline
 *   learns the new level. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct run {
    int rc;         /* exit status; -1 killed by a signal; -2 past the deadline (killed) */
    double seconds; /* how long it ran */
    char *out;      /* stdout and stderr together */
} run;

/* `tessel ARGS` with stdin from /dev/null, killed after deadline_s. */
static run train(double deadline_s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static run train(double deadline_s, const char *fmt, ...) {
    char args[2048], cmd[2600], log[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(cmd, sizeof cmd, "exec '%s' %s </dev/null >'%s' 2>&1", bin, args, log);
    run r = {-1, 0, NULL};
    const double t0 = now();
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    pid_t done = 0;
    while (pid > 0 && (done = waitpid(pid, &status, WNOHANG)) == 0 && now() - t0 < deadline_s)
        usleep(20000);
    if (pid > 0 && done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        r.rc = -2;
    } else if (done == pid) {
        r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    r.seconds = now() - t0;
    r.out = e2e_slurp(log, NULL);
    return r;
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_w1(void) {
    run r = train(180, "train examples/w1.yaml --set model.batch=16 --set train.steps=20 --out %s",
                  e2e_path("w1"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 20 steps"), "w1 batch 16: exit %d after %.1f s\n%s",
          r.rc, r.seconds, r.out);
    CHECK(!strstr(r.out, "paused") && !strstr(r.out, "alert:"),
          "the default rules acted on a healthy run:\n%s", r.out);
    free(r.out);
}

/* A small MLP without LayerNorm. */
static void write_cfg(const char *name, int steps, const char *extra) {
    FILE *f = fopen(e2e_path(name), "w");
    if (!f) return;
    fprintf(f,
            "model:\n  name: mlp\n  batch: 16\n  window: 0\n  in_dim: 8\n  hidden: 16\n"
            "  n_hidden: 2\n  out_dim: 1\n  layer_norm: false\n"
            "train:\n  steps: %d\n  lr: 0.01\n  threads: 1\n%s",
            steps, extra);
    fclose(f);
}

static void test_fp16_overflows(void) {
    write_cfg("fp16.yaml", 300,
              "precision:\n  default: fp16\n  init_scale: 1.0e+12\n  growth_interval: 10\n");
    run r = train(120, "train %s --out %s", e2e_path("fp16.yaml"), e2e_path("fp16"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 300 steps"), "fp16: exit %d after %.1f s\n%s", r.rc,
          r.seconds, r.out);
    CHECK(!strstr(r.out, "paused") && !strstr(r.out, "alert:"),
          "the loss scaler's skipped steps fed the default rules:\n%s", r.out);
    char *m = e2e_slurp(e2e_path("fp16/metrics.jsonl"), NULL);
    const int skipped = count(m, "\"step_skipped\":1");
    printf("fp16: %d of 300 steps skipped by the loss scaler, %.1f s\n", skipped, r.seconds);
    CHECK(skipped >= 20, "only %d overflows: the test does not exercise the scaler", skipped);
    free(m);
    free(r.out);
    /* The overflowed gradients' norm is NaN or infinite: rules that would
     * pause on it must not see those steps either. */
    r = train(60,
              "train %s --set 'alerts.rules=name=nf metric=grad_norm non_finite=true action=pause,"
              "name=nfg metric=nonfinite_grads above=0 action=pause' --out %s",
              e2e_path("fp16.yaml"), e2e_path("fp16-rules"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 300 steps") && !strstr(r.out, "alert:"),
          "fp16, rules on non-finite gradients: exit %d after %.1f s\n%s", r.rc, r.seconds, r.out);
    free(r.out);
}

static void test_pause_timeout(void) {
    /* An explosion at steps 3-5 and a pause rule that acts on each. */
    write_cfg("pause.yaml", 10,
              "alerts:\n  rules:\n    - name=boom metric=grad_norm above=150 action=pause\n"
              "  cooldown: 0\n  pause_timeout: 1\n"
              "debug:\n  inject: scale\n  inject_step: 3\n  inject_count: 3\n"
              "  inject_scale: 10000\n");
    run r = train(60, "train %s --out %s", e2e_path("pause.yaml"), e2e_path("pause"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 10 steps"), "pause_timeout: exit %d after %.1f s\n%s",
          r.rc, r.seconds, r.out);
    CHECK(strstr(r.out, "paused after step 3 by alert rule 'boom'") &&
              strstr(r.out, "at most 1 s") && strstr(r.out, "nobody resumed the run: timed out") &&
              strstr(r.out, "alerts.pause_timeout_action: continue"),
          "no timed-out pause:\n%s", r.out);
    CHECK(strstr(r.out, "not pausing at step 4 (rule 'boom')") &&
              strstr(r.out, "not pausing at step 5 (rule 'boom')") &&
              count(r.out, "paused after step") == 1,
          "a later pause waited again:\n%s", r.out);
    CHECK(!exists(e2e_path("pause/PAUSED")), "PAUSED left behind");
    CHECK(r.seconds < 30, "the run took %.1f s", r.seconds);
    free(r.out);

    r = train(60, "train %s --set alerts.pause_timeout_action=stop --out %s",
              e2e_path("pause.yaml"), e2e_path("pause-stop"));
    CHECK(r.rc == 3 && strstr(r.out, "stopped by alert rule 'boom' after step 3 (exit status 3)"),
          "pause_timeout_action stop: exit %d\n%s", r.rc, r.out);
    char *sum = e2e_slurp(e2e_path("pause-stop/summary.json"), NULL);
    CHECK(strstr(sum, "\"stopped_by_alert\"") != NULL, "summary: %s", sum);
    free(sum);
    free(r.out);
}

static void test_level_shift(void) {
    write_cfg("shift.yaml", 500,
              "alerts:\n  rules:\n    - name=shift metric=grad_variance ratio_to_baseline=8 "
              "action=log\n"
              "debug:\n  inject: scale\n  inject_step: 50\n  inject_count: 400\n"
              "  inject_scale: 30\n");
    run r = train(120, "train %s --out %s", e2e_path("shift.yaml"), e2e_path("shift"));
    CHECK(r.rc == 0, "level shift: exit %d\n%s", r.rc, r.out);
    const int fired = count(r.out, "rule 'shift'");
    printf("x30 input for 400 steps: the ratio rule fired %d times\n", fired);
    CHECK(fired >= 1 && fired <= 60, "a lasting change of level fired %d times", fired);
    free(r.out);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    bin = e2e_setup("unattended", dir, sizeof dir);
    if (!bin) return check_summary("e2e/alerts_unattended");
    test_fp16_overflows();
    test_pause_timeout();
    test_level_shift();
    test_w1();
    e2e_cleanup(dir);
    return check_summary("e2e/alerts_unattended");
}
