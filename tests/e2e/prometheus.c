/* The /metrics endpoint against the real Prometheus tools:
 *   1. `promtool check metrics` on what a scrape of the endpoint returns
 *      (every standard family with series), which also lints names;
 *   2. a real Prometheus server on loopback (temporary config and TSDB)
 *      scrapes the endpoint every second while the test moves the
 *      tessel_loss gauge like a training run; the loss series is then read
 *      back through the HTTP API (/api/v1/query?query=tessel_loss) until it
 *      shows the last value set, with the rank and job labels.
 * Each part skips with a message when its tool is not installed. The
 * server is bounded to 60 s (a loaded machine under ASan needed over 25), killed on every path (and
 * by PDEATHSIG should this test die), and its directory removed. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "core/core.h"
#include "obs/http.h"
#include "obs/metrics.h"

static char dir[64];

/* Full path of `prog` on PATH into out, or 0. */
static int which(const char *prog, char *out, size_t n) {
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        size_t k = strcspn(path, ":");
        snprintf(out, n, "%.*s/%s", (int)k, path, prog);
        if (k && access(out, X_OK) == 0) return 1;
        path += k + (path[k] == ':');
    }
    return 0;
}

/* GET http://127.0.0.1:port/path; the body of a 200 response, else NULL.
 * Timeouts keep a stuck server from stalling the test. */
static char *http_get(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char req[512];
    int k =
        snprintf(req, sizeof req,
                 "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", path, port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, req, (size_t)k) != k) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    close(fd);
    if (!buf) return NULL;
    buf[n] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 8, " 200", 4) || !body) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    socklen_t len = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void print_file(const char *path, int max_lines) {
    FILE *f = fopen(path, "r");
    char line[1024];
    for (int i = 0; f && i < max_lines && fgets(line, sizeof line, f); i++)
        fprintf(stderr, "  | %s", line);
    if (f) fclose(f);
}

/* ---- 1. promtool ------------------------------------------------------------------ */

static void test_promtool(int port) {
    char promtool[512];
    if (!which("promtool", promtool, sizeof promtool)) {
        printf("prometheus: SKIP promtool check: promtool is not installed (Debian package "
               "`prometheus`)\n");
        return;
    }
    char *body = http_get(port, "/metrics");
    CHECK(body != NULL, "scrape of /metrics");
    if (!body) return;
    char out[128], cmd[1024];
    snprintf(out, sizeof out, "%s/promtool.out", dir);
    snprintf(cmd, sizeof cmd, "'%s' check metrics > '%s' 2>&1", promtool, out);
    FILE *p = popen(cmd, "w");
    CHECK(p != NULL, "start promtool");
    if (p) {
        fputs(body, p);
        int st = pclose(p);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "promtool check metrics failed (status %d)",
              st);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) print_file(out, 40);
    }
    /* promtool must also reject what it should: a broken exposition */
    snprintf(cmd, sizeof cmd, "'%s' check metrics > /dev/null 2>&1", promtool);
    p = popen(cmd, "w");
    if (p) {
        fputs("# TYPE x counter\nx{a=\"1\" 2\n", p);
        int st = pclose(p);
        CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "promtool accepts broken text");
    }
    free(body);
}

/* ---- 2. a real Prometheus server -------------------------------------------------- */

/* Value of tessel_loss from an instant query, with its labels checked;
 * NAN when there is no sample yet. */
static double query_loss(int prom_port, int target_port, int *labels_ok) {
    char *body = http_get(prom_port, "/api/v1/query?query=tessel_loss");
    if (!body) return NAN;
    double v = NAN;
    json_error_t err;
    json_t *root = json_loads(body, 0, &err);
    free(body);
    json_t *result = json_object_get(json_object_get(root, "data"), "result");
    const char *status = json_string_value(json_object_get(root, "status"));
    if (status && !strcmp(status, "success") && json_array_size(result) == 1) {
        json_t *r0 = json_array_get(result, 0), *metric = json_object_get(r0, "metric");
        const char *val = json_string_value(json_array_get(json_object_get(r0, "value"), 1));
        if (val) v = strtod(val, NULL);
        char inst[64];
        snprintf(inst, sizeof inst, "127.0.0.1:%d", target_port);
        const char *rank = json_string_value(json_object_get(metric, "rank"));
        const char *job = json_string_value(json_object_get(metric, "job"));
        const char *instance = json_string_value(json_object_get(metric, "instance"));
        *labels_ok = rank && !strcmp(rank, "0") && job && !strcmp(job, "tessel") && instance &&
                     !strcmp(instance, inst);
    }
    json_decref(root);
    return v;
}

static void test_server(ts_train_metrics *tm, int target_port) {
    char prom[512];
    if (!which("prometheus", prom, sizeof prom)) {
        printf("prometheus: SKIP server test: prometheus is not installed (Debian package "
               "`prometheus`)\n");
        return;
    }
    int prom_port = free_port();
    CHECK(prom_port > 0, "a free port for prometheus");
    if (prom_port <= 0) return;
    char cfg[128], data[128], log[128], listen[64], a_cfg[160], a_data[160], a_listen[96];
    snprintf(cfg, sizeof cfg, "%s/prometheus.yml", dir);
    snprintf(data, sizeof data, "%s/tsdb", dir);
    snprintf(log, sizeof log, "%s/prometheus.log", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", prom_port);
    FILE *f = fopen(cfg, "w");
    if (!f) return;
    /* The scrape job of docs/observability.md, one rank, every second. */
    fprintf(f,
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: tessel\n"
            "    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n",
            target_port);
    fclose(f);
    snprintf(a_cfg, sizeof a_cfg, "--config.file=%s", cfg);
    snprintf(a_data, sizeof a_data, "--storage.tsdb.path=%s", data);
    snprintf(a_listen, sizeof a_listen, "--web.listen-address=%s", listen);
    char *argv[] = {prom, a_cfg, a_data, a_listen, "--log.level=info", NULL};

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* only async-signal-safe calls between fork and exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        execv(prom, argv);
        _exit(127);
    }
    CHECK(pid > 0, "fork prometheus");
    if (pid <= 0) return;

    /* Move the loss like a run, until Prometheus has scraped it; then hold
     * a final value and wait until the query returns exactly that. */
    const double t0 = ts_now(), deadline = t0 + 60;
    const double final = 0.125;
    int step = 0, seen = 0, got_final = 0, labels_ok = 0, exited = 0;
    double last = NAN, next_query = t0 + 1;
    while (ts_now() < deadline && !got_final) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            exited = 1;
            break;
        }
        if (!seen) {
            ts_step_metrics s = ts_step_metrics_empty();
            s.step = ++step;
            s.loss = 3.0 / step + 0.5;
            s.seconds = 0.01;
            ts_train_metrics_step(tm, &s);
        }
        if (ts_now() >= next_query) {
            next_query = ts_now() + 0.5;
            last = query_loss(prom_port, target_port, &labels_ok);
            if (!seen && !isnan(last)) {
                seen = 1;
                printf("prometheus: first sample tessel_loss=%g after %.1f s; holding %g\n", last,
                       ts_now() - t0, final);
                ts_step_metrics s = ts_step_metrics_empty();
                s.step = ++step;
                s.loss = final;
                ts_train_metrics_step(tm, &s);
            } else if (seen && last == final) {
                got_final = 1;
            }
        }
        sleep_s(0.1);
    }
    CHECK(!exited, "prometheus exited early");
    CHECK(seen, "prometheus scraped tessel_loss within 60 s (last query: %g)", last);
    CHECK(got_final, "the held loss %g came back through /api/v1/query (last %g)", final, last);
    CHECK(labels_ok, "labels rank=\"0\", job=\"tessel\", instance of the endpoint");
    if (seen && got_final)
        printf("prometheus: tessel_loss=%g read back after %.1f s\n", last, ts_now() - t0);
    if (!got_final) {
        char *targets = http_get(prom_port, "/api/v1/targets");
        fprintf(stderr, "targets: %.2000s\nprometheus log:\n", targets ? targets : "(none)");
        free(targets);
        print_file(log, 30);
    }

    /* Always stop the server: TERM, then KILL after 5 s. */
    if (!exited) {
        kill(pid, SIGTERM);
        int st, gone = 0;
        for (double t = ts_now(); ts_now() - t < 5 && !gone;) {
            if (waitpid(pid, &st, WNOHANG) == pid)
                gone = 1;
            else
                sleep_s(0.05);
        }
        if (!gone) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-prom-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(0, &tm));
    /* a series in every labelled family, so promtool sees all of them */
    ts_step_metrics s = ts_step_metrics_empty();
    s.step = 1;
    s.loss = 3.5;
    s.seconds = 0.02;
    s.learning_rate = 1e-3;
    s.samples_per_s = 512;
    s.tokens_per_s = 65536;
    s.grad_norm = 2;
    s.grad_variance = 0.01;
    s.loss_scale = 65536;
    CHECK_OK(ts_train_metrics_step(&tm, &s));
    CHECK_OK(ts_train_metrics_collective(&tm, "allreduce", 1 << 20, 0.003));
    CHECK_OK(ts_train_metrics_anomaly(&tm, "non_finite_loss"));
    CHECK_OK(ts_train_metrics_alert(&tm, "loss non_finite", "skip_step"));
    CHECK_OK(ts_train_metrics_skipped(&tm, "non_finite_loss"));
    CHECK_OK(ts_train_metrics_group(&tm, "embed \"tok\"\\x", 1.5, 1e-3));
    CHECK_OK(ts_metric_set(tm.arena_bytes, 123456));
    CHECK_OK(ts_metric_observe(tm.checkpoint_seconds, 0.8));

    ts_http_server *srv = NULL;
    CHECK_OK(ts_http_serve_metrics(tm.reg, "127.0.0.1", 0, &srv));
    if (srv) {
        test_promtool(ts_http_port(srv));
        test_server(&tm, ts_http_port(srv));
        ts_http_stop(srv);
    }
    ts_train_metrics_free(&tm);
    e2e_cleanup(dir);
    return check_summary("prometheus");
}
