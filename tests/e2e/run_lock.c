/* One process at a time in a run directory, end to end through `tessel`
 * ($TESSEL_BIN), and a run stopped before its first checkpoint:
 *
 * - while `tessel train --resume latest` runs, a second one into the same
 *   directory exits 2 naming the PID that holds the lock, and so do a new
 *   run there, `ckpt gc` and `audit verify`; `ctl status` still answers
 *   (it talks to the run); after the first ends, the others work again;
 * - with --procs 2 the launcher holds the lock for its workers: the second
 *   resume names the launcher's PID;
 * - a run killed (SIGKILL) before its first checkpoint continues from step
 *   0 with --resume latest, to the same losses as a fresh run; another
 *   config is refused there, and a plain rerun into it points at --resume
 *   latest. */
#include <signal.h>
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

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set ckpt.every=2 --set train.total_steps=1000000 "
    "--set observe.tensorboard=false --set alerts.defaults=false";

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* `tessel train examples/w1.yaml SMALL EXTRA` in the background, its output
 * into LOG; the child's PID. */
static pid_t start(const char *extra, const char *log) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec '%s' train examples/w1.yaml %s %s >'%s' 2>&1", bin, small,
             extra, log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0, "fork");
    return pid;
}

/* Waits (up to 60 s) until `path` holds at least `lines` lines and,
 * when pid > 0, begins with that PID (the lock file). */
static int wait_for(const char *path, long pid, int lines) {
    for (const double t0 = now(); now() - t0 < 60; usleep(20000)) {
        char *t = e2e_slurp(path, NULL);
        int n = 0;
        for (const char *p = t; *p; p++) n += *p == '\n';
        int ok = n >= lines && (pid <= 0 || strtol(t, NULL, 10) == pid);
        free(t);
        if (ok) return 1;
    }
    return 0;
}

static int wait_exit(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* `what` was refused with exit 2 and a message naming PID as the holder. */
static void expect_busy(const char *what, e2e_result r, pid_t pid) {
    char holder[64];
    snprintf(holder, sizeof holder, "process %ld holds its lock", (long)pid);
    CHECK(r.rc == 2, "%s: exit %d, expected 2 while the run holds the lock\n%s%s", what, r.rc,
          r.out, r.err);
    CHECK(strstr(r.err, "is in use") && strstr(r.err, holder), "%s: the holder is not named: %s",
          what, r.err);
    e2e_done(&r);
}

static void test_concurrent(const char *procs) {
    char run[160], log[200], lock[200], extra[512];
    snprintf(run, sizeof run, "%s/run%s", dir, procs[0] ? "-procs" : "");
    snprintf(log, sizeof log, "%s.log", run);
    snprintf(lock, sizeof lock, "%s/tessel.lock", run);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --steps 4 --out %s", small, run);
    CHECK(r.rc == 0, "first run: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);

    snprintf(extra, sizeof extra, "%s --steps 1000000 --resume latest --out %s", procs, run);
    pid_t pid = start(extra, log);
    if (pid <= 0) return;
    CHECK(wait_for(lock, pid, 1), "%s: the run's PID is not in its lock file within 60 s", run);

    expect_busy(
        "a second resume",
        e2e_runf("train examples/w1.yaml %s --steps 8 --resume latest --out %s", small, run), pid);
    expect_busy("a new run into it",
                e2e_runf("train examples/w1.yaml %s --steps 8 --out %s", small, run), pid);
    expect_busy("ckpt gc", e2e_runf("ckpt gc %s --keep-last 1", run), pid);
    expect_busy("audit verify", e2e_runf("audit verify %s", run), pid);
    r = e2e_runf("ctl status %s", run);
    CHECK(r.rc == 0 && strstr(r.out, "not paused"),
          "ctl status while the run holds the lock: %d %s", r.rc, r.err);
    e2e_done(&r);

    /* Stopped (SIGTERM): it saves, releases the lock, and the others work. */
    kill(pid, SIGTERM);
    int rc = wait_exit(pid);
    CHECK(rc == 130, "the stopped run exits 130, got %d", rc);
    r = e2e_runf("audit verify %s", run);
    CHECK(r.rc == 0, "audit verify after the run: %d %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt gc %s --keep-last 1", run);
    CHECK(r.rc == 0, "ckpt gc after the run: %d %s", r.rc, r.err);
    e2e_done(&r);
}

/* The train losses of the last 6 train lines of metrics.jsonl (the killed
 * run's lines stay before those of the run that continued it); the count. */
static int last6(const char *path, double l[6]) {
    char *t = e2e_slurp(path, NULL);
    int n = 0;
    for (char *p = t; (p = strstr(p, "{\"type\":\"train\"")); p++) {
        const char *q = strstr(p, "\"loss\":");
        if (q && sscanf(q, "\"loss\":%lf", &l[n % 6]) == 1) n++;
    }
    free(t);
    if (n > 6) { /* rotate the ring into step order */
        double r[6];
        for (int i = 0; i < 6; i++) r[i] = l[(n + i) % 6];
        memcpy(l, r, sizeof r);
    }
    return n;
}

static void test_killed_before_first_checkpoint(void) {
    char run[160], log[200], extra[512], metrics[200];
    snprintf(run, sizeof run, "%s/early", dir);
    snprintf(log, sizeof log, "%s.log", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(extra, sizeof extra, "--set ckpt.every=1000000 --steps 1000000 --out %s", run);
    pid_t pid = start(extra, log);
    if (pid <= 0) return;
    CHECK(wait_for(metrics, 0, 3), "no steps logged within 60 s");
    kill(pid, SIGKILL);
    CHECK(wait_exit(pid) == 128 + SIGKILL, "killed");
    struct stat st;
    char latest[200];
    snprintf(latest, sizeof latest, "%s/LATEST", run);
    CHECK(stat(latest, &st) != 0, "the killed run saved no checkpoint");

    e2e_result r = e2e_runf("train examples/w1.yaml %s --set ckpt.every=1000000 --steps 6 --out %s",
                            small, run);
    CHECK(r.rc == 2 && strstr(r.err, "--resume latest"), "a plain rerun: %d %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.every=1000000 --set train.lr=0.5 --steps 6 "
                 "--resume latest --out %s",
                 small, run);
    CHECK(r.rc == 2 && strstr(r.err, "holds no checkpoint yet"), "another config: %d %s", r.rc,
          r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.every=1000000 --steps 6 --resume latest "
                 "--out %s",
                 small, run);
    CHECK(r.rc == 0 && strstr(r.out, "resuming from step 0"), "resume from step 0: %d %s%s", r.rc,
          r.out, r.err);
    e2e_done(&r);
    char *sum = e2e_slurp(e2e_path("early/summary.json"), NULL);
    CHECK(strstr(sum, "\"completed\"") && strstr(sum, "\"steps\": 6"), "summary: %s", sum);
    free(sum);
    r = e2e_runf("audit verify %s", run);
    CHECK(r.rc == 0, "audit verify: %d %s", r.rc, r.err);
    e2e_done(&r);

    /* The same losses as a fresh run of 6 steps: the last 6 lines. */
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.every=1000000 --steps 6 --out %s/fresh",
                 small, dir);
    CHECK(r.rc == 0, "fresh run: %d %s", r.rc, r.err);
    e2e_done(&r);
    double a[6], b[6];
    int na = last6(metrics, a), nb = last6(e2e_path("fresh/metrics.jsonl"), b);
    CHECK(nb == 6 && na >= 6, "losses: %d and %d", na, nb);
    for (int i = 0; nb == 6 && na >= 6 && i < 6; i++)
        CHECK(a[i] == b[i], "step %d: %.9g resumed from 0, %.9g fresh", i + 1, a[i], b[i]);
}

int main(void) {
    if (!(bin = e2e_setup("run-lock", dir, sizeof dir))) return check_summary("e2e/run_lock");
    test_concurrent("");
    test_concurrent("--procs 2");
    test_killed_before_first_checkpoint();
    e2e_cleanup(dir);
    return check_summary("e2e/run_lock");
}
