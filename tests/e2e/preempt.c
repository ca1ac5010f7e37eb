/* Preemption (ckpt.on_signal, docs/cluster.md): SIGTERM mid-run, as Slurm's
 * scancel or a Kubernetes pod termination sends it, stops every rank after
 * the same step; with `save` (the default) that step's checkpoint is
 * committed before the run exits 130, and `--resume latest` ends with the
 * weights of an uninterrupted run (tessel ckpt diff). One process and
 * --procs 2 (the launcher passes the signal on); `none` stops without a
 * checkpoint of the stop step. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];
static const char *bin;

/* Many steps of a tiny model, so SIGTERM lands mid-run (no alert rules: a
 * tiny model's spikes would pause it); a checkpoint every 100 steps, so the
 * stop step's own checkpoint is told from those. */
#define STEPS "600"
static const char *small =
    "--set model.batch=8 --set model.hidden=8 --set model.window=2 --set model.features=2 "
    "--set train.threads=1 --set train.log_every=1 --set ckpt.every=100 --set ckpt.keep_last=0 "
    "--set alerts.defaults=false "
    "--steps " STEPS;

/* The step of the last train line of RUN/metrics.jsonl (0: none). */
static long last_step(const char *run) {
    char p[300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    char *t = e2e_slurp(p, NULL);
    long step = 0;
    for (char *q = t; (q = strstr(q, "{\"type\":\"train\",\"step\":")); q++)
        sscanf(q, "{\"type\":\"train\",\"step\":%ld", &step);
    free(t);
    return step;
}

/* Starts `tessel train examples/w1.yaml SMALL EXTRA --out RUN` in its own
 * process group, sends SIGTERM to that process alone once step 20 is
 * logged, and returns its exit status (-1: did not end within 60 s; it is
 * then killed). Its stdout goes to RUN.out. */
static int train_and_term(const char *extra, const char *run) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s train examples/w1.yaml %s %s --out %s >%s.out 2>%s.err", bin,
             small, extra, run, run, run);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    struct timespec pause = {0, 5 * 1000 * 1000};
    int started = 0;
    for (int i = 0; i < 12000 && !started; i++) {
        started = last_step(run) >= 20;
        if (!started) nanosleep(&pause, NULL);
    }
    CHECK(started, "%s: the run reached step 20", run);
    kill(pid, SIGTERM);
    int st = 0, done = 0;
    for (int i = 0; i < 12000 && !done; i++) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        if (!done) nanosleep(&pause, NULL);
    }
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void same_weights(const char *what, const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s %s", a, b);
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") &&
              strstr(r.out, "step-00000600 (step " STEPS ")"),
          "%s: ckpt diff exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

/* SIGTERM, the stop step's checkpoint, resume, the same final weights. */
static void preempt(const char *tag, const char *extra) {
    char full[256], run[300];
    snprintf(full, sizeof full, "%s", e2e_path(tag));
    snprintf(run, sizeof run, "%s-term", full);
    e2e_result r = e2e_runf("train examples/w1.yaml %s %s --out %s", small, extra, full);
    CHECK(r.rc == 0, "%s uninterrupted: exit %d: %s", tag, r.rc, r.err);
    e2e_done(&r);

    int rc = train_and_term(extra, run);
    CHECK(rc == 130, "%s: SIGTERM ends the run with exit 130, got %d", tag, rc);
    const long stop = last_step(run);
    char want[160], p[400];
    snprintf(want, sizeof want, "stopped by a signal: the checkpoint of step %ld is committed",
             stop);
    snprintf(p, sizeof p, "%s.out", run);
    char *out = e2e_slurp(p, NULL);
    CHECK(stop > 20 && stop < 600 && strstr(out, want), "%s: stopped at step %ld: %s", tag, stop,
          out);
    free(out);
    snprintf(p, sizeof p, "%s/step-%08ld/manifest.json", run, stop);
    CHECK(access(p, F_OK) == 0, "%s: the stop step's checkpoint %s exists", tag, p);
    r = e2e_runf("ckpt verify %s/step-%08ld", run, stop);
    CHECK(r.rc == 0, "%s: the stop checkpoint verifies: %s%s", tag, r.out, r.err);
    e2e_done(&r);

    r = e2e_runf("train examples/w1.yaml %s %s --resume latest --out %s", small, extra, run);
    snprintf(want, sizeof want, "at step %ld", stop);
    CHECK(r.rc == 0 && strstr(r.out, "resuming from") && strstr(r.out, want),
          "%s: resumed at step %ld: exit %d\n%s%s", tag, stop, r.rc, r.out, r.err);
    e2e_done(&r);
    same_weights(tag, full, run);
}

/* ckpt.on_signal none: the run still stops after an agreed step (exit
 * 130) but commits no checkpoint for it. */
static void no_save(void) {
    char run[256];
    snprintf(run, sizeof run, "%s", e2e_path("none"));
    int rc = train_and_term("--procs 2 --set ckpt.on_signal=none", run);
    CHECK(rc == 130, "on_signal none: exit 130, got %d", rc);
    const long stop = last_step(run);
    char p[300];
    snprintf(p, sizeof p, "%s/step-%08ld", run, stop);
    CHECK(stop > 20 && (stop % 100 == 0 || access(p, F_OK) != 0),
          "on_signal none: no checkpoint of the stop step %ld", stop);
    snprintf(p, sizeof p, "%s.out", run);
    char *out = e2e_slurp(p, NULL);
    CHECK(!strstr(out, "stopped by a signal") && strstr(out, "(interrupted)"), "on_signal none: %s",
          out);
    free(out);
}

/* The keys refuse what they do not know, before anything runs. */
static void bad_keys(void) {
    e2e_result r =
        e2e_runf("train examples/w1.yaml --set ckpt.on_signal=later --out %s", e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, "ckpt.on_signal: expected one of save, none, got 'later'"),
          "ckpt.on_signal later: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml --set ckpt.signal_grace_s=0 --out %s", e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, "ckpt.signal_grace_s: must be in [1, 1e6]"),
          "ckpt.signal_grace_s 0: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    if (!(bin = e2e_setup("preempt", dir, sizeof dir))) return check_summary("e2e/preempt");
    preempt("one", "");
    preempt("procs2", "--procs 2");
    no_save();
    bad_keys();
    e2e_cleanup(dir);
    return check_summary("e2e/preempt");
}
