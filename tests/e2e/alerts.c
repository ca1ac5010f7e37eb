/* Alert rules and actions through `tessel train`, end to end ($TESSEL_BIN,
 * run from the repository root), with data corrupted on purpose by the
 * debug.inject keys (a batch scaled by 1e4: a gradient explosion; a NaN in
 * x: a non-finite loss):
 *
 * - log + snapshot: the alert line is printed, RUN_DIR/step-N-anomaly/
 *   exists, verifies (ts_ckpt_open) and carries "tag": "anomaly", LATEST
 *   is not moved to it, audit.log holds the alert entry and the TensorBoard
 *   events the scalar alerts/RULE;
 * - skip_step: with a checkpoint every step, the checkpoint of the skipped
 *   step holds bit-identical parameters and optimizer state to the one
 *   before it, updates_applied lags step by one, and the run completes;
 * - the default rules: a NaN loss three steps in a row is skipped twice,
 *   then the run stops with exit status 3 and the documented message;
 *   an explosion once the baselines are warm (step 25 of 30) pauses the
 *   run (PAUSED appears, the process waits), and `tessel ctl resume
 *   RUN_DIR` lets it finish;
 * - webhook: a receiver on loopback in this process gets one POST with the
 *   JSON body of the alert. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "tessel/ckpt.h"

static const char *bin;
static char dir[64];

/* An MLP without LayerNorm (which would absorb a scaled input). */
static const char base_cfg[] = "model:\n  name: mlp\n  batch: 16\n  window: 0\n  in_dim: 8\n"
                               "  hidden: 16\n  n_hidden: 2\n  out_dim: 1\n  layer_norm: false\n"
                               "train:\n  steps: %d\n  lr: 0.01\n  threads: 1\n%s";

static void write_cfg(const char *name, int steps, const char *extra) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, base_cfg, steps, extra);
        fclose(f);
    }
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_log_snapshot(void) {
    write_cfg("snap.yaml", 12,
              "alerts:\n  rules:\n"
              "    - {name: explode_log, metric: grad_norm, above: 150, action: log}\n"
              "    - name=explode_snap metric=grad_norm above=150 action=snapshot\n"
              "debug:\n  inject: scale\n  inject_step: 8\n  inject_scale: 10000\n"
              "ckpt:\n  every: 5\n");
    e2e_result r = e2e_runf("train %s/snap.yaml --out %s/snap", dir, dir);
    CHECK(r.rc == 0, "snapshot run: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "alert: step 8: rule 'explode_log' (grad_norm above 150 for 1 step)"),
          "no log line for the explosion:\n%s", r.out);
    CHECK(strstr(r.out, "rule 'explode_snap'") && strstr(r.out, "-> snapshot"),
          "no snapshot line:\n%s", r.out);
    CHECK(!strstr(r.out, "alert: step 7") && !strstr(r.out, "alert: step 9"),
          "alerts outside the corrupted step:\n%s", r.out);
    e2e_done(&r);
    char path[256];
    snprintf(path, sizeof path, "%s/snap/step-00000008-anomaly", dir);
    ts_ckpt *c = NULL;
    CHECK_OK(ts_ckpt_open(path, NULL, NULL, &c));
    if (c) {
        ts_ckpt_info in;
        CHECK_OK(ts_ckpt_get_info(c, &in));
        CHECK(in.step == 8, "snapshot step %lld", (long long)in.step);
        CHECK(strstr(ts_ckpt_manifest(c), "\"tag\": \"anomaly\"") != NULL,
              "no anomaly tag in the manifest");
        ts_ckpt_close(c);
    }
    snprintf(path, sizeof path, "%s/snap/LATEST", dir);
    char *latest = e2e_slurp(path, NULL);
    CHECK(!strcmp(latest, "step-00000012\n"), "LATEST names '%s'", latest);
    free(latest);
    snprintf(path, sizeof path, "%s/snap/audit.log", dir);
    char *audit = e2e_slurp(path, NULL);
    CHECK(strstr(audit, "\"event\":\"alert\"") && strstr(audit, "\"rule\":\"explode_snap\""),
          "audit.log lacks the alert:\n%s", audit);
    free(audit);
    /* The TensorBoard scalar alerts/RULE (tags are stored as plain bytes). */
    char cmd[400], ev[256];
    snprintf(cmd, sizeof cmd, "ls %s/snap/tb/events.out.tfevents.* > %s/ev.txt", dir, dir);
    snprintf(ev, sizeof ev, "%s/ev.txt", dir);
    char *evname = system(cmd) == 0 ? e2e_slurp(ev, NULL) : calloc(1, 1);
    evname[strcspn(evname, "\n")] = 0;
    long evlen = 0;
    char *events = e2e_slurp(evname, &evlen);
    CHECK(evlen > 0 && memmem(events, (size_t)evlen, "alerts/explode_snap", 19) != NULL,
          "no alerts/explode_snap scalar in '%s'", evname);
    free(events);
    free(evname);
    snprintf(path, sizeof path, "%s/snap/summary.json", dir);
    char *sum = e2e_slurp(path, NULL);
    CHECK(strstr(sum, "\"completed\"") != NULL, "summary: %s", sum);
    free(sum);
}

/* Every tensor of two checkpoints is byte-identical. */
static int same_tensors(const char *a, const char *b) {
    ts_ckpt *ca = NULL, *cb = NULL;
    int same =
        ts_ckpt_open(a, NULL, NULL, &ca) == TS_OK && ts_ckpt_open(b, NULL, NULL, &cb) == TS_OK;
    for (int i = 0; same && i < ts_ckpt_tensor_count(ca); i++) {
        ts_ckpt_tensor t;
        same = ts_ckpt_tensor_info(ca, i, &t) == TS_OK;
        void *x = malloc(t.bytes), *y = malloc(t.bytes);
        same = same && x && y && ts_ckpt_read(ca, t.name, x, t.bytes) == TS_OK &&
               ts_ckpt_read(cb, t.name, y, t.bytes) == TS_OK && !memcmp(x, y, t.bytes);
        free(x);
        free(y);
    }
    same = same && ts_ckpt_tensor_count(ca) == ts_ckpt_tensor_count(cb) &&
           ts_ckpt_tensor_count(ca) > 0;
    ts_ckpt_close(ca);
    ts_ckpt_close(cb);
    return same;
}

static void test_skip(void) {
    write_cfg("skip.yaml", 8,
              "alerts:\n  rules:\n    - metric=loss non_finite=true action=skip_step\n"
              "debug:\n  inject: nan\n  inject_step: 5\n"
              "ckpt:\n  every: 1\n  keep_last: 0\n");
    e2e_result r = e2e_runf("train %s/skip.yaml --out %s/skip", dir, dir);
    CHECK(r.rc == 0, "skip run: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "alert: step 5: rule 'loss_non_finite_skip_step'") != NULL,
          "no skip alert:\n%s", r.out);
    e2e_done(&r);
    char a[256], b[256], c[256];
    snprintf(a, sizeof a, "%s/skip/step-00000004", dir);
    snprintf(b, sizeof b, "%s/skip/step-00000005", dir);
    snprintf(c, sizeof c, "%s/skip/step-00000006", dir);
    CHECK(same_tensors(a, b), "the skipped step 5 changed parameters or optimizer state");
    CHECK(!same_tensors(b, c), "step 6 changed nothing (the comparison cannot tell)");
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(b, NULL, NULL, &ck));
    if (ck) {
        ts_ckpt_info in;
        ts_ckpt_get_info(ck, &in);
        CHECK(in.step == 5 && in.updates_applied == 4, "step %lld, updates_applied %lld",
              (long long)in.step, (long long)in.updates_applied);
        ts_ckpt_close(ck);
    }
}

static void test_default_stop(void) {
    write_cfg("stop.yaml", 20, "debug:\n  inject: nan\n  inject_step: 4\n  inject_count: 5\n");
    e2e_result r = e2e_runf("train %s/stop.yaml --out %s/stop", dir, dir);
    CHECK(r.rc == 3, "stop run: exit %d, expected 3\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.err, "tessel: stopped by alert rule 'nonfinite_loss_stop' after step 6 (exit "
                        "status 3)") != NULL,
          "stop message:\n%s", r.err);
    CHECK(strstr(r.out, "alert: step 4: rule 'nonfinite_loss'") &&
              strstr(r.out, "alert: step 5: rule 'nonfinite_loss'"),
          "the first two NaN steps were not skipped:\n%s", r.out);
    e2e_done(&r);
    char path[256];
    snprintf(path, sizeof path, "%s/stop/summary.json", dir);
    char *sum = e2e_slurp(path, NULL);
    CHECK(strstr(sum, "\"stopped_by_alert\"") && strstr(sum, "\"steps\": 6"), "summary: %s", sum);
    free(sum);
}

static void test_default_pause(void) {
    /* The default explosion rule compares with the gradient norm's
     * baseline, which is used after alerts.baseline_warmup (20) steps. */
    write_cfg("pause.yaml", 30,
              "debug:\n  inject: scale\n  inject_step: 25\n  inject_scale: 10000\n");
    char run[160], out[200], cfg[160], paused[200];
    snprintf(run, sizeof run, "%s/pause", dir);
    snprintf(out, sizeof out, "%s/pause.out", dir);
    snprintf(cfg, sizeof cfg, "%s/pause.yaml", dir);
    snprintf(paused, sizeof paused, "%s/PAUSED", run);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "w", stdout)) _exit(127);
        execl(bin, bin, "train", cfg, "--out", run, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0, "fork");
    if (pid <= 0) return;
    const double t0 = now();
    while (!exists(paused) && now() - t0 < 60) usleep(20000);
    CHECK(exists(paused), "the run did not pause within 60 s");
    usleep(300000); /* still waiting a moment later */
    int status = 0;
    CHECK(waitpid(pid, &status, WNOHANG) == 0, "the paused run exited");
    char *log = e2e_slurp(out, NULL);
    CHECK(strstr(log, "paused after step 25 by alert rule 'grad_norm_explosion'") != NULL,
          "no pause line:\n%s", log);
    free(log);
    char snap[220];
    snprintf(snap, sizeof snap, "%s/step-00000025-anomaly/manifest.json", run);
    CHECK(exists(snap), "no checkpoint before the pause");
    e2e_result r = e2e_runf("ctl resume %s", run);
    CHECK(r.rc == 0 && strstr(r.out, "resumed"), "ctl resume: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    if (waitpid(pid, &status, 0) != pid) status = -1;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "paused run ended with status %d", status);
    log = e2e_slurp(out, NULL);
    CHECK(strstr(log, "resumed by tessel ctl") && strstr(log, "done: 30 steps"),
          "the run did not go on after the resume:\n%s", log);
    free(log);
    r = e2e_runf("ctl resume %s", run);
    CHECK(r.rc == 2 && strstr(r.err, "is not paused"), "resume of a running run: %d %s", r.rc,
          r.err);
    e2e_done(&r);
}

/* ---- webhook receiver -------------------------------------------------------- */

typedef struct receiver {
    int fd, port;
    char req[8192];
    size_t len;
} receiver;

static void *serve_one(void *arg) {
    receiver *rc = arg;
    struct timeval tv = {30, 0};
    setsockopt(rc->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int c = accept(rc->fd, NULL, NULL);
    if (c < 0) return NULL;
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* Headers, then Content-Length bytes of body. */
    for (ssize_t k; rc->len < sizeof rc->req - 1 &&
                    (k = read(c, rc->req + rc->len, sizeof rc->req - 1 - rc->len)) > 0;) {
        rc->len += (size_t)k;
        rc->req[rc->len] = 0;
        char *hend = strstr(rc->req, "\r\n\r\n"), *cl = strcasestr(rc->req, "Content-Length:");
        if (hend && cl && rc->len >= (size_t)(hend + 4 - rc->req) + (size_t)atol(cl + 15)) break;
    }
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    if (write(c, ok, sizeof ok - 1) < 0) perror("webhook receiver");
    close(c);
    return NULL;
}

static void test_webhook(void) {
    receiver rc = {0};
    rc.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    CHECK(rc.fd >= 0 && bind(rc.fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              listen(rc.fd, 4) == 0 && getsockname(rc.fd, (struct sockaddr *)&a, &n) == 0,
          "receiver socket");
    rc.port = ntohs(a.sin_port);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, serve_one, &rc) == 0, "receiver thread");
    char extra[512];
    snprintf(extra, sizeof extra,
             "alerts:\n  rules:\n    - name=hook metric=grad_norm above=150 action=webhook\n"
             "  webhook_url: http://127.0.0.1:%d/hook\n"
             "debug:\n  inject: scale\n  inject_step: 6\n  inject_scale: 10000\n",
             rc.port);
    write_cfg("hook.yaml", 8, extra);
    e2e_result r = e2e_runf("train %s/hook.yaml --out %s/hook", dir, dir);
    CHECK(r.rc == 0, "webhook run: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "rule 'hook' posted to http://127.0.0.1:") != NULL, "no post line:\n%s",
          r.out);
    e2e_done(&r);
    pthread_join(th, NULL);
    close(rc.fd);
    CHECK(!strncmp(rc.req, "POST /hook HTTP/1.1\r\n", 21), "request line: %.60s", rc.req);
    CHECK(strcasestr(rc.req, "Content-Type: application/json") != NULL, "content type:\n%s",
          rc.req);
    const char *body = strstr(rc.req, "\r\n\r\n");
    body = body ? body + 4 : "";
    CHECK(body[0] == '{' && strstr(body, "\"rule\":\"hook\"") &&
              strstr(body, "\"metric\":\"grad_norm\"") && strstr(body, "\"step\":6") &&
              strstr(body, "\"action\":\"webhook\"") && strstr(body, "\"threshold\":150") &&
              strstr(body, "\"condition\":\"above\"") && strstr(body, "\"rank\":0"),
          "body: %s", body);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    bin = e2e_setup("alerts", dir, sizeof dir);
    if (!bin) return check_summary("e2e/alerts");
    test_log_snapshot();
    test_skip();
    test_default_stop();
    test_default_pause();
    test_webhook();
    e2e_cleanup(dir);
    return check_summary("e2e/alerts");
}
